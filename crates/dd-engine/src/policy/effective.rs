//! Effective entitlements: the static weight shares (`entitlement::compute`) with the shares that
//! under-used entities leave unused lent to the others by weight, as Algorithm 1 of paper 002 does when
//! it picks a victim (`victim::select_victim` never takes from an entity under its share, so the rest
//! may grow into what it leaves).
//!
//! * At each level (the VMs that use the store, then the pools of one VM that use it) an entity more
//!   than two eviction batches under its share is *under-used*: its effective entitlement is what it
//!   uses, and the rest of its share goes to a pool of unused entitlement.
//! * Every other entity gets its share plus the unused pool times its weight over the sum of the
//!   weights of the entities that are not under-used.
//! * A pool's share is its VM's *effective* entitlement split by the pools' weights.
//!
//! Invariant: the effective entitlements of a level add up to its parent's (up to integer rounding,
//! downwards), and an entity's effective entitlement is at least its static one unless it is under-used.
//! The engine reports both per VM and per pool (`StoreCounters::effective_entitlement`); the lab uses
//! the same [`redistribute`] on its samples.

use crate::types::{PoolId, VmId};
use std::collections::BTreeMap;

/// One entity of a level: what it uses, its (static or parent-derived) share and its weight.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Share {
    pub used: u64,
    pub share: u64,
    pub weight: u64,
}

/// One level: the effective entitlement of each entity, in order. `batch` is the eviction batch in
/// pages (the slack within which an entity counts as using its share).
pub fn redistribute(level: &[Share], batch: u64) -> Vec<u64> {
    let under = |e: &Share| e.used.saturating_add(2 * batch) < e.share;
    let unused: u64 = level.iter().filter(|e| under(e)).map(|e| e.share - e.used).sum();
    let cand_w: u64 = level.iter().filter(|e| !under(e)).map(|e| e.weight).sum();
    level
        .iter()
        .map(|e| {
            if under(e) {
                e.used
            } else {
                e.share + (unused as u128 * e.weight as u128 / cand_w.max(1) as u128) as u64
            }
        })
        .collect()
}

/// A VM as one store sees it: its weight and static entitlement there, and its pools' weights and use.
#[derive(Debug, Clone)]
pub struct VmUse {
    pub vm: VmId,
    pub weight: u64,
    pub entitlement: u64,
    /// `(pool, weight in this store, pages used in this store)`.
    pub pools: Vec<(PoolId, u64, u64)>,
}

/// Effective entitlements in one store, per VM and per pool (pages). Entities that do not use the
/// store (static entitlement or weight 0) get 0.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Effective {
    pub vm: BTreeMap<VmId, u64>,
    pub pool: BTreeMap<(VmId, PoolId), u64>,
}

/// The effective entitlements of every VM and pool in one store.
pub fn compute(vms: &[VmUse], batch: u64) -> Effective {
    let mut out = Effective::default();
    let using: Vec<&VmUse> = vms.iter().filter(|v| v.entitlement > 0 && v.weight > 0).collect();
    let level1: Vec<Share> = using
        .iter()
        .map(|v| Share { used: v.pools.iter().map(|p| p.2).sum(), share: v.entitlement, weight: v.weight })
        .collect();
    for (v, eff) in using.iter().zip(redistribute(&level1, batch)) {
        out.vm.insert(v.vm, eff);
        let pools: Vec<&(PoolId, u64, u64)> = v.pools.iter().filter(|p| p.1 > 0).collect();
        let sum_w: u64 = pools.iter().map(|p| p.1).sum();
        let level2: Vec<Share> = pools
            .iter()
            .map(|&&(_, w, used)| Share {
                used,
                share: (eff as u128 * w as u128 / sum_w.max(1) as u128) as u64,
                weight: w,
            })
            .collect();
        for (p, e) in pools.iter().zip(redistribute(&level2, batch)) {
            out.pool.insert((v.vm, p.0), e);
        }
    }
    for v in vms {
        out.vm.entry(v.vm).or_insert(0);
        for p in &v.pools {
            out.pool.entry((v.vm, p.0)).or_insert(0);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(used: u64, share: u64, weight: u64) -> Share {
        Share { used, share, weight }
    }

    #[test]
    fn an_under_used_share_goes_to_the_others_by_weight() {
        // Shares 300/300/300 (equal weights): the first uses 50, so 250 go to the other two, 125 each.
        let eff = redistribute(&[s(50, 300, 1), s(400, 300, 1), s(450, 300, 1)], 10);
        assert_eq!(eff, vec![50, 425, 425]);
        assert_eq!(eff.iter().sum::<u64>(), 900, "the level's total is kept");
        // Weights 1:3 among the candidates.
        assert_eq!(redistribute(&[s(0, 400, 4), s(500, 100, 1), s(500, 300, 3)], 10), vec![0, 200, 600]);
    }

    #[test]
    fn within_two_batches_of_its_share_an_entity_is_not_under_used() {
        assert_eq!(redistribute(&[s(281, 300, 1), s(300, 300, 1)], 10), vec![300, 300]);
        assert_eq!(redistribute(&[s(279, 300, 1), s(300, 300, 1)], 10), vec![279, 321]);
    }

    #[test]
    fn an_idle_vm_lends_its_share_to_the_busy_one_and_its_pools_split_it_by_weight() {
        // Two VMs 1:1 over 1000 pages: VM 1 idle (10 used), VM 2 full with two pools 1:3.
        let vms = [
            VmUse { vm: VmId(1), weight: 1, entitlement: 500, pools: vec![(PoolId(1), 1, 10)] },
            VmUse {
                vm: VmId(2),
                weight: 1,
                entitlement: 500,
                pools: vec![(PoolId(1), 1, 300), (PoolId(2), 3, 680), (PoolId(3), 0, 0)],
            },
            VmUse { vm: VmId(3), weight: 5, entitlement: 0, pools: vec![] },
        ];
        let e = compute(&vms, 8);
        assert_eq!(e.vm[&VmId(1)], 10);
        assert_eq!(e.vm[&VmId(2)], 990);
        assert_eq!(e.vm[&VmId(3)], 0, "a VM that does not use the store takes no part");
        // VM 2's 990 split 1:3 = 247 / 742; pool 2 uses 680, more than two batches under its 742, so it
        // has what it uses and lends the other 62 to pool 1 (which uses more than its 247).
        assert_eq!(e.pool[&(VmId(2), PoolId(1))], 309);
        assert_eq!(e.pool[&(VmId(2), PoolId(2))], 680);
        assert_eq!(e.pool[&(VmId(2), PoolId(3))], 0, "a pool of weight 0 in the store gets nothing");
        assert_eq!(e.pool[&(VmId(1), PoolId(1))], 10);
    }
}
