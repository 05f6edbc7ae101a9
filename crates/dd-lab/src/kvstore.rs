//! Two emulated data stores served by a YCSB client: where their records live and which pages each
//! request touches. The emulator (`sim`) charges the touches through its usual paths and latencies.
//!
//! * **Redis-like** (`redis`): the records are in the server's heap, anonymous memory. A record the
//!   guest reclaimed was swapped out; touching it faults it back (swap device, or the container's
//!   frontswap pool when configured): latency = page hit, or swap-in from the disk.
//! * **MongoDB-like** (`mongo`, the mmapv1 engine): the records are in a memory-mapped data file. Their
//!   pages are file pages in the page cache; a reclaimed clean page is dropped (and put to the
//!   container's cleancache pool), a dirty one written back first; a fault reads the page from the pool
//!   or the disk. An update reads the record's pages and dirties them; an insert dirties fresh pages.
//!
//! Layout: record `k` occupies bytes `k * record_bytes ..` of the store's object (its heap or its data
//! file), so small records share pages and a scan touches consecutive pages. YCSB's load phase comes
//! first: the client's threads insert the `record_count` records in order, one per operation, then run
//! the workload's mix.
//!
//! Invariants: every page range returned lies inside the object (`< capacity_pages`); inserts beyond the
//! object's capacity (twice the loaded records) reuse its last page.

use crate::scenario::PAGE;
use crate::ycsb::{Op, Ycsb, YcsbWorkload};
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};

/// Which store a YCSB workload runs against.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum StoreKind {
    Redis,
    Mongo,
}

/// A run of pages one request touches: `(first page, pages, write)`.
pub type Touch = (u32, u32, bool);

/// One store and the YCSB client driving it.
#[derive(Debug, Clone)]
pub struct Store {
    pub kind: StoreKind,
    ycsb: Ycsb,
    record_bytes: u64,
    loaded: u64,
    record_count: u64,
    capacity_pages: u32,
    /// Nanoseconds between two requests of the client (0: closed loop) and when the next may start.
    pub interval_ns: u64,
    pub next_at: u64,
}

impl Store {
    pub fn new(
        kind: StoreKind,
        workload: YcsbWorkload,
        record_count: u64,
        record_kib: f64,
        target_ops_s: f64,
    ) -> Store {
        let record_bytes = ((record_kib * 1024.0).round() as u64).max(1);
        let capacity = (2 * record_count * record_bytes).div_ceil(PAGE).clamp(1, u32::MAX as u64 / 2) as u32;
        Store {
            kind,
            ycsb: Ycsb::new(workload, record_count, record_count),
            record_bytes,
            loaded: 0,
            record_count,
            capacity_pages: capacity,
            interval_ns: if target_ops_s > 0.0 { (1e9 / target_ops_s) as u64 } else { 0 },
            next_at: 0,
        }
    }

    /// Pages the store's object can hold (the heap or data file at its largest).
    pub fn capacity_pages(&self) -> u32 {
        self.capacity_pages
    }

    /// Whether the load phase is over.
    pub fn loaded(&self) -> bool {
        self.loaded >= self.record_count
    }

    fn pages_of(&self, first: u64, n: u64, write: bool) -> Touch {
        let last_page = self.capacity_pages as u64 - 1;
        let a = (first * self.record_bytes / PAGE).min(last_page);
        let b = (((first + n) * self.record_bytes - 1) / PAGE).min(last_page);
        (a as u32, (b - a + 1) as u32, write)
    }

    /// The next request: fills `out` with the page runs it touches in order and returns the bytes of
    /// records it reads or writes.
    pub fn next(&mut self, rng: &mut ChaCha8Rng, out: &mut Vec<Touch>) -> u64 {
        out.clear();
        if !self.loaded() {
            let k = self.loaded;
            self.loaded += 1;
            out.push(self.pages_of(k, 1, true));
            return self.record_bytes;
        }
        let rb = self.record_bytes;
        match self.ycsb.next_op(rng) {
            Op::Read(k) => {
                out.push(self.pages_of(k, 1, false));
                rb
            }
            // An update or a read-modify-write reads the record's pages and then dirties them.
            Op::Update(k) | Op::ReadModifyWrite(k) => {
                out.push(self.pages_of(k, 1, false));
                out.push(self.pages_of(k, 1, true));
                if matches!(self.kind, StoreKind::Redis) {
                    // In the heap the read is the same touch as the write: one fault at most.
                    out.remove(0);
                }
                2 * rb
            }
            Op::Insert(k) => {
                out.push(self.pages_of(k, 1, true));
                rb
            }
            Op::Scan { start, len } => {
                let n = (len as u64).min(self.ycsb.records() - start);
                out.push(self.pages_of(start, n, false));
                n * rb
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    #[test]
    fn load_phase_writes_every_record_in_order_then_runs_the_mix() {
        let mut s = Store::new(StoreKind::Mongo, YcsbWorkload::C, 10, 2.0, 0.0);
        let mut r = ChaCha8Rng::seed_from_u64(1);
        let mut out = Vec::new();
        let mut pages = Vec::new();
        for _ in 0..10 {
            assert_eq!(s.next(&mut r, &mut out), 2048);
            assert_eq!(out.len(), 1);
            assert!(out[0].2, "a load is a write");
            pages.push(out[0].0);
        }
        // Two 2 KiB records per 4 KiB page.
        assert_eq!(pages, vec![0, 0, 1, 1, 2, 2, 3, 3, 4, 4]);
        assert!(s.loaded());
        for _ in 0..100 {
            s.next(&mut r, &mut out);
            assert!(out.iter().all(|t| !t.2 && t.0 < 5), "workload C only reads loaded records: {out:?}");
        }
    }

    #[test]
    fn updates_read_then_dirty_in_mongo_and_touch_once_in_redis() {
        let mut out = Vec::new();
        for (kind, touches) in [(StoreKind::Mongo, 2), (StoreKind::Redis, 1)] {
            let mut s = Store::new(kind, YcsbWorkload::A, 1000, 1.0, 0.0);
            let mut r = ChaCha8Rng::seed_from_u64(2);
            for _ in 0..1000 {
                s.next(&mut r, &mut out);
            }
            let mut seen_update = false;
            for _ in 0..200 {
                s.next(&mut r, &mut out);
                if out.iter().any(|t| t.2) {
                    seen_update = true;
                    assert_eq!(out.len(), touches, "{kind:?}");
                    assert!(out.last().is_some_and(|t| t.2));
                }
            }
            assert!(seen_update);
        }
    }

    #[test]
    fn scans_touch_consecutive_pages_inside_the_object() {
        let mut s = Store::new(StoreKind::Mongo, YcsbWorkload::E, 5000, 1.0, 0.0);
        let mut r = ChaCha8Rng::seed_from_u64(3);
        let mut out = Vec::new();
        for _ in 0..5000 {
            s.next(&mut r, &mut out);
        }
        let mut longest = 0;
        for _ in 0..2000 {
            s.next(&mut r, &mut out);
            for &(first, n, _) in &out {
                assert!(first + n <= s.capacity_pages());
                longest = longest.max(n);
            }
        }
        // Up to 100 records of 1 KiB: up to 26 pages.
        assert!((20..=26).contains(&longest), "longest scan {longest} pages");
    }
}
