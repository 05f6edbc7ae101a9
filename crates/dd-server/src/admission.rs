//! Connection admission of the data plane: who gets a connection slot, so that no client, authenticated
//! or not, can keep another VM from being served (SPEC section 6, "Hostile tenants").
//!
//! * At most `max_connections` connections hold a slot. An accepted connection first holds a
//!   **handshake slot** until its HELLO succeeds (bounded by `handshake_timeout_ms` elsewhere).
//! * When every slot is taken, a new connection **displaces the oldest connection still in its
//!   handshake** (it is told to close): clients that never authenticate cannot keep one that does out,
//!   since a real HELLO takes a round trip and a slow one takes the deadline. Only when every slot is
//!   held by an authenticated session is a new connection refused (`busy`, in answer to its HELLO).
//! * An authenticated session also holds one of its VM's `max_connections_per_vm` slots; a HELLO
//!   beyond that is answered `busy`, so one VM's sessions cannot take every slot.
//!
//! Invariants: `total` = handshake slots + authenticated slots, never above the limit; every slot is
//! released exactly once (by `Drop`). The lock is a leaf held only for counter updates.

use crate::metrics::Metrics;
use dd_engine::VmId;
use parking_lot::Mutex;
use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use tokio::sync::oneshot;

/// Slots held per key (a VM's sessions here, a peer node's in `coop::slots`): a key is in the map only
/// while it holds at least one.
#[derive(Debug)]
pub(crate) struct PerKey<K>(HashMap<K, usize>);

impl<K> Default for PerKey<K> {
    fn default() -> Self {
        PerKey(HashMap::new())
    }
}

impl<K: std::hash::Hash + Eq> PerKey<K> {
    /// Takes one of `key`'s `max` slots; false when it holds them all.
    pub(crate) fn take(&mut self, key: K, max: usize) -> bool {
        if self.0.get(&key).is_some_and(|&n| n >= max) || max == 0 {
            return false;
        }
        *self.0.entry(key).or_insert(0) += 1;
        true
    }

    /// Gives one of `key`'s slots back.
    pub(crate) fn give_back(&mut self, key: &K) {
        if let Some(n) = self.0.get_mut(key) {
            *n -= 1;
            if *n == 0 {
                self.0.remove(key);
            }
        }
    }

    #[cfg(test)]
    pub(crate) fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Keys holding a slot now.
    pub(crate) fn keys(&self) -> usize {
        self.0.len()
    }
}

/// Connections answered `busy` at the same time at most (each reads a HELLO for its request id);
/// beyond it a refused connection is closed without an answer.
pub const MAX_REFUSING: usize = 64;

#[derive(Debug, Default)]
struct Inner {
    total: usize,
    /// Connections in their handshake, oldest first, with the sender that tells one to close.
    handshaking: BTreeMap<u64, oneshot::Sender<()>>,
    per_vm: PerKey<VmId>,
    next_id: u64,
}

/// The data plane's connection slots.
#[derive(Debug)]
pub struct Admission {
    max_connections: usize,
    max_per_vm: usize,
    inner: Mutex<Inner>,
    /// Connections being refused now (see [`MAX_REFUSING`]).
    pub refusing: AtomicUsize,
    metrics: Arc<Metrics>,
}

/// A slot held by a connection in its handshake. `displaced` fires when a newer connection took it.
#[derive(Debug)]
pub struct HandshakeSlot {
    adm: Arc<Admission>,
    id: u64,
    pub displaced: oneshot::Receiver<()>,
    done: bool,
}

/// Why a handshake slot did not become a session slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Refused {
    #[error("a newer connection took this connection's slot")]
    Displaced,
    #[error("the VM has its maximum of sessions")]
    VmLimit,
}

/// A slot held by an authenticated session of `vm`.
#[derive(Debug)]
pub struct SessionSlot {
    adm: Arc<Admission>,
    vm: VmId,
}

impl Admission {
    pub fn new(max_connections: usize, max_per_vm: usize, metrics: Arc<Metrics>) -> Arc<Admission> {
        Arc::new(Admission {
            max_connections,
            max_per_vm,
            inner: Mutex::new(Inner::default()),
            refusing: AtomicUsize::new(0),
            metrics,
        })
    }

    /// A handshake slot for a newly accepted connection, displacing the oldest handshake if every slot
    /// is taken; `None` when every slot belongs to an authenticated session.
    pub fn accept(self: &Arc<Self>) -> Option<HandshakeSlot> {
        let m = &self.metrics;
        let mut g = self.inner.lock();
        if g.total >= self.max_connections {
            let (_, tx) = match g.handshaking.pop_first() {
                Some(oldest) => oldest,
                None => {
                    drop(g);
                    m.connections_rejected.fetch_add(1, Ordering::Relaxed);
                    return None;
                }
            };
            // The displaced connection's slot passes to this one (total unchanged).
            let _ = tx.send(());
            m.connections_displaced.fetch_add(1, Ordering::Relaxed);
        } else {
            g.total += 1;
            m.connections_active.fetch_add(1, Ordering::Relaxed);
        }
        let id = g.next_id;
        g.next_id += 1;
        let (tx, rx) = oneshot::channel();
        g.handshaking.insert(id, tx);
        drop(g);
        m.connections_total.fetch_add(1, Ordering::Relaxed);
        Some(HandshakeSlot { adm: self.clone(), id, displaced: rx, done: false })
    }

    /// (connections in their handshake, VMs holding a session slot): the admission's tables, each
    /// back to 0 when its connections are gone.
    pub fn table_sizes(&self) -> (usize, usize) {
        let g = self.inner.lock();
        (g.handshaking.len(), g.per_vm.keys())
    }

    fn release_total(&self, g: &mut Inner) {
        g.total -= 1;
        self.metrics.connections_active.fetch_sub(1, Ordering::Relaxed);
    }
}

impl HandshakeSlot {
    /// The HELLO of `vm` succeeded: turns the slot into a session slot, or gives it back (`Err`) when
    /// the VM already has its maximum of sessions, or when the slot was displaced meanwhile.
    pub fn authenticate(mut self, vm: VmId) -> Result<SessionSlot, Refused> {
        let adm = self.adm.clone();
        let mut g = adm.inner.lock();
        // Displaced: the slot now belongs to the connection that displaced this one.
        let Some(_) = g.handshaking.remove(&self.id) else {
            self.done = true;
            return Err(Refused::Displaced);
        };
        self.done = true;
        if !g.per_vm.take(vm, adm.max_per_vm) {
            adm.release_total(&mut g);
            drop(g);
            adm.metrics.connections_rejected.fetch_add(1, Ordering::Relaxed);
            return Err(Refused::VmLimit);
        }
        Ok(SessionSlot { adm: adm.clone(), vm })
    }
}

impl Drop for HandshakeSlot {
    fn drop(&mut self) {
        if self.done {
            return;
        }
        let mut g = self.adm.inner.lock();
        // A displaced slot was already handed to another connection.
        if g.handshaking.remove(&self.id).is_some() {
            self.adm.release_total(&mut g);
        }
    }
}

impl Drop for SessionSlot {
    fn drop(&mut self) {
        let mut g = self.adm.inner.lock();
        g.per_vm.give_back(&self.vm);
        self.adm.release_total(&mut g);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn handshakes_are_displaced_oldest_first_and_sessions_are_capped_per_vm() {
        let adm = Admission::new(3, 2, Arc::new(Metrics::new()));
        let mut a = adm.accept().unwrap();
        let b = adm.accept().unwrap();
        let c = adm.accept().unwrap();
        // Full of handshakes: the next one displaces the oldest (a).
        let d = adm.accept().unwrap();
        assert!(a.displaced.try_recv().is_ok());
        assert!(a.authenticate(VmId(1)).is_err(), "a displaced handshake cannot authenticate");
        let sb = b.authenticate(VmId(1)).unwrap();
        let sc = c.authenticate(VmId(1)).unwrap();
        // VM 1 has its two sessions: a third is refused and its slot freed.
        assert!(d.authenticate(VmId(1)).is_err());
        let e = adm.accept().unwrap();
        let se = e.authenticate(VmId(2)).unwrap();
        // Every slot is a session now: refused.
        assert!(adm.accept().is_none());
        drop(sb);
        let f = adm.accept().unwrap();
        drop(f);
        drop((sc, se));
        assert_eq!(adm.inner.lock().total, 0);
        assert!(adm.inner.lock().per_vm.is_empty());
    }
}
