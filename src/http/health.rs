//! `/healthz` (the process answers), `/readyz` (the catalog answers), `/metrics` (Prometheus).

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
    if s.engine.ready().await {
        "ready\n".into_response()
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "catalog unavailable\n").into_response()
    }
}

async fn metrics(State(s): State<AppState>) -> Response {
    let mut res = s.metrics.encode().into_response();
    res.headers_mut().insert("content-type", HeaderValue::from_static("application/openmetrics-text; version=1.0.0; charset=utf-8"));
    res
}
