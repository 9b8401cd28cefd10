//! Transfer progress on stderr: an indicatif bar (bytes, rate, ETA) when stderr is a
//! terminal, otherwise plain lines — at most one per second, plus one at each milestone the
//! server confirmed — so logs of scripted runs stay readable.
//!
//! The rate is the transfer's: bytes that went over the wire ([`Progress::inc`]) divided by the
//! time since the first of them. Moving the position without a transfer ([`Progress::set`]:
//! a resume starting at the server's offset, a local prefix re-hashed) changes neither, so a
//! resumed upload does not show the bytes it skipped as speed. A transfer of unknown length
//! (an upload from a pipe) shows bytes and rate without a percentage or ETA.

use std::io::IsTerminal;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressState, ProgressStyle};

/// Least time between two plain progress lines.
const PLAIN_EVERY: Duration = Duration::from_secs(1);

/// Progress of one transfer of `total` bytes (shared by parallel parts).
pub struct Progress {
    bar: Option<ProgressBar>,
    label: String,
    /// `None`: not known (yet).
    total: Option<u64>,
    quiet: bool,
    rate: Arc<Mutex<Rate>>,
    state: Mutex<Plain>,
}

/// The transfer rate: bytes moved over the wire since the first of them.
#[derive(Default)]
struct Rate {
    first: Option<Instant>,
    moved: u64,
}

impl Rate {
    fn add(&mut self, n: u64, now: Instant) {
        self.first.get_or_insert(now);
        self.moved += n;
    }

    /// Bytes per second, 0 before two readings make sense.
    fn per_second(&self) -> f64 {
        self.measured_at(Instant::now()).unwrap_or(0.0)
    }

    /// Bytes per second, or `None` while it cannot be measured: nothing moved yet, or too
    /// short a time (a small file moved in one go is not "0 B/s").
    fn measured_at(&self, now: Instant) -> Option<f64> {
        let secs = now.duration_since(self.first?).as_secs_f64();
        (secs >= 0.05 && self.moved > 0).then(|| self.moved as f64 / secs)
    }
}

/// `, 12.0 MiB/s` and `, ETA 3m 20s` for a plain progress line: nothing when the rate is not
/// known.
fn speed_and_eta(rate: Option<f64>, left: Option<u64>) -> String {
    let Some(rate) = rate else { return String::new() };
    let eta = left.and_then(|l| eta(l, rate)).map(|e| format!(", ETA {e}")).unwrap_or_default();
    format!(", {}/s{eta}", bytesize::ByteSize::b(rate as u64).display().iec())
}

/// The time `left` bytes take at `rate` bytes per second, e.g. `3m 20s`.
fn eta(left: u64, rate: f64) -> Option<String> {
    (rate > 0.0 && left > 0).then(|| humantime::format_duration(Duration::from_secs((left as f64 / rate).ceil() as u64)).to_string())
}

struct Plain {
    /// Position shown: the most bytes ever reached, so progress never goes backwards.
    pos: u64,
    /// Where the transfer really is (a resume may move it below `pos`).
    actual: u64,
    /// A resume went back: say so once, until `actual` catches up with `pos`.
    behind_noted: bool,
    last_line: Option<Instant>,
    /// Position shown by the last line.
    last_pos: Option<u64>,
}

impl Progress {
    /// Progress for `label` (a file name), `total` bytes, starting at `pos`. `quiet` prints
    /// nothing.
    pub fn new(label: &str, total: u64, pos: u64, quiet: bool) -> Progress {
        Progress::with_total(label, Some(total), pos, quiet)
    }

    /// Progress of a transfer whose length is not known yet (an upload from a pipe).
    pub fn unknown(label: &str, quiet: bool) -> Progress {
        Progress::with_total(label, None, 0, quiet)
    }

    fn with_total(label: &str, total: Option<u64>, pos: u64, quiet: bool) -> Progress {
        let rate = Arc::new(Mutex::new(Rate::default()));
        let bar = (!quiet && std::io::stderr().is_terminal()).then(|| {
            let b = ProgressBar::with_draw_target(total, ProgressDrawTarget::stderr());
            let template = match total {
                Some(_) => "{msg} [{bar:30.cyan/blue}] {binary_bytes}/{binary_total_bytes} {rate} ETA {eta_moved}",
                None => "{msg} {spinner} {binary_bytes} {rate}",
            };
            let (r1, r2) = (rate.clone(), rate.clone());
            b.set_style(
                ProgressStyle::with_template(template)
                    .expect("valid template")
                    .with_key("rate", move |_: &ProgressState, w: &mut dyn std::fmt::Write| {
                        let _ = write!(w, "{}/s", bytesize::ByteSize::b(r1.lock().expect("rate lock").per_second() as u64).display().iec());
                    })
                    .with_key("eta_moved", move |s: &ProgressState, w: &mut dyn std::fmt::Write| {
                        let left = s.len().unwrap_or(0).saturating_sub(s.pos());
                        let _ = write!(w, "{}", eta(left, r2.lock().expect("rate lock").per_second()).unwrap_or_else(|| "-".into()));
                    })
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
            rate,
            state: Mutex::new(Plain { pos, actual: pos, behind_noted: false, last_line: None, last_pos: None }),
        }
    }

    /// `n` more bytes went over the wire.
    pub fn inc(&self, n: u64) {
        self.rate.lock().expect("rate lock").add(n, Instant::now());
        let mut s = self.state.lock().expect("progress lock");
        s.actual = (s.actual + n).min(self.total.unwrap_or(u64::MAX));
        self.show(&mut s, false);
    }

    /// The length became known (the end of a pipe was read).
    pub fn set_total(&self, total: u64) {
        if let Some(b) = &self.bar {
            b.set_length(total);
        }
    }

    /// The position is `pos` (the server's offset after a resume, which may be below what was
    /// sent: bytes the server did not keep are sent again). The display never goes backwards:
    /// it holds the most reached so far, with a note, until the transfer passes it again.
    /// With `milestone` (the server confirmed this offset), a plain line is printed now if
    /// none was printed yet, and the position only moves forward: a confirmed offset below
    /// what was sent means other bytes are still on their way (the other parts of a
    /// `--parallel` upload), not that the server lost any.
    pub fn set(&self, pos: u64, milestone: bool) {
        self.update(pos, milestone, milestone);
    }

    /// The server has at least `pos` bytes (a part of a `--parallel` upload starting or
    /// resuming): the position only moves forward, and no line is forced.
    pub fn reached(&self, pos: u64) {
        self.update(pos, true, false);
    }

    fn update(&self, pos: u64, forward_only: bool, line_now: bool) {
        let mut s = self.state.lock().expect("progress lock");
        let pos = pos.min(self.total.unwrap_or(u64::MAX));
        s.actual = if forward_only { s.actual.max(pos) } else { pos };
        if s.actual < s.pos && !s.behind_noted {
            s.behind_noted = true;
            let (kept, shown) = (s.actual, s.pos);
            drop(s);
            self.note(&format!("the server kept {kept} bytes; sending again from there (progress stays at {shown} until it is passed)"));
            s = self.state.lock().expect("progress lock");
        }
        let first = line_now && s.last_line.is_none();
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
        let rate = self.rate.lock().expect("rate lock").measured_at(now);
        if !force && s.last_line.is_none() && rate.is_none() {
            return;
        }
        s.last_line = Some(now);
        s.last_pos = Some(s.pos);
        match self.total {
            Some(total) => {
                let pct = if total == 0 { 100.0 } else { s.pos as f64 * 100.0 / total as f64 };
                eprintln!("ferry: {}: {}/{total} bytes ({pct:.1}%){}", self.label, s.pos, speed_and_eta(rate, Some(total.saturating_sub(s.pos))));
            }
            None => eprintln!("ferry: {}: {} bytes{}", self.label, s.pos, speed_and_eta(rate, None)),
        }
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

    /// Issue 13 item 11: a position reached without a transfer (a resume at the server's
    /// offset, a re-hashed local prefix) is not speed; the rate counts moved bytes from the
    /// first of them.
    #[test]
    fn rate_counts_only_moved_bytes() {
        let t0 = Instant::now();
        let mut r = Rate::default();
        assert_eq!(r.measured_at(t0 + Duration::from_secs(5)), None, "nothing moved yet");
        // 10 s spent re-hashing before the first byte moves are not part of the rate.
        let first = t0 + Duration::from_secs(10);
        r.add(1000, first);
        r.add(1000, first + Duration::from_secs(1));
        assert_eq!(r.measured_at(first + Duration::from_secs(2)), Some(1000.0));
        // A resume that jumps the position by a GiB moves no bytes.
        let p = Progress::new("f", 1 << 30, 0, true);
        p.set(1 << 29, true);
        assert_eq!(p.rate.lock().unwrap().moved, 0);
        p.inc(10);
        assert_eq!(p.rate.lock().unwrap().moved, 10);
        assert_eq!(eta(2000, 1000.0).as_deref(), Some("2s"));
        assert_eq!(eta(0, 1000.0), None);
    }

    /// Issue 23 kind 17: a small file moved in one go shows no rate rather than "0 B/s".
    #[test]
    fn a_rate_too_quick_to_measure_is_not_zero() {
        let t0 = Instant::now();
        let mut r = Rate::default();
        r.add(5 << 20, t0);
        assert_eq!(r.measured_at(t0 + Duration::from_millis(3)), None);
        assert_eq!(speed_and_eta(None, Some(0)), "");
        assert_eq!(speed_and_eta(Some(2.0 * 1024.0 * 1024.0), Some(4 << 20)), ", 2.0 MiB/s, ETA 2s");
        assert!(!speed_and_eta(r.measured_at(t0 + Duration::from_millis(3)), Some(0)).contains("0 B/s"));
    }
}
