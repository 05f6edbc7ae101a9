//! The hybrid tier against thesis 000, section 5.5 (acceptance 5 of the engine issue), at full scale
//! with 4 KiB pages.
//!
//! Table 5.1: a container with a 512 MiB memory share and a 1 GiB SSD share reads 2078 MiB sequentially
//! with 512 MiB of its own memory, so 1566 MiB of clean pages are put to its pool. With the default
//! watermarks (high = limit - limit/64, i.e. 504 MiB of 512 MiB and 1008 MiB of 1024 MiB; batches of
//! 2 MiB) the arithmetic is exact:
//!
//! | metric | thesis estimate | thesis observed | here |
//! | --- | --- | --- | --- |
//! | memory cache usage | 504 | 503 | 504 |
//! | SSD cache usage | 1008 | 1000 | 1008 |
//! | demotions | 1062 | 1064 | 1062 |
//! | evictions | 54 | 64 | 54 |
//! | puts (to the cache) | 2078 (*) | 2080 | 1566 |
//!
//! (*) The thesis counts 2078 MiB of puts, but 512 MiB of the 2078 MiB read stay in the container's own
//! memory, so only 1566 MiB can reach the cache: 504 + 1008 + 54 = 1566. Its "cumulative usage" row
//! (2078 = 512 + 504 + 1008 + 54) is the same sum with the container's memory added. We report 1566.
//!
//! Promotion (section 5.5.2): 1566 MiB sit on SSD with no memory share; the memory share is then set to
//! 256 MiB and exactly 256 - 64 = 192 MiB are promoted (eq. 5.2).

mod common;

use dd_engine::config::{Maintenance, MemStoreConfig, SsdStoreConfig, MIB};
use dd_engine::{Cache, EngineConfig, Key, PoolOptions, Spec, StoreKind, VmId, VmWeights};

const PAGE: usize = 4096;
const PAGES_PER_MIB: u64 = MIB / PAGE as u64;

fn cache(dir: &std::path::Path, mem_mib: u64, ssd_mib: u64) -> Cache {
    Cache::new(EngineConfig {
        mem: MemStoreConfig {
            capacity_bytes: mem_mib * MIB,
            max_capacity_bytes: Some(1024 * MIB),
            ..Default::default()
        },
        ssd: Some(SsdStoreConfig {
            path: dir.join("ssd.bin"),
            capacity_bytes: ssd_mib * MIB,
            ..Default::default()
        }),
        maintenance: Maintenance::Inline,
        ..Default::default()
    })
    .unwrap()
}

fn put_sequential(c: &Cache, pool: dd_engine::PoolId, mib: u64) {
    let mut buf = vec![0u8; PAGE];
    for i in 0..mib * PAGES_PER_MIB {
        buf[..8].copy_from_slice(&i.to_le_bytes());
        assert!(c.put(VmId(1), pool, Key::new(1, i), &buf).unwrap().is_stored());
    }
}

fn mib(pages: u64) -> f64 {
    pages as f64 / PAGES_PER_MIB as f64
}

#[test]
fn table_5_1_arithmetic() {
    let dir = tempfile::tempdir().unwrap();
    let c = cache(dir.path(), 512, 1024);
    c.add_vm(VmId(1), VmWeights::equal(100)).unwrap();
    let pool = c
        .new_pool(VmId(1), PoolOptions::ephemeral(Spec::Hybrid { mem_weight: 100, ssd_weight: 100 }))
        .unwrap();
    put_sequential(&c, pool, 1566);
    c.quiesce();
    let s = c.pool_stats(VmId(1), pool).unwrap().counters;
    let row = |name: &str, pages: u64| eprintln!("{name:>22}: {:>7.1} MiB", mib(pages));
    row("puts", s.mem.puts + s.ssd.puts);
    row("memory cache usage", s.mem.used);
    row("SSD cache usage", s.ssd.used);
    row("demotions", s.demotions);
    row("evictions", s.mem.evictions + s.ssd.evictions);
    assert_eq!(s.mem.puts + s.ssd.puts, 1566 * PAGES_PER_MIB);
    assert_eq!(s.mem.used, 504 * PAGES_PER_MIB);
    assert_eq!(s.ssd.used, 1008 * PAGES_PER_MIB);
    assert_eq!(s.demotions, 1062 * PAGES_PER_MIB);
    assert_eq!(s.ssd.evictions, 54 * PAGES_PER_MIB);
    assert_eq!(s.mem.evictions, 0);
    assert_eq!(s.gets_missed + s.mem.gets_hit + s.ssd.gets_hit, 0);
    // Eq. 5.1 per store.
    assert!(s.identity_holds(), "{s:?}");
    // The newest pages are in memory, the oldest surviving ones on SSD: spot-check the bytes.
    let mut out = vec![0u8; PAGE];
    let newest = 1566 * PAGES_PER_MIB - 1;
    assert!(c.get(VmId(1), pool, Key::new(1, newest), &mut out).unwrap());
    assert_eq!(u64::from_le_bytes(out[..8].try_into().unwrap()), newest);
    let oldest_kept = 54 * PAGES_PER_MIB;
    assert!(c.get(VmId(1), pool, Key::new(1, oldest_kept), &mut out).unwrap());
    assert_eq!(u64::from_le_bytes(out[..8].try_into().unwrap()), oldest_kept);
    assert!(!c.get(VmId(1), pool, Key::new(1, oldest_kept - 1), &mut out).unwrap(), "evicted");
    c.check_invariants().unwrap();
}

#[test]
fn promotion_fills_memory_to_the_low_watermark_exactly() {
    let dir = tempfile::tempdir().unwrap();
    let c = cache(dir.path(), 0, 2048);
    c.add_vm(VmId(1), VmWeights::equal(100)).unwrap();
    let pool = c
        .new_pool(VmId(1), PoolOptions::ephemeral(Spec::Hybrid { mem_weight: 100, ssd_weight: 100 }))
        .unwrap();
    put_sequential(&c, pool, 1566);
    c.quiesce();
    let before = c.pool_stats(VmId(1), pool).unwrap().counters;
    assert_eq!(before.ssd.used, 1566 * PAGES_PER_MIB);
    assert_eq!(before.mem.used, 0);
    c.set_capacity(StoreKind::Mem, 256 * MIB).unwrap();
    c.quiesce();
    let s = c.pool_stats(VmId(1), pool).unwrap().counters;
    eprintln!(
        "promoted {:.1} MiB; memory {:.1} MiB, SSD {:.1} MiB",
        mib(s.promotions),
        mib(s.mem.used),
        mib(s.ssd.used)
    );
    assert_eq!(s.promotions, 192 * PAGES_PER_MIB);
    assert_eq!(s.mem.used, 192 * PAGES_PER_MIB);
    assert_eq!(s.ssd.used, (1566 - 192) * PAGES_PER_MIB);
    assert_eq!(s.demotions, 0);
    assert!(s.identity_holds(), "{s:?}");
    // Promoted pages read back intact from memory.
    let mut out = vec![0u8; PAGE];
    let mut from_mem = 0;
    for i in (0..1566 * PAGES_PER_MIB).step_by(97) {
        assert!(c.get(VmId(1), pool, Key::new(1, i), &mut out).unwrap());
        assert_eq!(u64::from_le_bytes(out[..8].try_into().unwrap()), i);
        from_mem += 1;
    }
    assert!(from_mem > 0);
    c.check_invariants().unwrap();
}

#[test]
fn background_workers_reach_the_same_state() {
    // Same as Table 5.1 at 1/8 scale, with the maintenance thread instead of inline moves: once quiescent
    // every page is in exactly one tier, watermarks hold and the identity is exact.
    let dir = tempfile::tempdir().unwrap();
    let c = Cache::new(EngineConfig {
        mem: MemStoreConfig { capacity_bytes: 64 * MIB, ..Default::default() },
        ssd: Some(SsdStoreConfig {
            path: dir.path().join("ssd.bin"),
            capacity_bytes: 128 * MIB,
            ..Default::default()
        }),
        maintenance: Maintenance::Background,
        maintenance_interval_ms: 1,
        ..Default::default()
    })
    .unwrap();
    c.add_vm(VmId(1), VmWeights::equal(100)).unwrap();
    let pool =
        c.new_pool(VmId(1), PoolOptions::ephemeral(Spec::Hybrid { mem_weight: 1, ssd_weight: 1 })).unwrap();
    put_sequential(&c, pool, 180);
    c.quiesce();
    let s = c.pool_stats(VmId(1), pool).unwrap().counters;
    assert!(s.identity_holds(), "{s:?}");
    assert!(s.mem.used <= 63 * PAGES_PER_MIB, "memory above its high watermark: {}", s.mem.used);
    assert!(s.ssd.used <= 126 * PAGES_PER_MIB, "SSD above its high watermark: {}", s.ssd.used);
    assert!(s.demotions > 0);
    // Every page that is still cached is found exactly once with the right bytes.
    let mut out = vec![0u8; PAGE];
    let mut hits = 0;
    for i in 0..180 * PAGES_PER_MIB {
        if c.get(VmId(1), pool, Key::new(1, i), &mut out).unwrap() {
            assert_eq!(u64::from_le_bytes(out[..8].try_into().unwrap()), i);
            hits += 1;
        }
    }
    assert_eq!(hits, s.mem.used + s.ssd.used);
    c.check_invariants().unwrap();
}

#[test]
fn regression_quiesce_returned_while_the_maintenance_worker_still_moved_pages() {
    // `quiesce` ran maintenance to a fixed point on the caller's thread but did not wait for a pass of
    // the background worker already under way: a promotion or demotion the worker had reserved room
    // for and not yet indexed was still in flight when it returned, and the invariant check after it
    // read "store mem: reserved 286 != pages indexed 285" (CI of 066aca2, the stress test).
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = common::small_config(dir.path(), 64, 1024, 4);
    cfg.maintenance = Maintenance::Background;
    cfg.maintenance_interval_ms = 1;
    // Big moves keep the worker's pages in flight longer, so the race shows within a few rounds.
    cfg.hybrid.move_batch_bytes = 32 * common::PS as u64;
    let c = Cache::new(cfg).unwrap();
    c.add_vm(VmId(1), VmWeights::equal(1)).unwrap();
    let pool =
        c.new_pool(VmId(1), PoolOptions::ephemeral(Spec::Hybrid { mem_weight: 1, ssd_weight: 1 })).unwrap();
    for round in 0..300u64 {
        // Fill memory past its watermark (the worker demotes), then grow or shrink memory (the worker
        // promotes into the room or the shrink evicts), and quiesce while the worker is busy.
        for i in 0..160 {
            let key = Key::new(round % 7, i);
            c.put(VmId(1), pool, key, &common::page(pool, key, round)).unwrap();
        }
        let pages = if round % 2 == 0 { 256 } else { 64 };
        c.set_capacity(StoreKind::Mem, pages * common::PS as u64).unwrap();
        c.quiesce();
        c.check_invariants().unwrap_or_else(|e| panic!("round {round}: {e}"));
    }
}

#[test]
fn regression_promotion_past_the_high_watermark_ping_ponged_with_demotion() {
    // With a memory limit whose high-watermark margin (limit * ppm) is wider than the low-watermark
    // margin, the promotion target (limit - low margin) lay above the demotion threshold: each
    // promotion was demoted again at the next step and maintenance never reached a fixed point (the
    // background worker spun at full CPU; before the fix this test's `quiesce` left 242 pages in memory,
    // above the watermark). Here the limit is 256 pages: high watermark 240, low 248.
    let dir = tempfile::tempdir().unwrap();
    let c = common::small_cache(dir.path(), 256, 1024, 4);
    c.add_vm(VmId(1), VmWeights::equal(1)).unwrap();
    let pool =
        c.new_pool(VmId(1), PoolOptions::ephemeral(Spec::Hybrid { mem_weight: 1, ssd_weight: 1 })).unwrap();
    for i in 0..400 {
        let key = Key::new(1, i);
        assert!(c.put(VmId(1), pool, key, &common::page(pool, key, 1)).unwrap().is_stored());
    }
    c.quiesce();
    let s = c.pool_stats(VmId(1), pool).unwrap().counters;
    assert!(s.mem.used <= 240, "memory above its high watermark: {}", s.mem.used);
    assert!(s.mem.used >= 238, "memory left below the watermark it promotes to: {}", s.mem.used);
    // 400 pages over a 240-page watermark: 160 (or one batch more) demoted, and at most a batch back.
    assert!(s.demotions <= 162 && s.promotions <= 2, "pages moved back and forth: {s:?}");
    c.check_invariants().unwrap();
}
