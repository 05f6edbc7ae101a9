//! The daemon's memory of the recent past (issue 31): every `history.interval_ms` one engine statistics
//! snapshot is taken and each VM's and pool's use, entitlements and counters are kept, the last
//! `history.samples` of each, so that `/ui/` draws charts over time that a reload does not empty. Served
//! by `GET /v1/history` (host token: every VM) and `GET /v1/vm/history` (a VM's admin token: that VM
//! only), schema `History` in `docs/admin-api.yaml`.
//!
//! Invariants:
//! * Bounded memory: at most `history.max_series` series (VMs and pools together; series past it are not
//!   kept and are counted in `series_omitted`), each a ring of at most `history.samples` samples of
//!   [`SAMPLE_BYTES`] bytes, so the samples take at most `max_series x samples x SAMPLE_BYTES` (defaults:
//!   512 x 1800 x 88 B = 81 MB; a daemon with 8 pools at the defaults keeps 1.4 MB), plus one label
//!   (at most 255 bytes) per pool series.
//! * Only what exists is kept: after each sample the series of VMs and pools the snapshot no longer
//!   holds (removed, destroyed) are dropped, so the tables shrink back with churn, one interval later
//!   at most; a VM's series goes at once with its removal ([`History::forget_vm`]). A pool is keyed by
//!   `(vm, pool)` and a VM registered again under the same id starts a new series.
//! * The lock (a leaf) is held only to copy samples in or out; the snapshot is taken before it.

use dd_engine::{Counters, HostStats, StoreKind, VmId};
use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use std::collections::btree_map::Entry;
use std::collections::{BTreeMap, VecDeque};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// `[history]` of the daemon's configuration.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct HistoryConfig {
    /// Time between two samples, milliseconds (the page's refresh). Default 2000.
    pub interval_ms: u64,
    /// Samples kept per VM and pool. Default 1800 (an hour at 2 s).
    pub samples: usize,
    /// Series (VMs and pools together) kept; the ones past it are counted, not kept. Default 512.
    pub max_series: usize,
}

impl Default for HistoryConfig {
    fn default() -> Self {
        HistoryConfig { interval_ms: 2000, samples: 1800, max_series: 512 }
    }
}

impl HistoryConfig {
    /// The first bad field (name, reason).
    pub fn problem(&self) -> Option<(&'static str, &'static str)> {
        if !(100..=3_600_000).contains(&self.interval_ms) {
            return Some(("history.interval_ms", "must be 100 to 3600000"));
        }
        if !(2..=100_000).contains(&self.samples) {
            return Some(("history.samples", "must be 2 to 100000"));
        }
        if !(1..=1_000_000).contains(&self.max_series) {
            return Some(("history.max_series", "must be 1 to 1000000"));
        }
        None
    }
}

/// One sample of a VM's totals or a pool's counters: pages per store, counters summed over the stores.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Sample {
    t_unix_ms: u64,
    used: [u64; 2],
    entitlement: [u64; 2],
    effective: [u64; 2],
    puts: u64,
    gets_hit: u64,
    gets_missed: u64,
    evictions: u64,
}

/// Bytes one sample takes in a series' ring.
pub const SAMPLE_BYTES: usize = std::mem::size_of::<Sample>();

impl Sample {
    fn of(t_unix_ms: u64, c: &Counters) -> Sample {
        let per = |f: fn(&dd_engine::StoreCounters) -> u64| StoreKind::ALL.map(|s| f(c.store(s)));
        let sum = |f: fn(&dd_engine::StoreCounters) -> u64| per(f).iter().sum();
        Sample {
            t_unix_ms,
            used: per(|s| s.used),
            entitlement: per(|s| s.entitlement),
            effective: per(|s| s.effective_entitlement),
            puts: sum(|s| s.puts),
            gets_hit: sum(|s| s.gets_hit),
            gets_missed: c.gets_missed,
            evictions: sum(|s| s.evictions),
        }
    }
}

#[derive(Debug, Default)]
struct Ring(VecDeque<Sample>);

impl Ring {
    /// Appends `s`, dropping the oldest sample once `cap` are kept. The ring grows by doubling up to
    /// exactly `cap`, never past it: `VecDeque`'s own doubling would take a ring of 1800 samples to a
    /// capacity of 2048, and a full ring rotates through every slot of its capacity, so the 248 slots
    /// past `cap` would be touched (and become resident) only in the hour after the ring filled, a slow
    /// climb that looks like a leak in a soak (issue 35).
    fn push(&mut self, s: Sample, cap: usize) {
        let q = &mut self.0;
        if q.len() >= cap {
            q.pop_front();
        } else if q.len() == q.capacity() {
            let to = (q.capacity().max(4) * 2).min(cap);
            q.reserve_exact(to - q.len());
        }
        q.push_back(s);
        debug_assert!(q.len() <= cap);
    }
}

#[derive(Debug, Default)]
struct PoolSeries {
    label: Option<String>,
    ring: Ring,
}

#[derive(Debug, Default)]
struct VmSeries {
    ring: Ring,
    pools: BTreeMap<u32, PoolSeries>,
}

#[derive(Debug, Default)]
struct Inner {
    vms: BTreeMap<u32, VmSeries>,
    /// Series in `vms` (VMs and pools).
    series: usize,
    /// VMs and pools of the last snapshot that found no room.
    omitted: u64,
}

/// The kept samples (a leaf lock).
#[derive(Debug)]
pub struct History {
    cfg: HistoryConfig,
    page_size: usize,
    inner: Mutex<Inner>,
}

/// Columns of one series, oldest first (what the admin API answers).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SeriesColumns {
    pub t_unix_ms: Vec<u64>,
    pub mem_used_pages: Vec<u64>,
    pub ssd_used_pages: Vec<u64>,
    pub mem_entitlement_pages: Vec<u64>,
    pub ssd_entitlement_pages: Vec<u64>,
    pub mem_effective_entitlement_pages: Vec<u64>,
    pub ssd_effective_entitlement_pages: Vec<u64>,
    /// Counters since the pool's creation (for a VM: over its live and destroyed pools).
    pub puts: Vec<u64>,
    pub gets_hit: Vec<u64>,
    pub gets_missed: Vec<u64>,
    pub evictions: Vec<u64>,
}

impl SeriesColumns {
    fn of<'a>(samples: impl Iterator<Item = &'a Sample>) -> SeriesColumns {
        let mut c = SeriesColumns::default();
        for s in samples {
            c.t_unix_ms.push(s.t_unix_ms);
            c.mem_used_pages.push(s.used[0]);
            c.ssd_used_pages.push(s.used[1]);
            c.mem_entitlement_pages.push(s.entitlement[0]);
            c.ssd_entitlement_pages.push(s.entitlement[1]);
            c.mem_effective_entitlement_pages.push(s.effective[0]);
            c.ssd_effective_entitlement_pages.push(s.effective[1]);
            c.puts.push(s.puts);
            c.gets_hit.push(s.gets_hit);
            c.gets_missed.push(s.gets_missed);
            c.evictions.push(s.evictions);
        }
        c
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PoolHistory {
    pub pool: u32,
    /// The container's name (SET_LABEL), as of the last sample.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub label: Option<String>,
    pub series: SeriesColumns,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct VmHistory {
    pub vm: u32,
    pub series: SeriesColumns,
    pub pools: Vec<PoolHistory>,
}

/// The answer of `GET /v1/history` and `GET /v1/vm/history`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HistoryReport {
    pub interval_ms: u64,
    /// Samples kept per series at most.
    pub samples: usize,
    pub page_size_bytes: usize,
    /// VMs and pools of the last sample that were not kept (`history.max_series`).
    pub series_omitted: u64,
    pub vms: Vec<VmHistory>,
}

fn now_unix_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

impl History {
    pub fn new(cfg: HistoryConfig, page_size: usize) -> History {
        History { cfg, page_size, inner: Mutex::new(Inner::default()) }
    }

    pub fn interval(&self) -> Duration {
        Duration::from_millis(self.cfg.interval_ms)
    }

    /// Takes a snapshot of `cache` now and keeps it.
    pub fn sample(&self, cache: &dd_engine::Cache) {
        self.record(&cache.host_stats(), now_unix_ms());
    }

    /// Keeps one snapshot taken at `t_unix_ms`, and drops the series of what it no longer holds.
    pub fn record(&self, stats: &HostStats, t_unix_ms: u64) {
        let cap = self.cfg.samples;
        let mut g = self.inner.lock();
        let Inner { vms, series, omitted } = &mut *g;
        *omitted = 0;
        vms.retain(|id, v| {
            let Some(now) = stats.vms.iter().find(|s| s.vm.0 == *id) else { return false };
            v.pools.retain(|p, _| now.pools.iter().any(|s| s.pool.0 == *p));
            true
        });
        *series = vms.values().map(|v| 1 + v.pools.len()).sum();
        for vm in &stats.vms {
            let v = match vms.entry(vm.vm.0) {
                Entry::Occupied(e) => e.into_mut(),
                Entry::Vacant(_) if *series >= self.cfg.max_series => {
                    *omitted += 1 + vm.pools.len() as u64;
                    continue;
                }
                Entry::Vacant(e) => {
                    *series += 1;
                    e.insert(VmSeries::default())
                }
            };
            v.ring.push(Sample::of(t_unix_ms, &vm.totals), cap);
            for p in &vm.pools {
                let ps = match v.pools.entry(p.pool.0) {
                    Entry::Occupied(e) => e.into_mut(),
                    Entry::Vacant(_) if *series >= self.cfg.max_series => {
                        *omitted += 1;
                        continue;
                    }
                    Entry::Vacant(e) => {
                        *series += 1;
                        e.insert(PoolSeries::default())
                    }
                };
                if ps.label != p.label {
                    ps.label.clone_from(&p.label);
                }
                ps.ring.push(Sample::of(t_unix_ms, &p.counters), cap);
            }
        }
    }

    /// Drops a VM's series at once (its registration is gone).
    pub fn forget_vm(&self, vm: VmId) {
        let mut g = self.inner.lock();
        if let Some(v) = g.vms.remove(&vm.0) {
            g.series -= 1 + v.pools.len();
        }
    }

    /// Series kept now (VMs and pools; tests and the churn check).
    pub fn series(&self) -> usize {
        self.inner.lock().series
    }

    /// Samples kept now over every series (at most `series() x history.samples`: `dd_table_entries`).
    pub fn samples_kept(&self) -> usize {
        let g = self.inner.lock();
        g.vms.values().map(|v| v.ring.0.len() + v.pools.values().map(|p| p.ring.0.len()).sum::<usize>()).sum()
    }

    /// The samples after `since_unix_ms` (0: all) of every VM (`vm` `None`) or of one.
    pub fn report(&self, vm: Option<VmId>, since_unix_ms: u64) -> HistoryReport {
        let g = self.inner.lock();
        let after = |r: &Ring| SeriesColumns::of(r.0.iter().filter(|s| s.t_unix_ms > since_unix_ms));
        let vms = g
            .vms
            .iter()
            .filter(|(id, _)| vm.is_none_or(|v| v.0 == **id))
            .map(|(id, v)| VmHistory {
                vm: *id,
                series: after(&v.ring),
                pools: v
                    .pools
                    .iter()
                    .map(|(p, s)| PoolHistory { pool: *p, label: s.label.clone(), series: after(&s.ring) })
                    .collect(),
            })
            .collect();
        HistoryReport {
            interval_ms: self.cfg.interval_ms,
            samples: self.cfg.samples,
            page_size_bytes: self.page_size,
            series_omitted: g.omitted,
            vms,
        }
    }
}

/// Runs `sample` every `interval` until `stop` turns true: a task of the daemon's runtime, `sample` on
/// the blocking pool (it takes an engine snapshot, like the admin API's statistics).
pub fn spawn_sampler(
    interval: Duration,
    mut stop: tokio::sync::watch::Receiver<bool>,
    sample: impl Fn() + Clone + Send + 'static,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                _ = stop.changed() => return,
            }
            let _ = tokio::task::spawn_blocking(sample.clone()).await;
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use dd_engine::{Cache, EngineConfig, PoolOptions, Spec, VmWeights};

    fn cache() -> Cache {
        let mut cfg = EngineConfig::default();
        cfg.mem.capacity_bytes = 4 << 20;
        cfg.ssd = None;
        Cache::new(cfg).unwrap()
    }

    #[test]
    fn keeps_the_last_samples_and_drops_removed_pools_and_vms() {
        let c = cache();
        let h = History::new(HistoryConfig { interval_ms: 100, samples: 3, max_series: 100 }, 4096);
        c.add_vm(VmId(1), VmWeights::equal(100)).unwrap();
        c.add_vm(VmId(2), VmWeights::equal(100)).unwrap();
        let p = c.new_pool(VmId(1), PoolOptions::ephemeral(Spec::Mem { weight: 10 })).unwrap();
        let q = c.new_pool(VmId(1), PoolOptions::ephemeral(Spec::Mem { weight: 10 })).unwrap();
        c.set_pool_label(VmId(1), p, Some("web")).unwrap();
        let empty = h.series();
        for t in 1..=5 {
            c.put(VmId(1), p, dd_engine::Key::new(1, t), &[t as u8; 4096]).unwrap();
            h.record(&c.host_stats(), t * 1000);
        }
        assert_eq!(h.series(), empty + 4, "two VMs and two pools");
        let r = h.report(None, 0);
        let v1 = &r.vms[0];
        assert_eq!(v1.series.t_unix_ms, [3000, 4000, 5000], "the last `samples` only");
        assert_eq!(v1.pools[0].label.as_deref(), Some("web"));
        assert_eq!(v1.pools[0].series.mem_used_pages, [3, 4, 5]);
        assert_eq!(v1.pools[0].series.puts, [3, 4, 5]);
        assert_eq!(h.report(None, 4000).vms[0].pools[0].series.t_unix_ms, [5000], "since");
        // A VM token's view: its own VM only.
        assert_eq!(h.report(Some(VmId(2)), 0).vms.iter().map(|v| v.vm).collect::<Vec<_>>(), [2]);

        c.destroy_pool(VmId(1), q).unwrap();
        c.remove_vm(VmId(2)).unwrap();
        h.record(&c.host_stats(), 6000);
        assert_eq!(h.series(), empty + 2, "the destroyed pool's and the removed VM's series are gone");
        c.remove_vm(VmId(1)).unwrap();
        h.forget_vm(VmId(1));
        assert_eq!(h.series(), empty);
        assert!(h.report(None, 0).vms.is_empty());
    }

    #[test]
    fn series_past_max_series_are_counted_not_kept() {
        let c = cache();
        let h = History::new(HistoryConfig { interval_ms: 100, samples: 10, max_series: 2 }, 4096);
        c.add_vm(VmId(1), VmWeights::equal(100)).unwrap();
        for _ in 0..3 {
            c.new_pool(VmId(1), PoolOptions::ephemeral(Spec::Mem { weight: 10 })).unwrap();
        }
        h.record(&c.host_stats(), 1);
        let r = h.report(None, 0);
        assert_eq!((h.series(), r.series_omitted, r.vms[0].pools.len()), (2, 2, 1));
    }

    #[test]
    fn regression_a_full_history_ring_had_capacity_past_its_samples() {
        let cap = HistoryConfig::default().samples;
        let mut r = Ring::default();
        let s = Sample::of(0, &Counters::default());
        for i in 0..3 * cap {
            r.push(s, cap);
            assert!(
                r.0.capacity() <= cap,
                "capacity {} past {cap} samples after {} pushes",
                r.0.capacity(),
                i + 1
            );
        }
        assert_eq!(r.0.len(), cap);
    }

    #[test]
    fn the_memory_bound_holds_at_the_defaults() {
        assert_eq!(SAMPLE_BYTES, 88, "the bound in the module documentation and docs/ uses 88 bytes");
        let d = HistoryConfig::default();
        assert!(d.problem().is_none());
        assert!(d.max_series * d.samples * SAMPLE_BYTES <= 81 << 20);
        assert_eq!(d.samples as u64 * d.interval_ms, 3_600_000, "an hour at the page's interval");
    }
}
