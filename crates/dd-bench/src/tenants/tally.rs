//! What an attack of `bench tenants` did, counted by the attack's threads (`attacks` and `peers` both
//! count into it; a module of its own so that neither imports the other for it).

use std::sync::atomic::{AtomicU64, Ordering};

/// What an attack did.
#[derive(Debug, Default)]
pub struct Tally {
    pub actions: AtomicU64,
    /// Things that must never happen (an old registration's session served).
    pub leaks: AtomicU64,
    /// Bytes of frames the attacker got into its sockets (what the kernel took from its writes).
    pub bytes_sent: AtomicU64,
    /// CPU time of the attacker's thread (user and system), nanoseconds.
    pub cpu_ns: AtomicU64,
}

impl Tally {
    pub(super) fn act(&self, n: u64) {
        self.actions.fetch_add(n, Ordering::Relaxed);
    }

    pub(super) fn sent(&self, n: usize) {
        self.bytes_sent.fetch_add(n as u64, Ordering::Relaxed);
    }
}
