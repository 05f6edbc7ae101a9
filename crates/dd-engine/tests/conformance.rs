//! One conformance suite, run against every store configuration: memory, SSD and hybrid (SPEC
//! section 4: "One conformance test suite runs against every store").
//!
//! Each case takes a fresh cache from a [`Flavor`] and checks one rule of SPEC section 2, with pools of
//! one shard and of several (issue 28: a sharded pool keeps every rule).

mod common;

use common::*;
use dd_engine::{
    Cache, CacheError, Key, PoolKind, PoolOptions, PutOutcome, Spec, StoreKind, VmId, VmWeights,
};

#[derive(Clone, Copy, Debug)]
enum Flavor {
    Mem,
    Ssd,
    Hybrid,
    MemDedup,
    HybridDedup,
    MemCompressed,
    MemDedupCompressed,
}

impl Flavor {
    const ALL: [Flavor; 7] = [
        Flavor::Mem,
        Flavor::Ssd,
        Flavor::Hybrid,
        Flavor::MemDedup,
        Flavor::HybridDedup,
        Flavor::MemCompressed,
        Flavor::MemDedupCompressed,
    ];
    fn spec(self) -> Spec {
        match self {
            Flavor::Mem | Flavor::MemDedup | Flavor::MemCompressed | Flavor::MemDedupCompressed => {
                Spec::Mem { weight: 100 }
            }
            Flavor::Ssd => Spec::Ssd { weight: 100 },
            Flavor::Hybrid | Flavor::HybridDedup => Spec::Hybrid { mem_weight: 100, ssd_weight: 100 },
        }
    }
    fn dedup(self) -> bool {
        matches!(self, Flavor::MemDedup | Flavor::HybridDedup | Flavor::MemDedupCompressed)
    }
    fn compressed(self) -> bool {
        matches!(self, Flavor::MemCompressed | Flavor::MemDedupCompressed)
    }
}

struct Fixture {
    _dir: tempfile::TempDir,
    cache: Cache,
    flavor: Flavor,
    /// Shards of the fixture's pools.
    shards: u32,
}

impl Fixture {
    fn new(flavor: Flavor, mem_pages: u64, ssd_pages: u64, shards: u32) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let cache = if flavor.compressed() {
            small_compressed_cache(dir.path(), mem_pages, ssd_pages, 4, flavor.dedup())
        } else if flavor.dedup() {
            small_dedup_cache(dir.path(), mem_pages, ssd_pages, 4)
        } else {
            small_cache(dir.path(), mem_pages, ssd_pages, 4)
        };
        cache.add_vm(VmId(1), VmWeights::equal(1)).unwrap();
        cache.add_vm(VmId(2), VmWeights::equal(1)).unwrap();
        Fixture { _dir: dir, cache, flavor, shards }
    }
    fn pool(&self, vm: u32, kind: PoolKind) -> dd_engine::PoolId {
        let opts = match kind {
            PoolKind::Ephemeral => PoolOptions::ephemeral(self.flavor.spec()),
            PoolKind::Persistent => PoolOptions::persistent(self.flavor.spec()),
        };
        self.cache.new_pool(VmId(vm), opts.with_shards(self.shards)).unwrap()
    }
}

fn each(f: impl Fn(Fixture)) {
    for flavor in Flavor::ALL {
        for shards in [1, 4] {
            f(Fixture::new(flavor, 64, 128, shards));
        }
    }
}

fn get(c: &Cache, vm: u32, pool: dd_engine::PoolId, key: Key) -> Option<Vec<u8>> {
    let mut out = vec![0u8; PS];
    c.get(VmId(vm), pool, key, &mut out).unwrap().then_some(out)
}

#[test]
fn put_then_exclusive_get() {
    each(|f| {
        let p = f.pool(1, PoolKind::Ephemeral);
        let k = Key::new(1, 2);
        assert!(f.cache.put(VmId(1), p, k, &page(p, k, 1)).unwrap().is_stored());
        assert_eq!(get(&f.cache, 1, p, k), Some(page(p, k, 1)), "{:?}", f.flavor);
        assert_eq!(get(&f.cache, 1, p, k), None, "exclusive get must remove ({:?})", f.flavor);
        assert_identity(&f.cache);
    });
}

#[test]
fn put_replaces_and_get_returns_latest() {
    each(|f| {
        let p = f.pool(1, PoolKind::Ephemeral);
        let k = Key::new(9, 9);
        for v in 1..=5 {
            f.cache.put(VmId(1), p, k, &page(p, k, v)).unwrap();
        }
        assert_eq!(get(&f.cache, 1, p, k), Some(page(p, k, 5)));
        let s = f.cache.pool_stats(VmId(1), p).unwrap().counters;
        assert_eq!(s.mem.puts + s.ssd.puts, 5);
        assert_eq!(s.mem.flushes + s.ssd.flushes, 4, "replacements count as flushes");
        assert_identity(&f.cache);
    });
}

#[test]
fn flush_page_and_object_make_gets_miss() {
    each(|f| {
        let p = f.pool(1, PoolKind::Ephemeral);
        for i in 0..8 {
            let k = Key::new(1, i);
            f.cache.put(VmId(1), p, k, &page(p, k, 1)).unwrap();
            let k = Key::new(2, i);
            f.cache.put(VmId(1), p, k, &page(p, k, 1)).unwrap();
        }
        assert!(f.cache.flush_page(VmId(1), p, Key::new(1, 3)).unwrap());
        assert!(!f.cache.flush_page(VmId(1), p, Key::new(1, 3)).unwrap());
        assert_eq!(get(&f.cache, 1, p, Key::new(1, 3)), None);
        assert_eq!(f.cache.flush_object(VmId(1), p, 2).unwrap(), 8);
        for i in 0..8 {
            assert_eq!(get(&f.cache, 1, p, Key::new(2, i)), None);
        }
        assert_eq!(get(&f.cache, 1, p, Key::new(1, 4)), Some(page(p, Key::new(1, 4), 1)));
        assert_identity(&f.cache);
    });
}

#[test]
fn destroy_pool_frees_everything() {
    each(|f| {
        let p = f.pool(1, PoolKind::Ephemeral);
        for i in 0..20 {
            let k = Key::new(1, i);
            f.cache.put(VmId(1), p, k, &page(p, k, 1)).unwrap();
        }
        f.cache.destroy_pool(VmId(1), p).unwrap();
        let mut out = vec![0u8; PS];
        assert_eq!(f.cache.get(VmId(1), p, Key::new(1, 0), &mut out), Err(CacheError::UnknownPool(p)));
        let host = f.cache.host_stats();
        assert_eq!(host.stores.iter().map(|s| s.used_pages).sum::<u64>(), 0);
        assert_identity(&f.cache);
    });
}

#[test]
fn pool_handle_is_the_same_data_path_as_ids() {
    each(|f| {
        let p = f.pool(1, PoolKind::Ephemeral);
        let h = f.cache.pool_handle(VmId(1), p).unwrap();
        assert_eq!((h.id(), h.vm()), (p, VmId(1)));
        let mut out = vec![0u8; PS];
        for i in 0..10 {
            let k = Key::new(3, i);
            let stored = h.put(k, &page(p, k, 1)).unwrap();
            let PutOutcome::Stored(tier) = stored else { panic!("{:?}: refused", f.flavor) };
            // A page put through the handle is the id path's page, and the reverse; the handle's get
            // names the tier the put reported.
            if i % 2 == 0 {
                assert_eq!(h.get(k, &mut out).unwrap(), Some(tier), "{:?}", f.flavor);
                assert_eq!(out, page(p, k, 1));
            } else {
                assert_eq!(get(&f.cache, 1, p, k), Some(page(p, k, 1)), "{:?}", f.flavor);
            }
            assert_eq!(h.get(k, &mut out).unwrap(), None, "exclusive ({:?})", f.flavor);
        }
        assert!(matches!(h.put(Key::new(1, 1), &[0u8; 7]), Err(CacheError::BadPageSize { .. })));
        assert_eq!(
            f.cache.pool_handle(VmId(2), p).map(|_| ()),
            Err(CacheError::UnknownPool(p)),
            "another VM's pool"
        );
        let k = Key::new(4, 0);
        h.put(k, &page(p, k, 1)).unwrap();
        f.cache.destroy_pool(VmId(1), p).unwrap();
        assert_eq!(h.get(k, &mut out), Err(CacheError::UnknownPool(p)));
        assert_eq!(h.put(k, &page(p, k, 2)).map(|_| ()), Err(CacheError::UnknownPool(p)));
        let host = f.cache.host_stats();
        assert_eq!(host.stores.iter().map(|s| s.used_pages).sum::<u64>(), 0);
        assert_identity(&f.cache);
    });
}

#[test]
fn migrate_object_moves_pages_between_pools_of_a_vm() {
    each(|f| {
        let a = f.pool(1, PoolKind::Ephemeral);
        let b = f.pool(1, PoolKind::Ephemeral);
        for i in 0..4 {
            let k = Key::new(7, i);
            f.cache.put(VmId(1), a, k, &page(a, k, 1)).unwrap();
        }
        assert_eq!(f.cache.migrate_object(VmId(1), a, b, 7).unwrap(), 4);
        assert_eq!(get(&f.cache, 1, a, Key::new(7, 0)), None);
        assert_eq!(get(&f.cache, 1, b, Key::new(7, 0)), Some(page(a, Key::new(7, 0), 1)));
        let sa = f.cache.pool_stats(VmId(1), a).unwrap().counters;
        let sb = f.cache.pool_stats(VmId(1), b).unwrap().counters;
        assert_eq!((sa.migrations_out, sb.migrations_in), (4, 4));
        assert_identity(&f.cache);
    });
}

#[test]
fn pools_are_private_to_their_vm() {
    each(|f| {
        // Pool ids are numbered per VM: VM 1's second pool has an id VM 2 does not have, and VM 1's
        // first pool has the same number as VM 2's only pool without being it.
        let p1 = f.pool(1, PoolKind::Ephemeral);
        let p = f.pool(1, PoolKind::Ephemeral);
        let q = f.pool(2, PoolKind::Ephemeral);
        assert_eq!(p1, q);
        let k = Key::new(1, 1);
        f.cache.put(VmId(1), p, k, &page(p, k, 1)).unwrap();
        f.cache.put(VmId(1), p1, k, &page(p1, k, 1)).unwrap();
        let mut out = vec![0u8; PS];
        assert_eq!(f.cache.get(VmId(2), q, k, &mut out), Ok(false), "VM 2's pool 1 is not VM 1's");
        assert_eq!(f.cache.get(VmId(2), p, k, &mut out), Err(CacheError::UnknownPool(p)));
        assert_eq!(f.cache.put(VmId(2), p, k, &out), Err(CacheError::UnknownPool(p)));
        assert_eq!(f.cache.flush_page(VmId(2), p, k), Err(CacheError::UnknownPool(p)));
        assert_eq!(f.cache.flush_object(VmId(2), p, 1), Err(CacheError::UnknownPool(p)));
        assert_eq!(f.cache.pool_stats(VmId(2), p).unwrap_err(), CacheError::UnknownPool(p));
        assert_eq!(f.cache.migrate_object(VmId(2), p, q, 1), Err(CacheError::UnknownPool(p)));
        assert_eq!(f.cache.destroy_pool(VmId(2), p), Err(CacheError::UnknownPool(p)));
        // VM 2's view of its stats contains nothing of VM 1.
        let s = f.cache.vm_stats(VmId(2)).unwrap();
        assert_eq!(s.totals.used_total(), 0);
        assert_eq!(get(&f.cache, 1, p, k), Some(page(p, k, 1)));
    });
}

#[test]
fn eviction_under_pressure_never_returns_wrong_data() {
    each(|f| {
        let p = f.pool(1, PoolKind::Ephemeral);
        // Four times the total capacity.
        for i in 0..800 {
            let k = Key::new(i % 13, i);
            f.cache.put(VmId(1), p, k, &page(p, k, i)).unwrap();
        }
        let mut hits = 0;
        for i in 0..800 {
            let k = Key::new(i % 13, i);
            if let Some(got) = get(&f.cache, 1, p, k) {
                assert_eq!(got, page(p, k, i));
                hits += 1;
            }
        }
        assert!(hits > 0, "{:?}: something must have stayed", f.flavor);
        let s = f.cache.pool_stats(VmId(1), p).unwrap().counters;
        assert!(s.mem.evictions + s.ssd.evictions > 0);
        assert_identity(&f.cache);
    });
}

#[test]
fn persistent_pages_are_never_evicted_and_gets_keep_them() {
    each(|f| {
        let eph = f.pool(1, PoolKind::Ephemeral);
        let per = f.pool(1, PoolKind::Persistent);
        let mut stored = Vec::new();
        for i in 0..40 {
            let k = Key::new(1, i);
            if f.cache.put(VmId(1), per, k, &page(per, k, 1)).unwrap().is_stored() {
                stored.push(k);
            }
        }
        assert!(!stored.is_empty());
        for i in 0..1000 {
            let k = Key::new(2, i);
            f.cache.put(VmId(1), eph, k, &page(eph, k, 1)).unwrap();
        }
        for k in &stored {
            assert_eq!(get(&f.cache, 1, per, *k), Some(page(per, *k, 1)), "{:?} lost {k:?}", f.flavor);
            // Non-exclusive: still there.
            assert_eq!(get(&f.cache, 1, per, *k), Some(page(per, *k, 1)));
        }
        assert_identity(&f.cache);
    });
}

#[test]
fn persistent_put_that_does_not_fit_is_refused_not_dropped() {
    for (flavor, shards) in Flavor::ALL.into_iter().flat_map(|f| [(f, 1), (f, 4)]) {
        let f = Fixture::new(flavor, 16, 16, shards);
        let per = f.pool(1, PoolKind::Persistent);
        let mut refused = 0;
        let mut stored = Vec::new();
        for i in 0..100 {
            let k = Key::new(1, i);
            match f.cache.put(VmId(1), per, k, &page(per, k, 1)).unwrap() {
                PutOutcome::Stored(_) => stored.push(k),
                PutOutcome::Refused => refused += 1,
            }
        }
        assert!(refused > 0, "{flavor:?}");
        for k in &stored {
            assert_eq!(get(&f.cache, 1, per, *k), Some(page(per, *k, 1)), "{flavor:?} lost {k:?}");
        }
        let s = f.cache.pool_stats(VmId(1), per).unwrap().counters;
        assert_eq!(s.puts_refused, refused);
        assert_identity(&f.cache);
    }
}

#[test]
fn refused_put_invalidates_the_older_copy() {
    each(|f| {
        let p = f.pool(1, PoolKind::Ephemeral);
        let k = Key::new(1, 1);
        f.cache.put(VmId(1), p, k, &page(p, k, 1)).unwrap();
        f.cache.set_spec(VmId(1), p, Spec::None).unwrap();
        assert_eq!(f.cache.put(VmId(1), p, k, &page(p, k, 2)).unwrap(), PutOutcome::Refused);
        assert_eq!(get(&f.cache, 1, p, k), None, "the version-1 page must not survive a newer put");
        assert_identity(&f.cache);
    });
}

#[test]
fn batched_put_and_get() {
    each(|f| {
        let p = f.pool(1, PoolKind::Ephemeral);
        let keys: Vec<Key> = (0..16).map(|i| Key::new(3, i)).collect();
        let pages: Vec<Vec<u8>> = keys.iter().map(|k| page(p, *k, 4)).collect();
        let batch: Vec<(Key, &[u8])> = keys.iter().zip(&pages).map(|(k, d)| (*k, d.as_slice())).collect();
        let out = f.cache.put_batch(VmId(1), p, &batch).unwrap();
        assert!(out.iter().all(|o| o.is_stored()));
        let mut probe = keys.clone();
        probe.push(Key::new(99, 99));
        let mut buf = vec![0u8; probe.len() * PS];
        let hits = f.cache.get_batch(VmId(1), p, &probe, &mut buf).unwrap();
        assert_eq!(hits.iter().filter(|h| **h).count(), 16);
        assert!(!hits[16]);
        for (i, k) in keys.iter().enumerate() {
            assert_eq!(&buf[i * PS..(i + 1) * PS], page(p, *k, 4).as_slice());
        }
        let s = f.cache.pool_stats(VmId(1), p).unwrap().counters;
        assert_eq!(s.gets_missed, 1);
        assert_identity(&f.cache);
    });
}

#[test]
fn batched_get_each_hands_over_hits_in_order() {
    each(|f| {
        // Non-exclusive (memcached's semantics: the daemon's bench pool) and exclusive pools.
        for exclusive_gets in [false, true] {
            let opts = PoolOptions { exclusive_gets, ..PoolOptions::ephemeral(f.flavor.spec()) }
                .with_shards(f.shards);
            let p = f.cache.new_pool(VmId(1), opts).unwrap();
            let keys: Vec<Key> = (0..8).map(|i| Key::new(5, i)).collect();
            let pages: Vec<Vec<u8>> = keys.iter().map(|k| page(p, *k, 7)).collect();
            let batch: Vec<(Key, &[u8])> = keys.iter().zip(&pages).map(|(k, d)| (*k, d.as_slice())).collect();
            assert!(f.cache.put_batch(VmId(1), p, &batch).unwrap().iter().all(|o| o.is_stored()));
            // Misses first, between and last.
            let probe = vec![Key::new(9, 0), keys[0], keys[3], Key::new(9, 1), keys[7], Key::new(9, 2)];
            let h = f.cache.pool_handle(VmId(1), p).unwrap();
            let mut seen = Vec::new();
            let n = h.get_batch_each(&probe, &mut |i, pg| seen.push((i, pg.to_vec()))).unwrap();
            // Shard by shard: in no particular index order, each hit once.
            seen.sort_by_key(|(i, _)| *i);
            assert_eq!(n, 3, "{:?} exclusive {exclusive_gets}", f.flavor);
            let want: Vec<(usize, Vec<u8>)> =
                [(1, 0), (2, 3), (4, 7)].map(|(i, k)| (i, pages[k].clone())).into();
            assert_eq!(seen, want, "{:?} exclusive {exclusive_gets}", f.flavor);
            let c = f.cache.pool_stats(VmId(1), p).unwrap().counters;
            assert_eq!((c.gets_missed, c.mem.gets_hit + c.ssd.gets_hit), (3, 3), "{:?}", f.flavor);
            // A second look finds the pages again only where gets leave them.
            let again = h.get_batch_each(&probe, &mut |_, _| {}).unwrap();
            assert_eq!(again, if exclusive_gets { 0 } else { 3 }, "{:?}", f.flavor);
            let too_many = vec![keys[0]; 65];
            assert!(matches!(
                h.get_batch_each(&too_many, &mut |_, _| {}),
                Err(CacheError::BatchTooLarge { .. })
            ));
            f.cache.destroy_pool(VmId(1), p).unwrap();
            assert_eq!(h.get_batch_each(&probe, &mut |_, _| {}), Err(CacheError::UnknownPool(p)));
            assert_identity(&f.cache);
        }
    });
}

#[test]
fn bad_sizes_are_typed_errors() {
    each(|f| {
        let p = f.pool(1, PoolKind::Ephemeral);
        let err = f.cache.put(VmId(1), p, Key::new(1, 1), &[0u8; 7]).unwrap_err();
        assert_eq!(err, CacheError::BadPageSize { expected: PS, got: 7 });
        assert_eq!(err.code(), 13);
        let keys = vec![Key::new(1, 1); 65];
        let mut buf = vec![0u8; 65 * PS];
        assert!(matches!(
            f.cache.get_batch(VmId(1), p, &keys, &mut buf),
            Err(CacheError::BatchTooLarge { .. })
        ));
    });
}

#[test]
fn pages_land_in_the_stores_the_spec_names() {
    each(|f| {
        let p = f.pool(1, PoolKind::Ephemeral);
        for i in 0..10 {
            let k = Key::new(1, i);
            let o = f.cache.put(VmId(1), p, k, &page(p, k, 1)).unwrap();
            let expected = match f.flavor {
                Flavor::Ssd => StoreKind::Ssd,
                _ => StoreKind::Mem,
            };
            assert_eq!(o, PutOutcome::Stored(expected));
        }
    });
}

#[test]
fn equal_pages_from_different_pools_and_keys_stay_correct() {
    // With de-duplication the same bytes are shared; every rule still holds per key.
    each(|f| {
        let a = f.pool(1, PoolKind::Ephemeral);
        let b = f.pool(2, PoolKind::Ephemeral);
        let same = vec![0xabu8; PS];
        for i in 0..10 {
            f.cache.put(VmId(1), a, Key::new(1, i), &same).unwrap();
            f.cache.put(VmId(2), b, Key::new(1, i), &same).unwrap();
        }
        // Replace one copy with other bytes: the others keep the shared content.
        let other = page(a, Key::new(1, 3), 9);
        f.cache.put(VmId(1), a, Key::new(1, 3), &other).unwrap();
        assert_eq!(get(&f.cache, 1, a, Key::new(1, 3)), Some(other));
        for i in (0..10).filter(|i| *i != 3) {
            assert_eq!(get(&f.cache, 1, a, Key::new(1, i)).as_deref(), Some(same.as_slice()));
            assert_eq!(get(&f.cache, 2, b, Key::new(1, i)).as_deref(), Some(same.as_slice()));
        }
        assert_eq!(get(&f.cache, 2, b, Key::new(1, 3)).as_deref(), Some(same.as_slice()));
        let host = f.cache.host_stats();
        assert_eq!(host.stores[0].used_pages, 0, "{:?}: every frame released", f.flavor);
        if f.flavor.dedup() {
            assert!(host.totals.mem.dedup_hits >= 18, "{:?}", host.totals.mem);
        }
        assert_identity(&f.cache);
    });
}
