//! # dd-types: the vocabulary of DoubleDecker
//!
//! The types that cross a boundary between crates or between processes: ids and keys ([`VmId`],
//! [`PoolId`], [`Key`]), specs and pool options ([`Spec`], [`PoolOptions`]), eviction orders with their
//! wire codes ([`EvictionOrder::ALL`], the one table), the statistics the data plane and the admin API
//! carry as JSON ([`PoolStats`], [`VmStats`], [`HostStats`]), the engine's errors with their stable codes
//! ([`CacheError::code`]) and what a name may be ([`names`]).
//!
//! It also holds the one piece of behaviour that must sit next to a wire table: the eviction orders
//! themselves ([`order`]: one file per order behind [`order::Order`], and the lazy-deletion list they
//! run on), std-only code that the engine and `dd-mrc`'s simulation both run (D37).
//!
//! Invariant: this crate depends on nothing that implements anything (serde and thiserror only), so the
//! guest's crates (`dd-client`, `dd-guest`, `dd-fuse`, `dd-provision`) and the data-plane protocol
//! (`dd-proto`) build without the engine, io-uring or LZ4 (docs/decisions.md D35; the test
//! `crates/doubledecker-guest/tests/guest_deps.rs` pins it). `dd-engine` re-exports every item under its old
//! path (`dd_engine::PoolId`, `dd_engine::types::Spec`, ...).

pub mod error;
pub mod names;
pub mod order;
pub mod stats;
pub mod types;

pub use error::CacheError;
pub use stats::{Counters, HostStats, PoolStats, StoreCounters, StoreStatus, VmStats};
pub use types::{
    EvictionOrder, Key, Mode, PoolId, PoolKind, PoolOptions, PutOutcome, Spec, StoreKind, VmId, VmWeights,
};
