//! A state in two pieces: a small head and an append-only list of entries (DESIGN §2 "the part
//! list out of the hot row"). The blob store writes such states (S3: the head holds the
//! schedule, the multipart id and the tail; each uploaded part is an entry); the catalog keeps
//! the head in the upload's row — what every HEAD, GET and list reads — and the entries beside
//! it, appending those a checkpoint adds. A leaf module: both `blob` and `catalog` use it, and
//! neither may import the other (tests/layers.rs).
//!
//! Layout: `0xF0`, entry count (u32 LE), head length (u32 LE), head, then each entry as its
//! length (u32 LE) and bytes. A *row* is the same without the entries (it still names how many
//! there are). No store's own state format starts with `0xF0`.

/// The first byte of a framed state.
const FRAMED: u8 = 0xF0;

/// The head and the entries of a framed state, borrowed from it.
pub type Framed<'a> = (&'a [u8], Vec<&'a [u8]>);

/// A framed state that is cut (a row alone is one) or has bytes past its entries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Malformed;

/// The framed state of `head` and `entries`.
pub fn encode(head: &[u8], entries: &[Vec<u8>]) -> Vec<u8> {
    let mut v = Vec::with_capacity(9 + head.len() + entries.iter().map(|e| 4 + e.len()).sum::<usize>());
    v.push(FRAMED);
    v.extend_from_slice(&(entries.len() as u32).to_le_bytes());
    v.extend_from_slice(&(head.len() as u32).to_le_bytes());
    v.extend_from_slice(head);
    for e in entries {
        v.extend_from_slice(&(e.len() as u32).to_le_bytes());
        v.extend_from_slice(e);
    }
    v
}

/// `(head, entries)` of framed state `b`; `None` when `b` is not framed.
pub fn unframe(b: &[u8]) -> Result<Option<Framed<'_>>, Malformed> {
    let Some((n, head_end)) = frame(b)? else { return Ok(None) };
    let mut rest = &b[head_end..];
    let mut entries = Vec::with_capacity(n.min(16_384) as usize);
    for _ in 0..n {
        let (len, tail) = rest.split_first_chunk::<4>().ok_or(Malformed)?;
        let len = u32::from_le_bytes(*len) as usize;
        if tail.len() < len {
            return Err(Malformed);
        }
        let (e, tail) = tail.split_at(len);
        entries.push(e);
        rest = tail;
    }
    if !rest.is_empty() {
        return Err(Malformed);
    }
    Ok(Some((&b[9..head_end], entries)))
}

/// `(row, entries)` of state `b`: what the catalog keeps in the upload's row and beside it. A
/// state that is not framed (or is malformed) is all row, with no entries.
pub fn split(b: &[u8]) -> (&[u8], Vec<&[u8]>) {
    match (frame(b), unframe(b)) {
        (Ok(Some((_, head_end))), Ok(Some((_, entries)))) => (&b[..head_end], entries),
        (Ok(Some((_, head_end))), _) => (&b[..head_end], Vec::new()),
        _ => (b, Vec::new()),
    }
}

/// Whether `b` is a row read alone, naming entries it does not hold.
pub fn lacks_entries(b: &[u8]) -> bool {
    matches!(frame(b), Ok(Some((n, head_end))) if n > 0 && b.len() == head_end)
}

/// The whole state from a row and the entries kept beside it, in order.
pub fn join(row: &[u8], entries: &[Vec<u8>]) -> Vec<u8> {
    let mut v = Vec::with_capacity(row.len() + entries.iter().map(|e| 4 + e.len()).sum::<usize>());
    v.extend_from_slice(row);
    for e in entries {
        v.extend_from_slice(&(e.len() as u32).to_le_bytes());
        v.extend_from_slice(e);
    }
    v
}

/// What a checkpoint that replaces state `committed` with state `new` changes of the entries
/// the catalog keeps: `None` when the entries are the same, else the number of leading entries
/// both share (those after them are replaced by `new`'s; 0 for a state that is not framed).
pub fn entries_from(new: &[u8], committed: &[u8]) -> Option<u32> {
    let (new, old) = (split(new).1, split(committed).1);
    if new == old {
        return None;
    }
    Some(new.iter().zip(&old).take_while(|(a, b)| a == b).count() as u32)
}

/// Entry count and where the head ends, of framed state `b`.
fn frame(b: &[u8]) -> Result<Option<(u32, usize)>, Malformed> {
    if b.first() != Some(&FRAMED) {
        return Ok(None);
    }
    if b.len() < 9 {
        return Err(Malformed);
    }
    let n = u32::from_le_bytes(b[1..5].try_into().expect("4 bytes"));
    let head_end = 9 + u32::from_le_bytes(b[5..9].try_into().expect("4 bytes")) as usize;
    if b.len() < head_end {
        return Err(Malformed);
    }
    Ok(Some((n, head_end)))
}
