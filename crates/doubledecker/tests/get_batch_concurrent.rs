//! Batched gets of a non-exclusive pool on the real daemon, whose hits are copied from the engine's
//! frames under the pool lock (`PoolHandle::get_batch_each`): while other connections overwrite, flush
//! and evict the same keys (frames freed and reused all the time), every page a batched get returns is
//! whole and is a page that was put under its key, including on a connection that stops reading, so
//! that the daemon's writes to it are cut short and its responses wait in its output buffer.

mod common;

use common::{vm, Daemon};
use dd_engine::{Key, PoolOptions, Spec};
use dd_proto::{KeyList, Request, Response};
use rand::{Rng, SeedableRng};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

const KEYS: u64 = 2048;

/// A page all of whose words are `k << 32 | version`: a page made of two versions, of two keys, or of
/// a frame rewritten during the copy is told from a whole one.
fn stamped(k: u64, version: u32) -> Vec<u8> {
    (k << 32 | version as u64).to_le_bytes().repeat(4096 / 8)
}

fn check(k: u64, page: &[u8]) {
    let first = &page[..8];
    assert!(page.chunks_exact(8).all(|w| w == first), "key {k}: a torn page");
    let word = u64::from_le_bytes(first.try_into().unwrap());
    assert_eq!(word >> 32, k, "key {k}: another key's page");
}

#[test]
fn batched_gets_from_the_frames_stay_whole_under_concurrent_overwrites() {
    let a = vm(1);
    // 4 MiB: half the key space fits, so puts evict and frames are freed and reused throughout.
    let d = Daemon::start_with(&[&a], "", "capacity_bytes = 4194304\n", "");
    let mut admin = d.tcp_client(&a);
    let pool = admin
        .create_cgroup(PoolOptions {
            exclusive_gets: false,
            ..PoolOptions::ephemeral(Spec::Mem { weight: 1 })
        })
        .unwrap();
    let stop = AtomicBool::new(false);
    // Bounded: each thread stops after its rounds or when the deadline passes.
    let deadline = Instant::now() + Duration::from_secs(20);
    let pages_checked = std::thread::scope(|s| {
        for w in 0..2u64 {
            let (d, a, stop) = (&d, &a, &stop);
            s.spawn(move || {
                let mut c = d.tcp_client(a);
                let mut rng = rand::rngs::StdRng::seed_from_u64(w);
                let mut version = 0u32;
                while !stop.load(Ordering::Relaxed) && Instant::now() < deadline {
                    version += 1;
                    let keys: Vec<u64> = (0..16).map(|_| rng.gen_range(0..KEYS)).collect();
                    let pages: Vec<Vec<u8>> = keys.iter().map(|k| stamped(*k, version)).collect();
                    let batch: Vec<(Key, &[u8])> =
                        keys.iter().zip(&pages).map(|(k, p)| (Key::new(0, *k), p.as_slice())).collect();
                    c.put_batch(pool, &batch).unwrap();
                    if version.is_multiple_of(4) {
                        c.flush_page(pool, Key::new(0, rng.gen_range(0..KEYS))).unwrap();
                    }
                }
            });
        }
        let readers: Vec<_> = (0..2u64)
            .map(|r| {
                let (d, a) = (&d, &a);
                s.spawn(move || {
                    let mut c = d.tcp_client(a);
                    let mut rng = rand::rngs::StdRng::seed_from_u64(100 + r);
                    let mut checked = 0u64;
                    for round in 0..40u32 {
                        if Instant::now() >= deadline {
                            break;
                        }
                        // Reader 0 sends 96 batches (6 MiB of answers) before reading any: the
                        // daemon's socket fills and its direct writes are cut short. Reader 1 keeps 4
                        // in flight.
                        let depth = if r == 0 { 96 } else { 4 };
                        let mut sent: std::collections::VecDeque<Vec<u64>> = Default::default();
                        for _ in 0..depth {
                            let keys: Vec<u64> = (0..16).map(|_| rng.gen_range(0..KEYS)).collect();
                            let ks: Vec<Key> = keys.iter().map(|k| Key::new(0, *k)).collect();
                            c.send(&Request::GetBatch { pool, keys: KeyList::Keys(&ks) });
                            sent.push_back(keys);
                        }
                        c.flush().unwrap();
                        if r == 0 && round.is_multiple_of(8) {
                            std::thread::sleep(Duration::from_millis(50));
                        }
                        while let Some(keys) = sent.pop_front() {
                            match c.recv().unwrap().1 {
                                Response::GetBatch { hits, pages } => {
                                    let mut at = pages.chunks_exact(4096);
                                    for (k, _) in keys.iter().zip(&hits).filter(|(_, h)| **h) {
                                        check(*k, at.next().expect("a page per hit"));
                                        checked += 1;
                                    }
                                    assert!(at.next().is_none(), "more pages than hits");
                                }
                                other => panic!("{other:?}"),
                            }
                        }
                    }
                    checked
                })
            })
            .collect();
        let n: u64 = readers.into_iter().map(|h| h.join().unwrap()).sum();
        stop.store(true, Ordering::Relaxed);
        n
    });
    assert!(pages_checked > 1000, "only {pages_checked} hits checked");
}
