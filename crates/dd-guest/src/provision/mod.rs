//! `doubledecker guest provision`: the VM-level provisioner on a real guest (SPEC section 10b).
//!
//! Each round reads what the FUSE mount published (`[sampling] stats_file`: each container's sampled
//! miss-ratio curve of its page reads, its first-level cache, counters and read times), the watcher's
//! state file (container -> pool) and, with a daemon, the VM's entitlements in its stores; asks
//! `dd_provision::provision` for each container's first-level budget and pool weights so that its target
//! (a hit ratio, or a mean read latency through the mount) is met; and applies the plan: the budgets to
//! the mount's `budgets_file`, the pool specs to the daemon (SET_CG_WEIGHT), and, for a container that
//! has `memory_base_bytes`, its cgroup's memory limit (base plus first-level budget: the mount's cache is
//! the container's page cache). The decision is the closed loop's (`dd_provision::Controller`): each
//! round's measurement corrects the next round's predictions, a measured allocation is not given up for
//! a worse prediction, and a target measured missed for `report_after` rounds is reported as missed (one
//! nothing within the budget meets, as infeasible), never silently; a container whose curve the mount has
//! not published yet holds every change (the loop is learning). Run as a loop, what runs before its
//! first plan (the mount's first levels, the pools' shares of the entitlements by weight) is told to it
//! as the allocation in force: its first measurement is recorded as that allocation's, which the loop
//! can come back to, and its first plan moves in bounded steps from it as every later one does (a
//! single round, `--once` or `--dry-run`, plans from the model alone).
//!
//! The model here: an operation is one page read through the mount, the first level is the memory the
//! plan shares out (`memory_bytes`), the pool the cache; the cost of a read at each level is measured by
//! the mount (time in pool gets and backing reads, per page; the rest of a read's time is the first
//! level's). Rates are counted on the mount's clock (its uptime in the stats file), so a provisioner
//! started late measures what the mount saw, not the mount's history squeezed into its first moments.
//! Reads arrive at the rate measured since the last round (open loop), except for a container with a
//! throughput target, whose readers are taken as a closed loop (Little's law gives the reads in flight).
//! Once targets are met, the objective is the total of pages per second served without the backing store.
//!
//! Each applied round's [`RoundReport`] is printed by the CLI and, with `[admin]`, sent to the daemon's
//! admin API (`PUT /v1/vm/provisioner`, [`GuestProvisioner::publish`]) where `/ui/` shows it.
//!
//! Invariants: nothing is applied (or reported) in a dry run; a round that finds no published container
//! changes nothing; the budgets file and cgroup limits are written whole (atomic rename, one write per
//! value); a pool is respecified only through a connection to the daemon instance that made it.

mod config;

pub use config::{AdminReportConfig, ContainerGoal, GuestProvisionError, ProvisionFileConfig, PAGE};

use crate::mount_stats::{ContainerStats, MountStats, PublishedContainer, ReadTimesSnapshot};
use crate::watch::StateFile;
use dd_client::{BackoffPolicy, ClientError, PoolRef, Session};
pub use dd_provision::report::{ContainerReport, RoundReport};
use dd_provision::{
    Allocation, Budget, ContainerInput, Controller, Curve, Decision, Demand, LatencyModel, Measured,
    Observed, Plan, Target, Unit,
};
use dd_types::StoreKind;
use std::collections::BTreeMap;
use std::path::Path;

/// The provisioner between rounds: the counters of the last round, to measure since, and the closed
/// loop (what each allocation measured).
pub struct GuestProvisioner {
    cfg: ProvisionFileConfig,
    session: Option<Session>,
    /// Each container's counters at the last round, and the mount's uptime then (ms).
    last: BTreeMap<String, (PublishedContainer, u64)>,
    ctl: Controller,
    rounds: u64,
    /// The admin API the rounds are reported to (`[admin]`).
    admin: Option<dd_client::admin::AdminClient>,
    /// Rounds follow one another ([`GuestProvisioner::in_a_loop`]): the loop is told what runs before
    /// its first plan. A single round (`--once`, `--dry-run`) plans from the model instead.
    in_a_loop: bool,
}

/// Bound on one report to the admin API (a daemon away must not hold up the rounds for long).
const REPORT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);

fn read_json<T: serde::de::DeserializeOwned>(path: &Path) -> Result<T, GuestProvisionError> {
    let b = std::fs::read(path).map_err(|source| GuestProvisionError::Read { path: path.into(), source })?;
    serde_json::from_slice(&b)
        .map_err(|e| GuestProvisionError::Parse { path: path.into(), message: e.to_string() })
}

fn per(a: u64, b: u64) -> Option<f64> {
    (b > 0).then(|| a as f64 / b as f64)
}

fn round4(x: f64) -> f64 {
    (x * 1e4).round() / 1e4
}

/// A container's measurements since the last round.
struct Counted {
    hit_ratio: f64,
    latency_ms: f64,
    reads_per_s: f64,
    reads: u64,
}

impl GuestProvisioner {
    /// A provisioner; it connects to the daemon (with back-off, healing after restarts) on first use.
    pub fn new(cfg: ProvisionFileConfig) -> Result<GuestProvisioner, GuestProvisionError> {
        cfg.validate()?;
        let cfg_admin = match cfg.admin.as_ref() {
            None => None,
            Some(a) => Some(match &a.tls_ca_file {
                Some(ca) => dd_client::admin::AdminClient::with_tls(&a.url, REPORT_TIMEOUT, ca)?,
                None => dd_client::admin::AdminClient::with_timeout(&a.url, REPORT_TIMEOUT),
            }),
        };
        let session = cfg
            .daemon
            .as_ref()
            .map(|d| Session::new(d.endpoint(), BackoffPolicy::default(), "guest provision"));
        Ok(GuestProvisioner {
            cfg,
            session,
            last: BTreeMap::new(),
            ctl: Controller::new(),
            rounds: 0,
            admin: cfg_admin,
            in_a_loop: false,
        })
    }

    /// Rounds will follow one another: before the first plan, and after a dry run, what runs (the
    /// mount's first levels, the pools' shares by weight) is the allocation in force, whose measurement
    /// the loop records and from which it plans in bounded steps.
    pub fn in_a_loop(mut self) -> Self {
        self.in_a_loop = true;
        self
    }

    pub fn config(&self) -> &ProvisionFileConfig {
        &self.cfg
    }

    /// Sends a round's report to the daemon's admin API (`PUT /v1/vm/provisioner`, the VM's admin
    /// token), if `[admin]` is configured; `/ui/` shows it.
    pub fn publish(&self, report: &RoundReport) -> Result<(), GuestProvisionError> {
        let (Some(client), Some(a)) = (&self.admin, &self.cfg.admin) else { return Ok(()) };
        let body = serde_json::to_value(report).expect("plain data serialises");
        client.call::<serde_json::Value>("PUT", "/v1/vm/provisioner", &a.token, Some(&body))?;
        Ok(())
    }

    /// The VM's entitlement in each store, pages (what the daemon reports for its pools).
    fn entitlements(&mut self) -> Result<(u64, u64), GuestProvisionError> {
        let Some(s) = self.session.as_mut() else { return Ok((0, 0)) };
        let (ps, t) = s.call(|c| Ok((c.info().page_size as u64, c.get_stats()?.totals)))?;
        Ok((t.mem.entitlement * ps / PAGE, t.ssd.entitlement * ps / PAGE))
    }

    /// The watcher's pools by container name, bound to the daemon instance that made them.
    fn pools(&self) -> BTreeMap<String, PoolRef> {
        let Some(st) = StateFile::read(&self.cfg.state_file) else { return BTreeMap::new() };
        st.pools.into_iter().map(|(n, o)| (n, PoolRef { id: o.pool, instance: st.instance })).collect()
    }

    /// One round: decide and, unless `dry_run`, apply. `None` when the mount has published no container.
    pub fn round(&mut self, dry_run: bool) -> Result<Option<RoundReport>, GuestProvisionError> {
        let stats: MountStats = match read_json(&self.cfg.stats_file) {
            Ok(s) => s,
            Err(GuestProvisionError::Read { source, .. })
                if source.kind() == std::io::ErrorKind::NotFound =>
            {
                return Ok(None)
            }
            Err(e) => return Err(e),
        };
        let pools = self.pools();
        let now = stats.uptime_ms;
        // The containers: every one the mount attributed reads to (not the unattributed ""), in order.
        let cts: Vec<PublishedContainer> =
            stats.containers.into_iter().filter(|c| !c.counters.name.is_empty()).collect();
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
        // Each container's pool weights now (memory store, SSD store), for the allocation in force.
        let mut weights: Vec<(u32, u32)> = Vec::new();
        let mut loop_measured = Vec::new();
        let mut all = ReadTimesSnapshot::default();
        for c in &cts {
            let (prev, since) =
                self.last.get(&c.counters.name).cloned().unwrap_or_else(|| (zero(&c.counters.name), 0));
            let d = delta(c, &prev);
            // On the mount's clock: its counters started with it (a mount started again counts from 0).
            let secs = (if now >= since { now - since } else { now }) as f64 / 1e3;
            let secs = secs.max(1e-3);
            let reads = d.counters.l1_hits + d.counters.pool_hits + d.counters.backing_pages;
            let t = d.times;
            all.read_ns += t.read_ns;
            all.read_pages += t.read_pages;
            all.pool_ns += t.pool_ns;
            all.pool_pages += t.pool_pages;
            all.backing_ns += t.backing_ns;
            all.backing_pages += t.backing_pages;
            let goal = self.cfg.containers.get(&c.counters.name).cloned().unwrap_or(ContainerGoal {
                target: None,
                min_budget_bytes: 0,
                memory_base_bytes: None,
            });
            let stats = match (self.session.as_mut(), pools.get(&c.counters.name)) {
                (Some(s), Some(&p)) => s.on_pool(p, |cl, id| cl.pool_stats(id)).ok(),
                _ => None,
            };
            let pool_used = stats.as_ref().map_or(0.0, |s| s.counters.mem.used as f64);
            weights.push(
                stats.map_or((0, 0), |s| (s.spec.weight(StoreKind::Mem), s.spec.weight(StoreKind::Ssd))),
            );
            let ns_per_read = per(t.read_ns, t.read_pages);
            let rate = reads as f64 / secs;
            // Readers with a throughput target are a closed loop (its rate follows its latency; Little's
            // law gives the reads in flight); the others an open one (they read at the rate they did).
            let closed = matches!(goal.target, Some(Target::Throughput { .. }));
            let concurrency = if closed { (rate * ns_per_read.unwrap_or(0.0) / 1e9).max(1.0) } else { 1.0 };
            inputs.push(ContainerInput {
                name: c.counters.name.clone(),
                file_curve: c.curve.clone().unwrap_or_else(|| {
                    Curve::new(Unit::Pages, vec![0], vec![1.0]).expect("one point at size 0 with ratio 1")
                }),
                anon_curve: None,
                demand: Demand {
                    concurrency,
                    max_ops_s: (!closed).then_some(rate.max(1.0)),
                    file_reads_per_op: 1.0,
                    anon_accesses_per_op: 0.0,
                    other_ns_per_op: 0.0,
                    file_miss_ns: per(t.backing_ns, t.backing_pages),
                    anon_miss_ns: None,
                },
                target: goal.target,
                min_memory_pages: (goal.min_budget_bytes / PAGE).max(1),
                observed: ns_per_read.map(|ns| Observed {
                    file_pages: c.counters.l1_pages as f64,
                    anon_pages: 0.0,
                    mem_cache_pages: pool_used,
                    ssd_cache_pages: 0.0,
                    ns_per_op: ns,
                }),
            });
            let m = Counted {
                hit_ratio: if reads > 0 { 1.0 - d.counters.backing_pages as f64 / reads as f64 } else { 0.0 },
                latency_ms: ns_per_read.unwrap_or(0.0) / 1e6,
                reads_per_s: rate,
                reads,
            };
            // No curve yet, or no read since the last round: nothing measured.
            loop_measured.push((c.curve.is_some() && reads > 0).then_some(Measured {
                ops_s: m.reads_per_s,
                latency_ms: m.latency_ms,
                hit_ratio: m.hit_ratio,
            }));
            measured.push(m);
        }
        let lat = latency_model(&all);
        if self.in_a_loop {
            // What runs now, unless a plan of this loop does (its first round): the mount's first levels
            // and the pools' shares of the entitlements by weight. The loop records the next measurement
            // as this allocation's, and plans its first change in bounded steps from it.
            let (mem_w, ssd_w) =
                weights.iter().fold((0u64, 0u64), |(m, s), w| (m + w.0 as u64, s + w.1 as u64));
            let share = |total: u64, w: u32, all: u64| (total * w as u64).checked_div(all).unwrap_or(0);
            let now_alloc: Vec<Allocation> = cts
                .iter()
                .zip(&weights)
                .map(|(c, w)| Allocation {
                    memory_pages: c.counters.l1_budget_pages as u64,
                    mem_cache_pages: share(budget.mem_cache_pages, w.0, mem_w),
                    ssd_cache_pages: share(budget.ssd_cache_pages, w.1, ssd_w),
                })
                .collect();
            let names: Vec<String> = cts.iter().map(|c| c.counters.name.clone()).collect();
            // (The mount's first levels are its defaults, no one's choice: measured after one interval.)
            self.ctl.in_force(&names, &now_alloc, false);
        }
        let decision = self.ctl.decide(&inputs, &loop_measured, &lat, &budget, &self.cfg.decision)?;
        for c in &cts {
            self.last.insert(c.counters.name.clone(), (c.clone(), now));
        }
        let Some(plan) = &decision.plan else { return Ok(None) };
        self.rounds += 1;
        let report = self.report(plan, &decision, &cts, &measured, &pools, budget, !dry_run);
        if dry_run {
            self.ctl.not_applied();
        } else {
            self.apply(plan, &pools)?;
        }
        Ok(Some(report))
    }

    #[allow(clippy::too_many_arguments)]
    fn report(
        &self,
        plan: &Plan,
        decision: &Decision,
        cts: &[PublishedContainer],
        measured: &[Counted],
        pools: &BTreeMap<String, PoolRef>,
        budget: Budget,
        applied: bool,
    ) -> RoundReport {
        let containers = plan
            .containers
            .iter()
            .zip(measured)
            .zip(cts)
            .zip(&decision.containers)
            .map(|(((p, m), c), s)| ContainerReport {
                name: p.name.clone(),
                pool: pools.get(&p.name).map(|r| r.id.0),
                budget_bytes: p.allocation.memory_pages * PAGE,
                mem_cache_bytes: p.allocation.mem_cache_pages * PAGE,
                ssd_cache_bytes: p.allocation.ssd_cache_pages * PAGE,
                spec: p.spec(),
                memory_limit_bytes: self.memory_limit(&p.name, p.allocation),
                measured_hit_ratio: round4(m.hit_ratio),
                measured_latency_ms: round4(m.latency_ms),
                reads_per_s: m.reads_per_s.round(),
                predicted_hit_ratio: round4(p.predicted.hit_ratio),
                predicted_latency_ms: round4(p.predicted.ns_per_op / 1e6),
                predicted_reads_per_s: p.predicted.ops_s.round(),
                target: p.target,
                target_met: p.target_met,
                measured_target_met: p
                    .target
                    .filter(|_| m.reads > 0)
                    .map(|t| t.met_by_measured(m.reads_per_s, m.latency_ms, m.hit_ratio)),
                footprint_bytes: c.footprint_pages * PAGE,
                state: s.state,
                missed_intervals: s.missed_intervals,
                correction: round4(s.correction),
            })
            .collect();
        RoundReport {
            round: self.rounds,
            applied,
            feasible: plan.feasible,
            infeasible: plan.infeasible.clone(),
            missed: decision.missed(),
            source: decision.source,
            kept_current: plan.kept_current,
            memory_bytes: budget.memory_pages * PAGE,
            mem_cache_bytes: budget.mem_cache_pages * PAGE,
            ssd_cache_bytes: budget.ssd_cache_pages * PAGE,
            containers,
        }
    }

    /// The cgroup memory limit of a container with `memory_base_bytes`, for an allocation.
    fn memory_limit(&self, name: &str, a: Allocation) -> Option<u64> {
        let base = self.cfg.containers.get(name).and_then(|g| g.memory_base_bytes)?;
        Some(base + a.memory_pages * PAGE)
    }

    fn apply(&mut self, plan: &Plan, pools: &BTreeMap<String, PoolRef>) -> Result<(), GuestProvisionError> {
        let budgets: BTreeMap<&str, u64> =
            plan.containers.iter().map(|p| (p.name.as_str(), p.allocation.memory_pages * PAGE)).collect();
        let path = &self.cfg.budgets_file;
        let tmp = path.with_extension("tmp");
        let mut body = serde_json::to_vec_pretty(&budgets).expect("plain data serialises");
        body.push(b'\n');
        std::fs::write(&tmp, body)
            .and_then(|_| std::fs::rename(&tmp, path))
            .map_err(|source| GuestProvisionError::Write { path: path.clone(), source })?;
        for p in &plan.containers {
            if let (Some(s), Some(&pool)) = (self.session.as_mut(), pools.get(&p.name)) {
                let spec = p.spec();
                match s.on_pool(pool, |c, id| c.set_cg_weight(id, spec)) {
                    Ok(()) => {}
                    // The watcher just destroyed the pool, or the daemon restarted and the watcher has
                    // not published the new pools yet: the next round sees them.
                    Err(ClientError::PoolLost { .. }) => {}
                    Err(e) if e.status().is_some() => {
                        tracing::warn!("setting the spec of {}'s pool: {e}", p.name)
                    }
                    Err(e) => return Err(e.into()),
                }
            }
            if let (Some(limit), Some(parent)) =
                (self.memory_limit(&p.name, p.allocation), &self.cfg.cgroup_parent)
            {
                set_memory_limit(&parent.join(&p.name), limit)?;
            }
        }
        Ok(())
    }
}

/// A container's counters before anything was counted.
fn zero(name: &str) -> PublishedContainer {
    PublishedContainer {
        counters: ContainerStats { name: name.into(), ..ContainerStats::default() },
        times: ReadTimesSnapshot::default(),
        curve: None,
        footprint_pages: 0,
    }
}

/// Counters of `now` since `then` (a restarted mount's smaller counters count from zero).
fn delta(now: &PublishedContainer, then: &PublishedContainer) -> PublishedContainer {
    let d = |a: u64, b: u64| if a >= b { a - b } else { a };
    let (c, p) = (&now.counters, &then.counters);
    let (t, u) = (&now.times, &then.times);
    PublishedContainer {
        counters: ContainerStats {
            l1_hits: d(c.l1_hits, p.l1_hits),
            pool_hits: d(c.pool_hits, p.pool_hits),
            backing_pages: d(c.backing_pages, p.backing_pages),
            ..c.clone()
        },
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

    /// A mount's stats file with one container that read `reads` pages, a tenth of them from the backing
    /// directory, by `uptime_ms` of the mount's life.
    fn stats(reads: u64, uptime_ms: u64) -> MountStats {
        let curve = Curve::new(Unit::Pages, vec![0, 100, 200], vec![1.0, 0.5, 0.1]).unwrap();
        MountStats {
            page_size: 4096,
            uptime_ms,
            containers: vec![PublishedContainer {
                counters: ContainerStats {
                    name: "web".into(),
                    l1_budget_pages: 16,
                    l1_pages: 16,
                    l1_hits: reads - reads / 10,
                    backing_pages: reads / 10,
                    ..ContainerStats::default()
                },
                times: ReadTimesSnapshot {
                    read_ns: reads * 10_000,
                    read_pages: reads,
                    backing_ns: reads / 10 * 50_000,
                    backing_pages: reads / 10,
                    ..Default::default()
                },
                curve: Some(curve),
                footprint_pages: 200,
            }],
        }
    }

    /// Regression: a provisioner started long after the mount charged the mount's whole history of reads
    /// to its own first moments (its first round reported a million reads per second for a hundred),
    /// which also skewed the plan's open-loop rates. Rates now run on the mount's clock.
    #[test]
    fn regression_first_round_rates_count_from_the_mounts_start_not_the_provisioners() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("stats.json");
        let cfg: ProvisionFileConfig = toml::from_str(&format!(
            "stats_file = {:?}\nbudgets_file = {:?}\nstate_file = {:?}\nmemory_bytes = 1048576\n",
            file.display().to_string(),
            dir.path().join("budgets.json").display().to_string(),
            dir.path().join("none.json").display().to_string(),
        ))
        .unwrap();
        let mut p = GuestProvisioner::new(cfg).unwrap();
        // The mount has run 10 s and served 1,000 reads: 100 per second, whenever the provisioner starts.
        std::fs::write(&file, serde_json::to_vec(&stats(1000, 10_000)).unwrap()).unwrap();
        let r = p.round(true).unwrap().unwrap();
        assert_eq!(r.containers[0].reads_per_s, 100.0, "{r:?}");
        assert_eq!(r.containers[0].measured_hit_ratio, 0.9);
        // The next publication, 10 s of the mount's clock later, 3,000 reads more: 300 per second.
        std::fs::write(&file, serde_json::to_vec(&stats(4000, 20_000)).unwrap()).unwrap();
        let r = p.round(true).unwrap().unwrap();
        assert_eq!(r.containers[0].reads_per_s, 300.0, "{r:?}");
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
