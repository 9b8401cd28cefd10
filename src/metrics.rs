//! Prometheus metrics (`/metrics`, text exposition format via `prometheus-client`).

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::info::Info;
use prometheus_client::registry::Registry;

/// Label set of `ferry_http_requests_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StatusLabel {
    pub status: u16,
}

/// Label set of `ferry_webhook_attempts_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OutcomeLabel {
    /// `delivered`, `retry` or `failed` (given up).
    pub outcome: &'static str,
}

/// Every metric ferry exports.
pub struct Metrics {
    registry: Registry,
    /// HTTP responses by status code.
    pub requests: Family<StatusLabel, Counter>,
    /// Upload body bytes received (before any discard).
    pub bytes_received: Counter,
    pub uploads_created: Counter,
    pub uploads_finished: Counter,
    pub uploads_terminated: Counter,
    pub uploads_expired: Counter,
    /// PATCH (and creation-with-upload) bodies being received now.
    pub patches_in_flight: Gauge,
    /// Webhook delivery attempts by outcome.
    pub webhook_deliveries: Family<OutcomeLabel, Counter>,
    /// Webhook deliveries not yet acknowledged (every webhook, every replica).
    pub webhook_deliveries_pending: Gauge,
    /// Webhook deliveries given up and still kept.
    pub webhook_deliveries_failed: Gauge,
}

impl Default for Metrics {
    fn default() -> Self {
        let mut registry = Registry::with_prefix("ferry");
        let m = Metrics {
            requests: Family::default(),
            bytes_received: Counter::default(),
            uploads_created: Counter::default(),
            uploads_finished: Counter::default(),
            uploads_terminated: Counter::default(),
            uploads_expired: Counter::default(),
            patches_in_flight: Gauge::default(),
            webhook_deliveries: Family::default(),
            webhook_deliveries_pending: Gauge::default(),
            webhook_deliveries_failed: Gauge::default(),
            registry: Registry::default(),
        };
        registry.register("http_requests", "HTTP responses by status code", m.requests.clone());
        registry.register("bytes_received", "Upload body bytes received", m.bytes_received.clone());
        registry.register("uploads_created", "Uploads created", m.uploads_created.clone());
        registry.register("uploads_finished", "Uploads completed", m.uploads_finished.clone());
        registry.register("uploads_terminated", "Uploads terminated by DELETE", m.uploads_terminated.clone());
        registry.register("uploads_expired", "Unfinished uploads removed by the expiry sweeper", m.uploads_expired.clone());
        registry.register("patches_in_flight", "Upload bodies being received", m.patches_in_flight.clone());
        registry.register("webhook_attempts", "Webhook delivery attempts by outcome (delivered, retry, failed = given up)", m.webhook_deliveries.clone());
        registry.register("webhook_deliveries_pending", "Webhook deliveries not yet acknowledged by their receiver (the backlog)", m.webhook_deliveries_pending.clone());
        registry.register("webhook_deliveries_failed", "Webhook deliveries given up after their retry window", m.webhook_deliveries_failed.clone());
        Metrics { registry, ..m }
    }
}

impl Metrics {
    /// Metrics of the replica named `replica`: adds `ferry_replica_info{replica="…"} 1`, so
    /// series scraped from several processes behind one address can be told apart.
    pub fn for_replica(replica: &str) -> Metrics {
        let mut m = Metrics::default();
        m.registry.register("replica", "This process (replica) name", Info::new(vec![("replica".to_string(), replica.to_string())]));
        m
    }

    /// The registry in Prometheus text format.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &self.registry).expect("writing to a String cannot fail");
        out
    }
}
