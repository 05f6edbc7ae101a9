//! Exact statistics: the counters' types and their identity are `dd-types`' (re-exported here, so
//! `dd_engine::stats::Counters` keeps its path); the engine's own table sizes stay here.
//!
//! Counters are updated under the owning pool's lock, in the same critical section that changes the
//! index, so at any quiescent moment the SPEC section 5 identity holds (`dd_types::stats`).

use serde::{Deserialize, Serialize};

pub use dd_types::stats::{Counters, HostStats, PoolStats, StoreCounters, StoreStatus, VmStats};

/// Sizes of the engine's tables keyed by a VM or a pool ([`crate::Cache::table_sizes`]). Each comes
/// back to its value before once the VMs and pools created since are gone; `pool_objects_alive` may
/// stay above `pools` by at most one destroyed pool per thread that used the cache (the pool a thread
/// used last stays in its slot until its next call; its bookkeeping is freed at the destroy, so it is
/// a few hundred bytes).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct TableSizes {
    /// VMs in the tree.
    pub vms: usize,
    /// Pools in the tree.
    pub pools: usize,
    /// Entries of the pool table (its shards together): equals `pools`.
    pub pool_table_entries: usize,
    /// Buckets the pool table's shards hold: at most 4x the pools, plus 16 per shard.
    pub pool_table_capacity: usize,
    /// Pool objects not yet dropped (see the type's documentation).
    pub pool_objects_alive: u64,
    /// Pins held for peers.
    pub pins: usize,
}
