//! Seeded synthetic traces and full-size reference simulations shared by the accuracy tests.
#![allow(dead_code)]

use dd_mrc::{CacheSim, Curve, Policy, Unit};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// Spreads small ids over the key space, as real ids are (sampling must not depend on it, but this
/// keeps the traces honest).
pub fn scramble(i: u64) -> u64 {
    i.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ 0x00dd_00dd
}

pub fn uniform(n: usize, keys: u64, seed: u64) -> Vec<u64> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    (0..n).map(|_| scramble(rng.gen_range(0..keys))).collect()
}

/// Zipf with exponent `s` over `keys` ranks (inverse CDF over a precomputed table).
pub fn zipf(n: usize, keys: u64, s: f64, seed: u64) -> Vec<u64> {
    let mut cdf = Vec::with_capacity(keys as usize);
    let mut sum = 0.0;
    for r in 1..=keys {
        sum += 1.0 / (r as f64).powf(s);
        cdf.push(sum);
    }
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    (0..n)
        .map(|_| {
            let u = rng.gen::<f64>() * sum;
            scramble(cdf.partition_point(|&c| c < u) as u64)
        })
        .collect()
}

/// A hot set read uniformly (`hot_share` of the references) while a long sequential scan loops over a
/// disjoint range of `scan_keys` keys: the pattern that defeats LRU and that S3-FIFO is built for.
pub fn scan_plus_hot(n: usize, hot_keys: u64, scan_keys: u64, hot_share: f64, seed: u64) -> Vec<u64> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut scan = 0;
    (0..n)
        .map(|_| {
            if rng.gen::<f64>() < hot_share {
                scramble(rng.gen_range(0..hot_keys))
            } else {
                scan = (scan + 1) % scan_keys;
                scramble(hot_keys + scan)
            }
        })
        .collect()
}

/// Distinct keys of a trace.
pub fn unique(trace: &[u64]) -> u64 {
    let mut v = trace.to_vec();
    v.sort_unstable();
    v.dedup();
    v.len() as u64
}

/// The curve of `policy` by full simulation at each size: the brute-force reference.
pub fn simulated(policy: Policy, trace: &[u64], sizes: &[u64]) -> Curve {
    let miss: Vec<f64> = sizes
        .iter()
        .map(|&s| {
            let mut c = CacheSim::new(policy, s);
            trace.iter().filter(|&&k| !c.access(k, 1)).count() as f64 / trace.len() as f64
        })
        .collect();
    let mut sizes = sizes.to_vec();
    let mut miss = miss;
    if sizes.first() != Some(&0) {
        sizes.insert(0, 0);
        miss.insert(0, 1.0);
    }
    Curve::new(Unit::Pages, sizes, miss).unwrap()
}
