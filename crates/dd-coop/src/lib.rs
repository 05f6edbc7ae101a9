//! # dd-coop: co-operative de-duplication across hosts
//!
//! Thesis 004, chapter 5 (SPEC section 9): each daemon summarises the content of its unique frames in a
//! Bloom filter and publishes it to its peers, so that a frame about to be evicted can be offered to a
//! peer that probably holds equal content. This crate holds the parts that do not depend on the engine
//! or on sockets: the summaries ([`bloom`]), the peer-to-peer wire format ([`wire`]) and the
//! per-node identities peers prove in their handshake ([`identity`]), the encrypted channel every peer
//! session runs in ([`channel`]: Noise through `snow`, bound to the identities), and the pin table a daemon
//! keeps for its peers ([`pins`]: the state machine, time passed in), the client side's decisions
//! ([`peers`]: peer choice, back-off, unpin retries, the accept rule of a remotified get) and the
//! [`transport`] trait they send requests through, and the listener's answer to one authenticated
//! peer request ([`serve`]: Algorithm 4, the engine behind a trait), with an in-memory host for tests
//! and fuzzing (`testing`, feature `testing`). The daemon's
//! peer listener, client and remotifier are in `dd-server`'s `coop` module.
#![forbid(unsafe_code)] // nothing here needs it: unsafe code lives in dd-engine, dd-fuse, dd-memctl and the few FFI calls of the other crates

pub mod bloom;
pub mod channel;
pub mod identity;
pub mod peers;
pub mod pins;
pub mod serve;
#[cfg(any(test, feature = "testing"))]
pub mod testing;
pub mod transport;
pub mod wire;

pub use bloom::{BloomConfig, BloomFilter, Removal};
