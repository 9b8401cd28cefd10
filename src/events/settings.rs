//! The events engine's settings: `[[webhooks]]` receivers and the synchronous `[hooks]`, with the
//! checks that belong to their protocols (a Standard Webhooks secret). `config` fills them from
//! ferry.toml.

use std::time::Duration;

use serde::Deserialize;

/// Event types ferry writes (DESIGN §8).
pub const EVENT_TYPES: [&str; 6] =
    ["upload.created", "upload.finished", "upload.terminated", "upload.expired", "task.status_changed", "task.partial"];

/// One `[[webhooks]]` receiver: every event of `events` (types, or prefixes like `upload.*`;
/// empty = all) of `principals` (empty = all) is POSTed to `url` in the Standard Webhooks
/// shape, signed with `secret`, and retried with exponential backoff for `retry_for` until a 2xx.
#[derive(Clone, PartialEq, Eq)]
pub struct WebhookConfig {
    /// Names the delivery cursor and the deliveries (default: the URL). Renaming it starts
    /// the webhook afresh.
    pub name: String,
    pub url: url::Url,
    pub events: Vec<String>,
    pub principals: Vec<String>,
    /// `whsec_` + base64 of the key, as Standard Webhooks libraries take it.
    pub secret: String,
    /// How long a delivery is retried before it is given up (default 24 h).
    pub retry_for: Duration,
    /// How long one attempt may take, connect to last byte (default 10 s).
    pub timeout: Duration,
}

impl std::fmt::Debug for WebhookConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WebhookConfig")
            .field("name", &self.name)
            .field("url", &self.url.as_str())
            .field("events", &self.events)
            .field("principals", &self.principals)
            .finish_non_exhaustive()
    }
}

/// What a synchronous hook that fails (times out, cannot be reached, answers 5xx or not JSON)
/// means for the request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum HookFailure {
    /// Refuse the request with 503 `unavailable` (retryable). The default.
    Reject,
    /// Go on as if the hook had allowed it.
    Allow,
}

/// A synchronous upload hook (`[hooks.pre_create]`, `[hooks.pre_finish]`; see `events::hooks`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HookConfig {
    pub url: url::Url,
    /// The longest a request waits for the hook (default 5 s).
    pub timeout: Duration,
    pub on_failure: HookFailure,
}

/// Fewest key bytes a webhook secret may have: Standard Webhooks asks for keys of 24 to 64
/// bytes (a shorter key is guessable; `whsec_` alone is an empty key).
pub const MIN_WEBHOOK_KEY_BYTES: usize = 24;

/// A Standard Webhooks secret, `whsec_` + base64 of a key of at least
/// [`MIN_WEBHOOK_KEY_BYTES`] bytes. Errors: what is wrong with it, never the secret itself.
pub fn check_webhook_secret(secret: &str) -> Result<(), String> {
    use base64::Engine as _;
    let Some(b64) = secret.strip_prefix("whsec_") else {
        return Err("must be `whsec_` followed by base64 (Standard Webhooks)".into());
    };
    let key =
        base64::engine::general_purpose::STANDARD.decode(b64).map_err(|_| "must be `whsec_` followed by base64 (Standard Webhooks)".to_string())?;
    if key.len() < MIN_WEBHOOK_KEY_BYTES {
        return Err(format!(
            "has a {}-byte key; Standard Webhooks keys are {MIN_WEBHOOK_KEY_BYTES} to 64 random bytes (e.g. `whsec_$(openssl rand -base64 32)`)",
            key.len()
        ));
    }
    if key.iter().all(|b| *b == key[0]) {
        return Err("is one byte repeated; use random bytes (e.g. `whsec_$(openssl rand -base64 32)`)".into());
    }
    standardwebhooks::Webhook::new(secret).map_err(|_| "must be `whsec_` followed by base64 (Standard Webhooks)".to_string())?;
    Ok(())
}
