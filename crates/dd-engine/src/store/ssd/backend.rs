//! How pages move between page buffers and the store file: the [`PageIo`] trait and its plain
//! `pread`/`pwrite` backend.
//!
//! Backends: [`PreadIo`] (one system call per page), `uring::UringIo` (batches through io_uring,
//! falling back to `pread`/`pwrite` where a ring cannot run an operation) and `faults::FaultyIo` (tests
//! and fuzzing: wraps another backend and fails operations on a countdown). They implement the trait
//! defined here, and the store (`ssd/mod.rs`, `open_backend`) picks one at open, so imports go one way:
//! from the store to the backends, and from each backend to this module. The store owns buffers,
//! alignment and the write-behind queue; a backend only transfers whole buffers at byte offsets and
//! reports each transfer's outcome.
//!
//! Contract: every buffer handed to a backend satisfies the file's memory alignment (the store bounces
//! unaligned caller buffers); a backend never keeps a buffer after the call that lent it returns.

use super::file::reserve;
use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;

/// One page read: fill `buf` from byte `offset` of the file.
pub(crate) struct ReadOp<'a> {
    pub buf: &'a mut [u8],
    pub offset: u64,
    pub result: io::Result<()>,
}

/// One page write: `buf` to byte `offset` of the file.
pub(crate) struct WriteOp<'a> {
    pub buf: &'a [u8],
    pub offset: u64,
    pub result: io::Result<()>,
}

/// Transfers of whole buffers to and from the store file. See the module documentation.
pub(crate) trait PageIo: Send + Sync {
    /// Reads every op, storing each outcome in its `result`. Callers may call it from many threads.
    fn read(&self, ops: &mut [ReadOp<'_>]);
    /// Writes every op, storing each outcome in its `result`. Only the writer thread calls it.
    fn write(&self, ops: &mut [WriteOp<'_>]);
    /// Extends the file from `from` to `to` bytes, reserving the blocks where the file system allows.
    fn extend(&self, from: u64, to: u64) -> io::Result<()>;
    /// Whether transfers go through io_uring.
    fn uses_uring(&self) -> bool;
}

/// `pread`/`pwrite`, one page per system call.
pub(crate) struct PreadIo {
    pub(crate) file: File,
}

impl PageIo for PreadIo {
    fn read(&self, ops: &mut [ReadOp<'_>]) {
        for op in ops {
            op.result = self.file.read_exact_at(op.buf, op.offset);
        }
    }

    fn write(&self, ops: &mut [WriteOp<'_>]) {
        for op in ops {
            op.result = self.file.write_all_at(op.buf, op.offset);
        }
    }

    fn extend(&self, from: u64, to: u64) -> io::Result<()> {
        reserve(&self.file, from, to)
    }

    fn uses_uring(&self) -> bool {
        false
    }
}
