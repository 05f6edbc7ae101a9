//! Per-pool eviction order: FIFO (the paper's), LRU, CLOCK and S3-FIFO, as ring queues with lazy
//! deletion.
//!
//! A pool keeps one [`OrderQueue`] per store tier. Entries live in the pool's [`Slab`]; the queue holds
//! *records* `(entry id, stamp)` in order. Each entry carries the stamp of its one live record
//! ([`QPos`]). Removing an entry from the order (a get, a flush, a migration) touches nothing but the
//! entry itself: its record goes stale (the id is freed, or reused by an entry with another stamp) and is
//! skipped when it reaches the head. This is what keeps the data path at one metadata cache miss for the
//! order: an exclusive cache removes pages in random order, and unlinking from a doubly linked list
//! would touch two more random entries per get.
//!
//! Invariants:
//! * every entry in the queue has exactly one live record: the one whose stamp equals `QPos::stamp`, in
//!   the list named by `QPos::list`; `live[list]` counts those entries;
//! * stale records are bounded: when a list holds more than twice its live count (plus a constant), it
//!   is compacted, so memory is O(live) and every operation is amortised O(1).

use crate::types::{EvictionOrder, Key};
use std::collections::{HashSet, VecDeque};

/// Queue position of an entry: the stamp of its live record, its list, and its reference count.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct QPos {
    pub stamp: u64,
    /// 0 = main (the only list of FIFO/LRU/CLOCK), 1 = S3-FIFO small.
    pub list: u8,
    /// CLOCK reference bit / S3-FIFO frequency (0..=3).
    pub freq: u8,
    /// Whether the entry is currently in a queue (cleared on removal).
    pub queued: bool,
    /// Which queue of the pool holds it (queues number their stamps independently, so a stale record
    /// of one queue must never match an entry that now lives in another).
    pub queue: u8,
}

/// Anything stored in a slab that a queue can order.
pub(crate) trait Queued {
    fn qpos(&self) -> &QPos;
    fn qpos_mut(&mut self) -> &mut QPos;
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
    /// Frees an id without reading its item: on the data path the entry is a cache miss, and a write
    /// of its slot does not wait for the line the way a read does.
    pub fn discard(&mut self, id: u32) {
        crate::invariant!(self.items[id as usize].is_some(), "slab: discarding a free id {id}");
        self.items[id as usize] = None;
        self.free.push(id);
        self.live -= 1;
    }
    pub fn try_get(&self, id: u32) -> Option<&T> {
        self.items.get(id as usize).and_then(|x| x.as_ref())
    }
    pub fn get(&self, id: u32) -> &T {
        self.try_get(id).expect("slab: dangling id")
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
struct Record {
    id: u32,
    stamp: u64,
}

const MAIN: u8 = 0;
const SMALL: u8 = 1;

/// The order queue of one pool tier.
#[derive(Debug)]
pub(crate) struct OrderQueue {
    /// This queue's number among its pool's queues (the tier index).
    id: u8,
    order: EvictionOrder,
    lists: [VecDeque<Record>; 2],
    live: [usize; 2],
    next_stamp: u64,
    /// S3-FIFO ghost: keys recently evicted from the small queue, bounded by the queue's size.
    ghost: VecDeque<Key>,
    ghost_set: HashSet<Key>,
}

impl OrderQueue {
    pub fn new(id: u8, order: EvictionOrder) -> Self {
        OrderQueue {
            id,
            order,
            lists: [VecDeque::new(), VecDeque::new()],
            live: [0; 2],
            next_stamp: 1,
            ghost: VecDeque::new(),
            ghost_set: HashSet::new(),
        }
    }

    pub fn len(&self) -> usize {
        self.live[0] + self.live[1]
    }

    pub fn order(&self) -> EvictionOrder {
        self.order
    }

    fn is_live<T: Queued>(&self, slab: &Slab<T>, r: Record, list: u8) -> bool {
        slab.try_get(r.id).is_some_and(|e| {
            let q = e.qpos();
            q.queued && q.queue == self.id && q.stamp == r.stamp && q.list == list
        })
    }

    fn append<T: Queued>(&mut self, slab: &mut Slab<T>, id: u32, list: u8) {
        let pos = self.new_position(list);
        let q = slab.get_mut(id).qpos_mut();
        *q = QPos { freq: q.freq, ..pos };
        self.enqueue(slab, id, pos);
    }

    /// The position of the next entry appended to `list` (frequency 0: the caller keeps an entry's own).
    fn new_position(&mut self, list: u8) -> QPos {
        let stamp = self.next_stamp;
        self.next_stamp += 1;
        QPos { stamp, list, freq: 0, queued: true, queue: self.id }
    }

    /// Appends the record of entry `id`, whose position is `pos` (from [`Self::new_position`]).
    fn enqueue<T: Queued>(&mut self, slab: &Slab<T>, id: u32, pos: QPos) {
        self.lists[pos.list as usize].push_back(Record { id, stamp: pos.stamp });
        self.live[pos.list as usize] += 1;
        self.maybe_compact(slab, pos.list);
    }

    fn maybe_compact<T: Queued>(&mut self, slab: &Slab<T>, list: u8) {
        let l = list as usize;
        if self.live[l] == 0 {
            // Every record is stale: nothing to look up (an exclusive pool drained by its gets).
            self.lists[l].clear();
        } else if self.lists[l].len() > 2 * self.live[l] + 64 {
            let mut records = std::mem::take(&mut self.lists[l]);
            records.retain(|r| self.is_live(slab, *r, list));
            self.lists[l] = records;
            debug_assert_eq!(self.lists[l].len(), self.live[l]);
        }
    }

    /// Queues a newly inserted entry.
    pub fn push<T: Queued>(&mut self, slab: &mut Slab<T>, id: u32, key: Key) {
        slab.get_mut(id).qpos_mut().freq = 0;
        let list = self.list_for_new(key);
        self.append(slab, id, list);
    }

    fn list_for_new(&mut self, key: Key) -> u8 {
        if self.order == EvictionOrder::S3Fifo && !self.ghost_set.remove(&key) {
            SMALL
        } else {
            MAIN
        }
    }

    /// Inserts a new entry into `slab` and queues it, as `slab.insert` then [`Self::push`] would, but
    /// with its queue position built before the entry is written: the put writes its (cold) slab slot
    /// once and never reads it back. `make` builds the entry around its position. Returns its id.
    pub fn insert_new<T: Queued>(
        &mut self,
        slab: &mut Slab<T>,
        key: Key,
        make: impl FnOnce(QPos) -> T,
    ) -> u32 {
        let list = self.list_for_new(key);
        let pos = self.new_position(list);
        let id = slab.insert(make(pos));
        self.enqueue(slab, id, pos);
        id
    }

    /// Whether every entry of this queue is in its one list (FIFO, LRU, CLOCK: all but S3-FIFO), so
    /// that [`Self::remove_discarded`] needs nothing from the entry.
    pub fn single_list(&self) -> bool {
        self.order != EvictionOrder::S3Fifo
    }

    /// Takes out of the order an entry of a [`Self::single_list`] queue whose slab id the caller has
    /// just discarded, without touching the entry: its record is stale because the id is free (or,
    /// once reused, carries another stamp), exactly as after [`Self::remove`].
    pub fn remove_discarded<T: Queued>(&mut self, slab: &Slab<T>) {
        debug_assert!(self.single_list());
        self.live[MAIN as usize] -= 1;
        self.maybe_compact(slab, MAIN);
    }

    /// Records an access to a queued entry (non-exclusive hit).
    pub fn touch<T: Queued>(&mut self, slab: &mut Slab<T>, id: u32) {
        match self.order {
            EvictionOrder::Fifo => {}
            EvictionOrder::Lru => {
                let list = slab.get(id).qpos().list;
                self.live[list as usize] -= 1;
                self.append(slab, id, list); // the old record goes stale
            }
            EvictionOrder::Clock | EvictionOrder::S3Fifo => {
                let q = slab.get_mut(id).qpos_mut();
                q.freq = (q.freq + 1).min(3);
            }
        }
    }

    /// Takes an entry out of the order (get, flush, migration, move). O(1): its record goes stale.
    pub fn remove<T: Queued>(&mut self, slab: &mut Slab<T>, id: u32) {
        let q = slab.get_mut(id).qpos_mut();
        debug_assert!(q.queued, "removing an entry that is not queued");
        q.queued = false;
        let list = q.list;
        self.live[list as usize] -= 1;
        self.maybe_compact(slab, list);
    }

    /// Drops stale records at the head of a list and returns the first live one.
    fn head<T: Queued>(&mut self, slab: &Slab<T>, list: u8) -> Option<Record> {
        while let Some(&r) = self.lists[list as usize].front() {
            if self.is_live(slab, r, list) {
                return Some(r);
            }
            self.lists[list as usize].pop_front();
        }
        None
    }

    /// The entry at the victim end, without changing the order (global-mode age comparison).
    pub fn peek_oldest<T: Queued>(&mut self, slab: &Slab<T>) -> Option<u32> {
        self.head(slab, SMALL).or_else(|| self.head(slab, MAIN)).map(|r| r.id)
    }

    /// Up to `n` queued entries, oldest first.
    pub fn oldest<T: Queued>(&self, slab: &Slab<T>, n: usize) -> Vec<u32> {
        let mut out = Vec::with_capacity(n.min(self.len()));
        for list in [SMALL, MAIN] {
            for r in &self.lists[list as usize] {
                if out.len() == n {
                    return out;
                }
                if self.is_live(slab, *r, list) {
                    out.push(r.id);
                }
            }
        }
        out
    }

    /// Up to `n` queued entries, youngest first.
    pub fn youngest<T: Queued>(&self, slab: &Slab<T>, n: usize) -> Vec<u32> {
        let mut out = Vec::with_capacity(n.min(self.len()));
        for list in [MAIN, SMALL] {
            for r in self.lists[list as usize].iter().rev() {
                if out.len() == n {
                    return out;
                }
                if self.is_live(slab, *r, list) {
                    out.push(r.id);
                }
            }
        }
        out
    }

    /// Chooses the next victim and takes it out of the order. `key_of` gives an entry's key (for the
    /// S3-FIFO ghost).
    pub fn pop_victim<T: Queued>(&mut self, slab: &mut Slab<T>, key_of: impl Fn(&T) -> Key) -> Option<u32> {
        match self.order {
            EvictionOrder::Fifo | EvictionOrder::Lru => {
                let r = self.head(slab, MAIN)?;
                self.remove(slab, r.id);
                Some(r.id)
            }
            EvictionOrder::Clock => loop {
                let r = self.head(slab, MAIN)?;
                self.lists[MAIN as usize].pop_front();
                let q = slab.get_mut(r.id).qpos_mut();
                if q.freq > 0 {
                    q.freq = 0;
                    self.live[MAIN as usize] -= 1;
                    self.append(slab, r.id, MAIN);
                } else {
                    self.remove(slab, r.id);
                    return Some(r.id);
                }
            },
            EvictionOrder::S3Fifo => self.pop_s3(slab, key_of),
        }
    }

    fn pop_s3<T: Queued>(&mut self, slab: &mut Slab<T>, key_of: impl Fn(&T) -> Key) -> Option<u32> {
        loop {
            let total = self.len();
            if total == 0 {
                return None;
            }
            let small = self.live[SMALL as usize];
            // The small queue is kept at about 10% of the entries (S3-FIFO's default).
            if small > 0 && (small * 10 >= total || self.live[MAIN as usize] == 0) {
                let r = self.head(slab, SMALL).expect("live count says the small list is not empty");
                self.lists[SMALL as usize].pop_front();
                if slab.get(r.id).qpos().freq > 0 {
                    slab.get_mut(r.id).qpos_mut().freq = 0;
                    self.live[SMALL as usize] -= 1;
                    self.append(slab, r.id, MAIN);
                    continue;
                }
                self.remove(slab, r.id);
                let key = key_of(slab.get(r.id));
                if self.ghost_set.insert(key) {
                    self.ghost.push_back(key);
                }
                while self.ghost.len() > total.max(16) {
                    if let Some(old) = self.ghost.pop_front() {
                        self.ghost_set.remove(&old);
                    }
                }
                return Some(r.id);
            }
            let r = self.head(slab, MAIN).expect("live count says the main list is not empty");
            self.lists[MAIN as usize].pop_front();
            let q = slab.get_mut(r.id).qpos_mut();
            if q.freq > 0 {
                q.freq -= 1;
                self.live[MAIN as usize] -= 1;
                self.append(slab, r.id, MAIN);
                continue;
            }
            self.remove(slab, r.id);
            return Some(r.id);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug)]
    struct E {
        key: Key,
        q: QPos,
    }
    impl Queued for E {
        fn qpos(&self) -> &QPos {
            &self.q
        }
        fn qpos_mut(&mut self) -> &mut QPos {
            &mut self.q
        }
    }

    fn fill(order: EvictionOrder, n: u64) -> (Slab<E>, OrderQueue, Vec<u32>) {
        let mut slab = Slab::default();
        let mut q = OrderQueue::new(0, order);
        let mut ids = Vec::new();
        for i in 0..n {
            let key = Key::new(1, i);
            let id = slab.insert(E { key, q: QPos::default() });
            q.push(&mut slab, id, key);
            ids.push(id);
        }
        (slab, q, ids)
    }

    fn drain(slab: &mut Slab<E>, q: &mut OrderQueue) -> Vec<u64> {
        let mut out = Vec::new();
        while let Some(id) = q.pop_victim(slab, |e| e.key) {
            out.push(slab.remove(id).key.index);
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
        assert_eq!(slab.remove(first).key.index, 0);
        // Key 0 is a ghost now: reinserted, it goes straight to the main queue.
        let id = slab.insert(E { key: Key::new(1, 0), q: QPos::default() });
        q.push(&mut slab, id, Key::new(1, 0));
        assert_eq!(slab.get(id).qpos().list, MAIN);
        let rest = drain(&mut slab, &mut q);
        assert_eq!(rest.len(), 10);
        // Key 1 was referenced: it is promoted to main and outlives the unreferenced small entries.
        let pos1 = rest.iter().position(|&k| k == 1).unwrap();
        let pos2 = rest.iter().position(|&k| k == 2).unwrap();
        assert!(pos1 > pos2);
    }

    #[test]
    fn removed_entries_are_skipped_even_when_their_id_is_reused() {
        let (mut slab, mut q, ids) = fill(EvictionOrder::Fifo, 5);
        for &i in &[ids[2], ids[0], ids[4]] {
            q.remove(&mut slab, i);
            slab.remove(i);
        }
        // Reuse a freed id for a new entry: its old record must not make it look old.
        let id = slab.insert(E { key: Key::new(2, 9), q: QPos::default() });
        q.push(&mut slab, id, Key::new(2, 9));
        assert_eq!(q.len(), 3);
        assert_eq!(drain(&mut slab, &mut q), vec![1, 3, 9]);
    }

    #[test]
    fn stale_records_are_compacted() {
        let (mut slab, mut q, ids) = fill(EvictionOrder::Fifo, 1000);
        for &i in &ids[..990] {
            q.remove(&mut slab, i);
            slab.remove(i);
        }
        assert!(q.lists[0].len() <= 2 * 10 + 64 + 1, "{} records for 10 live", q.lists[0].len());
        assert_eq!(
            q.oldest(&slab, 3).iter().map(|&i| slab.get(i).key.index).collect::<Vec<_>>(),
            vec![990, 991, 992]
        );
        assert_eq!(
            q.youngest(&slab, 2).iter().map(|&i| slab.get(i).key.index).collect::<Vec<_>>(),
            vec![999, 998]
        );
    }

    /// Regression: the memory and SSD queues of a pool number their stamps independently; an entry that
    /// moved to the SSD queue was once matched by a stale memory-queue record with the same stamp, and
    /// demotion then copied a page that was not in memory (a get returned zeros).
    #[test]
    fn regression_stale_record_of_another_queue_never_matches() {
        let mut slab = Slab::default();
        let mut mem = OrderQueue::new(0, EvictionOrder::Fifo);
        let mut ssd = OrderQueue::new(1, EvictionOrder::Fifo);
        let a = slab.insert(E { key: Key::new(1, 1), q: QPos::default() });
        mem.push(&mut slab, a, Key::new(1, 1)); // stamp 1 in the memory queue
        mem.remove(&mut slab, a);
        ssd.push(&mut slab, a, Key::new(1, 1)); // stamp 1 in the SSD queue: same number
        assert!(mem.oldest(&slab, 10).is_empty());
        assert_eq!(mem.peek_oldest(&slab), None);
        assert_eq!(ssd.oldest(&slab, 10), vec![a]);
    }
}
