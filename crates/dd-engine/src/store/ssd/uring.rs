//! The io_uring backend: reads of a batch are submitted at once and awaited as a whole; the writer
//! thread's batches go through a ring of their own.
//!
//! Invariants:
//! * **The kernel never owns a buffer after the call that lent it returns**: every submitted operation
//!   is reaped before `read`/`write` return (if even waiting for completions fails, the process aborts
//!   rather than let the kernel write into freed memory).
//! * A ring that failed is never reused: a reader ring is dropped, the writer's ring is replaced by
//!   `pwrite` for the rest of the store's life. An operation a ring did not complete (short, refused with
//!   `EAGAIN`, never submitted) is finished with `pread`/`pwrite`, so a failing ring costs speed, never
//!   data.
//! * A single read gains nothing from a ring and uses `pread`.

use super::backend::{PageIo, ReadOp, WriteOp};
use super::file::reserve;
use crossbeam_queue::ArrayQueue;
use io_uring::{opcode, types, IoUring};
use parking_lot::Mutex;
use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::fs::FileExt;

/// Submission-queue size of a reader ring; a larger batch is issued in chunks of this size.
const READ_RING_ENTRIES: u32 = 256;
/// Reader rings kept for reuse; more concurrent readers create (and later drop) extra rings.
const READ_RING_POOL: usize = 16;
/// Marks an io_uring operation that was never submitted.
const NOT_RUN: i32 = i32::MIN;

/// io_uring transfers. See the module documentation.
pub(crate) struct UringIo {
    file: File,
    /// The writer thread's ring; `None` once it failed (then `pwrite`). Only the writer locks it.
    writer: Mutex<Option<IoUring>>,
    /// Reader rings for reuse (one per concurrent batch read).
    rings: ArrayQueue<IoUring>,
}

impl UringIo {
    pub(crate) fn new(file: File, writer_ring: IoUring) -> UringIo {
        UringIo { file, writer: Mutex::new(Some(writer_ring)), rings: ArrayQueue::new(READ_RING_POOL) }
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
}

impl PageIo for UringIo {
    fn read(&self, ops: &mut [ReadOp<'_>]) {
        let ring = if ops.len() >= 2 { self.take_ring() } else { None };
        let Some(mut ring) = ring else {
            for op in ops {
                op.result = self.file.read_exact_at(op.buf, op.offset);
            }
            return;
        };
        let mut uops: Vec<UringOp> = ops
            .iter_mut()
            .map(|op| UringOp {
                ptr: op.buf.as_mut_ptr(),
                len: op.buf.len(),
                offset: op.offset,
                res: NOT_RUN,
            })
            .collect();
        // SAFETY: every `ptr` points to `len` writable bytes mutably borrowed through `ops` for this whole
        // call, which we do not touch until `uring_run` has reaped every operation.
        let healthy = unsafe { uring_run(&mut ring, self.file.as_raw_fd(), OpKind::Read, &mut uops) };
        for (op, u) in ops.iter_mut().zip(&uops) {
            op.result = finish_read(&self.file, u, op.buf);
            if let Err(e) = &op.result {
                tracing::debug!(offset = op.offset, error = %e, "ssd store read failed");
            }
        }
        if healthy {
            let _ = self.rings.push(ring);
        }
    }

    fn write(&self, ops: &mut [WriteOp<'_>]) {
        let mut writer = self.writer.lock();
        let Some(ring) = writer.as_mut() else {
            for op in ops {
                op.result = self.file.write_all_at(op.buf, op.offset);
            }
            return;
        };
        let mut uops: Vec<UringOp> = ops
            .iter()
            .map(|op| UringOp {
                ptr: op.buf.as_ptr().cast_mut(),
                len: op.buf.len(),
                offset: op.offset,
                res: NOT_RUN,
            })
            .collect();
        // SAFETY: each `ptr` points to `len` bytes borrowed through `ops` for this whole call; the kernel
        // only reads them (a write operation) and nobody mutates a borrowed buffer.
        let healthy = unsafe { uring_run(ring, self.file.as_raw_fd(), OpKind::Write, &mut uops) };
        for (op, u) in ops.iter_mut().zip(&uops) {
            op.result = finish_write(&self.file, u, op.buf);
        }
        if !healthy {
            tracing::error!("ssd store writer ring failed; writing with pwrite");
            *writer = None;
        }
    }

    fn extend(&self, from: u64, to: u64) -> io::Result<()> {
        reserve(&self.file, from, to)
    }

    fn uses_uring(&self) -> bool {
        true
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

/// A ring with a completion queue twice the submission queue (so it can never overflow: we never have
/// more operations in flight than the submission queue holds). `COOP_TASKRUN` (Linux 5.19+) lets the
/// kernel run completion work when we next enter it instead of interrupting us; older kernels refuse the
/// flag, and get a plain ring.
pub(super) fn new_ring(entries: u32) -> io::Result<IoUring> {
    match IoUring::builder().setup_cqsize(entries * 2).setup_coop_taskrun().build(entries) {
        Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
            IoUring::builder().setup_cqsize(entries * 2).build(entries)
        }
        r => r,
    }
}
