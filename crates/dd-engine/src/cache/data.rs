//! The data path: puts, gets (single and batched), flushes and object migration, by id or through a
//! [`PoolHandle`].
//!
//! A put first places the bytes (memory: shared with an equal page, in half a frame, or in a frame of its
//! own; SSD: a fresh slot), reserving room in the store and evicting if it is full (`evict`), and only
//! then indexes the page under the lock of the key's pool shard; a refused put still invalidates the older
//! copy of its key. A get takes an exclusive pool's page out of the index under the lock and copies it
//! outside; a non-exclusive get holds a memory page's frame for reading under the lock and copies it
//! outside (`store::mem`: a held frame is freed only by its last reader; compressed halves are still
//! decompressed under the lock), and reads SSD pages outside it, validating the entry's version
//! afterwards (a get may miss, never return stale bytes). Locations taken out of the
//! index are freed with no pool lock held.

use super::{Cache, Shared, GROUP_DOMAINS};
use crate::config::Maintenance;
use crate::error::CacheError;
use crate::pool::{Arrival, Departure, Loc, Pool, Saving};
use crate::store::dedup::Lookup;
use crate::store::frame::{hash_page, FrameId};
use crate::types::{Key, PoolId, PutOutcome, Spec, StoreKind, VmId};
use std::sync::atomic::Ordering;
use std::sync::Arc;

impl Cache {
    // ------------------------------------------------------------------------------------------
    // VM scope: the data path
    // ------------------------------------------------------------------------------------------

    /// Stores a page. Replaces any page of the same key. An ephemeral put may be refused under pressure.
    pub fn put(&self, vm: VmId, pool: PoolId, key: Key, data: &[u8]) -> Result<PutOutcome, CacheError> {
        self.check_len(data.len())?;
        self.shared.with_pool(vm, pool, |p| self.shared.put_in(p, key, data))
    }

    /// A handle on one pool's data path: puts and gets through it skip the pool-table lookup (a shard
    /// read lock, a hash probe and an `Arc` clone per call). For callers that issue many operations on a
    /// pool they know, such as the lab's emulated guests. Operations through a handle on a destroyed
    /// pool fail with [`CacheError::UnknownPool`], as they would by id.
    pub fn pool_handle(&self, vm: VmId, pool: PoolId) -> Result<PoolHandle, CacheError> {
        Ok(PoolHandle { shared: self.shared.clone(), pool: self.shared.pool(vm, pool)? })
    }

    /// Looks a page up. On a hit copies it into `out` and returns true; in an exclusive pool the page is
    /// removed from the cache.
    pub fn get(&self, vm: VmId, pool: PoolId, key: Key, out: &mut [u8]) -> Result<bool, CacheError> {
        self.check_len(out.len())?;
        self.shared.with_pool(vm, pool, |p| Ok(self.shared.get_in(p, key, out).is_some()))
    }

    /// Stores several pages of one pool. Returns one outcome per page, in order.
    pub fn put_batch(
        &self,
        vm: VmId,
        pool: PoolId,
        pages: &[(Key, &[u8])],
    ) -> Result<Vec<PutOutcome>, CacheError> {
        self.shared.check_batch(pages.len())?;
        for (_, d) in pages {
            self.check_len(d.len())?;
        }
        self.shared.with_pool(vm, pool, |p| pages.iter().map(|(k, d)| self.shared.put_in(p, *k, d)).collect())
    }

    /// Looks several pages up; `out` holds `keys.len()` pages back to back. Returns which hit. SSD pages
    /// of the batch are read together (one io_uring submission when available).
    pub fn get_batch(
        &self,
        vm: VmId,
        pool: PoolId,
        keys: &[Key],
        out: &mut [u8],
    ) -> Result<Vec<bool>, CacheError> {
        self.shared.check_batch(keys.len())?;
        if keys.is_empty() && out.is_empty() {
            // An empty batch is valid (like an empty put batch); only the pool must exist.
            self.shared.pool(vm, pool)?;
            return Ok(Vec::new());
        }
        self.check_len(out.len() / keys.len().max(1))?;
        if out.len() != keys.len() * self.shared.page_size {
            return Err(CacheError::BadPageSize {
                expected: keys.len() * self.shared.page_size,
                got: out.len(),
            });
        }
        self.shared.with_pool(vm, pool, |p| Ok(self.shared.get_batch_in(p, keys, out)))
    }

    /// [`PoolHandle::get_batch_each`] by id: found as [`Cache::get`] finds its pool (the thread's last
    /// pool, else the table), so a data plane serving one pool from many threads takes no lock and
    /// writes no reference count shared by them per batch (issue 28: a `PoolHandle` per request cloned
    /// the pool's `Arc` and read-locked its table shard, lines every session of the pool wrote).
    pub fn get_batch_each(
        &self,
        vm: VmId,
        pool: PoolId,
        keys: &[Key],
        hit: &mut dyn FnMut(usize, &[u8]),
    ) -> Result<usize, CacheError> {
        self.shared.check_batch(keys.len())?;
        self.shared.with_pool(vm, pool, |p| Ok(self.shared.get_batch_each_in(p, keys, hit)))
    }

    /// Whether a get from this pool removes the page (the pool's `exclusive_gets`), found as
    /// [`Cache::get_batch_each`] finds it.
    pub fn exclusive_gets(&self, vm: VmId, pool: PoolId) -> Result<bool, CacheError> {
        self.shared.with_pool(vm, pool, |p| Ok(p.exclusive_gets))
    }

    /// Invalidates one page. Returns whether a page was there.
    pub fn flush_page(&self, vm: VmId, pool: PoolId, key: Key) -> Result<bool, CacheError> {
        let p = self.shared.pool(vm, pool)?;
        let loc = {
            let mut g = p.lock(key);
            let loc = g.take(key, Departure::Flush, |_| {});
            p.publish(&g);
            loc
        };
        self.shared.coop.release_remote_of(&p, key);
        if let Some(l) = loc {
            self.shared.place.free_locs(&[l]);
        }
        Ok(loc.is_some())
    }

    /// Invalidates every page of an object (a file). Returns how many pages were dropped.
    pub fn flush_object(&self, vm: VmId, pool: PoolId, object: u64) -> Result<u64, CacheError> {
        let p = self.shared.pool(vm, pool)?;
        // An object's pages spread over the shards (by extent): every shard, all locked together so
        // the flush is one step for concurrent readers.
        let locs: Vec<Loc> = {
            let mut gs = p.lock_all();
            let mut locs = Vec::new();
            for g in gs.iter_mut() {
                let ids = g.object_ids(object);
                locs.extend(ids.into_iter().map(|id| g.remove(id, Departure::Flush).loc));
                g.drop_remote_object(object);
                p.publish(g);
            }
            locs
        };
        self.shared.coop.release_remote(&p);
        self.shared.place.free_locs(&locs);
        Ok(locs.len() as u64)
    }

    /// Moves an object's pages from one pool of a VM to another (MIGRATE_OBJECT), for files whose
    /// owning container changed. Pages keep their tier; pages of the object the target already held are
    /// flushed (the source's pages are the current ones). Returns how many pages moved.
    pub fn migrate_object(&self, vm: VmId, from: PoolId, to: PoolId, object: u64) -> Result<u64, CacheError> {
        let a = self.shared.pool(vm, from)?;
        let b = self.shared.pool(vm, to)?;
        if from == to {
            return Ok(0);
        }
        if a.kind != b.kind {
            return Err(CacheError::PoolKindMismatch(from, to));
        }
        // Lock order: increasing pool id, every shard of each in increasing index (the object's pages
        // spread over the shards, and the two pools may have different shard counts).
        let (mut ga, mut gb) = if from < to {
            let ga = a.lock_all();
            (ga, b.lock_all())
        } else {
            let gb = b.lock_all();
            (a.lock_all(), gb)
        };
        if ga[0].dead || gb[0].dead {
            return Err(CacheError::UnknownPool(if ga[0].dead { from } else { to }));
        }
        // The object now belongs to the target: its pages there are exactly the source's. Older pages the
        // target held for the object are flushed first, so a page the source had already lost cannot be
        // "revived" from the target's older copy.
        let mut replaced: Vec<Loc> = Vec::new();
        for g in gb.iter_mut() {
            replaced.extend(g.object_ids(object).into_iter().map(|id| g.remove(id, Departure::Flush).loc));
            // Remotified pages do not move: the target's are stale, the source's become misses.
            g.drop_remote_object(object);
        }
        let mut moved = 0u64;
        for g in ga.iter_mut() {
            g.drop_remote_object(object);
            for id in g.object_ids(object) {
                let e = g.remove(id, Departure::Moved);
                g.counters.migrations_out += 1;
                let t = &mut gb[crate::pool::shard_of(e.key, b.shard_count() - 1)];
                if let Some(old) = t.insert(e.key, e.loc, e.seq, Arrival::Moved) {
                    replaced.push(old);
                }
                t.counters.migrations_in += 1;
                moved += 1;
            }
        }
        for g in &ga {
            a.publish(g);
        }
        for g in &gb {
            b.publish(g);
        }
        drop(ga);
        drop(gb);
        self.shared.coop.release_remote(&a);
        self.shared.coop.release_remote(&b);
        self.shared.place.free_locs(&replaced);
        Ok(moved)
    }
}

/// One pool's data path, from [`Cache::pool_handle`]. Cheap to clone. Holding a handle keeps the pool's
/// bookkeeping alive (not its pages: destroying the pool frees them and fails later calls).
#[derive(Clone)]
pub struct PoolHandle {
    shared: Arc<Shared>,
    pool: Arc<Pool>,
}

impl std::fmt::Debug for PoolHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PoolHandle").field("vm", &self.pool.vm).field("pool", &self.pool.id).finish()
    }
}

impl PoolHandle {
    pub fn id(&self) -> PoolId {
        self.pool.id
    }

    pub fn vm(&self) -> VmId {
        self.pool.vm
    }

    fn live(&self) -> Result<(), CacheError> {
        // A destroy that races with an operation past this check is the same race as one between the
        // pool-table lookup and the operation: a put fails under the pool lock, a get misses.
        if self.pool.destroyed.load(Ordering::Acquire) {
            return Err(CacheError::UnknownPool(self.pool.id));
        }
        Ok(())
    }

    /// [`Cache::put`] on this pool.
    pub fn put(&self, key: Key, data: &[u8]) -> Result<PutOutcome, CacheError> {
        self.shared.check_len(data.len())?;
        self.live()?;
        self.shared.put_in(&self.pool, key, data)
    }

    /// Whether a get removes the page (the pool's `exclusive_gets`).
    pub fn exclusive_gets(&self) -> bool {
        self.pool.exclusive_gets
    }

    /// [`Cache::get_batch`] without an output buffer: each hit's page is handed to `hit(index, page)`
    /// once, borrowed from the store where it can be, so the caller copies it once, where it wants it
    /// (the daemon: straight into its slot of a response). **Hits come in no particular index order**
    /// (a sharded pool's shard by shard; a one-shard pool's in increasing index order, compressed pages
    /// first). In a non-exclusive pool the hits are handed over in place, from their frames, once every
    /// shard is unlocked (a read hold keeps each frame from being freed or reused), except compressed
    /// pages, decompressed under their shard's lock: `hit` must not call into the cache. Otherwise the
    /// pages are read as by [`Cache::get_batch`] into a buffer first.
    pub fn get_batch_each(
        &self,
        keys: &[Key],
        hit: &mut dyn FnMut(usize, &[u8]),
    ) -> Result<usize, CacheError> {
        self.shared.check_batch(keys.len())?;
        self.live()?;
        Ok(self.shared.get_batch_each_in(&self.pool, keys, hit))
    }

    /// [`Cache::get`] on this pool, saying which tier held the page: `Some(tier)` on a hit (copied into
    /// `out`; removed from an exclusive pool), `None` on a miss.
    pub fn get(&self, key: Key, out: &mut [u8]) -> Result<Option<StoreKind>, CacheError> {
        self.shared.check_len(out.len())?;
        self.live()?;
        Ok(self.shared.get_in(&self.pool, key, out))
    }
}

impl Shared {
    /// Which tier a put to this pool goes to, or `None` if it is not stored at all.
    fn put_tier(&self, p: &Pool) -> Option<StoreKind> {
        match p.spec.load() {
            Spec::None => None,
            Spec::Mem { .. } => Some(StoreKind::Mem),
            Spec::Ssd { .. } => self.place.ssd.as_ref().map(|_| StoreKind::Ssd),
            Spec::Hybrid { ssd_weight, .. } => {
                // Memory while the pool's memory share allows (thesis 000, section 5.3.2).
                if p.used(StoreKind::Mem) < p.entitlement(StoreKind::Mem)
                    || ssd_weight == 0
                    || self.place.ssd.is_none()
                {
                    Some(StoreKind::Mem)
                } else {
                    Some(StoreKind::Ssd)
                }
            }
        }
    }

    fn put_in(&self, p: &Arc<Pool>, key: Key, data: &[u8]) -> Result<PutOutcome, CacheError> {
        let Some(tier) = self.put_tier(p) else {
            return Ok(self.refuse(p, key));
        };
        let stored = match tier {
            StoreKind::Mem => self.store_in_memory(p, data),
            StoreKind::Ssd => {
                let ssd = self.place.ssd.as_ref().expect("put_tier returns Ssd only with an SSD store");
                // A failing disk (its last write failed) takes no new pages but probes: refused, not lost.
                if !ssd.accepting() || !self.reserve(tier, p) {
                    None
                } else if let Some(slot) = ssd.alloc() {
                    ssd.write(slot, data);
                    Some((Loc::Ssd(slot), Saving::default()))
                } else {
                    self.place.stores[1].release(1);
                    None
                }
            }
        };
        match stored {
            Some((loc, saved)) => self.index_put(p, key, loc, tier, saved),
            None => Ok(self.refuse(p, key)),
        }
    }

    /// What a de-dup hit in `domain` saves the pool's statistics: the whole page in a VM's own domain;
    /// nothing in a group's (counted in host scope instead: the match may be with another VM's page).
    fn dedup_saving(&self, domain: u64) -> Saving {
        let ps = self.page_size as u64;
        if domain >= GROUP_DOMAINS {
            self.coop.count_group_dedup(ps);
            return Saving::default();
        }
        Saving { dedup_hit: true, bytes: ps }
    }

    /// Places a page's bytes in the memory store: shared with an equal page (de-duplication), in half a
    /// frame (compression), or in a frame of its own. Returns the location and the bytes saved, or `None`
    /// when there is no room.
    fn store_in_memory(&self, p: &Pool, data: &[u8]) -> Option<(Loc, Saving)> {
        let ps = self.page_size as u64;
        // 1. An equal page already stored is shared instead of copied.
        let content = match &self.place.dedup {
            Some(idx) => {
                let domain = p.dedup_domain.load(Ordering::Relaxed);
                let hash = hash_page(data);
                if let Lookup::Shared(f) = idx.lookup(&self.place.mem, domain, hash, data) {
                    return Some((Loc::Mem(f), self.dedup_saving(domain)));
                }
                Some((idx, domain, hash))
            }
            None => None,
        };
        // 2. A page that compresses to half a frame or less goes into a half; others are stored raw.
        let half = if self.place.compress { self.store_compressed(p, data).ok()? } else { None };
        let (mut place, saved) = match half {
            Some(h) => (h, ps / 2),
            None => {
                let f = self.reserve_frame(p)?;
                self.place.mem.write(f, data);
                (f, 0)
            }
        };
        // 3. Register the new content; if an equal page arrived meanwhile, share that one instead.
        if let Some((idx, domain, hash)) = content {
            let used = idx.insert(&self.place.mem, domain, hash, place, data);
            if used != place {
                if self.place.mem.free(place) {
                    self.place.stores[0].release(1);
                }
                place = used;
                return Some((Loc::Mem(place), self.dedup_saving(domain)));
            }
        }
        Some((Loc::Mem(place), Saving { dedup_hit: false, bytes: saved }))
    }

    /// Compresses a page into this thread's scratch buffer and stores it in a half frame:
    /// `Ok(Some(half))`; `Ok(None)` when it does not fit a half (the page is then stored raw);
    /// `Err(())` when there is no frame to put the half in.
    fn store_compressed(&self, p: &Pool, data: &[u8]) -> Result<Option<FrameId>, ()> {
        thread_local! {
            static HALF: std::cell::Cell<Vec<u8>> = const { std::cell::Cell::new(Vec::new()) };
        }
        // Taken out while in use (reserving a frame may evict), put back after.
        let mut buf = HALF.take();
        let stored = match crate::store::lz4::compress(data, &mut buf, self.place.mem.half_capacity()) {
            None => Ok(None),
            Some(c) => match self.place.mem.store_half(c) {
                Some(h) => Ok(Some(h)),
                None => self.reserve_frame(p).map(|f| Some(self.place.mem.store_half_in(f, c))).ok_or(()),
            },
        };
        HALF.set(buf);
        stored
    }

    /// Reserves and allocates one memory frame for a put into `p` (evicting if the store is full).
    fn reserve_frame(&self, p: &Pool) -> Option<FrameId> {
        if !self.reserve(StoreKind::Mem, p) {
            return None;
        }
        let f = self.place.mem.alloc();
        if f.is_none() {
            self.place.stores[0].release(1);
        }
        f
    }

    /// Publishes a stored page in its pool (the last step of a put), then frees the page it replaced.
    fn index_put(
        &self,
        p: &Arc<Pool>,
        key: Key,
        loc: Loc,
        tier: StoreKind,
        saved: Saving,
    ) -> Result<PutOutcome, CacheError> {
        let seq = self.next_seq();
        let replaced = {
            let mut g = p.lock(key);
            if g.dead {
                drop(g);
                self.place.free_locs(&[loc]);
                return Err(CacheError::UnknownPool(p.id));
            }
            let r = g.insert_saving(key, loc, seq, Arrival::Put, saved);
            p.publish(&g);
            r
        };
        self.coop.release_remote_of(p, key);
        if let Some(old) = replaced {
            self.place.free_locs(&[old]);
        }
        if tier == StoreKind::Mem && p.spec.load().is_hybrid() {
            self.after_hybrid_put(p);
        }
        Ok(PutOutcome::Stored(tier))
    }

    /// A refused put still invalidates any older copy of the key: the guest has newer data, and the
    /// cache must never return the old one.
    fn refuse(&self, p: &Pool, key: Key) -> PutOutcome {
        let loc = {
            let mut g = p.lock(key);
            g.counters.puts_refused += 1;
            let loc = g.take(key, Departure::Flush, |_| {});
            p.publish(&g);
            loc
        };
        self.coop.release_remote_of(p, key);
        if let Some(l) = loc {
            self.place.free_locs(&[l]);
        }
        PutOutcome::Refused
    }

    fn after_hybrid_put(&self, p: &Arc<Pool>) {
        let high = self.high_watermark(p.entitlement(StoreKind::Mem));
        if p.used(StoreKind::Mem) > high {
            match self.evictor.maintenance {
                Maintenance::Inline => {
                    self.maintain_pool(p);
                }
                Maintenance::Background => self.wake_worker(),
            }
        }
    }

    /// A get; returns the tier that held the page, `None` on a miss.
    fn get_in(&self, p: &Arc<Pool>, key: Key, out: &mut [u8]) -> Option<StoreKind> {
        if p.exclusive_gets {
            let taken = {
                let mut g = p.lock(key);
                let r = g.take(key, Departure::ExclusiveGet, |l| self.place.prefetch(l));
                if r.is_none() {
                    g.counters.gets_missed += 1;
                }
                p.publish(&g);
                r
            };
            let loc = taken?;
            let ok = self.place.read_owned(loc, out);
            self.place.free_locs(&[loc]);
            if !ok {
                self.count_lost_page(p, key, loc.store());
            }
            return ok.then_some(loc.store());
        }
        self.get_shared(p, key, out)
    }

    /// An exclusive get whose SSD read failed: the page is gone, so re-count the hit as an eviction and
    /// the get as a miss (the identity is unchanged: used did not move).
    fn count_lost_page(&self, p: &Pool, key: Key, store: StoreKind) {
        let mut g = p.lock(key);
        let c = g.counters.store_mut(store);
        c.gets_hit -= 1;
        c.exclusive_gets -= 1;
        c.evictions += 1;
        g.counters.gets_missed += 1;
        g.counters.pages_lost += 1;
        p.publish(&g);
    }

    /// A non-exclusive get (persistent pools, inclusive pools): the page stays.
    fn get_shared(&self, p: &Arc<Pool>, key: Key, out: &mut [u8]) -> Option<StoreKind> {
        // SSD pages are read without the lock and validated afterwards; a concurrent replacement makes
        // the read stale, so retry a few times, then report a miss (a cache may miss, never lie).
        for _ in 0..8 {
            let (slot, version) = {
                let mut g = p.lock(key);
                let Some((id, loc)) = g.lookup_slot(key) else {
                    g.counters.gets_missed += 1;
                    return None;
                };
                match loc {
                    Loc::Mem(f) => {
                        g.counters.mem.gets_hit += 1;
                        g.touch_in(id, StoreKind::Mem);
                        if f.is_half() {
                            self.place.mem.read(f, out);
                            return Some(StoreKind::Mem);
                        }
                        // Copied after the lock (a read hold keeps the frame), not under it.
                        self.place.mem.hold_for_read(f);
                        drop(g);
                        self.place.mem.read(f, out);
                        self.place.end_read(f);
                        return Some(StoreKind::Mem);
                    }
                    Loc::Ssd(slot) => (slot, g.entry(id).version),
                }
            };
            let read_ok = self.place.ssd.as_ref().is_some_and(|ssd| ssd.read(slot, out).is_ok());
            let mut g = p.lock(key);
            match g.lookup(key) {
                Some(id) if g.entry(id).version == version && g.entry(id).loc == Loc::Ssd(slot) => {
                    if read_ok {
                        g.counters.ssd.gets_hit += 1;
                        g.touch(id);
                        return Some(StoreKind::Ssd);
                    }
                    // The entry is intact but its slot cannot be read: drop it.
                    let e = g.remove(id, Departure::Evict);
                    g.counters.gets_missed += 1;
                    g.counters.pages_lost += 1;
                    p.publish(&g);
                    drop(g);
                    self.place.free_locs(&[e.loc]);
                    return None;
                }
                _ => continue,
            }
        }
        p.lock(key).counters.gets_missed += 1;
        None
    }

    fn get_batch_each_in(&self, p: &Arc<Pool>, keys: &[Key], hit: &mut dyn FnMut(usize, &[u8])) -> usize {
        if !p.exclusive_gets {
            return self.get_batch_in_memory(p, keys, hit);
        }
        let ps = self.page_size;
        let mut buf = vec![0u8; keys.len() * ps];
        let hits = self.get_batch_in(p, keys, &mut buf);
        let mut n = 0;
        for (i, page) in buf.chunks_exact(ps.max(1)).enumerate() {
            if hits[i] {
                hit(i, page);
                n += 1;
            }
        }
        n
    }

    /// A batch of non-exclusive gets, each counted and its page handed to `hit` as by one `get_shared`
    /// per key, **one shard at a time, in shard order** (issue 28: a batch of random keys spans most of
    /// a pool's shards; holding them all for the batch's copies made every batch a pool-wide lock
    /// again, and visiting the keys in index order took a shard's lock once per key). Within a shard
    /// every key is looked up, counted and its frame held for reading and prefetched; the pages are
    /// handed over in place once every shard is unlocked (issue 28, item 2: copies outside every lock),
    /// and the holds ended after (the last reader of a frame freed meanwhile frees it). A compressed
    /// page is decompressed and handed over under its shard's lock. A one-shard pool (the lab's) locks
    /// once, and hands its hits over in index order. A hit on the SSD is read after the shards, as by
    /// `get_shared`, with no lock held. Returns the number of hits.
    fn get_batch_in_memory(&self, p: &Arc<Pool>, keys: &[Key], hit: &mut dyn FnMut(usize, &[u8])) -> usize {
        let order = by_shard(p, keys);
        // Memory hits held for reading (`store::mem`), copied once every shard is unlocked.
        let mut held: Vec<(usize, FrameId)> = Vec::with_capacity(keys.len());
        let mut on_ssd: Vec<usize> = Vec::new();
        let mut n = 0;
        for group in order.chunk_by(|a, b| a.0 == b.0) {
            let mut g = p.lock_shard(group[0].0 as usize);
            let first = held.len();
            for &(_, i) in group {
                let i = i as usize;
                match g.lookup_slot(keys[i]) {
                    None => g.counters.gets_missed += 1,
                    Some((id, Loc::Mem(f))) => {
                        g.counters.mem.gets_hit += 1;
                        g.touch_in(id, StoreKind::Mem);
                        n += 1;
                        if f.is_half() {
                            // A compressed page is decompressed under the lock (halves are not held).
                            self.place.mem.with_page(f, |page| hit(i, page));
                        } else {
                            // The hold words are as cold as the frames: load both while the other
                            // keys are looked up, and take the holds after (measured: a hold taken
                            // at once stalled on its word, a quarter of this function's time).
                            self.place.mem.prefetch(f);
                            self.place.mem.prefetch_hold(f);
                            held.push((i, f));
                        }
                    }
                    Some((_, Loc::Ssd(_))) => on_ssd.push(i),
                }
            }
            for &(_, f) in &held[first..] {
                self.place.mem.hold_for_read(f);
            }
        }
        for (i, f) in held {
            self.place.mem.with_page(f, |page| hit(i, page));
            self.place.end_read(f);
        }
        if !on_ssd.is_empty() {
            let mut page = vec![0u8; self.page_size];
            for i in on_ssd {
                if self.get_shared(p, keys[i], &mut page).is_some() {
                    hit(i, &page);
                    n += 1;
                }
            }
        }
        n
    }

    fn get_batch_in(&self, p: &Arc<Pool>, keys: &[Key], out: &mut [u8]) -> Vec<bool> {
        let ps = self.page_size;
        if !p.exclusive_gets {
            let mut hits = vec![false; keys.len()];
            self.get_batch_in_memory(p, keys, &mut |i, page| {
                out[i * ps..(i + 1) * ps].copy_from_slice(page);
                hits[i] = true;
            });
            return hits;
        }
        let mut hits = vec![false; keys.len()];
        let mut taken: Vec<(usize, Loc)> = Vec::with_capacity(keys.len());
        // One shard lock at a time, as in `get_batch_in_memory`; the copies come after, unlocked.
        for group in by_shard(p, keys).chunk_by(|a, b| a.0 == b.0) {
            let mut g = p.lock_shard(group[0].0 as usize);
            for &(_, i) in group {
                let i = i as usize;
                match g.take(keys[i], Departure::ExclusiveGet, |l| self.place.prefetch(l)) {
                    Some(loc) => taken.push((i, loc)),
                    None => g.counters.gets_missed += 1,
                }
            }
            p.publish(&g);
        }
        let mut ssd_reqs: Vec<(usize, crate::store::ssd::SlotId)> = Vec::new();
        let mut locs = Vec::with_capacity(taken.len());
        for (i, loc) in taken {
            match loc {
                Loc::Mem(f) => {
                    self.place.mem.read(f, &mut out[i * ps..(i + 1) * ps]);
                    hits[i] = true;
                }
                Loc::Ssd(s) => ssd_reqs.push((i, s)),
            }
            locs.push(loc);
        }
        if let (false, Some(ssd)) = (ssd_reqs.is_empty(), self.place.ssd.as_ref()) {
            // Split `out` into disjoint page slices for the batched read.
            let mut slices: Vec<Option<&mut [u8]>> = out.chunks_mut(ps).map(Some).collect();
            let mut reqs: Vec<(crate::store::ssd::SlotId, &mut [u8])> = ssd_reqs
                .iter()
                .map(|(i, s)| (*s, slices[*i].take().expect("each page index is requested once")))
                .collect();
            let results = ssd.read_batch(&mut reqs);
            for ((i, _), r) in ssd_reqs.iter().zip(results) {
                if r.is_ok() {
                    hits[*i] = true;
                } else {
                    self.count_lost_page(p, keys[*i], StoreKind::Ssd);
                }
            }
        }
        self.place.free_locs(&locs);
        hits
    }
}

/// The batch's (shard, key index) pairs, sorted: each shard's keys together, in index order, the
/// shards in increasing index (a batch visits them so, one lock at a time).
fn by_shard(p: &Pool, keys: &[Key]) -> Vec<(u32, u32)> {
    let mut order: Vec<(u32, u32)> =
        keys.iter().enumerate().map(|(i, k)| (p.shard_index(*k) as u32, i as u32)).collect();
    order.sort_unstable();
    order
}

#[cfg(test)]
mod tests {
    use crate::config::{Maintenance, MemStoreConfig};
    use crate::{Cache, EngineConfig, Key, PoolOptions, Spec, VmId, VmWeights};
    use std::sync::mpsc;
    use std::time::Duration;

    /// Issue 28: a batched get took the locks of every shard its keys touched, in increasing index,
    /// and held them for the whole batch, copies included. A batch waiting for one busy shard then
    /// held the others, so a get on any of them waited too: with random keys every batch was a
    /// pool-wide lock again, and the daemon serving one pool stopped at a few cores. Now a batch
    /// holds one shard lock at a time.
    #[test]
    fn regression_a_batched_get_held_every_shard_it_touched_while_waiting_for_one() {
        for exclusive in [false, true] {
            let cfg = EngineConfig {
                page_size_bytes: 512,
                mem: MemStoreConfig { capacity_bytes: 256 * 512, ..Default::default() },
                ssd: None,
                maintenance: Maintenance::Inline,
                ..Default::default()
            };
            let cache = Cache::new(cfg).unwrap();
            cache.add_vm(VmId(1), VmWeights::equal(1)).unwrap();
            let mut opts = PoolOptions::ephemeral(Spec::Mem { weight: 1 }).with_shards(4);
            opts.exclusive_gets = exclusive;
            let id = cache.new_pool(VmId(1), opts).unwrap();
            let pool = cache.shared.pool(VmId(1), id).unwrap();
            // Two keys in different shards, `low` in the lower one (a batch visits it first).
            let keys: Vec<Key> = (0..64).map(|o| Key::new(o, 0)).collect();
            let low = *keys.iter().min_by_key(|k| pool.shard_index(**k)).unwrap();
            let high = *keys.iter().find(|k| pool.shard_index(**k) > pool.shard_index(low)).unwrap();
            for k in [low, high] {
                cache.put(VmId(1), id, k, &[k.object as u8; 512]).unwrap();
            }
            let busy = pool.lock_shard(pool.shard_index(high));
            std::thread::scope(|s| {
                let handle = cache.pool_handle(VmId(1), id).unwrap();
                // The batch gets `low`'s shard, then waits for `high`'s.
                s.spawn(move || handle.get_batch_each(&[low, high], &mut |_, _| {}).unwrap());
                std::thread::sleep(Duration::from_millis(100));
                // A get on `low`'s shard alone must not wait for the batch that waits for `high`'s (it
                // hits, or in an exclusive pool misses the page the batch took).
                let (tx, rx) = mpsc::channel();
                let c = &cache;
                s.spawn(move || {
                    let mut out = [0u8; 512];
                    tx.send(c.get(VmId(1), id, low, &mut out).unwrap()).unwrap();
                });
                let got = rx.recv_timeout(Duration::from_secs(5));
                drop(busy);
                assert_eq!(
                    got,
                    Ok(!exclusive),
                    "exclusive {exclusive}: a get on a shard the waiting batch had visited waited for it"
                );
            });
            cache.check_identity().unwrap();
        }
    }
}
