//! The conformance suite every [`Catalog`] backend must pass: plain async functions over
//! `&dyn Catalog`, called by each backend's tests (SQLite now; PostgreSQL later).
//!
//! Each check panics with a message on a violated guarantee.

use super::{Catalog, CatalogError, Checkpoint, Concat, CreationKey, KeyedCreate, UploadRecord};

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
    check_concat_lookup(cat, prefix).await;
    check_listing_is_per_principal(cat, prefix).await;
    check_creation_keys(cat, prefix).await;
    cat.ping().await.expect("ping");
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
    let cp = Checkpoint { offset: 42, hash_state: vec![9; 110], length: None, finished_sha256: None, expires_at_ms: Some(20_000), now_ms: 2_000 };
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
    let cp = Checkpoint { offset: big, hash_state: vec![1], length: Some(big), finished_sha256: Some([3; 32]), expires_at_ms: Some(1), now_ms: 3_000 };
    cat.checkpoint(&id, f, &cp).await.unwrap();
    let got = cat.get_upload(&id).await.unwrap().unwrap();
    assert_eq!((got.offset, got.length, got.sha256, got.finished_at_ms), (big, Some(big), Some([3; 32]), Some(3_000)));
    assert!(got.is_finished());
    assert_eq!(got.expires_at_ms, None, "finished uploads never expire");
    assert!(!cat.list_unfinished().await.unwrap().iter().any(|r| r.id == id));
}

pub async fn check_expiry_and_tombstones(cat: &dyn Catalog, p: &str) {
    let id = format!("{p}expiry");
    let mut rec = record(&id, "alice", Concat::None);
    rec.expires_at_ms = Some(5_000);
    cat.create_upload(&rec).await.unwrap();
    assert!(!cat.list_expired(4_999, 100).await.unwrap().contains(&id));
    assert!(cat.list_expired(5_000, 100).await.unwrap().contains(&id));
    let f = cat.acquire_fence(&id).await.unwrap();
    cat.mark_expired(&id, 6_000).await.unwrap();
    cat.mark_expired(&id, 7_000).await.expect("idempotent");
    assert!(cat.get_upload(&id).await.unwrap().unwrap().expired);
    let cp = Checkpoint { offset: 1, hash_state: vec![], length: None, finished_sha256: None, expires_at_ms: None, now_ms: 1 };
    assert!(matches!(cat.checkpoint(&id, f, &cp).await, Err(CatalogError::Fenced)), "expiry fences out writers");
    assert!(!cat.list_expired(i64::MAX, 100).await.unwrap().contains(&id), "tombstones are not listed again");
    assert!(!cat.list_tombstones(6_000, 100).await.unwrap().contains(&id), "kept until its time");
    assert!(cat.list_tombstones(6_001, 100).await.unwrap().contains(&id));
    assert!(!cat.list_unfinished().await.unwrap().iter().any(|r| r.id == id));
    assert!(cat.delete_upload(&id).await.unwrap());
    assert!(!cat.delete_upload(&id).await.unwrap(), "delete is idempotent");
    assert!(cat.get_upload(&id).await.unwrap().is_none());
    assert!(matches!(cat.mark_expired(&id, 1).await, Err(CatalogError::NotFound)));
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
            assert_eq!(upload, first, "the existing upload, as get_upload reads it");
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
