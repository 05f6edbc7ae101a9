//! The per-object page index of a pool: page index -> value, an open-addressing table with linear
//! probing whose buckets hold key and value together.
//!
//! Why not `HashMap`: a SwissTable keeps its control bytes apart from its buckets, so a lookup in a
//! table that is not in the CPU caches costs two dependent cache misses (the control group, then the
//! bucket). The pool's index is probed on every get and put and is usually cold (the pages it locates
//! are far larger than the caches), so here a bucket is found with one miss: the probe starts at the
//! bucket the hash names and the key is right there.
//!
//! Invariants:
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
    len: usize,
}

impl<V> Default for PageMap<V> {
    fn default() -> Self {
        PageMap { buckets: Box::new([]), len: 0 }
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

    /// The bucket holding `key`, if any.
    fn find(&self, h: &impl BuildHasher, key: u64) -> Option<usize> {
        if self.len == 0 {
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
        self.find(h, key).and_then(|i| self.buckets[i].val)
    }

    pub fn get_mut(&mut self, h: &impl BuildHasher, key: u64) -> Option<&mut V> {
        let i = self.find(h, key)?;
        self.buckets[i].val.as_mut()
    }

    /// Inserts or replaces; returns the value replaced.
    pub fn insert(&mut self, h: &impl BuildHasher, key: u64, val: V) -> Option<V> {
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
        for b in old.iter() {
            if let Some(v) = b.val {
                self.insert(h, b.key, v);
            }
        }
    }

    /// Every (key, value), in no particular order.
    pub fn iter(&self) -> impl Iterator<Item = (u64, V)> + '_ {
        self.buckets.iter().filter_map(|b| b.val.map(|v| (b.key, v)))
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

    proptest! {
        /// The map against `HashMap`, over inserts, replacements and removals of a small key space
        /// (so that runs, wrap-around and backward shifts are exercised), checked after every step.
        #[test]
        fn agrees_with_hashmap(ops in proptest::collection::vec((0u8..3, 0u64..48, any::<u32>()), 0..400)) {
            let h = H::default();
            let mut m: PageMap<u32> = PageMap::default();
            let mut r: HashMap<u64, u32> = HashMap::new();
            for (op, k, v) in ops {
                let k = if k >= 40 { u64::MAX - k } else { k };
                match op {
                    0 | 1 => prop_assert_eq!(m.insert(&h, k, v), r.insert(k, v)),
                    _ => prop_assert_eq!(m.remove(&h, k), r.remove(&k)),
                }
                prop_assert_eq!(m.len(), r.len());
                for key in (0..40).chain((40..48).map(|k| u64::MAX - k)) {
                    prop_assert_eq!(m.get(&h, key), r.get(&key).copied());
                }
                let mut items: Vec<_> = m.iter().collect();
                items.sort();
                let mut want: Vec<_> = r.iter().map(|(k, v)| (*k, *v)).collect();
                want.sort();
                prop_assert_eq!(items, want);
            }
        }
    }

    #[test]
    fn keeps_a_quarter_free_and_reuses_capacity() {
        let h = H::default();
        let mut m: PageMap<u32> = PageMap::default();
        for k in 0..1000 {
            m.insert(&h, k, k as u32);
            assert!(m.len() * 4 <= m.capacity() * 3);
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
