//! Eviction: reserving a page in a store and, when it is full, evicting one batch from the victim that
//! Algorithm 1 chooses (VM first, then pool; `policy::victim`) or, in global mode, from the pool whose
//! oldest page is the oldest of all. Owns [`Evictor`], the evictor's part of the engine's state.
//!
//! Lock order: the tree (read) -> the store's eviction lock -> one pool shard's mutex at a time. The eviction lock
//! serialises evictions from one store so that concurrent puts do not evict several batches for one page.
//! Persistent pages are never evicted; a persistent pool may push others out only while its VM is under its
//! entitlement. Evicted memory pages of the co-operative group are offered to the remote sink (`coop`)
//! instead of being freed at once.

use super::{Settings, Shared, Tree};
use crate::config::{EngineConfig, Maintenance};
use crate::policy::{select_victim, EntityUsage};
use crate::pool::{Entry, Loc, Pool};
use crate::types::{Mode, PoolId, PoolKind, StoreKind, VmId};
use crossbeam_utils::CachePadded;
use parking_lot::{Condvar, Mutex, RwLock};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// The evictor's state: Algorithm 1's settings (mode, batch; the hybrid watermarks), the insertion
/// sequence that global mode evicts by, and the signals of the maintenance worker (`tiers.rs`).
pub(super) struct Evictor {
    pub(super) maintenance: Maintenance,
    pub(super) maintenance_interval: Duration,
    pub(super) settings: RwLock<Settings>,
    /// Insertion sequence (global-mode FIFO order); threads take it in blocks, see [`Shared::next_seq`].
    pub(super) seq: CachePadded<AtomicU64>,
    pub(super) wake: (Mutex<bool>, Condvar),
    pub(super) shutdown: AtomicBool,
    /// Held for the whole of a maintenance pass (`Shared::maintain_all_until_idle`), so that
    /// `Cache::quiesce` waits for a pass of the background worker already under way: a move the worker
    /// has reserved room for is in flight until its pass ends. First in the lock order.
    pub(super) pass: Mutex<()>,
}

impl Evictor {
    pub(super) fn new(cfg: &EngineConfig) -> Evictor {
        Evictor {
            maintenance: cfg.maintenance,
            maintenance_interval: Duration::from_millis(cfg.maintenance_interval_ms),
            settings: RwLock::new(Settings {
                mode: cfg.mode,
                batch_pages: cfg.pages(cfg.eviction_batch_bytes),
                hybrid: cfg.hybrid.clone(),
            }),
            seq: CachePadded::new(AtomicU64::new(1)),
            wake: (Mutex::new(false), Condvar::new()),
            shutdown: AtomicBool::new(false),
            pass: Mutex::new(()),
        }
    }
}

impl Shared {
    /// Reserves one page in `store` for a put into `p`, evicting a batch when the store is full.
    pub(super) fn reserve(&self, store: StoreKind, p: &Pool) -> bool {
        let st = &self.place.stores[store.idx()];
        if st.try_reserve(1) {
            return true;
        }
        loop {
            let tree = self.tree.read();
            let _evicting = crate::lockprof::acquire(
                crate::lockprof::LockClass::EvictLock,
                || st.evict_lock.try_lock(),
                || st.evict_lock.lock(),
            );
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
            let s = self.evictor.settings.read();
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
                let Some(seq) = p.oldest_seq(store) else { continue };
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

    /// Evicts up to `n` pages of `store` from one pool (in the pool's order; a sharded pool's batch is
    /// split over its shards by `Pool::quotas`), stopping early in each shard at a page younger than
    /// `until_seq` (global mode). Returns how many were evicted.
    pub(super) fn evict_from_pool(
        &self,
        p: &Arc<Pool>,
        store: StoreKind,
        n: u64,
        until_seq: Option<u64>,
    ) -> u64 {
        if p.kind == PoolKind::Persistent {
            return 0;
        }
        let mut locs = Vec::new();
        // Memory pages offered for remotification: (key, token, frame).
        let mut offers = Vec::new();
        let offering = self.coop.offering(p, store);
        for (shard, quota) in p.quotas(store, n) {
            let mut g = p.lock_shard(shard);
            let mut taken = 0;
            while taken < quota {
                if let Some(limit) = until_seq {
                    let oldest = g.oldest_seq(store);
                    // Always take at least one page so global eviction makes progress.
                    if !(locs.is_empty() && offers.is_empty()) && oldest.is_none_or(|s| s > limit) {
                        break;
                    }
                }
                match (g.pop_victim(store), &offering) {
                    (Some(Entry { loc: Loc::Mem(f), key, .. }), Some(o))
                        if g.pending_remote < o.max_pending_per_shard =>
                    {
                        let token = o.token();
                        g.set_pending(key, token);
                        offers.push((key, token, f));
                    }
                    (Some(Entry { loc, .. }), _) => locs.push(loc),
                    (None, _) => break,
                }
                taken += 1;
            }
            p.publish(&g);
        }
        self.coop.release_remote(p);
        let evicted = (locs.len() + offers.len()) as u64;
        self.place.free_locs(&locs);
        if let Some(o) = offering {
            self.offer_evicted(p, o.sink, offers);
        }
        evicted
    }

    /// Evicts until the store's reservation fits its capacity (after a shrink).
    pub(super) fn shrink_to_capacity(&self, store: StoreKind) {
        let st = &self.place.stores[store.idx()];
        loop {
            let tree = self.tree.read();
            let _evicting = st.evict_lock.lock();
            st.drain_credit();
            if st.reserved.load(Ordering::Relaxed) <= st.capacity.load(Ordering::Relaxed) {
                return;
            }
            if self.evict_batch(&tree, store) == 0 {
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::config::{Maintenance, MemStoreConfig};
    use crate::{Cache, EngineConfig, Key, PoolOptions, Spec, VmId, VmWeights};
    use std::sync::atomic::Ordering;

    fn cache(pages: u64) -> Cache {
        let cfg = EngineConfig {
            page_size_bytes: 512,
            mem: MemStoreConfig { capacity_bytes: pages * 512, ..Default::default() },
            ssd: None,
            maintenance: Maintenance::Inline,
            ..Default::default()
        };
        let cache = Cache::new(cfg).unwrap();
        cache.add_vm(VmId(1), VmWeights::equal(1)).unwrap();
        cache
    }

    /// Issue 28, item 3: every put added one to the store's reservation counter and every get (and
    /// free) took one off, so all threads of a host wrote one cache line on every operation. Now a
    /// thread reserves from its own stripe's credit and the shared counter moves once per block: in a
    /// steady put-get loop of one thread it does not move at all.
    #[test]
    fn regression_every_put_and_get_wrote_the_store_wide_reservation() {
        let cache = cache(1024);
        let pool = cache.new_pool(VmId(1), PoolOptions::ephemeral(Spec::Mem { weight: 1 })).unwrap();
        let reserved = || cache.shared.place.stores[0].reserved.load(Ordering::Relaxed);
        let mut out = [0u8; 512];
        // Warm up: the thread's stripe takes its credit.
        for i in 0..4 {
            cache.put(VmId(1), pool, Key::new(0, i), &[1; 512]).unwrap();
            assert!(cache.get(VmId(1), pool, Key::new(0, i), &mut out).unwrap());
        }
        let before = reserved();
        for i in 0..1000 {
            cache.put(VmId(1), pool, Key::new(1, i), &[2; 512]).unwrap();
            assert_eq!(reserved(), before, "put {i} wrote the shared reservation");
            assert!(cache.get(VmId(1), pool, Key::new(1, i), &mut out).unwrap());
            assert_eq!(reserved(), before, "get {i} wrote the shared reservation");
        }
        assert_eq!(cache.host_stats().stores[0].used_pages, 0);
        cache.check_invariants().unwrap();
    }

    /// The reservation's credit is room, not use: a thread whose stripe holds freed pages as credit
    /// does not make another thread's puts evict (or be refused) while the store has room.
    #[test]
    fn credit_another_thread_holds_is_room_for_this_one() {
        const PAGES: u64 = 512;
        let cache = cache(PAGES);
        let a = cache.new_pool(VmId(1), PoolOptions::ephemeral(Spec::Mem { weight: 1 })).unwrap();
        let b = cache.new_pool(VmId(1), PoolOptions::ephemeral(Spec::Mem { weight: 1 })).unwrap();
        // Another thread puts and gets back 100 pages: its stripe keeps some of them as credit.
        std::thread::scope(|s| {
            s.spawn(|| {
                let mut out = [0u8; 512];
                for i in 0..100 {
                    cache.put(VmId(1), a, Key::new(0, i), &[1; 512]).unwrap();
                }
                for i in 0..100 {
                    assert!(cache.get(VmId(1), a, Key::new(0, i), &mut out).unwrap());
                }
            });
        });
        let held: u64 = cache.shared.place.stores[0].credit.iter().map(|c| c.load(Ordering::Relaxed)).sum();
        assert!(held > 0, "the other thread's stripe holds no credit: the test tests nothing");
        assert_eq!(cache.host_stats().stores[0].used_pages, 0);
        // This thread fills the whole store: every put is stored and nothing is evicted.
        for i in 0..PAGES {
            let r = cache.put(VmId(1), b, Key::new(1, i), &[2; 512]).unwrap();
            assert!(r.is_stored(), "put {i} of {PAGES} refused");
        }
        let st = cache.pool_stats(VmId(1), b).unwrap();
        assert_eq!((st.counters.mem.used, st.counters.mem.evictions), (PAGES, 0));
        assert_eq!(cache.host_stats().stores[0].used_pages, PAGES);
        // One more evicts exactly as a full store does.
        assert!(cache.put(VmId(1), b, Key::new(1, PAGES), &[2; 512]).unwrap().is_stored());
        assert!(cache.pool_stats(VmId(1), b).unwrap().counters.mem.evictions > 0);
        cache.check_invariants().unwrap();
    }
}
