//! Exact statistics: the counters of a pool, a VM and the host, as the engine keeps them and as the
//! data plane's POOL_STATS and VM_STATS and the admin API carry them (JSON).
//!
//! Counters are plain integers updated under the owning pool's lock, in the same critical section that
//! changes the index, so at any quiescent moment they satisfy, per pool and store (SPEC section 5):
//!
//! ```text
//! used = puts + moved_in - (exclusive_gets + flushes + evictions + moved_out)
//! ```
//!
//! How each event is charged:
//! * a put that replaces a page counts one put for the new page and one flush for the old one;
//! * `destroy_pool` counts every page it frees as a flush, then folds the pool's counters into its VM's
//!   "retired" counters so VM and host aggregates keep satisfying the identity;
//! * a migration counts `moved_out` on the source and `moved_in` on the target (same store);
//! * a demotion counts `moved_out` on the memory store and `moved_in` on the SSD store of the same pool
//!   (a promotion the reverse), plus the pool-level `demotions` / `promotions`;
//! * a page lost to an SSD read error counts as an eviction (the cache dropped it) and the get as a miss,
//!   and in the pool's `pages_lost`.

use crate::types::StoreKind;
use serde::{Deserialize, Serialize};

/// Counters of one pool (or an aggregate) in one store. Sizes are in pages.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoreCounters {
    /// Pages stored by puts.
    pub puts: u64,
    /// Gets served from this store.
    pub gets_hit: u64,
    /// Of those, gets that removed the page (exclusive caching).
    pub exclusive_gets: u64,
    pub flushes: u64,
    pub evictions: u64,
    pub moved_in: u64,
    pub moved_out: u64,
    /// Pages held now.
    pub used: u64,
    /// Static entitlement in pages: the weight share (for aggregates: the aggregate's own entitlement,
    /// not a sum).
    pub entitlement: u64,
    /// Effective entitlement in pages: the static one with the shares that under-used VMs or pools
    /// leave unused lent to the others by weight (`policy::effective`), what the entity may hold now
    /// without being a victim of Algorithm 1. Like `entitlement`, the aggregate's own, not a sum.
    #[serde(default)]
    pub effective_entitlement: u64,
    /// Puts whose content matched an existing frame (de-duplication).
    pub dedup_hits: u64,
    /// Bytes not stored thanks to de-duplication and compression.
    pub bytes_saved: u64,
}

impl StoreCounters {
    /// `puts + moved_in - (exclusive_gets + flushes + evictions + moved_out)`, the used count the
    /// event counters imply.
    pub fn implied_used(&self) -> i128 {
        self.puts as i128 + self.moved_in as i128
            - (self.exclusive_gets as i128
                + self.flushes as i128
                + self.evictions as i128
                + self.moved_out as i128)
    }

    /// Whether the SPEC section 5 identity holds.
    pub fn identity_holds(&self) -> bool {
        self.implied_used() == self.used as i128
    }

    fn add(&mut self, o: &StoreCounters) {
        self.puts += o.puts;
        self.gets_hit += o.gets_hit;
        self.exclusive_gets += o.exclusive_gets;
        self.flushes += o.flushes;
        self.evictions += o.evictions;
        self.moved_in += o.moved_in;
        self.moved_out += o.moved_out;
        self.used += o.used;
        self.dedup_hits += o.dedup_hits;
        self.bytes_saved += o.bytes_saved;
    }
}

/// Counters of a pool, or an aggregate of pools.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Counters {
    pub mem: StoreCounters,
    pub ssd: StoreCounters,
    /// Gets that found nothing (neither locally nor, for a remotified page, on its peer).
    pub gets_missed: u64,
    /// Puts not stored (pressure, spec `none`, persistent pool full).
    pub puts_refused: u64,
    pub migrations_in: u64,
    pub migrations_out: u64,
    /// Pages moved memory -> SSD.
    pub demotions: u64,
    /// Pages moved SSD -> memory.
    pub promotions: u64,
    /// Evicted pages a peer confirmed holding and pinned (co-operative de-duplication, thesis 004
    /// section 5.2.5): the entry now points at the peer.
    #[serde(default)]
    pub remotified: u64,
    /// Remotified pages held now (no local memory).
    #[serde(default)]
    pub remote_pages: u64,
    /// Local misses served by fetching a remotified page from its peer.
    #[serde(default)]
    pub remote_gets_hit: u64,
    /// Remotified gets that failed (peer dead, restarted, timed out, page dropped or wrong hash).
    #[serde(default)]
    pub remote_gets_missed: u64,
    /// Pages dropped because the SSD could not give them back (a read error, or a background write
    /// that had failed); each is also counted as an eviction and its get as a miss. In a persistent pool
    /// this is data the guest was promised: the count makes that loss visible, never silent.
    #[serde(default)]
    pub pages_lost: u64,
}

impl Counters {
    pub fn store(&self, s: StoreKind) -> &StoreCounters {
        match s {
            StoreKind::Mem => &self.mem,
            StoreKind::Ssd => &self.ssd,
        }
    }
    pub fn store_mut(&mut self, s: StoreKind) -> &mut StoreCounters {
        match s {
            StoreKind::Mem => &mut self.mem,
            StoreKind::Ssd => &mut self.ssd,
        }
    }
    pub fn identity_holds(&self) -> bool {
        self.mem.identity_holds() && self.ssd.identity_holds()
    }
    pub fn used_total(&self) -> u64 {
        self.mem.used + self.ssd.used
    }
    /// Adds `o` into `self` (entitlements are not summed).
    pub fn add(&mut self, o: &Counters) {
        self.mem.add(&o.mem);
        self.ssd.add(&o.ssd);
        self.gets_missed += o.gets_missed;
        self.puts_refused += o.puts_refused;
        self.migrations_in += o.migrations_in;
        self.migrations_out += o.migrations_out;
        self.demotions += o.demotions;
        self.promotions += o.promotions;
        self.remotified += o.remotified;
        self.remote_pages += o.remote_pages;
        self.remote_gets_hit += o.remote_gets_hit;
        self.remote_gets_missed += o.remote_gets_missed;
        self.pages_lost += o.pages_lost;
    }
}

/// A pool's statistics.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PoolStats {
    pub pool: crate::types::PoolId,
    pub vm: crate::types::VmId,
    pub kind: crate::types::PoolKind,
    pub spec: crate::types::Spec,
    pub order: crate::types::EvictionOrder,
    pub exclusive_gets: bool,
    pub counters: Counters,
    /// The name the guest gave the pool (`Cache::set_pool_label`: the watcher's container name).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub label: Option<String>,
}

/// A VM's statistics: its live pools, and totals over live and destroyed pools.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct VmStats {
    pub vm: crate::types::VmId,
    pub weights: crate::types::VmWeights,
    pub pools: Vec<PoolStats>,
    pub totals: Counters,
    /// Live pools left out of `pools` because the answer would not fit the data plane's frame limit
    /// (the daemon's VM_STATS); 0 when every pool is listed. `totals` always covers every pool.
    #[serde(default)]
    pub pools_omitted: u64,
}

/// One store's state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoreStatus {
    pub kind: StoreKind,
    pub configured: bool,
    pub capacity_pages: u64,
    /// Pages reserved (held or being stored).
    pub used_pages: u64,
}

/// The whole host.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HostStats {
    pub page_size: usize,
    pub mode: crate::types::Mode,
    pub eviction_batch_pages: u64,
    pub stores: Vec<StoreStatus>,
    pub vms: Vec<VmStats>,
    pub totals: Counters,
    /// Pins this host holds for peers now (co-operative de-duplication).
    #[serde(default)]
    pub pins_held: u64,
    /// Remote de-duplications: pins ever granted to peers (remote compares that matched).
    #[serde(default)]
    pub remote_dedups: u64,
    /// De-dup hits of pages in de-duplication groups, and the bytes they saved: host scope only (they
    /// are not in any pool's counters, which must not reveal a match with another VM's content).
    #[serde(default)]
    pub group_dedup_hits: u64,
    #[serde(default)]
    pub group_bytes_saved: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identity_arithmetic() {
        let c = StoreCounters {
            puts: 10,
            moved_in: 3,
            exclusive_gets: 4,
            flushes: 2,
            evictions: 1,
            moved_out: 2,
            used: 4,
            ..Default::default()
        };
        assert!(c.identity_holds());
        let mut bad = c;
        bad.used = 5;
        assert!(!bad.identity_holds());
    }
}
