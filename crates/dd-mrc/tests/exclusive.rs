//! The claim the crate comment makes for the second-chance cache: an exclusive FIFO second level fed by
//! an LRU first level's evictions, with hits moving pages back up, misses exactly like one LRU cache of
//! both sizes together. So a container's LRU curve read at `memory + cache` gives its disk reads.

mod common;

use common::{scan_plus_hot, zipf};
use dd_mrc::{ExactLru, Mrc, Unit};
use std::collections::{HashSet, VecDeque};

/// Misses that reach the disk in guest LRU (`m` pages) + exclusive FIFO second level (`c` pages).
fn two_level_misses(trace: &[u64], m: usize, c: usize) -> u64 {
    let mut guest: VecDeque<u64> = VecDeque::new(); // most recent at the front
    let mut second: VecDeque<u64> = VecDeque::new(); // oldest put at the front
    let mut in_second = HashSet::new();
    let mut misses = 0;
    for &k in trace {
        if let Some(p) = guest.iter().position(|&x| x == k) {
            guest.remove(p);
            guest.push_front(k);
            continue;
        }
        if in_second.remove(&k) {
            // Exclusive get: the page leaves the second level.
            let p = second.iter().position(|&x| x == k).expect("indexed, so queued");
            second.remove(p);
        } else {
            misses += 1;
        }
        guest.push_front(k);
        if guest.len() > m {
            let evicted = guest.pop_back().expect("over its size");
            if c > 0 {
                second.push_back(evicted); // put of a clean evicted page
                in_second.insert(evicted);
                if second.len() > c {
                    in_second.remove(&second.pop_front().expect("over its size"));
                }
            }
        }
    }
    misses
}

#[test]
fn exclusive_fifo_behind_lru_is_one_lru_of_both_sizes() {
    for trace in [zipf(6_000, 500, 0.9, 21), scan_plus_hot(6_000, 60, 200, 0.5, 22)] {
        let mut exact = ExactLru::new(Unit::Pages);
        trace.iter().for_each(|&k| exact.access(k));
        let curve = exact.curve();
        for m in [1usize, 10, 50] {
            for c in [0usize, 5, 40, 150] {
                let got = two_level_misses(&trace, m, c) as f64 / trace.len() as f64;
                let lru = curve.miss_ratio_at((m + c) as f64);
                assert!((got - lru).abs() < 1e-12, "m {m} c {c}: two levels {got}, LRU(m + c) {lru}");
                // And `behind` gives the second level's own miss ratio.
                let first = curve.miss_ratio_at(m as f64);
                let own = curve.behind(m as u64).miss_ratio_at(c as f64);
                assert!((own * first - got).abs() < 1e-9, "m {m} c {c}: behind");
            }
        }
    }
}
