//! [`TaskCatalog`] on PostgreSQL. Claims take `FOR UPDATE SKIP LOCKED`; read-modify-write
//! changes lock their row first; idempotency keys serialise on a transaction-scoped advisory
//! lock of (principal, kind, key), so concurrent starts with one key create at most one run
//! on every replica.

use async_trait::async_trait;
use sqlx::{Postgres, Transaction};

use super::dialect::sql;
use super::partials::{keep_from, Appended, PartialPage, MAX_FRAGMENTS};
use super::postgres::{settle, within, within_for, Tx};
use super::sql::{corrupt, json_map, json_text, raw, row_to_task, task_columns};
use super::task_statements as st;
use super::tasks::{NewTask, StartOutcome, TaskCatalog, TaskEnd, TaskRecord, TaskStatus, TaskUpdate};
use super::{CatalogError, CatalogResult, PostgresCatalog};

/// The task row, locked for the rest of the transaction.
async fn task_for_update(tx: &mut Transaction<'static, Postgres>, id: &str) -> CatalogResult<Option<TaskRecord>> {
    let row = sqlx::query(st::TASK_FOR_UPDATE.pg).bind(id).fetch_optional(&mut **tx).await?;
    row.as_ref().map(row_to_task).transpose()
}

async fn insert_task(tx: &mut Transaction<'static, Postgres>, new: &NewTask, prior: Option<&str>) -> CatalogResult<TaskRecord> {
    let row = sqlx::query(st::INSERT_TASK.pg)
        .bind(&new.id)
        .bind(&new.principal)
        .bind(&new.kind)
        .bind(&new.args)
        .bind(&new.idempotency_key)
        .bind(prior)
        .bind(new.now_ms)
        .bind(new.ttl_ms)
        .fetch_one(&mut **tx)
        .await?;
    row_to_task(&row)
}

async fn start_in(tx: &mut Transaction<'static, Postgres>, new: &NewTask) -> CatalogResult<Tx<StartOutcome>> {
    let Some(key) = &new.idempotency_key else {
        return Ok(Tx::Commit(StartOutcome::Created(insert_task(tx, new, None).await?)));
    };
    // Serialise starts with this key (on every replica) until the transaction ends. A hash
    // collision only serialises two unrelated keys.
    let lock_key = serde_json::to_string(&[&new.principal, &new.kind, key]).expect("strings serialise");
    sqlx::query("SELECT pg_advisory_xact_lock(hashtextextended($1, 0))").bind(&lock_key).execute(&mut **tx).await?;
    let existing: Option<String> =
        sqlx::query_scalar(st::TASK_BY_KEY.pg).bind(&new.principal).bind(&new.kind).bind(key).fetch_optional(&mut **tx).await?;
    let prior = match existing {
        None => None,
        Some(old_id) => match task_for_update(tx, &old_id).await? {
            None => None, // swept: the key is free again
            Some(old) if !super::tasks::same_args(&old.args, &new.args) => return Ok(Tx::Rollback(StartOutcome::Conflict(old.id))),
            Some(old) if matches!(old.status, TaskStatus::Failed | TaskStatus::Cancelled) => Some(old.id),
            Some(old) => return Ok(Tx::Rollback(StartOutcome::Existing(old))),
        },
    };
    let task = insert_task(tx, new, prior.as_deref()).await?;
    sqlx::query(st::PUT_TASK_KEY.pg).bind(&new.principal).bind(&new.kind).bind(key).bind(&new.id).execute(&mut **tx).await?;
    Ok(Tx::Commit(match prior {
        Some(prior) => StartOutcome::Retried { task, prior },
        None => StartOutcome::Created(task),
    }))
}

async fn park_in(tx: &mut Transaction<'static, Postgres>, id: &str, fence: u64, key: &str, request: &str, now_ms: i64) -> CatalogResult<Tx<()>> {
    let task = task_for_update(tx, id).await?.ok_or(CatalogError::NotFound)?;
    if task.fence != fence || task.status != TaskStatus::Working {
        return Err(CatalogError::Fenced);
    }
    let mut requests = json_map(&task.input_requests)?;
    requests.insert(key.to_string(), raw(request)?);
    sqlx::query(st::PARK.pg).bind(json_text(&requests)).bind(now_ms).bind(id).execute(&mut **tx).await?;
    Ok(Tx::Commit(()))
}

async fn append_in(
    tx: &mut Transaction<'static, Postgres>,
    id: &str,
    fence: Option<u64>,
    seq: u64,
    value: &str,
    now_ms: i64,
) -> CatalogResult<Tx<Appended>> {
    let task = task_for_update(tx, id).await?.ok_or(CatalogError::NotFound)?;
    if task.status.is_terminal() || fence.is_some_and(|f| f != task.fence) {
        return Err(CatalogError::Fenced);
    }
    let seq = if fence.is_some() { seq } else { task.partial_seq + 1 };
    if seq <= task.partial_seq {
        return Ok(Tx::Rollback(Appended::Replayed(seq)));
    }
    sqlx::query(st::INSERT_PARTIAL.pg).bind(id).bind(seq as i64).bind(now_ms).bind(value).execute(&mut **tx).await?;
    let sizes: Vec<(i64, i64)> = sqlx::query_as(st::PARTIAL_SIZES.pg).bind(id).bind(2 * MAX_FRAGMENTS as i64).fetch_all(&mut **tx).await?;
    let sizes: Vec<(u64, usize)> = sizes.into_iter().map(|(s, n)| (s as u64, n.max(0) as usize)).collect();
    let dropped = match keep_from(&sizes) {
        Some(from) => sqlx::query(st::DROP_PARTIALS.pg).bind(id).bind(from as i64).execute(&mut **tx).await?.rows_affected(),
        None => 0,
    };
    sqlx::query(st::SET_PARTIAL_SEQ.pg).bind(seq as i64).bind(dropped as i64).bind(now_ms).bind(id).execute(&mut **tx).await?;
    Ok(Tx::Commit(Appended::Stored(seq)))
}

async fn respond_in(tx: &mut Transaction<'static, Postgres>, id: &str, key: &str, response: &str, now_ms: i64) -> CatalogResult<Tx<bool>> {
    let task = task_for_update(tx, id).await?.ok_or(CatalogError::NotFound)?;
    let requests = json_map(&task.input_requests)?;
    let mut responses = json_map(&task.input_responses)?;
    if task.status.is_terminal() || !requests.contains_key(key) || responses.contains_key(key) {
        return Ok(Tx::Rollback(false));
    }
    responses.insert(key.to_string(), raw(response)?);
    let all_answered = requests.keys().all(|k| responses.contains_key(k));
    let status = if all_answered { "working" } else { task.status.as_str() };
    sqlx::query(st::RESPOND.pg).bind(json_text(&responses)).bind(status).bind(now_ms).bind(id).execute(&mut **tx).await?;
    Ok(Tx::Commit(true))
}

async fn sweep_in(tx: &mut Transaction<'static, Postgres>, now_ms: i64) -> CatalogResult<Tx<u64>> {
    let swept: Vec<String> =
        sqlx::query_scalar("DELETE FROM tasks WHERE status IN ('completed', 'failed', 'cancelled') AND updated_at_ms + ttl_ms <= $1 RETURNING id")
            .bind(now_ms)
            .fetch_all(&mut **tx)
            .await?;
    // Only keys that still name a deleted task (a retry may have moved the key on).
    sqlx::query("DELETE FROM task_keys WHERE task_id = ANY($1)").bind(&swept).execute(&mut **tx).await?;
    Ok(Tx::Commit(swept.len() as u64))
}

#[async_trait]
impl TaskCatalog for PostgresCatalog {
    async fn start_task(&self, new: &NewTask) -> CatalogResult<StartOutcome> {
        within(async {
            let mut tx = self.pool.begin().await?;
            let out = start_in(&mut tx, new).await;
            settle(tx, out).await
        })
        .await
    }

    async fn task_by_key(&self, principal: &str, kind: &str, key: &str) -> CatalogResult<Option<TaskRecord>> {
        within(async {
            let id: Option<String> = sqlx::query_scalar(st::TASK_BY_KEY.pg).bind(principal).bind(kind).bind(key).fetch_optional(&self.pool).await?;
            match id {
                Some(id) => self.get_task(&id).await,
                None => Ok(None),
            }
        })
        .await
    }

    async fn get_task(&self, id: &str) -> CatalogResult<Option<TaskRecord>> {
        within(async {
            let row = sqlx::query(st::GET_TASK.pg).bind(id).fetch_optional(&self.pool).await?;
            row.as_ref().map(row_to_task).transpose()
        })
        .await
    }

    async fn list_tasks(&self, principal: &str, limit: u32) -> CatalogResult<Vec<TaskRecord>> {
        within(async {
            let rows = sqlx::query(st::LIST_TASKS.pg).bind(principal).bind(limit as i64).fetch_all(&self.pool).await?;
            rows.iter().map(row_to_task).collect()
        })
        .await
    }

    async fn claim_task(&self, owner: &str, kinds: &[String], lease_ms: i64) -> CatalogResult<Option<TaskRecord>> {
        within(async {
            if kinds.is_empty() {
                return Ok(None);
            }
            // The lease is measured on the database's clock, so replicas with skewed clocks agree
            // on when it expires. SKIP LOCKED: a row another replica is claiming is passed over.
            let row = sqlx::query(
                sql!(
                    "UPDATE tasks SET lease_owner = ?, lease_expires_ms = {now} + ?, fence = fence + 1, runs = runs + 1 \
                     WHERE id = (SELECT id FROM tasks WHERE status = 'working' \
                         AND (lease_expires_ms IS NULL OR lease_expires_ms <= {now}) AND kind = ANY(?) \
                         ORDER BY created_at_ms LIMIT 1 FOR UPDATE SKIP LOCKED) \
                     RETURNING ",
                    task_columns!()
                )
                .pg,
            )
            .bind(owner)
            .bind(lease_ms)
            .bind(kinds)
            .fetch_optional(&self.pool)
            .await?;
            row.as_ref().map(row_to_task).transpose()
        })
        .await
    }

    async fn renew_lease(&self, id: &str, fence: u64, lease_ms: i64) -> CatalogResult<TaskStatus> {
        within(async {
            let status: Option<String> =
                sqlx::query_scalar(st::RENEW_TASK_LEASE.pg).bind(lease_ms).bind(id).bind(fence as i64).fetch_optional(&self.pool).await?;
            match status {
                Some(s) => TaskStatus::parse(&s).ok_or_else(|| corrupt("status")),
                None => Err(CatalogError::Fenced),
            }
        })
        .await
    }

    async fn update_task(&self, id: &str, fence: Option<u64>, u: &TaskUpdate) -> CatalogResult<()> {
        within(async {
            let progress = u.progress.as_ref().map(|p| serde_json::to_string(p).expect("progress serialises"));
            let done = sqlx::query(st::UPDATE_TASK.pg)
                .bind(progress)
                .bind(&u.checkpoint)
                .bind(u.partial_mark.map(|m| m as i64))
                .bind(u.now_ms)
                .bind(id)
                .bind(fence.map(|f| f as i64))
                .execute(&self.pool)
                .await?;
            if done.rows_affected() == 1 {
                Ok(())
            } else if self.get_task(id).await?.is_none() {
                Err(CatalogError::NotFound)
            } else {
                Err(CatalogError::Fenced)
            }
        })
        .await
    }

    async fn append_partial(&self, id: &str, fence: Option<u64>, seq: u64, value: &str, now_ms: i64) -> CatalogResult<Appended> {
        within(async {
            let mut tx = self.pool.begin().await?;
            let out = append_in(&mut tx, id, fence, seq, value, now_ms).await;
            settle(tx, out).await
        })
        .await
    }

    async fn task_partials(&self, id: &str, after: u64) -> CatalogResult<PartialPage> {
        within(async {
            let rows: Vec<super::partials::PageRow> =
                sqlx::query_as(st::PARTIAL_PAGE.pg).bind(after.min(i64::MAX as u64) as i64).bind(id).fetch_all(&self.pool).await?;
            super::partials::page_of(rows).ok_or(CatalogError::NotFound)
        })
        .await
    }

    async fn park_for_input(&self, id: &str, fence: u64, key: &str, request: &str, now_ms: i64) -> CatalogResult<()> {
        within(async {
            let mut tx = self.pool.begin().await?;
            let out = park_in(&mut tx, id, fence, key, request, now_ms).await;
            settle(tx, out).await
        })
        .await
    }

    async fn respond_input(&self, id: &str, key: &str, response: &str, now_ms: i64) -> CatalogResult<bool> {
        within(async {
            let mut tx = self.pool.begin().await?;
            let out = respond_in(&mut tx, id, key, response, now_ms).await;
            settle(tx, out).await
        })
        .await
    }

    async fn finish_task(&self, id: &str, fence: Option<u64>, end: &TaskEnd, now_ms: i64) -> CatalogResult<bool> {
        within(async {
            let (status, result, error) = match end {
                TaskEnd::Completed(r) => ("completed", Some(r.as_str()), None),
                TaskEnd::Failed(e) => ("failed", None, Some(e.as_str())),
            };
            let done = sqlx::query(st::FINISH_TASK.pg)
                .bind(status)
                .bind(result)
                .bind(error)
                .bind(now_ms)
                .bind(id)
                .bind(fence.map(|f| f as i64))
                .execute(&self.pool)
                .await?;
            Ok(done.rows_affected() == 1)
        })
        .await
    }

    async fn cancel_task(&self, id: &str, now_ms: i64) -> CatalogResult<TaskRecord> {
        within(async {
            sqlx::query(st::CANCEL_TASK.pg).bind(now_ms).bind(id).execute(&self.pool).await?;
            // A statement of its own: it sees a finish that won the race (one statement would read
            // the snapshot from before it).
            self.get_task(id).await?.ok_or(CatalogError::NotFound)
        })
        .await
    }

    async fn release_task(&self, id: &str, fence: u64) -> CatalogResult<()> {
        within(async {
            sqlx::query(st::RELEASE_TASK.pg).bind(id).bind(fence as i64).execute(&self.pool).await?;
            Ok(())
        })
        .await
    }

    async fn sweep_tasks(&self, now_ms: i64) -> CatalogResult<u64> {
        within_for(super::postgres::SWEEP_DEADLINE, async {
            let mut tx = self.pool.begin().await?;
            let out = sweep_in(&mut tx, now_ms).await;
            settle(tx, out).await
        })
        .await
    }

    async fn task_counts(&self) -> CatalogResult<Vec<super::tasks::TaskCount>> {
        within(async {
            let rows = sqlx::query(st::TASK_COUNTS.pg).fetch_all(&self.pool).await?;
            rows.iter().map(super::tasks::row_to_task_count).collect()
        })
        .await
    }
}
