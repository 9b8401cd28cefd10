//! Prometheus metrics (`/metrics`, text exposition format via `prometheus-client`).

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
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

/// Label set of `ferry_http_request_duration_seconds`: bounded — `route` is the matched route
/// template (`/files/{id}`, `/api/v1/tasks/{id}`…, `unmatched` for anything else), `method` one
/// of the methods ferry serves (else `OTHER`), `status` the response's code.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RouteLabels {
    pub method: &'static str,
    pub route: String,
    pub status: u16,
}

/// Label set of `ferry_tasks`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TaskLabels {
    /// A registered task kind.
    pub kind: String,
    /// `working`, `input_required`, `completed`, `failed`, `cancelled`.
    pub status: &'static str,
}

/// Label set of `ferry_check_findings_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct FindingLabel {
    /// `sha256_mismatch`, `missing`, `orphan_blob` or `orphan_multipart`.
    pub kind: &'static str,
}

/// Label set of `ferry_disk_free_bytes`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct DirLabel {
    /// `data` (`--data`) or `blobs` (`--blobs`, when it is a directory).
    pub dir: &'static str,
}

/// Label set of `ferry_s3_request_duration_seconds`: the S3 operation (`UploadPart`,
/// `CompleteMultipartUpload`…) and the answer's status class (`2xx`…`5xx`, `error`: none).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct S3RequestLabels {
    pub operation: &'static str,
    pub outcome: &'static str,
}

/// Label set of `ferry_http_undocumented_answers_total`: an `/api/v1` operation, and a
/// refusal it answered that its OpenAPI document does not list.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct AnswerLabels {
    pub operation: &'static str,
    pub status: u16,
    pub code: &'static str,
}

/// The route a request matched, as a response extension: set inside the router (where the
/// match is known), read by the outer middleware that times the whole request.
#[derive(Clone, Debug)]
pub struct MatchedRoute(pub String);

/// Buckets of `ferry_http_request_duration_seconds`: 1 ms to 10 min (a PATCH may stream long).
const REQUEST_BUCKETS: [f64; 14] = [0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 5.0, 30.0, 120.0, 600.0];
/// Buckets of `ferry_checkpoint_duration_seconds`: 0.5 ms to 10 s (fsync + catalog commit).
const CHECKPOINT_BUCKETS: [f64; 13] = [0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0];

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
    /// File bytes sent in download bodies.
    pub bytes_sent: Counter,
    /// Bytes tasks wrote into their output files (archives, exports, fetches, copies).
    pub task_bytes_written: Counter,
    /// Request durations by method, route template and status.
    pub request_duration: Family<RouteLabels, Histogram>,
    /// Tasks by kind and status (the catalog's, refreshed on every scrape).
    pub tasks: Family<TaskLabels, Gauge>,
    /// Tasks waiting for a worker.
    pub task_queue_depth: Gauge,
    /// Checkpoint durations: fsync (or part upload) + catalog commit.
    pub checkpoint_duration: Histogram,
    /// Free bytes on the filesystem of the data and blob directories (refreshed on every scrape).
    pub disk_free: Family<DirLabel, Gauge>,
    /// Finished files removed by retention (`retain_finished`).
    pub uploads_retention_removed: Counter,
    /// Finished files `check` tasks re-read to the end.
    pub check_files: Counter,
    /// Bytes `check` tasks read back from the blob store.
    pub check_bytes_read: Counter,
    /// What `check` tasks found, by kind.
    pub check_findings: Family<FindingLabel, Counter>,
    /// The S3 store's memory budget (`[s3] max_buffer`), refreshed on every scrape: bytes
    /// reserved now, the bound, reservations waiting now, and since start the reservations
    /// that waited, their wait in all (seconds) and those that gave up (answered 503).
    pub s3_buffer: Gauge,
    pub s3_buffer_limit: Gauge,
    pub s3_buffer_waiting: Gauge,
    pub s3_buffer_waits: Gauge,
    pub s3_buffer_wait_seconds: Gauge<f64, std::sync::atomic::AtomicU64>,
    pub s3_buffer_refused: Gauge,
    /// Refusals an `/api/v1` operation answered that its OpenAPI document does not list (a
    /// bug: the document must say every answer), by operation, status and code.
    pub undocumented_answers: Family<AnswerLabels, Counter>,
    /// Every request the S3 store made, by operation and outcome: how long until its answer.
    pub s3_request_duration: Family<S3RequestLabels, Histogram>,
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
            bytes_sent: Counter::default(),
            task_bytes_written: Counter::default(),
            request_duration: Family::new_with_constructor(|| Histogram::new(REQUEST_BUCKETS)),
            s3_request_duration: Family::new_with_constructor(|| Histogram::new(REQUEST_BUCKETS)),
            tasks: Family::default(),
            task_queue_depth: Gauge::default(),
            checkpoint_duration: Histogram::new(CHECKPOINT_BUCKETS),
            disk_free: Family::default(),
            s3_buffer: Gauge::default(),
            s3_buffer_limit: Gauge::default(),
            s3_buffer_waiting: Gauge::default(),
            s3_buffer_waits: Gauge::default(),
            s3_buffer_wait_seconds: Gauge::default(),
            s3_buffer_refused: Gauge::default(),
            uploads_retention_removed: Counter::default(),
            check_files: Counter::default(),
            check_bytes_read: Counter::default(),
            check_findings: Family::default(),
            undocumented_answers: Family::default(),
            registry: Registry::default(),
        };
        registry.register("http_requests", "HTTP responses by status code", m.requests.clone());
        registry.register("bytes_received", "Upload body bytes received", m.bytes_received.clone());
        registry.register("uploads_created", "Uploads created", m.uploads_created.clone());
        registry.register("uploads_finished", "Uploads completed", m.uploads_finished.clone());
        registry.register("uploads_terminated", "Uploads terminated by DELETE", m.uploads_terminated.clone());
        registry.register("uploads_expired", "Unfinished uploads removed by the expiry sweeper", m.uploads_expired.clone());
        registry.register("patches_in_flight", "Upload bodies being received", m.patches_in_flight.clone());
        registry.register(
            "webhook_attempts",
            "Webhook delivery attempts by outcome (delivered, retry, failed = given up)",
            m.webhook_deliveries.clone(),
        );
        registry.register(
            "webhook_deliveries_pending",
            "Webhook deliveries not yet acknowledged by their receiver (the backlog)",
            m.webhook_deliveries_pending.clone(),
        );
        registry.register("webhook_deliveries_failed", "Webhook deliveries given up after their retry window", m.webhook_deliveries_failed.clone());
        registry.register("bytes_sent", "File bytes sent in download bodies (GET /files/{id}, signed download links)", m.bytes_sent.clone());
        registry.register("task_bytes_written", "Bytes tasks wrote into their output files", m.task_bytes_written.clone());
        registry.register_with_unit(
            "http_request_duration",
            "HTTP request durations, from the request's arrival to the end of the response headers, by method, matched route template and status",
            prometheus_client::registry::Unit::Seconds,
            m.request_duration.clone(),
        );
        registry.register_with_unit(
            "s3_request_duration",
            "S3 store requests by S3 operation and outcome (status class, or error: \
             no answer): seconds until the answer's head (a part's upload included)",
            prometheus_client::registry::Unit::Seconds,
            m.s3_request_duration.clone(),
        );
        registry.register("tasks", "Tasks in the catalog by kind and status (every replica sees the same numbers)", m.tasks.clone());
        registry.register("task_queue_depth", "Tasks waiting for a worker: working, and no worker holds them", m.task_queue_depth.clone());
        registry.register_with_unit(
            "checkpoint_duration",
            "Upload checkpoint durations: making bytes durable (fsync, part upload) and committing offset and sha256 midstate",
            prometheus_client::registry::Unit::Seconds,
            m.checkpoint_duration.clone(),
        );
        registry.register_with_unit(
            "disk_free",
            "Free space on the filesystem of the data (and blob) directory",
            prometheus_client::registry::Unit::Bytes,
            m.disk_free.clone(),
        );
        registry.register_with_unit(
            "s3_buffer",
            "S3 store: bytes of open parts, tails read back and streamed pieces held in memory now",
            prometheus_client::registry::Unit::Bytes,
            m.s3_buffer.clone(),
        );
        registry.register_with_unit(
            "s3_buffer_limit",
            "S3 store: the memory budget ([s3] max_buffer)",
            prometheus_client::registry::Unit::Bytes,
            m.s3_buffer_limit.clone(),
        );
        registry.register("s3_buffer_waiting", "S3 store: reservations waiting for room in the memory budget now", m.s3_buffer_waiting.clone());
        registry.register(
            "s3_buffer_waits",
            "S3 store: reservations that had to wait for room in the memory budget, since start",
            m.s3_buffer_waits.clone(),
        );
        registry.register_with_unit(
            "s3_buffer_wait",
            "S3 store: time reservations spent waiting for room in the memory budget, since start",
            prometheus_client::registry::Unit::Seconds,
            m.s3_buffer_wait_seconds.clone(),
        );
        registry.register(
            "s3_buffer_refused",
            "S3 store: reservations that found no room in time (their request answered 503), since start",
            m.s3_buffer_refused.clone(),
        );
        registry.register("uploads_retention_removed", "Finished files removed by retention (retain_finished)", m.uploads_retention_removed.clone());
        registry.register("check_files", "Finished files check tasks re-read and compared with their sha256", m.check_files.clone());
        registry.register_with_unit(
            "check_read",
            "Bytes check tasks read back from the blob store",
            prometheus_client::registry::Unit::Bytes,
            m.check_bytes_read.clone(),
        );
        registry.register(
            "check_findings",
            "What check tasks found: sha256_mismatch, missing (finished files), orphan_blob, orphan_multipart",
            m.check_findings.clone(),
        );
        registry.register(
            "http_undocumented_answers",
            "Refusals an /api/v1 operation answered that its OpenAPI document does not list (should stay 0)",
            m.undocumented_answers.clone(),
        );
        for kind in ["sha256_mismatch", "missing", "orphan_blob", "orphan_multipart"] {
            let _ = m.check_findings.get_or_create(&FindingLabel { kind });
        }
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
