//! File names as people see them: the one place that decides how a name from an upload's
//! metadata (any UTF-8 a client sent) is shown on a terminal, in a log line, on a page, or
//! offered to a browser in `Content-Disposition`, and how long it may be.
//!
//! A name may carry terminal escapes (ESC, BEL and the other C0/C1 controls), line breaks, or
//! Unicode bidirectional controls (U+202E RIGHT-TO-LEFT OVERRIDE makes `gnp.exe` with an
//! override look like `exe.png`, Trojan Source style). [`display_name`] replaces each of them
//! with U+FFFD REPLACEMENT CHARACTER, visibly, and changes nothing else. Used by the server's
//! `Content-Disposition` and the pages (through the file view's `display_name`); the CLI's `ls`
//! / `status` output is to use it too (its owner applies it).
//!
//! Names are also bounded: at creation at most [`MAX_NAME_CHARS`] characters (what file
//! systems allow: 255 on Linux, Windows and macOS), and wherever ferry puts a name into a
//! response header, [`shorten`] keeps it within a byte budget with its extension intact.

/// The media type a file name's extension suggests (`report.csv` → `text/csv`, from
/// mime_guess's table), else `application/octet-stream`. For clients that create an upload
/// from a name and were given no type (`ferry upload`, `ferry request`, MCP
/// `file_upload_begin` and `file_request`); metadata that names no type is not guessed at.
pub fn guess_media_type(name: &str) -> mime::Mime {
    mime_guess::from_path(name).first().unwrap_or(mime::APPLICATION_OCTET_STREAM)
}

/// Most characters (Unicode scalar values) a file name in `Upload-Metadata` may have: 255, the
/// longest name Linux (bytes), Windows and macOS (UTF-16 units) store.
pub const MAX_NAME_CHARS: usize = 255;

/// Stands for every character [`display_name`] will not show.
pub const REPLACEMENT: char = '\u{FFFD}';

/// Whether `c` is a character a name must not carry to a person: a control character (C0,
/// DEL, C1: terminal escapes, BEL, line breaks), a line or paragraph separator (U+2028,
/// U+2029), or a bidirectional formatting character (U+061C, U+200E, U+200F, U+202A–U+202E,
/// U+2066–U+2069; Unicode TR9 §2, the Trojan Source list).
pub fn is_hidden_control(c: char) -> bool {
    c.is_control() || matches!(c, '\u{061C}' | '\u{200E}' | '\u{200F}' | '\u{202A}'..='\u{202E}' | '\u{2066}'..='\u{2069}' | '\u{2028}' | '\u{2029}')
}

/// `name` with every [`is_hidden_control`] character replaced by U+FFFD: safe to print on a
/// terminal, write into a log line or a page, or offer as a download's file name. Other
/// characters (any script, emoji, joiners) are kept as they are.
pub fn display_name(name: &str) -> String {
    name.chars().map(|c| if is_hidden_control(c) { REPLACEMENT } else { c }).collect()
}

/// `name` shortened to at most `max_bytes` bytes of UTF-8 (`max_bytes` ≥ 16), keeping its
/// extension (the part from the last `.`, when that is at most 16 bytes) and marking the cut
/// with `…`. Cuts fall on character boundaries. A name that fits is returned as it is.
pub fn shorten(name: &str, max_bytes: usize) -> String {
    if name.len() <= max_bytes {
        return name.to_string();
    }
    const ELLIPSIS: &str = "…";
    let ext = name.rfind('.').map(|i| &name[i..]).filter(|e| e.len() <= 16 && e.len() < name.len()).unwrap_or("");
    let budget = max_bytes.saturating_sub(ext.len() + ELLIPSIS.len());
    let stem = &name[..name.len() - ext.len()];
    let mut cut = budget.min(stem.len());
    while !stem.is_char_boundary(cut) {
        cut -= 1;
    }
    format!("{}{ELLIPSIS}{ext}", &stem[..cut])
}

/// `Upload-Metadata` key that marks an upload a person was asked to send through a link
/// (`file_request`, `ferry request`), value `1`: a reader of such an unfinished upload is told
/// to wait for the person and poll, not to send the bytes itself.
pub const REQUESTED_METADATA_KEY: &str = "requested";

/// Whether `metadata` (an `Upload-Metadata` value as stored) marks a requested upload.
pub fn is_requested(metadata: &str) -> bool {
    metadata.parse::<ferry_tus::UploadMetadata>().is_ok_and(|m| m.get(REQUESTED_METADATA_KEY).is_some())
}

/// Most bytes of one zip member's name (before a ` (n)` suffix), extension kept.
pub const MEMBER_NAME_BYTES: usize = 200;

/// Names for the members of one archive that are safe to extract and unique, from the names
/// the files were uploaded with (`None`: the file has none; `fallback` names it, e.g. its id).
/// A name keeps only its last path segment (after `/` or `\`), has control and bidi characters
/// (NUL included) replaced by U+FFFD ([`display_name`]) and is cut to [`MEMBER_NAME_BYTES`]
/// ([`shorten`]); an empty name, `.` or `..` becomes the fallback. A name already taken
/// (compared without case, as Windows and macOS file systems do) gets ` (2)`, ` (3)`… before
/// its extension.
pub fn unique_member_names(wanted: &[(Option<String>, String)]) -> Vec<String> {
    let safe = |n: &str| {
        let last = n.rsplit(['/', '\\']).next().unwrap_or(n);
        let shown = shorten(&display_name(last), MEMBER_NAME_BYTES);
        (!shown.trim().is_empty() && shown != "." && shown != "..").then_some(shown)
    };
    let mut taken = std::collections::HashSet::new();
    let mut out = Vec::with_capacity(wanted.len());
    for (name, fallback) in wanted {
        let base = name.as_deref().and_then(safe).or_else(|| safe(fallback)).unwrap_or_else(|| "file".to_string());
        let (stem, ext) = match base.rfind('.') {
            Some(dot) if dot > 0 => base.split_at(dot),
            _ => (base.as_str(), ""),
        };
        let mut candidate = base.clone();
        let mut n = 2;
        while !taken.insert(candidate.to_lowercase()) {
            candidate = format!("{stem} ({n}){ext}");
            n += 1;
        }
        out.push(candidate);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn member_names_are_safe_and_unique() {
        let w = |n: Option<&str>, f: &str| (n.map(str::to_string), f.to_string());
        let names = unique_member_names(&[
            w(Some("report.pdf"), "id1"),
            w(Some("REPORT.pdf"), "id2"),
            w(Some("../../etc/passwd"), "id3"),
            w(Some("a\\b\\report.pdf"), "id4"),
            w(Some(".."), "id5"),
            w(None, "id6"),
            w(Some("nul\0byte"), "id7"),
            w(Some("report (2).pdf"), "id8"),
            w(Some(".bashrc"), "id9"),
            w(Some(".bashrc"), "id10"),
            w(Some(""), "id6"),
        ]);
        let want = [
            "report.pdf",
            "REPORT (2).pdf",
            "passwd",
            "report (3).pdf",
            "id5",
            "id6",
            "nul\u{FFFD}byte",
            "report (2) (2).pdf",
            ".bashrc",
            ".bashrc (2)",
            "id6 (2)",
        ];
        assert_eq!(names, want);
        let long = unique_member_names(&[w(Some(&("x".repeat(400) + ".tar.gz")), "id")]);
        assert!(long[0].len() <= MEMBER_NAME_BYTES && long[0].ends_with(".gz"), "{}", long[0]);
    }

    #[test]
    fn controls_and_bidi_overrides_are_replaced_visibly() {
        assert_eq!(display_name("report\u{1b}[31m.txt\u{7}"), "report\u{FFFD}[31m.txt\u{FFFD}");
        assert_eq!(display_name("invoice\u{202E}gnp.exe"), "invoice\u{FFFD}gnp.exe");
        assert_eq!(display_name("a\nb\r\u{85}\u{2028}\u{2066}x\u{2069}"), "a\u{FFFD}b\u{FFFD}\u{FFFD}\u{FFFD}\u{FFFD}x\u{FFFD}");
        // Ordinary text of any script, and emoji with joiners, stay as they are.
        assert_eq!(display_name("résumé 履歴書 שלום 👩‍💻.pdf"), "résumé 履歴書 שלום 👩‍💻.pdf");
    }

    #[test]
    fn shortening_keeps_the_extension_and_character_boundaries() {
        assert_eq!(shorten("short.pdf", 100), "short.pdf");
        let long = format!("{}.tar.gz", "a".repeat(300));
        let s = shorten(&long, 64);
        assert!(s.len() <= 64 && s.ends_with("….gz") && s.starts_with("aaa"), "{s}");
        let wide = "é".repeat(300) + ".pdf";
        let s = shorten(&wide, 101);
        assert!(s.len() <= 101 && s.ends_with("….pdf"), "{s}");
        // No extension, or an "extension" that is most of the name.
        assert!(shorten(&"x".repeat(200), 32).len() <= 32);
        assert!(shorten(&format!(".{}", "y".repeat(200)), 32).len() <= 32);
    }
}
