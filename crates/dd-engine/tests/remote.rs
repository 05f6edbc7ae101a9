//! The engine's side of co-operative de-duplication: pending records, installs, invalidation, pins.
//! The sink here collects offers and releases in memory, standing in for the daemon's queue only; the
//! network path is tested end to end with real daemons in `crates/doubledecker/tests/coop.rs`.

use dd_engine::config::{Maintenance, MemStoreConfig};
use dd_engine::{
    Cache, EngineConfig, Evicted, GetOutcome, Holder, Key, PoolOptions, RemoteRef, RemoteSink, Spec, VmId,
    VmWeights,
};
use parking_lot::Mutex;
use std::sync::Arc;

#[derive(Debug, Default)]
struct Collect {
    offers: Mutex<Vec<Evicted>>,
    released: Mutex<Vec<RemoteRef>>,
}

impl RemoteSink for Collect {
    fn offer(&self, page: Evicted) -> bool {
        self.offers.lock().push(page);
        true
    }
    fn release(&self, r: RemoteRef) {
        self.released.lock().push(r);
    }
}

const PS: usize = 4096;

fn page(seed: u64) -> Vec<u8> {
    (0..PS).map(|i| (seed.wrapping_mul(2654435761).wrapping_add(i as u64 * 7) >> 3) as u8).collect()
}

fn cache(frames: u64) -> Cache {
    let cfg = EngineConfig {
        maintenance: Maintenance::Inline,
        eviction_batch_bytes: PS as u64,
        mem: MemStoreConfig { capacity_bytes: frames * PS as u64, dedup: true, ..Default::default() },
        // The tests name which page a FIFO evicts next: one queue per pool (not the host's shards).
        pool_shards: 1,
        ..Default::default()
    };
    let c = Cache::new(cfg).unwrap();
    // Co-operative de-duplication shares the pages of one de-dup group (the VMs below join it).
    c.set_coop_group(Some(1));
    c
}

/// A cache of `frames` pages with a collecting sink, VM 1 in the co-operative group and one ephemeral
/// memory pool of it.
fn coop_pool(frames: u64) -> (Cache, Arc<Collect>, VmId, dd_engine::PoolId) {
    let c = cache(frames);
    let sink = Arc::new(Collect::default());
    assert!(c.set_remote_sink(sink.clone()));
    let vm = VmId(1);
    c.add_vm(vm, VmWeights::equal(1)).unwrap();
    c.set_vm_dedup_group(vm, Some(1)).unwrap();
    let pool = c.new_pool(vm, PoolOptions::ephemeral(Spec::Mem { weight: 1 })).unwrap();
    (c, sink, vm, pool)
}

fn rref(pin: u64, data: &[u8]) -> RemoteRef {
    RemoteRef::new(Holder { peer: 0, epoch: 9, pin }, xxhash_rust::xxh3::xxh3_128(data))
}

#[test]
fn evicted_unique_pages_are_offered_and_installed_records_invalidate_on_put() {
    let (c, sink, vm, pool) = coop_pool(4);
    // Two keys share one frame: evicting one of them offers nothing (the frame stays for the other).
    c.put(vm, pool, Key::new(1, 0), &page(100)).unwrap();
    c.put(vm, pool, Key::new(1, 1), &page(100)).unwrap();
    for i in 0..4 {
        c.put(vm, pool, Key::new(2, i), &page(i)).unwrap();
    }
    c.check_invariants().unwrap();
    let offers: Vec<Evicted> = std::mem::take(&mut *sink.offers.lock());
    // Key (1,0) was evicted while (1,1) still shared its frame: not offered; (1,1) then was.
    assert_eq!(offers.len(), 1, "{offers:?}");
    let o = &offers[0];
    assert_eq!(o.key, Key::new(1, 1));
    assert_eq!(&*o.data, &page(100)[..]);
    assert!(c.install_remote(vm, pool, o.key, o.token, rref(5, &o.data)));
    assert!(!c.install_remote(vm, pool, o.key, o.token, rref(6, &o.data)), "a token installs once");
    let st = c.pool_stats(vm, pool).unwrap();
    assert_eq!((st.counters.remotified, st.counters.remote_pages), (1, 1));
    let mut out = vec![0u8; PS];
    assert_eq!(c.get_or_remote(vm, pool, Key::new(1, 0), &mut out).unwrap(), GetOutcome::Miss);
    // A put replaces the remote record: the pin is released and a get never sees the old copy.
    c.put(vm, pool, Key::new(1, 1), &page(7)).unwrap();
    assert_eq!(sink.released.lock().as_slice(), &[rref(5, &page(100))]);
    assert_eq!(c.get_or_remote(vm, pool, Key::new(1, 1), &mut out).unwrap(), GetOutcome::Hit);
    assert_eq!(out, page(7));
    c.check_invariants().unwrap();
}

#[test]
fn stale_tokens_never_install_and_exclusive_gets_take_the_record() {
    let (c, sink, vm, pool) = coop_pool(2);
    for i in 0..6 {
        c.put(vm, pool, Key::new(3, i), &page(10 + i)).unwrap();
    }
    let offers: Vec<Evicted> = std::mem::take(&mut *sink.offers.lock());
    assert_eq!(offers.len(), 4);
    // Flushed after the offer: the install must fail.
    c.flush_page(vm, pool, offers[0].key).unwrap();
    assert!(!c.install_remote(vm, pool, offers[0].key, offers[0].token, rref(1, &offers[0].data)));
    // Re-put after the offer: fails too.
    c.put(vm, pool, offers[1].key, &page(99)).unwrap();
    assert!(!c.install_remote(vm, pool, offers[1].key, offers[1].token, rref(2, &offers[1].data)));
    // Abandoned: gone, a later install fails.
    c.abandon_remote(vm, pool, offers[2].key, offers[2].token);
    assert!(!c.install_remote(vm, pool, offers[2].key, offers[2].token, rref(3, &offers[2].data)));
    // Installed, then an exclusive get takes it (once).
    let o = &offers[3];
    assert!(c.install_remote(vm, pool, o.key, o.token, rref(4, &o.data)));
    let mut out = vec![0u8; PS];
    assert_eq!(c.get_or_remote(vm, pool, o.key, &mut out).unwrap(), GetOutcome::Remote(rref(4, &o.data)));
    assert_eq!(c.get_or_remote(vm, pool, o.key, &mut out).unwrap(), GetOutcome::Miss);
    c.record_remote_get(vm, pool, true);
    let st = c.pool_stats(vm, pool).unwrap();
    assert_eq!((st.counters.remotified, st.counters.remote_pages, st.counters.remote_gets_hit), (1, 0, 1));
    c.check_invariants().unwrap();
    // Destroying the pool releases nothing more (no remote record left) and keeps the store consistent.
    c.destroy_pool(vm, pool).unwrap();
    assert!(sink.released.lock().is_empty());
    c.check_invariants().unwrap();
}

#[test]
fn pins_keep_a_frame_after_its_last_local_page_is_gone() {
    let c = cache(4);
    let vm = VmId(1);
    c.add_vm(vm, VmWeights::equal(1)).unwrap();
    c.set_vm_dedup_group(vm, Some(1)).unwrap();
    let pool = c.new_pool(vm, PoolOptions::ephemeral(Spec::Mem { weight: 1 })).unwrap();
    let p = page(42);
    let h = xxhash_rust::xxh3::xxh3_128(&p);
    assert_eq!(c.pin(h, &p), None, "nothing to pin yet");
    c.put(vm, pool, Key::new(1, 1), &p).unwrap();
    assert_eq!(c.pin(h, &page(43)), None, "a hash that does not match the bytes is refused");
    let mut other = p.clone();
    other[0] ^= 1;
    assert_eq!(c.pin(xxhash_rust::xxh3::xxh3_128(&other), &other), None, "different bytes never pin");
    let pin = c.pin(h, &p).expect("equal bytes pin");
    assert_eq!(c.content_hashes(), vec![h]);
    c.flush_page(vm, pool, Key::new(1, 1)).unwrap();
    c.check_invariants().unwrap();
    let mut out = vec![0u8; PS];
    assert!(c.read_pin(pin, &mut out));
    assert_eq!(out, p);
    assert_eq!(c.host_stats().pins_held, 1);
    assert_eq!(c.host_stats().remote_dedups, 1);
    assert!(c.unpin(pin));
    assert!(!c.unpin(pin));
    assert!(!c.read_pin(pin, &mut out));
    assert_eq!(c.host_stats().stores[0].used_pages, 0, "the frame was freed with the last pin");
    c.check_invariants().unwrap();
}

/// Randomised against a model (seeded): puts, gets, flushes and evictions interleaved with the daemon's
/// side (installing some offers as remote records backed by a simulated peer, abandoning others, in any
/// order). Whatever a get returns, locally or from the peer, is the latest put of its key; misses are
/// always allowed. At the end every pin the engine handed out has been released (no leaks).
#[test]
fn remote_records_never_serve_stale_data() {
    use rand::{Rng, SeedableRng};
    use std::collections::HashMap;
    let (mut remote_hits, mut local_hits) = (0, 0);
    for seed in 0..8u64 {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
        let c = cache(8);
        let sink = Arc::new(Collect::default());
        assert!(c.set_remote_sink(sink.clone()));
        let vm = VmId(1);
        c.add_vm(vm, VmWeights::equal(1)).unwrap();
        c.set_vm_dedup_group(vm, Some(1)).unwrap();
        c.set_vm_dedup_group(vm, Some(1)).unwrap();
        let pool = c.new_pool(vm, PoolOptions::ephemeral(Spec::Mem { weight: 1 })).unwrap();
        let mut model: HashMap<Key, Vec<u8>> = HashMap::new();
        // The simulated peer: pin -> bytes it holds for us.
        let mut peer: HashMap<u64, Vec<u8>> = HashMap::new();
        let mut next_pin = 1u64;
        let mut out = vec![0u8; PS];
        for step in 0..3000 {
            let key = Key::new(rng.gen_range(0..3), rng.gen_range(0..16));
            match rng.gen_range(0..100) {
                0..=39 => {
                    let data = page(rng.gen_range(0..200));
                    c.put(vm, pool, key, &data).unwrap();
                    model.insert(key, data);
                }
                40..=64 => match c.get_or_remote(vm, pool, key, &mut out).unwrap() {
                    GetOutcome::Hit => {
                        assert_eq!(Some(&out), model.remove(&key).as_ref(), "step {step}");
                        local_hits += 1;
                    }
                    GetOutcome::Remote(r) => {
                        remote_hits += 1;
                        let bytes = peer.remove(&r.holders()[0].pin).expect("a live pin");
                        assert_eq!(xxhash_rust::xxh3::xxh3_128(&bytes), r.hash);
                        assert_eq!(
                            Some(&bytes),
                            model.remove(&key).as_ref(),
                            "step {step}: stale remote page"
                        );
                    }
                    // A miss changes nothing: a key evicted while its offer is pending misses now and may
                    // still come back once the offer is installed (the latest put's bytes, so coherent).
                    GetOutcome::Miss => {}
                },
                65..=74 => {
                    c.flush_page(vm, pool, key).unwrap();
                    model.remove(&key);
                }
                75..=79 => {
                    c.flush_object(vm, pool, key.object).unwrap();
                    model.retain(|k, _| k.object != key.object);
                }
                _ => {
                    // The daemon handles some queued offers, in a random order.
                    let mut offers: Vec<Evicted> = std::mem::take(&mut *sink.offers.lock());
                    while !offers.is_empty() {
                        let o = offers.swap_remove(rng.gen_range(0..offers.len()));
                        if rng.gen_bool(0.7) {
                            let pin = next_pin;
                            next_pin += 1;
                            let r = RemoteRef::new(Holder { peer: 0, epoch: 1, pin }, o.hash);
                            peer.insert(pin, o.data.to_vec());
                            if !c.install_remote(vm, pool, o.key, o.token, r) {
                                peer.remove(&pin); // the key changed meanwhile: release at once
                            }
                        } else {
                            c.abandon_remote(vm, pool, o.key, o.token);
                        }
                    }
                }
            }
            for r in std::mem::take(&mut *sink.released.lock()) {
                assert!(peer.remove(&r.holders()[0].pin).is_some(), "released twice or never granted");
            }
            if step % 500 == 0 {
                c.check_invariants().unwrap();
            }
        }
        for o in std::mem::take(&mut *sink.offers.lock()) {
            c.abandon_remote(vm, pool, o.key, o.token);
        }
        c.destroy_pool(vm, pool).unwrap();
        for r in std::mem::take(&mut *sink.released.lock()) {
            assert!(peer.remove(&r.holders()[0].pin).is_some());
        }
        assert!(peer.is_empty(), "seed {seed}: {} pins leaked", peer.len());
        c.check_invariants().unwrap();
    }
    // The run must actually exercise both paths (a test that never served a remote page proves nothing).
    assert!(remote_hits > 100 && local_hits > 100, "remote {remote_hits}, local {local_hits}");
}

/// Only the pages of the co-operative group leave their VM's domain: a VM in its own domain (the
/// default) offers nothing when its pages are evicted, and peers can pin nothing of it.
#[test]
fn pages_outside_the_coop_group_are_never_offered_or_pinned() {
    let c = cache(8);
    let sink = Arc::new(Collect::default());
    assert!(c.set_remote_sink(sink.clone()));
    let vm = VmId(1);
    c.add_vm(vm, VmWeights::equal(1)).unwrap();
    let p = c.new_pool(vm, PoolOptions::ephemeral(Spec::Mem { weight: 1 })).unwrap();
    for i in 0..32 {
        c.put(vm, p, Key::new(1, i), &page(i)).unwrap();
    }
    assert!(sink.offers.lock().is_empty(), "a page outside the coop group was offered");
    assert_eq!(c.pin(xxhash_rust::xxh3::xxh3_128(&page(31)), &page(31)), None);
    assert!(c.content_hashes().is_empty());
}

/// A record names every holder (bounded by `MAX_HOLDERS`); a dead peer is struck from it, and only a
/// record left with no holder is dropped (and stops counting in `remote_pages`).
#[test]
fn records_name_every_holder_and_lose_only_dead_ones() {
    let mut r = RemoteRef::new(Holder { peer: 0, epoch: 9, pin: 1 }, 77);
    for peer in 1..dd_engine::MAX_HOLDERS as u32 {
        assert!(r.push(Holder { peer, epoch: 9, pin: 1 + peer as u64 }));
    }
    assert!(!r.push(Holder { peer: 99, epoch: 9, pin: 99 }), "the list is bounded");
    assert_eq!(r.holders().len(), dd_engine::MAX_HOLDERS);

    let (c, sink, vm, pool) = coop_pool(2);
    for i in 0..4 {
        c.put(vm, pool, Key::new(1, i), &page(i)).unwrap();
    }
    let offers: Vec<Evicted> = std::mem::take(&mut *sink.offers.lock());
    assert!(offers.len() >= 2, "{offers:?}");
    let two = |o: &Evicted| {
        let mut r = RemoteRef::new(Holder { peer: 0, epoch: 9, pin: 10 }, o.hash);
        r.push(Holder { peer: 1, epoch: 4, pin: 20 });
        r
    };
    assert!(c.install_remote(vm, pool, offers[0].key, offers[0].token, two(&offers[0])));
    assert!(c.install_remote(vm, pool, offers[1].key, offers[1].token, rref(30, &offers[1].data)));
    // Peer 0 dies: the first record keeps peer 1, the second (only peer 0) goes.
    assert_eq!(c.drop_dead_remote(&|h: &Holder| h.peer == 0), 1);
    assert_eq!(c.pool_stats(vm, pool).unwrap().counters.remote_pages, 1);
    let mut out = vec![0u8; PS];
    let GetOutcome::Remote(left) = c.get_or_remote(vm, pool, offers[0].key, &mut out).unwrap() else {
        panic!("the record with a live holder is gone")
    };
    assert_eq!(left.holders(), &[Holder { peer: 1, epoch: 4, pin: 20 }]);
    assert_eq!(c.get_or_remote(vm, pool, offers[1].key, &mut out).unwrap(), GetOutcome::Miss);
    c.check_invariants().unwrap();
}
