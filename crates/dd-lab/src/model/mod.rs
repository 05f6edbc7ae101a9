//! The model layer: the emulated guest and what runs in it, with no notion of time or of the event
//! loop that drives it (`crate::sim`). Reads only the scenario's plain data (`crate::scenario`).
//!
//! Owns [`guest`] (the guest kernel's page cache: memcgs, LRU lists, reclaim; `guest::memctl`: the VM
//! memory controller of thesis 000 chapter 4 in VM-wide reclaim), [`workload`] (the Filebench
//! personalities, trace replay), [`kvstore`] (Redis-, MongoDB- and MySQL-like stores) and [`ycsb`]
//! (YCSB A-F request generators).

pub mod guest;
pub mod kvstore;
pub mod workload;
pub mod ycsb;
