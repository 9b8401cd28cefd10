//! The error catalogue tells one truth (issue 23, kind 15): a refusal whose recovery hint
//! says to repeat the request — retry, wait, resume, send HEAD then resume — has a code that
//! is `retryable`, and a code that is not retryable never comes with such a hint. Walks every
//! `TusError::new(…)`, `Refusal::new(…)` and the `bad_request(…)` of both crates' sources
//! whose hints are literals, every context an engine gives as `http::hints` words it, and
//! every hint the MCP facade gives (`mcp::schema_tests`). Engines speak no transport's words.

use crate::error::ErrorCode;

/// Whether `hint` tells the client to repeat the same request: its first instruction (the
/// first clause, split at `.`, `;`, `:` and `,`, that begins with a verb) is a retrying one —
/// retry, wait, resume, send HEAD — rather than a repair (delete, fix, use a new key, …).
pub(crate) fn says_retry(hint: &str) -> bool {
    const RETRY: [&str; 10] = ["retry", "try again", "send head", "resume", "re-send", "resend", "wait", "ask again", "call again", "repeat"];
    const REPAIR: [&str; 25] = [
        "add", "delete", "finish", "fix", "use", "change", "ask", "upload", "begin", "create", "split", "check", "read", "start", "send", "pass",
        "omit", "encode", "call", "list", "tell", "request", "look", "make", "remove",
    ];
    for c in hint.split(['.', ';', ':', ',', '(']).map(|c| c.trim().to_ascii_lowercase()) {
        let c = c.strip_prefix("then ").or_else(|| c.strip_prefix("and ")).or_else(|| c.strip_prefix("or ")).unwrap_or(&c);
        if RETRY.iter().any(|r| c.starts_with(r)) {
            return true;
        }
        if REPAIR.iter().any(|r| c.starts_with(r)) {
            return false;
        }
    }
    false
}

/// The top-level arguments of the call whose `(` is at `open`, as source text.
fn call_args(src: &str, open: usize) -> Vec<String> {
    let (mut depth, mut args, mut cur, mut in_str, mut esc) = (0i32, Vec::new(), String::new(), false, false);
    for ch in src[open..].chars() {
        if in_str {
            cur.push(ch);
            match (esc, ch) {
                (true, _) => esc = false,
                (false, '\\') => esc = true,
                (false, '"') => in_str = false,
                _ => {}
            }
            continue;
        }
        match ch {
            '"' => {
                in_str = true;
                cur.push(ch);
            }
            '(' | '[' | '{' => {
                depth += 1;
                if depth > 1 {
                    cur.push(ch);
                }
            }
            ')' | ']' | '}' => {
                depth -= 1;
                if depth == 0 {
                    args.push(cur.trim().to_string());
                    return args;
                }
                cur.push(ch);
            }
            ',' if depth == 1 => args.push(std::mem::take(&mut cur).trim().to_string()),
            _ => cur.push(ch),
        }
    }
    args
}

/// The first string literal of an argument (`"…"` or `format!("…", …)`), if any.
fn literal(arg: &str) -> Option<String> {
    let start = arg.find('"')? + 1;
    let mut out = String::new();
    let mut esc = false;
    for ch in arg[start..].chars() {
        match (esc, ch) {
            (true, c) => {
                out.push(c);
                esc = false
            }
            (false, '\\') => esc = true,
            (false, '"') => return Some(out),
            (false, c) => out.push(c),
        }
    }
    None
}

fn code_named(name: &str) -> Option<ErrorCode> {
    ErrorCode::ALL.into_iter().find(|c| format!("{c:?}") == name)
}

fn sources(dir: &std::path::Path, out: &mut Vec<std::path::PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        let p = e.path();
        if p.is_dir() {
            sources(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// Every refusal built in `files` with a literal hint, or with a context: (file, line, code,
/// hint), the hint being the source text `Next::…` for a context. The hint of ferry's
/// [`crate::error::Refusal`] is its `next` when that is words ([`crate::error::Next::Say`]).
fn literal_refusals(root: &std::path::Path, files: &[std::path::PathBuf]) -> Vec<(String, usize, ErrorCode, String)> {
    let mut out = Vec::new();
    for f in files {
        let src = std::fs::read_to_string(f).unwrap();
        let calls = [
            ("TusError::new(", None),
            ("TusError::bad_request(", Some(ErrorCode::InvalidArgument)),
            ("Refusal::new(", None),
            ("Refusal::bad_request(", Some(ErrorCode::InvalidArgument)),
        ];
        for (pat, fixed) in calls {
            for (at, _) in src.match_indices(pat) {
                let args = call_args(&src, at + pat.len() - 1);
                let (code, hint) = match fixed {
                    Some(c) => (Some(c), args.get(1)),
                    None => (args.get(1).and_then(|a| a.rsplit("ErrorCode::").next()).and_then(code_named), args.get(3)),
                };
                let Some(hint) = hint else { continue };
                let hint = match hint.trim_start().strip_prefix("crate::error::").unwrap_or(hint.trim_start()) {
                    h if h.starts_with("Next::") => Some(h.to_string()),
                    _ => literal(hint),
                };
                let (Some(code), Some(hint)) = (code, hint) else { continue };
                out.push((f.strip_prefix(root).unwrap().display().to_string(), src[..at].lines().count(), code, hint));
            }
        }
    }
    out
}

#[test]
fn a_hint_that_says_retry_has_a_retryable_code() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = Vec::new();
    sources(&root.join("src"), &mut files);
    sources(&root.join("tus/src"), &mut files);
    let contexts = crate::error::tests_support::contexts();
    let (mut seen, mut wrong) = (0, Vec::new());
    for (f, line, code, hint) in literal_refusals(root, &files) {
        // A context is checked as HTTP words it (MCP words every non-retryable code by code,
        // checked in `mcp::schema_tests`), with each sample of its variant.
        let worded: Vec<String> = match hint.strip_prefix("Next::") {
            Some(src) => {
                let variant = &src[..src.find(|c: char| !c.is_ascii_alphanumeric()).unwrap_or(src.len())];
                let samples: Vec<String> = contexts
                    .iter()
                    .filter(|n| format!("{n:?}").split(|c: char| !c.is_ascii_alphanumeric()).next() == Some(variant))
                    .map(|n| crate::http::hints::hint(&crate::error::Refusal::new(code.status(), code, "d", n.clone()).with_cursor(7)))
                    .collect();
                assert!(!samples.is_empty(), "{f}:{line}: Next::{variant} has no sample in error::tests_support::contexts");
                samples
            }
            None => vec![hint],
        };
        seen += 1;
        for hint in worded.iter().filter(|h| says_retry(h) && !code.retryable()) {
            wrong.push(format!("{f}:{line}: {} is not retryable, but its hint says retry: {hint:?}", code.as_str()));
        }
    }
    assert!(seen > 80, "the walk found only {seen} refusals");
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

/// Engines (upload, tasks, events and the stores) give a code and the context of the next
/// step, never a transport's words: a literal hint there names no HTTP method, header, REST
/// path or MCP tool (issue 25 item 2). Their HTTP words live in `http::hints`, their MCP
/// words in `mcp`.
#[test]
fn engines_speak_no_transport() {
    const TRANSPORT: [&str; 16] = [
        "HEAD",
        "GET ",
        "POST",
        "PATCH",
        "PUT ",
        "DELETE ",
        "/api/",
        "header",
        "Header",
        "Trailer",
        "Upload-",
        "Idempotency-Key",
        "Retry-After",
        "file_",
        "task_",
        "(MCP)",
    ];
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = Vec::new();
    for layer in ["upload", "tasks", "events", "catalog", "blob"] {
        sources(&root.join("src").join(layer), &mut files);
    }
    let found = literal_refusals(root, &files);
    assert!(found.len() > 20, "the walk found only {} engine refusals", found.len());
    let wrong: Vec<String> = found
        .iter()
        .filter(|(_, _, _, hint)| !hint.starts_with("Next::"))
        .filter_map(|(f, line, _, hint)| TRANSPORT.iter().find(|w| hint.contains(**w)).map(|w| format!("{f}:{line}: {w:?} in {hint:?}")))
        .collect();
    assert!(wrong.is_empty(), "engine hints in a transport's words (give a crate::error::Next instead):\n{}", wrong.join("\n"));
}

#[test]
fn says_retry_reads_clauses() {
    assert!(says_retry("Send HEAD to learn the offset, then resume from it."));
    assert!(says_retry("Another writer holds it; wait a few seconds and call again."));
    assert!(!says_retry("Use a new Idempotency-Key for different arguments."));
    assert!(!says_retry("Delete files you no longer need (or ask for a larger quota), then resume from offset 7."));
    assert!(!says_retry("Use a new Idempotency-Key for a different upload, or resend the original request unchanged."));
}
