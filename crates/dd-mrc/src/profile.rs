//! Profiling a trace file: the whole of `doubledecker mrc` except parsing and printing.
//!
//! One pass feeds every request to the model built from an [`MrcConfig`] and reads the curve at the
//! sizes asked for, or at `points` sizes spread evenly up to the trace's (estimated) footprint. Miniature
//! simulation must know its sizes before it starts, so with `points` it first makes a cheap pass with
//! SHARDS at the same sampling to estimate the footprint (two reads of the file; every other case reads
//! it once).

use crate::{Curve, Method, Mrc, MrcConfig, MrcError, Policy, Unit};
use dd_trace::{Request, TraceError, TraceReader, DEFAULT_BATCH};
use serde::Serialize;
use thiserror::Error;

/// Where the curve is read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SizeGrid {
    /// These sizes (in the model's unit).
    Sizes(Vec<u64>),
    /// This many sizes, evenly spaced up to the footprint.
    Points(usize),
}

/// What a profile reports (the `--json` document of `doubledecker mrc` is made from it).
#[derive(Debug, Clone, Serialize)]
pub struct Profile {
    pub method: Method,
    pub policy: Policy,
    pub requests: u64,
    /// Distinct keys (exact) or the sampled estimate.
    pub unique: u64,
    /// The final sampling rate (1 for exact).
    pub sampling_rate: f64,
    /// The curve at exactly the requested sizes (size 0 only if asked for).
    pub sizes: Vec<u64>,
    pub miss_ratio: Vec<f64>,
    /// The curve at the requested sizes and, for the stack methods, 400 more spread up to the
    /// footprint (with size 0): for plots and interpolation.
    #[serde(skip)]
    pub curve: Curve,
}

/// Progress of a pass over the file.
#[derive(Debug, Clone, Copy)]
pub struct Progress {
    /// 0 for the footprint pass of miniature simulation, 1 for the pass that builds the curve.
    pub pass: u8,
    pub bytes_read: u64,
    pub total_bytes: Option<u64>,
    pub requests: u64,
}

#[derive(Debug, Error)]
#[non_exhaustive]
pub enum ProfileError {
    #[error(transparent)]
    Trace(#[from] TraceError),
    #[error(transparent)]
    Config(#[from] MrcError),
}

/// Feeds a whole trace to `sink`, one batch at a time, reporting progress after each batch.
fn each_request(
    reader: &mut dyn TraceReader,
    pass: u8,
    progress: &mut dyn FnMut(Progress),
    mut sink: impl FnMut(&[Request]),
) -> Result<u64, TraceError> {
    let mut batch = Vec::with_capacity(DEFAULT_BATCH);
    let mut requests = 0u64;
    loop {
        batch.clear();
        let n = reader.read_batch(&mut batch, DEFAULT_BATCH)?;
        if n == 0 {
            return Ok(requests);
        }
        sink(&batch);
        requests += n as u64;
        progress(Progress {
            pass,
            bytes_read: reader.bytes_read(),
            total_bytes: reader.total_bytes(),
            requests,
        });
    }
}

/// Feeds a batch: in pages through [`Mrc::access_keys`] (the exact model prefetches across it), in
/// bytes one request at a time with its size.
fn feed(model: &mut dyn Mrc, unit: Unit, batch: &[Request], keys: &mut Vec<u64>) {
    match unit {
        Unit::Pages => {
            keys.clear();
            keys.extend(batch.iter().map(|r| r.id));
            model.access_keys(keys);
        }
        Unit::Bytes => batch.iter().for_each(|r| model.access_sized(r.id, r.size)),
    }
}

/// Profiles the trace that `open` opens (called once, or twice for miniature simulation with
/// [`SizeGrid::Points`]).
pub fn profile(
    open: &mut dyn FnMut() -> Result<Box<dyn TraceReader>, TraceError>,
    config: &MrcConfig,
    grid: &SizeGrid,
    progress: &mut dyn FnMut(Progress),
) -> Result<Profile, ProfileError> {
    let mut config = config.clone();
    if config.method == Method::MiniSim {
        config.sizes = match grid {
            SizeGrid::Sizes(s) => s.clone(),
            SizeGrid::Points(n) => {
                let mut probe = MrcConfig { method: Method::Shards, policy: Policy::Lru, ..config.clone() };
                probe.sizes.clear();
                let mut model = probe.build()?;
                let mut keys = Vec::new();
                each_request(open()?.as_mut(), 0, progress, |b| {
                    feed(model.as_mut(), probe.unit, b, &mut keys)
                })?;
                Curve::even_sizes(model.stats().footprint, *n)
            }
        };
    }
    let mut model = config.build()?;
    let mut keys = Vec::new();
    each_request(open()?.as_mut(), 1, progress, |b| feed(model.as_mut(), config.unit, b, &mut keys))?;
    let stats = model.stats();
    let mut sizes = match grid {
        SizeGrid::Sizes(s) => s.clone(),
        SizeGrid::Points(_) if config.method == Method::MiniSim => config.sizes.clone(),
        SizeGrid::Points(n) => Curve::even_sizes(stats.footprint, *n),
    };
    sizes.sort_unstable();
    sizes.dedup();
    let mut dense = sizes.clone();
    if config.method != Method::MiniSim {
        let top = stats.footprint.max(sizes.last().copied().unwrap_or(0));
        dense.extend(Curve::even_sizes(top, 400));
    }
    let curve = model.curve_at(&dense);
    let miss_ratio = sizes.iter().map(|&s| curve.miss_ratio_at(s as f64)).collect();
    Ok(Profile {
        method: config.method,
        policy: config.policy,
        requests: stats.requests,
        unique: stats.unique,
        sampling_rate: stats.sampling_rate,
        sizes,
        miss_ratio,
        curve,
    })
}
