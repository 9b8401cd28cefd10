//! No line of Rust in the repository is wider than rustfmt's `max_width` (rustfmt.toml, 150
//! columns). rustfmt keeps code within it but gives up on a statement it cannot fit, mostly one
//! holding a string literal longer than the line, and on text it does not lay out (comments, the
//! bodies of `json!` and other macros it cannot parse, attributes such as `#[utoipa::path]`).
//! Those lines are this test's to catch: the failure names each file, line and width.
//!
//! Checked: every `.rs` file under `src/`, `tests/`, `benches/`, `tools/`, `tus/`, `examples/`
//! and `fuzz/` (build output and `node_modules` are skipped). Width is counted in characters,
//! as rustfmt counts it.
//!
//! Mending a long line without changing what it says: break a literal with a `\` line
//! continuation (the continuation drops the next line's leading whitespace, so the space goes
//! before the `\`), bind a long format argument to a local, put one `json!` member on a line,
//! and wrap comments.

use std::path::{Path, PathBuf};

const CHECKED_DIRS: &[&str] = &["src", "tests", "benches", "tools", "tus", "examples", "fuzz"];
const SKIPPED_DIRS: &[&str] = &["target", "node_modules"];

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// `max_width` of rustfmt.toml: the one place the limit is set.
fn max_width() -> usize {
    let text = std::fs::read_to_string(root().join("rustfmt.toml")).expect("rustfmt.toml at the repository root");
    let table: toml::Table = text.parse().expect("rustfmt.toml is TOML");
    let width = table.get("max_width").and_then(|v| v.as_integer()).expect("rustfmt.toml sets max_width");
    usize::try_from(width).expect("max_width is positive")
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    for entry in entries {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap_or_default().to_string_lossy();
        if path.is_dir() {
            if !SKIPPED_DIRS.contains(&name.as_ref()) {
                rust_files(&path, out);
            }
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// `(line number from 1, width in characters)` of every line of `text` wider than `max`.
fn too_wide(text: &str, max: usize) -> Vec<(usize, usize)> {
    text.lines().enumerate().map(|(i, line)| (i + 1, line.chars().count())).filter(|&(_, width)| width > max).collect()
}

#[test]
fn no_line_of_rust_is_wider_than_rustfmts_max_width() {
    let max = max_width();
    let mut files = Vec::new();
    for dir in CHECKED_DIRS {
        rust_files(&root().join(dir), &mut files);
    }
    assert!(files.len() > 100, "the walk found the sources (only {} .rs files)", files.len());
    let mut wide = Vec::new();
    for file in &files {
        let text = std::fs::read_to_string(file).unwrap_or_else(|e| panic!("reading {}: {e}", file.display()));
        for (line, width) in too_wide(&text, max) {
            wide.push(format!("{}:{line}: {width} columns", file.strip_prefix(root()).unwrap_or(file).display()));
        }
    }
    assert!(
        wide.is_empty(),
        "lines wider than rustfmt.toml's max_width = {max}, which rustfmt left (mend them by hand, \
         see this test's module doc):\n{}",
        wide.join("\n")
    );
}

#[test]
fn the_width_check_counts_characters_and_names_each_wide_line() {
    let max = 10;
    let text = format!("{}\n{}\nshort\n{}\n", "a".repeat(10), "b".repeat(11), "é".repeat(10));
    // 10 'é' are 20 bytes but 10 columns: within the limit, as rustfmt sees it.
    assert_eq!(too_wide(&text, max), vec![(2, 11)]);
    let mut wide = "fn f() {}\n".to_string();
    wide.push_str(&format!("    let s = \"{}\";\n", "x".repeat(max)));
    assert_eq!(too_wide(&wide, max), vec![(2, max + 15)]);
}
