//! One pool: the index of a container's pages and its per-tier eviction queues, split into **shards**.
//!
//! A pool is `shards` independent [`PoolInner`]s, each behind its own mutex (issue 28: one pool hit by
//! every vCPU of its VM must not serialise on one lock). A key belongs to the shard its hash names
//! ([`shard_of`]: the object and the page's 16-page extent, so a batch of consecutive pages of a file
//! touches a few shards); everything about the key (its index slot, its queue entry, its remote
//! record) lives in that shard. Each shard has its own counters; the pool's are their sum, read shard by
//! shard ([`Pool::counters`]), so the identity of `stats.rs`, which holds per shard whenever its lock is
//! free, holds for the sum too. The shard count is a power of two, a pool option (`PoolOptions::shards`,
//! default `EngineConfig::pool_shards`, itself from the host's cores); with one shard the pool behaves
//! exactly as the unsharded pool did (the lab runs with one: its outputs stay byte-identical).
//!
//! Eviction across shards ([`Pool::quotas`]) takes a batch from the fullest shards first, so that the
//! shards' sizes stay level; each shard gives its own oldest (in its order), so the pool's order is
//! approximated (docs/decisions.md D33 says by how much).
//!
//! Locks: no other lock is taken while a shard's is held except more shards of the same pool, always in
//! increasing shard index (batched gets, destroy, object flushes), and, in `migrate_object`, the shards
//! of a second pool, the pools in increasing pool-id order (see the lock order in `cache/mod.rs`). Page
//! bytes are never copied into or out of the SSD, and frames and slots are never freed, while a lock is
//! held: callers take locations out under the lock and do the expensive part after releasing it. Memory
//! frames of entries that stay in the index are held for reading under their shard's lock and copied
//! after it (non-exclusive gets; `store::mem`'s read holds keep a concurrent free from racing the
//! copy); compressed halves and demotion reads are still read under the lock.
//!
//! Invariants (checked by [`PoolInner::check`] in debug and `strict-invariants` builds):
//! * every entry is in its shard's object index exactly once, in the shard [`shard_of`] names, and
//!   linked in the queue of its location's tier;
//! * `counters.<store>.used` equals the number of the shard's entries located in that store, and the
//!   shard's mirrored atomic equals it whenever the shard's lock is released (`Pool::used` sums them);
//! * the identity of `stats.rs` holds for both stores in every shard;
//! * a key with a remote record (`remote.rs`: pending or remotified) is not indexed, and
//!   `counters.remote_pages` equals the number of remotified records.

use crate::order::{OrderQueue, QPos, Queued, Slab};
use crate::page_map::PageMap;
use crate::remote::{Holder, RemoteRef, RemoteState};
use crate::stats::Counters;
use crate::store::frame::FrameId;
use crate::store::ssd::SlotId;
use crate::types::{EvictionOrder, Key, PoolId, PoolKind, Spec, StoreKind, VmId};
use crossbeam_utils::CachePadded;
use parking_lot::{Mutex, MutexGuard};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

pub(crate) type Hasher = foldhash::fast::RandomState;
pub(crate) type Map<K, V> = HashMap<K, V, Hasher>;

/// Where a page lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Loc {
    Mem(FrameId),
    Ssd(SlotId),
}

impl Loc {
    pub fn store(&self) -> StoreKind {
        match self {
            Loc::Mem(_) => StoreKind::Mem,
            Loc::Ssd(_) => StoreKind::Ssd,
        }
    }
}

#[derive(Debug)]
pub(crate) struct Entry {
    pub key: Key,
    pub loc: Loc,
    pub qpos: QPos,
    /// Store-wide insertion sequence (global FIFO mode compares pools by their oldest entry's seq).
    pub seq: u64,
    /// Unique per pool; lets an operation that dropped the lock tell whether the entry it saw is still
    /// the same entry (optimistic SSD reads, tier moves).
    pub version: u64,
}

impl Queued for Entry {
    fn qpos(&self) -> &QPos {
        &self.qpos
    }
    fn qpos_mut(&mut self) -> &mut QPos {
        &mut self.qpos
    }
}

/// A spec packed in one atomic word so the put path can read it without the pool lock.
#[derive(Debug)]
pub(crate) struct AtomicSpec(AtomicU64);

impl AtomicSpec {
    fn encode(s: Spec) -> u64 {
        let (tag, a, b) = match s {
            Spec::None => (0u64, 0u32, 0u32),
            Spec::Mem { weight } => (1, weight, 0),
            Spec::Ssd { weight } => (2, weight, 0),
            Spec::Hybrid { mem_weight, ssd_weight } => (3, mem_weight, ssd_weight),
        };
        debug_assert!(a < 1 << 31 && b < 1 << 31);
        tag << 62 | (a as u64) << 31 | b as u64
    }
    fn decode(v: u64) -> Spec {
        let a = ((v >> 31) & 0x7fff_ffff) as u32;
        let b = (v & 0x7fff_ffff) as u32;
        match v >> 62 {
            0 => Spec::None,
            1 => Spec::Mem { weight: a },
            2 => Spec::Ssd { weight: a },
            _ => Spec::Hybrid { mem_weight: a, ssd_weight: b },
        }
    }
    pub fn new(s: Spec) -> Self {
        AtomicSpec(AtomicU64::new(Self::encode(s)))
    }
    pub fn load(&self) -> Spec {
        Self::decode(self.0.load(Ordering::Acquire))
    }
    pub fn store(&self, s: Spec) {
        self.0.store(Self::encode(s), Ordering::Release)
    }
}

/// The largest weight a spec may carry (weights are packed into 31 bits).
pub const MAX_WEIGHT: u32 = (1 << 31) - 1;

/// A VM's share, read by its pools without the tree lock: the VM's entitlement per store and the sum of
/// its pools' weights there. Written under the tree's write lock.
#[derive(Debug, Default)]
pub(crate) struct VmShare {
    pub entitlement: [AtomicU64; 2],
    pub weight_sum: [AtomicU64; 2],
    /// The cache's count of [`Pool`] objects not yet dropped (its table sizes report it): a pool is
    /// counted from `Pool::new` to its drop, so a destroyed pool that something still holds shows.
    pub pools_alive: Arc<AtomicU64>,
}

pub(crate) struct Pool {
    pub id: PoolId,
    pub vm: VmId,
    pub kind: PoolKind,
    pub exclusive_gets: bool,
    pub order: EvictionOrder,
    pub spec: AtomicSpec,
    /// The shards (module docs), a power of two of them; each on its own cache lines, so threads on
    /// different shards share no line.
    shards: Box<[CachePadded<Shard>]>,
    /// `shards.len() - 1`.
    shard_mask: usize,
    /// De-duplication domain of new puts (`store::dedup`): 0 = shared, otherwise private to the VM.
    pub dedup_domain: AtomicU64,
    /// The VM's share, from which the pool's entitlement is derived on read (so that recomputing the
    /// partition never walks other VMs' pools).
    pub share: Arc<VmShare>,
    /// Set by destroy (before the shards' `dead`): handles check it without taking a lock.
    pub destroyed: std::sync::atomic::AtomicBool,
    /// The name the guest gave the pool (its container's cgroup name), if any: what statistics,
    /// `/metrics` and `/ui/` show. A leaf lock, held only to read or replace the name; gone with the pool.
    pub label: Mutex<Option<Arc<str>>>,
}

impl Drop for Pool {
    fn drop(&mut self) {
        self.share.pools_alive.fetch_sub(1, Ordering::Relaxed);
    }
}

/// One shard of a pool: its part of the index and queues, and the lock-free mirror of its `used`.
pub(crate) struct Shard {
    inner: Mutex<PoolInner>,
    /// Mirror of `inner.counters.<store>.used`, readable without the lock (victim selection).
    used: [AtomicU64; 2],
}

impl Shard {
    fn lock(&self) -> MutexGuard<'_, PoolInner> {
        crate::lockprof::acquire(
            crate::lockprof::LockClass::PoolShard,
            || self.inner.try_lock(),
            || self.inner.lock(),
        )
    }
}

/// Pages of one object that hash to the same shard together: 16 pages (64 KiB of 4 KiB pages), so a
/// readahead batch of consecutive pages locks a few shards, not all, while a single large file (a
/// database) still spreads over every shard.
const EXTENT_SHIFT: u32 = 4;

/// The shard of `key` among `mask + 1` shards. A fixed mix (not seeded): a guest that picks colliding
/// keys only crowds its own pool's shards, and the same keys land in the same shards on every run.
pub(crate) fn shard_of(key: Key, mask: usize) -> usize {
    if mask == 0 {
        return 0;
    }
    let h = (key.object.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ (key.index >> EXTENT_SHIFT))
        .wrapping_mul(0xD6E8_FEB8_6659_FD93);
    (h >> 32) as usize & mask
}

pub(crate) struct PoolInner {
    /// This shard's index in its pool.
    shard: usize,
    /// The pool's shard mask (the check verifies every key is in its own shard).
    shard_mask: usize,
    /// object -> index -> (entry id, location). The location is duplicated here so that a get learns
    /// where the bytes are from the index probe alone and can prefetch them while it finishes the
    /// bookkeeping (the slab entry is a second, independent cache miss).
    objects: Map<u64, PageMap<Slot>>,
    /// Hashes page indices in the per-object maps (randomly seeded, like the maps' own hashers).
    pages_hasher: Hasher,
    /// Emptied per-object maps kept for the next objects, so that a file whose pages all left and come
    /// back does not allocate and grow its map again.
    spare: SpareMaps,
    /// The most entries the shard has held: what bounds the spare maps' capacity.
    peak: usize,
    pub slab: Slab<Entry>,
    pub queues: [OrderQueue; 2],
    pub counters: Counters,
    next_version: u64,
    /// Set by destroy: late operations that raced with the destroy must not insert.
    pub dead: bool,
    /// object -> index -> record of keys evicted for remotification (`remote.rs`).
    remote: Map<u64, Map<u64, RemoteState>>,
    /// Pending records held (bounded by the cache so abandoned offers cannot grow it without limit).
    pub pending_remote: usize,
    /// Remote records removed under the lock whose pins the caller must release after unlocking.
    pub released: Vec<RemoteRef>,
}

impl Pool {
    /// A pool of `shards` shards (a power of two, 1 to `config::MAX_POOL_SHARDS`; the caller validated
    /// it).
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        id: PoolId,
        vm: VmId,
        kind: PoolKind,
        spec: Spec,
        order: EvictionOrder,
        exclusive: bool,
        share: Arc<VmShare>,
        shards: usize,
    ) -> Self {
        share.pools_alive.fetch_add(1, Ordering::Relaxed);
        debug_assert!(shards.is_power_of_two() && shards <= crate::config::MAX_POOL_SHARDS as usize);
        let shard_mask = shards - 1;
        Pool {
            id,
            vm,
            kind,
            exclusive_gets: exclusive,
            order,
            spec: AtomicSpec::new(spec),
            shards: (0..shards)
                .map(|shard| {
                    CachePadded::new(Shard {
                        inner: Mutex::new(PoolInner {
                            shard,
                            shard_mask,
                            objects: Map::default(),
                            pages_hasher: Hasher::default(),
                            spare: SpareMaps::default(),
                            peak: 0,
                            slab: Slab::default(),
                            queues: [OrderQueue::new(0, order), OrderQueue::new(1, order)],
                            counters: Counters::default(),
                            next_version: 1,
                            dead: false,
                            remote: Map::default(),
                            pending_remote: 0,
                            released: Vec::new(),
                        }),
                        used: [AtomicU64::new(0), AtomicU64::new(0)],
                    })
                })
                .collect(),
            shard_mask,
            dedup_domain: AtomicU64::new(0),
            share,
            destroyed: std::sync::atomic::AtomicBool::new(false),
            label: Mutex::new(None),
        }
    }

    /// How many shards the pool has.
    pub fn shard_count(&self) -> usize {
        self.shards.len()
    }

    /// Locks the shard that holds `key`.
    pub fn lock(&self, key: Key) -> MutexGuard<'_, PoolInner> {
        self.shards[shard_of(key, self.shard_mask)].lock()
    }

    /// The index of `key`'s shard.
    pub fn shard_index(&self, key: Key) -> usize {
        shard_of(key, self.shard_mask)
    }

    /// Locks shard `i`.
    pub fn lock_shard(&self, i: usize) -> MutexGuard<'_, PoolInner> {
        self.shards[i].lock()
    }

    /// Locks every shard, in increasing index (destroy, object flushes and migrations).
    pub fn lock_all(&self) -> Vec<MutexGuard<'_, PoolInner>> {
        self.shards.iter().map(|s| s.lock()).collect()
    }

    /// The pool's counters: the sum of its shards', each read under its lock in turn (so each part,
    /// and hence the sum, satisfies the identity).
    pub fn counters(&self) -> Counters {
        let mut c = Counters::default();
        for s in self.shards.iter() {
            c.add(&s.lock().counters);
        }
        c
    }

    /// Seq of the oldest page of a tier over every shard (global mode compares pools by it).
    pub fn oldest_seq(&self, store: StoreKind) -> Option<u64> {
        self.shards.iter().filter_map(|s| s.lock().oldest_seq(store)).min()
    }

    /// Shares of a batch of `n` pages of `store` to take from each shard: from the fullest shards
    /// first, until their sizes are level (water-filling over the lock-free mirrors), so a sharded pool
    /// evicts about as a single queue would while no shard runs dry before the others. `(shard,
    /// pages)` pairs with pages > 0, in increasing shard index; one shard: `[(0, n)]`.
    pub fn quotas(&self, store: StoreKind, n: u64) -> Vec<(usize, u64)> {
        if self.shards.len() == 1 {
            return vec![(0, n)];
        }
        let used: Vec<u64> =
            self.shards.iter().map(|s| s.used[store.idx()].load(Ordering::Relaxed)).collect();
        let total: u64 = used.iter().sum();
        if total <= n {
            return used.iter().enumerate().filter(|(_, u)| **u > 0).map(|(i, u)| (i, *u)).collect();
        }
        // The highest level L whose excess sum(max(0, u - L)) is at least n.
        let excess = |l: u64| -> u64 { used.iter().map(|u| u.saturating_sub(l)).sum() };
        let (mut lo, mut hi) = (0u64, *used.iter().max().expect("at least one shard"));
        while lo < hi {
            let mid = lo + (hi - lo).div_ceil(2);
            if excess(mid) >= n {
                lo = mid;
            } else {
                hi = mid - 1;
            }
        }
        // Everything above L + 1, then one page each from shards at L + 1 until n is reached.
        let mut q: Vec<u64> = used.iter().map(|u| u.saturating_sub(lo + 1)).collect();
        let mut left = n - q.iter().sum::<u64>();
        for (i, u) in used.iter().enumerate() {
            if left == 0 {
                break;
            }
            if *u > lo {
                q[i] += 1;
                left -= 1;
            }
        }
        q.into_iter().enumerate().filter(|(_, p)| *p > 0).collect()
    }

    pub fn used(&self, s: StoreKind) -> u64 {
        self.shards.iter().map(|sh| sh.used[s.idx()].load(Ordering::Relaxed)).sum()
    }
    /// The pool's entitlement in `s`: its VM's entitlement x its weight / the sum of the weights of the
    /// VM's pools there (SPEC section 3), as `policy::entitlement::compute` has it.
    pub fn entitlement(&self, s: StoreKind) -> u64 {
        let w = self.spec.load().weight(s) as u128;
        let sum = self.share.weight_sum[s.idx()].load(Ordering::Relaxed) as u128;
        if w == 0 || sum == 0 {
            return 0;
        }
        let vm = self.share.entitlement[s.idx()].load(Ordering::Relaxed) as u128;
        (vm * w / sum.max(w)) as u64
    }
    pub fn evictable(&self, s: StoreKind) -> u64 {
        match self.kind {
            PoolKind::Ephemeral => self.used(s),
            PoolKind::Persistent => 0,
        }
    }

    /// Publishes a shard's lock-free mirrors; call before releasing its lock after any change.
    pub fn publish(&self, inner: &PoolInner) {
        let shard = &self.shards[inner.shard];
        for s in StoreKind::ALL {
            shard.used[s.idx()].store(inner.counters.store(s).used, Ordering::Relaxed);
        }
        // O(1) checks on every change; the full O(n) walk on small shards and on every 4096th change, so
        // that checking never makes a workload quadratic.
        for s in StoreKind::ALL {
            let c = inner.counters.store(s);
            crate::invariant!(c.identity_holds(), "stats identity broken in {s}: {c:?}");
            crate::invariant!(inner.queues[s.idx()].len() as u64 == c.used, "queue length of {s} != used");
        }
        #[cfg(any(debug_assertions, feature = "strict-invariants"))]
        if inner.slab.len() < 256 || inner.next_version.is_multiple_of(4096) {
            inner.check();
        }
    }
}

impl PoolInner {
    pub fn lookup(&self, key: Key) -> Option<u32> {
        self.lookup_slot(key).map(|(id, _)| id)
    }

    /// The entry id and location of a key, from the index alone (the entry is not read).
    pub fn lookup_slot(&self, key: Key) -> Option<(u32, Loc)> {
        self.objects
            .get(&key.object)
            .and_then(|o| o.get(&self.pages_hasher, key.index))
            .map(|s| (s.id, s.loc))
    }

    pub fn entry(&self, id: u32) -> &Entry {
        self.slab.get(id)
    }

    /// Inserts a page (a put or the arrival of a moved page). Returns the location of the page it
    /// replaced, which the caller frees after unlocking. Counts the put or move and, for a replaced
    /// page, a flush.
    pub fn insert(&mut self, key: Key, loc: Loc, seq: u64, how: Arrival) -> Option<Loc> {
        self.insert_saving(key, loc, seq, how, Saving::default())
    }

    /// [`Self::insert`] for a put whose storage de-duplication or compression saved on.
    pub fn insert_saving(
        &mut self,
        key: Key,
        loc: Loc,
        seq: u64,
        how: Arrival,
        saving: Saving,
    ) -> Option<Loc> {
        self.drop_remote(key);
        let version = self.next_version;
        self.next_version += 1;
        let id = self.queues[loc.store().idx()].insert_new(&mut self.slab, key, |qpos| Entry {
            key,
            loc,
            qpos,
            seq,
            version,
        });
        // One probe of each map level: the insert returns the entry it replaced, if any.
        let slot = Slot { id, loc };
        let spare = &mut self.spare;
        let pages = self.objects.entry(key.object).or_insert_with(|| spare.take());
        let replaced = pages.insert(&self.pages_hasher, key.index, slot).map(|old| {
            self.unlink_slot(old);
            let c = self.counters.store_mut(old.loc.store());
            c.flushes += 1;
            c.used -= 1;
            old.loc
        });
        self.peak = self.peak.max(self.slab.len());
        let c = self.counters.store_mut(loc.store());
        match how {
            Arrival::Put => c.puts += 1,
            Arrival::Moved => c.moved_in += 1,
        }
        c.dedup_hits += saving.dedup_hit as u64;
        c.bytes_saved += saving.bytes;
        c.used += 1;
        replaced
    }

    /// Removes the page of `key`, if any, and counts the departure: the data path's one-pass lookup and
    /// removal (exclusive gets, flushes).
    /// `prefetch` is called with the page's location as soon as the index gives it.
    /// Returns the page's location, which the caller now owns.
    pub fn take(&mut self, key: Key, why: Departure, prefetch: impl FnOnce(Loc)) -> Option<Loc> {
        if why == Departure::Flush {
            self.drop_remote(key);
        }
        let slot = self.unindex(key)?;
        prefetch(slot.loc);
        self.unlink_slot(slot);
        self.count_departure(slot.loc.store(), why);
        Some(slot.loc)
    }

    /// Takes the entry of an index slot just removed from the index out of its queue and the slab.
    /// The slot says where the page is; the entry itself (a cache miss of its own) is only read when
    /// the queue needs it (S3-FIFO: which of its lists holds the entry).
    fn unlink_slot(&mut self, slot: Slot) {
        crate::invariant!(self.slab.get(slot.id).loc == slot.loc, "index and entry disagree on the location");
        let q = &mut self.queues[slot.loc.store().idx()];
        if q.single_list() {
            self.slab.discard(slot.id);
            q.remove_discarded(&self.slab);
        } else {
            q.remove(&mut self.slab, slot.id);
            self.slab.discard(slot.id);
        }
    }

    fn count_departure(&mut self, store: StoreKind, why: Departure) {
        let c = self.counters.store_mut(store);
        c.used -= 1;
        match why {
            Departure::ExclusiveGet => {
                c.gets_hit += 1;
                c.exclusive_gets += 1;
            }
            Departure::Flush => c.flushes += 1,
            Departure::Evict => c.evictions += 1,
            Departure::Moved => c.moved_out += 1,
        }
    }

    /// Inserts a promoted page at the victim end of its new tier's queue, keeping its version.
    pub fn relocate(&mut self, id: u32, to: Loc) -> Loc {
        let from = self.slab.get(id).loc;
        self.queues[from.store().idx()].remove(&mut self.slab, id);
        self.slab.get_mut(id).loc = to;
        let key = self.slab.get(id).key;
        let h = &self.pages_hasher;
        if let Some(slot) = self.objects.get_mut(&key.object).and_then(|o| o.get_mut(h, key.index)) {
            slot.loc = to;
        }
        self.queues[to.store().idx()].push(&mut self.slab, id, key);
        let c = self.counters.store_mut(from.store());
        c.moved_out += 1;
        c.used -= 1;
        let c = self.counters.store_mut(to.store());
        c.moved_in += 1;
        c.used += 1;
        from
    }

    /// Removes an entry from the index and its queue, without counting anything.
    fn unlink(&mut self, id: u32) -> Entry {
        let store = self.slab.get(id).loc.store();
        self.queues[store.idx()].remove(&mut self.slab, id);
        let e = self.slab.remove(id);
        self.unindex(e.key);
        e
    }

    /// Removes a key from the object index, keeping an emptied object's map for reuse; returns the
    /// key's slot (its entry, if still in the slab, is the caller's to unlink).
    fn unindex(&mut self, key: Key) -> Option<Slot> {
        let pages = self.objects.get_mut(&key.object)?;
        let slot = pages.remove(&self.pages_hasher, key.index)?;
        if pages.is_empty() {
            let empty = self.objects.remove(&key.object).expect("probed above");
            self.spare.give(empty, self.peak);
        }
        Some(slot)
    }

    /// Removes an entry for a departure of the given kind and counts it.
    pub fn remove(&mut self, id: u32, why: Departure) -> Entry {
        let e = self.unlink(id);
        self.count_departure(e.loc.store(), why);
        e
    }

    /// Pops the next eviction victim of a tier (unlinked and counted as an eviction).
    pub fn pop_victim(&mut self, store: StoreKind) -> Option<Entry> {
        let id = self.queues[store.idx()].pop_victim(&mut self.slab, |e| e.key)?;
        // pop_victim unlinked it from the queue; finish the removal from the index.
        let e = self.slab.remove(id);
        self.unindex(e.key);
        let c = self.counters.store_mut(store);
        c.used -= 1;
        c.evictions += 1;
        Some(e)
    }

    /// Seq of the oldest page of the shard in a tier.
    pub fn oldest_seq(&mut self, store: StoreKind) -> Option<u64> {
        self.queues[store.idx()].peek_oldest(&self.slab).map(|id| self.slab.get(id).seq)
    }

    /// Ids of every page of an object.
    pub fn object_ids(&self, object: u64) -> Vec<u32> {
        self.objects.get(&object).map(|o| o.values().map(|s| s.id).collect()).unwrap_or_default()
    }

    /// Frees every allocation of a destroyed pool's bookkeeping, emptied or not: the index, its spare
    /// maps, the slab and the order queues keep their capacity (up to the pool's peak) when entries
    /// leave, and a destroyed pool may stay alive for a while after its destroy (a handle, or a runtime
    /// thread's last-pool slot, `cache::Shared::with_pool`). Called with every entry removed.
    pub fn release_memory(&mut self) {
        debug_assert_eq!(self.slab.len(), 0, "releasing the bookkeeping of a pool that holds pages");
        self.objects = Map::default();
        self.spare = SpareMaps::default();
        self.peak = 0;
        self.slab = Slab::default();
        self.queues =
            [OrderQueue::new(0, self.queues[0].order()), OrderQueue::new(1, self.queues[1].order())];
        self.remote = Map::default();
    }

    /// Ids of every entry (destroy, spec changes).
    pub fn all_ids(&self) -> Vec<u32> {
        self.slab.iter().map(|(id, _)| id).collect()
    }

    /// Ids of entries in a tier, oldest first, at most `n`.
    pub fn oldest_in(&self, store: StoreKind, n: usize) -> Vec<u32> {
        self.queues[store.idx()].oldest(&self.slab, n)
    }

    /// Ids of entries in a tier, youngest first, at most `n`.
    pub fn youngest_in(&self, store: StoreKind, n: usize) -> Vec<u32> {
        self.queues[store.idx()].youngest(&self.slab, n)
    }

    /// Records an access for the eviction order (non-exclusive hits).
    pub fn touch(&mut self, id: u32) {
        let store = self.slab.get(id).loc.store();
        self.touch_in(id, store);
    }

    /// [`Self::touch`] of an entry the caller knows is in `store` (from the index): a FIFO queue
    /// ignores accesses, so its entry is not even read.
    pub fn touch_in(&mut self, id: u32, store: StoreKind) {
        crate::invariant!(self.slab.get(id).loc.store() == store, "touching entry {id} in the wrong tier");
        self.queues[store.idx()].touch(&mut self.slab, id);
    }

    /// Removes a key's remote record, if any; a remotified one goes to `released`.
    pub fn drop_remote(&mut self, key: Key) {
        let Some(pages) = self.remote.get_mut(&key.object) else { return };
        let Some(st) = pages.remove(&key.index) else { return };
        if pages.is_empty() {
            self.remote.remove(&key.object);
        }
        self.forget(st);
    }

    /// Removes the remote records of an object (flush, migration).
    pub fn drop_remote_object(&mut self, object: u64) {
        if let Some(pages) = self.remote.remove(&object) {
            for st in pages.into_values() {
                self.forget(st);
            }
        }
    }

    /// Removes every remote record (destroy).
    pub fn drop_all_remote(&mut self) {
        for pages in std::mem::take(&mut self.remote).into_values() {
            for st in pages.into_values() {
                self.forget(st);
            }
        }
    }

    /// Removes the holders `dead` says are gone (a peer that restarted or has been unreachable past
    /// its pin lifetime) from the remotified records: they would only ever miss. A record left with no
    /// holder goes. Their pins are not released (the peer dropped them itself). Returns how many
    /// records went.
    pub fn drop_dead_remote(&mut self, dead: &dyn Fn(&Holder) -> bool) -> u64 {
        let mut n = 0;
        self.remote.retain(|_, pages| {
            pages.retain(|_, st| match st {
                RemoteState::Remote(r) => {
                    r.retain(|h| !dead(h));
                    n += r.is_empty() as u64;
                    !r.is_empty()
                }
                RemoteState::Pending(_) => true,
            });
            !pages.is_empty()
        });
        self.counters.remote_pages -= n;
        n
    }

    fn forget(&mut self, st: RemoteState) {
        match st {
            RemoteState::Pending(_) => self.pending_remote -= 1,
            RemoteState::Remote(r) => {
                self.counters.remote_pages -= 1;
                self.released.push(r);
            }
        }
    }

    /// Records that `key` (just evicted) was offered for remotification under `token`.
    pub fn set_pending(&mut self, key: Key, token: u64) {
        let old = self.remote.entry(key.object).or_default().insert(key.index, RemoteState::Pending(token));
        self.pending_remote += 1;
        if let Some(st) = old {
            self.forget(st);
        }
    }

    /// Turns the pending record of `token` into a remote one. False when the key was put, flushed or
    /// offered again since (the caller releases the pin).
    pub fn install_remote(&mut self, key: Key, token: u64, r: RemoteRef) -> bool {
        let Some(st) = self.remote.get_mut(&key.object).and_then(|o| o.get_mut(&key.index)) else {
            return false;
        };
        if *st != RemoteState::Pending(token) {
            return false;
        }
        *st = RemoteState::Remote(r);
        self.pending_remote -= 1;
        self.counters.remote_pages += 1;
        self.counters.remotified += 1;
        true
    }

    /// Drops the pending record of `token`, if it is still the key's record.
    pub fn abandon_remote(&mut self, key: Key, token: u64) {
        let pending = self.remote.get(&key.object).and_then(|o| o.get(&key.index)).copied();
        if pending == Some(RemoteState::Pending(token)) {
            self.drop_remote(key);
        }
    }

    /// The remote record of a key that missed locally. An exclusive get removes it (the caller fetches
    /// the page and then releases the pin); otherwise it stays.
    pub fn take_remote(&mut self, key: Key, exclusive: bool) -> Option<RemoteRef> {
        let st = *self.remote.get(&key.object)?.get(&key.index)?;
        let RemoteState::Remote(r) = st else { return None };
        if exclusive {
            let pages = self.remote.get_mut(&key.object).expect("looked up above");
            pages.remove(&key.index);
            if pages.is_empty() {
                self.remote.remove(&key.object);
            }
            self.counters.remote_pages -= 1;
        }
        Some(r)
    }

    /// Verifies the shard's invariants; panics with a description when one is broken.
    pub fn check(&self) {
        let mut per_store = [0u64; 2];
        let mut indexed = 0usize;
        for (object, pages) in &self.objects {
            assert!(!pages.is_empty(), "empty object map for {object}");
            for (index, slot) in pages.iter() {
                assert_eq!(
                    shard_of(Key::new(*object, index), self.shard_mask),
                    self.shard,
                    "key in the wrong shard"
                );
                let e = self.slab.get(slot.id);
                assert_eq!(e.key, Key::new(*object, index), "index points at the wrong entry");
                assert_eq!(e.loc, slot.loc, "index and entry disagree on the location");
                per_store[e.loc.store().idx()] += 1;
                indexed += 1;
            }
        }
        assert_eq!(indexed, self.slab.len(), "slab and index disagree");
        let (mut pending, mut remote) = (0usize, 0u64);
        for (object, pages) in &self.remote {
            for (index, st) in pages {
                assert!(
                    self.lookup(Key::new(*object, *index)).is_none(),
                    "a remote record of an indexed key"
                );
                match st {
                    RemoteState::Pending(_) => pending += 1,
                    RemoteState::Remote(_) => remote += 1,
                }
            }
        }
        assert_eq!(pending, self.pending_remote, "pending remote records miscounted");
        assert_eq!(remote, self.counters.remote_pages, "remote_pages disagrees with the records");
        for s in StoreKind::ALL {
            let c = self.counters.store(s);
            assert_eq!(c.used, per_store[s.idx()], "used counter of {s} disagrees with the index");
            assert_eq!(self.queues[s.idx()].len() as u64, c.used, "queue length of {s} disagrees");
            assert!(c.identity_holds(), "stats identity broken in {s}: {c:?}");
        }
    }
}

/// An index leaf: the entry and, duplicated from it, its location.
#[derive(Debug, Clone, Copy)]
struct Slot {
    id: u32,
    loc: Loc,
}

/// Emptied per-object maps, kept with their capacity. Their capacities add up to at most the pool's
/// peak number of entries, so the spares never hold more index memory than the pool once used.
#[derive(Default)]
struct SpareMaps {
    maps: Vec<PageMap<Slot>>,
    capacity: usize,
}

impl SpareMaps {
    fn give(&mut self, map: PageMap<Slot>, peak: usize) {
        debug_assert!(map.is_empty());
        // A map that never held a second key has no buckets: nothing to keep.
        if map.capacity() > 0 && self.capacity + map.capacity() <= peak {
            self.capacity += map.capacity();
            self.maps.push(map);
        }
    }

    fn take(&mut self) -> PageMap<Slot> {
        match self.maps.pop() {
            Some(m) => {
                self.capacity -= m.capacity();
                m
            }
            None => PageMap::default(),
        }
    }
}

/// What storing a page saved: a de-duplication hit stores nothing new; compression stores half a frame.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Saving {
    pub dedup_hit: bool,
    pub bytes: u64,
}

/// How a page arrives in a pool.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Arrival {
    Put,
    Moved,
}

/// Why a page leaves a pool.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Departure {
    ExclusiveGet,
    Flush,
    Evict,
    Moved,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spec_packs_and_unpacks() {
        for s in [
            Spec::None,
            Spec::Mem { weight: 7 },
            Spec::Ssd { weight: MAX_WEIGHT },
            Spec::Hybrid { mem_weight: 3, ssd_weight: MAX_WEIGHT },
        ] {
            assert_eq!(AtomicSpec::new(s).load(), s);
        }
    }

    fn pool(shards: usize) -> Pool {
        let spec = Spec::Mem { weight: 1 };
        Pool::new(
            PoolId(1),
            VmId(1),
            PoolKind::Ephemeral,
            spec,
            EvictionOrder::Fifo,
            true,
            Arc::default(),
            shards,
        )
    }

    /// Eviction quotas level the shards: the fullest give first, the total is what was asked (or all
    /// there is), and one shard takes the whole batch.
    #[test]
    fn quotas_take_from_the_fullest_shards_first() {
        assert_eq!(pool(1).quotas(StoreKind::Mem, 7), vec![(0, 7)]);
        let p = pool(4);
        for (i, n) in [10u64, 4, 7, 0].into_iter().enumerate() {
            p.shards[i].used[0].store(n, Ordering::Relaxed);
        }
        assert_eq!(p.quotas(StoreKind::Mem, 3), vec![(0, 3)]);
        // 10 -> 6, 7 -> 6: levels 6 (one each from the shards at the level after that).
        assert_eq!(p.quotas(StoreKind::Mem, 5), vec![(0, 4), (2, 1)]);
        assert_eq!(p.quotas(StoreKind::Mem, 8), vec![(0, 6), (2, 2)]);
        assert_eq!(p.quotas(StoreKind::Mem, 100), vec![(0, 10), (1, 4), (2, 7)]);
        for n in 0..=21 {
            let q = p.quotas(StoreKind::Mem, n);
            assert_eq!(q.iter().map(|(_, k)| k).sum::<u64>(), n);
            assert!(q.iter().all(|(i, k)| *k <= p.shards[*i].used[0].load(Ordering::Relaxed)));
        }
    }

    /// Keys spread over the shards by extent: the pages of one 16-page extent share a shard, and a
    /// run of extents uses every shard.
    #[test]
    fn keys_spread_over_shards_by_extent() {
        assert_eq!(shard_of(Key::new(3, 99), 0), 0);
        let mut seen = [0u32; 8];
        for e in 0..256u64 {
            let s = shard_of(Key::new(42, e << EXTENT_SHIFT), 7);
            for i in 1..(1 << EXTENT_SHIFT) {
                assert_eq!(shard_of(Key::new(42, (e << EXTENT_SHIFT) + i), 7), s);
            }
            seen[s] += 1;
        }
        assert!(seen.iter().all(|n| *n > 16), "{seen:?}");
    }

    #[test]
    fn insert_replace_and_remove_keep_counters_exact() {
        let p = Pool::new(
            PoolId(1),
            VmId(1),
            PoolKind::Ephemeral,
            Spec::Mem { weight: 1 },
            EvictionOrder::Fifo,
            true,
            Arc::default(),
            1,
        );
        let mut g = p.lock_shard(0);
        assert_eq!(g.insert(Key::new(1, 1), Loc::Mem(FrameId(0)), 1, Arrival::Put), None);
        assert_eq!(
            g.insert(Key::new(1, 1), Loc::Mem(FrameId(1)), 2, Arrival::Put),
            Some(Loc::Mem(FrameId(0)))
        );
        g.insert(Key::new(1, 2), Loc::Mem(FrameId(2)), 3, Arrival::Put);
        g.check();
        let id = g.lookup(Key::new(1, 2)).unwrap();
        g.remove(id, Departure::ExclusiveGet);
        let v = g.pop_victim(StoreKind::Mem).unwrap();
        assert_eq!(v.loc, Loc::Mem(FrameId(1)));
        g.check();
        let c = g.counters.mem;
        assert_eq!((c.puts, c.flushes, c.exclusive_gets, c.evictions, c.used), (3, 1, 1, 1, 0));
    }
}
