//! `/healthz` (the process answers), `/readyz` (every store can do its work, DESIGN §9),
//! `/metrics` (Prometheus).

use axum::extract::State;
use axum::http::{HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;

use super::AppState;

pub fn routes() -> Router<AppState> {
    Router::new().route("/healthz", get(healthz)).route("/readyz", get(readyz)).route("/metrics", get(metrics))
}

async fn healthz() -> &'static str {
    "ok\n"
}

/// 200 when ready, 503 otherwise; the body is JSON either way:
/// `{"ready":false,"checks":[{"store":"blobs","ok":false,"reason":"…"},…],"free_bytes":…,"reserve_bytes":…}`.
async fn readyz(State(s): State<AppState>) -> Response {
    let r = s.engine.readiness().await;
    let status = if r.ready { StatusCode::OK } else { StatusCode::SERVICE_UNAVAILABLE };
    let mut res = (status, axum::Json(r)).into_response();
    res.headers_mut().insert("cache-control", HeaderValue::from_static("no-store"));
    res
}

async fn metrics(State(s): State<AppState>) -> Response {
    s.engine.refresh_metrics();
    if let Err(e) = s.tasks.refresh_metrics().await {
        tracing::warn!(error = %e, "metrics: could not count tasks");
    }
    let mut res = s.metrics.encode().into_response();
    res.headers_mut().insert("content-type", HeaderValue::from_static("application/openmetrics-text; version=1.0.0; charset=utf-8"));
    res
}
