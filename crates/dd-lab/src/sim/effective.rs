//! Effective entitlements of the lab's samples: the static weight shares with the under-used shares
//! redistributed by weight, as Algorithm 1 of paper 002 does when it picks a victim (SPEC section 3).
//! One level's rule is the engine's (`dd_engine::policy::effective::redistribute`, which the daemon
//! reports live); this module applies it to samples, which carry no weights.
//!
//! The engine reports each pool's *static* entitlement: its weight's share of its VM's share of the
//! store. A resource-conserving cache lets a demanding container hold more than that while others leave
//! theirs unused, so a correct run can be far from its static entitlement. The effective entitlement is
//! what the container may hold once the unused shares are lent out:
//!
//! * at each level (the VMs of the store, then the containers of one VM), an entity more than two
//!   eviction batches under its share is *under-used*: its effective entitlement is what it uses, and the
//!   rest of its share (share - used) goes to a pool of unused entitlement;
//! * every other entity gets its share plus the unused pool times its weight over the sum of the weights
//!   of the entities that are not under-used;
//! * a container's share is its VM's *effective* entitlement split by the containers' weights.
//!
//! Weights are not in the samples, but they need not be: within a level the engine's static
//! entitlements are proportional to the weights (entitlement = parent x weight / sum of weights), so the
//! static entitlements serve as the weights. A container that does not use the store (static
//! entitlement 0) takes no part. The effective entitlements of a level add up to its parent's (up to
//! integer rounding).

use crate::sim::{RunResult, Sample};
use dd_engine::policy::effective::{redistribute, Share};

/// Per sample of `run` (same order), the effective entitlement in pages in the memory and the SSD store.
/// `batch_pages` is the scenario's (scaled) eviction batch.
pub fn effective_entitlements(run: &RunResult, batch_pages: u64) -> Vec<[u64; 2]> {
    let mut out = vec![[0u64; 2]; run.samples.len()];
    // Samples of one time are consecutive (one per enabled container per sampling).
    let mut start = 0;
    while start < run.samples.len() {
        let t = run.samples[start].t_s.to_bits();
        let end = start + run.samples[start..].iter().take_while(|s| s.t_s.to_bits() == t).count();
        let group: Vec<(usize, &Sample)> = (start..end).map(|i| (i, &run.samples[i])).collect();
        for store in [0usize, 1] {
            for (i, e) in one_time(run, &group, store, batch_pages) {
                out[i][store] = e;
            }
        }
        start = end;
    }
    out
}

fn used_ent(s: &Sample, store: usize) -> (u64, u64) {
    if store == 0 {
        (s.mem_used, s.mem_ent)
    } else {
        (s.ssd_used, s.ssd_ent)
    }
}

/// `(sample index, used, static entitlement)` of one container.
type CtShare = (usize, u64, u64);

/// The effective entitlements of the samples of one time, for one store: `(sample index, pages)`.
fn one_time(run: &RunResult, group: &[(usize, &Sample)], store: usize, batch: u64) -> Vec<(usize, u64)> {
    // VMs in order of first appearance, with their containers that use the store.
    let mut vms: Vec<(&str, Vec<CtShare>)> = Vec::new();
    for &(i, s) in group {
        let (used, ent) = used_ent(s, store);
        if ent == 0 {
            continue;
        }
        let vm = run.containers[s.ct].1.as_str();
        match vms.iter_mut().find(|(n, _)| *n == vm) {
            Some((_, cts)) => cts.push((i, used, ent)),
            None => vms.push((vm, vec![(i, used, ent)])),
        }
    }
    let level1: Vec<Share> = vms
        .iter()
        .map(|(_, cts)| {
            let used: u64 = cts.iter().map(|c| c.1).sum();
            let ent: u64 = cts.iter().map(|c| c.2).sum();
            Share { used, share: ent, weight: ent }
        })
        .collect();
    let vm_eff = redistribute(&level1, batch);
    let mut out = Vec::new();
    for ((_, cts), vm_eff) in vms.iter().zip(vm_eff) {
        let sum_w: u64 = cts.iter().map(|c| c.2).sum();
        // Each container's share of its VM's effective entitlement, by weight (static entitlement).
        let level2: Vec<Share> = cts
            .iter()
            .map(|&(_, used, w)| Share {
                used,
                share: (vm_eff as u128 * w as u128 / sum_w.max(1) as u128) as u64,
                weight: w,
            })
            .collect();
        for (c, e) in cts.iter().zip(redistribute(&level2, batch)) {
            out.push((c.0, e));
        }
    }
    out
}
