//! [`EventCatalog`] on PostgreSQL: the outbox rows the triggers of `0005_events.sql` write, and
//! webhook deliveries. Cursors are locked rows (`FOR UPDATE`), so replicas enqueue each event
//! once; claims take `FOR UPDATE SKIP LOCKED` plus a lease on the database clock, so no two
//! replicas send one delivery at once.

use async_trait::async_trait;
use sqlx::{Postgres, Transaction};

use super::events::{Delivery, DeliveryState, EventCatalog, EventFilter, EventRecord, Settlement};
use super::postgres_tasks::{settle, Tx};
use super::{CatalogResult, PostgresCatalog};

use super::events::{row_to_delivery, row_to_event, DELIVERY_COLUMNS, EVENT_COLUMNS};

async fn enqueue_in(tx: &mut Transaction<'static, Postgres>, webhook: &str, filter: &EventFilter, now_ms: i64, limit: u32) -> CatalogResult<u32> {
    sqlx::query("INSERT INTO webhook_cursors (webhook, last_seq) SELECT $1, COALESCE(MAX(seq), 0) FROM events ON CONFLICT (webhook) DO NOTHING")
        .bind(webhook)
        .execute(&mut **tx)
        .await?;
    // The row lock makes replicas take turns: each reads the cursor the last one left.
    let cursor: i64 = sqlx::query_scalar("SELECT last_seq FROM webhook_cursors WHERE webhook = $1 FOR UPDATE").bind(webhook).fetch_one(&mut **tx).await?;
    let rows = sqlx::query(sqlx::AssertSqlSafe(format!("SELECT {EVENT_COLUMNS} FROM events e WHERE e.seq > $1 ORDER BY e.seq LIMIT $2")))
        .bind(cursor)
        .bind(limit as i64)
        .fetch_all(&mut **tx)
        .await?;
    let events = rows.iter().map(row_to_event).collect::<CatalogResult<Vec<_>>>()?;
    let Some(last) = events.last().map(|e| e.seq) else {
        return Ok(0);
    };
    for e in events.iter().filter(|e| filter.matches(e)) {
        sqlx::query(
            "INSERT INTO webhook_deliveries (webhook, event_seq, subject, state, created_at_ms, next_attempt_ms) VALUES ($1, $2, $3, 'pending', $4, $4) \
             ON CONFLICT (webhook, event_seq) DO NOTHING",
        )
        .bind(webhook)
        .bind(e.seq)
        .bind(&e.subject)
        .bind(now_ms)
        .execute(&mut **tx)
        .await?;
    }
    sqlx::query("UPDATE webhook_cursors SET last_seq = $1 WHERE webhook = $2").bind(last).bind(webhook).execute(&mut **tx).await?;
    Ok(events.len() as u32)
}

async fn claim_in(tx: &mut Transaction<'static, Postgres>, owner: &str, now_ms: i64, lease_ms: i64, limit: u32) -> CatalogResult<Vec<Delivery>> {
    let keys: Vec<(String, i64)> = sqlx::query_as(
        "WITH due AS (SELECT d.webhook, d.event_seq FROM webhook_deliveries d WHERE d.state = 'pending' AND d.next_attempt_ms <= $1 \
           AND (d.lease_owner IS NULL OR d.lease_expires_ms <= ferry_now_ms()) \
           AND NOT EXISTS (SELECT 1 FROM webhook_deliveries p WHERE p.webhook = d.webhook AND p.subject = d.subject \
                           AND p.state = 'pending' AND p.event_seq < d.event_seq) \
           ORDER BY d.event_seq LIMIT $2 FOR UPDATE SKIP LOCKED) \
         UPDATE webhook_deliveries w SET lease_owner = $3, lease_expires_ms = ferry_now_ms() + $4 FROM due \
         WHERE w.webhook = due.webhook AND w.event_seq = due.event_seq RETURNING w.webhook, w.event_seq",
    )
    .bind(now_ms)
    .bind(limit as i64)
    .bind(owner)
    .bind(lease_ms)
    .fetch_all(&mut **tx)
    .await?;
    let mut out = Vec::with_capacity(keys.len());
    for (webhook, seq) in keys {
        let row = sqlx::query(sqlx::AssertSqlSafe(format!(
            "SELECT {DELIVERY_COLUMNS}, {EVENT_COLUMNS} FROM webhook_deliveries d JOIN events e ON e.seq = d.event_seq WHERE d.webhook = $1 AND d.event_seq = $2"
        )))
        .bind(&webhook)
        .bind(seq)
        .fetch_optional(&mut **tx)
        .await?;
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
        let rows =
            sqlx::query(sqlx::AssertSqlSafe(format!("SELECT {EVENT_COLUMNS} FROM events e WHERE e.seq > $1 AND ($2::TEXT IS NULL OR e.principal = $2) ORDER BY e.seq LIMIT $3")))
                .bind(after_seq)
                .bind(principal)
                .bind(limit as i64)
                .fetch_all(&self.pool)
                .await?;
        rows.iter().map(row_to_event).collect()
    }

    async fn event_by_id(&self, id: &str) -> CatalogResult<Option<EventRecord>> {
        let row = sqlx::query(sqlx::AssertSqlSafe(format!("SELECT {EVENT_COLUMNS} FROM events e WHERE e.id = $1"))).bind(id).fetch_optional(&self.pool).await?;
        row.as_ref().map(row_to_event).transpose()
    }

    async fn last_event_seq(&self) -> CatalogResult<i64> {
        Ok(sqlx::query_scalar("SELECT COALESCE(MAX(seq), 0)::BIGINT FROM events").fetch_one(&self.pool).await?)
    }

    async fn prune_events(&self, before_ms: i64) -> CatalogResult<u64> {
        let mut tx = self.pool.begin().await?;
        let out: CatalogResult<Tx<_>> = async {
            sqlx::query("DELETE FROM webhook_deliveries WHERE state <> 'pending' AND COALESCE(last_attempt_ms, created_at_ms) < $1").bind(before_ms).execute(&mut *tx).await?;
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
    }

    async fn enqueue_deliveries(&self, webhook: &str, filter: &EventFilter, now_ms: i64, limit: u32) -> CatalogResult<u32> {
        let mut tx = self.pool.begin().await?;
        let out = enqueue_in(&mut tx, webhook, filter, now_ms, limit).await.map(Tx::Commit);
        settle(tx, out).await
    }

    async fn claim_deliveries(&self, owner: &str, now_ms: i64, lease_ms: i64, limit: u32) -> CatalogResult<Vec<Delivery>> {
        let mut tx = self.pool.begin().await?;
        let out = claim_in(&mut tx, owner, now_ms, lease_ms, limit).await.map(Tx::Commit);
        settle(tx, out).await
    }

    async fn settle_deliveries(&self, owner: &str, settlements: &[Settlement], now_ms: i64) -> CatalogResult<Vec<bool>> {
        let mut tx = self.pool.begin().await?;
        let out: CatalogResult<Tx<_>> = async {
            let mut applied = Vec::with_capacity(settlements.len());
            for s in settlements {
                let (state, status, error, next) = s.outcome.columns();
                let done = sqlx::query(
                    "UPDATE webhook_deliveries SET state = $1, attempts = attempts + 1, last_attempt_ms = $2, last_status = $3, last_error = $4, \
                 next_attempt_ms = COALESCE($5, next_attempt_ms), lease_owner = NULL, lease_expires_ms = NULL \
                 WHERE webhook = $6 AND event_seq = $7 AND lease_owner = $8 AND state = 'pending'",
                )
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
    }

    async fn list_deliveries(&self, principal: Option<&str>, states: &[DeliveryState], limit: u32) -> CatalogResult<Vec<Delivery>> {
        let states: Vec<String> = states.iter().map(|s| s.as_str().to_string()).collect();
        let rows = sqlx::query(sqlx::AssertSqlSafe(format!(
            "SELECT {DELIVERY_COLUMNS}, {EVENT_COLUMNS} FROM webhook_deliveries d JOIN events e ON e.seq = d.event_seq \
             WHERE d.state = ANY($1) AND ($2::TEXT IS NULL OR e.principal = $2) ORDER BY d.event_seq DESC LIMIT $3"
        )))
        .bind(states)
        .bind(principal)
        .bind(limit as i64)
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(row_to_delivery).collect()
    }

    async fn delivery_backlog(&self) -> CatalogResult<(u64, u64)> {
        let (pending, failed): (i64, i64) =
            sqlx::query_as("SELECT COUNT(*) FILTER (WHERE state = 'pending'), COUNT(*) FILTER (WHERE state = 'failed') FROM webhook_deliveries WHERE state <> 'delivered'")
                .fetch_one(&self.pool)
                .await?;
        Ok((pending as u64, failed as u64))
    }
}
