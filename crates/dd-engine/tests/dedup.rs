//! Local content de-duplication (thesis 004, section 6.2.1; SPEC sections 4 and 9).

mod common;

use common::*;
use dd_engine::{Key, PoolOptions, Spec, VmId, VmWeights};
use rand::{RngCore, SeedableRng};

fn frames(cache: &dd_engine::Cache) -> u64 {
    cache.host_stats().stores[0].used_pages
}

/// Thesis 004, 6.2.1: a "one file" of identical pages put through a pool stores one frame, and the
/// de-dup hits are the puts minus one; a file of random pages de-duplicates nothing.
#[test]
fn one_file_of_identical_pages_is_one_frame_and_a_random_file_is_not_shared() {
    let dir = tempfile::tempdir().unwrap();
    let cache = small_dedup_cache(dir.path(), 1024, 0, 4);
    cache.add_vm(VmId(1), VmWeights::equal(1)).unwrap();
    let pool = cache.new_pool(VmId(1), PoolOptions::ephemeral(Spec::Mem { weight: 1 })).unwrap();
    let one = vec![0x11u8; PS];
    for i in 0..500 {
        cache.put(VmId(1), pool, Key::new(1, i), &one).unwrap();
    }
    let s = cache.pool_stats(VmId(1), pool).unwrap().counters.mem;
    assert_eq!(frames(&cache), 1);
    assert_eq!(s.puts, 500);
    assert_eq!(s.used, 500, "each page is charged to the pool");
    assert_eq!(s.dedup_hits, 499);
    assert_eq!(s.bytes_saved, 499 * PS as u64);

    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(61);
    let mut random = vec![0u8; PS];
    for i in 0..300 {
        rng.fill_bytes(&mut random);
        cache.put(VmId(1), pool, Key::new(2, i), &random).unwrap();
    }
    let s2 = cache.pool_stats(VmId(1), pool).unwrap().counters.mem;
    assert_eq!(s2.dedup_hits, 499, "random pages share nothing");
    assert_eq!(frames(&cache), 301);
    // Every copy of the identical page reads back, and the frame goes with the last reference.
    let mut out = vec![0u8; PS];
    for i in 0..500 {
        assert!(cache.get(VmId(1), pool, Key::new(1, i), &mut out).unwrap());
        assert_eq!(out, one);
    }
    assert_eq!(frames(&cache), 300);
    assert_identity(&cache);
}

#[test]
fn an_isolated_vm_never_shares_frames_with_others() {
    let dir = tempfile::tempdir().unwrap();
    let cache = small_dedup_cache(dir.path(), 1024, 0, 4);
    for vm in 1..=3 {
        cache.add_vm(VmId(vm), VmWeights::equal(1)).unwrap();
    }
    // VMs 1 and 2 are in one de-duplication group; VM 3 keeps the default, a domain of its own.
    cache.set_vm_dedup_group(VmId(1), Some(7)).unwrap();
    cache.set_vm_dedup_group(VmId(2), Some(7)).unwrap();
    let same = vec![0x42u8; PS];
    let pools: Vec<_> = (1..=3)
        .map(|vm| (vm, cache.new_pool(VmId(vm), PoolOptions::ephemeral(Spec::Mem { weight: 1 })).unwrap()))
        .collect();
    for (vm, p) in &pools {
        cache.put(VmId(*vm), *p, Key::new(1, 1), &same).unwrap();
    }
    // VMs 1 and 2 share one frame; VM 3 has its own.
    assert_eq!(frames(&cache), 2);
    let s3 = cache.pool_stats(VmId(3), pools[2].1).unwrap().counters.mem;
    assert_eq!(s3.dedup_hits, 0);
    // VM 2's match was with VM 1's page: counted in host scope, never in VM 2's own statistics.
    assert_eq!(cache.pool_stats(VmId(2), pools[1].1).unwrap().counters.mem.dedup_hits, 0);
    assert_eq!((cache.host_stats().group_dedup_hits, cache.host_stats().group_bytes_saved), (1, PS as u64));
    assert_identity(&cache);
}

#[test]
fn dedup_saves_capacity_without_changing_entitlement_charges() {
    let dir = tempfile::tempdir().unwrap();
    let cache = small_dedup_cache(dir.path(), 64, 0, 4);
    cache.add_vm(VmId(1), VmWeights::equal(1)).unwrap();
    let p = cache.new_pool(VmId(1), PoolOptions::ephemeral(Spec::Mem { weight: 1 })).unwrap();
    // 1000 logical pages of 4 distinct contents fit in a 64-frame store without one eviction.
    for i in 0..1000u64 {
        let content = vec![(i % 4) as u8 + 1; PS];
        assert!(cache.put(VmId(1), p, Key::new(i, 0), &content).unwrap().is_stored());
    }
    let s = cache.pool_stats(VmId(1), p).unwrap().counters.mem;
    assert_eq!(s.evictions, 0);
    assert_eq!(s.used, 1000);
    assert_eq!(frames(&cache), 4);
    assert_identity(&cache);
}
