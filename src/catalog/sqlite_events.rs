//! [`EventCatalog`] on SQLite: the outbox rows the triggers of `0005_events.sql` write, and
//! webhook deliveries. Multi-statement changes run in `BEGIN IMMEDIATE` transactions.

use async_trait::async_trait;

use super::dialect::sql;
use super::event_statements::{self as st, deliveries_joined};
use super::events::{row_to_delivery, row_to_event};
use super::events::{Delivery, DeliveryState, EventCatalog, EventFilter, EventRecord, Settlement};
use super::{CatalogResult, SqliteCatalog};

#[async_trait]
impl EventCatalog for SqliteCatalog {
    async fn list_events(&self, principal: Option<&str>, after_seq: i64, limit: u32) -> CatalogResult<Vec<EventRecord>> {
        let rows = sqlx::query(st::LIST_EVENTS.sqlite).bind(after_seq).bind(principal).bind(limit as i64).fetch_all(&self.pool).await?;
        rows.iter().map(row_to_event).collect()
    }

    async fn event_by_id(&self, id: &str) -> CatalogResult<Option<EventRecord>> {
        let row = sqlx::query(st::EVENT_BY_ID.sqlite).bind(id).fetch_optional(&self.pool).await?;
        row.as_ref().map(row_to_event).transpose()
    }

    async fn last_event_seq(&self) -> CatalogResult<i64> {
        // AUTOINCREMENT never reuses a seq, even after pruning: read the counter, not MAX(seq).
        let seq: Option<i64> = sqlx::query_scalar("SELECT seq FROM sqlite_sequence WHERE name = 'events'").fetch_optional(&self.pool).await?;
        Ok(seq.unwrap_or(0))
    }

    async fn prune_events(&self, before_ms: i64) -> CatalogResult<u64> {
        let mut tx = self.pool.begin_with("BEGIN IMMEDIATE").await?;
        sqlx::query(st::PRUNE_DELIVERIES.sqlite).bind(before_ms).execute(&mut *tx).await?;
        // Never an event a webhook's cursor has not passed yet: it has no delivery row until
        // that webhook's worker (perhaps on a replica that is down) enqueues it.
        let done = sqlx::query(
            "DELETE FROM events WHERE at_ms < ? AND seq NOT IN (SELECT event_seq FROM webhook_deliveries) \
             AND seq <= (SELECT COALESCE(MIN(last_seq), 9223372036854775807) FROM webhook_cursors)",
        )
        .bind(before_ms)
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(done.rows_affected())
    }

    async fn enqueue_deliveries(&self, webhook: &str, filter: &EventFilter, now_ms: i64, limit: u32) -> CatalogResult<u32> {
        let mut tx = self.pool.begin_with("BEGIN IMMEDIATE").await?;
        sqlx::query(
            "INSERT INTO webhook_cursors (webhook, last_seq) VALUES (?, COALESCE((SELECT seq \
             FROM sqlite_sequence WHERE name = 'events'), 0)) ON CONFLICT (webhook) DO NOTHING",
        )
        .bind(webhook)
        .execute(&mut *tx)
        .await?;
        let cursor: i64 = sqlx::query_scalar(st::CURSOR.sqlite).bind(webhook).fetch_one(&mut *tx).await?;
        let rows = sqlx::query(st::EVENTS_AFTER.sqlite).bind(cursor).bind(limit as i64).fetch_all(&mut *tx).await?;
        let events = rows.iter().map(row_to_event).collect::<CatalogResult<Vec<_>>>()?;
        let Some(last) = events.last().map(|e| e.seq) else {
            tx.commit().await?;
            return Ok(0);
        };
        for e in events.iter().filter(|e| filter.matches(e)) {
            sqlx::query(st::INSERT_DELIVERY.sqlite).bind(webhook).bind(e.seq).bind(&e.subject).bind(now_ms).execute(&mut *tx).await?;
        }
        sqlx::query(st::SET_CURSOR.sqlite).bind(last).bind(webhook).execute(&mut *tx).await?;
        tx.commit().await?;
        Ok(events.len() as u32)
    }

    async fn claim_deliveries(&self, owner: &str, now_ms: i64, lease_ms: i64, limit: u32) -> CatalogResult<Vec<Delivery>> {
        let mut tx = self.pool.begin_with("BEGIN IMMEDIATE").await?;
        let keys: Vec<(String, i64)> = sqlx::query_as(
            sql!(
                "SELECT d.webhook, d.event_seq FROM webhook_deliveries d WHERE d.state = 'pending' AND d.next_attempt_ms <= ? \
                 AND (d.lease_owner IS NULL OR d.lease_expires_ms <= {now}) \
                 AND NOT EXISTS (SELECT 1 FROM webhook_deliveries p WHERE p.webhook = d.webhook AND p.subject = d.subject \
                                 AND p.state = 'pending' AND p.event_seq < d.event_seq) \
                 ORDER BY d.event_seq LIMIT ?"
            )
            .sqlite,
        )
        .bind(now_ms)
        .bind(limit as i64)
        .fetch_all(&mut *tx)
        .await?;
        let mut out = Vec::with_capacity(keys.len());
        for (webhook, seq) in keys {
            sqlx::query(
                sql!("UPDATE webhook_deliveries SET lease_owner = ?, lease_expires_ms = {now} + ? WHERE webhook = ? AND event_seq = ?").sqlite,
            )
            .bind(owner)
            .bind(lease_ms)
            .bind(&webhook)
            .bind(seq)
            .execute(&mut *tx)
            .await?;
            let row = sqlx::query(st::DELIVERY.sqlite).bind(&webhook).bind(seq).fetch_optional(&mut *tx).await?;
            if let Some(r) = row {
                out.push(row_to_delivery(&r)?);
            }
        }
        tx.commit().await?;
        Ok(out)
    }

    async fn settle_deliveries(&self, owner: &str, settlements: &[Settlement], now_ms: i64) -> CatalogResult<Vec<bool>> {
        let mut tx = self.pool.begin_with("BEGIN IMMEDIATE").await?;
        let mut out = Vec::with_capacity(settlements.len());
        for s in settlements {
            let (state, status, error, next) = s.outcome.columns();
            let done = sqlx::query(st::SETTLE_DELIVERY.sqlite)
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
            out.push(done.rows_affected() == 1);
        }
        tx.commit().await?;
        Ok(out)
    }

    async fn list_deliveries(&self, principal: Option<&str>, states: &[DeliveryState], limit: u32) -> CatalogResult<Vec<Delivery>> {
        let states_json = serde_json::to_string(&states.iter().map(|s| s.as_str()).collect::<Vec<_>>()).expect("strings serialise");
        let rows = sqlx::query(
            sql!(
                deliveries_joined!(),
                "WHERE d.state IN (SELECT value FROM json_each(?1)) AND (?2 IS NULL OR e.principal = ?2) ORDER BY d.event_seq DESC LIMIT ?3"
            )
            .sqlite,
        )
        .bind(states_json)
        .bind(principal)
        .bind(limit as i64)
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(row_to_delivery).collect()
    }

    async fn delivery_backlog(&self) -> CatalogResult<(u64, u64)> {
        let (pending, failed): (i64, i64) = sqlx::query_as(st::DELIVERY_BACKLOG.sqlite).fetch_one(&self.pool).await?;
        Ok((pending as u64, failed as u64))
    }
}
