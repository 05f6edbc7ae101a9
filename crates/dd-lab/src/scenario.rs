//! Scenario files: plain serde data read from TOML (`docs/scenario-format.md` is the user's reference).
//!
//! Owns the format, its documented defaults, `validate()` (the error names the bad field with its
//! path, e.g. `vms[0].containers[1].memory_limit_mib`) and the `scale` factor. Invariants after
//! `validate()`: names are unique (containers across the whole scenario), every name referenced by a
//! variant, a timeline event or a check exists, sizes and times are finite and non-negative.
//!
//! `scale` multiplies every size (memory, capacities, file sets, eviction batch) and every time
//! (duration, start/stop times, timeline, sampling interval, check windows) but no latency: the run is
//! the same experiment in miniature, with the same shapes at proportionally earlier times.

use crate::error::LabError;
use dd_engine::{Mode, Spec};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashSet};

/// Bytes per guest page. The lab always models 4 KiB pages.
pub const PAGE: u64 = 4096;

fn d_seed() -> u64 {
    1
}
fn d_one() -> f64 {
    1.0
}
fn d_sample() -> f64 {
    10.0
}
fn d_batch() -> f64 {
    2.0
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Scenario {
    pub name: String,
    /// What the scenario reproduces and what it must show. Default empty.
    #[serde(default)]
    pub description: String,
    /// Emulated seconds.
    pub duration_s: f64,
    /// Seed of every random choice. Default 1.
    #[serde(default = "d_seed")]
    pub seed: u64,
    /// Size and time factor (see the module doc). Default 1.0.
    #[serde(default = "d_one")]
    pub scale: f64,
    /// Sampling period of `timeseries.csv`, emulated seconds. Default 10.
    #[serde(default = "d_sample")]
    pub sample_interval_s: f64,
    pub host: Host,
    #[serde(default)]
    pub timing: Timing,
    #[serde(default)]
    pub guest: GuestOptions,
    pub vms: Vec<Vm>,
    #[serde(default)]
    pub timeline: Vec<Event>,
    /// Runs of the same scenario with some settings overridden (e.g. Global, DDMem, DDSSD). None means
    /// one run called `default`.
    #[serde(default)]
    pub variants: Vec<Variant>,
    #[serde(default)]
    pub checks: Vec<Check>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Host {
    /// Memory store capacity, MiB.
    pub mem_capacity_mib: f64,
    /// SSD store capacity, MiB; 0 (default) means no SSD store.
    #[serde(default)]
    pub ssd_capacity_mib: f64,
    /// `partitioned` (DoubleDecker, default) or `global` (one FIFO, the papers' baseline).
    #[serde(default)]
    pub mode: Mode,
    /// Eviction batch, MiB. Default 2.
    #[serde(default = "d_batch")]
    pub eviction_batch_mib: f64,
    #[serde(default)]
    pub disk: DiskModel,
}

/// The VMs' virtual disks (one host disk, shared, first come first served).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DiskModel {
    /// `hdd` (default), `ssd` or `network`: sets the defaults of the two fields below.
    #[serde(default)]
    pub kind: DiskKind,
    /// Positioning time of a non-sequential request, microseconds. Defaults: hdd 4000, ssd 80,
    /// network 500.
    #[serde(default)]
    pub access_us: Option<f64>,
    /// Transfer rate, MiB/s. Defaults: hdd 150, ssd 500, network 110.
    #[serde(default)]
    pub bandwidth_mib_s: Option<f64>,
}

impl Default for DiskModel {
    fn default() -> Self {
        DiskModel { kind: DiskKind::Hdd, access_us: None, bandwidth_mib_s: None }
    }
}

impl DiskModel {
    pub fn access_ns(&self) -> u64 {
        let d = match self.kind {
            DiskKind::Hdd => 4000.0,
            DiskKind::Ssd => 80.0,
            DiskKind::Network => 500.0,
        };
        (self.access_us.unwrap_or(d) * 1000.0) as u64
    }
    /// Transfer time of one 4 KiB page.
    pub fn page_transfer_ns(&self) -> u64 {
        let d = match self.kind {
            DiskKind::Hdd => 150.0,
            DiskKind::Ssd => 500.0,
            DiskKind::Network => 110.0,
        };
        let bw = self.bandwidth_mib_s.unwrap_or(d) * 1024.0 * 1024.0;
        (PAGE as f64 / bw * 1e9) as u64
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DiskKind {
    #[default]
    Hdd,
    Ssd,
    Network,
}

/// Latencies of the operations the emulated clock charges (SPEC section 10, "Time").
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Timing {
    /// A 4 KiB page found in the guest page cache (copy to the application). Default 1000 ns.
    pub page_cache_hit_ns: u64,
    /// A page found in the memory store of the second-chance cache (hypercall + copy). Default 4000 ns.
    pub mem_store_hit_ns: u64,
    /// A page found in the SSD store. Default 90 us.
    pub ssd_store_hit_ns: u64,
    /// A put or a missed get (hypercall). Default 500 ns.
    pub cache_op_ns: u64,
    /// CPU time of one file-level operation (system call, application work). Default 50 us.
    pub op_cpu_ns: u64,
}

impl Default for Timing {
    fn default() -> Self {
        Timing {
            page_cache_hit_ns: 1_000,
            mem_store_hit_ns: 4_000,
            ssd_store_hit_ns: 90_000,
            cache_op_ns: 500,
            op_cpu_ns: 50_000,
        }
    }
}

/// How the guest's page cache orders pages.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum LruMode {
    /// Linux's active/inactive lists with promotion on the second access (default).
    #[default]
    TwoList,
    /// One exact LRU list per memcg (for validating against a reference LRU).
    Plain,
}

#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct GuestOptions {
    pub lru: LruMode,
    /// Pages reclaimed per reclaim pass (Linux's SWAP_CLUSTER_MAX). Default 32.
    pub reclaim_batch_pages: u32,
    /// Not part of the file: the scale [`Scenario::scaled`] applied. Linux sizes the inactive list by
    /// the lists' size in GiB; the guest divides by this factor so a run at scale 0.05 keeps the
    /// active/inactive balance of the full-scale experiment (else every scaled memcg is "under 1 GiB"
    /// and may keep only half its pages active).
    #[serde(skip, default = "one")]
    pub size_scale: f64,
}

fn one() -> f64 {
    1.0
}

impl Default for GuestOptions {
    fn default() -> Self {
        GuestOptions { lru: LruMode::TwoList, reclaim_batch_pages: 32, size_scale: 1.0 }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Vm {
    pub name: String,
    /// Guest memory available to containers, MiB.
    pub memory_mib: f64,
    /// Virtual CPUs: the VM's operations share them (each operation's CPU time runs on the earliest
    /// free one). Default 8.
    #[serde(default = "d_vcpus")]
    pub vcpus: u32,
    /// Weight in the memory store. Default 100.
    #[serde(default = "d_w")]
    pub mem_weight: u32,
    /// Weight in the SSD store. Default 100.
    #[serde(default = "d_w")]
    pub ssd_weight: u32,
    /// The VM's memory controller (thesis 000 chapter 4). Default none: Linux's own reclaim.
    #[serde(default)]
    pub memctl: Option<crate::memctl::VmMemctl>,
    pub containers: Vec<Container>,
}

fn d_w() -> u32 {
    100
}
fn d_vcpus() -> u32 {
    8
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Container {
    pub name: String,
    /// memcg hard limit, MiB. Default: the VM's memory.
    #[serde(default)]
    pub memory_limit_mib: Option<f64>,
    /// memcg soft limit, MiB. Default: none (unlimited, as Linux).
    #[serde(default)]
    pub soft_limit_mib: Option<f64>,
    /// The container's spec `<T, W>` in the second-chance cache, e.g. `{ type = "mem", weight = 100 }`.
    /// Default `{ type = "mem", weight = 100 }`.
    #[serde(default = "d_spec")]
    pub cache: Spec,
    /// Swapped-out anonymous pages go to a persistent pool of this spec instead of the swap disk.
    /// Default none (swap disk).
    #[serde(default)]
    pub swap_cache: Option<Spec>,
    /// Emulated second at which the container starts (its pool is created). Default 0.
    #[serde(default)]
    pub start_s: f64,
    /// Emulated second at which it stops (its pool is destroyed). Default: never.
    #[serde(default)]
    pub stop_s: Option<f64>,
    pub workload: Workload,
}

fn d_spec() -> Spec {
    Spec::Mem { weight: 100 }
}

/// File selection of a Filebench fileset.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Selection {
    /// Uniformly random file (Filebench's default pick).
    #[default]
    Random,
    /// A cursor walks the fileset in order and wraps (Filebench's in-order selection).
    InOrder,
}

/// A workload with its published defaults; every size field is scaled by `scale`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "lowercase", deny_unknown_fields)]
pub enum Workload {
    /// Filebench webserver: 10 x (open, read whole file, close), then append to a shared log.
    Webserver {
        #[serde(default = "d_1000")]
        nfiles: u64,
        #[serde(default = "d_16k")]
        filesize_kib: f64,
        #[serde(default = "d_100")]
        nthreads: u32,
        #[serde(default = "d_16k")]
        appendsize_kib: f64,
        #[serde(default)]
        selection: Selection,
    },
    /// Filebench webproxy: delete, create, append, close, then 5 x (open, read whole file, close).
    Webproxy {
        #[serde(default = "d_10000")]
        nfiles: u64,
        #[serde(default = "d_16k")]
        filesize_kib: f64,
        #[serde(default = "d_100")]
        nthreads: u32,
        #[serde(default = "d_16k")]
        appendsize_kib: f64,
        #[serde(default)]
        selection: Selection,
    },
    /// Filebench varmail: delete, create, append, fsync, close, open, read, append, fsync, close, open,
    /// read, close.
    Varmail {
        #[serde(default = "d_1000")]
        nfiles: u64,
        #[serde(default = "d_16k")]
        filesize_kib: f64,
        #[serde(default = "d_16")]
        nthreads: u32,
        #[serde(default = "d_16k")]
        appendsize_kib: f64,
        #[serde(default)]
        selection: Selection,
    },
    /// Filebench videoserver: readers stream active videos in `readiosize` chunks; one writer rewrites
    /// a passive video whole, then waits `repint_s`.
    Videoserver {
        #[serde(default = "d_32")]
        numactivevids: u64,
        #[serde(default = "d_194")]
        numpassivevids: u64,
        /// Default 10 GiB (Filebench's 10g).
        #[serde(default = "d_10g")]
        filesize_mib: f64,
        #[serde(default = "d_48")]
        nthreads: u32,
        #[serde(default = "d_256")]
        readiosize_kib: f64,
        #[serde(default = "d_1024")]
        writeiosize_kib: f64,
        #[serde(default = "d_10")]
        repint_s: f64,
        /// The readers' `bwlimit`, MiB/s (0: unlimited). Default 0.
        #[serde(default)]
        read_limit_mib_s: f64,
        #[serde(default)]
        selection: Selection,
    },
    /// An in-memory key-value store (Redis-like): random 4 KiB accesses to anonymous memory.
    Kv {
        /// Resident data, MiB.
        dataset_mib: f64,
        #[serde(default = "d_1")]
        nthreads: u32,
        /// Fraction of accesses that write. Default 0.5 (YCSB A).
        #[serde(default = "d_half")]
        write_fraction: f64,
    },
    /// A YCSB client (`workload`: a..f) against an emulated store: `redis` keeps the records in
    /// anonymous memory (swapped out on reclaim, faulted back on access), `mongo` in an mmap'd file
    /// (file pages through the page cache and the container's cleancache pool).
    Ycsb {
        store: crate::kvstore::StoreKind,
        workload: crate::ycsb::YcsbWorkload,
        /// Records loaded before the run (YCSB `recordcount`); scaled. Default 1000.
        #[serde(default = "d_1000")]
        record_count: u64,
        /// Bytes of one record in memory, KiB. Default 1 (YCSB's 10 fields of 100 bytes).
        #[serde(default = "d_one")]
        record_kib: f64,
        #[serde(default = "d_1")]
        nthreads: u32,
        /// Request rate of the client (YCSB `-target`), operations/s; 0 (default) runs closed-loop.
        #[serde(default)]
        target_ops_s: f64,
    },
    /// Replay of a block trace (CSV: `object,index,pages,op` with op `R` or `W`), as fast as the
    /// modelled latencies allow, looping at the end. The path is relative to the scenario file.
    Trace {
        path: String,
        #[serde(default)]
        repeat: bool,
    },
}

fn d_1() -> u32 {
    1
}
fn d_16() -> u32 {
    16
}
fn d_32() -> u64 {
    32
}
fn d_48() -> u32 {
    48
}
fn d_100() -> u32 {
    100
}
fn d_194() -> u64 {
    194
}
fn d_1000() -> u64 {
    1000
}
fn d_10000() -> u64 {
    10_000
}
fn d_16k() -> f64 {
    16.0
}
fn d_256() -> f64 {
    256.0
}
fn d_1024() -> f64 {
    1024.0
}
fn d_10g() -> f64 {
    10240.0
}
fn d_10() -> f64 {
    10.0
}
fn d_half() -> f64 {
    0.5
}

/// A change at an emulated time.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "action", rename_all = "snake_case", deny_unknown_fields)]
pub enum Event {
    Start {
        at_s: f64,
        container: String,
    },
    Stop {
        at_s: f64,
        container: String,
    },
    SetCache {
        at_s: f64,
        container: String,
        cache: Spec,
    },
    /// New store weights of a VM; a weight left out keeps its current value.
    SetVmWeights {
        at_s: f64,
        vm: String,
        #[serde(default)]
        mem: Option<u32>,
        #[serde(default)]
        ssd: Option<u32>,
    },
    SetCapacity {
        at_s: f64,
        store: dd_engine::StoreKind,
        mib: f64,
    },
    SetMode {
        at_s: f64,
        mode: Mode,
    },
    /// Balloon the VM to `memory_mib` (down: VM-wide reclaim to fit), at once or, with `over_s > 0`,
    /// in twenty even steps over `over_s` seconds (scaled).
    Balloon {
        at_s: f64,
        vm: String,
        memory_mib: f64,
        #[serde(default)]
        over_s: f64,
    },
}

impl Event {
    pub fn at_s(&self) -> f64 {
        match self {
            Event::Start { at_s, .. }
            | Event::Stop { at_s, .. }
            | Event::SetCache { at_s, .. }
            | Event::SetVmWeights { at_s, .. }
            | Event::SetCapacity { at_s, .. }
            | Event::SetMode { at_s, .. }
            | Event::Balloon { at_s, .. } => *at_s,
        }
    }
    fn at_mut(&mut self) -> &mut f64 {
        match self {
            Event::Start { at_s, .. }
            | Event::Stop { at_s, .. }
            | Event::SetCache { at_s, .. }
            | Event::SetVmWeights { at_s, .. }
            | Event::SetCapacity { at_s, .. }
            | Event::SetMode { at_s, .. }
            | Event::Balloon { at_s, .. } => at_s,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ContainerOverride {
    #[serde(default)]
    pub cache: Option<Spec>,
    #[serde(default)]
    pub memory_limit_mib: Option<f64>,
    #[serde(default)]
    pub start_s: Option<f64>,
    /// Leave the container out of this variant entirely.
    #[serde(default)]
    pub disabled: bool,
}

#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Variant {
    pub name: String,
    #[serde(default)]
    pub mode: Option<Mode>,
    #[serde(default)]
    pub mem_capacity_mib: Option<f64>,
    #[serde(default)]
    pub ssd_capacity_mib: Option<f64>,
    /// Per-VM memory overrides, MiB.
    #[serde(default)]
    pub vm_memory_mib: BTreeMap<String, f64>,
    #[serde(default)]
    pub containers: BTreeMap<String, ContainerOverride>,
    /// Per-VM memory-controller overrides (policy, chunk cap).
    #[serde(default)]
    pub memctl: BTreeMap<String, crate::memctl::MemctlOverride>,
}

/// What a check measures for one container or VM of one variant.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Measure {
    /// Variant name; default: the first (or only) variant.
    #[serde(default)]
    pub variant: Option<String>,
    /// A container name, or a VM name for cache-use metrics.
    pub entity: String,
    pub metric: Metric,
    /// Window start (emulated s, scaled); default 0.
    #[serde(default)]
    pub from_s: Option<f64>,
    /// Window end; default the end of the run.
    #[serde(default)]
    pub to_s: Option<f64>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Metric {
    /// Application operations per second over the window.
    Throughput,
    /// MiB/s read and written by the application over the window.
    ThroughputMib,
    /// Mean operation latency, ms.
    LatencyMs,
    /// Mean pages held in the second-chance cache (both stores), over the window's samples.
    CacheUsed,
    /// Mean pages in the memory store.
    MemUsed,
    /// Mean pages in the SSD store.
    SsdUsed,
    /// Mean static entitlement in the memory store (the weight share, as the engine reports it).
    MemEntitlement,
    /// Mean effective entitlement in the memory store (`crate::effective`: under-used shares
    /// redistributed by weight).
    MemEffectiveEntitlement,
    SsdEntitlement,
    SsdEffectiveEntitlement,
    /// Pages evicted from the pool(s) in the window.
    Evictions,
    /// Gets that hit, per 100 puts (Table 2's lookup-to-store ratio), in the window.
    LookupToStorePct,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum CheckKind {
    /// `lhs / rhs` is at least `min` (and at most `max` if given).
    Ratio {
        lhs: Measure,
        rhs: Measure,
        min: f64,
        #[serde(default)]
        max: Option<f64>,
    },
    /// `lhs` is at least `min` (and at most `max`).
    Value {
        lhs: Measure,
        min: f64,
        #[serde(default)]
        max: Option<f64>,
    },
    /// The largest over the smallest of one measure across variants is at most `max_ratio`.
    Spread {
        entity: String,
        metric: Metric,
        variants: Vec<String>,
        max_ratio: f64,
        #[serde(default)]
        from_s: Option<f64>,
        #[serde(default)]
        to_s: Option<f64>,
    },
    /// Each entity's mean memory-store use over the window is within `tolerance` (fraction) of its
    /// mean entitlement, or below it without evictions in the window (it does not demand more). With
    /// `exact = false` (default) using more than the entitlement passes too (resource conservation lets a
    /// demanding entity take what others leave unused); `exact = true` also bounds it from above.
    /// `effective = true` compares with the effective entitlement (`crate::effective`) instead of the
    /// static weight share, so `exact` holds a resource-conserving result to what it may really use.
    Entitlement {
        #[serde(default)]
        exact: bool,
        #[serde(default)]
        effective: bool,
        #[serde(default)]
        variant: Option<String>,
        entities: Vec<String>,
        from_s: f64,
        to_s: f64,
        #[serde(default = "d_tol")]
        tolerance: f64,
        #[serde(default)]
        store: Option<dd_engine::StoreKind>,
    },
    /// The run verified every second-chance hit's content and never saw stale data (always checked).
    Coherent,
    /// Memory usage ratio of two containers against a target, per sample (`memctl`).
    MemRatio(crate::memctl::MemRatioCheck),
    /// Gap between two containers' exceeds over their soft limits, per sample (`memctl`).
    ExceedGap(crate::memctl::ExceedGapCheck),
    /// Share of VM-wide reclaim that was directed rather than LRU (`memctl`).
    ReclaimMode(crate::memctl::ReclaimModeCheck),
    /// A container keeps its memory while others can still give (`memctl`).
    Protected(crate::memctl::ProtectedCheck),
}

fn d_tol() -> f64 {
    0.05
}

/// A named check. (Unknown fields are rejected by the flattened [`CheckKind`]; serde cannot combine
/// `deny_unknown_fields` with `flatten` on this struct itself.)
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Check {
    pub name: String,
    #[serde(flatten)]
    pub kind: CheckKind,
}

impl Scenario {
    pub fn from_toml(text: &str) -> Result<Scenario, LabError> {
        let s: Scenario = toml::from_str(text).map_err(|e| LabError::Parse(e.to_string()))?;
        s.validate()?;
        Ok(s)
    }

    /// The smallest scenario: one 64 MiB VM with one container `c` replaying the block trace at
    /// `trace_path` through a plain-LRU page cache of `memory_limit_pages` pages, reclaimed one page at a
    /// time, over an SSD-modelled disk, for `duration_s`; with `cache_mib` MiB of memory store behind it
    /// (0: no second-chance cache). Trace studies start from it; the exact-LRU tests use it.
    pub fn trace_replay(
        trace_path: &str,
        memory_limit_pages: u64,
        cache_mib: f64,
        duration_s: f64,
    ) -> Scenario {
        let cache = if cache_mib > 0.0 { "" } else { "cache = { type = \"none\" }" };
        Scenario::from_toml(&format!(
            "name = \"trace-replay\"\nduration_s = {duration_s:?}\n\
             [host]\nmem_capacity_mib = {cache_mib:?}\ndisk = {{ kind = \"ssd\" }}\n\
             [guest]\nlru = \"plain\"\nreclaim_batch_pages = 1\n\
             [[vms]]\nname = \"vm\"\nmemory_mib = 64\n\
             [[vms.containers]]\nname = \"c\"\nmemory_limit_mib = {:?}\n{cache}\n\
             workload = {{ kind = \"trace\", path = {trace_path:?} }}\n",
            memory_limit_pages as f64 / 256.0
        ))
        .expect("a valid scenario for any trace path, limit and positive duration")
    }

    /// The variants to run (one implicit `default` when none is declared).
    pub fn variant_list(&self) -> Vec<Variant> {
        if self.variants.is_empty() {
            vec![Variant { name: "default".into(), ..Default::default() }]
        } else {
            self.variants.clone()
        }
    }

    pub fn containers(&self) -> impl Iterator<Item = (usize, &Vm, &Container)> {
        self.vms.iter().enumerate().flat_map(|(vi, vm)| vm.containers.iter().map(move |c| (vi, vm, c)))
    }

    /// Whether any spec of the run (containers' caches and swap caches, timeline changes) puts pages in
    /// `store`.
    pub fn uses_store(&self, store: dd_engine::StoreKind) -> bool {
        let containers = self.vms.iter().flat_map(|vm| &vm.containers);
        let specs = containers.flat_map(|c| std::iter::once(c.cache).chain(c.swap_cache));
        let changes = self.timeline.iter().filter_map(|e| match e {
            Event::SetCache { cache, .. } => Some(*cache),
            _ => None,
        });
        specs.chain(changes).any(|spec| spec.uses(store))
    }

    /// Checks every field; the error names the first bad one.
    pub fn validate(&self) -> Result<(), LabError> {
        let bad = |f: &str, m: &str| Err(LabError::invalid(f, m));
        let fin = |v: f64| v.is_finite() && v >= 0.0;
        if self.name.is_empty() {
            return bad("name", "must not be empty");
        }
        if !(self.duration_s.is_finite() && self.duration_s > 0.0) {
            return bad("duration_s", "must be a positive number");
        }
        if !(self.scale.is_finite() && self.scale > 0.0 && self.scale <= 100.0) {
            return bad("scale", "must be in (0, 100]");
        }
        if !(self.sample_interval_s.is_finite() && self.sample_interval_s > 0.0) {
            return bad("sample_interval_s", "must be positive");
        }
        if !fin(self.host.mem_capacity_mib) {
            return bad("host.mem_capacity_mib", "must be a non-negative number");
        }
        if !fin(self.host.ssd_capacity_mib) {
            return bad("host.ssd_capacity_mib", "must be a non-negative number");
        }
        if !(self.host.eviction_batch_mib.is_finite() && self.host.eviction_batch_mib > 0.0) {
            return bad("host.eviction_batch_mib", "must be positive");
        }
        if let Some(a) = self.host.disk.access_us {
            if !fin(a) {
                return bad("host.disk.access_us", "must be non-negative");
            }
        }
        if let Some(b) = self.host.disk.bandwidth_mib_s {
            if !(b.is_finite() && b > 0.0) {
                return bad("host.disk.bandwidth_mib_s", "must be positive");
            }
        }
        if self.guest.reclaim_batch_pages == 0 {
            return bad("guest.reclaim_batch_pages", "must be at least 1");
        }
        if self.vms.is_empty() {
            return bad("vms", "at least one VM is needed");
        }
        let mut vm_names = HashSet::new();
        let mut ct_names = HashSet::new();
        for (vi, vm) in self.vms.iter().enumerate() {
            let p = format!("vms[{vi}]");
            if vm.name.is_empty() || !vm_names.insert(vm.name.clone()) {
                return bad(&format!("{p}.name"), "must be non-empty and unique");
            }
            if vm.vcpus == 0 || vm.vcpus > 1024 {
                return bad(&format!("{p}.vcpus"), "must be in 1..=1024");
            }
            if !(vm.memory_mib.is_finite() && vm.memory_mib > 0.0) {
                return bad(&format!("{p}.memory_mib"), "must be positive");
            }
            for (ci, c) in vm.containers.iter().enumerate() {
                let p = format!("{p}.containers[{ci}]");
                if c.name.is_empty() || !ct_names.insert(c.name.clone()) || vm_names.contains(&c.name) {
                    return bad(
                        &format!("{p}.name"),
                        "must be non-empty and unique among VMs and containers",
                    );
                }
                if let Some(l) = c.memory_limit_mib {
                    if !(l.is_finite() && l > 0.0) {
                        return bad(&format!("{p}.memory_limit_mib"), "must be positive");
                    }
                }
                if let Some(l) = c.soft_limit_mib {
                    if !fin(l) {
                        return bad(&format!("{p}.soft_limit_mib"), "must be non-negative");
                    }
                }
                if !fin(c.start_s) {
                    return bad(&format!("{p}.start_s"), "must be non-negative");
                }
                if let Some(s) = c.stop_s {
                    if !(s.is_finite() && s > c.start_s) {
                        return bad(&format!("{p}.stop_s"), "must be after start_s");
                    }
                }
                validate_workload(&c.workload, &format!("{p}.workload"))?;
            }
            if let Some(m) = &vm.memctl {
                let names: Vec<&str> = vm.containers.iter().map(|c| c.name.as_str()).collect();
                m.validate(&format!("{p}.memctl"), &names)?;
            }
        }
        for (i, e) in self.timeline.iter().enumerate() {
            let p = format!("timeline[{i}]");
            if !fin(e.at_s()) {
                return bad(&format!("{p}.at_s"), "must be non-negative");
            }
            match e {
                Event::Start { container, .. }
                | Event::Stop { container, .. }
                | Event::SetCache { container, .. } => {
                    if !ct_names.contains(container) {
                        return bad(&format!("{p}.container"), "no such container");
                    }
                }
                Event::SetVmWeights { vm, mem, ssd, .. } => {
                    if !vm_names.contains(vm) {
                        return bad(&format!("{p}.vm"), "no such VM");
                    }
                    if mem.is_none() && ssd.is_none() {
                        return bad(&format!("{p}.mem"), "give `mem`, `ssd` or both");
                    }
                }
                Event::Balloon { vm, memory_mib, over_s, .. } => {
                    if !vm_names.contains(vm) {
                        return bad(&format!("{p}.vm"), "no such VM");
                    }
                    if !(memory_mib.is_finite() && *memory_mib > 0.0) {
                        return bad(&format!("{p}.memory_mib"), "must be positive");
                    }
                    if !fin(*over_s) {
                        return bad(&format!("{p}.over_s"), "must be non-negative");
                    }
                }
                Event::SetCapacity { mib, .. } => {
                    if !fin(*mib) {
                        return bad(&format!("{p}.mib"), "must be non-negative");
                    }
                }
                Event::SetMode { .. } => {}
            }
        }
        let mut var_names = HashSet::new();
        for (i, v) in self.variants.iter().enumerate() {
            let p = format!("variants[{i}]");
            if v.name.is_empty() || !var_names.insert(v.name.clone()) {
                return bad(&format!("{p}.name"), "must be non-empty and unique");
            }
            for k in v.containers.keys() {
                if !ct_names.contains(k) {
                    return bad(&format!("{p}.containers.{k}"), "no such container");
                }
            }
            for k in v.vm_memory_mib.keys() {
                if !vm_names.contains(k) {
                    return bad(&format!("{p}.vm_memory_mib.{k}"), "no such VM");
                }
            }
            for (k, o) in &v.memctl {
                if !self.vms.iter().any(|vm| &vm.name == k && vm.memctl.is_some()) {
                    return bad(&format!("{p}.memctl.{k}"), "no such VM with a [vms.memctl] table");
                }
                if o.chunk_cap_mib.is_some_and(|c| !(c.is_finite() && c > 0.0)) {
                    return bad(&format!("{p}.memctl.{k}.chunk_cap_mib"), "must be positive");
                }
            }
        }
        let entity_ok = |e: &str| ct_names.contains(e) || vm_names.contains(e);
        let variant_ok = |v: &Option<String>| v.as_ref().is_none_or(|v| var_names.contains(v));
        let check_measure = |m: &Measure, p: &str| -> Result<(), LabError> {
            if !entity_ok(&m.entity) {
                return Err(LabError::invalid(&format!("{p}.entity"), "no such container or VM"));
            }
            if !variant_ok(&m.variant) {
                return Err(LabError::invalid(&format!("{p}.variant"), "no such variant"));
            }
            Ok(())
        };
        for (i, c) in self.checks.iter().enumerate() {
            let p = format!("checks[{i}]");
            if c.name.is_empty() {
                return bad(&format!("{p}.name"), "must not be empty");
            }
            match &c.kind {
                CheckKind::Ratio { lhs, rhs, .. } => {
                    check_measure(lhs, &format!("{p}.lhs"))?;
                    check_measure(rhs, &format!("{p}.rhs"))?;
                }
                CheckKind::Value { lhs, .. } => check_measure(lhs, &format!("{p}.lhs"))?,
                CheckKind::Spread { entity, variants, .. } => {
                    if !entity_ok(entity) {
                        return bad(&format!("{p}.entity"), "no such container or VM");
                    }
                    if variants.len() < 2 || variants.iter().any(|v| !var_names.contains(v)) {
                        return bad(&format!("{p}.variants"), "needs two or more existing variants");
                    }
                }
                CheckKind::Entitlement { variant, entities, from_s, to_s, tolerance, .. } => {
                    if !variant_ok(variant) {
                        return bad(&format!("{p}.variant"), "no such variant");
                    }
                    if entities.is_empty() || entities.iter().any(|e| !entity_ok(e)) {
                        return bad(&format!("{p}.entities"), "needs existing containers or VMs");
                    }
                    if !(fin(*from_s) && *to_s > *from_s) {
                        return bad(&format!("{p}.to_s"), "window must be non-empty");
                    }
                    if !(tolerance.is_finite() && *tolerance > 0.0) {
                        return bad(&format!("{p}.tolerance"), "must be positive");
                    }
                }
                CheckKind::Coherent => {}
                CheckKind::MemRatio(m) => {
                    if !(ct_names.contains(&m.lhs) && ct_names.contains(&m.rhs)) {
                        return bad(&format!("{p}.lhs"), "lhs and rhs must be containers");
                    }
                    if m.variants.iter().any(|v| !var_names.contains(v)) {
                        return bad(&format!("{p}.variants"), "no such variant");
                    }
                    if !(m.target.is_finite() && m.target > 0.0) {
                        return bad(&format!("{p}.target"), "must be positive");
                    }
                }
                CheckKind::ExceedGap(m) => {
                    if !(ct_names.contains(&m.lhs) && ct_names.contains(&m.rhs)) {
                        return bad(&format!("{p}.lhs"), "lhs and rhs must be containers");
                    }
                    if !variant_ok(&m.variant) {
                        return bad(&format!("{p}.variant"), "no such variant");
                    }
                }
                CheckKind::ReclaimMode(m) => {
                    if m.entities.is_empty() || m.entities.iter().any(|e| !ct_names.contains(e)) {
                        return bad(&format!("{p}.entities"), "needs existing containers");
                    }
                    if !variant_ok(&m.variant) {
                        return bad(&format!("{p}.variant"), "no such variant");
                    }
                }
                CheckKind::Protected(m) => {
                    if !ct_names.contains(&m.protected) || m.others.iter().any(|e| !ct_names.contains(e)) {
                        return bad(&format!("{p}.protected"), "protected and others must be containers");
                    }
                    if !variant_ok(&m.variant) {
                        return bad(&format!("{p}.variant"), "no such variant");
                    }
                }
            }
        }
        Ok(())
    }

    /// A copy with `scale` applied to every size and time (and `scale` reset to 1).
    pub fn scaled(&self) -> Scenario {
        let k = self.scale;
        let mut s = self.clone();
        s.scale = 1.0;
        s.guest.size_scale *= k;
        s.duration_s *= k;
        s.sample_interval_s *= k;
        s.host.mem_capacity_mib *= k;
        s.host.ssd_capacity_mib *= k;
        s.host.eviction_batch_mib *= k;
        for vm in &mut s.vms {
            vm.memory_mib *= k;
            if let Some(m) = vm.memctl.as_mut() {
                m.scale(k);
            }
            for c in &mut vm.containers {
                c.memory_limit_mib = c.memory_limit_mib.map(|v| v * k);
                c.soft_limit_mib = c.soft_limit_mib.map(|v| v * k);
                c.start_s *= k;
                c.stop_s = c.stop_s.map(|v| v * k);
                scale_workload(&mut c.workload, k);
            }
        }
        for e in &mut s.timeline {
            *e.at_mut() *= k;
            match e {
                Event::SetCapacity { mib, .. } => *mib *= k,
                Event::Balloon { memory_mib, over_s, .. } => {
                    *memory_mib *= k;
                    *over_s *= k;
                }
                _ => {}
            }
        }
        for v in &mut s.variants {
            v.mem_capacity_mib = v.mem_capacity_mib.map(|x| x * k);
            v.ssd_capacity_mib = v.ssd_capacity_mib.map(|x| x * k);
            for m in v.vm_memory_mib.values_mut() {
                *m *= k;
            }
            for o in v.containers.values_mut() {
                o.memory_limit_mib = o.memory_limit_mib.map(|x| x * k);
                o.start_s = o.start_s.map(|x| x * k);
            }
            for o in v.memctl.values_mut() {
                o.chunk_cap_mib = o.chunk_cap_mib.map(|x| x * k);
            }
        }
        let sm = |m: &mut Measure| {
            m.from_s = m.from_s.map(|x| x * k);
            m.to_s = m.to_s.map(|x| x * k);
        };
        for c in &mut s.checks {
            match &mut c.kind {
                CheckKind::Ratio { lhs, rhs, .. } => {
                    sm(lhs);
                    sm(rhs);
                }
                CheckKind::Value { lhs, min, max } => {
                    sm(lhs);
                    // Sizes and page counts shrink with the scenario; rates and ratios do not.
                    if matches!(
                        lhs.metric,
                        Metric::CacheUsed
                            | Metric::MemUsed
                            | Metric::SsdUsed
                            | Metric::MemEntitlement
                            | Metric::MemEffectiveEntitlement
                            | Metric::SsdEntitlement
                            | Metric::SsdEffectiveEntitlement
                            | Metric::Evictions
                    ) {
                        *min *= k;
                        *max = max.map(|x| x * k);
                    }
                }
                CheckKind::Entitlement { from_s, to_s, .. } => {
                    *from_s *= k;
                    *to_s *= k;
                }
                CheckKind::Spread { from_s, to_s, .. } => {
                    *from_s = from_s.map(|x| x * k);
                    *to_s = to_s.map(|x| x * k);
                }
                CheckKind::Coherent => {}
                CheckKind::MemRatio(m) => m.scale(k),
                CheckKind::ExceedGap(m) => m.scale(k),
                CheckKind::ReclaimMode(m) => m.scale(k),
                CheckKind::Protected(m) => m.scale(k),
            }
        }
        s
    }
}

/// File counts scale (the file set shrinks, file sizes stay, so per-operation costs are unchanged);
/// videos have no useful count to scale, so their size scales instead.
fn scale_workload(w: &mut Workload, k: f64) {
    let n = |v: &mut u64| *v = ((*v as f64 * k).round() as u64).max(1);
    match w {
        Workload::Webserver { nfiles, .. }
        | Workload::Webproxy { nfiles, .. }
        | Workload::Varmail { nfiles, .. } => n(nfiles),
        Workload::Videoserver { filesize_mib, repint_s, .. } => {
            *filesize_mib *= k;
            *repint_s *= k;
        }
        Workload::Kv { dataset_mib, .. } => *dataset_mib *= k,
        Workload::Ycsb { record_count, .. } => n(record_count),
        Workload::Trace { .. } => {}
    }
}

fn validate_workload(w: &Workload, p: &str) -> Result<(), LabError> {
    let pos = |v: f64, f: &str| -> Result<(), LabError> {
        if v.is_finite() && v > 0.0 {
            Ok(())
        } else {
            Err(LabError::invalid(&format!("{p}.{f}"), "must be positive"))
        }
    };
    let thr = |t: u32| -> Result<(), LabError> {
        if (1..=4096).contains(&t) {
            Ok(())
        } else {
            Err(LabError::invalid(&format!("{p}.nthreads"), "must be in 1..=4096"))
        }
    };
    match w {
        Workload::Webserver { nfiles, filesize_kib, nthreads, appendsize_kib, .. }
        | Workload::Webproxy { nfiles, filesize_kib, nthreads, appendsize_kib, .. }
        | Workload::Varmail { nfiles, filesize_kib, nthreads, appendsize_kib, .. } => {
            if *nfiles == 0 || *nfiles > (1 << 22) {
                return Err(LabError::invalid(&format!("{p}.nfiles"), "must be in 1..=4194304"));
            }
            pos(*filesize_kib, "filesize_kib")?;
            pos(*appendsize_kib, "appendsize_kib")?;
            thr(*nthreads)
        }
        Workload::Videoserver {
            numactivevids,
            numpassivevids,
            filesize_mib,
            nthreads,
            readiosize_kib,
            writeiosize_kib,
            repint_s,
            read_limit_mib_s,
            ..
        } => {
            if *numactivevids == 0 || *numactivevids > 100_000 {
                return Err(LabError::invalid(&format!("{p}.numactivevids"), "must be in 1..=100000"));
            }
            if *numpassivevids == 0 || *numpassivevids > 100_000 {
                return Err(LabError::invalid(&format!("{p}.numpassivevids"), "must be in 1..=100000"));
            }
            pos(*filesize_mib, "filesize_mib")?;
            pos(*readiosize_kib, "readiosize_kib")?;
            pos(*writeiosize_kib, "writeiosize_kib")?;
            if !(read_limit_mib_s.is_finite() && *read_limit_mib_s >= 0.0) {
                return Err(LabError::invalid(&format!("{p}.read_limit_mib_s"), "must be non-negative"));
            }
            if !(repint_s.is_finite() && *repint_s >= 0.0) {
                return Err(LabError::invalid(&format!("{p}.repint_s"), "must be non-negative"));
            }
            thr(*nthreads)
        }
        Workload::Kv { dataset_mib, nthreads, write_fraction } => {
            pos(*dataset_mib, "dataset_mib")?;
            if !(0.0..=1.0).contains(write_fraction) {
                return Err(LabError::invalid(&format!("{p}.write_fraction"), "must be in [0, 1]"));
            }
            thr(*nthreads)
        }
        Workload::Ycsb { record_count, record_kib, nthreads, target_ops_s, .. } => {
            if *record_count == 0 || *record_count > (1 << 30) {
                return Err(LabError::invalid(&format!("{p}.record_count"), "must be in 1..=2^30"));
            }
            pos(*record_kib, "record_kib")?;
            if !(target_ops_s.is_finite() && *target_ops_s >= 0.0) {
                return Err(LabError::invalid(&format!("{p}.target_ops_s"), "must be non-negative"));
            }
            thr(*nthreads)
        }
        Workload::Trace { path, .. } => {
            if path.is_empty() {
                return Err(LabError::invalid(&format!("{p}.path"), "must not be empty"));
            }
            Ok(())
        }
    }
}

/// MiB to 4 KiB pages.
pub fn mib_pages(mib: f64) -> u64 {
    (mib * 256.0).round().max(0.0) as u64
}
