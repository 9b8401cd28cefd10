//! Concurrency checks of the catalog conformance suite: two handles on one database (two
//! pools — for PostgreSQL, what two replicas have) racing each other. Each check runs its
//! contenders as separate tokio tasks, so their statements really interleave.
//!
//! Each check panics with a message on a violated guarantee.

use std::collections::HashSet;
use std::sync::Arc;

use super::conformance_tasks::new_task;
use super::tasks::{StartOutcome, TaskEnd, TaskStatus};
use super::{Catalog, CatalogError, Checkpoint, Concat, LeaseOutcome, UploadRecord};

/// An hour: a lease that cannot run out during a check.
const LIVE: i64 = 3_600_000;

fn now() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).expect("clock after 1970").as_millis() as i64
}

fn upload(id: &str, expires_at_ms: Option<i64>) -> UploadRecord {
    UploadRecord {
        id: id.to_string(),
        principal: "alice".to_string(),
        length: Some(100),
        offset: 0,
        metadata: String::new(),
        hash_state: vec![0],
        sha256: None,
        expected_sha256: None,
        concat: Concat::None,
        created_at_ms: now(),
        updated_at_ms: now(),
        expires_at_ms,
        finished_at_ms: None,
        expired: false,
        blob_state: Vec::new(),
        provisional: false,
    }
}

fn cp(offset: u64, finished: bool) -> Checkpoint {
    Checkpoint {
        offset,
        hash_state: vec![offset as u8; 104],
        blob_state: offset.to_be_bytes().to_vec(),
        blob_entries_from: None,
        length: None,
        finished_sha256: finished.then_some([9; 32]),
        expires_at_ms: Some(now() + LIVE),
        now_ms: now(),
    }
}

/// Run every concurrency check with two handles `a` and `b` on one database.
pub async fn run_all(a: Arc<dyn Catalog>, b: Arc<dyn Catalog>, p: &str) {
    check_racing_claims(a.clone(), b.clone(), p).await;
    check_racing_idempotent_starts(a.clone(), b.clone(), p).await;
    check_racing_upload_leases(a.clone(), b.clone(), p).await;
    check_stale_fence_checkpoints(a.clone(), b.clone(), p).await;
    check_expiry_vs_finish(a.clone(), b.clone(), p).await;
    check_task_expiry_vs_finish(a.clone(), b.clone(), p).await;
    check_racing_answers_and_cancel(a.clone(), b.clone(), p).await;
    check_reopen_keeps_fence(a.as_ref(), p).await;
    check_shared_secret_race(a, b, p).await;
}

/// Eight workers on two handles drain 60 tasks: every task is claimed exactly once.
pub async fn check_racing_claims(a: Arc<dyn Catalog>, b: Arc<dyn Catalog>, p: &str) {
    let kind = format!("{p}race");
    let n = 60;
    for i in 0..n {
        a.start_task(&new_task(&format!("{p}race{i:03}"), "alice", &kind, "{}", None)).await.unwrap();
    }
    let mut workers = Vec::new();
    for w in 0..8 {
        let cat = if w % 2 == 0 { a.clone() } else { b.clone() };
        let kinds = vec![kind.clone()];
        workers.push(tokio::spawn(async move {
            let mut got = Vec::new();
            while let Some(t) = cat.claim_task(&format!("worker-{w}"), &kinds, LIVE).await.expect("claim") {
                got.push(t.id);
            }
            got
        }));
    }
    let mut seen = HashSet::new();
    let mut total = 0;
    for w in workers {
        for id in w.await.unwrap() {
            total += 1;
            assert!(seen.insert(id.clone()), "task {id} was claimed twice");
        }
    }
    assert_eq!((total, seen.len()), (n, n), "every task claimed exactly once");
    for id in seen {
        let t = a.get_task(&id).await.unwrap().unwrap();
        assert_eq!(t.runs, 1, "{id} ran once");
        a.cancel_task(&id, now()).await.unwrap();
    }
}

/// Ten starts with one idempotency key on two handles at once: one run, everyone gets it.
pub async fn check_racing_idempotent_starts(a: Arc<dyn Catalog>, b: Arc<dyn Catalog>, p: &str) {
    let kind = format!("{p}idemrace");
    let mut starts = Vec::new();
    for i in 0..10 {
        let cat = if i % 2 == 0 { a.clone() } else { b.clone() };
        let new = new_task(&format!("{p}idemrace{i}"), "alice", &kind, "{\"x\":1}", Some("one-key"));
        starts.push(tokio::spawn(async move { cat.start_task(&new).await.expect("start") }));
    }
    let mut created = Vec::new();
    let mut joined = HashSet::new();
    for s in starts {
        match s.await.unwrap() {
            StartOutcome::Created(t) => created.push(t.id),
            StartOutcome::Existing(t) => {
                joined.insert(t.id);
            }
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(created.len(), 1, "exactly one run is created: {created:?}");
    assert!(joined.iter().all(|id| *id == created[0]), "every other start joins it: {joined:?}");
    a.cancel_task(&created[0], now()).await.unwrap();
}

/// Many takers of one upload lease at once, on two handles: exactly one is granted.
pub async fn check_racing_upload_leases(a: Arc<dyn Catalog>, b: Arc<dyn Catalog>, p: &str) {
    let id = format!("{p}leaserace");
    a.create_upload(&upload(&id, None)).await.unwrap();
    let mut takers = Vec::new();
    for i in 0..10 {
        let cat = if i % 2 == 0 { a.clone() } else { b.clone() };
        let id = id.clone();
        takers.push(tokio::spawn(async move { cat.acquire_upload_lease(&id, &format!("owner-{i}"), LIVE).await.expect("acquire") }));
    }
    let mut granted = Vec::new();
    for t in takers {
        if let LeaseOutcome::Granted(g) = t.await.unwrap() {
            granted.push(g);
        }
    }
    assert_eq!(granted.len(), 1, "one holder at a time: {granted:?}");
    a.release_upload_lease(&id, granted[0].fence).await.unwrap();
}

/// Two writers checkpoint one upload from two handles, the second having taken the fence
/// later: from then on only the newer one's checkpoints land, and the offset never goes
/// back to a stale writer's value.
pub async fn check_stale_fence_checkpoints(a: Arc<dyn Catalog>, b: Arc<dyn Catalog>, p: &str) {
    let id = format!("{p}stale");
    a.create_upload(&upload(&id, None)).await.unwrap();
    let old = a.acquire_fence(&id).await.unwrap();
    a.checkpoint(&id, old, &cp(10, false)).await.unwrap();
    let new = b.acquire_fence(&id).await.unwrap();
    assert!(new > old);
    let (sa, sb) = (a.clone(), b.clone());
    let (ia, ib) = (id.clone(), id.clone());
    let stale = tokio::spawn(async move {
        let mut refused = 0;
        for off in 11..40 {
            if matches!(sa.checkpoint(&ia, old, &cp(off, false)).await, Err(CatalogError::Fenced)) {
                refused += 1;
            }
        }
        refused
    });
    let current = tokio::spawn(async move {
        for off in 50..80 {
            sb.checkpoint(&ib, new, &cp(off, false)).await.expect("the current fence is accepted");
        }
    });
    assert_eq!(stale.await.unwrap(), 29, "every stale checkpoint is refused");
    current.await.unwrap();
    let row = a.get_upload(&id).await.unwrap().unwrap();
    assert_eq!((row.offset, row.blob_state.clone()), (79, 79u64.to_be_bytes().to_vec()), "offset and blob state are the current writer's");
}

/// A sweeper and a finishing writer race on an upload whose expiry has passed: either the
/// writer finished first and the upload is never tombstoned, or the sweeper won and the
/// writer is fenced out — never a finished tombstone, never a lost finish that reported
/// success.
pub async fn check_expiry_vs_finish(a: Arc<dyn Catalog>, b: Arc<dyn Catalog>, p: &str) {
    for round in 0..20 {
        let id = format!("{p}evf{round}");
        a.create_upload(&upload(&id, Some(now() - 1_000))).await.unwrap();
        let fence = a.acquire_fence(&id).await.unwrap();
        let (wa, sb) = (a.clone(), b.clone());
        let (iw, is) = (id.clone(), id.clone());
        let writer = tokio::spawn(async move {
            let mut c = cp(100, true);
            c.length = Some(100);
            wa.checkpoint(&iw, fence, &c).await
        });
        let sweeper = tokio::spawn(async move { sb.expire_if_due(&is, now()).await.expect("sweep") });
        let (finished, swept) = (writer.await.unwrap(), sweeper.await.unwrap());
        let row = a.get_upload(&id).await.unwrap().unwrap();
        match (finished, swept) {
            (Ok(()), false) => assert!(row.is_finished() && !row.expired, "finished, not swept: {row:?}"),
            (Err(CatalogError::Fenced), true) => assert!(row.expired && !row.is_finished(), "swept, writer fenced: {row:?}"),
            (f, s) => panic!("round {round}: finish {f:?} and sweep {s} both won: {row:?}"),
        }
        if row.is_finished() {
            assert!(!b.mark_expired(&id, now()).await.unwrap(), "mark_expired never tombstones a finished upload");
            assert!(!b.get_upload(&id).await.unwrap().unwrap().expired);
        }
    }
}

/// A worker whose task lease ran out races the worker that took the task over: only the
/// new holder's end lands, and a terminal status never changes again.
pub async fn check_task_expiry_vs_finish(a: Arc<dyn Catalog>, b: Arc<dyn Catalog>, p: &str) {
    let kind = format!("{p}tevf");
    for round in 0..10 {
        let id = format!("{p}tevf{round}");
        a.start_task(&new_task(&id, "alice", &kind, "{}", None)).await.unwrap();
        let old = a.claim_task("old", std::slice::from_ref(&kind), -60_000).await.unwrap().expect("claim");
        let new = b.claim_task("new", std::slice::from_ref(&kind), LIVE).await.unwrap().expect("the expired lease is taken over");
        assert_eq!(new.id, id);
        let (ca, cb) = (a.clone(), b.clone());
        let (i1, i2) = (id.clone(), id.clone());
        let late = tokio::spawn(async move { ca.finish_task(&i1, Some(old.fence), &TaskEnd::Completed("\"old\"".into()), now()).await.unwrap() });
        let current = tokio::spawn(async move { cb.finish_task(&i2, Some(new.fence), &TaskEnd::Completed("\"new\"".into()), now()).await.unwrap() });
        assert!(!late.await.unwrap(), "the expired holder's result is discarded");
        assert!(current.await.unwrap(), "the current holder's result lands");
        let row = a.get_task(&id).await.unwrap().unwrap();
        assert_eq!((row.status, row.result.as_deref()), (TaskStatus::Completed, Some("\"new\"")));
    }
}

/// Two answers to one input request from two handles: exactly one is accepted. Then a
/// cancel and a finish race: whichever wins, the status never changes afterwards.
pub async fn check_racing_answers_and_cancel(a: Arc<dyn Catalog>, b: Arc<dyn Catalog>, p: &str) {
    let kind = format!("{p}answers");
    for round in 0..10 {
        let id = format!("{p}answers{round}");
        a.start_task(&new_task(&id, "alice", &kind, "{}", None)).await.unwrap();
        let t = a.claim_task("w", std::slice::from_ref(&kind), LIVE).await.unwrap().unwrap();
        a.park_for_input(&id, t.fence, "q", "{}", now()).await.unwrap();
        let (ca, cb) = (a.clone(), b.clone());
        let (i1, i2) = (id.clone(), id.clone());
        let r1 = tokio::spawn(async move { ca.respond_input(&i1, "q", "1", now()).await.unwrap() });
        let r2 = tokio::spawn(async move { cb.respond_input(&i2, "q", "2", now()).await.unwrap() });
        let (r1, r2) = (r1.await.unwrap(), r2.await.unwrap());
        assert!(r1 ^ r2, "exactly one answer is accepted ({r1}, {r2})");
        let t = a.claim_task("w", std::slice::from_ref(&kind), LIVE).await.unwrap().expect("answered → claimable");
        let (ca, cb) = (a.clone(), b.clone());
        let (i1, i2) = (id.clone(), id.clone());
        let fin = tokio::spawn(async move { ca.finish_task(&i1, Some(t.fence), &TaskEnd::Completed("1".into()), now()).await.unwrap() });
        let cancel = tokio::spawn(async move { cb.cancel_task(&i2, now()).await.unwrap() });
        let (finished, cancelled) = (fin.await.unwrap(), cancel.await.unwrap());
        let row = a.get_task(&id).await.unwrap().unwrap();
        if finished {
            assert_eq!(row.status, TaskStatus::Completed, "the finish won: cancel left it alone");
            assert_eq!(cancelled.status, TaskStatus::Completed);
        } else {
            assert_eq!(row.status, TaskStatus::Cancelled, "the cancel won: the finish was discarded");
        }
    }
}

/// Reopening a finished upload keeps its row and its fence: a token issued before can never
/// become current again.
pub async fn check_reopen_keeps_fence(cat: &dyn Catalog, p: &str) {
    let id = format!("{p}reopen");
    cat.create_upload(&upload(&id, None)).await.unwrap();
    let f1 = cat.acquire_fence(&id).await.unwrap();
    let mut done = cp(100, true);
    done.length = Some(100);
    cat.checkpoint(&id, f1, &done).await.unwrap();
    let f2 = cat.acquire_fence(&id).await.unwrap();
    cat.reopen_upload(&id, f2, &cp(40, false)).await.expect("reopen under the current fence");
    let row = cat.get_upload(&id).await.unwrap().unwrap();
    assert_eq!((row.offset, row.length, row.sha256, row.finished_at_ms), (40, None, None, None), "reopened at the checkpoint");
    assert_eq!(row.blob_state, 40u64.to_be_bytes().to_vec());
    assert!(matches!(cat.reopen_upload(&id, f1, &cp(0, false)).await, Err(CatalogError::Fenced)), "reopen needs the current fence");
    assert!(matches!(cat.checkpoint(&id, f1, &cp(1, false)).await, Err(CatalogError::Fenced)), "an old token stays stale after a reopen");
    let f3 = cat.acquire_fence(&id).await.unwrap();
    assert!(f3 > f2, "fences only grow");
}

/// Replicas starting together agree on one shared secret.
pub async fn check_shared_secret_race(a: Arc<dyn Catalog>, b: Arc<dyn Catalog>, p: &str) {
    let name = format!("{p}secret");
    let mut racers = Vec::new();
    for i in 0..6u8 {
        let cat = if i % 2 == 0 { a.clone() } else { b.clone() };
        let name = name.clone();
        racers.push(tokio::spawn(async move { cat.shared_secret(&name, &[i; 32]).await.expect("secret") }));
    }
    let mut values = HashSet::new();
    for r in racers {
        values.insert(r.await.unwrap());
    }
    assert_eq!(values.len(), 1, "every replica got the same secret");
    let v = values.into_iter().next().unwrap();
    assert_eq!(a.shared_secret(&name, &[99; 32]).await.unwrap(), v, "never replaced");
}
