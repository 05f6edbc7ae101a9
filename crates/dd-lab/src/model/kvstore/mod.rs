//! Three emulated data stores served by a YCSB client: where their records live and which pages each
//! request touches. The emulator (`sim`) charges the touches through its usual paths and latencies.
//!
//! * **Redis-like** (`redis`): the records are in the server's heap, anonymous memory. A record the
//!   guest reclaimed was swapped out; touching it faults it back (swap device, or the container's
//!   frontswap pool when configured): latency = page hit, or swap-in from the disk.
//! * **MongoDB-like** (`mongo`, the mmapv1 engine): the records are in a memory-mapped data file. Their
//!   pages are file pages in the page cache; a reclaimed clean page is dropped (and put to the
//!   container's cleancache pool), a dirty one written back first; a fault reads the page from the pool
//!   or the disk. An update reads the record's pages and dirties them; an insert dirties fresh pages.
//! * **MySQL-like** (`mysql`, InnoDB): the records are in a tablespace file of 16 KiB pages, and the
//!   server keeps its own page cache, the buffer pool, in anonymous memory ([`innodb`]). A request finds
//!   its tablespace page in the pool (a touch of the frame's heap page, which faults it back if the guest
//!   swapped it out) or misses: the frame the pool's LRU gives up is written back to the data file if
//!   dirty, the page is read from the data file through the page cache (guest page cache, then the
//!   container's cleancache pool, then the disk: buffered I/O, `innodb_flush_method = fsync`) and
//!   copied into the frame. So its memory is the pool's frames plus the page-cache copies of the
//!   tablespace pages it read ("double buffering").
//!
//! Layout: record `k` occupies bytes `k * record_bytes ..` of the store's object (its heap or its data
//! file), so small records share pages and a scan touches consecutive pages. YCSB's load phase comes
//! first: the client's threads insert the `record_count` records in order, one per operation, then run
//! the workload's mix.
//!
//! Invariants: every page range returned lies inside its object (the heap: `< heap_pages`, the data
//! file: `< capacity_pages`); inserts beyond the object's capacity (twice the loaded records) reuse its
//! last page.

pub mod innodb;

use crate::model::ycsb::{Op, Ycsb, YcsbWorkload};
pub use crate::scenario::StoreKind;
use crate::scenario::{Workload, PAGE};
use innodb::{BufferPool, Step};
use rand_chacha::ChaCha8Rng;

/// Which of a store's two objects a touch is in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Space {
    /// The server's anonymous memory: Redis's records, MySQL's buffer pool frames.
    Heap,
    /// The data file, through the page cache: MongoDB's mmap'd records, MySQL's tablespace.
    File,
}

/// A run of pages one request touches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Touch {
    pub space: Space,
    pub first: u32,
    pub n: u32,
    pub write: bool,
}

/// What a store is (the `ycsb` workload's settings).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StoreConfig {
    pub kind: StoreKind,
    pub workload: YcsbWorkload,
    pub record_count: u64,
    pub record_kib: f64,
    /// The client's rate, ops/s (0: closed loop).
    pub target_ops_s: f64,
    /// MySQL's buffer pool (MiB) and tablespace page size (KiB); ignored by the other stores.
    pub buffer_pool_mib: f64,
    pub page_kib: f64,
    /// The load phase ran before the run: the records are in the data file on the disk, nothing is
    /// cached, and the run starts with the workload's mix (MongoDB and MySQL only).
    pub preload: bool,
}

impl StoreConfig {
    /// A store with the defaults of the other fields (tests).
    pub fn of(kind: StoreKind, workload: YcsbWorkload, record_count: u64, record_kib: f64) -> StoreConfig {
        StoreConfig {
            kind,
            workload,
            record_count,
            record_kib,
            target_ops_s: 0.0,
            buffer_pool_mib: 128.0,
            page_kib: 16.0,
            preload: false,
        }
    }
}

/// One store and the YCSB client driving it.
#[derive(Debug, Clone)]
pub struct Store {
    pub kind: StoreKind,
    ycsb: Ycsb,
    record_bytes: u64,
    loaded: u64,
    record_count: u64,
    capacity_pages: u32,
    /// MySQL's buffer pool and the guest pages of one tablespace page.
    pool: Option<(BufferPool, u32)>,
    /// The record touches of a MySQL request before they go through the pool (kept to reuse).
    scratch: Vec<Touch>,
    /// The keys in use (`working_set` events): fraction and offset of the records; `None`: all.
    window: Option<(f64, f64)>,
    /// Nanoseconds between two requests of the client (0: closed loop) and when the next may start.
    pub interval_ns: u64,
    pub next_at: u64,
}

impl Store {
    /// The store a scenario's `ycsb` workload runs, `None` for the other workloads: the one place that
    /// turns a workload's settings into a store, so that the run (`sim::setup`) and its memory budget
    /// (`sim::budget`) size the same store.
    pub fn of_workload(w: &Workload) -> Option<Store> {
        let Workload::Ycsb {
            store,
            workload,
            record_count,
            record_kib,
            target_ops_s,
            buffer_pool_mib,
            page_kib,
            preload,
            ..
        } = w
        else {
            return None;
        };
        Some(Store::new(&StoreConfig {
            kind: *store,
            workload: *workload,
            record_count: *record_count,
            record_kib: *record_kib,
            target_ops_s: *target_ops_s,
            buffer_pool_mib: *buffer_pool_mib,
            page_kib: *page_kib,
            preload: *preload,
        }))
    }

    pub fn new(cfg: &StoreConfig) -> Store {
        let record_count = cfg.record_count;
        let record_bytes = ((cfg.record_kib * 1024.0).round() as u64).max(1);
        let capacity = (2 * record_count * record_bytes).div_ceil(PAGE).clamp(1, u32::MAX as u64 / 2) as u32;
        let pool = (cfg.kind == StoreKind::Mysql).then(|| {
            let page_pages = ((cfg.page_kib * 1024.0 / PAGE as f64).round() as u32).max(1);
            let frames = ((cfg.buffer_pool_mib * 1024.0 * 1024.0 / PAGE as f64) as u64 / page_pages as u64)
                .clamp(1, (u32::MAX / 2 / page_pages) as u64) as u32;
            let mut bp = BufferPool::new(frames);
            if cfg.preload {
                bp.set_file_pages(
                    (record_count * record_bytes).div_ceil(PAGE).div_ceil(page_pages as u64) as u32
                );
            }
            (bp, page_pages)
        });
        let mut s = Store {
            kind: cfg.kind,
            pool,
            scratch: Vec::new(),
            window: None,
            ycsb: Ycsb::new(cfg.workload, record_count, record_count),
            record_bytes,
            loaded: 0,
            record_count,
            capacity_pages: capacity,
            interval_ns: if cfg.target_ops_s > 0.0 { (1e9 / cfg.target_ops_s) as u64 } else { 0 },
            next_at: 0,
        };
        if cfg.preload {
            s.loaded = record_count;
        }
        s
    }

    /// Draws keys in a window of the records from now on (see `Event::WorkingSet`).
    pub fn set_window(&mut self, fraction: f64, offset: f64) {
        self.window = Some((fraction, offset));
    }

    /// A key of the workload mapped into the window (the window follows the records as they grow).
    fn windowed(&self, k: u64) -> u64 {
        match self.window {
            None => k,
            Some((f, o)) => {
                let n = self.ycsb.records();
                crate::model::workload::Window::of(n, f, o).item(k, n)
            }
        }
    }

    /// Pages of the data file before the run: those of the loaded records if preloaded, else none.
    pub fn initial_file_pages(&self, preload: bool) -> u32 {
        if preload {
            ((self.record_count * self.record_bytes).div_ceil(PAGE) as u32).min(self.capacity_pages)
        } else {
            0
        }
    }

    /// Pages the store's object can hold (the heap or data file at its largest).
    pub fn capacity_pages(&self) -> u32 {
        self.capacity_pages
    }

    /// Pages of the store's anonymous memory: the records (Redis) or the buffer pool (MySQL).
    pub fn heap_pages(&self) -> u32 {
        match &self.pool {
            Some((bp, pp)) => bp.frames() * pp,
            None => self.capacity_pages,
        }
    }

    /// Whether the load phase is over.
    pub fn loaded(&self) -> bool {
        self.loaded >= self.record_count
    }

    fn pages_of(&self, first: u64, n: u64, write: bool) -> Touch {
        let last_page = self.capacity_pages as u64 - 1;
        let a = (first * self.record_bytes / PAGE).min(last_page);
        let b = (((first + n) * self.record_bytes - 1) / PAGE).min(last_page);
        let space = if self.kind == StoreKind::Redis { Space::Heap } else { Space::File };
        Touch { space, first: a as u32, n: (b - a + 1) as u32, write }
    }

    /// MySQL: the records' pages go through the buffer pool. Each tablespace page they lie on is
    /// looked up there; a miss writes back the evicted page if dirty, reads the page from the data file
    /// unless it is new, and fills the frame; then the record's bytes in the frame are touched.
    fn through_pool(&mut self, records: &[Touch], out: &mut Vec<Touch>) {
        out.clear();
        let Some((bp, pp)) = self.pool.as_mut() else { return };
        let pp = *pp;
        for &t in records {
            let (first, last) = (t.first / pp, (t.first + t.n - 1) / pp);
            for page in first..=last {
                let frame = match bp.access(page, t.write) {
                    Step::Hit { frame } => frame,
                    Step::Miss { frame, evicted, fresh } => {
                        if let Some((old, true)) = evicted {
                            out.push(Touch { space: Space::File, first: old * pp, n: pp, write: true });
                        }
                        if !fresh {
                            out.push(Touch { space: Space::File, first: page * pp, n: pp, write: false });
                        }
                        // The frame is overwritten with the page: every heap page of it is written.
                        out.push(Touch { space: Space::Heap, first: frame * pp, n: pp, write: true });
                        frame
                    }
                };
                // The record's part of the page, at the same offset in the frame.
                let a = t.first.max(page * pp) - page * pp;
                let b = (t.first + t.n).min((page + 1) * pp) - page * pp;
                out.push(Touch { space: Space::Heap, first: frame * pp + a, n: b - a, write: t.write });
            }
        }
    }

    /// The next request: fills `out` with the page runs it touches in order and returns the bytes of
    /// records it reads or writes.
    pub fn next(&mut self, rng: &mut ChaCha8Rng, out: &mut Vec<Touch>) -> u64 {
        if self.pool.is_none() {
            return self.records_touched(rng, out);
        }
        let mut records = std::mem::take(&mut self.scratch);
        let bytes = self.records_touched(rng, &mut records);
        self.through_pool(&records, out);
        self.scratch = records;
        bytes
    }

    /// The record pages a request touches, as if the records were in one object.
    fn records_touched(&mut self, rng: &mut ChaCha8Rng, out: &mut Vec<Touch>) -> u64 {
        out.clear();
        if !self.loaded() {
            let k = self.loaded;
            self.loaded += 1;
            out.push(self.pages_of(k, 1, true));
            return self.record_bytes;
        }
        let rb = self.record_bytes;
        let op = match self.ycsb.next_op(rng) {
            Op::Read(k) => Op::Read(self.windowed(k)),
            Op::Update(k) => Op::Update(self.windowed(k)),
            Op::ReadModifyWrite(k) => Op::ReadModifyWrite(self.windowed(k)),
            Op::Scan { start, len } => Op::Scan { start: self.windowed(start), len },
            insert => insert,
        };
        match op {
            Op::Read(k) => {
                out.push(self.pages_of(k, 1, false));
                rb
            }
            // An update or a read-modify-write reads the record's pages and then dirties them.
            Op::Update(k) | Op::ReadModifyWrite(k) => {
                out.push(self.pages_of(k, 1, false));
                out.push(self.pages_of(k, 1, true));
                if matches!(self.kind, StoreKind::Redis | StoreKind::Mysql) {
                    // In the heap (or the buffer pool) the read is the same touch as the write: one
                    // fault (or pool miss) at most.
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
        let mut s = Store::new(&StoreConfig::of(StoreKind::Mongo, YcsbWorkload::C, 10, 2.0));
        let mut r = ChaCha8Rng::seed_from_u64(1);
        let mut out = Vec::new();
        let mut pages = Vec::new();
        for _ in 0..10 {
            assert_eq!(s.next(&mut r, &mut out), 2048);
            assert_eq!(out.len(), 1);
            assert!(out[0].write, "a load is a write");
            pages.push(out[0].first);
        }
        // Two 2 KiB records per 4 KiB page.
        assert_eq!(pages, vec![0, 0, 1, 1, 2, 2, 3, 3, 4, 4]);
        assert!(s.loaded());
        for _ in 0..100 {
            s.next(&mut r, &mut out);
            assert!(
                out.iter().all(|t| !t.write && t.first < 5),
                "workload C only reads loaded records: {out:?}"
            );
        }
    }

    #[test]
    fn updates_read_then_dirty_in_mongo_and_touch_once_in_redis() {
        let mut out = Vec::new();
        for (kind, touches) in [(StoreKind::Mongo, 2), (StoreKind::Redis, 1)] {
            let mut s = Store::new(&StoreConfig::of(kind, YcsbWorkload::A, 1000, 1.0));
            let mut r = ChaCha8Rng::seed_from_u64(2);
            for _ in 0..1000 {
                s.next(&mut r, &mut out);
            }
            let mut seen_update = false;
            for _ in 0..200 {
                s.next(&mut r, &mut out);
                if out.iter().any(|t| t.write) {
                    seen_update = true;
                    assert_eq!(out.len(), touches, "{kind:?}");
                    assert!(out.last().is_some_and(|t| t.write));
                }
            }
            assert!(seen_update);
        }
    }

    #[test]
    fn scans_touch_consecutive_pages_inside_the_object() {
        let mut s = Store::new(&StoreConfig::of(StoreKind::Mongo, YcsbWorkload::E, 5000, 1.0));
        let mut r = ChaCha8Rng::seed_from_u64(3);
        let mut out = Vec::new();
        for _ in 0..5000 {
            s.next(&mut r, &mut out);
        }
        let mut longest = 0;
        for _ in 0..2000 {
            s.next(&mut r, &mut out);
            for t in &out {
                assert!(t.first + t.n <= s.capacity_pages());
                longest = longest.max(t.n);
            }
        }
        // Up to 100 records of 1 KiB: up to 26 pages.
        assert!((20..=26).contains(&longest), "longest scan {longest} pages");
    }

    #[test]
    fn mysql_reads_its_tablespace_only_on_a_buffer_pool_miss() {
        // 1 MiB pool of 16 KiB pages (64 frames) over 1000 records of 1 KiB (63 tablespace pages): after
        // the load every page is in the pool, so reads touch only the heap.
        let mut s = Store::new(&StoreConfig {
            buffer_pool_mib: 1.0,
            ..StoreConfig::of(StoreKind::Mysql, YcsbWorkload::C, 1000, 1.0)
        });
        assert_eq!(s.heap_pages(), 256);
        let mut r = ChaCha8Rng::seed_from_u64(4);
        let mut out = Vec::new();
        for _ in 0..1000 {
            s.next(&mut r, &mut out);
            assert!(out.iter().all(|t| t.space == Space::Heap), "a load into a pool with room: {out:?}");
        }
        for _ in 0..500 {
            s.next(&mut r, &mut out);
            assert_eq!(out.len(), 1);
            assert!(out[0].space == Space::Heap && !out[0].write && out[0].first + out[0].n <= 256);
        }
    }

    #[test]
    fn mysql_buffer_pool_misses_write_back_then_read_the_data_file_then_fill_the_frame() {
        // 64 KiB pool: 4 frames of 16 KiB, over 100 records of 4 KiB (25 tablespace pages).
        let mut s = Store::new(&StoreConfig {
            buffer_pool_mib: 1.0 / 16.0,
            ..StoreConfig::of(StoreKind::Mysql, YcsbWorkload::A, 100, 4.0)
        });
        let mut r = ChaCha8Rng::seed_from_u64(5);
        let mut out = Vec::new();
        let mut file_writes = 0;
        for _ in 0..100 {
            s.next(&mut r, &mut out);
            file_writes += out.iter().filter(|t| t.space == Space::File && t.write).count();
            assert!(out.iter().all(|t| t.space == Space::Heap || t.write), "the load never reads the file");
        }
        assert_eq!(file_writes, 21, "25 pages loaded, 4 still in the pool, the rest written back once");
        let (mut reads, mut misses) = (0, 0);
        for _ in 0..2000 {
            s.next(&mut r, &mut out);
            let read = out.iter().position(|t| t.space == Space::File && !t.write);
            if let Some(i) = read {
                misses += 1;
                let t = out[i];
                assert_eq!((t.first % 4, t.n), (0, 4), "one whole 16 KiB page is read");
                // Then the frame is filled, then the record's page in it touched.
                let fill = out[i + 1];
                assert!(fill.space == Space::Heap && fill.write && fill.n == 4 && fill.first % 4 == 0);
                assert_eq!(out.len(), i + 3);
                assert!(out[..i].iter().all(|t| t.space == Space::File && t.write), "write-back first");
            }
            reads += 1;
        }
        assert!(misses > 100 && misses < reads, "a 4-frame pool over 25 pages misses often: {misses}");
    }
}
