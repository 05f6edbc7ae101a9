//! The SSD store: a file of fixed-size page slots, a slot allocator and a bounded write-behind queue.
//!
//! # What it owns
//!
//! * The backing file (`SsdOptions::path`, or an unnamed scratch file; opening it is `store::ssd_file`'s
//!   business), `slots() * page_size()` bytes, opened with `O_DIRECT` where the file system allows it and re-initialised at every [`SsdStore::open`]: **the store always starts
//!   empty**. Nothing written before a restart is ever served, because the store cannot vouch for it (SPEC
//!   section 4); the old contents are discarded (the file is truncated to zero and re-extended), so a
//!   stray read of an old slot returns zeros, never an old page. Nothing is ever `fsync`ed: the contents
//!   need not survive a crash.
//! * The slot allocator: a LIFO free list plus a bump pointer over never-used slots, O(1) per operation,
//!   and a bitmap of allocated slots that turns a double free into a no-op (and a debug assertion).
//! * The write-behind queue: [`SsdStore::write`] copies the page into an aligned buffer, records it in the
//!   `pending` map (slot -> newest buffer) and queues `(slot, generation)`. One writer thread drains the
//!   queue in batches; with io_uring a batch is submitted at once and awaited as a whole. A read of a slot
//!   with a pending entry is served from that buffer.
//! * A pool of aligned page buffers (reused by the queue and as bounce buffers for unaligned reads under
//!   `O_DIRECT`) and a pool of io_uring instances for readers (one ring per concurrent `read_batch`).
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
//! 6. The kernel never owns a buffer after the call that lent it returns: every submitted io_uring
//!    operation is reaped before buffers are released (if even waiting for completions fails, the process
//!    aborts rather than let the kernel write into freed memory).
//!
//! # Threading and lock order
//!
//! `SsdStore` is `Send + Sync`; every method takes `&self`. Locks, in the order they may be taken:
//! `grow_lock` (serialises `grow`) -> `state` (allocator, pending map, queue, bad set). No lock is held
//! across I/O, except that `grow` holds `grow_lock` while it extends the file. The buffer and ring pools
//! are lock-free queues. Condition variables: `work` (the writer waits for queued writes) and `progress`
//! (writers blocked by back-pressure, `sync`), both used with `state`.

use super::ssd_file::{open_file, reserve};
use crate::config::{DirectIo, IoBackend};
use crate::error::StoreError;
use crossbeam_queue::ArrayQueue;
use io_uring::{opcode, types, IoUring};
use parking_lot::{Condvar, Mutex};
use std::alloc::{self, Layout};
use std::collections::{HashMap, HashSet, VecDeque};
use std::fs::File;
use std::io;
use std::ops::{Deref, DerefMut};
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;

/// Options of an SSD store.
#[derive(Debug, Clone)]
pub struct SsdOptions {
    /// The backing file; created if missing, re-initialised if present. With `scratch`, the directory
    /// in which an unnamed file is created instead (`store::ssd_file`).
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
}

/// Most writes the writer thread issues as one batch (and the size of its io_uring).
const MAX_WRITE_BATCH: usize = 128;
/// Submission-queue size of a reader ring; a larger `read_batch` is issued in chunks of this size.
const READ_RING_ENTRIES: u32 = 256;
/// Reader rings kept for reuse; more concurrent readers create (and later drop) extra rings.
const READ_RING_POOL: usize = 16;
/// Spare page buffers kept for reuse beyond the write queue's own.
const SPARE_BUFFERS: usize = 64;
/// Marks an io_uring operation that was never submitted.
const NOT_RUN: i32 = i32::MIN;

/// The SSD store. See the module documentation.
pub struct SsdStore {
    shared: Arc<Shared>,
    writer: Option<JoinHandle<()>>,
}

/// Everything the writer thread shares with the callers.
struct Shared {
    file: File,
    path: String,
    page_size: usize,
    /// Alignment of our own buffers: a multiple of `mem_align`, at least `page_size`.
    buf_align: usize,
    /// Memory alignment `O_DIRECT` needs of a caller's buffer (1 when buffered).
    mem_align: usize,
    direct: bool,
    uring: bool,
    write_queue_pages: usize,
    slots: AtomicU32,
    grow_lock: Mutex<()>,
    state: Mutex<State>,
    work: Condvar,
    progress: Condvar,
    pending_or_bad: AtomicUsize,
    buffers: ArrayQueue<AlignedBuf>,
    rings: ArrayQueue<IoUring>,
    stats: Stats,
    #[cfg(test)]
    hooks: tests::Hooks,
}

#[derive(Default)]
struct State {
    /// Freed slots, reused last-in first-out.
    free: Vec<u32>,
    /// Slots `next_fresh..limit` have never been allocated.
    next_fresh: u32,
    limit: u32,
    allocated: Bitmap,
    in_use: u32,
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
}

fn bump(counter: &AtomicU64, by: u64) {
    counter.fetch_add(by, Ordering::Relaxed);
}

impl SsdStore {
    /// Creates the file at `opts.path` (or an unnamed one in that directory with `opts.scratch`), or
    /// truncates and re-initialises it, to `slots * page_size` bytes (space is reserved with `fallocate`
    /// where the file system supports it and is not memory-backed; `store::ssd_file`).
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

        let (writer_ring, uring) = match opts.io_backend {
            IoBackend::Sync => (None, false),
            IoBackend::Uring => {
                (Some(new_ring(write_ring_entries(opts.write_queue_pages)).map_err(io_err)?), true)
            }
            IoBackend::Auto => match new_ring(write_ring_entries(opts.write_queue_pages)) {
                Ok(ring) => (Some(ring), true),
                Err(e) => {
                    tracing::info!(path = %path, error = %e, "io_uring unavailable, using pread/pwrite");
                    (None, false)
                }
            },
        };

        let mut allocated = Bitmap::default();
        allocated.resize(opts.slots);
        let shared = Arc::new(Shared {
            file,
            path: path.clone(),
            page_size: ps,
            buf_align,
            mem_align,
            direct,
            uring,
            write_queue_pages: opts.write_queue_pages,
            slots: AtomicU32::new(opts.slots),
            grow_lock: Mutex::new(()),
            state: Mutex::new(State { limit: opts.slots, allocated, ..State::default() }),
            work: Condvar::new(),
            progress: Condvar::new(),
            pending_or_bad: AtomicUsize::new(0),
            buffers: ArrayQueue::new(opts.write_queue_pages + MAX_WRITE_BATCH + SPARE_BUFFERS),
            rings: ArrayQueue::new(READ_RING_POOL),
            stats: Stats::default(),
            #[cfg(test)]
            hooks: tests::Hooks::default(),
        });
        let writer = {
            let shared = Arc::clone(&shared);
            std::thread::Builder::new()
                .name("dd-ssd-writer".into())
                .spawn(move || shared.writer_main(writer_ring))
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
        reserve(&sh.file, old_len, new_len).map_err(|e| sh.io_error(e))?;
        let mut st = sh.state.lock();
        st.limit = slots;
        st.allocated.resize(slots);
        sh.slots.store(slots, Ordering::Release);
        Ok(())
    }

    /// A free slot, or `None` when all `slots()` are in use. Thread-safe, O(1).
    pub fn alloc(&self) -> Option<SlotId> {
        let mut st = self.shared.state.lock();
        let slot = match st.free.pop() {
            Some(slot) => slot,
            None if st.next_fresh < st.limit => {
                st.next_fresh += 1;
                st.next_fresh - 1
            }
            None => return None,
        };
        debug_assert!(!st.allocated.get(slot), "slot {slot} on the free list is allocated");
        st.allocated.set(slot, true);
        st.in_use += 1;
        Some(SlotId(slot))
    }

    /// Returns a slot to the allocator. A write of it that was queued but not yet issued is cancelled;
    /// one already in flight completes first (module invariant 2), so the slot can be reused at once.
    /// Freeing a slot that is not allocated is a contract violation: a debug assertion, a no-op otherwise.
    pub fn free(&self, slot: SlotId) {
        let sh = &*self.shared;
        let mut st = sh.state.lock();
        if slot.0 >= st.limit || !st.allocated.get(slot.0) {
            drop(st);
            debug_assert!(false, "free of slot {} that is not allocated", slot.0);
            tracing::error!(slot = slot.0, "ssd store: free of a slot that is not allocated; ignored");
            return;
        }
        st.allocated.set(slot.0, false);
        st.in_use -= 1;
        st.free.push(slot.0);
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
        self.shared.state.lock().in_use
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
        debug_assert!(
            slot.0 < st.limit && st.allocated.get(slot.0),
            "write of slot {} that is not allocated",
            slot.0
        );
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

        if from_file.len() >= 2 && sh.uring {
            if let Some(ring) = sh.take_ring() {
                sh.read_uring(ring, reqs, &from_file, &mut results);
                from_file.clear();
            }
        }
        for &i in &from_file {
            let (slot, out) = &mut reqs[i];
            results[i] = sh.read_sync(*slot, out);
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
        }
    }

    /// Whether the file is open with `O_DIRECT`.
    pub fn direct_io_active(&self) -> bool {
        self.shared.direct
    }

    /// Whether reads and writes go through io_uring.
    pub fn uring_active(&self) -> bool {
        self.shared.uring
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

/// One write of the writer's current batch.
struct Job {
    slot: u32,
    gen: u64,
    buf: Arc<AlignedBuf>,
    result: io::Result<()>,
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

    /// Test hook: the writer issues nothing while paused (except to drain at shutdown).
    fn writer_paused(&self) -> bool {
        #[cfg(test)]
        return self.hooks.paused.load(Ordering::Acquire);
        #[cfg(not(test))]
        false
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

    fn take_ring(&self) -> Option<IoUring> {
        match self.rings.pop() {
            Some(ring) => Some(ring),
            None => match new_ring(READ_RING_ENTRIES) {
                Ok(ring) => Some(ring),
                Err(e) => {
                    tracing::warn!(error = %e, "cannot create a reader io_uring; reading with pread");
                    None
                }
            },
        }
    }

    /// Whether a caller's buffer can be used for I/O on our file as it is.
    fn usable_directly(&self, buf: &[u8]) -> bool {
        (buf.as_ptr() as usize).is_multiple_of(self.mem_align)
    }

    fn read_sync(&self, slot: SlotId, out: &mut [u8]) -> Result<(), StoreError> {
        let offset = self.offset(slot.0);
        let result = if self.usable_directly(out) {
            self.file.read_exact_at(out, offset)
        } else {
            let mut bounce = self.take_buffer();
            let r = self.file.read_exact_at(&mut bounce, offset);
            out.copy_from_slice(&bounce);
            let _ = self.buffers.push(bounce);
            r
        };
        match result {
            Ok(()) => {
                bump(&self.stats.reads, 1);
                bump(&self.stats.bytes_read, out.len() as u64);
                Ok(())
            }
            Err(e) => Err(self.io_error(e)),
        }
    }

    /// Reads `reqs[i]` for every `i` in `which` through `ring`, storing each outcome in `results[i]`.
    fn read_uring(
        &self,
        mut ring: IoUring,
        reqs: &mut [(SlotId, &mut [u8])],
        which: &[usize],
        results: &mut [Result<(), StoreError>],
    ) {
        let mut bounces: Vec<Option<AlignedBuf>> = Vec::with_capacity(which.len());
        let mut ops: Vec<UringOp> = Vec::with_capacity(which.len());
        for &i in which {
            let (slot, out) = &mut reqs[i];
            let mut bounce = (!self.usable_directly(out)).then(|| self.take_buffer());
            let ptr = match bounce.as_mut() {
                Some(b) => b.as_mut_ptr(),
                None => out.as_mut_ptr(),
            };
            bounces.push(bounce);
            ops.push(UringOp { ptr, len: self.page_size, offset: self.offset(slot.0), res: NOT_RUN });
        }
        // SAFETY: every `ptr` points to `page_size` writable bytes that stay valid and untouched by us
        // until `uring_run` returns: either a caller buffer, mutably borrowed through `reqs` for this whole
        // call, or a bounce buffer owned by `bounces`, which outlives the call.
        let healthy = unsafe { uring_run(&mut ring, self.file.as_raw_fd(), OpKind::Read, &mut ops) };
        for (k, &i) in which.iter().enumerate() {
            let (slot, out) = &mut reqs[i];
            let op = &ops[k];
            let outcome = match bounces[k].as_mut() {
                Some(b) => finish_read(&self.file, op, b),
                None => finish_read(&self.file, op, out),
            };
            results[i] = match outcome {
                Ok(()) => {
                    if let Some(b) = &bounces[k] {
                        out.copy_from_slice(b);
                    }
                    bump(&self.stats.reads, 1);
                    bump(&self.stats.bytes_read, self.page_size as u64);
                    Ok(())
                }
                Err(e) => {
                    tracing::debug!(slot = slot.0, error = %e, "ssd store read failed");
                    Err(self.io_error(e))
                }
            };
        }
        for b in bounces.into_iter().flatten() {
            let _ = self.buffers.push(b);
        }
        if healthy {
            let _ = self.rings.push(ring);
        }
    }

    /// The writer thread: forms batches under the state lock, writes them outside it, completes them
    /// under it again (module invariant 2).
    fn writer_main(&self, mut ring: Option<IoUring>) {
        let max_batch = write_ring_entries(self.write_queue_pages) as usize;
        let mut jobs: Vec<Job> = Vec::with_capacity(max_batch);
        loop {
            {
                let mut st = self.state.lock();
                loop {
                    while jobs.len() < max_batch && (!self.writer_paused() || st.shutdown) {
                        let Some((slot, gen)) = st.queue.pop_front() else { break };
                        if let Some(entry) = st.pending.get_mut(&slot) {
                            if entry.gen == gen && !entry.issued {
                                entry.issued = true;
                                let buf = Arc::clone(&entry.buf);
                                jobs.push(Job { slot, gen, buf, result: Ok(()) });
                            }
                        }
                    }
                    if !jobs.is_empty() {
                        st.writer_busy = true;
                        break;
                    }
                    if st.shutdown {
                        return;
                    }
                    self.work.wait(&mut st);
                }
            }

            if let Some(r) = ring.as_mut() {
                if !self.write_uring(r, &mut jobs) {
                    tracing::error!(path = %self.path, "ssd store writer ring failed; writing with pwrite");
                    ring = None;
                }
            } else {
                for job in &mut jobs {
                    job.result = self.file.write_all_at(&job.buf, self.offset(job.slot));
                }
            }
            #[cfg(test)]
            if self.hooks.fail_writes.load(Ordering::Relaxed) {
                for job in &mut jobs {
                    job.result = Err(io::Error::other("injected write failure"));
                }
            }

            let mut done: Vec<Arc<AlignedBuf>> = Vec::with_capacity(jobs.len() * 2);
            {
                let mut st = self.state.lock();
                for job in jobs.drain(..) {
                    match &job.result {
                        Ok(()) => {
                            bump(&self.stats.writes, 1);
                            bump(&self.stats.bytes_written, self.page_size as u64);
                        }
                        Err(e) => {
                            bump(&self.stats.write_errors, 1);
                            tracing::warn!(slot = job.slot, error = %e, "ssd store write failed");
                        }
                    }
                    // Only the write of the slot's current entry completes it: a freed or rewritten slot
                    // has moved on, and a newer write will land after this one.
                    if st.pending.get(&job.slot).is_some_and(|e| e.gen == job.gen) {
                        if let Some(entry) = st.pending.remove(&job.slot) {
                            done.push(entry.buf);
                        }
                        if job.result.is_err() {
                            st.bad.insert(job.slot);
                        }
                    }
                    done.push(job.buf);
                }
                st.writer_busy = false;
                self.pending_or_bad.store(st.pending_or_bad(), Ordering::Release);
            }
            self.progress.notify_all();
            // The entry's reference is dropped first, so the job's one is the last and the buffer returns
            // to the pool.
            for buf in done {
                self.recycle(buf);
            }
        }
    }

    /// Writes a batch through io_uring; `false` if the ring is no longer usable (the batch is still
    /// completed, with pwrite where the ring did not run an operation).
    fn write_uring(&self, ring: &mut IoUring, jobs: &mut [Job]) -> bool {
        let mut ops: Vec<UringOp> = jobs
            .iter()
            .map(|j| UringOp {
                ptr: j.buf.as_ptr().cast_mut(),
                len: self.page_size,
                offset: self.offset(j.slot),
                res: NOT_RUN,
            })
            .collect();
        // SAFETY: each `ptr` points to a `page_size`-byte buffer kept alive by the `Arc` in `jobs`, which
        // outlives the call; the kernel only reads it (a write operation) and nobody mutates a buffer
        // once it is shared.
        let healthy = unsafe { uring_run(ring, self.file.as_raw_fd(), OpKind::Write, &mut ops) };
        for (job, op) in jobs.iter_mut().zip(&ops) {
            job.result = finish_write(&self.file, op, &job.buf);
        }
        healthy
    }
}

/// One read or write handed to io_uring; `res` is the completion result (bytes or `-errno`).
struct UringOp {
    ptr: *mut u8,
    len: usize,
    offset: u64,
    res: i32,
}

#[derive(Clone, Copy)]
enum OpKind {
    Read,
    Write,
}

/// Runs `ops` through `ring`, submitting as many at once as the submission queue holds and waiting for
/// all of them before submitting more. Returns when the kernel has completed every submitted operation;
/// an operation it never saw keeps `res == NOT_RUN`. Returns `false` if the ring must not be reused.
///
/// # Safety
///
/// Every `op.ptr` must point to `op.len` bytes that stay valid until this returns: writable for reads,
/// readable and unmodified for writes. `fd` must be open.
unsafe fn uring_run(ring: &mut IoUring, fd: RawFd, kind: OpKind, ops: &mut [UringOp]) -> bool {
    let capacity = ring.params().sq_entries() as usize;
    let mut next = 0;
    while next < ops.len() {
        let mut pushed = 0;
        {
            let mut sq = ring.submission();
            for (i, op) in ops.iter().enumerate().skip(next).take(capacity) {
                let len = op.len as u32; // page_size <= 65536
                let entry = match kind {
                    OpKind::Read => opcode::Read::new(types::Fd(fd), op.ptr, len).offset(op.offset).build(),
                    OpKind::Write => opcode::Write::new(types::Fd(fd), op.ptr, len).offset(op.offset).build(),
                };
                // SAFETY: the caller guarantees the buffer outlives this call, and we reap every
                // submitted entry before returning.
                if unsafe { sq.push(&entry.user_data(i as u64)) }.is_err() {
                    break; // Not expected: the queue is empty before each chunk and a chunk fits in it.
                }
                pushed += 1;
            }
        }
        if pushed == 0 {
            return false;
        }
        let chunk_len = pushed;
        let mut reaped = 0;
        while reaped < chunk_len {
            match ring.submit_and_wait(chunk_len - reaped) {
                Ok(_) => {}
                Err(e) if retryable(&e) => {}
                Err(e) => {
                    // Nothing more will be submitted. Wait for what the kernel already took, then give up
                    // on the rest; they stay NOT_RUN and the ring is discarded (its queue still holds them).
                    tracing::error!(error = %e, "io_uring_enter failed");
                    let unsubmitted = ring.submission().len();
                    wait_for_completions(ring, ops, chunk_len - reaped - unsubmitted);
                    return false;
                }
            }
            for cqe in ring.completion() {
                if let Some(op) = ops.get_mut(cqe.user_data() as usize) {
                    op.res = cqe.result();
                }
                reaped += 1;
            }
        }
        next += pushed;
    }
    true
}

/// Reaps `count` completions without submitting anything; aborts the process if the kernel will not
/// report them, because it may still write into buffers we are about to release.
fn wait_for_completions(ring: &mut IoUring, ops: &mut [UringOp], mut count: usize) {
    while count > 0 {
        for cqe in ring.completion() {
            if let Some(op) = ops.get_mut(cqe.user_data() as usize) {
                op.res = cqe.result();
            }
            count = count.saturating_sub(1);
        }
        if count == 0 {
            break;
        }
        // SAFETY: a plain wait (to_submit = 0, no argument): it submits nothing and touches no memory of
        // ours beyond the rings the crate mapped.
        let r = unsafe {
            ring.submitter().enter::<libc::sigset_t>(
                0,
                count as u32,
                io_uring::EnterFlags::GETEVENTS.bits(),
                None,
            )
        };
        if let Err(e) = r {
            if !retryable(&e) {
                tracing::error!(error = %e, "cannot reap io_uring completions; aborting");
                eprintln!("dd ssd store: cannot reap io_uring completions ({e}); aborting");
                std::process::abort();
            }
        }
    }
}

fn retryable(e: &io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::EINTR | libc::EAGAIN | libc::EBUSY))
}

/// Turns an io_uring read result into the final outcome, completing a short or refused read with pread.
fn finish_read(file: &File, op: &UringOp, buf: &mut [u8]) -> io::Result<()> {
    let done = match op.res {
        NOT_RUN => 0,
        n if n >= 0 => n as usize,
        n if retryable(&io::Error::from_raw_os_error(-n)) => 0,
        n => return Err(io::Error::from_raw_os_error(-n)),
    };
    if done >= buf.len() {
        return Ok(());
    }
    if op.res == 0 {
        return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "read past the end of the store file"));
    }
    file.read_exact_at(&mut buf[done..], op.offset + done as u64)
}

/// Turns an io_uring write result into the final outcome, completing a short or refused write with pwrite.
fn finish_write(file: &File, op: &UringOp, buf: &[u8]) -> io::Result<()> {
    let done = match op.res {
        NOT_RUN => 0,
        n if n >= 0 => n as usize,
        n if retryable(&io::Error::from_raw_os_error(-n)) => 0,
        n => return Err(io::Error::from_raw_os_error(-n)),
    };
    if done >= buf.len() {
        return Ok(());
    }
    file.write_all_at(&buf[done..], op.offset + done as u64)
}

fn write_ring_entries(write_queue_pages: usize) -> u32 {
    write_queue_pages.clamp(1, MAX_WRITE_BATCH).next_power_of_two() as u32
}

/// A ring with a completion queue twice the submission queue (so it can never overflow: we never have
/// more operations in flight than the submission queue holds). `COOP_TASKRUN` (Linux 5.19+) lets the
/// kernel run completion work when we next enter it instead of interrupting us; older kernels refuse the
/// flag, and get a plain ring.
fn new_ring(entries: u32) -> io::Result<IoUring> {
    match IoUring::builder().setup_cqsize(entries * 2).setup_coop_taskrun().build(entries) {
        Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
            IoUring::builder().setup_cqsize(entries * 2).build(entries)
        }
        r => r,
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

/// A zeroed heap buffer with a chosen alignment (for `O_DIRECT`).
pub(crate) struct AlignedBuf {
    ptr: NonNull<u8>,
    layout: Layout,
}

// SAFETY: `AlignedBuf` uniquely owns its allocation, like a `Box<[u8]>`.
unsafe impl Send for AlignedBuf {}
// SAFETY: shared access only hands out `&[u8]`.
unsafe impl Sync for AlignedBuf {}

impl AlignedBuf {
    pub(crate) fn new(len: usize, align: usize) -> AlignedBuf {
        let layout = match Layout::from_size_align(len, align) {
            Ok(layout) if len > 0 => layout,
            _ => panic!("invalid page buffer layout: {len} bytes aligned to {align}"),
        };
        // SAFETY: `layout` has a non-zero size.
        let ptr = unsafe { alloc::alloc_zeroed(layout) };
        match NonNull::new(ptr) {
            Some(ptr) => AlignedBuf { ptr, layout },
            None => alloc::handle_alloc_error(layout),
        }
    }
}

impl Deref for AlignedBuf {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        // SAFETY: `ptr` points to `layout.size()` initialised (zeroed at allocation) bytes that we own.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.layout.size()) }
    }
}

impl DerefMut for AlignedBuf {
    fn deref_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in `deref`, and `&mut self` guarantees exclusive access.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.layout.size()) }
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        // SAFETY: allocated in `new` with exactly this layout.
        unsafe { alloc::dealloc(self.ptr.as_ptr(), self.layout) }
    }
}

/// One bit per slot: allocated or not.
#[derive(Default)]
struct Bitmap {
    words: Vec<u64>,
}

impl Bitmap {
    fn resize(&mut self, bits: u32) {
        let words = (bits as usize).div_ceil(64);
        if words > self.words.len() {
            self.words.resize(words, 0);
        }
    }
    fn get(&self, bit: u32) -> bool {
        self.words.get(bit as usize / 64).is_some_and(|w| w & (1 << (bit % 64)) != 0)
    }
    fn set(&mut self, bit: u32, value: bool) {
        if let Some(w) = self.words.get_mut(bit as usize / 64) {
            if value {
                *w |= 1 << (bit % 64);
            } else {
                *w &= !(1 << (bit % 64));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha8Rng;
    use std::path::Path;
    use std::sync::atomic::{AtomicBool, AtomicU8};

    const PS: usize = 4096;

    /// Test-only controls of the writer thread.
    #[derive(Default)]
    pub(super) struct Hooks {
        pub(super) paused: AtomicBool,
        pub(super) fail_writes: AtomicBool,
    }

    impl SsdStore {
        /// Stops (or restarts) the writer issuing writes, so queued writes stay queued.
        fn pause_writer(&self, paused: bool) {
            let st = self.shared.state.lock();
            self.shared.hooks.paused.store(paused, Ordering::Release);
            drop(st);
            self.shared.work.notify_all();
        }
        fn fail_writes(&self, fail: bool) {
            self.shared.hooks.fail_writes.store(fail, Ordering::Relaxed);
        }
    }

    /// A directory on a file system that supports direct I/O (ext4 here).
    fn disk_dir() -> tempfile::TempDir {
        let base =
            if Path::new("/var/tmp").is_dir() { PathBuf::from("/var/tmp") } else { std::env::temp_dir() };
        tempfile::Builder::new().prefix("dd-ssd-test").tempdir_in(base).expect("temp dir")
    }

    fn options(dir: &Path, slots: u32, direct_io: DirectIo, io_backend: IoBackend) -> SsdOptions {
        SsdOptions {
            path: dir.join("store.bin"),
            scratch: false,
            slots,
            page_size: PS,
            direct_io,
            io_backend,
            write_queue_pages: 64,
        }
    }

    /// Opens a store, or returns `None` (and says so) when this machine refuses a required feature.
    fn open_or_skip(opts: SsdOptions) -> Option<SsdStore> {
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
    const STRICT: [(DirectIo, IoBackend); 4] = [
        (DirectIo::On, IoBackend::Uring),
        (DirectIo::On, IoBackend::Sync),
        (DirectIo::Off, IoBackend::Uring),
        (DirectIo::Off, IoBackend::Sync),
    ];

    fn pattern(slot: u32, gen: u64) -> Vec<u8> {
        let mut page = vec![0u8; PS];
        for (i, word) in page.chunks_exact_mut(8).enumerate() {
            let v = (slot as u64) << 40 ^ gen << 12 ^ i as u64 ^ 0x9e37_79b9_7f4a_7c15;
            word.copy_from_slice(&v.to_le_bytes());
        }
        page
    }

    fn read_page(store: &SsdStore, slot: SlotId) -> Vec<u8> {
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
    fn failed_write_marks_the_slot_bad_until_rewritten() {
        let dir = disk_dir();
        let store = SsdStore::open(options(dir.path(), 4, DirectIo::Auto, IoBackend::Auto)).expect("open");
        let s = store.alloc().expect("slot");
        store.write(s, &pattern(s.0, 1));
        store.sync();
        store.fail_writes(true);
        store.write(s, &pattern(s.0, 2));
        store.sync();
        assert!(store.read(s, &mut vec![0u8; PS]).is_err(), "never the stale page");
        let stats = store.io_stats();
        assert_eq!((stats.write_errors, stats.read_errors), (1, 1));
        store.fail_writes(false);
        store.write(s, &pattern(s.0, 3));
        store.sync();
        assert_eq!(read_page(&store, s), pattern(s.0, 3));
        // Freeing clears the mark too.
        store.fail_writes(true);
        store.write(s, &pattern(s.0, 4));
        store.sync();
        store.fail_writes(false);
        store.free(s);
        let t = store.alloc().expect("slot");
        store.write(t, &pattern(t.0, 5));
        store.sync();
        assert_eq!(read_page(&store, t), pattern(t.0, 5));
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
}
