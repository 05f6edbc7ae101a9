//! The memory budget of a lab run: an upper estimate of each variant's peak memory, the memory the host
//! (or the lab's memory cgroup) has available, and the plan that follows from them: how many variants
//! run side by side and where the SSD store's scratch file goes, or a refusal with one message.
//!
//! Why: the lab's engines are real caches sized like the papers' hosts. A full-scale run of
//! `fig9-10-table2-modes` once fallocated a 16 GiB SSD store in `/dev/shm` per variant, two variants at
//! once, and the kernel's OOM killer took unrelated processes (issue 13). Now the scratch file is never
//! reserved on a memory-backed file system (`dd_engine::store::ssd::file`), and a run starts only if its
//! estimate fits below the margin.
//!
//! Invariants:
//! * **The estimate is an upper bound** of a variant's peak, each term bounded by a capacity the
//!   scenario fixes: the memory store's frames (its largest capacity), the engine's index at its
//!   worst-case bytes per cached page (one-page objects) for every page both stores can hold, the SSD
//!   store's file when it lives in memory, and the guest model at its bytes per page for the VM's largest
//!   memory plus its anonymous datasets. `tests/memory_estimate.rs` fills an engine and a guest to
//!   capacity and checks the per-page constants against the process's resident memory.
//! * **A plan never lets available memory fall below [`MARGIN_FRACTION`] of the total**: the largest
//!   `jobs` estimates together fit in `available - MARGIN_FRACTION x total` (with other processes' use
//!   as it was at the start).
//! * Planning changes no output: the scratch file's place and the number of threads never change a
//!   result byte (each variant has its own engine; tested in `lib.rs`).

use crate::error::LabError;
use crate::scenario::{mib_pages, Event, Scenario, Workload};
use crate::sim::backend::{BackendConfig, ENGINE_PAGE};
use dd_engine::StoreKind;
use std::path::{Path, PathBuf};

/// Part of the total memory a run leaves available: it never plans below it.
pub const MARGIN_FRACTION: f64 = 0.2;
/// Engine bytes per page it indexes, besides the page's frame: slab entry, object maps and order-queue
/// records with their lazy-deletion slack and growth reserve, at one page per object (the worst case).
/// Measured 337 B (`tests/memory_estimate.rs`), plus headroom.
pub const ENGINE_INDEX_BYTES_PER_PAGE: u64 = 448;
/// Guest-model bytes per page of VM memory: page descriptor, key map and growth reserve. Measured 79 B.
pub const GUEST_BYTES_PER_PAGE: u64 = 112;
/// Bytes per anonymous page of a dataset (version and swap state) and per file (size, generation,
/// cursor).
const ANON_BYTES_PER_PAGE: u64 = 8;
const FILE_BYTES: u64 = 16;
/// Fixed cost of one variant (buffers of the SSD writer, the sampler, the event queue, thread stack).
const VARIANT_BASE_BYTES: u64 = 16 << 20;
/// Fixed cost of the process (binary, allocator, plots and report at the end).
pub const PROCESS_BASE_BYTES: u64 = 64 << 20;

/// One variant's estimated peak memory, by part.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VariantEstimate {
    pub variant: String,
    /// Memory store frames and the engine's index (0 against a daemon).
    pub engine_bytes: u64,
    /// The SSD store's scratch file, when it is on a memory-backed file system.
    pub scratch_bytes: u64,
    /// The emulated guests and workloads.
    pub guest_bytes: u64,
}

impl VariantEstimate {
    pub fn total(&self) -> u64 {
        self.engine_bytes + self.scratch_bytes + self.guest_bytes + VARIANT_BASE_BYTES
    }
}

/// Estimates a variant's peak memory. `s` is the scaled scenario with the variant applied, `cfg` its
/// backend configuration; `in_process`: the engine runs in this process; `scratch_in_memory`: the SSD
/// store's file would be on a memory-backed file system.
pub fn estimate_variant(
    variant: &str,
    s: &Scenario,
    cfg: &BackendConfig,
    in_process: bool,
    scratch_in_memory: bool,
) -> VariantEstimate {
    let ep = ENGINE_PAGE as u64;
    let (engine_bytes, scratch_bytes) = if in_process {
        let mem = cfg.mem_max_pages.max(cfg.mem_pages);
        // A store no spec of the run ever uses holds no page (e.g. the SSD store of a memory-only
        // variant): neither its index nor its file grows.
        let ssd = if s.uses_store(StoreKind::Ssd) { cfg.ssd_pages } else { 0 };
        let frames = mem * ep + 2 * ep * 4096; // + the SSD writer's queue of page buffers
        let index = (mem + ssd) * ENGINE_INDEX_BYTES_PER_PAGE;
        (frames + index, if scratch_in_memory { ssd * ep } else { 0 })
    } else {
        (0, 0)
    };
    VariantEstimate { variant: variant.to_string(), engine_bytes, scratch_bytes, guest_bytes: guest_bytes(s) }
}

fn guest_bytes(s: &Scenario) -> u64 {
    let mut bytes = 0;
    for vm in &s.vms {
        // The guest's page slab and map grow to the VM's largest memory (balloons included).
        let mut mib = vm.memory_mib;
        for e in &s.timeline {
            if let Event::Balloon { vm: name, memory_mib, .. } = e {
                if *name == vm.name {
                    mib = mib.max(*memory_mib);
                }
            }
        }
        bytes += mib_pages(mib) * GUEST_BYTES_PER_PAGE;
        for c in &vm.containers {
            bytes += workload_bytes(&c.workload);
        }
    }
    bytes
}

fn workload_bytes(w: &Workload) -> u64 {
    match w {
        Workload::Webserver { nfiles, .. }
        | Workload::Webproxy { nfiles, .. }
        | Workload::Varmail { nfiles, .. } => nfiles * FILE_BYTES,
        Workload::Videoserver { numactivevids, numpassivevids, .. } => {
            (numactivevids + numpassivevids) * FILE_BYTES
        }
        Workload::Kv { dataset_mib, .. } => mib_pages(*dataset_mib) * ANON_BYTES_PER_PAGE,
        Workload::Ycsb { store, .. } => {
            let st = crate::model::kvstore::Store::of_workload(w).expect("a ycsb workload runs a store");
            // The records' pages (Redis's heap, the data file's objects) and MySQL's buffer pool.
            let pool =
                if *store == crate::model::kvstore::StoreKind::Mysql { st.heap_pages() as u64 } else { 0 };
            (st.capacity_pages() as u64 + pool) * ANON_BYTES_PER_PAGE
        }
        // At most `max_requests` rows (the load refuses more) of 16 bytes, and while loading the map
        // that numbers the objects (at most one per request, under 32 bytes each).
        Workload::Trace { max_requests, .. } => max_requests.saturating_mul(16 + 32),
    }
}

/// Memory the run may use, as `/proc/meminfo` and the lab's memory cgroup (v1 or v2) say.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HostMemory {
    /// Total memory (the cgroup's limit when lower).
    pub total_bytes: u64,
    /// Memory available without swapping (the cgroup's room when lower: limit - usage + its
    /// reclaimable file pages).
    pub available_bytes: u64,
}

impl HostMemory {
    /// Reads the host's memory and the calling process's memory cgroup limits.
    pub fn read() -> Result<HostMemory, LabError> {
        let meminfo =
            std::fs::read_to_string("/proc/meminfo").map_err(|e| LabError::io("/proc/meminfo", e))?;
        let field = |name: &str| -> Option<u64> {
            meminfo.lines().find_map(|l| {
                let rest = l.strip_prefix(name)?.strip_prefix(':')?;
                rest.split_whitespace().next()?.parse::<u64>().ok().map(|kib| kib * 1024)
            })
        };
        let (Some(total), Some(avail)) = (field("MemTotal"), field("MemAvailable")) else {
            return Err(LabError::io("/proc/meminfo", std::io::Error::other("no MemTotal / MemAvailable")));
        };
        let mut hm = HostMemory { total_bytes: total, available_bytes: avail };
        if let Some((limit, room)) = cgroup_room() {
            hm.total_bytes = hm.total_bytes.min(limit);
            hm.available_bytes = hm.available_bytes.min(room);
        }
        Ok(hm)
    }

    /// What a plan may use: available memory above the margin.
    pub fn budget_bytes(&self) -> u64 {
        let margin = (self.total_bytes as f64 * MARGIN_FRACTION) as u64;
        self.available_bytes.saturating_sub(margin)
    }
}

/// The tightest `(limit, room)` of the process's memory cgroup and its ancestors, if any is limited.
fn cgroup_room() -> Option<(u64, u64)> {
    let own = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    let read_u64 = |p: &Path| std::fs::read_to_string(p).ok()?.trim().parse::<u64>().ok();
    let inactive_file = |p: &Path, key: &str| -> u64 {
        let stat = std::fs::read_to_string(p.join("memory.stat")).unwrap_or_default();
        stat.lines()
            .find_map(|l| l.strip_prefix(key)?.strip_prefix(' ')?.trim().parse::<u64>().ok())
            .unwrap_or(0)
    };
    let mut best: Option<(u64, u64)> = None;
    let mut consider = |limit: u64, usage: u64, reclaimable: u64| {
        let room = limit.saturating_sub(usage.saturating_sub(reclaimable));
        best = Some(best.map_or((limit, room), |(l, r)| (l.min(limit), r.min(room))));
    };
    for line in own.lines() {
        let mut parts = line.splitn(3, ':');
        let (_, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
        // v1: the memory controller's hierarchy. v2: the unified hierarchy, when mounted at the root.
        let (root, v1) = if controllers.split(',').any(|c| c == "memory") {
            (PathBuf::from("/sys/fs/cgroup/memory"), true)
        } else if controllers.is_empty() && Path::new("/sys/fs/cgroup/cgroup.controllers").exists() {
            (PathBuf::from("/sys/fs/cgroup"), false)
        } else {
            continue;
        };
        let mut dir = root.join(path.trim_start_matches('/'));
        loop {
            if v1 {
                if let (Some(l), Some(u)) = (
                    read_u64(&dir.join("memory.limit_in_bytes")),
                    read_u64(&dir.join("memory.usage_in_bytes")),
                ) {
                    // The unlimited value is a huge page-aligned number; anything above 2^60 means none.
                    if l < 1 << 60 {
                        consider(l, u, inactive_file(&dir, "total_inactive_file"));
                    }
                }
            } else if let (Some(l), Some(u)) =
                (read_u64(&dir.join("memory.max")), read_u64(&dir.join("memory.current")))
            {
                consider(l, u, inactive_file(&dir, "inactive_file"));
            }
            if dir == root || !dir.pop() {
                break;
            }
        }
    }
    best
}

/// What a run will do about memory.
#[derive(Debug, Clone)]
pub struct Plan {
    /// Variants side by side.
    pub jobs: usize,
    /// Where the SSD stores' scratch files go.
    pub scratch_dir: PathBuf,
    /// Whether that directory is memory-backed (its files count as memory).
    pub scratch_in_memory: bool,
    /// Estimated peak of the whole run: the process's base and the `jobs` largest variants.
    pub peak_bytes: u64,
    pub host: HostMemory,
    /// Per variant, in variant order.
    pub estimates: Vec<VariantEstimate>,
}

/// Peak of running the `jobs` largest variants at once.
fn peak_of(estimates: &[VariantEstimate], jobs: usize) -> u64 {
    let mut totals: Vec<u64> = estimates.iter().map(VariantEstimate::total).collect();
    totals.sort_unstable_by(|a, b| b.cmp(a));
    PROCESS_BASE_BYTES + totals.iter().take(jobs).sum::<u64>()
}

/// The most variants (at most `want`) that fit the budget side by side; 0 when not even one does.
fn fitting_jobs(estimates: &[VariantEstimate], want: usize, budget: u64) -> usize {
    (1..=want.min(estimates.len()).max(1)).rev().find(|&j| peak_of(estimates, j) <= budget).unwrap_or(0)
}

/// A scratch-directory candidate: where, and whether it is memory-backed.
#[derive(Debug, Clone)]
pub struct ScratchChoice {
    pub dir: PathBuf,
    pub in_memory: bool,
}

impl ScratchChoice {
    pub fn at(dir: PathBuf) -> ScratchChoice {
        // A directory we cannot inspect is treated as memory (the cautious reading).
        let in_memory = dd_engine::store::ssd::file::is_memory_backed(&dir).unwrap_or(true);
        ScratchChoice { dir, in_memory }
    }
}

/// Plans a run: for each scratch candidate (the user's one, or the defaults in order of preference)
/// the most variants that fit; the candidate that runs the most wins, the first on a tie. Refuses with
/// [`LabError::NotEnoughMemory`] when no candidate fits even one variant.
///
/// `estimate(scratch_in_memory)` gives every variant's estimate for a scratch placement.
pub fn plan(
    candidates: &[ScratchChoice],
    want_jobs: usize,
    host: HostMemory,
    user_scratch: bool,
    estimate: &dyn Fn(bool) -> Vec<VariantEstimate>,
) -> Result<Plan, LabError> {
    let budget = host.budget_bytes();
    let mut best: Option<Plan> = None;
    let mut smallest_refused: Option<(u64, Vec<VariantEstimate>, &ScratchChoice)> = None;
    for c in candidates {
        let estimates = estimate(c.in_memory);
        let jobs = fitting_jobs(&estimates, want_jobs, budget);
        if jobs == 0 {
            let need = peak_of(&estimates, 1);
            if smallest_refused.as_ref().is_none_or(|(n, _, _)| need < *n) {
                smallest_refused = Some((need, estimates, c));
            }
            continue;
        }
        if best.as_ref().is_none_or(|b| jobs > b.jobs) {
            let peak_bytes = peak_of(&estimates, jobs);
            best = Some(Plan {
                jobs,
                scratch_dir: c.dir.clone(),
                scratch_in_memory: c.in_memory,
                peak_bytes,
                host,
                estimates,
            });
        }
    }
    if let Some(p) = best {
        return Ok(p);
    }
    let (needed, estimates, c) = smallest_refused.expect("at least one scratch candidate");
    let largest = estimates.iter().max_by_key(|e| e.total()).expect("a scenario has a variant");
    let scratch = (largest.scratch_bytes > 0).then_some((c.dir.as_path(), largest.scratch_bytes));
    Err(LabError::NotEnoughMemory {
        needed_bytes: needed,
        available_bytes: host.available_bytes,
        message: refusal(needed, host, &largest.variant, scratch, user_scratch),
    })
}

/// The one message of a refused run: the memory needed and available, and the options.
fn refusal(
    needed: u64,
    host: HostMemory,
    variant: &str,
    scratch: Option<(&Path, u64)>,
    user: bool,
) -> String {
    let mut m = format!(
        "not enough memory for this run: it needs about {} (the variant `{variant}` alone",
        gib(needed)
    );
    if let Some((dir, bytes)) = scratch {
        m += &format!(
            ", {} of it the SSD store's scratch file in memory-backed {}",
            gib(bytes),
            dir.display()
        );
    }
    m += &format!(
        "), but {} are available of {} and the lab keeps {:.0}% of the total free ({} usable). Options: a \
         smaller --scale (memory grows with it); --jobs 1 runs one variant at a time (already too much \
         here)",
        gib(host.available_bytes),
        gib(host.total_bytes),
        MARGIN_FRACTION * 100.0,
        gib(host.budget_bytes())
    );
    match (scratch, user) {
        (Some(_), _) => {
            m += "; --scratch-dir DIR on a disk file system puts the SSD store's file out of memory"
        }
        (None, true) => {
            m += "; --scratch-dir is already on a disk file system (the scratch file takes no memory)"
        }
        (None, false) => m += "; --scratch-dir would not help (the scratch file already takes no memory)",
    }
    m.push('.');
    m
}

/// The default scratch candidates, best first: `/dev/shm` (no disk I/O in wall time), then a disk
/// directory (`/var/tmp`, else the system temporary directory). Only writable directories.
pub fn default_scratch_candidates() -> Vec<ScratchChoice> {
    let writable = |p: &Path| std::fs::metadata(p).is_ok_and(|m| m.is_dir() && !m.permissions().readonly());
    let mut out = Vec::new();
    for dir in [PathBuf::from("/dev/shm"), PathBuf::from("/var/tmp"), std::env::temp_dir()] {
        if writable(&dir) && !out.iter().any(|c: &ScratchChoice| c.dir == dir) {
            out.push(ScratchChoice::at(dir));
        }
    }
    if out.is_empty() {
        out.push(ScratchChoice::at(std::env::temp_dir()));
    }
    out
}

/// `bytes` in GiB with two decimals (for messages).
pub fn gib(bytes: u64) -> String {
    format!("{:.2} GiB", bytes as f64 / (1u64 << 30) as f64)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn est(name: &str, engine: u64, scratch: u64) -> VariantEstimate {
        VariantEstimate { variant: name.into(), engine_bytes: engine, scratch_bytes: scratch, guest_bytes: 0 }
    }
    const G: u64 = 1 << 30;

    fn host(total: u64, avail: u64) -> HostMemory {
        HostMemory { total_bytes: total, available_bytes: avail }
    }

    fn candidates() -> Vec<ScratchChoice> {
        vec![
            ScratchChoice { dir: "/shm".into(), in_memory: true },
            ScratchChoice { dir: "/disk".into(), in_memory: false },
        ]
    }

    /// The case: three variants, one with a 16 GiB SSD store, on a 24 GiB machine.
    fn fig9(in_memory: bool) -> Vec<VariantEstimate> {
        vec![est("global", G, 0), est("ddmem", G, 0), est("ddssd", 3 * G, if in_memory { 16 * G } else { 0 })]
    }

    #[test]
    fn a_large_memory_backed_store_moves_the_scratch_file_to_disk() {
        let p = plan(&candidates(), 2, host(24 * G, 22 * G), false, &fig9).unwrap();
        assert_eq!(p.scratch_dir, PathBuf::from("/disk"));
        assert_eq!(p.jobs, 2);
        assert!(p.peak_bytes <= host(24 * G, 22 * G).budget_bytes());
    }

    #[test]
    fn small_runs_keep_the_memory_backed_scratch_dir() {
        let small = |m: bool| vec![est("a", G / 8, 0), est("b", G / 8, if m { G / 8 } else { 0 })];
        let p = plan(&candidates(), 2, host(24 * G, 20 * G), false, &small).unwrap();
        assert_eq!((p.scratch_dir, p.jobs), (PathBuf::from("/shm"), 2));
    }

    #[test]
    fn jobs_shrink_to_what_fits() {
        // Budget 9 - 4.8 = 4.2 GiB: the two largest (3 + 1 GiB + bases) fit, all three (5.1) do not.
        let p = plan(&candidates(), 3, host(24 * G, 9 * G), false, &fig9).unwrap();
        assert_eq!(p.jobs, 2);
        let p = plan(&candidates(), 3, host(24 * G, 8 * G), false, &fig9).unwrap();
        assert_eq!(p.jobs, 1);
    }

    #[test]
    fn refuses_when_nothing_fits_and_names_the_numbers_and_options() {
        let user = [ScratchChoice { dir: "/shm".into(), in_memory: true }];
        let e = plan(&user, 2, host(24 * G, 15 * G), true, &fig9).unwrap_err();
        let msg = e.to_string();
        let needed = gib(PROCESS_BASE_BYTES + VARIANT_BASE_BYTES + 19 * G);
        for want in ["--scale", "--jobs", "--scratch-dir", "ddssd", &needed, "15.00 GiB", "24.00 GiB", "/shm"]
        {
            assert!(msg.contains(want), "`{want}` missing from: {msg}");
        }
    }

    #[test]
    fn the_margin_is_a_fifth_of_the_total() {
        assert_eq!(host(10 * G, 5 * G).budget_bytes(), 3 * G);
        assert_eq!(host(10 * G, G).budget_bytes(), 0);
    }

    #[test]
    fn host_memory_reads_this_machine() {
        let h = HostMemory::read().unwrap();
        assert!(h.total_bytes > 0 && h.available_bytes <= h.total_bytes.max(h.available_bytes));
    }
}
