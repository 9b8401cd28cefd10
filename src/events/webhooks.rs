//! Webhook delivery (DESIGN §8; Standard Webhooks, <https://www.standardwebhooks.com/>).
//!
//! One worker per process. Each round it (1) turns new outbox events into pending deliveries
//! for every configured webhook ([`crate::catalog::EventCatalog::enqueue_deliveries`]), (2)
//! claims due deliveries under a lease on the database clock — one at a time per (webhook,
//! upload/task), so a subject's events arrive in order; no two replicas hold one delivery —
//! and (3) POSTs each, at most [`PARALLEL`] at once (a freed slot is refilled at once, so a
//! hanging receiver never holds up the others; while due deliveries wait, the worker claims
//! again as soon as a slot frees, and an idle worker wakes when the outbox head moves), each
//! bounded by the webhook's `timeout`:
//! `webhook-id` is the event's one id (the same on every attempt), `webhook-timestamp` the
//! attempt's Unix seconds, `webhook-signature` `v1,` + base64 HMAC-SHA256 of
//! `id.timestamp.body` under the webhook's secret. A 2xx settles it; anything else (another
//! status, a redirect — never followed —, a timeout, a connection closed mid-answer) schedules a
//! retry after 1 s, 2 s, 4 s… (at most 1 h) until `retry_for` has passed since the event, then
//! the delivery is `failed` (visible at `GET /api/v1/webhooks/deliveries` and in metrics).
//!
//! Uploads never wait for any of this: the worker only reads the outbox.

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;

use super::settings::WebhookConfig;
use super::EventView;
use crate::catalog::{AttemptOutcome, Catalog, Delivery, EventFilter, Settlement};
use crate::metrics::Metrics;
use crate::upload::now_ms;

/// Deliveries sent at once by one process.
pub const PARALLEL: usize = 8;
/// Deliveries claimed per round.
const BATCH: u32 = 32;
/// Attempts recorded per catalog transaction (what finished together is settled together).
const SETTLE_BATCH: usize = 64;

/// An attempt waiting to be recorded, with the slot it holds until then.
struct Settle {
    settlement: Settlement,
    event_id: String,
    _slot: tokio::sync::OwnedSemaphorePermit,
}
/// Events turned into deliveries per catalog transaction.
const ENQUEUE_BATCH: u32 = 256;
/// First retry delay; doubles per attempt up to [`MAX_BACKOFF`].
const FIRST_BACKOFF: Duration = Duration::from_secs(1);
const MAX_BACKOFF: Duration = Duration::from_secs(3600);

struct Hook {
    cfg: WebhookConfig,
    filter: EventFilter,
    signer: standardwebhooks::Webhook,
}

/// The delivery worker.
pub struct WebhookWorker {
    catalog: Arc<dyn Catalog>,
    hooks: Vec<Hook>,
    owner: String,
    client: reqwest::Client,
    metrics: Arc<Metrics>,
    /// The last event seq every cursor is known to have passed (skips idle enqueues).
    enqueued_to: std::sync::atomic::AtomicI64,
    /// The outbox head ([`super::Events::head`]): wakes an idle worker when an event commits.
    head: tokio::sync::watch::Receiver<i64>,
}

/// What the worker does after a round.
#[derive(Debug, PartialEq, Eq)]
enum Next {
    /// Look again at once (more to enqueue or claim, and a slot is free).
    Now,
    /// Every slot is busy and due deliveries wait: claim again when a slot frees.
    WhenSlotFrees,
    /// Nothing due: wait for a new event or [`super::POLL`] (retries come due with time).
    Idle,
    /// No pending delivery at all: wait for a new event (or [`QUIET_POLL`]; [`super::POLL`]
    /// while the head is unknown), so an idle worker makes no query.
    Quiet,
}

/// The longest a worker with no pending delivery waits without being woken by the head.
const QUIET_POLL: Duration = Duration::from_secs(10);

/// The delay before attempt `attempts + 1` (after `attempts` failed ones): 1 s, 2 s, 4 s… capped.
/// The attempt count is the delivery's, kept in the catalog ([`crate::retry::delay_after`]).
pub fn backoff(attempts: u32) -> Duration {
    crate::retry::delay_after(crate::retry::doubling(FIRST_BACKOFF, MAX_BACKOFF), attempts)
}

impl WebhookWorker {
    /// A worker for `hooks`, claiming deliveries as `owner` (this process's lease owner id),
    /// woken by `head` ([`super::Events::head`]).
    /// Errors: a secret that is not Standard Webhooks base64 (the configuration checks it first).
    pub fn new(
        catalog: Arc<dyn Catalog>,
        hooks: &[WebhookConfig],
        owner: String,
        metrics: Arc<Metrics>,
        head: tokio::sync::watch::Receiver<i64>,
    ) -> anyhow::Result<WebhookWorker> {
        let hooks = hooks
            .iter()
            .map(|cfg| {
                let signer = standardwebhooks::Webhook::new(&cfg.secret)
                    .map_err(|_| anyhow::anyhow!("webhook {}: the secret is not `whsec_` + base64", cfg.name))?;
                Ok(Hook { filter: EventFilter { types: cfg.events.clone(), principals: cfg.principals.clone() }, cfg: cfg.clone(), signer })
            })
            .collect::<anyhow::Result<Vec<_>>>()?;
        let client = reqwest::Client::builder().redirect(reqwest::redirect::Policy::none()).connect_timeout(Duration::from_secs(5)).build()?;
        Ok(WebhookWorker { catalog, hooks, owner, client, metrics, enqueued_to: std::sync::atomic::AtomicI64::new(-1), head })
    }

    /// Start each webhook's cursor (a new webhook receives the events committed from now on).
    pub async fn start_cursors(&self) -> anyhow::Result<()> {
        for h in &self.hooks {
            self.catalog.enqueue_deliveries(&h.cfg.name, &h.filter, now_ms(), 0).await?;
        }
        Ok(())
    }

    /// Run until `shutdown`. Catalog errors are logged and retried after a pause.
    pub fn spawn(self, shutdown: tokio_util::sync::CancellationToken) -> tokio::task::JoinHandle<()> {
        if self.hooks.is_empty() {
            return tokio::spawn(async {});
        }
        let mut head = self.head.clone();
        let me = Arc::new(self);
        // At most PARALLEL deliveries in flight; a slot is refilled as soon as one settles, so
        // a receiver that hangs holds one slot per attempt, never the other webhooks' deliveries.
        let slots = Arc::new(tokio::sync::Semaphore::new(PARALLEL));
        let (settle_tx, settle_rx) = tokio::sync::mpsc::unbounded_channel();
        let settler = tokio::spawn(me.clone().settle(settle_rx));
        tokio::spawn(async move {
            loop {
                head.borrow_and_update();
                let next = match me.round(&slots, &settle_tx).await {
                    Ok(next) => next,
                    Err(e) => {
                        tracing::warn!(error = %e, "webhook delivery round failed; trying again");
                        Next::Idle
                    }
                };
                if shutdown.is_cancelled() {
                    break;
                }
                match next {
                    Next::Now => {}
                    Next::WhenSlotFrees => tokio::select! {
                        _ = shutdown.cancelled() => break,
                        permit = slots.acquire() => drop(permit),
                    },
                    Next::Idle => tokio::select! {
                        _ = shutdown.cancelled() => break,
                        _ = head.changed() => {}
                        _ = tokio::time::sleep(super::POLL) => {}
                    },
                    Next::Quiet => {
                        let wait = if *head.borrow() == super::HEAD_UNKNOWN_SEQ { super::POLL } else { QUIET_POLL };
                        tokio::select! {
                            _ = shutdown.cancelled() => break,
                            _ = head.changed() => {}
                            _ = tokio::time::sleep(wait) => {}
                        }
                    }
                }
            }
            // Attempts in flight still settle (the caller bounds how long it waits for this).
            drop(settle_tx);
            let _ = settler.await;
        })
    }

    /// Record attempts as they finish, up to [`SETTLE_BATCH`] per transaction, until every
    /// sender is gone. A slot is freed once its attempt is recorded (or failed to be: then the
    /// delivery is retried when its lease lapses).
    async fn settle(self: Arc<Self>, mut rx: tokio::sync::mpsc::UnboundedReceiver<Settle>) {
        let mut batch = Vec::with_capacity(SETTLE_BATCH);
        while rx.recv_many(&mut batch, SETTLE_BATCH).await > 0 {
            let settlements: Vec<Settlement> = batch.iter().map(|s| s.settlement.clone()).collect();
            match self.catalog.settle_deliveries(&self.owner, &settlements, now_ms()).await {
                Ok(done) => {
                    for (s, ok) in batch.iter().zip(done) {
                        if !ok {
                            tracing::warn!(
                                webhook = s.settlement.webhook,
                                event = s.event_id,
                                "lost the delivery's lease before settling it; another worker retries"
                            );
                        }
                    }
                }
                Err(e) => {
                    tracing::warn!(
                        deliveries = batch.len(),
                        error = %e,
                        "could not record delivery attempts; they are retried when their leases lapse"
                    )
                }
            }
            batch.clear();
        }
    }

    /// One round: enqueue, claim as many deliveries as there are free slots, start sending them.
    /// Returns what to do next. An idle round costs two reads (the last event seq, the
    /// backlog), no write.
    async fn round(
        self: &Arc<Self>,
        slots: &Arc<tokio::sync::Semaphore>,
        settle: &tokio::sync::mpsc::UnboundedSender<Settle>,
    ) -> anyhow::Result<Next> {
        use std::sync::atomic::Ordering;
        let now = now_ms();
        let mut busy = false;
        let last = self.catalog.last_event_seq().await?;
        if last != self.enqueued_to.load(Ordering::Relaxed) {
            for h in &self.hooks {
                busy |= self.catalog.enqueue_deliveries(&h.cfg.name, &h.filter, now, ENQUEUE_BATCH).await? == ENQUEUE_BATCH;
            }
            if !busy {
                self.enqueued_to.store(last, Ordering::Relaxed);
            }
        }
        let (pending, failed) = self.catalog.delivery_backlog().await?;
        self.metrics.webhook_deliveries_pending.set(pending as i64);
        self.metrics.webhook_deliveries_failed.set(failed as i64);
        let free = slots.available_permits().min(BATCH as usize);
        if pending == 0 {
            return Ok(if busy { Next::Now } else { Next::Quiet });
        }
        if free == 0 {
            return Ok(Next::WhenSlotFrees);
        }
        let lease_ms = self.hooks.iter().map(|h| h.cfg.timeout).max().unwrap_or_default().as_millis() as i64 + 30_000;
        let claimed = self.catalog.claim_deliveries(&self.owner, now, lease_ms, free as u32).await?;
        let got = claimed.len();
        for d in claimed {
            let slot = slots.clone().acquire_owned().await.expect("the semaphore is never closed");
            let (me, settle) = (self.clone(), settle.clone());
            tokio::spawn(async move {
                if let Some(settlement) = me.deliver(&d).await {
                    // The settler only stops after every sender is gone, so this cannot fail.
                    let _ = settle.send(Settle { settlement, event_id: d.event.id, _slot: slot });
                }
            });
        }
        Ok(if busy || (got == free && slots.available_permits() > 0) {
            Next::Now
        } else if got > 0 && (got as u64) < pending {
            // More may be due behind these (the backlog counts retries not yet due too; a
            // round that claims nothing goes idle, so this cannot spin).
            Next::WhenSlotFrees
        } else {
            Next::Idle
        })
    }

    /// Send one claimed delivery; the attempt to record (None: not attempted).
    async fn deliver(&self, d: &Delivery) -> Option<Settlement> {
        let Some(hook) = self.hooks.iter().find(|h| h.cfg.name == d.webhook) else {
            // A webhook removed from the configuration: leave its deliveries pending (visible)
            // and let the lease lapse.
            return None;
        };
        let outcome = self.attempt(hook, d).await;
        match &outcome {
            AttemptOutcome::Delivered { .. } => {
                self.metrics.webhook_deliveries.get_or_create(&crate::metrics::OutcomeLabel { outcome: "delivered" }).inc()
            }
            AttemptOutcome::Retry { status, error, .. } => {
                tracing::info!(
                    webhook = hook.cfg.name,
                    event = d.event.id,
                    attempt = d.attempts + 1,
                    ?status,
                    error,
                    "webhook delivery failed; will retry"
                );
                self.metrics.webhook_deliveries.get_or_create(&crate::metrics::OutcomeLabel { outcome: "retry" }).inc()
            }
            AttemptOutcome::GiveUp { status, error } => {
                tracing::warn!(webhook = hook.cfg.name, event = d.event.id, attempts = d.attempts + 1, ?status, error, "webhook delivery given up");
                self.metrics.webhook_deliveries.get_or_create(&crate::metrics::OutcomeLabel { outcome: "failed" }).inc()
            }
        };
        Some(Settlement { webhook: d.webhook.clone(), event_seq: d.event.seq, outcome })
    }

    /// POST one delivery and judge the answer.
    async fn attempt(&self, hook: &Hook, d: &Delivery) -> AttemptOutcome {
        let payload = EventView::of(&d.event).payload();
        let ts = now_ms() / 1000;
        let signature = match hook.signer.sign(&d.event.id, ts, payload.as_bytes()) {
            Ok(s) => s,
            Err(e) => return AttemptOutcome::GiveUp { status: None, error: format!("cannot sign the payload: {e}") },
        };
        let send = self
            .client
            .post(hook.cfg.url.clone())
            .header(http::header::CONTENT_TYPE, "application/json")
            .header(standardwebhooks::HEADER_WEBHOOK_ID, &d.event.id)
            .header(standardwebhooks::HEADER_WEBHOOK_TIMESTAMP, ts.to_string())
            .header(standardwebhooks::HEADER_WEBHOOK_SIGNATURE, signature)
            .header(http::header::USER_AGENT, concat!("ferry/", env!("CARGO_PKG_VERSION")))
            .body(payload)
            .send();
        // The whole exchange, answer body included (read and dropped), within the timeout.
        let exchange = async {
            let resp = send.await?;
            let status = resp.status();
            let mut body = resp.bytes_stream();
            while let Some(chunk) = body.next().await {
                chunk?;
            }
            Ok::<_, reqwest::Error>(status)
        };
        let (status, error) = match tokio::time::timeout(hook.cfg.timeout, exchange).await {
            Err(_) => (None, format!("no complete answer within {}", crate::units::human_duration(hook.cfg.timeout))),
            Ok(Err(e)) => (None, one_line(&e)),
            Ok(Ok(s)) if s.is_success() => return AttemptOutcome::Delivered { status: s.as_u16() },
            Ok(Ok(s)) if s.is_redirection() => (Some(s.as_u16()), format!("HTTP {s}: redirects are not followed; configure the final URL")),
            Ok(Ok(s)) => (Some(s.as_u16()), format!("HTTP {s}")),
        };
        let next = now_ms() + backoff(d.attempts).as_millis() as i64;
        if next > d.created_at_ms + hook.cfg.retry_for.as_millis() as i64 {
            AttemptOutcome::GiveUp { status, error }
        } else {
            AttemptOutcome::Retry { status, error, next_attempt_ms: next }
        }
    }
}

/// An error and its causes on one line (no URL credentials: reqwest strips them from messages).
fn one_line(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut src = e.source();
    while let Some(c) = src {
        s.push_str(": ");
        s.push_str(&c.to_string());
        src = c.source();
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_and_is_capped() {
        assert_eq!(backoff(0), Duration::from_secs(1));
        assert_eq!(backoff(1), Duration::from_secs(2));
        assert_eq!(backoff(3), Duration::from_secs(8));
        assert_eq!(backoff(12), MAX_BACKOFF);
        assert_eq!(backoff(u32::MAX), MAX_BACKOFF);
    }
}
