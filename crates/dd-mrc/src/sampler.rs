//! Spatial sampling by key hash (SHARDS): a key is sampled iff its hash is at most a threshold, so
//! every reference to a sampled key is sampled and the sampled keys are a uniform fraction of all keys.
//!
//! The hash is splitmix64's finaliser over `key ^ seed`: a bijection of `u64`, so distinct keys never
//! share a hash (fixed-size sampling evicts "the key with the largest hash", which is then one key) and
//! sequential ids spread uniformly.

/// The seed every model uses unless told otherwise (any fixed value; equal seeds give equal samples).
pub const DEFAULT_SEED: u64 = 0x5eed_dd00_2015_0001;

/// The sampling hash of `key` (a bijection for a given seed).
#[inline]
pub fn sample_hash(key: u64, seed: u64) -> u64 {
    let mut z = (key ^ seed).wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// A snapshot of a model's sampling filter: `Copy`, lock-free to use.
///
/// A fixed-size model only ever lowers its threshold, so a stale snapshot lets through a superset of
/// what the model samples now: filter with it outside a lock, then feed the survivors to the model
/// (which filters again) and report the rest with [`crate::Shards::skip`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sampler {
    pub(crate) seed: u64,
    /// Sampled iff `sample_hash(key) <= max_hash`.
    pub(crate) max_hash: u64,
}

impl Sampler {
    /// A filter that samples the fraction `rate` (in `(0, 1]`) of keys.
    pub(crate) fn with_rate(rate: f64, seed: u64) -> Sampler {
        let max_hash = if rate >= 1.0 { u64::MAX } else { ((rate * 2f64.powi(64)) as u64).saturating_sub(1) };
        Sampler { seed, max_hash }
    }

    /// Whether references to `key` are sampled.
    #[inline]
    pub fn sampled(&self, key: u64) -> bool {
        sample_hash(key, self.seed) <= self.max_hash
    }

    /// The fraction of keys sampled.
    pub fn rate(&self) -> f64 {
        (self.max_hash as f64 + 1.0) / 2f64.powi(64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sampled_fraction_matches_the_rate() {
        for rate in [0.5, 0.1, 0.01] {
            let s = Sampler::with_rate(rate, DEFAULT_SEED);
            let n = 200_000u64;
            let got = (0..n).filter(|&k| s.sampled(k)).count() as f64 / n as f64;
            assert!((got - rate).abs() < 4.0 * (rate / n as f64).sqrt() + 1e-4, "rate {rate}: {got}");
            assert!((s.rate() - rate).abs() < 1e-12);
        }
        assert!((0..1000).all(|k| Sampler::with_rate(1.0, 7).sampled(k)));
    }

    #[test]
    fn hash_is_seeded() {
        assert_ne!(sample_hash(1, 1), sample_hash(1, 2));
        assert_eq!(sample_hash(1, 1), sample_hash(1, 1));
    }
}
