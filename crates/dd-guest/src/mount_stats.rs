//! The document the FUSE mount publishes for the provisioner (`[sampling] stats_file` of `doubledecker
//! mount`; `dd_fuse::publish` writes it, [`crate::provision`] reads it): per container, its first-level
//! cache, its cumulative counters and read times, and the miss-ratio curve of the pages it reads.
//! Plain serde data; counters only grow while the mount runs.

use serde::{Deserialize, Serialize};

/// Time a container's reads spent at each level, cumulative: whole read requests, gets from its pool
/// (for the pages asked for), reads from the backing directory.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReadTimesSnapshot {
    pub read_ns: u64,
    pub read_pages: u64,
    pub pool_ns: u64,
    pub pool_pages: u64,
    pub backing_ns: u64,
    pub backing_pages: u64,
}

/// One container's counters as the mount keeps them (`dd_fuse::Frontend::stats`, the report of
/// `doubledecker mount` at exit) and publishes them. Counters only grow while the mount runs.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct ContainerStats {
    pub name: String,
    pub pool: Option<u32>,
    pub l1_budget_pages: usize,
    pub l1_pages: usize,
    /// Pages served from the first level.
    pub l1_hits: u64,
    /// Pages got from the container's pool.
    pub pool_hits: u64,
    /// Pages read from the backing directory, and the read requests that carried them.
    pub backing_pages: u64,
    pub backing_reads: u64,
    /// Evicted pages put to the pool, and those dropped (written since they were read, or no pool).
    pub puts: u64,
    pub puts_dropped: u64,
    /// Objects migrated into this container.
    pub migrations: u64,
}

/// One container as published: its counters, read times and curve.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PublishedContainer {
    #[serde(flatten)]
    pub counters: ContainerStats,
    pub times: ReadTimesSnapshot,
    /// The miss-ratio curve of its page reads (sizes in pages); `None` with sampling off.
    pub curve: Option<dd_mrc::Curve>,
    /// Distinct pages it read, as the sampled model estimates.
    pub footprint_pages: u64,
}

/// The stats file.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MountStats {
    pub page_size: usize,
    /// Milliseconds since the mount started when this was published: the clock the counters count on
    /// (rates are counted from the mount's start, not from whenever the reader started).
    #[serde(default)]
    pub uptime_ms: u64,
    pub containers: Vec<PublishedContainer>,
}
