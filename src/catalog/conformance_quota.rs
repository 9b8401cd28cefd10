//! Conformance of per-principal quotas and retention (issue 13 item 4) for every [`Catalog`]
//! backend: what [`Catalog::usage`] counts, that [`Catalog::create_upload_within`] inserts
//! nothing over a limit (also when two handles — two replicas — create at once), and the
//! retention compare-and-set. Called from [`super::conformance::run_all`] and `run_concurrent`.

use super::{Catalog, CatalogError, Checkpoint, Concat, CreationKey, KeyedCreate, PrincipalScope, Quota, UploadRecord};

fn rec(id: &str, principal: &str, length: Option<u64>, now: i64) -> UploadRecord {
    UploadRecord {
        id: id.to_string(),
        principal: principal.to_string(),
        length,
        offset: 0,
        metadata: String::new(),
        hash_state: vec![1],
        sha256: None,
        expected_sha256: None,
        concat: Concat::None,
        created_at_ms: now,
        updated_at_ms: now,
        expires_at_ms: Some(now + 60_000),
        finished_at_ms: None,
        expired: false,
        blob_state: Vec::new(),
        provisional: false,
    }
}

fn finish(len: u64, now: i64) -> Checkpoint {
    Checkpoint {
        offset: len,
        hash_state: vec![2],
        blob_state: Vec::new(),
        blob_entries_from: None,
        length: Some(len),
        finished_sha256: Some([3; 32]),
        expires_at_ms: None,
        now_ms: now,
    }
}

pub async fn check_usage_and_quota(cat: &dyn Catalog, p: &str) {
    let who = format!("{p}quser");
    let now = 1_000_000;
    let u = cat.usage(&who, now).await.unwrap();
    assert_eq!((u.bytes, u.uploads_in_progress), (0, 0), "a principal with nothing uses nothing");
    // A known length reserves it; a deferred one counts its offset; a finished one its length.
    cat.create_upload(&rec(&format!("{p}q1"), &who, Some(400), now)).await.unwrap();
    cat.create_upload(&rec(&format!("{p}q2"), &who, None, now)).await.unwrap();
    let f = cat.acquire_fence(&format!("{p}q2")).await.unwrap();
    cat.checkpoint(
        &format!("{p}q2"),
        f,
        &Checkpoint {
            offset: 50,
            hash_state: vec![1],
            blob_state: Vec::new(),
            blob_entries_from: None,
            length: None,
            finished_sha256: None,
            expires_at_ms: Some(now + 60_000),
            now_ms: now,
        },
    )
    .await
    .unwrap();
    cat.create_upload(&rec(&format!("{p}q3"), &who, Some(100), now)).await.unwrap();
    let f = cat.acquire_fence(&format!("{p}q3")).await.unwrap();
    cat.checkpoint(&format!("{p}q3"), f, &finish(100, now)).await.unwrap();
    // Tombstones and unfinished uploads past their expiry count nothing.
    cat.create_upload(&rec(&format!("{p}q4"), &who, Some(1_000), now)).await.unwrap();
    assert!(cat.mark_expired(&format!("{p}q4"), now).await.unwrap());
    let mut stale = rec(&format!("{p}q5"), &who, Some(1_000), now);
    stale.expires_at_ms = Some(now - 1);
    cat.create_upload(&stale).await.unwrap();
    cat.create_upload(&rec(&format!("{p}q6"), &format!("{p}other"), Some(9_999), now)).await.unwrap();
    let u = cat.usage(&who, now).await.unwrap();
    assert_eq!((u.bytes, u.uploads_in_progress), (550, 2), "400 reserved + 50 stored + 100 finished; two unfinished");

    // Over the bytes quota: refused with the use without the new row, nothing inserted.
    let quota = Quota { max_bytes: Some(600), max_uploads_in_progress: Some(3) };
    let big = rec(&format!("{p}q7"), &who, Some(51), now);
    match cat.create_upload_within(&big, None, &quota).await {
        Err(CatalogError::QuotaExceeded(q)) => assert_eq!((q.name, q.limit, q.used, q.requested), ("bytes", 600, 550, 51)),
        other => panic!("expected QuotaExceeded, got {other:?}"),
    }
    assert!(cat.get_upload(&big.id).await.unwrap().is_none(), "nothing inserted over the quota");
    let fits = rec(&format!("{p}q8"), &who, Some(50), now);
    assert!(matches!(cat.create_upload_within(&fits, None, &quota).await, Ok(KeyedCreate::Created)));
    // Uploads in progress: three now; a fourth (even of 0 bytes) is refused.
    let fourth = rec(&format!("{p}q9"), &who, None, now);
    match cat.create_upload_within(&fourth, None, &quota).await {
        Err(CatalogError::QuotaExceeded(q)) => assert_eq!((q.name, q.limit, q.used, q.requested), ("uploads_in_progress", 3, 3, 1)),
        other => panic!("expected QuotaExceeded, got {other:?}"),
    }
    // A retried creation under its key finds its upload, whatever the quota says now.
    let key = CreationKey { key: "k:retry".into(), fingerprint: "fp".into() };
    let who2 = format!("{p}quser2");
    let q1 = Quota { max_bytes: Some(10), max_uploads_in_progress: None };
    assert!(matches!(cat.create_upload_within(&rec(&format!("{p}qa"), &who2, Some(10), now), Some(&key), &q1).await, Ok(KeyedCreate::Created)));
    match cat.create_upload_within(&rec(&format!("{p}qb"), &who2, Some(10), now), Some(&key), &q1).await {
        Ok(KeyedCreate::Existing { upload, .. }) => assert_eq!(upload.id, format!("{p}qa")),
        other => panic!("a retry under its key must find its upload, got {other:?}"),
    }
}

pub async fn check_retention(cat: &dyn Catalog, p: &str) {
    let (a, b) = (format!("{p}ret_a"), format!("{p}ret_b"));
    for (id, who, at) in [(format!("{p}r1"), &a, 1_000), (format!("{p}r2"), &a, 5_000), (format!("{p}r3"), &b, 1_000)] {
        cat.create_upload(&rec(&id, who, Some(1), at)).await.unwrap();
        let f = cat.acquire_fence(&id).await.unwrap();
        cat.checkpoint(&id, f, &finish(1, at)).await.unwrap();
    }
    cat.create_upload(&rec(&format!("{p}r4"), &a, Some(1), 1_000)).await.unwrap();
    let only_a = cat.list_finished_before(&PrincipalScope::Only(a.clone()), 2_000, 100).await.unwrap();
    assert_eq!(only_a, vec![format!("{p}r1")], "finished before 2000, of a only; never an unfinished one");
    let others = cat.list_finished_before(&PrincipalScope::AllExcept(vec![a.clone()]), 2_000, 1_000_000).await.unwrap();
    assert!(others.contains(&format!("{p}r3")) && !others.contains(&format!("{p}r1")), "{others:?}");
    // Compare-and-set: one winner, only when still due; the id is then a tombstone.
    let id = format!("{p}r1");
    // Read once before it expires: a catalog that keeps finished rows in memory must forget it.
    assert!(!cat.get_upload(&id).await.unwrap().unwrap().expired);
    assert!(!cat.expire_finished_if_due(&id, 500, 3_000).await.unwrap(), "not due before it finished");
    assert!(cat.expire_finished_if_due(&id, 2_000, 3_000).await.unwrap());
    assert!(!cat.expire_finished_if_due(&id, 2_000, 3_000).await.unwrap(), "once only");
    assert!(cat.get_upload(&id).await.unwrap().unwrap().expired);
    assert!(!cat.expire_finished_if_due(&format!("{p}r4"), 2_000, 3_000).await.unwrap(), "an unfinished upload is not retention's");
    assert!(cat.list_tombstones(4_000, 1_000_000).await.unwrap().contains(&id), "the tombstone is forgotten like an expired upload's");
}

/// Two handles (two replicas) creating for one principal at once never pass the quota together.
pub async fn check_racing_quota(a: &dyn Catalog, b: &dyn Catalog, p: &str) {
    let who = format!("{p}qrace");
    let quota = Quota { max_bytes: Some(10 * 100), max_uploads_in_progress: None };
    let mut created = 0;
    for round in 0..20 {
        let (ra, rb) = (rec(&format!("{p}qra{round}"), &who, Some(100), 1_000), rec(&format!("{p}qrb{round}"), &who, Some(100), 1_000));
        let (x, y) = futures::join!(a.create_upload_within(&ra, None, &quota), b.create_upload_within(&rb, None, &quota));
        for r in [x, y] {
            match r {
                Ok(_) => created += 1,
                Err(CatalogError::QuotaExceeded(_)) => {}
                Err(e) => panic!("round {round}: {e}"),
            }
        }
    }
    assert_eq!(created, 10, "exactly the quota's worth of uploads was created");
    assert_eq!(a.usage(&who, 1_000).await.unwrap().bytes, 1_000);
}

/// [`Catalog::reserve_upload_bytes`]: a deferred-length upload counts its reservation; a grant
/// never passes the quota beside the principal's other uploads (nor goes below the offset); a
/// release names its reservation; and two handles (two replicas) reserving for two uploads of one
/// principal at once are granted no more than the quota together.
pub async fn check_reservations(cat: &dyn Catalog, p: &str) {
    let who = format!("{p}resv");
    let now = 1_000_000;
    let (a, b) = (format!("{p}resva"), format!("{p}resvb"));
    cat.create_upload(&rec(&a, &who, None, now)).await.unwrap();
    cat.create_upload(&rec(&b, &who, Some(300), now)).await.unwrap();
    let r = cat.reserve_upload_bytes(&a, 900, 1000, now).await.unwrap();
    assert_eq!(r.granted_to, 700, "the room beside the other upload's 300");
    assert_eq!(cat.usage(&who, now).await.unwrap().bytes, 1000, "the reservation counts");
    let q = Quota { max_bytes: Some(1000), max_uploads_in_progress: None };
    assert!(
        matches!(cat.create_upload_within(&rec(&format!("{p}resvc"), &who, Some(1), now), None, &q).await, Err(CatalogError::QuotaExceeded(_))),
        "no room beside a reservation"
    );
    let again = cat.reserve_upload_bytes(&a, 100, 1000, now).await.unwrap();
    assert_eq!(again.granted_to, 100, "a new reservation replaces the upload's own");
    cat.release_upload_bytes(&a, &r.nonce).await.unwrap();
    assert_eq!(cat.usage(&who, now).await.unwrap().bytes, 400, "a stale release frees nothing of the newer one");
    cat.release_upload_bytes(&a, &again.nonce).await.unwrap();
    assert_eq!(cat.usage(&who, now).await.unwrap().bytes, 300, "released: the upload counts its offset (0)");
    assert!(matches!(cat.reserve_upload_bytes(&format!("{p}resvnone"), 1, 1000, now).await, Err(CatalogError::NotFound)));
}

pub async fn check_racing_reservations(x: &dyn Catalog, y: &dyn Catalog, p: &str) {
    let who = format!("{p}resrace");
    let now = 1_000_000;
    let mut granted = 0;
    for round in 0..10 {
        let (a, b) = (format!("{p}rra{round}"), format!("{p}rrb{round}"));
        x.create_upload(&rec(&a, &who, None, now)).await.unwrap();
        x.create_upload(&rec(&b, &who, None, now)).await.unwrap();
        let (ra, rb) = futures::join!(x.reserve_upload_bytes(&a, 1000, 1000, now), y.reserve_upload_bytes(&b, 1000, 1000, now));
        let (ra, rb) = (ra.unwrap(), rb.unwrap());
        assert!(ra.granted_to + rb.granted_to <= 1000, "round {round}: {} + {} past the quota", ra.granted_to, rb.granted_to);
        granted += ra.granted_to + rb.granted_to;
        for id in [&a, &b] {
            x.delete_upload(id).await.unwrap();
        }
    }
    assert_eq!(granted, 10 * 1000, "each round grants the whole quota, once");
}
