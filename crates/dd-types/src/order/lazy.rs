//! A FIFO list of records with lazy deletion: the queue every eviction order runs on, in the engine
//! and in `dd-mrc`'s simulation.
//!
//! A record names an entry and the stamp it had when queued; the entry is *live* in the list while its
//! current stamp (and list) match, which only the list's user can tell, so every operation that may
//! look takes an `is_live` predicate. Taking an entry out of the order touches nothing here but the
//! live count ([`LazyList::retire`]): its record goes stale and is dropped when it reaches the head.
//! That keeps a removal at O(1) with no access to neighbouring entries (an exclusive cache removes
//! pages in random order).
//!
//! Invariants: `live` counts the entries with a live record here, each with exactly one; when the
//! list holds more than twice its live count plus 64 records it is compacted (and cleared when nothing
//! is live), so memory is O(live) and every operation is amortised O(1).

use std::collections::VecDeque;

/// A list of records with lazy deletion (module docs).
#[derive(Debug, Clone)]
pub struct LazyList<R> {
    records: VecDeque<R>,
    live: usize,
}

impl<R> Default for LazyList<R> {
    fn default() -> Self {
        LazyList { records: VecDeque::new(), live: 0 }
    }
}

impl<R: Copy> LazyList<R> {
    /// Entries with a live record here.
    #[inline]
    pub fn live(&self) -> usize {
        self.live
    }

    /// Records held, stale ones included.
    #[inline]
    pub fn records(&self) -> usize {
        self.records.len()
    }

    /// Every record, head first, stale ones included (filter with the user's liveness test).
    pub fn iter(&self) -> impl DoubleEndedIterator<Item = &R> {
        self.records.iter()
    }

    /// Appends the record of an entry that now lives here.
    #[inline]
    pub fn push(&mut self, r: R, is_live: impl FnMut(&R) -> bool) {
        self.records.push_back(r);
        self.live += 1;
        self.compact_if_stale(is_live);
    }

    /// One entry of this list left it (its record is stale now, or was popped by
    /// [`LazyList::pop_head`]).
    #[inline]
    pub fn retire(&mut self, is_live: impl FnMut(&R) -> bool) {
        self.live -= 1;
        self.compact_if_stale(is_live);
    }

    /// The first live record, stale ones before it dropped.
    #[inline]
    pub fn head(&mut self, mut is_live: impl FnMut(&R) -> bool) -> Option<R> {
        while let Some(r) = self.records.front() {
            if is_live(r) {
                return Some(*r);
            }
            self.records.pop_front();
        }
        None
    }

    /// Drops the head record (the live one [`LazyList::head`] returned); the caller then retires its
    /// entry or queues it again, and either way calls [`LazyList::retire`].
    #[inline]
    pub fn pop_head(&mut self) {
        self.records.pop_front();
    }

    fn compact_if_stale(&mut self, is_live: impl FnMut(&R) -> bool) {
        if self.live == 0 {
            // Every record is stale: nothing to look up (an exclusive pool drained by its gets).
            self.records.clear();
        } else if self.records.len() > 2 * self.live + 64 {
            self.records.retain(is_live);
            debug_assert_eq!(self.records.len(), self.live);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stale_records_are_skipped_and_compacted() {
        // Entry i is live while alive[i]; records are (entry, stamp) with stamp = entry here.
        let mut alive = vec![true; 1000];
        let mut l = LazyList::default();
        for i in 0..1000usize {
            l.push(i, |&r: &usize| alive[r]);
        }
        for i in 0..990 {
            alive[i] = false;
            l.retire(|&r| alive[r]);
        }
        assert_eq!(l.live(), 10);
        assert!(l.records() <= 2 * 10 + 64 + 1, "{} records for 10 live", l.records());
        assert_eq!(l.head(|&r| alive[r]), Some(990));
        l.pop_head();
        alive[990] = false;
        l.retire(|&r| alive[r]);
        assert_eq!(l.head(|&r| alive[r]), Some(991));
        for i in 991..1000 {
            alive[i] = false;
            l.retire(|&r| alive[r]);
        }
        assert_eq!((l.live(), l.records()), (0, 0), "an all-stale list is cleared");
        assert_eq!(l.head(|&r| alive[r]), None);
    }
}
