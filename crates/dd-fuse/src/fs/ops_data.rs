//! The handlers of file contents beyond read and write: `fallocate`, `lseek` (`SEEK_DATA`/`SEEK_HOLE`)
//! and `copy_file_range`, each on the open files' own descriptors.
//!
//! Invariant (the coherence argument of `frontend.rs`): every call that may change a file's bytes runs
//! under the object's exclusive lock through [`crate::Frontend::change_range`], which drops and flushes
//! the cached pages of the range it changed (to the end of the file where bytes move), and queues the
//! kernel's cached pages of that range for invalidation (shared mappings). Calls that change no bytes
//! (`fallocate` mode 0 or `KEEP_SIZE` only allocate; `lseek` only reads the layout) take no lock.

use super::{kill_suid, nix_errno, DdFs, Handle};
use fuser::{Errno, FileHandle, INodeNo, Request};
use nix::fcntl::FallocateFlags;
use std::os::fd::AsFd;

/// The largest copy one request makes (the reply counts bytes in 32 bits); callers loop, as they must
/// for any short copy.
const MAX_COPY: u64 = 1 << 30;

impl DdFs {
    /// Queues the kernel's cached pages of `ino` in `offset..offset+len` (0: to the end) for dropping.
    fn kernel_invalidate(&self, ino: INodeNo, offset: u64, len: u64) {
        if let Some(k) = self.kernel.get() {
            k.invalidate(ino.0, offset.min(i64::MAX as u64) as i64, len.min(i64::MAX as u64) as i64);
        }
    }

    pub(super) fn do_fallocate(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        (offset, length): (u64, u64),
        mode: i32,
    ) -> Result<(), Errno> {
        let h = self.handle(fh)?;
        let flags = FallocateFlags::from_bits_retain(mode);
        let (off, len) = (offset as libc::off_t, length as libc::off_t);
        let call = || nix::fcntl::fallocate(h.file.as_fd(), flags, off, len).map_err(std::io::Error::from);
        let moves = FallocateFlags::FALLOC_FL_COLLAPSE_RANGE | FallocateFlags::FALLOC_FL_INSERT_RANGE;
        let zeroes = FallocateFlags::FALLOC_FL_PUNCH_HOLE | FallocateFlags::FALLOC_FL_ZERO_RANGE;
        // The bytes from `offset` to the end move (collapse, insert), or those of the range become zeros
        // (punch, zero); otherwise blocks are only allocated and no byte changes.
        let changed = if flags.intersects(moves) {
            Some(None)
        } else if flags.intersects(zeroes) {
            Some(Some(length))
        } else {
            None
        };
        let r = match changed {
            None => call(),
            Some(range) => {
                kill_suid(req, h.file.as_fd())?;
                let r = self.fe.change_range(&h.obj, &h.file, offset, range, call);
                self.kernel_invalidate(ino, offset, range.unwrap_or(0));
                r
            }
        };
        r.map_err(|e| super::errno(&e))
    }

    /// `SEEK_DATA` and `SEEK_HOLE` (the kernel answers the other kinds itself), on the open file.
    pub(super) fn do_lseek(&self, fh: FileHandle, offset: i64, whence: i32) -> Result<i64, Errno> {
        let h = self.handle(fh)?;
        let whence = match whence {
            libc::SEEK_DATA => nix::unistd::Whence::SeekData,
            libc::SEEK_HOLE => nix::unistd::Whence::SeekHole,
            libc::SEEK_SET => nix::unistd::Whence::SeekSet,
            libc::SEEK_CUR => nix::unistd::Whence::SeekCur,
            libc::SEEK_END => nix::unistd::Whence::SeekEnd,
            _ => return Err(Errno::EINVAL),
        };
        nix::unistd::lseek(h.file.as_fd(), offset, whence).map_err(nix_errno)
    }

    /// Copies between two open files in the backing file system (reflinks where it has them); the
    /// destination's range is invalidated as by a write.
    pub(super) fn do_copy_file_range(
        &self,
        req: &Request,
        (fh_in, offset_in): (FileHandle, u64),
        (ino_out, fh_out, offset_out): (INodeNo, FileHandle, u64),
        len: u64,
    ) -> Result<u64, Errno> {
        let (hin, hout): (std::sync::Arc<Handle>, _) = (self.handle(fh_in)?, self.handle(fh_out)?);
        let len = len.min(MAX_COPY);
        let (mut oin, mut oout) = (offset_in as i64, offset_out as i64);
        kill_suid(req, hout.file.as_fd())?;
        let copy = || {
            nix::fcntl::copy_file_range(&hin.file, Some(&mut oin), &hout.file, Some(&mut oout), len as usize)
                .map_err(std::io::Error::from)
        };
        let n = self
            .fe
            .change_range(&hout.obj, &hout.file, offset_out, Some(len), copy)
            .map_err(|e| super::errno(&e))?;
        self.kernel_invalidate(ino_out, offset_out, n as u64);
        Ok(n as u64)
    }
}
