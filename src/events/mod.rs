//! Events (DESIGN §8): what the outbox holds, delivered to the systems that integrate ferry.
//!
//! The catalog writes every event in the same transaction as the change it describes
//! ([`crate::catalog::events`]); this module only *reads* the outbox:
//! - [`webhooks`]: the delivery worker — `[[webhooks]]` receivers get each event in the
//!   Standard Webhooks shape, retried with exponential backoff, with delivery state in the
//!   catalog (a restart resumes; replicas claim deliveries under a lease).
//! - [`Events::follow`]: a principal's events from a cursor on, for Server-Sent Events
//!   (`GET /api/v1/events`, resumable with `Last-Event-ID`).
//! - retention: events are pruned after `[events] retention` (default 24 h) unless a pending
//!   webhook delivery still needs them or a webhook's cursor has not passed them yet (its
//!   worker is behind, or the only replica configured with it is down).
//!
//! Memory stays bounded whatever receivers do: events stay in the outbox, and the worker holds
//! at most one claimed batch at a time.

use std::sync::Arc;
use std::time::Duration;

use futures::Stream;
use serde::Serialize;

use crate::catalog::{Catalog, CatalogError, Delivery, DeliveryState, EventRecord};
use crate::upload::now_ms;

pub mod hooks;
pub mod settings;
pub mod webhooks;

pub use hooks::HttpHooks;
pub use webhooks::WebhookWorker;

/// The longest a follower (SSE) or the delivery worker waits before looking at the outbox
/// again without being woken (the head watcher wakes them sooner; see [`Events::spawn_head_watcher`]).
pub const POLL: Duration = Duration::from_millis(200);
/// How often the head watcher reads the outbox's last event seq while anyone waits on it: one
/// read per process per tick, however many followers there are.
pub const TICK: Duration = Duration::from_millis(25);
/// The head's value while it is unknown (before the watcher's first read, or while reading it
/// fails): followers then read the outbox every [`POLL`] instead of waiting for a change.
pub const HEAD_UNKNOWN_SEQ: i64 = -1;
/// Events read per catalog query.
const PAGE: u32 = 256;
/// The longest a [`Changes::wait`] sleeps while the head is known and does not move: a bounded
/// fallback, so that a change the head watcher somehow did not publish delays a waiter by this
/// much at worst instead of hanging it. Every change a waiter waits for (a task's status, a
/// concatenation finishing) writes an event, so in practice the watcher wakes it within a
/// [`TICK`] of the commit, on any replica.
pub const WAIT_FALLBACK: Duration = Duration::from_secs(10);

/// Shared handle: read the outbox for one principal, list deliveries.
pub struct Events {
    catalog: Arc<dyn Catalog>,
    retention: Duration,
    /// The outbox's last event seq as the head watcher last read it (any principal's, any
    /// replica's): followers and the delivery worker wait on it instead of each polling.
    head: Arc<tokio::sync::watch::Sender<i64>>,
}

/// One event as SSE and webhook receivers see it (Standard Webhooks payload shape:
/// `type`, `timestamp`, `data`).
#[derive(Debug, Clone, Serialize)]
pub struct EventView {
    /// The event's one id for life (`evt_` + 32 hex): the SSE `id` and the `webhook-id`.
    pub id: String,
    #[serde(rename = "type")]
    pub event_type: String,
    /// When the change committed, RFC 3339 with milliseconds (UTC).
    pub timestamp: String,
    /// The event body (handles, sizes, hashes; never bytes) plus `principal`; an upload's
    /// `metadata` is the decoded map every surface shows ([`crate::upload::metadata_json`]).
    pub data: serde_json::Value,
    /// The event's position in the outbox (not shown: ids are what clients hold), for a
    /// follower that starts again after it ([`Cursor::Position`]).
    #[serde(skip)]
    pub seq: i64,
}

impl EventView {
    pub fn of(e: &EventRecord) -> EventView {
        let mut data: serde_json::Value = serde_json::from_str(&e.body).unwrap_or_else(|_| serde_json::json!({}));
        if let Some(obj) = data.as_object_mut() {
            obj.insert("principal".into(), e.principal.clone().into());
            // The outbox keeps `Upload-Metadata` as sent; every surface shows the one decoded
            // map (issue 48, kind 13): text values as strings, others `{"base64": …}`, a key
            // without a value `null` ([`crate::upload::metadata_json`], as hooks and REST).
            if let Some(serde_json::Value::String(raw)) = obj.get("metadata") {
                let decoded = crate::upload::metadata_json(raw);
                obj.insert("metadata".into(), decoded.into());
            }
        }
        let at = std::time::UNIX_EPOCH + Duration::from_millis(e.at_ms.max(0) as u64);
        EventView {
            id: e.id.clone(),
            event_type: e.event_type.clone(),
            timestamp: humantime::format_rfc3339_millis(at).to_string(),
            data,
            seq: e.seq,
        }
    }

    /// The webhook payload: `{"type", "timestamp", "data"}` (the id travels in `webhook-id`).
    pub fn payload(&self) -> String {
        serde_json::json!({"type": self.event_type, "timestamp": self.timestamp, "data": self.data}).to_string()
    }
}

/// A delivery as `GET /api/v1/webhooks/deliveries` shows it.
#[derive(Debug, Clone, Serialize)]
pub struct DeliveryView {
    pub webhook: String,
    pub event: EventView,
    pub state: DeliveryState,
    pub attempts: u32,
    /// Unix ms of the next attempt (pending only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub next_attempt_ms: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_attempt_ms: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_status: Option<u16>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_error: Option<String>,
}

impl DeliveryView {
    fn of(d: &Delivery) -> DeliveryView {
        DeliveryView {
            webhook: d.webhook.clone(),
            event: EventView::of(&d.event),
            state: d.state,
            attempts: d.attempts,
            next_attempt_ms: (d.state == DeliveryState::Pending).then_some(d.next_attempt_ms),
            last_attempt_ms: d.last_attempt_ms,
            last_status: d.last_status,
            last_error: d.last_error.clone(),
        }
    }
}

/// One way to wait for a change (a task leaving `working`, a concatenation finishing): the
/// outbox head as [`Events::spawn_head_watcher`] publishes it. Every state change waited for
/// commits an event in its own transaction, and the watcher reads the head every [`TICK`] on
/// every catalog (SQLite without notifications too), so a change by this process or another
/// replica wakes the waiter within a tick. Waiters re-check their condition after each wake:
/// most wakes are other changes.
///
/// A change committed after the subscription was taken (or after the last wake) is never
/// missed: the watch remembers it until the next [`Changes::wait`].
pub struct Changes {
    head: tokio::sync::watch::Receiver<i64>,
}

/// Why [`Changes::wait`] returned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Woken {
    /// The outbox head moved (or its watcher went away): re-check.
    Changed,
    /// Nothing was published within the wait: the caller's `at_most` passed, or the fallback
    /// ([`WAIT_FALLBACK`], [`POLL`] while the head is unknown) did.
    TimedOut,
}

impl Changes {
    /// Wait until the outbox head moves, at most `at_most`, and at most [`WAIT_FALLBACK`]
    /// ([`POLL`] while the head is unknown: the watcher is failing or has not read it yet).
    pub async fn wait(&mut self, at_most: Duration) -> Woken {
        let fallback = if *self.head.borrow() == HEAD_UNKNOWN_SEQ { POLL } else { WAIT_FALLBACK };
        match tokio::time::timeout(at_most.min(fallback), self.head.changed()).await {
            Ok(Ok(())) => {
                self.head.borrow_and_update();
                Woken::Changed
            }
            Ok(Err(_)) => {
                // The watcher is gone (shutting down): fall back to polling.
                tokio::time::sleep(at_most.min(POLL)).await;
                Woken::Changed
            }
            Err(_) => Woken::TimedOut,
        }
    }
}

/// Where a follower starts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Cursor {
    /// Only events committed from now on.
    Now,
    /// After the event with this id (`Last-Event-ID`).
    After(String),
    /// After outbox position `seq`, as [`Events::position`] read it: the events committed
    /// since that read, none skipped however late the follow starts.
    Position(i64),
}

/// Why a follow could not start.
#[derive(Debug, thiserror::Error)]
pub enum FollowError {
    /// `Last-Event-ID` names no event kept for this principal (unknown, another principal's,
    /// or older than the retention).
    #[error("event {0} is unknown or no longer kept (events are kept {1})")]
    UnknownEvent(String, String),
    #[error(transparent)]
    Catalog(#[from] CatalogError),
}

impl Events {
    pub fn new(catalog: Arc<dyn Catalog>, retention: Duration) -> Events {
        Events { catalog, retention, head: Arc::new(tokio::sync::watch::Sender::new(HEAD_UNKNOWN_SEQ)) }
    }

    /// A receiver of the outbox head (the last event seq seen by the head watcher).
    pub fn head(&self) -> tokio::sync::watch::Receiver<i64> {
        self.head.subscribe()
    }

    /// The outbox's position now: the seq of the last event committed (any principal's), read
    /// from the catalog. [`Cursor::Position`] of it follows the events committed after this call.
    /// Errors: the catalog's.
    pub async fn position(&self) -> Result<i64, CatalogError> {
        self.catalog.last_event_seq().await
    }

    /// A subscription to "something changed": woken when any event commits, on any replica
    /// (see [`Changes`]). Take it **before** checking the condition waited for, so that a
    /// change between the check and the wait is not missed.
    pub fn changes(&self) -> Changes {
        Changes { head: self.head() }
    }

    /// Read the outbox head every [`TICK`] while anyone holds a [`Events::head`] receiver, and
    /// publish it when it moved, until `shutdown`. Events committed by other replicas are seen
    /// the same way. A failed read is logged once per failure streak; waiters fall back to
    /// [`POLL`].
    pub fn spawn_head_watcher(&self, shutdown: tokio_util::sync::CancellationToken) -> tokio::task::JoinHandle<()> {
        let (catalog, head) = (self.catalog.clone(), self.head.clone());
        tokio::spawn(async move {
            let mut failing = false;
            loop {
                if head.receiver_count() > 0 {
                    match catalog.last_event_seq().await {
                        Ok(seq) => {
                            failing = false;
                            head.send_if_modified(|h| std::mem::replace(h, seq) != seq);
                        }
                        Err(e) => {
                            if !failing {
                                tracing::warn!(error = %e, "reading the outbox head failed; followers poll until it works again");
                            }
                            failing = true;
                            // Followers poll while the head is unknown.
                            head.send_if_modified(|h| std::mem::replace(h, HEAD_UNKNOWN_SEQ) != HEAD_UNKNOWN_SEQ);
                        }
                    }
                }
                tokio::select! {
                    _ = shutdown.cancelled() => return,
                    _ = tokio::time::sleep(TICK) => {}
                }
            }
        })
    }

    /// How long events are kept.
    pub fn retention(&self) -> Duration {
        self.retention
    }

    /// `principal`'s events from `cursor` on, in commit order, forever (until dropped). Reads
    /// the outbox when the head watcher says it moved (every [`POLL`] only while the head is
    /// unknown, [`HEAD_UNKNOWN_SEQ`]; an idle follower makes no query); a catalog
    /// error ends the stream with that error (the client reconnects with its last id). Errors
    /// at start: [`FollowError::UnknownEvent`].
    pub async fn follow(
        &self,
        principal: &str,
        cursor: Cursor,
    ) -> Result<impl Stream<Item = Result<EventView, CatalogError>> + Send + 'static, FollowError> {
        let after = match cursor {
            Cursor::Now => self.position().await?,
            Cursor::Position(seq) => seq,
            Cursor::After(id) => match self.catalog.event_by_id(&id).await? {
                Some(e) if e.principal == principal => e.seq,
                _ => return Err(FollowError::UnknownEvent(id, crate::units::human_duration(self.retention))),
            },
        };
        let catalog = self.catalog.clone();
        let principal = principal.to_string();
        let head = self.head();
        // State: the cursor, events read but not yet yielded, whether the stream ended, the
        // head receiver, and whether the outbox must be read before waiting again.
        Ok(futures::stream::unfold(
            (after, std::collections::VecDeque::new(), false, head, true),
            move |(mut after, mut buf, done, mut head, mut read)| {
                let catalog = catalog.clone();
                let principal = principal.clone();
                async move {
                    if done {
                        return None;
                    }
                    loop {
                        if let Some(e) = buf.pop_front() {
                            return Some((Ok(EventView::of(&e)), (after, buf, false, head, true)));
                        }
                        if read {
                            head.borrow_and_update();
                            match catalog.list_events(Some(&principal), after, PAGE).await {
                                Ok(page) if page.is_empty() => {}
                                Ok(page) => {
                                    after = page.last().map_or(after, |e| e.seq);
                                    buf.extend(page);
                                    continue;
                                }
                                Err(e) => return Some((Err(e), (after, buf, true, head, true))),
                            }
                        }
                        // Woken when any event commits (most are another principal's: then the read
                        // finds nothing and this waits again). A wait that times out reads again
                        // only when the head is unknown (the watcher is failing or has not read it
                        // yet): an idle follower costs no query.
                        read = match tokio::time::timeout(POLL, head.changed()).await {
                            Ok(Ok(())) => {
                                let h = *head.borrow();
                                h == HEAD_UNKNOWN_SEQ || h > after
                            }
                            Ok(Err(_)) => {
                                tokio::time::sleep(POLL).await; // the watcher is gone (shutting down)
                                true
                            }
                            Err(_) => *head.borrow() == HEAD_UNKNOWN_SEQ,
                        };
                    }
                }
            },
        ))
    }

    /// Deliveries of `principal`'s events in `states`, newest first, at most `limit`.
    pub async fn deliveries(&self, principal: &str, states: &[DeliveryState], limit: u32) -> Result<Vec<DeliveryView>, CatalogError> {
        Ok(self.catalog.list_deliveries(Some(principal), states, limit).await?.iter().map(DeliveryView::of).collect())
    }

    /// Prune events past the retention (and settled deliveries as old), every `every`, until
    /// `shutdown`. Safe on every replica at once.
    pub fn spawn_pruner(self: &Arc<Self>, every: Duration, shutdown: tokio_util::sync::CancellationToken) -> tokio::task::JoinHandle<()> {
        let me = self.clone();
        tokio::spawn(async move {
            loop {
                let before = now_ms() - me.retention.as_millis() as i64;
                match me.catalog.prune_events(before).await {
                    Ok(n) if n > 0 => tracing::info!(events = n, "pruned events past the retention"),
                    Ok(_) => {}
                    Err(e) => tracing::warn!(error = %e, "pruning events failed; trying again later"),
                }
                tokio::select! {
                    _ = shutdown.cancelled() => return,
                    _ = tokio::time::sleep(every) => {}
                }
            }
        })
    }
}
