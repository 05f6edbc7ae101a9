//! The guest's commands (`watch`, `provision`, `pages`, `mount`), shared by two binaries: the guest's
//! own `doubledecker-guest` (this package's `main.rs`, built from the guest's crates only) and the
//! host's `doubledecker`, which has them as `doubledecker guest ...` and `doubledecker mount`, with the
//! same flags.
//!
//! Invariant: this crate depends on no host crate (`dd-engine`, `dd-server`, `dd-bench`, `dd-lab`;
//! docs/decisions.md D35, pinned by `crates/doubledecker-guest/tests/guest_deps.rs`), and prints only through
//! [`out`]'s macros.
#![forbid(unsafe_code)] // nothing here needs it: unsafe code lives in dd-engine, dd-fuse, dd-memctl and the few FFI calls of the other crates

#[macro_use]
pub mod out;
pub mod guest;
pub mod logging;
pub mod mount;
