//! Concurrency stress (acceptance 6 of the engine issue): several threads put, get, flush and migrate
//! across VMs, pools and stores while another thread reconfigures capacities, weights, specs, mode and
//! batch size, and the background maintenance worker moves hybrid pages. At the end the statistics
//! identity holds exactly everywhere, every persistent page that was stored is still there with its
//! latest bytes, and no get ever returned bytes that were not the latest put of its key.

mod common;

use common::*;
use dd_engine::config::Maintenance;
use dd_engine::{Cache, Key, Mode, PoolId, PoolOptions, Spec, StoreKind, VmId, VmWeights};
use rand::{Rng, SeedableRng};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

const THREADS: usize = 4;
const OPS_PER_THREAD: usize = 40_000;
/// How long a worker may go on past its quota waiting for a demotion (a run takes about 0.3 s).
const DEMOTION_WAIT: std::time::Duration = std::time::Duration::from_secs(60);

#[test]
fn mixed_load_with_reconfiguration_keeps_every_rule() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = small_config(dir.path(), 256, 512, 8);
    cfg.maintenance = Maintenance::Background;
    cfg.maintenance_interval_ms = 1;
    let cache = Arc::new(Cache::new(cfg).unwrap());
    for vm in 1..=2 {
        cache.add_vm(VmId(vm), VmWeights { mem: vm, ssd: 3 - vm }).unwrap();
    }
    // Each worker thread owns its keys (object = thread id) so it can model them exactly; pools are
    // shared between threads, which is what makes the locking interesting.
    let specs = [
        Spec::Mem { weight: 3 },
        Spec::Ssd { weight: 2 },
        Spec::Hybrid { mem_weight: 1, ssd_weight: 1 },
        Spec::Mem { weight: 1 },
    ];
    let mut pools: Vec<(VmId, PoolId)> = Vec::new();
    for (i, spec) in specs.iter().enumerate() {
        let vm = VmId(1 + (i as u32 % 2));
        pools.push((vm, cache.new_pool(vm, PoolOptions::ephemeral(*spec)).unwrap()));
    }
    let persistent: Vec<(VmId, PoolId)> = (1..=2)
        .map(|vm| {
            (VmId(vm), cache.new_pool(VmId(vm), PoolOptions::persistent(Spec::Mem { weight: 1 })).unwrap())
        })
        .collect();
    let stop = Arc::new(AtomicBool::new(false));

    let reconfig = {
        let cache = cache.clone();
        let stop = stop.clone();
        let pools = pools.clone();
        std::thread::spawn(move || {
            let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(99);
            let mut n = 0u64;
            while !stop.load(Ordering::Relaxed) {
                n += 1;
                match rng.gen_range(0..6) {
                    0 => cache.set_capacity(StoreKind::Mem, rng.gen_range(128..320) * PS as u64).unwrap(),
                    1 => cache.set_capacity(StoreKind::Ssd, rng.gen_range(256..640) * PS as u64).unwrap(),
                    2 => {
                        let vm = VmId(rng.gen_range(1..=2));
                        cache
                            .set_vm_weights(
                                vm,
                                VmWeights { mem: rng.gen_range(1..5), ssd: rng.gen_range(1..5) },
                            )
                            .unwrap()
                    }
                    3 => {
                        let (vm, p) = pools[rng.gen_range(0..pools.len())];
                        let spec = specs_for(rng.gen_range(0..4), rng.gen_range(1..9));
                        cache.set_spec(vm, p, spec).unwrap();
                    }
                    4 => cache.set_mode(if rng.gen_bool(0.2) { Mode::Global } else { Mode::Partitioned }),
                    _ => cache.set_eviction_batch(rng.gen_range(1..16) * PS as u64).unwrap(),
                }
                std::thread::sleep(std::time::Duration::from_micros(200));
            }
            n
        })
    };

    let workers: Vec<_> = (0..THREADS)
        .map(|t| {
            let cache = cache.clone();
            let pools = pools.clone();
            let persistent = persistent.clone();
            std::thread::spawn(move || worker(t, &cache, &pools, &persistent))
        })
        .collect();
    let mut persistent_models = Vec::new();
    for w in workers {
        persistent_models.push(w.join().expect("worker panicked"));
    }
    stop.store(true, Ordering::Relaxed);
    let reconfigs = reconfig.join().unwrap();
    assert!(reconfigs > 10, "the reconfiguration thread must have run");
    cache.quiesce();
    assert_identity(&cache);
    // No persistent page lost.
    for (t, model) in persistent_models.into_iter().enumerate() {
        for ((vm, pool, key), version) in model {
            let mut out = vec![0u8; PS];
            assert!(cache.get(vm, pool, key, &mut out).unwrap(), "thread {t}: persistent {key:?} lost");
            assert_eq!(out, page(pool, key, version));
        }
    }
    let t = cache.host_stats().totals;
    assert!(t.mem.evictions > 0 && t.demotions > 0 && t.migrations_in > 0, "{t:?}");
}

fn specs_for(code: u32, w: u32) -> Spec {
    match code {
        0 => Spec::Mem { weight: w },
        1 => Spec::Ssd { weight: w },
        2 => Spec::Hybrid { mem_weight: w, ssd_weight: 10 - w },
        _ => Spec::Mem { weight: 1 + w },
    }
}

type Model = HashMap<(VmId, PoolId, Key), u64>;

fn worker(t: usize, cache: &Cache, pools: &[(VmId, PoolId)], persistent: &[(VmId, PoolId)]) -> Model {
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(t as u64);
    let mut eph: Model = HashMap::new();
    let mut per: Model = HashMap::new();
    let mut version = (t as u64) << 40;
    let obj = t as u64;
    let mut out = vec![0u8; PS];
    // Past its quota a worker goes on until the maintenance worker has demoted something (for at most
    // `DEMOTION_WAIT` more): the run must exercise demotion under load, and with a fixed count it
    // sometimes did not (the reconfiguration thread re-specs the hybrid pool and shrinks the memory
    // store at random; about one run in twelve ended with no demotion and failed the final check). A
    // bound of four times the quota still failed about one run in twenty-five on two busy cores (CI of
    // 066aca2 ran it beside the other tests): the bound is in time, not operations.
    let started = std::time::Instant::now();
    let mut i = 0;
    while i < OPS_PER_THREAD
        || ((i % 1024 != 0 || cache.host_stats().totals.demotions == 0) && started.elapsed() < DEMOTION_WAIT)
    {
        i += 1;
        let key = Key::new(obj, rng.gen_range(0..64));
        version += 1;
        match rng.gen_range(0..100) {
            0..=39 => {
                let (vm, p) = pools[rng.gen_range(0..pools.len())];
                if cache.put(vm, p, key, &page(p, key, version)).unwrap().is_stored() {
                    eph.insert((vm, p, key), version);
                } else {
                    eph.remove(&(vm, p, key));
                }
            }
            40..=74 => {
                let (vm, p) = pools[rng.gen_range(0..pools.len())];
                if cache.get(vm, p, key, &mut out).unwrap() {
                    let v = eph.remove(&(vm, p, key)).expect("hit on a key this thread never stored there");
                    // The page may have been migrated here from another pool: its bytes name the writer.
                    let writer = PoolId(u32::from_le_bytes(out[0..4].try_into().unwrap()));
                    assert_eq!(out, page(writer, key, v), "stale or wrong bytes");
                } else {
                    eph.remove(&(vm, p, key));
                }
            }
            75..=84 => {
                let (vm, p) = persistent[rng.gen_range(0..persistent.len())];
                if cache.put(vm, p, key, &page(p, key, version)).unwrap().is_stored() {
                    per.insert((vm, p, key), version);
                } else {
                    per.remove(&(vm, p, key));
                }
            }
            85..=92 => {
                let (vm, p) = persistent[rng.gen_range(0..persistent.len())];
                let hit = cache.get(vm, p, key, &mut out).unwrap();
                match per.get(&(vm, p, key)) {
                    Some(v) => {
                        assert!(hit, "persistent page lost");
                        assert_eq!(out, page(p, key, *v));
                    }
                    None => assert!(!hit, "persistent get returned a page never stored"),
                }
            }
            93..=96 => {
                let (vm, p) = pools[rng.gen_range(0..pools.len())];
                cache.flush_page(vm, p, key).unwrap();
                eph.remove(&(vm, p, key));
            }
            _ => {
                // Migrate this thread's object between two pools of one VM.
                let vm = VmId(1 + rng.gen_range(0..2));
                let same_vm: Vec<PoolId> = pools.iter().filter(|(v, _)| *v == vm).map(|(_, p)| *p).collect();
                let (a, b) = (same_vm[0], same_vm[1]);
                let (from, to) = if rng.gen_bool(0.5) { (a, b) } else { (b, a) };
                cache.migrate_object(vm, from, to, obj).unwrap();
                let moved: Vec<(Key, u64)> = eph
                    .iter()
                    .filter(|((v, p, _), _)| *v == vm && *p == from)
                    .map(|((_, _, k), ver)| (*k, *ver))
                    .collect();
                eph.retain(|(v, p, _), _| !(*v == vm && (*p == from || *p == to)));
                for (k, ver) in moved {
                    eph.insert((vm, to, k), ver);
                }
            }
        }
    }
    per
}

/// Issue 28: eight threads on one sharded pool of each kind (a non-exclusive memory pool, an exclusive
/// hybrid pool, 8 shards each) while a ninth reads their statistics. Every hit is the latest put of its
/// key, every statistics snapshot satisfies the identity (the pool's counters are the sum of its
/// shards', each read under its lock), and at the end the invariants and the identity hold exactly.
#[test]
fn eight_threads_on_one_sharded_pool_stay_coherent_and_exact() {
    const WORKERS: u64 = 8;
    const OPS: usize = 12_000;
    let dir = tempfile::tempdir().unwrap();
    // Inline maintenance: the workers' own puts demote the hybrid pool's pages, concurrently with each
    // other (a background worker might not get to run on a busy machine).
    let cache = Arc::new(Cache::new(small_config(dir.path(), 384, 768, 8)).unwrap());
    let vm = VmId(1);
    cache.add_vm(vm, VmWeights::equal(1)).unwrap();
    let shared = PoolOptions { exclusive_gets: false, ..PoolOptions::ephemeral(Spec::Mem { weight: 3 }) };
    let a = cache.new_pool(vm, shared.with_shards(8)).unwrap();
    let hybrid = Spec::Hybrid { mem_weight: 1, ssd_weight: 1 };
    let b = cache.new_pool(vm, PoolOptions::ephemeral(hybrid).with_shards(8)).unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let monitor = {
        let (cache, stop) = (cache.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut snapshots = 0u64;
            while !stop.load(Ordering::Relaxed) {
                for p in [a, b] {
                    let c = cache.pool_stats(vm, p).unwrap().counters;
                    assert!(c.identity_holds(), "identity broken in a snapshot of pool {p}: {c:?}");
                }
                snapshots += 1;
            }
            snapshots
        })
    };
    let workers: Vec<_> = (0..WORKERS)
        .map(|t| {
            let cache = cache.clone();
            std::thread::spawn(move || {
                let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(0x28_0000 + t);
                // key -> version this thread last stored, per pool (its keys are its own object's).
                let mut model: [HashMap<Key, u64>; 2] = [HashMap::new(), HashMap::new()];
                let mut version = t << 40;
                let mut out = vec![0u8; PS];
                let mut hits = 0u64;
                for _ in 0..OPS {
                    let key = Key::new(t, rng.gen_range(0..128));
                    let which = rng.gen_range(0..2usize);
                    let p = [a, b][which];
                    version += 1;
                    match rng.gen_range(0..100) {
                        0..=44 => {
                            if cache.put(vm, p, key, &page(p, key, version)).unwrap().is_stored() {
                                model[which].insert(key, version);
                            } else {
                                model[which].remove(&key);
                            }
                        }
                        45..=84 => {
                            if cache.get(vm, p, key, &mut out).unwrap() {
                                let v = model[which].get(&key).copied().expect("hit on a key never stored");
                                assert_eq!(out, page(p, key, v), "stale or wrong bytes");
                                hits += 1;
                                if p == b {
                                    model[which].remove(&key);
                                }
                            } else {
                                model[which].remove(&key);
                            }
                        }
                        85..=92 => {
                            // A batch of 16 consecutive keys: several shards of the pool at once.
                            let first = rng.gen_range(0..112);
                            let keys: Vec<Key> = (first..first + 16).map(|i| Key::new(t, i)).collect();
                            let mut buf = vec![0u8; 16 * PS];
                            let got = cache.get_batch(vm, p, &keys, &mut buf).unwrap();
                            for (i, k) in keys.iter().enumerate() {
                                if got[i] {
                                    let v = model[which].get(k).copied().expect("batch hit never stored");
                                    assert_eq!(&buf[i * PS..(i + 1) * PS], &page(p, *k, v)[..]);
                                    hits += 1;
                                    if p == b {
                                        model[which].remove(k);
                                    }
                                } else {
                                    model[which].remove(k);
                                }
                            }
                        }
                        93..=98 => {
                            cache.flush_page(vm, p, key).unwrap();
                            model[which].remove(&key);
                        }
                        _ => {
                            cache.flush_object(vm, p, t).unwrap();
                            model[which].clear();
                        }
                    }
                }
                hits
            })
        })
        .collect();
    let hits: u64 = workers.into_iter().map(|w| w.join().expect("worker panicked")).sum();
    stop.store(true, Ordering::Relaxed);
    let snapshots = monitor.join().expect("a statistics snapshot broke the identity");
    cache.quiesce();
    cache.check_invariants().unwrap();
    assert_identity(&cache);
    let (sa, sb) = (cache.pool_stats(vm, a).unwrap().counters, cache.pool_stats(vm, b).unwrap().counters);
    eprintln!("hits {hits}, snapshots {snapshots}, a {sa:?}, b {sb:?}");
    assert!(hits > 1_000 && snapshots > 10, "hits {hits}, snapshots {snapshots}");
    assert!(sa.mem.evictions > 0 && sb.demotions > 0, "the run must evict and demote: {sa:?} {sb:?}");
}

/// Non-exclusive gets copy their pages with no lock held, from frames they hold for reading
/// (`store::mem`), while other threads replace, flush and evict those very pages: every page a get
/// returns is whole and is one that was put under its key (no frame reused under a reader), and at the
/// end every frame freed while held has been freed and given back to the reservation.
#[test]
fn non_exclusive_gets_copy_outside_the_lock_while_their_pages_are_replaced() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = small_config(dir.path(), 96, 0, 4);
    let cfg = dd_engine::EngineConfig { ssd: None, maintenance: Maintenance::Inline, ..cfg };
    let cache = Arc::new(Cache::new(cfg).unwrap());
    cache.add_vm(VmId(1), VmWeights::equal(1)).unwrap();
    let opts = PoolOptions { exclusive_gets: false, ..PoolOptions::ephemeral(Spec::Mem { weight: 1 }) };
    let pool = cache.new_pool(VmId(1), opts.with_shards(4)).unwrap();
    let keys: Vec<Key> = (0..128).map(|i| Key::new(i / 16, i)).collect();
    std::thread::scope(|s| {
        for t in 0..4u64 {
            let (cache, keys) = (&cache, &keys);
            s.spawn(move || {
                let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(t);
                let mut version = t << 40;
                for _ in 0..6000 {
                    version += 1;
                    let key = keys[rng.gen_range(0..keys.len())];
                    match rng.gen_range(0..10) {
                        // Writers replace pages (the old frame is freed, often while a reader holds it).
                        0..=3 => {
                            cache.put(VmId(1), pool, key, &page(pool, key, version)).unwrap();
                        }
                        4 => {
                            cache.flush_page(VmId(1), pool, key).unwrap();
                        }
                        _ => {
                            let batch: Vec<Key> =
                                (0..8).map(|_| keys[rng.gen_range(0..keys.len())]).collect();
                            cache
                                .get_batch_each(VmId(1), pool, &batch, &mut |i, pg| {
                                    let v = u64::from_le_bytes(pg[20..28].try_into().unwrap());
                                    assert_eq!(pg, page(pool, batch[i], v), "a torn or foreign page");
                                })
                                .unwrap();
                        }
                    }
                }
            });
        }
    });
    assert_identity(&cache);
    cache.check_invariants().unwrap();
    let used = cache.pool_stats(VmId(1), pool).unwrap().counters.mem.used;
    assert_eq!(cache.host_stats().stores[0].used_pages, used, "a frame freed while held leaked");
}
