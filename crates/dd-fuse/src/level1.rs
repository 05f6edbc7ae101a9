//! A container's first-level page cache: the guest page cache of paper 002's containers, in user space.
//!
//! Pages are 4 KiB, keyed by `(object, page index)`, least recently used first out. Every page is clean
//! (the filesystem writes through), so an evicted page can always be handed to the second level or
//! dropped. Each page carries the object's write generation at the time it was filled: the put of an
//! evicted page is valid only if the object has not been written since (checked by the caller under the
//! object's lock, see `frontend.rs`).
//!
//! Invariants: `len() <= budget` after every call; `pages` and `order` hold the same keys (one record per
//! page, by its last-use tick). Not thread-safe by itself: each container wraps it in a mutex that is a
//! leaf (no I/O and no other lock under it).

use crate::config::PAGE_SIZE;
use std::collections::BTreeMap;

type PageKey = (u64, u64);

struct Slot {
    data: Box<[u8]>,
    generation: u64,
    tick: u64,
}

/// A page pushed out of a first-level cache.
#[derive(Debug)]
pub struct Evicted {
    pub object: u64,
    pub index: u64,
    pub generation: u64,
    pub data: Box<[u8]>,
}

pub struct Level1 {
    budget: usize,
    pages: BTreeMap<PageKey, Slot>,
    order: BTreeMap<u64, PageKey>,
    tick: u64,
}

impl Level1 {
    pub fn new(budget_pages: usize) -> Level1 {
        Level1 { budget: budget_pages.max(1), pages: BTreeMap::new(), order: BTreeMap::new(), tick: 0 }
    }

    pub fn len(&self) -> usize {
        self.pages.len()
    }

    pub fn is_empty(&self) -> bool {
        self.pages.is_empty()
    }

    pub fn budget(&self) -> usize {
        self.budget
    }

    fn next_tick(&mut self) -> u64 {
        self.tick += 1;
        self.tick
    }

    /// Copies a cached page into `out` (one page) and marks it used.
    pub fn get(&mut self, object: u64, index: u64, out: &mut [u8]) -> bool {
        let t = self.next_tick();
        let Some(s) = self.pages.get_mut(&(object, index)) else { return false };
        out.copy_from_slice(&s.data);
        self.order.remove(&s.tick);
        s.tick = t;
        self.order.insert(t, (object, index));
        true
    }

    /// Caches a page (replacing any older copy); returns the pages evicted to stay within budget.
    pub fn insert(&mut self, object: u64, index: u64, generation: u64, data: Box<[u8]>) -> Vec<Evicted> {
        debug_assert_eq!(data.len(), PAGE_SIZE);
        let t = self.next_tick();
        if let Some(old) = self.pages.insert((object, index), Slot { data, generation, tick: t }) {
            self.order.remove(&old.tick);
        }
        self.order.insert(t, (object, index));
        self.evict_over_budget()
    }

    /// Evicts least recently used pages until the cache fits its budget.
    fn evict_over_budget(&mut self) -> Vec<Evicted> {
        let mut out = Vec::new();
        while self.pages.len() > self.budget {
            let (_, key) = self.order.pop_first().expect("order mirrors pages");
            let s = self.pages.remove(&key).expect("order mirrors pages");
            out.push(Evicted { object: key.0, index: key.1, generation: s.generation, data: s.data });
        }
        out
    }

    /// Changes the budget (at least one page); returns the pages evicted to fit in it, least recently
    /// used first.
    pub fn set_budget(&mut self, pages: usize) -> Vec<Evicted> {
        self.budget = pages.max(1);
        self.evict_over_budget()
    }

    /// Drops pages `first..=last` of an object; returns how many were cached.
    pub fn remove_range(&mut self, object: u64, first: u64, last: u64) -> usize {
        let keys: Vec<PageKey> =
            self.pages.range((object, first)..=(object, last)).map(|(k, _)| *k).collect();
        for k in &keys {
            let s = self.pages.remove(k).expect("listed above");
            self.order.remove(&s.tick);
        }
        keys.len()
    }

    /// Takes every page of an object out (for a migration to another container).
    pub fn take_object(&mut self, object: u64) -> Vec<(u64, u64, Box<[u8]>)> {
        let keys: Vec<PageKey> =
            self.pages.range((object, 0)..=(object, u64::MAX)).map(|(k, _)| *k).collect();
        keys.into_iter()
            .map(|k| {
                let s = self.pages.remove(&k).expect("listed above");
                self.order.remove(&s.tick);
                (k.1, s.generation, s.data)
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn page(b: u8) -> Box<[u8]> {
        vec![b; PAGE_SIZE].into_boxed_slice()
    }

    #[test]
    fn lru_order_and_budget() {
        let mut l = Level1::new(2);
        assert!(l.insert(1, 0, 0, page(1)).is_empty());
        assert!(l.insert(1, 1, 0, page(2)).is_empty());
        let mut buf = vec![0u8; PAGE_SIZE];
        // Touch page 0: page 1 becomes the least recently used.
        assert!(l.get(1, 0, &mut buf));
        assert_eq!(buf[0], 1);
        let ev = l.insert(2, 0, 5, page(3));
        assert_eq!(ev.len(), 1);
        assert_eq!((ev[0].object, ev[0].index, ev[0].data[0]), (1, 1, 2));
        assert_eq!(l.len(), 2);
        assert!(!l.get(1, 1, &mut buf));
        // Replacing a page keeps one copy.
        assert!(l.insert(2, 0, 6, page(4)).is_empty());
        assert_eq!(l.len(), 2);
        assert!(l.get(2, 0, &mut buf));
        assert_eq!(buf[0], 4);
    }

    #[test]
    fn ranges_and_objects() {
        let mut l = Level1::new(100);
        for i in 0..10 {
            l.insert(7, i, 0, page(i as u8));
            l.insert(8, i, 0, page(i as u8));
        }
        assert_eq!(l.remove_range(7, 2, 4), 3);
        assert_eq!(l.len(), 17);
        let t = l.take_object(7);
        assert_eq!(t.len(), 7);
        assert_eq!(l.len(), 10);
        let mut buf = vec![0u8; PAGE_SIZE];
        assert!(!l.get(7, 0, &mut buf));
        assert!(l.get(8, 9, &mut buf));
        assert_eq!(buf[0], 9);
        // The order index stayed in step with the pages: filling past the budget evicts only object 8.
        let mut evicted = 0;
        for i in 0..100 {
            evicted += l.insert(9, i, 0, page(0)).len();
        }
        assert_eq!(evicted, 10);
        assert_eq!(l.len(), 100);
    }
}
