//! Pre-create and pre-finish hooks over HTTP (DESIGN §8), in the spirit of tusd's HTTP hooks:
//! ferry POSTs JSON to the configured URL and waits at most `timeout` for the answer.
//!
//! Request: `{"type": "pre-create", "upload": {"principal", "length", "metadata": {key: value},
//! "concat"}}` or `{"type": "pre-finish", "upload": {"id", "principal", "size", "sha256",
//! "metadata"}}`. Metadata values are byte-exact ([`crate::upload::metadata_json`]): the decoded
//! text when it is UTF-8, `{"base64": "…"}` when it is not, `null` for a key without a value.
//!
//! Answer:
//! - `2xx` with an empty body or a JSON object: allowed. For pre-create, `{"metadata": {…}}`
//!   replaces the upload's metadata (values: text, `{"base64": "…"}` or `null`, as sent).
//! - `4xx`: refused. The client gets that status and the hook's message (`{"message": "…"}`,
//!   or the body's text) as a problem body with code `rejected`. A refused pre-finish marks the
//!   upload failed: its record and bytes are removed.
//! - `5xx`, a timeout, no connection: the hook could not answer, and `on_failure` decides:
//!   `reject` (default) answers 503 `unavailable` (retryable; a pre-finish keeps every byte so
//!   the final request can be retried), `allow` goes on as if the hook had allowed it.
//! - an answer that is not the documented one (a redirect, a 2xx that is not a JSON object,
//!   metadata that is not text or does not encode, an answer past 64 KiB): the hook is broken,
//!   and asking again gets the same answer, so `reject` answers 502 `hook_invalid` (not
//!   retryable) with the reason; `allow` goes on.

use std::time::Duration;

use crate::error::{ErrorCode, Refusal};
use async_trait::async_trait;
use futures::StreamExt;

use super::settings::{HookConfig, HookFailure};
use crate::upload::hooks::{FinishingUpload, PlannedUpload, UploadHooks};

/// Largest hook answer read, bytes.
const MAX_ANSWER: usize = 64 << 10;

/// The configured hooks, called over HTTP.
pub struct HttpHooks {
    pre_create: Option<HookConfig>,
    pre_finish: Option<HookConfig>,
    client: reqwest::Client,
}

/// How one call went.
enum Answer {
    Allowed(serde_json::Map<String, serde_json::Value>),
    /// Not the documented answer: asking again gets the same (issue 23, kind 16).
    Invalid(String),
    Refused {
        status: u16,
        message: String,
    },
    Failed(String),
}

fn metadata_json(raw: &str) -> serde_json::Value {
    crate::upload::metadata_json(raw).into()
}

/// A hook's `metadata` object as `Upload-Metadata` text; `Err` names what is wrong.
fn metadata_raw(v: &serde_json::Value) -> Result<String, String> {
    crate::upload::metadata_from_json(v)
}

impl HttpHooks {
    pub fn new(pre_create: Option<HookConfig>, pre_finish: Option<HookConfig>) -> anyhow::Result<HttpHooks> {
        let client = reqwest::Client::builder().redirect(reqwest::redirect::Policy::none()).connect_timeout(Duration::from_secs(5)).build()?;
        Ok(HttpHooks { pre_create, pre_finish, client })
    }

    /// Whether any hook is configured.
    pub fn any(&self) -> bool {
        self.pre_create.is_some() || self.pre_finish.is_some()
    }

    async fn call(&self, hook: &HookConfig, body: serde_json::Value) -> Answer {
        let exchange = async {
            let resp = self
                .client
                .post(hook.url.clone())
                .header(http::header::CONTENT_TYPE, "application/json")
                .body(body.to_string())
                .send()
                .await
                .map_err(|e| e.to_string())?;
            let status = resp.status();
            let mut body = Vec::new();
            let mut stream = resp.bytes_stream();
            while let Some(chunk) = stream.next().await {
                let chunk = chunk.map_err(|e| e.to_string())?;
                if body.len() + chunk.len() > MAX_ANSWER {
                    return Ok(Err(format!("the answer is larger than {MAX_ANSWER} bytes")));
                }
                body.extend_from_slice(&chunk);
            }
            Ok(Ok((status, body)))
        };
        let (status, body) = match tokio::time::timeout(hook.timeout, exchange).await {
            Err(_) => return Answer::Failed(format!("no answer within {}", crate::units::human_duration(hook.timeout))),
            Ok(Err(e)) => return Answer::Failed(e),
            Ok(Ok(Err(invalid))) => return Answer::Invalid(invalid),
            Ok(Ok(Ok(a))) => a,
        };
        if status.is_client_error() {
            let text = String::from_utf8_lossy(&body);
            let message = serde_json::from_slice::<serde_json::Value>(&body)
                .ok()
                .and_then(|v| v.get("message").and_then(|m| m.as_str()).map(str::to_owned))
                .unwrap_or_else(|| text.trim().chars().take(1000).collect());
            let message = if message.is_empty() { format!("refused by the hook (HTTP {status})") } else { message };
            return Answer::Refused { status: status.as_u16(), message };
        }
        if status.is_server_error() {
            return Answer::Failed(format!("HTTP {status}"));
        }
        if !status.is_success() {
            return Answer::Invalid(format!("HTTP {status}, not 2xx or 4xx"));
        }
        if body.iter().all(|b| b.is_ascii_whitespace()) {
            return Answer::Allowed(Default::default());
        }
        match serde_json::from_slice::<serde_json::Value>(&body) {
            Ok(serde_json::Value::Object(map)) => Answer::Allowed(map),
            _ => Answer::Invalid("the answer is not a JSON object".into()),
        }
    }

    /// The policy's answer for a hook that failed.
    fn failed(which: &str, hook: &HookConfig, why: &str) -> Result<(), Refusal> {
        tracing::warn!(hook = which, url = %hook.url, reason = why, policy = ?hook.on_failure, "upload hook failed");
        match hook.on_failure {
            HookFailure::Allow => Ok(()),
            HookFailure::Reject => {
                Err(Refusal::new(503, ErrorCode::Unavailable, format!("the {which} hook did not answer ({why})"), "Try again in a moment."))
            }
        }
    }

    /// The policy's answer for a hook that answered something other than the documented JSON.
    fn invalid(which: &str, hook: &HookConfig, why: &str) -> Result<(), Refusal> {
        tracing::warn!(hook = which, url = %hook.url, reason = why, policy = ?hook.on_failure, "upload hook answered invalidly");
        match hook.on_failure {
            HookFailure::Allow => Ok(()),
            HookFailure::Reject => Err(Refusal::new(
                502,
                ErrorCode::HookInvalid,
                format!("the {which} hook's answer is not valid: {why}"),
                "The operator's hook is broken; asking again gets the same answer: tell \
                 the operator (the reason is in detail). Bytes already sent are kept.",
            )),
        }
    }
}

fn refused(status: u16, message: String) -> Refusal {
    Refusal::new(status, ErrorCode::Rejected, message, "The server's policy refused this upload; change what the message names, or ask the operator.")
}

#[async_trait]
impl UploadHooks for HttpHooks {
    async fn pre_create(&self, upload: &PlannedUpload<'_>) -> Result<Option<String>, Refusal> {
        let Some(hook) = &self.pre_create else { return Ok(None) };
        let body = serde_json::json!({"type": "pre-create", "upload": {
            "principal": upload.principal, "length": upload.length, "metadata": metadata_json(upload.metadata), "concat": upload.concat}});
        match self.call(hook, body).await {
            Answer::Refused { status, message } => Err(refused(status, message)),
            Answer::Failed(why) => Self::failed("pre-create", hook, &why).map(|()| None),
            Answer::Invalid(why) => Self::invalid("pre-create", hook, &why).map(|()| None),
            Answer::Allowed(map) => match map.get("metadata") {
                None => Ok(None),
                Some(v) => match metadata_raw(v) {
                    Ok(raw) => Ok(Some(raw)),
                    Err(why) => Self::invalid("pre-create", hook, &why).map(|()| None),
                },
            },
        }
    }

    async fn pre_finish(&self, upload: &FinishingUpload<'_>) -> Result<(), Refusal> {
        let Some(hook) = &self.pre_finish else { return Ok(()) };
        let body = serde_json::json!({"type": "pre-finish", "upload": {
            "id": upload.id, "principal": upload.principal, "size": upload.size, "sha256": hex::encode(upload.sha256),
            "metadata": metadata_json(upload.metadata)}});
        match self.call(hook, body).await {
            Answer::Refused { status, message } => Err(refused(status, message)),
            Answer::Failed(why) => Self::failed("pre-finish", hook, &why),
            Answer::Invalid(why) => Self::invalid("pre-finish", hook, &why),
            Answer::Allowed(_) => Ok(()),
        }
    }

    fn has_pre_finish(&self) -> bool {
        self.pre_finish.is_some()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metadata_round_trips_through_the_hook_shape() {
        let raw = "filename aGVsbG8udHh0,empty";
        let json = metadata_json(raw);
        assert_eq!(json, serde_json::json!({"filename": "hello.txt", "empty": null}));
        let back = metadata_raw(&json).unwrap();
        assert_eq!(metadata_json(&back), json);
        assert!(metadata_raw(&serde_json::json!({"n": 5})).is_err());
        // Not UTF-8: handed over as base64 and taken back byte for byte.
        let raw = "filename //4AYWJj";
        assert_eq!(metadata_json(raw), serde_json::json!({"filename": {"base64": "//4AYWJj"}}));
        assert_eq!(metadata_raw(&metadata_json(raw)).unwrap(), raw);
        assert!(metadata_raw(&serde_json::json!(["x"])).is_err());
    }
}
