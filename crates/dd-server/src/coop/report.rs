//! Co-operative de-duplication's counters, and the snapshot of them the admin API and `/metrics` show
//! (`Coop::report`, `GET /v1/host/coop`; the report's types are in `coop_types`). Counters are
//! relaxed atomics (each is independent); latencies are HDR histograms behind a mutex taken only to
//! record one value or to report.

use super::Coop;
use crate::coop_types::{CoopReport, LatencyReport, PeerReport};
use parking_lot::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Counters of co-operative de-duplication (also in `/metrics` and `GET /v1/host/coop`).
#[derive(Debug, Default)]
pub struct CoopStats {
    /// Evicted pages offered by the engine and queued.
    pub offered: AtomicU64,
    /// Offers refused because the queue was full (plain evictions).
    pub dropped: AtomicU64,
    /// Pages remotified (a peer pinned an equal frame and the engine installed the reference).
    pub remotified: AtomicU64,
    /// Offers no peer's summary matched.
    pub no_candidate: AtomicU64,
    /// Remote compares that found no equal frame (summary false positives or stale summaries).
    pub compare_mismatches: AtomicU64,
    /// Offers whose compares failed on the network.
    pub remotify_errors: AtomicU64,
    /// Pins granted by a peer that the engine no longer wanted (the key changed meanwhile).
    pub stale_installs: AtomicU64,
    pub remote_gets_hit: AtomicU64,
    pub remote_gets_missed: AtomicU64,
    /// Unpins sent to peers.
    pub unpins_sent: AtomicU64,
    pub summaries_sent: AtomicU64,
    pub summaries_received: AtomicU64,
    /// Remote compares this daemon answered, and how many matched (remote de-duplications).
    pub compares_served: AtomicU64,
    pub remote_dedups: AtomicU64,
    pub fetches_served: AtomicU64,
    /// Pins released because their peer restarted (new epoch) or went silent.
    pub pins_released_epoch: AtomicU64,
    pub pins_released_ttl: AtomicU64,
    /// Remote references forgotten because every peer they named restarted or stayed unreachable past
    /// `pin_ttl_ms` (a dead holder is struck from a record that names others).
    pub references_dropped: AtomicU64,
    /// Failed requests to peers (each also backs the peer off; logged at most every `LOG_EVERY`).
    pub peer_failures: AtomicU64,
    /// Peer-listener handshakes refused (unknown name, or a signature that does not verify).
    pub auth_failures: AtomicU64,
    /// AUTHs answered `busy`: the node already held `coop.max_sessions_per_peer` sessions.
    pub sessions_refused: AtomicU64,
    /// Authenticated sessions closed after `coop.idle_timeout_ms` without a frame.
    pub sessions_idle_closed: AtomicU64,
    /// Connections closed on a record that failed authentication (tampered, injected or replayed).
    pub records_refused: AtomicU64,
    /// Microseconds per successful remotification (from taking the offer to installing the pin) and
    /// per remotified get that hit (the peer fetch, as the connection thread waits for it).
    pub(super) remotify_us: Mutex<Latency>,
    pub(super) fetch_us: Mutex<Latency>,
}

/// A latency histogram in microseconds (1 µs to 60 s, 3 significant digits).
#[derive(Debug)]
pub(super) struct Latency(hdrhistogram::Histogram<u64>);

impl Default for Latency {
    fn default() -> Self {
        Latency(hdrhistogram::Histogram::new_with_bounds(1, 60_000_000, 3).expect("valid bounds"))
    }
}

impl Latency {
    pub(super) fn record(&mut self, d: Duration) {
        let _ = self.0.record((d.as_micros() as u64).clamp(1, 60_000_000));
    }
    fn report(&self) -> LatencyReport {
        LatencyReport {
            count: self.0.len(),
            p50_us: self.0.value_at_quantile(0.5),
            p99_us: self.0.value_at_quantile(0.99),
        }
    }
}

impl Coop {
    /// Statistics and peers for the admin API.
    pub fn report(&self) -> CoopReport {
        let s = &self.stats;
        let l = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let owners = self.owners.lock();
        let peers = self
            .peers
            .read()
            .iter()
            .map(|p| PeerReport {
                name: p.name.clone(),
                addr: p.addr.read().clone(),
                active: p.active.load(Ordering::Relaxed),
                summary_age_ms: p.summary.read().as_ref().map(|s| s.received.elapsed().as_millis() as u64),
                pins_held_for: owners.pins_of(&p.name) as u64,
                backoff_ms: p.backoff.lock().remaining(Instant::now()).as_millis() as u64,
            })
            .collect();
        CoopReport {
            node_name: self.me.clone(),
            public_key: self.key.public_text(),
            epoch: self.epoch,
            offered: l(&s.offered),
            queued: self.queue.pages.load(Ordering::Relaxed) as u64,
            dropped: l(&s.dropped),
            remotified: l(&s.remotified),
            no_candidate: l(&s.no_candidate),
            compare_mismatches: l(&s.compare_mismatches),
            remotify_errors: l(&s.remotify_errors),
            stale_installs: l(&s.stale_installs),
            remote_gets_hit: l(&s.remote_gets_hit),
            remote_gets_missed: l(&s.remote_gets_missed),
            unpins_sent: l(&s.unpins_sent),
            summaries_sent: l(&s.summaries_sent),
            summaries_received: l(&s.summaries_received),
            compares_served: l(&s.compares_served),
            remote_dedups: l(&s.remote_dedups),
            fetches_served: l(&s.fetches_served),
            pins_held: owners.len() as u64,
            pins_released_epoch: l(&s.pins_released_epoch),
            pins_released_ttl: l(&s.pins_released_ttl),
            references_dropped: l(&s.references_dropped),
            peer_failures: l(&s.peer_failures),
            auth_failures: l(&s.auth_failures),
            sessions_refused: l(&s.sessions_refused),
            sessions_idle_closed: l(&s.sessions_idle_closed),
            records_refused: l(&s.records_refused),
            remotify_latency: s.remotify_us.lock().report(),
            remote_get_latency: s.fetch_us.lock().report(),
            peers,
        }
    }
}
