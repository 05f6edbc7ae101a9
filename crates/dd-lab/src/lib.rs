//! # dd-lab: the DoubleDecker lab
//!
//! A fast, deterministic discrete-event emulator of a host running VMs whose containers run workload
//! patterns (Filebench personalities, an anonymous-memory key-value store, block traces), with the real
//! DoubleDecker cache store as the hypervisor's second-chance cache (SPEC section 10).
//!
//! Module map: [`scenario`] (the TOML format, defaults, validation, scaling), [`guest`] (page cache,
//! memcgs, LRU lists, reclaim), [`workload`] (Filebench personalities, traces), [`ycsb`] (YCSB A-F
//! request generators), [`kvstore`] (Redis-like and MongoDB-like stores), [`memctl`] (the VM memory
//! controller of thesis 000 chapter 4: `dd_memctl::decide` in VM-wide reclaim, its checks, memory
//! plots), [`backend`] (the second-chance cache interface and the in-process engine), [`remote`] (a
//! running daemon as the cache), [`sim`] (event queue, clock, I/O path,
//! timeline, sampling), [`report`] (checks, `summary.json`, `timeseries.csv`), [`plot`] (PNGs,
//! `report.html`, index page), [`bundled`] (the scenarios shipped with the binary).
//!
//! Determinism: every random choice comes from a `ChaCha8Rng` seeded from the scenario's seed and the
//! container's position; the event queue breaks time ties by scheduling order; no output depends on the
//! wall clock or on hash-map iteration order.

pub mod backend;
pub mod bundled;
pub mod error;
pub mod guest;
pub mod kvstore;
pub mod memctl;
pub mod plot;
pub mod remote;
pub mod report;
pub mod scenario;
pub mod sim;
pub mod workload;
pub mod ycsb;

pub use error::LabError;
pub use report::{CheckResult, ScenarioResult};
pub use scenario::Scenario;

use backend::{BackendConfig, EngineBackend, Stamped};
use std::path::PathBuf;

/// How to run a scenario.
#[derive(Debug, Clone, Default)]
pub struct RunOptions {
    /// Overrides the scenario's `scale`.
    pub scale: Option<f64>,
    /// Overrides the scenario's `seed`.
    pub seed: Option<u64>,
    /// Directory that relative trace paths are resolved against (the scenario file's directory).
    pub base_dir: Option<PathBuf>,
    /// Where the SSD store's scratch file goes; default [`default_scratch_dir`].
    pub scratch_dir: Option<PathBuf>,
    /// Run against this daemon instead of the in-process engine (same results; see [`remote`]).
    pub daemon: Option<remote::DaemonTarget>,
}

/// Runs every variant of a scenario with the in-process engine and evaluates its checks.
/// `progress(variant_index, fraction_of_variant_done)` is called as emulated time passes.
pub fn run_scenario(
    sc: &Scenario,
    opts: &RunOptions,
    progress: &mut dyn FnMut(usize, f64),
) -> Result<ScenarioResult, LabError> {
    let mut sc = sc.clone();
    if let Some(s) = opts.scale {
        sc.scale = s;
    }
    if let Some(s) = opts.seed {
        sc.seed = s;
    }
    sc.validate()?;
    let scale = sc.scale;
    let scaled = sc.scaled();
    let base = opts.base_dir.clone();
    let load = move |p: &str| -> Result<String, LabError> {
        if let Some(t) = bundled::trace(p) {
            return Ok(t.to_string());
        }
        let path = match &base {
            Some(b) => b.join(p),
            None => PathBuf::from(p),
        };
        std::fs::read_to_string(&path).map_err(|e| LabError::io(&path, e))
    };
    let mut runs = Vec::new();
    for (vi, v) in scaled.variant_list().iter().enumerate() {
        let s = sim::apply_variant(&scaled, v);
        let cfg = backend_config(&s, opts);
        let mut p = |f| progress(vi, f);
        let run = match &opts.daemon {
            None => sim::Sim::new(&s, v, EngineBackend::new(&cfg)?, &load)?.run(&mut p)?,
            Some(t) => {
                let backend = Stamped::over(remote::Daemon::connect(t, &cfg)?);
                sim::Sim::new(&s, v, backend, &load)?.run(&mut p)?
            }
        };
        runs.push(run);
    }
    let checks = report::evaluate(&scaled, &runs);
    Ok(ScenarioResult { scenario: scaled, scale, runs, checks })
}

/// The cache's host settings for a (scaled, variant-applied) scenario: the memory arena is reserved
/// for the largest capacity the timeline sets.
pub fn backend_config(s: &Scenario, opts: &RunOptions) -> BackendConfig {
    use scenario::{mib_pages, Event};
    let mut mem_max = mib_pages(s.host.mem_capacity_mib);
    let mut ssd = mib_pages(s.host.ssd_capacity_mib);
    for e in &s.timeline {
        if let Event::SetCapacity { store, mib, .. } = e {
            match store {
                dd_engine::StoreKind::Mem => mem_max = mem_max.max(mib_pages(*mib)),
                dd_engine::StoreKind::Ssd => ssd = ssd.max(mib_pages(*mib)),
            }
        }
    }
    BackendConfig {
        mem_pages: mib_pages(s.host.mem_capacity_mib),
        mem_max_pages: mem_max,
        ssd_pages: ssd,
        mode: s.host.mode,
        batch_pages: mib_pages(s.host.eviction_batch_mib).max(1),
        scratch_dir: opts.scratch_dir.clone().unwrap_or_else(default_scratch_dir),
    }
}

/// Where the SSD store's file goes when the caller names no directory: `/dev/shm` when it is a
/// writable directory, else the system temporary directory. The lab charges SSD latency on the emulated
/// clock, so the file only needs to hold the stamped pages; on a real disk its page-cache write-back
/// made a large DDSSD variant I/O-bound in wall time (minutes) without changing any output.
pub fn default_scratch_dir() -> PathBuf {
    let shm = std::path::Path::new("/dev/shm");
    let writable = std::fs::metadata(shm).is_ok_and(|m| m.is_dir() && !m.permissions().readonly());
    if writable {
        shm.to_path_buf()
    } else {
        std::env::temp_dir()
    }
}
