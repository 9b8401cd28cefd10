//! The book (`docs/`) builds with mdBook and has no broken internal link or anchor; the
//! README's relative links name files that exist and headings it has.
//!
//! mdBook checks neither links nor anchors, and the checkers written for it (mdbook-linkcheck)
//! follow mdBook 0.4's plugin interface, not 0.5's. So this test checks mdBook's own output: it
//! builds the book into a temporary directory and reads every `href` of every page. A link to
//! another page must name a page the build wrote (a chapter renamed or moved without its links
//! fails here), and a `#fragment` must be an `id` that page carries — the ids mdBook itself gave
//! the headings, so no slug rule is guessed here. Links with a scheme (`https:`, `mailto:`) are
//! not followed: CI has no network to follow them with.
//!
//! Needs `mdbook` 0.5 on the PATH (or `FERRY_MDBOOK`, or in `~/.cargo/bin`): `.ci/run` installs it.

mod common;
use common::*;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

fn mdbook() -> PathBuf {
    if let Some(p) = std::env::var_os("FERRY_MDBOOK") {
        return PathBuf::from(p);
    }
    let on_path = std::env::var_os("PATH")
        .into_iter()
        .flat_map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .map(|d| d.join("mdbook"))
        .find(|p| p.is_file());
    let in_cargo = std::env::var_os("CARGO_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cargo")))
        .map(|c| c.join("bin/mdbook"))
        .filter(|p| p.is_file());
    on_path.or(in_cargo).expect("mdbook is not installed: run .ci/run, or `cargo install mdbook --version 0.5.4 --locked`")
}

/// Every `NAME="value"` attribute of `html` (mdBook writes attributes with double quotes; text
/// and code are escaped, so a `"` never appears inside one).
fn attributes<'a>(html: &'a str, name: &str) -> Vec<&'a str> {
    let needle = format!(" {name}=\"");
    let mut out = Vec::new();
    let mut rest = html;
    while let Some(i) = rest.find(&needle) {
        let v = &rest[i + needle.len()..];
        let end = v.find('"').expect("a closed attribute");
        out.push(&v[..end]);
        rest = &v[end..];
    }
    out
}

/// `base/rel` with `.` and `..` folded, as a browser resolves a relative link.
fn resolve(base: &Path, rel: &str) -> PathBuf {
    let mut parts: Vec<String> = base.components().map(|c| c.as_os_str().to_string_lossy().into_owned()).collect();
    for seg in rel.split('/') {
        match seg {
            "" | "." => {}
            ".." => {
                parts.pop();
            }
            s => parts.push(s.to_string()),
        }
    }
    parts.iter().collect()
}

fn html_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            html_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "html") {
            out.push(p);
        }
    }
}

#[test]
fn the_book_has_no_broken_internal_link_or_anchor() {
    let out_dir = tempfile::tempdir().unwrap();
    let built = std::process::Command::new(mdbook()).arg("build").arg(manifest_dir().join("docs")).arg("-d").arg(out_dir.path()).output().unwrap();
    assert!(built.status.success(), "mdbook build docs: {}{}", String::from_utf8_lossy(&built.stdout), String::from_utf8_lossy(&built.stderr));
    let root = out_dir.path();
    let mut pages = Vec::new();
    html_files(root, &mut pages);
    assert!(pages.len() > 20, "the book has its chapters: {pages:?}");

    let mut ids: BTreeMap<PathBuf, BTreeSet<String>> = BTreeMap::new();
    let mut texts = BTreeMap::new();
    for p in &pages {
        let rel = p.strip_prefix(root).unwrap().to_path_buf();
        let html = std::fs::read_to_string(p).unwrap();
        ids.insert(rel.clone(), attributes(&html, "id").into_iter().map(str::to_string).collect());
        texts.insert(rel, html);
    }
    let mut broken = Vec::new();
    for (page, html) in &texts {
        let dir = page.parent().unwrap_or(Path::new(""));
        for href in attributes(html, "href") {
            if href.contains(':') || href.starts_with("//") || href.is_empty() {
                continue;
            }
            let (path, fragment) = href.split_once('#').map_or((href, None), |(p, f)| (p, Some(f)));
            let target = if path.is_empty() { page.clone() } else { resolve(dir, path) };
            let target = if root.join(&target).is_dir() { target.join("index.html") } else { target };
            if !root.join(&target).exists() {
                broken.push(format!("{}: {href} (no {})", page.display(), target.display()));
                continue;
            }
            if let Some(f) = fragment.filter(|f| !f.is_empty()) {
                let f = percent_encoding::percent_decode_str(f).decode_utf8_lossy();
                if !ids.get(&target).is_some_and(|set| set.contains(f.as_ref())) {
                    broken.push(format!("{}: {href} (no id {f:?} in {})", page.display(), target.display()));
                }
            }
        }
    }
    assert!(broken.is_empty(), "broken links in the book:\n{}", broken.join("\n"));
}

/// The id GitHub gives a README heading: lower case, spaces to `-`, punctuation dropped.
fn github_slug(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter_map(|c| {
            if c == ' ' {
                Some('-')
            } else if c.is_alphanumeric() || c == '-' || c == '_' {
                Some(c)
            } else {
                None
            }
        })
        .collect()
}

#[test]
fn the_readmes_links_name_files_and_headings_that_exist() {
    let readme = book::text("README.md");
    let mut headings = BTreeSet::new();
    let mut fence = false;
    for l in readme.lines() {
        if l.starts_with("```") {
            fence = !fence;
        } else if !fence && l.starts_with('#') {
            headings.insert(github_slug(l.trim_start_matches('#')));
        }
    }
    let mut broken = Vec::new();
    let mut rest = readme.as_str();
    while let Some(i) = rest.find("](") {
        let v = &rest[i + 2..];
        let end = v.find(')').expect("a closed link");
        let link = &v[..end];
        rest = &v[end..];
        if link.contains(':') {
            continue;
        }
        let (path, fragment) = link.split_once('#').map_or((link, None), |(p, f)| (p, Some(f)));
        if !path.is_empty() && !manifest_dir().join(path).exists() {
            broken.push(format!("{link}: no file {path}"));
        }
        if let (true, Some(f)) = (path.is_empty(), fragment) {
            if !headings.contains(f) {
                broken.push(format!("{link}: no heading with that id (has {headings:?})"));
            }
        }
    }
    assert!(broken.is_empty(), "broken links in README.md:\n{}", broken.join("\n"));
}
