//! # dd-lab: the DoubleDecker lab
//!
//! A fast, deterministic discrete-event emulator of a host running VMs whose containers run workload
//! patterns (Filebench personalities, an anonymous-memory key-value store, block traces), with the real
//! DoubleDecker cache store as the hypervisor's second-chance cache (SPEC section 10).
//!
//! Layers, each a folder (or a file), each importing only the ones above it in this list
//! (`scripts/module-cycles` checks that no two modules import each other):
//! * [`record`]: what a run produces (samples, totals, the provisioners' decisions), plain data.
//! * [`scenario`]: plain data and validation (the TOML format, defaults, `validate()`, scaling; the
//!   workloads' settings, `scenario::memctl`, `scenario::provision`; [`bundled`]) and the check kinds,
//!   one module each with its settings, validation, scaling and evaluation on a run's record
//!   (`scenario::checks`, D38).
//! * [`model`]: the guest kernel (page cache, memcgs, LRU lists, reclaim; `guest::memctl`, the VM memory
//!   controller of thesis 000 chapter 4), the workloads (Filebench personalities, traces), the key-value
//!   stores and YCSB.
//! * [`sim`]: the event loop (event queue, clock, timeline, sampling), the operations of workload threads
//!   and the I/O path, the calls into the second-chance cache (`sim::backend`: the in-process engine;
//!   `sim::remote`: a running daemon), online curves (`sim::streams`), the VM-level provisioner's
//!   decisions, effective entitlements and the memory budget of a run (`sim::budget`).
//! * [`results`]: searches collapsed to their best candidate (`results::search`), `summary.json` and
//!   `timeseries.csv` (`results::report`), PNGs and HTML (`results::plot`).
//!
//! This file runs a scenario: [`prepare`] (validate, scale, plan memory) and [`run_prepared`] (variants
//! on threads, then checks).
//! [`mixes`], beside it, runs generated mixes (`scenario::mixgen`) through them and scores the VM-level
//! provisioner against the best static allocation (issue 27). [`sweep`] expands a sweep file into
//! independent points (a grid, a list, or a search's candidates), runs them resumably into their own
//! folders and gathers their rows (issue 33).
//!
//! Determinism: every random choice comes from a `ChaCha8Rng` seeded from the scenario's seed and the
//! container's position; the event queue breaks time ties by scheduling order; no output depends on the
//! wall clock or on hash-map iteration order.
#![forbid(unsafe_code)] // nothing here needs it: unsafe code lives in dd-engine, dd-fuse, dd-memctl and the few FFI calls of the other crates

pub mod error;
pub mod mixes;
pub mod model;
pub mod record;
pub mod results;
pub mod scenario;
pub mod sim;
pub mod sweep;

pub use error::LabError;
pub use results::{CheckResult, ScenarioResult};
pub use scenario::{bundled, Scenario};

use backend::{BackendConfig, EngineBackend, Stamped};
use sim::{backend, budget, remote};
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
    /// Where the SSD store's (unnamed) scratch file goes; default: the best of
    /// [`budget::default_scratch_candidates`] for the memory available (see [`prepare`]).
    pub scratch_dir: Option<PathBuf>,
    /// Run against this daemon instead of the in-process engine (same results; see [`remote`]).
    pub daemon: Option<remote::DaemonTarget>,
    /// Threads that run variants side by side (each variant has its own engine, so results do not
    /// depend on it). `None`: one per core. At most as many as fit in memory ([`budget`]). Runs against a
    /// daemon always take one variant at a time.
    pub jobs: Option<usize>,
    /// The memory the run may plan with; `None` reads it from the host ([`budget::HostMemory::read`]).
    pub host_memory: Option<budget::HostMemory>,
    /// Overrides the scenario's disk scheduler (`host.disk.scheduler`).
    pub disk_scheduler: Option<scenario::DiskScheduler>,
}

/// A scenario ready to run: validated, scaled, its memory planned.
#[derive(Debug, Clone)]
pub struct Prepared {
    /// The scaled scenario.
    pub scenario: Scenario,
    pub scale: f64,
    pub plan: budget::Plan,
}

/// Validates and scales `sc` with the options' overrides and plans its memory: how many variants run
/// side by side and where the SSD scratch file goes, or [`LabError::NotEnoughMemory`] at once when not
/// even one variant fits in the memory available above the margin ([`budget`]).
pub fn prepare(sc: &Scenario, opts: &RunOptions) -> Result<Prepared, LabError> {
    let mut sc = sc.clone();
    if let Some(s) = opts.scale {
        sc.scale = s;
    }
    if let Some(s) = opts.seed {
        sc.seed = s;
    }
    if let Some(d) = opts.disk_scheduler {
        sc.host.disk.scheduler = d;
    }
    sc.validate()?;
    let scale = sc.scale;
    let scaled = sc.scaled();
    let variants = scaled.run_list();
    let in_process = opts.daemon.is_none();
    let want = match opts.daemon {
        Some(_) => 1,
        None => opts.jobs.unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get())),
    }
    .clamp(1, variants.len().max(1));
    let (candidates, user_scratch) = match (&opts.scratch_dir, in_process) {
        (Some(d), true) => (vec![budget::ScratchChoice::at(d.clone())], true),
        (None, true) => (budget::default_scratch_candidates(), false),
        // Against a daemon the lab has no SSD store of its own.
        (d, false) => {
            let dir = d.clone().unwrap_or_else(std::env::temp_dir);
            (vec![budget::ScratchChoice { dir, in_memory: false }], d.is_some())
        }
    };
    let host = match opts.host_memory {
        Some(h) => h,
        None => budget::HostMemory::read()?,
    };
    let estimate = |in_memory: bool| -> Vec<budget::VariantEstimate> {
        variants
            .iter()
            .map(|v| {
                let s = sim::apply_variant(&scaled, v);
                let cfg = backend_config(&s, std::path::Path::new(""));
                budget::estimate_variant(&v.name, &s, &cfg, in_process, in_memory)
            })
            .collect()
    };
    let plan = budget::plan(&candidates, want, host, user_scratch, &estimate)?;
    Ok(Prepared { scenario: scaled, scale, plan })
}

/// Runs every variant of a scenario with the in-process engine (or a daemon) and evaluates its checks:
/// [`prepare`] (memory plan or refusal), then [`run_prepared`].
/// `progress(variant_index, fraction_of_variant_done)` is called as emulated time passes, always on the
/// calling thread.
///
/// Variants are independent emulations (each its own guest, clock, random generators and engine), so
/// they run on up to `opts.jobs` threads at once; the results are the same bytes in any case.
pub fn run_scenario(
    sc: &Scenario,
    opts: &RunOptions,
    progress: &mut dyn FnMut(usize, f64),
) -> Result<ScenarioResult, LabError> {
    let prepared = prepare(sc, opts)?;
    run_prepared(&prepared, opts, progress)
}

/// Runs a [`prepare`]d scenario with its plan's jobs and scratch directory (see [`run_scenario`]).
pub fn run_prepared(
    prepared: &Prepared,
    opts: &RunOptions,
    progress: &mut dyn FnMut(usize, f64),
) -> Result<ScenarioResult, LabError> {
    let scaled = &prepared.scenario;
    let base = opts.base_dir.clone();
    let load = move |p: &str| -> Result<model::workload::TraceStream, LabError> {
        if let Some(t) = bundled::trace(p) {
            return Ok(Box::new(t.as_bytes()));
        }
        let path = match &base {
            Some(b) => b.join(p),
            None => PathBuf::from(p),
        };
        Ok(Box::new(std::fs::File::open(&path).map_err(|e| LabError::io(&path, e))?))
    };
    // Searching variants run as their candidates, collapsed back to one run each afterwards.
    let variants = scaled.run_list();
    let scratch = prepared.plan.scratch_dir.as_path();
    let run_variant = |v: &scenario::Variant, p: &mut dyn FnMut(f64)| -> Result<sim::RunResult, LabError> {
        let s = sim::apply_variant(scaled, v);
        let cfg = backend_config(&s, scratch);
        match &opts.daemon {
            None => sim::Sim::new(&s, v, EngineBackend::new(&cfg)?, &load)?.run(p),
            Some(t) => {
                let backend = Stamped::over(remote::Daemon::connect(t, &cfg)?);
                sim::Sim::new(&s, v, backend, &load)?.run(p)
            }
        }
    };
    let jobs = prepared.plan.jobs.clamp(1, variants.len().max(1));
    let runs = if jobs == 1 {
        let mut runs = Vec::new();
        for (vi, v) in variants.iter().enumerate() {
            runs.push(run_variant(v, &mut |f| progress(vi, f))?);
        }
        runs
    } else {
        run_parallel(&variants, jobs, &run_variant, progress)?
    };
    let (runs, searches) = results::search::collapse(scaled, &variants, runs);
    let checks = scenario::checks::evaluate(scaled, &runs);
    Ok(ScenarioResult { scenario: scaled.clone(), scale: prepared.scale, runs, checks, searches })
}

/// Runs one variant, reporting the fraction of it done.
type RunVariant<'a> =
    dyn Fn(&scenario::Variant, &mut dyn FnMut(f64)) -> Result<sim::RunResult, LabError> + Sync + 'a;

/// Runs `variants` on `jobs` threads, each taking the next variant not yet started; progress reports
/// come back over a channel to the calling thread. Returns the runs in variant order, or the error of the
/// first variant (in order) that failed.
fn run_parallel(
    variants: &[scenario::Variant],
    jobs: usize,
    run_variant: &RunVariant<'_>,
    progress: &mut dyn FnMut(usize, f64),
) -> Result<Vec<sim::RunResult>, LabError> {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Mutex;
    let next = AtomicUsize::new(0);
    let results: Mutex<Vec<Option<Result<sim::RunResult, LabError>>>> =
        Mutex::new((0..variants.len()).map(|_| None).collect());
    std::thread::scope(|scope| {
        let (tx, rx) = std::sync::mpsc::channel::<(usize, f64)>();
        for _ in 0..jobs {
            let tx = tx.clone();
            let (next, results) = (&next, &results);
            scope.spawn(move || loop {
                let vi = next.fetch_add(1, Ordering::Relaxed);
                let Some(v) = variants.get(vi) else { break };
                // A closed channel only means nobody watches the progress any more.
                let r = run_variant(v, &mut |f| {
                    let _ = tx.send((vi, f));
                });
                let failed = r.is_err();
                results.lock().unwrap_or_else(|e| e.into_inner())[vi] = Some(r);
                if failed {
                    // Do not start more variants; the ones running finish.
                    next.store(variants.len(), Ordering::Relaxed);
                }
            });
        }
        drop(tx);
        for (vi, f) in rx {
            progress(vi, f);
        }
    });
    // Variants start in index order and none starts after a failure, so in index order an error comes
    // before any variant that never ran; collecting stops at the first error.
    results
        .into_inner()
        .unwrap_or_else(|e| e.into_inner())
        .into_iter()
        .map(|r| r.expect("a variant left unstarted follows the failed one"))
        .collect()
}

/// The cache's host settings for a (scaled, variant-applied) scenario: the memory arena is reserved
/// for the largest capacity the timeline sets.
pub fn backend_config(s: &Scenario, scratch_dir: &std::path::Path) -> BackendConfig {
    use scenario::{mib_pages, Event};
    let mut mem_max = mib_pages(s.host.mem_capacity_mib);
    let mut ssd = mib_pages(s.host.ssd_capacity_mib);
    let mut ssd_resized = false;
    for e in &s.timeline {
        if let Event::SetCapacity { store, mib, .. } = e {
            match store {
                dd_engine::StoreKind::Mem => mem_max = mem_max.max(mib_pages(*mib)),
                dd_engine::StoreKind::Ssd => {
                    ssd = ssd.max(mib_pages(*mib));
                    ssd_resized = true;
                }
            }
        }
    }
    // An SSD store no spec of the run uses would hold no page, but its file would still take its whole
    // capacity of disk (fallocated) for the length of the run (fig9's memory-only variants: 16 GiB).
    // Entitlements count a store only for the VMs and pools that use it (D2), so leaving it out changes
    // no output (checked in tests/lab.rs); a timeline that resizes it keeps it.
    if !ssd_resized && !s.uses_store(dd_engine::StoreKind::Ssd) {
        ssd = 0;
    }
    BackendConfig {
        mem_pages: mib_pages(s.host.mem_capacity_mib),
        mem_max_pages: mem_max,
        ssd_pages: ssd,
        mode: s.host.mode,
        batch_pages: mib_pages(s.host.eviction_batch_mib).max(1),
        scratch_dir: scratch_dir.to_path_buf(),
    }
}
