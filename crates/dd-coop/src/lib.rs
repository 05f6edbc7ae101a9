//! # dd-coop: co-operative de-duplication across hosts
//!
//! Thesis 004, chapter 5 (SPEC section 9): each daemon summarises the content of its unique frames in a
//! Bloom filter and publishes it to its peers, so that a frame about to be evicted can be offered to a
//! peer that probably holds equal content. This crate holds the parts that do not depend on the network:
//! the summaries ([`bloom`]).

pub mod bloom;

pub use bloom::{BloomConfig, BloomFilter, Removal};
