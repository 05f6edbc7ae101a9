//! Partitioning policy: who is entitled to what, and who gives pages back when a store is full.

pub mod effective;
pub mod entitlement;
pub mod victim;

pub use entitlement::{compute as compute_entitlements, Entitlements, VmShape};
pub use victim::{exceed, select_victim, EntityUsage};
