//! Statistics (GET_STATS for a pool, a VM, the host) and the invariant check of the whole cache.
//!
//! Counters are read under each pool shard's lock in turn (a pool's are the sum of its shards'), so a
//! snapshot satisfies the identity per pool, but is not one instant across shards or pools. Effective entitlements (`policy::effective`) are computed from the tree on each call.
//! `check_invariants` verifies every pool and that each store's reservation equals the pages indexed in it
//! (frames in use and de-duplication references when pages share frames).

use super::{Cache, Shared, Tree, VmNode};
use crate::error::CacheError;
use crate::policy::effective::{self, Effective, VmUse};
use crate::pool::Pool;
use crate::stats::{HostStats, PoolStats, StoreStatus, TableSizes, VmStats};
use crate::types::{PoolId, StoreKind, VmId};
use std::sync::atomic::Ordering;

impl Cache {
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

    /// Sizes of the tables keyed by a VM or a pool (issue 35: they must shrink when their VMs and
    /// pools go).
    pub fn table_sizes(&self) -> TableSizes {
        let (vms, pools) = {
            let tree = self.shared.tree.read();
            (tree.vms.len(), tree.pool_count)
        };
        let (mut entries, mut capacity) = (0, 0);
        for shard in &self.shared.pools {
            let t = shard.read();
            entries += t.len();
            capacity += t.capacity();
        }
        TableSizes {
            vms,
            pools,
            pool_table_entries: entries,
            pool_table_capacity: capacity,
            pool_objects_alive: self.shared.pools_alive.load(Ordering::Relaxed),
            pins: self.shared.coop.pins_held() as usize,
        }
    }

    pub fn host_stats(&self) -> HostStats {
        let tree = self.shared.tree.read();
        let settings = self.shared.evictor.settings.read().clone();
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
        let (remote_dedups, group_dedup_hits, group_bytes_saved) = self.shared.coop.counters();
        HostStats {
            page_size: self.shared.page_size,
            mode: settings.mode,
            eviction_batch_pages: settings.batch_pages,
            stores: StoreKind::ALL
                .iter()
                .map(|&s| StoreStatus {
                    kind: s,
                    configured: s == StoreKind::Mem || self.shared.place.ssd.is_some(),
                    capacity_pages: self.capacity_pages(s),
                    used_pages: self.shared.place.stores[s.idx()].used(),
                })
                .collect(),
            vms,
            totals,
            pins_held: self.pins_held(),
            remote_dedups,
            group_dedup_hits,
            group_bytes_saved,
        }
    }

    /// The SSD store's I/O counters, if there is one.
    pub fn ssd_io_stats(&self) -> Option<crate::store::ssd::SsdIoStats> {
        self.shared.place.ssd.as_ref().map(|s| s.io_stats())
    }

    /// Checks the SPEC section 5 identity of every pool, of every VM's totals and of the host's totals,
    /// added up as [`Cache::host_stats`] adds them (destroyed pools and removed VMs included), without
    /// what `host_stats` also does: effective entitlements and allocations. The model test and the
    /// `engine_model` fuzz target check the identity after every operation, where `host_stats` cost
    /// half of the time (and, under the address sanitizer's quarantine, a page fault per few
    /// allocations). Returns which identity is broken. Takes every pool's lock in turn.
    pub fn check_identity(&self) -> Result<(), String> {
        let tree = self.shared.tree.read();
        let mut host = tree.retired;
        for (vm, node) in &tree.vms {
            let mut totals = node.retired;
            for p in node.pools.values() {
                let c = p.counters();
                if !c.identity_holds() {
                    return Err(format!("identity broken for pool {} of {vm:?}: {c:?}", p.id));
                }
                totals.add(&c);
            }
            if !totals.identity_holds() {
                return Err(format!("identity broken for {vm:?}: {totals:?}"));
            }
            host.add(&totals);
        }
        if !host.identity_holds() {
            return Err(format!("identity broken for the host: {host:?}"));
        }
        Ok(())
    }

    /// Verifies every pool's invariants and the store reservations (tests; takes every lock in turn).
    pub fn check_invariants(&self) -> Result<(), String> {
        let tree = self.shared.tree.read();
        let mut per_store = [0u64; 2];
        for node in tree.vms.values() {
            for p in node.pools.values() {
                for i in 0..p.shard_count() {
                    let g = p.lock_shard(i);
                    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| g.check()))
                        .map_err(|_| format!("pool {} failed its invariant check in shard {i}", p.id))?;
                    for s in StoreKind::ALL {
                        per_store[s.idx()] += g.counters.store(s).used;
                    }
                }
            }
        }
        for s in StoreKind::ALL {
            let reserved = self.shared.place.stores[s.idx()].used();
            if s == StoreKind::Mem && (self.shared.place.dedup.is_some() || self.shared.place.compress) {
                // Reservations count whole frames; pools count pages, which may share a frame (equal
                // content) or half of one (compressed).
                let frames = self.shared.place.mem.frames_in_use();
                if reserved != frames {
                    return Err(format!("mem: reserved {reserved} != frames in use {frames}"));
                }
                if let Some(idx) = &self.shared.place.dedup {
                    let pins = self.shared.coop.pins_held();
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
}

impl Shared {
    // --------------------------------------------------------------------------------------------
    // Statistics
    // --------------------------------------------------------------------------------------------

    /// Effective entitlements of every VM and pool, per store (`policy::effective`), from the tree's
    /// use and static entitlements now. Called with the tree locked (read); O(pools).
    fn effective(&self, tree: &Tree) -> [Effective; 2] {
        let batch = self.evictor.settings.read().batch_pages;
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
        let mut counters = p.counters();
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
            label: p.label.lock().as_deref().map(str::to_string),
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

#[cfg(test)]
mod tests {
    use crate::config::{Maintenance, MemStoreConfig};
    use crate::{Cache, EngineConfig, Key, PoolOptions, Spec, VmId, VmWeights};

    /// `check_identity` agrees with the identity `host_stats` reports, and names a broken one: a pool's
    /// (its own counters), and then its VM's and the host's (sums of them).
    #[test]
    fn check_identity_names_a_broken_pool_vm_and_host() {
        let cfg = EngineConfig {
            page_size_bytes: 512,
            mem: MemStoreConfig { capacity_bytes: 64 * 512, ..Default::default() },
            ssd: None,
            maintenance: Maintenance::Inline,
            ..Default::default()
        };
        let cache = Cache::new(cfg).unwrap();
        cache.add_vm(VmId(1), VmWeights::equal(1)).unwrap();
        let a = cache.new_pool(VmId(1), PoolOptions::ephemeral(Spec::Mem { weight: 1 })).unwrap();
        let b = cache.new_pool(VmId(1), PoolOptions::ephemeral(Spec::Mem { weight: 1 })).unwrap();
        for i in 0..8 {
            cache.put(VmId(1), a, Key::new(0, i), &[i as u8; 512]).unwrap();
        }
        cache.destroy_pool(VmId(1), b).unwrap();
        cache.check_identity().unwrap();
        assert!(cache.host_stats().totals.identity_holds());

        // One page too many in pool a's counters: a, then VM 1, then the host break with it.
        cache.shared.pool(VmId(1), a).unwrap().lock_shard(0).counters.mem.used += 1;
        let e = cache.check_identity().unwrap_err();
        assert!(e.contains(&format!("pool {a}")), "{e}");
        assert!(!cache.host_stats().vms[0].pools[0].counters.identity_holds());
        // Balanced again by a put; then the VM's destroyed pools (its `retired` counters) break the VM's
        // totals, and the removed VMs' break the host's.
        cache.shared.pool(VmId(1), a).unwrap().lock_shard(0).counters.mem.puts += 1;
        cache.check_identity().unwrap();
        cache.shared.tree.write().vms.get_mut(&VmId(1)).unwrap().retired.mem.used += 1;
        let e = cache.check_identity().unwrap_err();
        assert!(e.contains("VmId(1)"), "{e}");
        assert!(!cache.host_stats().vms[0].totals.identity_holds());
        cache.shared.tree.write().vms.get_mut(&VmId(1)).unwrap().retired.mem.used -= 1;
        cache.shared.tree.write().retired.mem.used += 1;
        let e = cache.check_identity().unwrap_err();
        assert!(e.contains("the host"), "{e}");
        assert!(!cache.host_stats().totals.identity_holds());
    }
}
