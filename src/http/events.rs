//! `/api/v1/events` (Server-Sent Events of the caller's principal, resumable with
//! `Last-Event-ID`) and `/api/v1/webhooks/deliveries` (pending and failed webhook deliveries
//! of the caller's events). Both read through [`crate::events::Events`]; see DESIGN §8.

use std::convert::Infallible;
use std::time::Duration;

use crate::error::{ErrorCode, Refusal};
use axum::extract::rejection::QueryRejection;
use axum::extract::{Query, State};
use axum::http::HeaderMap;
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::Extension;
use futures::StreamExt;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::{AppState, Problem};
use crate::app::Principal;
use crate::catalog::DeliveryState;
use crate::events::{Cursor, DeliveryView, FollowError};

/// Query of `GET /api/v1/events`.
#[derive(Deserialize, ToSchema)]
pub(super) struct EventsQuery {
    /// Resume after this event id (what `Last-Event-ID` carries; the header wins).
    last_event_id: Option<String>,
}

/// The caller's events as `text/event-stream`: each message has `id` (the event id), `event`
/// (its type) and `data` (JSON `{id, type, timestamp, data}`). Without `Last-Event-ID`, events
/// committed from now on; with it, every event after that one first (kept for `[events]
/// retention`, default 24 h). Another principal's events never appear.
#[utoipa::path(get, path = "/api/v1/events", tag = "events", operation_id = "events",
    params(
        ("Last-Event-ID" = Option<String>, Header, description = "Resume after this event id."),
        ("last_event_id" = Option<String>, Query, description = "The same, for clients that cannot set headers."),
    ),
    responses(
        (status = 200, description = "An endless stream of events (Server-Sent Events).", content_type = "text/event-stream", body = String),
    ))]
pub(super) async fn events(
    State(s): State<AppState>,
    Extension(Principal(p)): Extension<Principal>,
    h: HeaderMap,
    q: Result<Query<EventsQuery>, QueryRejection>,
) -> Result<Response, Problem> {
    let from_query = q.ok().and_then(|Query(q)| q.last_event_id);
    let last = h.get("last-event-id").and_then(|v| v.to_str().ok()).map(|v| v.trim().to_string()).or(from_query).filter(|v| !v.is_empty());
    let cursor = last.map_or(Cursor::Now, Cursor::After);
    let stream = s.events.follow(&p, cursor).await.map_err(|e| match e {
        FollowError::UnknownEvent(..) => Problem(Refusal::new(
            404,
            ErrorCode::NotFound,
            e.to_string(),
            "Reconnect without Last-Event-ID and read current state from /api/v1/files and /api/v1/tasks.",
        )),
        FollowError::Catalog(c) => Problem(c.into()),
    })?;
    let shutdown = s.http.shutdown.clone();
    let sse = stream.take_until(async move { shutdown.cancelled().await }).map(|item| {
        Ok::<_, Infallible>(match item {
            Ok(v) => Event::default().id(v.id.clone()).event(v.event_type.clone()).data(serde_json::to_string(&v).expect("an event view serialises")),
            // The client reconnects with its last id and misses nothing.
            Err(e) => {
                tracing::warn!(error = %e, "event stream ended by a catalog error");
                Event::default().event("error").data("{\"code\":\"unavailable\",\"retryable\":true}")
            }
        })
    });
    let mut res = Sse::new(sse).keep_alive(KeepAlive::new().interval(Duration::from_secs(15))).into_response();
    res.headers_mut().insert("cache-control", axum::http::HeaderValue::from_static("no-store"));
    // nginx (and proxies that honour it) would otherwise buffer the stream: events would reach
    // the client in bursts, or only when the buffer fills.
    res.headers_mut().insert("x-accel-buffering", axum::http::HeaderValue::from_static("no"));
    Ok(res)
}

/// Query of `GET /api/v1/webhooks/deliveries`.
#[derive(Deserialize, ToSchema)]
pub(super) struct DeliveriesQuery {
    /// `pending`, `failed` or `delivered`, comma-separated (default `pending,failed`).
    state: Option<String>,
    /// At most this many, 1 to 1000 (default 100).
    limit: Option<u32>,
}

#[derive(Serialize, ToSchema)]
pub(super) struct DeliveryList {
    /// Newest event first. Each: `webhook`, `event` `{id, type, timestamp, data}`, `state`,
    /// `attempts`, `next_attempt_ms`, `last_attempt_ms`, `last_status`, `last_error`.
    #[schema(value_type = Vec<Object>)]
    deliveries: Vec<DeliveryView>,
}

/// Webhook deliveries of the caller's events that have not been acknowledged (pending, with
/// their next attempt) or were given up (failed), newest first.
#[utoipa::path(get, path = "/api/v1/webhooks/deliveries", tag = "events", operation_id = "webhook_deliveries",
    params(
        ("state" = Option<String>, Query, pattern = r"^(pending|failed|delivered)(,(pending|failed|delivered))*$",
            description = "pending, failed, delivered; comma-separated (default pending,failed)."),
        ("limit" = Option<u32>, Query, minimum = 1, maximum = 1000, description = "At most this many (default 100)."),
    ),
    responses(
        (status = 200, description = "The deliveries.", body = DeliveryList),
    ))]
pub(super) async fn deliveries(
    State(s): State<AppState>,
    Extension(Principal(p)): Extension<Principal>,
    q: Result<Query<DeliveriesQuery>, QueryRejection>,
) -> Result<Response, Problem> {
    let bad = |detail: String| Problem(Refusal::bad_request(detail, "Send ?state=pending,failed&limit=100, or omit both."));
    let Ok(Query(q)) = q else { return Err(bad("the query must be state=…&limit=…".into())) };
    let states = match q.state.as_deref() {
        None => vec![DeliveryState::Pending, DeliveryState::Failed],
        Some(list) => list
            .split(',')
            .map(|s| DeliveryState::parse(s.trim()).ok_or_else(|| bad(format!("unknown delivery state {s:?}"))))
            .collect::<Result<Vec<_>, _>>()?,
    };
    let limit = match q.limit {
        None => 100,
        Some(n) if (1..=1000).contains(&n) => n,
        Some(n) => return Err(bad(format!("limit must be from 1 to 1000, got {n}"))),
    };
    let deliveries = s.events.deliveries(&p, &states, limit).await.map_err(|e| Problem(e.into()))?;
    Ok(axum::Json(DeliveryList { deliveries }).into_response())
}
