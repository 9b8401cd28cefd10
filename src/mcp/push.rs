//! Task status pushed to MCP clients (issue 27): `notifications/tasks` (SEP-2663) on the
//! client's `subscriptions/listen` stream (MCP 2026-07-28), on `/mcp` and on stdio.
//!
//! A client that declares the tasks extension (`io.modelcontextprotocol/tasks`) on its
//! `subscriptions/listen` request gets, on that stream, one `notifications/tasks` for every
//! status change of its principal's tasks committed after its start was noted (before the
//! acknowledgment, below) — `working` (created), `input_required`, `working` (answered), and
//! the terminal one — each carrying the task as `tasks/get` shows it in that status (a
//! completed task inlines its `CallToolResult`), with `_meta`
//! `io.modelcontextprotocol/subscriptionId` (the listen request's id) and `io.ferry/event` (the
//! outbox event id; the same change seen twice, e.g. after re-listening, has the same id).
//!
//! The changes come from the outbox ([`crate::events::Events::follow`]), which every replica
//! writes in the transaction that makes the change and the head watcher reads: a stream open on
//! one replica carries the changes another replica made. A stream ends with the server (the
//! client re-listens and calls `tasks/get` for what changed meanwhile: there is no replay, as
//! the listen request has no cursor).
//!
//! rmcp 3.11's [`rmcp::service::SubscriptionSink::send`] refuses `notifications/tasks`
//! (`SubscriptionFilter` has no `taskIds` yet), so the notification is sent the way rmcp sends
//! the stream's acknowledgment: through the listen request's peer
//! ([`rmcp::service::SubscriptionContext::request_context`]`.peer.send_notification`) with the
//! subscription id in `_meta`. On Streamable HTTP that peer is the listen request's own
//! response stream; on stdio, the connection. A client without the extension gets an open
//! stream that carries nothing ferry-specific.
//!
//! rmcp acknowledges a listen before it calls [`rmcp::ServerHandler::listen`], and a client may
//! change a task the moment it reads the acknowledgment. So the stream's start is read from the
//! outbox when the request arrives, before the acknowledgment ([`ListenStart`]), not when
//! `listen` runs: a change made after the acknowledgment is always after that start. A listen
//! whose start could not be read ends with an error (`unavailable`, retryable) right after its
//! acknowledgment, rather than following from a later start.

use std::borrow::Cow;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::State;
use axum::middleware::Next;
use futures::StreamExt;
use rmcp::model::{
    ClientNotification, ClientRequest, NotificationMetaObject, ProtocolVersion, RequestId, ServerConfig, ServerNotification, ServerResult,
    TaskStatusNotification, TaskStatusNotificationParams,
};
use rmcp::service::{NotificationContext, RequestContext, RoleServer, Service, SubscriptionContext};
use rmcp::{ErrorData as McpError, ServerHandler};

use super::FerryMcp;
use crate::catalog::TaskStatus;
use crate::error::Refusal;
use crate::events::{Cursor, EventView, Events};

/// Pause before following the outbox again after a read failed.
const RETRY: Duration = Duration::from_secs(1);

/// Where a `subscriptions/listen` request arrived in the outbox: the position
/// ([`Events::position`]) read before rmcp acknowledges the request, or why it could not be
/// read. Put in the request's extensions by [`FerryService`] (stdio) and by
/// [`note_listen_start`] (Streamable HTTP, into the HTTP request rmcp hands on).
#[derive(Debug, Clone)]
pub(super) struct ListenStart(Result<i64, Refusal>);

impl ListenStart {
    async fn read(events: &Events) -> ListenStart {
        ListenStart(
            events
                .position()
                .await
                .map_err(|e| Refusal::unavailable(format!("the event outbox could not be read to start this stream ({e}); listen again"))),
        )
    }

    /// The listen request's start, from its context: `None` when nothing noted it (a handler
    /// served without [`FerryService`] or the HTTP layer).
    fn of(ctx: &RequestContext<RoleServer>) -> Option<&ListenStart> {
        ctx.extensions
            .get::<ListenStart>()
            .or_else(|| ctx.extensions.get::<axum::http::request::Parts>().and_then(|p| p.extensions.get::<ListenStart>()))
    }
}

/// [`FerryMcp`] as rmcp serves it on stdio: every request and notification goes to the
/// handler unchanged, except that a `subscriptions/listen` first notes its [`ListenStart`].
/// (rmcp's Streamable HTTP service takes a [`ServerHandler`] only; there
/// [`note_listen_start`] does this.)
#[derive(Clone)]
pub struct FerryService(pub FerryMcp);

impl Service<RoleServer> for FerryService {
    async fn handle_request(&self, request: ClientRequest, mut context: RequestContext<RoleServer>) -> Result<ServerResult, McpError> {
        match &request {
            ClientRequest::SubscriptionsListenRequest(_) => {
                context.extensions.insert(ListenStart::read(&self.0.state.events).await);
            }
            // Before rmcp checks the request's `_meta`: a removed method is not found, whatever
            // else is wrong with the request.
            ClientRequest::CustomRequest(r)
                if super::transport_errors::is_removed(&r.method, context.meta.protocol_version().as_ref().map(|v| v.as_str())) =>
            {
                return Err(super::transport_errors::removed(&r.method));
            }
            _ => {}
        }
        Service::handle_request(&self.0, request, context).await
    }

    async fn handle_notification(&self, notification: ClientNotification, context: NotificationContext<RoleServer>) -> Result<(), McpError> {
        Service::handle_notification(&self.0, notification, context).await
    }

    fn get_info(&self) -> ServerConfig {
        ServerHandler::get_info(&self.0)
    }

    fn supported_protocol_versions(&self) -> Cow<'static, [ProtocolVersion]> {
        ServerHandler::supported_protocol_versions(&self.0)
    }
}

/// Middleware before rmcp's Streamable HTTP service: a request sent with `Mcp-Method:
/// subscriptions/listen` (SEP-2243; required from MCP 2026-07-28, the first version with
/// `subscriptions/listen`, and checked by rmcp against the body) gets its [`ListenStart`] in
/// its extensions. Other requests pass untouched, at no cost.
pub(super) async fn note_listen_start(State(events): State<Arc<Events>>, mut req: axum::extract::Request, next: Next) -> axum::response::Response {
    if req.headers().get("mcp-method").is_some_and(|m| m.as_bytes() == b"subscriptions/listen") {
        let start = ListenStart::read(&events).await;
        req.extensions_mut().insert(start);
    }
    next.run(req).await
}

impl FerryMcp {
    /// Serve one `subscriptions/listen` stream until the client cancels it or the server shuts
    /// down (then `Ok`: rmcp sends the final result): task status notifications, and
    /// `notifications/resources/updated` of the files in its accepted `resourceSubscriptions`
    /// ([`super::watch`]).
    pub(super) async fn listen_stream(&self, sub: SubscriptionContext) -> Result<(), McpError> {
        let uris = sub.accepted().resource_subscriptions.clone().unwrap_or_default();
        let files = async {
            if uris.is_empty() {
                return std::future::pending().await;
            }
            let p = Self::principal(sub.request_context());
            let sink = sub.sink().clone();
            let stop = self.state.http.shutdown.child_token();
            self.watch_files(&p, &uris, &stop, |uri| {
                let sink = sink.clone();
                async move { sink.notify_resource_updated(uri).await.is_ok() }
            })
            .await;
        };
        tokio::select! {
            r = self.task_stream(&sub) => r,
            () = files => Ok(()), // the client is gone, or the server shuts down
        }
    }

    /// The task status notifications of a listen stream (module docs).
    async fn task_stream(&self, sub: &SubscriptionContext) -> Result<(), McpError> {
        let ctx = sub.request_context();
        if !ctx.client_capabilities().is_some_and(|c| c.supports_tasks()) {
            tokio::select! {
                _ = sub.cancelled() => {}
                _ = self.state.http.shutdown.cancelled() => {}
            }
            return Ok(());
        }
        let p = Self::principal(ctx);
        // Where the request arrived, read before the acknowledgment: a change the client made
        // after reading it is after this. `Now` only for a handler served bare.
        let mut cursor = match ListenStart::of(ctx) {
            Some(ListenStart(Ok(at))) => Cursor::Position(*at),
            Some(ListenStart(Err(e))) => return Err(listen_refused(e)),
            None => Cursor::Now,
        };
        loop {
            let events = match self.state.events.follow(&p, cursor.clone()).await {
                Ok(s) => s,
                Err(e) => {
                    tracing::warn!(error = %e, "task notifications: reading the outbox failed; trying again");
                    tokio::select! {
                        _ = sub.cancelled() => return Ok(()),
                        _ = self.state.http.shutdown.cancelled() => return Ok(()),
                        _ = tokio::time::sleep(RETRY) => continue,
                    }
                }
            };
            let mut events = std::pin::pin!(events);
            loop {
                let next = tokio::select! {
                    _ = sub.cancelled() => return Ok(()),
                    _ = self.state.http.shutdown.cancelled() => return Ok(()),
                    n = events.next() => n,
                };
                match next {
                    Some(Ok(ev)) => {
                        // By position: a follow started again after a read error does not depend on
                        // this event still being kept.
                        cursor = Cursor::Position(ev.seq);
                        if ev.event_type != "task.status_changed" {
                            continue;
                        }
                        if !self.notify(&p, ctx, &ev).await {
                            return Ok(()); // the client is gone
                        }
                    }
                    Some(Err(e)) => {
                        tracing::warn!(error = %e, "task notifications: the outbox read failed; following again from the last event");
                        break;
                    }
                    None => break,
                }
            }
            tokio::select! {
                _ = sub.cancelled() => return Ok(()),
                _ = self.state.http.shutdown.cancelled() => return Ok(()),
                _ = tokio::time::sleep(RETRY) => {}
            }
        }
    }

    /// Send the `notifications/tasks` of status-change event `ev`; false when the stream is
    /// closed. A task swept since, or a change the view cannot be built for, is skipped.
    async fn notify(&self, p: &str, ctx: &RequestContext<RoleServer>, ev: &EventView) -> bool {
        let Some(id) = ev.data.get("task").and_then(|v| v.as_str()) else { return true };
        let Some(status) = ev.data.get("status").and_then(|v| v.as_str()).and_then(TaskStatus::parse) else { return true };
        let Ok(mut t) = self.state.tasks.get(p, id).await else { return true };
        // The task as it was in this change: a later change may have committed already.
        if t.status != status {
            t.status = status;
            t.updated_at_ms = at_ms(ev).unwrap_or(t.updated_at_ms);
            if status == TaskStatus::InputRequired {
                // Answered since: show the requests it was waiting for (answers are kept, so
                // every request it ever made; the one it asked last among them).
                t.input_responses = "{}".into();
            }
        }
        let detailed = match self.detailed(p, &t).await {
            Ok(d) => d,
            Err(e) => {
                tracing::warn!(task = id, error = %e.message, "task notification skipped: its view could not be built");
                return true;
            }
        };
        let n = ServerNotification::TaskStatusNotification(TaskStatusNotification::new(TaskStatusNotificationParams::new(detailed)));
        send(ctx, n, ctx.id.clone(), &ev.id).await
    }
}

/// The error that ends a listen whose start could not be read: ferry's envelope of `e`, with a
/// hint that fits a listen (not a tool call).
fn listen_refused(e: &Refusal) -> McpError {
    let hint = "Listen again (subscriptions/listen) in a few seconds; meanwhile tasks/get shows each task's status.";
    super::mcp_err_with_hint(e, hint.to_string())
}

/// `ev`'s commit time, Unix ms.
fn at_ms(ev: &EventView) -> Option<i64> {
    humantime::parse_rfc3339(&ev.timestamp).ok().and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok()).map(|d| d.as_millis() as i64)
}

/// Send `n` on the listen stream `subscription` with the subscription id and the event id in
/// `_meta`; false when the stream is closed.
async fn send(ctx: &RequestContext<RoleServer>, mut n: ServerNotification, subscription: RequestId, event_id: &str) -> bool {
    use rmcp::model::GetMeta;
    let meta: &mut NotificationMetaObject = n.get_meta_mut();
    meta.set_subscription_id(subscription);
    meta.0 .0.insert("io.ferry/event".into(), event_id.into());
    ctx.peer.send_notification(n).await.is_ok()
}
