//! Miniature simulation (Waldspurger et al., ATC'17): the curve of any policy from scaled-down caches.
//!
//! The keys are sampled as in SHARDS; for each configured size `S` a cache of the policy with capacity
//! `round(R x S)` is fed the sampled references. Its miss count, scaled by `1 / R`, estimates the misses
//! of the full cache; as in SHARDS_adj it is divided by the real number of references. With fixed-size
//! sampling, when the rate falls from `R` to `R'` the dropped key leaves every cache and each capacity
//! shrinks to `round(R' x S)`; a miss is counted with the weight `1 / R` of the rate at its time.
//!
//! Invariants: one cache per size, sizes ascending; with fixed-size sampling at most `max_samples`
//! keys are tracked, and every cache holds only tracked keys.

use crate::sampler::{sample_hash, Sampler, DEFAULT_SEED};
use crate::sim::CacheSim;
use crate::{Curve, Mrc, MrcError, MrcStats, Policy, Sampling, Unit};
use std::collections::{BinaryHeap, HashMap};

/// Miniature simulation of a policy at a set of sizes.
#[derive(Debug)]
pub struct MiniSim {
    policy: Policy,
    unit: Unit,
    sizes: Vec<u64>,
    caches: Vec<CacheSim>,
    /// Weighted misses per size.
    misses: Vec<f64>,
    sampler: Sampler,
    max_samples: Option<usize>,
    heap: BinaryHeap<(u64, u64)>,
    /// Keys sampled so far (fixed rate: all of them; fixed size: the tracked ones), with their sizes.
    tracked: HashMap<u64, u64, foldhash::fast::FixedState>,
    tracked_units: u64,
    requests: u64,
    sampled_requests: u64,
}

impl MiniSim {
    /// Simulates `policy` at `sizes` (in `unit`; sorted and deduplicated here, 0 dropped), sampling as
    /// `sampling` says.
    pub fn new(policy: Policy, sizes: &[u64], sampling: Sampling, unit: Unit) -> Result<MiniSim, MrcError> {
        MiniSim::seeded(policy, sizes, sampling, unit, DEFAULT_SEED)
    }

    /// [`MiniSim::new`] with a sampling seed of your own.
    pub fn seeded(
        policy: Policy,
        sizes: &[u64],
        sampling: Sampling,
        unit: Unit,
        seed: u64,
    ) -> Result<MiniSim, MrcError> {
        sampling.validate()?;
        let mut sizes: Vec<u64> = sizes.iter().copied().filter(|&s| s > 0).collect();
        sizes.sort_unstable();
        sizes.dedup();
        if sizes.is_empty() {
            return Err(MrcError::invalid("sizes", "miniature simulation needs at least one size above 0"));
        }
        let (sampler, max_samples) = match sampling {
            Sampling::Rate(r) => (Sampler::with_rate(r, seed), None),
            Sampling::MaxSamples(n) => (Sampler::with_rate(1.0, seed), Some(n)),
        };
        let rate = sampler.rate();
        let caches = sizes.iter().map(|&s| CacheSim::new(policy, scaled(s, rate))).collect();
        Ok(MiniSim {
            policy,
            unit,
            misses: vec![0.0; sizes.len()],
            sizes,
            caches,
            sampler,
            max_samples,
            heap: BinaryHeap::new(),
            tracked: HashMap::with_hasher(foldhash::fast::FixedState::with_seed(0x31_5e)),
            tracked_units: 0,
            requests: 0,
            sampled_requests: 0,
        })
    }

    pub fn policy(&self) -> Policy {
        self.policy
    }

    /// The simulated sizes (full scale, in the model's unit).
    pub fn sizes(&self) -> &[u64] {
        &self.sizes
    }

    #[cold]
    fn sampled_access(&mut self, key: u64, h: u64, size: u64) {
        if self.tracked.insert(key, size).is_none() {
            self.tracked_units += size;
            if let Some(max) = self.max_samples {
                self.heap.push((h, key));
                if self.heap.len() > max {
                    let (top_hash, top_key) = self.heap.pop().expect("the heap is over its bound");
                    self.tracked_units -= self.tracked.remove(&top_key).expect("heap keys are tracked");
                    self.sampler.max_hash = top_hash - 1;
                    let rate = self.sampler.rate();
                    for (cache, &s) in self.caches.iter_mut().zip(&self.sizes) {
                        cache.remove(top_key);
                        cache.set_capacity(scaled(s, rate));
                    }
                    if top_key == key {
                        return;
                    }
                }
            }
        }
        let weight = 1.0 / self.sampler.rate();
        self.sampled_requests += 1;
        for (cache, m) in self.caches.iter_mut().zip(self.misses.iter_mut()) {
            if !cache.access(key, size) {
                *m += weight;
            }
        }
    }
}

/// A full-scale capacity scaled by the sampling rate, rounded to the nearest unit.
fn scaled(size: u64, rate: f64) -> u64 {
    (size as f64 * rate).round() as u64
}

impl Mrc for MiniSim {
    #[inline]
    fn access_sized(&mut self, key: u64, size_bytes: u32) {
        self.requests += 1;
        let h = sample_hash(key, self.sampler.seed);
        if h > self.sampler.max_hash {
            return;
        }
        let size = match self.unit {
            Unit::Pages => 1,
            Unit::Bytes => size_bytes.max(1) as u64,
        };
        self.sampled_access(key, h, size);
    }

    fn curve(&self) -> Curve {
        let n = self.requests.max(1) as f64;
        let at = |s: u64| self.sizes.binary_search(&s).map_or(1.0, |i| self.misses[i] / n);
        Curve::from_fn(self.unit, &self.sizes, at)
    }

    /// Interpolated between the simulated sizes (flat after the largest).
    fn curve_at(&self, sizes: &[u64]) -> Curve {
        self.curve().resample(sizes)
    }

    fn stats(&self) -> MrcStats {
        let rate = self.sampler.rate();
        MrcStats {
            requests: self.requests,
            sampled_requests: self.sampled_requests,
            unique: (self.tracked.len() as f64 / rate).round() as u64,
            footprint: (self.tracked_units as f64 / rate).round() as u64,
            sampling_rate: rate,
            tracked_keys: self.tracked.len() as u64,
        }
    }
}
