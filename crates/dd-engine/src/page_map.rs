//! The per-object page index of a pool: page index -> value, an open-addressing table with linear
//! probing whose buckets hold key and value together.
//!
//! Why not `HashMap`: a SwissTable keeps its control bytes apart from its buckets, so a lookup in a
//! table that is not in the CPU caches costs two dependent cache misses (the control group, then the
//! bucket). The pool's index is probed on every get and put and is usually cold (the pages it locates
//! are far larger than the caches), so here a bucket is found with one miss: the probe starts at the
//! bucket the hash names and the key is right there.
//!
//! A map that never held more than one key keeps it **inline**, in the map itself, and allocates no
//! buckets: an object of one page (a small file, a trace's object) is then found in the object map's
//! own entry, one dependent cache miss fewer per get and put (measured: `PageMap::remove` alone was 17%
//! of a lab trace replay whose objects are single pages, nearly all of it the miss on the object's own
//! bucket array; BENCHMARKS.md).
//!
//! Invariants:
//! * while no buckets are allocated the map holds at most one key, in `one`; once they are, `one` is
//!   empty for good (an emptied map keeps its buckets for reuse);
//! * the capacity is zero or a power of two, and at most three quarters of the buckets are full, so
//!   every probe sequence ends at an empty bucket;
//! * every key sits in the probe sequence from its home bucket with no empty bucket in between (removal
//!   shifts the following entries back instead of leaving tombstones), so lookups stop at the first
//!   empty bucket;
//! * keys are hashed with the pool's randomly seeded hasher, so a guest cannot choose page indices that
//!   collide (every tenant's pages share the daemon's CPU).

use std::hash::BuildHasher;

#[derive(Debug, Clone, Copy)]
struct Bucket<V> {
    key: u64,
    /// `None`: the bucket is empty (values with a niche, such as the pool's slots, cost no extra space).
    val: Option<V>,
}

/// Page index -> `V`; see the module documentation.
#[derive(Debug, Clone)]
pub(crate) struct PageMap<V> {
    buckets: Box<[Bucket<V>]>,
    /// The map's only key while `buckets` is empty (module docs).
    one: Bucket<V>,
    len: usize,
}

impl<V> Default for PageMap<V> {
    fn default() -> Self {
        PageMap { buckets: Box::new([]), one: Bucket { key: 0, val: None }, len: 0 }
    }
}

impl<V: Copy> PageMap<V> {
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Buckets allocated (what an emptied map keeps for reuse).
    pub fn capacity(&self) -> usize {
        self.buckets.len()
    }

    fn home(&self, h: &impl BuildHasher, key: u64) -> usize {
        h.hash_one(key) as usize & (self.buckets.len() - 1)
    }

    /// The bucket holding `key`, if any (buckets allocated).
    fn find(&self, h: &impl BuildHasher, key: u64) -> Option<usize> {
        if self.len == 0 || self.buckets.is_empty() {
            return None;
        }
        let mask = self.buckets.len() - 1;
        let mut i = self.home(h, key);
        loop {
            let b = &self.buckets[i];
            b.val?;
            if b.key == key {
                return Some(i);
            }
            i = (i + 1) & mask;
        }
    }

    pub fn get(&self, h: &impl BuildHasher, key: u64) -> Option<V> {
        if self.buckets.is_empty() {
            return self.one.val.filter(|_| self.one.key == key);
        }
        self.find(h, key).and_then(|i| self.buckets[i].val)
    }

    pub fn get_mut(&mut self, h: &impl BuildHasher, key: u64) -> Option<&mut V> {
        if self.buckets.is_empty() {
            return self.one.val.as_mut().filter(|_| self.one.key == key);
        }
        let i = self.find(h, key)?;
        self.buckets[i].val.as_mut()
    }

    /// Inserts or replaces; returns the value replaced.
    pub fn insert(&mut self, h: &impl BuildHasher, key: u64, val: V) -> Option<V> {
        if self.buckets.is_empty() {
            match self.one.val {
                None => {
                    self.one = Bucket { key, val: Some(val) };
                    self.len = 1;
                    return None;
                }
                Some(old) if self.one.key == key => {
                    self.one.val = Some(val);
                    return Some(old);
                }
                // A second key: allocate the buckets (`grow` moves the inline key into them).
                Some(_) => {}
            }
        }
        if (self.len + 1) * 4 > self.buckets.len() * 3 {
            self.grow(h);
        }
        let mask = self.buckets.len() - 1;
        let mut i = self.home(h, key);
        loop {
            let b = &mut self.buckets[i];
            match b.val {
                None => {
                    *b = Bucket { key, val: Some(val) };
                    self.len += 1;
                    return None;
                }
                Some(old) if b.key == key => {
                    b.val = Some(val);
                    return Some(old);
                }
                Some(_) => i = (i + 1) & mask,
            }
        }
    }

    /// Removes a key; returns its value.
    pub fn remove(&mut self, h: &impl BuildHasher, key: u64) -> Option<V> {
        if self.buckets.is_empty() {
            if self.one.key != key {
                return None;
            }
            let val = self.one.val.take()?;
            self.len = 0;
            return Some(val);
        }
        let mut hole = self.find(h, key)?;
        let val = self.buckets[hole].val.take();
        self.len -= 1;
        // Backward shift: move later entries of the run into the hole when that keeps them reachable
        // from their home bucket, so no lookup ever stops early at the hole.
        let mask = self.buckets.len() - 1;
        let mut j = hole;
        loop {
            j = (j + 1) & mask;
            let Some(v) = self.buckets[j].val else { break };
            let home = self.home(h, self.buckets[j].key);
            // The entry at j may fill the hole unless its home lies cyclically in (hole, j].
            let home_after_hole = if hole <= j { hole < home && home <= j } else { hole < home || home <= j };
            if !home_after_hole {
                self.buckets[hole] = Bucket { key: self.buckets[j].key, val: Some(v) };
                self.buckets[j].val = None;
                hole = j;
            }
        }
        val
    }

    fn grow(&mut self, h: &impl BuildHasher) {
        let cap = (self.buckets.len() * 2).max(8);
        let old =
            std::mem::replace(&mut self.buckets, vec![Bucket { key: 0, val: None }; cap].into_boxed_slice());
        self.len = 0;
        // The inline key, if any, moves into the buckets and `one` stays empty from now on.
        let one = std::mem::replace(&mut self.one, Bucket { key: 0, val: None });
        for b in old.iter().chain(std::iter::once(&one)) {
            if let Some(v) = b.val {
                self.insert(h, b.key, v);
            }
        }
    }

    /// Every (key, value), in no particular order.
    pub fn iter(&self) -> impl Iterator<Item = (u64, V)> + '_ {
        std::iter::once(&self.one).chain(self.buckets.iter()).filter_map(|b| b.val.map(|v| (b.key, v)))
    }

    pub fn values(&self) -> impl Iterator<Item = V> + '_ {
        self.iter().map(|(_, v)| v)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::HashMap;

    type H = foldhash::fast::RandomState;

    /// Applies `(op, key, value)` steps (op 0 and 1 insert, 2 removes) to the map and to `HashMap`,
    /// and after every step checks that they agree on the length, every key of `probe`, and the items.
    fn agrees_with_hashmap_over(steps: Vec<(u8, u64, u32)>, probe: &[u64]) -> Result<(), TestCaseError> {
        let h = H::default();
        let mut m: PageMap<u32> = PageMap::default();
        let mut r: HashMap<u64, u32> = HashMap::new();
        for (op, k, v) in steps {
            match op {
                0 | 1 => prop_assert_eq!(m.insert(&h, k, v), r.insert(k, v)),
                _ => prop_assert_eq!(m.remove(&h, k), r.remove(&k)),
            }
            prop_assert_eq!(m.len(), r.len());
            prop_assert_eq!(m.is_empty(), r.is_empty());
            for &key in probe {
                prop_assert_eq!(m.get(&h, key), r.get(&key).copied());
                prop_assert_eq!(m.get_mut(&h, key).copied(), r.get(&key).copied());
            }
            let mut items: Vec<_> = m.iter().collect();
            items.sort();
            let mut want: Vec<_> = r.iter().map(|(k, v)| (*k, *v)).collect();
            want.sort();
            prop_assert_eq!(items, want);
        }
        Ok(())
    }

    proptest! {
        /// The map against `HashMap`, over inserts, replacements and removals of a small key space
        /// (so that runs, wrap-around and backward shifts are exercised), checked after every step.
        #[test]
        fn agrees_with_hashmap(ops in proptest::collection::vec((0u8..3, 0u64..48, any::<u32>()), 0..400)) {
            let key = |k: u64| if k >= 40 { u64::MAX - k } else { k };
            let probe: Vec<u64> = (0..48).map(key).collect();
            agrees_with_hashmap_over(ops.into_iter().map(|(op, k, v)| (op, key(k), v)).collect(), &probe)?;
        }

        /// The same over three keys, so that the inline key, its replacement and removal, and the move
        /// to allocated buckets at a second key are what most steps exercise.
        #[test]
        fn agrees_with_hashmap_around_the_inline_key(ops in proptest::collection::vec((0u8..3, 0u64..3, any::<u32>()), 0..40)) {
            let key = |k: u64| if k == 2 { u64::MAX } else { k };
            agrees_with_hashmap_over(ops.into_iter().map(|(op, k, v)| (op, key(k), v)).collect(), &[0, 1, u64::MAX, 7])?;
        }
    }

    #[test]
    fn one_key_allocates_no_buckets_and_a_second_moves_it_into_them() {
        let h = H::default();
        let mut m: PageMap<u32> = PageMap::default();
        assert_eq!(m.insert(&h, 9, 1), None);
        assert_eq!(m.insert(&h, 9, 2), Some(1));
        assert_eq!(m.capacity(), 0, "one key stays inline");
        assert_eq!(m.remove(&h, 9), Some(2));
        assert!(m.is_empty());
        assert_eq!(m.capacity(), 0);
        m.insert(&h, 9, 3);
        m.insert(&h, 10, 4);
        assert_eq!(m.capacity(), 8, "a second key allocates the buckets");
        assert_eq!((m.get(&h, 9), m.get(&h, 10)), (Some(3), Some(4)));
        assert_eq!(m.iter().count(), 2, "the inline key moved, it is not listed twice");
        m.remove(&h, 9);
        m.remove(&h, 10);
        m.insert(&h, 11, 5);
        assert_eq!(m.capacity(), 8, "an emptied map keeps its buckets, and uses them");
        assert_eq!(m.iter().collect::<Vec<_>>(), vec![(11, 5)]);
    }

    #[test]
    fn keeps_a_quarter_free_and_reuses_capacity() {
        let h = H::default();
        let mut m: PageMap<u32> = PageMap::default();
        for k in 0..1000 {
            m.insert(&h, k, k as u32);
            assert!(m.len() * 4 <= m.capacity() * 3 || (m.capacity() == 0 && m.len() == 1));
        }
        let cap = m.capacity();
        for k in 0..1000 {
            assert_eq!(m.remove(&h, k), Some(k as u32));
        }
        assert!(m.is_empty());
        assert_eq!(m.capacity(), cap, "an emptied map keeps its buckets");
        assert_eq!(m.get_mut(&h, 5), None);
        m.insert(&h, 5, 1);
        *m.get_mut(&h, 5).expect("inserted") = 2;
        assert_eq!(m.get(&h, 5), Some(2));
    }
}
