//! `bench shards`: how far a sharded pool's eviction order is from a single queue's (issue 28, D33).
//!
//! A seeded synthetic oracle-general trace (libCacheSim's binary format; zipf popularity, scrambled
//! ids, [`crate::mrc::write_synthetic`]) is written, read back, and replayed through the real engine:
//! one non-exclusive memory pool in FIFO or LRU order, cache-aside (a get; on a miss, a put of the
//! object's page), at several cache sizes and shard counts. Each replay reports the pool's miss ratio;
//! the report gives each sharded pool's difference from the one-shard pool (a single queue) of the same
//! order and size. The replay is single-threaded and deterministic, so the differences are the order's
//! alone, not timing's.

use dd_engine::config::{Maintenance, MemStoreConfig};
use dd_engine::{Cache, EngineConfig, EvictionOrder, Key, PoolOptions, Spec, VmId, VmWeights};
use dd_trace::{Format, Request};
use serde::Serialize;

/// Engine page size of the replay (the smallest the engine takes: the bytes are not what is measured).
const PAGE: usize = 512;

/// Options of `bench shards`.
#[derive(Debug, Clone)]
pub struct ShardsBenchOptions {
    /// References in the trace. Default 2 000 000.
    pub requests: u64,
    /// Distinct objects. Default 200 000.
    pub keys: u64,
    /// Zipf exponent. Default 0.9.
    pub zipf: f64,
    /// Cache sizes as fractions of `keys`. Default 0.01, 0.05, 0.2.
    pub sizes: Vec<f64>,
    /// Shard counts compared with one. Default 4, 16, 64.
    pub shards: Vec<u32>,
    /// Pages evicted at once when the pool is full. Default 16.
    pub batch_pages: u64,
    pub seed: u64,
}

impl Default for ShardsBenchOptions {
    fn default() -> Self {
        ShardsBenchOptions {
            requests: 2_000_000,
            keys: 200_000,
            zipf: 0.9,
            sizes: vec![0.01, 0.05, 0.2],
            shards: vec![4, 16, 64],
            batch_pages: 16,
            seed: 0x5eed,
        }
    }
}

/// One replay.
#[derive(Debug, Clone, Serialize)]
pub struct ShardsRow {
    pub order: String,
    pub size_fraction: f64,
    pub cache_pages: u64,
    pub shards: u32,
    pub miss_ratio: f64,
    /// `miss_ratio` minus the one-shard pool's of the same order and size (0 for the one-shard row).
    pub miss_ratio_diff: f64,
}

/// The report printed by `doubledecker bench shards --json`.
#[derive(Debug, Clone, Serialize)]
pub struct ShardsBenchReport {
    pub requests: u64,
    pub keys: u64,
    pub zipf: f64,
    pub batch_pages: u64,
    pub seed: u64,
    pub rows: Vec<ShardsRow>,
    /// The largest `|miss_ratio_diff|` of any row.
    pub max_abs_diff: f64,
}

/// Errors of `bench shards`.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ShardsBenchError {
    #[error("invalid option {field}: {reason}")]
    InvalidOption { field: &'static str, reason: String },
    #[error("trace: {0}")]
    Trace(#[from] dd_trace::TraceError),
    #[error("writing the trace: {0}")]
    Io(#[from] std::io::Error),
    #[error(transparent)]
    Cache(#[from] dd_engine::CacheError),
}

/// Runs the comparison; `progress` gets a line per replay.
pub fn run(
    o: &ShardsBenchOptions,
    progress: &mut dyn FnMut(&str),
) -> Result<ShardsBenchReport, ShardsBenchError> {
    if o.requests == 0 || o.keys == 0 {
        return Err(ShardsBenchError::InvalidOption {
            field: "requests",
            reason: "requests and keys must be > 0".into(),
        });
    }
    if o.sizes.iter().any(|s| !(*s > 0.0 && *s <= 1.0)) {
        return Err(ShardsBenchError::InvalidOption { field: "sizes", reason: "each within (0, 1]".into() });
    }
    let file = tempfile::Builder::new().prefix("dd-bench-shards").suffix(".oracleGeneral.bin").tempfile()?;
    crate::mrc::write_synthetic(file.path(), o.requests, o.keys, o.zipf, o.seed)?;
    let trace = dd_trace::read_all(&mut *dd_trace::open(file.path(), &Format::OracleGeneral)?)?;
    let mut rows = Vec::new();
    for order in [EvictionOrder::Fifo, EvictionOrder::Lru] {
        for &size in &o.sizes {
            let pages = ((o.keys as f64 * size) as u64).max(o.batch_pages.max(1) * 2);
            let single = replay(&trace, order, pages, 1, o.batch_pages)?;
            progress(&format!("{order:?} {pages} pages: 1 shard miss ratio {single:.4}"));
            rows.push(row(order, size, pages, 1, single, single));
            for &shards in &o.shards {
                let m = replay(&trace, order, pages, shards, o.batch_pages)?;
                progress(&format!("{order:?} {pages} pages: {shards} shards miss ratio {m:.4}"));
                rows.push(row(order, size, pages, shards, m, single));
            }
        }
    }
    let max_abs_diff = rows.iter().map(|r| r.miss_ratio_diff.abs()).fold(0.0, f64::max);
    Ok(ShardsBenchReport {
        requests: o.requests,
        keys: o.keys,
        zipf: o.zipf,
        batch_pages: o.batch_pages,
        seed: o.seed,
        rows,
        max_abs_diff,
    })
}

fn row(order: EvictionOrder, size: f64, pages: u64, shards: u32, miss: f64, single: f64) -> ShardsRow {
    ShardsRow {
        order: format!("{order:?}").to_lowercase(),
        size_fraction: size,
        cache_pages: pages,
        shards,
        miss_ratio: miss,
        miss_ratio_diff: miss - single,
    }
}

/// Replays `trace` cache-aside through one pool of `shards` shards holding `pages` pages; the miss
/// ratio.
fn replay(
    trace: &[Request],
    order: EvictionOrder,
    pages: u64,
    shards: u32,
    batch: u64,
) -> Result<f64, ShardsBenchError> {
    let cache = Cache::new(EngineConfig {
        page_size_bytes: PAGE,
        mem: MemStoreConfig { capacity_bytes: pages * PAGE as u64, ..Default::default() },
        eviction_batch_bytes: batch.max(1) * PAGE as u64,
        maintenance: Maintenance::Inline,
        ..Default::default()
    })?;
    let vm = VmId(1);
    cache.add_vm(vm, VmWeights::equal(1))?;
    let opts = PoolOptions { exclusive_gets: false, ..PoolOptions::ephemeral(Spec::Mem { weight: 1 }) };
    let pool = cache.pool_handle(vm, cache.new_pool(vm, opts.with_order(order).with_shards(shards))?)?;
    let mut page = vec![0u8; PAGE];
    let mut misses = 0u64;
    for r in trace {
        let key = Key::new(r.id, 0);
        if pool.get(key, &mut page)?.is_none() {
            misses += 1;
            page[..8].copy_from_slice(&r.id.to_le_bytes());
            pool.put(key, &page)?;
        }
    }
    Ok(misses as f64 / trace.len() as f64)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A small replay: one row per order, size and shard count, one-shard rows at 0, and sharded FIFO
    /// and LRU within two points of the single queue on this trace.
    #[test]
    fn sharded_pools_miss_about_as_a_single_queue() {
        let o = ShardsBenchOptions {
            requests: 100_000,
            keys: 10_000,
            sizes: vec![0.05, 0.2],
            shards: vec![8],
            ..Default::default()
        };
        let r = run(&o, &mut |_| {}).unwrap();
        assert_eq!(r.rows.len(), 2 * 2 * 2);
        for row in &r.rows {
            assert!(row.miss_ratio > 0.0 && row.miss_ratio < 1.0, "{row:?}");
            if row.shards == 1 {
                assert_eq!(row.miss_ratio_diff, 0.0);
            }
        }
        assert!(r.max_abs_diff < 0.02, "{r:?}");
    }
}
