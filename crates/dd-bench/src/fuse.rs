//! `bench fuse`: what the second-chance cache buys a real program re-reading files through the FUSE
//! filesystem, against the same mount without the daemon.
//!
//! Setup: a file set larger than the container's first-level cache in a backing directory, a real
//! container cgroup (v1 memory or v2), `doubledecker mount` as a process with every backing read delayed
//! by `backing_read_latency_us` (a network disk stand-in), and `cat` in the cgroup reading the whole set
//! once cold and then `passes` more times. Run twice: with the daemon (a real `doubledecker serve`, the
//! container's pool made by the real watcher) and without (first level only). The figure is the ratio
//! of the re-read times; the mount's own counters (first-level hits, pool hits, backing reads) are
//! reported so that a speed-up can be traced to pool hits.
//!
//! With `sampling_rounds > 0` it also measures what the mount's read sampling for the provisioner
//! (`[sampling]`, on by default) costs, two ways: end to end, more mounts on the same daemon, alternately
//! with sampling off and on after one discarded warm-up pair, so that a drift of the machine falls on
//! both (the ratio of the median re-read times); and in this process, the mount's own sampler
//! (`dd_fuse::sampling::Sampled`) fed the file set's pages in the order the re-reads read them, against
//! a copy of the same pages (the least a read through the mount does per page: the mount copies each
//! page at least once), which resolves a cost far below the end-to-end noise.
//!
//! Owns: a temporary directory (backing files, mount point, configurations) and one cgroup, both removed
//! at the end; the mount and daemon processes, which are signalled by PID, reaped, and on any error
//! unmounted (lazily) by guards. Needs root and `/dev/fuse`.

use crate::daemon::{BenchVm, Daemon, DaemonOptions};
use serde::Serialize;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum FuseBenchError {
    #[error("bench fuse needs {0}")]
    Unavailable(String),
    #[error("i/o: {0}")]
    Io(#[from] std::io::Error),
    #[error("daemon: {0}")]
    Daemon(#[from] crate::daemon::DaemonError),
    #[error("watcher: {0}")]
    Watch(#[from] dd_guest::watch::WatchError),
    #[error("{0}")]
    Failed(String),
}

/// Parameters of `bench fuse`.
#[derive(Debug, Clone, Serialize)]
pub struct FuseBenchOptions {
    /// The `doubledecker` executable (for `serve` and `mount`).
    #[serde(skip)]
    pub exe: PathBuf,
    /// Total bytes of the file set.
    pub file_set_bytes: u64,
    pub files: u32,
    /// The container's first-level page cache.
    pub l1_budget_bytes: u64,
    /// Delay of every backing-store read request.
    pub backing_read_latency_us: u64,
    /// Timed re-reads after the cold pass.
    pub passes: u32,
    /// Pairs of extra runs with the daemon (sampling off, then on) that measure the sampling's cost;
    /// 0: none.
    pub sampling_rounds: u32,
    /// Where the temporary backing directory goes.
    #[serde(skip)]
    pub dir: PathBuf,
}

impl Default for FuseBenchOptions {
    fn default() -> Self {
        FuseBenchOptions {
            exe: PathBuf::from("doubledecker"),
            file_set_bytes: 64 << 20,
            files: 16,
            l1_budget_bytes: 16 << 20,
            // One millisecond per request: the small-I/O latency of cloud network block storage.
            backing_read_latency_us: 1000,
            passes: 3,
            sampling_rounds: 0,
            dir: PathBuf::from("/var/tmp"),
        }
    }
}

/// One configuration's run.
#[derive(Debug, Clone, Serialize)]
pub struct FuseRun {
    pub daemon: bool,
    /// The mount sampled its reads for the provisioner (`[sampling] enabled`).
    pub sampling: bool,
    pub cold_s: f64,
    /// Median of the timed re-read passes.
    pub reread_s: f64,
    pub reread_mib_per_s: f64,
    /// The mount's counters of the container over the whole run.
    pub l1_hits: u64,
    pub pool_hits: u64,
    pub backing_reads: u64,
    pub backing_pages: u64,
}

#[derive(Debug, Clone, Serialize)]
pub struct FuseBenchReport {
    pub parameters: FuseBenchOptions,
    pub cgroup_version: u32,
    pub without_daemon: FuseRun,
    pub with_daemon: FuseRun,
    /// `without_daemon.reread_s / with_daemon.reread_s`.
    pub speedup: f64,
    /// What sampling costs (`sampling_rounds > 0`).
    pub sampling_cost: Option<SamplingCost>,
}

/// Re-reads with the daemon, sampling off and on, in alternating runs; and the sampler's cost per page
/// against a page copy, in this process.
#[derive(Debug, Clone, Serialize)]
pub struct SamplingCost {
    /// The sampler, per page read (every pass over the file set after the first).
    pub sampler_ns_per_page: f64,
    /// A 4 KiB copy from a buffer the size of the file set, per page.
    pub memcpy_ns_per_page: f64,
    /// `sampler_ns_per_page / memcpy_ns_per_page`.
    pub sampler_per_memcpy: f64,
    /// Each run's median re-read time, in the order they ran.
    pub unsampled_reread_s: Vec<f64>,
    pub sampled_reread_s: Vec<f64>,
    pub unsampled_median_s: f64,
    pub sampled_median_s: f64,
    /// `sampled_median_s / unsampled_median_s`: 1.0 means free.
    pub ratio: f64,
}

/// The in-process half of [`SamplingCost`]: (sampler ns per page, memcpy ns per page).
fn sampler_cost(opts: &FuseBenchOptions) -> (f64, f64) {
    use dd_fuse::sampling::{page_key, Sampled};
    const PAGE: usize = 4096;
    let pages_per_file = opts.file_set_bytes / opts.files as u64 / PAGE as u64;
    // Inode-like object ids; each file read front to back, as `cat` does.
    let keys: Vec<u64> = (0..opts.files as u64)
        .flat_map(|f| (0..pages_per_file).map(move |i| page_key(1000 + f, i)))
        .collect();
    let passes = (opts.passes.max(1) + 1) as usize;
    // Defaults of `[sampling]` (max_samples dd_mrc::DEFAULT_MAX_SAMPLES); the first pass fills the model,
    // as the cold pass does.
    let s = Sampled::new(dd_mrc::DEFAULT_MAX_SAMPLES, 1);
    keys.iter().for_each(|&k| s.access(k));
    let t = Instant::now();
    for _ in 1..passes {
        keys.iter().for_each(|&k| s.access(std::hint::black_box(k)));
    }
    let sampler = t.elapsed().as_nanos() as f64 / (keys.len() * (passes - 1)).max(1) as f64;
    let src = vec![7u8; keys.len() * PAGE];
    let mut dst = vec![0u8; PAGE];
    let t = Instant::now();
    for _ in 1..passes {
        for chunk in src.chunks_exact(PAGE) {
            dst.copy_from_slice(std::hint::black_box(chunk));
            std::hint::black_box(&mut dst);
        }
    }
    let memcpy = t.elapsed().as_nanos() as f64 / (keys.len() * (passes - 1)).max(1) as f64;
    (sampler, memcpy)
}

fn median(v: &[f64]) -> f64 {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// A mount process, unmounted and reaped whatever happens.
struct MountGuard {
    child: Option<Child>,
    mountpoint: PathBuf,
}

fn is_mounted(mountpoint: &Path) -> bool {
    let m = mountpoint.display().to_string();
    std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap_or_default()
        .lines()
        .any(|l| l.split(' ').nth(4) == Some(m.as_str()))
}

impl MountGuard {
    /// SIGTERM, wait (bounded), and the counters the mount printed.
    fn stop(&mut self) -> Result<serde_json::Value, FuseBenchError> {
        let Some(mut c) = self.child.take() else { return Ok(serde_json::Value::Null) };
        // SAFETY: kill(2) on the pid of a child we spawned and have not reaped.
        unsafe { libc::kill(c.id() as libc::pid_t, libc::SIGTERM) };
        let deadline = Instant::now() + Duration::from_secs(60);
        while c.try_wait()?.is_none() {
            if Instant::now() > deadline {
                let _ = c.kill();
                let _ = c.wait();
                return Err(FuseBenchError::Failed("doubledecker mount did not exit on SIGTERM".into()));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let mut out = String::new();
        if let Some(mut o) = c.stdout.take() {
            o.read_to_string(&mut out)?;
        }
        serde_json::from_str(out.trim()).map_err(|e| FuseBenchError::Failed(format!("mount counters: {e}")))
    }
}

impl Drop for MountGuard {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        if is_mounted(&self.mountpoint) {
            let _ = Command::new("umount").arg("-l").arg(&self.mountpoint).status();
        }
    }
}

/// The container cgroup, removed on drop (its reader processes have exited by then).
struct CgroupGuard(PathBuf);

impl Drop for CgroupGuard {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir(self.0.join("bench"));
        let _ = std::fs::remove_dir(&self.0);
    }
}

fn cgroup_root() -> Result<(PathBuf, u32), FuseBenchError> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Err(FuseBenchError::Unavailable("root (it mounts and makes cgroups)".into()));
    }
    if !Path::new("/dev/fuse").exists() {
        return Err(FuseBenchError::Unavailable("/dev/fuse".into()));
    }
    if Path::new("/sys/fs/cgroup/memory/cgroup.procs").exists() {
        return Ok(("/sys/fs/cgroup/memory".into(), 1));
    }
    let ctl = std::fs::read_to_string("/sys/fs/cgroup/cgroup.controllers").unwrap_or_default();
    if ctl.split_whitespace().any(|c| c == "memory") {
        return Ok(("/sys/fs/cgroup".into(), 2));
    }
    Err(FuseBenchError::Unavailable("a cgroup v1 or v2 memory controller".into()))
}

/// Reads every file once with `cat` inside the container; returns the wall time.
fn pass(cgroup: &Path, files: &[PathBuf]) -> Result<f64, FuseBenchError> {
    let mut script = format!("echo $$ > {}/cgroup.procs && cat", cgroup.display());
    for f in files {
        script.push(' ');
        script.push_str(&f.display().to_string());
    }
    script.push_str(" > /dev/null");
    let t = Instant::now();
    let st = Command::new("sh").arg("-c").arg(&script).status()?;
    let s = t.elapsed().as_secs_f64();
    if !st.success() {
        return Err(FuseBenchError::Failed(format!("reading the files failed: {st}")));
    }
    Ok(s)
}

fn run_one(
    opts: &FuseBenchOptions,
    work: &Path,
    parent: &Path,
    daemon: Option<&Daemon>,
    vm: &BenchVm,
    sampling: bool,
) -> Result<FuseRun, FuseBenchError> {
    let (back, mnt) = (work.join("back"), work.join("mnt"));
    let state = work.join("pools.json");
    let mut cfg = format!(
        "cgroup_parent = {:?}\nstate_file = {:?}\ndefault_budget_bytes = {}\nbacking_read_latency_us = {}\n",
        parent.display().to_string(),
        state.display().to_string(),
        opts.l1_budget_bytes,
        opts.backing_read_latency_us
    );
    let mut watcher = None;
    if let Some(d) = daemon {
        let daemon_toml =
            format!("[daemon]\ntcp = \"{}\"\nvm = {}\ndata_token = {:?}\n", d.tcp, vm.id, vm.data_token);
        // The real watcher makes the container's pool and publishes it where the mount looks.
        let wcfg: dd_guest::WatchConfig = toml::from_str(&format!(
            "cgroup_parent = {:?}\nstate_file = {:?}\n{daemon_toml}",
            parent.display().to_string(),
            state.display().to_string()
        ))
        .map_err(|e| FuseBenchError::Failed(e.to_string()))?;
        let mut w = dd_guest::Watcher::new(wcfg)?;
        w.round()?;
        watcher = Some(w);
        cfg.push_str(&daemon_toml);
    }
    if !sampling {
        cfg.push_str("[sampling]\nenabled = false\n");
    }
    let cfg_path = work.join("mount.toml");
    std::fs::write(&cfg_path, cfg)?;
    let child = Command::new(&opts.exe)
        .arg("mount")
        .arg(&back)
        .arg(&mnt)
        .arg("--config")
        .arg(&cfg_path)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .spawn()?;
    let mut m = MountGuard { child: Some(child), mountpoint: mnt.clone() };
    // A bound on start-up, not a measurement.
    let deadline = Instant::now() + Duration::from_secs(60);
    while !is_mounted(&mnt) {
        if Instant::now() > deadline {
            return Err(FuseBenchError::Failed("not mounted after 60 s".into()));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let files: Vec<PathBuf> = (0..opts.files).map(|i| mnt.join(format!("f{i:03}"))).collect();
    let cgroup = parent.join("bench");
    let cold_s = pass(&cgroup, &files)?;
    let mut times = Vec::new();
    for _ in 0..opts.passes {
        times.push(pass(&cgroup, &files)?);
    }
    let stats = m.stop()?;
    if let Some(w) = watcher {
        w.shutdown()?;
    }
    let reread_s = median(&times);
    let c = stats["containers"]
        .as_array()
        .and_then(|v| v.iter().find(|c| c["name"] == "bench"))
        .cloned()
        .ok_or_else(|| FuseBenchError::Failed(format!("no counters of the container in {stats}")))?;
    let n = |k: &str| c[k].as_u64().unwrap_or(0);
    Ok(FuseRun {
        daemon: daemon.is_some(),
        sampling,
        cold_s,
        reread_s,
        reread_mib_per_s: opts.file_set_bytes as f64 / (1 << 20) as f64 / reread_s,
        l1_hits: n("l1_hits"),
        pool_hits: n("pool_hits"),
        backing_reads: n("backing_reads"),
        backing_pages: n("backing_pages"),
    })
}

/// Runs the benchmark (without the daemon, then with it).
pub fn run(
    opts: &FuseBenchOptions,
    progress: &mut dyn FnMut(&str),
) -> Result<FuseBenchReport, FuseBenchError> {
    let (root, version) = cgroup_root()?;
    if opts.files == 0 || opts.passes == 0 || opts.file_set_bytes < opts.files as u64 {
        return Err(FuseBenchError::Failed("files, passes and file_set_bytes must be positive".into()));
    }
    if opts.file_set_bytes <= opts.l1_budget_bytes {
        return Err(FuseBenchError::Failed("the file set must be larger than the first-level cache".into()));
    }
    let work = tempfile::Builder::new().prefix("dd-bench-fuse.").tempdir_in(&opts.dir)?;
    std::fs::create_dir(work.path().join("back"))?;
    std::fs::create_dir(work.path().join("mnt"))?;
    let per_file = (opts.file_set_bytes / opts.files as u64) as usize;
    progress(&format!("writing {} files of {} KiB", opts.files, per_file >> 10));
    for i in 0..opts.files {
        use rand::{RngCore, SeedableRng};
        let mut data = vec![0u8; per_file];
        rand_chacha::ChaCha8Rng::seed_from_u64(i as u64).fill_bytes(&mut data);
        std::fs::write(work.path().join("back").join(format!("f{i:03}")), data)?;
    }
    let parent = root.join(format!("dd-bench-fuse-{}", std::process::id()));
    std::fs::create_dir(&parent)?;
    let _cg = CgroupGuard(parent.clone());
    std::fs::create_dir(parent.join("bench"))?;
    let vm = BenchVm::new(1);
    progress("without the daemon");
    let without = run_one(opts, work.path(), &parent, None, &vm, true)?;
    progress("with the daemon");
    let d = Daemon::start(&DaemonOptions {
        exe: opts.exe.clone(),
        mem_capacity_bytes: 2 * opts.file_set_bytes,
        ssd_capacity_bytes: 0,
        vms: vec![vm.clone()],
        extra_toml: String::new(),
    })?;
    let with = run_one(opts, work.path(), &parent, Some(&d), &vm, true)?;
    let mut sampling_cost = None;
    if opts.sampling_rounds > 0 {
        let (mut off, mut on) = (Vec::new(), Vec::new());
        // Round 0 warms the machine up and is not counted (the first runs after the daemon's start
        // were up to 1.6x slower than the later ones).
        for round in 0..=opts.sampling_rounds {
            progress(&format!("sampling cost, round {round} of {} (0: warm-up)", opts.sampling_rounds));
            let a = run_one(opts, work.path(), &parent, Some(&d), &vm, false)?.reread_s;
            let b = run_one(opts, work.path(), &parent, Some(&d), &vm, true)?.reread_s;
            if round > 0 {
                off.push(a);
                on.push(b);
            }
        }
        let (unsampled_median_s, sampled_median_s) = (median(&off), median(&on));
        let (sampler_ns_per_page, memcpy_ns_per_page) = sampler_cost(opts);
        sampling_cost = Some(SamplingCost {
            sampler_ns_per_page,
            memcpy_ns_per_page,
            sampler_per_memcpy: sampler_ns_per_page / memcpy_ns_per_page,
            unsampled_reread_s: off,
            sampled_reread_s: on,
            unsampled_median_s,
            sampled_median_s,
            ratio: sampled_median_s / unsampled_median_s,
        });
    }
    Ok(FuseBenchReport {
        parameters: opts.clone(),
        cgroup_version: version,
        speedup: without.reread_s / with.reread_s,
        without_daemon: without,
        with_daemon: with,
        sampling_cost,
    })
}
