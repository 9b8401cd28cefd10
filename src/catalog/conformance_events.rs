//! The outbox half of the catalog conformance suite (DESIGN §8): events are written with the
//! change they describe (and only then), have one id each, come back in commit order per
//! principal, and webhook deliveries are enqueued once, claimed by one holder, in order per
//! subject. Called from [`super::conformance::run_all`] and [`super::conformance::run_concurrent`].

use std::collections::HashSet;

use super::{
    AttemptOutcome, Catalog, CatalogError, Checkpoint, Concat, CreationKey, DeliveryState, EventFilter, EventRecord, NewTask, TaskEnd, UploadRecord,
};

fn record(id: &str, principal: &str) -> UploadRecord {
    UploadRecord {
        id: id.to_string(),
        principal: principal.to_string(),
        length: Some(11),
        offset: 0,
        metadata: "filename aGVsbG8udHh0".to_string(),
        hash_state: vec![1, 2, 3],
        sha256: None,
        expected_sha256: None,
        concat: Concat::None,
        created_at_ms: 1_000,
        updated_at_ms: 1_000,
        expires_at_ms: Some(10_000),
        finished_at_ms: None,
        expired: false,
        blob_state: Vec::new(),
        provisional: false,
    }
}

/// A task of a kind no other check claims.
fn task(id: &str, principal: &str) -> NewTask {
    NewTask {
        id: id.to_string(),
        principal: principal.to_string(),
        kind: format!("{principal}-kind"),
        args: "{\"a\":1}".into(),
        idempotency_key: Some(format!("{id}-key")),
        ttl_ms: 60_000,
        now_ms: 1_000,
    }
}

fn body(e: &EventRecord) -> serde_json::Value {
    serde_json::from_str(&e.body).unwrap_or_else(|err| panic!("event {} body is not JSON ({err}): {}", e.id, e.body))
}

async fn events_of(cat: &dyn Catalog, principal: &str) -> Vec<EventRecord> {
    cat.list_events(Some(principal), 0, 10_000).await.expect("list events")
}

pub async fn run_all(cat: &dyn Catalog, p: &str) {
    check_upload_events(cat, p).await;
    check_provisional_uploads(cat, p).await;
    check_task_events(cat, p).await;
    check_no_event_without_a_change(cat, p).await;
    check_event_listing(cat, p).await;
    check_deliveries(cat, p).await;
    check_prune_keeps_events_cursors_have_not_passed(cat, p).await;
}

/// Every upload change writes exactly one event of its type, with the change's facts.
pub async fn check_upload_events(cat: &dyn Catalog, p: &str) {
    let who = format!("{p}ev-uploads");
    let (a, b, c) = (format!("{p}evA"), format!("{p}evB"), format!("{p}evC"));
    for id in [&a, &b, &c] {
        cat.create_upload(&record(id, &who)).await.unwrap();
    }
    let f = cat.acquire_fence(&a).await.unwrap();
    let cp = |finished: Option<[u8; 32]>| Checkpoint {
        offset: 11,
        hash_state: vec![1],
        blob_state: Vec::new(),
        blob_entries_from: None,
        length: None,
        finished_sha256: finished,
        expires_at_ms: Some(1),
        now_ms: 2_000,
    };
    cat.checkpoint(&a, f, &cp(None)).await.unwrap(); // progress alone is no event
    cat.checkpoint(&a, f, &cp(Some([0xab; 32]))).await.unwrap();
    assert!(cat.mark_expired(&b, 3_000).await.unwrap());
    assert!(cat.delete_upload(&c).await.unwrap());
    assert!(cat.delete_tombstone(&b, 4_000).await.unwrap(), "tombstone deleted");

    let evs = events_of(cat, &who).await;
    let kinds: Vec<(&str, &str)> = evs.iter().map(|e| (e.event_type.as_str(), e.subject.as_str())).collect();
    assert_eq!(
        kinds,
        vec![
            ("upload.created", a.as_str()),
            ("upload.created", b.as_str()),
            ("upload.created", c.as_str()),
            ("upload.finished", a.as_str()),
            ("upload.expired", b.as_str()),
            ("upload.terminated", c.as_str())
        ],
        "one event per change, in commit order; deleting a tombstone is no event"
    );
    let finished = body(&evs[3]);
    assert_eq!(finished["upload"], a.as_str());
    assert_eq!(finished["size"], 11);
    assert_eq!(finished["sha256"], "ab".repeat(32), "sha256 as lowercase hex");
    assert_eq!(body(&evs[0])["metadata"], "filename aGVsbG8udHh0");
    assert_eq!(body(&evs[5])["finished"], false);
    let ids: HashSet<&str> = evs.iter().map(|e| e.id.as_str()).collect();
    assert_eq!(ids.len(), evs.len(), "every event has its own id");
    for e in &evs {
        assert!(
            e.id.len() == 36 && e.id.starts_with("evt_") && e.id[4..].bytes().all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase()),
            "event id shape: {}",
            e.id
        );
        assert_eq!(e.principal, who);
        assert!(e.at_ms > 1_600_000_000_000, "at_ms is Unix ms on the database clock: {}", e.at_ms);
        assert_eq!(cat.event_by_id(&e.id).await.unwrap().as_ref(), Some(e), "event_by_id reads the same row");
    }
    assert!(evs.windows(2).all(|w| w[0].seq < w[1].seq), "seq grows");
}

/// A task's life: working → input_required → working → completed, one event per status.
pub async fn check_task_events(cat: &dyn Catalog, p: &str) {
    let who = format!("{p}ev-tasks");
    let id = format!("{p}evtask");
    cat.start_task(&task(&id, &who)).await.unwrap();
    let claimed = cat.claim_task("w", &[format!("{who}-kind")], 60_000).await.unwrap().expect("claimed");
    assert_eq!(claimed.id, id);
    cat.update_task(
        &id,
        Some(claimed.fence),
        &super::TaskUpdate { progress: None, checkpoint: Some("{}".into()), partial_mark: None, now_ms: 1_500 },
    )
    .await
    .unwrap();
    cat.park_for_input(&id, claimed.fence, "q", "{\"ask\":\"?\"}", 2_000).await.unwrap();
    assert!(cat.respond_input(&id, "q", "\"yes\"", 3_000).await.unwrap());
    assert!(cat.finish_task(&id, None, &TaskEnd::Completed("{\"file\":\"h1\"}".into()), 4_000).await.unwrap());
    let evs = events_of(cat, &who).await;
    let statuses: Vec<(String, String)> =
        evs.iter().map(|e| (e.event_type.clone(), body(e)["status"].as_str().unwrap_or_default().to_string())).collect();
    let want = ["working", "input_required", "working", "completed"].map(|s| ("task.status_changed".to_string(), s.to_string()));
    assert_eq!(statuses, want, "one event per status change; progress and checkpoints are none");
    let done = body(&evs[3]);
    assert_eq!(
        (done["task"].as_str(), done["kind"].as_str(), done["previous_status"].as_str()),
        (Some(id.as_str()), Some(format!("{who}-kind").as_str()), Some("working"))
    );
    assert_eq!(done["result"], serde_json::json!({"file": "h1"}), "the result is embedded as JSON");

    let other = format!("{p}evtask2");
    cat.start_task(&task(&other, &who)).await.unwrap();
    cat.cancel_task(&other, 5_000).await.unwrap();
    cat.cancel_task(&other, 6_000).await.unwrap(); // terminal: no change, no event
    let evs = events_of(cat, &who).await;
    let tail: Vec<String> = evs[4..].iter().map(|e| body(e)["status"].as_str().unwrap_or_default().to_string()).collect();
    assert_eq!(tail, vec!["working", "cancelled"]);
}

/// Refused, discarded and repeated changes write nothing.
pub async fn check_no_event_without_a_change(cat: &dyn Catalog, p: &str) {
    let who = format!("{p}ev-none");
    let id = format!("{p}evnone");
    cat.create_upload(&record(&id, &who)).await.unwrap();
    let before = events_of(cat, &who).await.len();
    assert!(matches!(cat.create_upload(&record(&id, &who)).await, Err(CatalogError::AlreadyExists)));
    let stale = cat.acquire_fence(&id).await.unwrap();
    let _current = cat.acquire_fence(&id).await.unwrap();
    let fin = Checkpoint {
        offset: 11,
        hash_state: vec![1],
        blob_state: Vec::new(),
        blob_entries_from: None,
        length: None,
        finished_sha256: Some([1; 32]),
        expires_at_ms: None,
        now_ms: 2_000,
    };
    assert!(matches!(cat.checkpoint(&id, stale, &fin).await, Err(CatalogError::Fenced)), "a fenced-out completion is refused");
    let key = CreationKey { key: "k1".into(), fingerprint: "f1".into() };
    cat.create_upload_keyed(&record(&format!("{p}evkey1"), &who), &key).await.unwrap();
    let again = cat.create_upload_keyed(&record(&format!("{p}evkey2"), &who), &key).await.unwrap();
    assert!(matches!(again, super::KeyedCreate::Existing { .. }), "the key names the first upload");
    assert!(!cat.delete_upload(&format!("{p}evnothere")).await.unwrap());
    let t = format!("{p}evnonetask");
    cat.start_task(&task(&t, &who)).await.unwrap();
    assert!(cat.finish_task(&t, None, &TaskEnd::Failed("{\"code\":\"x\",\"message\":\"m\"}".into()), 2_000).await.unwrap());
    assert!(!cat.finish_task(&t, None, &TaskEnd::Completed("{}".into()), 3_000).await.unwrap(), "a late end is discarded");
    let evs = events_of(cat, &who).await;
    let new: Vec<&str> = evs[before..].iter().map(|e| e.event_type.as_str()).collect();
    assert_eq!(new, vec!["upload.created", "task.status_changed", "task.status_changed"], "only the keyed create and the task's two statuses");
    assert_eq!(body(evs.last().unwrap())["error"]["code"], "x");
}

/// Listing: per principal, after a seq, limited; another principal's events never appear.
pub async fn check_event_listing(cat: &dyn Catalog, p: &str) {
    let (alice, bob) = (format!("{p}ev-alice"), format!("{p}ev-bob"));
    for i in 0..5 {
        cat.create_upload(&record(&format!("{p}evla{i}"), &alice)).await.unwrap();
        cat.create_upload(&record(&format!("{p}evlb{i}"), &bob)).await.unwrap();
    }
    let all = events_of(cat, &alice).await;
    assert_eq!(all.len(), 5);
    assert!(all.iter().all(|e| e.principal == alice), "only alice's events");
    let page = cat.list_events(Some(&alice), all[1].seq, 2).await.unwrap();
    assert_eq!(page, all[2..4].to_vec(), "after a seq, in order, at most limit");
    let everyone = cat.list_events(None, all[0].seq - 1, 10_000).await.unwrap();
    assert!(everyone.iter().any(|e| e.principal == bob) && everyone.iter().any(|e| e.principal == alice));
    assert!(cat.last_event_seq().await.unwrap() >= all[4].seq);
    assert!(cat.event_by_id("evt_00000000000000000000000000000000").await.unwrap().is_none());
}

/// Deliveries: enqueued once per (webhook, event) from the webhook's start, filtered, claimed
/// by one holder, in order per subject, retried, given up, pruned.
pub async fn check_deliveries(cat: &dyn Catalog, p: &str) {
    let who = format!("{p}ev-hooked");
    let hook = format!("{p}hook");
    let filter = EventFilter { types: vec!["upload.*".into()], principals: vec![who.clone()] };
    cat.create_upload(&record(&format!("{p}evbefore"), &who)).await.unwrap();
    cat.enqueue_deliveries(&hook, &filter, 1_000, 1000).await.unwrap(); // the webhook starts here
    let (u1, u2) = (format!("{p}evd1"), format!("{p}evd2"));
    cat.create_upload(&record(&u1, &who)).await.unwrap();
    cat.create_upload(&record(&u2, &who)).await.unwrap();
    cat.create_upload(&record(&format!("{p}evdother"), "someone-else")).await.unwrap();
    cat.start_task(&task(&format!("{p}evdtask"), &who)).await.unwrap();
    assert!(cat.delete_upload(&u1).await.unwrap());
    while cat.enqueue_deliveries(&hook, &filter, 1_000, 2).await.unwrap() > 0 {}

    let pending = cat.list_deliveries(Some(&who), &[DeliveryState::Pending], 100).await.unwrap();
    let mut got: Vec<(String, String)> = pending.iter().map(|d| (d.event.event_type.clone(), d.event.subject.clone())).collect();
    got.reverse(); // newest first
    assert_eq!(
        got,
        vec![("upload.created".into(), u1.clone()), ("upload.created".into(), u2.clone()), ("upload.terminated".into(), u1.clone())],
        "filtered, from the webhook's start"
    );
    assert_eq!(cat.delivery_backlog().await.unwrap(), (3, 0));

    // Claim: the second event of u1 waits for the first.
    let first = cat.claim_deliveries("r1", 1_000, 60_000, 10).await.unwrap();
    let subjects: Vec<&str> = first.iter().map(|d| d.event.subject.as_str()).collect();
    assert_eq!(subjects, vec![u1.as_str(), u2.as_str()], "one delivery per subject at a time, oldest first");
    assert!(cat.claim_deliveries("r2", 1_000, 60_000, 10).await.unwrap().is_empty(), "leased deliveries are not claimed twice");
    let d1 = &first[0];
    assert!(
        !cat.settle_delivery(&hook, d1.event.seq, "r2", &AttemptOutcome::Delivered { status: 200 }, 1_100).await.unwrap(),
        "only the holder settles"
    );
    let retry = AttemptOutcome::Retry { status: Some(500), error: "HTTP 500".into(), next_attempt_ms: 5_000 };
    assert!(cat.settle_delivery(&hook, d1.event.seq, "r1", &retry, 1_100).await.unwrap());
    assert!(cat.settle_delivery(&hook, first[1].event.seq, "r1", &AttemptOutcome::Delivered { status: 204 }, 1_100).await.unwrap());
    assert!(cat.claim_deliveries("r1", 2_000, 60_000, 10).await.unwrap().is_empty(), "not due yet, and u1's next event still waits");
    let again = cat.claim_deliveries("r1", 5_000, -1, 10).await.unwrap(); // a lease that has already run out
    assert_eq!(again.len(), 1);
    assert_eq!(
        (again[0].event.id.as_str(), again[0].attempts, again[0].last_status),
        (d1.event.id.as_str(), 1, Some(500)),
        "the same event id on every attempt"
    );
    let stolen = cat.claim_deliveries("r2", 5_000, 60_000, 10).await.unwrap();
    assert_eq!(stolen.len(), 1, "an expired lease is claimed by another holder");
    assert!(
        !cat.settle_delivery(&hook, d1.event.seq, "r1", &AttemptOutcome::Delivered { status: 200 }, 5_100).await.unwrap(),
        "the old holder lost it"
    );
    assert!(cat
        .settle_delivery(&hook, d1.event.seq, "r2", &AttemptOutcome::GiveUp { status: None, error: "timed out".into() }, 5_100)
        .await
        .unwrap());
    let failed = cat.list_deliveries(Some(&who), &[DeliveryState::Failed], 10).await.unwrap();
    assert_eq!((failed.len(), failed[0].attempts, failed[0].last_error.as_deref()), (1, 2, Some("timed out")));
    let next = cat.claim_deliveries("r1", 5_000, 60_000, 10).await.unwrap();
    assert_eq!(
        next.iter().map(|d| d.event.event_type.as_str()).collect::<Vec<_>>(),
        vec!["upload.terminated"],
        "a given-up delivery no longer holds its subject back"
    );
    assert!(cat.settle_delivery(&hook, next[0].event.seq, "r1", &AttemptOutcome::Delivered { status: 200 }, 5_100).await.unwrap());
    assert_eq!(cat.delivery_backlog().await.unwrap(), (0, 1));
    assert!(cat
        .list_deliveries(Some("nobody"), &[DeliveryState::Failed, DeliveryState::Pending, DeliveryState::Delivered], 10)
        .await
        .unwrap()
        .is_empty());

    // Pruning: far in the future everything settled goes, and with it every event.
    cat.prune_events(i64::MAX).await.unwrap();
    assert!(events_of(cat, &who).await.is_empty(), "events no delivery needs are pruned");
    assert_eq!(cat.delivery_backlog().await.unwrap(), (0, 0));
}

/// Pruning never deletes an event a webhook's cursor has not passed (it has no delivery row
/// yet: the webhook's worker is behind, or the only replica with that webhook is down), and
/// deletes it once the cursor has passed and its delivery is settled.
pub async fn check_prune_keeps_events_cursors_have_not_passed(cat: &dyn Catalog, p: &str) {
    let who = format!("{p}ev-behind");
    let hook = format!("{p}behindhook");
    let filter = EventFilter { types: vec![], principals: vec![who.clone()] };
    cat.enqueue_deliveries(&hook, &filter, 1_000, 0).await.unwrap(); // the webhook starts here
    let u = format!("{p}evbehind");
    cat.create_upload(&record(&u, &who)).await.unwrap();
    let event = events_of(cat, &who).await.pop().expect("upload.created");
    cat.prune_events(i64::MAX).await.unwrap();
    assert!(cat.event_by_id(&event.id).await.unwrap().is_some(), "an event the webhook's cursor has not reached is kept past the retention");
    while cat.enqueue_deliveries(&hook, &filter, 1_000, 100).await.unwrap() > 0 {}
    let claimed = cat.claim_deliveries("rb", 1_000, 60_000, 100).await.unwrap();
    let mine: Vec<_> = claimed.iter().filter(|d| d.webhook == hook).collect();
    assert_eq!(mine.iter().map(|d| d.event.id.as_str()).collect::<Vec<_>>(), vec![event.id.as_str()], "and delivered once the webhook catches up");
    for d in &claimed {
        assert!(cat.settle_delivery(&d.webhook, d.event.seq, "rb", &AttemptOutcome::Delivered { status: 200 }, 1_100).await.unwrap());
    }
    // The cursor of check_deliveries' webhook (this catalog's only other one) passes it too.
    let other = EventFilter { types: vec!["upload.*".into()], principals: vec![format!("{p}ev-hooked")] };
    while cat.enqueue_deliveries(&format!("{p}hook"), &other, 1_000, 100).await.unwrap() > 0 {}
    cat.prune_events(i64::MAX).await.unwrap();
    assert!(cat.event_by_id(&event.id).await.unwrap().is_none(), "pruned once passed and settled");
}

/// Two handles (two replicas) claiming at once never get one delivery twice, and enqueueing
/// at once makes each event one delivery.
pub async fn check_racing_delivery_claims(a: &dyn Catalog, b: &dyn Catalog, p: &str) {
    let who = format!("{p}ev-race");
    let hook = format!("{p}racehook");
    let filter = EventFilter { types: vec![], principals: vec![who.clone()] };
    a.enqueue_deliveries(&hook, &filter, 0, 100).await.unwrap();
    for i in 0..20 {
        a.create_upload(&record(&format!("{p}evrace{i}"), &who)).await.unwrap();
    }
    loop {
        let (x, y) = futures::join!(a.enqueue_deliveries(&hook, &filter, 0, 3), b.enqueue_deliveries(&hook, &filter, 0, 3));
        if x.unwrap() + y.unwrap() == 0 {
            break;
        }
    }
    assert_eq!(a.delivery_backlog().await.unwrap().0, 20, "each event became one delivery");
    let mut seen = HashSet::new();
    for _ in 0..20 {
        let (x, y) = futures::join!(a.claim_deliveries("a", 0, 3_600_000, 2), b.claim_deliveries("b", 0, 3_600_000, 2));
        for d in x.unwrap().into_iter().chain(y.unwrap()) {
            assert!(seen.insert(d.event.seq), "delivery {} claimed twice", d.event.id);
        }
    }
    assert_eq!(seen.len(), 20, "every delivery claimed exactly once");
    // A restarted process (same owner id) frees what its dead incarnation held at once.
    assert!(b.claim_deliveries("c", 0, 3_600_000, 100).await.unwrap().is_empty(), "all held for an hour");
    b.reclaim_owner("a").await.unwrap();
    let freed = b.claim_deliveries("c", 0, 3_600_000, 100).await.unwrap();
    assert!(!freed.is_empty() && freed.len() < 20, "exactly a's deliveries are free again: {}", freed.len());
}

/// A provisional upload ([`UploadRecord::provisional`]) writes no event until announced; then
/// `upload.created` (and `upload.finished` when it is finished already); withdrawn, it leaves
/// no event at all; an announced upload is never withdrawn.
pub async fn check_provisional_uploads(cat: &dyn Catalog, p: &str) {
    let who = format!("{p}ev-prov");
    let (a, b) = (format!("{p}provA"), format!("{p}provB"));
    let mut ra = record(&a, &who);
    ra.provisional = true;
    let mut rb = record(&b, &who);
    rb.provisional = true;
    cat.create_upload(&ra).await.unwrap();
    cat.create_upload(&rb).await.unwrap();
    assert!(cat.get_upload(&a).await.unwrap().unwrap().provisional);
    let f = cat.acquire_fence(&a).await.unwrap();
    let fin = Checkpoint {
        offset: 11,
        hash_state: vec![1],
        blob_state: Vec::new(),
        blob_entries_from: None,
        length: Some(11),
        finished_sha256: Some([1; 32]),
        expires_at_ms: None,
        now_ms: 2_000,
    };
    cat.checkpoint(&a, f, &fin).await.unwrap();
    let types = |evs: Vec<EventRecord>| evs.into_iter().map(|e| (e.event_type, e.subject)).collect::<Vec<(String, String)>>();
    assert_eq!(types(cat.list_events(Some(&who), 0, 100).await.unwrap()), vec![], "nothing before it is announced");
    assert!(cat.withdraw_upload(&b).await.unwrap(), "withdrawn");
    assert!(cat.get_upload(&b).await.unwrap().is_none());
    cat.announce_upload(&a).await.unwrap();
    cat.announce_upload(&a).await.unwrap();
    assert!(!cat.withdraw_upload(&a).await.unwrap(), "an announced upload stays");
    assert!(!cat.get_upload(&a).await.unwrap().unwrap().provisional);
    assert_eq!(
        types(cat.list_events(Some(&who), 0, 100).await.unwrap()),
        vec![("upload.created".into(), a.clone()), ("upload.finished".into(), a.clone())],
        "announced once, in order"
    );
}
