//! Bloom-filter summaries of page contents (thesis 004, section 5.2.1.3; Fan et al.'s Summary Cache).
//!
//! A filter has `m` bits and `k` hash functions. Inserting a page's content sets its `k` bit positions;
//! a query answers "possibly present" (all `k` set) or "definitely absent". The `k` positions come from
//! the page's 128-bit content hash by double hashing (`h1 + i·h2 mod m`, Kirsch and Mitzenmacher), so the
//! filter costs no extra pass over the page and a peer can query with the hash alone.
//!
//! Removal — the thesis's question of what to do when a page leaves the cache — is a setting:
//! * [`Removal::NoUnset`] (the thesis's choice): bits are never cleared. No false negatives ever; false
//!   positives grow until the filter is rebuilt from the live frames (the daemon rebuilds before each
//!   publication, so staleness is bounded by the publication period).
//! * [`Removal::Counting`] (Fan et al.'s fix): a 4-bit saturating counter per position; removal
//!   decrements. A counter that saturated is never decremented again (it might otherwise underflow and
//!   cause a false negative), so the filter stays free of false negatives at 4x the memory.
//!
//! The expected false-positive rate with `n` distinct insertions is `(1 - e^(-k·n/m))^k`.

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Removal {
    #[default]
    NoUnset,
    Counting,
}

/// Size and behaviour of a summary. Plain data; `validate` names a bad field.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct BloomConfig {
    /// Bits in the filter. Default 8 Mi (1 MiB), about 10 bits per page for 800 k pages (3 GiB).
    pub m_bits: u64,
    /// Hash functions. Default 7 (optimal for 10 bits per element).
    pub k_hashes: u32,
    pub removal: Removal,
}

impl Default for BloomConfig {
    fn default() -> Self {
        BloomConfig { m_bits: 8 << 20, k_hashes: 7, removal: Removal::NoUnset }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum BloomError {
    #[error("invalid bloom filter setting {field}: {reason}")]
    Invalid { field: &'static str, reason: String },
    #[error("a summary of {got} bytes does not match m = {m_bits} bits")]
    BadSummary { m_bits: u64, got: usize },
}

impl BloomConfig {
    pub fn validate(&self) -> Result<(), BloomError> {
        if self.m_bits < 64 || !self.m_bits.is_multiple_of(64) {
            return Err(BloomError::Invalid {
                field: "m_bits",
                reason: "must be a multiple of 64, at least 64".into(),
            });
        }
        if self.k_hashes == 0 || self.k_hashes > 32 {
            return Err(BloomError::Invalid { field: "k_hashes", reason: "must be within 1..=32".into() });
        }
        Ok(())
    }

    /// `(1 - e^(-k n / m))^k`.
    pub fn expected_false_positive_rate(&self, n: u64) -> f64 {
        let k = self.k_hashes as f64;
        (1.0 - (-k * n as f64 / self.m_bits as f64).exp()).powf(k)
    }
}

/// A content summary.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BloomFilter {
    cfg: BloomConfig,
    bits: Vec<u64>,
    /// 4-bit counters, two per byte (counting variant only).
    counters: Vec<u8>,
}

const SATURATED: u8 = 15;

impl BloomFilter {
    pub fn new(cfg: BloomConfig) -> Result<Self, BloomError> {
        cfg.validate()?;
        let words = (cfg.m_bits / 64) as usize;
        let counters = match cfg.removal {
            Removal::Counting => vec![0u8; (cfg.m_bits as usize).div_ceil(2)],
            Removal::NoUnset => Vec::new(),
        };
        Ok(BloomFilter { cfg, bits: vec![0; words], counters })
    }

    pub fn config(&self) -> &BloomConfig {
        &self.cfg
    }

    fn positions(&self, hash: u128) -> impl Iterator<Item = u64> + '_ {
        let h1 = hash as u64;
        // An odd step visits distinct positions for power-of-two m and is never 0.
        let h2 = ((hash >> 64) as u64) | 1;
        let m = self.cfg.m_bits;
        (0..self.cfg.k_hashes as u64).map(move |i| h1.wrapping_add(i.wrapping_mul(h2)) % m)
    }

    fn counter(&self, pos: u64) -> u8 {
        let b = self.counters[(pos / 2) as usize];
        if pos.is_multiple_of(2) {
            b & 0x0f
        } else {
            b >> 4
        }
    }

    fn set_counter(&mut self, pos: u64, v: u8) {
        let b = &mut self.counters[(pos / 2) as usize];
        *b = if pos.is_multiple_of(2) { (*b & 0xf0) | v } else { (*b & 0x0f) | (v << 4) };
    }

    /// Records a content hash.
    pub fn insert(&mut self, hash: u128) {
        let positions: Vec<u64> = self.positions(hash).collect();
        for p in positions {
            self.bits[(p / 64) as usize] |= 1 << (p % 64);
            if self.cfg.removal == Removal::Counting {
                let c = self.counter(p);
                if c < SATURATED {
                    self.set_counter(p, c + 1);
                }
            }
        }
    }

    /// Forgets a content hash that was inserted (counting variant; a no-op with `NoUnset`).
    pub fn remove(&mut self, hash: u128) {
        if self.cfg.removal != Removal::Counting {
            return;
        }
        let positions: Vec<u64> = self.positions(hash).collect();
        for p in positions {
            let c = self.counter(p);
            if c == 0 || c == SATURATED {
                continue;
            }
            self.set_counter(p, c - 1);
            if c == 1 {
                self.bits[(p / 64) as usize] &= !(1 << (p % 64));
            }
        }
    }

    /// "Possibly present" (true) or "definitely absent" (false).
    pub fn may_contain(&self, hash: u128) -> bool {
        self.positions(hash).all(|p| self.bits[(p / 64) as usize] & (1 << (p % 64)) != 0)
    }

    /// The bit array as published to peers (little-endian words; counters stay local).
    pub fn summary(&self) -> Vec<u8> {
        self.bits.iter().flat_map(|w| w.to_le_bytes()).collect()
    }

    /// A peer's published summary, for querying.
    pub fn from_summary(cfg: BloomConfig, bytes: &[u8]) -> Result<Self, BloomError> {
        let mut f = BloomFilter::new(BloomConfig { removal: Removal::NoUnset, ..cfg })?;
        if bytes.len() as u64 * 8 != cfg.m_bits {
            return Err(BloomError::BadSummary { m_bits: cfg.m_bits, got: bytes.len() });
        }
        for (w, chunk) in f.bits.iter_mut().zip(bytes.chunks_exact(8)) {
            *w = u64::from_le_bytes(chunk.try_into().expect("chunks of 8"));
        }
        Ok(f)
    }

    /// Fraction of bits set.
    pub fn fill_ratio(&self) -> f64 {
        self.bits.iter().map(|w| w.count_ones() as u64).sum::<u64>() as f64 / self.cfg.m_bits as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};

    fn measured_fp(cfg: BloomConfig, n: u64, probes: u64, seed: u64) -> f64 {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
        let mut f = BloomFilter::new(cfg).unwrap();
        for _ in 0..n {
            f.insert(rng.gen());
        }
        let hits = (0..probes).filter(|_| f.may_contain(rng.gen())).count();
        hits as f64 / probes as f64
    }

    /// Acceptance 4 of the de-duplication issue: the measured false-positive rate is within 20% of
    /// `(1 - e^(-kn/m))^k`, for several configured sizes.
    #[test]
    fn false_positive_rate_matches_the_formula_within_20_percent() {
        for (m_bits, k, n) in [
            (1u64 << 20, 7u32, 100_000u64),
            (1 << 20, 3, 150_000),
            (1 << 18, 5, 30_000),
            (1 << 22, 10, 300_000),
        ] {
            let cfg = BloomConfig { m_bits, k_hashes: k, removal: Removal::NoUnset };
            let expected = cfg.expected_false_positive_rate(n);
            let measured = measured_fp(cfg, n, 400_000, m_bits ^ k as u64);
            eprintln!("m={m_bits} k={k} n={n}: expected {expected:.5}, measured {measured:.5}");
            assert!(
                (measured / expected - 1.0).abs() <= 0.2,
                "m={m_bits} k={k} n={n}: {measured} vs {expected}"
            );
        }
    }

    #[test]
    fn no_false_negatives_and_summaries_round_trip() {
        let cfg = BloomConfig { m_bits: 1 << 16, k_hashes: 4, removal: Removal::NoUnset };
        let mut f = BloomFilter::new(cfg).unwrap();
        let hashes: Vec<u128> =
            (0..2000u128).map(|i| i.wrapping_mul(0x9E37_79B9_7F4A_7C15_F39C_C060_5CED_C835)).collect();
        for h in &hashes {
            f.insert(*h);
        }
        let peer = BloomFilter::from_summary(cfg, &f.summary()).unwrap();
        assert!(hashes.iter().all(|h| f.may_contain(*h) && peer.may_contain(*h)));
        // No-unset: removal keeps the bits.
        f.remove(hashes[0]);
        assert!(f.may_contain(hashes[0]));
        assert!(BloomFilter::from_summary(cfg, &[0u8; 3]).is_err());
    }

    #[test]
    fn counting_filter_forgets_removed_content_without_false_negatives() {
        let cfg = BloomConfig { m_bits: 1 << 16, k_hashes: 4, removal: Removal::Counting };
        let mut f = BloomFilter::new(cfg).unwrap();
        let a = 0x1234_5678_9abc_def0_1122_3344_5566_7788u128;
        let b = 0x0fed_cba9_8765_4321_8877_6655_4433_2211u128;
        f.insert(a);
        f.insert(b);
        f.remove(a);
        assert!(!f.may_contain(a), "the removed content is gone");
        assert!(f.may_contain(b), "no false negative for what remains");
        // Saturated counters never go back down.
        for _ in 0..40 {
            f.insert(b);
        }
        for _ in 0..40 {
            f.remove(b);
        }
        assert!(f.may_contain(b));
    }

    #[test]
    fn config_is_validated() {
        assert!(BloomConfig { m_bits: 100, ..Default::default() }.validate().is_err());
        assert!(BloomConfig { k_hashes: 0, ..Default::default() }.validate().is_err());
        BloomConfig::default().validate().unwrap();
    }
}
