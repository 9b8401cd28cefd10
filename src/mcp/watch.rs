//! What a client is told without asking (issue 49): resource subscriptions on
//! `ferry://files/{id}`, log messages, progress heartbeats, and completion of file ids.
//!
//! **Resource subscriptions.** A client of MCP 2026-07-28 names the files in the
//! `resourceSubscriptions` of its `subscriptions/listen` request; a client of an older version
//! calls `resources/subscribe` (and `resources/unsubscribe`) in its session. Either way it gets
//! `notifications/resources/updated` for a file when its upload moved on (at most one per
//! [`UPDATE_EVERY`] per file while bytes arrive), when it finished, and when it failed or went
//! away (expired, deleted, a concatenation that cannot be built) — so a model that asked a
//! person for a file (`file_request`) waits without polling, then reads it (`resources/read`,
//! `file_status`). Finishing, failing and deleting commit an event, which wakes the watch at
//! once through [`crate::events::Changes`] from whichever replica made the change; bytes
//! arriving commit none (as a task's progress), so while a watched upload is unfinished its
//! record is read again every [`UPDATE_EVERY`].
//!
//! **Log messages** (`notifications/message`, logger `ferry`) go to the request that caused
//! them: a tool refused because the server's storage refused or failed (`store_refused`,
//! `insufficient_storage`, `internal`, `damaged`: level `error`), a task that failed or needs
//! input while `task_get` waited on it (`warning`, `notice`). They are sent only at or above the
//! level the client asked for: a request's `_meta` `io.modelcontextprotocol/logLevel` (MCP
//! 2026-07-28), else the session's `logging/setLevel` (older versions); a client that asked
//! for none gets none.
//!
//! **Progress.** A tool call that carries a progress token and runs longer than
//! [`HEARTBEAT`] gets `notifications/progress` every [`HEARTBEAT`] until it answers (clients
//! give up on a request after 60 s of silence); `task_get` sends the task's own progress, and
//! the same heartbeat while it does not move ([`Heartbeat`]).

#![allow(deprecated)] // logging (`LoggingLevel`, `SetLevelRequestParams`) is SEP-2577-deprecated in rmcp; MCP still defines it.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rmcp::model::{
    CompleteRequestParams, CompleteResult, CompletionInfo, LoggingLevel, LoggingMessageNotificationParam, ProgressNotificationParam, ProgressToken,
    Reference, SetLevelRequestParams, SubscribeRequestParams, UnsubscribeRequestParams,
};
use rmcp::service::{Peer, RequestContext, RoleServer};
use rmcp::ErrorData as McpError;
use serde_json::{json, Value};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::envelope::id_from_uri;
use super::FerryMcp;
use crate::error::{ErrorCode, Refusal};

/// Least time between two `notifications/resources/updated` of one file for bytes arriving,
/// and how often an unfinished watched file is read again (finishing and failing are told at
/// once).
pub const UPDATE_EVERY: Duration = Duration::from_secs(2);
/// Longest a tool call with a progress token goes without `notifications/progress` (MCP
/// clients give up after 60 s without one; the issue asks for at most 15 s).
pub const HEARTBEAT: Duration = Duration::from_secs(10);
/// How long a watch of files that are all finished (or gone) waits for an event before reading
/// them again anyway (a deletion or expiry commits one; this only bounds a missed wake).
const IDLE_READ: Duration = Duration::from_secs(60);
/// Most values a `completion/complete` of file ids answers (MCP's limit is 100).
const MAX_COMPLETIONS: usize = 100;
/// Files a completion looks through (the principal's newest).
const COMPLETION_SCAN: u32 = 1000;
/// The logger name on ferry's `notifications/message`.
const LOGGER: &str = "ferry";

/// What one client connection holds beyond its requests: the level it asked for with
/// `logging/setLevel` and its `resources/subscribe` watches. One per session (Streamable HTTP
/// with sessions), per request (stateless MCP 2026-07-28, where both come with the request or
/// the listen stream instead), or per process (stdio).
#[derive(Default)]
pub struct Session {
    level: Mutex<Option<LoggingLevel>>,
    watches: Mutex<BTreeMap<String, CancellationToken>>,
}

impl Drop for Session {
    fn drop(&mut self) {
        if let Ok(w) = self.watches.get_mut() {
            w.values().for_each(CancellationToken::cancel);
        }
    }
}

/// Severity rank of a level (RFC 5424 order, as MCP's `LoggingLevel`).
fn rank(l: LoggingLevel) -> u8 {
    match l {
        LoggingLevel::Debug => 0,
        LoggingLevel::Info => 1,
        LoggingLevel::Notice => 2,
        LoggingLevel::Warning => 3,
        LoggingLevel::Error => 4,
        LoggingLevel::Critical => 5,
        LoggingLevel::Alert => 6,
        LoggingLevel::Emergency => 7,
    }
}

/// What a watched file is, as far as its subscribers care.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Seen {
    /// Receiving: bytes stored so far, and the length once declared.
    Receiving {
        offset: u64,
        length: Option<u64>,
    },
    Finished,
    /// Gone or failed: the error code a read gets now.
    Failed(&'static str),
}

impl FerryMcp {
    /// The level at or above which `ctx`'s request gets log messages: its `_meta` logLevel
    /// (2026-07-28), else its session's `logging/setLevel`; `None`: no log messages.
    fn log_level(&self, ctx: &RequestContext<RoleServer>) -> Option<LoggingLevel> {
        ctx.meta.log_level().or_else(|| *self.session.level.lock().expect("level lock"))
    }

    /// Send `notifications/message` at `level` with `data` on `ctx`'s request, when the client
    /// asked for that level.
    pub(super) async fn log(&self, ctx: &RequestContext<RoleServer>, level: LoggingLevel, data: Value) {
        if self.log_level(ctx).is_some_and(|min| rank(level) >= rank(min)) {
            let _ = ctx.peer.notify_logging_message(LoggingMessageNotificationParam::new(level, data).with_logger(LOGGER)).await;
        }
    }

    /// The log message a failed tool call deserves: a refusal by the server's storage, which
    /// the operator must see to (module docs). Other failures are the call's own answer.
    pub(super) async fn log_refusal(&self, ctx: &RequestContext<RoleServer>, tool: &str, e: &Refusal) {
        if matches!(e.code, ErrorCode::StoreRefused | ErrorCode::InsufficientStorage | ErrorCode::Internal | ErrorCode::Damaged) {
            self.log(ctx, LoggingLevel::Error, json!({ "tool": tool, "code": e.code.as_str(), "message": e.detail })).await;
        }
    }

    /// `logging/setLevel` (sessions of MCP before 2026-07-28).
    pub(super) fn set_session_level(&self, req: SetLevelRequestParams) {
        *self.session.level.lock().expect("level lock") = Some(req.level);
    }

    /// The file a subscription names, checked: a `ferry://files/{id}` URI of a file of the
    /// caller's (in any state but gone). Otherwise resource-not-found with `data.uri`.
    async fn watchable(&self, p: &str, uri: &str) -> Result<String, McpError> {
        let Some(id) = id_from_uri(uri) else {
            return Err(not_found(uri, format!("{uri} is not a ferry file URI (ferry://files/ID)")));
        };
        match self.state.engine.get(p, id).await {
            Ok(_) => Ok(id.to_string()),
            Err(e) if e.code == ErrorCode::NotFound || e.code == ErrorCode::UploadExpired => Err(not_found(uri, format!("no file {id}"))),
            Err(e) => Err(super::mcp_err(e)),
        }
    }

    /// `resources/subscribe` (sessions before 2026-07-28): watch the file and tell the session
    /// (its standalone stream) about it until `resources/unsubscribe` or the session ends.
    pub(super) async fn subscribe_session(&self, req: SubscribeRequestParams, ctx: RequestContext<RoleServer>) -> Result<(), McpError> {
        let p = Self::principal(&ctx);
        self.watchable(&p, &req.uri).await?;
        let stop = self.state.http.shutdown.child_token();
        if let Some(old) = self.session.watches.lock().expect("watches lock").insert(req.uri.clone(), stop.clone()) {
            old.cancel();
        }
        let (me, peer, uri) = (self.clone(), ctx.peer.clone(), req.uri);
        tokio::spawn(async move { me.watch_files(&p, std::slice::from_ref(&uri), &stop, |u| send_updated(&peer, u)).await });
        Ok(())
    }

    /// `resources/unsubscribe`: end the session's watch of the URI (none: nothing to do).
    pub(super) fn unsubscribe_session(&self, req: UnsubscribeRequestParams) {
        if let Some(t) = self.session.watches.lock().expect("watches lock").remove(&req.uri) {
            t.cancel();
        }
    }

    /// The `resourceSubscriptions` a listen may have: ferry file URIs (others are left out of
    /// the acknowledged filter).
    pub(super) fn acceptable_uris(requested: &[String]) -> Vec<String> {
        requested.iter().filter(|u| id_from_uri(u).is_some()).cloned().collect()
    }

    /// Tell `send` about every change of the files `uris` (module docs) until `stop` or until
    /// `send` says the client is gone. At the start, a file that already finished or failed is
    /// told once (a client subscribes, then reads: whatever happened in between is told).
    pub(super) async fn watch_files<F, Fut>(&self, p: &str, uris: &[String], stop: &CancellationToken, send: F)
    where
        F: Fn(String) -> Fut,
        Fut: std::future::Future<Output = bool>,
    {
        let mut seen: BTreeMap<&str, (Seen, Option<Instant>)> = BTreeMap::new();
        loop {
            // Taken before the reads: a change committed after them wakes the wait.
            let mut changes = self.state.events.changes();
            let mut receiving = false;
            for uri in uris {
                let Some(now) = self.seen(p, uri).await else {
                    receiving = true; // a read failed for now: read again soon
                    continue;
                };
                receiving |= matches!(now, Seen::Receiving { .. });
                let Some((before, sent_at)) = seen.get(uri.as_str()).cloned() else {
                    // The first read: a file that already finished or failed is told at once
                    // (it may have done so between the subscription and this read); one still
                    // receiving is told when it moves on.
                    let told = !matches!(now, Seen::Receiving { .. });
                    if told && !send(uri.clone()).await {
                        return;
                    }
                    seen.insert(uri, (now, told.then(Instant::now)));
                    continue;
                };
                if now == before {
                    continue;
                }
                // Bytes arriving: at most one update per UPDATE_EVERY; the rest at once.
                let progress_only = matches!((&before, &now), (Seen::Receiving { .. }, Seen::Receiving { .. }));
                if progress_only && sent_at.is_some_and(|t| t.elapsed() < UPDATE_EVERY) {
                    continue;
                }
                if !send(uri.clone()).await {
                    return;
                }
                seen.insert(uri, (now, Some(Instant::now())));
            }
            let at_most = if receiving { UPDATE_EVERY } else { IDLE_READ };
            tokio::select! {
                _ = changes.wait(at_most) => {}
                _ = stop.cancelled() => return,
            }
        }
    }

    /// A watched file's state now; `None` when it could not be read for a passing reason (the
    /// catalog briefly away): no change is told for it.
    async fn seen(&self, p: &str, uri: &str) -> Option<Seen> {
        let Some(id) = id_from_uri(uri) else { return Some(Seen::Failed(ErrorCode::NotFound.as_str())) };
        match self.state.engine.get(p, id).await {
            Ok(r) if r.is_finished() => Some(Seen::Finished),
            Ok(r) => Some(Seen::Receiving { offset: r.offset, length: r.length }),
            Err(e) if e.code.retryable() => None,
            Err(e) => Some(Seen::Failed(e.code.as_str())),
        }
    }

    /// `completion/complete` for the `id` of the `ferry://files/{id}` template: the caller's
    /// file ids starting with the typed value, newest first. Other references: invalid params
    /// (ferry has no prompts and one template).
    pub(super) async fn complete_ids(&self, req: CompleteRequestParams, ctx: RequestContext<RoleServer>) -> Result<CompleteResult, McpError> {
        let template = match &req.r#ref {
            Reference::Resource(r) if r.uri == super::FILE_TEMPLATE && req.argument.name == "id" => r.uri.clone(),
            Reference::Resource(r) => {
                return Err(McpError::invalid_params(
                    format!("no completion for argument {:?} of {}: ferry completes `id` of {}", req.argument.name, r.uri, super::FILE_TEMPLATE),
                    Some(json!({ "uri": r.uri })),
                ))
            }
            Reference::Prompt(pr) => return Err(McpError::invalid_params(format!("no prompt {:?}: ferry has no prompts", pr.name), None)),
            _ => return Err(McpError::invalid_params(format!("ferry completes only `id` of {}", super::FILE_TEMPLATE), None)),
        };
        let p = Self::principal(&ctx);
        let files = self.state.engine.list(&p, COMPLETION_SCAN).await.map_err(super::mcp_err)?;
        let typed = req.argument.value.to_ascii_lowercase();
        let all: Vec<String> = files.into_iter().map(|r| r.id).filter(|id| id.starts_with(&typed)).collect();
        let total = all.len();
        let values: Vec<String> = all.into_iter().take(MAX_COMPLETIONS).collect();
        tracing::debug!(template, typed, total, "completion of file ids");
        let info =
            CompletionInfo::with_pagination(values, Some(total as u32), total > MAX_COMPLETIONS).map_err(|e| McpError::internal_error(e, None))?;
        Ok(CompleteResult::new(info))
    }
}

/// Resource-not-found for `uri`, with the URI in `data` (SEP-2164).
pub(super) fn not_found(uri: &str, message: String) -> McpError {
    McpError::resource_not_found(message, Some(json!({ "uri": uri })))
}

/// Send `notifications/resources/updated` for `uri` to a session's peer; false when it is gone.
async fn send_updated(peer: &Peer<RoleServer>, uri: String) -> bool {
    peer.notify_resource_updated(rmcp::model::ResourceUpdatedNotificationParam::new(uri)).await.is_ok()
}

/// `notifications/progress` every [`HEARTBEAT`] for a tool call with a progress token, while
/// it runs: `progress` counts the seconds waited (it must grow with every notification).
pub(super) async fn with_heartbeat<T>(
    token: Option<ProgressToken>,
    tool: &str,
    ctx: &RequestContext<RoleServer>,
    work: impl std::future::Future<Output = T>,
) -> T {
    let Some(token) = token else { return work.await };
    let started = Instant::now();
    let mut work = std::pin::pin!(work);
    loop {
        tokio::select! {
            out = &mut work => return out,
            _ = tokio::time::sleep(HEARTBEAT) => {
                let waited = started.elapsed().as_secs_f64().floor();
                let param = progress(&token, waited, None, Some(format!("{tool} is still working ({waited} s)")));
                let _ = ctx.peer.notify_progress(param).await;
            }
        }
    }
}

/// A `notifications/progress` param.
pub(super) fn progress(token: &ProgressToken, progress: f64, total: Option<f64>, message: Option<String>) -> ProgressNotificationParam {
    serde_json::from_value(json!({ "progressToken": token, "progress": progress, "total": total, "message": message }))
        .expect("progress notification shape")
}

/// The progress a `task_get` wait reports: the task's fraction of 1, never going back, and
/// raised by the least step when it did not move for [`HEARTBEAT`] (a heartbeat: MCP requires
/// every progress value to exceed the last).
#[derive(Debug)]
pub(super) struct Heartbeat {
    sent: Option<f64>,
    at: Instant,
}

impl Heartbeat {
    pub(super) fn new() -> Heartbeat {
        Heartbeat { sent: None, at: Instant::now() }
    }

    /// The value to send now for a task at `fraction` (None: unknown) whose shown state
    /// `changed` since the last one, or `None` when nothing is due.
    pub(super) fn next(&mut self, fraction: Option<f64>, changed: bool) -> Option<f64> {
        let due = changed || self.sent.is_none() || self.at.elapsed() >= HEARTBEAT;
        if !due {
            return None;
        }
        let f = fraction.unwrap_or(0.0).clamp(0.0, 1.0);
        let v = match self.sent {
            Some(s) if f <= s => s + 1e-9,
            _ => f,
        };
        self.sent = Some(v);
        self.at = Instant::now();
        Some(v)
    }

    /// How long until the next heartbeat is due.
    pub(super) fn due_in(&self) -> Duration {
        HEARTBEAT.saturating_sub(self.at.elapsed())
    }
}

/// The session state of a new connection (module docs).
pub(super) fn new_session() -> Arc<Session> {
    Arc::new(Session::default())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn heartbeat_progress_always_grows_and_follows_the_task() {
        let mut h = Heartbeat::new();
        assert_eq!(h.next(Some(0.25), false), Some(0.25), "the first is always sent");
        assert_eq!(h.next(Some(0.25), false), None, "nothing changed and no heartbeat is due");
        let same = h.next(Some(0.25), true).unwrap();
        assert!(same > 0.25 && same < 0.2500001, "a repeat is raised by the least step: {same}");
        assert_eq!(h.next(Some(0.5), true), Some(0.5));
        let back = h.next(Some(0.1), true).unwrap();
        assert!(back > 0.5, "never goes back: {back}");
        h.at -= HEARTBEAT;
        assert!(h.next(None, false).unwrap() > back, "a due heartbeat is sent and grows");
    }

    #[test]
    fn levels_rank_in_rfc_5424_order() {
        let all = [
            LoggingLevel::Debug,
            LoggingLevel::Info,
            LoggingLevel::Notice,
            LoggingLevel::Warning,
            LoggingLevel::Error,
            LoggingLevel::Critical,
            LoggingLevel::Alert,
            LoggingLevel::Emergency,
        ];
        assert!(all.windows(2).all(|w| rank(w[0]) < rank(w[1])));
    }
}
