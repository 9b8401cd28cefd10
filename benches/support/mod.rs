//! Helpers shared by the bench targets (each bench is its own crate; include with
//! `#[path = "support/mod.rs"] mod support;`).

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
