//! Per-pool eviction order: the queues that run FIFO (the paper's), LRU, CLOCK and S3-FIFO over a
//! pool's slab, with lazy deletion. What each order does (on a hit, at a list's head, which list gives
//! the victim) is the order's own file in `dd-types/src/order/` (D37), which `dd-mrc`'s simulation runs
//! too; this module keeps the entries, their positions and the ghost.
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
//!   the list named by `QPos::list`; that list's live count ([`LazyList::live`]) counts those entries;
//! * stale records are bounded: when a list holds more than twice its live count (plus a constant), it
//!   is compacted, so memory is O(live) and every operation is amortised O(1).

use crate::types::{EvictionOrder, Key};
use dd_types::order::{AtHead, LazyList, List, OnHit, MAX_FREQ};
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

const MAIN: u8 = List::Main as u8;
const SMALL: u8 = List::Small as u8;

/// Whether `r`, a record of list `list` of queue `queue`, is its entry's live record.
#[inline]
fn is_live<T: Queued>(slab: &Slab<T>, queue: u8, list: u8, r: &Record) -> bool {
    slab.try_get(r.id).is_some_and(|e| {
        let q = e.qpos();
        q.queued && q.queue == queue && q.stamp == r.stamp && q.list == list
    })
}

/// The order queue of one pool tier: the order's two lazy-deletion lists over the pool's slab, and
/// the S3-FIFO ghost. Every decision is the order's ([`EvictionOrder`]'s methods, one file per order in
/// `dd-types/src/order/`); this type only moves records.
#[derive(Debug)]
pub(crate) struct OrderQueue {
    /// This queue's number among its pool's queues (the tier index).
    id: u8,
    order: EvictionOrder,
    /// Indexed by [`List::index`]: main, then small (used by probation orders only).
    lists: [LazyList<Record>; 2],
    next_stamp: u64,
    /// Probation orders' ghost: keys recently evicted from the small list, bounded by the queue's
    /// size (at least 16).
    ghost: VecDeque<Key>,
    ghost_set: HashSet<Key>,
}

impl OrderQueue {
    pub fn new(id: u8, order: EvictionOrder) -> Self {
        OrderQueue {
            id,
            order,
            lists: [LazyList::default(), LazyList::default()],
            next_stamp: 1,
            ghost: VecDeque::new(),
            ghost_set: HashSet::new(),
        }
    }

    pub fn len(&self) -> usize {
        self.lists[0].live() + self.lists[1].live()
    }

    pub fn order(&self) -> EvictionOrder {
        self.order
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
        let (queue, list) = (self.id, pos.list);
        self.lists[list as usize].push(Record { id, stamp: pos.stamp }, |r| is_live(slab, queue, list, r));
    }

    /// Counts one entry out of `list` (its record is stale, or popped).
    fn retire<T: Queued>(&mut self, slab: &Slab<T>, list: u8) {
        let queue = self.id;
        self.lists[list as usize].retire(|r| is_live(slab, queue, list, r));
    }

    /// Queues a newly inserted entry.
    pub fn push<T: Queued>(&mut self, slab: &mut Slab<T>, id: u32, key: Key) {
        slab.get_mut(id).qpos_mut().freq = 0;
        let list = self.list_for_new(key);
        self.append(slab, id, list);
    }

    fn list_for_new(&mut self, key: Key) -> u8 {
        if self.order.probation() && !self.ghost_set.remove(&key) {
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

    /// Whether every entry of this queue is in its one list (orders without probation: all but
    /// S3-FIFO), so that [`Self::remove_discarded`] needs nothing from the entry.
    pub fn single_list(&self) -> bool {
        !self.order.probation()
    }

    /// Takes out of the order an entry of a [`Self::single_list`] queue whose slab id the caller has
    /// just discarded, without touching the entry: its record is stale because the id is free (or,
    /// once reused, carries another stamp), exactly as after [`Self::remove`].
    pub fn remove_discarded<T: Queued>(&mut self, slab: &Slab<T>) {
        debug_assert!(self.single_list());
        self.retire(slab, MAIN);
    }

    /// Records an access to a queued entry (non-exclusive hit).
    pub fn touch<T: Queued>(&mut self, slab: &mut Slab<T>, id: u32) {
        match self.order.on_hit() {
            OnHit::Nothing => {}
            OnHit::Requeue => {
                let list = slab.get(id).qpos().list;
                let pos = self.new_position(list);
                let q = slab.get_mut(id).qpos_mut();
                *q = QPos { freq: q.freq, ..pos }; // the old record goes stale
                self.retire(slab, list);
                self.enqueue(slab, id, pos);
            }
            OnHit::Count => {
                let q = slab.get_mut(id).qpos_mut();
                q.freq = (q.freq + 1).min(MAX_FREQ);
            }
        }
    }

    /// Takes an entry out of the order (get, flush, migration, move). O(1): its record goes stale.
    pub fn remove<T: Queued>(&mut self, slab: &mut Slab<T>, id: u32) {
        let q = slab.get_mut(id).qpos_mut();
        debug_assert!(q.queued, "removing an entry that is not queued");
        q.queued = false;
        let list = q.list;
        self.retire(slab, list);
    }

    /// Drops stale records at the head of a list and returns the first live one.
    fn head<T: Queued>(&mut self, slab: &Slab<T>, list: u8) -> Option<Record> {
        let queue = self.id;
        self.lists[list as usize].head(|r| is_live(slab, queue, list, r))
    }

    /// The entry at the victim end, without changing the order (global-mode age comparison).
    pub fn peek_oldest<T: Queued>(&mut self, slab: &Slab<T>) -> Option<u32> {
        self.head(slab, SMALL).or_else(|| self.head(slab, MAIN)).map(|r| r.id)
    }

    /// Up to `n` queued entries, oldest first.
    pub fn oldest<T: Queued>(&self, slab: &Slab<T>, n: usize) -> Vec<u32> {
        let mut out = Vec::with_capacity(n.min(self.len()));
        for list in [SMALL, MAIN] {
            for r in self.lists[list as usize].iter() {
                if out.len() == n {
                    return out;
                }
                if is_live(slab, self.id, list, r) {
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
                if is_live(slab, self.id, list, r) {
                    out.push(r.id);
                }
            }
        }
        out
    }

    /// Chooses the next victim, as the order decides, and takes it out of the order. `key_of` gives an
    /// entry's key (for the ghost of a probation order).
    pub fn pop_victim<T: Queued>(&mut self, slab: &mut Slab<T>, key_of: impl Fn(&T) -> Key) -> Option<u32> {
        loop {
            // The ghost's bound counts the victim (the queue's size before it leaves).
            let total = self.len();
            let (small, main) = (self.lists[SMALL as usize].live(), self.lists[MAIN as usize].live());
            let list = self.order.victim_list(small as u64, main as u64) as u8;
            let r = self.head(slab, list)?;
            self.lists[list as usize].pop_head();
            let freq = slab.get(r.id).qpos().freq;
            match self.order.at_head(List::from_index(list), freq) {
                AtHead::Requeue { to, freq } => {
                    slab.get_mut(r.id).qpos_mut().freq = freq;
                    self.retire(slab, list);
                    self.append(slab, r.id, to as u8);
                }
                AtHead::Evict => {
                    self.remove(slab, r.id);
                    if list == SMALL {
                        self.remember_ghost(key_of(slab.get(r.id)), total);
                    }
                    return Some(r.id);
                }
            }
        }
    }

    /// Remembers a key evicted from the small list, keeping at most `max(total, 16)` ghosts.
    fn remember_ghost(&mut self, key: Key, total: usize) {
        if self.ghost_set.insert(key) {
            self.ghost.push_back(key);
        }
        while self.ghost.len() > total.max(16) {
            if let Some(old) = self.ghost.pop_front() {
                self.ghost_set.remove(&old);
            }
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
        assert!(q.lists[0].records() <= 2 * 10 + 64 + 1, "{} records for 10 live", q.lists[0].records());
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
