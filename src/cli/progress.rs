//! Transfer progress on stderr: an indicatif bar (bytes, rate, ETA) when stderr is a
//! terminal, otherwise plain lines — at most one per second, plus one at each milestone the
//! server confirmed — so logs of scripted runs stay readable.

use std::io::IsTerminal;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

/// Least time between two plain progress lines.
const PLAIN_EVERY: Duration = Duration::from_secs(1);

/// Progress of one transfer of `total` bytes (shared by parallel parts).
pub struct Progress {
    bar: Option<ProgressBar>,
    label: String,
    total: u64,
    quiet: bool,
    state: Mutex<Plain>,
}

struct Plain {
    /// Position shown: the most bytes ever reached, so progress never goes backwards.
    pos: u64,
    /// Where the transfer really is (a resume may move it below `pos`).
    actual: u64,
    /// A resume went back: say so once, until `actual` catches up with `pos`.
    behind_noted: bool,
    start: Instant,
    /// Bytes that went over the wire (the rate), unlike `pos`, which a resume moves.
    moved: u64,
    last_line: Option<Instant>,
    /// Position shown by the last line.
    last_pos: Option<u64>,
}

impl Progress {
    /// Progress for `label` (a file name), `total` bytes, starting at `pos`. `quiet` prints
    /// nothing.
    pub fn new(label: &str, total: u64, pos: u64, quiet: bool) -> Progress {
        let bar = (!quiet && std::io::stderr().is_terminal()).then(|| {
            let b = ProgressBar::with_draw_target(Some(total), ProgressDrawTarget::stderr());
            b.set_style(
                ProgressStyle::with_template("{msg} [{bar:30.cyan/blue}] {binary_bytes}/{binary_total_bytes} {binary_bytes_per_sec} ETA {eta}")
                    .expect("valid template")
                    .progress_chars("=> "),
            );
            b.set_message(label.to_string());
            b.set_position(pos);
            b.reset_eta();
            b
        });
        Progress {
            bar,
            label: label.to_string(),
            total,
            quiet,
            state: Mutex::new(Plain { pos, actual: pos, behind_noted: false, start: Instant::now(), moved: 0, last_line: None, last_pos: None }),
        }
    }

    /// `n` more bytes went over the wire.
    pub fn inc(&self, n: u64) {
        let mut s = self.state.lock().expect("progress lock");
        s.actual = (s.actual + n).min(self.total);
        s.moved += n;
        self.show(&mut s, false);
    }

    /// The position is `pos` (the server's offset after a resume, which may be below what was
    /// sent: bytes the server did not keep are sent again). The display never goes backwards:
    /// it holds the most reached so far, with a note, until the transfer passes it again.
    /// With `milestone` (the server confirmed this offset), a plain line is printed now if
    /// none was printed yet.
    pub fn set(&self, pos: u64, milestone: bool) {
        let mut s = self.state.lock().expect("progress lock");
        s.actual = pos.min(self.total);
        if s.actual < s.pos && !s.behind_noted {
            s.behind_noted = true;
            let (kept, shown) = (s.actual, s.pos);
            drop(s);
            self.note(&format!("the server kept {kept} bytes; sending again from there (progress stays at {shown} until it is passed)"));
            s = self.state.lock().expect("progress lock");
        }
        let first = milestone && s.last_line.is_none();
        self.show(&mut s, first);
    }

    /// The position shown (the most reached so far), in bytes.
    pub fn shown(&self) -> u64 {
        self.state.lock().expect("progress lock").pos
    }

    fn show(&self, s: &mut Plain, force: bool) {
        if s.actual >= s.pos {
            s.pos = s.actual;
            s.behind_noted = false;
        }
        if let Some(b) = &self.bar {
            b.set_position(s.pos);
        }
        self.plain_line(s, force);
    }

    /// A status message (a bar shows it in place of the file name; plain mode prints a line).
    pub fn note(&self, msg: &str) {
        if self.quiet {
            return;
        }
        match &self.bar {
            Some(b) => b.println(format!("ferry: {}: {msg}", self.label)),
            None => eprintln!("ferry: {}: {msg}", self.label),
        }
    }

    /// Remove the bar (the summary goes to stdout).
    pub fn finish(&self) {
        if let Some(b) = &self.bar {
            b.finish_and_clear();
        }
        if self.bar.is_none() && !self.quiet {
            let mut s = self.state.lock().expect("progress lock");
            if s.last_pos != Some(s.pos) {
                self.plain_line(&mut s, true);
            }
        }
    }

    fn plain_line(&self, s: &mut Plain, force: bool) {
        if self.bar.is_some() || self.quiet {
            return;
        }
        let now = Instant::now();
        if !force && s.last_line.is_some_and(|t| now.duration_since(t) < PLAIN_EVERY) {
            return;
        }
        if !force && s.last_line.is_none() && s.moved == 0 {
            return;
        }
        s.last_line = Some(now);
        s.last_pos = Some(s.pos);
        let secs = now.duration_since(s.start).as_secs_f64().max(1e-3);
        let rate = s.moved as f64 / secs;
        let pct = if self.total == 0 { 100.0 } else { s.pos as f64 * 100.0 / self.total as f64 };
        let eta = if rate > 0.0 && s.pos < self.total {
            format!(", ETA {}", humantime::format_duration(Duration::from_secs(((self.total - s.pos) as f64 / rate).ceil() as u64)))
        } else {
            String::new()
        };
        eprintln!("ferry: {}: {}/{} bytes ({pct:.1}%), {}/s{eta}", self.label, s.pos, self.total, bytesize::ByteSize::b(rate as u64).display().iec(),);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn progress_never_goes_backwards() {
        let p = Progress::new("f", 1000, 0, true);
        p.inc(600);
        assert_eq!(p.shown(), 600);
        // The server kept only 200 bytes: they are sent again, the display holds at 600.
        p.set(200, false);
        assert_eq!(p.shown(), 600);
        p.inc(300);
        assert_eq!(p.shown(), 600);
        p.inc(200);
        assert_eq!(p.shown(), 700);
        p.set(1000, true);
        assert_eq!(p.shown(), 1000);
    }
}
