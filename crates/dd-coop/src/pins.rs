//! The pin table a daemon keeps for its peers (Algorithm 4's bookkeeping, SPEC section 9): which
//! engine pins it holds on behalf of each authenticated peer, under which handles, since which epoch.
//!
//! Pure state, no I/O, no engine: every operation returns the engine pins the caller must release, and
//! time is a parameter (`now`), never read here, so the rules are testable without clocks or sockets.
//!
//! Invariants:
//! * **Pins never leak forever.** A peer's pins are released when it authenticates with another epoch
//!   (it restarted and holds none of its old references: [`PinTable::hello`]), when it has not been
//!   heard from for the pin TTL ([`PinTable::expire`]), and when it unpins them ([`PinTable::unpin`]).
//! * **Handles are private to their owner.** A handle is looked up only among the pins of the peer it
//!   was granted to, so no node can fetch or release another's pins by guessing; handles are never 0
//!   and unique per owner.
//! * **No pin without an owner.** [`PinTable::grant`] refuses when the peer has no entry in the
//!   session's epoch (a stale session of an epoch that authenticated since): the caller releases the
//!   engine pin at once.
//! * **A live session keeps its entry.** A request of an authenticated session ([`PinTable::touch`])
//!   re-enters a peer whose entry the TTL removed: the peer proved its name on this connection and is
//!   plainly alive, and its old handles were released with the entry (its fetches of them miss). Were
//!   it refused instead, a connection that outlived its entry would be refused every compare for as
//!   long as it stayed open (the regression test in `tests/fake_net.rs`).

use std::collections::HashMap;
use std::time::{Duration, Instant};

/// Why a pin could not be recorded for a peer.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum PinError {
    /// The peer has no entry (never said HELLO, or expired since and not heard from again).
    #[error("peer {0:?} has no pin table entry")]
    UnknownPeer(String),
    /// The peer's entry is of another epoch than the session asking: the session is stale (the peer
    /// restarted and authenticated again on another connection).
    #[error("peer {peer:?} authenticated in epoch {current} since this session's epoch {session}")]
    OtherEpoch { peer: String, session: u64, current: u64 },
}

/// Pins held for one authenticated peer.
#[derive(Debug)]
struct Owner {
    epoch: u64,
    /// Handle → engine pin.
    pins: HashMap<u64, u64>,
    last_heard: Instant,
}

/// The pins held for every peer, by authenticated name.
#[derive(Debug, Default)]
pub struct PinTable {
    owners: HashMap<String, Owner>,
}

impl PinTable {
    pub fn new() -> Self {
        Self::default()
    }

    /// `peer` proved its name in `epoch` at `now`. A new epoch means it restarted and lost every
    /// reference: its old pins are returned for the caller to release.
    pub fn hello(&mut self, peer: &str, epoch: u64, now: Instant) -> Vec<u64> {
        let o = self.owners.entry(peer.to_string()).or_insert_with(|| Owner {
            epoch,
            pins: HashMap::new(),
            last_heard: now,
        });
        o.last_heard = now;
        if o.epoch == epoch {
            return Vec::new();
        }
        o.epoch = epoch;
        o.pins.drain().map(|(_, pin)| pin).collect()
    }

    /// A session of `peer` authenticated in `epoch` was heard from at `now` (any request counts: it
    /// keeps its pins alive). A peer without an entry (the TTL removed it while the connection stayed
    /// open) is entered again, with no pins; an entry of another epoch is left alone, so that a stale
    /// session does not keep a newer one's pins alive.
    pub fn touch(&mut self, peer: &str, epoch: u64, now: Instant) {
        let o = self.owners.entry(peer.to_string()).or_insert_with(|| Owner {
            epoch,
            pins: HashMap::new(),
            last_heard: now,
        });
        if o.epoch == epoch {
            o.last_heard = now;
        }
    }

    /// Records `engine_pin` for `peer` under a fresh handle drawn from `draw` (redrawn while it is 0
    /// or already one of the peer's handles); the handle is what the peer gets.
    /// Refused unless `peer`'s entry is of the session's `epoch`.
    pub fn grant(
        &mut self,
        peer: &str,
        epoch: u64,
        engine_pin: u64,
        mut draw: impl FnMut() -> u64,
    ) -> Result<u64, PinError> {
        let o = self.owners.get_mut(peer).ok_or_else(|| PinError::UnknownPeer(peer.to_string()))?;
        if o.epoch != epoch {
            return Err(PinError::OtherEpoch { peer: peer.to_string(), session: epoch, current: o.epoch });
        }
        let handle = loop {
            let h = draw();
            if h != 0 && !o.pins.contains_key(&h) {
                break h;
            }
        };
        o.pins.insert(handle, engine_pin);
        Ok(handle)
    }

    /// The engine pin behind `handle`, looked up only among `peer`'s pins.
    pub fn lookup(&self, peer: &str, handle: u64) -> Option<u64> {
        self.owners.get(peer).and_then(|o| o.pins.get(&handle).copied())
    }

    /// `peer` releases `handles`: the engine pins that were its own are returned (others' handles and
    /// unknown ones are ignored, so a duplicated unpin releases nothing twice).
    pub fn unpin(&mut self, peer: &str, handles: impl IntoIterator<Item = u64>) -> Vec<u64> {
        match self.owners.get_mut(peer) {
            Some(o) => handles.into_iter().filter_map(|h| o.pins.remove(&h)).collect(),
            None => Vec::new(),
        }
    }

    /// Forgets every peer not heard from for `ttl` at `now` (it has forgotten us too: see the
    /// daemon's reference expiry) and returns their pins for the caller to release.
    pub fn expire(&mut self, now: Instant, ttl: Duration) -> Vec<u64> {
        let mut released = Vec::new();
        self.owners.retain(|_, o| {
            let alive = now.saturating_duration_since(o.last_heard) < ttl;
            if !alive {
                released.extend(o.pins.drain().map(|(_, pin)| pin));
            }
            alive
        });
        released
    }

    /// Pins held for `peer`.
    pub fn pins_of(&self, peer: &str) -> usize {
        self.owners.get(peer).map_or(0, |o| o.pins.len())
    }

    /// Pins held for every peer.
    pub fn len(&self) -> usize {
        self.owners.values().map(|o| o.pins.len()).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn counter() -> impl FnMut() -> u64 {
        let mut n = 0;
        move || {
            n += 1;
            n
        }
    }

    #[test]
    fn a_new_epoch_releases_every_old_pin() {
        let t0 = Instant::now();
        let mut t = PinTable::new();
        let mut draw = counter();
        assert!(t.hello("a", 7, t0).is_empty());
        let h1 = t.grant("a", 7, 100, &mut draw).unwrap();
        let h2 = t.grant("a", 7, 101, &mut draw).unwrap();
        assert_ne!(h1, h2);
        // The same epoch again (a reconnect) keeps them.
        assert!(t.hello("a", 7, t0).is_empty());
        assert_eq!(t.pins_of("a"), 2);
        let mut released = t.hello("a", 8, t0);
        released.sort();
        assert_eq!(released, vec![100, 101]);
        assert!(t.is_empty());
        assert_eq!(t.lookup("a", h1), None);
    }

    #[test]
    fn silence_past_the_ttl_releases_and_any_request_keeps_alive() {
        let t0 = Instant::now();
        let ttl = Duration::from_millis(1000);
        let mut t = PinTable::new();
        t.hello("a", 1, t0);
        t.hello("b", 1, t0);
        t.grant("a", 1, 1, counter()).unwrap();
        t.grant("b", 1, 2, counter()).unwrap();
        t.touch("b", 1, t0 + Duration::from_millis(900));
        assert!(t.expire(t0 + Duration::from_millis(999), ttl).is_empty());
        assert_eq!(t.expire(t0 + ttl, ttl), vec![1]);
        assert_eq!(t.pins_of("b"), 1);
        // An expired peer cannot be granted pins until its session is heard from again.
        assert_eq!(t.grant("a", 1, 3, counter()), Err(PinError::UnknownPeer("a".into())));
        assert_eq!(t.expire(t0 + Duration::from_millis(1900), ttl), vec![2]);
        assert!(t.is_empty());
    }

    #[test]
    fn a_session_heard_after_its_entry_expired_is_entered_again_but_a_stale_epoch_is_not() {
        let t0 = Instant::now();
        let ttl = Duration::from_millis(1000);
        let mut t = PinTable::new();
        t.hello("a", 1, t0);
        t.grant("a", 1, 10, counter()).unwrap();
        assert_eq!(t.expire(t0 + ttl, ttl), vec![10]);
        // The same session speaks again: a fresh entry, no old pins.
        t.touch("a", 1, t0 + ttl);
        assert_eq!(t.pins_of("a"), 0);
        let h = t.grant("a", 1, 11, counter()).unwrap();
        assert_eq!(t.lookup("a", h), Some(11));
        // The peer restarts (epoch 2, another connection); the old session's requests neither keep
        // the new entry alive nor get pins recorded under it.
        assert_eq!(t.hello("a", 2, t0 + ttl), vec![11]);
        t.touch("a", 1, t0 + ttl * 3 / 2);
        assert_eq!(
            t.grant("a", 1, 12, counter()),
            Err(PinError::OtherEpoch { peer: "a".into(), session: 1, current: 2 })
        );
        t.grant("a", 2, 13, counter()).unwrap();
        assert_eq!(t.expire(t0 + ttl * 2, ttl), vec![13], "the stale session kept the entry alive");
    }

    #[test]
    fn handles_are_private_to_their_owner_and_unpin_is_idempotent() {
        let t0 = Instant::now();
        let mut t = PinTable::new();
        t.hello("a", 1, t0);
        t.hello("b", 1, t0);
        // Both peers draw the same handle: each means its own pin.
        let ha = t.grant("a", 1, 10, || 5).unwrap();
        let hb = t.grant("b", 1, 20, || 5).unwrap();
        assert_eq!((ha, hb), (5, 5));
        assert_eq!(t.lookup("a", 5), Some(10));
        assert_eq!(t.lookup("b", 5), Some(20));
        assert_eq!(t.lookup("c", 5), None);
        assert!(t.unpin("c", [5]).is_empty());
        assert_eq!(t.unpin("a", [5, 6]), vec![10]);
        assert!(t.unpin("a", [5]).is_empty());
        assert_eq!(t.lookup("b", 5), Some(20));
    }

    #[test]
    fn grant_redraws_zero_and_taken_handles() {
        let t0 = Instant::now();
        let mut t = PinTable::new();
        t.hello("a", 1, t0);
        let mut seq = [0u64, 9, 9, 0, 4].into_iter();
        assert_eq!(t.grant("a", 1, 1, || seq.next().unwrap()).unwrap(), 9);
        assert_eq!(t.grant("a", 1, 2, || seq.next().unwrap()).unwrap(), 4);
    }
}
