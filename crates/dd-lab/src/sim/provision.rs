//! The VM-level provisioner in the event loop (SPEC section 10b): at `[vms.provision]`'s interval, the
//! VM's running containers are described to `dd_provision::provision` (their curves from
//! [`crate::streams`], their demand and residency measured since the last decision, their targets, the
//! latency model of `[timing]` and the disk, the VM's memory and cache entitlements), and its plan is
//! applied through the same calls as the timeline: memcg hard limits (reclaiming at once down to a
//! lowered limit) and pool specs (`set_spec`).
//!
//! Owns [`VmProv`] (one VM's settings and the counters at its last decision); what the run reports
//! of it, [`Decision`] and [`CurveSnapshot`], is `crate::record`'s. The decision is the closed loop's
//! (`dd_provision::Controller`): each container's throughput, latency and hit ratio since the last
//! decision are its measurement of the allocation in force, and the scenario's initial settings (its
//! memory limits, or usage where it has none, and the pools' occupancy) are the first allocation
//! measured: after its transient, like a change of the loop's, when some member has a limit (an
//! allocation someone chose), after one interval when none has. From the start of the run, before any
//! decision, a provisioned VM's guest spares anonymous memory in VM-wide reclaim while page cache is
//! left (`VmProvision::spare_anon`, `crate::model::guest`'s module doc). Invariants: a decision changes nothing
//! of a container that is not running, nor anything at all while a running container has not run since
//! the last decision (the loop is learning); a VM out of the memory store at its first decision while
//! another VM uses it plans with no memory cache from then on (`VmProvision::keep_out_of_mem_store`).

use super::{Sim, NS};
use crate::error::LabError;
use crate::model::guest::{ANON_ACTIVE, ANON_INACTIVE, FILE_ACTIVE, FILE_INACTIVE};
use crate::record::{CurveSnapshot, DecidedContainer, Decision};
use crate::scenario::provision::VmProvision;
use crate::scenario::{mib_pages, Scenario};
use crate::sim::backend::SecondChance;
use crate::sim::streams::StreamCounters;
use dd_engine::StoreKind;
use dd_provision::{
    price_swap_ins_at_shared_disk, Allocation, Budget, ContainerInput, Controller, Curve, Demand,
    LatencyModel, Measured, Observed, Target,
};
use std::collections::BTreeMap;

/// A container holding less than this fraction of its memory limit is still filling it (its page cache
/// grows until the limit reclaims): what it has evicted, and so what its pool holds, is not yet its
/// allocation's measure.
const STILL_FILLING: f64 = 0.97;

/// Points read from each curve for a decision (evenly spaced up to the VM's memory and caches).
const CURVE_POINTS: usize = 128;

/// A container's counters at the last decision.
#[derive(Debug, Clone, Copy, Default)]
struct Snap {
    ops: u64,
    lat_ns: u64,
    streams: StreamCounters,
    /// When it was taken (emulated ns).
    t_ns: u64,
}

/// One VM's provisioner.
#[derive(Debug)]
pub(super) struct VmProv {
    cfg: VmProvision,
    /// Per container index: its target and floor (pages).
    targets: BTreeMap<usize, (Option<Target>, u64)>,
    last: BTreeMap<usize, Snap>,
    /// The closed loop: what each allocation measured, the model's corrections, the misses.
    ctl: Controller,
    /// Whether the VM stays out of the memory store (`VmProvision::keep_out_of_mem_store`); set at the
    /// first decision.
    mem_store_out: Option<bool>,
}

impl VmProv {
    /// The provisioner of VM `vm` of a (scaled, variant-applied) scenario, if it has one and it is on;
    /// `first_ct` is the index of the VM's first container in the emulator.
    pub(super) fn new(sc: &Scenario, vm: usize, first_ct: usize) -> Option<VmProv> {
        let v = &sc.vms[vm];
        let cfg = v.provision.clone().filter(|p| p.enabled)?;
        let targets = v
            .containers
            .iter()
            .enumerate()
            .map(|(i, c)| {
                let floor = cfg.floor_mib.get(&c.name).map_or(0, |m| mib_pages(*m));
                (first_ct + i, (c.target, floor))
            })
            .collect();
        Some(VmProv { cfg, targets, last: BTreeMap::new(), ctl: Controller::new(), mem_store_out: None })
    }

    /// Decision times (ns) up to `end`.
    pub(super) fn times(&self, end: u64) -> Vec<u64> {
        let (start, step) = (ns(self.cfg.start_s), ns(self.cfg.interval_s).max(1));
        (0..).map(|i| start + i * step).take_while(|&t| t <= end).collect()
    }

    pub(super) fn max_samples(&self) -> usize {
        self.cfg.max_samples as usize
    }

    /// Whether the VM's reclaim spares anonymous memory (`VmProvision::spare_anon`).
    pub(super) fn spare_anon(&self) -> bool {
        self.cfg.spare_anon
    }
}

fn ns(s: f64) -> u64 {
    (s * NS).round() as u64
}

fn all_misses() -> Curve {
    Curve::new(dd_provision::Unit::Pages, vec![0], vec![1.0]).expect("one point at size 0 with ratio 1")
}

fn mib(pages: u64) -> f64 {
    (pages as f64 / 256.0 * 1000.0).round() / 1000.0
}

impl<B: SecondChance> Sim<B> {
    /// The VM's entitlement in `store` if it uses the store: its weight's share among the VMs whose
    /// running containers use it.
    fn vm_budget(&self, v: usize, store: StoreKind) -> u64 {
        let s = store.idx();
        let w = |vm: usize| if s == 0 { self.vm_weights[vm].0 } else { self.vm_weights[vm].1 } as u64;
        let uses = |vm: usize| vm == v || self.vm_uses(vm, store);
        let sum: u64 = (0..self.vm_cts.len()).filter(|&vm| uses(vm)).map(w).sum();
        if sum == 0 {
            0
        } else {
            (self.capacity[s] as u128 * w(v) as u128 / sum as u128) as u64
        }
    }

    /// Whether a running container of VM `vm` uses `store`.
    fn vm_uses(&self, vm: usize, store: StoreKind) -> bool {
        self.vm_cts[vm].iter().any(|&c| self.cts[c].running && self.cts[c].spec.uses(store))
    }

    /// Runs VM `v`'s provisioner now.
    pub(super) fn provision(&mut self, v: usize) -> Result<(), LabError> {
        let Some(mut st) = self.prov[v].take() else { return Ok(()) };
        let r = self.decide(v, &mut st);
        self.prov[v] = Some(st);
        r
    }

    fn decide(&mut self, v: usize, st: &mut VmProv) -> Result<(), LabError> {
        let members: Vec<usize> =
            self.vm_cts[v].iter().copied().filter(|&c| self.cts[c].enabled && self.cts[c].running).collect();
        if members.is_empty() {
            return Ok(());
        }
        let t = self.timing;
        let vmid = v as u32 + 1;
        let disk_page = (self.disk.access + self.disk.xfer) as f64;
        let lat = LatencyModel {
            memory_hit_ns: t.page_cache_hit_ns as f64,
            // A failed get, the copy in, and the put of the page the guest evicts to make room.
            mem_cache_hit_ns: (2 * t.cache_op_ns + t.mem_store_hit_ns + t.page_cache_hit_ns) as f64,
            ssd_cache_hit_ns: (2 * t.cache_op_ns + t.ssd_store_hit_ns + t.page_cache_hit_ns) as f64,
            file_miss_ns: (2 * t.cache_op_ns + t.page_cache_hit_ns) as f64 + disk_page,
            anon_miss_ns: t.page_cache_hit_ns as f64 + disk_page,
        };
        let mem = StoreKind::Mem;
        let out = match st.mem_store_out {
            Some(out) => out,
            None => {
                let kept_out = st.cfg.keep_out_of_mem_store
                    && !self.vm_uses(v, mem)
                    && (0..self.vm_cts.len()).any(|u| u != v && self.vm_uses(u, mem));
                *st.mem_store_out.insert(kept_out)
            }
        };
        let g = &self.guests[v];
        let mut budget = Budget {
            memory_pages: g.limit,
            // (A plan with no memory cache gives every pool memory weight 0: the VM stays out.)
            mem_cache_pages: if out { 0 } else { self.vm_budget(v, mem) },
            ssd_cache_pages: self.vm_budget(v, StoreKind::Ssd),
        };
        if !st.cfg.memory {
            // Memory stays where the guest put it: the plan may only move cache.
            budget.memory_pages = members.iter().map(|&c| g.cgs[self.cts[c].cg].usage).sum();
        }
        let max = budget.memory_pages + budget.mem_cache_pages + budget.ssd_cache_pages;
        let sizes = Curve::even_sizes(max.max(1), CURVE_POINTS);
        let mut inputs = Vec::with_capacity(members.len());
        let mut in_force = Vec::with_capacity(members.len());
        // Whether a member has a limit of its own (the scenario's, a timeline's): an allocation someone
        // chose.
        let mut chosen = false;
        let mut measured = Vec::with_capacity(members.len());
        let mut loop_measured = Vec::with_capacity(members.len());
        let mut shown = Vec::with_capacity(members.len());
        for &c in &members {
            let (ops, lat_ns) = (self.cts[c].tot.ops, self.cts[c].tot.lat_ns);
            let streams =
                self.streams[c].as_ref().ok_or_else(|| LabError::invalid("provision", "no streams"))?;
            let now = Snap { ops, lat_ns, streams: streams.counters, t_ns: self.now };
            let prev = st.last.insert(c, now);
            // What follows is counted since the last decision, or since the container started.
            let since = prev.map_or(self.cts[c].started_at.unwrap_or(0), |p| p.t_ns);
            let prev = prev.unwrap_or_default();
            // Since the last decision; the whole run so far if nothing ran in between.
            let d = if now.ops > prev.ops {
                Snap {
                    ops: now.ops - prev.ops,
                    lat_ns: now.lat_ns - prev.lat_ns,
                    streams: now.streams.since(&prev.streams),
                    t_ns: since,
                }
            } else {
                now
            };
            let n = d.ops.max(1) as f64;
            let sc = &d.streams;
            let per = |a: u64, b: u64| (b > 0).then(|| a as f64 / b as f64);
            let ct = &self.cts[c];
            let cg = &self.guests[v].cgs[ct.cg];
            let pc = match ct.pool {
                Some(p) => self.backend.pool_counters(vmid, p)?,
                None => Default::default(),
            };
            let (target, floor) = st.targets.get(&c).copied().unwrap_or((None, 0));
            let g = &self.guests[v];
            let file_pages = g.list_len(ct.cg, FILE_INACTIVE) + g.list_len(ct.cg, FILE_ACTIVE);
            let anon_pages = g.list_len(ct.cg, ANON_INACTIVE) + g.list_len(ct.cg, ANON_ACTIVE);
            let file_curve = streams.file_curve(&sizes);
            shown.push((file_curve.is_some(), streams.counters.anon_accesses > 0));
            inputs.push(ContainerInput {
                name: ct.name.clone(),
                // No reads: every read would miss (there are none to charge).
                file_curve: file_curve.unwrap_or_else(all_misses),
                anon_curve: streams.anon_curve(&sizes),
                demand: Demand {
                    concurrency: ct.roles.len().max(1) as f64,
                    max_ops_s: ct
                        .store
                        .as_ref()
                        .filter(|s| s.interval_ns > 0)
                        .map(|s| NS / s.interval_ns as f64),
                    file_reads_per_op: sc.file_reads as f64 / n,
                    anon_accesses_per_op: sc.anon_accesses as f64 / n,
                    other_ns_per_op: t.op_cpu_ns as f64,
                    file_miss_ns: per(sc.file_disk_ns, sc.file_disk_pages)
                        .map(|w| w + (2 * t.cache_op_ns + t.page_cache_hit_ns) as f64),
                    anon_miss_ns: per(sc.anon_fault_ns, sc.anon_faults)
                        .map(|w| w + t.page_cache_hit_ns as f64),
                },
                target,
                min_memory_pages: if st.cfg.memory { floor } else { cg.usage },
                observed: Some(Observed {
                    file_pages: file_pages as f64,
                    anon_pages: anon_pages as f64,
                    mem_cache_pages: pc.mem.used as f64,
                    ssd_cache_pages: pc.ssd.used as f64,
                    ns_per_op: d.lat_ns as f64 / n,
                }),
            });
            let limited = cg.hard < g.limit;
            chosen |= limited;
            in_force.push(Allocation {
                // Without a limit of its own (the VM's memory), what it holds is its share.
                memory_pages: if limited { cg.hard } else { cg.usage },
                // A pool fills with what its container evicts, so behind a container still filling the
                // memory a limit gave it, an empty pool is not yet measured, not unneeded: its allocation
                // is its entitlement (issue 27, seed 12: the plan read the balanced allocation's 77 MiB
                // for `mysql2` as nothing and gave 67 of it away; the store fell from 51,440 to 22,954
                // ops/s against a target of 31,600).
                mem_cache_pages: if limited && (cg.usage as f64) < cg.hard as f64 * STILL_FILLING {
                    pc.mem.used.max(pc.mem.entitlement)
                } else {
                    pc.mem.used
                },
                ssd_cache_pages: pc.ssd.used,
            });
            // (The first decision's span is since the container started, not one interval: its rate was
            // the start's operations over an interval, three times too high in the mixes of issue 27.)
            let ran = now.ops > prev.ops;
            let span_s = if ran { (self.now - since) as f64 / NS } else { self.now as f64 / NS };
            let ops_s = d.ops as f64 / span_s.max(1e-9);
            measured.push(ops_s);
            // Nothing ran since the last decision: no measurement (the loop waits for one).
            loop_measured.push(ran.then(|| Measured {
                ops_s,
                latency_ms: d.lat_ns as f64 / n / 1e6,
                hit_ratio: if sc.file_reads > 0 {
                    1.0 - sc.file_disk_pages.min(sc.file_reads) as f64 / sc.file_reads as f64
                } else {
                    1.0
                },
            }));
        }
        // The curves have been read: what happens next counts more than what came before.
        for &c in &members {
            if let Some(s) = self.streams[c].as_mut() {
                s.decay(st.cfg.history_decay);
            }
        }
        // The VM's containers share its disk: a swap-in queues behind their reads.
        price_swap_ins_at_shared_disk(&mut inputs, &lat);
        let names: Vec<String> = inputs.iter().map(|c| c.name.clone()).collect();
        st.ctl.in_force(&names, &in_force, chosen);
        let decision = st
            .ctl
            .decide(&inputs, &loop_measured, &lat, &budget, &st.cfg.decision)
            .map_err(|e| LabError::invalid("vms.provision", e.to_string()))?;
        let t_s = self.now as f64 / NS;
        let missed = decision.missed();
        let Some(plan) = decision.plan else {
            // Learning: the first decision waits for every container to have run.
            self.decisions.push(Decision {
                t_s,
                vm: self.vm_names[v].clone(),
                feasible: false,
                infeasible: Vec::new(),
                missed,
                kept_current: true,
                source: decision.source,
                containers: Vec::new(),
            });
            return Ok(());
        };
        let mut decided = Vec::with_capacity(members.len());
        let each = inputs.into_iter().zip(measured).zip(shown).zip(&decision.containers);
        for ((&c, p), (((input, x), (has_file, _)), status)) in members.iter().zip(&plan.containers).zip(each)
        {
            if st.cfg.memory {
                let (cg, pages) = (self.cts[c].cg, p.allocation.memory_pages.max(1));
                self.reclaim_now(v, |g, sink| g.set_hard_limit(cg, pages, sink))?;
            }
            // A VM without a store gets weight 0 there: keep what the container has for that store.
            let spec = p.spec();
            if spec != self.cts[c].spec {
                self.cts[c].spec = spec;
                if let Some(pool) = self.cts[c].pool {
                    self.backend.set_spec(vmid, pool, spec)?;
                }
            }
            self.curves.retain(|s| s.container != p.name);
            self.curves.push(CurveSnapshot {
                container: p.name.clone(),
                t_s,
                file: has_file.then_some(input.file_curve),
                anon: input.anon_curve,
                allocation: p.allocation,
                file_pages: p.predicted.file_pages,
                anon_pages: p.predicted.anon_pages,
            });
            decided.push(DecidedContainer {
                name: p.name.clone(),
                memory_limit_mib: mib(p.allocation.memory_pages),
                mem_cache_mib: mib(p.allocation.mem_cache_pages),
                ssd_cache_mib: mib(p.allocation.ssd_cache_pages),
                spec,
                measured_ops_s: (x * 1000.0).round() / 1000.0,
                predicted_ops_s: (p.predicted.ops_s * 1000.0).round() / 1000.0,
                predicted_latency_ms: (p.predicted.ns_per_op / 1e3).round() / 1e3,
                predicted_hit_ratio: (p.predicted.hit_ratio * 1e4).round() / 1e4,
                target: p.target,
                target_met: p.target_met,
                state: status.state,
                missed_intervals: status.missed_intervals,
            });
        }
        self.decisions.push(Decision {
            t_s,
            vm: self.vm_names[v].clone(),
            feasible: plan.feasible,
            infeasible: plan.infeasible,
            missed,
            kept_current: plan.kept_current,
            source: decision.source,
            containers: decided,
        });
        Ok(())
    }
}
