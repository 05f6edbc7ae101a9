//! Acceptance 1, second part, and issue 27 acceptance 3: SHARDS and miniature simulation against exact
//! curves, mean absolute error at most 0.01 over 12 evenly spaced sizes up to the footprint, on uniform,
//! zipf 0.9, scan-plus-hot and zipf-with-periodic-scans traces of at least a million references: with
//! the default sampling (fixed size, `DEFAULT_MAX_SAMPLES` keys) and 8,192 samples at fixed size, and
//! on the first three also at `R = 0.01`.
//!
//! "Exact" is `ExactLru` for LRU (itself pinned to a brute-force LRU in `exact.rs`) and, for FIFO and
//! S3-FIFO, a full simulation at each size by the independent array-based references of
//! `common::reference` (no code shared with `CacheSim`). The models see the dense ids scrambled over
//! the 64-bit key space, as real ids are. Everything is seeded; the sampling seed is the crate's
//! default, the one every user gets, and SHARDS with the default sampling is also checked with
//! `SEEDS` other sampling seeds, since one seed that happens to land well proves little (the FUSE
//! mount seeds each container's model differently). How the error spreads over more seeds is recorded
//! in BENCHMARKS.md ("Miss-ratio curves").

mod common;

use common::{dense, reference, scramble};
use dd_mrc::{Curve, ExactLru, MiniSim, Mrc, MrcConfig, Policy, Sampling, Shards, Unit};

const MAX_MAE: f64 = 0.01;

/// The sampling seeds besides the default with which SHARDS at the default sampling is checked.
const SEEDS: [u64; 5] = [1, 2, 3, 4, 5];

fn curve_of(sizes: &[u64], requests: usize, misses: impl Fn(usize) -> u64) -> Curve {
    let m = sizes.iter().map(|&s| misses(s as usize) as f64 / requests as f64).collect();
    Curve::new(Unit::Pages, sizes.to_vec(), m).unwrap()
}

/// Checks every model at each of `samplings` (default seed), and SHARDS at the default sampling with
/// each of [`SEEDS`], against the exact curves of `ids` (dense ids `0..keys`).
fn check_trace(name: &str, ids: &[u32], keys: usize, samplings: &[Sampling]) {
    assert!(ids.len() >= 1_000_000, "acceptance asks for at least a million references");
    let trace: Vec<u64> = ids.iter().map(|&k| scramble(k as u64)).collect();
    let mut exact = ExactLru::new(Unit::Pages);
    exact.access_keys(&trace);
    let sizes = Curve::even_sizes(exact.stats().unique, 12);
    let lru = exact.curve_at(&sizes);
    let fifo = curve_of(&sizes, ids.len(), |c| reference::fifo_misses(ids, keys, c));
    let s3fifo = curve_of(&sizes, ids.len(), |c| reference::s3fifo_misses(ids, keys, c));
    let mut failures = Vec::new();
    for &sampling in samplings {
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
    for seed in SEEDS {
        // Built as `doubledecker mrc` builds it without sampling flags: the default configuration.
        let mut shards = MrcConfig { seed, ..MrcConfig::default() }.build().unwrap();
        shards.access_keys(&trace);
        let mae = shards.curve_at(&sizes).mean_absolute_error(&lru);
        println!("{name} shards lru {:?} seed {seed}: MAE {mae:.4}", Sampling::default());
        if mae > MAX_MAE {
            failures.push(format!("shards lru {:?} seed {seed}: MAE {mae:.4}", Sampling::default()));
        }
    }
    assert!(failures.is_empty(), "{name}: {failures:?}");
    // The references are not vacuous: the policies' curves differ where they should.
    assert!(fifo.mean_absolute_error(&lru) > 0.0 || name == "uniform");
}

/// The samplings checked with the default seed on the first three traces: the SHARDS paper's standard
/// rate, 8,192 samples (what the lab's provisioner and the FUSE mount keep), and the default.
const SAMPLINGS: [Sampling; 3] = [Sampling::Rate(0.01), Sampling::MaxSamples(8192), DEFAULT];
const DEFAULT: Sampling = Sampling::MaxSamples(dd_mrc::DEFAULT_MAX_SAMPLES);

#[test]
fn default_sampling_is_the_checked_one() {
    assert_eq!(Sampling::default(), DEFAULT);
}

#[test]
fn sampled_curves_match_exact_on_uniform() {
    check_trace("uniform", &dense::uniform(3_000_000, 1_000_000, 1), 1_000_000, &SAMPLINGS);
}

#[test]
fn sampled_curves_match_exact_on_zipf_0_9() {
    check_trace("zipf", &dense::zipf(3_000_000, 2_000_000, 0.9, 2), 2_000_000, &SAMPLINGS);
}

#[test]
fn sampled_curves_match_exact_on_scan_plus_hot() {
    let ids = dense::scan_plus_hot(2_000_000, 200_000, 0.6, 3);
    check_trace("scan+hot", &ids, 1_100_000, &SAMPLINGS);
}

/// Issue 27: zipf 0.9 over 200,000 ids and, after every 100,000 of its references, a scan of a table
/// of 50,000 other ids (a third of all references). The scans form a loop that LRU holds only above
/// the table plus the hot ids read between two scans: a cliff in the curve (from 0.42 to 0.07 between
/// 70,000 and 78,000 pages). `R = 0.01` samples about 500 of the table's ids, and the error of that
/// count moves the whole plateau before the cliff: MAE 0.0147 with the default seed, 0.0019-0.0542
/// over 20 seeds, so it is not checked here.
#[test]
fn sampled_curves_match_exact_on_zipf_with_periodic_scans() {
    let ids = dense::zipf_with_scans(2_000_000, 200_000, 0.9, 100_000, 50_000, 50_000, 4);
    check_trace("zipf+scans", &ids, 250_000, &[Sampling::MaxSamples(8192), DEFAULT]);
}

/// The spread over sampling seeds behind the default's choice (BENCHMARKS.md, "Miss-ratio curves"): SHARDS's
/// MAE on the four traces for `MRC_SEEDS` seeds (the default one and 1, 2, ...; 20 unless set) at a few
/// samplings. Not run by default (about a minute): `cargo test -p dd-mrc --test accuracy -- --ignored
/// --nocapture`.
#[test]
#[ignore]
fn shards_error_over_seeds() {
    let seeds: u64 = std::env::var("MRC_SEEDS").map_or(20, |s| s.parse().unwrap());
    let traces: [(&str, Vec<u32>); 4] = [
        ("uniform", dense::uniform(3_000_000, 1_000_000, 1)),
        ("zipf", dense::zipf(3_000_000, 2_000_000, 0.9, 2)),
        ("scan+hot", dense::scan_plus_hot(2_000_000, 200_000, 0.6, 3)),
        ("zipf+scans", dense::zipf_with_scans(2_000_000, 200_000, 0.9, 100_000, 50_000, 50_000, 4)),
    ];
    for (name, ids) in traces {
        let trace: Vec<u64> = ids.iter().map(|&k| scramble(k as u64)).collect();
        let mut exact = ExactLru::new(Unit::Pages);
        exact.access_keys(&trace);
        let sizes = Curve::even_sizes(exact.stats().unique, 12);
        let lru = exact.curve_at(&sizes);
        for sampling in [
            Sampling::Rate(0.01),
            Sampling::MaxSamples(8192),
            Sampling::MaxSamples(16_384),
            Sampling::MaxSamples(32_768),
            Sampling::MaxSamples(65_536),
        ] {
            let mut maes: Vec<f64> = std::iter::once(dd_mrc::DEFAULT_SEED)
                .chain(1..seeds)
                .map(|seed| {
                    let config = MrcConfig { sampling, seed, ..MrcConfig::default() };
                    let mut shards = config.build().unwrap();
                    shards.access_keys(&trace);
                    shards.curve_at(&sizes).mean_absolute_error(&lru)
                })
                .collect();
            let default_seed = maes[0];
            maes.sort_by(f64::total_cmp);
            let mean = maes.iter().sum::<f64>() / maes.len() as f64;
            let over = maes.iter().filter(|&&m| m > MAX_MAE).count();
            println!(
                "{name} {sampling:?}: default seed {default_seed:.4}, mean {mean:.4}, max {:.4}, \
                 above {MAX_MAE}: {over} of {}",
                maes[maes.len() - 1],
                maes.len()
            );
        }
    }
}
