//! Acceptance 1, second part: SHARDS and miniature simulation against exact curves, mean absolute error
//! at most 0.01 over 12 evenly spaced sizes up to the footprint, at `R = 0.01` and with 8,192 samples
//! at fixed size, on uniform, zipf 0.9 and scan-plus-hot traces of at least a million references.
//!
//! "Exact" is `ExactLru` for LRU (itself pinned to a brute-force LRU in `exact.rs`) and, for FIFO and
//! S3-FIFO, a full simulation at each size by the independent array-based references of
//! `common::reference` (no code shared with `CacheSim`). The models see the dense ids scrambled over
//! the 64-bit key space, as real ids are. Everything is seeded; the sampling seed is the crate's
//! default, the one every user gets. How the error spreads over other sampling seeds is recorded in
//! BENCHMARKS.md ("Miss-ratio curves").

mod common;

use common::{dense, reference, scramble};
use dd_mrc::{Curve, ExactLru, MiniSim, Mrc, Policy, Sampling, Shards, Unit};

const MAX_MAE: f64 = 0.01;

fn curve_of(sizes: &[u64], requests: usize, misses: impl Fn(usize) -> u64) -> Curve {
    let m = sizes.iter().map(|&s| misses(s as usize) as f64 / requests as f64).collect();
    Curve::new(Unit::Pages, sizes.to_vec(), m).unwrap()
}

fn check_trace(name: &str, ids: &[u32], keys: usize) {
    assert!(ids.len() >= 1_000_000, "acceptance asks for at least a million references");
    let trace: Vec<u64> = ids.iter().map(|&k| scramble(k as u64)).collect();
    let mut exact = ExactLru::new(Unit::Pages);
    exact.access_keys(&trace);
    let sizes = Curve::even_sizes(exact.stats().unique, 12);
    let lru = exact.curve_at(&sizes);
    let fifo = curve_of(&sizes, ids.len(), |c| reference::fifo_misses(ids, keys, c));
    let s3fifo = curve_of(&sizes, ids.len(), |c| reference::s3fifo_misses(ids, keys, c));
    let mut failures = Vec::new();
    for sampling in [Sampling::Rate(0.01), Sampling::MaxSamples(8192)] {
        let mut shards: Box<dyn Mrc> = match sampling {
            Sampling::Rate(r) => Box::new(Shards::fixed_rate(r, Unit::Pages).unwrap()),
            Sampling::MaxSamples(n) => Box::new(Shards::fixed_size(n, Unit::Pages).unwrap()),
        };
        let mut models = vec![("shards lru", shards.as_mut() as &mut dyn Mrc, &lru)];
        let mut mini_lru = MiniSim::new(Policy::Lru, &sizes, sampling, Unit::Pages).unwrap();
        let mut mini_fifo = MiniSim::new(Policy::Fifo, &sizes, sampling, Unit::Pages).unwrap();
        let mut mini_s3 = MiniSim::new(Policy::S3Fifo, &sizes, sampling, Unit::Pages).unwrap();
        models.push(("minisim lru", &mut mini_lru, &lru));
        models.push(("minisim fifo", &mut mini_fifo, &fifo));
        models.push(("minisim s3fifo", &mut mini_s3, &s3fifo));
        for (what, model, truth) in models {
            model.access_keys(&trace);
            let mae = model.curve_at(&sizes).mean_absolute_error(truth);
            println!("{name} {what} {sampling:?}: MAE {mae:.4}");
            if mae > MAX_MAE {
                failures.push(format!("{what} {sampling:?}: MAE {mae:.4}"));
            }
        }
    }
    assert!(failures.is_empty(), "{name}: {failures:?}");
    // The references are not vacuous: the policies' curves differ where they should.
    assert!(fifo.mean_absolute_error(&lru) > 0.0 || name == "uniform");
}

#[test]
fn sampled_curves_match_exact_on_uniform() {
    check_trace("uniform", &dense::uniform(3_000_000, 1_000_000, 1), 1_000_000);
}

#[test]
fn sampled_curves_match_exact_on_zipf_0_9() {
    check_trace("zipf", &dense::zipf(3_000_000, 2_000_000, 0.9, 2), 2_000_000);
}

#[test]
fn sampled_curves_match_exact_on_scan_plus_hot() {
    let ids = dense::scan_plus_hot(2_000_000, 200_000, 0.6, 3);
    check_trace("scan+hot", &ids, 1_100_000);
}
