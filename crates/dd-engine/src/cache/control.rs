//! The control plane: the tree of VMs and pools, their weights, quotas and de-duplication groups, store
//! capacities and the eviction and hybrid settings.
//!
//! Every call here takes the tree's write lock, changes it, and recomputes the VMs' entitlements
//! (`Shared::recompute`, O(number of VMs): pools derive theirs from their VM's `VmShare` on read). Work
//! that evicts or moves pages (a shrunk capacity, a spec that drops a store, hybrid maintenance after a
//! reconfiguration) runs after the tree lock is released, in lock order. A destroyed pool leaves the pool
//! table and is marked dead under its own lock, so a racing put fails and a racing get misses; its final
//! counters go to its VM's (or the host's) `retired` counters so aggregates keep the statistics identity.

use super::{dedup_domain, shard_of, Cache, Shared, Tree, VmNode, NO_DOMAIN};
use crate::config::{EngineConfig, HybridConfig};
use crate::error::CacheError;
use crate::pool::{Departure, Loc, Pool, VmShare, MAX_WEIGHT};
use crate::stats::Counters;
use crate::types::{Mode, PoolId, PoolKind, PoolOptions, Spec, StoreKind, VmId, VmWeights};
use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;

impl Cache {
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
                share: Arc::new(VmShare {
                    pools_alive: self.shared.pools_alive.clone(),
                    ..VmShare::default()
                }),
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
        self.shared.coop.set_domain(d);
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
                if pages > self.shared.place.mem.max_frames() as u64 {
                    return Err(CacheError::invalid(
                        "mem.capacity_bytes",
                        format!(
                            "{bytes} exceeds the arena reserved at start ({} bytes; raise mem.max_capacity_bytes)",
                            self.shared.place.mem.max_frames() as u64 * self.shared.page_size as u64
                        ),
                    ));
                }
                self.shared.place.mem.set_limit(pages as u32);
            }
            StoreKind::Ssd => {
                let ssd =
                    self.shared.place.ssd.as_ref().ok_or(CacheError::StoreUnavailable(StoreKind::Ssd))?;
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
            self.shared.place.stores[store.idx()].capacity.store(pages, Ordering::Relaxed);
            self.shared.recompute(&mut tree);
        }
        self.shared.shrink_to_capacity(store);
        self.after_reconfigure();
        Ok(())
    }

    pub fn capacity_pages(&self, store: StoreKind) -> u64 {
        self.shared.place.stores[store.idx()].capacity.load(Ordering::Relaxed)
    }

    pub fn set_mode(&self, mode: Mode) {
        self.shared.evictor.settings.write().mode = mode;
    }

    /// Sets the eviction batch. At least one page.
    pub fn set_eviction_batch(&self, bytes: u64) -> Result<(), CacheError> {
        let pages = bytes / self.shared.page_size as u64;
        if pages == 0 {
            return Err(CacheError::invalid("eviction_batch_bytes", "smaller than one page"));
        }
        self.shared.evictor.settings.write().batch_pages = pages;
        Ok(())
    }

    pub fn set_hybrid(&self, hybrid: HybridConfig) -> Result<(), CacheError> {
        let probe = EngineConfig {
            hybrid: hybrid.clone(),
            page_size_bytes: self.shared.page_size,
            ..Default::default()
        };
        probe.validate()?;
        self.shared.evictor.settings.write().hybrid = hybrid;
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
        crate::config::check_shards("shards", opts.shards)?;
        let shards = if opts.shards == 0 { self.shared.pool_shards } else { opts.shards } as usize;
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
        let pool = Arc::new(Pool::new(
            id,
            vm,
            opts.kind,
            opts.spec,
            opts.order,
            exclusive,
            node.share.clone(),
            shards,
        ));
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

    /// Names a pool (the watcher gives its container's cgroup name); `None` takes the name away. The
    /// name must pass [`crate::names::name_problem`] within [`crate::names::MAX_POOL_LABEL_BYTES`].
    pub fn set_pool_label(&self, vm: VmId, pool: PoolId, label: Option<&str>) -> Result<(), CacheError> {
        if let Some(problem) =
            label.and_then(|l| crate::names::name_problem(l, crate::names::MAX_POOL_LABEL_BYTES))
        {
            return Err(CacheError::InvalidConfig { field: "label".into(), reason: problem.into() });
        }
        let p = self.shared.pool(vm, pool)?;
        *p.label.lock() = label.map(Arc::from);
        Ok(())
    }

    /// The pools of a VM.
    pub fn pools(&self, vm: VmId) -> Result<Vec<PoolId>, CacheError> {
        let tree = self.shared.tree.read();
        Ok(tree.vms.get(&vm).ok_or(CacheError::UnknownVm(vm))?.pools.keys().copied().collect())
    }
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

impl Shared {
    /// Recomputes every VM's entitlement from the tree (SPEC section 3; `policy::entitlement::compute`
    /// is the reference it must agree with). Pools derive theirs from their VM's share on read, so this
    /// costs O(number of VMs) and never walks pools. Called with the tree write-locked.
    fn recompute(&self, tree: &mut Tree) {
        for s in StoreKind::ALL {
            let i = s.idx();
            let cap = self.place.stores[i].capacity.load(Ordering::Relaxed) as u128;
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
        {
            let mut shard = self.pools[shard_of(p.vm, p.id)].write();
            shard.remove(&(p.vm, p.id));
            // A shard keeps its capacity when pools go; a burst of pools would leave it at the burst's
            // size for good. Shrunk to twice its pools once under a quarter full, so it stays within 4x
            // its pools (or 16 buckets).
            let n = shard.len();
            if shard.capacity() > 16 && n * 4 < shard.capacity() {
                shard.shrink_to(n * 2);
            }
        }
        p.destroyed.store(true, Ordering::Release);
        let (locs, counters) = {
            let mut gs = p.lock_all();
            let mut locs: Vec<Loc> = Vec::new();
            let mut counters = Counters::default();
            for g in gs.iter_mut() {
                g.dead = true;
                let ids = g.all_ids();
                locs.extend(ids.into_iter().map(|id| g.remove(id, Departure::Flush).loc));
                g.drop_all_remote();
                g.release_memory();
                p.publish(g);
                counters.add(&g.counters);
            }
            (locs, counters)
        };
        self.coop.release_remote(p);
        self.place.free_locs(&locs);
        counters
    }
}
