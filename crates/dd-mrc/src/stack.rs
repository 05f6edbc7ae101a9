//! The order-statistic structure behind stack distances: live keys hold the "slot" of their last access
//! (slots are handed out in time order), and the LRU stack distance of a re-reference is the weight of
//! the live slots after the key's own, plus its own new weight (1 per page, or its bytes).
//!
//! Layout, chosen for speed (every reference of the exact method pays for it): a bitset of live slots,
//! and a Fenwick tree over its 64-slot words holding each word's live weight. A suffix sum is a Fenwick
//! prefix over words plus a popcount (pages) or a masked walk over one word (bytes). The tree is 64 times
//! smaller than one over slots, so for a million keys it stays in the L2 cache; the only random memory
//! touches per reference are the key map and the key's previous word.
//!
//! When the slots run out, the live ones are packed to the front in the same order (their relative order
//! is all that matters) into a table of four times the live keys, and the tree is rebuilt in O(slots):
//! memory stays O(live keys) however long the stream. The re-mapping walks the key map in its own
//! memory order and computes each key's new slot as its rank among the live bits, so it costs a
//! sequential scan, not a random map update per key.
//!
//! Invariants: for every key `k` in `map`, bit `map[k]` is set, and the map's slots are distinct; no
//! other bit is set; `weights[s] > 0` for set bits (weighted mode); `tree` is the Fenwick tree of the
//! words' live weights; `live_weight` is their sum.

use crate::keymap::KeyMap;

#[derive(Debug)]
pub(crate) struct ReuseStack {
    /// Live slots, one bit each.
    bits: Vec<u64>,
    /// Slots handed out: `bits.len() * 64`.
    slots: usize,
    /// Per-slot weights; empty when every weight is 1 (pages).
    weights: Vec<u64>,
    weighted: bool,
    /// Fenwick tree over words, 1-based: `tree[i]` sums words `(i - lowbit(i), i]` (1-based).
    tree: Vec<u64>,
    next: usize,
    map: KeyMap,
    live_weight: u64,
}

const MIN_SLOTS: usize = 4096;

impl ReuseStack {
    /// `weighted`: keys carry weights other than 1 (byte curves).
    pub fn new(weighted: bool) -> Self {
        let mut s = ReuseStack {
            bits: Vec::new(),
            slots: 0,
            weights: Vec::new(),
            weighted,
            tree: Vec::new(),
            next: 0,
            map: KeyMap::new(),
            live_weight: 0,
        };
        s.rebuild(0, Vec::new(), MIN_SLOTS);
        s
    }

    /// Live keys.
    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// Sum of the live keys' weights.
    pub fn live_weight(&self) -> u64 {
        self.live_weight
    }

    /// References `key` with `weight` (> 0; must be 1 unless weighted): returns its stack distance (in
    /// weight, its own new weight included) if it was live, `None` for a first reference; either way it
    /// is now the most recent.
    #[inline]
    pub fn access(&mut self, key: u64, weight: u64) -> Option<u64> {
        debug_assert!(weight > 0 && (self.weighted || weight == 1));
        if self.next == self.slots {
            self.compact();
        }
        let slot = self.next;
        self.next += 1;
        let distance = match self.map.insert(key, slot as u32) {
            Some(prev) => {
                let prev = prev as usize;
                // Keys referenced after `prev`: everything live minus slots 0..=prev.
                let after = self.live_weight - self.prefix(prev + 1);
                self.clear(prev);
                Some(after + weight)
            }
            None => None,
        };
        self.bits[slot / 64] |= 1 << (slot % 64);
        if self.weighted {
            self.weights[slot] = weight;
        }
        self.add(slot / 64, weight);
        self.live_weight += weight;
        distance
    }

    /// See [`KeyMap::prefetch`].
    #[inline]
    pub fn prefetch(&self, key: u64) {
        self.map.prefetch(key);
    }

    /// Forgets `key` (fixed-size sampling dropping a key). Returns whether it was live.
    pub fn remove(&mut self, key: u64) -> bool {
        let Some(slot) = self.map.remove(key) else { return false };
        self.clear(slot as usize);
        true
    }

    #[inline]
    fn clear(&mut self, slot: usize) {
        let old = if self.weighted { self.weights[slot] } else { 1 };
        self.bits[slot / 64] &= !(1 << (slot % 64));
        self.add(slot / 64, old.wrapping_neg());
        self.live_weight -= old;
    }

    /// Adds `delta` (two's complement for a decrease) to word `word`.
    #[inline]
    fn add(&mut self, word: usize, delta: u64) {
        let n = self.bits.len();
        let mut i = word + 1;
        while i <= n {
            self.tree[i] = self.tree[i].wrapping_add(delta);
            i += i & i.wrapping_neg();
        }
    }

    /// Sum of the weights of slots `0..end`.
    #[inline]
    fn prefix(&self, end: usize) -> u64 {
        let (word, bit) = (end / 64, end % 64);
        let mut sum = 0u64;
        let mut i = word;
        while i > 0 {
            sum = sum.wrapping_add(self.tree[i]);
            i &= i - 1;
        }
        if bit > 0 {
            let mut w = self.bits[word] & ((1u64 << bit) - 1);
            if self.weighted {
                while w != 0 {
                    sum += self.weights[word * 64 + w.trailing_zeros() as usize];
                    w &= w - 1;
                }
            } else {
                sum += w.count_ones() as u64;
            }
        }
        sum
    }

    /// Packs the live slots to the front (keeping their order) and rebuilds.
    fn compact(&mut self) {
        let live = self.map.len();
        // rank[w] = live slots before word w.
        let mut rank = Vec::with_capacity(self.bits.len());
        let mut before = 0u32;
        for w in &self.bits {
            rank.push(before);
            before += w.count_ones();
        }
        debug_assert_eq!(before as usize, live);
        let mut weights = vec![0u64; if self.weighted { live } else { 0 }];
        for slot in self.map.slots_mut() {
            let old = *slot as usize;
            let below = self.bits[old / 64] & ((1u64 << (old % 64)) - 1);
            let new = rank[old / 64] + below.count_ones();
            if self.weighted {
                weights[new as usize] = self.weights[old];
            }
            *slot = new;
        }
        self.rebuild(live, weights, (4 * live).max(MIN_SLOTS));
    }

    /// Lays out `live` keys (with `weights`) in slots `0..live` of a table of at least `cap` slots.
    fn rebuild(&mut self, live: usize, mut weights: Vec<u64>, cap: usize) {
        let cap = cap.next_multiple_of(64);
        assert!(cap <= u32::MAX as usize, "more than 2^30 distinct keys in one stack");
        let words = cap / 64;
        let mut bits = vec![0u64; words];
        for (w, word) in bits.iter_mut().enumerate().take(live.div_ceil(64)) {
            let n = (live - w * 64).min(64);
            *word = if n == 64 { u64::MAX } else { (1u64 << n) - 1 };
        }
        if self.weighted {
            weights.resize(cap, 0);
        }
        // Linear Fenwick construction: each node passes its sum to its parent.
        let mut tree = vec![0u64; words + 1];
        for w in 0..words {
            let own = if self.weighted {
                weights[w * 64..(w + 1) * 64].iter().sum()
            } else {
                bits[w].count_ones() as u64
            };
            let i = w + 1;
            tree[i] = tree[i].wrapping_add(own);
            let parent = i + (i & i.wrapping_neg());
            if parent <= words {
                tree[parent] = tree[parent].wrapping_add(tree[i]);
            }
        }
        self.bits = bits;
        self.slots = cap;
        self.weights = weights;
        self.tree = tree;
        self.next = live;
    }

    /// Checks every invariant of the module comment.
    #[cfg(test)]
    pub fn check(&self) {
        let mut seen = std::collections::HashSet::new();
        for s in self.map.slots() {
            let s = s as usize;
            assert!(seen.insert(s), "two keys in slot {s}");
            assert!(self.bits[s / 64] & (1 << (s % 64)) != 0);
            assert!(!self.weighted || self.weights[s] > 0);
        }
        let live_bits: u32 = self.bits.iter().map(|w| w.count_ones()).sum();
        assert_eq!(live_bits as usize, self.map.len());
        let mut total = 0;
        for slot in 0..self.slots {
            if self.bits[slot / 64] & (1 << (slot % 64)) != 0 {
                total += if self.weighted { self.weights[slot] } else { 1 };
            }
            assert_eq!(self.prefix(slot + 1), total, "prefix at {slot}");
        }
        assert_eq!(total, self.live_weight);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};

    /// A literal LRU stack (vector, most recent last) as the reference.
    fn brute_distance(stack: &mut Vec<(u64, u64)>, key: u64, w: u64) -> Option<u64> {
        let pos = stack.iter().position(|&(k, _)| k == key);
        let d = pos.map(|p| stack[p + 1..].iter().map(|&(_, w)| w).sum::<u64>() + w);
        if let Some(p) = pos {
            stack.remove(p);
        }
        stack.push((key, w));
        d
    }

    #[test]
    fn distances_match_a_literal_stack_through_compactions() {
        for weighted in [false, true] {
            distances_match_a_literal_stack(weighted);
        }
    }

    fn distances_match_a_literal_stack(weighted: bool) {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(7);
        let mut s = ReuseStack::new(weighted);
        let mut brute = Vec::new();
        for i in 0..40_000 {
            let key = rng.gen_range(0..if i < 20_000 { 300u64 } else { 3000 });
            let w = if weighted { rng.gen_range(1..5u64) } else { 1 };
            if i % 97 == 0 {
                let gone = s.remove(key);
                let pos = brute.iter().position(|&(k, _)| k == key);
                assert_eq!(gone, pos.is_some());
                if let Some(p) = pos {
                    brute.remove(p);
                }
                continue;
            }
            assert_eq!(s.access(key, w), brute_distance(&mut brute, key, w), "access {i}");
            if i % 5000 == 0 {
                s.check();
            }
        }
        s.check();
        assert_eq!(s.len(), brute.len());
    }

    #[test]
    fn stays_small_over_a_long_stream_of_few_keys() {
        let mut s = ReuseStack::new(false);
        for i in 0..1_000_000u64 {
            s.access(i % 10, 1);
        }
        assert!(s.slots <= MIN_SLOTS, "{}", s.slots);
        assert_eq!(s.access(3, 1), Some(7)); // 4..=9 came after it
    }
}
