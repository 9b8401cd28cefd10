//! The layers of DESIGN §1, checked on the source tree: a module that imports across a
//! forbidden arrow fails this test with the file and the path it names.
//!
//! Arrows point down only: `http` and `mcp` are siblings over `app` (neither imports the
//! other); `app` → `tasks` → `upload` → `catalog`, `blob`; `catalog` and `blob` know no callers;
//! `ferry-tus` (tus/) depends on nothing of ferry's. The transports (`http`, `mcp`, `app`) never
//! touch files or SQL themselves.
//!
//! Settings belong to the engines: each defines its own settings types (`tasks::settings`,
//! `events::settings`, `app::CorsConfig`, `app::principal::TokenEntry`, `upload::Limits`,
//! `blob::s3::S3Settings`, `exhaustion::Reserve`), and `config` only reads ferry.toml < env <
//! flags and maps them onto those types. So `config` sits on top, and only the composition root
//! may import it ([`CONFIG_READERS`]): `serve` (builds every engine from a `Config`),
//! `check_command` (`ferry check` opens the stores a server is configured with) and
//! `token_command` (`ferry token` edits the server's configuration file), plus `main.rs` and
//! `lib.rs`, which are not modules of any layer. Every other module naming `crate::config` fails.
//! Durations and sizes as people read them live in the leaf `units`, which names no module of ours.
//!
//! The upload engine knows no transport ([`TRANSPORT_FREE`]): it names none of the HTTP
//! crates (`http`, `http_body`, `axum`, `hyper`…); each transport adapts what it received into
//! an `upload::ChunkStream`.
//!
//! An import is any path the code names — `use crate::x`, `crate::{x, y}`, `crate::x::f()` in an
//! expression, or `super::super::x` climbing out of a module — with comments removed first.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

/// (layer, top-level modules it must never name).
const FORBIDDEN: &[(&str, &[&str])] = &[
    ("http", &["mcp", "cli"]),
    ("mcp", &["http", "cli"]),
    ("app", &["http", "mcp", "cli", "serve"]),
    ("tasks", &["http", "mcp", "app", "cli", "serve"]),
    ("events", &["tasks", "http", "mcp", "app", "cli", "serve"]),
    ("upload", &["tasks", "http", "mcp", "app", "cli", "serve"]),
    ("catalog", &["upload", "tasks", "http", "mcp", "app", "cli", "serve", "blob", "events"]),
    ("blob", &["upload", "tasks", "http", "mcp", "app", "cli", "serve", "catalog", "events"]),
    ("cli", &["http", "mcp", "app", "serve", "tasks", "upload", "catalog", "blob"]),
];

/// The composition root: the only top-level modules that may name `crate::config` (besides
/// `config` itself). `main.rs` and `lib.rs` belong to no layer and are not checked.
const CONFIG_READERS: &[&str] = &["config", "serve", "check_command", "token_command"];

/// Leaf modules: they name no module of the crate at all (each defines one concept every layer
/// may use: sizes and durations, the clock, the backoff schedule, the error catalogue, framed
/// blob states, the zip format's records).
const LEAVES: &[&str] = &["units", "clock", "retry", "error", "framed", "zip_layout"];

/// Engines that know no transport (issue 25 item 3): the upload engine takes a chunk's bytes
/// and its checksum (`upload::ChunkStream`), never an HTTP body or header, so TUS, the draft,
/// MCP and tasks feed it the same way. These crates are the HTTP stack: naming any of them
/// (`use http_body_util::BodyExt`, `http::HeaderValue`, `B: http_body::Body`, `axum::…`) in
/// one of these layers fails.
const TRANSPORT_FREE: &[&str] = &["upload"];
const TRANSPORT_CRATES: &[&str] = &["http", "http_body", "http_body_util", "axum", "hyper", "tower_http"];

/// Layers that must not do file or SQL I/O themselves (text that would mean they do).
const NO_STORAGE: &[&str] = &["http", "mcp", "app"];
const STORAGE_PATHS: &[&str] = &["sqlx::", "std::fs", "tokio::fs", "rusqlite"];

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap_or_else(|e| panic!("reading {}: {e}", dir.display())) {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The module path of a file under `src/`: `src/http/tus.rs` → `[http, tus]`,
/// `src/http/mod.rs` → `[http]`, `src/serve.rs` → `[serve]`.
fn module_path(rel: &Path) -> Vec<String> {
    let mut parts: Vec<String> = rel.iter().map(|p| p.to_string_lossy().into_owned()).collect();
    let last = parts.pop().expect("a file name");
    let stem = last.trim_end_matches(".rs");
    if stem != "mod" && stem != "lib" && stem != "main" {
        parts.push(stem.to_string());
    }
    parts
}

/// Source without `//` and `/* */` comments, string literals emptied (text such as
/// "see crate::http" is not an import).
fn strip_comments(src: &str) -> String {
    strip(src, false)
}

/// Source without `//` and `/* */` comments; string literals kept when `keep_strings`.
fn strip(src: &str, keep_strings: bool) -> String {
    let mut out = String::with_capacity(src.len());
    let mut rest = src;
    while !rest.is_empty() {
        if let Some(r) = rest.strip_prefix("//") {
            rest = r.find('\n').map(|i| &r[i..]).unwrap_or("");
        } else if let Some(r) = rest.strip_prefix("/*") {
            rest = r.find("*/").map(|i| &r[i + 2..]).unwrap_or("");
        } else if rest.starts_with('"') {
            // Skip string literals: text such as "see crate::http" is not an import.
            let mut end = 1;
            let b = rest.as_bytes();
            while end < b.len() && b[end] != b'"' {
                end += if b[end] == b'\\' { 2 } else { 1 };
            }
            out.push_str(if keep_strings { rest.get(..end + 1).unwrap_or(rest) } else { "\"\"" });
            rest = rest.get(end + 1..).unwrap_or("");
        } else {
            let c = rest.chars().next().unwrap();
            out.push(c);
            rest = &rest[c.len_utf8()..];
        }
    }
    out
}

fn ident_at(s: &str) -> &str {
    let end = s.find(|c: char| !(c.is_ascii_alphanumeric() || c == '_')).unwrap_or(s.len());
    &s[..end]
}

/// Top-level modules of the crate that the code of module `module` names.
fn imported_modules(module: &[String], src: &str) -> BTreeSet<String> {
    let code = strip_comments(src);
    let mut found = BTreeSet::new();
    let bytes = code.as_bytes();
    for (i, _) in code.match_indices("crate::") {
        // Not part of a longer identifier such as `ferry_crate::`.
        if i > 0 && (bytes[i - 1].is_ascii_alphanumeric() || bytes[i - 1] == b'_') {
            continue;
        }
        let after = code[i + "crate::".len()..].trim_start();
        if let Some(group) = after.strip_prefix('{') {
            let body = &group[..group.find('}').unwrap_or(group.len())];
            for item in body.split(',') {
                let id = ident_at(item.trim());
                if !id.is_empty() {
                    found.insert(id.to_string());
                }
            }
        } else {
            let id = ident_at(after);
            if !id.is_empty() {
                found.insert(id.to_string());
            }
        }
    }
    // `super::` chains resolved against this module's path.
    for (i, _) in code.match_indices("super::") {
        if i > 0 && (bytes[i - 1].is_ascii_alphanumeric() || bytes[i - 1] == b'_' || bytes[i - 1] == b':') {
            continue;
        }
        let mut rest = &code[i..];
        let mut path: Vec<String> = module.to_vec();
        while let Some(r) = rest.strip_prefix("super::") {
            path.pop();
            rest = r;
        }
        if path.is_empty() {
            let id = ident_at(rest);
            if !id.is_empty() {
                found.insert(id.to_string());
            }
        }
    }
    found
}

/// The external crates of `crates` that `src` names as a path's first segment: `name::…`,
/// `::name::…`, `use name;`, `use name as …`, `extern crate name`. A segment further along a
/// path (`crate::http::…`, `tower_http::…` for `http`), an identifier of that name (`let http
/// = …`), comments and strings are not.
fn external_crates_named(src: &str, crates: &[&str]) -> BTreeSet<String> {
    let code = strip_comments(src);
    let bytes = code.as_bytes();
    let is_ident = |b: u8| b.is_ascii_alphanumeric() || b == b'_';
    let mut found = BTreeSet::new();
    for name in crates {
        for (i, _) in code.match_indices(name) {
            let end = i + name.len();
            if end < bytes.len() && is_ident(bytes[end]) || i > 0 && is_ident(bytes[i - 1]) {
                continue;
            }
            let before = code[..i].trim_end();
            // `a::name`: a later segment of another path (a leading `::name` is the crate).
            if let Some(b) = before.strip_suffix("::") {
                let b = b.trim_end();
                let word = &b[b.rfind(|c: char| !(c.is_ascii_alphanumeric() || c == '_')).map_or(0, |j| j + 1)..];
                if !word.is_empty() && !KEYWORDS_BEFORE_A_PATH.contains(&word) {
                    continue;
                }
            }
            let after = code[end..].trim_start();
            let used = before.ends_with("use") && (after.starts_with(';') || after.starts_with("as ")) || before.ends_with("extern crate");
            if after.starts_with("::") || used {
                found.insert(name.to_string());
            }
        }
    }
    found
}

/// Keywords after which `::name` starts an absolute path (`use ::http::X`, `dyn ::hyper::Y`).
const KEYWORDS_BEFORE_A_PATH: &[&str] = &["use", "dyn", "impl", "mut", "return", "in", "as", "for", "where"];

/// Every forbidden import in the tree under `src/` given as (relative path, source) pairs.
fn violations(files: &[(PathBuf, String)]) -> Vec<String> {
    let mut out = Vec::new();
    for (rel, src) in files {
        let module = module_path(rel);
        let Some(top) = module.first() else { continue };
        let names = imported_modules(&module, src);
        if let Some((_, banned)) = FORBIDDEN.iter().find(|(layer, _)| layer == top) {
            for b in banned.iter().filter(|b| names.contains(**b)) {
                out.push(format!("src/{}: the {top} layer imports crate::{b}", rel.display()));
            }
        }
        if !CONFIG_READERS.contains(&top.as_str()) && names.contains("config") {
            out.push(format!(
                "src/{}: the {top} module imports crate::config; settings belong to the \
                 engines and only the composition root ({}) reads the configuration",
                rel.display(),
                CONFIG_READERS.join(", ")
            ));
        }
        if LEAVES.contains(&top.as_str()) {
            for n in &names {
                out.push(format!("src/{}: the leaf {top} imports crate::{n}", rel.display()));
            }
        }
        if TRANSPORT_FREE.contains(&top.as_str()) {
            for c in external_crates_named(src, TRANSPORT_CRATES) {
                out.push(format!(
                    "src/{}: the {top} engine names the HTTP crate {c}; it takes bytes (upload::ChunkStream), and the transport adapts its body",
                    rel.display()
                ));
            }
        }
        if NO_STORAGE.contains(&top.as_str()) {
            let code = strip_comments(src);
            for p in STORAGE_PATHS.iter().filter(|p| code.contains(**p)) {
                out.push(format!("src/{}: the {top} layer touches storage directly ({p})", rel.display()));
            }
        }
    }
    out
}

fn source_tree() -> Vec<(PathBuf, String)> {
    let src = root().join("src");
    let mut paths = Vec::new();
    rust_files(&src, &mut paths);
    paths.sort();
    paths.into_iter().map(|p| (p.strip_prefix(&src).unwrap().to_path_buf(), std::fs::read_to_string(&p).unwrap())).collect()
}

#[test]
fn no_module_imports_across_the_layers_design_forbids() {
    let files = source_tree();
    assert!(files.iter().any(|(p, _)| p.starts_with("mcp")) && files.iter().any(|(p, _)| p.starts_with("http")), "the source tree was found");
    let v = violations(&files);
    assert!(v.is_empty(), "DESIGN §1 layer violations:\n{}", v.join("\n"));
}

/// The real tree with one engine → `config` import planted in each engine's file that used to
/// have one: each is reported, by file, and nothing else is.
#[test]
fn an_engine_importing_config_in_the_real_tree_is_caught() {
    let clean = source_tree();
    let planted =
        ["events/webhooks.rs", "events/hooks.rs", "blob/s3/mod.rs", "upload/exhausted.rs", "tasks/kinds/mod.rs", "app/principal.rs", "http/mod.rs"];
    for target in planted {
        let mut files = clean.clone();
        let (_, src) = files.iter_mut().find(|(p, _)| p == Path::new(target)).unwrap_or_else(|| panic!("src/{target} is in the tree"));
        src.push_str("\nfn planted() -> String { crate::config::human_duration(std::time::Duration::ZERO) }\n");
        let v = violations(&files);
        assert_eq!(v.len(), 1, "{target}: {v:?}");
        assert!(v[0].starts_with(&format!("src/{target}: ")) && v[0].contains("imports crate::config"), "{}", v[0]);
    }
}

/// The real tree with the HTTP stack planted back into the upload engine, in each form it
/// used to take there (a body type bound, a trailer's header value, the body extension
/// trait) and in others: each is reported, by file, and nothing else is.
#[test]
fn the_upload_engine_naming_http_in_the_real_tree_is_caught() {
    let clean = source_tree();
    assert!(violations(&clean).iter().all(|v| !v.contains("HTTP crate")), "the real tree is clean");
    let plants = [
        ("upload/append.rs", "\nfn planted<B: http_body::Body>(_: B) {}\n", "http_body"),
        ("upload/append.rs", "\nfn planted(v: &http::HeaderValue) -> bool { v.is_empty() }\n", "http"),
        ("upload/exhausted.rs", "\nuse http_body_util::BodyExt;\n", "http_body_util"),
        ("upload/mod.rs", "\nfn planted(_: axum::body::Body) {}\n", "axum"),
        ("upload/chunk.rs", "\nuse ::hyper::body::Incoming;\n", "hyper"),
        ("upload/files.rs", "\nuse http;\n", "http"),
    ];
    for (target, plant, name) in plants {
        let mut files = clean.clone();
        let (_, src) = files.iter_mut().find(|(p, _)| p == Path::new(target)).unwrap_or_else(|| panic!("src/{target} is in the tree"));
        src.push_str(plant);
        let v = violations(&files);
        assert_eq!(v.len(), 1, "{target} {plant:?}: {v:?}");
        assert!(v[0].starts_with(&format!("src/{target}: ")) && v[0].contains(&format!("HTTP crate {name};")), "{}", v[0]);
    }
    // The same text in the transport is no violation.
    let mut files = clean.clone();
    let (_, src) = files.iter_mut().find(|(p, _)| p == Path::new("http/tus.rs")).expect("src/http/tus.rs");
    src.push_str("\nuse http_body_util::BodyExt;\n");
    assert!(violations(&files).is_empty());
}

/// No two folders of `src/` import each other through `config`: nothing `config` imports
/// imports it back.
#[test]
fn config_is_on_no_import_cycle() {
    let files = source_tree();
    let tops_naming = |name: &str| -> BTreeSet<String> {
        files
            .iter()
            .filter(|(rel, src)| imported_modules(&module_path(rel), src).contains(name))
            .filter_map(|(rel, _)| module_path(rel).first().cloned())
            .filter(|t| t != name)
            .collect()
    };
    let config_imports: BTreeSet<String> = files
        .iter()
        .filter(|(rel, _)| rel.starts_with("config"))
        .flat_map(|(rel, src)| imported_modules(&module_path(rel), src))
        .filter(|m| m != "config")
        .collect();
    assert!(config_imports.contains("tasks") && config_imports.contains("events"), "config maps onto the engines' types: {config_imports:?}");
    let back: Vec<String> = tops_naming("config").intersection(&config_imports).cloned().collect();
    assert!(back.is_empty(), "config and these import each other: {back:?}");
}

/// Test-only top-level modules (`#[cfg(test)]` in lib.rs): checks that look at several layers
/// at once; they are in no layer and on no cycle of the built crate.
const TEST_ONLY: &[&str] = &["error_catalogue_tests"];

/// Which top-level modules each top-level module of `src/` names (itself and [`TEST_ONLY`] left out).
fn top_level_imports(files: &[(PathBuf, String)]) -> std::collections::BTreeMap<String, BTreeSet<String>> {
    let mut graph: std::collections::BTreeMap<String, BTreeSet<String>> = Default::default();
    for (rel, src) in files {
        let module = module_path(rel);
        let Some(top) = module.first().cloned() else { continue };
        if top == "main" || top == "lib" || TEST_ONLY.contains(&top.as_str()) {
            continue;
        }
        let names = imported_modules(&module, src);
        graph.entry(top.clone()).or_default().extend(names.into_iter().filter(|n| *n != top && !TEST_ONLY.contains(&n.as_str())));
    }
    graph
}

/// Top-level modules that reach each other through imports (a cycle of any length), sorted.
fn import_cycles(graph: &std::collections::BTreeMap<String, BTreeSet<String>>) -> Vec<(String, String)> {
    let reach = |from: &str| -> BTreeSet<String> {
        let mut seen = BTreeSet::new();
        let mut todo = vec![from.to_string()];
        while let Some(m) = todo.pop() {
            for n in graph.get(&m).into_iter().flatten() {
                if seen.insert(n.clone()) {
                    todo.push(n.clone());
                }
            }
        }
        seen
    };
    let mut out = Vec::new();
    for a in graph.keys() {
        for b in reach(a) {
            if a < &b && reach(&b).contains(a) {
                out.push((a.clone(), b));
            }
        }
    }
    out
}

#[test]
fn no_two_folders_of_src_import_each_other() {
    let cycles = import_cycles(&top_level_imports(&source_tree()));
    assert!(cycles.is_empty(), "top-level modules that import each other (directly or around a cycle): {cycles:?}");
}

#[test]
fn the_cycle_checker_catches_a_cycle_around_three_modules() {
    let files: Vec<(PathBuf, String)> = vec![
        (PathBuf::from("upload/mod.rs"), "use crate::catalog::Catalog;".into()),
        (PathBuf::from("catalog/mod.rs"), "fn f() { crate::blob::g() }".into()),
        (PathBuf::from("blob/mod.rs"), "use crate::upload::UploadEngine;".into()),
        (PathBuf::from("http/mod.rs"), "use crate::upload::UploadEngine;".into()),
    ];
    let cycles = import_cycles(&top_level_imports(&files));
    let pairs: Vec<(&str, &str)> = cycles.iter().map(|(a, b)| (a.as_str(), b.as_str())).collect();
    assert_eq!(pairs, vec![("blob", "catalog"), ("blob", "upload"), ("catalog", "upload")]);
}

#[test]
fn ferry_tus_depends_on_nothing_of_ferry() {
    let manifest = std::fs::read_to_string(root().join("tus/Cargo.toml")).unwrap();
    let deps: toml::Table = toml::from_str(&manifest).unwrap();
    for section in ["dependencies", "dev-dependencies", "build-dependencies"] {
        if let Some(t) = deps.get(section).and_then(|d| d.as_table()) {
            assert!(!t.contains_key("ferry"), "tus/Cargo.toml [{section}] names ferry");
            for (name, spec) in t {
                assert!(spec.get("path").is_none(), "tus/Cargo.toml [{section}] {name} is a path dependency: ferry-tus depends on nothing of ours");
            }
        }
    }
    let mut paths = Vec::new();
    rust_files(&root().join("tus/src"), &mut paths);
    for p in paths {
        let code = strip_comments(&std::fs::read_to_string(&p).unwrap());
        assert!(!code.contains("ferry::"), "{} names the ferry crate", p.display());
    }
}

/// The codes TUS 1.0 and the IETF draft define: all that `ferry_tus::ErrorCode` may hold.
const PROTOCOL_CODES: &[&str] = &["OffsetMismatch", "ChecksumMismatch", "SizeExceeded", "UploadExpired", "NotFound", "Conflict", "InvalidArgument"];

/// ferry's own codes (and their details): they live in `src/error.rs`, never in the protocol
/// crate — as a variant, a type, or the wire word.
const APPLICATION_CODES: &[(&str, &str)] = &[
    ("TaskFailed", "task_failed"),
    ("Cancelled", "cancelled"),
    ("Unauthorized", "unauthorized"),
    ("InsufficientStorage", "insufficient_storage"),
    ("Unavailable", "unavailable"),
    ("Rejected", "rejected"),
    ("QuotaExceeded", "quota_exceeded"),
    ("QuotaDetail", "quota"),
    ("HookInvalid", "hook_invalid"),
    ("StoreRefused", "store_refused"),
    ("Damaged", "damaged"),
    ("ChunkTooLarge", "chunk_too_large"),
    ("UploadIncomplete", "upload_incomplete"),
    ("Locked", "locked"),
    ("Internal", "internal"),
];

/// What of ferry's application a protocol source names: its `ErrorCode` variants that are not
/// the protocol's, and application code names or wire words anywhere in its code (comments
/// aside; string literals count).
fn application_names(src: &str) -> Vec<String> {
    let code = strip(src, true);
    let mut out = Vec::new();
    if let Some(at) = code.find("enum ErrorCode") {
        let body = &code[at..];
        let body = &body[body.find('{').map_or(0, |i| i + 1)..body.find('}').unwrap_or(body.len())];
        for v in body.split(',').map(|v| ident_at(v.trim_start_matches(|c: char| c.is_whitespace() || c == '#' || c == '[' || c == ']').trim())) {
            if !v.is_empty() && !PROTOCOL_CODES.contains(&v) {
                out.push(format!("ErrorCode::{v} is not a protocol code"));
            }
        }
    }
    let words: Vec<&str> = code.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_')).collect();
    for (name, wire) in APPLICATION_CODES {
        if words.contains(name) {
            out.push(format!("names {name}"));
        }
        if code.contains(&format!("\"{wire}\"")) {
            out.push(format!("has the wire word \"{wire}\""));
        }
    }
    out
}

/// DESIGN §1 and issue 25 item 2: the protocol crate speaks only the protocols. Its error
/// codes are the ones TUS 1.0 and the draft define; ferry's catalogue (tasks, quotas, storage
/// trouble, hooks, locks, internal failures) is `src/error.rs`.
#[test]
fn ferry_tus_keeps_only_the_protocols_codes() {
    let mut paths = Vec::new();
    rust_files(&root().join("tus/src"), &mut paths);
    let mut found = Vec::new();
    let mut saw_enum = false;
    for p in paths {
        let src = std::fs::read_to_string(&p).unwrap();
        saw_enum |= strip(&src, true).contains("enum ErrorCode");
        found.extend(application_names(&src).into_iter().map(|w| format!("{}: {w}", p.strip_prefix(root()).unwrap().display())));
    }
    assert!(saw_enum, "tus/src defines its ErrorCode");
    assert!(found.is_empty(), "ferry-tus names ferry's application codes:\n{}", found.join("\n"));
}

/// The checker itself: each kind of forbidden import is caught, allowed ones are not.
#[test]
fn the_checker_catches_each_kind_of_crossing() {
    let f = |path: &str, src: &str| violations(&[(PathBuf::from(path), src.to_string())]);
    assert_eq!(f("mcp/mod.rs", "use crate::http::AppState;").len(), 1);
    assert_eq!(f("mcp/tools.rs", "use crate::{app::AppState, http::api::file_view};").len(), 1);
    assert_eq!(f("http/mod.rs", "fn f() { crate::mcp::FerryMcp::new(); }").len(), 1);
    assert_eq!(f("http/tus.rs", "use super::super::mcp::X;").len(), 1);
    assert_eq!(f("catalog/sqlite.rs", "use crate::upload::now_ms;").len(), 1);
    assert_eq!(f("tasks/kinds/fetch.rs", "use crate::http::Problem;").len(), 1);
    assert_eq!(f("upload/mod.rs", "use crate::tasks::Engine;").len(), 1);
    assert_eq!(f("http/api.rs", "let x = sqlx::query(\"\");").len(), 1);
    // Engines never read the configuration: a settings type or a helper taken from `config`.
    assert_eq!(f("events/webhooks.rs", "use crate::config::WebhookConfig;").len(), 1);
    assert_eq!(f("blob/s3/mod.rs", "fn f(d: Duration) -> String { crate::config::human_duration(d) }").len(), 1);
    assert_eq!(f("tasks/kinds/mod.rs", "use super::super::config::Config;").len(), 1);
    assert_eq!(f("upload/exhausted.rs", "use crate::{catalog::Catalog, config::Config};").len(), 1);
    assert_eq!(f("cli/token.rs", "use crate::config::TokenEntry;").len(), 1);
    assert_eq!(f("metrics.rs", "use crate::config::Config;").len(), 1);
    assert_eq!(f("units.rs", "use crate::upload::now_ms;").len(), 1);
    // Allowed: downward imports, comments, strings, and `super::` inside the same layer.
    assert!(f("mcp/mod.rs", "use crate::app::AppState; use crate::upload::now_ms;").is_empty());
    assert!(f("mcp/mod.rs", "// use crate::http::AppState;\n/* crate::http */ let s = \"crate::http\";").is_empty());
    assert!(f("http/tus.rs", "use super::{AppState, Problem};").is_empty());
    assert!(f("tasks/kinds/fetch.rs", "use super::super::Job; use crate::upload::FileHandle;").is_empty());
    // The composition root reads the configuration; a module's own `config` field is no import.
    assert!(f("serve.rs", "use crate::config::{BlobLocation, Config};").is_empty());
    assert!(f("check_command.rs", "use crate::config::{Config, ServeArgs};").is_empty());
    assert!(f("token_command.rs", "crate::config::file_tokens(path)").is_empty());
    assert!(f("config/file.rs", "use super::parse_interval; use crate::events::settings::WebhookConfig;").is_empty());
    assert!(f("events/webhooks.rs", "use super::settings::WebhookConfig; let t = hook.config.timeout;").is_empty());
}

/// The transport checker: a crate named as a path's start is caught; a later segment, an
/// identifier, a comment or a string is not.
#[test]
fn the_transport_checker_tells_a_crate_from_a_segment() {
    let f = |src: &str| external_crates_named(src, TRANSPORT_CRATES).into_iter().collect::<Vec<_>>();
    assert_eq!(f("use http_body_util::BodyExt;"), ["http_body_util"]);
    assert_eq!(f("fn f<B>(b: B) where B: http_body::Body<Data = Bytes> {}"), ["http_body"]);
    assert_eq!(f("let v: &http :: HeaderValue = x;"), ["http"]);
    assert_eq!(f("use ::axum::body::Body;"), ["axum"]);
    assert_eq!(f("use {bytes::Bytes, hyper::body::Incoming};"), ["hyper"]);
    assert_eq!(f("use http as h;"), ["http"]);
    assert_eq!(f("extern crate http;"), ["http"]);
    assert!(f("use crate::http::AppState; use tower::ServiceExt; let http = 1; ferry_tus::http_date(x);").is_empty());
    assert!(f("// http::HeaderValue\nlet s = \"http://example.com\"; let t = \"axum::Body\";").is_empty());
    assert!(f("use super::http; fn https() {} struct HttpBody; let a = my_http::X;").is_empty());
}

/// The protocol checker catches an application code re-added as a variant, a type or a word.
#[test]
fn the_protocol_checker_catches_application_codes() {
    assert!(application_names("pub enum ErrorCode { OffsetMismatch, NotFound, InvalidArgument }").is_empty());
    assert_eq!(application_names("pub enum ErrorCode {\n    /// 507\n    OffsetMismatch,\n    QuotaExceeded,\n}").len(), 2, "a variant and its name");
    assert_eq!(application_names("pub enum ErrorCode { OffsetMismatch, #[doc(hidden)] Damaged }").len(), 2);
    assert_eq!(application_names("pub struct QuotaDetail { pub name: &'static str }").len(), 1);
    assert_eq!(application_names("fn f() -> &'static str { \"insufficient_storage\" }").len(), 1);
    // Comments and other words are not names.
    assert!(application_names("// QuotaExceeded was moved to ferry\nfn quota_free() {}").is_empty());
}

/// The files of `src/` that may vouch that a blob is named by no record
/// ([`ferry::blob::Unreferenced::vouched`], the right to remove its bytes): the upload engine's
/// removal steps, each made from the catalog step that released the row, and the blob stores'
/// own definition and conformance tests. `BlobStore::delete` takes an `Unreferenced`, so bytes
/// are removed only with one, and one is made only here.
const REMOVAL_GRANTORS: &[&str] = &["upload/removal.rs", "blob/mod.rs", "blob/conformance.rs"];

/// Files of `src/` outside [`REMOVAL_GRANTORS`] that make an `Unreferenced`, as `file: line`.
fn unlicensed_removals(files: &[(PathBuf, String)]) -> Vec<String> {
    let mut found = Vec::new();
    for (path, src) in files {
        if REMOVAL_GRANTORS.iter().any(|g| path == Path::new(g)) {
            continue;
        }
        let code = strip_comments(src);
        // The constructor by any path (`Unreferenced::vouched`, `blob::Unreferenced::vouched`),
        // or the struct literal (only possible inside `blob`, and not done there either).
        for (n, line) in code.lines().enumerate() {
            let compact: String = line.chars().filter(|c| !c.is_whitespace()).collect();
            if compact.contains("Unreferenced::vouched") || compact.contains("Unreferenced{id") {
                found.push(format!("src/{}: {}: {}", path.display(), n + 1, line.trim()));
            }
        }
    }
    found
}

#[test]
fn only_the_removal_steps_vouch_that_bytes_are_unreferenced() {
    let files = source_tree();
    assert!(files.iter().any(|(p, src)| p == Path::new("upload/removal.rs") && src.contains("Unreferenced::vouched")), "the grantor was found");
    let v = unlicensed_removals(&files);
    assert!(
        v.is_empty(),
        "bytes vouched unreferenced outside src/upload/removal.rs (make the evidence there, from the catalog step that released the row):\n{}",
        v.join("\n")
    );
}

/// A vouching planted in the engine's other files, by each path it could take: each is
/// reported, by file; a comment or a string that names it is not.
#[test]
fn a_removal_vouched_outside_the_removal_steps_is_caught() {
    let clean = source_tree();
    let plants = [
        ("upload/maintenance.rs", "\nfn planted() -> crate::blob::Unreferenced { crate::blob::Unreferenced::vouched(\"x\") }\n"),
        ("upload/mod.rs", "\nfn planted() { let _ = Unreferenced :: vouched(String::new()); }\n"),
        ("tasks/engine.rs", "\nfn planted() { let _ = crate::blob::Unreferenced::vouched(\"x\"); }\n"),
        ("blob/s3/mod.rs", "\nfn planted() -> super::Unreferenced { super::Unreferenced { id: String::new() } }\n"),
    ];
    for (target, plant) in plants {
        let mut files = clean.clone();
        let (_, src) = files.iter_mut().find(|(p, _)| p == Path::new(target)).unwrap_or_else(|| panic!("src/{target} is in the tree"));
        src.push_str(plant);
        let v = unlicensed_removals(&files);
        assert_eq!(v.len(), 1, "{target}: {v:?}");
        assert!(v[0].starts_with(&format!("src/{target}: ")), "{}", v[0]);
    }
    let mut files = clean.clone();
    files[0].1.push_str("\n// Unreferenced::vouched is for removal.rs\nfn f() -> &'static str { \"Unreferenced::vouched\" }\n");
    assert!(unlicensed_removals(&files).is_empty());
}
