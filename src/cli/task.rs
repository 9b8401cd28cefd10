//! `ferry task start|get|list|respond|cancel`: a small client of `/api/v1/tasks`.
//!
//! Prints the server's JSON exactly as received (one document per line) on stdout; errors go
//! to stderr as the problem's `detail` and `recovery_hint`. Exit codes: the ones of every
//! client command ([`super::client::EXIT_CODES`]).
//!
//! **Waiting** (`start --wait`, `get --wait`) follows the live events stream
//! (`GET /api/v1/events`, Server-Sent Events): it subscribes first, then reads the task (so no
//! change between the two is missed), then re-reads the task only when a
//! `task.status_changed` event names it. A dropped stream is reopened with `Last-Event-ID`
//! (nothing missed) within `--retry-for`; when the stream is unavailable (404 or 405: a server
//! or proxy without it; a 5xx; an answer that is not `text/event-stream`) the task is polled
//! instead, every `poll_after_ms` it suggests.

use std::io::{IsTerminal, Read};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, Subcommand};
use futures::StreamExt;
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

pub use super::client::Connection;
use super::client::{
    error_chain, exit_codes_help, parse_duration, print_line, CliError, Client, Retry, EXIT_FAILURE, EXIT_NETWORK, EXIT_NOT_FOUND,
    EXIT_TASK_CANCELLED, EXIT_TASK_FAILED,
};

/// `ferry task …`: start, inspect, list and cancel tasks on a running ferry server.
#[derive(Debug, Args)]
#[command(after_help = exit_codes_help())]
pub struct TaskArgs {
    #[command(flatten)]
    pub conn: Connection,
    /// Keep retrying network errors and 5xx for this long without progress (after the server
    /// first answered); `task start` retries only with --idempotency-key (a retried start
    /// without one could start a second run).
    #[arg(long, value_name = "DURATION", default_value = "2m", value_parser = parse_duration, global = true)]
    pub retry_for: Duration,
    #[command(subcommand)]
    pub command: TaskCommand,
}

#[derive(Debug, Subcommand)]
pub enum TaskCommand {
    /// Start a task of KIND and print it (JSON). With an idempotency key, a retry returns the
    /// task the key already names instead of starting a second run.
    #[command(after_help = exit_codes_help())]
    Start {
        /// Task kind, e.g. archive, compress, fetch, command, external.
        kind: String,
        /// Arguments as JSON text, sent exactly as given.
        #[arg(long, value_name = "JSON", conflicts_with = "args_file")]
        args: Option<String>,
        /// Read the JSON arguments from a file (`-` for stdin).
        #[arg(long, value_name = "PATH")]
        args_file: Option<PathBuf>,
        /// Idempotency key (1-255 characters): makes the start safe to retry.
        #[arg(long, value_name = "K")]
        idempotency_key: Option<String>,
        /// Wait until the task is completed, failed or cancelled (following the server's live
        /// events), then print it; the exit code tells which (0, 7, 8). Interrupting the wait
        /// does not cancel the task.
        #[arg(long)]
        wait: bool,
    },
    /// Print a task (JSON).
    #[command(after_help = exit_codes_help())]
    Get {
        /// Task id.
        id: String,
        /// Wait until the task is completed, failed or cancelled (following the server's live
        /// events), then print it; the exit code tells which (0, 7, 8).
        #[arg(long)]
        wait: bool,
    },
    /// Print your tasks, newest first (JSON `{"tasks": [...]}`).
    #[command(after_help = exit_codes_help())]
    List {
        /// At most this many (server default 100, at most 1000).
        #[arg(long, value_name = "N")]
        limit: Option<u32>,
    },
    /// Answer one of a task's input requests (`input_requests` of `task get`; `--wait` shows
    /// each as it comes) and print `{"accepted": …, "task": …}` (JSON). The task then works
    /// on. A KEY the task is not waiting for changes nothing: exit code 3, naming the keys it
    /// waits for. An answer outside the request's `schema`: exit code 2, naming the place.
    #[command(after_help = exit_codes_help())]
    Respond {
        /// Task id.
        id: String,
        /// The input request's key (e.g. dest.name).
        key: String,
        /// The answer as JSON text, sent exactly as given: `'"orders"'` (a string), `42`,
        /// `true`, `'{"a": 1}'`. For text, --text quotes it for you.
        #[arg(value_name = "JSON", required_unless_present_any = ["text", "response_file"], conflicts_with_all = ["text", "response_file"])]
        response: Option<String>,
        /// Answer with this text (sent as a JSON string).
        #[arg(long, value_name = "TEXT", conflicts_with = "response_file")]
        text: Option<String>,
        /// Read the JSON answer from a file (`-` for stdin).
        #[arg(long, value_name = "PATH")]
        response_file: Option<PathBuf>,
        /// Then wait until the task is completed, failed or cancelled, as `task get --wait`.
        #[arg(long)]
        wait: bool,
    },
    /// Cancel a task and print it (JSON). Cancelling a finished task changes nothing.
    #[command(after_help = exit_codes_help())]
    Cancel {
        /// Task id.
        id: String,
    },
}

/// Run `ferry task …`; returns the process exit code.
pub fn run(args: TaskArgs) -> ExitCode {
    super::client::run_command(|| execute(args))
}

/// The parts of a task view the client looks at.
#[derive(Deserialize)]
struct TaskSummary {
    id: String,
    status: String,
    #[serde(default)]
    poll_after_ms: Option<u64>,
    #[serde(default)]
    progress: Option<ProgressSummary>,
    #[serde(default)]
    input_requests: serde_json::Map<String, serde_json::Value>,
}

#[derive(Deserialize, PartialEq, Clone, Default)]
struct ProgressSummary {
    #[serde(default)]
    fraction: Option<f64>,
    #[serde(default)]
    message: Option<String>,
}

fn usage(msg: impl std::fmt::Display) -> CliError {
    CliError::usage(msg.to_string())
}

/// Print one JSON document (a closed stdout ends the command quietly with 0).
fn print_json(body: &str) -> Result<(), CliError> {
    print_line(body.trim_end())
}

/// Path segment for a task id.
fn task_path(id: &str) -> Result<String, CliError> {
    if id.is_empty() {
        return Err(usage("the task id is empty"));
    }
    Ok(format!("/tasks/{}", super::client::id_segment(id)?))
}

/// The `--args` / `--args-file` JSON text, checked to be one JSON value.
fn read_args(args: Option<String>, file: Option<PathBuf>) -> Result<Option<String>, CliError> {
    read_json(args, file, "arguments", "--args-file")
}

/// JSON text given on the command line or read from `file` (`-`: stdin), checked to be one
/// JSON value; `what` and `flag` name it in errors.
fn read_json(given: Option<String>, file: Option<PathBuf>, what: &str, flag: &str) -> Result<Option<String>, CliError> {
    let (text, source) = match (given, file) {
        (Some(a), _) => (a, "the command line".to_string()),
        (None, Some(p)) if p.as_os_str() == "-" => {
            let mut s = String::new();
            std::io::stdin().read_to_string(&mut s).map_err(|e| usage(format_args!("reading {what} from stdin: {e}")))?;
            (s, "stdin".to_string())
        }
        (None, Some(p)) => {
            let s = std::fs::read_to_string(&p).map_err(|e| usage(format_args!("reading {flag} {}: {e}", p.display())))?;
            (s, p.display().to_string())
        }
        (None, None) => return Ok(None),
    };
    let raw: Box<RawValue> = serde_json::from_str(&text).map_err(|e| {
        usage(format_args!("{what} from {source}: not JSON: {e}")).hint("Text is quoted in JSON: '\"orders\"' (`task respond` takes --text orders).")
    })?;
    Ok(Some(raw.get().to_string()))
}

async fn execute(args: TaskArgs) -> Result<(), CliError> {
    let client = Client::with_http(&args.conn, super::client::http_client(args.conn.cacert().as_deref(), Some(Duration::from_secs(60)), None)?)?;
    let retry_for = args.retry_for;
    let retry = || Retry::new(retry_for);
    match args.command {
        TaskCommand::Start { kind, args, args_file, idempotency_key, wait } => {
            let args = read_args(args, args_file)?;
            #[derive(Serialize)]
            struct StartBody<'a> {
                kind: &'a str,
                #[serde(skip_serializing_if = "Option::is_none")]
                args: Option<&'a RawValue>,
            }
            let raw: Option<&RawValue> = args.as_deref().map(|a| serde_json::from_str(a).expect("checked above"));
            let body = serde_json::to_string(&StartBody { kind: &kind, args: raw }).expect("serialises");
            // Sent in the header's RFC 9651 string form, so keys with spaces travel intact.
            let key = idempotency_key.as_deref().map(|k| ferry_tus::IdempotencyKey::new(k).map(|k| k.to_string())).transpose().map_err(usage)?;
            // Without a key a retried POST could start a second run: no retries then.
            let mut r = if key.is_some() { retry() } else { Retry::new(Duration::ZERO) };
            let headers: Vec<(&str, String)> = key.map(|k| ("idempotency-key", k)).into_iter().collect();
            let (status, text) = client.api_with(&mut r, reqwest::Method::POST, "/tasks", &[], &headers, Some(body)).await?;
            if !wait {
                return print_json(&text);
            }
            let task = parse_task(&text)?;
            if status == 200 {
                eprintln!("ferry: task {} (already started with this idempotency key) is {}", task.id, task.status);
            } else {
                eprintln!("ferry: task {} started; waiting (interrupting does not cancel it)", task.id);
            }
            wait_for(&client, retry_for, &task.id).await
        }
        TaskCommand::Get { id, wait } => {
            let path = task_path(&id)?;
            if wait {
                return wait_for(&client, retry_for, &id).await;
            }
            print_json(&client.api(&mut retry(), reqwest::Method::GET, &path, &[], None).await?)
        }
        TaskCommand::List { limit } => {
            let query: Vec<(&str, String)> = match limit {
                Some(0) => return Err(usage("--limit must be at least 1")),
                Some(n) => vec![("limit", n.to_string())],
                None => vec![],
            };
            print_json(&client.api(&mut retry(), reqwest::Method::GET, "/tasks", &query, None).await?)
        }
        TaskCommand::Respond { id, key, response, text, response_file, wait } => {
            let path = format!("{}/input", task_path(&id)?);
            let answer = match text {
                Some(t) => serde_json::to_string(&t).expect("serialises"),
                None => read_json(response, response_file, "the answer", "--response-file")?
                    .ok_or_else(|| usage("give the answer: JSON, --text or --response-file"))?,
            };
            let raw: &RawValue = serde_json::from_str(&answer).expect("checked above");
            let body = serde_json::json!({ "key": key, "response": raw }).to_string();
            // Answering twice is harmless (the second finds the key answered): retried.
            let text = client.api(&mut retry(), reqwest::Method::POST, &path, &[], Some(body)).await?;
            print_json(&text)?;
            #[derive(Deserialize)]
            struct Answered {
                accepted: bool,
                task: TaskSummary,
            }
            let a: Answered = serde_json::from_str(&text)
                .map_err(|e| CliError::new(EXIT_FAILURE, format!("the server's answer is not as expected ({e}): {}", text.trim())))?;
            if !a.accepted {
                let waiting: Vec<&str> = a.task.input_requests.keys().map(String::as_str).collect();
                let now = if waiting.is_empty() {
                    format!("it waits for no input now ({})", a.task.status)
                } else {
                    format!("it waits for {}", waiting.join(", "))
                };
                return Err(CliError::new(EXIT_NOT_FOUND, format!("task {id} is not waiting for input {key:?}: nothing was changed; {now}"))
                    .hint(format!("`ferry task get {id}` shows its input_requests.")));
            }
            if wait {
                return wait_for(&client, retry_for, &id).await;
            }
            Ok(())
        }
        TaskCommand::Cancel { id } => {
            let path = format!("{}/cancel", task_path(&id)?);
            print_json(&client.api(&mut retry(), reqwest::Method::POST, &path, &[], None).await?)
        }
    }
}

fn parse_task(body: &str) -> Result<TaskSummary, CliError> {
    serde_json::from_str(body).map_err(|e| CliError::new(EXIT_FAILURE, format!("the server's answer is not a task ({e}): {}", body.trim())))
}

/// What [`wait_for`] shows on stderr while it waits.
struct Shown {
    on_terminal: bool,
    last: Option<(String, ProgressSummary)>,
    asked: Vec<String>,
}

impl Shown {
    /// Say what changed: a new status or progress (on a terminal), each new input request.
    fn show(&mut self, task: &TaskSummary) {
        if task.status == "input_required" {
            for (key, request) in &task.input_requests {
                if !self.asked.contains(key) {
                    eprintln!("ferry: task {} needs input {key:?}: {request}", task.id);
                    eprintln!("hint: answer with `ferry task respond {} {key} JSON` (or --text TEXT)", task.id);
                    self.asked.push(key.clone());
                }
            }
        }
        let now = (task.status.clone(), task.progress.clone().unwrap_or_default());
        if self.on_terminal && self.last.as_ref() != Some(&now) {
            let pct = now.1.fraction.map(|f| format!(" {:.0}%", f * 100.0)).unwrap_or_default();
            let msg = now.1.message.as_deref().map(|m| format!(" {m}")).unwrap_or_default();
            eprintln!("ferry: {}{pct}{msg}", now.0);
            self.last = Some(now);
        }
    }
}

/// The exit of a wait once `task` (its JSON `body`) is terminal: print it, and 0 / 7 / 8.
fn finished(task: &TaskSummary, body: &str) -> Option<Result<(), CliError>> {
    let code = match task.status.as_str() {
        "completed" => 0,
        "failed" => EXIT_TASK_FAILED,
        "cancelled" => EXIT_TASK_CANCELLED,
        _ => return None,
    };
    Some(print_json(body).and_then(|()| if code == 0 { Ok(()) } else { Err(CliError::new(code, "")) }))
}

/// Why the events stream could not be followed.
enum StreamError {
    /// The server has no events stream: poll instead.
    Unavailable(String),
    /// A failure worth retrying (network, 5xx) or reporting.
    Failed(CliError),
}

/// Open `GET /api/v1/events` (after `last_id`, when known).
async fn open_events(client: &Client, last_id: Option<&str>) -> Result<reqwest::Response, StreamError> {
    let url = client.url("/api/v1/events");
    let what = super::client::describe(&reqwest::Method::GET, &url);
    let mut req = client.request(reqwest::Method::GET, &url).header("accept", "text/event-stream");
    if let Some(id) = last_id {
        req = req.header("last-event-id", id);
    }
    let res = req.send().await.map_err(|e| StreamError::Failed(CliError::network(&what, &e)))?;
    let status = res.status().as_u16();
    let sse = res.headers().get("content-type").and_then(|v| v.to_str().ok()).is_some_and(|t| t.starts_with("text/event-stream"));
    match status {
        200 if sse => Ok(res),
        // No stream here (an older server, a proxy that does not pass it), or the stream is
        // failing (5xx) while the task may still be read: poll instead.
        200 | 404 | 405 | 500..=599 => {
            Err(StreamError::Unavailable(format!("{what} answered HTTP {status}{}", if status == 200 { " without text/event-stream" } else { "" })))
        }
        _ => Err(StreamError::Failed(CliError::from_status(&what, status, &res.text().await.unwrap_or_default()))),
    }
}

/// A read of the events stream that sends nothing (not even its 15 s keep-alive) this long
/// means the connection is gone: reopen it.
const STREAM_IDLE: Duration = Duration::from_secs(45);

/// Wait until task `id` is terminal; print its final JSON; map its status to the exit code.
async fn wait_for(client: &Client, retry_for: Duration, id: &str) -> Result<(), CliError> {
    let path = task_path(id)?;
    let mut shown = Shown { on_terminal: std::io::stderr().is_terminal(), last: None, asked: Vec::new() };
    let mut retry = Retry::new(retry_for);
    let mut last_id: Option<String> = None;
    // The stream is opened through a client without an overall timeout.
    let stream_client = Client::with_http_of(client, super::client::http_client(client.cacert.as_deref(), None, Some(STREAM_IDLE))?);
    client.contact().await?;
    loop {
        let events = match open_events(&stream_client, last_id.as_deref()).await {
            Ok(r) => r,
            Err(StreamError::Unavailable(why)) => {
                eprintln!("ferry: no live events ({why}); polling task {id} instead");
                return poll(client, retry_for, &path, &mut shown).await;
            }
            Err(StreamError::Failed(e)) if e.code == EXIT_NETWORK => {
                retry.wait(e).await?;
                continue;
            }
            Err(StreamError::Failed(e)) if last_id.is_some() && e.code == super::client::EXIT_NOT_FOUND => {
                // The last event seen is no longer kept: subscribe afresh (the task is read
                // right after, so nothing is missed).
                last_id = None;
                continue;
            }
            Err(StreamError::Failed(e)) => return Err(e),
        };
        // Subscribed: now read the task, so a change made before this point is seen here and
        // every later one arrives as an event.
        let body = client.api(&mut retry, reqwest::Method::GET, &path, &[], None).await?;
        let task = parse_task(&body)?;
        if let Some(done) = finished(&task, &body) {
            return done;
        }
        shown.show(&task);
        eprintln!("ferry: waiting for task {id} ({}): following live events (GET /api/v1/events)", task.status);
        retry.success();
        let mut stream = Box::pin(sse_stream::SseStream::from_bytes_stream(events.bytes_stream()));
        let ended = loop {
            match stream.next().await {
                None => break CliError::new(EXIT_NETWORK, "the events stream ended"),
                Some(Err(e)) => break CliError::new(EXIT_NETWORK, format!("the events stream failed: {}", error_chain(&e))),
                Some(Ok(ev)) => {
                    if let Some(i) = ev.id.filter(|i| !i.is_empty()) {
                        last_id = Some(i);
                    }
                    if ev.event.as_deref() != Some("task.status_changed") {
                        continue;
                    }
                    #[derive(Deserialize)]
                    struct Event {
                        data: EventData,
                    }
                    #[derive(Deserialize)]
                    struct EventData {
                        task: String,
                        status: String,
                    }
                    let Some(e) = ev.data.as_deref().and_then(|d| serde_json::from_str::<Event>(d).ok()) else { continue };
                    if e.data.task != id {
                        continue;
                    }
                    let body = client.api(&mut retry, reqwest::Method::GET, &path, &[], None).await?;
                    let task = parse_task(&body)?;
                    if let Some(done) = finished(&task, &body) {
                        eprintln!("ferry: task {id} is {} (event {})", e.data.status, last_id.as_deref().unwrap_or("?"));
                        return done;
                    }
                    shown.show(&task);
                }
            }
        };
        retry.wait(ended).await?;
    }
}

/// Poll the task every `poll_after_ms` (100 ms to 5 s) until it is terminal.
async fn poll(client: &Client, retry_for: Duration, path: &str, shown: &mut Shown) -> Result<(), CliError> {
    let mut retry = Retry::new(retry_for);
    loop {
        let body = client.api(&mut retry, reqwest::Method::GET, path, &[], None).await?;
        retry.success();
        let task = parse_task(&body)?;
        if let Some(done) = finished(&task, &body) {
            return done;
        }
        shown.show(&task);
        tokio::time::sleep(Duration::from_millis(task.poll_after_ms.unwrap_or(1000).clamp(100, 5000))).await;
    }
}
