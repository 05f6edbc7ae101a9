//! Entitlements, computed top-down (SPEC section 3).
//!
//! `entitlement(entity, store) = entitlement(parent, store) * weight / sum of the weights of the siblings
//! that use that store`, with the host's entitlement being the store's capacity. A VM "uses" a store when
//! its weight there is non-zero and at least one of its pools' specs places pages in that store; a pool
//! uses a store when its spec does. Integer division rounds down, so entitlements never sum to more than
//! the capacity.

use crate::types::{PoolId, Spec, StoreKind, VmId, VmWeights};
use std::collections::BTreeMap;

/// Input for one VM.
#[derive(Debug, Clone)]
pub struct VmShape {
    pub weights: VmWeights,
    /// The specs of the VM's pools.
    pub pools: Vec<(PoolId, Spec)>,
}

/// Output: per-store entitlements in pages.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Entitlements {
    pub vm: BTreeMap<VmId, [u64; 2]>,
    /// By (VM, pool): pool ids are numbered per VM.
    pub pool: BTreeMap<(VmId, PoolId), [u64; 2]>,
}

fn vm_uses(shape: &VmShape, store: StoreKind) -> bool {
    shape.weights.get(store) > 0 && shape.pools.iter().any(|(_, s)| s.uses(store) && s.weight(store) > 0)
}

/// Computes every VM's and pool's entitlement for the given store capacities (pages).
pub fn compute(capacity: [u64; 2], vms: &BTreeMap<VmId, VmShape>) -> Entitlements {
    let mut out = Entitlements::default();
    for (vm, shape) in vms {
        out.vm.insert(*vm, [0, 0]);
        for (pool, _) in &shape.pools {
            out.pool.insert((*vm, *pool), [0, 0]);
        }
    }
    for store in StoreKind::ALL {
        let s = store.idx();
        let vm_sum: u64 =
            vms.values().filter(|v| vm_uses(v, store)).map(|v| v.weights.get(store) as u64).sum();
        if vm_sum == 0 {
            continue;
        }
        for (vm, shape) in vms.iter().filter(|(_, v)| vm_uses(v, store)) {
            let vm_ent = (capacity[s] as u128 * shape.weights.get(store) as u128 / vm_sum as u128) as u64;
            out.vm.get_mut(vm).expect("inserted above")[s] = vm_ent;
            let pool_sum: u64 = shape.pools.iter().map(|(_, spec)| spec.weight(store) as u64).sum();
            if pool_sum == 0 {
                continue;
            }
            for (pool, spec) in &shape.pools {
                let w = spec.weight(store) as u128;
                out.pool.get_mut(&(*vm, *pool)).expect("inserted above")[s] =
                    (vm_ent as u128 * w / pool_sum as u128) as u64;
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The entitlement of pool `p` (pool ids are unique across the VMs of these tests).
    fn pe(e: &Entitlements, p: u32) -> [u64; 2] {
        *e.pool.iter().find(|((_, id), _)| *id == PoolId(p)).expect("pool").1
    }

    fn vm(mem: u32, ssd: u32, pools: &[(u32, Spec)]) -> VmShape {
        VmShape {
            weights: VmWeights { mem, ssd },
            pools: pools.iter().map(|(p, s)| (PoolId(*p), *s)).collect(),
        }
    }

    #[test]
    fn paper_figure_6_example() {
        // VM1 (33) has <SSD,100> and <Mem,100>; VM2 (67) has <Mem,1>, <Mem,3>, <SSD,100>.
        let mut vms = BTreeMap::new();
        vms.insert(VmId(1), vm(33, 33, &[(1, Spec::Ssd { weight: 100 }), (2, Spec::Mem { weight: 100 })]));
        vms.insert(
            VmId(2),
            vm(
                67,
                67,
                &[(3, Spec::Mem { weight: 1 }), (4, Spec::Mem { weight: 3 }), (5, Spec::Ssd { weight: 100 })],
            ),
        );
        let e = compute([1000, 10_000], &vms);
        assert_eq!(e.vm[&VmId(1)], [330, 3300]);
        assert_eq!(e.vm[&VmId(2)], [670, 6700]);
        assert_eq!(pe(&e, 1), [0, 3300]);
        assert_eq!(pe(&e, 2), [330, 0]);
        assert_eq!(pe(&e, 3), [167, 0]);
        assert_eq!(pe(&e, 4), [502, 0]);
        assert_eq!(pe(&e, 5), [0, 6700]);
    }

    #[test]
    fn vm_without_pools_in_a_store_gets_no_share() {
        let mut vms = BTreeMap::new();
        vms.insert(VmId(1), vm(60, 60, &[(1, Spec::Mem { weight: 1 })]));
        vms.insert(VmId(2), vm(40, 40, &[(2, Spec::Ssd { weight: 1 })]));
        let e = compute([1000, 1000], &vms);
        assert_eq!(e.vm[&VmId(1)], [1000, 0]);
        assert_eq!(e.vm[&VmId(2)], [0, 1000]);
    }

    #[test]
    fn hybrid_pools_count_in_both_stores() {
        let mut vms = BTreeMap::new();
        vms.insert(
            VmId(1),
            vm(
                1,
                1,
                &[
                    (1, Spec::Hybrid { mem_weight: 1, ssd_weight: 3 }),
                    (2, Spec::Mem { weight: 1 }),
                    (3, Spec::None),
                ],
            ),
        );
        let e = compute([100, 400], &vms);
        assert_eq!(pe(&e, 1), [50, 400]);
        assert_eq!(pe(&e, 2), [50, 0]);
        assert_eq!(pe(&e, 3), [0, 0]);
    }

    #[test]
    fn entitlements_never_exceed_capacity() {
        let mut vms = BTreeMap::new();
        for i in 0..7 {
            vms.insert(
                VmId(i),
                vm(i + 1, 3, &[(i * 10, Spec::Mem { weight: 3 }), (i * 10 + 1, Spec::Mem { weight: 7 })]),
            );
        }
        let e = compute([999_983, 0], &vms);
        let vm_total: u64 = e.vm.values().map(|v| v[0]).sum();
        let pool_total: u64 = e.pool.values().map(|v| v[0]).sum();
        assert!(vm_total <= 999_983 && vm_total > 999_983 - 7);
        assert!(pool_total <= vm_total);
    }
}
