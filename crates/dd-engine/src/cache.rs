//! The cache: the public API of the engine and everything that spans more than one pool.
//!
//! # Structure
//! * The **tree** (host -> VMs -> pools) with weights, specs and entitlements sits behind one
//!   `RwLock`; it changes only on control-plane calls and is read when a victim must be chosen.
//! * **Pools** are found through a sharded table (`POOL_SHARDS` `RwLock`ed hash maps), so the data path
//!   takes no lock shared by all pools: a put or get locks one table shard for reading (to clone the
//!   pool's `Arc`) and then the pool's own mutex. A [`PoolHandle`] holds that `Arc` and skips the table.
//! * Each **store** (memory, SSD) has a capacity and a reservation counter. A put reserves a page
//!   before it allocates; when the reservation fails the store is full and the putting thread evicts one
//!   batch from the victim chosen by Algorithm 1 (VM first, then pool), serialised by the store's
//!   eviction lock so that concurrent puts do not evict several batches for one page.
//!
//! # Lock order
//! `tree` -> `stores[mem].evict_lock` -> `stores[ssd].evict_lock` -> pool mutexes (increasing pool id)
//! -> pool-table shards, memory-store free stacks and SSD-store internals (leaves). A thread never
//! acquires a lock that comes earlier in this list while holding a later one.
//!
//! # Where the expensive work happens
//! Page copies into fresh frames, SSD reads and writes, and freeing frames and slots all happen with no
//! pool lock held: an operation takes a location out of (or puts it into) the index under the lock and
//! does the rest outside. Two exceptions copy 4 KiB under the pool lock because the page stays indexed
//! and must not be freed mid-copy: non-exclusive memory hits and demotion reads.
//!
//! # Invariants
//! * A page key is indexed in at most one tier of one pool (exclusive caching, and "each page in exactly
//!   one tier" for hybrid pools).
//! * A get returns the bytes of the latest put of that key that completed before it, or misses. Puts are
//!   ordered by the pool lock; a page that left the index is never returned (optimistic SSD reads are
//!   validated against the entry's version after the read).
//! * `stores[s].reserved` = pages indexed in store `s` + pages in flight (reserved, not yet indexed or
//!   freed). At quiescence it equals the sum of the pools' `used`.
//! * Per pool and store the statistics identity holds whenever the pool lock is free.
//!
//! # Co-operative de-duplication
//! With a [`RemoteSink`] installed, eviction of an unshared memory page leaves a pending record and
//! offers the page's bytes to the sink; the daemon later installs a remote record or abandons it
//! (`remote.rs`). The pin table (pins held for peers) is a leaf lock. The engine never waits for a
//! peer: the sink's calls return at once, and fetching a remotified page is the daemon's business.

use crate::config::{Compression, EngineConfig, HybridConfig, Maintenance};
use crate::error::CacheError;
use crate::policy::effective::{self, Effective, VmUse};
use crate::policy::{select_victim, EntityUsage};
use crate::pool::{
    Arrival, Departure, Entry, Hasher, Loc, Map, Pool, PoolInner, Saving, VmShare, MAX_WEIGHT,
};
use crate::remote::{Evicted, Holder, RemoteRef, RemoteSink};
use crate::stats::{Counters, HostStats, PoolStats, StoreStatus, VmStats};
use crate::store::dedup::{hash_page, ContentIndex, Lookup};
use crate::store::mem::MemStore;
use crate::store::ssd::{SsdOptions, SsdStore};
use crate::types::{Key, Mode, PoolId, PoolKind, PoolOptions, PutOutcome, Spec, StoreKind, VmId, VmWeights};
use crossbeam_utils::CachePadded;
use parking_lot::{Condvar, Mutex, RwLock};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

const POOL_SHARDS: usize = 16;
/// One shard of the pool table: pools by (VM, per-VM pool id).
type PoolTable = Map<(VmId, PoolId), Arc<Pool>>;
/// Sequence numbers a thread takes from the shared counter at once.
const SEQ_BLOCK: u64 = 256;

static NEXT_INSTANCE: AtomicU64 = AtomicU64::new(1);

thread_local! {
    /// (cache instance, next seq, end of block) of this thread's current sequence block.
    static SEQ_CACHE: std::cell::Cell<(u64, u64, u64)> = const { std::cell::Cell::new((0, 0, 0)) };
}
/// Pages a demotion copies per pool-lock hold (bounds the time others wait on the pool).
const DEMOTE_CHUNK: usize = 32;

struct StoreState {
    capacity: AtomicU64,
    /// Written by every put and get: on its own cache line.
    reserved: CachePadded<AtomicU64>,
    evict_lock: Mutex<()>,
}

impl StoreState {
    fn new(capacity: u64) -> Self {
        StoreState {
            capacity: AtomicU64::new(capacity),
            reserved: CachePadded::new(AtomicU64::new(0)),
            evict_lock: Mutex::new(()),
        }
    }

    fn try_reserve(&self, n: u64) -> bool {
        let cap = self.capacity.load(Ordering::Relaxed);
        let mut cur = self.reserved.load(Ordering::Relaxed);
        loop {
            if cur + n > cap {
                return false;
            }
            match self.reserved.compare_exchange_weak(cur, cur + n, Ordering::AcqRel, Ordering::Relaxed) {
                Ok(_) => return true,
                Err(now) => cur = now,
            }
        }
    }

    fn release(&self, n: u64) {
        let prev = self.reserved.fetch_sub(n, Ordering::AcqRel);
        debug_assert!(prev >= n, "store reservation underflow");
    }
}

struct VmNode {
    weights: VmWeights,
    pools: BTreeMap<PoolId, Arc<Pool>>,
    /// Counters of destroyed pools, so aggregates keep the identity.
    retired: Counters,
    entitlement: [u64; 2],
    /// Sum of the pool weights per store (a VM uses a store when this and its own weight are non-zero).
    weight_sum: [u64; 2],
    /// What the VM's pools read: its entitlement and `weight_sum` (see `pool::VmShare`).
    share: Arc<VmShare>,
    /// The next pool id of this VM: pool ids are numbered per VM (1, 2, ...), so they tell a VM nothing
    /// about other VMs' pools, and are never reused within one registration.
    next_pool: u32,
    /// The VM's pool quota.
    max_pools: usize,
    /// The de-duplication group the host administrator put the VM in; `None` (the default): the VM's
    /// pages are de-duplicated only among themselves (`store::dedup`, side channels).
    dedup_group: Option<u32>,
}

#[derive(Default)]
struct Tree {
    vms: BTreeMap<VmId, VmNode>,
    /// Counters of removed VMs.
    retired: Counters,
    pool_count: usize,
}

#[derive(Debug, Clone)]
struct Settings {
    mode: Mode,
    batch_pages: u64,
    hybrid: HybridConfig,
}

struct Shared {
    page_size: usize,
    max_batch: usize,
    max_pools: usize,
    max_pools_per_vm: usize,
    maintenance: Maintenance,
    maintenance_interval: Duration,
    settings: RwLock<Settings>,
    mem: MemStore,
    /// LZ4-compress memory pages into half frames (`mem.compression`).
    compress: bool,
    /// Content index when the memory store de-duplicates (`mem.dedup`).
    dedup: Option<ContentIndex>,
    ssd: Option<SsdStore>,
    stores: [StoreState; 2],
    /// Pools by (VM, per-VM pool id).
    pools: [RwLock<PoolTable>; POOL_SHARDS],
    tree: RwLock<Tree>,
    /// Insertion sequence (global-mode FIFO order); threads take it in blocks, see [`Shared::next_seq`].
    seq: CachePadded<AtomicU64>,
    /// Distinguishes caches in the per-thread sequence-block cache.
    instance: u64,
    wake: (Mutex<bool>, Condvar),
    shutdown: AtomicBool,
    /// The daemon's remotifier, once installed (`remote.rs`).
    sink: std::sync::OnceLock<Arc<dyn RemoteSink>>,
    /// Tokens of pending remote records (never repeat within this cache).
    remote_tokens: AtomicU64,
    /// Pending records a pool may hold; beyond it evictions are plain.
    max_pending_per_pool: usize,
    /// The domain co-operative de-duplication shares ([`Cache::set_coop_group`]); `NO_DOMAIN`: none.
    coop_domain: AtomicU64,
    /// De-dup hits and bytes saved in group domains: counted in host scope only, so that no VM's own
    /// statistics reveal a match with another VM's content.
    group_dedup_hits: AtomicU64,
    group_bytes_saved: AtomicU64,
    /// Pins held for peers: pin number -> frame (a leaf lock).
    pins: Mutex<Map<u64, crate::store::mem::FrameId>>,
    next_pin: AtomicU64,
    pins_granted: AtomicU64,
}

/// What a get found when co-operative de-duplication is in use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GetOutcome {
    Hit,
    Miss,
    /// Not held locally, but remotified: the caller fetches it from the peer, verifies its hash and
    /// reports the result with [`Cache::record_remote_get`].
    Remote(RemoteRef),
}

/// The DoubleDecker cache store. Cheap to share: wrap it in an `Arc` (it is `Send + Sync`).
pub struct Cache {
    shared: Arc<Shared>,
    worker: Mutex<Option<JoinHandle<()>>>,
}

impl std::fmt::Debug for Cache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cache").field("page_size", &self.shared.page_size).finish_non_exhaustive()
    }
}

impl Cache {
    /// Builds a cache from a validated configuration. Opens (and empties) the SSD store if configured and
    /// starts the background worker unless maintenance is inline.
    pub fn new(cfg: EngineConfig) -> Result<Cache, CacheError> {
        Cache::with_ssd_faults(cfg, None)
    }

    /// [`Cache::new`] with an SSD store whose I/O fails as `faults` says (tests and fuzzing only:
    /// `store::ssd::faults`). Without an SSD store in `cfg`, `faults` is unused.
    pub fn with_ssd_faults(
        cfg: EngineConfig,
        faults: Option<Arc<crate::store::ssd::faults::FaultInjector>>,
    ) -> Result<Cache, CacheError> {
        cfg.validate()?;
        let ps = cfg.page_size_bytes;
        let mem_cap = cfg.pages(cfg.mem.capacity_bytes);
        let mem_max = cfg.pages(cfg.mem.max_bytes());
        let mem =
            MemStore::new(ps, mem_max as u32, mem_cap as u32).map_err(|e| CacheError::Io(e.to_string()))?;
        let (ssd, ssd_cap) = match &cfg.ssd {
            Some(s) => {
                let slots = cfg.pages(s.capacity_bytes);
                let dir = if s.scratch { Some(s.path.as_path()) } else { s.path.parent() };
                if let Some(dir) = dir.filter(|d| !d.as_os_str().is_empty()) {
                    std::fs::create_dir_all(dir)
                        .map_err(|e| CacheError::Io(format!("creating {}: {e}", dir.display())))?;
                }
                let store = SsdStore::open(SsdOptions {
                    path: s.path.clone(),
                    scratch: s.scratch,
                    slots: slots as u32,
                    page_size: ps,
                    direct_io: s.direct_io,
                    io_backend: s.io_backend,
                    write_queue_pages: s.write_queue_pages,
                    faults,
                })?;
                (Some(store), slots)
            }
            None => (None, 0),
        };
        let shared = Arc::new(Shared {
            page_size: ps,
            max_batch: cfg.max_batch_pages,
            max_pools: cfg.max_pools,
            max_pools_per_vm: cfg.max_pools_per_vm,
            maintenance: cfg.maintenance,
            maintenance_interval: Duration::from_millis(cfg.maintenance_interval_ms),
            settings: RwLock::new(Settings {
                mode: cfg.mode,
                batch_pages: cfg.pages(cfg.eviction_batch_bytes),
                hybrid: cfg.hybrid.clone(),
            }),
            dedup: cfg.mem.dedup.then(|| ContentIndex::new(mem_max as u32)),
            compress: cfg.mem.compression == Compression::Lz4,
            mem,
            ssd,
            stores: [StoreState::new(mem_cap), StoreState::new(ssd_cap)],
            pools: std::array::from_fn(|_| RwLock::new(Map::with_hasher(Hasher::default()))),
            tree: RwLock::new(Tree::default()),
            seq: CachePadded::new(AtomicU64::new(1)),
            instance: NEXT_INSTANCE.fetch_add(1, Ordering::Relaxed),
            wake: (Mutex::new(false), Condvar::new()),
            shutdown: AtomicBool::new(false),
            sink: std::sync::OnceLock::new(),
            remote_tokens: AtomicU64::new(1),
            max_pending_per_pool: 4096,
            coop_domain: AtomicU64::new(NO_DOMAIN),
            group_dedup_hits: AtomicU64::new(0),
            group_bytes_saved: AtomicU64::new(0),
            pins: Mutex::new(Map::with_hasher(Hasher::default())),
            next_pin: AtomicU64::new(1),
            pins_granted: AtomicU64::new(0),
        });
        let worker = match cfg.maintenance {
            Maintenance::Inline => None,
            Maintenance::Background => {
                let weak = Arc::downgrade(&shared);
                let handle = std::thread::Builder::new()
                    .name("dd-maintenance".into())
                    .spawn(move || maintenance_loop(weak))
                    .map_err(|e| CacheError::Io(format!("spawning maintenance worker: {e}")))?;
                Some(handle)
            }
        };
        Ok(Cache { shared, worker: Mutex::new(worker) })
    }

    pub fn page_size(&self) -> usize {
        self.shared.page_size
    }

    // ------------------------------------------------------------------------------------------
    // Host scope
    // ------------------------------------------------------------------------------------------

    /// Registers a VM with its per-store weights.
    pub fn add_vm(&self, vm: VmId, weights: VmWeights) -> Result<(), CacheError> {
        check_weight("weights.mem", weights.mem)?;
        check_weight("weights.ssd", weights.ssd)?;
        let mut tree = self.shared.tree.write();
        if tree.vms.contains_key(&vm) {
            return Err(CacheError::VmExists(vm));
        }
        tree.vms.insert(
            vm,
            VmNode {
                weights,
                pools: BTreeMap::new(),
                retired: Counters::default(),
                entitlement: [0; 2],
                weight_sum: [0; 2],
                share: Arc::new(VmShare::default()),
                next_pool: 1,
                max_pools: self.shared.max_pools_per_vm,
                dedup_group: None,
            },
        );
        self.shared.recompute(&mut tree);
        Ok(())
    }

    /// Removes a VM and destroys all its pools, in one pass: the cost grows with this VM's pools and
    /// pages and the number of VMs, never with other VMs' pools.
    pub fn remove_vm(&self, vm: VmId) -> Result<(), CacheError> {
        let mut tree = self.shared.tree.write();
        let node = tree.vms.remove(&vm).ok_or(CacheError::UnknownVm(vm))?;
        let mut retired = node.retired;
        for p in node.pools.values() {
            retired.add(&self.shared.destroy_locked(p));
        }
        tree.pool_count -= node.pools.len();
        tree.retired.add(&retired);
        self.shared.recompute(&mut tree);
        drop(tree);
        self.after_reconfigure();
        Ok(())
    }

    /// Sets a VM's pool quota (host scope). Pools it holds beyond a lowered quota stay; it creates no
    /// more until it is under it.
    pub fn set_vm_pool_quota(&self, vm: VmId, max_pools: usize) -> Result<(), CacheError> {
        if max_pools == 0 || max_pools > u32::MAX as usize {
            return Err(CacheError::invalid("max_pools", "must be 1 to 2^32 - 1"));
        }
        self.shared.tree.write().vms.get_mut(&vm).ok_or(CacheError::UnknownVm(vm))?.max_pools = max_pools;
        Ok(())
    }

    /// A VM's pool quota.
    pub fn vm_pool_quota(&self, vm: VmId) -> Result<usize, CacheError> {
        Ok(self.shared.tree.read().vms.get(&vm).ok_or(CacheError::UnknownVm(vm))?.max_pools)
    }

    pub fn set_vm_weights(&self, vm: VmId, weights: VmWeights) -> Result<(), CacheError> {
        check_weight("weights.mem", weights.mem)?;
        check_weight("weights.ssd", weights.ssd)?;
        let mut tree = self.shared.tree.write();
        tree.vms.get_mut(&vm).ok_or(CacheError::UnknownVm(vm))?.weights = weights;
        self.shared.recompute(&mut tree);
        drop(tree);
        self.after_reconfigure();
        Ok(())
    }

    /// Puts the VM's pages in a de-duplication group shared with the other VMs of that group
    /// (`Some(group)`, host scope: the administrator accepts that these VMs can learn about each other's
    /// content, `store::dedup`), or in a domain of its own (`None`, the default). Only pages put
    /// afterwards are affected; pages already stored keep their frames.
    pub fn set_vm_dedup_group(&self, vm: VmId, group: Option<u32>) -> Result<(), CacheError> {
        let mut tree = self.shared.tree.write();
        let node = tree.vms.get_mut(&vm).ok_or(CacheError::UnknownVm(vm))?;
        node.dedup_group = group;
        for p in node.pools.values() {
            p.dedup_domain.store(dedup_domain(vm, group), Ordering::Relaxed);
        }
        Ok(())
    }

    /// The de-duplication group whose content co-operative de-duplication shares with peers: only its
    /// pages are offered when evicted, published in the summary and pinned for peers. `None` (the
    /// default): nothing is shared with peers.
    pub fn set_coop_group(&self, group: Option<u32>) {
        let d = group.map_or(NO_DOMAIN, |g| dedup_domain(VmId(0), Some(g)));
        self.shared.coop_domain.store(d, Ordering::Relaxed);
    }

    /// The registered VMs and their weights.
    pub fn vms(&self) -> Vec<(VmId, VmWeights)> {
        self.shared.tree.read().vms.iter().map(|(id, n)| (*id, n.weights)).collect()
    }

    /// Changes a store's capacity. Shrinking evicts (ephemeral pages, by Algorithm 1) down to the new
    /// capacity before returning; persistent pages are never evicted, so a store full of them may stay
    /// above its capacity until they are flushed.
    pub fn set_capacity(&self, store: StoreKind, bytes: u64) -> Result<(), CacheError> {
        let pages = bytes / self.shared.page_size as u64;
        match store {
            StoreKind::Mem => {
                if pages > self.shared.mem.max_frames() as u64 {
                    return Err(CacheError::invalid(
                        "mem.capacity_bytes",
                        format!(
                            "{bytes} exceeds the arena reserved at start ({} bytes; raise mem.max_capacity_bytes)",
                            self.shared.mem.max_frames() as u64 * self.shared.page_size as u64
                        ),
                    ));
                }
                self.shared.mem.set_limit(pages as u32);
            }
            StoreKind::Ssd => {
                let ssd = self.shared.ssd.as_ref().ok_or(CacheError::StoreUnavailable(StoreKind::Ssd))?;
                if pages > u32::MAX as u64 {
                    return Err(CacheError::invalid("ssd.capacity_bytes", "more than 2^32 pages"));
                }
                if pages > ssd.slots() as u64 {
                    ssd.grow(pages as u32)?;
                }
            }
        }
        {
            let mut tree = self.shared.tree.write();
            self.shared.stores[store.idx()].capacity.store(pages, Ordering::Relaxed);
            self.shared.recompute(&mut tree);
        }
        self.shared.shrink_to_capacity(store);
        self.after_reconfigure();
        Ok(())
    }

    pub fn capacity_pages(&self, store: StoreKind) -> u64 {
        self.shared.stores[store.idx()].capacity.load(Ordering::Relaxed)
    }

    pub fn set_mode(&self, mode: Mode) {
        self.shared.settings.write().mode = mode;
    }

    /// Sets the eviction batch. At least one page.
    pub fn set_eviction_batch(&self, bytes: u64) -> Result<(), CacheError> {
        let pages = bytes / self.shared.page_size as u64;
        if pages == 0 {
            return Err(CacheError::invalid("eviction_batch_bytes", "smaller than one page"));
        }
        self.shared.settings.write().batch_pages = pages;
        Ok(())
    }

    pub fn set_hybrid(&self, hybrid: HybridConfig) -> Result<(), CacheError> {
        let probe = EngineConfig {
            hybrid: hybrid.clone(),
            page_size_bytes: self.shared.page_size,
            ..Default::default()
        };
        probe.validate()?;
        self.shared.settings.write().hybrid = hybrid;
        self.after_reconfigure();
        Ok(())
    }

    // ------------------------------------------------------------------------------------------
    // VM scope: pool lifecycle
    // ------------------------------------------------------------------------------------------

    /// Creates a pool for a container of `vm` (CREATE_CGROUP). Refused beyond the VM's quota, or when
    /// the host holds `max_pools`. Costs O(number of VMs), whatever the other VMs' pools.
    pub fn new_pool(&self, vm: VmId, opts: PoolOptions) -> Result<PoolId, CacheError> {
        check_spec(&opts.spec)?;
        let mut tree = self.shared.tree.write();
        let host_full = tree.pool_count >= self.shared.max_pools;
        let node = tree.vms.get_mut(&vm).ok_or(CacheError::UnknownVm(vm))?;
        if node.pools.len() >= node.max_pools {
            return Err(CacheError::TooManyPools(node.max_pools));
        }
        if host_full {
            return Err(CacheError::HostPoolLimit);
        }
        let id = PoolId(node.next_pool);
        node.next_pool = node.next_pool.checked_add(1).ok_or(CacheError::TooManyPools(node.max_pools))?;
        let exclusive = match opts.kind {
            PoolKind::Ephemeral => opts.exclusive_gets,
            PoolKind::Persistent => false,
        };
        let pool =
            Arc::new(Pool::new(id, vm, opts.kind, opts.spec, opts.order, exclusive, node.share.clone()));
        pool.dedup_domain.store(dedup_domain(vm, node.dedup_group), Ordering::Relaxed);
        node.add_weights(&opts.spec, 1);
        node.pools.insert(id, pool.clone());
        tree.pool_count += 1;
        self.shared.pools[shard_of(vm, id)].write().insert((vm, id), pool);
        self.shared.recompute(&mut tree);
        drop(tree);
        self.after_reconfigure();
        Ok(id)
    }

    /// Destroys a pool and frees every page in it (DESTROY_CGROUP).
    pub fn destroy_pool(&self, vm: VmId, pool: PoolId) -> Result<(), CacheError> {
        let mut tree = self.shared.tree.write();
        let node = tree.vms.get_mut(&vm).ok_or(CacheError::UnknownPool(pool))?;
        let p = node.pools.remove(&pool).ok_or(CacheError::UnknownPool(pool))?;
        node.add_weights(&p.spec.load(), -1);
        let final_counters = self.shared.destroy_locked(&p);
        node.retired.add(&final_counters);
        tree.pool_count -= 1;
        self.shared.recompute(&mut tree);
        drop(tree);
        self.after_reconfigure();
        Ok(())
    }

    /// Changes a pool's `<T, W>` (SET_CG_WEIGHT). Ephemeral pages held in a store the new spec does not
    /// use are evicted; persistent pages stay where they are (readable, never lost) until flushed.
    pub fn set_spec(&self, vm: VmId, pool: PoolId, spec: Spec) -> Result<(), CacheError> {
        check_spec(&spec)?;
        let p = self.shared.pool(vm, pool)?;
        {
            let mut tree = self.shared.tree.write();
            // The pool may have been destroyed since the lookup: then it is no longer in its VM.
            let node = tree.vms.get_mut(&vm).filter(|n| n.pools.contains_key(&pool));
            let node = node.ok_or(CacheError::UnknownPool(pool))?;
            node.add_weights(&p.spec.load(), -1);
            p.spec.store(spec);
            node.add_weights(&spec, 1);
            self.shared.recompute(&mut tree);
        }
        if p.kind == PoolKind::Ephemeral {
            for s in StoreKind::ALL {
                if !spec.uses(s) {
                    self.shared.evict_from_pool(&p, s, u64::MAX, None);
                }
            }
        }
        self.after_reconfigure();
        Ok(())
    }

    /// The pools of a VM.
    pub fn pools(&self, vm: VmId) -> Result<Vec<PoolId>, CacheError> {
        let tree = self.shared.tree.read();
        Ok(tree.vms.get(&vm).ok_or(CacheError::UnknownVm(vm))?.pools.keys().copied().collect())
    }

    // ------------------------------------------------------------------------------------------
    // VM scope: the data path
    // ------------------------------------------------------------------------------------------

    /// Stores a page. Replaces any page of the same key. An ephemeral put may be refused under pressure.
    pub fn put(&self, vm: VmId, pool: PoolId, key: Key, data: &[u8]) -> Result<PutOutcome, CacheError> {
        self.check_len(data.len())?;
        let p = self.shared.pool(vm, pool)?;
        self.shared.put_in(&p, key, data)
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
        let p = self.shared.pool(vm, pool)?;
        Ok(self.shared.get_in(&p, key, out).is_some())
    }

    /// Stores several pages of one pool. Returns one outcome per page, in order.
    pub fn put_batch(
        &self,
        vm: VmId,
        pool: PoolId,
        pages: &[(Key, &[u8])],
    ) -> Result<Vec<PutOutcome>, CacheError> {
        self.check_batch(pages.len())?;
        for (_, d) in pages {
            self.check_len(d.len())?;
        }
        let p = self.shared.pool(vm, pool)?;
        pages.iter().map(|(k, d)| self.shared.put_in(&p, *k, d)).collect()
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
        self.check_batch(keys.len())?;
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
        let p = self.shared.pool(vm, pool)?;
        Ok(self.shared.get_batch_in(&p, keys, out))
    }

    /// Invalidates one page. Returns whether a page was there.
    pub fn flush_page(&self, vm: VmId, pool: PoolId, key: Key) -> Result<bool, CacheError> {
        let p = self.shared.pool(vm, pool)?;
        let loc = {
            let mut g = p.inner.lock();
            let loc = g.take(key, Departure::Flush, |_| {}).map(|e| e.loc);
            p.publish(&g);
            loc
        };
        self.shared.release_remote(&p);
        if let Some(l) = loc {
            self.shared.free_locs(&[l]);
        }
        Ok(loc.is_some())
    }

    /// Invalidates every page of an object (a file). Returns how many pages were dropped.
    pub fn flush_object(&self, vm: VmId, pool: PoolId, object: u64) -> Result<u64, CacheError> {
        let p = self.shared.pool(vm, pool)?;
        let locs: Vec<Loc> = {
            let mut g = p.inner.lock();
            let ids = g.object_ids(object);
            let locs = ids.into_iter().map(|id| g.remove(id, Departure::Flush).loc).collect();
            g.drop_remote_object(object);
            p.publish(&g);
            locs
        };
        self.shared.release_remote(&p);
        self.shared.free_locs(&locs);
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
        // Lock order: increasing pool id.
        let (mut ga, mut gb) = if from < to {
            let ga = a.inner.lock();
            (ga, b.inner.lock())
        } else {
            let gb = b.inner.lock();
            (a.inner.lock(), gb)
        };
        if ga.dead || gb.dead {
            return Err(CacheError::UnknownPool(if ga.dead { from } else { to }));
        }
        // The object now belongs to the target: its pages there are exactly the source's. Older pages the
        // target held for the object are flushed first, so a page the source had already lost cannot be
        // "revived" from the target's older copy.
        let mut replaced: Vec<Loc> =
            gb.object_ids(object).into_iter().map(|id| gb.remove(id, Departure::Flush).loc).collect();
        // Remotified pages do not move: the target's are stale, the source's become misses.
        gb.drop_remote_object(object);
        ga.drop_remote_object(object);
        let ids = ga.object_ids(object);
        let moved = ids.len() as u64;
        for id in ids {
            let e = ga.remove(id, Departure::Moved);
            ga.counters.migrations_out += 1;
            if let Some(old) = gb.insert(e.key, e.loc, e.seq, Arrival::Moved) {
                replaced.push(old);
            }
            gb.counters.migrations_in += 1;
        }
        a.publish(&ga);
        b.publish(&gb);
        drop(ga);
        drop(gb);
        self.shared.release_remote(&a);
        self.shared.release_remote(&b);
        self.shared.free_locs(&replaced);
        Ok(moved)
    }

    // ------------------------------------------------------------------------------------------
    // Statistics
    // ------------------------------------------------------------------------------------------

    pub fn pool_stats(&self, vm: VmId, pool: PoolId) -> Result<PoolStats, CacheError> {
        let p = self.shared.pool(vm, pool)?;
        let eff = self.shared.effective(&self.shared.tree.read());
        Ok(self.shared.pool_stats(&p, &eff))
    }

    /// GET_STATS for a VM: its pools and totals (including destroyed pools).
    pub fn vm_stats(&self, vm: VmId) -> Result<VmStats, CacheError> {
        let tree = self.shared.tree.read();
        let node = tree.vms.get(&vm).ok_or(CacheError::UnknownVm(vm))?;
        Ok(self.shared.vm_stats(vm, node, &self.shared.effective(&tree)))
    }

    pub fn host_stats(&self) -> HostStats {
        let tree = self.shared.tree.read();
        let settings = self.shared.settings.read().clone();
        let eff = self.shared.effective(&tree);
        let vms: Vec<VmStats> = tree.vms.iter().map(|(id, n)| self.shared.vm_stats(*id, n, &eff)).collect();
        let mut totals = tree.retired;
        for v in &vms {
            totals.add(&v.totals);
        }
        for s in StoreKind::ALL {
            totals.store_mut(s).entitlement = self.capacity_pages(s);
            totals.store_mut(s).effective_entitlement = self.capacity_pages(s);
        }
        HostStats {
            page_size: self.shared.page_size,
            mode: settings.mode,
            eviction_batch_pages: settings.batch_pages,
            stores: StoreKind::ALL
                .iter()
                .map(|&s| StoreStatus {
                    kind: s,
                    configured: s == StoreKind::Mem || self.shared.ssd.is_some(),
                    capacity_pages: self.capacity_pages(s),
                    used_pages: self.shared.stores[s.idx()].reserved.load(Ordering::Relaxed),
                })
                .collect(),
            vms,
            totals,
            pins_held: self.pins_held(),
            remote_dedups: self.shared.pins_granted.load(Ordering::Relaxed),
            group_dedup_hits: self.shared.group_dedup_hits.load(Ordering::Relaxed),
            group_bytes_saved: self.shared.group_bytes_saved.load(Ordering::Relaxed),
        }
    }

    /// Runs hybrid maintenance to a fixed point and drains the SSD write queue: after it returns, with no
    /// concurrent operations, every watermark is satisfied. Tests and shutdown use it.
    pub fn quiesce(&self) {
        self.shared.maintain_all_until_idle();
        if let Some(ssd) = &self.shared.ssd {
            ssd.sync();
        }
    }

    /// The SSD store's I/O counters, if there is one.
    pub fn ssd_io_stats(&self) -> Option<crate::store::ssd::SsdIoStats> {
        self.shared.ssd.as_ref().map(|s| s.io_stats())
    }

    // ------------------------------------------------------------------------------------------
    // Co-operative de-duplication (remote.rs)
    // ------------------------------------------------------------------------------------------

    /// Installs the remotifier. Only the first call takes effect (returns false afterwards); remotification
    /// needs the memory store's de-duplication (`mem.dedup`), without it the call is refused too.
    pub fn set_remote_sink(&self, sink: Arc<dyn RemoteSink>) -> bool {
        self.shared.dedup.is_some() && self.shared.sink.set(sink).is_ok()
    }

    /// Makes the pending record of an offered page remote. False when the key changed since the offer
    /// (put, flushed, pool gone): the caller must release the pin.
    pub fn install_remote(&self, vm: VmId, pool: PoolId, key: Key, token: u64, r: RemoteRef) -> bool {
        let Ok(p) = self.shared.pool(vm, pool) else { return false };
        let mut g = p.inner.lock();
        if g.dead {
            return false;
        }
        g.install_remote(key, token, r)
    }

    /// Drops the pending record of an offered page that no peer took.
    pub fn abandon_remote(&self, vm: VmId, pool: PoolId, key: Key, token: u64) {
        if let Ok(p) = self.shared.pool(vm, pool) {
            p.inner.lock().abandon_remote(key, token);
        }
    }

    /// A get that also reports remotified pages: on a local miss of a remotified key returns its
    /// [`RemoteRef`] (an exclusive pool forgets the record; the caller releases the pin after fetching).
    pub fn get_or_remote(
        &self,
        vm: VmId,
        pool: PoolId,
        key: Key,
        out: &mut [u8],
    ) -> Result<GetOutcome, CacheError> {
        if self.get(vm, pool, key, out)? {
            return Ok(GetOutcome::Hit);
        }
        Ok(match self.take_remote(vm, pool, key)? {
            Some((r, _)) => GetOutcome::Remote(r),
            None => GetOutcome::Miss,
        })
    }

    /// The remote record of a key that just missed locally (see [`Self::get_or_remote`]), and whether
    /// it was removed (exclusive pools): then the caller releases the pin once it has fetched the page.
    pub fn take_remote(
        &self,
        vm: VmId,
        pool: PoolId,
        key: Key,
    ) -> Result<Option<(RemoteRef, bool)>, CacheError> {
        let p = self.shared.pool(vm, pool)?;
        let mut g = p.inner.lock();
        Ok(g.take_remote(key, p.exclusive_gets).map(|r| (r, p.exclusive_gets)))
    }

    /// Forgets every holder of a remotified record for which `dead` holds (pins of a peer that
    /// restarted, or that has been unreachable for longer than it keeps pins): they could only miss.
    /// A record left with no holder goes, so `remote_pages` counts only records that can still hit.
    /// Walks every pool once (rare: on a peer's epoch change or expiry). Returns the records dropped.
    pub fn drop_dead_remote(&self, dead: &dyn Fn(&Holder) -> bool) -> u64 {
        let pools: Vec<Arc<Pool>> = self
            .shared
            .pools
            .iter()
            .flat_map(|shard| shard.read().values().cloned().collect::<Vec<_>>())
            .collect();
        pools.iter().map(|p| p.inner.lock().drop_dead_remote(dead)).sum()
    }

    /// Counts the result of fetching a remotified page for a pool's statistics. A hit turns the get's
    /// local miss into a hit: `gets_missed` counts only gets that found the page nowhere.
    pub fn record_remote_get(&self, vm: VmId, pool: PoolId, hit: bool) {
        if let Ok(p) = self.shared.pool(vm, pool) {
            let mut g = p.inner.lock();
            if hit {
                g.counters.remote_gets_hit += 1;
                g.counters.gets_missed = g.counters.gets_missed.saturating_sub(1);
            } else {
                g.counters.remote_gets_missed += 1;
            }
        }
    }

    /// A peer's remote compare (Algorithm 4): if a frame of the co-operative group's domain
    /// ([`Cache::set_coop_group`]) holds exactly `data`, takes a reference on it for the peer and returns
    /// the pin number.
    pub fn pin(&self, hash: u128, data: &[u8]) -> Option<u64> {
        let idx = self.shared.dedup.as_ref()?;
        let domain = self.shared.coop_domain.load(Ordering::Relaxed);
        if domain == NO_DOMAIN || data.len() != self.shared.page_size || hash_page(data) != hash {
            return None;
        }
        let Lookup::Shared(f) = idx.lookup(&self.shared.mem, domain, hash, data) else { return None };
        let pin = self.shared.next_pin.fetch_add(1, Ordering::Relaxed);
        self.shared.pins.lock().insert(pin, f);
        self.shared.pins_granted.fetch_add(1, Ordering::Relaxed);
        Some(pin)
    }

    /// Copies a pinned frame into `out`. False for an unknown (released) pin.
    pub fn read_pin(&self, pin: u64, out: &mut [u8]) -> bool {
        if out.len() != self.shared.page_size {
            return false;
        }
        // Read under the pin-table lock so a concurrent unpin cannot free the frame mid-copy.
        let pins = self.shared.pins.lock();
        let Some(f) = pins.get(&pin) else { return false };
        self.shared.mem.read(*f, out);
        true
    }

    /// Releases a pin (its frame is freed if nothing else references it). False for an unknown pin.
    pub fn unpin(&self, pin: u64) -> bool {
        let Some(f) = self.shared.pins.lock().remove(&pin) else { return false };
        self.shared.release_frames(&[f]);
        true
    }

    /// Pins held now.
    pub fn pins_held(&self) -> u64 {
        self.shared.pins.lock().len() as u64
    }

    /// Content hashes of the frames of the co-operative group's domain (the summary a daemon
    /// publishes); none without a co-operative group.
    pub fn content_hashes(&self) -> Vec<u128> {
        let domain = self.shared.coop_domain.load(Ordering::Relaxed);
        match (&self.shared.dedup, domain) {
            (Some(idx), d) if d != NO_DOMAIN => idx.hashes(d),
            _ => Vec::new(),
        }
    }

    /// Verifies every pool's invariants and the store reservations (tests; takes every lock in turn).
    pub fn check_invariants(&self) -> Result<(), String> {
        let tree = self.shared.tree.read();
        let mut per_store = [0u64; 2];
        for node in tree.vms.values() {
            for p in node.pools.values() {
                let g = p.inner.lock();
                std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| g.check()))
                    .map_err(|_| format!("pool {} failed its invariant check", p.id))?;
                for s in StoreKind::ALL {
                    per_store[s.idx()] += g.counters.store(s).used;
                }
            }
        }
        for s in StoreKind::ALL {
            let reserved = self.shared.stores[s.idx()].reserved.load(Ordering::Relaxed);
            if s == StoreKind::Mem && (self.shared.dedup.is_some() || self.shared.compress) {
                // Reservations count whole frames; pools count pages, which may share a frame (equal
                // content) or half of one (compressed).
                let frames = self.shared.mem.frames_in_use();
                if reserved != frames {
                    return Err(format!("mem: reserved {reserved} != frames in use {frames}"));
                }
                if let Some(idx) = &self.shared.dedup {
                    let pins = self.shared.pins.lock().len() as u64;
                    if idx.references() != per_store[0] + pins {
                        return Err(format!(
                            "dedup: {} references != {} pages indexed + {pins} pins",
                            idx.references(),
                            per_store[0]
                        ));
                    }
                }
                continue;
            }
            if reserved != per_store[s.idx()] {
                return Err(format!(
                    "store {s}: reserved {reserved} != pages indexed {}",
                    per_store[s.idx()]
                ));
            }
        }
        Ok(())
    }

    fn check_len(&self, len: usize) -> Result<(), CacheError> {
        self.shared.check_len(len)
    }

    fn check_batch(&self, n: usize) -> Result<(), CacheError> {
        if n > self.shared.max_batch {
            return Err(CacheError::BatchTooLarge { limit: self.shared.max_batch, got: n });
        }
        Ok(())
    }

    fn after_reconfigure(&self) {
        match self.shared.maintenance {
            Maintenance::Inline => self.shared.maintain_all_until_idle(),
            Maintenance::Background => self.shared.wake_worker(),
        }
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

    /// [`Cache::get`] on this pool, saying which tier held the page: `Some(tier)` on a hit (copied into
    /// `out`; removed from an exclusive pool), `None` on a miss.
    pub fn get(&self, key: Key, out: &mut [u8]) -> Result<Option<StoreKind>, CacheError> {
        self.shared.check_len(out.len())?;
        self.live()?;
        Ok(self.shared.get_in(&self.pool, key, out))
    }
}

impl Drop for Cache {
    fn drop(&mut self) {
        self.shared.shutdown.store(true, Ordering::Release);
        self.shared.wake_worker();
        if let Some(h) = self.worker.lock().take() {
            let _ = h.join();
        }
    }
}

/// First domain of the de-duplication groups (a VM's own domain is its id + 1, below it).
const GROUP_DOMAINS: u64 = 1 << 33;
/// No domain (co-operative de-duplication shares nothing).
const NO_DOMAIN: u64 = u64::MAX;

/// A VM's own domain is its id + 1; a group's is `GROUP_DOMAINS` + the group.
fn dedup_domain(vm: VmId, group: Option<u32>) -> u64 {
    match group {
        None => vm.0 as u64 + 1,
        Some(g) => GROUP_DOMAINS + g as u64,
    }
}

fn shard_of(vm: VmId, id: PoolId) -> usize {
    ((id.0 as usize) ^ (vm.0 as usize).rotate_left(16)).wrapping_mul(0x9E37_79B9) % POOL_SHARDS
}

impl VmNode {
    /// Adds (`sign` 1) or removes (-1) a pool's weights to the VM's sums and publishes them.
    fn add_weights(&mut self, spec: &Spec, sign: i64) {
        for s in StoreKind::ALL {
            let w = spec.weight(s) as u64;
            let sum = &mut self.weight_sum[s.idx()];
            *sum = if sign > 0 { *sum + w } else { *sum - w };
            self.share.weight_sum[s.idx()].store(*sum, Ordering::Relaxed);
        }
    }
}

fn check_weight(field: &str, w: u32) -> Result<(), CacheError> {
    if w > MAX_WEIGHT {
        return Err(CacheError::invalid(field, format!("{w} exceeds {MAX_WEIGHT}")));
    }
    Ok(())
}

fn check_spec(spec: &Spec) -> Result<(), CacheError> {
    check_weight("spec.weight", spec.weight(StoreKind::Mem))?;
    check_weight("spec.weight", spec.weight(StoreKind::Ssd))
}

fn maintenance_loop(weak: std::sync::Weak<Shared>) {
    loop {
        let Some(shared) = weak.upgrade() else { return };
        if shared.shutdown.load(Ordering::Acquire) {
            return;
        }
        shared.maintain_all_until_idle();
        let interval = shared.maintenance_interval;
        {
            let (lock, cv) = &shared.wake;
            let mut woken = lock.lock();
            if !*woken {
                cv.wait_for(&mut woken, interval);
            }
            *woken = false;
        }
    }
}

impl Shared {
    fn wake_worker(&self) {
        let (lock, cv) = &self.wake;
        *lock.lock() = true;
        cv.notify_one();
    }

    fn check_len(&self, len: usize) -> Result<(), CacheError> {
        if len != self.page_size {
            return Err(CacheError::BadPageSize { expected: self.page_size, got: len });
        }
        Ok(())
    }

    /// Finds a pool of `vm`. A pool of another VM is reported as unknown.
    fn pool(&self, vm: VmId, pool: PoolId) -> Result<Arc<Pool>, CacheError> {
        match self.pools[shard_of(vm, pool)].read().get(&(vm, pool)) {
            Some(p) => Ok(p.clone()),
            None => Err(CacheError::UnknownPool(pool)),
        }
    }

    /// Recomputes every VM's entitlement from the tree (SPEC section 3; `policy::entitlement::compute`
    /// is the reference it must agree with). Pools derive theirs from their VM's share on read, so this
    /// costs O(number of VMs) and never walks pools. Called with the tree write-locked.
    fn recompute(&self, tree: &mut Tree) {
        for s in StoreKind::ALL {
            let i = s.idx();
            let cap = self.stores[i].capacity.load(Ordering::Relaxed) as u128;
            let uses = |n: &VmNode| n.weights.get(s) > 0 && n.weight_sum[i] > 0;
            let vm_sum: u128 = tree.vms.values().filter(|n| uses(n)).map(|n| n.weights.get(s) as u128).sum();
            for node in tree.vms.values_mut() {
                let ent = if uses(node) && vm_sum > 0 {
                    (cap * node.weights.get(s) as u128 / vm_sum) as u64
                } else {
                    0
                };
                node.entitlement[i] = ent;
                node.share.entitlement[i].store(ent, Ordering::Relaxed);
            }
        }
    }

    /// Marks a pool dead, drops every page (counted as flushes) and returns its final counters. Called
    /// with the tree write-locked; removes the pool from the table.
    fn destroy_locked(&self, p: &Arc<Pool>) -> Counters {
        self.pools[shard_of(p.vm, p.id)].write().remove(&(p.vm, p.id));
        p.destroyed.store(true, Ordering::Release);
        let (locs, counters) = {
            let mut g = p.inner.lock();
            g.dead = true;
            let ids = g.all_ids();
            let locs: Vec<Loc> = ids.into_iter().map(|id| g.remove(id, Departure::Flush).loc).collect();
            g.drop_all_remote();
            p.publish(&g);
            (locs, g.counters)
        };
        self.release_remote(p);
        self.free_locs(&locs);
        counters
    }

    fn free_locs(&self, locs: &[Loc]) {
        let mut n = [0u64; 2];
        for l in locs {
            match *l {
                Loc::Mem(f) => {
                    if let Some(idx) = &self.dedup {
                        if !idx.release(&self.mem, f) {
                            continue; // still shared: no frame freed, no reservation released
                        }
                    }
                    if !self.mem.free(f) {
                        continue; // a half whose buddy still holds the frame
                    }
                }
                Loc::Ssd(s) => {
                    if let Some(ssd) = &self.ssd {
                        ssd.free(s)
                    }
                }
            }
            n[l.store().idx()] += 1;
        }
        for s in StoreKind::ALL {
            if n[s.idx()] > 0 {
                self.stores[s.idx()].release(n[s.idx()]);
            }
        }
    }

    /// The next insertion sequence number. A thread takes `SEQ_BLOCK` numbers at a time from the shared
    /// counter, so concurrent putters do not fight over one cache line: with one thread the order is
    /// exact insertion order (the lab, the tests); across threads it is insertion order to within a
    /// block, which is all "FIFO across concurrent putters" can mean anyway. With inline maintenance
    /// (the deterministic setting) every number comes from the shared counter: a daemon handles one
    /// connection's requests on whichever runtime thread is free, and the lab run against it must see
    /// the exact insertion order the in-process engine gives.
    fn next_seq(&self) -> u64 {
        if self.maintenance == Maintenance::Inline {
            return self.seq.fetch_add(1, Ordering::Relaxed);
        }
        SEQ_CACHE.with(|c| {
            let (inst, next, end) = c.get();
            if inst == self.instance && next < end {
                c.set((inst, next + 1, end));
                return next;
            }
            let start = self.seq.fetch_add(SEQ_BLOCK, Ordering::Relaxed);
            c.set((self.instance, start + 1, start + SEQ_BLOCK));
            start
        })
    }

    fn store_available(&self, s: StoreKind) -> bool {
        s == StoreKind::Mem || self.ssd.is_some()
    }

    /// Which tier a put to this pool goes to, or `None` if it is not stored at all.
    fn put_tier(&self, p: &Pool) -> Option<StoreKind> {
        match p.spec.load() {
            Spec::None => None,
            Spec::Mem { .. } => Some(StoreKind::Mem),
            Spec::Ssd { .. } => self.ssd.as_ref().map(|_| StoreKind::Ssd),
            Spec::Hybrid { ssd_weight, .. } => {
                // Memory while the pool's memory share allows (thesis 000, section 5.3.2).
                if p.used(StoreKind::Mem) < p.entitlement(StoreKind::Mem)
                    || ssd_weight == 0
                    || self.ssd.is_none()
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
                let ssd = self.ssd.as_ref().expect("put_tier returns Ssd only with an SSD store");
                // A failing disk (its last write failed) takes no new pages but probes: refused, not lost.
                if !ssd.accepting() || !self.reserve(tier, p) {
                    None
                } else if let Some(slot) = ssd.alloc() {
                    ssd.write(slot, data);
                    Some((Loc::Ssd(slot), Saving::default()))
                } else {
                    self.stores[1].release(1);
                    None
                }
            }
        };
        match stored {
            Some((loc, saved)) => self.index_put(p, key, loc, tier, saved),
            None => Ok(self.refuse(p, key)),
        }
    }

    /// Places a page's bytes in the memory store: shared with an equal page (de-duplication), in half a
    /// frame (compression), or in a frame of its own. Returns the location and the bytes saved, or `None`
    /// when there is no room.
    /// What a de-dup hit in `domain` saves the pool's statistics: the whole page in a VM's own domain;
    /// nothing in a group's (counted in host scope instead: the match may be with another VM's page).
    fn dedup_saving(&self, domain: u64) -> Saving {
        let ps = self.page_size as u64;
        if domain >= GROUP_DOMAINS {
            self.group_dedup_hits.fetch_add(1, Ordering::Relaxed);
            self.group_bytes_saved.fetch_add(ps, Ordering::Relaxed);
            return Saving::default();
        }
        Saving { dedup_hit: true, bytes: ps }
    }

    fn store_in_memory(&self, p: &Pool, data: &[u8]) -> Option<(Loc, Saving)> {
        let ps = self.page_size as u64;
        // 1. An equal page already stored is shared instead of copied.
        let content = match &self.dedup {
            Some(idx) => {
                let domain = p.dedup_domain.load(Ordering::Relaxed);
                let hash = hash_page(data);
                if let Lookup::Shared(f) = idx.lookup(&self.mem, domain, hash, data) {
                    return Some((Loc::Mem(f), self.dedup_saving(domain)));
                }
                Some((idx, domain, hash))
            }
            None => None,
        };
        // 2. A page that compresses to half a frame or less goes into a half; others are stored raw.
        let compressed = self
            .compress
            .then(|| lz4_flex::block::compress(data))
            .filter(|c| c.len() <= self.mem.half_capacity());
        let (mut place, saved) = match &compressed {
            Some(c) => match self.mem.store_half(c) {
                Some(h) => (h, ps / 2),
                None => {
                    let f = self.reserve_frame(p)?;
                    (self.mem.store_half_in(f, c), ps / 2)
                }
            },
            None => {
                let f = self.reserve_frame(p)?;
                self.mem.write(f, data);
                (f, 0)
            }
        };
        // 3. Register the new content; if an equal page arrived meanwhile, share that one instead.
        if let Some((idx, domain, hash)) = content {
            let used = idx.insert(&self.mem, domain, hash, place, data);
            if used != place {
                if self.mem.free(place) {
                    self.stores[0].release(1);
                }
                place = used;
                return Some((Loc::Mem(place), self.dedup_saving(domain)));
            }
        }
        Some((Loc::Mem(place), Saving { dedup_hit: false, bytes: saved }))
    }

    /// Reserves and allocates one memory frame for a put into `p` (evicting if the store is full).
    fn reserve_frame(&self, p: &Pool) -> Option<crate::store::mem::FrameId> {
        if !self.reserve(StoreKind::Mem, p) {
            return None;
        }
        let f = self.mem.alloc();
        if f.is_none() {
            self.stores[0].release(1);
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
            let mut g = p.inner.lock();
            if g.dead {
                drop(g);
                self.free_locs(&[loc]);
                return Err(CacheError::UnknownPool(p.id));
            }
            let r = g.insert_saving(key, loc, seq, Arrival::Put, saved);
            p.publish(&g);
            r
        };
        self.release_remote(p);
        if let Some(old) = replaced {
            self.free_locs(&[old]);
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
            let mut g = p.inner.lock();
            g.counters.puts_refused += 1;
            let loc = g.take(key, Departure::Flush, |_| {}).map(|e| e.loc);
            p.publish(&g);
            loc
        };
        self.release_remote(p);
        if let Some(l) = loc {
            self.free_locs(&[l]);
        }
        PutOutcome::Refused
    }

    fn after_hybrid_put(&self, p: &Arc<Pool>) {
        let high = self.high_watermark(p.entitlement(StoreKind::Mem));
        if p.used(StoreKind::Mem) > high {
            match self.maintenance {
                Maintenance::Inline => {
                    self.maintain_pool(p);
                }
                Maintenance::Background => self.wake_worker(),
            }
        }
    }

    /// Reserves one page in `store` for a put into `p`, evicting a batch when the store is full.
    fn reserve(&self, store: StoreKind, p: &Pool) -> bool {
        let st = &self.stores[store.idx()];
        if st.try_reserve(1) {
            return true;
        }
        loop {
            let tree = self.tree.read();
            let _evicting = st.evict_lock.lock();
            if st.try_reserve(1) {
                return true;
            }
            if p.kind == PoolKind::Persistent {
                // A persistent pool may fill free space, but may only push others out while its VM is
                // under its entitlement: one VM cannot pin the whole store with swap pages.
                let vm_used: u64 =
                    tree.vms.get(&p.vm).map(|n| n.pools.values().map(|q| q.used(store)).sum()).unwrap_or(0);
                let vm_ent = tree.vms.get(&p.vm).map(|n| n.entitlement[store.idx()]).unwrap_or(0);
                if vm_used >= vm_ent {
                    return false;
                }
            }
            if self.evict_batch(&tree, store) == 0 {
                return false;
            }
        }
    }

    /// Evicts one batch from `store`. Called with the tree read-locked and the store's eviction lock held.
    /// Returns the number of pages evicted.
    fn evict_batch(&self, tree: &Tree, store: StoreKind) -> u64 {
        let (mode, batch) = {
            let s = self.settings.read();
            (s.mode, s.batch_pages)
        };
        match mode {
            Mode::Partitioned => {
                let Some(pool) = self.pick_victim(tree, store, batch) else { return 0 };
                self.evict_from_pool(&pool, store, batch, None)
            }
            Mode::Global => self.evict_global(tree, store, batch),
        }
    }

    /// Algorithm 1 twice: victim VM, then victim pool inside it.
    fn pick_victim(&self, tree: &Tree, store: StoreKind, batch: u64) -> Option<Arc<Pool>> {
        let vms: Vec<EntityUsage<VmId>> = tree
            .vms
            .iter()
            .map(|(id, n)| EntityUsage {
                id: *id,
                used: n.pools.values().map(|p| p.used(store)).sum(),
                entitlement: n.entitlement[store.idx()],
                weight: n.weights.get(store),
                evictable: n.pools.values().map(|p| p.evictable(store)).sum(),
            })
            .collect();
        let vm = select_victim(&vms, batch)?;
        let node = &tree.vms[&vm];
        let pools: Vec<EntityUsage<PoolId>> = node
            .pools
            .iter()
            .map(|(id, p)| EntityUsage {
                id: *id,
                used: p.used(store),
                entitlement: p.entitlement(store),
                weight: p.spec.load().weight(store),
                evictable: p.evictable(store),
            })
            .collect();
        let pool = select_victim(&pools, batch)?;
        node.pools.get(&pool).cloned()
    }

    /// Global FIFO: repeatedly take pages from the pool whose oldest page is the oldest of all.
    fn evict_global(&self, tree: &Tree, store: StoreKind, batch: u64) -> u64 {
        let mut done = 0;
        while done < batch {
            let mut first: Option<(u64, &Arc<Pool>)> = None;
            let mut second = u64::MAX;
            for p in tree.vms.values().flat_map(|n| n.pools.values()) {
                if p.evictable(store) == 0 {
                    continue;
                }
                let Some(seq) = p.inner.lock().oldest_seq(store) else { continue };
                match first {
                    Some((f, _)) if seq >= f => second = second.min(seq),
                    _ => {
                        if let Some((f, _)) = first {
                            second = second.min(f);
                        }
                        first = Some((seq, p));
                    }
                }
            }
            let Some((_, victim)) = first else { break };
            let n = self.evict_from_pool(victim, store, batch - done, Some(second));
            if n == 0 {
                break;
            }
            done += n;
        }
        done
    }

    /// Evicts up to `n` pages of `store` from one pool (in the pool's order), stopping early at a page
    /// younger than `until_seq` (global mode). Returns how many were evicted.
    fn evict_from_pool(&self, p: &Arc<Pool>, store: StoreKind, n: u64, until_seq: Option<u64>) -> u64 {
        if p.kind == PoolKind::Persistent {
            return 0;
        }
        let mut locs = Vec::new();
        // Memory pages offered for remotification: (key, token, frame).
        let mut offers = Vec::new();
        // Only pages of the co-operative group are offered to peers (the rule of SPEC section 6 across
        // hosts: content leaves a VM's domain only where the administrator said so).
        let coop = self.coop_domain.load(Ordering::Relaxed);
        let sink = self
            .sink
            .get()
            .filter(|_| store == StoreKind::Mem && coop != NO_DOMAIN)
            .filter(|_| p.dedup_domain.load(Ordering::Relaxed) == coop);
        {
            let mut g = p.inner.lock();
            while ((locs.len() + offers.len()) as u64) < n {
                if let Some(limit) = until_seq {
                    let oldest = g.oldest_seq(store);
                    // Always take at least one page so global eviction makes progress.
                    if !(locs.is_empty() && offers.is_empty()) && oldest.is_none_or(|s| s > limit) {
                        break;
                    }
                }
                match g.pop_victim(store) {
                    Some(Entry { loc: Loc::Mem(f), key, .. })
                        if sink.is_some() && g.pending_remote < self.max_pending_per_pool =>
                    {
                        let token = self.remote_tokens.fetch_add(1, Ordering::Relaxed);
                        g.set_pending(key, token);
                        offers.push((key, token, f));
                    }
                    Some(Entry { loc, .. }) => locs.push(loc),
                    None => break,
                }
            }
            p.publish(&g);
        }
        self.release_remote(p);
        let evicted = (locs.len() + offers.len()) as u64;
        self.free_locs(&locs);
        if let Some(sink) = sink {
            self.offer_evicted(p, sink.as_ref(), offers);
        }
        evicted
    }

    /// Frees evicted memory pages, first offering the ones no other local page shares (thesis 004,
    /// Algorithm 3: only "remote sharing candidates" are remotified). Offers that were not made are
    /// abandoned under the pool lock again.
    fn offer_evicted(
        &self,
        p: &Pool,
        sink: &dyn RemoteSink,
        offers: Vec<(Key, u64, crate::store::mem::FrameId)>,
    ) {
        let idx = self.dedup.as_ref().expect("a sink is only installed with de-duplication");
        let mut not_offered = Vec::new();
        let mut freed = 0;
        for (key, token, f) in offers {
            if !idx.release(&self.mem, f) {
                not_offered.push((key, token)); // still shared locally: stays a local page
                continue;
            }
            // The last reference is gone: this thread owns the frame until it frees it.
            let mut data = vec![0u8; self.page_size].into_boxed_slice();
            self.mem.read(f, &mut data);
            if self.mem.free(f) {
                freed += 1;
            }
            let hash = hash_page(&data);
            if !sink.offer(Evicted { vm: p.vm, pool: p.id, key, token, hash, data }) {
                not_offered.push((key, token));
            }
        }
        if freed > 0 {
            self.stores[0].release(freed);
        }
        if !not_offered.is_empty() {
            let mut g = p.inner.lock();
            for (key, token) in not_offered {
                g.abandon_remote(key, token);
            }
        }
    }

    /// Hands the remote records a pool operation removed to the sink (call after unlocking the pool).
    fn release_remote(&self, p: &Pool) {
        let Some(sink) = self.sink.get() else { return };
        let released = std::mem::take(&mut p.inner.lock().released);
        for r in released {
            sink.release(r);
        }
    }

    /// Drops references to memory frames (pins), freeing frames that become unreferenced.
    fn release_frames(&self, frames: &[crate::store::mem::FrameId]) {
        let locs: Vec<Loc> = frames.iter().map(|f| Loc::Mem(*f)).collect();
        self.free_locs(&locs);
    }

    /// Evicts until the store's reservation fits its capacity (after a shrink).
    fn shrink_to_capacity(&self, store: StoreKind) {
        let st = &self.stores[store.idx()];
        loop {
            let tree = self.tree.read();
            let _evicting = st.evict_lock.lock();
            if st.reserved.load(Ordering::Relaxed) <= st.capacity.load(Ordering::Relaxed) {
                return;
            }
            if self.evict_batch(&tree, store) == 0 {
                return;
            }
        }
    }

    /// A get; returns the tier that held the page, `None` on a miss.
    fn get_in(&self, p: &Arc<Pool>, key: Key, out: &mut [u8]) -> Option<StoreKind> {
        if p.exclusive_gets {
            let taken = {
                let mut g = p.inner.lock();
                let r = g.take(key, Departure::ExclusiveGet, |l| self.prefetch(l)).map(|e| e.loc);
                if r.is_none() {
                    g.counters.gets_missed += 1;
                }
                p.publish(&g);
                r
            };
            let loc = taken?;
            let ok = self.read_owned(loc, out);
            self.free_locs(&[loc]);
            if !ok {
                self.count_lost_page(p, loc.store());
            }
            return ok.then_some(loc.store());
        }
        self.get_shared(p, key, out)
    }

    /// Starts loading a memory page into the CPU caches (the copy follows shortly).
    fn prefetch(&self, loc: Loc) {
        if let Loc::Mem(f) = loc {
            self.mem.prefetch(f);
        }
    }

    /// Copies a location the caller owns (taken out of the index) into `out`.
    fn read_owned(&self, loc: Loc, out: &mut [u8]) -> bool {
        match loc {
            Loc::Mem(f) => {
                self.mem.read(f, out);
                true
            }
            Loc::Ssd(s) => self.ssd.as_ref().is_some_and(|ssd| ssd.read(s, out).is_ok()),
        }
    }

    /// An exclusive get whose SSD read failed: the page is gone, so re-count the hit as an eviction and
    /// the get as a miss (the identity is unchanged: used did not move).
    fn count_lost_page(&self, p: &Pool, store: StoreKind) {
        let mut g = p.inner.lock();
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
                let mut g = p.inner.lock();
                let Some(id) = g.lookup(key) else {
                    g.counters.gets_missed += 1;
                    return None;
                };
                let e = g.entry(id);
                match e.loc {
                    Loc::Mem(f) => {
                        self.mem.read(f, out);
                        g.counters.mem.gets_hit += 1;
                        g.touch(id);
                        return Some(StoreKind::Mem);
                    }
                    Loc::Ssd(slot) => (slot, e.version),
                }
            };
            let read_ok = self.ssd.as_ref().is_some_and(|ssd| ssd.read(slot, out).is_ok());
            let mut g = p.inner.lock();
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
                    self.free_locs(&[e.loc]);
                    return None;
                }
                _ => continue,
            }
        }
        p.inner.lock().counters.gets_missed += 1;
        None
    }

    fn get_batch_in(&self, p: &Arc<Pool>, keys: &[Key], out: &mut [u8]) -> Vec<bool> {
        let ps = self.page_size;
        if !p.exclusive_gets {
            return keys
                .iter()
                .enumerate()
                .map(|(i, k)| self.get_shared(p, *k, &mut out[i * ps..(i + 1) * ps]).is_some())
                .collect();
        }
        let mut hits = vec![false; keys.len()];
        let mut taken: Vec<(usize, Loc)> = Vec::with_capacity(keys.len());
        {
            let mut g = p.inner.lock();
            for (i, k) in keys.iter().enumerate() {
                match g.take(*k, Departure::ExclusiveGet, |l| self.prefetch(l)) {
                    Some(e) => taken.push((i, e.loc)),
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
                    self.mem.read(f, &mut out[i * ps..(i + 1) * ps]);
                    hits[i] = true;
                }
                Loc::Ssd(s) => ssd_reqs.push((i, s)),
            }
            locs.push(loc);
        }
        if let (false, Some(ssd)) = (ssd_reqs.is_empty(), self.ssd.as_ref()) {
            // Split `out` into disjoint page slices for the batched read.
            let mut slices: Vec<Option<&mut [u8]>> = out.chunks_mut(ps).map(Some).collect();
            let mut reqs: Vec<(crate::store::ssd::SlotId, &mut [u8])> = ssd_reqs
                .iter()
                .map(|(i, s)| (*s, slices[*i].take().expect("each page index is requested once")))
                .collect();
            let results = ssd.read_batch(&mut reqs);
            let mut lost = 0;
            for ((i, _), r) in ssd_reqs.iter().zip(results) {
                if r.is_ok() {
                    hits[*i] = true;
                } else {
                    lost += 1;
                }
            }
            for _ in 0..lost {
                self.count_lost_page(p, StoreKind::Ssd);
            }
        }
        self.free_locs(&locs);
        hits
    }

    // --------------------------------------------------------------------------------------------
    // Hybrid maintenance (thesis 000, sections 5.3-5.4)
    // --------------------------------------------------------------------------------------------

    fn high_watermark(&self, limit: u64) -> u64 {
        let ppm = self.settings.read().hybrid.high_watermark_margin_ppm as u128;
        limit - (limit as u128 * ppm / 1_000_000) as u64
    }

    fn maintain_all_until_idle(&self) {
        let pools: Vec<Arc<Pool>> = {
            let tree = self.tree.read();
            tree.vms
                .values()
                .flat_map(|n| n.pools.values().cloned())
                .filter(|p| p.spec.load().is_hybrid())
                .collect()
        };
        for p in pools {
            // Each step moves at most one batch; a pool converges in a bounded number of steps because
            // every step strictly reduces its distance to the watermarks (or does nothing).
            let mut steps = 0u64;
            while self.maintain_pool(&p) && !self.shutdown.load(Ordering::Relaxed) {
                steps += 1;
                if steps > 1_000_000 {
                    tracing::warn!(pool = p.id.0, "hybrid maintenance did not converge");
                    break;
                }
            }
        }
    }

    /// One maintenance step for a hybrid pool: demote, evict from the SSD tier, or promote one batch.
    /// Returns whether anything moved.
    fn maintain_pool(&self, p: &Arc<Pool>) -> bool {
        let spec = p.spec.load();
        if !spec.is_hybrid() {
            return false;
        }
        let (batch, low_margin) = {
            let s = self.settings.read();
            (
                (s.hybrid.move_batch_bytes / self.page_size as u64).max(1),
                s.hybrid.low_watermark_margin_bytes / self.page_size as u64,
            )
        };
        let mem_limit = p.entitlement(StoreKind::Mem);
        let ssd_limit = p.entitlement(StoreKind::Ssd);
        let mem_used = p.used(StoreKind::Mem);
        let ssd_used = p.used(StoreKind::Ssd);
        let mem_high = self.high_watermark(mem_limit);
        let ssd_high = self.high_watermark(ssd_limit);
        let can_demote = self.store_available(StoreKind::Ssd) && spec.weight(StoreKind::Ssd) > 0;

        if ssd_used > ssd_high && p.kind == PoolKind::Ephemeral {
            return self.evict_from_pool(p, StoreKind::Ssd, batch.min(ssd_used), None) > 0;
        }
        if mem_used > mem_high {
            let n = batch.min(mem_used);
            if can_demote {
                return self.demote(p, n) > 0;
            }
            return self.evict_from_pool(p, StoreKind::Mem, n, None) > 0;
        }
        let low = mem_limit.saturating_sub(low_margin);
        if mem_used < low && ssd_used > 0 {
            return self.promote(p, batch.min(low - mem_used).min(ssd_used)) > 0;
        }
        false
    }

    /// Moves up to `n` of the oldest memory pages of `p` to the SSD tier. Returns pages moved.
    fn demote(&self, p: &Arc<Pool>, n: u64) -> u64 {
        let Some(ssd) = self.ssd.as_ref() else { return 0 };
        let ps = self.page_size;
        let mut moved = 0u64;
        let mut buf = vec![0u8; ps * DEMOTE_CHUNK];
        while moved < n {
            let want = (n - moved).min(DEMOTE_CHUNK as u64) as usize;
            // 1. Copy the oldest pages out under the lock (they stay indexed and readable).
            let picked: Vec<(Key, u64)> = {
                let g = p.inner.lock();
                let mut picked = Vec::with_capacity(want);
                for id in g.oldest_in(StoreKind::Mem, want) {
                    let e = g.entry(id);
                    let Loc::Mem(f) = e.loc else {
                        crate::invariant!(false, "memory queue holds a page located on SSD");
                        continue;
                    };
                    let i = picked.len();
                    self.mem.read(f, &mut buf[i * ps..(i + 1) * ps]);
                    picked.push((e.key, e.version));
                }
                picked
            };
            if picked.is_empty() {
                break;
            }
            // 2. Write them to fresh SSD slots outside the lock.
            let mut staged = Vec::with_capacity(picked.len());
            for (i, (key, version)) in picked.iter().enumerate() {
                if !ssd.accepting() || !self.reserve(StoreKind::Ssd, p) {
                    break;
                }
                let Some(slot) = ssd.alloc() else {
                    self.stores[1].release(1);
                    break;
                };
                ssd.write(slot, &buf[i * ps..(i + 1) * ps]);
                staged.push((*key, *version, slot));
            }
            if staged.is_empty() {
                // No SSD room at all: fall back to dropping the pages so memory stays bounded.
                return moved + self.evict_from_pool(p, StoreKind::Mem, n - moved, None);
            }
            // 3. Switch each entry that is still the same page to its SSD slot.
            let mut to_free = Vec::new();
            {
                let mut g = p.inner.lock();
                for (key, version, slot) in staged {
                    match g.lookup(key) {
                        Some(id) if g.entry(id).version == version && !g.dead => {
                            let old = g.relocate(id, Loc::Ssd(slot));
                            g.counters.demotions += 1;
                            to_free.push(old);
                            moved += 1;
                        }
                        // Replaced, flushed or got meanwhile: the SSD copy is stale, drop it.
                        _ => to_free.push(Loc::Ssd(slot)),
                    }
                }
                p.publish(&g);
            }
            self.free_locs(&to_free);
        }
        moved
    }

    /// Moves up to `n` of the youngest SSD pages of `p` back to memory, using only free memory.
    fn promote(&self, p: &Arc<Pool>, n: u64) -> u64 {
        let Some(ssd) = self.ssd.as_ref() else { return 0 };
        let picked: Vec<(Key, u64, crate::store::ssd::SlotId)> = {
            let g = p.inner.lock();
            g.youngest_in(StoreKind::Ssd, n as usize)
                .into_iter()
                .filter_map(|id| {
                    let e = g.entry(id);
                    match e.loc {
                        Loc::Ssd(s) => Some((e.key, e.version, s)),
                        Loc::Mem(_) => None,
                    }
                })
                .collect()
        };
        let mut staged = Vec::with_capacity(picked.len());
        for (key, version, slot) in picked {
            if !self.stores[0].try_reserve(1) {
                break;
            }
            let Some(frame) = self.mem.alloc() else {
                self.stores[0].release(1);
                break;
            };
            let mut page = vec![0u8; self.page_size];
            if ssd.read(slot, &mut page).is_err() {
                self.mem.free(frame);
                self.stores[0].release(1);
                continue;
            }
            self.mem.write(frame, &page);
            let frame = match &self.dedup {
                Some(idx) => {
                    let used = idx.insert(
                        &self.mem,
                        p.dedup_domain.load(Ordering::Relaxed),
                        hash_page(&page),
                        frame,
                        &page,
                    );
                    if used != frame {
                        self.mem.free(frame);
                        self.stores[0].release(1);
                    }
                    used
                }
                None => frame,
            };
            staged.push((key, version, slot, frame));
        }
        let mut moved = 0;
        let mut to_free = Vec::new();
        {
            let mut g = p.inner.lock();
            for (key, version, slot, frame) in staged {
                match g.lookup(key) {
                    Some(id)
                        if g.entry(id).version == version && g.entry(id).loc == Loc::Ssd(slot) && !g.dead =>
                    {
                        let old = g.relocate(id, Loc::Mem(frame));
                        g.counters.promotions += 1;
                        to_free.push(old);
                        moved += 1;
                    }
                    _ => to_free.push(Loc::Mem(frame)),
                }
            }
            p.publish(&g);
        }
        self.free_locs(&to_free);
        moved
    }

    // --------------------------------------------------------------------------------------------
    // Statistics
    // --------------------------------------------------------------------------------------------

    /// Effective entitlements of every VM and pool, per store (`policy::effective`), from the tree's
    /// use and static entitlements now. Called with the tree locked (read); O(pools).
    fn effective(&self, tree: &Tree) -> [Effective; 2] {
        let batch = self.settings.read().batch_pages;
        StoreKind::ALL.map(|s| {
            let vms: Vec<VmUse> = tree
                .vms
                .iter()
                .map(|(id, n)| VmUse {
                    vm: *id,
                    weight: n.weights.get(s) as u64,
                    entitlement: n.entitlement[s.idx()],
                    pools: n
                        .pools
                        .iter()
                        .map(|(pid, p)| {
                            let spec = p.spec.load();
                            let w = if spec.uses(s) { spec.weight(s) as u64 } else { 0 };
                            (*pid, w, p.used(s))
                        })
                        .collect(),
                })
                .collect();
            effective::compute(&vms, batch)
        })
    }

    fn pool_stats(&self, p: &Pool, eff: &[Effective; 2]) -> PoolStats {
        let mut counters = p.inner.lock().counters;
        for s in StoreKind::ALL {
            counters.store_mut(s).entitlement = p.entitlement(s);
            counters.store_mut(s).effective_entitlement =
                eff[s.idx()].pool.get(&(p.vm, p.id)).copied().unwrap_or(0);
        }
        PoolStats {
            pool: p.id,
            vm: p.vm,
            kind: p.kind,
            spec: p.spec.load(),
            order: p.order,
            exclusive_gets: p.exclusive_gets,
            counters,
        }
    }

    fn vm_stats(&self, vm: VmId, node: &VmNode, eff: &[Effective; 2]) -> VmStats {
        let pools: Vec<PoolStats> = node.pools.values().map(|p| self.pool_stats(p, eff)).collect();
        let mut totals = node.retired;
        for p in &pools {
            totals.add(&p.counters);
        }
        for s in StoreKind::ALL {
            totals.store_mut(s).entitlement = node.entitlement[s.idx()];
            totals.store_mut(s).effective_entitlement = eff[s.idx()].vm.get(&vm).copied().unwrap_or(0);
        }
        VmStats { vm, weights: node.weights, pools, totals, pools_omitted: 0 }
    }
}

#[allow(dead_code)]
fn _assert_send_sync() {
    fn is<T: Send + Sync>() {}
    is::<Cache>();
    is::<PoolInner>();
}
