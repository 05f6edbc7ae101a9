//! Shared helpers of the engine's integration tests.
#![allow(dead_code)]

use dd_engine::config::{HybridConfig, Maintenance, MemStoreConfig, SsdStoreConfig};
use dd_engine::{Cache, EngineConfig, Key, PoolId};
use std::path::Path;

pub const PS: usize = 512;

/// A page whose bytes encode who wrote it, so any stale or foreign page is detected exactly.
pub fn page(pool: PoolId, key: Key, version: u64) -> Vec<u8> {
    let mut p = vec![0u8; PS];
    p[0..4].copy_from_slice(&pool.0.to_le_bytes());
    p[4..12].copy_from_slice(&key.object.to_le_bytes());
    p[12..20].copy_from_slice(&key.index.to_le_bytes());
    p[20..28].copy_from_slice(&version.to_le_bytes());
    let fill = (version as u8) ^ (key.index as u8) ^ 0x5a;
    for b in &mut p[28..] {
        *b = fill;
    }
    p
}

/// A small cache (512-byte pages) for model and conformance tests: `mem_pages` of memory, `ssd_pages`
/// of SSD in `dir` (no SSD store when 0), inline maintenance so runs are deterministic.
pub fn small_config(dir: &Path, mem_pages: u64, ssd_pages: u64, batch_pages: u64) -> EngineConfig {
    EngineConfig {
        page_size_bytes: PS,
        mem: MemStoreConfig {
            capacity_bytes: mem_pages * PS as u64,
            max_capacity_bytes: Some(4 * mem_pages * PS as u64),
            ..Default::default()
        },
        ssd: (ssd_pages > 0).then(|| SsdStoreConfig {
            path: dir.join("ssd.bin"),
            capacity_bytes: ssd_pages * PS as u64,
            write_queue_pages: 16,
            ..Default::default()
        }),
        eviction_batch_bytes: batch_pages * PS as u64,
        hybrid: HybridConfig {
            high_watermark_margin_ppm: 62_500,
            low_watermark_margin_bytes: 8 * PS as u64,
            move_batch_bytes: 2 * PS as u64,
        },
        maintenance: Maintenance::Inline,
        max_batch_pages: 64,
        // One shard unless a test asks for more: the same engine on every host, whatever its cores.
        pool_shards: 1,
        ..Default::default()
    }
}

pub fn small_cache(dir: &Path, mem_pages: u64, ssd_pages: u64, batch_pages: u64) -> Cache {
    Cache::new(small_config(dir, mem_pages, ssd_pages, batch_pages)).expect("cache")
}

/// [`small_cache`] with the memory store's content de-duplication switched on.
pub fn small_dedup_cache(dir: &Path, mem_pages: u64, ssd_pages: u64, batch_pages: u64) -> Cache {
    let mut cfg = small_config(dir, mem_pages, ssd_pages, batch_pages);
    cfg.mem.dedup = true;
    Cache::new(cfg).expect("cache")
}

/// [`small_cache`] with LZ4 compression, and de-duplication if asked.
pub fn small_compressed_cache(
    dir: &Path,
    mem_pages: u64,
    ssd_pages: u64,
    batch_pages: u64,
    dedup: bool,
) -> Cache {
    let mut cfg = small_config(dir, mem_pages, ssd_pages, batch_pages);
    cfg.mem.dedup = dedup;
    cfg.mem.compression = dd_engine::config::Compression::Lz4;
    Cache::new(cfg).expect("cache")
}

/// Asserts the SPEC section 5 identity for every pool, VM and the host, and the engine's invariants.
pub fn assert_identity(cache: &Cache) {
    let host = cache.host_stats();
    for vm in &host.vms {
        for p in &vm.pools {
            assert!(p.counters.identity_holds(), "identity broken for pool {:?}: {:?}", p.pool, p.counters);
        }
        assert!(vm.totals.identity_holds(), "identity broken for vm {:?}: {:?}", vm.vm, vm.totals);
    }
    assert!(host.totals.identity_holds(), "identity broken for the host: {:?}", host.totals);
    cache.check_invariants().expect("engine invariants");
}
