//! `doubledecker guest provision`: the VM-level provisioner on a real guest (SPEC section 10b).
//!
//! Each round reads what the FUSE mount published (`[sampling] stats_file`: each container's sampled
//! miss-ratio curve of its page reads, its first-level cache, counters and read times), the watcher's
//! state file (container -> pool) and, with a daemon, the VM's entitlements in its stores; asks
//! `dd_provision::provision` for each container's first-level budget and pool weights so that its target
//! (a hit ratio, or a mean read latency through the mount) is met; and applies the plan: the budgets to
//! the mount's `budgets_file`, the pool specs to the daemon (SET_CG_WEIGHT), and, for a container that
//! has `memory_base_bytes`, its cgroup's memory limit (base plus first-level budget: the mount's cache is
//! the container's page cache). A target no plan meets is reported as infeasible in the round's report,
//! never silently missed.
//!
//! The model here: an operation is one page read through the mount, the first level is the memory the
//! plan shares out (`memory_bytes`), the pool the cache; the cost of a read at each level is measured by
//! the mount (time in pool gets and backing reads, per page; the rest of a read's time is the first
//! level's). Reads arrive at the rate measured since the last round (open loop): the objective, once
//! targets are met, is the total of pages per second served without the backing store.
//!
//! Invariants: nothing is applied in a dry run; a round that finds no published container changes
//! nothing; the budgets file and cgroup limits are written whole (atomic rename, one write per value).

use crate::mount_stats::{MountStats, PublishedContainer, ReadTimesSnapshot};
use crate::watch::{DaemonConfig, Owned};
use dd_client::Client;
use dd_engine::{PoolId, Spec};
use dd_provision::{
    provision, Allocation, Budget, ContainerInput, Curve, Demand, LatencyModel, Objective, Observed, Plan,
    ProvisionConfig, Target, Unit,
};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Instant;

const PAGE: u64 = 4096;

/// One container's goal.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ContainerGoal {
    /// `{ kind = "hit_ratio", ratio }` or `{ kind = "mean_latency", ms }` (per page read through the
    /// mount). Default none: the container only takes what the others leave.
    #[serde(default)]
    pub target: Option<Target>,
    /// First-level bytes it keeps whatever the plan. Default 0 (one page).
    #[serde(default)]
    pub min_budget_bytes: u64,
    /// When set, the container's cgroup memory limit is this plus its first-level budget. Default none
    /// (the limit is left alone).
    #[serde(default)]
    pub memory_base_bytes: Option<u64>,
}

fn d_state() -> PathBuf {
    PathBuf::from("dd-guest-pools.json")
}
fn d_interval() -> u64 {
    2000
}
fn d_decision() -> ProvisionConfig {
    ProvisionConfig { objective: Objective::Hits, ..ProvisionConfig::default() }
}

/// The provisioner's configuration file (TOML).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProvisionFileConfig {
    /// The mount's `[sampling] stats_file`.
    pub stats_file: PathBuf,
    /// The mount's `[sampling] budgets_file`.
    pub budgets_file: PathBuf,
    /// The watcher's state file (container -> pool). Default `dd-guest-pools.json`.
    #[serde(default = "d_state")]
    pub state_file: PathBuf,
    /// Between rounds. Default 2000 ms.
    #[serde(default = "d_interval")]
    pub interval_ms: u64,
    /// First-level memory the containers share, bytes.
    pub memory_bytes: u64,
    /// The VM's share of the daemon's memory store to plan with, bytes. Default: the VM's entitlement
    /// the daemon reports (0 without a daemon).
    #[serde(default)]
    pub mem_cache_bytes: Option<u64>,
    /// Same for the SSD store.
    #[serde(default)]
    pub ssd_cache_bytes: Option<u64>,
    /// The daemon, to set the pools' specs. Without it only first-level budgets (and limits) are set.
    #[serde(default)]
    pub daemon: Option<DaemonConfig>,
    /// Containers are the child cgroups of this directory (for `memory_base_bytes`).
    #[serde(default)]
    pub cgroup_parent: Option<PathBuf>,
    /// Goals by container name; a published container not listed has no target.
    #[serde(default)]
    pub containers: BTreeMap<String, ContainerGoal>,
    /// The decision's settings (default objective `hits`).
    #[serde(default = "d_decision")]
    pub decision: ProvisionConfig,
}

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum GuestProvisionError {
    #[error("invalid provisioner configuration: {field}: {reason}")]
    Config { field: String, reason: String },
    #[error("cannot read {path}: {source}")]
    Read { path: PathBuf, source: std::io::Error },
    #[error("cannot parse {path}: {message}")]
    Parse { path: PathBuf, message: String },
    #[error("cannot write {path}: {source}")]
    Write { path: PathBuf, source: std::io::Error },
    #[error("daemon: {0}")]
    Daemon(#[from] dd_client::ClientError),
    #[error("provisioner: {0}")]
    Provision(#[from] dd_provision::ProvisionError),
}

fn bad(field: &str, reason: &str) -> GuestProvisionError {
    GuestProvisionError::Config { field: field.into(), reason: reason.into() }
}

impl ProvisionFileConfig {
    /// Reads a TOML file; `DD_VM_DATA_TOKEN` in the environment overrides the daemon's token.
    pub fn from_file(path: &Path) -> Result<ProvisionFileConfig, GuestProvisionError> {
        let text = std::fs::read_to_string(path)
            .map_err(|source| GuestProvisionError::Read { path: path.into(), source })?;
        let mut cfg: ProvisionFileConfig = toml::from_str(&text)
            .map_err(|e| GuestProvisionError::Parse { path: path.into(), message: e.to_string() })?;
        if let (Some(d), Ok(t)) = (cfg.daemon.as_mut(), std::env::var("DD_VM_DATA_TOKEN")) {
            d.data_token = t;
        }
        cfg.validate()?;
        Ok(cfg)
    }

    pub fn validate(&self) -> Result<(), GuestProvisionError> {
        if self.interval_ms == 0 {
            return Err(bad("interval_ms", "must be at least 1"));
        }
        if self.memory_bytes < PAGE {
            return Err(bad("memory_bytes", "must be at least one page (4096)"));
        }
        if let Some(d) = &self.daemon {
            if d.unix_socket.is_none() && d.tcp.is_none() {
                return Err(bad("daemon.unix_socket", "set it or daemon.tcp"));
            }
            if d.data_token.is_empty() {
                return Err(bad("daemon.data_token", "empty (set it or DD_VM_DATA_TOKEN)"));
            }
        }
        let floors: u64 = self.containers.values().map(|c| c.min_budget_bytes.max(PAGE)).sum();
        if floors > self.memory_bytes {
            return Err(bad("containers.min_budget_bytes", "the floors exceed memory_bytes"));
        }
        if self.containers.values().any(|c| c.memory_base_bytes.is_some()) && self.cgroup_parent.is_none() {
            return Err(bad("cgroup_parent", "memory_base_bytes needs the containers' cgroup parent"));
        }
        self.decision.validate().map_err(|e| bad("decision", &e.to_string()))
    }
}

/// One container in a round's report.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ContainerReport {
    pub name: String,
    pub budget_bytes: u64,
    pub mem_cache_bytes: u64,
    pub ssd_cache_bytes: u64,
    pub spec: Spec,
    /// Set when `memory_base_bytes` is.
    pub memory_limit_bytes: Option<u64>,
    /// Since the last round (the first round: since the mount started).
    pub measured_hit_ratio: f64,
    pub measured_latency_ms: f64,
    pub reads_per_s: f64,
    pub predicted_hit_ratio: f64,
    pub predicted_latency_ms: f64,
    pub target: Option<Target>,
    pub target_met: Option<bool>,
}

/// What a round decided (and, unless a dry run, applied).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RoundReport {
    pub applied: bool,
    pub feasible: bool,
    pub infeasible: Vec<String>,
    pub budget: Budget,
    pub containers: Vec<ContainerReport>,
}

/// The provisioner between rounds: the counters of the last round, to measure since.
pub struct GuestProvisioner {
    cfg: ProvisionFileConfig,
    client: Option<Client>,
    last: BTreeMap<String, (PublishedContainer, Instant)>,
    started: Instant,
    current: BTreeMap<String, Allocation>,
}

fn read_json<T: serde::de::DeserializeOwned>(path: &Path) -> Result<T, GuestProvisionError> {
    let b = std::fs::read(path).map_err(|source| GuestProvisionError::Read { path: path.into(), source })?;
    serde_json::from_slice(&b).map_err(|e| GuestProvisionError::Parse { path: path.into(), message: e.to_string() })
}

fn per(a: u64, b: u64) -> Option<f64> {
    (b > 0).then(|| a as f64 / b as f64)
}

impl GuestProvisioner {
    pub fn new(cfg: ProvisionFileConfig) -> Result<GuestProvisioner, GuestProvisionError> {
        cfg.validate()?;
        let client = match &cfg.daemon {
            Some(d) => Some(match (&d.unix_socket, &d.tcp) {
                (Some(p), _) => Client::connect_unix(p, d.vm, &d.data_token)?,
                (None, Some(a)) => Client::connect_tcp(a.as_str(), d.vm, &d.data_token)?,
                (None, None) => return Err(bad("daemon.unix_socket", "set it or daemon.tcp")),
            }),
            None => None,
        };
        Ok(GuestProvisioner {
            cfg,
            client,
            last: BTreeMap::new(),
            started: Instant::now(),
            current: BTreeMap::new(),
        })
    }

    pub fn config(&self) -> &ProvisionFileConfig {
        &self.cfg
    }

    /// The VM's entitlement in each store, pages (what the daemon reports for its pools).
    fn entitlements(&mut self) -> Result<(u64, u64), GuestProvisionError> {
        let Some(c) = self.client.as_mut() else { return Ok((0, 0)) };
        let ps = c.info().page_size as u64;
        let t = c.get_stats()?.totals;
        Ok((t.mem.entitlement * ps / PAGE, t.ssd.entitlement * ps / PAGE))
    }

    /// One round: decide and, unless `dry_run`, apply. `None` when the mount has published no container.
    pub fn round(&mut self, dry_run: bool) -> Result<Option<RoundReport>, GuestProvisionError> {
        let stats: MountStats = match read_json(&self.cfg.stats_file) {
            Ok(s) => s,
            Err(GuestProvisionError::Read { source, .. }) if source.kind() == std::io::ErrorKind::NotFound => {
                return Ok(None)
            }
            Err(e) => return Err(e),
        };
        let pools: BTreeMap<String, Owned> = read_json(&self.cfg.state_file).unwrap_or_default();
        let now = Instant::now();
        // The containers: every one the mount attributed reads to (not the unattributed ""), in order.
        let cts: Vec<PublishedContainer> = stats.containers.into_iter().filter(|c| !c.name.is_empty()).collect();
        if cts.is_empty() {
            return Ok(None);
        }
        let (ent_mem, ent_ssd) = self.entitlements()?;
        let budget = Budget {
            memory_pages: self.cfg.memory_bytes / PAGE,
            mem_cache_pages: self.cfg.mem_cache_bytes.map_or(ent_mem, |b| b / PAGE),
            ssd_cache_pages: self.cfg.ssd_cache_bytes.map_or(ent_ssd, |b| b / PAGE),
        };
        let mut inputs = Vec::new();
        let mut measured = Vec::new();
        let mut all = ReadTimesSnapshot::default();
        for c in &cts {
            let (prev, since) = self.last.get(&c.name).cloned().unwrap_or_else(|| (zero(&c.name), self.started));
            let d = delta(c, &prev);
            let secs = now.duration_since(since).as_secs_f64().max(1e-3);
            let reads = d.l1_hits + d.pool_hits + d.backing_pages;
            let t = d.times;
            all.read_ns += t.read_ns;
            all.read_pages += t.read_pages;
            all.pool_ns += t.pool_ns;
            all.pool_pages += t.pool_pages;
            all.backing_ns += t.backing_ns;
            all.backing_pages += t.backing_pages;
            let goal = self.cfg.containers.get(&c.name).cloned().unwrap_or(ContainerGoal {
                target: None,
                min_budget_bytes: 0,
                memory_base_bytes: None,
            });
            let pool_used = match (self.client.as_mut(), pools.get(&c.name)) {
                (Some(cl), Some(o)) => cl.pool_stats(o.pool).map(|s| s.counters.mem.used as f64).unwrap_or(0.0),
                _ => 0.0,
            };
            inputs.push(ContainerInput {
                name: c.name.clone(),
                file_curve: c.curve.clone().unwrap_or_else(|| {
                    Curve::new(Unit::Pages, vec![0], vec![1.0]).expect("one point at size 0 with ratio 1")
                }),
                anon_curve: None,
                demand: Demand {
                    concurrency: 1.0,
                    max_ops_s: Some((reads as f64 / secs).max(1.0)),
                    file_reads_per_op: 1.0,
                    anon_accesses_per_op: 0.0,
                    other_ns_per_op: 0.0,
                    file_miss_ns: per(t.backing_ns, t.backing_pages),
                    anon_miss_ns: None,
                },
                target: goal.target,
                min_memory_pages: (goal.min_budget_bytes / PAGE).max(1),
                observed: per(t.read_ns, t.read_pages).map(|ns| Observed {
                    file_pages: c.l1_pages as f64,
                    anon_pages: 0.0,
                    mem_cache_pages: pool_used,
                    ssd_cache_pages: 0.0,
                    ns_per_op: ns,
                }),
            });
            measured.push((
                if reads > 0 { 1.0 - d.backing_pages as f64 / reads as f64 } else { 0.0 },
                per(t.read_ns, t.read_pages).unwrap_or(0.0) / 1e6,
                reads as f64 / secs,
            ));
        }
        let lat = latency_model(&all);
        let current: Option<Vec<Allocation>> = cts.iter().map(|c| self.current.get(&c.name).copied()).collect();
        let plan = provision(&inputs, current.as_deref(), &lat, &budget, &self.cfg.decision)?;
        for c in &cts {
            self.last.insert(c.name.clone(), (c.clone(), now));
        }
        let report = self.report(&plan, &measured, budget, !dry_run);
        if !dry_run {
            self.apply(&plan, &pools)?;
        }
        Ok(Some(report))
    }

    fn report(&self, plan: &Plan, measured: &[(f64, f64, f64)], budget: Budget, applied: bool) -> RoundReport {
        let containers = plan
            .containers
            .iter()
            .zip(measured)
            .map(|(p, &(hit, ms, rate))| ContainerReport {
                name: p.name.clone(),
                budget_bytes: p.allocation.memory_pages * PAGE,
                mem_cache_bytes: p.allocation.mem_cache_pages * PAGE,
                ssd_cache_bytes: p.allocation.ssd_cache_pages * PAGE,
                spec: p.spec(),
                memory_limit_bytes: self
                    .cfg
                    .containers
                    .get(&p.name)
                    .and_then(|g| g.memory_base_bytes)
                    .map(|b| b + p.allocation.memory_pages * PAGE),
                measured_hit_ratio: (hit * 1e4).round() / 1e4,
                measured_latency_ms: (ms * 1e4).round() / 1e4,
                reads_per_s: rate.round(),
                predicted_hit_ratio: (p.predicted.hit_ratio * 1e4).round() / 1e4,
                predicted_latency_ms: (p.predicted.ns_per_op / 1e2).round() / 1e4,
                target: p.target,
                target_met: p.target_met,
            })
            .collect();
        RoundReport { applied, feasible: plan.feasible, infeasible: plan.infeasible.clone(), budget, containers }
    }

    fn apply(&mut self, plan: &Plan, pools: &BTreeMap<String, Owned>) -> Result<(), GuestProvisionError> {
        let budgets: BTreeMap<&str, u64> =
            plan.containers.iter().map(|p| (p.name.as_str(), p.allocation.memory_pages * PAGE)).collect();
        let path = &self.cfg.budgets_file;
        let tmp = path.with_extension("tmp");
        let body = serde_json::to_vec_pretty(&budgets).expect("plain data serialises");
        std::fs::write(&tmp, body)
            .and_then(|_| std::fs::rename(&tmp, path))
            .map_err(|source| GuestProvisionError::Write { path: path.clone(), source })?;
        for p in &plan.containers {
            if let (Some(cl), Some(o)) = (self.client.as_mut(), pools.get(&p.name)) {
                let spec = p.spec();
                // A pool the watcher just destroyed is not an error of ours: the next round sees it gone.
                if let Err(e) = cl.set_cg_weight(PoolId(o.pool.0), spec) {
                    match e.status() {
                        Some(_) => tracing::warn!("setting the spec of {}'s pool: {e}", p.name),
                        None => return Err(e.into()),
                    }
                }
            }
            let base = self.cfg.containers.get(&p.name).and_then(|g| g.memory_base_bytes);
            if let (Some(base), Some(parent)) = (base, &self.cfg.cgroup_parent) {
                set_memory_limit(&parent.join(&p.name), base + p.allocation.memory_pages * PAGE)?;
            }
            self.current.insert(p.name.clone(), p.allocation);
        }
        Ok(())
    }
}

/// A container's counters before anything was counted.
fn zero(name: &str) -> PublishedContainer {
    PublishedContainer {
        name: name.into(),
        pool: None,
        l1_budget_pages: 0,
        l1_pages: 0,
        l1_hits: 0,
        pool_hits: 0,
        backing_pages: 0,
        times: ReadTimesSnapshot::default(),
        curve: None,
        footprint_pages: 0,
    }
}

/// Counters of `now` since `then` (a restarted mount's smaller counters count from zero).
fn delta(now: &PublishedContainer, then: &PublishedContainer) -> PublishedContainer {
    let d = |a: u64, b: u64| if a >= b { a - b } else { a };
    let (t, u) = (&now.times, &then.times);
    PublishedContainer {
        l1_hits: d(now.l1_hits, then.l1_hits),
        pool_hits: d(now.pool_hits, then.pool_hits),
        backing_pages: d(now.backing_pages, then.backing_pages),
        times: ReadTimesSnapshot {
            read_ns: d(t.read_ns, u.read_ns),
            read_pages: d(t.read_pages, u.read_pages),
            pool_ns: d(t.pool_ns, u.pool_ns),
            pool_pages: d(t.pool_pages, u.pool_pages),
            backing_ns: d(t.backing_ns, u.backing_ns),
            backing_pages: d(t.backing_pages, u.backing_pages),
        },
        ..now.clone()
    }
}

/// The cost of a page read at each level, from what every container's reads measured since the last
/// round; a level nothing reached gets a conservative default.
fn latency_model(t: &ReadTimesSnapshot) -> LatencyModel {
    let pool = per(t.pool_ns, t.pool_pages).unwrap_or(50_000.0);
    let backing = per(t.backing_ns, t.backing_pages).unwrap_or(1_000_000.0);
    // What a read took besides its pool gets and backing reads, per page: the first level's cost.
    let first = per(t.read_ns.saturating_sub(t.pool_ns + t.backing_ns), t.read_pages).unwrap_or(2_000.0);
    LatencyModel {
        memory_hit_ns: first,
        mem_cache_hit_ns: first + pool,
        ssd_cache_hit_ns: first + pool,
        file_miss_ns: first + pool + backing,
        anon_miss_ns: 0.0,
    }
}

/// Writes a cgroup's memory limit (`memory.max` on v2, `memory.limit_in_bytes` on v1).
pub fn set_memory_limit(dir: &Path, bytes: u64) -> Result<(), GuestProvisionError> {
    use dd_memctl::cgroup::{CgroupIo, RealIo, Version};
    let file = match Version::detect(&RealIo, dir) {
        Some(Version::V2) => "memory.max",
        _ => "memory.limit_in_bytes",
    };
    let p = dir.join(file);
    RealIo.write(&p, &bytes.to_string()).map_err(|source| GuestProvisionError::Write { path: p, source })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_parses_and_validate_names_the_field() {
        let cfg: ProvisionFileConfig = toml::from_str(
            r#"
            stats_file = "s.json"
            budgets_file = "b.json"
            memory_bytes = 16777216
            [containers.web]
            target = { kind = "hit_ratio", ratio = 0.9 }
            [containers.db]
            target = { kind = "mean_latency", ms = 0.2 }
            min_budget_bytes = 1048576
            "#,
        )
        .unwrap();
        cfg.validate().unwrap();
        assert_eq!(cfg.decision.objective, Objective::Hits);
        assert_eq!(cfg.interval_ms, 2000);
        let mut c = cfg.clone();
        c.containers.get_mut("db").unwrap().memory_base_bytes = Some(1 << 20);
        assert!(c.validate().unwrap_err().to_string().contains("cgroup_parent"));
        let mut c = cfg;
        c.containers.get_mut("db").unwrap().min_budget_bytes = 1 << 30;
        assert!(c.validate().unwrap_err().to_string().contains("min_budget_bytes"));
    }

    #[test]
    fn latency_model_charges_each_level_what_it_took() {
        let t = ReadTimesSnapshot {
            read_ns: 1_000_000,
            read_pages: 100,
            pool_ns: 200_000,
            pool_pages: 20,
            backing_ns: 500_000,
            backing_pages: 5,
        };
        let m = latency_model(&t);
        assert_eq!(m.memory_hit_ns, 3_000.0);
        assert_eq!(m.mem_cache_hit_ns, 13_000.0);
        assert_eq!(m.file_miss_ns, 113_000.0);
    }
}
