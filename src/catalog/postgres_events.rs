//! [`EventCatalog`] on PostgreSQL: the outbox rows the triggers of `0005_events.sql` write, and
//! webhook deliveries. Cursors are locked rows (`FOR UPDATE`), so replicas enqueue each event
//! once; claims take `FOR UPDATE SKIP LOCKED` plus a lease on the database clock, so no two
//! replicas send one delivery at once.

use async_trait::async_trait;
use sqlx::{Postgres, Transaction};

use super::dialect::sql;
use super::event_statements::{self as st, deliveries_joined};
use super::events::{row_to_delivery, row_to_event};
use super::events::{Delivery, DeliveryState, EventCatalog, EventFilter, EventRecord, Settlement};
use super::postgres::{settle, within, within_for, Tx};
use super::{CatalogResult, PostgresCatalog};

async fn enqueue_in(tx: &mut Transaction<'static, Postgres>, webhook: &str, filter: &EventFilter, now_ms: i64, limit: u32) -> CatalogResult<u32> {
    sqlx::query("INSERT INTO webhook_cursors (webhook, last_seq) SELECT $1, COALESCE(MAX(seq), 0) FROM events ON CONFLICT (webhook) DO NOTHING")
        .bind(webhook)
        .execute(&mut **tx)
        .await?;
    // The row lock makes replicas take turns: each reads the cursor the last one left.
    let cursor: i64 = sqlx::query_scalar(st::CURSOR.pg).bind(webhook).fetch_one(&mut **tx).await?;
    let rows = sqlx::query(st::EVENTS_AFTER.pg).bind(cursor).bind(limit as i64).fetch_all(&mut **tx).await?;
    let events = rows.iter().map(row_to_event).collect::<CatalogResult<Vec<_>>>()?;
    let Some(last) = events.last().map(|e| e.seq) else {
        return Ok(0);
    };
    for e in events.iter().filter(|e| filter.matches(e)) {
        sqlx::query(st::INSERT_DELIVERY.pg).bind(webhook).bind(e.seq).bind(&e.subject).bind(now_ms).execute(&mut **tx).await?;
    }
    sqlx::query(st::SET_CURSOR.pg).bind(last).bind(webhook).execute(&mut **tx).await?;
    Ok(events.len() as u32)
}

async fn claim_in(tx: &mut Transaction<'static, Postgres>, owner: &str, now_ms: i64, lease_ms: i64, limit: u32) -> CatalogResult<Vec<Delivery>> {
    let keys: Vec<(String, i64)> = sqlx::query_as(
        sql!(
            "WITH due AS (SELECT d.webhook, d.event_seq FROM webhook_deliveries d WHERE d.state = 'pending' AND d.next_attempt_ms <= ? \
               AND (d.lease_owner IS NULL OR d.lease_expires_ms <= {now}) \
               AND NOT EXISTS (SELECT 1 FROM webhook_deliveries p WHERE p.webhook = d.webhook AND p.subject = d.subject \
                               AND p.state = 'pending' AND p.event_seq < d.event_seq) \
               ORDER BY d.event_seq LIMIT ? FOR UPDATE SKIP LOCKED) \
             UPDATE webhook_deliveries w SET lease_owner = ?, lease_expires_ms = {now} + ? FROM due \
             WHERE w.webhook = due.webhook AND w.event_seq = due.event_seq RETURNING w.webhook, w.event_seq"
        )
        .pg,
    )
    .bind(now_ms)
    .bind(limit as i64)
    .bind(owner)
    .bind(lease_ms)
    .fetch_all(&mut **tx)
    .await?;
    let mut out = Vec::with_capacity(keys.len());
    for (webhook, seq) in keys {
        let row = sqlx::query(st::DELIVERY.pg).bind(&webhook).bind(seq).fetch_optional(&mut **tx).await?;
        if let Some(r) = row {
            out.push(row_to_delivery(&r)?);
        }
    }
    out.sort_by_key(|d| d.event.seq);
    Ok(out)
}

#[async_trait]
impl EventCatalog for PostgresCatalog {
    async fn list_events(&self, principal: Option<&str>, after_seq: i64, limit: u32) -> CatalogResult<Vec<EventRecord>> {
        within(async {
            let rows = sqlx::query(st::LIST_EVENTS.pg).bind(after_seq).bind(principal).bind(limit as i64).fetch_all(&self.pool).await?;
            rows.iter().map(row_to_event).collect()
        })
        .await
    }

    async fn event_by_id(&self, id: &str) -> CatalogResult<Option<EventRecord>> {
        within(async {
            let row = sqlx::query(st::EVENT_BY_ID.pg).bind(id).fetch_optional(&self.pool).await?;
            row.as_ref().map(row_to_event).transpose()
        })
        .await
    }

    async fn last_event_seq(&self) -> CatalogResult<i64> {
        within(async { Ok(sqlx::query_scalar("SELECT COALESCE(MAX(seq), 0)::BIGINT FROM events").fetch_one(&self.pool).await?) }).await
    }

    async fn prune_events(&self, before_ms: i64) -> CatalogResult<u64> {
        within_for(super::postgres::SWEEP_DEADLINE, async {
            let mut tx = self.pool.begin().await?;
            let out: CatalogResult<Tx<_>> = async {
                sqlx::query(st::PRUNE_DELIVERIES.pg).bind(before_ms).execute(&mut *tx).await?;
                // Never an event a webhook's cursor has not passed yet: it has no delivery row until
                // that webhook's worker (perhaps on a replica that is down) enqueues it.
                let done = sqlx::query(
                    "DELETE FROM events e WHERE e.at_ms < $1 AND NOT EXISTS (SELECT 1 FROM webhook_deliveries d WHERE d.event_seq = e.seq) \
                 AND e.seq <= (SELECT COALESCE(MIN(last_seq), 9223372036854775807) FROM webhook_cursors)",
                )
                .bind(before_ms)
                .execute(&mut *tx)
                .await?;
                Ok(Tx::Commit(done.rows_affected()))
            }
            .await;
            settle(tx, out).await
        })
        .await
    }

    async fn enqueue_deliveries(&self, webhook: &str, filter: &EventFilter, now_ms: i64, limit: u32) -> CatalogResult<u32> {
        within(async {
            let mut tx = self.pool.begin().await?;
            let out = enqueue_in(&mut tx, webhook, filter, now_ms, limit).await.map(Tx::Commit);
            settle(tx, out).await
        })
        .await
    }

    async fn claim_deliveries(&self, owner: &str, now_ms: i64, lease_ms: i64, limit: u32) -> CatalogResult<Vec<Delivery>> {
        within(async {
            let mut tx = self.pool.begin().await?;
            let out = claim_in(&mut tx, owner, now_ms, lease_ms, limit).await.map(Tx::Commit);
            settle(tx, out).await
        })
        .await
    }

    async fn settle_deliveries(&self, owner: &str, settlements: &[Settlement], now_ms: i64) -> CatalogResult<Vec<bool>> {
        within(async {
            let mut tx = self.pool.begin().await?;
            let out: CatalogResult<Tx<_>> = async {
                let mut applied = Vec::with_capacity(settlements.len());
                for s in settlements {
                    let (state, status, error, next) = s.outcome.columns();
                    let done = sqlx::query(st::SETTLE_DELIVERY.pg)
                        .bind(state)
                        .bind(now_ms)
                        .bind(status.map(i64::from))
                        .bind(error)
                        .bind(next)
                        .bind(&s.webhook)
                        .bind(s.event_seq)
                        .bind(owner)
                        .execute(&mut *tx)
                        .await?;
                    applied.push(done.rows_affected() == 1);
                }
                Ok(Tx::Commit(applied))
            }
            .await;
            settle(tx, out).await
        })
        .await
    }

    async fn list_deliveries(&self, principal: Option<&str>, states: &[DeliveryState], limit: u32) -> CatalogResult<Vec<Delivery>> {
        within(async {
            let states: Vec<String> = states.iter().map(|s| s.as_str().to_string()).collect();
            let rows = sqlx::query(
                sql!(deliveries_joined!(), "WHERE d.state = ANY(?1) AND (?2::TEXT IS NULL OR e.principal = ?2) ORDER BY d.event_seq DESC LIMIT ?3")
                    .pg,
            )
            .bind(states)
            .bind(principal)
            .bind(limit as i64)
            .fetch_all(&self.pool)
            .await?;
            rows.iter().map(row_to_delivery).collect()
        })
        .await
    }

    async fn delivery_backlog(&self) -> CatalogResult<(u64, u64)> {
        within(async {
            let (pending, failed): (i64, i64) = sqlx::query_as(st::DELIVERY_BACKLOG.pg).fetch_one(&self.pool).await?;
            Ok((pending as u64, failed as u64))
        })
        .await
    }
}
