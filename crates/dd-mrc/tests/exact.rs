//! Acceptance 1, first part: the exact curve equals a brute-force LRU simulation at every size.
//!
//! The brute force is a literal LRU list (most recent first), simulated once per cache size: nothing in
//! common with the Fenwick-tree stack distances it checks.

mod common;

use common::{scan_plus_hot, uniform, zipf};
use dd_mrc::{ExactLru, Mrc, Unit};
use std::collections::VecDeque;

/// Misses of an LRU cache holding `capacity` units, objects of `size(key)` units (evict least recent
/// until the new one fits; an object larger than the cache is not cached).
fn brute_lru_misses(trace: &[u64], capacity: u64, size: impl Fn(u64) -> u64) -> u64 {
    let mut list: VecDeque<u64> = VecDeque::new();
    let mut used = 0;
    let mut misses = 0;
    for &k in trace {
        if let Some(p) = list.iter().position(|&x| x == k) {
            list.remove(p);
            list.push_front(k);
            continue;
        }
        misses += 1;
        if size(k) > capacity {
            continue;
        }
        list.push_front(k);
        used += size(k);
        while used > capacity {
            used -= size(list.pop_back().expect("over capacity, so not empty"));
        }
    }
    misses
}

fn traces() -> Vec<(&'static str, Vec<u64>)> {
    vec![
        ("uniform", uniform(4_000, 150, 11)),
        ("zipf", zipf(4_000, 400, 0.9, 12)),
        ("scan+hot", scan_plus_hot(4_000, 40, 120, 0.6, 13)),
        ("uniform-wide", uniform(2_000, 600, 14)),
    ]
}

#[test]
fn exact_curve_equals_brute_force_lru_at_every_size() {
    for (name, trace) in traces() {
        let mut m = ExactLru::new(Unit::Pages);
        trace.iter().for_each(|&k| m.access(k));
        let unique = m.stats().unique;
        let sizes: Vec<u64> = (0..=unique + 1).collect();
        let curve = m.curve_at(&sizes);
        for &c in &sizes {
            let want = brute_lru_misses(&trace, c, |_| 1) as f64 / trace.len() as f64;
            let got = curve.miss_ratio_at(c as f64);
            assert!((got - want).abs() < 1e-12, "{name}: size {c}: exact {got}, brute force {want}");
        }
        // The natural curve carries the same points.
        for (s, mr) in m.curve().points() {
            assert!((mr - curve.miss_ratio_at(s as f64)).abs() < 1e-12, "{name}: natural curve at {s}");
        }
    }
}

#[test]
fn exact_byte_curve_equals_brute_force_at_its_points() {
    let size = |k: u64| 1 + (k >> 7) % 8; // 1..=8 units, fixed per key
    for (name, trace) in traces() {
        let mut m = ExactLru::new(Unit::Bytes);
        trace.iter().for_each(|&k| m.access_sized(k, size(k) as u32));
        let curve = m.curve();
        // Byte distances above 256 fall in buckets of up to 1/256 of their value: the curve is exact at
        // its own points (bucket tops), which is what is checked here, at every one of them.
        assert!(curve.sizes().len() > 100, "{name}: too few points to be a test");
        for (c, got) in curve.points().filter(|&(c, _)| c >= 8) {
            let want = brute_lru_misses(&trace, c, size) as f64 / trace.len() as f64;
            assert!((got - want).abs() < 1e-12, "{name}: {c} bytes: exact {got}, brute force {want}");
        }
    }
}
