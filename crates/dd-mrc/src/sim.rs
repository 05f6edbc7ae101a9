//! Cache simulators for one size: LRU, FIFO and S3-FIFO, in slots or bytes.
//!
//! These are what [`crate::MiniSim`] runs at `R x size`, and, at full size, the brute-force references
//! of the tests. Queues are `VecDeque`s of `(key, stamp)` records with lazy deletion (the engine's
//! `order.rs` does the same): an entry's live record carries its current stamp; a hit under LRU or a
//! removal leaves a stale record that is skipped at the head, and a queue holding more than twice its
//! live entries is compacted, so memory is O(entries) and every operation amortised O(1).
//!
//! S3-FIFO is the engine's (`dd-engine/src/order.rs`, after Yang et al., SOSP'23): new keys enter a
//! small FIFO unless a ghost FIFO remembers them, in which case they go to the main FIFO; a hit raises
//! a 2-bit frequency; the small queue is evicted from while it holds at least 10% of the cached units
//! (its head moves to main if it was hit, otherwise it leaves and is remembered as a ghost); main's head
//! is re-queued with its frequency decremented while it is non-zero. The ghost remembers as many keys
//! as the cache holds (at least 16).

use crate::Policy;
use std::collections::{HashMap, VecDeque};

type Map<V> = HashMap<u64, V, foldhash::fast::FixedState>;

fn map<V>() -> Map<V> {
    Map::with_hasher(foldhash::fast::FixedState::with_seed(0x5_1a_1c))
}

#[derive(Debug, Clone, Copy)]
struct Entry {
    size: u64,
    stamp: u64,
    freq: u8,
    /// S3-FIFO: in the small queue (otherwise main).
    small: bool,
}

/// One simulated cache of a fixed capacity.
#[derive(Debug)]
pub struct CacheSim {
    policy: Policy,
    capacity: u64,
    entries: Map<Entry>,
    /// FIFO / LRU: the only queue; S3-FIFO: main.
    main: VecDeque<(u64, u64)>,
    small: VecDeque<(u64, u64)>,
    main_used: u64,
    small_used: u64,
    ghost: VecDeque<(u64, u64)>,
    ghost_keys: Map<u64>,
    next_stamp: u64,
}

impl CacheSim {
    /// An empty cache of `capacity` units (slots, or bytes for sized accesses).
    pub fn new(policy: Policy, capacity: u64) -> CacheSim {
        CacheSim {
            policy,
            capacity,
            entries: map(),
            main: VecDeque::new(),
            small: VecDeque::new(),
            main_used: 0,
            small_used: 0,
            ghost: VecDeque::new(),
            ghost_keys: map(),
            next_stamp: 0,
        }
    }

    pub fn capacity(&self) -> u64 {
        self.capacity
    }

    /// Units in use.
    pub fn used(&self) -> u64 {
        self.main_used + self.small_used
    }

    /// Keys cached.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    fn stamp(&mut self) -> u64 {
        self.next_stamp += 1;
        self.next_stamp
    }

    /// References `key` of `size` units (> 0): whether it hit. A missing key is inserted unless it is
    /// larger than the whole cache.
    pub fn access(&mut self, key: u64, size: u64) -> bool {
        if let Some(e) = self.entries.get_mut(&key) {
            match self.policy {
                Policy::Fifo => {}
                Policy::Lru => {
                    self.next_stamp += 1;
                    e.stamp = self.next_stamp;
                    self.main.push_back((key, self.next_stamp));
                    self.compact_if_stale();
                }
                Policy::S3Fifo => e.freq = (e.freq + 1).min(3),
            }
            return true;
        }
        if size > self.capacity {
            return false;
        }
        let stamp = self.stamp();
        let to_main = self.policy != Policy::S3Fifo || self.ghost_keys.remove(&key).is_some();
        self.entries.insert(key, Entry { size, stamp, freq: 0, small: !to_main });
        if to_main {
            self.main.push_back((key, stamp));
            self.main_used += size;
        } else {
            self.small.push_back((key, stamp));
            self.small_used += size;
        }
        self.evict_to_capacity();
        false
    }

    /// Forgets `key` (a sampled key that sampling dropped). Returns whether it was cached.
    pub fn remove(&mut self, key: u64) -> bool {
        self.ghost_keys.remove(&key);
        let Some(e) = self.entries.remove(&key) else { return false };
        if e.small {
            self.small_used -= e.size;
        } else {
            self.main_used -= e.size;
        }
        self.compact_if_stale();
        true
    }

    /// Changes the capacity, evicting down to it.
    pub fn set_capacity(&mut self, capacity: u64) {
        self.capacity = capacity;
        self.evict_to_capacity();
    }

    fn evict_to_capacity(&mut self) {
        while self.used() > self.capacity {
            self.evict_one();
        }
    }

    /// The live record at the head of a queue, stale ones dropped.
    fn head(entries: &Map<Entry>, q: &mut VecDeque<(u64, u64)>) -> Option<(u64, Entry)> {
        while let Some(&(k, s)) = q.front() {
            match entries.get(&k) {
                Some(e) if e.stamp == s => return Some((k, *e)),
                _ => {
                    q.pop_front();
                }
            }
        }
        None
    }

    fn evict_one(&mut self) {
        if self.policy != Policy::S3Fifo {
            let (k, e) = Self::head(&self.entries, &mut self.main).expect("over capacity, so not empty");
            self.main.pop_front();
            self.entries.remove(&k);
            self.main_used -= e.size;
            return;
        }
        loop {
            if self.small_used > 0 && (self.small_used * 10 >= self.used() || self.main_used == 0) {
                let (k, e) = Self::head(&self.entries, &mut self.small).expect("small_used > 0");
                self.small.pop_front();
                self.small_used -= e.size;
                if e.freq > 0 {
                    let stamp = self.stamp();
                    self.entries.insert(k, Entry { stamp, freq: 0, small: false, ..e });
                    self.main.push_back((k, stamp));
                    self.main_used += e.size;
                    continue;
                }
                self.entries.remove(&k);
                self.remember_ghost(k);
                return;
            }
            let (k, e) = Self::head(&self.entries, &mut self.main).expect("main_used > 0");
            self.main.pop_front();
            if e.freq > 0 {
                let stamp = self.stamp();
                self.entries.insert(k, Entry { stamp, freq: e.freq - 1, ..e });
                self.main.push_back((k, stamp));
                continue;
            }
            self.entries.remove(&k);
            self.main_used -= e.size;
            return;
        }
    }

    fn remember_ghost(&mut self, key: u64) {
        let stamp = self.stamp();
        self.ghost_keys.insert(key, stamp);
        self.ghost.push_back((key, stamp));
        let bound = self.entries.len().max(16);
        while self.ghost_keys.len() > bound {
            let Some((k, s)) = self.ghost.pop_front() else { break };
            if self.ghost_keys.get(&k) == Some(&s) {
                self.ghost_keys.remove(&k);
            }
        }
        if self.ghost.len() > 2 * self.ghost_keys.len() + 64 {
            let keys = &self.ghost_keys;
            self.ghost.retain(|(k, s)| keys.get(k) == Some(s));
        }
    }

    fn compact_if_stale(&mut self) {
        let live = self.entries.len();
        if self.main.len() + self.small.len() > 2 * live + 64 {
            let entries = &self.entries;
            let is_live = |&(k, s): &(u64, u64)| entries.get(&k).is_some_and(|e| e.stamp == s);
            self.main.retain(is_live);
            self.small.retain(is_live);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(policy: Policy, cap: u64, keys: &[u64]) -> Vec<bool> {
        let mut c = CacheSim::new(policy, cap);
        keys.iter().map(|&k| c.access(k, 1)).collect()
    }

    #[test]
    fn fifo_does_not_reorder_on_hits_and_lru_does() {
        let trace = [1, 2, 1, 3, 1];
        // FIFO(2): 1 m, 2 m, 1 h, 3 m (evicts 1), 1 m.
        assert_eq!(run(Policy::Fifo, 2, &trace), [false, false, true, false, false]);
        // LRU(2): 1 m, 2 m, 1 h, 3 m (evicts 2), 1 h.
        assert_eq!(run(Policy::Lru, 2, &trace), [false, false, true, false, true]);
    }

    #[test]
    fn s3fifo_keeps_a_hot_key_through_a_scan() {
        let mut c = CacheSim::new(Policy::S3Fifo, 20);
        c.access(7, 1);
        c.access(7, 1); // freq 1 in small
        for k in 100..200 {
            c.access(k, 1);
        }
        assert!(c.access(7, 1), "the hit key moved to main and survived the scan");
        let lru = run(Policy::Lru, 20, &[&[7, 7][..], &(100..200).collect::<Vec<_>>(), &[7]].concat());
        assert!(!lru[lru.len() - 1], "LRU loses it");
        assert!(c.used() <= 20);
    }

    #[test]
    fn s3fifo_ghost_hit_goes_to_main() {
        let mut c = CacheSim::new(Policy::S3Fifo, 10);
        for k in 0..30 {
            c.access(k, 1);
        }
        // Key 19 left the small queue unhit: a ghost; a re-reference enters main.
        assert!(!c.access(19, 1));
        assert!(!c.entries[&19].small);
    }

    #[test]
    fn sizes_capacity_and_removal() {
        let mut c = CacheSim::new(Policy::Fifo, 100);
        assert!(!c.access(1, 60));
        assert!(!c.access(2, 60)); // evicts 1
        assert!(!c.access(1, 60));
        assert!(!c.access(3, 200)); // larger than the cache: not admitted
        assert_eq!(c.used(), 60);
        assert!(c.remove(1));
        assert_eq!(c.used(), 0);
        for k in 0..10 {
            c.access(k, 10);
        }
        c.set_capacity(30);
        assert_eq!(c.used(), 30);
        assert!(c.access(9, 10) && !c.access(0, 10));
    }
}
