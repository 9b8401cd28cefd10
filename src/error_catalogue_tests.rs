//! The error catalogue tells one truth (issue 23, kind 15): a refusal whose recovery hint
//! says to repeat the request — retry, wait, resume, send HEAD then resume — has a code that
//! is `retryable`, and a code that is not retryable never comes with such a hint. Walks every
//! `TusError::new(…)` and `TusError::bad_request(…)` of both crates' sources (the hints are
//! literals there), and every hint the MCP facade gives (`mcp::schema_tests`).

use ferry_tus::ErrorCode;

/// Whether `hint` tells the client to repeat the same request: its first instruction (the
/// first clause, split at `.`, `;`, `:` and `,`, that begins with a verb) is a retrying one —
/// retry, wait, resume, send HEAD — rather than a repair (delete, fix, use a new key, …).
pub(crate) fn says_retry(hint: &str) -> bool {
    const RETRY: [&str; 10] = ["retry", "try again", "send head", "resume", "re-send", "resend", "wait", "ask again", "call again", "repeat"];
    const REPAIR: [&str; 25] = [
        "add", "delete", "finish", "fix", "use", "change", "ask", "upload", "begin", "create", "split", "check", "read", "start", "send", "pass", "omit", "encode", "call", "list",
        "tell", "request", "look", "make", "remove",
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

#[test]
fn a_hint_that_says_retry_has_a_retryable_code() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = Vec::new();
    sources(&root.join("src"), &mut files);
    sources(&root.join("tus/src"), &mut files);
    let (mut seen, mut wrong) = (0, Vec::new());
    for f in &files {
        let src = std::fs::read_to_string(f).unwrap();
        for (pat, fixed) in [("TusError::new(", None), ("TusError::bad_request(", Some(ErrorCode::InvalidArgument))] {
            for (at, _) in src.match_indices(pat) {
                let args = call_args(&src, at + pat.len() - 1);
                let (code, hint) = match fixed {
                    Some(c) => (Some(c), args.get(1)),
                    None => (args.get(1).and_then(|a| a.rsplit("ErrorCode::").next()).and_then(code_named), args.get(3)),
                };
                let (Some(code), Some(hint)) = (code, hint.and_then(|h| literal(h))) else { continue };
                seen += 1;
                if says_retry(&hint) && !code.retryable() {
                    let line = src[..at].lines().count();
                    wrong.push(format!("{}:{line}: {} is not retryable, but its hint says retry: {hint:?}", f.strip_prefix(root).unwrap().display(), code.as_str()));
                }
            }
        }
    }
    assert!(seen > 80, "the walk found only {seen} refusals");
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

#[test]
fn says_retry_reads_clauses() {
    assert!(says_retry("Send HEAD to learn the offset, then resume from it."));
    assert!(says_retry("Another writer holds it; wait a few seconds and call again."));
    assert!(!says_retry("Use a new Idempotency-Key for different arguments."));
    assert!(!says_retry("Delete files you no longer need (or ask for a larger quota), then resume from offset 7."));
    assert!(!says_retry("Use a new Idempotency-Key for a different upload, or resend the original request unchanged."));
}
