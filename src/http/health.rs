//! `/healthz` (the process answers), `/readyz` (the catalog and the blob store answer), `/metrics` (Prometheus).

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

async fn readyz(State(s): State<AppState>) -> Response {
    match s.engine.ready().await {
        Ok(()) => "ready\n".into_response(),
        Err(what) => (StatusCode::SERVICE_UNAVAILABLE, format!("{what}\n")).into_response(),
    }
}

async fn metrics(State(s): State<AppState>) -> Response {
    let mut res = s.metrics.encode().into_response();
    res.headers_mut().insert("content-type", HeaderValue::from_static("application/openmetrics-text; version=1.0.0; charset=utf-8"));
    res
}
