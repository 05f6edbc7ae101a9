//! The VM-level memory controller of thesis 000, chapter 4, in the emulated guest: the VM-wide reclaim
//! that asks `dd_memctl::decide` what to take. (Its settings are `crate::scenario::memctl`; its checks
//! `crate::scenario::checks` (`mem_ratio`, `exceed_gap`, `reclaim_mode`, `protected`); its plots `crate::results::plot::memory`.)
//!
//! Owns [`GuestMemctl`] (a VM's `[vms.memctl]` table resolved to memcg indices and pages, held by a
//! [`Guest`]; `VmMemctl::resolve` builds it) and [`reclaim`], which replaces the guest's built-in
//! soft-limit/global-LRU victim choice when a VM has a controller. The decision itself is never
//! re-implemented here: every VM-wide reclaim request builds a `ContainerSnapshot` per memcg from the
//! guest model and carries out the one `Action` `decide` returns.
//!
//! Request size: under `linux-default` a request is the guest's reclaim batch, so the policy reproduces
//! the built-in soft-limit reclaim page for page (a test holds the two equal). Under the proportional
//! policies a request is one chunk (`chunk_cap_mib`), as the thesis's modified kswapd path asks the
//! victim for up to 50 MB per soft-reclaim request; the victim gives at most its exceed, so the memory
//! freed beyond what the allocation needed is headroom that every container then allocates from.
//!
//! Invariants: a memcg with no pages is left out of the snapshot (it has nothing to give and no share to
//! defend, e.g. a container not started yet); a container never gives below its floor; all arithmetic on
//! sizes is in pages here and in bytes inside `decide`.

use super::{Evicted, Guest};
use crate::scenario::memctl::VmMemctl;
use crate::scenario::{mib_pages, PAGE};
use dd_memctl::{decide, Action, Class, ContainerSnapshot, DecisionConfig, Policy, Reason};

impl VmMemctl {
    /// The guest-side form for a VM whose memcgs are its containers in order.
    pub fn resolve(&self, containers: &[&str]) -> GuestMemctl {
        let get = |n: &str| self.containers.get(n);
        GuestMemctl {
            cfg: DecisionConfig {
                policy: self.policy,
                chunk_cap_bytes: (mib_pages(self.chunk_cap_mib).max(1)) * PAGE,
            },
            weight: containers.iter().map(|n| get(n).map_or(1, |c| c.weight)).collect(),
            class: containers.iter().map(|n| get(n).map_or(Class::Silver, |c| c.class)).collect(),
            floor: containers.iter().map(|n| get(n).map_or(0, |c| mib_pages(c.floor_mib))).collect(),
        }
    }
}

/// A VM's controller as the guest applies it; vectors are indexed by memcg.
#[derive(Debug, Clone, PartialEq)]
pub struct GuestMemctl {
    pub cfg: DecisionConfig,
    pub weight: Vec<u32>,
    pub class: Vec<Class>,
    /// Pages.
    pub floor: Vec<u64>,
}

/// One VM-wide reclaim request of at least `n` pages under the guest's controller (see the module doc
/// for its size). Returns the pages freed; 0 when nothing can be freed.
pub fn reclaim(g: &mut Guest, n: u64, sink: &mut dyn FnMut(Evicted)) -> u64 {
    let Some(m) = g.memctl.as_ref() else { return 0 };
    let need_pages = match m.cfg.policy {
        Policy::LinuxDefault => n,
        _ => n.max(m.cfg.chunk_cap_bytes / PAGE),
    };
    // Snapshot indices -> memcg indices.
    let idx: Vec<usize> = (0..g.cgs.len()).filter(|&i| g.cgs[i].usage > 0).collect();
    let snap: Vec<ContainerSnapshot> = idx
        .iter()
        .map(|&i| {
            let c = &g.cgs[i];
            ContainerSnapshot {
                name: String::new(),
                usage_bytes: c.usage * PAGE,
                weight: m.weight.get(i).copied().unwrap_or(1),
                class: m.class.get(i).copied().unwrap_or_default(),
                soft_limit_bytes: c.soft.saturating_mul(PAGE),
                reclaimable_bytes: c.usage.saturating_sub(m.floor.get(i).copied().unwrap_or(0)) * PAGE,
            }
        })
        .collect();
    match decide(&snap, need_pages * PAGE, &m.cfg) {
        Action::Reclaim { index, bytes, reason } => {
            let cg = idx[index];
            // At least one page: an exceed under a page still names the victim.
            let freed = g.reclaim_memcg(cg, bytes.div_ceil(PAGE).max(1), true, sink);
            let c = &mut g.cgs[cg].counters;
            match reason {
                Reason::SoftLimitExceed | Reason::ProportionalExceed => c.reclaimed_directed += freed,
            }
            freed
        }
        Action::Lru { members, bytes } => {
            let members: Vec<usize> = members.iter().map(|&i| idx[i]).collect();
            let floors: Vec<u64> = members.iter().map(|&i| m.floor.get(i).copied().unwrap_or(0)).collect();
            let mut freed = 0;
            let want = bytes.div_ceil(PAGE).max(1);
            // The LRU of the members together, a batch at a time from the one with the oldest page,
            // never below a floor.
            while freed < want {
                let eligible: Vec<usize> = members
                    .iter()
                    .zip(&floors)
                    .filter(|(&i, &f)| g.cgs[i].usage > f)
                    .map(|(&i, _)| i)
                    .collect();
                let Some(cg) = g.oldest_memcg(eligible.iter().copied()) else { break };
                let room = g.cgs[cg].usage - floors[members.iter().position(|&i| i == cg).unwrap_or(0)];
                let got = g.reclaim_memcg(cg, (want - freed).min(g.batch()).min(room), true, sink);
                if got == 0 {
                    break;
                }
                g.cgs[cg].counters.reclaimed_lru += got;
                freed += got;
            }
            freed
        }
        Action::None => 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::guest::key;
    use crate::scenario::LruMode;
    use rand::{Rng, SeedableRng};

    fn ctl(policy: Policy, chunk_pages: u64, weight: &[u32], class: &[Class], floor: &[u64]) -> GuestMemctl {
        GuestMemctl {
            cfg: DecisionConfig { policy, chunk_cap_bytes: chunk_pages * PAGE },
            weight: weight.to_vec(),
            class: class.to_vec(),
            floor: floor.to_vec(),
        }
    }

    /// Fills a guest of `limit` pages with random inserts into memcgs with the given soft limits, and
    /// returns the sequence of evictions.
    fn churn(memctl: Option<GuestMemctl>, seed: u64) -> Vec<Evicted> {
        let mut g = Guest::new(300, LruMode::TwoList, 8);
        for soft in [60, 100, u64::MAX] {
            g.add_memcg(1000, soft);
        }
        g.memctl = memctl;
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
        let mut ev = Vec::new();
        for i in 0..3000u32 {
            let cg = rng.gen_range(0..3usize);
            let k = key(cg as u32 + 1, rng.gen_range(0..400));
            if !g.access(cg, k, false) {
                g.insert(cg, k, false, i % 3 == 0, &mut |e| ev.push(e));
            }
        }
        g.set_limit(200, &mut |e| ev.push(e));
        g.check_invariants().unwrap();
        ev
    }

    #[test]
    fn linux_default_through_decide_is_the_built_in_reclaim_page_for_page() {
        for seed in 0..4 {
            let builtin = churn(None, seed);
            let s = [Class::Silver; 3];
            let via = churn(Some(ctl(Policy::LinuxDefault, 12800, &[1, 1, 1], &s, &[0, 0, 0])), seed);
            assert!(builtin.len() > 1000);
            assert_eq!(builtin, via, "seed {seed}");
        }
    }

    fn filled(memctl: GuestMemctl, usage: &[u64]) -> Guest {
        let mut g = Guest::new(usage.iter().sum(), LruMode::TwoList, 32);
        for _ in usage {
            g.add_memcg(u64::MAX, u64::MAX);
        }
        g.memctl = Some(memctl);
        let mut none = |_: Evicted| panic!("no eviction while filling");
        for (cg, &n) in usage.iter().enumerate() {
            for i in 0..n {
                g.insert(cg, key(cg as u32 + 1, i as u32), false, false, &mut none);
            }
        }
        g
    }

    #[test]
    fn proportional_reclaim_brings_usage_to_the_weights() {
        // 1:2 weights but 3000 and 3000 pages: ballooning down to 4500 must take from the first only,
        // down to the 1:2 ratio (1500 : 3000).
        let s = [Class::Silver; 2];
        let mut g = filled(ctl(Policy::Proportional, 256, &[1, 2], &s, &[0, 0]), &[3000, 3000]);
        g.set_limit(4500, &mut |_| {});
        assert_eq!(g.cgs[1].usage, 3000, "the under-share container gives nothing");
        assert_eq!(g.cgs[0].usage, 1500);
        // Further down, both give in ratio.
        g.set_limit(3000, &mut |_| {});
        // The last request is a whole chunk (256 pages) bounded by the victim's exceed, so the ratio is
        // kept to within a chunk's share of the total.
        let r = g.cgs[1].usage as f64 / g.cgs[0].usage as f64;
        assert!((r - 2.0).abs() < 0.05, "ratio {r}");
        assert!(g.used <= 3000 && g.used > 3000 - 256);
        assert!(g.cgs[0].counters.reclaimed_directed > 0 && g.cgs[1].counters.reclaimed_directed > 0);
        g.check_invariants().unwrap();
    }

    #[test]
    fn classes_spare_gold_until_the_others_reach_their_floor() {
        let c = [Class::Gold, Class::Silver, Class::Silver];
        let mut g = filled(
            ctl(Policy::ProportionalClasses, 256, &[1000, 1, 1], &c, &[0, 200, 300]),
            &[1000, 1000, 1000],
        );
        g.set_limit(1600, &mut |_| {});
        assert_eq!(g.cgs[0].usage, 1000, "gold untouched while silver can give");
        assert!(g.cgs[1].usage >= 200 && g.cgs[2].usage >= 300, "floors hold");
        assert!(g.cgs[1].usage + g.cgs[2].usage <= 600);
        g.set_limit(1300, &mut |_| {});
        assert_eq!((g.cgs[1].usage, g.cgs[2].usage), (200, 300), "silver down to the floors first");
        assert!((800 - 256..=800).contains(&g.cgs[0].usage), "then gold gives: {}", g.cgs[0].usage);
        g.check_invariants().unwrap();
    }

    #[test]
    fn a_proportional_request_is_one_chunk_bounded_by_the_exceed() {
        let s = [Class::Silver; 2];
        // Exceed of the first: 3000 - 6000/3 = 1000 pages; the chunk (256) bounds the request.
        let mut g = filled(ctl(Policy::Proportional, 256, &[1, 2], &s, &[0, 0]), &[3000, 3000]);
        assert_eq!(reclaim(&mut g, 32, &mut |_| {}), 256);
        // With a chunk larger than the exceed, the exceed bounds it.
        let mut g = filled(ctl(Policy::Proportional, 5000, &[1, 2], &s, &[0, 0]), &[3000, 3000]);
        assert_eq!(reclaim(&mut g, 32, &mut |_| {}), 1000);
        assert_eq!(g.cgs[1].usage, 3000);
    }
}
