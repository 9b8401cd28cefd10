//! The conformance suite every [`Catalog`] backend must pass: plain async functions over
//! `&dyn Catalog`, called by each backend's tests (tests/conformance.rs: SQLite and PostgreSQL).
//! The task half is in [`super::conformance_tasks`]; races between two handles (two
//! processes) in [`run_concurrent`] and [`super::conformance_race`].
//!
//! Each check panics with a message on a violated guarantee.

use std::time::Duration;

use futures::StreamExt;

use super::{BlobClaim, Catalog, CatalogError, Checkpoint, Concat, CreationKey, KeyedCreate, LeaseOutcome, NewTask, UploadRecord};

fn record(id: &str, principal: &str, concat: Concat) -> UploadRecord {
    UploadRecord {
        id: id.to_string(),
        principal: principal.to_string(),
        length: Some(1 << 40),
        offset: 0,
        metadata: "filename aGVsbG8udHh0,empty".to_string(),
        hash_state: vec![1, 2, 3],
        sha256: None,
        expected_sha256: Some([7; 32]),
        concat,
        created_at_ms: 1_000,
        updated_at_ms: 1_000,
        expires_at_ms: Some(10_000),
        finished_at_ms: None,
        expired: false,
        blob_state: Vec::new(),
        provisional: false,
    }
}

fn cp(offset: u64, now_ms: i64) -> Checkpoint {
    Checkpoint {
        offset,
        hash_state: vec![offset as u8; 8],
        blob_state: vec![1, offset as u8],
        blob_entries_from: None,
        length: None,
        finished_sha256: None,
        expires_at_ms: Some(now_ms + 10_000),
        now_ms,
    }
}

fn unix_ms() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as i64
}

fn granted(o: LeaseOutcome) -> super::LeaseGrant {
    match o {
        LeaseOutcome::Granted(g) => g,
        held => panic!("expected the lease to be granted, got {held:?}"),
    }
}

/// Run every check against `cat`. Ids are prefixed with `prefix` so the suite can share a
/// database with other data.
pub async fn run_all(cat: &dyn Catalog, prefix: &str) {
    check_create_get_roundtrip(cat, prefix).await;
    check_duplicate_create(cat, prefix).await;
    check_fenced_checkpoint(cat, prefix).await;
    check_finish_and_large_values(cat, prefix).await;
    check_expiry_and_tombstones(cat, prefix).await;
    check_deleting_a_row_queues_its_bytes(cat, prefix).await;
    check_concat_lookup(cat, prefix).await;
    check_final_failures(cat, prefix).await;
    check_kept_crc32s(cat, prefix).await;
    check_listing_is_per_principal(cat, prefix).await;
    check_creation_keys(cat, prefix).await;
    check_blob_state_in_checkpoint(cat, prefix).await;
    check_blob_entries_beside_the_row(cat, prefix).await;
    check_expire_if_due_is_compare_and_set(cat, prefix).await;
    check_reopen_keeps_the_fence_monotonic(cat, prefix).await;
    check_upload_lease(cat, prefix).await;
    check_lease_expiry_uses_the_database_clock(cat, prefix).await;
    check_touch_extends_never_shortens(cat, prefix).await;
    check_reclaim_owner(cat, prefix).await;
    check_task_lease_database_clock(cat, prefix).await;
    check_release_requests(cat, prefix).await;
    check_shared_secret(cat, prefix).await;
    check_mcp_sessions(cat, prefix).await;
    check_damage_marks_and_paging(cat, prefix).await;
    super::conformance_quota::check_usage_and_quota(cat, prefix).await;
    super::conformance_quota::check_retention(cat, prefix).await;
    super::conformance_quota::check_reservations(cat, prefix).await;
    super::conformance_tasks::run_all(cat, prefix).await;
    super::conformance_events::run_all(cat, prefix).await;
    super::conformance_links::run_all(cat, prefix).await;
    cat.ping().await.expect("ping");
}

/// Checks that need two handles on one database (two processes sharing a catalog): each race
/// has exactly one winner.
pub async fn run_concurrent(a: &dyn Catalog, b: &dyn Catalog, prefix: &str) {
    check_racing_lease(a, b, prefix).await;
    check_racing_claim(a, b, prefix).await;
    super::conformance_events::check_racing_delivery_claims(a, b, prefix).await;
    check_racing_expiry(a, b, prefix).await;
    check_release_request_crosses_handles(a, b, prefix).await;
    super::conformance_quota::check_racing_quota(a, b, prefix).await;
    super::conformance_quota::check_racing_reservations(a, b, prefix).await;
    super::conformance_links::check_racing_downloads(a, b, prefix).await;
}

pub async fn check_create_get_roundtrip(cat: &dyn Catalog, p: &str) {
    let rec = record(&format!("{p}roundtrip"), "alice", Concat::None);
    cat.create_upload(&rec).await.expect("create");
    assert_eq!(cat.get_upload(&rec.id).await.unwrap().as_ref(), Some(&rec), "get returns what was created");
    assert!(cat.get_upload(&format!("{p}missing")).await.unwrap().is_none(), "unknown id → None");
    let fin = record(&format!("{p}final"), "alice", Concat::Final { parts: vec!["a".into(), "b".into()], header: "final;/files/a /files/b".into() });
    cat.create_upload(&fin).await.unwrap();
    assert_eq!(cat.get_upload(&fin.id).await.unwrap().unwrap().concat, fin.concat);
}

pub async fn check_duplicate_create(cat: &dyn Catalog, p: &str) {
    let rec = record(&format!("{p}dup"), "alice", Concat::None);
    cat.create_upload(&rec).await.unwrap();
    assert!(matches!(cat.create_upload(&rec).await, Err(CatalogError::AlreadyExists)));
}

pub async fn check_fenced_checkpoint(cat: &dyn Catalog, p: &str) {
    let id = format!("{p}fence");
    cat.create_upload(&record(&id, "alice", Concat::None)).await.unwrap();
    let f1 = cat.acquire_fence(&id).await.unwrap();
    let f2 = cat.acquire_fence(&id).await.unwrap();
    assert!(f2 > f1, "fences increase");
    let cp = Checkpoint {
        offset: 42,
        hash_state: vec![9; 110],
        blob_state: Vec::new(),
        blob_entries_from: None,
        length: None,
        finished_sha256: None,
        expires_at_ms: Some(20_000),
        now_ms: 2_000,
    };
    assert!(matches!(cat.checkpoint(&id, f1, &cp).await, Err(CatalogError::Fenced)), "stale fence refused");
    assert_eq!(cat.get_upload(&id).await.unwrap().unwrap().offset, 0, "a refused checkpoint changes nothing");
    cat.checkpoint(&id, f2, &cp).await.expect("current fence accepted");
    let got = cat.get_upload(&id).await.unwrap().unwrap();
    assert_eq!((got.offset, got.hash_state.len(), got.expires_at_ms, got.updated_at_ms), (42, 110, Some(20_000), 2_000));
    assert!(matches!(cat.acquire_fence(&format!("{p}nope")).await, Err(CatalogError::NotFound)));
    assert!(matches!(cat.checkpoint(&format!("{p}nope"), 1, &cp).await, Err(CatalogError::NotFound)));
}

pub async fn check_finish_and_large_values(cat: &dyn Catalog, p: &str) {
    let id = format!("{p}finish");
    let mut rec = record(&id, "alice", Concat::None);
    rec.length = None;
    cat.create_upload(&rec).await.unwrap();
    let f = cat.acquire_fence(&id).await.unwrap();
    let big = 5 * (1u64 << 30) + 7; // past 2^32
    let cp = Checkpoint {
        offset: big,
        hash_state: vec![1],
        blob_state: Vec::new(),
        blob_entries_from: None,
        length: Some(big),
        finished_sha256: Some([3; 32]),
        expires_at_ms: Some(1),
        now_ms: 3_000,
    };
    cat.checkpoint(&id, f, &cp).await.unwrap();
    let got = cat.get_upload(&id).await.unwrap().unwrap();
    assert_eq!((got.offset, got.length, got.sha256, got.finished_at_ms), (big, Some(big), Some([3; 32]), Some(3_000)));
    assert!(got.is_finished());
    assert_eq!(got.expires_at_ms, None, "finished uploads never expire");
    assert!(!cat.list_awaiting_finish(u32::MAX).await.unwrap().contains(&id), "a finished upload is not unfinished work");
}

pub async fn check_expiry_and_tombstones(cat: &dyn Catalog, p: &str) {
    let id = format!("{p}expiry");
    let mut rec = record(&id, "alice", Concat::None);
    rec.expires_at_ms = Some(5_000);
    cat.create_upload(&rec).await.unwrap();
    assert!(!cat.list_expired(4_999, 100).await.unwrap().contains(&id));
    assert!(cat.list_expired(5_000, 100).await.unwrap().contains(&id));
    let f = cat.acquire_fence(&id).await.unwrap();
    assert!(cat.mark_expired(&id, 6_000).await.unwrap());
    assert!(cat.mark_expired(&id, 7_000).await.expect("idempotent"), "a tombstone stays one");
    assert!(cat.get_upload(&id).await.unwrap().unwrap().expired);
    let cp = Checkpoint {
        offset: 1,
        hash_state: vec![],
        blob_state: Vec::new(),
        blob_entries_from: None,
        length: None,
        finished_sha256: None,
        expires_at_ms: None,
        now_ms: 1,
    };
    assert!(matches!(cat.checkpoint(&id, f, &cp).await, Err(CatalogError::Fenced)), "expiry fences out writers");
    assert!(!cat.list_expired(i64::MAX, 100).await.unwrap().contains(&id), "tombstones are not listed again");
    assert!(!cat.list_tombstones(6_000, 100).await.unwrap().contains(&id), "kept until its time");
    assert!(cat.list_tombstones(6_001, 100).await.unwrap().contains(&id));
    assert!(!cat.list_awaiting_finish(u32::MAX).await.unwrap().contains(&id), "a tombstone is not unfinished work");
    assert!(cat.delete_upload(&id).await.unwrap());
    assert!(!cat.delete_upload(&id).await.unwrap(), "delete is idempotent");
    assert!(cat.get_upload(&id).await.unwrap().is_none());
    assert!(matches!(cat.mark_expired(&id, 1).await, Err(CatalogError::NotFound)));
}

/// Every way an upload row is deleted queues its bytes for removal in the same transaction
/// (issue 48: the row goes first, the bytes after it), and [`Catalog::blob_claim`] says what
/// names an id: the row, then the queued removal, then nothing.
pub async fn check_deleting_a_row_queues_its_bytes(cat: &dyn Catalog, p: &str) {
    let queued = |ids: Vec<String>, id: &str| ids.iter().any(|i| i == id);
    let (a, b, c, never) = (format!("{p}rmdelete"), format!("{p}rmwithdraw"), format!("{p}rmtombstone"), format!("{p}rmnever"));
    assert_eq!(cat.blob_claim(&never).await.unwrap(), BlobClaim::Unclaimed);
    for id in [&a, &b, &c] {
        let mut rec = record(id, "alice", Concat::None);
        rec.provisional = id == &b;
        cat.create_upload(&rec).await.unwrap();
        assert_eq!(cat.blob_claim(id).await.unwrap(), BlobClaim::Row);
        assert!(!queued(cat.list_blob_removals(u32::MAX).await.unwrap(), id), "a live upload's bytes are not queued for removal");
    }
    assert!(cat.delete_upload(&a).await.unwrap());
    assert!(cat.withdraw_upload(&b).await.unwrap());
    assert!(cat.mark_expired(&c, 2_000).await.unwrap());
    assert_eq!(cat.blob_claim(&c).await.unwrap(), BlobClaim::Row, "a tombstone is still a row");
    assert!(cat.delete_tombstone(&c, 3_000).await.unwrap());
    let list = cat.list_blob_removals(u32::MAX).await.unwrap();
    for id in [&a, &b, &c] {
        assert!(queued(list.clone(), id), "deleting {id}'s row queued its bytes: {list:?}");
        assert_eq!(cat.blob_claim(id).await.unwrap(), BlobClaim::Removal);
    }
    for id in [&a, &b, &c] {
        cat.forget_blob_removal(id).await.unwrap();
        cat.forget_blob_removal(id).await.expect("forgetting is idempotent");
        assert_eq!(cat.blob_claim(id).await.unwrap(), BlobClaim::Unclaimed);
    }
    assert!(!cat.list_blob_removals(u32::MAX).await.unwrap().iter().any(|i| [&a, &b, &c].contains(&i)));
}

pub async fn check_concat_lookup(cat: &dyn Catalog, p: &str) {
    let a = format!("{p}parta");
    let fin = format!("{p}finalab");
    cat.create_upload(&record(&a, "alice", Concat::Partial)).await.unwrap();
    let parts = vec![a.clone(), format!("{p}partb")];
    cat.create_upload(&record(&fin, "alice", Concat::Final { parts, header: "final;x".into() })).await.unwrap();
    assert_eq!(cat.finals_waiting_on(&a).await.unwrap(), vec![fin.clone()]);
    assert!(cat.finals_waiting_on(&format!("{p}part")).await.unwrap().is_empty(), "exact id match only");
}

/// Why a final upload can never be built: kept for unfinished finals only (the first one
/// recorded stays), readable once the final is a tombstone, gone with the row.
pub async fn check_final_failures(cat: &dyn Catalog, p: &str) {
    let part = format!("{p}ffpart");
    let fin = format!("{p}fffinal");
    cat.create_upload(&record(&part, "alice", Concat::Partial)).await.unwrap();
    cat.create_upload(&record(&fin, "alice", Concat::Final { parts: vec![part.clone()], header: "final;x".into() })).await.unwrap();
    let f = super::FinalFailure { code: "size_exceeded".into(), detail: "its parts add up to 1800 bytes".into(), failed_at_ms: 5 };
    assert!(!cat.set_final_failure(&part, &f).await.unwrap(), "only a final upload is marked");
    assert!(!cat.set_final_failure(&format!("{p}ffnone"), &f).await.unwrap(), "an unknown id is never marked");
    assert_eq!(cat.final_failure(&part).await.unwrap(), None);
    assert!(cat.set_final_failure(&fin, &f).await.unwrap());
    let later = super::FinalFailure { code: "quota_exceeded".into(), detail: "later".into(), failed_at_ms: 6 };
    assert!(!cat.set_final_failure(&fin, &later).await.unwrap(), "the first failure stays");
    assert!(cat.mark_expired(&fin, 7).await.unwrap());
    assert_eq!(cat.final_failure(&fin).await.unwrap(), Some(f));
    assert!(cat.finals_waiting_on(&part).await.unwrap().is_empty(), "a failed final waits on nothing");
    assert!(cat.delete_upload(&fin).await.unwrap());
    assert_eq!(cat.final_failure(&fin).await.unwrap(), None, "the failure goes with its upload");
}

/// A finished upload's CRC-32: kept for finished live uploads only (the first value stays, all
/// 32 bits of it), forgotten by a damage mark set or cleared, gone with the row.
pub async fn check_kept_crc32s(cat: &dyn Catalog, p: &str) {
    let (open, done) = (format!("{p}crc-open"), format!("{p}crc-done"));
    for id in [&open, &done] {
        cat.create_upload(&record(id, "alice", Concat::None)).await.unwrap();
    }
    let f = cat.acquire_fence(&done).await.unwrap();
    let finish = Checkpoint {
        offset: 10,
        hash_state: vec![1],
        blob_state: Vec::new(),
        blob_entries_from: None,
        length: Some(10),
        finished_sha256: Some([4; 32]),
        expires_at_ms: None,
        now_ms: 5,
    };
    cat.checkpoint(&done, f, &finish).await.unwrap();
    assert!(!cat.keep_crc32(&open, 7).await.unwrap(), "an unfinished upload keeps none");
    assert!(!cat.keep_crc32(&format!("{p}crc-none"), 7).await.unwrap(), "an unknown id keeps none");
    assert_eq!(cat.crc32(&open).await.unwrap(), None);
    assert!(cat.keep_crc32(&done, u32::MAX).await.unwrap());
    assert!(!cat.keep_crc32(&done, 1).await.unwrap(), "the first value stays");
    assert_eq!(cat.crc32(&done).await.unwrap(), Some(u32::MAX));
    let d = super::Damage { kind: "missing".into(), detail: "gone".into(), found_at_ms: 7 };
    cat.set_damage(&done, Some(&d)).await.unwrap();
    assert_eq!(cat.crc32(&done).await.unwrap(), None, "a damage mark forgets it");
    cat.set_damage(&done, None).await.unwrap();
    assert!(cat.keep_crc32(&done, 0).await.unwrap());
    cat.set_damage(&done, None).await.unwrap();
    assert_eq!(cat.crc32(&done).await.unwrap(), None, "clearing a mark forgets it too (the bytes were restored)");
    assert!(cat.keep_crc32(&done, 3).await.unwrap());
    assert!(cat.delete_upload(&done).await.unwrap());
    assert_eq!(cat.crc32(&done).await.unwrap(), None, "the value goes with its upload");
    cat.create_upload(&record(&done, "alice", Concat::None)).await.unwrap();
    assert_eq!(cat.crc32(&done).await.unwrap(), None, "a new upload of the same id starts without one");
}

pub async fn check_listing_is_per_principal(cat: &dyn Catalog, p: &str) {
    let mut rec = record(&format!("{p}bobs"), "bob", Concat::None);
    rec.created_at_ms = 9_999;
    cat.create_upload(&rec).await.unwrap();
    let bobs = cat.list_uploads("bob", 100).await.unwrap();
    assert!(bobs.iter().all(|r| r.principal == "bob"));
    assert!(bobs.iter().any(|r| r.id == rec.id));
    assert!(!cat.list_uploads("alice", 100).await.unwrap().iter().any(|r| r.id == rec.id));
}

/// [`Catalog::create_upload_keyed`]: a key is held per principal by one live upload; a second
/// creation under it returns the first (and its fingerprint) and inserts nothing; deleting or
/// expiring the holder frees the key; concurrent creations make exactly one upload.
pub async fn check_creation_keys(cat: &dyn Catalog, p: &str) {
    let key = |k: &str, fp: &str| CreationKey { key: format!("{p}{k}"), fingerprint: fp.to_string() };
    let first = record(&format!("{p}key1"), "alice", Concat::None);
    assert_eq!(cat.create_upload_keyed(&first, &key("k", "fp-a")).await.unwrap(), KeyedCreate::Created);
    let retry = record(&format!("{p}key2"), "alice", Concat::None);
    match cat.create_upload_keyed(&retry, &key("k", "fp-b")).await.unwrap() {
        KeyedCreate::Existing { upload, fingerprint } => {
            assert_eq!(*upload, first, "the existing upload, as get_upload reads it");
            assert_eq!(fingerprint, "fp-a", "the fingerprint it was created with");
        }
        other => panic!("a held key must return the holder, got {other:?}"),
    }
    assert!(cat.get_upload(&retry.id).await.unwrap().is_none(), "nothing inserted for the retry");
    // Keys are per principal.
    let bobs = record(&format!("{p}key3"), "bob", Concat::None);
    assert_eq!(cat.create_upload_keyed(&bobs, &key("k", "fp-a")).await.unwrap(), KeyedCreate::Created);
    // A plain create does not take or check keys.
    cat.create_upload(&record(&format!("{p}key4"), "alice", Concat::None)).await.unwrap();
    // Expiring the holder frees the key; so does deleting it.
    cat.mark_expired(&first.id, 50_000).await.unwrap();
    assert_eq!(cat.create_upload_keyed(&retry, &key("k", "fp-b")).await.unwrap(), KeyedCreate::Created);
    assert!(cat.delete_upload(&retry.id).await.unwrap());
    let third = record(&format!("{p}key5"), "alice", Concat::None);
    assert_eq!(cat.create_upload_keyed(&third, &key("k", "fp-c")).await.unwrap(), KeyedCreate::Created);
    // The same id under another key is still a duplicate id.
    assert!(matches!(cat.create_upload_keyed(&third, &key("other", "x")).await, Err(CatalogError::AlreadyExists)));
    // Concurrent creations under one new key: exactly one is created.
    let racers: Vec<UploadRecord> = (0..8).map(|i| record(&format!("{p}race{i}"), "carol", Concat::None)).collect();
    let k = key("race", "fp");
    let outcomes = futures::future::join_all(racers.iter().map(|r| cat.create_upload_keyed(r, &k))).await;
    let created = outcomes.iter().filter(|o| matches!(o, Ok(KeyedCreate::Created))).count();
    assert_eq!(created, 1, "{outcomes:?}");
    assert!(outcomes.iter().all(|o| o.is_ok()), "{outcomes:?}");
}

pub async fn check_blob_state_in_checkpoint(cat: &dyn Catalog, p: &str) {
    let id = format!("{p}blobstate");
    cat.create_upload(&record(&id, "alice", Concat::None)).await.unwrap();
    assert!(cat.get_upload(&id).await.unwrap().unwrap().blob_state.is_empty(), "a new upload has the empty blob state");
    let f = cat.acquire_fence(&id).await.unwrap();
    let mut c = cp(77, 2_000);
    c.blob_state = (0..=255u8).collect();
    cat.checkpoint(&id, f, &c).await.unwrap();
    let got = cat.get_upload(&id).await.unwrap().unwrap();
    assert_eq!((got.offset, &got.blob_state), (77, &c.blob_state), "blob state is committed with the offset, byte for byte");
    let f2 = cat.acquire_fence(&id).await.unwrap();
    assert!(matches!(cat.checkpoint(&id, f, &cp(99, 3_000)).await, Err(CatalogError::Fenced)));
    assert_eq!(cat.get_upload(&id).await.unwrap().unwrap().blob_state, c.blob_state, "a stale checkpoint changes no blob state");
    cat.checkpoint(&id, f2, &cp(99, 3_000)).await.unwrap();
    assert_eq!(cat.get_upload(&id).await.unwrap().unwrap().blob_state, vec![1, 99]);
}

pub async fn check_expire_if_due_is_compare_and_set(cat: &dyn Catalog, p: &str) {
    // Not due yet, then due.
    let id = format!("{p}cas");
    let mut rec = record(&id, "alice", Concat::None);
    rec.expires_at_ms = Some(5_000);
    cat.create_upload(&rec).await.unwrap();
    assert!(!cat.expire_if_due(&id, 4_999).await.unwrap(), "not due");
    let f = cat.acquire_fence(&id).await.unwrap();
    assert!(cat.expire_if_due(&id, 5_000).await.unwrap(), "due");
    assert!(!cat.expire_if_due(&id, 5_000).await.unwrap(), "exactly once");
    assert!(matches!(cat.checkpoint(&id, f, &cp(1, 5_001)).await, Err(CatalogError::Fenced)), "expiry fences out the writer");
    assert!(!cat.expire_if_due(&format!("{p}unknowncas"), 5_000).await.unwrap(), "unknown → false");

    // Expiry vs finish: an upload that finished (on another replica) after the sweeper listed
    // it is never tombstoned, by the sweep nor by mark_expired.
    let id = format!("{p}casfinish");
    let mut rec = record(&id, "alice", Concat::None);
    rec.expires_at_ms = Some(5_000);
    cat.create_upload(&rec).await.unwrap();
    assert!(cat.list_expired(6_000, 1000).await.unwrap().contains(&id));
    let f = cat.acquire_fence(&id).await.unwrap();
    let mut fin = cp(10, 5_500);
    fin.length = Some(10);
    fin.finished_sha256 = Some([4; 32]);
    cat.checkpoint(&id, f, &fin).await.unwrap();
    assert!(!cat.expire_if_due(&id, 6_000).await.unwrap(), "finished meanwhile: left alone");
    assert!(!cat.mark_expired(&id, 6_000).await.unwrap(), "mark_expired never tombstones a finished upload");
    let got = cat.get_upload(&id).await.unwrap().unwrap();
    assert!(got.is_finished() && !got.expired);

    // Extended meanwhile (a checkpoint moved the expiry).
    let id = format!("{p}casextend");
    let mut rec = record(&id, "alice", Concat::None);
    rec.expires_at_ms = Some(5_000);
    cat.create_upload(&rec).await.unwrap();
    let f = cat.acquire_fence(&id).await.unwrap();
    cat.checkpoint(&id, f, &cp(3, 5_500)).await.unwrap(); // expires 15_500
    assert!(!cat.expire_if_due(&id, 6_000).await.unwrap(), "extended meanwhile: left alone");

    // A live lease (unexpired on the database clock) keeps a due upload alive.
    let id = format!("{p}casleased");
    let mut rec = record(&id, "alice", Concat::None);
    rec.expires_at_ms = Some(5_000);
    cat.create_upload(&rec).await.unwrap();
    let g = granted(cat.acquire_upload_lease(&id, "writer", 3_600_000).await.unwrap());
    assert!(!cat.expire_if_due(&id, 6_000).await.unwrap(), "a leased upload is alive");
    cat.release_upload_lease(&id, g.fence).await.unwrap();
    assert!(cat.expire_if_due(&id, 6_000).await.unwrap(), "released: due again");

    // Tombstones are deleted only as tombstones, only when old enough.
    assert!(!cat.delete_tombstone(&id, 6_000).await.unwrap(), "kept until its time");
    assert!(cat.delete_tombstone(&id, 6_001).await.unwrap());
    let live = format!("{p}casextend");
    assert!(!cat.delete_tombstone(&live, i64::MAX).await.unwrap(), "a live upload is never deleted as a tombstone");
    assert!(cat.get_upload(&live).await.unwrap().is_some());
}

pub async fn check_reopen_keeps_the_fence_monotonic(cat: &dyn Catalog, p: &str) {
    let id = format!("{p}reopen");
    cat.create_upload(&record(&id, "alice", Concat::None)).await.unwrap();
    let old = cat.acquire_fence(&id).await.unwrap();
    let mut fin = cp(50, 2_000);
    fin.length = Some(50);
    fin.finished_sha256 = Some([5; 32]);
    cat.checkpoint(&id, old, &fin).await.unwrap();
    let f = cat.acquire_fence(&id).await.unwrap();
    assert!(matches!(cat.reopen_upload(&id, old, &cp(20, 3_000)).await, Err(CatalogError::Fenced)), "reopen is fenced");
    cat.reopen_upload(&id, f, &cp(20, 3_000)).await.expect("reopen under the current fence");
    let got = cat.get_upload(&id).await.unwrap().unwrap();
    assert_eq!((got.offset, got.length, got.sha256, got.finished_at_ms, got.expires_at_ms), (20, None, None, None, Some(13_000)));
    assert_eq!(got.blob_state, vec![1, 20]);
    assert!(
        matches!(cat.checkpoint(&id, old, &cp(21, 3_100)).await, Err(CatalogError::Fenced)),
        "an older writer's token never becomes current again"
    );
    let next = cat.acquire_fence(&id).await.unwrap();
    assert!(next > f, "the fence keeps growing after a reopen ({next} > {f})");
    assert!(matches!(cat.reopen_upload(&format!("{p}nope"), 1, &cp(0, 1)).await, Err(CatalogError::NotFound)));
}

pub async fn check_upload_lease(cat: &dyn Catalog, p: &str) {
    let id = format!("{p}lease");
    cat.create_upload(&record(&id, "alice", Concat::None)).await.unwrap();
    let before = cat.acquire_fence(&id).await.unwrap();
    let g = granted(cat.acquire_upload_lease(&id, "a", 3_600_000).await.unwrap());
    assert!(g.fence > before, "a lease grant grows the fence");
    assert_eq!(g.takeovers, 0, "a free lease is not a takeover");
    assert_eq!(g.row.as_deref(), cat.get_upload(&id).await.unwrap().as_ref(), "the grant reads the row as it stands");
    match cat.acquire_upload_lease(&id, "b", 3_600_000).await.unwrap() {
        LeaseOutcome::Held { owner, expires_at_ms } => assert_eq!((owner.as_str(), expires_at_ms), ("a", g.expires_at_ms)),
        other => panic!("a held lease must answer Held, got {other:?}"),
    }
    assert!(matches!(cat.acquire_upload_lease(&id, "a", 1).await.unwrap(), LeaseOutcome::Held { .. }), "even for its own owner");
    let renewed = cat.renew_upload_lease(&id, g.fence, 7_200_000).await.unwrap();
    assert!(renewed > g.expires_at_ms, "renewal moves the expiry");
    assert!(matches!(cat.renew_upload_lease(&id, g.fence - 1, 1_000).await, Err(CatalogError::Fenced)), "renewal with a stale fence");
    cat.checkpoint(&id, g.fence, &cp(5, 2_000)).await.expect("the holder checkpoints with the lease's fence");
    cat.release_upload_lease(&id, g.fence - 1).await.unwrap();
    assert!(matches!(cat.acquire_upload_lease(&id, "b", 1_000).await.unwrap(), LeaseOutcome::Held { .. }), "a stale release is a no-op");
    cat.release_upload_lease(&id, g.fence).await.unwrap();
    cat.release_upload_lease(&id, g.fence).await.expect("release is idempotent");
    assert!(matches!(cat.renew_upload_lease(&id, g.fence, 1_000).await, Err(CatalogError::Fenced)), "a released lease cannot be renewed");
    let h = granted(cat.acquire_upload_lease(&id, "b", 3_600_000).await.unwrap());
    assert!(h.fence > g.fence && h.takeovers == g.takeovers, "after a release: granted, nothing to repair");
    assert_eq!(h.row.map(|r| r.offset), Some(5), "the next holder's grant reads the checkpoint");
    assert!(matches!(cat.checkpoint(&id, g.fence, &cp(6, 2_100)).await, Err(CatalogError::Fenced)), "the old holder is fenced out");
    assert!(matches!(cat.acquire_upload_lease(&format!("{p}nolease"), "a", 1_000).await, Err(CatalogError::NotFound)));
    // A tombstone has no lease to give.
    cat.release_upload_lease(&id, h.fence).await.unwrap();
    assert!(cat.mark_expired(&id, 3_000).await.unwrap());
    assert!(matches!(cat.acquire_upload_lease(&id, "a", 1_000).await, Err(CatalogError::NotFound)), "a tombstone is not leased");
}

pub async fn check_lease_expiry_uses_the_database_clock(cat: &dyn Catalog, p: &str) {
    let id = format!("{p}leaseclock");
    cat.create_upload(&record(&id, "alice", Concat::None)).await.unwrap();
    // Expiry is database-now + ttl in Unix ms: near this machine's clock (generous bound:
    // the database may run elsewhere), whatever `now_ms` values rows carry (here ~1970).
    let local = unix_ms();
    let g = granted(cat.acquire_upload_lease(&id, "a", 60_000).await.unwrap());
    assert!(
        (g.expires_at_ms - (local + 60_000)).abs() < 600_000,
        "lease expiry {} is database now + ttl in Unix ms (local {local})",
        g.expires_at_ms
    );
    // A lease whose time is up on the database clock is free: a zero-length lease is expired
    // at once, and its taker learns it must repair.
    let id2 = format!("{p}leasezero");
    cat.create_upload(&record(&id2, "alice", Concat::None)).await.unwrap();
    let z = granted(cat.acquire_upload_lease(&id2, "a", 0).await.unwrap());
    let t = granted(cat.acquire_upload_lease(&id2, "b", 60_000).await.unwrap());
    assert!(t.fence > z.fence, "taken over with a bigger fence");
    assert_eq!(t.takeovers, z.takeovers + 1, "the taker of an expired lease must repair");
    assert_eq!((z.takeovers, t.takeovers), (0, 1), "a takeover from a holder that never let go is counted");
    assert!(matches!(cat.checkpoint(&id2, z.fence, &cp(1, 1)).await, Err(CatalogError::Fenced)), "the expired holder is fenced out");
    cat.release_upload_lease(&id2, t.fence).await.unwrap();
    let r = granted(cat.acquire_upload_lease(&id2, "c", 60_000).await.unwrap());
    assert_eq!(r.takeovers, 1, "a lease its holder released is not a takeover");
}

/// A framed blob state (an S3 part list) is kept as its row plus entries beside it: reads of
/// the row carry no entry, [`Catalog::upload_blob_state`] joins them, a checkpoint replaces
/// only the entries from [`Checkpoint::blob_entries_from`] on, and they go with the row.
pub async fn check_blob_entries_beside_the_row(cat: &dyn Catalog, p: &str) {
    use crate::framed::{encode, entries_from, lacks_entries, split};
    let id = format!("{p}entries");
    cat.create_upload(&record(&id, "alice", Concat::None)).await.unwrap();
    assert_eq!(cat.upload_blob_state(&id).await.unwrap(), Some(Vec::new()), "a new upload's state is empty");
    assert_eq!(cat.upload_blob_state(&format!("{p}entries-none")).await.unwrap(), None);
    let f = cat.acquire_fence(&id).await.unwrap();
    let entry = |i: u8| vec![i; 40 + i as usize];
    let state = |n: u8, head: &[u8]| encode(head, &(0..n).map(entry).collect::<Vec<_>>());
    let put = |st: &Vec<u8>, from: Option<u32>, offset: u64| Checkpoint { blob_state: st.clone(), blob_entries_from: from, ..cp(offset, 1) };
    let two = state(2, b"head-two");
    cat.checkpoint(&id, f, &put(&two, Some(0), 10)).await.unwrap();
    let row = cat.get_upload(&id).await.unwrap().unwrap().blob_state;
    assert_eq!(row, split(&two).0, "the row keeps the head alone");
    assert!(lacks_entries(&row));
    assert_eq!(cat.upload_blob_state(&id).await.unwrap(), Some(two.clone()), "row and entries join to what was committed");
    // Appending: the first two are kept, three more added.
    let five = state(5, b"head-five");
    assert_eq!(entries_from(&five, &two), Some(2));
    cat.checkpoint(&id, f, &put(&five, entries_from(&five, &two), 20)).await.unwrap();
    assert_eq!(cat.upload_blob_state(&id).await.unwrap(), Some(five.clone()));
    // Entries unchanged, head changed.
    let five_b = state(5, b"head-five-b");
    assert_eq!(entries_from(&five_b, &five), None);
    cat.checkpoint(&id, f, &put(&five_b, None, 30)).await.unwrap();
    assert_eq!(cat.upload_blob_state(&id).await.unwrap(), Some(five_b.clone()));
    // A fenced-out checkpoint changes no entry.
    assert!(matches!(cat.checkpoint(&id, f - 1, &put(&state(1, b"stale"), Some(0), 40)).await, Err(CatalogError::Fenced)));
    assert_eq!(cat.upload_blob_state(&id).await.unwrap(), Some(five_b.clone()), "a stale writer's entries are not kept");
    // Rolled back to fewer entries, then to a state of another layout.
    let one = state(1, b"head-one");
    cat.checkpoint(&id, f, &put(&one, entries_from(&one, &five_b), 5)).await.unwrap();
    assert_eq!(cat.upload_blob_state(&id).await.unwrap(), Some(one.clone()));
    let other = vec![1u8, 3, 0, 0, 0, 0, 0, 0, 0];
    cat.checkpoint(&id, f, &put(&other, entries_from(&other, &one), 3)).await.unwrap();
    assert_eq!(cat.upload_blob_state(&id).await.unwrap(), Some(other));
    // Entries go with their row.
    cat.checkpoint(&id, f, &put(&two, Some(0), 10)).await.unwrap();
    assert!(cat.delete_upload(&id).await.unwrap());
    cat.create_upload(&record(&id, "alice", Concat::None)).await.unwrap();
    let f = cat.acquire_fence(&id).await.unwrap();
    let head_only = encode(b"h", &[]);
    cat.checkpoint(&id, f, &put(&head_only, None, 1)).await.unwrap();
    assert_eq!(cat.upload_blob_state(&id).await.unwrap(), Some(head_only), "no entry of the deleted upload came back");
}

pub async fn check_touch_extends_never_shortens(cat: &dyn Catalog, p: &str) {
    let id = format!("{p}touch");
    cat.create_upload(&record(&id, "alice", Concat::None)).await.unwrap(); // expires 10_000
    let f = cat.acquire_fence(&id).await.unwrap();
    cat.touch_upload(&id, f, 50_000).await.unwrap();
    assert_eq!(cat.get_upload(&id).await.unwrap().unwrap().expires_at_ms, Some(50_000));
    cat.touch_upload(&id, f, 20_000).await.unwrap();
    assert_eq!(cat.get_upload(&id).await.unwrap().unwrap().expires_at_ms, Some(50_000), "never earlier");
    assert!(!cat.list_expired(40_000, 1000).await.unwrap().contains(&id), "a touched upload is not due");
    assert!(matches!(cat.touch_upload(&id, f - 1, 90_000).await, Err(CatalogError::Fenced)));
    assert!(matches!(cat.touch_upload(&format!("{p}nope"), 1, 1).await, Err(CatalogError::NotFound)));
}

pub async fn check_reclaim_owner(cat: &dyn Catalog, p: &str) {
    let owner = format!("{p}me-before-the-crash");
    let id = format!("{p}reclaim");
    cat.create_upload(&record(&id, "alice", Concat::None)).await.unwrap();
    let g = granted(cat.acquire_upload_lease(&id, &owner, 3_600_000).await.unwrap());
    let kind = format!("{p}reclaimkind");
    let task = new_task(&format!("{p}reclaimtask"), &kind);
    cat.start_task(&task).await.unwrap();
    let claimed = cat.claim_task(&owner, std::slice::from_ref(&kind), 3_600_000).await.unwrap().expect("claimed");
    assert!(cat.claim_task("other", std::slice::from_ref(&kind), 3_600_000).await.unwrap().is_none(), "held for an hour");
    let (uploads, tasks) = cat.reclaim_owner(&owner).await.unwrap();
    assert!(uploads >= 1 && tasks >= 1, "reclaimed ({uploads}, {tasks})");
    let t = granted(cat.acquire_upload_lease(&id, "me-now", 60_000).await.unwrap());
    assert!(t.fence > g.fence && t.takeovers == g.takeovers + 1, "a reclaimed upload lease is taken at once, with a repair");
    let again = cat.claim_task("me-now", std::slice::from_ref(&kind), 60_000).await.unwrap().expect("a reclaimed task is claimable at once");
    assert_eq!(again.id, claimed.id);
    assert!(again.fence > claimed.fence, "task fences grow too");
    assert!(
        matches!(cat.update_task(&claimed.id, Some(claimed.fence), &Default::default()).await, Err(CatalogError::Fenced)),
        "the dead run is fenced out"
    );
    assert_eq!(cat.reclaim_owner(&format!("{p}nobody")).await.unwrap(), (0, 0));
}

fn new_task(id: &str, kind: &str) -> NewTask {
    NewTask {
        id: id.to_string(),
        principal: "alice".into(),
        kind: kind.to_string(),
        args: "{}".into(),
        idempotency_key: None,
        ttl_ms: 60_000,
        now_ms: 1_000,
    }
}

pub async fn check_task_lease_database_clock(cat: &dyn Catalog, p: &str) {
    let kind = format!("{p}clockkind");
    cat.start_task(&new_task(&format!("{p}clocktask"), &kind)).await.unwrap();
    let local = unix_ms();
    let t = cat.claim_task("a", std::slice::from_ref(&kind), 60_000).await.unwrap().expect("claimed");
    let exp = t.lease_expires_ms.expect("leased");
    assert!((exp - (local + 60_000)).abs() < 600_000, "task lease expiry {exp} is database now + lease in Unix ms");
    assert!(cat.claim_task("b", std::slice::from_ref(&kind), 60_000).await.unwrap().is_none());
    cat.renew_lease(&t.id, t.fence, 0).await.unwrap(); // expires at database now
    let u = cat.claim_task("b", std::slice::from_ref(&kind), 60_000).await.unwrap().expect("an expired task lease is claimable");
    assert!(u.fence > t.fence);
    assert!(matches!(cat.renew_lease(&t.id, t.fence, 60_000).await, Err(CatalogError::Fenced)), "the old holder lost it");
}

pub async fn check_release_requests(cat: &dyn Catalog, p: &str) {
    let id = format!("{p}releasereq");
    let mut stream = cat.release_requests().await.unwrap();
    cat.request_release(&id, "asker").await.unwrap();
    let got = tokio::time::timeout(Duration::from_secs(30), async {
        loop {
            match stream.next().await {
                Some(x) if x.upload_id == id => {
                    assert_eq!(x.from, "asker", "the request names who asked");
                    return x.upload_id;
                }
                Some(_) => continue,
                None => panic!("the release request stream ended"),
            }
        }
    })
    .await
    .expect("a release request arrives");
    assert_eq!(got, id);
}

pub async fn check_shared_secret(cat: &dyn Catalog, p: &str) {
    let name = format!("{p}secret");
    assert_eq!(cat.shared_secret(&name, &[1; 32]).await.unwrap(), vec![1; 32], "the first candidate is stored");
    assert_eq!(cat.shared_secret(&name, &[2; 32]).await.unwrap(), vec![1; 32], "later candidates get the stored value");
}

pub async fn check_mcp_sessions(cat: &dyn Catalog, p: &str) {
    let (old, new) = (format!("{p}session-old"), format!("{p}session-new"));
    assert_eq!(cat.get_mcp_session(&old, 10).await.unwrap(), None, "unknown session");
    cat.put_mcp_session(&old, "{\"a\":1}", 1_000).await.unwrap();
    cat.put_mcp_session(&old, "{\"a\":2}", 1_000).await.unwrap();
    cat.put_mcp_session(&new, "{}", 1_000).await.unwrap();
    assert_eq!(cat.get_mcp_session(&old, 1_000).await.unwrap().as_deref(), Some("{\"a\":2}"), "a second put replaces the state");
    // Reading marks the session used: only the one not read since 1 000 is forgotten.
    assert_eq!(cat.get_mcp_session(&new, 5_000).await.unwrap().as_deref(), Some("{}"));
    assert!(cat.forget_mcp_sessions(2_000).await.unwrap() >= 1);
    assert_eq!(cat.get_mcp_session(&old, 6_000).await.unwrap(), None, "unused since 1 000: forgotten");
    assert!(cat.get_mcp_session(&new, 6_000).await.unwrap().is_some(), "used at 5 000: kept");
    cat.delete_mcp_session(&new).await.unwrap();
    cat.delete_mcp_session(&new).await.unwrap();
    assert_eq!(cat.get_mcp_session(&new, 7_000).await.unwrap(), None, "deleted");
}

pub async fn check_racing_lease(a: &dyn Catalog, b: &dyn Catalog, p: &str) {
    for round in 0..20 {
        let id = format!("{p}racelease{round}");
        a.create_upload(&record(&id, "alice", Concat::None)).await.unwrap();
        let (x, y) = futures::join!(a.acquire_upload_lease(&id, "a", 3_600_000), b.acquire_upload_lease(&id, "b", 3_600_000));
        let wins = [x.unwrap(), y.unwrap()].iter().filter(|o| matches!(o, LeaseOutcome::Granted(_))).count();
        assert_eq!(wins, 1, "exactly one of two processes gets an upload lease (round {round})");
    }
}

pub async fn check_racing_claim(a: &dyn Catalog, b: &dyn Catalog, p: &str) {
    let kind = format!("{p}racekind");
    for round in 0..20 {
        a.start_task(&new_task(&format!("{p}racetask{round}"), &kind)).await.unwrap();
    }
    let mut seen = std::collections::HashSet::new();
    for _ in 0..20 {
        let (x, y) =
            futures::join!(a.claim_task("a", std::slice::from_ref(&kind), 3_600_000), b.claim_task("b", std::slice::from_ref(&kind), 3_600_000));
        for t in [x.unwrap(), y.unwrap()].into_iter().flatten() {
            assert!(seen.insert(t.id.clone()), "task {} claimed twice", t.id);
        }
    }
    assert_eq!(seen.len(), 20, "every task claimed exactly once");
}

pub async fn check_racing_expiry(a: &dyn Catalog, b: &dyn Catalog, p: &str) {
    for round in 0..20 {
        let id = format!("{p}raceexpiry{round}");
        let mut rec = record(&id, "alice", Concat::None);
        rec.expires_at_ms = Some(5_000);
        a.create_upload(&rec).await.unwrap();
        let (x, y) = futures::join!(a.expire_if_due(&id, 6_000), b.expire_if_due(&id, 6_000));
        assert_eq!([x.unwrap(), y.unwrap()].iter().filter(|w| **w).count(), 1, "exactly one sweeper tombstones (round {round})");
    }
}

pub async fn check_release_request_crosses_handles(a: &dyn Catalog, b: &dyn Catalog, p: &str) {
    let id = format!("{p}crossrelease");
    let mut on_a = a.release_requests().await.unwrap();
    b.request_release(&id, "b").await.unwrap();
    tokio::time::timeout(Duration::from_secs(30), async {
        while let Some(x) = on_a.next().await {
            if x.upload_id == id {
                return;
            }
        }
        panic!("stream ended");
    })
    .await
    .expect("a request made through one handle reaches the other");
}

/// `ferry check`'s catalog calls: paging through every row in id order, and damage marks —
/// only on finished live uploads, replaced, cleared, and gone with their upload.
pub async fn check_damage_marks_and_paging(cat: &dyn Catalog, p: &str) {
    let ids: Vec<String> = (0..5).map(|i| format!("{p}dmg{i}")).collect();
    for id in &ids {
        cat.create_upload(&record(id, "alice", Concat::None)).await.unwrap();
    }
    // Page through everything, two at a time: every row once, in id order.
    let mut seen = Vec::new();
    let mut after = String::new();
    loop {
        let page = cat.list_uploads_after(&after, 2).await.unwrap();
        let Some(last) = page.last() else { break };
        assert!(page.len() <= 2);
        after = last.id.clone();
        seen.extend(page.into_iter().map(|r| r.id));
    }
    let mut sorted = seen.clone();
    sorted.sort();
    assert_eq!(seen, sorted, "id order");
    sorted.dedup();
    assert_eq!(sorted.len(), seen.len(), "each row once");
    assert!(ids.iter().all(|id| seen.contains(id)));

    let d = super::Damage { kind: "missing".into(), detail: "the blob store has 0 of 10 bytes".into(), found_at_ms: 7 };
    assert!(!cat.set_damage(&ids[0], Some(&d)).await.unwrap(), "an unfinished upload is never marked");
    assert_eq!(cat.damage(&ids[0]).await.unwrap(), None);
    assert!(!cat.set_damage(&format!("{p}dmg-none"), Some(&d)).await.unwrap(), "an unknown id is never marked");
    for id in &ids[1..3] {
        let f = cat.acquire_fence(id).await.unwrap();
        let cp = Checkpoint {
            offset: 10,
            hash_state: vec![1],
            blob_state: Vec::new(),
            blob_entries_from: None,
            length: Some(10),
            finished_sha256: Some([4; 32]),
            expires_at_ms: None,
            now_ms: 5,
        };
        cat.checkpoint(id, f, &cp).await.unwrap();
    }
    assert!(cat.set_damage(&ids[1], Some(&d)).await.unwrap());
    assert_eq!(cat.damage(&ids[1]).await.unwrap(), Some(d.clone()));
    let again = super::Damage { kind: "sha256_mismatch".into(), detail: "other".into(), found_at_ms: 9 };
    assert!(cat.set_damage(&ids[1], Some(&again)).await.unwrap(), "a later finding replaces the mark");
    assert_eq!(cat.damage(&ids[1]).await.unwrap(), Some(again));
    assert!(cat.set_damage(&ids[1], None).await.unwrap(), "cleared");
    assert!(!cat.set_damage(&ids[1], None).await.unwrap(), "clearing twice changes nothing");
    assert_eq!(cat.damage(&ids[1]).await.unwrap(), None);
    assert!(cat.set_damage(&ids[2], Some(&d)).await.unwrap());
    assert!(cat.delete_upload(&ids[2]).await.unwrap());
    assert_eq!(cat.damage(&ids[2]).await.unwrap(), None, "the mark goes with its upload");
    cat.create_upload(&record(&ids[2], "alice", Concat::None)).await.unwrap();
    assert_eq!(cat.damage(&ids[2]).await.unwrap(), None, "a new upload of the same id starts unmarked");
}
