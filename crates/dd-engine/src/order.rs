//! Per-pool eviction order: FIFO (the paper's), LRU, CLOCK and S3-FIFO over one intrusive list slab.
//!
//! A pool keeps one [`OrderQueue`] per store tier. Entries live in the pool's [`Slab`]; the queue links
//! them through `prev`/`next` indices, so insert, touch, remove and victim selection are O(1) (CLOCK and
//! S3-FIFO amortised O(1)). The queue never owns page data: popping a victim only unlinks it; the pool
//! then removes it from its index and frees the frame outside its lock.
//!
//! Invariant: an entry id is linked in at most one list of one queue, and `len` of a list is the number
//! of entries linked in it.

use crate::types::{EvictionOrder, Key};
use std::collections::{HashSet, VecDeque};

pub(crate) const NIL: u32 = u32::MAX;

/// The links an entry carries for its queue.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Links {
    pub prev: u32,
    pub next: u32,
    /// Which list (0 = main/only, 1 = S3-FIFO small).
    pub list: u8,
    /// CLOCK reference bit / S3-FIFO frequency (0..=3).
    pub freq: u8,
}

impl Default for Links {
    fn default() -> Self {
        Links { prev: NIL, next: NIL, list: 0, freq: 0 }
    }
}

/// Anything stored in a slab that a queue can link.
pub(crate) trait Linked {
    fn links(&self) -> &Links;
    fn links_mut(&mut self) -> &mut Links;
}

/// A vector of entries with a free list; ids are stable while an entry lives.
#[derive(Debug)]
pub(crate) struct Slab<T> {
    items: Vec<Option<T>>,
    free: Vec<u32>,
    live: usize,
}

impl<T> Default for Slab<T> {
    fn default() -> Self {
        Slab { items: Vec::new(), free: Vec::new(), live: 0 }
    }
}

impl<T> Slab<T> {
    pub fn insert(&mut self, item: T) -> u32 {
        self.live += 1;
        if let Some(id) = self.free.pop() {
            self.items[id as usize] = Some(item);
            id
        } else {
            self.items.push(Some(item));
            (self.items.len() - 1) as u32
        }
    }
    pub fn remove(&mut self, id: u32) -> T {
        let item = self.items[id as usize].take().expect("slab: removing a free id");
        self.free.push(id);
        self.live -= 1;
        item
    }
    pub fn get(&self, id: u32) -> &T {
        self.items[id as usize].as_ref().expect("slab: dangling id")
    }
    pub fn get_mut(&mut self, id: u32) -> &mut T {
        self.items[id as usize].as_mut().expect("slab: dangling id")
    }
    pub fn len(&self) -> usize {
        self.live
    }
    pub fn iter(&self) -> impl Iterator<Item = (u32, &T)> {
        self.items.iter().enumerate().filter_map(|(i, x)| x.as_ref().map(|x| (i as u32, x)))
    }
}

#[derive(Debug, Clone, Copy)]
struct List {
    head: u32,
    tail: u32,
    len: usize,
}

impl Default for List {
    fn default() -> Self {
        List { head: NIL, tail: NIL, len: 0 }
    }
}

/// The order queue of one pool tier.
#[derive(Debug)]
pub(crate) struct OrderQueue {
    order: EvictionOrder,
    lists: [List; 2],
    /// S3-FIFO ghost: keys recently evicted from the small queue, bounded by the queue's size.
    ghost: VecDeque<Key>,
    ghost_set: HashSet<Key>,
}

const MAIN: u8 = 0;
const SMALL: u8 = 1;

impl OrderQueue {
    pub fn new(order: EvictionOrder) -> Self {
        OrderQueue { order, lists: [List::default(); 2], ghost: VecDeque::new(), ghost_set: HashSet::new() }
    }

    pub fn len(&self) -> usize {
        self.lists[0].len + self.lists[1].len
    }

    fn link_tail<T: Linked>(&mut self, slab: &mut Slab<T>, id: u32, list: u8) {
        let l = &mut self.lists[list as usize];
        let tail = l.tail;
        {
            let links = slab.get_mut(id).links_mut();
            links.prev = tail;
            links.next = NIL;
            links.list = list;
        }
        if tail == NIL {
            l.head = id;
        } else {
            slab.get_mut(tail).links_mut().next = id;
        }
        l.tail = id;
        l.len += 1;
    }

    fn unlink<T: Linked>(&mut self, slab: &mut Slab<T>, id: u32) {
        let Links { prev, next, list, .. } = *slab.get(id).links();
        let l = &mut self.lists[list as usize];
        if prev == NIL {
            l.head = next;
        } else {
            slab.get_mut(prev).links_mut().next = next;
        }
        if next == NIL {
            l.tail = prev;
        } else {
            slab.get_mut(next).links_mut().prev = prev;
        }
        l.len -= 1;
        let links = slab.get_mut(id).links_mut();
        links.prev = NIL;
        links.next = NIL;
    }

    /// Links a newly inserted entry.
    pub fn push<T: Linked>(&mut self, slab: &mut Slab<T>, id: u32, key: Key) {
        slab.get_mut(id).links_mut().freq = 0;
        if self.order == EvictionOrder::S3Fifo {
            if self.ghost_set.remove(&key) {
                self.link_tail(slab, id, MAIN);
            } else {
                self.link_tail(slab, id, SMALL);
            }
        } else {
            self.link_tail(slab, id, MAIN);
        }
    }

    /// Records an access to a live entry (non-exclusive hit).
    pub fn touch<T: Linked>(&mut self, slab: &mut Slab<T>, id: u32) {
        match self.order {
            EvictionOrder::Fifo => {}
            EvictionOrder::Lru => {
                let list = slab.get(id).links().list;
                self.unlink(slab, id);
                self.link_tail(slab, id, list);
            }
            EvictionOrder::Clock | EvictionOrder::S3Fifo => {
                let l = slab.get_mut(id).links_mut();
                l.freq = (l.freq + 1).min(3);
            }
        }
    }

    /// Unlinks an entry that leaves the tier (get, flush, migration, move).
    pub fn remove<T: Linked>(&mut self, slab: &mut Slab<T>, id: u32) {
        self.unlink(slab, id);
    }

    /// The entry at the victim end, without side effects (for global-mode age comparison).
    pub fn peek_oldest(&self) -> Option<u32> {
        let small = self.lists[SMALL as usize];
        if small.head != NIL {
            return Some(small.head);
        }
        let main = self.lists[MAIN as usize];
        (main.head != NIL).then_some(main.head)
    }

    /// The youngest entry (promotion source).
    pub fn peek_youngest(&self) -> Option<u32> {
        let main = self.lists[MAIN as usize];
        if main.tail != NIL {
            return Some(main.tail);
        }
        let small = self.lists[SMALL as usize];
        (small.tail != NIL).then_some(small.tail)
    }

    /// Chooses and unlinks the next victim. `key_of` gives an entry's key (for the S3-FIFO ghost).
    pub fn pop_victim<T: Linked>(&mut self, slab: &mut Slab<T>, key_of: impl Fn(&T) -> Key) -> Option<u32> {
        match self.order {
            EvictionOrder::Fifo | EvictionOrder::Lru => {
                let head = self.lists[MAIN as usize].head;
                if head == NIL {
                    return None;
                }
                self.unlink(slab, head);
                Some(head)
            }
            EvictionOrder::Clock => loop {
                let head = self.lists[MAIN as usize].head;
                if head == NIL {
                    return None;
                }
                self.unlink(slab, head);
                let links = slab.get_mut(head).links_mut();
                if links.freq > 0 {
                    links.freq = 0;
                    self.link_tail(slab, head, MAIN);
                } else {
                    return Some(head);
                }
            },
            EvictionOrder::S3Fifo => self.pop_s3(slab, key_of),
        }
    }

    fn pop_s3<T: Linked>(&mut self, slab: &mut Slab<T>, key_of: impl Fn(&T) -> Key) -> Option<u32> {
        loop {
            let total = self.len();
            if total == 0 {
                return None;
            }
            let small = self.lists[SMALL as usize];
            // The small queue is kept at about 10% of the entries (S3-FIFO's default).
            if small.len > 0 && (small.len * 10 >= total || self.lists[MAIN as usize].len == 0) {
                let id = small.head;
                self.unlink(slab, id);
                if slab.get(id).links().freq > 0 {
                    slab.get_mut(id).links_mut().freq = 0;
                    self.link_tail(slab, id, MAIN);
                    continue;
                }
                let key = key_of(slab.get(id));
                if self.ghost_set.insert(key) {
                    self.ghost.push_back(key);
                }
                while self.ghost.len() > total.max(16) {
                    if let Some(old) = self.ghost.pop_front() {
                        self.ghost_set.remove(&old);
                    }
                }
                return Some(id);
            }
            let id = self.lists[MAIN as usize].head;
            self.unlink(slab, id);
            let links = slab.get_mut(id).links_mut();
            if links.freq > 0 {
                links.freq -= 1;
                self.link_tail(slab, id, MAIN);
                continue;
            }
            return Some(id);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug)]
    struct E {
        key: Key,
        links: Links,
    }
    impl Linked for E {
        fn links(&self) -> &Links {
            &self.links
        }
        fn links_mut(&mut self) -> &mut Links {
            &mut self.links
        }
    }

    fn fill(order: EvictionOrder, n: u64) -> (Slab<E>, OrderQueue, Vec<u32>) {
        let mut slab = Slab::default();
        let mut q = OrderQueue::new(order);
        let mut ids = Vec::new();
        for i in 0..n {
            let key = Key::new(1, i);
            let id = slab.insert(E { key, links: Links::default() });
            q.push(&mut slab, id, key);
            ids.push(id);
        }
        (slab, q, ids)
    }

    fn drain(slab: &mut Slab<E>, q: &mut OrderQueue) -> Vec<u64> {
        let mut out = Vec::new();
        while let Some(id) = q.pop_victim(slab, |e| e.key) {
            out.push(slab.get(id).key.index);
        }
        out
    }

    #[test]
    fn fifo_ignores_touches() {
        let (mut slab, mut q, ids) = fill(EvictionOrder::Fifo, 4);
        q.touch(&mut slab, ids[0]);
        assert_eq!(drain(&mut slab, &mut q), vec![0, 1, 2, 3]);
    }

    #[test]
    fn lru_moves_touched_to_the_back() {
        let (mut slab, mut q, ids) = fill(EvictionOrder::Lru, 4);
        q.touch(&mut slab, ids[0]);
        q.touch(&mut slab, ids[2]);
        assert_eq!(drain(&mut slab, &mut q), vec![1, 3, 0, 2]);
    }

    #[test]
    fn clock_gives_referenced_pages_a_second_chance() {
        let (mut slab, mut q, ids) = fill(EvictionOrder::Clock, 4);
        q.touch(&mut slab, ids[0]);
        assert_eq!(drain(&mut slab, &mut q), vec![1, 2, 3, 0]);
    }

    #[test]
    fn s3fifo_evicts_one_hit_wonders_first_and_remembers_ghosts() {
        let (mut slab, mut q, ids) = fill(EvictionOrder::S3Fifo, 10);
        q.touch(&mut slab, ids[1]);
        let first = q.pop_victim(&mut slab, |e| e.key).unwrap();
        assert_eq!(slab.get(first).key.index, 0);
        // Key 0 is a ghost now: reinserted, it goes straight to the main queue.
        let id = slab.insert(E { key: Key::new(1, 0), links: Links::default() });
        q.push(&mut slab, id, Key::new(1, 0));
        assert_eq!(slab.get(id).links().list, MAIN);
        let rest = drain(&mut slab, &mut q);
        assert_eq!(rest.len(), 10);
        // Key 1 was referenced: it is promoted to main and outlives the unreferenced small entries.
        let pos1 = rest.iter().position(|&k| k == 1).unwrap();
        let pos2 = rest.iter().position(|&k| k == 2).unwrap();
        assert!(pos1 > pos2);
    }

    #[test]
    fn remove_in_the_middle_keeps_links_consistent() {
        let (mut slab, mut q, ids) = fill(EvictionOrder::Fifo, 5);
        q.remove(&mut slab, ids[2]);
        q.remove(&mut slab, ids[0]);
        q.remove(&mut slab, ids[4]);
        assert_eq!(q.len(), 2);
        assert_eq!(drain(&mut slab, &mut q), vec![1, 3]);
    }
}
