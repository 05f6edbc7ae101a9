//! Helpers shared by the engine's unit tests.

/// `n` bytes of a fixed xorshift sequence from `seed` (non-zero): incompressible, and the same in
/// every run.
pub(crate) fn pseudo_random_bytes(seed: u64, n: usize) -> Vec<u8> {
    let mut x = seed;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}
