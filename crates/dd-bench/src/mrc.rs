//! `bench mrc`: references per CPU second of the miss-ratio-curve methods on one binary trace, the
//! same path `doubledecker mrc` takes (read the oracle-general file in batches, feed the model, read
//! the curve), with the SPEC section 11 targets: SHARDS at `R = 0.01` at least 20 M references per CPU
//! second, the exact method at least 2 M; and SHARDS's mean absolute error against the exact curve of the
//! same run (target at most 0.01).
//!
//! The trace is a file given with `trace`, or a synthetic one written first (zipf with exponent
//! `zipf` over `keys` objects, scrambled ids, seeded): the file is read back from the page cache, so
//! reading it is part of what is measured, as it is for `doubledecker mrc` and libCacheSim's tools.
//! CPU time is the calling thread's (`CLOCK_THREAD_CPUTIME_ID`), so builds running beside it change
//! the wall time, not the figure.

use crate::thread_cpu_s;
use dd_mrc::profile::{profile, SizeGrid};
use dd_mrc::{Curve, Method, MrcConfig, Policy, Sampling, Unit, DEFAULT_SEED};
use dd_trace::{Format, OracleGeneralWriter, Request};
use rand::{Rng, SeedableRng};
use serde::Serialize;
use std::io::BufWriter;
use std::path::{Path, PathBuf};

/// SPEC section 11: SHARDS at R = 0.01.
pub const TARGET_SHARDS_PER_CPU_S: f64 = 20e6;
/// Issue 14: the exact method.
pub const TARGET_EXACT_PER_CPU_S: f64 = 2e6;

#[derive(Debug, Clone)]
pub struct MrcBenchOptions {
    /// An existing oracle-general trace; `None` writes a synthetic one.
    pub trace: Option<PathBuf>,
    /// Where the synthetic trace goes (kept); `None` uses a temporary file.
    pub keep_trace: Option<PathBuf>,
    pub requests: u64,
    pub keys: u64,
    pub zipf: f64,
    pub seed: u64,
    /// Also time miniature simulation of LRU, FIFO and S3-FIFO at R = 0.01.
    pub minisim: bool,
}

impl Default for MrcBenchOptions {
    fn default() -> Self {
        MrcBenchOptions {
            trace: None,
            keep_trace: None,
            requests: 10_000_000,
            keys: 10_000_000,
            zipf: 0.9,
            seed: 14,
            minisim: true,
        }
    }
}

/// One method's run.
#[derive(Debug, Clone, Serialize)]
pub struct MethodRun {
    pub method: String,
    pub cpu_s: f64,
    pub requests_per_cpu_s: f64,
    /// The target it has, if any, and whether it is met.
    pub target_per_cpu_s: Option<f64>,
    pub meets_target: Option<bool>,
    /// Mean absolute error against the exact LRU curve over 100 sizes up to the footprint (for FIFO and
    /// S3-FIFO this is how far their curve is from LRU's, not an error).
    pub mae_vs_exact: Option<f64>,
}

#[derive(Debug, Clone, Serialize)]
pub struct MrcBenchReport {
    pub trace: String,
    pub requests: u64,
    pub unique: u64,
    pub runs: Vec<MethodRun>,
}

#[derive(Debug, thiserror::Error)]
pub enum MrcBenchError {
    #[error("writing the synthetic trace {path}: {source}")]
    Write { path: String, source: std::io::Error },
    #[error(transparent)]
    Profile(#[from] dd_mrc::profile::ProfileError),
    #[error("temporary file: {0}")]
    Temp(std::io::Error),
}

/// Writes `requests` zipf-distributed references over `keys` objects as an oracle-general file.
pub fn write_synthetic(path: &Path, requests: u64, keys: u64, zipf: f64, seed: u64) -> std::io::Result<()> {
    let mut cdf = Vec::with_capacity(keys as usize);
    let mut sum = 0.0;
    for r in 1..=keys {
        sum += 1.0 / (r as f64).powf(zipf);
        cdf.push(sum);
    }
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
    let mut w = OracleGeneralWriter::new(BufWriter::with_capacity(1 << 20, std::fs::File::create(path)?));
    for t in 0..requests {
        let rank = cdf.partition_point(|&c| c < rng.gen::<f64>() * sum) as u64;
        // Scrambled ids: the hot objects are not the small numbers.
        let id = rank.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ 0x00dd_0014;
        w.write(&Request { time: t / 1000, id, size: 4096, next_access_vtime: -1 })?;
    }
    w.finish()?;
    Ok(())
}

pub fn run(opts: &MrcBenchOptions, progress: &mut dyn FnMut(&str)) -> Result<MrcBenchReport, MrcBenchError> {
    let _temp;
    let path = match (&opts.trace, &opts.keep_trace) {
        (Some(p), _) => p.clone(),
        (None, keep) => {
            let p = match keep {
                Some(k) => k.clone(),
                None => {
                    _temp = tempfile::Builder::new()
                        .prefix("dd-bench-mrc")
                        .suffix(".oracleGeneral.bin")
                        .tempfile_in(std::env::temp_dir())
                        .map_err(MrcBenchError::Temp)?;
                    _temp.path().to_path_buf()
                }
            };
            progress(&format!(
                "writing {} requests over {} objects to {}",
                opts.requests,
                opts.keys,
                p.display()
            ));
            write_synthetic(&p, opts.requests, opts.keys, opts.zipf, opts.seed)
                .map_err(|source| MrcBenchError::Write { path: p.display().to_string(), source })?;
            p
        }
    };
    let mut methods: Vec<(&str, MrcConfig, Option<f64>)> = vec![
        ("exact", cfg(Method::Exact, Policy::Lru, Sampling::default()), Some(TARGET_EXACT_PER_CPU_S)),
        (
            "shards R=0.01",
            cfg(Method::Shards, Policy::Lru, Sampling::Rate(0.01)),
            Some(TARGET_SHARDS_PER_CPU_S),
        ),
        ("shards R=0.001", cfg(Method::Shards, Policy::Lru, Sampling::Rate(0.001)), None),
        ("shards 8192 samples", cfg(Method::Shards, Policy::Lru, Sampling::MaxSamples(8192)), None),
        // The default (`doubledecker mrc` without sampling flags): fixed size, 32,768 samples.
        ("shards default", cfg(Method::Shards, Policy::Lru, Sampling::default()), None),
    ];
    if opts.minisim {
        for (name, p) in [("minisim lru R=0.01", Policy::Lru), ("minisim fifo R=0.01", Policy::Fifo)] {
            methods.push((name, cfg(Method::MiniSim, p, Sampling::Rate(0.01)), None));
        }
        methods.push((
            "minisim s3fifo R=0.01",
            cfg(Method::MiniSim, Policy::S3Fifo, Sampling::Rate(0.01)),
            None,
        ));
    }
    let mut runs = Vec::new();
    let (mut exact_curve, mut requests, mut unique): (Option<Curve>, u64, u64) = (None, 0, 0);
    for (name, config, target) in methods {
        progress(name);
        let mut open = || dd_trace::open(&path, &Format::OracleGeneral);
        let start = thread_cpu_s();
        let grid = SizeGrid::Points(100);
        let p = profile(&mut open, &config, &grid, &mut |_| {})?;
        let cpu_s = thread_cpu_s() - start;
        let rate = p.requests as f64 / cpu_s.max(1e-9);
        let mae = exact_curve.as_ref().map(|e| e.resample(&p.sizes).mean_absolute_error(&p.curve));
        if config.method == Method::Exact {
            (requests, unique) = (p.requests, p.unique);
            exact_curve = Some(p.curve.clone());
        }
        runs.push(MethodRun {
            method: name.to_string(),
            cpu_s,
            requests_per_cpu_s: rate,
            target_per_cpu_s: target,
            meets_target: target.map(|t| rate >= t),
            mae_vs_exact: mae,
        });
    }
    Ok(MrcBenchReport { trace: path.display().to_string(), requests, unique, runs })
}

fn cfg(method: Method, policy: Policy, sampling: Sampling) -> MrcConfig {
    MrcConfig { method, policy, sampling, unit: Unit::Pages, seed: DEFAULT_SEED, sizes: Vec::new() }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_small_run_times_every_method_and_compares_to_exact() {
        let opts = MrcBenchOptions { requests: 200_000, keys: 50_000, ..Default::default() };
        let r = run(&opts, &mut |_| {}).unwrap();
        assert_eq!(r.requests, 200_000);
        assert!(r.unique > 10_000 && r.unique <= 50_000);
        assert_eq!(r.runs.len(), 8);
        assert!(r.runs.iter().all(|m| m.requests_per_cpu_s > 0.0));
        assert!(r.runs[0].mae_vs_exact.is_none());
        let shards = &r.runs[1];
        assert!(shards.mae_vs_exact.unwrap() < 0.05, "{shards:?}");
        assert!(shards.meets_target.is_some());
    }
}
