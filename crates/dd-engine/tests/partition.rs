//! Weighted partitioning under sustained demand (acceptance 4 of the engine issue): usage converges to
//! the entitlements of SPEC section 3 within 2% of the capacity, whatever the pools' put rates; in global
//! mode it follows the put rates instead.

mod common;

use common::*;
use dd_engine::{Cache, Key, Mode, PoolId, PoolOptions, Spec, StoreKind, VmId, VmWeights};

const CAP: u64 = 4096; // pages
const BATCH: u64 = 64; // pages

/// Drives `rounds` rounds in which pool i puts `rates[i]` new pages.
fn drive(cache: &Cache, pools: &[(VmId, PoolId)], rates: &[u64], rounds: u64, next: &mut u64) {
    for _ in 0..rounds {
        for ((vm, pool), &rate) in pools.iter().zip(rates) {
            for _ in 0..rate {
                *next += 1;
                let k = Key::new(*next / 64, *next);
                cache.put(*vm, *pool, k, &page(*pool, k, *next)).unwrap();
            }
        }
    }
}

fn used(cache: &Cache, vm: VmId, pool: PoolId) -> u64 {
    cache.pool_stats(vm, pool).unwrap().counters.mem.used
}

fn assert_within(cache: &Cache, pools: &[(VmId, PoolId)], expected: &[u64]) {
    for ((vm, p), e) in pools.iter().zip(expected) {
        let u = used(cache, *vm, *p);
        let err = u.abs_diff(*e);
        assert!(err * 50 <= CAP, "pool {p:?}: used {u}, entitlement {e}, error {err} pages > 2% of {CAP}");
        let ent = cache.pool_stats(*vm, *p).unwrap().counters.mem.entitlement;
        assert_eq!(ent, *e, "entitlement of {p:?}");
    }
}

fn setup(weights: &[u32]) -> (tempfile::TempDir, Cache, Vec<(VmId, PoolId)>) {
    let dir = tempfile::tempdir().unwrap();
    let cache = small_cache(dir.path(), CAP, 0, BATCH);
    cache.add_vm(VmId(1), VmWeights::equal(1)).unwrap();
    let pools = weights
        .iter()
        .map(|w| {
            (VmId(1), cache.new_pool(VmId(1), PoolOptions::ephemeral(Spec::Mem { weight: *w })).unwrap())
        })
        .collect();
    (dir, cache, pools)
}

#[test]
fn containers_60_40_converge_whatever_their_put_rates() {
    let (_d, cache, pools) = setup(&[60, 40]);
    let mut n = 0;
    // Pool B puts three times as fast as A; the partition must still be 60:40.
    drive(&cache, &pools, &[1, 3], 20_000, &mut n);
    assert_within(&cache, &pools, &[CAP * 60 / 100, CAP * 40 / 100]);
    assert_identity(&cache);
}

#[test]
fn containers_50_30_20_converge() {
    let (_d, cache, pools) = setup(&[50, 30, 20]);
    let mut n = 0;
    drive(&cache, &pools, &[1, 2, 4], 12_000, &mut n);
    assert_within(&cache, &pools, &[CAP * 50 / 100, CAP * 30 / 100, CAP * 20 / 100]);
    assert_identity(&cache);
}

#[test]
fn weights_changed_at_run_time_converge_to_the_new_entitlements() {
    // Paper Figure 13: 60:40, then a third container at 50:30:20, then the third moved to SSD.
    let dir = tempfile::tempdir().unwrap();
    let cache = small_cache(dir.path(), CAP, 4 * CAP, BATCH);
    cache.add_vm(VmId(1), VmWeights::equal(1)).unwrap();
    let a = cache.new_pool(VmId(1), PoolOptions::ephemeral(Spec::Mem { weight: 60 })).unwrap();
    let b = cache.new_pool(VmId(1), PoolOptions::ephemeral(Spec::Mem { weight: 40 })).unwrap();
    let mut n = 0;
    let two = [(VmId(1), a), (VmId(1), b)];
    drive(&cache, &two, &[2, 2], 8_000, &mut n);
    assert_within(&cache, &two, &[2457, 1638]);
    let c = cache.new_pool(VmId(1), PoolOptions::ephemeral(Spec::Mem { weight: 20 })).unwrap();
    cache.set_spec(VmId(1), a, Spec::Mem { weight: 50 }).unwrap();
    cache.set_spec(VmId(1), b, Spec::Mem { weight: 30 }).unwrap();
    let three = [(VmId(1), a), (VmId(1), b), (VmId(1), c)];
    drive(&cache, &three, &[2, 2, 2], 8_000, &mut n);
    assert_within(&cache, &three, &[2048, 1228, 819]);
    cache.set_spec(VmId(1), c, Spec::Ssd { weight: 100 }).unwrap();
    cache.set_spec(VmId(1), a, Spec::Mem { weight: 60 }).unwrap();
    cache.set_spec(VmId(1), b, Spec::Mem { weight: 40 }).unwrap();
    assert_eq!(used(&cache, VmId(1), c), 0, "moving to SSD takes the pages out of memory");
    drive(&cache, &three, &[2, 2, 2], 8_000, &mut n);
    assert_within(&cache, &two, &[2457, 1638]);
    assert!(cache.pool_stats(VmId(1), c).unwrap().counters.ssd.used > 0);
    assert_identity(&cache);
}

#[test]
fn vms_60_40_then_container_split_inside_each() {
    let dir = tempfile::tempdir().unwrap();
    let cache = small_cache(dir.path(), CAP, 0, BATCH);
    cache.add_vm(VmId(1), VmWeights::equal(60)).unwrap();
    cache.add_vm(VmId(2), VmWeights::equal(40)).unwrap();
    let p1 = cache.new_pool(VmId(1), PoolOptions::ephemeral(Spec::Mem { weight: 1 })).unwrap();
    let p2 = cache.new_pool(VmId(1), PoolOptions::ephemeral(Spec::Mem { weight: 3 })).unwrap();
    let p3 = cache.new_pool(VmId(2), PoolOptions::ephemeral(Spec::Mem { weight: 1 })).unwrap();
    let pools = [(VmId(1), p1), (VmId(1), p2), (VmId(2), p3)];
    let mut n = 0;
    drive(&cache, &pools, &[3, 1, 2], 12_000, &mut n);
    let vm1 = CAP * 60 / 100;
    assert_within(&cache, &pools, &[vm1 / 4, vm1 * 3 / 4, CAP * 40 / 100]);
    assert_identity(&cache);
}

#[test]
fn unused_entitlement_is_shared_and_not_evicted_while_free() {
    // Resource conservation: a lone pool may use the whole store; once a light pool uses less than its
    // share, the heavy ones split the rest.
    let (_d, cache, pools) = setup(&[50, 30, 20]);
    let mut n = 0;
    drive(&cache, &pools[..1], &[1], CAP, &mut n);
    assert_eq!(used(&cache, pools[0].0, pools[0].1), CAP, "nothing evicted while space was free");
    let s = cache.pool_stats(pools[0].0, pools[0].1).unwrap().counters.mem;
    assert_eq!(s.evictions, 0);
    // Pool C only ever holds 100 pages; A and B compete for the rest.
    let c_keys: Vec<Key> = (0..100).map(|i| Key::new(999, i)).collect();
    for k in &c_keys {
        cache.put(pools[2].0, pools[2].1, *k, &page(pools[2].1, *k, 1)).unwrap();
    }
    drive(&cache, &pools[..2], &[1, 1], 12_000, &mut n);
    let (a, b, c) = (
        used(&cache, pools[0].0, pools[0].1),
        used(&cache, pools[1].0, pools[1].1),
        used(&cache, pools[2].0, pools[2].1),
    );
    assert_eq!(c, 100, "the light pool keeps everything it holds");
    // A and B share the rest: the underused entitlement goes to them by weight (Algorithm 1), so they
    // converge to 5:3 of what C leaves.
    let rest = CAP - 100;
    assert!((a as i64 - (rest * 5 / 8) as i64).unsigned_abs() * 50 <= CAP, "a={a} b={b}");
    assert!((b as i64 - (rest * 3 / 8) as i64).unsigned_abs() * 50 <= CAP, "a={a} b={b}");
    assert_identity(&cache);
}

#[test]
fn global_mode_does_not_partition() {
    let (_d, cache, pools) = setup(&[50, 50]);
    cache.set_mode(Mode::Global);
    let mut n = 0;
    drive(&cache, &pools, &[1, 3], 20_000, &mut n);
    let a = used(&cache, pools[0].0, pools[0].1);
    let b = used(&cache, pools[1].0, pools[1].1);
    // One FIFO over both: shares follow the put rates (1:3), not the equal weights.
    assert!(a.abs_diff(CAP / 4) * 50 <= CAP, "a={a} b={b}");
    assert!(b.abs_diff(CAP * 3 / 4) * 50 <= CAP, "a={a} b={b}");
    // Switching back to partitioned mode restores the weights.
    cache.set_mode(Mode::Partitioned);
    drive(&cache, &pools, &[1, 3], 20_000, &mut n);
    assert_within(&cache, &pools, &[CAP / 2, CAP / 2]);
    assert_identity(&cache);
}

#[test]
fn shrinking_capacity_evicts_down_to_it() {
    let (_d, cache, pools) = setup(&[1, 1]);
    let mut n = 0;
    drive(&cache, &pools, &[1, 1], CAP, &mut n);
    cache.set_capacity(StoreKind::Mem, CAP / 2 * PS as u64).unwrap();
    let total: u64 = pools.iter().map(|(v, p)| used(&cache, *v, *p)).sum();
    assert!(total <= CAP / 2);
    drive(&cache, &pools, &[1, 1], CAP, &mut n);
    assert_within(&cache, &pools, &[CAP / 4, CAP / 4]);
    assert_identity(&cache);
}

/// The partition is recomputed incrementally (per VM sums, pools derive theirs on read); it must agree
/// with the reference `policy::compute_entitlements` after any sequence of control-plane changes.
#[test]
fn incremental_entitlements_agree_with_the_reference() {
    use dd_engine::policy::{compute_entitlements, VmShape};
    use rand::{Rng, SeedableRng};
    let cfg = dd_engine::EngineConfig {
        maintenance: dd_engine::config::Maintenance::Inline,
        ssd: None,
        ..Default::default()
    };
    let cache = Cache::new(cfg).unwrap();
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(12);
    let mut pools: Vec<(VmId, PoolId)> = Vec::new();
    for step in 0..400 {
        let vm = VmId(rng.gen_range(1..6));
        let spec = match rng.gen_range(0..4) {
            0 => Spec::None,
            1 => Spec::Mem { weight: rng.gen_range(0..50) },
            2 => Spec::Ssd { weight: rng.gen_range(1..50) },
            _ => Spec::Hybrid { mem_weight: rng.gen_range(0..9), ssd_weight: rng.gen_range(0..9) },
        };
        match rng.gen_range(0..10) {
            0 => {
                let _ =
                    cache.add_vm(vm, VmWeights { mem: rng.gen_range(0..100), ssd: rng.gen_range(0..100) });
            }
            1 if step % 7 == 0 => {
                if cache.remove_vm(vm).is_ok() {
                    pools.retain(|(v, _)| *v != vm);
                }
            }
            2 => {
                let _ = cache.set_vm_weights(vm, VmWeights { mem: rng.gen_range(0..100), ssd: 3 });
            }
            3 | 4 if !pools.is_empty() => {
                let (v, p) = pools[rng.gen_range(0..pools.len())];
                if rng.gen_bool(0.5) {
                    cache.destroy_pool(v, p).unwrap();
                    pools.retain(|x| *x != (v, p));
                } else {
                    cache.set_spec(v, p, spec).unwrap();
                }
            }
            5 => {
                let _ = cache.set_capacity(StoreKind::Mem, rng.gen_range(1..64) << 20);
            }
            _ => {
                if let Ok(p) = cache.new_pool(vm, PoolOptions::ephemeral(spec)) {
                    pools.push((vm, p));
                }
            }
        }
        let host = cache.host_stats();
        let shapes = host
            .vms
            .iter()
            .map(|v| {
                let ps = v.pools.iter().map(|p| (p.pool, p.spec)).collect();
                (v.vm, VmShape { weights: v.weights, pools: ps })
            })
            .collect();
        let cap = [cache.capacity_pages(StoreKind::Mem), cache.capacity_pages(StoreKind::Ssd)];
        let want = compute_entitlements(cap, &shapes);
        for v in &host.vms {
            for s in StoreKind::ALL {
                assert_eq!(v.totals.store(s).entitlement, want.vm[&v.vm][s.idx()], "step {step} vm {}", v.vm);
            }
            for p in &v.pools {
                for s in StoreKind::ALL {
                    let got = p.counters.store(s).entitlement;
                    assert_eq!(
                        got,
                        want.pool[&(v.vm, p.pool)][s.idx()],
                        "step {step} {} pool {}",
                        v.vm,
                        p.pool
                    );
                }
            }
        }
    }
}
