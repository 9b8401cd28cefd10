//! [`TaskCatalog`] on SQLite. Multi-statement changes run in `BEGIN IMMEDIATE` transactions,
//! so concurrent writers serialise instead of failing on a lock upgrade.

use async_trait::async_trait;
use sqlx::{Sqlite, Transaction};

use super::dialect::sql;
use super::partials::{keep_from, Appended, PartialPage, MAX_FRAGMENTS};
use super::sql::{corrupt, json_map, json_text, raw, row_to_task};
use super::sqlite::to_end;
use super::task_statements as st;
use super::tasks::{NewTask, StartOutcome, TaskCatalog, TaskEnd, TaskRecord, TaskStatus, TaskUpdate};
use super::{CatalogError, CatalogResult, SqliteCatalog};

async fn task_in(tx: &mut Transaction<'static, Sqlite>, id: &str) -> CatalogResult<Option<TaskRecord>> {
    let row = sqlx::query(st::TASK_FOR_UPDATE.sqlite).bind(id).fetch_optional(&mut **tx).await?;
    row.as_ref().map(row_to_task).transpose()
}

async fn insert_task(tx: &mut Transaction<'static, Sqlite>, new: &NewTask, prior: Option<&str>) -> CatalogResult<TaskRecord> {
    let row = sqlx::query(st::INSERT_TASK.sqlite)
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

impl SqliteCatalog {
    async fn immediate(&self) -> CatalogResult<Transaction<'static, Sqlite>> {
        Ok(self.pool.begin_with("BEGIN IMMEDIATE").await?)
    }

    /// Held by every task write: when dropped — after the write committed or failed — the
    /// read cache forgets task `id` (`None`: every task).
    pub(super) fn tasks_changed(&self, id: Option<&str>) -> Invalidate<TaskRecord> {
        Invalidate::new(self.task_cache.clone(), id)
    }
}

/// Rows as last read, for a process that is the database's only writer (see
/// [`SqliteCatalog::with_read_cache`]).
///
/// A reader may only keep what it read if no write finished while it read: it notes the write
/// generation before the query and stores the row only if the generation is unchanged (checked
/// and stored under the lock). A writer bumps the generation and drops the entry after its
/// commit (under the lock), so a row read before a commit is either never stored or dropped by
/// that writer — never served afterwards.
///
/// A writer that read its row back from its own statement (`RETURNING`) may keep it instead of
/// dropping it ([`Invalidate::wrote`]), only when no other write overlapped its own: none
/// finished since it began (the generation is unchanged) and none is under way (`writing`
/// counts the writes begun and not finished). So the row kept is the database's row as of the
/// last commit, whatever the order the writes committed in.
pub struct RowCache<T> {
    inner: std::sync::Mutex<CacheInner<T>>,
}

struct CacheInner<T> {
    generation: u64,
    /// Writes begun ([`Invalidate`] made) and not finished (dropped).
    writing: u64,
    rows: std::collections::HashMap<String, T>,
}

impl<T> CacheInner<T> {
    /// Keep `row` as `id`'s; the cache starts over beyond [`ROW_CACHE_MAX`] rows.
    fn insert(&mut self, id: &str, row: T) {
        if self.rows.len() >= ROW_CACHE_MAX {
            self.rows.clear();
        }
        self.rows.insert(id.to_owned(), row);
    }
}

impl<T> Default for RowCache<T> {
    fn default() -> Self {
        RowCache { inner: std::sync::Mutex::new(CacheInner { generation: 0, writing: 0, rows: std::collections::HashMap::new() }) }
    }
}

/// Rows kept at most; the cache starts over beyond it.
const ROW_CACHE_MAX: usize = 4096;

impl<T: Clone> RowCache<T> {
    fn lock(&self) -> std::sync::MutexGuard<'_, CacheInner<T>> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The cached row of `id`, or the generation to pass to [`RowCache::keep`].
    pub(super) fn get(&self, id: &str) -> Result<T, u64> {
        let g = self.lock();
        g.rows.get(id).cloned().ok_or(g.generation)
    }

    /// Keep `row` as `id`'s, unless a write finished since `generation` was read.
    pub(super) fn keep(&self, generation: u64, id: &str, row: &T) {
        let mut g = self.lock();
        if g.generation != generation {
            return;
        }
        g.insert(id, row.clone());
    }

    /// A write begins: the generation to hand back to [`RowCache::changed`].
    fn begin(&self) -> u64 {
        let mut g = self.lock();
        g.writing += 1;
        g.generation
    }

    /// A write that changed nothing ended.
    fn unchanged(&self) {
        self.lock().writing -= 1;
    }

    /// A write begun at generation `began` ended: forget `id` (`None`: every row), or keep
    /// `written` as its row when no other write overlapped this one.
    fn changed(&self, id: Option<&str>, began: u64, written: Option<T>) {
        let mut g = self.lock();
        g.writing -= 1;
        let alone = g.writing == 0 && g.generation == began;
        g.generation += 1;
        match (id, written) {
            (Some(id), Some(row)) if alone => g.insert(id, row),
            (Some(id), _) => {
                g.rows.remove(id);
            }
            (None, _) => g.rows.clear(),
        }
    }
}

/// Task rows as last read ([`SqliteCatalog::with_read_cache`]).
pub type TaskReadCache = RowCache<TaskRecord>;

/// Invalidates a read cache when dropped (see [`SqliteCatalog::tasks_changed`]).
pub(super) struct Invalidate<T: Clone> {
    cache: Option<std::sync::Arc<RowCache<T>>>,
    id: Option<String>,
    /// The cache's generation when the write began.
    began: u64,
    /// The row as the write left it, to keep instead of forgetting ([`Invalidate::wrote`]).
    written: Option<T>,
}

impl<T: Clone> Invalidate<T> {
    /// A write to row `id` (`None`: any row) begins; it ends when this is dropped.
    pub(super) fn new(cache: Option<std::sync::Arc<RowCache<T>>>, id: Option<&str>) -> Self {
        let began = cache.as_ref().map_or(0, |c| c.begin());
        Invalidate { cache, id: id.map(str::to_owned), began, written: None }
    }

    /// Narrow to the row the write turned out to touch: `Some(id)` forgets only that row, `None`
    /// (the write changed nothing) forgets nothing.
    pub(super) fn narrow_to(&mut self, id: Option<&str>) {
        match id {
            Some(id) => self.id = Some(id.to_owned()),
            None => {
                if let Some(c) = self.cache.take() {
                    c.unchanged();
                }
            }
        }
    }

    /// The write committed and left `row` (read back by its own statement): the cache keeps
    /// it as the row's when no other write overlapped (see [`RowCache`]).
    pub(super) fn wrote(&mut self, row: T) {
        self.written = Some(row);
    }
}

impl<T: Clone> Drop for Invalidate<T> {
    fn drop(&mut self) {
        if let Some(c) = self.cache.take() {
            c.changed(self.id.as_deref(), self.began, self.written.take());
        }
    }
}

#[async_trait]
impl TaskCatalog for SqliteCatalog {
    async fn start_task(&self, new: &NewTask) -> CatalogResult<StartOutcome> {
        to_end!(self, this, [new: &NewTask], {
            // A retry's new run replaces the key of an earlier task: forget every row.
            let _changed = this.tasks_changed(None);
            let mut tx = this.immediate().await?;
            let Some(key) = &new.idempotency_key else {
                let task = insert_task(&mut tx, new, None).await?;
                tx.commit().await?;
                return Ok(StartOutcome::Created(task));
            };
            let existing: Option<String> =
                sqlx::query_scalar(st::TASK_BY_KEY.sqlite).bind(&new.principal).bind(&new.kind).bind(key).fetch_optional(&mut *tx).await?;
            let prior = match existing {
                None => None,
                Some(old_id) => match task_in(&mut tx, &old_id).await? {
                    None => None, // swept: the key is free again
                    Some(old) if !super::tasks::same_args(&old.args, &new.args) => return Ok(StartOutcome::Conflict(old.id)),
                    Some(old) if matches!(old.status, TaskStatus::Failed | TaskStatus::Cancelled) => Some(old.id),
                    Some(old) => return Ok(StartOutcome::Existing(old)),
                },
            };
            let task = insert_task(&mut tx, new, prior.as_deref()).await?;
            sqlx::query(st::PUT_TASK_KEY.sqlite).bind(&new.principal).bind(&new.kind).bind(key).bind(&new.id).execute(&mut *tx).await?;
            tx.commit().await?;
            Ok(match prior {
                Some(prior) => StartOutcome::Retried { task, prior },
                None => StartOutcome::Created(task),
            })
        })
    }

    async fn task_by_key(&self, principal: &str, kind: &str, key: &str) -> CatalogResult<Option<TaskRecord>> {
        let id: Option<String> = sqlx::query_scalar(st::TASK_BY_KEY.sqlite).bind(principal).bind(kind).bind(key).fetch_optional(&self.pool).await?;
        match id {
            Some(id) => self.get_task(&id).await,
            None => Ok(None),
        }
    }

    async fn get_task(&self, id: &str) -> CatalogResult<Option<TaskRecord>> {
        let generation = match self.task_cache.as_ref().map(|c| c.get(id)) {
            Some(Ok(task)) => return Ok(Some(task)),
            Some(Err(generation)) => Some(generation),
            None => None,
        };
        let row = sqlx::query(st::GET_TASK.sqlite).bind(id).fetch_optional(&self.pool).await?;
        let task = row.as_ref().map(row_to_task).transpose()?;
        if let (Some(c), Some(g), Some(t)) = (&self.task_cache, generation, &task) {
            c.keep(g, &t.id, t);
        }
        Ok(task)
    }

    async fn list_tasks(&self, principal: &str, limit: u32) -> CatalogResult<Vec<TaskRecord>> {
        let rows = sqlx::query(st::LIST_TASKS.sqlite).bind(principal).bind(limit as i64).fetch_all(&self.pool).await?;
        rows.iter().map(row_to_task).collect()
    }

    async fn claim_task(&self, owner: &str, kinds: &[String], lease_ms: i64) -> CatalogResult<Option<TaskRecord>> {
        to_end!(self, this, [owner: &str, kinds: &[String]], {
            if kinds.is_empty() {
                return Ok(None);
            }
            let kinds_json = serde_json::to_string(kinds).expect("strings serialise");
            // Which row changes is known only inside the transaction: every row until then, so an
            // error after the update (commit outcome unknown) still forgets them all.
            let mut changed = this.tasks_changed(None);
            let mut tx = this.immediate().await?;
            let id: Option<String> = sqlx::query_scalar(
                sql!(
                    "SELECT id FROM tasks WHERE status = 'working' AND (lease_expires_ms IS NULL OR lease_expires_ms <= {now}) \
                     AND kind IN (SELECT value FROM json_each(?)) ORDER BY created_at_ms LIMIT 1"
                )
                .sqlite,
            )
            .bind(&kinds_json)
            .fetch_optional(&mut *tx)
            .await?;
            let Some(id) = id else {
                // Nothing claimed, nothing written: an idle worker's polls keep the cache.
                changed.narrow_to(None);
                return Ok(None);
            };
            sqlx::query(
                sql!(
                    "UPDATE tasks SET lease_owner = ?, lease_expires_ms = {now} + ?, fence = fence + 1, runs = runs + 1 \
                     WHERE id = ?"
                )
                .sqlite,
            )
                .bind(owner)
                .bind(lease_ms)
                .bind(&id)
                .execute(&mut *tx)
                .await?;
            let task = task_in(&mut tx, &id).await?;
            tx.commit().await?;
            changed.narrow_to(Some(&id));
            Ok(task)
        })
    }

    async fn renew_lease(&self, id: &str, fence: u64, lease_ms: i64) -> CatalogResult<TaskStatus> {
        to_end!(self, this, [id: &str], {
            let _changed = this.tasks_changed(Some(id));
            let status: Option<String> = super::sqlite::first(
                sqlx::query_scalar(st::RENEW_TASK_LEASE.sqlite).bind(lease_ms).bind(id).bind(fence as i64).fetch_all(&this.pool).await?,
            );
            match status {
                Some(s) => TaskStatus::parse(&s).ok_or_else(|| corrupt("status")),
                None => Err(CatalogError::Fenced),
            }
        })
    }

    async fn update_task(&self, id: &str, fence: Option<u64>, u: &TaskUpdate) -> CatalogResult<()> {
        to_end!(self, this, [id: &str, u: &TaskUpdate], {
            let _changed = this.tasks_changed(Some(id));
            let progress = u.progress.as_ref().map(|p| serde_json::to_string(p).expect("progress serialises"));
            let done = sqlx::query(st::UPDATE_TASK.sqlite)
                .bind(progress)
                .bind(&u.checkpoint)
                .bind(u.partial_mark.map(|m| m as i64))
                .bind(u.now_ms)
                .bind(id)
                .bind(fence.map(|f| f as i64))
                .execute(&this.pool)
                .await?;
            if done.rows_affected() == 1 {
                Ok(())
            } else if this.get_task(id).await?.is_none() {
                Err(CatalogError::NotFound)
            } else {
                Err(CatalogError::Fenced)
            }
        })
    }

    async fn append_partial(&self, id: &str, fence: Option<u64>, seq: u64, value: &str, now_ms: i64) -> CatalogResult<Appended> {
        to_end!(self, this, [id: &str, value: &str], {
            let _changed = this.tasks_changed(Some(id));
            let mut tx = this.immediate().await?;
            let task = task_in(&mut tx, id).await?.ok_or(CatalogError::NotFound)?;
            if task.status.is_terminal() || fence.is_some_and(|f| f != task.fence) {
                return Err(CatalogError::Fenced);
            }
            let seq = if fence.is_some() { seq } else { task.partial_seq + 1 };
            if seq <= task.partial_seq {
                return Ok(Appended::Replayed(seq));
            }
            sqlx::query(st::INSERT_PARTIAL.sqlite).bind(id).bind(seq as i64).bind(now_ms).bind(value).execute(&mut *tx).await?;
            let sizes: Vec<(i64, i64)> = sqlx::query_as(st::PARTIAL_SIZES.sqlite).bind(id).bind(2 * MAX_FRAGMENTS as i64).fetch_all(&mut *tx).await?;
            let sizes: Vec<(u64, usize)> = sizes.into_iter().map(|(s, n)| (s as u64, n.max(0) as usize)).collect();
            let dropped = match keep_from(&sizes) {
                Some(from) => sqlx::query(st::DROP_PARTIALS.sqlite).bind(id).bind(from as i64).execute(&mut *tx).await?.rows_affected(),
                None => 0,
            };
            sqlx::query(st::SET_PARTIAL_SEQ.sqlite).bind(seq as i64).bind(dropped as i64).bind(now_ms).bind(id).execute(&mut *tx).await?;
            tx.commit().await?;
            Ok(Appended::Stored(seq))
        })
    }

    async fn task_partials(&self, id: &str, after: u64) -> CatalogResult<PartialPage> {
        let rows: Vec<super::partials::PageRow> =
            sqlx::query_as(st::PARTIAL_PAGE.sqlite).bind(after.min(i64::MAX as u64) as i64).bind(id).fetch_all(&self.pool).await?;
        super::partials::page_of(rows).ok_or(CatalogError::NotFound)
    }

    async fn park_for_input(&self, id: &str, fence: u64, key: &str, request: &str, now_ms: i64) -> CatalogResult<()> {
        to_end!(self, this, [id: &str, key: &str, request: &str], {
            let _changed = this.tasks_changed(Some(id));
            let mut tx = this.immediate().await?;
            let task = task_in(&mut tx, id).await?.ok_or(CatalogError::NotFound)?;
            if task.fence != fence || task.status != TaskStatus::Working {
                return Err(CatalogError::Fenced);
            }
            let mut requests = json_map(&task.input_requests)?;
            requests.insert(key.to_string(), raw(request)?);
            sqlx::query(st::PARK.sqlite).bind(json_text(&requests)).bind(now_ms).bind(id).execute(&mut *tx).await?;
            tx.commit().await?;
            Ok(())
        })
    }

    async fn respond_input(&self, id: &str, key: &str, response: &str, now_ms: i64) -> CatalogResult<bool> {
        to_end!(self, this, [id: &str, key: &str, response: &str], {
            let _changed = this.tasks_changed(Some(id));
            let mut tx = this.immediate().await?;
            let task = task_in(&mut tx, id).await?.ok_or(CatalogError::NotFound)?;
            let requests = json_map(&task.input_requests)?;
            let mut responses = json_map(&task.input_responses)?;
            if task.status.is_terminal() || !requests.contains_key(key) || responses.contains_key(key) {
                return Ok(false);
            }
            responses.insert(key.to_string(), raw(response)?);
            let all_answered = requests.keys().all(|k| responses.contains_key(k));
            let status = if all_answered { "working" } else { task.status.as_str() };
            sqlx::query(st::RESPOND.sqlite).bind(json_text(&responses)).bind(status).bind(now_ms).bind(id).execute(&mut *tx).await?;
            tx.commit().await?;
            Ok(true)
        })
    }

    async fn finish_task(&self, id: &str, fence: Option<u64>, end: &TaskEnd, now_ms: i64) -> CatalogResult<bool> {
        to_end!(self, this, [id: &str, end: &TaskEnd], {
            let _changed = this.tasks_changed(Some(id));
            let (status, result, error) = match end {
                TaskEnd::Completed(r) => ("completed", Some(r.as_str()), None),
                TaskEnd::Failed(e) => ("failed", None, Some(e.as_str())),
            };
            let done = sqlx::query(st::FINISH_TASK.sqlite)
                .bind(status)
                .bind(result)
                .bind(error)
                .bind(now_ms)
                .bind(id)
                .bind(fence.map(|f| f as i64))
                .execute(&this.pool)
                .await?;
            Ok(done.rows_affected() == 1)
        })
    }

    async fn cancel_task(&self, id: &str, now_ms: i64) -> CatalogResult<TaskRecord> {
        to_end!(self, this, [id: &str], {
            {
                // Forgotten once the update committed, before the read below (which must see it).
                let _changed = this.tasks_changed(Some(id));
                sqlx::query(st::CANCEL_TASK.sqlite).bind(now_ms).bind(id).execute(&this.pool).await?;
            }
            this.get_task(id).await?.ok_or(CatalogError::NotFound)
        })
    }

    async fn release_task(&self, id: &str, fence: u64) -> CatalogResult<()> {
        to_end!(self, this, [id: &str], {
            let _changed = this.tasks_changed(Some(id));
            sqlx::query(st::RELEASE_TASK.sqlite).bind(id).bind(fence as i64).execute(&this.pool).await?;
            Ok(())
        })
    }

    async fn sweep_tasks(&self, now_ms: i64) -> CatalogResult<u64> {
        to_end!(self, this, [], {
            let _changed = this.tasks_changed(None);
            let mut tx = this.immediate().await?;
            sqlx::query(
                "DELETE FROM task_keys WHERE task_id IN (SELECT id FROM tasks WHERE status IN ('completed', 'failed', 'cancelled') \
                 AND updated_at_ms + ttl_ms <= ?)",
            )
            .bind(now_ms)
            .execute(&mut *tx)
            .await?;
            let done = sqlx::query("DELETE FROM tasks WHERE status IN ('completed', 'failed', 'cancelled') AND updated_at_ms + ttl_ms <= ?")
                .bind(now_ms)
                .execute(&mut *tx)
                .await?;
            tx.commit().await?;
            Ok(done.rows_affected())
        })
    }

    async fn task_counts(&self) -> CatalogResult<Vec<super::tasks::TaskCount>> {
        let rows = sqlx::query(st::TASK_COUNTS.sqlite).fetch_all(&self.pool).await?;
        rows.iter().map(super::tasks::row_to_task_count).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    fn cache() -> Arc<RowCache<u32>> {
        Arc::new(RowCache::default())
    }

    /// A write alone keeps the row it read back; a reader that began before it cannot replace
    /// that row with what it read.
    #[test]
    fn a_write_alone_keeps_its_row_and_an_older_read_cannot_replace_it() {
        let c = cache();
        let generation = c.get("a").unwrap_err();
        let mut w = Invalidate::new(Some(c.clone()), Some("a"));
        w.wrote(2);
        drop(w);
        c.keep(generation, "a", &1);
        assert_eq!(c.get("a"), Ok(2));
    }

    /// Overlapping writes keep nothing: neither the one that ends while another is under way,
    /// nor the one that began before another finished.
    #[test]
    fn overlapping_writes_forget_the_row() {
        let c = cache();
        let mut first = Invalidate::new(Some(c.clone()), Some("a"));
        let mut second = Invalidate::new(Some(c.clone()), Some("a"));
        first.wrote(1);
        drop(first);
        assert!(c.get("a").is_err(), "kept while another write was under way");
        second.wrote(2);
        drop(second);
        assert!(c.get("a").is_err(), "kept although a write finished after it began");

        let mut w = Invalidate::new(Some(c.clone()), Some("a"));
        w.wrote(3);
        drop(w);
        assert_eq!(c.get("a"), Ok(3), "alone again: kept");
        let mut unchanged = Invalidate::new(Some(c.clone()), None);
        unchanged.narrow_to(None);
        drop(unchanged);
        assert_eq!(c.get("a"), Ok(3), "a write that changed nothing forgets nothing");
        drop(Invalidate::new(Some(c.clone()), Some("a")));
        assert!(c.get("a").is_err(), "a write without its row forgets it");
    }
}
