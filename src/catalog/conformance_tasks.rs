//! The task half of the catalog conformance suite: every [`TaskCatalog`] guarantee of
//! DESIGN §4, checked against `&dyn Catalog`. Lease times run on the database clock, so the
//! checks never compare them with this process's clock; they use leases that are plainly
//! live (an hour) or plainly over (already expired when granted).
//!
//! Each check panics with a message on a violated guarantee.

use super::tasks::{NewTask, Progress, StartOutcome, TaskEnd, TaskStatus, TaskUpdate};
use super::{Catalog, CatalogError};

/// An hour: a lease that cannot run out during a check.
const LIVE: i64 = 3_600_000;
/// A lease that is over the moment it is granted.
const EXPIRED: i64 = -60_000;

/// Unix ms on this process's clock, for the row timestamps the caller supplies.
fn now() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).expect("clock after 1970").as_millis() as i64
}

/// A new task of `kind` for `principal`; `args` is exact JSON text.
pub fn new_task(id: &str, principal: &str, kind: &str, args: &str, key: Option<&str>) -> NewTask {
    NewTask {
        id: id.to_string(),
        principal: principal.to_string(),
        kind: kind.to_string(),
        args: args.to_string(),
        idempotency_key: key.map(str::to_owned),
        ttl_ms: 86_400_000,
        now_ms: now(),
    }
}

fn created(out: StartOutcome) -> super::TaskRecord {
    match out {
        StartOutcome::Created(t) => t,
        other => panic!("expected a new task, got {other:?}"),
    }
}

/// Claim tasks of `kind` until the one with `id` comes up (other checks' tasks of the same
/// kind may be waiting); the others are released again.
async fn claim_this(cat: &dyn Catalog, owner: &str, kind: &str, id: &str, lease_ms: i64) -> Option<super::TaskRecord> {
    let mut passed = Vec::new();
    let found = loop {
        match cat.claim_task(owner, &[kind.to_string()], lease_ms).await.expect("claim") {
            Some(t) if t.id == id => break Some(t),
            Some(t) => passed.push(t),
            None => break None,
        }
    };
    for t in passed {
        cat.release_task(&t.id, t.fence).await.unwrap();
    }
    found
}

/// Run every task check. Ids and kinds are prefixed with `p`, so the suite can share a
/// database with other data.
pub async fn run_all(cat: &dyn Catalog, p: &str) {
    check_task_create_get_exact_json(cat, p).await;
    check_task_listing(cat, p).await;
    check_task_idempotency(cat, p).await;
    check_task_claim_and_lease(cat, p).await;
    check_task_renew_and_release(cat, p).await;
    check_task_checkpoint_fenced(cat, p).await;
    check_task_input_requests(cat, p).await;
    check_task_cancel_and_terminal_never_changes(cat, p).await;
    check_task_ttl_sweep(cat, p).await;
    check_task_partials(cat, p).await;
}

/// What goes in comes back byte for byte: arguments, checkpoints, results, input requests
/// and responses are exact JSON text (key order, whitespace, number spelling, escapes).
pub async fn check_task_create_get_exact_json(cat: &dyn Catalog, p: &str) {
    let args = "{ \"z\":1,\"a\" : [1.0, 2e3, -0],\"s\":\"caf\\u00e9 \u{1F980}\\n\",\"dup\":1,\"dup\":2 }";
    let kind = format!("{p}exact");
    let t = created(cat.start_task(&new_task(&format!("{p}exact1"), "alice", &kind, args, None)).await.expect("start"));
    assert_eq!(t.args, args, "args returned by start_task are the exact text");
    assert_eq!((t.status, t.fence, t.runs, t.lease_owner.as_deref()), (TaskStatus::Working, 0, 0, None));
    let got = cat.get_task(&t.id).await.unwrap().expect("get the new task");
    assert_eq!(got, t, "get returns the row start_task returned");
    assert!(cat.get_task(&format!("{p}nosuchtask")).await.unwrap().is_none(), "unknown id → None");

    let claimed = claim_this(cat, "w1", &kind, &t.id, LIVE).await.expect("claim");
    let checkpoint = "{\"page\" : 10,\"cursor\":\"x\\\"y\",\"f\":1.50}";
    cat.update_task(
        &t.id,
        Some(claimed.fence),
        &TaskUpdate { progress: None, checkpoint: Some(checkpoint.into()), partial_mark: None, now_ms: now() },
    )
    .await
    .unwrap();
    assert_eq!(cat.get_task(&t.id).await.unwrap().unwrap().checkpoint.as_deref(), Some(checkpoint), "checkpoint text kept exactly");
    let request = "{\"question\" : \"ok?\",  \"choices\":[\"y\",\"n\"]}";
    cat.park_for_input(&t.id, claimed.fence, "q1", request, now()).await.unwrap();
    let parked = cat.get_task(&t.id).await.unwrap().unwrap();
    let requests: serde_json::Map<String, serde_json::Value> = serde_json::from_str(&parked.input_requests).unwrap();
    assert_eq!(requests.len(), 1);
    assert!(parked.input_requests.contains(request), "request text kept exactly: {}", parked.input_requests);
    let response = "{\"answer\" :\"y\" ,\"n\":1e2}";
    assert!(cat.respond_input(&t.id, "q1", response, now()).await.unwrap());
    let answered = cat.get_task(&t.id).await.unwrap().unwrap();
    assert!(answered.input_responses.contains(response), "response text kept exactly: {}", answered.input_responses);
    let again = claim_this(cat, "w1", &kind, &t.id, LIVE).await.expect("claimable after the answer");
    let result = "{\"file\":\"abc\", \"size\" : 18446744073709551615, \"sha\":\"\\u0041\"}";
    assert!(cat.finish_task(&t.id, Some(again.fence), &TaskEnd::Completed(result.into()), now()).await.unwrap());
    assert_eq!(cat.get_task(&t.id).await.unwrap().unwrap().result.as_deref(), Some(result), "result text kept exactly");
}

pub async fn check_task_listing(cat: &dyn Catalog, p: &str) {
    let kind = format!("{p}list");
    let principal = format!("{p}lister");
    let mut ids = Vec::new();
    for i in 0..3 {
        let mut n = new_task(&format!("{p}list{i}"), &principal, &kind, "{}", None);
        n.now_ms = 1_000_000 + i;
        ids.push(created(cat.start_task(&n).await.unwrap()).id);
    }
    cat.start_task(&new_task(&format!("{p}listother"), &format!("{p}someoneelse"), &kind, "{}", None)).await.unwrap();
    let listed: Vec<String> = cat.list_tasks(&principal, 100).await.unwrap().into_iter().map(|t| t.id).collect();
    ids.reverse();
    assert_eq!(listed, ids, "a principal's tasks, newest first, nobody else's");
    assert_eq!(cat.list_tasks(&principal, 2).await.unwrap().len(), 2, "limit");
    for id in ids {
        cat.cancel_task(&id, now()).await.unwrap();
    }
    cat.cancel_task(&format!("{p}listother"), now()).await.unwrap();
}

/// DESIGN §4: running or completed → the same task; failed or cancelled → a new run naming
/// the prior one; other arguments → conflict; keys are per (principal, kind).
pub async fn check_task_idempotency(cat: &dyn Catalog, p: &str) {
    let kind = format!("{p}idem");
    let key = Some("key-1");
    let first = created(cat.start_task(&new_task(&format!("{p}idem1"), "alice", &kind, "{\"n\":1}", key)).await.unwrap());
    match cat.start_task(&new_task(&format!("{p}idem2"), "alice", &kind, "{\"n\":1}", key)).await.unwrap() {
        StartOutcome::Existing(t) => assert_eq!(t.id, first.id, "a retry joins the running task"),
        other => panic!("same key, same args, running: expected Existing, got {other:?}"),
    }
    // The same JSON value in other text (spaces, key order, number spelling) is the same
    // request; the row keeps the first text exactly.
    let first2 = created(
        cat.start_task(&new_task(&format!("{p}idem1b"), "alice", &kind, "{\"n\":1,\"m\":[1,{\"a\":true,\"b\":null}]}", Some("key-json")))
            .await
            .unwrap(),
    );
    for (i, text) in
        ["{ \"m\" : [ 1.0, {\"b\":null, \"a\":true} ], \"n\" : 1e0 }", "\n{\"n\": 1, \"m\": [1, {\"a\": true, \"b\": null}]}\n"].iter().enumerate()
    {
        match cat.start_task(&new_task(&format!("{p}idem1c{i}"), "alice", &kind, text, Some("key-json"))).await.unwrap() {
            StartOutcome::Existing(t) => {
                assert_eq!((t.id.as_str(), t.args.as_str()), (first2.id.as_str(), first2.args.as_str()), "reformatted JSON joins the task")
            }
            other => panic!("same key, same JSON value in other text {text:?}: expected Existing, got {other:?}"),
        }
    }
    for text in ["{\"n\":1,\"m\":[{\"a\":true,\"b\":null},1]}", "{\"n\":1,\"m\":[1,{\"a\":true}]}", "{\"n\":\"1\",\"m\":[1,{\"a\":true,\"b\":null}]}"]
    {
        match cat.start_task(&new_task(&format!("{p}idem1d"), "alice", &kind, text, Some("key-json"))).await.unwrap() {
            StartOutcome::Conflict(id) => assert_eq!(id, first2.id, "array order, a missing member or a type change is another request"),
            other => panic!("same key, other JSON value {text:?}: expected Conflict, got {other:?}"),
        }
    }
    cat.cancel_task(&first2.id, now()).await.unwrap();
    match cat.start_task(&new_task(&format!("{p}idem3"), "alice", &kind, "{\"n\": 2}", key)).await.unwrap() {
        StartOutcome::Conflict(id) => assert_eq!(id, first.id, "other arguments → conflict naming the task"),
        other => panic!("same key, other args: expected Conflict, got {other:?}"),
    }
    assert!(cat.get_task(&format!("{p}idem2")).await.unwrap().is_none(), "a joined start creates no row");
    // Keys are per principal and per kind.
    created(cat.start_task(&new_task(&format!("{p}idem4"), "bob", &kind, "{\"n\":1}", key)).await.unwrap());
    created(cat.start_task(&new_task(&format!("{p}idem5"), "alice", &format!("{p}idemother"), "{\"n\":1}", key)).await.unwrap());

    // Failed → a new run that names the failure.
    let c = claim_this(cat, "w", &kind, &first.id, LIVE).await.unwrap();
    assert!(cat.finish_task(&first.id, Some(c.fence), &TaskEnd::Failed("{\"code\":\"task_failed\",\"message\":\"x\"}".into()), now()).await.unwrap());
    let retry = match cat.start_task(&new_task(&format!("{p}idem6"), "alice", &kind, "{\"n\":1}", key)).await.unwrap() {
        StartOutcome::Retried { task, prior } => {
            assert_eq!(prior, first.id);
            task
        }
        other => panic!("after a failure: expected Retried, got {other:?}"),
    };
    assert_eq!(retry.prior_failure.as_deref(), Some(first.id.as_str()));
    assert_eq!(retry.status, TaskStatus::Working);
    // Completed → the same answer.
    let c = claim_this(cat, "w", &kind, &retry.id, LIVE).await.unwrap();
    assert!(cat.finish_task(&retry.id, Some(c.fence), &TaskEnd::Completed("42".into()), now()).await.unwrap());
    match cat.start_task(&new_task(&format!("{p}idem7"), "alice", &kind, "{\"n\":1}", key)).await.unwrap() {
        StartOutcome::Existing(t) => assert_eq!((t.id.as_str(), t.result.as_deref()), (retry.id.as_str(), Some("42"))),
        other => panic!("after completion: expected Existing, got {other:?}"),
    }
    // Cancelled → a new run.
    let t = created(cat.start_task(&new_task(&format!("{p}idem8"), "alice", &kind, "{}", Some("key-2"))).await.unwrap());
    cat.cancel_task(&t.id, now()).await.unwrap();
    assert!(matches!(
        cat.start_task(&new_task(&format!("{p}idem9"), "alice", &kind, "{}", Some("key-2"))).await.unwrap(),
        StartOutcome::Retried { .. }
    ));
    for id in ["idem4", "idem5", "idem9"] {
        cat.cancel_task(&format!("{p}{id}"), now()).await.unwrap();
    }
}

/// Claims take only `working` tasks of the named kinds whose lease is free or over; every
/// claim grows the fence and `runs`; a claimed task is not claimed again while its lease
/// lives; after the lease is over another worker takes it and the old holder is fenced out.
pub async fn check_task_claim_and_lease(cat: &dyn Catalog, p: &str) {
    let kind = format!("{p}claim");
    assert!(cat.claim_task("w", &[], LIVE).await.unwrap().is_none(), "no kinds → nothing");
    let t = created(cat.start_task(&new_task(&format!("{p}claim1"), "alice", &kind, "{}", None)).await.unwrap());
    assert!(cat.claim_task("w", &[format!("{p}nosuchkind")], LIVE).await.unwrap().is_none(), "other kinds are not claimed");
    let a = claim_this(cat, "worker-a", &kind, &t.id, LIVE).await.expect("first claim");
    assert_eq!((a.lease_owner.as_deref(), a.runs, a.status), (Some("worker-a"), 1, TaskStatus::Working));
    assert!(a.fence > t.fence, "a claim grows the fence");
    assert!(a.lease_expires_ms.is_some());
    assert!(claim_this(cat, "worker-b", &kind, &t.id, LIVE).await.is_none(), "a live lease is never claimed twice");

    // Over: a lease granted already expired is claimable at once.
    cat.release_task(&t.id, a.fence).await.unwrap();
    let short = claim_this(cat, "worker-a", &kind, &t.id, EXPIRED).await.expect("claim after release");
    let b = claim_this(cat, "worker-b", &kind, &t.id, LIVE).await.expect("an expired lease is taken over");
    assert!(b.fence > short.fence && b.runs == short.runs + 1, "takeover grows fence and runs");
    assert_eq!(b.lease_owner.as_deref(), Some("worker-b"));
    let stale = TaskUpdate {
        progress: Some(Progress { fraction: Some(0.5), ..Default::default() }),
        checkpoint: Some("1".into()),
        partial_mark: None,
        now_ms: now(),
    };
    assert!(matches!(cat.update_task(&t.id, Some(short.fence), &stale).await, Err(CatalogError::Fenced)), "the old holder's checkpoint is refused");
    assert!(matches!(cat.renew_lease(&t.id, short.fence, LIVE).await, Err(CatalogError::Fenced)), "the old holder cannot renew");
    assert!(
        !cat.finish_task(&t.id, Some(short.fence), &TaskEnd::Completed("\"late\"".into()), now()).await.unwrap(),
        "the old holder's result is discarded"
    );
    assert!(matches!(cat.park_for_input(&t.id, short.fence, "k", "{}", now()).await, Err(CatalogError::Fenced)), "the old holder cannot park");
    let row = cat.get_task(&t.id).await.unwrap().unwrap();
    assert_eq!(
        (row.status, row.checkpoint.as_deref(), row.lease_owner.as_deref()),
        (TaskStatus::Working, None, Some("worker-b")),
        "nothing of the old holder landed"
    );
    assert!(cat.finish_task(&t.id, Some(b.fence), &TaskEnd::Completed("1".into()), now()).await.unwrap());
    let done = cat.get_task(&t.id).await.unwrap().unwrap();
    assert_eq!((done.lease_owner, done.lease_expires_ms), (None, None), "a finished task holds no lease");
    assert!(claim_this(cat, "worker-c", &kind, &t.id, LIVE).await.is_none(), "terminal tasks are never claimed");
}

pub async fn check_task_renew_and_release(cat: &dyn Catalog, p: &str) {
    let kind = format!("{p}renew");
    let t = created(cat.start_task(&new_task(&format!("{p}renew1"), "alice", &kind, "{}", None)).await.unwrap());
    let a = claim_this(cat, "worker-a", &kind, &t.id, EXPIRED).await.unwrap();
    assert_eq!(cat.renew_lease(&t.id, a.fence, LIVE).await.unwrap(), TaskStatus::Working, "renewal reports the status");
    assert!(claim_this(cat, "worker-b", &kind, &t.id, LIVE).await.is_none(), "a renewed lease is live again");
    cat.release_task(&t.id, a.fence).await.unwrap();
    let released = cat.get_task(&t.id).await.unwrap().unwrap();
    assert_eq!((released.status, released.lease_owner), (TaskStatus::Working, None), "release keeps the status, drops the lease");
    let b = claim_this(cat, "worker-b", &kind, &t.id, LIVE).await.expect("released → claimable at once");
    cat.release_task(&t.id, a.fence).await.expect("releasing with a stale fence is a no-op");
    assert_eq!(cat.get_task(&t.id).await.unwrap().unwrap().lease_owner.as_deref(), Some("worker-b"), "a stale release leaves the holder alone");
    cat.cancel_task(&t.id, now()).await.unwrap();
    assert_eq!(cat.renew_lease(&t.id, b.fence, LIVE).await.ok(), Some(TaskStatus::Cancelled), "renewal tells the holder of a cancellation");
}

/// Progress and checkpoints land only under the current fence (or, with no fence, from an
/// external producer) and only while the task is not terminal.
pub async fn check_task_checkpoint_fenced(cat: &dyn Catalog, p: &str) {
    let kind = format!("{p}ckpt");
    let t = created(cat.start_task(&new_task(&format!("{p}ckpt1"), "alice", &kind, "{}", None)).await.unwrap());
    let a = claim_this(cat, "w", &kind, &t.id, LIVE).await.unwrap();
    let mut counters = std::collections::BTreeMap::new();
    counters.insert("pages".to_string(), 7u64);
    let progress = Progress { fraction: Some(0.25), message: Some("page 7".into()), counters };
    cat.update_task(
        &t.id,
        Some(a.fence),
        &TaskUpdate { progress: Some(progress.clone()), checkpoint: Some("{\"page\":7}".into()), partial_mark: None, now_ms: now() },
    )
    .await
    .unwrap();
    cat.update_task(&t.id, Some(a.fence), &TaskUpdate { progress: None, checkpoint: None, partial_mark: None, now_ms: now() }).await.unwrap();
    let row = cat.get_task(&t.id).await.unwrap().unwrap();
    assert_eq!((row.progress, row.checkpoint.as_deref()), (progress, Some("{\"page\":7}")), "None leaves fields as they were");
    assert!(
        matches!(cat.update_task(&t.id, Some(a.fence + 1), &TaskUpdate::default()).await, Err(CatalogError::Fenced)),
        "a fence not yet issued is refused"
    );
    cat.update_task(&t.id, None, &TaskUpdate { progress: Some(Progress::default()), checkpoint: None, partial_mark: None, now_ms: now() })
        .await
        .expect("an external producer reports without a fence");
    assert!(matches!(cat.update_task(&format!("{p}nosuch"), None, &TaskUpdate::default()).await, Err(CatalogError::NotFound)));
    assert!(cat.finish_task(&t.id, None, &TaskEnd::Completed("true".into()), now()).await.unwrap(), "an external producer ends its task");
    assert!(matches!(cat.update_task(&t.id, None, &TaskUpdate::default()).await, Err(CatalogError::Fenced)), "a terminal task takes no reports");
    assert!(matches!(cat.update_task(&t.id, Some(a.fence), &TaskUpdate::default()).await, Err(CatalogError::Fenced)));
}

/// `park_for_input` → `input_required` without a lease; only an outstanding key is answered,
/// once; when every request is answered the task is `working` (claimable) again.
pub async fn check_task_input_requests(cat: &dyn Catalog, p: &str) {
    let kind = format!("{p}input");
    let t = created(cat.start_task(&new_task(&format!("{p}input1"), "alice", &kind, "{}", None)).await.unwrap());
    let a = claim_this(cat, "w", &kind, &t.id, LIVE).await.unwrap();
    cat.park_for_input(&t.id, a.fence, "first", "{\"q\":1}", now()).await.unwrap();
    let parked = cat.get_task(&t.id).await.unwrap().unwrap();
    assert_eq!((parked.status, parked.lease_owner.as_deref()), (TaskStatus::InputRequired, None), "parked: input_required, lease released");
    assert!(claim_this(cat, "w", &kind, &t.id, LIVE).await.is_none(), "an input_required task is not claimed");
    assert!(matches!(cat.park_for_input(&t.id, a.fence, "second", "{}", now()).await, Err(CatalogError::Fenced)), "parking needs a working task");
    assert!(!cat.respond_input(&t.id, "unknown", "1", now()).await.unwrap(), "a key never requested is refused");
    assert!(cat.respond_input(&t.id, "first", "\"yes\"", now()).await.unwrap());
    assert!(!cat.respond_input(&t.id, "first", "\"again\"", now()).await.unwrap(), "a key is answered once");
    let answered = cat.get_task(&t.id).await.unwrap().unwrap();
    assert_eq!(answered.status, TaskStatus::Working, "all answered → working");
    assert!(answered.input_responses.contains("\"yes\"") && !answered.input_responses.contains("again"));

    // Two requests outstanding: the task waits for both.
    let b = claim_this(cat, "w", &kind, &t.id, LIVE).await.expect("resumable after the answer");
    assert!(b.fence > a.fence);
    cat.park_for_input(&t.id, b.fence, "second", "{\"q\":2}", now()).await.unwrap();
    assert!(cat.respond_input(&t.id, "second", "2", now()).await.unwrap());
    assert!(matches!(cat.respond_input(&format!("{p}nosuch"), "k", "1", now()).await, Err(CatalogError::NotFound)));
    cat.cancel_task(&t.id, now()).await.unwrap();
    assert!(!cat.respond_input(&t.id, "second", "3", now()).await.unwrap(), "a terminal task takes no answers");
}

/// `cancelled` is terminal at once; a terminal status never changes again, whoever tries.
pub async fn check_task_cancel_and_terminal_never_changes(cat: &dyn Catalog, p: &str) {
    let kind = format!("{p}cancel");
    let t = created(cat.start_task(&new_task(&format!("{p}cancel1"), "alice", &kind, "{}", None)).await.unwrap());
    let a = claim_this(cat, "w", &kind, &t.id, LIVE).await.unwrap();
    let c = cat.cancel_task(&t.id, now()).await.unwrap();
    assert_eq!((c.status, c.lease_owner.as_deref()), (TaskStatus::Cancelled, None));
    assert_eq!(cat.renew_lease(&t.id, a.fence, LIVE).await.ok(), Some(TaskStatus::Cancelled), "the worker learns of the cancellation when it renews");
    assert!(!cat.finish_task(&t.id, Some(a.fence), &TaskEnd::Completed("1".into()), now()).await.unwrap(), "a late result is discarded");
    assert!(!cat.finish_task(&t.id, None, &TaskEnd::Failed("{}".into()), now()).await.unwrap());
    assert_eq!(cat.cancel_task(&t.id, now()).await.unwrap().status, TaskStatus::Cancelled, "cancel is idempotent");
    assert!(matches!(cat.cancel_task(&format!("{p}nosuch"), now()).await, Err(CatalogError::NotFound)));

    let d = created(cat.start_task(&new_task(&format!("{p}cancel2"), "alice", &kind, "{}", None)).await.unwrap());
    let b = claim_this(cat, "w", &kind, &d.id, LIVE).await.unwrap();
    assert!(cat.finish_task(&d.id, Some(b.fence), &TaskEnd::Completed("\"done\"".into()), now()).await.unwrap());
    let after = cat.cancel_task(&d.id, now()).await.unwrap();
    assert_eq!((after.status, after.result.as_deref()), (TaskStatus::Completed, Some("\"done\"")), "cancel leaves a completed task alone");
    assert!(!cat.finish_task(&d.id, None, &TaskEnd::Failed("{}".into()), now()).await.unwrap(), "completed never becomes failed");
    let row = cat.get_task(&d.id).await.unwrap().unwrap();
    assert_eq!((row.status, row.result.as_deref(), row.error), (TaskStatus::Completed, Some("\"done\""), None));
}

/// Terminal tasks are deleted `ttl_ms` after they ended (with their idempotency keys, so the
/// key is free again); tasks that are not terminal are never swept.
pub async fn check_task_ttl_sweep(cat: &dyn Catalog, p: &str) {
    let kind = format!("{p}ttl");
    let t0 = now();
    let mut n = new_task(&format!("{p}ttl1"), "alice", &kind, "{}", Some("ttl-key"));
    n.ttl_ms = 1_000;
    let done = created(cat.start_task(&n).await.unwrap());
    let mut n = new_task(&format!("{p}ttl2"), "alice", &kind, "{}", None);
    n.ttl_ms = 1_000;
    let running = created(cat.start_task(&n).await.unwrap());
    let c = claim_this(cat, "w", &kind, &done.id, LIVE).await.unwrap();
    assert!(cat.finish_task(&done.id, Some(c.fence), &TaskEnd::Completed("1".into()), t0).await.unwrap());
    cat.sweep_tasks(t0 + 999).await.unwrap();
    assert!(cat.get_task(&done.id).await.unwrap().is_some(), "kept until its TTL is over");
    assert!(cat.sweep_tasks(t0 + 1_000).await.unwrap() >= 1);
    assert!(cat.get_task(&done.id).await.unwrap().is_none(), "swept once its TTL is over");
    cat.sweep_tasks(t0 + 10 * LIVE).await.unwrap();
    assert!(cat.get_task(&running.id).await.unwrap().is_some(), "a working task is never swept");
    let mut n = new_task(&format!("{p}ttl3"), "alice", &kind, "{}", Some("ttl-key"));
    n.ttl_ms = 1_000;
    created(cat.start_task(&n).await.expect("the swept task's key is free again"));
    cat.cancel_task(&running.id, now()).await.unwrap();
    cat.cancel_task(&format!("{p}ttl3"), now()).await.unwrap();
}

/// Partial results (issue 27, [`super::partials`]): numbered in order, exact JSON text, one
/// `task.partial` event each in the same transaction; a run's replay of a number already taken
/// stores nothing; fenced like checkpoints; an external producer gets the next number; the
/// bounds drop the oldest and count them; a finished task takes no more.
pub async fn check_task_partials(cat: &dyn Catalog, p: &str) {
    use super::partials::{Appended, MAX_FRAGMENTS, MAX_FRAGMENT_BYTES, MAX_VIEW_BYTES};
    let kind = format!("{p}partial");
    let t = created(cat.start_task(&new_task(&format!("{p}partial1"), "alice", &kind, "{}", None)).await.expect("start"));
    assert_eq!((t.partial_seq, t.partial_dropped, t.partial_mark), (0, 0, 0));
    let page = cat.task_partials(&t.id, 0).await.unwrap();
    assert!(page.fragments.is_empty() && page.next == 0 && page.dropped == 0, "a new task has no fragments: {page:?}");
    let a = claim_this(cat, "w1", &kind, &t.id, LIVE).await.expect("claim");
    let values = ["{\"rows\" : 1}", "[1, 2.50, \"caf\\u00e9\"]", "\"three\""];
    for (i, v) in values.iter().enumerate() {
        assert_eq!(cat.append_partial(&t.id, Some(a.fence), i as u64 + 1, v, now()).await.unwrap(), Appended::Stored(i as u64 + 1));
    }
    let page = cat.task_partials(&t.id, 0).await.unwrap();
    assert_eq!(
        page.fragments.iter().map(|f| (f.seq, f.value.get())).collect::<Vec<_>>(),
        vec![(1, values[0]), (2, values[1]), (3, values[2])],
        "in order, exact text"
    );
    assert_eq!((page.next, page.dropped), (3, 0));
    let newer = cat.task_partials(&t.id, 2).await.unwrap();
    assert_eq!(newer.fragments.iter().map(|f| f.seq).collect::<Vec<_>>(), vec![3], "partial_after 2 → only 3");
    assert!(cat.task_partials(&t.id, 3).await.unwrap().fragments.is_empty());

    let events: Vec<_> = cat
        .list_events(Some("alice"), 0, 10_000)
        .await
        .unwrap()
        .into_iter()
        .filter(|e| e.subject == t.id && e.event_type == "task.partial")
        .collect();
    assert_eq!(events.len(), 3, "one task.partial event per fragment");
    for (i, e) in events.iter().enumerate() {
        let body: serde_json::Value = serde_json::from_str(&e.body).unwrap();
        assert_eq!(body["seq"], i as u64 + 1, "{body}");
        assert_eq!((body["task"].as_str(), body["kind"].as_str()), (Some(t.id.as_str()), Some(kind.as_str())));
        assert_eq!(body["value"], serde_json::from_str::<serde_json::Value>(values[i]).unwrap(), "the event carries the fragment");
    }

    // A checkpoint covering two fragments; the run dies; the next run replays from there.
    cat.update_task(&t.id, Some(a.fence), &TaskUpdate { progress: None, checkpoint: Some("{}".into()), partial_mark: Some(2), now_ms: now() })
        .await
        .unwrap();
    assert_eq!(cat.get_task(&t.id).await.unwrap().unwrap().partial_mark, 2);
    cat.release_task(&t.id, a.fence).await.unwrap();
    let b = claim_this(cat, "w2", &kind, &t.id, LIVE).await.expect("reclaim");
    assert_eq!((b.partial_mark, b.partial_seq), (2, 3), "the claimed row says where to number from");
    assert_eq!(
        cat.append_partial(&t.id, Some(b.fence), 3, "\"three again\"", now()).await.unwrap(),
        Appended::Replayed(3),
        "a taken number is a replay"
    );
    assert_eq!(cat.append_partial(&t.id, Some(b.fence), 4, "4", now()).await.unwrap(), Appended::Stored(4));
    assert!(matches!(cat.append_partial(&t.id, Some(a.fence), 5, "5", now()).await, Err(CatalogError::Fenced)), "the old run's fence is refused");
    let page = cat.task_partials(&t.id, 0).await.unwrap();
    assert_eq!(
        page.fragments.iter().map(|f| (f.seq, f.value.get())).collect::<Vec<_>>(),
        vec![(1, values[0]), (2, values[1]), (3, values[2]), (4, "4")],
        "no duplicate, the first text kept"
    );
    let events =
        cat.list_events(Some("alice"), 0, 10_000).await.unwrap().into_iter().filter(|e| e.subject == t.id && e.event_type == "task.partial").count();
    assert_eq!(events, 4, "a replay writes no event");

    // An external producer (no fence): the next number, whatever it passes.
    assert_eq!(cat.append_partial(&t.id, None, 99, "{\"x\":5}", now()).await.unwrap(), Appended::Stored(5));

    // Bounds: many small fragments keep the newest MAX_FRAGMENTS.
    for i in 6..=300u64 {
        cat.append_partial(&t.id, Some(b.fence), i, &i.to_string(), now()).await.unwrap();
    }
    let page = cat.task_partials(&t.id, 0).await.unwrap();
    assert_eq!(page.fragments.len(), MAX_FRAGMENTS);
    assert_eq!(
        (page.fragments[0].seq, page.fragments.last().unwrap().seq, page.dropped, page.next),
        (300 - MAX_FRAGMENTS as u64 + 1, 300, 300 - MAX_FRAGMENTS as u64, 300)
    );
    // Big ones keep the view within its bytes.
    let big = format!("\"{}\"", "é".repeat((MAX_FRAGMENT_BYTES - 2) / 2));
    for i in 301..=310u64 {
        cat.append_partial(&t.id, Some(b.fence), i, &big, now()).await.unwrap();
    }
    let page = cat.task_partials(&t.id, 0).await.unwrap();
    let text = serde_json::to_string(&page).unwrap();
    assert!(text.len() <= MAX_VIEW_BYTES, "view of {} bytes", text.len());
    assert_eq!(page.fragments.last().map(|f| f.seq), Some(310));
    assert_eq!(page.dropped + page.fragments.len() as u64, 310, "every fragment is kept or counted as dropped");
    let row = cat.get_task(&t.id).await.unwrap().unwrap();
    assert_eq!((row.partial_seq, row.partial_dropped), (310, page.dropped));

    // Finished: no more fragments; the kept ones stay readable.
    assert!(cat.finish_task(&t.id, Some(b.fence), &TaskEnd::Completed("{}".into()), now()).await.unwrap());
    assert!(matches!(cat.append_partial(&t.id, Some(b.fence), 311, "1", now()).await, Err(CatalogError::Fenced)));
    assert!(matches!(cat.append_partial(&t.id, None, 0, "1", now()).await, Err(CatalogError::Fenced)));
    assert_eq!(cat.task_partials(&t.id, 309).await.unwrap().fragments.len(), 1);
    assert!(matches!(cat.append_partial(&format!("{p}nosuchtask"), None, 0, "1", now()).await, Err(CatalogError::NotFound)));
    assert!(matches!(cat.task_partials(&format!("{p}nosuchtask"), 0).await, Err(CatalogError::NotFound)));
}
