//! Tests of the SSD store: round trips on every backend and direct-I/O mode, the write-behind queue,
//! the allocator through the store, and a multi-threaded stress against per-slot generations.

use super::*;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU8};

pub(super) const PS: usize = 4096;

/// Test-only controls of the writer thread.
#[derive(Default)]
pub(super) struct Hooks {
    pub(super) paused: AtomicBool,
}

impl SsdStore {
    /// Stops (or restarts) the writer issuing writes, so queued writes stay queued.
    pub(super) fn pause_writer(&self, paused: bool) {
        let st = self.shared.state.lock();
        self.shared.hooks.paused.store(paused, Ordering::Release);
        drop(st);
        self.shared.work.notify_all();
    }
}

/// A directory on a file system that supports direct I/O (ext4 here).
pub(super) fn disk_dir() -> tempfile::TempDir {
    let base = if Path::new("/var/tmp").is_dir() { PathBuf::from("/var/tmp") } else { std::env::temp_dir() };
    tempfile::Builder::new().prefix("dd-ssd-test").tempdir_in(base).expect("temp dir")
}

pub(super) fn options(dir: &Path, slots: u32, direct_io: DirectIo, io_backend: IoBackend) -> SsdOptions {
    SsdOptions {
        path: dir.join("store.bin"),
        scratch: false,
        slots,
        page_size: PS,
        direct_io,
        io_backend,
        write_queue_pages: 64,
        faults: None,
    }
}

/// Opens a store, or returns `None` (and says so) when this machine refuses a required feature.
pub(super) fn open_or_skip(opts: SsdOptions) -> Option<SsdStore> {
    let what = format!("{:?}/{:?}", opts.direct_io, opts.io_backend);
    match SsdStore::open(opts) {
        Ok(store) => Some(store),
        Err(e) => {
            eprintln!("skipping {what}: {e}");
            None
        }
    }
}

/// The strict configurations (each asserted to be what it says) on ext4.
pub(super) const STRICT: [(DirectIo, IoBackend); 4] = [
    (DirectIo::On, IoBackend::Uring),
    (DirectIo::On, IoBackend::Sync),
    (DirectIo::Off, IoBackend::Uring),
    (DirectIo::Off, IoBackend::Sync),
];

pub(super) fn pattern(slot: u32, gen: u64) -> Vec<u8> {
    let mut page = vec![0u8; PS];
    for (i, word) in page.chunks_exact_mut(8).enumerate() {
        let v = (slot as u64) << 40 ^ gen << 12 ^ i as u64 ^ 0x9e37_79b9_7f4a_7c15;
        word.copy_from_slice(&v.to_le_bytes());
    }
    page
}

pub(super) fn read_page(store: &SsdStore, slot: SlotId) -> Vec<u8> {
    let mut out = vec![0u8; PS];
    store.read(slot, &mut out).expect("read");
    out
}

fn check_round_trip(store: &SsdStore) {
    let slots: Vec<SlotId> = (0..8).map(|_| store.alloc().expect("free slot")).collect();
    for (g, &s) in slots.iter().enumerate() {
        store.write(s, &pattern(s.0, g as u64));
    }
    store.sync();
    for (g, &s) in slots.iter().enumerate() {
        assert_eq!(read_page(store, s), pattern(s.0, g as u64), "slot {}", s.0);
    }
    let mut bufs = vec![vec![0u8; PS]; slots.len()];
    let mut reqs: Vec<(SlotId, &mut [u8])> =
        slots.iter().copied().zip(bufs.iter_mut().map(|b| b.as_mut_slice())).collect();
    let results = store.read_batch(&mut reqs);
    assert!(results.iter().all(|r| r.is_ok()), "{results:?}");
    for (g, (s, buf)) in slots.iter().zip(&bufs).enumerate() {
        assert_eq!(*buf, pattern(s.0, g as u64));
    }
    let stats = store.io_stats();
    assert_eq!(stats.writes, 8);
    assert_eq!(stats.reads, 16);
    assert_eq!(stats.bytes_read, 16 * PS as u64);
    assert_eq!(stats.read_errors + stats.write_errors, 0);
}

#[test]
fn store_is_send_and_sync() {
    fn check<T: Send + Sync>() {}
    check::<SsdStore>();
}

#[test]
fn round_trip_every_backend_and_direct_mode() {
    let dir = disk_dir();
    for (direct, backend) in STRICT {
        let Some(store) = open_or_skip(options(dir.path(), 64, direct, backend)) else { continue };
        assert_eq!(store.direct_io_active(), direct == DirectIo::On);
        assert_eq!(store.uring_active(), backend == IoBackend::Uring);
        check_round_trip(&store);
    }
}

#[test]
fn auto_modes_on_tmpfs_work_whatever_they_pick() {
    let base = Path::new("/dev/shm");
    if !base.is_dir() {
        return;
    }
    let dir = tempfile::Builder::new().prefix("dd-ssd-test").tempdir_in(base).expect("temp dir");
    let store = SsdStore::open(options(dir.path(), 64, DirectIo::Auto, IoBackend::Auto)).expect("open");
    eprintln!("tmpfs: direct {} uring {}", store.direct_io_active(), store.uring_active());
    check_round_trip(&store);
}

#[test]
fn read_is_served_from_the_queue_until_the_write_completes() {
    let dir = disk_dir();
    for (direct, backend) in STRICT {
        let Some(store) = open_or_skip(options(dir.path(), 16, direct, backend)) else { continue };
        store.pause_writer(true);
        let s = store.alloc().expect("slot");
        store.write(s, &pattern(s.0, 1));
        assert_eq!(read_page(&store, s), pattern(s.0, 1));
        let stats = store.io_stats();
        assert_eq!((stats.reads_from_queue, stats.reads, stats.writes), (1, 0, 0));
        store.pause_writer(false);
        store.sync();
        assert_eq!(read_page(&store, s), pattern(s.0, 1));
        let stats = store.io_stats();
        assert_eq!((stats.reads_from_queue, stats.reads, stats.writes), (1, 1, 1));
    }
}

#[test]
fn free_cancels_a_pending_write_and_reuse_never_returns_old_data() {
    let dir = disk_dir();
    for (direct, backend) in STRICT {
        let Some(store) = open_or_skip(options(dir.path(), 16, direct, backend)) else { continue };
        // Written to the file, freed, reused.
        let a = store.alloc().expect("slot");
        store.write(a, &pattern(a.0, 1));
        store.sync();
        store.free(a);
        let b = store.alloc().expect("slot");
        assert_eq!(a, b, "freed slots are reused first");
        store.write(b, &pattern(b.0, 2));
        assert_eq!(read_page(&store, b), pattern(b.0, 2));
        store.sync();
        assert_eq!(read_page(&store, b), pattern(b.0, 2));

        // Queued, freed before issue (cancelled), reused while the new write is queued too.
        store.pause_writer(true);
        store.write(b, &pattern(b.0, 3));
        store.free(b);
        assert_eq!(store.io_stats().cancelled_writes, 1);
        let c = store.alloc().expect("slot");
        assert_eq!(c, b);
        store.write(c, &pattern(c.0, 4));
        assert_eq!(read_page(&store, c), pattern(c.0, 4));
        store.pause_writer(false);
        store.sync();
        assert_eq!(read_page(&store, c), pattern(c.0, 4));
        let stats = store.io_stats();
        assert_eq!(stats.writes, 3, "the cancelled write was never issued");
        assert_eq!(stats.cancelled_writes, 1);
    }
}

#[test]
fn rewrite_of_a_pending_slot_keeps_the_newest_data() {
    let dir = disk_dir();
    let store = SsdStore::open(options(dir.path(), 4, DirectIo::Auto, IoBackend::Auto)).expect("open");
    let s = store.alloc().expect("slot");
    store.pause_writer(true);
    store.write(s, &pattern(s.0, 1));
    store.write(s, &pattern(s.0, 2));
    assert_eq!(read_page(&store, s), pattern(s.0, 2));
    store.pause_writer(false);
    store.sync();
    assert_eq!(read_page(&store, s), pattern(s.0, 2));
    assert_eq!(store.io_stats().cancelled_writes, 1);
    // Many rewrites racing with the writer: the last one always wins.
    for gen in 3..200 {
        store.write(s, &pattern(s.0, gen));
    }
    store.sync();
    assert_eq!(read_page(&store, s), pattern(s.0, 199));
}

#[test]
fn alloc_exhaustion_then_grow() {
    let dir = disk_dir();
    let store = SsdStore::open(options(dir.path(), 4, DirectIo::Auto, IoBackend::Auto)).expect("open");
    let mut got: Vec<SlotId> = (0..4).map_while(|_| store.alloc()).collect();
    assert_eq!(got.len(), 4);
    assert_eq!(store.alloc(), None);
    assert_eq!(store.in_use(), 4);
    store.grow(2).expect("grow never shrinks");
    assert_eq!(store.slots(), 4);
    store.grow(9).expect("grow");
    assert_eq!(store.slots(), 9);
    assert_eq!(std::fs::metadata(dir.path().join("store.bin")).expect("stat").len(), 9 * PS as u64);
    got.extend((0..5).map_while(|_| store.alloc()));
    assert_eq!(got.len(), 9);
    assert_eq!(store.alloc(), None);
    got.sort();
    got.dedup();
    assert_eq!(got.len(), 9, "no slot handed out twice");
    let last = SlotId(8);
    store.write(last, &pattern(8, 1));
    store.sync();
    assert_eq!(read_page(&store, last), pattern(8, 1));
    store.free(last);
    assert_eq!(store.in_use(), 8);
    assert_eq!(store.alloc(), Some(last));
}

#[test]
fn reopening_starts_empty() {
    let dir = disk_dir();
    let opts = options(dir.path(), 8, DirectIo::Auto, IoBackend::Auto);
    {
        let store = SsdStore::open(opts.clone()).expect("open");
        for _ in 0..8 {
            let s = store.alloc().expect("slot");
            store.write(s, &pattern(s.0, 7));
        }
        // No sync: dropping drains the queue.
    }
    let file = std::fs::read(&opts.path).expect("read file");
    assert_eq!(&file[..PS], &pattern(0, 7)[..], "drop drained the write-behind queue");

    let store = SsdStore::open(opts).expect("reopen");
    assert_eq!(store.in_use(), 0);
    let s = store.alloc().expect("alloc after restart");
    assert_eq!(s, SlotId(0));
    assert_eq!(read_page(&store, s), vec![0u8; PS], "old contents are discarded");
}

#[test]
fn unaligned_caller_buffers_bounce() {
    let dir = disk_dir();
    for (direct, backend) in STRICT {
        let Some(store) = open_or_skip(options(dir.path(), 8, direct, backend)) else { continue };
        let slots: Vec<SlotId> = (0..3).map_while(|_| store.alloc()).collect();
        for &s in &slots {
            store.write(s, &pattern(s.0, 5));
        }
        store.sync();
        let mut raw = vec![0u8; 3 * PS + 3];
        let (a, rest) = raw[1..].split_at_mut(PS);
        let (b, rest) = rest.split_at_mut(PS);
        let c = &mut rest[..PS];
        let mut reqs: Vec<(SlotId, &mut [u8])> = vec![(slots[0], a), (slots[1], b), (slots[2], c)];
        assert!(store.read_batch(&mut reqs).iter().all(|r| r.is_ok()));
        for (i, &s) in slots.iter().enumerate() {
            assert_eq!(&raw[1 + i * PS..1 + (i + 1) * PS], &pattern(s.0, 5)[..]);
        }
        let mut one = vec![0u8; PS + 1];
        store.read(slots[2], &mut one[1..]).expect("read");
        assert_eq!(&one[1..], &pattern(slots[2].0, 5)[..]);
    }
}

#[test]
fn batches_larger_than_the_ring_are_chunked() {
    let dir = disk_dir();
    for (direct, backend) in STRICT {
        let Some(store) = open_or_skip(options(dir.path(), 600, direct, backend)) else { continue };
        let slots: Vec<SlotId> = (0..600).map_while(|_| store.alloc()).collect();
        for &s in &slots {
            store.write(s, &pattern(s.0, 9));
        }
        store.sync();
        let mut bufs = vec![0u8; slots.len() * PS];
        let mut reqs: Vec<(SlotId, &mut [u8])> =
            slots.iter().rev().copied().zip(bufs.chunks_exact_mut(PS)).collect();
        assert!(store.read_batch(&mut reqs).iter().all(|r| r.is_ok()));
        for (s, page) in slots.iter().rev().zip(bufs.chunks_exact(PS)) {
            assert!(page == pattern(s.0, 9), "slot {}", s.0);
        }
    }
}

#[test]
fn invalid_options_and_slots_are_errors() {
    let dir = disk_dir();
    let mut opts = options(dir.path(), 4, DirectIo::Off, IoBackend::Sync);
    opts.page_size = 1000;
    assert!(matches!(
        SsdStore::open(opts.clone()),
        Err(StoreError::InvalidOption { field: "page_size", .. })
    ));
    opts.page_size = PS;
    opts.write_queue_pages = 0;
    assert!(matches!(
        SsdStore::open(opts.clone()),
        Err(StoreError::InvalidOption { field: "write_queue_pages", .. })
    ));
    opts.write_queue_pages = 1;
    let store = SsdStore::open(opts).expect("open");
    assert!(store.read(SlotId(4), &mut vec![0u8; PS]).is_err());
    let mut bufs = vec![vec![0u8; PS]; 3];
    let mut reqs: Vec<(SlotId, &mut [u8])> =
        bufs.iter_mut().enumerate().map(|(i, b)| (SlotId(i as u32 * 3), b.as_mut_slice())).collect();
    let results = store.read_batch(&mut reqs);
    assert!(results[0].is_ok() && results[1].is_ok() && results[2].is_err());
}

/// 4 threads allocate, write, read and free with per-slot generations; every read of a live slot must
/// return the last bytes written to it, whether it comes from the queue or the file.
fn stress(direct: DirectIo, backend: IoBackend) {
    const THREADS: usize = 4;
    const SLOTS: u32 = 96;
    let dir = disk_dir();
    let mut opts = options(dir.path(), SLOTS, direct, backend);
    opts.write_queue_pages = 8;
    let Some(store) = open_or_skip(opts) else { return };
    let owners: Vec<AtomicU8> = (0..SLOTS).map(|_| AtomicU8::new(0)).collect();
    let finished = AtomicU8::new(0);
    std::thread::scope(|scope| {
        // The engine's optimistic path: reads of any slot, racing with frees and rewrites, whose
        // results are discarded. They must not crash, hang or disturb the owners' data.
        let (store_ref, finished_ref) = (&store, &finished);
        scope.spawn(move || {
            let mut rng = ChaCha8Rng::seed_from_u64(99);
            let mut bufs = vec![0u8; 4 * PS];
            while finished_ref.load(Ordering::Acquire) < THREADS as u8 {
                let ids: Vec<SlotId> = (0..4).map(|_| SlotId(rng.gen_range(0..SLOTS))).collect();
                let mut reqs: Vec<(SlotId, &mut [u8])> =
                    ids.iter().copied().zip(bufs.chunks_exact_mut(PS)).collect();
                let _ = store_ref.read_batch(&mut reqs);
                let _ = store_ref.read(ids[0], &mut bufs[..PS]);
            }
        });
        for t in 0..THREADS {
            let (store, owners, finished) = (&store, &owners, &finished);
            scope.spawn(move || {
                let mut rng = ChaCha8Rng::seed_from_u64(t as u64);
                let me = t as u8 + 1;
                let mut mine: Vec<(SlotId, u64)> = Vec::new();
                let mut gen = 0u64;
                let mut buf = vec![0u8; PS];
                for _ in 0..3000 {
                    match rng.gen_range(0..10) {
                        0..=2 => {
                            let Some(s) = store.alloc() else { continue };
                            assert_eq!(
                                owners[s.0 as usize].swap(me, Ordering::AcqRel),
                                0,
                                "slot {s:?} given out twice"
                            );
                            gen += 1;
                            store.write(s, &pattern(s.0, gen << 3 | t as u64));
                            mine.push((s, gen << 3 | t as u64));
                        }
                        3 if !mine.is_empty() => {
                            let (s, _) = mine.swap_remove(rng.gen_range(0..mine.len()));
                            owners[s.0 as usize].store(0, Ordering::Release);
                            store.free(s);
                        }
                        4 if !mine.is_empty() => {
                            let k = rng.gen_range(1..=mine.len().min(6));
                            let picked: Vec<(SlotId, u64)> =
                                (0..k).map(|_| mine[rng.gen_range(0..mine.len())]).collect();
                            let mut bufs = vec![vec![0u8; PS]; k];
                            let mut reqs: Vec<(SlotId, &mut [u8])> = picked
                                .iter()
                                .zip(bufs.iter_mut())
                                .map(|(&(s, _), b)| (s, b.as_mut_slice()))
                                .collect();
                            for r in store.read_batch(&mut reqs) {
                                r.expect("batch read");
                            }
                            for ((s, g), b) in picked.iter().zip(&bufs) {
                                assert!(*b == pattern(s.0, *g), "batch read of slot {} is stale", s.0);
                            }
                        }
                        5 if rng.gen_ratio(1, 20) => store.sync(),
                        _ if !mine.is_empty() => {
                            let (s, g) = mine[rng.gen_range(0..mine.len())];
                            store.read(s, &mut buf).expect("read");
                            assert!(buf == pattern(s.0, g), "read of slot {} is stale", s.0);
                        }
                        _ => {}
                    }
                }
                for (s, g) in mine.drain(..) {
                    store.read(s, &mut buf).expect("read");
                    assert!(buf == pattern(s.0, g), "final read of slot {} is stale", s.0);
                    owners[s.0 as usize].store(0, Ordering::Release);
                    store.free(s);
                }
                finished.fetch_add(1, Ordering::AcqRel);
            });
        }
    });
    store.sync();
    assert_eq!(store.in_use(), 0);
    let stats = store.io_stats();
    assert_eq!(stats.write_errors, 0, "{stats:?}");
    assert!(stats.writes > 0 && stats.reads + stats.reads_from_queue > 0, "{stats:?}");
}

#[test]
fn stress_uring_direct() {
    stress(DirectIo::On, IoBackend::Uring);
}

#[test]
fn stress_sync_direct() {
    stress(DirectIo::On, IoBackend::Sync);
}

#[test]
fn stress_uring_buffered() {
    stress(DirectIo::Off, IoBackend::Uring);
}
