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

pub mod bundled;
pub mod checks;
pub mod memctl;
pub mod mixgen;
pub mod provision;
mod validate;
pub mod workload;

pub use checks::{Check, CheckKind, Measure, Metric};
pub use workload::{Selection, StoreKind, Workload, YcsbWorkload};

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
    /// How requests of different containers share the disk: `fifo` (default, one queue) or `fair` (a
    /// queue per container, served in proportion to the containers' `io_weight`; `sim/disk.rs`).
    #[serde(default)]
    pub scheduler: DiskScheduler,
}

impl Default for DiskModel {
    fn default() -> Self {
        DiskModel {
            kind: DiskKind::Hdd,
            access_us: None,
            bandwidth_mib_s: None,
            scheduler: DiskScheduler::Fifo,
        }
    }
}

/// The disk's scheduler between containers (see [`DiskModel::scheduler`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DiskScheduler {
    /// One first-come-first-served queue for every container (the lab's model before issue 34).
    #[default]
    Fifo,
    /// A queue per container (and one for asynchronous write-back), the disk's time shared among the
    /// queues with work outstanding by `io_weight`: generalised processor sharing, the fluid that
    /// Linux's CFQ, BFQ and `io.weight` approximate (D34).
    Fair,
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
    pub memctl: Option<memctl::VmMemctl>,
    /// The VM-level provisioner of its containers (SPEC 10b). Default none.
    #[serde(default)]
    pub provision: Option<provision::VmProvision>,
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
    /// The order in which the container's (ephemeral) pool gives up pages when it is the eviction
    /// victim: `fifo` (the paper's), `lru`, `clock` or `s3-fifo`. Default `fifo`.
    #[serde(default)]
    pub cache_order: dd_engine::EvictionOrder,
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
    /// What the container must reach (the provisioner plans for it; `targets` and `violation` checks
    /// test it), e.g. `{ kind = "throughput", ops_s = 900 }`. Default none.
    #[serde(default)]
    pub target: Option<dd_provision::Target>,
    /// Its weight in the disk's `fair` scheduler (cgroup v2 `io.weight`: 1-10000). Default 100.
    #[serde(default = "d_w")]
    pub io_weight: u32,
    pub workload: Workload,
}

fn d_spec() -> Spec {
    Spec::Mem { weight: 100 }
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
    /// A container's memory (memcg hard) limit from now on: lowered, it reclaims at once, as the
    /// provisioner's plans do; `None` lifts it (the VM's memory).
    SetMemoryLimit {
        at_s: f64,
        container: String,
        #[serde(default)]
        mib: Option<f64>,
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
    /// From now on the container uses only a window of its data: `fraction` of it, starting `offset`
    /// of the way in (wrapping at the end). Filebench personalities pick files in it, YCSB draws its
    /// keys in it (the zipfian's skew within the window), `kv` its pages. A working set that grows or
    /// shifts between phases.
    WorkingSet {
        at_s: f64,
        container: String,
        fraction: f64,
        #[serde(default)]
        offset: f64,
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
            | Event::SetMemoryLimit { at_s, .. }
            | Event::SetMode { at_s, .. }
            | Event::Balloon { at_s, .. }
            | Event::WorkingSet { at_s, .. } => *at_s,
        }
    }
    fn at_mut(&mut self) -> &mut f64 {
        match self {
            Event::Start { at_s, .. }
            | Event::Stop { at_s, .. }
            | Event::SetCache { at_s, .. }
            | Event::SetVmWeights { at_s, .. }
            | Event::SetCapacity { at_s, .. }
            | Event::SetMemoryLimit { at_s, .. }
            | Event::SetMode { at_s, .. }
            | Event::Balloon { at_s, .. }
            | Event::WorkingSet { at_s, .. } => at_s,
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
    pub memctl: BTreeMap<String, memctl::MemctlOverride>,
    /// Per-VM switch of the provisioner (`[vms.provision]`).
    #[serde(default)]
    pub provision: BTreeMap<String, bool>,
    /// This variant stands for the best of a grid of settings (see [`provision::Search`]).
    #[serde(default)]
    pub search: Option<provision::Search>,
    /// Not part of the file: the searching variant a candidate was expanded from.
    #[serde(skip)]
    pub search_of: Option<String>,
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

    /// The variants of the scenario (one implicit `default` when none is declared); a searching
    /// variant is one entry here.
    pub fn variant_list(&self) -> Vec<Variant> {
        if self.variants.is_empty() {
            vec![Variant { name: "default".into(), ..Default::default() }]
        } else {
            self.variants.clone()
        }
    }

    /// A copy that runs only the named variants (in the scenario's order; `lab run --variant`, Python's
    /// `lab.run(variants=...)`, a sweep's `variants`). A check that names a variant left out, or that
    /// means the first variant by default while the first is left out, is dropped: it could only fail
    /// for want of its run. An unknown name is an error naming the field `variants`.
    pub fn only_variants(&self, names: &[String]) -> Result<Scenario, LabError> {
        let all = self.variant_list();
        for n in names {
            if !all.iter().any(|v| &v.name == n) {
                let known: Vec<&str> = all.iter().map(|v| v.name.as_str()).collect();
                return Err(LabError::invalid(
                    "variants",
                    format!("no variant `{n}` (the scenario has: {})", known.join(", ")),
                ));
            }
        }
        let mut s = self.clone();
        if self.variants.is_empty() {
            // Only the implicit `default`, which the check above accepted.
            return Ok(s);
        }
        s.variants.retain(|v| names.contains(&v.name));
        let first_kept = s.variants.first().map(|v| v.name.as_str()) == all.first().map(|v| v.name.as_str());
        s.checks.retain(|c| {
            let (named, implicit) = check_variants(c);
            named.iter().all(|n| names.contains(n)) && (!implicit || first_kept)
        });
        Ok(s)
    }

    /// The variants to run: [`Scenario::variant_list`] with each searching variant replaced by its
    /// candidates (in place, in order).
    pub fn run_list(&self) -> Vec<Variant> {
        let vm_memory = |c: &str| -> Option<(String, f64)> {
            self.containers()
                .find(|(_, _, ct)| ct.name == c)
                .map(|(_, vm, _)| (vm.name.clone(), vm.memory_mib))
        };
        self.variant_list().iter().flat_map(|v| provision::expand(v, &vm_memory)).collect()
    }

    pub fn containers(&self) -> impl Iterator<Item = (usize, &Vm, &Container)> {
        self.vms.iter().enumerate().flat_map(|(vi, vm)| vm.containers.iter().map(move |c| (vi, vm, c)))
    }

    /// Whether any spec of the run (containers' caches and swap caches, timeline changes) puts pages in
    /// `store`, or a provisioner that sets pool specs runs (it may move a container to either store).
    pub fn uses_store(&self, store: dd_engine::StoreKind) -> bool {
        let provisioned =
            self.vms.iter().any(|vm| vm.provision.as_ref().is_some_and(|p| p.enabled && p.cache));
        if provisioned {
            return true;
        }
        let containers = self.vms.iter().flat_map(|vm| &vm.containers);
        let specs = containers.flat_map(|c| std::iter::once(c.cache).chain(c.swap_cache));
        let changes = self.timeline.iter().filter_map(|e| match e {
            Event::SetCache { cache, .. } => Some(*cache),
            _ => None,
        });
        specs.chain(changes).any(|spec| spec.uses(store))
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
            if let Some(p) = vm.provision.as_mut() {
                p.scale(k);
            }
            for c in &mut vm.containers {
                c.memory_limit_mib = c.memory_limit_mib.map(|v| v * k);
                c.soft_limit_mib = c.soft_limit_mib.map(|v| v * k);
                c.start_s *= k;
                c.stop_s = c.stop_s.map(|v| v * k);
                workload::scale_workload(&mut c.workload, k);
            }
        }
        for e in &mut s.timeline {
            *e.at_mut() *= k;
            match e {
                Event::SetCapacity { mib, .. } => *mib *= k,
                Event::SetMemoryLimit { mib, .. } => *mib = mib.map(|v| v * k),
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
            if let Some(se) = v.search.as_mut() {
                se.scale(k);
            }
        }
        for c in &mut s.checks {
            c.kind.spec_mut().scale(k);
        }
        s
    }
}

/// The variants a check names, and whether it also means the first variant by default (a `variant`
/// left out, an empty `variants` list). Read from the check's serialised form, so that a new check kind
/// is covered as long as it names its variants `variant`, `variants` or `baseline`, as all do.
fn check_variants(c: &Check) -> (Vec<String>, bool) {
    fn walk(v: &serde_json::Value, named: &mut Vec<String>, implicit: &mut bool) {
        match v {
            serde_json::Value::Object(m) => {
                for (k, x) in m {
                    match (k.as_str(), x) {
                        ("variant" | "baseline", serde_json::Value::String(n)) => named.push(n.clone()),
                        ("variant", serde_json::Value::Null) => *implicit = true,
                        ("variants", serde_json::Value::Array(a)) => {
                            *implicit |= a.is_empty();
                            named.extend(a.iter().filter_map(|n| n.as_str().map(str::to_string)));
                        }
                        _ => walk(x, named, implicit),
                    }
                }
            }
            serde_json::Value::Array(a) => a.iter().for_each(|x| walk(x, named, implicit)),
            _ => {}
        }
    }
    let (mut named, mut implicit) = (Vec::new(), false);
    walk(&serde_json::to_value(c).unwrap_or_default(), &mut named, &mut implicit);
    (named, implicit)
}

/// MiB to 4 KiB pages.
pub fn mib_pages(mib: f64) -> u64 {
    (mib * 256.0).round().max(0.0) as u64
}
