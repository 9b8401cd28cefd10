//! The `command` kind: run a program declared in ferry.toml (`[commands.NAME]`), stream its
//! stdout into a file, and read progress, checkpoints and input requests from its stderr.
//!
//! One file of ~1 060 lines because running a declared program is one state machine (spawn, stdout
//! into the file, the stderr protocol of progress, checkpoints, input requests and partial
//! results); about a third is its tests.
//!
//! # Arguments
//!
//! `{"command": "NAME", "params": {...}}` — `NAME` must be declared in ferry.toml; `params` is an
//! optional JSON object. When the command declares `params_schema`, params (absent: `{}`) must
//! validate against it ([`Job::validate`], so a start is refused before a task exists). A
//! request never supplies a command line: ferry runs `program` with the fixed `args`, in `cwd`,
//! with stdin closed, in a process group of its own, and this environment — on top of a few
//! variables of the server's ([`PASSED_ENV`], `LC_*`, and the names the command lists in
//! `env`), never the rest of it: the server's credentials
//! (`AWS_SECRET_ACCESS_KEY`, a `FERRY_CATALOG` with a password…) are not the program's:
//!
//! | variable            | value                                                                |
//! |---------------------|----------------------------------------------------------------------|
//! | `FERRY_TASK_ID`     | the task id                                                          |
//! | `FERRY_PARAMS`      | `params` as compact JSON (`{}` when absent)                          |
//! | `FERRY_CHECKPOINT`  | the token of the checkpoint this run resumes from (empty: from the start) |
//! | `FERRY_OFFSET`      | bytes already in the output file at that checkpoint (`0` at the start) |
//! | `FERRY_INPUT_<KEY>` | the JSON response to input request `<key>` (see `input` below)      |
//!
//! `<KEY>` is the key upper-cased with every character other than `A-Z`/`0-9` replaced by `_`.
//!
//! # Output
//!
//! Everything the program writes to stdout becomes the file `output_name` (default
//! `NAME.out`) of type `media_type` (default `application/octet-stream`). Exit status 0
//! completes the task with `{"file": FileHandle, "exit_code": 0}`; any other status fails it
//! with `command NAME exited with status N: <last stderr log lines>`.
//!
//! # The stderr line protocol
//!
//! stderr is read as lines (`\n`-terminated, an optional trailing `\r` removed, invalid UTF-8
//! replaced, at most 64 KiB; a longer line is cut into 64 KiB pieces). A line is a *control
//! line* when it starts with one of these words followed by one space, and is otherwise
//! ordinary log output. Write each line with a single `write` (line-buffered stderr does).
//!
//! - `progress <fraction> [message...]` — `fraction` is a decimal in `[0, 1]` (digits and one
//!   `.`, e.g. `0.25`); the rest of the line, if any, is the progress message.
//! - `count <name> <n>` — sets progress counter `name` (`[A-Za-z0-9_.-]{1,64}`) to `n` (digits).
//! - `checkpoint <bytes> <token>` — "the first `<bytes>` bytes I wrote to stdout *in this run*
//!   form a consistent resume point, identified by `<token>`". `<bytes>` is digits; `<token>` is
//!   the rest of the line (1 byte to 1 KiB, opaque to ferry). When ferry's copy of stdout
//!   reaches exactly that many bytes, it makes the file durable there and persists the task
//!   checkpoint. If the task is resumed later (server crash, lease moved to another replica,
//!   input answered), the file is cut back to that point and the program is started again
//!   with `FERRY_CHECKPOINT=<token>` (and `FERRY_OFFSET`); it must then write only the bytes
//!   that come after that point. `<bytes>` counts this run only (a resumed run starts at 0)
//!   and must not decrease. The count is what makes a checkpoint exact although stdout and
//!   stderr are separate pipes; flush stdout before writing the line. A checkpoint that ferry
//!   reads only after it has already stored bytes past `<bytes>` is skipped (the task then
//!   resumes from an earlier one, which is safe).
//! - `input <key> <json>` — ask the task's owner for input: `key` is `[A-Za-z0-9_.-]{1,64}`,
//!   `<json>` the request (any JSON value, e.g. an MCP elicitation schema). The program should
//!   then exit (any status; it is killed after 30 s). ferry then moves the task to
//!   `input_required`; once answered, the program is run again from the last checkpoint with
//!   `FERRY_INPUT_<KEY>` set to the JSON response, and so on every later run of this task.
//!   Output written after the last checkpoint is discarded. Asking again for a key that was
//!   already answered is an error.
//!
//! - `partial <json>` — append a partial result: `<json>` is one JSON value of at most 16 KiB
//!   (rows exported so far, a first finding), shown in the task's `partial.fragments` and sent
//!   as a `task.partial` event at once, before the task ends. A checkpoint covers the fragments
//!   written before its line: a run resumed from it should write again only the fragments that
//!   came after that line, and those that ferry had already stored (the crash came between the
//!   fragment and the next checkpoint) are recognised by their position and not stored twice.
//!   The oldest fragments are dropped past 256 or 64 KiB (`partial.dropped` counts them).
//!
//! A malformed `progress` or `count` line is kept as log output; a malformed `checkpoint`,
//! `input` or `partial` line (not JSON, over 16 KiB) fails the task (the output could not be trusted). The last 20 log lines (at most
//! 4 KiB) are kept for the failure message.
//!
//! # Checkpoint
//!
//! `{"cursor": FileCursor, "token": "<last token>", "inputs": {"<key>": <request>, ...}}` — the
//! durable end of the output file, the token to resume the program with, and every input the
//! program asked for so far. A run first calls `need_input` for each recorded key (stored
//! responses make this replay-safe; an unanswered one parks the task again), then reopens the
//! file at `cursor` and starts the program. The first checkpoint (`token` empty, `cursor` at
//! byte 0) is taken right after the output file is created, so a resumed task never creates a
//! second file.
//!
//! Cancellation kills the program's whole process group: the program and every process it
//! started that stayed in its group (a process that made a session or group of its own,
//! `setsid`, left it). So does the end of a run: whatever the program left running in its
//! group when it exited is killed. A server killed outright (`kill -9`, a crash) cannot: the
//! group's leader is recorded in the task's checkpoint when the program starts (its pid, start
//! time, boot and pid namespace: [`command_group`](super::command_group)), and the task's next
//! run, or a cancel while no run holds it, ends what is left of that group first — never a
//! process that got the same pid later, nor one on another machine.

use std::collections::{BTreeMap, VecDeque};
use std::process::{ExitStatus, Stdio};
use std::time::Duration;

use async_trait::async_trait;
use bytes::{Bytes, BytesMut};
use futures::FutureExt;
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use serde_json::Value;
use tokio::io::AsyncReadExt;
use tokio::process::{Child, ChildStderr, ChildStdout};
use tokio::time::Instant;

use super::command_group::{Ended, RecordedGroup};
use crate::tasks::settings::CommandSpec;
use crate::tasks::{Job, JobContext, JobError};
use crate::upload::{FileCursor, FileWriter};

/// Longest stderr line; longer ones are cut.
const MAX_LINE: usize = 64 * 1024;
/// Longest checkpoint token.
const MAX_TOKEN: usize = 1024;
/// Log lines kept for the failure message.
const TAIL_LINES: usize = 20;
const TAIL_BYTES: usize = 4096;
/// stdout read size.
const CHUNK: usize = 64 * 1024;
/// A program that asked for input is killed if it has not exited after this.
const INPUT_GRACE: Duration = Duration::from_secs(30);
/// After the program exited, its stdout must reach end-of-file within this.
const DRAIN_GRACE: Duration = Duration::from_secs(5);
/// Runs in one `run` call (each answered input restarts the program once).
const MAX_RUNS: usize = 32;

/// Runs the programs of `[commands.NAME]`.
pub struct CommandJob {
    commands: BTreeMap<String, CommandSpec>,
    /// The compiled `params_schema` of each command that declares one (or why it is unusable:
    /// `ferry serve` refuses such a config at start-up; an embedder's gets the reason on
    /// every start).
    validators: BTreeMap<String, Result<jsonschema::Validator, String>>,
}

/// Most schema violations a refusal lists.
const MAX_SCHEMA_ERRORS: usize = 10;

impl CommandJob {
    pub fn new(commands: BTreeMap<String, CommandSpec>) -> Self {
        let validators =
            commands.iter().filter_map(|(n, c)| c.params_schema.as_ref().map(|s| (n.clone(), crate::tasks::settings::params_validator(s)))).collect();
        CommandJob { commands, validators }
    }

    /// `params` (absent: `{}`) against the command's `params_schema`, if it has one: every
    /// violation (up to [`MAX_SCHEMA_ERRORS`]) with its JSON Pointer inside params.
    fn check_params(&self, name: &str, params: Option<&Value>) -> Result<(), String> {
        let Some(v) = self.validators.get(name) else { return Ok(()) };
        let v = v.as_ref().map_err(|e| format!("command '{name}' has an unusable params_schema: {e}"))?;
        let empty = Value::Object(Default::default());
        let params = params.unwrap_or(&empty);
        let errors: Vec<String> = v
            .iter_errors(params)
            .take(MAX_SCHEMA_ERRORS + 1)
            .map(|e| {
                let at = e.instance_path().to_string();
                format!("params{}: {e}", if at.is_empty() { String::new() } else { at })
            })
            .collect();
        if errors.is_empty() {
            return Ok(());
        }
        let more = if errors.len() > MAX_SCHEMA_ERRORS { "; …" } else { "" };
        let shown: Vec<&str> = errors.iter().take(MAX_SCHEMA_ERRORS).map(String::as_str).collect();
        Err(format!("params do not match the params_schema of command '{name}': {}{more}", shown.join("; ")))
    }

    fn spec(&self, args: &CommandArgs) -> Result<&CommandSpec, String> {
        if let Some(p) = &args.params {
            if !p.is_object() {
                return Err("params must be a JSON object".into());
            }
        }
        self.commands.get(&args.command).ok_or_else(|| {
            if self.commands.is_empty() {
                format!("unknown command '{}': no commands are declared in ferry.toml ([commands.NAME])", args.command)
            } else {
                let names: Vec<&str> = self.commands.keys().map(String::as_str).collect();
                format!("unknown command '{}'; declared commands: {}", args.command, names.join(", "))
            }
        })
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct CommandArgs {
    command: String,
    #[serde(default)]
    params: Option<Value>,
}

fn parse_args(args: &RawValue) -> Result<CommandArgs, String> {
    serde_json::from_str(args.get()).map_err(|e| format!("command arguments: {e} (expected {{\"command\": NAME, \"params\": {{...}}}})"))
}

/// The task checkpoint of a `command` run (module docs).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct CommandCheckpoint {
    cursor: FileCursor,
    token: String,
    #[serde(default)]
    inputs: BTreeMap<String, Value>,
    /// The process group of the run in progress, recorded when its program starts, so a run
    /// killed with its server (kill -9) has it ended by the next run or a cancel.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    group: Option<RecordedGroup>,
}

#[async_trait]
impl Job for CommandJob {
    fn kind(&self) -> &str {
        "command"
    }

    /// `{"command": one of the declared names, "params": an object}`; with a `params_schema`
    /// of its own (one without `$ref`, which would point outside) per command.
    fn args_schema(&self) -> Option<Value> {
        let names: Vec<&String> = self.commands.keys().collect();
        let per: Vec<Value> = self
            .commands
            .iter()
            .filter_map(|(n, c)| c.params_schema.as_ref().filter(|s| !s.to_string().contains("\"$ref\"")).map(|s| (n, s)))
            .map(|(n, s)| {
                let mut s = s.clone();
                if let Some(m) = s.as_object_mut() {
                    m.remove("$schema");
                    m.remove("$id");
                }
                // Absent params are checked as `{}`: required when the schema requires members.
                let requires = s.get("required").and_then(Value::as_array).is_some_and(|r| !r.is_empty());
                let then = if requires {
                    serde_json::json!({ "properties": { "params": s }, "required": ["params"] })
                } else {
                    serde_json::json!({ "properties": { "params": s } })
                };
                serde_json::json!({ "if": { "properties": { "command": { "const": n } } }, "then": then })
            })
            .collect();
        let mut schema = serde_json::json!({
            "type": "object",
            "properties": {
                "command": { "type": "string", "enum": names, "description": "A command declared in ferry.toml ([commands.NAME])." },
                "params": { "type": ["object", "null"], "description": "Passed to the program as FERRY_PARAMS (absent: {})." }
            },
            "required": ["command"],
            "additionalProperties": false
        });
        if !per.is_empty() {
            schema["allOf"] = Value::Array(per);
        }
        Some(schema)
    }

    fn validate(&self, args: &RawValue) -> Result<(), String> {
        let args = parse_args(args)?;
        self.spec(&args)?;
        self.check_params(&args.command, args.params.as_ref())
    }

    fn release(&self, task_id: &str, checkpoint: Option<&str>) {
        let recorded = checkpoint.and_then(|c| serde_json::from_str::<CommandCheckpoint>(c).ok()).and_then(|c| c.group);
        if let Some(group) = recorded {
            end_left_over(task_id, &group);
        }
    }

    async fn run(&self, ctx: &JobContext, args: &RawValue, checkpoint: Option<Value>) -> Result<Value, JobError> {
        let mut state: Option<CommandCheckpoint> =
            checkpoint.map(serde_json::from_value).transpose().map_err(|e| JobError::Internal(format!("command checkpoint: {e}")))?;
        // A run killed with its server left its program's group running: it ends before
        // anything else, even a refusal of the arguments (a command no longer declared), and
        // before this run starts another (which would write the same file from the same
        // checkpoint).
        if let Some(group) = state.as_mut().and_then(|s| s.group.take()) {
            end_left_over(ctx.task_id(), &group);
        }
        let args = parse_args(args).map_err(JobError::failed)?;
        let spec = self.spec(&args).map_err(JobError::failed)?;
        let name = args.command.as_str();
        let params = args.params.clone().unwrap_or_else(|| Value::Object(Default::default())).to_string();

        for _ in 0..MAX_RUNS {
            ctx.check()?;
            // Inputs first: an unanswered one parks the task before anything is started.
            let mut answers = BTreeMap::new();
            if let Some(s) = &state {
                for (key, request) in &s.inputs {
                    answers.insert(key.clone(), ctx.need_input(key, request.clone()).await?);
                }
            }
            let writer = match &state {
                Some(s) => ctx.reopen_file(&s.cursor).await?,
                None => {
                    let file_name = spec.output_name.clone().unwrap_or_else(|| format!("{name}.out"));
                    let media_type = spec.media_type.as_deref().unwrap_or("application/octet-stream");
                    let mut w = ctx.create_file(&file_name, media_type).await?;
                    let cursor = w.sync().await?;
                    let s = CommandCheckpoint { cursor, token: String::new(), inputs: BTreeMap::new(), group: None };
                    ctx.checkpoint(&s).await?;
                    state = Some(s);
                    w
                }
            };
            let mut cp = state.clone().expect("state set above");
            let (child, group) = spawn(spec, name, ctx.task_id(), &params, &cp, &answers)?;
            let mark = ctx.partial_count().await;
            // Recorded before a byte of its output is read: a server killed from here on
            // leaves a group the next run or a cancel ends.
            cp.group = child.id().and_then(RecordedGroup::of);
            if cp.group.is_some() {
                ctx.checkpoint_at(&cp, mark).await?;
            }
            let mut run = Run {
                ctx,
                name,
                writer,
                state: cp,
                mark,
                run_bytes: 0,
                pending: VecDeque::new(),
                tail: Tail::default(),
                asked: false,
                answered: answers,
            };
            let status = run.supervise(child, &group).await;
            // Whatever the program left running in its group ends with the run.
            drop(group);
            let status = status?;
            // The group ended with the run: no later run or cancel has it to end.
            run.state.group = None;
            if run.asked {
                // Record the requests (with the last durable cursor and the partial results it
                // covers), then loop: parks, or restarts at once if the answers are already
                // stored — from that checkpoint, so fragments after it are written again.
                ctx.checkpoint_at(&run.state, run.mark).await?;
                ctx.rewind_partials(run.mark).await;
                state = Some(run.state);
                continue;
            }
            if !status.success() {
                let how = match status.code() {
                    Some(n) => format!("exited with status {n}"),
                    None => format!("was terminated ({status})"),
                };
                return Err(JobError::failed(format!("command {name} {how}: {}", run.tail.text())));
            }
            let handle = run.writer.finish().await?;
            return Ok(serde_json::json!({ "file": handle, "exit_code": 0 }));
        }
        Err(JobError::failed(format!("command {name} asked for input {MAX_RUNS} times in a row without finishing")))
    }
}

/// End the process group a run of task `task_id` killed with its server left running
/// ([`RecordedGroup::end`]), saying so in the log.
fn end_left_over(task_id: &str, group: &RecordedGroup) {
    match group.end(task_id) {
        Ended::Killed => {
            tracing::warn!(task = task_id, pgid = group.pgid, "ended the process group a run of this task left running when its server stopped")
        }
        Ended::Elsewhere => tracing::info!(
            task = task_id,
            pgid = group.pgid,
            "the task's last run was on another machine or boot: its process group is not this server's to end"
        ),
        Ended::NothingLeft => {}
    }
}

/// The environment variable carrying the response to input `key`.
fn input_env(key: &str) -> String {
    let mut s = String::from("FERRY_INPUT_");
    s.extend(key.chars().map(|c| if c.is_ascii_alphanumeric() { c.to_ascii_uppercase() } else { '_' }));
    s
}

/// The variables of the server's environment every program gets (and `LC_*`): what it needs to
/// find programs, its user's home, its locale, time zone and temporary directory. Anything else
/// only when the command names it in `env`.
pub const PASSED_ENV: [&str; 5] = ["PATH", "HOME", "LANG", "TZ", "TMPDIR"];

/// Whether the server's variable `name` is passed to `spec`'s program.
fn passed(spec: &CommandSpec, name: &str) -> bool {
    !name.starts_with("FERRY_INPUT_") && (PASSED_ENV.contains(&name) || name.starts_with("LC_") || spec.env.iter().any(|n| n == name))
}

fn spawn(
    spec: &CommandSpec,
    name: &str,
    task_id: &str,
    params: &str,
    cp: &CommandCheckpoint,
    answers: &BTreeMap<String, Value>,
) -> Result<(Child, Group), JobError> {
    let mut cmd = tokio::process::Command::new(&spec.program);
    // A group of its own (its id is the program's pid): cancelling kills the group.
    cmd.args(&spec.args).stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped()).kill_on_drop(true).process_group(0);
    if let Some(cwd) = &spec.cwd {
        cmd.current_dir(cwd);
    }
    cmd.env_clear();
    for (k, v) in std::env::vars_os() {
        if k.to_str().is_some_and(|k| passed(spec, k)) {
            cmd.env(k, v);
        }
    }
    cmd.env("FERRY_TASK_ID", task_id)
        .env("FERRY_PARAMS", params)
        .env("FERRY_CHECKPOINT", &cp.token)
        .env("FERRY_OFFSET", cp.cursor.offset.to_string());
    for (k, v) in answers {
        cmd.env(input_env(k), v.to_string());
    }
    let child = cmd.spawn().map_err(|e| JobError::failed(format!("command {name}: cannot start {}: {e}", spec.program.display())))?;
    let group = Group(child.id().and_then(|pid| i32::try_from(pid).ok()));
    Ok((child, group))
}

/// The process group of a running program: killed whole (SIGKILL) when cancelled, and when
/// dropped — the run is over, and nothing the program started may outlive it.
struct Group(Option<i32>);

impl Group {
    fn kill(&self) {
        if let Some(pgid) = self.0 {
            // ESRCH: nothing is left in the group.
            let _ = nix::sys::signal::killpg(nix::unistd::Pid::from_raw(pgid), nix::sys::signal::Signal::SIGKILL);
        }
    }
}

impl Drop for Group {
    fn drop(&mut self) {
        self.kill();
    }
}

/// One stderr line, decided.
#[derive(Debug, Clone, PartialEq)]
enum Line {
    Progress {
        fraction: f64,
        message: Option<String>,
    },
    Count {
        name: String,
        value: u64,
    },
    Checkpoint {
        bytes: u64,
        token: String,
    },
    Input {
        key: String,
        request: Value,
    },
    /// A partial result fragment, checked JSON text.
    Partial(String),
    Log(String),
}

/// `1*DIGIT` as u64 (no sign, no overflow): ferry-tus's one number grammar.
fn digits(s: &str) -> Option<u64> {
    ferry_tus::parse_u64_digits(s, "stderr line").ok()
}

fn is_name(s: &str) -> bool {
    !s.is_empty() && s.len() <= 64 && s.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'))
}

/// Parse one stderr line (without its newline). `Err` is a protocol error that fails the task.
fn parse_line(line: &str) -> Result<Line, String> {
    let log = || Ok(Line::Log(line.to_string()));
    let Some((word, rest)) = line.split_once(' ') else { return log() };
    match word {
        "progress" => {
            let (f, msg) = rest.split_once(' ').unwrap_or((rest, ""));
            let ok = !f.is_empty() && f.bytes().all(|b| b.is_ascii_digit() || b == b'.') && f.bytes().filter(|&b| b == b'.').count() <= 1;
            match f.parse::<f64>() {
                Ok(fraction) if ok && (0.0..=1.0).contains(&fraction) => {
                    let msg = msg.trim();
                    Ok(Line::Progress { fraction, message: (!msg.is_empty()).then(|| msg.to_string()) })
                }
                _ => log(),
            }
        }
        "count" => match rest.split_once(' ') {
            Some((name, n)) if is_name(name) => match digits(n) {
                Some(value) => Ok(Line::Count { name: name.to_string(), value }),
                None => log(),
            },
            _ => log(),
        },
        "checkpoint" => {
            let (n, token) = rest.split_once(' ').ok_or("checkpoint line needs `checkpoint <bytes> <token>`")?;
            let bytes = digits(n).ok_or_else(|| format!("checkpoint byte count '{n}' is not a number"))?;
            if token.is_empty() || token.len() > MAX_TOKEN {
                return Err(format!("checkpoint token must be 1 to {MAX_TOKEN} bytes"));
            }
            Ok(Line::Checkpoint { bytes, token: token.to_string() })
        }
        "input" => {
            let (key, json) = rest.split_once(' ').ok_or("input line needs `input <key> <json>`")?;
            if !is_name(key) {
                return Err(format!("input key '{key}' must be 1 to 64 of A-Z a-z 0-9 _ . -"));
            }
            let request = serde_json::from_str(json).map_err(|e| format!("input request for '{key}' is not JSON: {e}"))?;
            Ok(Line::Input { key: key.to_string(), request })
        }
        "partial" => {
            let value = crate::catalog::partials::check_fragment(rest).map_err(|e| format!("partial line: {e}"))?;
            Ok(Line::Partial(value.get().to_string()))
        }
        _ => log(),
    }
}

/// The last log lines of stderr.
#[derive(Debug, Default)]
struct Tail {
    lines: VecDeque<String>,
    bytes: usize,
}

impl Tail {
    fn push(&mut self, line: &str) {
        let mut end = line.len().min(TAIL_BYTES);
        while !line.is_char_boundary(end) {
            end -= 1;
        }
        self.lines.push_back(line[..end].to_string());
        self.bytes += end;
        while self.lines.len() > TAIL_LINES || self.bytes > TAIL_BYTES {
            if let Some(l) = self.lines.pop_front() {
                self.bytes -= l.len();
            }
        }
    }

    fn text(&self) -> String {
        if self.lines.is_empty() {
            return "(no stderr output)".into();
        }
        self.lines.iter().map(String::as_str).collect::<Vec<_>>().join("\n")
    }
}

/// Split complete lines (and over-long pieces) off the front of `buf`; at end-of-file the
/// remainder is a line too.
fn take_lines(buf: &mut BytesMut, eof: bool) -> Vec<String> {
    let mut out = Vec::new();
    loop {
        let raw = if let Some(i) = buf.iter().position(|&b| b == b'\n') {
            let mut l = buf.split_to(i + 1);
            l.truncate(i);
            l
        } else if buf.len() >= MAX_LINE || (eof && !buf.is_empty()) {
            buf.split_to(buf.len().min(MAX_LINE))
        } else {
            return out;
        };
        let raw = raw.strip_suffix(b"\r").unwrap_or(&raw);
        out.push(String::from_utf8_lossy(raw).into_owned());
    }
}

/// One run of the program.
struct Run<'a> {
    ctx: &'a JobContext,
    name: &'a str,
    writer: FileWriter,
    /// The last persisted checkpoint, plus inputs asked in this run.
    state: CommandCheckpoint,
    /// The partial result fragments `state`'s checkpoint covers.
    mark: u64,
    /// stdout bytes received and written in this run.
    run_bytes: u64,
    /// Declared checkpoints not yet reached by the copy: (bytes of this run, token, partial
    /// result fragments appended before the line).
    pending: VecDeque<(u64, String, u64)>,
    tail: Tail,
    /// The program asked for new input in this run.
    asked: bool,
    /// Responses given to the program in its environment.
    answered: BTreeMap<String, Value>,
}

impl Run<'_> {
    fn protocol(&self, msg: impl std::fmt::Display) -> JobError {
        JobError::failed(format!("command {}: stderr protocol: {msg}", self.name))
    }

    /// Copy stdout, interpret stderr, and wait for the program to exit.
    async fn supervise(&mut self, mut child: Child, group: &Group) -> Result<ExitStatus, JobError> {
        let mut stdout: ChildStdout = child.stdout.take().expect("stdout piped");
        let mut stderr: ChildStderr = child.stderr.take().expect("stderr piped");
        let (mut out_buf, mut err_buf) = (BytesMut::new(), BytesMut::new());
        let (mut out_eof, mut err_eof) = (false, false);
        let mut status: Option<ExitStatus> = None;
        let mut deadline: Option<Instant> = None;
        let cancel = self.ctx.cancelled().clone();
        loop {
            if out_eof && err_eof {
                if let Some(s) = status {
                    return Ok(s);
                }
            }
            out_buf.reserve(CHUNK);
            err_buf.reserve(4096);
            tokio::select! {
                biased;
                _ = cancel.cancelled() => {
                    group.kill();
                    let _ = child.start_kill();
                    let _ = child.wait().await;
                    return Err(JobError::Cancelled);
                }
                r = stderr.read_buf(&mut err_buf), if !err_eof => {
                    err_eof = r.map_err(|e| JobError::Internal(format!("reading stderr: {e}")))? == 0;
                    self.lines(&mut err_buf, err_eof).await?;
                }
                r = stdout.read_buf(&mut out_buf), if !out_eof => {
                    if r.map_err(|e| JobError::Internal(format!("reading stdout: {e}")))? == 0 {
                        out_eof = true;
                        if let Some((at, _, _)) = self.pending.front() {
                            let written = self.run_bytes;
                            return Err(self.protocol(format_args!("checkpoint at byte {at} but only {written} bytes were written to stdout")));
                        }
                        continue;
                    }
                    let chunk = out_buf.split().freeze();
                    // Control lines written before these bytes are in the stderr pipe by now:
                    // let the driver see them and read them first, so a checkpoint inside this
                    // chunk is not missed.
                    if !err_eof {
                        tokio::task::yield_now().await;
                        while let Some(r) = stderr.read_buf(&mut err_buf).now_or_never() {
                            err_eof = r.map_err(|e| JobError::Internal(format!("reading stderr: {e}")))? == 0;
                            self.lines(&mut err_buf, err_eof).await?;
                            if err_eof {
                                break;
                            }
                            err_buf.reserve(4096);
                        }
                    }
                    self.stdout(chunk).await?;
                }
                s = child.wait(), if status.is_none() => {
                    status = Some(s.map_err(|e| JobError::Internal(format!("waiting for command: {e}")))?);
                    deadline = Some(Instant::now() + DRAIN_GRACE);
                }
                _ = tokio::time::sleep_until(deadline.unwrap_or_else(Instant::now)), if deadline.is_some() => {
                    match status {
                        None => {
                            // Asked for input but did not exit.
                            group.kill();
                            let _ = child.start_kill();
                            deadline = None;
                        }
                        Some(_) if !out_eof => {
                            let name = &self.name;
                            return Err(JobError::failed(format!(
                                "command {name} exited but its stdout stayed open (a process it started still holds it)"
                            )));
                        }
                        Some(s) => return Ok(s),
                    }
                }
            }
            if self.asked && status.is_none() && deadline.is_none() {
                deadline = Some(Instant::now() + INPUT_GRACE);
            }
        }
    }

    async fn lines(&mut self, buf: &mut BytesMut, eof: bool) -> Result<(), JobError> {
        for line in take_lines(buf, eof) {
            match parse_line(&line).map_err(|e| self.protocol(e))? {
                Line::Log(l) => self.tail.push(&l),
                Line::Progress { fraction, message } => self.ctx.progress(Some(fraction), message.as_deref(), &[]).await?,
                Line::Count { name, value } => self.ctx.progress(None, None, &[(&name, value)]).await?,
                Line::Checkpoint { bytes, token } => {
                    if self.pending.back().is_some_and(|(at, _, _)| bytes < *at) {
                        return Err(self.protocol(format_args!("checkpoint byte count {bytes} is lower than an earlier one")));
                    }
                    // The checkpoint covers the fragments written before its line, whenever the
                    // copy of stdout reaches it.
                    let mark = self.ctx.partial_count().await;
                    if bytes == self.run_bytes {
                        self.checkpoint_now(token, mark).await?;
                    } else if bytes > self.run_bytes {
                        match self.pending.back_mut() {
                            Some(last) if last.0 == bytes => (last.1, last.2) = (token, mark),
                            _ => self.pending.push_back((bytes, token, mark)),
                        }
                    } else {
                        tracing::debug!(task = self.ctx.task_id(), bytes, stored = self.run_bytes, "command checkpoint seen late; skipped");
                    }
                }
                Line::Partial(value) => {
                    self.ctx.partial_json(&value).await?;
                }
                Line::Input { key, request } => {
                    if self.answered.contains_key(&key) {
                        return Err(self.protocol(format_args!("asked again for input '{key}', which was already answered")));
                    }
                    let env = input_env(&key);
                    if let Some(other) = self.state.inputs.keys().find(|k| **k != key && input_env(k) == env) {
                        return Err(self.protocol(format_args!("input keys '{other}' and '{key}' both map to {env}")));
                    }
                    self.state.inputs.insert(key, request);
                    self.asked = true;
                }
            }
        }
        Ok(())
    }

    /// Write a stdout chunk, stopping at declared checkpoints on the way.
    async fn stdout(&mut self, mut chunk: Bytes) -> Result<(), JobError> {
        while let Some(&(at, _, _)) = self.pending.front() {
            if at > self.run_bytes + chunk.len() as u64 {
                break;
            }
            let head = chunk.split_to((at - self.run_bytes) as usize);
            self.write(head).await?;
            let (_, token, mark) = self.pending.pop_front().expect("front");
            self.checkpoint_now(token, mark).await?;
        }
        self.write(chunk).await
    }

    async fn write(&mut self, data: Bytes) -> Result<(), JobError> {
        if data.is_empty() {
            return Ok(());
        }
        self.run_bytes += data.len() as u64;
        self.writer.write(data).await?;
        self.ctx.progress(None, None, &[("output_bytes", self.writer.position())]).await
    }

    async fn checkpoint_now(&mut self, token: String, mark: u64) -> Result<(), JobError> {
        self.state.cursor = self.writer.sync().await?;
        self.state.token = token;
        self.ctx.checkpoint_at(&self.state, mark).await?;
        self.mark = mark;
        Ok(())
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    #[test]
    fn control_lines() {
        assert_eq!(parse_line("progress 0.5 half way").unwrap(), Line::Progress { fraction: 0.5, message: Some("half way".into()) });
        assert_eq!(parse_line("progress 1").unwrap(), Line::Progress { fraction: 1.0, message: None });
        assert_eq!(parse_line("count rows 42").unwrap(), Line::Count { name: "rows".into(), value: 42 });
        assert_eq!(parse_line("checkpoint 1024 page=7 cursor=abc").unwrap(), Line::Checkpoint { bytes: 1024, token: "page=7 cursor=abc".into() });
        assert_eq!(
            parse_line(r#"input confirm {"message":"go?"}"#).unwrap(),
            Line::Input { key: "confirm".into(), request: serde_json::json!({"message": "go?"}) }
        );
    }

    #[test]
    fn partial_lines_carry_one_small_json_value() {
        assert_eq!(parse_line(r#"partial {"rows": 10, "last": "b"}"#).unwrap(), Line::Partial(r#"{"rows": 10, "last": "b"}"#.into()));
        assert_eq!(parse_line("partial 7").unwrap(), Line::Partial("7".into()));
        assert!(parse_line("partial rows so far").unwrap_err().contains("JSON"), "not JSON fails the task");
        assert!(parse_line("partial ").is_err());
        let big = format!("partial \"{}\"", "x".repeat(crate::catalog::partials::MAX_FRAGMENT_BYTES));
        assert!(parse_line(&big).unwrap_err().contains("at most"));
        assert_eq!(parse_line("partial").unwrap(), Line::Log("partial".into()), "the bare word is log output");
    }

    #[test]
    fn malformed_progress_and_count_are_log_lines() {
        for l in [
            "progress",
            "progress 1.5",
            "progress -0.1",
            "progress NaN",
            "progress 1e-3",
            "progress +0.5",
            "count rows",
            "count rows -1",
            "count rows +1",
            "count r/s 1",
            "hello world",
            "Progress 0.5",
            "",
        ] {
            assert_eq!(parse_line(l).unwrap(), Line::Log(l.into()), "{l}");
        }
    }

    #[test]
    fn malformed_checkpoint_and_input_are_errors() {
        for l in ["checkpoint abc", "checkpoint 12", "checkpoint +1 t", "checkpoint 1 ", "input k", "input k {", "input bad/key {}", "input  {}"] {
            assert!(parse_line(l).is_err(), "{l}");
        }
        assert!(parse_line(&format!("checkpoint 1 {}", "x".repeat(MAX_TOKEN + 1))).is_err());
        assert!(parse_line(&format!("checkpoint 1 {}", "x".repeat(MAX_TOKEN))).is_ok());
    }

    /// Of the server's environment only the allowlist, `LC_*` and what the command names in
    /// `env` reach the program; never an inherited `FERRY_INPUT_*`.
    #[test]
    fn only_allowlisted_variables_are_passed() {
        let spec = CommandSpec {
            program: "/bin/true".into(),
            args: vec![],
            output_name: None,
            media_type: None,
            cwd: None,
            env: vec!["PGPASSWORD".into()],
            description: None,
            params_schema: None,
        };
        for yes in ["PATH", "HOME", "LANG", "LC_ALL", "LC_TIME", "TZ", "TMPDIR", "PGPASSWORD"] {
            assert!(passed(&spec, yes), "{yes}");
        }
        for no in ["AWS_SECRET_ACCESS_KEY", "FERRY_CATALOG", "FERRY_INPUT_X", "PGUSER", "USER", "LD_PRELOAD", "path"] {
            assert!(!passed(&spec, no), "{no}");
        }
    }

    #[test]
    fn input_env_names() {
        assert_eq!(input_env("confirm"), "FERRY_INPUT_CONFIRM");
        assert_eq!(input_env("a.b-c_1"), "FERRY_INPUT_A_B_C_1");
    }

    #[test]
    fn lines_are_framed() {
        let mut b = BytesMut::from(&b"one\r\ntwo\npart"[..]);
        assert_eq!(take_lines(&mut b, false), vec!["one", "two"]);
        assert_eq!(&b[..], b"part");
        assert_eq!(take_lines(&mut b, true), vec!["part"]);
        let mut long = BytesMut::from(vec![b'x'; MAX_LINE + 3].as_slice());
        let l = take_lines(&mut long, false);
        assert_eq!(l.len(), 1);
        assert_eq!(long.len(), 3);
    }

    #[test]
    fn tail_keeps_last_lines_and_bytes() {
        let mut t = Tail::default();
        for i in 0..30 {
            t.push(&format!("line {i}"));
        }
        assert_eq!(t.lines.len(), TAIL_LINES);
        assert!(t.text().starts_with("line 10\n"));
        t.push(&"y".repeat(5000));
        assert!(t.bytes <= TAIL_BYTES);
        assert_eq!(t.lines.len(), 1);
    }

    #[test]
    fn validate_names_declared_commands() {
        let spec = CommandSpec {
            program: "/bin/true".into(),
            args: vec![],
            output_name: None,
            media_type: None,
            cwd: None,
            env: vec![],
            description: None,
            params_schema: None,
        };
        let job = CommandJob::new(BTreeMap::from([("export".to_string(), spec.clone()), ("dump".to_string(), spec)]));
        let raw = |s: &str| RawValue::from_string(s.to_string()).unwrap();
        assert!(job.validate(&raw(r#"{"command":"export","params":{"a":1}}"#)).is_ok());
        let e = job.validate(&raw(r#"{"command":"rm"}"#)).unwrap_err();
        assert!(e.contains("dump, export"), "{e}");
        assert!(job.validate(&raw(r#"{"command":"export","params":[1]}"#)).is_err());
        assert!(job.validate(&raw(r#"{"command":"export","cmdline":"rm -rf /"}"#)).is_err());
        assert!(CommandJob::new(BTreeMap::new()).validate(&raw(r#"{"command":"x"}"#)).unwrap_err().contains("no commands"));
    }

    #[test]
    fn params_are_checked_against_the_declared_schema() {
        let schema = serde_json::json!({ "type": "object", "required": ["month"], "additionalProperties": false,
            "properties": { "month": { "type": "string", "pattern": "^[0-9]{4}-[0-9]{2}$" } } });
        let spec = CommandSpec {
            program: "/bin/true".into(),
            args: vec![],
            output_name: None,
            media_type: None,
            cwd: None,
            env: vec![],
            description: None,
            params_schema: Some(schema),
        };
        let job = CommandJob::new(BTreeMap::from([("orders".to_string(), spec)]));
        let raw = |s: &str| RawValue::from_string(s.to_string()).unwrap();
        assert!(job.validate(&raw(r#"{"command":"orders","params":{"month":"2026-11"}}"#)).is_ok());
        let e = job.validate(&raw(r#"{"command":"orders","params":{"month":"soon","x":1}}"#)).unwrap_err();
        assert!(e.contains("params/month") && e.contains("orders") && e.contains("'x'"), "{e}");
        let e = job.validate(&raw(r#"{"command":"orders"}"#)).unwrap_err();
        assert!(e.contains("month"), "absent params are checked as {{}}: {e}");
    }

    /// An engine on a temporary directory with `job` registered.
    pub(crate) async fn engine(dir: &std::path::Path, job: std::sync::Arc<dyn Job>) -> std::sync::Arc<crate::tasks::Engine> {
        use std::sync::Arc;
        let catalog = Arc::new(crate::catalog::SqliteCatalog::open(&dir.join("ferry.db")).await.unwrap());
        let blobs = Arc::new(crate::blob::FsBlobStore::open(&dir.join("blobs"), false).unwrap());
        let uploads = crate::upload::UploadEngine::new(catalog.clone(), blobs, Default::default(), Arc::new(crate::metrics::Metrics::default()));
        let cfg = crate::tasks::TaskConfig { workers: 2, poll: Duration::from_millis(20), ..Default::default() };
        let mut e = crate::tasks::Engine::new(catalog, uploads, cfg);
        e.register(job);
        let e = Arc::new(e);
        e.spawn();
        e
    }

    /// Wait until the task leaves `working`.
    pub(crate) async fn settle(e: &crate::tasks::Engine, id: &str) -> crate::tasks::TaskRecord {
        for _ in 0..500 {
            let t = e.get("p", id).await.unwrap();
            if t.status != crate::tasks::TaskStatus::Working {
                return t;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        panic!("task {id} still working");
    }

    /// The bytes of the file in a task result.
    pub(crate) async fn file_bytes(e: &crate::tasks::Engine, result: &str) -> Vec<u8> {
        use futures::TryStreamExt;
        let v: Value = serde_json::from_str(result).unwrap();
        let rec = e.uploads().get("p", v["file"]["id"].as_str().unwrap()).await.unwrap();
        let size = v["file"]["size"].as_u64().unwrap();
        let chunks: Vec<Bytes> = e.uploads().read(&rec, 0..size).await.unwrap().try_collect().await.unwrap();
        chunks.concat()
    }

    fn script(dir: &std::path::Path, body: &str) -> CommandSpec {
        use std::os::unix::fs::PermissionsExt;
        let path = dir.join("prog.sh");
        std::fs::write(&path, format!("#!/bin/sh\n{body}")).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
        CommandSpec {
            program: path,
            args: vec![],
            output_name: None,
            media_type: Some("text/plain".into()),
            cwd: None,
            env: vec![],
            description: None,
            params_schema: None,
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn checkpoint_input_and_resume() {
        let dir = tempfile::tempdir().unwrap();
        let spec = script(
            dir.path(),
            r#"
if [ -z "$FERRY_INPUT_GO" ]; then
  printf 'part1\n'
  echo "checkpoint 6 one" >&2
  printf 'junk\n'
  echo "count rows 3" >&2
  echo 'input go {"message":"continue?"}' >&2
  exit 3
fi
[ "$FERRY_CHECKPOINT" = one ] && [ "$FERRY_OFFSET" = 6 ] || { echo "bad resume '$FERRY_CHECKPOINT' $FERRY_OFFSET" >&2; exit 1; }
echo "progress 0.5 second half" >&2
printf 'part2 %s %s\n' "$FERRY_INPUT_GO" "$FERRY_PARAMS"
"#,
        );
        let e = engine(dir.path(), std::sync::Arc::new(CommandJob::new(BTreeMap::from([("prog".to_string(), spec)])))).await;
        let t = e.start("p", "command", r#"{"command":"prog","params":{"a":1}}"#, None, None).await.unwrap().task;
        let t = settle(&e, &t.id).await;
        assert_eq!(t.status, crate::tasks::TaskStatus::InputRequired, "{t:?}");
        assert!(t.input_requests.contains("continue?"), "{}", t.input_requests);
        let (ok, _) = e.respond("p", &t.id, "go", "true").await.unwrap();
        assert!(ok);
        let t = settle(&e, &t.id).await;
        assert_eq!(t.status, crate::tasks::TaskStatus::Completed, "{t:?}");
        let result = t.result.unwrap();
        assert!(result.contains(r#""exit_code":0"#), "{result}");
        assert_eq!(file_bytes(&e, &result).await, b"part1\npart2 true {\"a\":1}\n");
        e.shutdown();
    }

    /// Fragments written after the last checkpoint, before an input request, are written again
    /// by the run after the answer (it starts from that checkpoint): stored once.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn partial_results_after_the_last_checkpoint_are_not_stored_twice_after_input() {
        let dir = tempfile::tempdir().unwrap();
        let spec = script(
            dir.path(),
            r#"
if [ -z "$FERRY_INPUT_GO" ]; then
  printf 'a\n'
  echo 'partial {"n":1}' >&2
  echo "checkpoint 2 one" >&2
  echo 'partial {"n":2}' >&2
  echo 'input go {"message":"go?"}' >&2
  exit 0
fi
echo 'partial {"n":2}' >&2
echo 'partial {"n":3}' >&2
printf 'b\n'
"#,
        );
        let e = engine(dir.path(), std::sync::Arc::new(CommandJob::new(BTreeMap::from([("prog".to_string(), spec)])))).await;
        let t = e.start("p", "command", r#"{"command":"prog"}"#, None, None).await.unwrap().task;
        let t = settle(&e, &t.id).await;
        assert_eq!(t.status, crate::tasks::TaskStatus::InputRequired, "{t:?}");
        assert_eq!((t.partial_seq, t.partial_mark), (2, 1), "the input checkpoint covers only the fragment before the byte checkpoint");
        e.respond("p", &t.id, "go", "true").await.unwrap();
        let t = settle(&e, &t.id).await;
        assert_eq!(t.status, crate::tasks::TaskStatus::Completed, "{t:?}");
        let page = e.partials(&t, 0).await.unwrap();
        let got: Vec<(u64, &str)> = page.fragments.iter().map(|f| (f.seq, f.value.get())).collect();
        assert_eq!(got, vec![(1, r#"{"n":1}"#), (2, r#"{"n":2}"#), (3, r#"{"n":3}"#)]);
        assert_eq!(file_bytes(&e, t.result.as_deref().unwrap()).await, b"a\nb\n");
        e.shutdown();
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn failure_carries_the_stderr_tail() {
        let dir = tempfile::tempdir().unwrap();
        let spec = script(dir.path(), "echo 'progress 0.1' >&2\necho 'disk full' >&2\nexit 7\n");
        let e = engine(dir.path(), std::sync::Arc::new(CommandJob::new(BTreeMap::from([("prog".to_string(), spec)])))).await;
        let t = e.start("p", "command", r#"{"command":"prog"}"#, None, None).await.unwrap().task;
        let t = settle(&e, &t.id).await;
        assert_eq!(t.status, crate::tasks::TaskStatus::Failed);
        let err = t.error.unwrap();
        assert!(err.contains("command prog exited with status 7: disk full"), "{err}");
        e.shutdown();
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn large_output_with_many_checkpoints() {
        let dir = tempfile::tempdir().unwrap();
        // 200 blocks of 4 KiB, a checkpoint after each; stdout and stderr both busy.
        let spec = script(
            dir.path(),
            "i=0\nwhile [ $i -lt 200 ]; do i=$((i+1)); head -c 4096 /dev/zero; echo \"checkpoint $((i*4096)) b$i\" >&2; echo \"log $i\" >&2; done\n",
        );
        let e = engine(dir.path(), std::sync::Arc::new(CommandJob::new(BTreeMap::from([("prog".to_string(), spec)])))).await;
        let t = e.start("p", "command", r#"{"command":"prog"}"#, None, None).await.unwrap().task;
        let t = settle(&e, &t.id).await;
        assert_eq!(t.status, crate::tasks::TaskStatus::Completed, "{t:?}");
        assert_eq!(file_bytes(&e, &t.result.unwrap()).await.len(), 200 * 4096);
        let cp: CommandCheckpoint = serde_json::from_str(t.checkpoint.as_deref().unwrap()).unwrap();
        assert_eq!(cp.token, "b200");
        assert_eq!(cp.cursor.offset, 200 * 4096);
        e.shutdown();
    }
}
