//! One SQL text for both catalogs: a statement is written once, in a template, and
//! [`sql!`](crate::catalog::dialect) renders the SQLite and the PostgreSQL text of it **at
//! compile time** (const evaluation; nothing is formatted per query).
//!
//! The template is the SQL both databases accept, plus a few marks for what differs:
//!
//! | mark | SQLite | PostgreSQL |
//! |---|---|---|
//! | `?` | `?` | `$1`, `$2`, … in order |
//! | `?N` (N = 1…99) | `?N` | `$N` (a parameter used twice) |
//! | `{now}` | the host clock as Unix ms, read inside the statement | `ferry_now_ms()`, the database's clock |
//! | `{true}` / `{false}` | `1` / `0` (the columns are integers) | `TRUE` / `FALSE` |
//! | `{greatest}` | `MAX` (two-argument scalar) | `GREATEST` |
//! | `{strpos}` | `instr` | `strpos` |
//! | `{pg:TEXT}` | nothing | `TEXT` (casts, `FOR UPDATE`, `SKIP LOCKED`) |
//! | `{sqlite:TEXT}` | `TEXT` | nothing |
//!
//! A statement numbers all its parameters or none: sqlx's SQLite driver binds numbered and
//! bare ones from separate counters, so a mix would bind the wrong values (`render` refuses it).
//!
//! Upserts (`ON CONFLICT … DO UPDATE SET x = excluded.x`), `RETURNING` and `FILTER` are the
//! same in both and need no mark. What is a different *flow* rather than a different text —
//! advisory locks and `BEGIN IMMEDIATE`, `NOTIFY` against polling, `= ANY(array)` against a
//! list of placeholders — stays in the backend's own file.

/// A statement in both dialects (see the module docs); made by `sql!`.
#[derive(Clone, Copy, Debug)]
pub(super) struct Stmt {
    /// The SQLite text.
    pub sqlite: &'static str,
    /// The PostgreSQL text.
    pub pg: &'static str,
}

/// Render `template` for PostgreSQL (`pg`) or SQLite into `out`; returns the length of the
/// text. With an `out` shorter than the text (e.g. empty) it only measures. Panics — at
/// compile time, inside `sql!` — on an unclosed `{…}` or an unknown mark.
pub(super) const fn render(template: &str, pg: bool, out: &mut [u8]) -> usize {
    let t = template.as_bytes();
    let (mut i, mut n, mut next) = (0, 0, 1);
    let (mut bare, mut numbered) = (false, false);
    while i < t.len() {
        let c = t[i];
        if c == b'?' {
            // `?N`: an explicit number, the same in both dialects.
            let mut j = i + 1;
            let mut num = 0;
            while j < t.len() && t[j].is_ascii_digit() {
                num = num * 10 + (t[j] - b'0') as usize;
                j += 1;
            }
            if j == i + 1 {
                bare = true;
            } else {
                numbered = true;
            }
            assert!(!(bare && numbered), "a SQL template numbers all its parameters or none");
            if !pg {
                n = put(out, n, t, i, j);
            } else {
                if j == i + 1 {
                    num = next;
                    next += 1;
                }
                n = put(out, n, b"$", 0, 1);
                n = put_number(out, n, num);
            }
            i = j;
        } else if c == b'{' {
            let mut j = i + 1;
            while j < t.len() && t[j] != b'}' {
                j += 1;
            }
            assert!(j < t.len(), "unclosed `{{` in a SQL template");
            let mark = t.split_at(j).0.split_at(i + 1).1;
            n = if eq(mark, b"now") {
                put(out, n, if pg { PG_NOW } else { SQLITE_NOW }, 0, usize::MAX)
            } else if eq(mark, b"true") {
                put(out, n, if pg { b"TRUE" } else { b"1" }, 0, usize::MAX)
            } else if eq(mark, b"false") {
                put(out, n, if pg { b"FALSE" } else { b"0" }, 0, usize::MAX)
            } else if eq(mark, b"greatest") {
                put(out, n, if pg { b"GREATEST" } else { b"MAX" }, 0, usize::MAX)
            } else if eq(mark, b"strpos") {
                put(out, n, if pg { b"strpos" } else { b"instr" }, 0, usize::MAX)
            } else if starts(mark, b"pg:") {
                if pg {
                    put(out, n, mark, 3, usize::MAX)
                } else {
                    n
                }
            } else if starts(mark, b"sqlite:") {
                if pg {
                    n
                } else {
                    put(out, n, mark, 7, usize::MAX)
                }
            } else {
                panic!("unknown mark in a SQL template")
            };
            i = j + 1;
        } else {
            n = put(out, n, t, i, i + 1);
            i += 1;
        }
    }
    n
}

/// The database clock as Unix ms on SQLite (the host clock, read inside the statement).
const SQLITE_NOW: &[u8] = b"CAST((julianday('now') - 2440587.5) * 86400000.0 AS INTEGER)";
/// The database clock as Unix ms on PostgreSQL (a function of the migrations).
const PG_NOW: &[u8] = b"ferry_now_ms()";

/// Copy `src[from..to.min(len)]` to `out` at `n` (as far as `out` reaches); the new length.
const fn put(out: &mut [u8], mut n: usize, src: &[u8], from: usize, to: usize) -> usize {
    let mut k = from;
    let end = if to < src.len() { to } else { src.len() };
    while k < end {
        if n < out.len() {
            out[n] = src[k];
        }
        n += 1;
        k += 1;
    }
    n
}

const fn put_number(out: &mut [u8], n: usize, num: usize) -> usize {
    assert!(num >= 1 && num < 100, "SQL parameters are numbered 1 to 99");
    if num >= 10 {
        let n = put(out, n, &[b'0' + (num / 10) as u8], 0, 1);
        put(out, n, &[b'0' + (num % 10) as u8], 0, 1)
    } else {
        put(out, n, &[b'0' + num as u8], 0, 1)
    }
}

const fn eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && starts(a, b)
}

const fn starts(a: &[u8], prefix: &[u8]) -> bool {
    if a.len() < prefix.len() {
        return false;
    }
    let mut k = 0;
    while k < prefix.len() {
        if a[k] != prefix[k] {
            return false;
        }
        k += 1;
    }
    true
}

/// The text `render` wrote (const: inside `sql!`).
pub(super) const fn text(bytes: &'static [u8]) -> &'static str {
    match std::str::from_utf8(bytes) {
        Ok(s) => s,
        Err(_) => panic!("a SQL template rendered to invalid UTF-8"),
    }
}

/// A [`Stmt`] from a template made of string literals and macros that expand to them (as
/// `concat!` takes them), rendered for both databases during compilation.
macro_rules! sql {
    ($($part:tt)+) => {{
        const TEMPLATE: &str = concat!($($part)+);
        const SQLITE_LEN: usize = $crate::catalog::dialect::render(TEMPLATE, false, &mut []);
        const PG_LEN: usize = $crate::catalog::dialect::render(TEMPLATE, true, &mut []);
        const SQLITE: [u8; SQLITE_LEN] = {
            let mut out = [0u8; SQLITE_LEN];
            $crate::catalog::dialect::render(TEMPLATE, false, &mut out);
            out
        };
        const PG: [u8; PG_LEN] = {
            let mut out = [0u8; PG_LEN];
            $crate::catalog::dialect::render(TEMPLATE, true, &mut out);
            out
        };
        $crate::catalog::dialect::Stmt { sqlite: $crate::catalog::dialect::text(&SQLITE), pg: $crate::catalog::dialect::text(&PG) }
    }};
}
pub(super) use sql;

#[cfg(test)]
mod tests {
    const S: super::Stmt =
        sql!("UPDATE t SET a = ?, b = {now} + ? WHERE c = {false} AND d = {greatest}(e, ?)", " RETURNING x{pg: FOR UPDATE}{sqlite:;}");
    const N: super::Stmt = sql!("SELECT ?1, ?12::int4[], ?1 WHERE {strpos}(a, ?2) > 0 AND b = {true}");

    #[test]
    fn placeholders_and_marks_render_per_dialect() {
        assert_eq!(
            S.sqlite,
            "UPDATE t SET a = ?, b = CAST((julianday('now') - 2440587.5) * 86400000.0 AS INTEGER) + ? WHERE c = 0 AND d = MAX(e, ?) RETURNING x;"
        );
        assert_eq!(S.pg, "UPDATE t SET a = $1, b = ferry_now_ms() + $2 WHERE c = FALSE AND d = GREATEST(e, $3) RETURNING x FOR UPDATE");
        assert_eq!(N.sqlite, "SELECT ?1, ?12::int4[], ?1 WHERE instr(a, ?2) > 0 AND b = 1");
        assert_eq!(N.pg, "SELECT $1, $12::int4[], $1 WHERE strpos(a, $2) > 0 AND b = TRUE");
    }
}
