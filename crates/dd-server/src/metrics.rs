//! Prometheus metrics (`GET /metrics`, host scope).
//!
//! The hot path only bumps relaxed atomics in a fixed table (requests by op and status, connections).
//! The request counters, bumped on every request, are striped: each thread bumps its own stripe (on its
//! own cache lines), and a read adds the stripes up, so connections served by different runtime threads
//! never write a shared line to count (issue 28, item 3);
//! everything per VM, pool and store is read from one engine statistics snapshot at scrape time and
//! rendered with `prometheus-client` into a registry built for that scrape. So a scrape costs the
//! same as `GET /v1/stats`, and the data path pays no label hashing or locking for metrics.

use dd_engine::HostStats;
use dd_proto::{frame::Op, Status};
use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use std::sync::atomic::{AtomicU64, Ordering};

/// Op slots: 0 for an unknown op byte, then the ops by number.
const OP_SLOTS: usize = Op::ALL.len() + 1;
/// Status slots: ok, the engine's 10..=19, the protocol's 100..=111, and "other".
const STATUS_SLOTS: usize = 1 + 10 + 12 + 1;

fn status_slot(s: Status) -> usize {
    match s.0 {
        0 => 0,
        10..=19 => 1 + (s.0 - 10) as usize,
        100..=111 => 11 + (s.0 - 100) as usize,
        _ => STATUS_SLOTS - 1,
    }
}

fn slot_status(i: usize) -> Option<Status> {
    match i {
        0 => Some(Status::OK),
        1..=10 => Some(Status(10 + i as u16 - 1)),
        11..=22 => Some(Status(100 + i as u16 - 11)),
        _ => None,
    }
}

/// Stripes of the request counters (module docs): a thread's stripe is chosen once, round robin.
const STRIPES: usize = 16;

/// One stripe of the request counters, on cache lines of its own.
#[derive(Debug)]
#[repr(align(128))]
struct Stripe([AtomicU64; OP_SLOTS * STATUS_SLOTS]);

/// This thread's stripe.
fn my_stripe() -> usize {
    dd_engine::stripe::index() % STRIPES
}

#[derive(Debug)]
pub struct Metrics {
    requests: Box<[Stripe]>,
    pub connections_active: AtomicU64,
    pub connections_total: AtomicU64,
    pub connections_rejected: AtomicU64,
    /// Connections in their handshake closed to make room for a newer one (`admission`).
    pub connections_displaced: AtomicU64,
    /// Connections closed by the handshake deadline, the idle timeout or a revoked registration.
    pub connections_timed_out: AtomicU64,
    pub connections_revoked: AtomicU64,
    /// Failed handshakes held for `limits.handshake_fail_delay_ms` before their answer (`net`).
    pub handshakes_delayed: AtomicU64,
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
}

type Labels = Vec<(String, String)>;

impl Metrics {
    pub fn new() -> Metrics {
        Metrics {
            requests: (0..STRIPES).map(|_| Stripe(std::array::from_fn(|_| AtomicU64::new(0)))).collect(),
            connections_active: AtomicU64::new(0),
            connections_total: AtomicU64::new(0),
            connections_rejected: AtomicU64::new(0),
            connections_displaced: AtomicU64::new(0),
            connections_timed_out: AtomicU64::new(0),
            connections_revoked: AtomicU64::new(0),
            handshakes_delayed: AtomicU64::new(0),
        }
    }

    pub fn record_request(&self, op: u8, status: Status) {
        let o = Op::from_u8(op).map_or(0, |o| o as usize);
        self.requests[my_stripe()].0[o * STATUS_SLOTS + status_slot(status)].fetch_add(1, Ordering::Relaxed);
    }

    /// One request counter, the stripes added up.
    fn request_count(&self, slot: usize) -> u64 {
        self.requests.iter().map(|s| s.0[slot].load(Ordering::Relaxed)).sum()
    }

    /// Requests recorded for `op` with `status` (tests).
    pub fn requests(&self, op: Op, status: Status) -> u64 {
        self.request_count(op as usize * STATUS_SLOTS + status_slot(status))
    }

    /// Renders every metric in the Prometheus text format.
    pub fn render(
        &self,
        stats: &HostStats,
        ssd: Option<&dd_engine::store::ssd::SsdIoStats>,
        coop: Option<&crate::coop_types::CoopReport>,
        reports: &[crate::provisioner::StoredReport],
        tables: &[(&'static str, u64)],
    ) -> String {
        let mut reg = Registry::default();
        let entries = Family::<Labels, Gauge<i64>>::default();
        for (table, n) in tables {
            entries
                .get_or_create(&vec![("table".into(), (*table).into())])
                .set((*n).min(i64::MAX as u64) as i64);
        }
        reg.register(
            "dd_table_entries",
            "Entries of the daemon's tables keyed by a VM, pool or connection (ServerState::table_sizes)",
            entries,
        );
        if let Some(heap) = heap_bytes() {
            let family = Family::<Labels, Gauge<i64>>::default();
            for (kind, n) in heap {
                family.get_or_create(&vec![("kind".into(), kind.into())]).set(n.min(i64::MAX as u64) as i64);
            }
            reg.register(
                "dd_heap_bytes",
                "The C allocator's heap (glibc mallinfo2): in use, free, mmapped",
                family,
            );
        }
        let requests = Family::<Labels, Counter>::default();
        for o in 0..OP_SLOTS {
            let op = if o == 0 { "unknown" } else { Op::ALL[o - 1].name() };
            for s in 0..STATUS_SLOTS {
                let v = self.request_count(o * STATUS_SLOTS + s);
                if v > 0 {
                    let name = slot_status(s).map_or("other", |s| s.name());
                    requests
                        .get_or_create(&vec![("op".into(), op.into()), ("status".into(), name.into())])
                        .inc_by(v);
                }
            }
        }
        reg.register("dd_requests", "Data-plane requests by op and status", requests);
        let gauge = |v: u64| {
            let g = Gauge::<i64>::default();
            g.set(v.min(i64::MAX as u64) as i64);
            g
        };
        let counter = |v: u64| {
            let c = Counter::<u64>::default();
            c.inc_by(v);
            c
        };
        reg.register(
            "dd_connections_active",
            "Open data-plane connections",
            gauge(self.connections_active.load(Ordering::Relaxed)),
        );
        reg.register(
            "dd_connections",
            "Data-plane connections accepted",
            counter(self.connections_total.load(Ordering::Relaxed)),
        );
        reg.register(
            "dd_connections_rejected",
            "Connections refused at the connection limit or their VM's limit",
            counter(self.connections_rejected.load(Ordering::Relaxed)),
        );
        reg.register(
            "dd_connections_displaced",
            "Connections in their handshake closed to make room for a newer connection",
            counter(self.connections_displaced.load(Ordering::Relaxed)),
        );
        reg.register(
            "dd_connections_timed_out",
            "Connections closed by the handshake deadline or the idle timeout",
            counter(self.connections_timed_out.load(Ordering::Relaxed)),
        );
        reg.register(
            "dd_connections_revoked",
            "Sessions closed because their VM was removed or its tokens replaced",
            counter(self.connections_revoked.load(Ordering::Relaxed)),
        );
        reg.register(
            "dd_handshakes_delayed",
            "Failed handshakes answered after limits.handshake_fail_delay_ms, unread meanwhile",
            counter(self.handshakes_delayed.load(Ordering::Relaxed)),
        );

        let store_capacity = Family::<Labels, Gauge>::default();
        let store_used = Family::<Labels, Gauge>::default();
        for s in &stats.stores {
            if s.configured {
                let l = vec![("store".to_string(), s.kind.name().to_string())];
                store_capacity.get_or_create(&l).set(s.capacity_pages as i64);
                store_used.get_or_create(&l).set(s.used_pages as i64);
            }
        }
        reg.register("dd_store_capacity_pages", "Store capacity in pages", store_capacity);
        reg.register("dd_store_used_pages", "Pages held by the store", store_used);
        if let Some(io) = ssd {
            // A failing disk must be visible: the daemon keeps serving the memory store meanwhile.
            for (name, help, v) in [
                ("dd_ssd_writes", "SSD page writes that completed", io.writes),
                ("dd_ssd_reads", "SSD page reads served from the file", io.reads),
                ("dd_ssd_write_errors", "SSD page writes that failed (the page is lost)", io.write_errors),
                ("dd_ssd_read_errors", "SSD page reads that failed (served as misses)", io.read_errors),
                (
                    "dd_ssd_writes_refused",
                    "Pages refused because the SSD store was failing",
                    io.writes_refused,
                ),
            ] {
                reg.register(name, help, counter(v));
            }
            reg.register(
                "dd_ssd_failing",
                "1 while the SSD store's last write failed (new pages refused but for probes)",
                gauge(io.failing as u64),
            );
        }

        let pool_used = Family::<Labels, Gauge>::default();
        let pool_ent = Family::<Labels, Gauge>::default();
        let pool_puts = Family::<Labels, Counter>::default();
        let pool_hits = Family::<Labels, Counter>::default();
        let pool_flushes = Family::<Labels, Counter>::default();
        let pool_evictions = Family::<Labels, Counter>::default();
        let pool_misses = Family::<Labels, Counter>::default();
        let pool_refused = Family::<Labels, Counter>::default();
        let pool_lost = Family::<Labels, Counter>::default();
        let pool_remotified = Family::<Labels, Counter>::default();
        let pool_remote_pages = Family::<Labels, Gauge>::default();
        let pool_remote_hits = Family::<Labels, Counter>::default();
        let pool_remote_misses = Family::<Labels, Counter>::default();
        let vm_used = Family::<Labels, Gauge>::default();
        let vm_ent = Family::<Labels, Gauge>::default();
        let pool_eff = Family::<Labels, Gauge>::default();
        let vm_eff = Family::<Labels, Gauge>::default();
        for vm in &stats.vms {
            for p in &vm.pools {
                // `container`: the pool's label (the watcher's cgroup name); absent while unnamed (what
                // Prometheus makes of an empty value too).
                let mut base =
                    vec![("vm".to_string(), vm.vm.to_string()), ("pool".to_string(), p.pool.to_string())];
                if let Some(l) = &p.label {
                    base.push(("container".to_string(), l.clone()));
                }
                pool_misses.get_or_create(&base).inc_by(p.counters.gets_missed);
                pool_refused.get_or_create(&base).inc_by(p.counters.puts_refused);
                pool_lost.get_or_create(&base).inc_by(p.counters.pages_lost);
                pool_remotified.get_or_create(&base).inc_by(p.counters.remotified);
                pool_remote_pages.get_or_create(&base).set(p.counters.remote_pages as i64);
                pool_remote_hits.get_or_create(&base).inc_by(p.counters.remote_gets_hit);
                pool_remote_misses.get_or_create(&base).inc_by(p.counters.remote_gets_missed);
                for s in dd_engine::StoreKind::ALL {
                    let c = p.counters.store(s);
                    let mut l = base.clone();
                    l.push(("store".into(), s.name().into()));
                    pool_used.get_or_create(&l).set(c.used as i64);
                    pool_ent.get_or_create(&l).set(c.entitlement as i64);
                    pool_eff.get_or_create(&l).set(c.effective_entitlement as i64);
                    pool_puts.get_or_create(&l).inc_by(c.puts);
                    pool_hits.get_or_create(&l).inc_by(c.gets_hit);
                    pool_flushes.get_or_create(&l).inc_by(c.flushes);
                    pool_evictions.get_or_create(&l).inc_by(c.evictions);
                }
            }
            for s in dd_engine::StoreKind::ALL {
                let l =
                    vec![("vm".to_string(), vm.vm.to_string()), ("store".to_string(), s.name().to_string())];
                vm_used.get_or_create(&l).set(vm.totals.store(s).used as i64);
                vm_ent.get_or_create(&l).set(vm.totals.store(s).entitlement as i64);
                vm_eff.get_or_create(&l).set(vm.totals.store(s).effective_entitlement as i64);
            }
        }
        reg.register("dd_pool_used_pages", "Pages a pool holds per store", pool_used);
        reg.register("dd_pool_entitlement_pages", "A pool's static entitlement per store", pool_ent);
        reg.register(
            "dd_pool_effective_entitlement_pages",
            "A pool's effective entitlement per store (under-used shares lent by weight)",
            pool_eff,
        );
        reg.register("dd_pool_puts", "Pages stored by puts", pool_puts);
        reg.register("dd_pool_gets_hit", "Gets served", pool_hits);
        reg.register("dd_pool_flushes", "Pages flushed", pool_flushes);
        reg.register("dd_pool_evictions", "Pages evicted", pool_evictions);
        reg.register("dd_pool_gets_missed", "Gets that missed", pool_misses);
        reg.register("dd_pool_puts_refused", "Puts not stored", pool_refused);
        reg.register(
            "dd_pool_pages_lost",
            "Pages dropped because the SSD could not give them back (read or write error)",
            pool_lost,
        );
        reg.register("dd_vm_used_pages", "Pages a VM holds per store", vm_used);
        reg.register("dd_vm_entitlement_pages", "A VM's static entitlement per store", vm_ent);
        reg.register(
            "dd_vm_effective_entitlement_pages",
            "A VM's effective entitlement per store (under-used shares lent by weight)",
            vm_eff,
        );
        reg.register("dd_pool_remotified", "Evicted pages remotified to a peer", pool_remotified);
        reg.register("dd_pool_remote_pages", "Remotified pages a pool refers to now", pool_remote_pages);
        reg.register("dd_pool_remote_gets_hit", "Remotified gets served by a peer", pool_remote_hits);
        reg.register("dd_pool_remote_gets_missed", "Remotified gets that missed", pool_remote_misses);
        reg.register(
            "dd_pins_held",
            "Pins held for peers (co-operative de-duplication)",
            gauge(stats.pins_held),
        );
        reg.register(
            "dd_remote_dedups",
            "Remote compares that matched and pinned a frame",
            counter(stats.remote_dedups),
        );
        if let Some(c) = coop {
            for (name, help, v) in [
                ("dd_coop_offered", "Evicted pages queued for remotification", c.offered),
                ("dd_coop_dropped", "Evicted pages not queued (queue full)", c.dropped),
                ("dd_coop_no_candidate", "Offers no peer summary matched", c.no_candidate),
                (
                    "dd_coop_compare_mismatches",
                    "Remote compares that found no equal frame",
                    c.compare_mismatches,
                ),
                ("dd_coop_remotify_errors", "Offers whose compares failed on the network", c.remotify_errors),
                ("dd_coop_summaries_sent", "Summaries pushed to peers", c.summaries_sent),
                ("dd_coop_summaries_received", "Summaries received from peers", c.summaries_received),
                ("dd_coop_unpins_sent", "Pins released on peers", c.unpins_sent),
                (
                    "dd_coop_pins_released_epoch",
                    "Pins released because their peer restarted",
                    c.pins_released_epoch,
                ),
                (
                    "dd_coop_pins_released_ttl",
                    "Pins released because their peer went silent",
                    c.pins_released_ttl,
                ),
                (
                    "dd_coop_references_dropped",
                    "Remote references forgotten (peer restarted or unreachable past the pin lifetime)",
                    c.references_dropped,
                ),
                ("dd_coop_peer_failures", "Failed requests to peers", c.peer_failures),
                ("dd_coop_auth_failures", "Peer handshakes refused", c.auth_failures),
                (
                    "dd_coop_sessions_refused",
                    "Peer AUTHs answered busy (per-peer session cap)",
                    c.sessions_refused,
                ),
                ("dd_coop_sessions_idle_closed", "Peer sessions closed idle", c.sessions_idle_closed),
                ("dd_coop_records_refused", "Peer records that failed authentication", c.records_refused),
            ] {
                reg.register(name, help, counter(v));
            }
            reg.register("dd_coop_queued", "Evicted pages waiting for remotification", gauge(c.queued));
        }

        provisioner_metrics(&mut reg, reports);
        let mut out = String::new();
        encode(&mut out, &reg).expect("writing to a String cannot fail");
        out
    }
}

/// The guest provisioners' last reports (`crate::provisioner`) as gauges, so that Grafana shows the
/// targets and decisions `/ui/` shows: per VM the round and whether every target is feasible, per
/// container (labels `vm`, `container`) the planned sizes, the target, and what was measured and
/// predicted against it.
fn provisioner_metrics(reg: &mut Registry, reports: &[crate::provisioner::StoredReport]) {
    use dd_provision::model::Target;
    type F = Family<Labels, Gauge<f64, AtomicU64>>;
    let round = Family::<Labels, Gauge>::default();
    let feasible = Family::<Labels, Gauge>::default();
    let received = Family::<Labels, Gauge>::default();
    let per: Vec<(&str, &str, F)> = [
        ("dd_provisioner_budget_bytes", "First-level budget planned for a container (its page cache)"),
        (
            "dd_provisioner_mem_cache_bytes",
            "A container's planned share of the VM's memory-store entitlement",
        ),
        ("dd_provisioner_ssd_cache_bytes", "A container's planned share of the VM's SSD-store entitlement"),
        ("dd_provisioner_memory_limit_bytes", "The cgroup memory limit the provisioner set"),
        ("dd_provisioner_target_hit_ratio", "A container's hit-ratio target"),
        ("dd_provisioner_target_latency_ms", "A container's mean-latency target, milliseconds"),
        ("dd_provisioner_target_reads_per_s", "A container's throughput target, reads per second"),
        ("dd_provisioner_target_met", "1 when the plan meets the container's target (as predicted)"),
        ("dd_provisioner_measured_target_met", "1 when the last round's measurement met the target"),
        ("dd_provisioner_measured_hit_ratio", "Hit ratio measured since the last round"),
        ("dd_provisioner_predicted_hit_ratio", "Hit ratio the model predicts for the plan"),
        ("dd_provisioner_measured_latency_ms", "Mean read latency measured since the last round, ms"),
        ("dd_provisioner_predicted_latency_ms", "Mean read latency the model predicts for the plan, ms"),
        ("dd_provisioner_reads_per_s", "Reads per second measured since the last round"),
        ("dd_provisioner_predicted_reads_per_s", "Reads per second the model predicts for the plan"),
        (
            "dd_provisioner_correction",
            "Measured over predicted throughput the closed loop learnt for a container (1: the model was right)",
        ),
    ]
    .into_iter()
    .map(|(n, h)| (n, h, F::default()))
    .collect();
    for r in reports {
        let vm = vec![("vm".to_string(), r.vm.to_string())];
        round.get_or_create(&vm).set(r.report.round.min(i64::MAX as u64) as i64);
        feasible.get_or_create(&vm).set(r.report.feasible as i64);
        received.get_or_create(&vm).set((r.received_unix_ms / 1000) as i64);
        for c in &r.report.containers {
            let l = vec![("vm".to_string(), r.vm.to_string()), ("container".to_string(), c.name.clone())];
            let (ratio, ms, ops) = match c.target {
                Some(Target::HitRatio { ratio }) => (Some(ratio), None, None),
                Some(Target::MeanLatency { ms }) => (None, Some(ms), None),
                Some(Target::Throughput { ops_s }) => (None, None, Some(ops_s)),
                None => (None, None, None),
            };
            let flag = |b: Option<bool>| b.map(|b| b as u8 as f64);
            let values = [
                Some(c.budget_bytes as f64),
                Some(c.mem_cache_bytes as f64),
                Some(c.ssd_cache_bytes as f64),
                c.memory_limit_bytes.map(|b| b as f64),
                ratio,
                ms,
                ops,
                flag(c.target_met),
                flag(c.measured_target_met),
                Some(c.measured_hit_ratio),
                Some(c.predicted_hit_ratio),
                Some(c.measured_latency_ms),
                Some(c.predicted_latency_ms),
                Some(c.reads_per_s),
                Some(c.predicted_reads_per_s),
                Some(c.correction),
            ];
            for ((_, _, f), v) in per.iter().zip(values) {
                if let Some(v) = v {
                    f.get_or_create(&l).set(v);
                }
            }
        }
    }
    reg.register("dd_provisioner_round", "The last round a VM's guest provisioner reported", round);
    reg.register(
        "dd_provisioner_feasible",
        "1 when every target of the VM's last round is feasible",
        feasible,
    );
    reg.register(
        "dd_provisioner_report_received_seconds",
        "When the VM's last provisioner report arrived, seconds since the Unix epoch",
        received,
    );
    for (n, h, f) in per {
        reg.register(n, h, f);
    }
}

/// The process heap as glibc's allocator sees it (`mallinfo2`): bytes in use (small and mmapped
/// chunks), bytes free inside its arenas (fragmentation and what it keeps for reuse), and of those in
/// use, bytes in separately mmapped chunks. `None` where the allocator is not glibc's.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
pub fn heap_bytes() -> Option<[(&'static str, u64); 3]> {
    // SAFETY: mallinfo2 takes no arguments, only reads the allocator's statistics under its own locks
    // and returns a plain struct by value.
    let m = unsafe { libc::mallinfo2() };
    Some([
        ("in_use", (m.uordblks + m.hblkhd) as u64),
        ("free", m.fordblks as u64),
        ("mmapped", m.hblkhd as u64),
    ])
}

/// See the glibc version: no statistics elsewhere.
#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
pub fn heap_bytes() -> Option<[(&'static str, u64); 3]> {
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_slots_round_trip() {
        for s in [Status::OK, Status(10), Status(19)].into_iter().chain(Status::PROTOCOL) {
            assert_eq!(slot_status(status_slot(s)), Some(s));
        }
        assert_eq!(slot_status(status_slot(Status(5000))), None);
    }

    /// Requests counted on many threads (each on its stripe, several sharing one) add up exactly, in
    /// `requests` and in the rendered text.
    #[test]
    fn striped_request_counts_add_up_exactly() {
        let m = Metrics::new();
        std::thread::scope(|s| {
            for t in 0..(STRIPES + 3) {
                let m = &m;
                s.spawn(move || {
                    for _ in 0..1000 + t {
                        m.record_request(Op::Get as u8, Status::OK);
                    }
                });
            }
        });
        let want: u64 = (0..(STRIPES + 3) as u64).map(|t| 1000 + t).sum();
        assert_eq!(m.requests(Op::Get, Status::OK), want);
        assert_eq!(m.requests(Op::Put, Status::OK), 0);
        let stats = dd_engine::Cache::new(dd_engine::EngineConfig::default()).unwrap().host_stats();
        let text = m.render(&stats, None, None, &[], &[]);
        assert!(text.contains(&format!("{want}")), "{text}");
    }
}
