//! The slot allocator: which page slots of the store file are handed out.
//!
//! A LIFO free list plus a bump pointer over never-used slots, O(1) per operation, and a bitmap of
//! allocated slots that turns a double free into a no-op (and a debug assertion). It is plain data: the
//! store keeps it inside its state mutex.
//!
//! Invariants: `in_use` equals the number of set bits; a slot is on the free list only if its bit is
//! clear; every slot below `next_fresh` is either allocated or on the free list.

#[derive(Default)]
pub(super) struct SlotAllocator {
    /// Freed slots, reused last-in first-out.
    free: Vec<u32>,
    /// Slots `next_fresh..limit` have never been allocated.
    next_fresh: u32,
    limit: u32,
    allocated: Bitmap,
    in_use: u32,
}

impl SlotAllocator {
    pub(super) fn new(slots: u32) -> SlotAllocator {
        let mut a = SlotAllocator { limit: slots, ..SlotAllocator::default() };
        a.allocated.resize(slots);
        a
    }

    /// Makes slots up to `slots` available (never shrinks).
    pub(super) fn grow(&mut self, slots: u32) {
        if slots > self.limit {
            self.limit = slots;
            self.allocated.resize(slots);
        }
    }

    #[cfg(test)]
    pub(super) fn limit(&self) -> u32 {
        self.limit
    }

    pub(super) fn in_use(&self) -> u32 {
        self.in_use
    }

    pub(super) fn is_allocated(&self, slot: u32) -> bool {
        slot < self.limit && self.allocated.get(slot)
    }

    pub(super) fn alloc(&mut self) -> Option<u32> {
        let slot = match self.free.pop() {
            Some(slot) => slot,
            None if self.next_fresh < self.limit => {
                self.next_fresh += 1;
                self.next_fresh - 1
            }
            None => return None,
        };
        debug_assert!(!self.allocated.get(slot), "slot {slot} on the free list is allocated");
        self.allocated.set(slot, true);
        self.in_use += 1;
        Some(slot)
    }

    /// Returns `slot` to the free list; `false` (and no change) if it is not allocated.
    pub(super) fn free(&mut self, slot: u32) -> bool {
        if !self.is_allocated(slot) {
            return false;
        }
        self.allocated.set(slot, false);
        self.in_use -= 1;
        self.free.push(slot);
        true
    }
}

/// One bit per slot: allocated or not.
#[derive(Default)]
struct Bitmap {
    words: Vec<u64>,
}

impl Bitmap {
    fn resize(&mut self, bits: u32) {
        let words = (bits as usize).div_ceil(64);
        if words > self.words.len() {
            self.words.resize(words, 0);
        }
    }
    fn get(&self, bit: u32) -> bool {
        self.words.get(bit as usize / 64).is_some_and(|w| w & (1 << (bit % 64)) != 0)
    }
    fn set(&mut self, bit: u32, value: bool) {
        if let Some(w) = self.words.get_mut(bit as usize / 64) {
            if value {
                *w |= 1 << (bit % 64);
            } else {
                *w &= !(1 << (bit % 64));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fresh_slots_then_lifo_reuse_and_double_free_is_refused() {
        let mut a = SlotAllocator::new(3);
        assert_eq!((a.alloc(), a.alloc(), a.alloc(), a.alloc()), (Some(0), Some(1), Some(2), None));
        assert!(a.free(1) && a.free(0));
        assert!(!a.free(0), "a double free changes nothing");
        assert!(!a.free(7), "a slot beyond the limit is not allocated");
        assert_eq!(a.in_use(), 1);
        assert_eq!(a.alloc(), Some(0), "last freed, first reused");
        a.grow(2);
        assert_eq!(a.limit(), 3, "never shrinks");
        a.grow(4);
        assert_eq!((a.alloc(), a.alloc(), a.alloc()), (Some(1), Some(3), None));
        assert_eq!(a.in_use(), 4);
    }
}
