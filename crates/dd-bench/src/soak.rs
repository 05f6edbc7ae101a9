//! `soak`: mixed load on the real daemon for a configurable time, then three checks.
//!
//! # What it owns
//!
//! A `doubledecker serve` process (started from the binary the caller names, on 127.0.0.1 with
//! ephemeral ports, a memory store and an SSD store in a temporary folder), `vms` VMs registered in its
//! configuration file, one data-plane client thread per VM and one admin-API thread.
//!
//! # Load
//!
//! * Each data thread (one VM) keeps two ephemeral pools and, per step, picks by a seeded ChaCha8
//!   generator: batched puts and gets (most of the load), single puts and gets, page flushes, object
//!   flushes, object migration between its pools, spec changes over the data plane (mem, ssd, hybrid,
//!   none), and now and then destroys one of its pools and creates a new one. Its key space is larger
//!   than the memory store, so eviction, demotion and refusal all happen. Every hit is checked against
//!   the key stamped into the page.
//! * The admin thread, every ~50 ms: creates a pool through the VM-scope API, changes its spec, lists
//!   the VM's pools and changes the spec of one of the data thread's pools (which may have just been
//!   destroyed: `unknown_pool` is then the right answer and is counted, anything else is an error),
//!   destroys its pool; changes VM weights through the host API; every ~2 s registers and removes an
//!   extra VM.
//!
//! # Checks (all must pass; the CLI exits non-zero otherwise)
//!
//! 1. **Bounded memory**: the daemon's resident set (`VmRSS` of `/proc/<pid>/status`) is sampled every
//!    `sample_ms`. The maximum over the second half of the run must stay within
//!    `mem capacity x 1.10 + 64 MiB`: the memory store may hold its whole capacity, plus 10% for
//!    per-page metadata (index, order queues, slab entries: well under 10% of a 4 KiB page) and a fixed
//!    64 MiB for the runtime, connection buffers (256 KiB each), the SSD write queue and the allocator.
//!    The SSD store's data lives in its file (page cache, not this process's RSS).
//!
//!    **Flat memory** (issue 35): the least-squares slope of the second half's samples, in MiB per hour,
//!    must be at most [`SLOPE_LIMIT_MIB_PER_H`] in runs of at least [`SLOPE_MIN_RUN_SECS`]; shorter runs
//!    report it unchecked (the second half of a short run is still the stores' filling, the allocator's
//!    warm-up and the filling of the daemon's hour of history, and its slope says nothing about a leak).
//! 2. **Stats identity**: after the load stops and the counters have settled (two identical reads of
//!    `/v1/stats` in a row), `used = puts + moved_in - (exclusive_gets + flushes + evictions +
//!    moved_out)` must hold exactly per store for every pool, every VM's totals and the host totals.
//! 3. **Health**: `/healthz` answers, a fresh data-plane connection authenticates and pings, and the
//!    daemon exits cleanly on SIGTERM.

use crate::daemon::{BenchVm, Daemon, DaemonError, DaemonOptions, HOST_TOKEN};
use dd_engine::{HostStats, Key, PoolId, PoolOptions, PoolStats, Spec};
use rand::{Rng, RngCore, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::Serialize;
use serde_json::json;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Errors that stop the soak before its checks (a failed check is a report with `pass = false`).
pub type SoakError = crate::daemon::LoadError;

/// Options of `soak`.
#[derive(Debug, Clone)]
pub struct SoakOptions {
    pub exe: std::path::PathBuf,
    pub seconds: f64,
    /// VMs, one data-plane thread each. Default 3.
    pub vms: u32,
    /// Default 64 MiB.
    pub mem_capacity_bytes: u64,
    /// Default 128 MiB.
    pub ssd_capacity_bytes: u64,
    /// Distinct pages each data thread touches. Default 8 192 (32 MiB a VM: together more than the
    /// memory store, so it evicts and demotes).
    pub keys_per_vm: u64,
    /// RSS sampling period. Default 500 ms.
    pub sample_ms: u64,
    /// Progress line period. Default 10 s.
    pub progress_secs: f64,
    pub seed: u64,
}

impl Default for SoakOptions {
    fn default() -> Self {
        SoakOptions {
            exe: "doubledecker".into(),
            seconds: 60.0,
            vms: 3,
            mem_capacity_bytes: 64 << 20,
            ssd_capacity_bytes: 128 << 20,
            keys_per_vm: 8_192,
            sample_ms: 500,
            progress_secs: 10.0,
            seed: 0x5eed,
        }
    }
}

/// Operation counts over the run.
#[derive(Debug, Clone, Default, Serialize)]
pub struct SoakOps {
    pub puts: u64,
    pub gets: u64,
    pub get_hits: u64,
    pub page_flushes: u64,
    pub object_flushes: u64,
    pub migrations: u64,
    pub spec_changes: u64,
    pub pools_created: u64,
    pub pools_destroyed: u64,
    pub admin_calls: u64,
    /// Admin spec changes that found the data thread's pool already destroyed (expected answers).
    pub admin_unknown_pool: u64,
    pub vms_added_removed: u64,
}

/// The resident-memory check.
#[derive(Debug, Clone, Serialize)]
pub struct RssReport {
    pub samples: usize,
    pub min_mib: f64,
    pub max_mib: f64,
    pub first_half_max_mib: f64,
    pub second_half_min_mib: f64,
    pub second_half_max_mib: f64,
    pub final_mib: f64,
    /// `mem capacity x 1.10 + 64 MiB`.
    pub bound_mib: f64,
    pub bounded: bool,
    /// Least-squares slope of the RSS over the second half's samples, MiB per hour (`None`: fewer
    /// than two samples there).
    pub second_half_slope_mib_per_h: Option<f64>,
    /// [`SLOPE_LIMIT_MIB_PER_H`].
    pub slope_limit_mib_per_h: f64,
    /// Whether the slope is checked: only in runs of at least [`SLOPE_MIN_RUN_SECS`] (a shorter
    /// second half is still the tail of the stores' and the history's filling).
    pub slope_checked: bool,
    /// The slope is at most the limit, or not checked.
    pub flat: bool,
}

/// The most the RSS may grow over the second half of a long soak, MiB per hour: issue 35's acceptance
/// (at most 1 MiB/h over the second hour of a two-hour run). A leak of 0.7 KiB per pool destroyed (the
/// soak destroys ~45 000 an hour) is ~30 MiB/h, the runtime's blocking threads growing with their
/// buffers (issue 35) was ~10-20 MiB/h; the allocator's own steps are a fraction of a MiB.
pub const SLOPE_LIMIT_MIB_PER_H: f64 = 1.0;
/// Runs shorter than this report the slope but do not check it (two hours). The daemon's `/ui/`
/// history keeps an hour of samples per VM and pool (`history.samples` x `interval_ms`, bounded by
/// design, docs/decisions.md D31): its rings fill over the first hour, 0.15 MiB/h for each VM or
/// pool that lives through it (88 bytes every 2 s), so a second half that starts before the hour is
/// out measures the history's filling, not a leak. From two hours on the second half starts after
/// it, spans an hour, and a 0.25 MiB step of the allocator's reads as 0.25 MiB/h (over CI's 15-second
/// soak it would read as 100 MiB/h).
pub const SLOPE_MIN_RUN_SECS: f64 = 7200.0;

/// The stats-identity check.
#[derive(Debug, Clone, Serialize)]
pub struct IdentityReport {
    pub pools_checked: usize,
    pub vms_checked: usize,
    pub host_holds: bool,
    pub holds: bool,
    /// Which pool / VM failed (empty when `holds`).
    pub failures: Vec<String>,
    pub host_used_pages_mem: u64,
    pub host_used_pages_ssd: u64,
    pub host_evictions_mem: u64,
}

/// The report printed by `doubledecker soak --json`.
#[derive(Debug, Clone, Serialize)]
pub struct SoakReport {
    pub seconds: f64,
    pub vms: u32,
    pub mem_capacity_mib: u64,
    pub ssd_capacity_mib: u64,
    pub ops: SoakOps,
    pub ops_per_s: f64,
    /// First error of a load thread, if any (fails the run).
    pub load_error: Option<String>,
    pub rss: RssReport,
    pub identity: IdentityReport,
    pub healthy: bool,
    pub clean_exit: bool,
    pub pass: bool,
}

#[derive(Default)]
struct Counters {
    puts: AtomicU64,
    gets: AtomicU64,
    get_hits: AtomicU64,
    page_flushes: AtomicU64,
    object_flushes: AtomicU64,
    migrations: AtomicU64,
    spec_changes: AtomicU64,
    pools_created: AtomicU64,
    pools_destroyed: AtomicU64,
    admin_calls: AtomicU64,
    admin_unknown_pool: AtomicU64,
    vms_added_removed: AtomicU64,
}

impl Counters {
    fn snapshot(&self) -> SoakOps {
        let g = |a: &AtomicU64| a.load(Ordering::Relaxed);
        SoakOps {
            puts: g(&self.puts),
            gets: g(&self.gets),
            get_hits: g(&self.get_hits),
            page_flushes: g(&self.page_flushes),
            object_flushes: g(&self.object_flushes),
            migrations: g(&self.migrations),
            spec_changes: g(&self.spec_changes),
            pools_created: g(&self.pools_created),
            pools_destroyed: g(&self.pools_destroyed),
            admin_calls: g(&self.admin_calls),
            admin_unknown_pool: g(&self.admin_unknown_pool),
            vms_added_removed: g(&self.vms_added_removed),
        }
    }
}

fn add(a: &AtomicU64, n: u64) {
    a.fetch_add(n, Ordering::Relaxed);
}

const PAGE: usize = 4096;
const BATCH: usize = 16;
const MIB: f64 = 1048576.0;

fn stamp(p: &mut [u8], k: Key) {
    let v = k.object << 6 | k.index;
    p[..8].copy_from_slice(&v.to_le_bytes());
    p[PAGE - 8..].copy_from_slice(&(!v).to_le_bytes());
}

fn stamped(p: &[u8], k: Key) -> bool {
    let v = k.object << 6 | k.index;
    p[..8] == v.to_le_bytes() && p[PAGE - 8..] == (!v).to_le_bytes()
}

fn random_spec(rng: &mut ChaCha8Rng) -> Spec {
    let w = rng.gen_range(1..=100);
    match rng.gen_range(0..10) {
        0..=4 => Spec::Mem { weight: w },
        5..=6 => Spec::Ssd { weight: w },
        7..=8 => Spec::Hybrid { mem_weight: w, ssd_weight: rng.gen_range(1..=100) },
        _ => Spec::None,
    }
}

fn soak_error(what: &str, e: impl std::fmt::Display) -> String {
    format!("{what}: {e}")
}

/// One VM's data-plane load until `stop`.
fn data_thread(
    d: &Daemon,
    vm: &BenchVm,
    keys: u64,
    seed: u64,
    stop: &AtomicBool,
    c: &Counters,
) -> Result<(), String> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut cl =
        dd_client::Client::connect_tcp(d.tcp, vm.id, &vm.data_token).map_err(|e| soak_error("connect", e))?;
    let objects = (keys / 64).max(1);
    let mut pools = Vec::new();
    for _ in 0..2 {
        pools.push(
            cl.create_cgroup(PoolOptions::ephemeral(Spec::Mem { weight: 100 }))
                .map_err(|e| soak_error("create", e))?,
        );
        add(&c.pools_created, 1);
    }
    let mut pages = vec![0u8; BATCH * PAGE];
    rng.fill_bytes(&mut pages);
    let mut out = vec![0u8; BATCH * PAGE];
    let key = |rng: &mut ChaCha8Rng| Key::new(rng.gen_range(0..objects), rng.gen_range(0..64));
    while !stop.load(Ordering::Relaxed) {
        let p = pools[rng.gen_range(0..pools.len())];
        let op = rng.gen_range(0..1000);
        let r: Result<(), dd_client::ClientError> = (|| {
            match op {
                // Batched puts.
                0..=399 => {
                    let ks: Vec<Key> = (0..BATCH).map(|_| key(&mut rng)).collect();
                    for (i, k) in ks.iter().enumerate() {
                        stamp(&mut pages[i * PAGE..(i + 1) * PAGE], *k);
                    }
                    let items: Vec<(Key, &[u8])> =
                        ks.iter().enumerate().map(|(i, k)| (*k, &pages[i * PAGE..(i + 1) * PAGE])).collect();
                    cl.put_batch(p, &items)?;
                    add(&c.puts, BATCH as u64);
                }
                // Batched gets (exclusive: hits leave the pool).
                400..=749 => {
                    let mut ks: Vec<Key> = (0..BATCH).map(|_| key(&mut rng)).collect();
                    ks.sort_by_key(|k| (k.object, k.index));
                    ks.dedup();
                    let hits = cl.get_batch(p, &ks, &mut out[..ks.len() * PAGE])?;
                    for (i, k) in ks.iter().enumerate().filter(|(i, _)| hits[*i]) {
                        if !stamped(&out[i * PAGE..(i + 1) * PAGE], *k) {
                            return Err(dd_client::ClientError::Unexpected(format!("wrong page for {k:?}")));
                        }
                    }
                    add(&c.gets, ks.len() as u64);
                    add(&c.get_hits, hits.iter().filter(|h| **h).count() as u64);
                }
                // Single put / get.
                750..=849 => {
                    let k = key(&mut rng);
                    if op < 800 {
                        stamp(&mut pages[..PAGE], k);
                        cl.put(p, k, &pages[..PAGE])?;
                        add(&c.puts, 1);
                    } else {
                        let hit = cl.get(p, k, &mut out[..PAGE])?;
                        if hit && !stamped(&out[..PAGE], k) {
                            return Err(dd_client::ClientError::Unexpected(format!("wrong page for {k:?}")));
                        }
                        add(&c.gets, 1);
                        add(&c.get_hits, hit as u64);
                    }
                }
                850..=919 => {
                    cl.flush_page(p, key(&mut rng))?;
                    add(&c.page_flushes, 1);
                }
                920..=949 => {
                    cl.flush_object(p, rng.gen_range(0..objects))?;
                    add(&c.object_flushes, 1);
                }
                950..=974 => {
                    let to = pools[rng.gen_range(0..pools.len())];
                    if to != p {
                        cl.migrate_object(p, to, rng.gen_range(0..objects))?;
                        add(&c.migrations, 1);
                    }
                }
                975..=994 => {
                    cl.set_cg_weight(p, random_spec(&mut rng))?;
                    add(&c.spec_changes, 1);
                }
                // Container stops, another starts: 1 step in 4 000 (a pool lives long enough to fill).
                _ if rng.gen_ratio(1, 20) => {
                    let i = pools.iter().position(|x| *x == p).expect("own pool");
                    cl.destroy_cgroup(p)?;
                    add(&c.pools_destroyed, 1);
                    pools[i] = cl.create_cgroup(PoolOptions::ephemeral(random_spec(&mut rng)))?;
                    add(&c.pools_created, 1);
                }
                _ => {}
            }
            Ok(())
        })();
        r.map_err(|e| soak_error(&format!("vm {} op {op}", vm.id), e))?;
    }
    Ok(())
}

/// Admin-API load until `stop`.
fn admin_thread(
    d: &Daemon,
    vms: &[BenchVm],
    seed: u64,
    stop: &AtomicBool,
    c: &Counters,
) -> Result<(), String> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut step = 0u64;
    let spec_json = |s: Spec| serde_json::to_value(s).expect("spec serialises");
    while !stop.load(Ordering::Relaxed) {
        step += 1;
        let vm = &vms[rng.gen_range(0..vms.len())];
        let t = vm.admin_token.as_str();
        let r: Result<(), DaemonError> = (|| {
            let created: PoolStats = d.admin(
                "POST",
                "/v1/vm/pools",
                t,
                Some(&json!({ "spec": spec_json(random_spec(&mut rng)) })),
            )?;
            add(&c.pools_created, 1);
            let path = format!("/v1/vm/pools/{}", created.pool.0);
            let _: PoolStats =
                d.admin("PUT", &format!("{path}/spec"), t, Some(&spec_json(random_spec(&mut rng))))?;
            let pools: Vec<PoolStats> = d.admin("GET", "/v1/vm/pools", t, None)?;
            let others: Vec<PoolId> = pools.iter().map(|p| p.pool).filter(|p| *p != created.pool).collect();
            if !others.is_empty() {
                let p = others[rng.gen_range(0..others.len())];
                match d.admin::<PoolStats>(
                    "PUT",
                    &format!("/v1/vm/pools/{}/spec", p.0),
                    t,
                    Some(&spec_json(random_spec(&mut rng))),
                ) {
                    Ok(_) => add(&c.spec_changes, 1),
                    // The data thread destroyed it in between: the documented answer.
                    Err(DaemonError::Admin(e)) if e.code() == Some("unknown_pool") => {
                        add(&c.admin_unknown_pool, 1)
                    }
                    Err(e) => return Err(e),
                }
            }
            let _: serde_json::Value = d.admin("DELETE", &path, t, None)?;
            add(&c.pools_destroyed, 1);
            let w = json!({ "mem": rng.gen_range(1..=100), "ssd": rng.gen_range(1..=100) });
            let _: serde_json::Value =
                d.admin("PUT", &format!("/v1/vms/{}/weights", vm.id), HOST_TOKEN, Some(&w))?;
            add(&c.admin_calls, 6);
            if step.is_multiple_of(40) {
                // A VM comes and goes (with a pool of its own, created and left for the removal).
                let extra = BenchVm::new(1000 + (step / 40) as u32);
                let body = json!({ "id": extra.id, "data_token": extra.data_token, "admin_token": extra.admin_token });
                let _: serde_json::Value = d.admin("POST", "/v1/vms", HOST_TOKEN, Some(&body))?;
                let _: PoolStats = d.admin(
                    "POST",
                    "/v1/vm/pools",
                    &extra.admin_token,
                    Some(&json!({ "spec": { "type": "mem", "weight": 10 } })),
                )?;
                let mut cl = dd_client::Client::connect_tcp(d.tcp, extra.id, &extra.data_token)?;
                cl.ping()?;
                drop(cl);
                let _: serde_json::Value =
                    d.admin("DELETE", &format!("/v1/vms/{}", extra.id), HOST_TOKEN, None)?;
                add(&c.vms_added_removed, 1);
                add(&c.admin_calls, 3);
            }
            Ok(())
        })();
        r.map_err(|e| soak_error("admin", e))?;
        std::thread::sleep(Duration::from_millis(50));
    }
    Ok(())
}

/// Checks the identity on every pool, VM and the host; returns the report.
pub fn check_identity(h: &HostStats) -> IdentityReport {
    let mut failures = Vec::new();
    let mut pools = 0;
    for v in &h.vms {
        if !v.totals.identity_holds() {
            failures.push(format!("vm {} totals: {:?}", v.vm.0, v.totals));
        }
        for p in &v.pools {
            pools += 1;
            if !p.counters.identity_holds() {
                failures.push(format!("vm {} pool {}: {:?}", v.vm.0, p.pool.0, p.counters));
            }
        }
    }
    let host_holds = h.totals.identity_holds();
    if !host_holds {
        failures.push(format!("host totals: {:?}", h.totals));
    }
    IdentityReport {
        pools_checked: pools,
        vms_checked: h.vms.len(),
        host_holds,
        holds: failures.is_empty(),
        failures,
        host_used_pages_mem: h.totals.mem.used,
        host_used_pages_ssd: h.totals.ssd.used,
        host_evictions_mem: h.totals.mem.evictions,
    }
}

/// Least-squares slope of `(seconds, bytes)` samples, MiB per hour; `None` for fewer than two
/// distinct times.
pub fn slope_mib_per_h(samples: &[&(f64, u64)]) -> Option<f64> {
    let n = samples.len() as f64;
    if samples.len() < 2 {
        return None;
    }
    let mt = samples.iter().map(|s| s.0).sum::<f64>() / n;
    let mb = samples.iter().map(|s| s.1 as f64 / MIB).sum::<f64>() / n;
    let (mut cov, mut var) = (0.0, 0.0);
    for s in samples {
        let dt = s.0 - mt;
        cov += dt * (s.1 as f64 / MIB - mb);
        var += dt * dt;
    }
    (var > 0.0).then(|| cov / var * 3600.0)
}

/// The RSS check over `(seconds since start, bytes)` samples.
pub fn check_rss(samples: &[(f64, u64)], run_secs: f64, mem_capacity_bytes: u64) -> RssReport {
    let bound = mem_capacity_bytes as f64 * 1.10 + 64.0 * MIB;
    let mib = |b: u64| b as f64 / MIB;
    let half = run_secs / 2.0;
    let (first, second): (Vec<_>, Vec<_>) = samples.iter().partition(|(t, _)| *t < half);
    let max = |v: &[&(f64, u64)]| v.iter().map(|s| s.1).max().unwrap_or(0);
    let min = |v: &[&(f64, u64)]| v.iter().map(|s| s.1).min().unwrap_or(0);
    let all: Vec<&(f64, u64)> = samples.iter().collect();
    let second_max = max(&second);
    let slope = slope_mib_per_h(&second);
    let slope_checked = run_secs >= SLOPE_MIN_RUN_SECS;
    RssReport {
        samples: samples.len(),
        min_mib: mib(min(&all)),
        max_mib: mib(max(&all)),
        first_half_max_mib: mib(max(&first)),
        second_half_min_mib: mib(min(&second)),
        second_half_max_mib: mib(second_max),
        final_mib: mib(samples.last().map_or(0, |s| s.1)),
        bound_mib: bound / MIB,
        // No samples in the second half is a failure too: nothing was shown.
        bounded: !second.is_empty() && (second_max as f64) <= bound,
        second_half_slope_mib_per_h: slope,
        slope_limit_mib_per_h: SLOPE_LIMIT_MIB_PER_H,
        slope_checked,
        flat: !slope_checked || slope.is_some_and(|s| s <= SLOPE_LIMIT_MIB_PER_H),
    }
}

/// Runs the soak; `progress` gets a line every `progress_secs`.
pub fn run(o: &SoakOptions, progress: &mut dyn FnMut(&str)) -> Result<SoakReport, SoakError> {
    if o.seconds.is_nan() || o.seconds <= 0.0 {
        return Err(SoakError::InvalidOption { field: "seconds", reason: "must be positive".into() });
    }
    if o.vms == 0 || o.keys_per_vm < 64 {
        return Err(SoakError::InvalidOption {
            field: "vms",
            reason: "at least 1 VM of at least 64 keys".into(),
        });
    }
    let vms: Vec<BenchVm> = (1..=o.vms).map(BenchVm::new).collect();
    let mut d = Daemon::start(&DaemonOptions {
        exe: o.exe.clone(),
        mem_capacity_bytes: o.mem_capacity_bytes,
        ssd_capacity_bytes: o.ssd_capacity_bytes,
        vms: vms.clone(),
        extra_toml: String::new(),
    })?;
    let stop = AtomicBool::new(false);
    let counters = Counters::default();
    let first_error: Mutex<Option<String>> = Mutex::new(None);
    let mut samples: Vec<(f64, u64)> = Vec::new();
    let start = Instant::now();
    let run_for = Duration::from_secs_f64(o.seconds);
    let fail = |e: String| {
        first_error.lock().expect("not poisoned").get_or_insert(e);
    };
    std::thread::scope(|s| {
        let (d, stop, counters, vms, fail) = (&d, &stop, &counters, &vms, &fail);
        let mut hs = Vec::new();
        for (i, vm) in vms.iter().enumerate() {
            hs.push(s.spawn(move || {
                if let Err(e) = data_thread(d, vm, o.keys_per_vm, o.seed ^ (i as u64 + 1), stop, counters) {
                    fail(e);
                    stop.store(true, Ordering::Relaxed);
                }
            }));
        }
        hs.push(s.spawn(move || {
            if let Err(e) = admin_thread(d, vms, o.seed ^ 0xad, stop, counters) {
                fail(e);
                stop.store(true, Ordering::Relaxed);
            }
        }));
        let mut next_progress = Duration::from_secs_f64(o.progress_secs);
        while start.elapsed() < run_for && !stop.load(Ordering::Relaxed) {
            std::thread::sleep(Duration::from_millis(o.sample_ms));
            let t = start.elapsed();
            match d.rss_bytes() {
                Ok(b) => samples.push((t.as_secs_f64(), b)),
                Err(e) => {
                    fail(format!("reading the daemon's RSS: {e}"));
                    break;
                }
            }
            if t >= next_progress {
                next_progress += Duration::from_secs_f64(o.progress_secs);
                let ops = counters.snapshot();
                progress(&format!(
                    "{:>5.0}/{:.0} s  {:>10} page ops  {:>5} pools created  rss {:>6.1} MiB",
                    t.as_secs_f64(),
                    o.seconds,
                    ops.puts + ops.gets,
                    ops.pools_created,
                    samples.last().map_or(0.0, |s| s.1 as f64 / MIB),
                ));
            }
        }
        stop.store(true, Ordering::Relaxed);
        for h in hs {
            if h.join().is_err() {
                fail("a load thread panicked".into());
            }
        }
    });
    let elapsed = start.elapsed().as_secs_f64();
    let ops = counters.snapshot();

    // Settle: background maintenance may still be moving pages; read until two reads agree.
    let mut last: Option<HostStats> = None;
    let settle_deadline = Instant::now() + Duration::from_secs(10);
    let host = loop {
        let h: HostStats = d.admin("GET", "/v1/stats", HOST_TOKEN, None)?;
        if last.as_ref() == Some(&h) || Instant::now() > settle_deadline {
            break h;
        }
        last = Some(h);
        std::thread::sleep(Duration::from_millis(200));
    };
    let identity = check_identity(&host);
    if let Ok(b) = d.rss_bytes() {
        samples.push((elapsed, b));
    }
    let rss = check_rss(&samples, elapsed, o.mem_capacity_bytes);

    let health: Result<serde_json::Value, _> = d.admin("GET", "/healthz", HOST_TOKEN, None);
    let ping =
        dd_client::Client::connect_tcp(d.tcp, vms[0].id, &vms[0].data_token).and_then(|mut c| c.ping());
    let healthy = d.is_running() && health.map(|v| v["status"] == "ok").unwrap_or(false) && ping.is_ok();
    let clean_exit = d.stop(Duration::from_secs(30))?;
    let load_error = first_error.into_inner().expect("not poisoned");
    let pass = load_error.is_none() && rss.bounded && rss.flat && identity.holds && healthy && clean_exit;
    Ok(SoakReport {
        seconds: elapsed,
        vms: o.vms,
        mem_capacity_mib: o.mem_capacity_bytes >> 20,
        ssd_capacity_mib: o.ssd_capacity_bytes >> 20,
        ops_per_s: (ops.puts + ops.gets) as f64 / elapsed,
        ops,
        load_error,
        rss,
        identity,
        healthy,
        clean_exit,
        pass,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identity_check_names_the_broken_pool() {
        use dd_engine::{Counters as C, EvictionOrder, Mode, PoolKind, VmId, VmStats, VmWeights};
        let mut good = C::default();
        good.mem.puts = 10;
        good.mem.exclusive_gets = 3;
        good.mem.evictions = 2;
        good.mem.used = 5;
        let mut bad = good;
        bad.mem.used = 6; // one page more than the counters account for
        let pool = |id: u32, counters: C| PoolStats {
            pool: PoolId(id),
            vm: VmId(1),
            kind: PoolKind::Ephemeral,
            spec: Spec::Mem { weight: 1 },
            order: EvictionOrder::default(),
            exclusive_gets: true,
            counters,
            label: None,
        };
        let mut totals = good;
        totals.add(&good);
        let mut h = HostStats {
            page_size: PAGE,
            mode: Mode::default(),
            eviction_batch_pages: 1,
            stores: vec![],
            vms: vec![VmStats {
                vm: VmId(1),
                weights: VmWeights::equal(1),
                pools: vec![pool(1, good), pool(2, good)],
                totals,
                pools_omitted: 0,
            }],
            totals,
            pins_held: 0,
            remote_dedups: 0,
            group_dedup_hits: 0,
            group_bytes_saved: 0,
        };
        let r = check_identity(&h);
        assert!(r.holds && r.host_holds, "{r:?}");
        assert_eq!((r.pools_checked, r.vms_checked), (2, 1));
        h.vms[0].pools[1] = pool(2, bad);
        let r = check_identity(&h);
        assert!(!r.holds && r.host_holds);
        assert_eq!(r.failures.len(), 1);
        assert!(r.failures[0].starts_with("vm 1 pool 2"), "{:?}", r.failures);
    }

    #[test]
    fn rss_bound_uses_the_second_half() {
        let cap = 64 << 20;
        // Start-up growth in the first half above the bound does not count; the second half does.
        let s = vec![(1.0, 300 << 20), (6.0, 100 << 20), (9.0, 120 << 20)];
        let r = check_rss(&s, 10.0, cap);
        assert!(r.bounded, "{r:?}");
        assert_eq!(r.second_half_max_mib, 120.0);
        assert!((r.bound_mib - (64.0 * 1.1 + 64.0)).abs() < 1e-9);
        let r = check_rss(&[(1.0, 10 << 20), (8.0, 200 << 20)], 10.0, cap);
        assert!(!r.bounded);
        assert!(!check_rss(&[(1.0, 10 << 20)], 10.0, cap).bounded, "no second-half sample");
    }

    #[test]
    fn rss_slope_is_fitted_over_the_second_half_and_checked_only_in_long_runs() {
        let cap = 64 << 20;
        let mib = |m: f64| (m * MIB) as u64;
        // 100 MiB growing 3 MiB an hour in the second half (a steep first half does not count), with
        // +-0.2 MiB of alternating noise that the fit averages out.
        let run = 2.0 * SLOPE_MIN_RUN_SECS;
        let samples: Vec<(f64, u64)> = (0..=400)
            .map(|i| {
                let t = run * i as f64 / 400.0;
                let noise = if i % 2 == 0 { 0.2 } else { -0.2 };
                let m = if t < run / 2.0 { 50.0 + t } else { 100.0 + 3.0 * t / 3600.0 + noise };
                (t, mib(m))
            })
            .collect();
        let r = check_rss(&samples, run, cap);
        let s = r.second_half_slope_mib_per_h.expect("a slope");
        assert!((s - 3.0).abs() < 0.1, "{r:?}");
        assert!(r.slope_checked && !r.flat && r.bounded, "{r:?}");
        // Flat: the same samples less the growth.
        let flat: Vec<(f64, u64)> = samples
            .iter()
            .map(|&(t, b)| (t, if t < run / 2.0 { b } else { b - mib(3.0 * t / 3600.0) }))
            .collect();
        let r = check_rss(&flat, run, cap);
        assert!(r.flat && r.second_half_slope_mib_per_h.unwrap().abs() < 0.1, "{r:?}");
        // A short run reports the slope but passes whatever it is.
        let short: Vec<(f64, u64)> = samples.iter().map(|&(t, b)| (t / 100.0, b)).collect();
        let r = check_rss(&short, run / 100.0, cap);
        assert!(!r.slope_checked && r.flat && r.second_half_slope_mib_per_h.unwrap() > 100.0, "{r:?}");
        assert_eq!(slope_mib_per_h(&[&(1.0, 5)]), None);
    }
}
