//! # dd-engine: the DoubleDecker cache store
//!
//! An exclusive second-chance page cache with tmem/cleancache semantics (SPEC sections 2-5): pools per
//! container, capacity split by weight first between VMs and then between each VM's containers, on a
//! memory store, an SSD store or both (hybrid), with the victim selection of the DoubleDecker paper
//! (Algorithm 1) and exact statistics.
//!
//! The entry point is [`Cache`]. Everything is in pages of `page_size_bytes` (default 4096).
//!
//! ```
//! use dd_engine::{Cache, EngineConfig, Key, PoolOptions, Spec, VmId, VmWeights};
//! let cfg = EngineConfig { maintenance: dd_engine::config::Maintenance::Inline, ..Default::default() };
//! let cache = Cache::new(cfg).unwrap();
//! cache.add_vm(VmId(1), VmWeights::equal(1)).unwrap();
//! let pool = cache.new_pool(VmId(1), PoolOptions::ephemeral(Spec::Mem { weight: 100 })).unwrap();
//! let page = vec![7u8; 4096];
//! cache.put(VmId(1), pool, Key::new(42, 0), &page).unwrap();
//! let mut out = vec![0u8; 4096];
//! assert!(cache.get(VmId(1), pool, Key::new(42, 0), &mut out).unwrap()); // hit, and removed
//! assert!(!cache.get(VmId(1), pool, Key::new(42, 0), &mut out).unwrap()); // exclusive: now a miss
//! ```
//!
//! Module map: [`cache`] (public API, eviction, hybrid maintenance, lock order), `pool` (one pool's index
//! and queues), `order` (FIFO/LRU/CLOCK/S3-FIFO), [`policy`] (entitlements and Algorithm 1),
//! [`store`] (memory arena and SSD file), [`stats`] (counters and the identity), [`config`], [`error`],
//! [`types`] and [`names`] (`dd-types`' modules, re-exported: the vocabulary the guest's crates share
//! without building the engine).

/// An invariant check: a `debug_assert!` normally, a hard `assert!` with the `strict-invariants`
/// feature (the test suite's configuration for release-mode runs).
#[macro_export]
#[doc(hidden)]
macro_rules! invariant {
    ($($t:tt)*) => {
        if cfg!(feature = "strict-invariants") { assert!($($t)*) } else { debug_assert!($($t)*) }
    };
}

pub mod cache;
pub mod config;
pub mod error;
pub mod lockprof;
pub(crate) mod order;
mod page_map;
pub mod policy;
mod pool;
pub mod remote;
pub mod stats;
pub mod store;
pub mod stripe;
#[cfg(test)]
mod test_util;

// The vocabulary lives in dd-types (D35); its modules keep their engine paths.
pub use dd_types::{names, types};

pub use cache::{Cache, GetOutcome, PoolHandle};
pub use config::EngineConfig;
pub use error::CacheError;
pub use remote::{Evicted, Holder, RemoteRef, RemoteSink, MAX_HOLDERS};
pub use stats::{Counters, HostStats, PoolStats, StoreCounters, TableSizes, VmStats};
pub use types::{
    EvictionOrder, Key, Mode, PoolId, PoolKind, PoolOptions, PutOutcome, Spec, StoreKind, VmId, VmWeights,
};
