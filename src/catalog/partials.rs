//! Partial results of a task (issue 27): small JSON fragments a job appends while the task is
//! `working` or `input_required`, so a caller can start using what a long task found before it
//! ends. The final result stays separate ([`super::TaskRecord::result`]).
//!
//! **Numbering.** A task's fragments are numbered `seq` = 1, 2, 3… and a number is never reused.
//! The task row keeps the last number handed out (`partial_seq`) and the number its last
//! checkpoint covered (`partial_mark`). A job run numbers its own fragments, starting after the
//! mark of the checkpoint it resumes from; a fragment whose number is already taken was stored
//! by an earlier run that crashed after appending it and before checkpointing, and is not
//! stored again ([`Appended::Replayed`]). So a resumed run that re-emits what it emitted after
//! its last checkpoint duplicates nothing — the fragments are tied to the checkpoint as the
//! output bytes are. An external producer (no fence) gets the next number.
//!
//! **Bounds.** At most [`MAX_FRAGMENTS`] fragments, whose views together stay within
//! [`MAX_VIEW_BYTES`], are kept per task; appending past that deletes the oldest, counted in
//! `dropped`. One fragment is at most [`MAX_FRAGMENT_BYTES`] of JSON text (big data belongs in
//! a file).

use serde::Serialize;
use serde_json::value::RawValue;

/// Fragments kept per task.
pub const MAX_FRAGMENTS: usize = 256;
/// The most a task's `partial` view (`{"fragments":[…],"dropped":N,"next":N}`) may take, bytes.
pub const MAX_VIEW_BYTES: usize = 64 * 1024;
/// The largest fragment, bytes of JSON text.
pub const MAX_FRAGMENT_BYTES: usize = 16 * 1024;
/// What one fragment adds to the view besides its value: `{"seq":N,"at_ms":N,"value":}` and a
/// comma, with 20-digit numbers (the most a u64 or i64 takes).
pub const FRAGMENT_OVERHEAD: usize = 27 + 20 + 20;
/// The view's frame: `{"fragments":[],"dropped":N,"next":N}` with 20-digit numbers.
pub const VIEW_OVERHEAD: usize = 35 + 20 + 20;

/// One fragment as stored and shown.
#[derive(Debug, Clone, Serialize)]
pub struct Fragment {
    /// 1, 2, 3… per task; never reused.
    pub seq: u64,
    /// When it was appended, Unix ms.
    pub at_ms: i64,
    /// The fragment, exact JSON text.
    pub value: Box<RawValue>,
}

/// A task's fragments after a cursor, as the `partial` member of the task view shows them.
#[derive(Debug, Clone, Serialize)]
pub struct PartialPage {
    /// Kept fragments with `seq` greater than the cursor asked for, oldest first.
    pub fragments: Vec<Fragment>,
    /// How many of the task's fragments were deleted to stay within the bounds.
    pub dropped: u64,
    /// The task's last fragment number (0: none yet): pass it as `partial_after` to read only
    /// fragments appended after this view.
    pub next: u64,
}

impl PartialPage {
    /// No fragments, nothing dropped.
    pub fn empty() -> PartialPage {
        PartialPage { fragments: Vec::new(), dropped: 0, next: 0 }
    }
}

impl PartialEq for Fragment {
    /// Equal numbers, times and JSON text.
    fn eq(&self, other: &Fragment) -> bool {
        self.seq == other.seq && self.at_ms == other.at_ms && self.value.get() == other.value.get()
    }
}

impl PartialEq for PartialPage {
    fn eq(&self, other: &PartialPage) -> bool {
        self.fragments == other.fragments && self.dropped == other.dropped && self.next == other.next
    }
}

/// What [`super::TaskCatalog::append_partial`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Appended {
    /// Stored with this number (and its `task.partial` event written in the same transaction).
    Stored(u64),
    /// The number was already taken (a resumed run re-emitting a fragment stored before its
    /// crash): nothing was stored.
    Replayed(u64),
}

/// The bytes fragment `value` takes in the view.
pub fn view_cost(value_len: usize) -> usize {
    value_len + FRAGMENT_OVERHEAD
}

/// Given the kept fragments as `(seq, value length)`, **newest first**, the lowest `seq` to
/// keep so that at most [`MAX_FRAGMENTS`] remain and their view fits [`MAX_VIEW_BYTES`]; `None`
/// keeps all. The newest is always kept (a fragment alone always fits: see
/// [`MAX_FRAGMENT_BYTES`]).
pub fn keep_from(newest_first: &[(u64, usize)]) -> Option<u64> {
    let mut used = VIEW_OVERHEAD;
    for (i, &(_, len)) in newest_first.iter().enumerate() {
        used += view_cost(len);
        if i > 0 && (i >= MAX_FRAGMENTS || used > MAX_VIEW_BYTES) {
            return Some(newest_first[i - 1].0);
        }
    }
    None
}

/// Check a fragment before anything is stored: JSON text of at most [`MAX_FRAGMENT_BYTES`].
/// `Err` is a message for the caller.
pub fn check_fragment(text: &str) -> Result<Box<RawValue>, String> {
    if text.len() > MAX_FRAGMENT_BYTES {
        return Err(format!(
            "a partial result fragment may be at most {MAX_FRAGMENT_BYTES} bytes of JSON, got {}; put big data in a file",
            text.len()
        ));
    }
    serde_json::from_str::<Box<RawValue>>(text).map_err(|e| format!("a partial result fragment must be JSON: {e}"))
}

/// A row of a task joined with one of its fragments: `(partial_seq, partial_dropped, seq,
/// at_ms, value)`, the last three `NULL` when it has none (after the cursor).
pub(super) type PageRow = (i64, i64, Option<i64>, Option<i64>, Option<String>);

/// A page from rows `(partial_seq, partial_dropped, seq, at_ms, value)` of the task joined
/// with its fragments (no fragment: the last three `NULL`); `None` when there is no row (no
/// such task). A stored value that is not JSON is shown as `null`.
pub(super) fn page_of(rows: Vec<PageRow>) -> Option<PartialPage> {
    let first = rows.first()?;
    let (next, dropped) = (first.0.max(0) as u64, first.1.max(0) as u64);
    let fragments = rows
        .into_iter()
        .filter_map(|(_, _, seq, at_ms, value)| {
            let value = RawValue::from_string(value?).unwrap_or_else(|_| RawValue::from_string("null".into()).expect("null is JSON"));
            Some(Fragment { seq: seq?.max(0) as u64, at_ms: at_ms?, value })
        })
        .collect();
    Some(PartialPage { fragments, dropped, next })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_bound_keeps_the_newest() {
        assert_eq!(keep_from(&[]), None);
        assert_eq!(keep_from(&[(3, 10), (2, 10), (1, 10)]), None);
        let many: Vec<(u64, usize)> = (1..=300u64).rev().map(|s| (s, 5)).collect();
        assert_eq!(keep_from(&many), Some(300 - MAX_FRAGMENTS as u64 + 1), "256 kept");
        let big: Vec<(u64, usize)> = (1..=10u64).rev().map(|s| (s, MAX_FRAGMENT_BYTES)).collect();
        let from = keep_from(&big).unwrap();
        let kept = big.iter().filter(|(s, _)| *s >= from).count();
        assert!(VIEW_OVERHEAD + kept * view_cost(MAX_FRAGMENT_BYTES) <= MAX_VIEW_BYTES && kept == 3, "{kept}");
    }

    #[test]
    fn the_worst_view_fits_its_bound() {
        // Fragments of every size: the rendered view never passes MAX_VIEW_BYTES.
        for len in [1usize, 7, 100, 255, 1000, MAX_FRAGMENT_BYTES] {
            let value = RawValue::from_string(format!("\"{}\"", "x".repeat(len.saturating_sub(2)))).unwrap();
            let n = 2000u64;
            let sizes: Vec<(u64, usize)> = (1..=n).rev().map(|s| (s, value.get().len())).collect();
            let from = keep_from(&sizes).unwrap_or(1);
            let page = PartialPage {
                fragments: (from..=n).map(|seq| Fragment { seq: u64::MAX - n + seq, at_ms: i64::MAX, value: value.clone() }).collect(),
                dropped: u64::MAX,
                next: u64::MAX,
            };
            let text = serde_json::to_string(&page).unwrap();
            assert!(text.len() <= MAX_VIEW_BYTES, "{len}: {}", text.len());
        }
    }

    #[test]
    fn fragments_are_small_json() {
        assert!(check_fragment("{\"a\":1}").is_ok());
        assert!(check_fragment("nope").unwrap_err().contains("JSON"));
        assert!(check_fragment(&format!("\"{}\"", "x".repeat(MAX_FRAGMENT_BYTES))).unwrap_err().contains("at most"));
    }
}
