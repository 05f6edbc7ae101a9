//! The SSD store: a file of fixed-size page slots, a slot allocator and a bounded write-behind queue.
//!
//! # What it owns
//!
//! * The backing file (`SsdOptions::path`, or an unnamed scratch file; opening it is `file`'s
//!   business), `slots() * page_size()` bytes, opened with `O_DIRECT` where the file system allows it
//!   and re-initialised at every [`SsdStore::open`]: **the store always starts empty**. Nothing written before a restart is ever served, because the store cannot vouch for it (SPEC
//!   section 4); the old contents are discarded (the file is truncated to zero and re-extended), so a
//!   stray read of an old slot returns zeros, never an old page. Nothing is ever `fsync`ed: the contents
//!   need not survive a crash.
//! * The slot allocator (`alloc`): which slots are handed out.
//! * The write-behind queue: [`SsdStore::write`] copies the page into an aligned buffer, records it in the
//!   `pending` map (slot -> newest buffer) and queues `(slot, generation)`. One writer thread drains the
//!   queue in batches (`writer`); with io_uring a batch is submitted at once and awaited as a whole. A
//!   read of a slot with a pending entry is served from that buffer.
//! * A pool of aligned page buffers (`buf`; reused by the queue and as bounce buffers for unaligned reads
//!   under `O_DIRECT`).
//! * The I/O backend, which only transfers buffers: `backend` defines the `PageIo` trait and its
//!   `pread`/`pwrite` implementation, `uring` and (for tests and fuzzing) the fault-injecting `faults`
//!   implement it too, and `open_backend` here picks one at open.
//!
//! # Under I/O errors
//!
//! A failed read is an error for that slot (the engine's miss). A failed background write marks its
//! slot bad (invariant 3) and puts the store in the *failing* state, in which [`SsdStore::accepting`]
//! says no to new pages except one probe write in `PROBE_EVERY`; the first write that succeeds ends the
//! state. So a dying disk costs refused puts, not a stream of pages accepted and then lost.
//!
//! # Contract with the engine
//!
//! The engine guarantees that a slot is written at most once between `alloc` and `free`, and never reads
//! a slot it has not written, except in one optimistic path where it may read a slot concurrently with a
//! free, re-allocation or rewrite and then discards the result. Such a read may return arbitrary bytes
//! or an error, but it never crashes, never blocks forever and never corrupts another slot. The store
//! nevertheless handles a rewrite of a pending slot correctly (the newest data wins).
//!
//! # Invariants
//!
//! 1. `pending[slot]`, when present, holds the newest data written to `slot` that is not yet known to be
//!    in the file; reads prefer it over the file. An entry is removed only when its own write completed
//!    (matched by generation), when the slot is freed, or when a newer write replaces it.
//! 2. **Write ordering.** The writer never has writes of two batches in flight: it forms a batch under the
//!    state lock from entries not yet issued (at most one per slot, because the map holds one entry per
//!    slot and a queue item whose generation is not the entry's is stale and skipped), then waits for
//!    the whole batch before forming the next. Hence any write queued after another write to the same
//!    slot was issued is issued after that one completed and lands last. This is why a slot freed while
//!    its write is in flight can be handed out again at once: its new owner's write cannot overtake it.
//! 3. A failed background write whose entry is still current marks the slot *bad*: `read` returns an
//!    error (a miss for the engine), never the stale bytes in the file. `write` and `free` clear the mark.
//! 4. `pending_or_bad == pending.len() + bad.len()`, updated under the state lock, so readers can skip the
//!    lock when it is zero (the common case once the queue is drained).
//! 5. At most `write_queue_pages` entries are pending; `write` blocks while the queue is full.
//! 6. The kernel never owns a buffer after the call that lent it returns (the backends' contract,
//!    `backend` and `uring`).
//!
//! # Threading and lock order
//!
//! `SsdStore` is `Send + Sync`; every method takes `&self`. Locks, in the order they may be taken:
//! `grow_lock` (serialises `grow`) -> `state` (allocator, pending map, queue, bad set). No lock is held
//! across I/O, except that `grow` holds `grow_lock` while it extends the file. The buffer pool is a
//! lock-free queue. Condition variables: `work` (the writer waits for queued writes) and `progress`
//! (writers blocked by back-pressure, `sync`), both used with `state`.

mod alloc;
mod backend;
mod buf;
pub mod faults;
pub mod file;
#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_faults;
mod uring;
mod writer;

use self::alloc::SlotAllocator;
use self::backend::{PageIo, PreadIo, ReadOp};
pub(crate) use self::buf::AlignedBuf;
use self::faults::{FaultInjector, FaultyIo};
use self::file::open_file;
use self::uring::{new_ring, UringIo};
use crate::config::{DirectIo, IoBackend};
use crate::error::StoreError;
use crossbeam_queue::ArrayQueue;
use parking_lot::{Condvar, Mutex};
use std::collections::{HashMap, HashSet, VecDeque};
use std::fs::File;
use std::io;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;

/// Options of an SSD store.
#[derive(Debug, Clone)]
pub struct SsdOptions {
    /// The backing file; created if missing, re-initialised if present. With `scratch`, the directory
    /// in which an unnamed file is created instead (`file`).
    pub path: PathBuf,
    /// The file has no name: nothing is left behind by any exit, a crash or SIGKILL included.
    pub scratch: bool,
    /// Initial number of page slots.
    pub slots: u32,
    /// Bytes per slot: a power of two from 512 to 65536.
    pub page_size: usize,
    pub direct_io: DirectIo,
    pub io_backend: IoBackend,
    /// Writes that may be pending before [`SsdStore::write`] blocks; at least 1.
    pub write_queue_pages: usize,
    /// Tests and fuzzing only: fail I/O as this injector says (`faults`). `None` in production.
    pub faults: Option<Arc<FaultInjector>>,
}

/// A page slot of the store: the page at byte offset `slot * page_size` of the file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SlotId(pub u32);

/// I/O counters of an SSD store (monotonic since `open`).
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct SsdIoStats {
    /// Background page writes that completed successfully.
    pub writes: u64,
    /// Page reads served from the file.
    pub reads: u64,
    /// Page reads served from the write-behind queue.
    pub reads_from_queue: u64,
    /// Background page writes that failed (the slot was marked bad).
    pub write_errors: u64,
    /// Page reads that returned an error: an I/O error, or a slot whose write had failed.
    pub read_errors: u64,
    /// Queued writes dropped before they were issued (the slot was freed or rewritten).
    pub cancelled_writes: u64,
    pub bytes_written: u64,
    pub bytes_read: u64,
    /// New pages offered while the store was failing (its last background write failed) and turned
    /// away by [`SsdStore::accepting`].
    pub writes_refused: u64,
    /// The last background write failed: the store refuses new pages but for probes (not a counter).
    pub failing: bool,
}

/// Most writes the writer thread issues as one batch (and the size of its io_uring).
const MAX_WRITE_BATCH: usize = 128;
/// Spare page buffers kept for reuse beyond the write queue's own.
const SPARE_BUFFERS: usize = 64;
/// While failing, one offered page in this many is accepted as a probe of the disk.
const PROBE_EVERY: u64 = 64;

/// The SSD store. See the module documentation.
pub struct SsdStore {
    shared: Arc<Shared>,
    writer: Option<JoinHandle<()>>,
}

/// Everything the writer thread shares with the callers.
struct Shared {
    io: Box<dyn PageIo>,
    path: String,
    page_size: usize,
    /// Alignment of our own buffers: a multiple of `mem_align`, at least `page_size`.
    buf_align: usize,
    /// Memory alignment `O_DIRECT` needs of a caller's buffer (1 when buffered).
    mem_align: usize,
    direct: bool,
    write_queue_pages: usize,
    slots: AtomicU32,
    grow_lock: Mutex<()>,
    state: Mutex<State>,
    work: Condvar,
    progress: Condvar,
    pending_or_bad: AtomicUsize,
    /// The last background write failed (module section "Under I/O errors").
    failing: AtomicBool,
    /// Pages offered while failing, for `PROBE_EVERY`.
    offered_while_failing: AtomicU64,
    buffers: ArrayQueue<AlignedBuf>,
    stats: Stats,
    #[cfg(test)]
    hooks: tests::Hooks,
}

#[derive(Default)]
struct State {
    slots: SlotAllocator,
    pending: HashMap<u32, Pending>,
    /// Queued writes in arrival order; an item whose generation is not its slot's entry is stale.
    queue: VecDeque<(u32, u64)>,
    bad: HashSet<u32>,
    next_gen: u64,
    /// The writer has a batch in flight.
    writer_busy: bool,
    shutdown: bool,
}

impl State {
    fn pending_or_bad(&self) -> usize {
        self.pending.len() + self.bad.len()
    }
}

struct Pending {
    gen: u64,
    buf: Arc<AlignedBuf>,
    /// Part of the writer's current batch.
    issued: bool,
}

#[derive(Default)]
struct Stats {
    writes: AtomicU64,
    reads: AtomicU64,
    reads_from_queue: AtomicU64,
    write_errors: AtomicU64,
    read_errors: AtomicU64,
    cancelled_writes: AtomicU64,
    bytes_written: AtomicU64,
    bytes_read: AtomicU64,
    writes_refused: AtomicU64,
}

fn bump(counter: &AtomicU64, by: u64) {
    counter.fetch_add(by, Ordering::Relaxed);
}

/// Picks the backend for an opened file: io_uring per `backend` (`Uring` fails if no ring can be set
/// up, `Auto` falls back to `pread`), wrapped in the fault injector when one is given.
fn open_backend(
    file: File,
    backend: IoBackend,
    write_ring_entries: u32,
    faults: Option<Arc<FaultInjector>>,
    path: &str,
) -> io::Result<Box<dyn PageIo>> {
    let io: Box<dyn PageIo> = match backend {
        IoBackend::Sync => Box::new(PreadIo { file }),
        IoBackend::Uring => Box::new(UringIo::new(file, new_ring(write_ring_entries)?)),
        IoBackend::Auto => match new_ring(write_ring_entries) {
            Ok(ring) => Box::new(UringIo::new(file, ring)),
            Err(e) => {
                tracing::info!(path, error = %e, "io_uring unavailable, using pread/pwrite");
                Box::new(PreadIo { file })
            }
        },
    };
    Ok(match faults {
        Some(faults) => Box::new(FaultyIo::new(io, faults)),
        None => io,
    })
}

impl SsdStore {
    /// Creates the file at `opts.path` (or an unnamed one in that directory with `opts.scratch`), or
    /// truncates and re-initialises it, to `slots * page_size` bytes (space is reserved with `fallocate`
    /// where the file system supports it and is not memory-backed; `file`).
    ///
    /// The store **always starts empty**: it never serves a page from before a restart, because it cannot
    /// vouch for one; the old contents are discarded.
    ///
    /// `direct_io`: `On` opens with `O_DIRECT` and fails if the file system refuses it; `Auto` falls back
    /// to buffered I/O in that case (e.g. a file system without direct I/O, or one whose direct-I/O
    /// alignment does not divide the page size); `Off` is buffered. `io_backend`: `Uring` fails if an
    /// io_uring instance cannot be set up (old kernel, seccomp, `io_uring_disabled`); `Auto` falls back to
    /// `pread`/`pwrite`; `Sync` never uses io_uring.
    pub fn open(opts: SsdOptions) -> Result<SsdStore, StoreError> {
        let ps = opts.page_size;
        if !(512..=65536).contains(&ps) || !ps.is_power_of_two() {
            return Err(invalid("page_size", format!("{ps} is not a power of two in 512..=65536")));
        }
        if opts.write_queue_pages == 0 {
            return Err(invalid("write_queue_pages", "must be at least 1".into()));
        }
        let path = opts.path.display().to_string();
        let io_err = |source: io::Error| StoreError::Io { path: path.clone(), source };
        let len = file_len(opts.slots, ps)?;

        let (file, direct, mem_align) = open_file(&opts, len).map_err(io_err)?;
        let buf_align = ps.max(mem_align);

        let entries = writer::ring_entries(opts.write_queue_pages);
        let io = open_backend(file, opts.io_backend, entries, opts.faults.clone(), &path).map_err(io_err)?;
        let uring = io.uses_uring();
        let shared = Arc::new(Shared {
            io,
            path: path.clone(),
            page_size: ps,
            buf_align,
            mem_align,
            direct,
            write_queue_pages: opts.write_queue_pages,
            slots: AtomicU32::new(opts.slots),
            grow_lock: Mutex::new(()),
            state: Mutex::new(State { slots: SlotAllocator::new(opts.slots), ..State::default() }),
            work: Condvar::new(),
            progress: Condvar::new(),
            pending_or_bad: AtomicUsize::new(0),
            failing: AtomicBool::new(false),
            offered_while_failing: AtomicU64::new(0),
            buffers: ArrayQueue::new(opts.write_queue_pages + MAX_WRITE_BATCH + SPARE_BUFFERS),
            stats: Stats::default(),
            #[cfg(test)]
            hooks: tests::Hooks::default(),
        });
        let writer = {
            let shared = Arc::clone(&shared);
            std::thread::Builder::new()
                .name("dd-ssd-writer".into())
                .spawn(move || shared.writer_main())
                .map_err(io_err)?
        };
        tracing::debug!(path = %path, slots = opts.slots, direct, uring, "ssd store opened");
        Ok(SsdStore { shared, writer: Some(writer) })
    }

    /// Bytes per slot.
    pub fn page_size(&self) -> usize {
        self.shared.page_size
    }

    /// Current slot count (file size / page size).
    pub fn slots(&self) -> u32 {
        self.shared.slots.load(Ordering::Acquire)
    }

    /// Extends the file to at least `slots` slots (reserving the space where the file system supports
    /// it). Never shrinks: a smaller count is a no-op.
    pub fn grow(&self, slots: u32) -> Result<(), StoreError> {
        let sh = &*self.shared;
        let _grow = sh.grow_lock.lock();
        let old = sh.slots.load(Ordering::Acquire);
        if slots <= old {
            return Ok(());
        }
        let old_len = file_len(old, sh.page_size)?;
        let new_len = file_len(slots, sh.page_size)?;
        sh.io.extend(old_len, new_len).map_err(|e| sh.io_error(e))?;
        sh.state.lock().slots.grow(slots);
        sh.slots.store(slots, Ordering::Release);
        Ok(())
    }

    /// A free slot, or `None` when all `slots()` are in use. Thread-safe, O(1).
    pub fn alloc(&self) -> Option<SlotId> {
        self.shared.state.lock().slots.alloc().map(SlotId)
    }

    /// Returns a slot to the allocator. A write of it that was queued but not yet issued is cancelled;
    /// one already in flight completes first (module invariant 2), so the slot can be reused at once.
    /// Freeing a slot that is not allocated is a contract violation: a debug assertion, a no-op otherwise.
    pub fn free(&self, slot: SlotId) {
        let sh = &*self.shared;
        let mut st = sh.state.lock();
        if !st.slots.free(slot.0) {
            drop(st);
            debug_assert!(false, "free of slot {} that is not allocated", slot.0);
            tracing::error!(slot = slot.0, "ssd store: free of a slot that is not allocated; ignored");
            return;
        }
        st.bad.remove(&slot.0);
        let cancelled = st.pending.remove(&slot.0);
        sh.pending_or_bad.store(st.pending_or_bad(), Ordering::Release);
        drop(st);
        if let Some(entry) = cancelled {
            if !entry.issued {
                bump(&sh.stats.cancelled_writes, 1);
            }
            sh.progress.notify_all();
            sh.recycle(entry.buf);
        }
    }

    /// Allocated slots.
    pub fn in_use(&self) -> u32 {
        self.shared.state.lock().slots.in_use()
    }

    /// Whether a new page should be offered to the store: `false` while it is failing (its last
    /// background write failed), except for one probe in `PROBE_EVERY` whose outcome ends or confirms
    /// the state. Callers that get `false` refuse the page (or keep it where it is) instead of writing.
    pub fn accepting(&self) -> bool {
        let sh = &*self.shared;
        if !sh.failing.load(Ordering::Acquire) {
            return true;
        }
        let probe = sh.offered_while_failing.fetch_add(1, Ordering::Relaxed) % PROBE_EVERY == PROBE_EVERY - 1;
        if !probe {
            bump(&sh.stats.writes_refused, 1);
        }
        probe
    }

    /// Asynchronous write-behind of one page: copies `data` into an aligned buffer, queues it and returns.
    /// Blocks (back-pressure) only while `write_queue_pages` writes are already pending. Until the write
    /// completes, a `read` of the slot is served from the queued buffer. If the background write fails,
    /// the slot is marked bad and a later `read` returns an error, never wrong data.
    ///
    /// # Panics
    ///
    /// If `data` is not exactly `page_size()` bytes.
    pub fn write(&self, slot: SlotId, data: &[u8]) {
        let sh = &*self.shared;
        assert_eq!(data.len(), sh.page_size, "ssd store: write of a buffer that is not one page");
        let mut buf = sh.take_buffer();
        buf.copy_from_slice(data);
        let buf = Arc::new(buf);

        let mut st = sh.state.lock();
        debug_assert!(st.slots.is_allocated(slot.0), "write of slot {} that is not allocated", slot.0);
        while st.pending.len() >= sh.write_queue_pages && !st.pending.contains_key(&slot.0) {
            sh.progress.wait(&mut st);
        }
        let gen = st.next_gen;
        st.next_gen += 1;
        st.bad.remove(&slot.0);
        let replaced = st.pending.insert(slot.0, Pending { gen, buf, issued: false });
        st.queue.push_back((slot.0, gen));
        sh.pending_or_bad.store(st.pending_or_bad(), Ordering::Release);
        drop(st);
        sh.work.notify_one();
        if let Some(old) = replaced {
            if !old.issued {
                bump(&sh.stats.cancelled_writes, 1);
            }
            sh.recycle(old.buf);
        }
    }

    /// Synchronous read of one page into `out`: from the write-behind queue if the slot's write is still
    /// pending, from the file otherwise (one `pread`: a single read gains nothing from io_uring).
    ///
    /// # Panics
    ///
    /// If `out` is not exactly `page_size()` bytes.
    pub fn read(&self, slot: SlotId, out: &mut [u8]) -> Result<(), StoreError> {
        let mut reqs = [(slot, out)];
        // `read_batch` returns exactly one result per request.
        self.read_batch(&mut reqs).pop().unwrap_or(Ok(()))
    }

    /// Reads many pages at once. With io_uring, all file reads are submitted together (queue depth = the
    /// number of pages not served from the queue, in chunks of 256) and the call returns when all have
    /// completed. Each request gets its own result.
    ///
    /// # Panics
    ///
    /// If a buffer is not exactly `page_size()` bytes.
    pub fn read_batch(&self, reqs: &mut [(SlotId, &mut [u8])]) -> Vec<Result<(), StoreError>> {
        let sh = &*self.shared;
        let mut results: Vec<Result<(), StoreError>> = Vec::with_capacity(reqs.len());
        let mut from_file: Vec<usize> = Vec::with_capacity(reqs.len());
        let limit = self.slots();
        let check_queue = sh.pending_or_bad.load(Ordering::Acquire) != 0;
        let mut st = if check_queue { Some(sh.state.lock()) } else { None };
        for (i, (slot, out)) in reqs.iter_mut().enumerate() {
            assert_eq!(out.len(), sh.page_size, "ssd store: read into a buffer that is not one page");
            if slot.0 >= limit {
                results.push(Err(sh.io_error(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!("slot {} is beyond the store's {limit} slots", slot.0),
                ))));
                continue;
            }
            if let Some(st) = st.as_deref() {
                if st.bad.contains(&slot.0) {
                    results.push(Err(sh.bad_slot_error(slot.0)));
                    continue;
                }
                if let Some(entry) = st.pending.get(&slot.0) {
                    out.copy_from_slice(&entry.buf);
                    results.push(Ok(()));
                    bump(&sh.stats.reads_from_queue, 1);
                    continue;
                }
            }
            results.push(Ok(()));
            from_file.push(i);
        }
        drop(st.take());
        if !from_file.is_empty() {
            sh.read_from_file(reqs, &from_file, &mut results);
        }

        bump(&sh.stats.read_errors, results.iter().filter(|r| r.is_err()).count() as u64);
        results
    }

    /// Waits until every queued write has completed (tests, shutdown, benchmarks).
    pub fn sync(&self) {
        let sh = &*self.shared;
        let mut st = sh.state.lock();
        while !st.pending.is_empty() || st.writer_busy {
            sh.progress.wait(&mut st);
        }
    }

    /// A snapshot of the I/O counters.
    pub fn io_stats(&self) -> SsdIoStats {
        let s = &self.shared.stats;
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        SsdIoStats {
            writes: get(&s.writes),
            reads: get(&s.reads),
            reads_from_queue: get(&s.reads_from_queue),
            write_errors: get(&s.write_errors),
            read_errors: get(&s.read_errors),
            cancelled_writes: get(&s.cancelled_writes),
            bytes_written: get(&s.bytes_written),
            bytes_read: get(&s.bytes_read),
            writes_refused: get(&s.writes_refused),
            failing: self.shared.failing.load(Ordering::Acquire),
        }
    }

    /// Whether the file is open with `O_DIRECT`.
    pub fn direct_io_active(&self) -> bool {
        self.shared.direct
    }

    /// Whether reads and writes go through io_uring.
    pub fn uring_active(&self) -> bool {
        self.shared.io.uses_uring()
    }
}

impl Drop for SsdStore {
    /// Drains the queue (every accepted write is issued), then stops and joins the writer thread.
    fn drop(&mut self) {
        self.shared.state.lock().shutdown = true;
        self.shared.work.notify_all();
        if let Some(writer) = self.writer.take() {
            if writer.join().is_err() {
                tracing::error!(path = %self.shared.path, "ssd store writer thread panicked");
            }
        }
    }
}

impl Shared {
    fn io_error(&self, source: io::Error) -> StoreError {
        StoreError::Io { path: self.path.clone(), source }
    }

    fn bad_slot_error(&self, slot: u32) -> StoreError {
        self.io_error(io::Error::other(format!(
            "slot {slot} holds no valid page: its background write failed"
        )))
    }

    fn offset(&self, slot: u32) -> u64 {
        slot as u64 * self.page_size as u64
    }

    fn take_buffer(&self) -> AlignedBuf {
        self.buffers.pop().unwrap_or_else(|| AlignedBuf::new(self.page_size, self.buf_align))
    }

    /// Returns a buffer to the pool once nobody else holds it.
    fn recycle(&self, buf: Arc<AlignedBuf>) {
        if let Ok(buf) = Arc::try_unwrap(buf) {
            let _ = self.buffers.push(buf);
        }
    }

    /// Whether a caller's buffer can be used for I/O on our file as it is.
    fn usable_directly(&self, buf: &[u8]) -> bool {
        (buf.as_ptr() as usize).is_multiple_of(self.mem_align)
    }

    /// Reads `reqs[i]` for every `i` in `which` from the file as one batch, through bounce buffers
    /// where a caller's buffer is not aligned, storing each outcome in `results[i]`.
    fn read_from_file(
        &self,
        reqs: &mut [(SlotId, &mut [u8])],
        which: &[usize],
        results: &mut [Result<(), StoreError>],
    ) {
        let mut bounces: Vec<Option<AlignedBuf>> =
            which.iter().map(|&i| (!self.usable_directly(reqs[i].1)).then(|| self.take_buffer())).collect();
        let outcomes: Vec<io::Result<()>> = {
            let mut wanted = vec![false; reqs.len()];
            for &i in which {
                wanted[i] = true;
            }
            let mut bounce_iter = bounces.iter_mut();
            let mut ops: Vec<ReadOp<'_>> = Vec::with_capacity(which.len());
            for (i, (slot, out)) in reqs.iter_mut().enumerate() {
                if !wanted[i] {
                    continue;
                }
                let offset = self.offset(slot.0);
                let buf: &mut [u8] = match bounce_iter.next().and_then(|b| b.as_mut()) {
                    Some(b) => b,
                    None => out,
                };
                ops.push(ReadOp { buf, offset, result: Ok(()) });
            }
            self.io.read(&mut ops);
            ops.into_iter().map(|op| op.result).collect()
        };
        for ((&i, outcome), bounce) in which.iter().zip(outcomes).zip(&bounces) {
            results[i] = match outcome {
                Ok(()) => {
                    if let Some(b) = bounce {
                        reqs[i].1.copy_from_slice(b);
                    }
                    bump(&self.stats.reads, 1);
                    bump(&self.stats.bytes_read, self.page_size as u64);
                    Ok(())
                }
                Err(e) => Err(self.io_error(e)),
            };
        }
        for b in bounces.into_iter().flatten() {
            let _ = self.buffers.push(b);
        }
    }
}

fn invalid(field: &'static str, reason: String) -> StoreError {
    StoreError::InvalidOption { field, reason }
}

fn file_len(slots: u32, page_size: usize) -> Result<u64, StoreError> {
    let len = slots as u64 * page_size as u64;
    if len > i64::MAX as u64 {
        return Err(invalid("slots", format!("{slots} slots of {page_size} bytes exceed the largest file")));
    }
    Ok(len)
}
