//! # dd-fuse: real applications on DoubleDecker
//!
//! A FUSE filesystem in front of a backing directory that plays the guest kernel's cgroup-aware
//! cleancache frontend of paper 002 (section 4.1, SPEC section 7) in user space:
//! * [`attrib`]: each request is attributed to the container (memory cgroup) of the calling process, and
//!   the container to its pool through the state file of `doubledecker guest watch`;
//! * [`level1`]: each container has a first-level page cache (4 KiB pages, LRU) bounded by its budget;
//! * [`frontend`]: clean pages evicted from it are put to the container's pool, misses are got from the
//!   pool before the backing store, writes, truncation and deletion invalidate, files read by another
//!   container migrate (MIGRATE_OBJECT); the coherence argument is at the top of that module;
//! * [`daemon`]: the connections to the daemon, which survive its restarts (back-off, instance-bound
//!   pools, flushes owed while it was away);
//! * [`passthrough`]: extended attributes and special nodes on the backing directory, and the kernel
//!   page-cache invalidations that keep shared mappings coherent;
//! * [`fs`]: the FUSE operations on the backing directory (via the pure-Rust `fuser`, no libfuse) and
//!   [`Mount`], which `doubledecker mount` runs until SIGINT/SIGTERM unmounts it;
//! * [`sampling`] and [`publish`]: each container's sampled miss-ratio curve and read times, published
//!   for `doubledecker guest provision`, and the first-level budgets it decides, applied.

pub mod attrib;
pub mod config;
pub mod daemon;
pub mod frontend;
pub mod fs;
pub mod level1;
pub mod passthrough;
pub mod publish;
pub mod sampling;

pub use config::{FuseConfig, SamplingConfig, PAGE_SIZE};
pub use frontend::{ContainerStats, Frontend};
pub use fs::{FuseError, Mount, Unmounter};
pub use publish::{MountStats, PublishedContainer};
