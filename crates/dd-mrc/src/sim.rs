//! Cache simulators for one size: any eviction order (the MRC configuration names LRU, FIFO and
//! S3-FIFO), in slots or bytes.
//!
//! These are what [`crate::MiniSim`] runs at `R x size`, and, at full size, the brute-force references
//! of the tests. The order's decisions (what a hit does, which list gives the victim, what becomes of
//! a list's head) are the engine's own: one file per order in `dd-types/src/order/` (D37), asked
//! through [`EvictionOrder`]; this module keeps the entries, their sizes and the ghost. Queues are
//! [`LazyList`]s of `(key, stamp)` records with lazy deletion, as the engine's: an entry's live record
//! carries its current stamp (stamps are unique across both lists); a requeue or a removal leaves a
//! stale record that is skipped at the head, so memory is O(entries) and every operation amortised
//! O(1).
//!
//! Units are what the order's `victim_list` weighs (S3-FIFO's 10% small list is 10% of the cached
//! units). The ghost of a probation order (S3-FIFO) remembers as many keys as the cache holds (at
//! least 16); a remembered key seen again enters main.

use crate::Policy;
use dd_types::order::{AtHead, LazyList, List, OnHit, MAX_FREQ};
use dd_types::EvictionOrder;
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
    /// In the small list (probation orders; otherwise main).
    small: bool,
}

impl Entry {
    fn list(&self) -> List {
        if self.small {
            List::Small
        } else {
            List::Main
        }
    }
}

/// Whether `(key, stamp)` is its entry's live record.
fn is_live(entries: &Map<Entry>, &(k, s): &(u64, u64)) -> bool {
    entries.get(&k).is_some_and(|e| e.stamp == s)
}

/// One simulated cache of a fixed capacity.
#[derive(Debug)]
pub struct CacheSim {
    order: EvictionOrder,
    capacity: u64,
    entries: Map<Entry>,
    /// Indexed by [`List::index`]: main (the only list of orders without probation), small.
    lists: [LazyList<(u64, u64)>; 2],
    /// Units in each list, indexed as `lists`.
    used: [u64; 2],
    ghost: VecDeque<(u64, u64)>,
    ghost_keys: Map<u64>,
    next_stamp: u64,
}

impl CacheSim {
    /// An empty cache of `capacity` units (slots, or bytes for sized accesses).
    pub fn new(policy: Policy, capacity: u64) -> CacheSim {
        CacheSim::of_order(policy.eviction_order(), capacity)
    }

    /// An empty cache of `capacity` units running any of the engine's orders.
    pub fn of_order(order: EvictionOrder, capacity: u64) -> CacheSim {
        CacheSim {
            order,
            capacity,
            entries: map(),
            lists: [LazyList::default(), LazyList::default()],
            used: [0; 2],
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
        self.used[0] + self.used[1]
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

    /// Appends `key`'s record (its entry already carries `stamp`) to `list`.
    fn enqueue(&mut self, list: List, key: u64, stamp: u64) {
        let entries = &self.entries;
        self.lists[list.index()].push((key, stamp), |r| is_live(entries, r));
    }

    /// Counts one entry out of `list` (its record is stale, or popped).
    fn retire(&mut self, list: List) {
        let entries = &self.entries;
        self.lists[list.index()].retire(|r| is_live(entries, r));
    }

    /// References `key` of `size` units (> 0): whether it hit. A missing key is inserted unless it is
    /// larger than the whole cache.
    pub fn access(&mut self, key: u64, size: u64) -> bool {
        if let Some(e) = self.entries.get(&key).copied() {
            match self.order.on_hit() {
                OnHit::Nothing => {}
                OnHit::Requeue => {
                    let stamp = self.stamp();
                    self.entries.insert(key, Entry { stamp, ..e }); // the old record goes stale
                    self.retire(e.list());
                    self.enqueue(e.list(), key, stamp);
                }
                OnHit::Count => {
                    let freq = (e.freq + 1).min(MAX_FREQ);
                    self.entries.insert(key, Entry { freq, ..e });
                }
            }
            return true;
        }
        if size > self.capacity {
            return false;
        }
        let stamp = self.stamp();
        let to_main = !self.order.probation() || self.ghost_keys.remove(&key).is_some();
        let list = if to_main { List::Main } else { List::Small };
        self.entries.insert(key, Entry { size, stamp, freq: 0, small: !to_main });
        self.used[list.index()] += size;
        self.enqueue(list, key, stamp);
        self.evict_to_capacity();
        false
    }

    /// Forgets `key` (a sampled key that sampling dropped). Returns whether it was cached.
    pub fn remove(&mut self, key: u64) -> bool {
        self.ghost_keys.remove(&key);
        let Some(e) = self.entries.remove(&key) else { return false };
        self.used[e.list().index()] -= e.size;
        self.retire(e.list());
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

    /// Evicts one entry, as the order decides (over capacity, so not empty).
    fn evict_one(&mut self) {
        loop {
            let list = self.order.victim_list(self.used[List::Small.index()], self.used[List::Main.index()]);
            let entries = &self.entries;
            let (k, _) =
                self.lists[list.index()].head(|r| is_live(entries, r)).expect("units, so a live record");
            self.lists[list.index()].pop_head();
            let e = self.entries[&k];
            // The popped record was the entry's only live one: it leaves `list` either way.
            self.used[list.index()] -= e.size;
            self.retire(list);
            match self.order.at_head(list, e.freq) {
                AtHead::Requeue { to, freq } => {
                    let stamp = self.stamp();
                    self.entries.insert(k, Entry { stamp, freq, small: to == List::Small, ..e });
                    self.used[to.index()] += e.size;
                    self.enqueue(to, k, stamp);
                }
                AtHead::Evict => {
                    self.entries.remove(&k);
                    if list == List::Small {
                        self.remember_ghost(k);
                    }
                    return;
                }
            }
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

    /// Any order of the wire table runs in the simulation, CLOCK too (it has no MRC policy name), and
    /// every one keeps the cache within its capacity.
    #[test]
    fn clock_gives_a_referenced_key_a_second_chance() {
        let mut c = CacheSim::of_order(EvictionOrder::Clock, 3);
        for k in [1, 2, 3, 1, 4] {
            c.access(k, 1); // 1 referenced; 4 evicts 2 (1 loses its reference and goes to the back)
        }
        assert!(c.access(1, 1) && !c.access(2, 1));
        for o in EvictionOrder::ALL {
            let mut c = CacheSim::of_order(o, 8);
            for k in 0..100u64 {
                c.access(k % 13, 1);
                assert!(c.used() <= 8 && c.len() as u64 == c.used(), "{o:?}");
            }
        }
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
