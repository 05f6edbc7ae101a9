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

/// Independent brute-force references over dense ids `0..keys` (arrays instead of maps, a literal
/// reading of each policy), one full simulation per size.
pub mod reference {
    use std::collections::VecDeque;

    /// FIFO: insert on miss at the tail, evict at the head, hits change nothing.
    pub fn fifo_misses(trace: &[u32], keys: usize, cap: usize) -> u64 {
        let mut cached = vec![false; keys];
        let mut q = VecDeque::with_capacity(cap + 1);
        let mut misses = 0;
        for &k in trace {
            if cached[k as usize] {
                continue;
            }
            misses += 1;
            if cap == 0 {
                continue;
            }
            cached[k as usize] = true;
            q.push_back(k);
            if q.len() > cap {
                cached[q.pop_front().unwrap() as usize] = false;
            }
        }
        misses
    }

    /// S3-FIFO as `dd-engine` runs it: small queue (admission) and main queue, 2-bit frequency, the
    /// small queue evicted while it holds at least 10% of the cache, its hit heads promoted to main and
    /// the others remembered in a ghost queue as long as the cache's entry count (at least 16); a ghost
    /// hit enters main; main's head is reinserted with its frequency decremented until it reaches 0.
    pub fn s3fifo_misses(trace: &[u32], keys: usize, cap: usize) -> u64 {
        const NONE: u8 = 0;
        const SMALL: u8 = 1;
        const MAIN: u8 = 2;
        let mut place = vec![NONE; keys];
        let mut freq = vec![0u8; keys];
        let mut ghost_gen = vec![0u32; keys]; // generation of the key's live ghost record, 0 = none
        let (mut small, mut main) = (VecDeque::new(), VecDeque::new());
        let mut ghost: VecDeque<(u32, u32)> = VecDeque::new();
        let (mut ghost_len, mut gen) = (0usize, 0u32);
        let mut misses = 0;
        for &k in trace {
            let ku = k as usize;
            if place[ku] != NONE {
                freq[ku] = (freq[ku] + 1).min(3);
                continue;
            }
            misses += 1;
            if cap == 0 {
                continue;
            }
            freq[ku] = 0;
            if ghost_gen[ku] != 0 {
                ghost_gen[ku] = 0;
                ghost_len -= 1;
                place[ku] = MAIN;
                main.push_back(k);
            } else {
                place[ku] = SMALL;
                small.push_back(k);
            }
            while small.len() + main.len() > cap {
                let used = small.len() + main.len();
                if !small.is_empty() && (small.len() * 10 >= used || main.is_empty()) {
                    let v = small.pop_front().unwrap();
                    let vu = v as usize;
                    if freq[vu] > 0 {
                        freq[vu] = 0;
                        place[vu] = MAIN;
                        main.push_back(v);
                        continue;
                    }
                    place[vu] = NONE;
                    gen += 1;
                    ghost_gen[vu] = gen;
                    ghost.push_back((v, gen));
                    ghost_len += 1;
                    let bound = (small.len() + main.len()).max(16);
                    while ghost_len > bound {
                        let (g, g_gen) = ghost.pop_front().unwrap();
                        if ghost_gen[g as usize] == g_gen {
                            ghost_gen[g as usize] = 0;
                            ghost_len -= 1;
                        }
                    }
                    break;
                }
                let v = main.pop_front().unwrap();
                let vu = v as usize;
                if freq[vu] > 0 {
                    freq[vu] -= 1;
                    main.push_back(v);
                    continue;
                }
                place[vu] = NONE;
                break;
            }
        }
        misses
    }
}

/// Dense-id traces (ids `0..keys`), for the references above; [`scramble`] them for the models.
pub mod dense {
    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha8Rng;

    pub fn uniform(n: usize, keys: u32, seed: u64) -> Vec<u32> {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        (0..n).map(|_| rng.gen_range(0..keys)).collect()
    }

    pub fn zipf(n: usize, keys: u32, s: f64, seed: u64) -> Vec<u32> {
        let mut cdf = Vec::with_capacity(keys as usize);
        let mut sum = 0.0;
        for r in 1..=keys {
            sum += 1.0 / (r as f64).powf(s);
            cdf.push(sum);
        }
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        // Ranks are shuffled onto ids so the hottest keys are not the smallest ids.
        (0..n)
            .map(|_| {
                let r = cdf.partition_point(|&c| c < rng.gen::<f64>() * sum) as u32;
                (r.wrapping_mul(2_654_435_761)) % keys
            })
            .collect()
    }

    /// Zipf (exponent `s`) over a hot set of `hot` ids, and every `period` references a sequential scan of
    /// `scan_len` cold ids, which walks on through a range of `cold` ids (`hot..hot + cold`) and wraps
    /// around: a database's index lookups with a periodic table scan, backup or report. Each scan pushes
    /// much of the hot set out of an LRU cache smaller than the scan, and its ids come back only
    /// `cold / scan_len` scans later, so the curve has a plateau between the hot set and the cold range.
    pub fn zipf_with_scans(
        n: usize,
        hot: u32,
        s: f64,
        period: usize,
        scan_len: u32,
        cold: u32,
        seed: u64,
    ) -> Vec<u32> {
        assert!(period > 0 && scan_len > 0 && cold > 0);
        // The zipf references are drawn as for `zipf` (more than the trace keeps: the scans take the
        // rest of the `n`).
        let mut out = Vec::with_capacity(n);
        let mut cursor = 0u32;
        for (i, k) in zipf(n, hot, s, seed).into_iter().enumerate() {
            if i > 0 && i % period == 0 {
                for _ in 0..scan_len {
                    out.push(hot + cursor);
                    cursor = (cursor + 1) % cold;
                }
            }
            out.push(k);
            if out.len() >= n {
                break;
            }
        }
        out.truncate(n);
        out
    }

    /// A hot set read uniformly (`hot_share` of the references) while sequential scans of fresh pages
    /// (never read again, like a backup or a batch job's input) run through the rest: the pattern that
    /// pushes LRU's hot set out and that S3-FIFO's small queue absorbs.
    pub fn scan_plus_hot(n: usize, hot: u32, hot_share: f64, seed: u64) -> Vec<u32> {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let mut scan = hot;
        (0..n)
            .map(|_| {
                if rng.gen::<f64>() < hot_share {
                    rng.gen_range(0..hot)
                } else {
                    scan += 1;
                    scan - 1
                }
            })
            .collect()
    }
}
