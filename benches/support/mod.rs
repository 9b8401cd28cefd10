//! Helpers shared by the bench targets (each bench is its own crate; include with
//! `#[path = "support/mod.rs"] mod support;`).
#![allow(dead_code)] // each bench uses its own subset

/// Wait for a just-spawned `ferry serve` (stdout piped) to print `listening on URL`; returns
/// the URL without a trailing `/`. The rest of stdout is drained on a thread so the server
/// never blocks writing it. Panics if ferry exits first.
pub fn wait_listening(child: &mut std::process::Child) -> String {
    use std::io::BufRead;
    let mut lines = std::io::BufReader::new(child.stdout.take().expect("ferry's stdout is piped")).lines();
    let base = loop {
        let line = lines.next().expect("ferry exited before listening").expect("read ferry stdout");
        if let Some(rest) = line.strip_prefix("listening on ") {
            break rest.trim().trim_end_matches('/').to_string();
        }
    };
    std::thread::spawn(move || for _ in lines.by_ref() {});
    base
}

/// Deterministic pseudo-random bytes (xorshift64): incompressible, the same for a seed.
pub fn pseudo_random(len: usize, seed: u64) -> Vec<u8> {
    let mut out = Vec::with_capacity(len + 8);
    let mut x = seed | 1;
    while out.len() < len {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        out.extend_from_slice(&x.to_le_bytes());
    }
    out.truncate(len);
    out
}
