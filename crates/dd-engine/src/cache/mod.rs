//! The cache: the public API of the engine and everything that spans more than one pool.
//!
//! # Structure
//! * The **tree** (host -> VMs -> pools) with weights, specs and entitlements sits behind one
//!   `RwLock`; it changes only on control-plane calls and is read when a victim must be chosen.
//! * **Pools** are found through a sharded table (`POOL_SHARDS` `RwLock`ed hash maps), so the data path
//!   takes no lock shared by all pools: a put or get locks one table shard for reading (to clone the
//!   pool's `Arc`) and then the mutex of the key's shard of the pool (`pool.rs`: a pool is split into
//!   shards by key hash, so threads on one pool rarely meet). A [`PoolHandle`] holds that `Arc` and skips the table.
//! * Each **store** (memory, SSD) has a capacity and a reservation counter. A put reserves a page
//!   before it allocates; when the reservation fails the store is full and the putting thread evicts one
//!   batch from the victim chosen by Algorithm 1 (VM first, then pool), serialised by the store's
//!   eviction lock so that concurrent puts do not evict several batches for one page.
//!
//! # Lock order
//! the maintenance pass (`evictor.pass`) -> `tree` -> `stores[mem].evict_lock` -> `stores[ssd].evict_lock`
//! -> pool shard mutexes (increasing pool id; within a pool, increasing shard index) -> pool-table
//! shards, memory-store free stacks, SSD-store internals and pool labels (leaves). A thread never
//! acquires a lock that comes earlier in this list while holding a later one.
//!
//! # Where the expensive work happens
//! Page copies into fresh frames, SSD reads and writes, and freeing frames and slots all happen with no
//! pool lock held: an operation takes a location out of (or puts it into) the index under the lock and
//! does the rest outside. A non-exclusive memory hit leaves its page indexed: it holds the frame for
//! reading under the lock and copies it after (`store::mem`: a frame freed while held is freed by its
//! last reader). Two exceptions still copy under the key's pool-shard lock: compressed (half-frame)
//! hits, which are decompressed, and demotion reads.
//!
//! # Invariants
//! * A page key is indexed in at most one tier of one pool (exclusive caching, and "each page in exactly
//!   one tier" for hybrid pools).
//! * A get returns the bytes of the latest put of that key that completed before it, or misses. Puts are
//!   ordered by the pool lock; a page that left the index is never returned (optimistic SSD reads are
//!   validated against the entry's version after the read).
//! * `stores[s].used()` (the shared reservation less the stripes' credit, `StoreState`) = pages indexed
//!   in store `s` + pages in flight (reserved, not yet indexed or freed). At quiescence it equals the
//!   sum of the pools' `used`.
//! * Per pool shard and store the statistics identity holds whenever the shard's lock is free, and so
//!   for the pool's counters, which are the sum of its shards' read one shard lock at a time.
//!
//! # Co-operative de-duplication
//! With a [`RemoteSink`](crate::remote::RemoteSink) installed, eviction of an unshared memory page
//! leaves a pending record and offers the page's bytes to the sink; the daemon later installs a remote
//! record or abandons it (`remote.rs`). Its state is `coop::Coop`, a part of `Shared` that the put and
//! eviction paths reach through four calls only (`offering`, `count_group_dedup`, `release_remote`,
//! `release_remote_of`). The pin table (pins held for peers) is a leaf lock. The engine never waits
//! for a peer: the sink's calls return at once, and fetching a remotified page is the daemon's business.
//!
//! # State, by owner
//! `Shared` holds the registry (the tree, the pool table, limits) and three parts, each owned by one
//! file: `place::Placement` (the stores, their reservations, de-duplication and compression: where
//! pages live, knowing nothing of pools), `evict::Evictor` (Algorithm 1's settings, the insertion
//! sequence, the maintenance worker's signals) and `coop::Coop` (co-operative de-duplication, reached by
//! the put and eviction paths through four calls).
//!
//! # Files
//! One concern per file, all of them `impl` blocks of [`Cache`] and of the shared state (`Shared`)
//! defined here: `control` (the tree: VMs, pools, weights, capacities), `data` (puts, gets, flushes,
//! migrations, [`PoolHandle`]), `place` (placing and freeing pages, reservations), `evict` (reserving
//! with eviction, Algorithm 1), `tiers` (hybrid maintenance: demotion and promotion), `coop`
//! (co-operative de-duplication: remote records and pins), `stats` (statistics and invariant checks).
//! The files call each other's methods only through `Shared` and `Cache` (methods used by a sibling are
//! `pub(super)`); the types, constants and helpers they share live here.

mod control;
mod coop;
mod data;
mod evict;
mod place;
mod stats;
mod tiers;

pub use data::PoolHandle;

use coop::Coop;
use evict::Evictor;
use place::Placement;

use crate::config::{EngineConfig, HybridConfig, Maintenance};
use crate::error::CacheError;
use crate::pool::{Hasher, Map, Pool, PoolInner, VmShare};
use crate::remote::RemoteRef;
use crate::stats::Counters;
use crate::types::{Mode, PoolId, VmId, VmWeights};
use parking_lot::{Mutex, RwLock};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use tiers::maintenance_loop;

const POOL_SHARDS: usize = 16;
/// One shard of the pool table: pools by (VM, per-VM pool id).
type PoolTable = Map<(VmId, PoolId), Arc<Pool>>;
/// Sequence numbers a thread takes from the shared counter at once.
const SEQ_BLOCK: u64 = 256;

static NEXT_INSTANCE: AtomicU64 = AtomicU64::new(1);

thread_local! {
    /// (cache instance, next seq, end of block) of this thread's current sequence block.
    static SEQ_CACHE: std::cell::Cell<(u64, u64, u64)> = const { std::cell::Cell::new((0, 0, 0)) };
    /// The pool this thread last used by id, with its cache instance (see [`Shared::with_pool`]).
    static LAST_POOL: std::cell::Cell<Option<(u64, Arc<Pool>)>> = const { std::cell::Cell::new(None) };
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
    /// Shards of a pool whose options name none (`EngineConfig::pool_shards`, 0 resolved).
    pool_shards: u32,
    /// Where pages live (`place.rs`): the stores, their reservations, de-duplication and compression.
    place: Placement,
    /// Pools by (VM, per-VM pool id).
    pools: [RwLock<PoolTable>; POOL_SHARDS],
    tree: RwLock<Tree>,
    /// Distinguishes caches in the per-thread sequence-block cache.
    instance: u64,
    /// What chooses victims and when (`evict.rs`, `tiers.rs`): the mode and batch, the insertion
    /// sequence, the maintenance worker's signals.
    evictor: Evictor,
    /// Co-operative de-duplication's state (`coop.rs`): the put and eviction paths reach it only through
    /// `Coop`'s methods.
    coop: Coop,
    /// `Pool` objects not yet dropped (every VM's share holds this counter; see `pool::VmShare`).
    pools_alive: Arc<AtomicU64>,
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
        let place = Placement::open(&cfg, faults)?;
        let shared = Arc::new(Shared {
            page_size: ps,
            max_batch: cfg.max_batch_pages,
            max_pools: cfg.max_pools,
            max_pools_per_vm: cfg.max_pools_per_vm,
            pool_shards: match cfg.pool_shards {
                0 => crate::config::default_pool_shards(),
                n => n,
            },
            evictor: Evictor::new(&cfg),
            place,
            pools: std::array::from_fn(|_| RwLock::new(Map::with_hasher(Hasher::default()))),
            tree: RwLock::new(Tree::default()),
            instance: NEXT_INSTANCE.fetch_add(1, Ordering::Relaxed),
            coop: Coop::new(),
            pools_alive: Arc::new(AtomicU64::new(0)),
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

    fn check_len(&self, len: usize) -> Result<(), CacheError> {
        self.shared.check_len(len)
    }

    fn after_reconfigure(&self) {
        match self.shared.evictor.maintenance {
            Maintenance::Inline => self.shared.maintain_all_until_idle(),
            Maintenance::Background => self.shared.wake_worker(),
        }
    }
}

impl Drop for Cache {
    fn drop(&mut self) {
        self.shared.evictor.shutdown.store(true, Ordering::Release);
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

impl Shared {
    fn wake_worker(&self) {
        let (lock, cv) = &self.evictor.wake;
        *lock.lock() = true;
        cv.notify_one();
    }

    /// A batch of `n` pages is within the configured bound (`EngineConfig::max_batch_pages`).
    fn check_batch(&self, n: usize) -> Result<(), CacheError> {
        if n > self.max_batch {
            return Err(CacheError::BatchTooLarge { limit: self.max_batch, got: n });
        }
        Ok(())
    }

    fn check_len(&self, len: usize) -> Result<(), CacheError> {
        if len != self.page_size {
            return Err(CacheError::BadPageSize { expected: self.page_size, got: len });
        }
        Ok(())
    }

    /// Finds a pool of `vm`. A pool of another VM is reported as unknown.
    fn pool(&self, vm: VmId, pool: PoolId) -> Result<Arc<Pool>, CacheError> {
        let table = &self.pools[shard_of(vm, pool)];
        let table = crate::lockprof::acquire(
            crate::lockprof::LockClass::PoolTable,
            || table.try_read(),
            || table.read(),
        );
        match table.get(&(vm, pool)) {
            Some(p) => Ok(p.clone()),
            None => Err(CacheError::UnknownPool(pool)),
        }
    }

    /// Runs `f` on a pool of `vm`, as [`Self::pool`] finds it, for the data path by id. A thread
    /// usually works on one pool for a while (a connection's batch, a guest's file), so the pool it used
    /// last is kept in a thread-local slot and reused while it is the one asked for and not destroyed:
    /// that skips the table shard's read lock, the probe and the `Arc`'s two reference-count updates,
    /// four atomic read-modify-writes per call. The slot is taken out while `f` runs, so a nested call
    /// looks its pool up in the table. A destroyed pool in the slot is only dropped (its bookkeeping
    /// freed) on this thread's next call; a destroy racing with a call is the same race as one racing
    /// with a table lookup (`PoolHandle::live`).
    fn with_pool<R>(
        &self,
        vm: VmId,
        id: PoolId,
        f: impl FnOnce(&Arc<Pool>) -> Result<R, CacheError>,
    ) -> Result<R, CacheError> {
        let p = match LAST_POOL.with(|c| c.take()) {
            Some((inst, p))
                if inst == self.instance
                    && p.vm == vm
                    && p.id == id
                    && !p.destroyed.load(Ordering::Acquire) =>
            {
                p
            }
            _ => self.pool(vm, id)?,
        };
        let r = f(&p);
        LAST_POOL.with(|c| c.set(Some((self.instance, p))));
        r
    }

    /// The next insertion sequence number. A thread takes `SEQ_BLOCK` numbers at a time from the shared
    /// counter, so concurrent putters do not fight over one cache line: with one thread the order is
    /// exact insertion order (the lab, the tests); across threads it is insertion order to within a
    /// block, which is all "FIFO across concurrent putters" can mean anyway. With inline maintenance
    /// (the deterministic setting) every number comes from the shared counter: a daemon handles one
    /// connection's requests on whichever runtime thread is free, and the lab run against it must see
    /// the exact insertion order the in-process engine gives.
    fn next_seq(&self) -> u64 {
        if self.evictor.maintenance == Maintenance::Inline {
            return self.evictor.seq.fetch_add(1, Ordering::Relaxed);
        }
        SEQ_CACHE.with(|c| {
            let (inst, next, end) = c.get();
            if inst == self.instance && next < end {
                c.set((inst, next + 1, end));
                return next;
            }
            let start = self.evictor.seq.fetch_add(SEQ_BLOCK, Ordering::Relaxed);
            c.set((self.instance, start + 1, start + SEQ_BLOCK));
            start
        })
    }
}

#[allow(dead_code)]
fn _assert_send_sync() {
    fn is<T: Send + Sync>() {}
    is::<Cache>();
    is::<PoolInner>();
}
