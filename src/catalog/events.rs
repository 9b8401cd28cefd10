//! The outbox (DESIGN §8): events the catalog writes in the same transaction as the change they
//! describe, and the webhook deliveries made from them. Every catalog backend provides
//! [`EventCatalog`].
//!
//! **Where events come from.** Database triggers (migrations `0005_events.sql`) write one row
//! per change, whichever method makes it: `upload.created` (a row inserted),
//! `upload.finished` (completion set; body has `size` in bytes and `sha256` hex),
//! `upload.expired` (tombstoned), `upload.terminated` (a live row deleted), and
//! `task.status_changed` (a task inserted, or its status changed; body has `status`,
//! `previous_status`, `result`/`error` JSON), and `task.partial` (a partial result fragment
//! appended, migration `0013`; body `task`, `kind`, `seq`, `at_ms`, `value`). A rolled-back change leaves no event; a committed
//! one always has exactly one, with one id for life (`evt_` + 32 hex digits).
//!
//! **Order.** `seq` grows in commit order on both backends (SQLite serialises writers;
//! PostgreSQL serialises event-writing transactions on an advisory lock its triggers take at
//! commit — deferred, migration `0011`, so a transaction holds it only while committing), so a
//! reader that has seen `seq` N never later finds a smaller one: cursors over `seq` miss nothing.

use async_trait::async_trait;
use serde::Serialize;

use super::{CatalogError, CatalogResult};

/// One outbox row.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct EventRecord {
    /// Position in commit order (grows; gaps are rolled-back draws).
    pub seq: i64,
    /// The event's one id for life: `evt_` + 32 lowercase hex digits.
    pub id: String,
    /// `upload.created`, `upload.finished`, `upload.terminated`, `upload.expired`, `task.status_changed`, `task.partial`.
    #[serde(rename = "type")]
    pub event_type: String,
    /// The principal that owns the upload or task.
    pub principal: String,
    /// The upload or task id the event is about (events of one subject are in `seq` order).
    pub subject: String,
    /// When the change committed, Unix ms on the database clock.
    pub at_ms: i64,
    /// JSON object text: handles, sizes, hashes; never file bytes.
    pub body: String,
}

/// Which events a webhook receives: empty lists mean "all".
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EventFilter {
    /// Event types (exact, or a prefix ending in `.`/`*` such as `upload.*`).
    pub types: Vec<String>,
    pub principals: Vec<String>,
}

impl EventFilter {
    /// Whether `e` passes.
    pub fn matches(&self, e: &EventRecord) -> bool {
        let type_ok = self.types.is_empty()
            || self.types.iter().any(|t| match t.strip_suffix('*') {
                Some(prefix) => e.event_type.starts_with(prefix),
                None => *t == e.event_type,
            });
        type_ok && (self.principals.is_empty() || self.principals.contains(&e.principal))
    }
}

/// A delivery's state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum DeliveryState {
    /// Not yet acknowledged; due at `next_attempt_ms`.
    Pending,
    /// A 2xx arrived.
    Delivered,
    /// Retries ran out (the webhook's retry window passed).
    Failed,
}

impl DeliveryState {
    pub fn as_str(self) -> &'static str {
        match self {
            DeliveryState::Pending => "pending",
            DeliveryState::Delivered => "delivered",
            DeliveryState::Failed => "failed",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "pending" => DeliveryState::Pending,
            "delivered" => DeliveryState::Delivered,
            "failed" => DeliveryState::Failed,
            _ => return None,
        })
    }
}

/// One (webhook, event) delivery with its event.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Delivery {
    /// The webhook's name (from the configuration).
    pub webhook: String,
    pub event: EventRecord,
    pub state: DeliveryState,
    /// Attempts made so far.
    pub attempts: u32,
    /// Unix ms (caller clock) when the delivery was made from the event.
    pub created_at_ms: i64,
    /// Unix ms (caller clock) when the next attempt is due.
    pub next_attempt_ms: i64,
    pub last_attempt_ms: Option<i64>,
    /// HTTP status of the last attempt, if the receiver answered.
    pub last_status: Option<u16>,
    /// Why the last attempt failed (no secrets, no bodies).
    pub last_error: Option<String>,
}

/// One attempt to record ([`EventCatalog::settle_deliveries`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settlement {
    pub webhook: String,
    pub event_seq: i64,
    pub outcome: AttemptOutcome,
}

/// How one attempt went (see [`EventCatalog::settle_deliveries`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AttemptOutcome {
    /// The receiver answered 2xx.
    Delivered { status: u16 },
    /// Failed; try again at `next_attempt_ms` (caller clock).
    Retry { status: Option<u16>, error: String, next_attempt_ms: i64 },
    /// Failed and out of time: no more attempts.
    GiveUp { status: Option<u16>, error: String },
}

impl AttemptOutcome {
    /// What settling a delivery with this outcome writes (both catalogs): its new `state`,
    /// `last_status`, `last_error`, and `next_attempt_ms` (`None`: unchanged).
    pub(super) fn columns(&self) -> (&'static str, Option<u16>, Option<&str>, Option<i64>) {
        match self {
            AttemptOutcome::Delivered { status } => ("delivered", Some(*status), None, None),
            AttemptOutcome::Retry { status, error, next_attempt_ms } => ("pending", *status, Some(error.as_str()), Some(*next_attempt_ms)),
            AttemptOutcome::GiveUp { status, error } => ("failed", *status, Some(error.as_str()), None),
        }
    }
}

/// The columns [`row_to_event`] reads, from `events e` (both catalogs; a literal, for `sql!`).
macro_rules! event_columns {
    () => {
        "e.seq, e.id, e.type, e.principal, e.subject, e.at_ms, e.body"
    };
}
pub(super) use event_columns;

/// The columns [`row_to_delivery`] reads from `webhook_deliveries d` (with [`event_columns`]).
macro_rules! delivery_columns {
    () => {
        "d.webhook, d.state, d.attempts, d.created_at_ms, d.next_attempt_ms, d.last_attempt_ms, d.last_status, d.last_error"
    };
}
pub(super) use delivery_columns;

/// An event from a row of [`event_columns`] (SQLite or PostgreSQL).
pub(super) fn row_to_event<R>(r: &R) -> CatalogResult<EventRecord>
where
    R: sqlx::Row,
    for<'a> &'a str: sqlx::ColumnIndex<R>,
    i64: for<'q> sqlx::Decode<'q, R::Database> + sqlx::Type<R::Database>,
    String: for<'q> sqlx::Decode<'q, R::Database> + sqlx::Type<R::Database>,
{
    Ok(EventRecord {
        seq: r.try_get("seq")?,
        id: r.try_get("id")?,
        event_type: r.try_get("type")?,
        principal: r.try_get("principal")?,
        subject: r.try_get("subject")?,
        at_ms: r.try_get("at_ms")?,
        body: r.try_get("body")?,
    })
}

/// A delivery from a row of [`delivery_columns`] and [`event_columns`] (SQLite or PostgreSQL).
pub(super) fn row_to_delivery<R>(r: &R) -> CatalogResult<Delivery>
where
    R: sqlx::Row,
    for<'a> &'a str: sqlx::ColumnIndex<R>,
    i64: for<'q> sqlx::Decode<'q, R::Database> + sqlx::Type<R::Database>,
    String: for<'q> sqlx::Decode<'q, R::Database> + sqlx::Type<R::Database>,
{
    let state: String = r.try_get("state")?;
    Ok(Delivery {
        webhook: r.try_get("webhook")?,
        event: row_to_event(r)?,
        state: DeliveryState::parse(&state).ok_or_else(|| CatalogError::Backend("stored delivery state is invalid".into()))?,
        attempts: r.try_get::<i64, _>("attempts")? as u32,
        created_at_ms: r.try_get("created_at_ms")?,
        next_attempt_ms: r.try_get("next_attempt_ms")?,
        last_attempt_ms: r.try_get("last_attempt_ms")?,
        last_status: r.try_get::<Option<i64>, _>("last_status")?.map(|s| s as u16),
        last_error: r.try_get("last_error")?,
    })
}

/// The outbox and webhook deliveries.
#[async_trait]
pub trait EventCatalog: Send + Sync {
    /// Events with `seq > after_seq`, of `principal` when given, oldest first, at most `limit`.
    /// Only committed events are ever returned, and never one with a smaller `seq` than one
    /// returned before (see the module doc).
    async fn list_events(&self, principal: Option<&str>, after_seq: i64, limit: u32) -> CatalogResult<Vec<EventRecord>>;

    /// The event with this id, if still kept.
    async fn event_by_id(&self, id: &str) -> CatalogResult<Option<EventRecord>>;

    /// The largest `seq` written so far (0 when none).
    async fn last_event_seq(&self) -> CatalogResult<i64>;

    /// Delete settled (delivered or failed) deliveries last attempted before `before_ms`, then
    /// events older than `before_ms` that no remaining delivery names and every webhook's
    /// cursor has passed (an event a cursor has not reached yet has no delivery row: deleting
    /// it would lose it for that webhook). Returns
    /// how many events were deleted. Safe on every replica at once.
    async fn prune_events(&self, before_ms: i64) -> CatalogResult<u64>;

    /// Turn new events into pending deliveries for `webhook`: atomically read the webhook's
    /// cursor (created at the current last seq if missing: a new webhook starts with the events
    /// after it was added), insert a delivery due at `now_ms` for each of the next `limit`
    /// events that `filter` passes, and move the cursor past every event read. Of replicas
    /// racing, each event becomes at most one delivery per webhook. Returns the events read.
    async fn enqueue_deliveries(&self, webhook: &str, filter: &EventFilter, now_ms: i64, limit: u32) -> CatalogResult<u32>;

    /// Claim up to `limit` pending deliveries due at `now_ms` whose lease is free or expired
    /// (database clock; [`super::Catalog::reclaim_owner`] frees a dead incarnation's at once) and
    /// that no earlier pending delivery of the same webhook and subject precedes (per-subject
    /// order): each gets `owner`'s lease for `lease_ms`. Of concurrent claimers (any replica)
    /// exactly one gets a given delivery. Oldest event first.
    async fn claim_deliveries(&self, owner: &str, now_ms: i64, lease_ms: i64, limit: u32) -> CatalogResult<Vec<Delivery>>;

    /// Record attempts of claimed deliveries and release their leases, in one transaction (one
    /// commit for a batch: the worker settles what finished together). Each only while `owner`
    /// still holds it; its entry in the answer is false (and nothing changed for it) otherwise,
    /// or when it is no longer pending. The answer has one entry per settlement, in order.
    async fn settle_deliveries(&self, owner: &str, settlements: &[Settlement], now_ms: i64) -> CatalogResult<Vec<bool>>;

    /// [`EventCatalog::settle_deliveries`] for one attempt.
    async fn settle_delivery(&self, webhook: &str, event_seq: i64, owner: &str, outcome: &AttemptOutcome, now_ms: i64) -> CatalogResult<bool> {
        let one = [Settlement { webhook: webhook.to_string(), event_seq, outcome: outcome.clone() }];
        Ok(self.settle_deliveries(owner, &one, now_ms).await?.first().copied().unwrap_or(false))
    }

    /// Deliveries in one of `states`, of events of `principal` when given, newest event first.
    async fn list_deliveries(&self, principal: Option<&str>, states: &[DeliveryState], limit: u32) -> CatalogResult<Vec<Delivery>>;

    /// How many deliveries are (pending, failed), over every webhook.
    async fn delivery_backlog(&self) -> CatalogResult<(u64, u64)>;
}
