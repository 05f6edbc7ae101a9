//! Co-operative de-duplication as the rest of the daemon sees it, below the layer itself: the
//! [`CoopHandle`] trait through which the shared state (`state`), the request handler, the admin API
//! and shutdown reach the running layer, and the reports it returns ([`CoopReport`], [`PeerReport`],
//! [`LatencyReport`]), which `metrics` renders.
//!
//! Invariant: this module imports no other module of the daemon, so `state` and `metrics` can name
//! the co-operative layer without importing `coop`, which imports them (imports go one way: `coop`
//! above `state`, `admission` and `metrics`, and all of them above this module). `coop::Coop` is the
//! only implementation; the trait's methods are its methods of the same names.

use dd_engine::RemoteRef;
use serde::{Deserialize, Serialize};

/// The running co-operative layer (`coop::Coop`), as the state holds it once `crate::run` started it.
pub trait CoopHandle: Send + Sync + std::fmt::Debug {
    /// A remotified get: the page's bytes from the first of its holders that has them into `out`, or
    /// false (a clean miss) if every holder is unreachable, restarted, no longer holds the pin or
    /// returns other bytes.
    fn fetch(&self, r: &RemoteRef, out: &mut [u8]) -> bool;
    /// Releases a remote reference's pin after an exclusive remotified get (queued, best effort).
    fn release(&self, r: RemoteRef);
    /// Statistics and peers for the admin API and `/metrics`.
    fn report(&self) -> CoopReport;
    /// Rebuilds the summary from the live frames and pushes it to every active peer. Returns the
    /// peers reached.
    fn publish(&self) -> usize;
    /// Stops the remotifier (shutdown).
    fn close(&self);
}

/// Percentiles of a latency histogram (0 when empty).
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
pub struct LatencyReport {
    pub count: u64,
    pub p50_us: u64,
    pub p99_us: u64,
}

/// A snapshot of the co-operative layer's counters (`coop::CoopStats`) plus its peers, for the
/// admin API and `/metrics`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct CoopReport {
    pub node_name: String,
    /// This daemon's public key (base64), which the other members list for it.
    pub public_key: String,
    pub epoch: u64,
    pub offered: u64,
    pub queued: u64,
    pub dropped: u64,
    pub remotified: u64,
    pub no_candidate: u64,
    pub compare_mismatches: u64,
    pub remotify_errors: u64,
    pub stale_installs: u64,
    pub remote_gets_hit: u64,
    pub remote_gets_missed: u64,
    pub unpins_sent: u64,
    pub summaries_sent: u64,
    pub summaries_received: u64,
    pub compares_served: u64,
    pub remote_dedups: u64,
    pub fetches_served: u64,
    pub pins_held: u64,
    pub pins_released_epoch: u64,
    pub pins_released_ttl: u64,
    pub references_dropped: u64,
    pub peer_failures: u64,
    pub auth_failures: u64,
    /// AUTHs answered `busy` (the node held `coop.max_sessions_per_peer` sessions).
    pub sessions_refused: u64,
    /// Peer sessions closed after `coop.idle_timeout_ms` without a frame.
    pub sessions_idle_closed: u64,
    /// Peer connections closed on a record that failed authentication.
    pub records_refused: u64,
    /// Successful remotifications: offer taken to pin installed.
    pub remotify_latency: LatencyReport,
    /// Remotified gets that hit: the peer fetch.
    pub remote_get_latency: LatencyReport,
    pub peers: Vec<PeerReport>,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct PeerReport {
    pub name: String,
    pub addr: String,
    /// In the membership now.
    pub active: bool,
    /// Whether a summary from it is held, and its age.
    pub summary_age_ms: Option<u64>,
    /// Pins this daemon holds for it.
    pub pins_held_for: u64,
    /// Milliseconds left of its back-off after a failed request (no request goes to it until then; a
    /// publication ends the back-off early); 0 when it is not backed off.
    pub backoff_ms: u64,
}
