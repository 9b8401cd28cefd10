//! The book's text (`docs/src/`) and the README, for tests that run their recipes exactly as
//! printed: a chapter, one section of it, and its fenced code blocks.

use std::path::PathBuf;

/// The text of a Markdown file of the repository: `README.md`, or a chapter such as
/// `docs/src/clients/curl.md`. Panics naming the file when it is missing.
pub fn text(path: &str) -> String {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(path);
    std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

/// The part of `text` under the heading line `heading` (e.g. `## The walk-through`), up to the
/// next heading of the same or a higher level, outside code blocks. Panics when there is none.
pub fn section(text: &str, heading: &str) -> String {
    let level = heading.chars().take_while(|c| *c == '#').count();
    let mut out = Vec::new();
    let (mut inside, mut fence) = (false, false);
    for line in text.lines() {
        if line.starts_with("```") {
            fence = !fence;
        }
        let hashes = line.chars().take_while(|c| *c == '#').count();
        let is_heading = !fence && hashes > 0 && line[hashes..].starts_with(' ');
        if inside && is_heading && hashes <= level {
            break;
        }
        if inside {
            out.push(line);
        }
        if is_heading && line == heading {
            inside = true;
        }
    }
    assert!(inside, "no heading {heading:?}");
    out.join("\n") + "\n"
}

/// The bodies of the ```LANG blocks of `text`, in order.
pub fn blocks(text: &str, lang: &str) -> Vec<String> {
    let open = format!("```{lang}\n");
    let mut out = Vec::new();
    let mut rest = text;
    while let Some(start) = rest.find(&open) {
        let body = &rest[start + open.len()..];
        let end = body.find("\n```").map(|e| e + 1).expect("a closed code block");
        out.push(body[..end].to_string());
        rest = &body[end + 3..];
    }
    out
}
