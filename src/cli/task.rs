//! `ferry task start|get|list|cancel`: a small client of `/api/v1/tasks`.
//!
//! Prints the server's JSON exactly as received (one document per line) on stdout; errors go
//! to stderr as the problem's `detail` and `recovery_hint`. Exit codes: see [`EXIT_CODES`].

use std::io::{IsTerminal, Read};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, Subcommand};
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

/// Shown under every `ferry task` help page.
pub const EXIT_CODES: &str = "\
Exit codes:
  0  success (with --wait: the task completed)
  1  with --wait: the task failed; or the server could not be reached, or answered 5xx
  2  usage error, or the server refused the request (4xx, e.g. unknown id, bad arguments)
  3  with --wait: the task was cancelled";

/// Exit code: the task failed, the server is unreachable, or a 5xx.
const EXIT_FAILURE: u8 = 1;
/// Exit code: usage error or a 4xx answer.
const EXIT_USAGE: u8 = 2;
/// Exit code: the awaited task was cancelled.
const EXIT_CANCELLED: u8 = 3;

/// `ferry task …`: start, inspect, list and cancel tasks on a running ferry server.
#[derive(Debug, Args)]
#[command(after_help = EXIT_CODES)]
pub struct TaskArgs {
    #[command(flatten)]
    pub conn: Connection,
    #[command(subcommand)]
    pub command: TaskCommand,
}

use super::client::error_chain;
pub use super::client::Connection;

#[derive(Debug, Subcommand)]
pub enum TaskCommand {
    /// Start a task of KIND and print it (JSON). With an idempotency key, a retry returns the
    /// task the key already names instead of starting a second run.
    #[command(after_help = EXIT_CODES)]
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
        /// Poll until the task is completed, failed or cancelled, then print it; the exit code
        /// tells which (0, 1, 3). Interrupting the wait does not cancel the task.
        #[arg(long)]
        wait: bool,
    },
    /// Print a task (JSON).
    #[command(after_help = EXIT_CODES)]
    Get {
        /// Task id.
        id: String,
    },
    /// Print your tasks, newest first (JSON `{"tasks": [...]}`).
    #[command(after_help = EXIT_CODES)]
    List {
        /// At most this many (server default 100, at most 1000).
        #[arg(long, value_name = "N")]
        limit: Option<u32>,
    },
    /// Cancel a task and print it (JSON). Cancelling a finished task changes nothing.
    #[command(after_help = EXIT_CODES)]
    Cancel {
        /// Task id.
        id: String,
    },
}

/// Why a command stopped: the message is already printed; this is the exit code.
struct Exit(u8);

fn usage(msg: impl std::fmt::Display) -> Exit {
    eprintln!("ferry: {msg}");
    Exit(EXIT_USAGE)
}

/// Run `ferry task …`; returns the process exit code.
pub fn run(args: TaskArgs) -> ExitCode {
    let rt = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("ferry: cannot start the async runtime: {e}");
            return ExitCode::from(EXIT_FAILURE);
        }
    };
    match rt.block_on(execute(args)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(Exit(code)) => ExitCode::from(code),
    }
}

struct Client {
    http: reqwest::Client,
    base: String,
    token: Option<String>,
}

/// A successful answer: the body as received.
struct Answer {
    status: u16,
    body: String,
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

/// The problem+json fields shown to the user.
#[derive(Deserialize)]
struct ProblemBody {
    #[serde(default)]
    detail: Option<String>,
    #[serde(default)]
    recovery_hint: Option<String>,
    #[serde(default)]
    code: Option<String>,
}

/// What a request failure means for the exit code and for retrying while waiting.
enum Failure {
    /// The server answered with an error status (message printed).
    Status(u16),
    /// The server could not be reached (message printed).
    Unreachable,
}

impl Failure {
    fn exit(&self) -> Exit {
        match self {
            Failure::Status(s) if (400..500).contains(s) => Exit(EXIT_USAGE),
            _ => Exit(EXIT_FAILURE),
        }
    }
}

impl Client {
    fn new(conn: &Connection) -> Result<Client, Exit> {
        let base = conn.base().map_err(|e| usage(e.message))?.as_str().trim_end_matches('/').to_string();
        let http = super::client::http_client(Some(Duration::from_secs(60)), None).map_err(|e| {
            e.print();
            Exit(EXIT_FAILURE)
        })?;
        Ok(Client { http, base, token: conn.token() })
    }

    /// Send a request to `/api/v1{path}`; a non-2xx answer is printed (detail, hint) and
    /// returned as a [`Failure`].
    async fn send(&self, method: reqwest::Method, path: &str, headers: &[(&str, &str)], body: Option<String>) -> Result<Answer, Failure> {
        let url = format!("{}/api/v1{}", self.base, path);
        let mut req = self.http.request(method, &url);
        if let Some(t) = &self.token {
            req = req.bearer_auth(t);
        }
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        if let Some(b) = body {
            req = req.header("content-type", "application/json").body(b);
        }
        let res = match req.send().await {
            Ok(r) => r,
            Err(e) => {
                eprintln!("ferry: cannot reach {}: {}", self.base, error_chain(&e));
                eprintln!("hint: is `ferry serve` running there? Set --server or FERRY_SERVER.");
                return Err(Failure::Unreachable);
            }
        };
        let status = res.status().as_u16();
        let body = match res.text().await {
            Ok(b) => b,
            Err(e) => {
                eprintln!("ferry: reading the answer from {}: {}", self.base, error_chain(&e));
                return Err(Failure::Unreachable);
            }
        };
        if (200..300).contains(&status) {
            return Ok(Answer { status, body });
        }
        match serde_json::from_str::<ProblemBody>(&body) {
            Ok(p) if p.detail.is_some() => {
                let code = p.code.map(|c| format!(" ({c})")).unwrap_or_default();
                eprintln!("ferry: {}{code} [HTTP {status}]", p.detail.unwrap_or_default());
                if let Some(h) = p.recovery_hint.filter(|h| !h.is_empty()) {
                    eprintln!("hint: {h}");
                }
            }
            _ => eprintln!("ferry: HTTP {status} from {url}: {}", body.trim()),
        }
        Err(Failure::Status(status))
    }
}

/// Print one JSON document. A closed stdout (`ferry task list | head`) ends the command
/// quietly with exit code 0; another write error with exit code 1.
fn print_json(body: &str) {
    if let Err(e) = super::client::print_line(body.trim_end()) {
        e.print();
        std::process::exit(i32::from(e.code));
    }
}

/// Path segment for a task id (ids are base32, but never let a typo reach another route).
fn id_segment(id: &str) -> Result<String, Exit> {
    if id.is_empty() {
        return Err(usage("the task id is empty"));
    }
    Ok(percent_encoding::utf8_percent_encode(id, percent_encoding::NON_ALPHANUMERIC).to_string())
}

/// The `--args` / `--args-file` JSON text, checked to be one JSON value.
fn read_args(args: Option<String>, file: Option<PathBuf>) -> Result<Option<String>, Exit> {
    let (text, source) = match (args, file) {
        (Some(a), _) => (a, "--args".to_string()),
        (None, Some(p)) if p.as_os_str() == "-" => {
            let mut s = String::new();
            std::io::stdin().read_to_string(&mut s).map_err(|e| usage(format_args!("reading arguments from stdin: {e}")))?;
            (s, "stdin".to_string())
        }
        (None, Some(p)) => {
            let s = std::fs::read_to_string(&p).map_err(|e| usage(format_args!("reading --args-file {}: {e}", p.display())))?;
            (s, p.display().to_string())
        }
        (None, None) => return Ok(None),
    };
    let raw: Box<RawValue> = serde_json::from_str(&text).map_err(|e| usage(format_args!("arguments from {source} are not JSON: {e}")))?;
    Ok(Some(raw.get().to_string()))
}

async fn execute(args: TaskArgs) -> Result<(), Exit> {
    let client = Client::new(&args.conn)?;
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
            let headers: Vec<(&str, &str)> = key.as_deref().map(|k| ("idempotency-key", k)).into_iter().collect();
            let a = client.send(reqwest::Method::POST, "/tasks", &headers, Some(body)).await.map_err(|f| f.exit())?;
            if !wait {
                print_json(&a.body);
                return Ok(());
            }
            let task: TaskSummary = parse_task(&a.body)?;
            if a.status == 200 {
                eprintln!("ferry: task {} (already started with this idempotency key) is {}", task.id, task.status);
            } else {
                eprintln!("ferry: task {} started; waiting (interrupting does not cancel it)", task.id);
            }
            wait_for(&client, task, a.body).await
        }
        TaskCommand::Get { id } => {
            let a = client.send(reqwest::Method::GET, &format!("/tasks/{}", id_segment(&id)?), &[], None).await.map_err(|f| f.exit())?;
            print_json(&a.body);
            Ok(())
        }
        TaskCommand::List { limit } => {
            let path = match limit {
                Some(0) => return Err(usage("--limit must be at least 1")),
                Some(n) => format!("/tasks?limit={n}"),
                None => "/tasks".to_string(),
            };
            let a = client.send(reqwest::Method::GET, &path, &[], None).await.map_err(|f| f.exit())?;
            print_json(&a.body);
            Ok(())
        }
        TaskCommand::Cancel { id } => {
            let a = client.send(reqwest::Method::POST, &format!("/tasks/{}/cancel", id_segment(&id)?), &[], None).await.map_err(|f| f.exit())?;
            print_json(&a.body);
            Ok(())
        }
    }
}

fn parse_task(body: &str) -> Result<TaskSummary, Exit> {
    serde_json::from_str(body).map_err(|e| {
        eprintln!("ferry: the server's answer is not a task ({e}): {}", body.trim());
        Exit(EXIT_FAILURE)
    })
}

/// Consecutive failed polls (server down or 5xx) tolerated while waiting, e.g. across a
/// server restart.
const WAIT_RETRIES: u32 = 60;

/// Poll until `task` is terminal; print its final JSON; map its status to the exit code.
async fn wait_for(client: &Client, mut task: TaskSummary, mut body: String) -> Result<(), Exit> {
    let path = format!("/tasks/{}", id_segment(&task.id)?);
    let show = std::io::stderr().is_terminal();
    let mut last_shown: Option<(String, ProgressSummary)> = None;
    let mut asked: Vec<String> = Vec::new();
    let mut failures = 0;
    loop {
        match task.status.as_str() {
            "completed" => {
                print_json(&body);
                return Ok(());
            }
            "failed" => {
                print_json(&body);
                return Err(Exit(EXIT_FAILURE));
            }
            "cancelled" => {
                print_json(&body);
                return Err(Exit(EXIT_CANCELLED));
            }
            _ => {}
        }
        if task.status == "input_required" {
            for (key, request) in &task.input_requests {
                if !asked.contains(key) {
                    eprintln!("ferry: task {} needs input {key:?}: {request}", task.id);
                    eprintln!("hint: answer with POST /api/v1/tasks/{}/input {{\"key\": {key:?}, \"response\": …}}", task.id);
                    asked.push(key.clone());
                }
            }
        }
        let now = (task.status.clone(), task.progress.clone().unwrap_or_default());
        if show && last_shown.as_ref() != Some(&now) {
            let pct = now.1.fraction.map(|f| format!(" {:.0}%", f * 100.0)).unwrap_or_default();
            let msg = now.1.message.as_deref().map(|m| format!(" {m}")).unwrap_or_default();
            eprintln!("ferry: {}{pct}{msg}", now.0);
            last_shown = Some(now);
        }
        let pause = task.poll_after_ms.unwrap_or(1000).clamp(100, 5000);
        tokio::time::sleep(Duration::from_millis(pause)).await;
        match client.send(reqwest::Method::GET, &path, &[], None).await {
            Ok(a) => {
                failures = 0;
                task = parse_task(&a.body)?;
                body = a.body;
            }
            Err(Failure::Status(s)) if s < 500 => return Err(Failure::Status(s).exit()),
            Err(f) => {
                failures += 1;
                if failures > WAIT_RETRIES {
                    return Err(f.exit());
                }
                eprintln!("ferry: still waiting for task {} (retry {failures}/{WAIT_RETRIES})", task.id);
            }
        }
    }
}
