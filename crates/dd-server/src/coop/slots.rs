//! Who gets a connection on the peer listener, so that no connection, authenticated or not, keeps a
//! member from reaching this node (issue 30, items 1 and 3).
//!
//! * **Handshake slots** come from two kinds of pools. A connection from an IP address in the
//!   membership (a peer's `addr`) takes one of that address's `coop.handshakes_per_member` slots; any
//!   other connection one of `coop.max_connections` shared by all other addresses. When its pool is
//!   full, a new connection **displaces the oldest handshake of the same pool**: a flood from
//!   elsewhere, however fast, never displaces a member's handshake, however slow (a TCP connection
//!   needs its source address to answer, so the address cannot be borrowed). A flood from a member's
//!   own address displaces only that address's handshakes.
//! * **Sessions**: an authenticated node holds at most `coop.max_sessions_per_peer` sessions; its next
//!   AUTH is answered `busy` and closed, so one member cannot take the sessions every other member
//!   needs (sessions idle for `coop.idle_timeout_ms` are closed by the listener).
//!
//! Invariants: every slot is released exactly once (by `Drop`); a pool never holds more handshakes
//! than its limit; the lock is a leaf held only for map updates.

use crate::admission::PerKey;
use parking_lot::Mutex;
use std::collections::{BTreeMap, HashMap};
use std::net::IpAddr;
use std::sync::Arc;
use tokio::sync::oneshot;

/// Which pool a handshake slot is drawn from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum PoolKey {
    /// Addresses in the membership, each its own pool.
    Member(IpAddr),
    /// Every other address, together.
    Other,
}

#[derive(Debug, Default)]
struct Inner {
    /// Each pool's handshakes, oldest first, with the sender that tells one to close.
    handshakes: HashMap<PoolKey, BTreeMap<u64, oneshot::Sender<()>>>,
    /// Sessions per authenticated node name.
    sessions: PerKey<String>,
    next_id: u64,
}

/// The peer listener's slots.
#[derive(Debug)]
pub struct PeerSlots {
    per_member: usize,
    others: usize,
    per_peer: usize,
    inner: Mutex<Inner>,
}

/// A slot held by a connection in its handshake; `displaced` fires when a newer connection of its
/// pool took it.
#[derive(Debug)]
pub struct Handshake {
    slots: Arc<PeerSlots>,
    pool: PoolKey,
    id: u64,
    pub displaced: oneshot::Receiver<()>,
}

/// A session slot of an authenticated node.
#[derive(Debug)]
pub struct Session {
    slots: Arc<PeerSlots>,
    name: String,
}

impl PeerSlots {
    /// `per_member` handshakes per membership address, `others` for all other addresses together,
    /// `per_peer` sessions per node.
    pub fn new(per_member: usize, others: usize, per_peer: usize) -> Arc<PeerSlots> {
        Arc::new(PeerSlots { per_member, others, per_peer, inner: Mutex::new(Inner::default()) })
    }

    /// A handshake slot for a connection from `ip` (`member`: an address in the membership),
    /// displacing the oldest handshake of its pool when that is full; `None` when the pool has no
    /// slot at all (a limit of 0).
    pub fn accept(self: &Arc<Self>, ip: IpAddr, member: bool) -> Option<Handshake> {
        let (pool, limit) =
            if member { (PoolKey::Member(ip), self.per_member) } else { (PoolKey::Other, self.others) };
        if limit == 0 {
            return None;
        }
        let mut g = self.inner.lock();
        let id = g.next_id;
        g.next_id += 1;
        let q = g.handshakes.entry(pool).or_default();
        if q.len() >= limit {
            if let Some((_, tx)) = q.pop_first() {
                let _ = tx.send(());
            }
        }
        let (tx, rx) = oneshot::channel();
        q.insert(id, tx);
        Some(Handshake { slots: self.clone(), pool, id, displaced: rx })
    }

    /// Handshakes held now in the pool of `ip` (for tests and the report).
    pub fn handshakes(&self, ip: IpAddr, member: bool) -> usize {
        let pool = if member { PoolKey::Member(ip) } else { PoolKey::Other };
        self.inner.lock().handshakes.get(&pool).map_or(0, |q| q.len())
    }
}

impl Handshake {
    /// The handshake proved `name`: its slot becomes one of that node's sessions, or `None` when the
    /// node holds its maximum already (the handshake slot is released either way).
    pub fn authenticate(&mut self, name: &str) -> Option<Session> {
        let slots = self.slots.clone();
        self.release();
        if !slots.inner.lock().sessions.take(name.to_string(), slots.per_peer) {
            return None;
        }
        Some(Session { slots, name: name.to_string() })
    }
}

impl Handshake {
    /// Gives the handshake slot back (at most once: `id` is then no longer in its pool).
    fn release(&mut self) {
        let mut g = self.slots.inner.lock();
        if let Some(q) = g.handshakes.get_mut(&self.pool) {
            q.remove(&self.id);
            if q.is_empty() {
                g.handshakes.remove(&self.pool);
            }
        }
    }
}

impl Drop for Handshake {
    fn drop(&mut self) {
        self.release();
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        self.slots.inner.lock().sessions.give_back(&self.name);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn others_never_displace_a_member_and_sessions_are_capped_per_node() {
        let s = PeerSlots::new(2, 3, 2);
        let (member, other): (IpAddr, IpAddr) = ("10.0.0.1".parse().unwrap(), "10.0.0.9".parse().unwrap());
        let mut a = s.accept(member, true).unwrap();
        let mut flood: Vec<Handshake> = (0..100).map(|_| s.accept(other, false).unwrap()).collect();
        assert!(a.displaced.try_recv().is_err(), "a member's handshake was displaced by others");
        assert_eq!(s.handshakes(other, false), 3);
        let live = flood.iter_mut().map(|h| h.displaced.try_recv().is_err()).filter(|&open| open).count();
        assert_eq!(live, 3, "only the newest of the others' pool hold slots");
        // The member's own pool displaces oldest first.
        let _b = s.accept(member, true).unwrap();
        let _c = s.accept(member, true).unwrap();
        assert!(a.displaced.try_recv().is_ok());
        // Sessions: two per node, then refused; a freed one can be taken again.
        let s1 = s.accept(member, true).unwrap().authenticate("a").unwrap();
        let _s2 = s.accept(member, true).unwrap().authenticate("a").unwrap();
        assert!(s.accept(member, true).unwrap().authenticate("a").is_none());
        assert!(s.accept(member, true).unwrap().authenticate("b").is_some(), "another node is not held back");
        drop(s1);
        assert!(s.accept(member, true).unwrap().authenticate("a").is_some());
        drop(flood);
        assert_eq!(s.handshakes(other, false), 0);
    }
}
