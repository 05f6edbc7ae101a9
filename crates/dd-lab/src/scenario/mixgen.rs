//! A seeded generator of VM mixes nobody tuned the provisioner to (issue 27): from a seed and a few
//! plain-data knobs ([`MixConfig`]), a [`Scenario`] with one or two VMs whose containers run workloads
//! drawn from the lab's kinds ([`MixKind`]) with random working sets and thread counts, over a host
//! memory cache; a `[vms.provision]` table per VM (off, turned on by the `provisioner` variant) and a
//! `static` variant searching a bounded grid of memory limits and cache weights. No targets: they come
//! from a sweep of the static grid (`crate::mixes`, the harness that runs the mixes and scores the
//! provisioner).
//!
//! Invariants of [`generate`] (its tests check them): the same seed and knobs give the same scenario,
//! which validates; sizes at scale 1 are in the documented ranges ([`VM_MEMORY_MIB`], [`CACHE_MIB`],
//! [`THREADS`], working sets at least [`MIN_WORKING_SET_MIB`]); each VM's working sets add up to
//! [`OVERCOMMIT`] times what its memory and its share of the cache hold, so no container fits unless
//! another gives way; every container of a VM is in the search (its memory limit, or the rest of the
//! VM's memory for the last one; a cache weight, 0 for workloads without file pages), so weights that
//! are proportional within a VM are one candidate; the search expands to at most
//! [`MixConfig::max_candidates`] candidates.

use super::provision::{Search, VmProvision};
use super::workload::{Selection, StoreKind, Workload, YcsbWorkload};
use super::{Container, DiskKind, DiskModel, GuestOptions, Host, Scenario, Timing, Variant, Vm};
use crate::error::LabError;
use dd_engine::{Mode, Spec};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::ops::RangeInclusive;

/// The searching variant: the best static allocation of the grid.
pub const STATIC: &str = "static";
/// The variant that runs every VM's provisioner.
pub const PROVISIONER: &str = "provisioner";
/// Emulated length of a mix at scale 1, s.
pub const DURATION_S: f64 = 300.0;
/// The window in which targets are derived, met and compared starts here (scale 1, s); it ends with
/// the run. The provisioner has had twelve decisions by then.
pub const WINDOW_FROM_S: f64 = 150.0;
/// Sampling period at scale 1, s.
pub const SAMPLE_INTERVAL_S: f64 = 3.0;
/// The provisioner's first decision and its interval at scale 1, s.
pub const PROVISION_START_S: f64 = 30.0;
pub const PROVISION_INTERVAL_S: f64 = 10.0;
/// A VM's memory at scale 1, MiB (multiples of 64).
pub const VM_MEMORY_MIB: RangeInclusive<f64> = 512.0..=1536.0;
/// The host's memory cache at scale 1, MiB (multiples of 32), shared by the VMs with equal weights.
pub const CACHE_MIB: RangeInclusive<f64> = 128.0..=512.0;
/// Each workload's threads (or YCSB client threads).
pub const THREADS: RangeInclusive<u32> = 1..=4;
/// A VM's working sets add up to this many times its memory plus its share of the cache.
pub const OVERCOMMIT: RangeInclusive<f64> = 1.2..=1.6;
/// The smallest working set of a container at scale 1, MiB.
pub const MIN_WORKING_SET_MIB: f64 = 24.0;
/// Memory-store weights the search tries for a container that reads files (0: no cache).
const FILE_WEIGHTS: [u32; 3] = [0, 1, 3];

/// A workload kind of a mix, each one of the lab's workloads (`scenario::workload`) with settings
/// drawn per container.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum MixKind {
    /// `kv`: uniform random pages of anonymous memory.
    Kv,
    /// YCSB against the Redis-like store: zipfian keys, records in anonymous memory.
    Redis,
    /// YCSB against the MongoDB-like store: zipfian keys, records in an mmap'd file (preloaded).
    Mongo,
    /// YCSB against the MySQL-like store: a buffer pool in anonymous memory over a tablespace file.
    Mysql,
    /// Filebench webserver, random file pick.
    Web,
    /// Filebench webserver, files read in order: a sequential scanner.
    Scan,
    /// Filebench webproxy.
    Proxy,
    /// Filebench varmail (fsyncs).
    Mail,
}

impl MixKind {
    pub const ALL: [MixKind; 8] = [
        MixKind::Kv,
        MixKind::Redis,
        MixKind::Mongo,
        MixKind::Mysql,
        MixKind::Web,
        MixKind::Scan,
        MixKind::Proxy,
        MixKind::Mail,
    ];

    /// The short name (also the stem of its containers' names).
    pub fn label(self) -> &'static str {
        match self {
            MixKind::Kv => "kv",
            MixKind::Redis => "redis",
            MixKind::Mongo => "mongo",
            MixKind::Mysql => "mysql",
            MixKind::Web => "web",
            MixKind::Scan => "scan",
            MixKind::Proxy => "proxy",
            MixKind::Mail => "mail",
        }
    }

    /// Whether its pages include file pages (which the second-chance cache can hold).
    pub fn reads_files(self) -> bool {
        !matches!(self, MixKind::Kv | MixKind::Redis)
    }
}

fn d_min_containers() -> usize {
    3
}
fn d_max_containers() -> usize {
    5
}
fn d_one() -> usize {
    1
}
fn d_two() -> usize {
    2
}
fn d_scale() -> f64 {
    1.0
}
fn d_candidates() -> usize {
    60
}
fn d_kinds() -> Vec<MixKind> {
    MixKind::ALL.to_vec()
}

/// The generator's knobs (plain data; [`MixConfig::validate`] names a bad field).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MixConfig {
    /// Containers of a mix, drawn uniformly in `min_containers..=max_containers`. Default 3 to 5.
    #[serde(default = "d_min_containers")]
    pub min_containers: usize,
    #[serde(default = "d_max_containers")]
    pub max_containers: usize,
    /// VMs of a mix, drawn uniformly. Default 1 to 2.
    #[serde(default = "d_one")]
    pub min_vms: usize,
    #[serde(default = "d_two")]
    pub max_vms: usize,
    /// The scenario's `scale` (sizes and times). Default 1.
    #[serde(default = "d_scale")]
    pub scale: f64,
    /// Most candidates of the static search; the grid is thinned until it fits. Default 60.
    #[serde(default = "d_candidates")]
    pub max_candidates: usize,
    /// Kinds to draw from, uniformly. Default all of [`MixKind::ALL`].
    #[serde(default = "d_kinds")]
    pub kinds: Vec<MixKind>,
}

impl Default for MixConfig {
    fn default() -> Self {
        MixConfig {
            min_containers: d_min_containers(),
            max_containers: d_max_containers(),
            min_vms: d_one(),
            max_vms: d_two(),
            scale: d_scale(),
            max_candidates: d_candidates(),
            kinds: d_kinds(),
        }
    }
}

impl MixConfig {
    pub fn validate(&self) -> Result<(), LabError> {
        if !(1..=8).contains(&self.min_vms) {
            return Err(LabError::invalid("min_vms", "must be in 1..=8"));
        }
        if !(self.min_vms..=8).contains(&self.max_vms) {
            return Err(LabError::invalid("max_vms", "must be in min_vms..=8"));
        }
        if self.min_containers < self.max_vms {
            return Err(LabError::invalid("min_containers", "must be at least max_vms (a container per VM)"));
        }
        if self.max_containers < self.min_containers || self.max_containers > 16 {
            return Err(LabError::invalid("max_containers", "must be in min_containers..=16"));
        }
        if !(self.scale.is_finite() && self.scale > 0.0 && self.scale <= 100.0) {
            return Err(LabError::invalid("scale", "must be in (0, 100]"));
        }
        if !(1..=super::provision::MAX_CANDIDATES).contains(&self.max_candidates) {
            return Err(LabError::invalid(
                "max_candidates",
                format!("must be in 1..={}", super::provision::MAX_CANDIDATES),
            ));
        }
        if self.kinds.is_empty() {
            return Err(LabError::invalid("kinds", "needs at least one kind"));
        }
        Ok(())
    }
}

/// One container of a mix as drawn (sizes at scale 1).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct MixContainer {
    pub name: String,
    pub vm: String,
    pub kind: MixKind,
    /// The memory its data takes (MySQL: tablespace and buffer pool), MiB at scale 1.
    pub working_set_mib: f64,
    pub nthreads: u32,
}

/// A generated mix: the scenario and what was drawn.
#[derive(Debug, Clone, PartialEq)]
pub struct Mix {
    pub seed: u64,
    pub scenario: Scenario,
    pub containers: Vec<MixContainer>,
}

impl Mix {
    /// `vm1: redis1, scan2 | vm2: web3` (names carry the kinds).
    pub fn describe(&self) -> String {
        let mut by_vm: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
        for c in &self.containers {
            by_vm.entry(&c.vm).or_default().push(&c.name);
        }
        by_vm.iter().map(|(vm, cs)| format!("{vm}: {}", cs.join(", "))).collect::<Vec<_>>().join(" | ")
    }
}

/// Rounds down to a multiple of `step` (at least `step`).
fn multiple(x: f64, step: f64) -> f64 {
    ((x / step).floor() * step).max(step)
}

/// The mix of `seed` (see the module doc).
pub fn generate(seed: u64, cfg: &MixConfig) -> Result<Mix, LabError> {
    cfg.validate()?;
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let nvms = rng.gen_range(cfg.min_vms..=cfg.max_vms);
    let n = rng.gen_range(cfg.min_containers..=cfg.max_containers);
    // A container per VM, the rest anywhere.
    let mut per_vm = vec![1usize; nvms];
    for _ in nvms..n {
        per_vm[rng.gen_range(0..nvms)] += 1;
    }
    let step = |r: &RangeInclusive<f64>, unit: f64| (r.start() / unit) as u32..=(r.end() / unit) as u32;
    let cache_mib = f64::from(rng.gen_range(step(&CACHE_MIB, 32.0))) * 32.0;
    let share = cache_mib / nvms as f64;
    // Every other setting of the provisioner at its default, whatever fields it has.
    let provision: VmProvision = serde_json::from_value(serde_json::json!({
        "enabled": false,
        "start_s": PROVISION_START_S,
        "interval_s": PROVISION_INTERVAL_S,
    }))
    .map_err(|e| LabError::invalid("vms.provision", e.to_string()))?;
    let mut vms = Vec::with_capacity(nvms);
    let mut drawn = Vec::with_capacity(n);
    let mut search = Search { from_s: Some(WINDOW_FROM_S), ..Default::default() };
    for (vi, &count) in per_vm.iter().enumerate() {
        let vm = format!("vm{}", vi + 1);
        let memory = f64::from(rng.gen_range(step(&VM_MEMORY_MIB, 64.0))) * 64.0;
        let total = (memory + share) * rng.gen_range(OVERCOMMIT);
        let weights: Vec<f64> = (0..count).map(|_| rng.gen_range(0.5..=1.5)).collect();
        let wsum: f64 = weights.iter().sum();
        let mut containers = Vec::with_capacity(count);
        let mut sets = Vec::with_capacity(count);
        for w in &weights {
            let kind = cfg.kinds[rng.gen_range(0..cfg.kinds.len())];
            let name = format!("{}{}", kind.label(), drawn.len() + 1);
            let ws = (total * w / wsum).round().max(MIN_WORKING_SET_MIB);
            let nthreads = rng.gen_range(THREADS);
            let workload = workload(kind, ws, nthreads, &mut rng);
            drawn.push(MixContainer {
                name: name.clone(),
                vm: vm.clone(),
                kind,
                working_set_mib: ws,
                nthreads,
            });
            sets.push(ws);
            containers.push(Container {
                name,
                memory_limit_mib: None,
                soft_limit_mib: None,
                cache: Spec::Mem { weight: 100 },
                cache_order: Default::default(),
                swap_cache: None,
                start_s: 0.0,
                stop_s: None,
                target: None,
                io_weight: 100,
                workload,
            });
        }
        // The grid: every container but the VM's last gets limits around its fair share of the memory
        // (half of it, all of it, and its whole working set), the last the rest; file readers a cache
        // weight in FILE_WEIGHTS, the others none.
        let set_sum: f64 = sets.iter().sum();
        for (i, c) in containers.iter().enumerate() {
            let kind = drawn[drawn.len() - count + i].kind;
            let weights = if kind.reads_files() { FILE_WEIGHTS.to_vec() } else { vec![0] };
            search.cache_weights.insert(c.name.clone(), weights);
            if i + 1 == count {
                search.rest_of_memory.push(c.name.clone());
                continue;
            }
            let fair = memory * sets[i] / set_sum;
            let fit = (sets[i] * 1.1).min(memory * 0.85);
            let mut levels: Vec<f64> =
                [fair * 0.5, fair, fit].iter().map(|x| multiple(*x, 4.0).max(8.0)).collect();
            levels.sort_by(f64::total_cmp);
            levels.dedup();
            search.memory_limit_mib.insert(c.name.clone(), levels);
        }
        vms.push(Vm {
            name: vm,
            memory_mib: memory,
            vcpus: 8,
            mem_weight: 100,
            ssd_weight: 100,
            memctl: None,
            provision: Some(provision.clone()),
            containers,
        });
    }
    let provision = vms.iter().map(|v| (v.name.clone(), true)).collect();
    let mut sc = Scenario {
        name: format!("mix-{seed}"),
        description: String::new(),
        duration_s: DURATION_S,
        seed,
        scale: cfg.scale,
        sample_interval_s: SAMPLE_INTERVAL_S,
        host: Host {
            mem_capacity_mib: cache_mib,
            ssd_capacity_mib: 0.0,
            mode: Mode::Partitioned,
            eviction_batch_mib: 2.0,
            disk: DiskModel { kind: DiskKind::Network, ..DiskModel::default() },
        },
        timing: Timing::default(),
        guest: GuestOptions::default(),
        vms,
        timeline: Vec::new(),
        variants: vec![
            Variant { name: STATIC.into(), search: Some(search), ..Default::default() },
            Variant { name: PROVISIONER.into(), provision, ..Default::default() },
        ],
        checks: Vec::new(),
    };
    thin(&mut sc, cfg.max_candidates);
    let mut mix = Mix { seed, scenario: sc, containers: drawn };
    mix.scenario.description = describe(&mix, cache_mib);
    mix.scenario.validate()?;
    Ok(mix)
}

/// A mix (with or without its targets) as a scenario file that `lab run` reads back to the same scenario.
/// The provisioner's table keeps only what the generator sets, so the file runs main's provisioner with
/// its defaults of the day.
pub fn case_toml(sc: &Scenario) -> Result<String, LabError> {
    let err = |e: &dyn std::fmt::Display| LabError::invalid("mix", format!("as TOML: {e}"));
    let mut v = toml::Value::try_from(sc).map_err(|e| err(&e))?;
    let vms = v.get_mut("vms").and_then(toml::Value::as_array_mut).into_iter().flatten();
    for p in vms.filter_map(|vm| vm.get_mut("provision").and_then(toml::Value::as_table_mut)) {
        p.retain(|k, _| ["enabled", "start_s", "interval_s"].contains(&k));
    }
    toml::to_string(&v).map_err(|e| err(&e))
}

/// How many candidates the static search expands to.
pub fn candidates(sc: &Scenario) -> usize {
    sc.run_list().iter().filter(|v| v.search_of.as_deref() == Some(STATIC)).count()
}

/// Thins the static grid until it expands to at most `max` candidates: the middle value of the longest
/// list goes (cache weights before memory limits at equal lengths, then the later container).
fn thin(sc: &mut Scenario, max: usize) {
    while candidates(sc) > max {
        let Some(search) = sc.variants.iter_mut().find_map(|v| v.search.as_mut()) else { return };
        let longest = search
            .cache_weights
            .iter()
            .map(|(k, v)| (v.len(), 1, k.clone()))
            .chain(search.memory_limit_mib.iter().map(|(k, v)| (v.len(), 0, k.clone())))
            .max();
        match longest {
            Some((len, 1, k)) if len > 1 => {
                let v = search.cache_weights.get_mut(&k).expect("a key just listed");
                v.remove(len / 2);
            }
            Some((len, _, k)) if len > 1 => {
                let v = search.memory_limit_mib.get_mut(&k).expect("a key just listed");
                v.remove(len / 2);
            }
            // Every list has one value: a single candidate.
            _ => return,
        }
    }
}

/// The workload of `kind` whose data takes `ws` MiB, with `nthreads` threads.
fn workload(kind: MixKind, ws: f64, nthreads: u32, rng: &mut ChaCha8Rng) -> Workload {
    const YCSB: [YcsbWorkload; 6] = [
        YcsbWorkload::A,
        YcsbWorkload::B,
        YcsbWorkload::C,
        YcsbWorkload::D,
        YcsbWorkload::E,
        YcsbWorkload::F,
    ];
    let ycsb = |store, records: f64, pool: f64, rng: &mut ChaCha8Rng| Workload::Ycsb {
        store,
        workload: YCSB[rng.gen_range(0..YCSB.len())],
        // Records of 1 KiB.
        record_count: (records * 1024.0) as u64,
        record_kib: 1.0,
        nthreads,
        target_ops_s: 0.0,
        buffer_pool_mib: pool,
        page_kib: 16.0,
        preload: store != StoreKind::Redis,
    };
    let files = |rng: &mut ChaCha8Rng| {
        let size = [16.0, 32.0, 48.0, 64.0][rng.gen_range(0..4)];
        ((ws * 1024.0 / size).round() as u64, size)
    };
    match kind {
        MixKind::Kv => Workload::Kv {
            dataset_mib: ws,
            nthreads,
            write_fraction: f64::from(rng.gen_range(1..=5u32)) / 10.0,
        },
        MixKind::Redis => ycsb(StoreKind::Redis, ws, 128.0, rng),
        MixKind::Mongo => ycsb(StoreKind::Mongo, ws, 128.0, rng),
        MixKind::Mysql => {
            // A buffer pool of a quarter to a half of the tablespace; the two make the working set.
            let b = f64::from(rng.gen_range(25..=50u32)) / 100.0;
            let table = ws / (1.0 + b);
            ycsb(StoreKind::Mysql, table, (table * b).round().max(1.0), rng)
        }
        MixKind::Web | MixKind::Scan => {
            let (nfiles, filesize_kib) = files(rng);
            let selection = if kind == MixKind::Scan { Selection::InOrder } else { Selection::Random };
            Workload::Webserver { nfiles, filesize_kib, nthreads, appendsize_kib: 16.0, selection }
        }
        MixKind::Proxy => {
            let (nfiles, filesize_kib) = files(rng);
            Workload::Webproxy {
                nfiles,
                filesize_kib,
                nthreads,
                appendsize_kib: 16.0,
                selection: Selection::Random,
            }
        }
        MixKind::Mail => {
            let (nfiles, filesize_kib) = files(rng);
            Workload::Varmail {
                nfiles,
                filesize_kib,
                nthreads,
                appendsize_kib: 16.0,
                selection: Selection::Random,
            }
        }
    }
}

fn describe(mix: &Mix, cache_mib: f64) -> String {
    let vms: Vec<String> = mix
        .scenario
        .vms
        .iter()
        .map(|vm| {
            let cts: Vec<String> = mix
                .containers
                .iter()
                .filter(|c| c.vm == vm.name)
                .map(|c| format!("{} ({} MiB, {} thread(s))", c.name, c.working_set_mib, c.nthreads))
                .collect();
            format!("{} ({} MiB): {}", vm.name, vm.memory_mib, cts.join(", "))
        })
        .collect();
    format!(
        "Generated mix of seed {} (dd_lab::scenario::mixgen, issue 27) over a {cache_mib} MiB memory cache \
         and a network disk; sizes at scale 1. {}. `{STATIC}` is the best of {} static allocations \
         (memory limits and cache weights), `{PROVISIONER}` runs the VM-level provisioner.",
        mix.seed,
        vms.join("; "),
        candidates(&mix.scenario)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_grid_is_thinned_to_the_bound() {
        let cfg =
            MixConfig { min_containers: 5, max_containers: 5, min_vms: 1, max_vms: 1, ..Default::default() };
        for seed in 1..=5 {
            let m = generate(seed, &cfg).unwrap();
            let n = candidates(&m.scenario);
            assert!((2..=cfg.max_candidates).contains(&n), "seed {seed}: {n}");
        }
        let tiny = MixConfig { max_candidates: 4, ..cfg };
        assert!(candidates(&generate(1, &tiny).unwrap().scenario) <= 4);
    }

    #[test]
    fn a_bad_knob_is_named() {
        let bad = MixConfig { min_containers: 1, ..Default::default() };
        assert!(generate(1, &bad).unwrap_err().to_string().contains("min_containers"));
        let bad = MixConfig { kinds: vec![], ..Default::default() };
        assert!(generate(1, &bad).unwrap_err().to_string().contains("kinds"));
    }
}
