//! The SSD store under injected I/O faults (`faults`): every fault is an error for the slot it hit,
//! never wrong data, a panic or a hang, on every backend and direct-I/O mode.

use super::faults::{Fault, FaultInjector, IoOp};
use super::tests::{disk_dir, open_or_skip, options, pattern, read_page, PS, STRICT};
use super::*;
use std::time::Duration;

/// Opens a store on every strict configuration this machine supports, with `faults` under it.
fn stores(dir: &std::path::Path, slots: u32) -> Vec<(SsdStore, Arc<FaultInjector>)> {
    STRICT
        .iter()
        .filter_map(|&(direct, backend)| {
            let faults = FaultInjector::new();
            let mut opts = options(dir, slots, direct, backend);
            opts.faults = Some(faults.clone());
            open_or_skip(opts).map(|s| (s, faults))
        })
        .collect()
}

#[test]
fn failed_write_marks_the_slot_bad_until_rewritten() {
    let dir = disk_dir();
    for fault in [Fault::Eio, Fault::Enospc, Fault::Short] {
        for (store, faults) in stores(dir.path(), 4) {
            let s = store.alloc().expect("slot");
            store.write(s, &pattern(s.0, 1));
            store.sync();
            faults.fail_after(IoOp::Write, 0, fault, 1);
            store.write(s, &pattern(s.0, 2));
            store.sync();
            assert!(store.read(s, &mut vec![0u8; PS]).is_err(), "{fault:?}: never the stale page");
            let stats = store.io_stats();
            assert_eq!((stats.write_errors, stats.read_errors), (1, 1), "{fault:?}");
            store.write(s, &pattern(s.0, 3));
            store.sync();
            assert_eq!(read_page(&store, s), pattern(s.0, 3), "{fault:?}: a rewrite heals the slot");
            // Freeing clears the mark too.
            faults.fail_after(IoOp::Write, 0, fault, 1);
            store.write(s, &pattern(s.0, 4));
            store.sync();
            store.free(s);
            let t = store.alloc().expect("slot");
            store.write(t, &pattern(t.0, 5));
            store.sync();
            assert_eq!(read_page(&store, t), pattern(t.0, 5));
        }
    }
}

#[test]
fn a_short_write_never_becomes_a_served_page() {
    let dir = disk_dir();
    for (store, faults) in stores(dir.path(), 8) {
        let slots: Vec<SlotId> = (0..4).map(|_| store.alloc().expect("slot")).collect();
        // The second write of the batch is torn: half of it reaches the file. (The writer is paused so
        // that the four writes form one batch, whose failure leaves the store failing.)
        faults.fail_after(IoOp::Write, 1, Fault::Short, 1);
        store.pause_writer(true);
        for &s in &slots {
            store.write(s, &pattern(s.0, 7));
        }
        store.pause_writer(false);
        store.sync();
        let mut bufs = vec![vec![0u8; PS]; slots.len()];
        let mut reqs: Vec<(SlotId, &mut [u8])> =
            slots.iter().copied().zip(bufs.iter_mut().map(|b| b.as_mut_slice())).collect();
        let results = store.read_batch(&mut reqs);
        let failed: Vec<bool> = results.iter().map(|r| r.is_err()).collect();
        assert_eq!(failed.iter().filter(|&&f| f).count(), 1, "{results:?}");
        for ((s, buf), failed) in slots.iter().zip(&bufs).zip(&failed) {
            if !failed {
                assert_eq!(*buf, pattern(s.0, 7), "slot {}", s.0);
            }
        }
        assert!(store.io_stats().failing, "a torn write makes the store failing");
    }
}

#[test]
fn eio_and_short_reads_are_errors_for_their_slots_only() {
    let dir = disk_dir();
    for fault in [Fault::Eio, Fault::Short] {
        for (store, faults) in stores(dir.path(), 8) {
            let slots: Vec<SlotId> = (0..6).map(|_| store.alloc().expect("slot")).collect();
            for &s in &slots {
                store.write(s, &pattern(s.0, 3));
            }
            store.sync();
            faults.fail_after(IoOp::Read, 2, fault, 2);
            let mut bufs = vec![vec![0u8; PS]; slots.len()];
            let mut reqs: Vec<(SlotId, &mut [u8])> =
                slots.iter().copied().zip(bufs.iter_mut().map(|b| b.as_mut_slice())).collect();
            let results = store.read_batch(&mut reqs);
            let failed: Vec<bool> = results.iter().map(|r| r.is_err()).collect();
            assert_eq!(failed, [false, false, true, true, false, false], "{fault:?}");
            for ((s, buf), failed) in slots.iter().zip(&bufs).zip(&failed) {
                if !failed {
                    assert_eq!(*buf, pattern(s.0, 3));
                }
            }
            assert_eq!(store.io_stats().read_errors, 2);
            // The pages are intact on disk: the next reads succeed.
            for &s in &slots {
                assert_eq!(read_page(&store, s), pattern(s.0, 3));
            }
        }
    }
}

#[test]
fn a_failing_store_refuses_new_pages_until_a_probe_write_succeeds() {
    let dir = disk_dir();
    for (store, faults) in stores(dir.path(), 4) {
        let s = store.alloc().expect("slot");
        assert!(store.accepting());
        faults.fail_after(IoOp::Write, 0, Fault::Enospc, u64::MAX);
        store.write(s, &pattern(s.0, 1));
        store.sync();
        let offered = 3 * PROBE_EVERY;
        let accepted = (0..offered).filter(|_| store.accepting()).count() as u64;
        assert_eq!(accepted, 3, "one probe in PROBE_EVERY");
        assert_eq!(store.io_stats().writes_refused, offered - 3);
        // A probe that fails keeps the state; the disk heals; the next probe ends it.
        store.write(s, &pattern(s.0, 2));
        store.sync();
        assert!(store.io_stats().failing);
        faults.heal();
        store.write(s, &pattern(s.0, 3));
        store.sync();
        assert!(!store.io_stats().failing);
        assert!(store.accepting());
        assert_eq!(read_page(&store, s), pattern(s.0, 3));
    }
}

#[test]
fn a_slow_write_queue_applies_back_pressure_and_never_hangs() {
    let dir = disk_dir();
    let faults = FaultInjector::new();
    faults.set_write_delay(Duration::from_millis(2));
    let mut opts = options(dir.path(), 64, DirectIo::Auto, IoBackend::Auto);
    opts.write_queue_pages = 2;
    opts.faults = Some(faults.clone());
    let store = SsdStore::open(opts).expect("open");
    let slots: Vec<SlotId> = (0..64).map(|_| store.alloc().expect("slot")).collect();
    std::thread::scope(|scope| {
        scope.spawn(|| {
            for &s in &slots {
                store.write(s, &pattern(s.0, 11));
            }
        });
        // Readers racing with the blocked writer see each page from the queue or the file.
        scope.spawn(|| {
            for _ in 0..200 {
                for &s in &slots[..4] {
                    let mut out = vec![0u8; PS];
                    if store.read(s, &mut out).is_ok() && out != vec![0u8; PS] {
                        assert_eq!(out, pattern(s.0, 11));
                    }
                }
            }
        });
    });
    store.sync();
    for &s in &slots {
        assert_eq!(read_page(&store, s), pattern(s.0, 11));
    }
    assert_eq!(store.io_stats().writes, 64);
}

#[test]
fn a_failed_grow_leaves_the_store_as_it_was() {
    let dir = disk_dir();
    for fault in [Fault::Enospc, Fault::Short, Fault::Eio] {
        for (store, faults) in stores(dir.path(), 2) {
            faults.fail_after(IoOp::Extend, 0, fault, 1);
            assert!(store.grow(8).is_err(), "{fault:?}");
            assert_eq!(store.slots(), 2);
            let got: Vec<SlotId> = (0..4).map_while(|_| store.alloc()).collect();
            assert_eq!(got.len(), 2, "no slot beyond the old size is handed out");
            store.grow(8).expect("the disk has room again");
            assert_eq!(store.slots(), 8);
            let s = store.alloc().expect("slot");
            store.write(s, &pattern(s.0, 1));
            store.sync();
            assert_eq!(read_page(&store, s), pattern(s.0, 1));
        }
    }
}
