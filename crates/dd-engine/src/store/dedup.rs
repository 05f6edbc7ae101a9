//! Content de-duplication of the memory store (thesis 004, chapter 4; SPEC section 4).
//!
//! Equal pages share one refcounted frame. The content index maps `(domain, 128-bit hash)` to a frame
//! and its reference count; a match is confirmed by a full byte comparison before it is shared, so a
//! hash collision can cost a missed de-duplication but never wrong data.
//!
//! **Domains.** Pages are only shared inside one de-duplication domain. By default every VM has a
//! domain of its own (secure by default); the host administrator may put VMs in a named group, whose
//! VMs share one domain (`Cache::set_vm_dedup_group`). Sharing across tenants opens a side channel: a
//! put that de-duplicates is measurably cheaper (no frame is written and no capacity is used), so a
//! tenant that puts a guessed page and times the put, or watches how fast the store fills, learns
//! whether another tenant holds a page with that content (the attack known from KSM and other memory
//! de-duplication). So content crosses VMs only inside a group the administrator made, and even there a
//! VM's own statistics never count a group match (`dedup_hits`, `bytes_saved` of group pages go to
//! host-scope counters only). Co-operative de-duplication shares one group's domain with peers.
//!
//! **Charging.** Every pool is charged one page for every page it references, shared or not: a pool's
//! `used` and its entitlement count logical pages, so sharing never lets a tenant exceed its share and
//! the charge does not depend on what other tenants store. The store's capacity counts physical frames,
//! so de-duplication shows up as free capacity (the store fills later) and in `dedup_hits` and
//! `bytes_saved`.
//!
//! **Invariants.** A frame in the index is immutable while its count is positive (every reference
//! holder only reads it); its count equals the number of pool entries that reference it; the frame is
//! freed exactly when the count drops to zero, under the shard lock, so a concurrent put can never take
//! a reference to a frame that is being freed. Each frame's domain and hash are recorded in side tables
//! when it enters the index (it is owned exclusively then), so a release finds its index entry without
//! reading and re-hashing the page's 4 KiB.
//! Frames that lost a hash collision are stored unindexed (domain [`UNINDEXED`]) and freed directly.

use super::frame::FrameId;
use super::mem::MemStore;
use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};

const SHARDS: usize = 32;

/// The frame-domain marker of a frame that is not in the index.
pub const UNINDEXED: u64 = u64::MAX;

type Shard = Mutex<HashMap<(u64, u128), (FrameId, u32), foldhash::fast::RandomState>>;

pub struct ContentIndex {
    shards: Box<[crossbeam_utils::CachePadded<Shard>]>,
    /// Domain of each place (frame or half frame, by `FrameId::place_index`) while it is indexed.
    frame_domain: Box<[AtomicU64]>,
    /// Content hash of each indexed place (low and high halves), recorded with its domain.
    frame_hash: Box<[[AtomicU64; 2]]>,
    /// Places held (frames or half frames, indexed or not): one per distinct stored page.
    frames: AtomicU64,
}

/// What a put found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lookup {
    /// An equal page exists; a reference was taken on this frame.
    Shared(FrameId),
    /// No equal page: the caller stores a new frame and calls [`ContentIndex::insert`].
    Absent,
}

impl ContentIndex {
    pub fn new(max_frames: u32) -> Self {
        ContentIndex {
            shards: (0..SHARDS)
                .map(|_| crossbeam_utils::CachePadded::new(Mutex::new(HashMap::default())))
                .collect(),
            frame_domain: (0..max_frames as usize * 2).map(|_| AtomicU64::new(UNINDEXED)).collect(),
            frame_hash: (0..max_frames as usize * 2)
                .map(|_| [AtomicU64::new(0), AtomicU64::new(0)])
                .collect(),
            frames: AtomicU64::new(0),
        }
    }

    fn shard(&self, hash: u128) -> &Shard {
        &self.shards[(hash as usize) % SHARDS]
    }

    /// Looks for a frame equal to `data` in `domain` and takes a reference on it if there is one.
    pub fn lookup(&self, mem: &MemStore, domain: u64, hash: u128, data: &[u8]) -> Lookup {
        let mut shard = self.shard(hash).lock();
        if let Some((frame, refs)) = shard.get_mut(&(domain, hash)) {
            // The frame cannot be freed or changed while we hold the shard lock and its count is positive.
            if mem.equals(*frame, data) {
                *refs += 1;
                return Lookup::Shared(*frame);
            }
        }
        Lookup::Absent
    }

    /// Registers a freshly written frame (owned by the caller) holding `data`. If another thread
    /// registered equal content meanwhile, takes a reference on that frame instead and returns it; the
    /// caller then frees its own frame. Returns the frame the page must use.
    pub fn insert(&self, mem: &MemStore, domain: u64, hash: u128, frame: FrameId, data: &[u8]) -> FrameId {
        let mut shard = self.shard(hash).lock();
        match shard.get_mut(&(domain, hash)) {
            Some((other, refs)) if mem.equals(*other, data) => {
                *refs += 1;
                *other
            }
            Some(_) => {
                // A genuine 128-bit collision with different bytes: keep this page unindexed.
                self.frame_domain[frame.place_index()].store(UNINDEXED, Ordering::Relaxed);
                self.frames.fetch_add(1, Ordering::Relaxed);
                frame
            }
            None => {
                shard.insert((domain, hash), (frame, 1));
                let [lo, hi] = &self.frame_hash[frame.place_index()];
                lo.store(hash as u64, Ordering::Relaxed);
                hi.store((hash >> 64) as u64, Ordering::Relaxed);
                self.frame_domain[frame.place_index()].store(domain, Ordering::Relaxed);
                self.frames.fetch_add(1, Ordering::Relaxed);
                frame
            }
        }
    }

    /// Drops one reference. Returns true when the frame is no longer referenced and must be freed (and
    /// its reservation released) by the caller.
    pub fn release(&self, frame: FrameId) -> bool {
        // Relaxed is enough: the caller's reference to the frame was handed to it (through a pool's
        // lock or a pin) after the insert that recorded these, so the insert happens before this load.
        let domain = self.frame_domain[frame.place_index()].load(Ordering::Relaxed);
        if domain == UNINDEXED {
            self.frames.fetch_sub(1, Ordering::Relaxed);
            return true;
        }
        let [lo, hi] = &self.frame_hash[frame.place_index()];
        let hash = lo.load(Ordering::Relaxed) as u128 | (hi.load(Ordering::Relaxed) as u128) << 64;
        let mut shard = self.shard(hash).lock();
        let Some((f, refs)) = shard.get_mut(&(domain, hash)) else {
            crate::invariant!(false, "released frame {} is not in the content index", frame.0);
            return false;
        };
        crate::invariant!(*f == frame, "content index points at another frame");
        *refs -= 1;
        if *refs == 0 {
            shard.remove(&(domain, hash));
            self.frame_domain[frame.place_index()].store(UNINDEXED, Ordering::Relaxed);
            self.frames.fetch_sub(1, Ordering::Relaxed);
            return true;
        }
        false
    }

    /// Content hashes of the indexed frames of one domain (the summary published to peers).
    pub fn hashes(&self, domain: u64) -> Vec<u128> {
        let mut out = Vec::new();
        for s in self.shards.iter() {
            out.extend(s.lock().keys().filter(|(d, _)| *d == domain).map(|(_, h)| *h));
        }
        out
    }

    /// Places held: distinct stored pages.
    pub fn frames(&self) -> u64 {
        self.frames.load(Ordering::Relaxed)
    }

    /// Sum of reference counts over indexed frames, plus unindexed frames (for invariant checks).
    pub fn references(&self) -> u64 {
        let indexed: u64 =
            self.shards.iter().map(|s| s.lock().values().map(|(_, r)| *r as u64).sum::<u64>()).sum();
        let indexed_frames: u64 = self.shards.iter().map(|s| s.lock().len() as u64).sum();
        indexed + (self.frames() - indexed_frames)
    }
}

impl std::fmt::Debug for ContentIndex {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ContentIndex").field("frames", &self.frames()).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::frame::hash_page;

    #[test]
    fn equal_pages_share_a_frame_until_the_last_release() {
        let mem = MemStore::new(512, 8, 8).unwrap();
        let idx = ContentIndex::new(8);
        let page = vec![7u8; 512];
        let h = hash_page(&page);
        assert_eq!(idx.lookup(&mem, 0, h, &page), Lookup::Absent);
        let f = mem.alloc().unwrap();
        mem.write(f, &page);
        assert_eq!(idx.insert(&mem, 0, h, f, &page), f);
        assert_eq!(idx.lookup(&mem, 0, h, &page), Lookup::Shared(f));
        // Another domain does not see it.
        assert_eq!(idx.lookup(&mem, 9, h, &page), Lookup::Absent);
        assert_eq!(idx.frames(), 1);
        assert_eq!(idx.references(), 2);
        assert!(!idx.release(f));
        assert!(idx.release(f));
        assert_eq!(idx.frames(), 0);
        assert_eq!(idx.lookup(&mem, 0, h, &page), Lookup::Absent);
    }

    #[test]
    fn a_colliding_hash_with_other_bytes_is_never_shared() {
        let mem = MemStore::new(512, 8, 8).unwrap();
        let idx = ContentIndex::new(8);
        let a = vec![1u8; 512];
        let b = vec![2u8; 512];
        let fa = mem.alloc().unwrap();
        mem.write(fa, &a);
        // Pretend b hashes like a.
        let h = hash_page(&a);
        idx.insert(&mem, 0, h, fa, &a);
        assert_eq!(idx.lookup(&mem, 0, h, &b), Lookup::Absent);
        let fb = mem.alloc().unwrap();
        mem.write(fb, &b);
        assert_eq!(idx.insert(&mem, 0, h, fb, &b), fb);
        assert_eq!(idx.frames(), 2);
        assert!(idx.release(fb), "the unindexed frame is freed directly");
        assert!(idx.release(fa));
    }
}
