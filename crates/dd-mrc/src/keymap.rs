//! `KeyMap`: key -> slot, an open-addressing table with linear probing, for the stack models and the
//! lab's trace loader (`dd_lab::model::workload`, which numbers a trace's objects densely).
//!
//! Why not `HashMap`: the exact model looks up one key per reference in a map of every distinct key,
//! far larger than the caches; with the key and its slot in one 16-byte entry, a lookup costs one
//! cache miss where a SwissTable's separate control bytes and buckets cost two (measured: the map was
//! two thirds of the exact model's time). [`KeyMap::prefetch`] lets a caller that knows the next keys
//! overlap those misses (the trace loader knows a whole batch of them), and [`prefetch_slot`] the
//! record a looked-up slot indexes (the lab's guest page cache, whose crate allows no unsafe code).
//!
//! Invariants: `len` entries are occupied (`slot != EMPTY`); every occupied entry is reachable from
//! its home index without crossing an empty one (deletion shifts entries back to keep it so); the
//! table is at most 5/8 full.

const EMPTY: u32 = u32::MAX;

/// Hints the CPU to fetch `items[i]` (a no-op where there is no prefetch instruction, or when `i` is
/// out of range). For a caller that knows which record a later access will touch.
#[inline]
pub fn prefetch_slot<T>(items: &[T], i: usize) {
    #[cfg(target_arch = "x86_64")]
    if let Some(p) = items.get(i) {
        // SAFETY: prefetching is only a hint and never faults; the address is an element of `items`.
        unsafe {
            core::arch::x86_64::_mm_prefetch((p as *const T).cast::<i8>(), core::arch::x86_64::_MM_HINT_T0)
        };
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (items, i);
}

#[derive(Debug, Clone, Copy)]
#[repr(C, align(16))]
struct Entry {
    key: u64,
    slot: u32,
}

const VACANT: Entry = Entry { key: 0, slot: EMPTY };

#[derive(Debug)]
pub struct KeyMap {
    entries: Vec<Entry>,
    /// `64 - log2(entries.len())`: the home index is the hash's top bits.
    shift: u32,
    len: usize,
}

#[inline]
fn mix(key: u64) -> u64 {
    // A multiply-xorshift mixer: cheap, and independent of the sampling hash (sampled keys all have
    // small sampling hashes; they must still spread over this table).
    let k = (key ^ (key >> 32)).wrapping_mul(0xd6e8_feb8_6659_fd93);
    k ^ (k >> 32)
}

impl Default for KeyMap {
    fn default() -> Self {
        KeyMap::new()
    }
}

impl KeyMap {
    pub fn new() -> KeyMap {
        KeyMap { entries: vec![VACANT; 1024], shift: 64 - 10, len: 0 }
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// `key`'s slot.
    #[inline]
    pub fn get(&self, key: u64) -> Option<u32> {
        self.find(key).map(|i| self.entries[i].slot)
    }

    /// The index of `key`'s entry.
    #[inline]
    fn find(&self, key: u64) -> Option<usize> {
        let mask = self.entries.len() - 1;
        let mut i = self.home(key);
        loop {
            let e = self.entries[i];
            if e.slot == EMPTY {
                return None;
            }
            if e.key == key {
                return Some(i);
            }
            i = (i + 1) & mask;
        }
    }

    #[inline]
    fn home(&self, key: u64) -> usize {
        (mix(key).wrapping_mul(0x9e37_79b9_7f4a_7c15) >> self.shift) as usize
    }

    /// Hints the CPU to fetch `key`'s entry (a no-op where there is no prefetch instruction).
    #[inline]
    pub fn prefetch(&self, key: u64) {
        prefetch_slot(&self.entries, self.home(key));
    }

    /// Sets `key`'s slot (any value but `u32::MAX`); returns the previous one.
    #[inline]
    pub fn insert(&mut self, key: u64, slot: u32) -> Option<u32> {
        debug_assert_ne!(slot, EMPTY);
        let mask = self.entries.len() - 1;
        let mut i = self.home(key);
        loop {
            let e = &mut self.entries[i];
            if e.slot == EMPTY {
                *e = Entry { key, slot };
                self.len += 1;
                if self.len * 8 > self.entries.len() * 5 {
                    self.grow();
                }
                return None;
            }
            if e.key == key {
                return Some(std::mem::replace(&mut e.slot, slot));
            }
            i = (i + 1) & mask;
        }
    }

    /// Removes `key`; returns its slot.
    pub fn remove(&mut self, key: u64) -> Option<u32> {
        let mask = self.entries.len() - 1;
        let i = self.find(key)?;
        let slot = self.entries[i].slot;
        // Backward-shift deletion: pull later entries of the run into the hole when their home allows.
        let mut hole = i;
        let mut j = (i + 1) & mask;
        loop {
            let e = self.entries[j];
            if e.slot == EMPTY {
                break;
            }
            let home = self.home(e.key);
            // `e` may move to `hole` iff its home is not in (hole, j] (cyclically).
            let stays = if hole <= j { hole < home && home <= j } else { hole < home || home <= j };
            if !stays {
                self.entries[hole] = e;
                hole = j;
            }
            j = (j + 1) & mask;
        }
        self.entries[hole] = VACANT;
        self.len -= 1;
        Some(slot)
    }

    /// Every key's slot, for rewriting in place (the entries' memory order, not the keys').
    pub fn slots_mut(&mut self) -> impl Iterator<Item = &mut u32> {
        self.entries.iter_mut().filter(|e| e.slot != EMPTY).map(|e| &mut e.slot)
    }

    /// Every key's slot.
    #[cfg(test)]
    pub fn slots(&self) -> impl Iterator<Item = u32> + '_ {
        self.entries.iter().filter(|e| e.slot != EMPTY).map(|e| e.slot)
    }

    fn grow(&mut self) {
        let bigger = vec![VACANT; self.entries.len() * 2];
        let old = std::mem::replace(&mut self.entries, bigger);
        self.shift -= 1;
        self.len = 0;
        for e in old.into_iter().filter(|e| e.slot != EMPTY) {
            self.insert(e.key, e.slot);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};
    use std::collections::HashMap;

    #[test]
    fn behaves_like_a_hashmap_under_inserts_and_removals() {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(3);
        let mut m = KeyMap::new();
        let mut model = HashMap::new();
        for i in 0..200_000u32 {
            // Few distinct keys and many removals exercise long runs and backward shifts.
            let key = rng.gen_range(0..5_000u64) << 20;
            assert_eq!(m.get(key), model.get(&key).copied(), "get {key} at {i}");
            if rng.gen_bool(0.3) {
                assert_eq!(m.remove(key), model.remove(&key), "remove {key} at {i}");
            } else {
                assert_eq!(m.insert(key, i), model.insert(key, i), "insert {key} at {i}");
            }
            assert_eq!(m.len(), model.len());
        }
        let mut got: Vec<u32> = m.slots().collect();
        let mut want: Vec<u32> = model.values().copied().collect();
        got.sort_unstable();
        want.sort_unstable();
        assert_eq!(got, want);
    }
}
