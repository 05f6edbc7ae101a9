//! The engine over a failing disk (issue 17, acceptance 2): an I/O fault injector under the SSD store
//! (`store::ssd::faults`) fails reads, writes and file extensions on a countdown. Whatever fails, the
//! engine answers with misses and refused puts, never wrong data, a panic or a hang; the statistics
//! identity holds exactly after each step; and every persistent page the guest stored is either served
//! exactly or counted in `pages_lost`, never lost silently.

mod common;

use common::{page, small_config, PS};
use dd_engine::store::ssd::faults::{Fault, FaultInjector, IoOp};
use dd_engine::{Cache, Key, PoolId, PoolOptions, Spec, VmId, VmWeights};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::collections::HashMap;
use std::sync::Arc;

const VM: VmId = VmId(1);

struct Rig {
    _dir: tempfile::TempDir,
    cache: Cache,
    faults: Arc<FaultInjector>,
    ephemeral: PoolId,
    persistent: PoolId,
}

/// A cache whose SSD store has `ssd_pages` and a fault injector under it; one SSD-only pool of each
/// kind.
fn rig(ssd_pages: u64) -> Rig {
    let dir = tempfile::tempdir().unwrap();
    let faults = FaultInjector::new();
    let cache =
        Cache::with_ssd_faults(small_config(dir.path(), 64, ssd_pages, 8), Some(faults.clone())).unwrap();
    cache.add_vm(VM, VmWeights::equal(100)).unwrap();
    let ephemeral = cache.new_pool(VM, PoolOptions::ephemeral(Spec::Ssd { weight: 100 })).unwrap();
    let persistent = cache.new_pool(VM, PoolOptions::persistent(Spec::Ssd { weight: 100 })).unwrap();
    Rig { _dir: dir, cache, faults, ephemeral, persistent }
}

fn key(i: u64) -> Key {
    Key::new(7, i)
}

/// The statistics identity holds exactly for every pool, the VM and the host, and the engine's own
/// invariants hold.
fn check(c: &Cache) {
    c.check_invariants().unwrap();
    let host = c.host_stats();
    assert!(host.totals.identity_holds(), "host: {:?}", host.totals);
    for vm in &host.vms {
        assert!(vm.totals.identity_holds(), "vm: {:?}", vm.totals);
        for p in &vm.pools {
            assert!(p.counters.identity_holds(), "pool {:?}: {:?}", p.pool, p.counters);
        }
    }
}

fn get(c: &Cache, pool: PoolId, k: Key) -> Option<Vec<u8>> {
    let mut out = vec![0u8; PS];
    c.get(VM, pool, k, &mut out).unwrap().then_some(out)
}

#[test]
fn eio_on_ssd_reads_gives_misses() {
    for fault in [Fault::Eio, Fault::Short] {
        let r = rig(256);
        for pool in [r.ephemeral, r.persistent] {
            for i in 0..16 {
                assert!(r.cache.put(VM, pool, key(i), &page(pool, key(i), 1)).unwrap().is_stored());
            }
        }
        r.cache.quiesce(); // every page is in the file, none served from the queue
        r.faults.fail_after(IoOp::Read, 0, fault, u64::MAX);
        for pool in [r.ephemeral, r.persistent] {
            for i in 0..16 {
                assert_eq!(get(&r.cache, pool, key(i)), None, "{fault:?}: a failed read is a miss");
            }
            check(&r.cache);
        }
        let p = r.cache.pool_stats(VM, r.persistent).unwrap().counters;
        assert_eq!((p.pages_lost, p.ssd.used, p.gets_missed), (16, 0, 16), "{fault:?}: {p:?}");
        let e = r.cache.pool_stats(VM, r.ephemeral).unwrap().counters;
        assert_eq!((e.pages_lost, e.ssd.evictions, e.ssd.gets_hit), (16, 16, 0), "{fault:?}: {e:?}");
        // The disk recovers: new pages are served again.
        r.faults.heal();
        assert!(r.cache.put(VM, r.persistent, key(99), &page(r.persistent, key(99), 2)).unwrap().is_stored());
        assert_eq!(get(&r.cache, r.persistent, key(99)), Some(page(r.persistent, key(99), 2)));
        check(&r.cache);
    }
}

#[test]
fn enospc_and_eio_on_writes_give_refused_puts() {
    for fault in [Fault::Enospc, Fault::Eio] {
        let r = rig(256);
        let pool = r.persistent;
        r.faults.fail_after(IoOp::Write, 0, fault, u64::MAX);
        // The first page is accepted (nothing has failed yet) and its background write fails.
        assert!(r.cache.put(VM, pool, key(0), &page(pool, key(0), 1)).unwrap().is_stored());
        r.cache.quiesce();
        assert!(r.cache.ssd_io_stats().unwrap().failing);
        // From now on the failing disk refuses new pages (but for the occasional probe).
        let outcomes: Vec<bool> = (1..101)
            .map(|i| r.cache.put(VM, pool, key(i), &page(pool, key(i), 1)).unwrap().is_stored())
            .collect();
        r.cache.quiesce();
        let probes = outcomes.iter().filter(|&&s| s).count() as u64;
        assert!(probes <= 2, "{fault:?}: {probes} pages accepted by a failing disk");
        let c = r.cache.pool_stats(VM, pool).unwrap().counters;
        assert_eq!(c.puts_refused, 100 - probes, "{fault:?}");
        // The accepted pages whose writes failed are misses, each one counted as lost.
        for i in 0..101 {
            assert_eq!(get(&r.cache, pool, key(i)), None, "{fault:?}: key {i}");
        }
        let c = r.cache.pool_stats(VM, pool).unwrap().counters;
        assert_eq!(c.pages_lost, 1 + probes, "{fault:?}: every accepted page that was lost is reported");
        assert_eq!(r.cache.ssd_io_stats().unwrap().write_errors, 1 + probes);
        check(&r.cache);
        // Healed: the next probe succeeds and puts are stored again.
        r.faults.heal();
        let stored = (200..400)
            .filter(|&i| {
                let ok = r.cache.put(VM, pool, key(i), &page(pool, key(i), 1)).unwrap().is_stored();
                r.cache.quiesce();
                ok
            })
            .count();
        assert!(stored > 100, "{fault:?}: only {stored} of 200 puts stored after the disk healed");
        assert!(!r.cache.ssd_io_stats().unwrap().failing);
        check(&r.cache);
    }
}

#[test]
fn a_short_write_never_becomes_a_served_page() {
    let r = rig(256);
    for pool in [r.ephemeral, r.persistent] {
        r.faults.fail_after(IoOp::Write, 3, Fault::Short, 1);
        for i in 0..8 {
            assert!(r.cache.put(VM, pool, key(i), &page(pool, key(i), 5)).unwrap().is_stored());
        }
        r.cache.quiesce();
        let mut missed = 0;
        for i in 0..8 {
            match get(&r.cache, pool, key(i)) {
                Some(p) => assert_eq!(p, page(pool, key(i), 5), "key {i}: a torn page was served"),
                None => missed += 1,
            }
        }
        assert_eq!(missed, 1, "exactly the torn page is a miss");
        assert_eq!(r.cache.pool_stats(VM, pool).unwrap().counters.pages_lost, 1);
        check(&r.cache);
        // Let the store leave the failing state before the next pool's round.
        r.faults.heal();
        for i in 100..100 + 2 * 64 {
            let _ = r.cache.put(VM, pool, key(i), &page(pool, key(i), 5)).unwrap();
            r.cache.quiesce();
        }
        assert!(!r.cache.ssd_io_stats().unwrap().failing);
    }
}

#[test]
fn a_failed_ssd_grow_is_an_error_and_the_old_capacity_stays() {
    let r = rig(64);
    r.faults.fail_after(IoOp::Extend, 0, Fault::Enospc, 1);
    let err = r.cache.set_capacity(dd_engine::StoreKind::Ssd, 256 * PS as u64);
    assert!(err.is_err(), "{err:?}");
    for i in 0..64 {
        let _ = r.cache.put(VM, r.persistent, key(i), &page(r.persistent, key(i), 1)).unwrap();
    }
    r.cache.quiesce();
    for i in 0..64 {
        if let Some(p) = get(&r.cache, r.persistent, key(i)) {
            assert_eq!(p, page(r.persistent, key(i), 1));
        }
    }
    check(&r.cache);
}

/// A seeded walk over puts, gets, flushes and fault changes on both pools with a shadow model: every
/// hit is the latest put of its key; in the persistent pool (nothing is ever evicted there) every miss
/// of a key the model holds is a page counted in `pages_lost`, one for one.
#[test]
fn random_faults_never_give_wrong_data_or_unreported_loss() {
    for seed in 0..4u64 {
        let r = rig(512);
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let mut shadow: HashMap<(PoolId, Key), u64> = HashMap::new();
        let mut unexplained_misses = 0u64;
        let mut version = 0u64;
        for step in 0..3000 {
            let pool = if rng.gen_bool(0.5) { r.ephemeral } else { r.persistent };
            let k = key(rng.gen_range(0..64));
            match rng.gen_range(0..100) {
                0..=44 => {
                    version += 1;
                    if r.cache.put(VM, pool, k, &page(pool, k, version)).unwrap().is_stored() {
                        shadow.insert((pool, k), version);
                    } else {
                        shadow.remove(&(pool, k)); // a refused put invalidates the old copy
                    }
                }
                45..=84 => {
                    let got = get(&r.cache, pool, k);
                    let want = shadow.get(&(pool, k)).copied();
                    match (&got, want) {
                        (Some(p), Some(v)) => assert_eq!(*p, page(pool, k, v), "seed {seed} step {step}"),
                        (Some(_), None) => panic!("seed {seed} step {step}: a hit on a key never stored"),
                        (None, Some(_)) if pool == r.persistent => unexplained_misses += 1,
                        _ => {}
                    }
                    if pool == r.ephemeral || got.is_none() {
                        shadow.remove(&(pool, k)); // exclusive get, or the page is gone
                    }
                }
                85..=89 => {
                    let _ = r.cache.flush_page(VM, pool, k).unwrap();
                    shadow.remove(&(pool, k));
                }
                90..=93 => {
                    let op = [IoOp::Read, IoOp::Write][rng.gen_range(0..2)];
                    let fault = [Fault::Eio, Fault::Enospc, Fault::Short][rng.gen_range(0..3)];
                    r.faults.fail_after(op, rng.gen_range(0..8), fault, rng.gen_range(1..6));
                }
                94..=96 => r.faults.heal(),
                _ => r.cache.quiesce(),
            }
            if step % 100 == 0 {
                r.cache.quiesce();
                check(&r.cache);
            }
        }
        r.cache.quiesce();
        check(&r.cache);
        let lost = r.cache.pool_stats(VM, r.persistent).unwrap().counters.pages_lost;
        assert_eq!(unexplained_misses, lost, "seed {seed}: every persistent miss is a reported loss");
        assert!(r.faults.injected() > 0, "seed {seed}: the walk injected no fault");
    }
}
