//! What the mount passes straight through to the backing directory, and the kernel page-cache
//! invalidations that keep shared mappings coherent (issue 13).
//!
//! Owns: extended attributes (`getxattr`, `setxattr`, `listxattr`, `removexattr` on an inode's
//! `/proc/self/fd/N` name, which leads to the file itself, a symlink's own inode included), special nodes
//! (`mknod` of FIFOs, sockets, regular files and whiteouts; device nodes are refused: a container must
//! not create a device on the host's backing directory),
//! and [`KernelCache`], the thread that tells the kernel to drop its cached pages of a file.
//!
//! Why a thread: a FUSE invalidation must not be sent from the handler of a request on the same file
//! (the kernel may hold the page the request is about locked, and the invalidation waits for it), so
//! handlers only queue `(inode, offset, length)` and this thread sends them. Invalidating writes back a
//! mapping's dirty pages first (the kernel launders them through ordinary WRITE requests), so nothing
//! written through a mapping is lost.

use fuser::{Errno, INodeNo, Notifier};
use std::ffi::{CString, OsStr};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::mpsc;

fn cstr(b: &[u8]) -> Result<CString, Errno> {
    CString::new(b).map_err(|_| Errno::EINVAL)
}

fn last_errno() -> Errno {
    Errno::from_i32(std::io::Error::last_os_error().raw_os_error().unwrap_or(libc::EIO))
}

/// `size` 0 asks for the value's length; otherwise the value, or `ERANGE` if it is longer than `size`.
pub enum Xattr {
    Size(u32),
    Data(Vec<u8>),
}

/// Reads an attribute's value (`name`) or, with `name` `None`, the list of names.
pub fn get(path: &Path, name: Option<&OsStr>, size: u32) -> Result<Xattr, Errno> {
    let p = cstr(path.as_os_str().as_bytes())?;
    let n = name.map(|n| cstr(n.as_bytes())).transpose()?;
    let mut buf = vec![0u8; size as usize];
    let call = |buf: &mut [u8]| -> isize {
        let (ptr, len) = (buf.as_mut_ptr().cast::<libc::c_void>(), buf.len());
        // SAFETY: NUL-terminated path and name, and a buffer of `len` bytes we own (null with len 0).
        unsafe {
            match &n {
                Some(n) => libc::getxattr(
                    p.as_ptr(),
                    n.as_ptr(),
                    if len == 0 { std::ptr::null_mut() } else { ptr },
                    len,
                ),
                None => libc::listxattr(p.as_ptr(), ptr.cast(), len),
            }
        }
    };
    let r = call(&mut buf);
    if r < 0 {
        return Err(last_errno());
    }
    if size == 0 {
        return Ok(Xattr::Size(r as u32));
    }
    buf.truncate(r as usize);
    Ok(Xattr::Data(buf))
}

/// Sets an attribute (`flags`: `XATTR_CREATE` / `XATTR_REPLACE` as given).
pub fn set(path: &Path, name: &OsStr, value: &[u8], flags: i32) -> Result<(), Errno> {
    let (p, n) = (cstr(path.as_os_str().as_bytes())?, cstr(name.as_bytes())?);
    // SAFETY: NUL-terminated path and name; `value` is valid for its length.
    let r = unsafe { libc::setxattr(p.as_ptr(), n.as_ptr(), value.as_ptr().cast(), value.len(), flags) };
    if r < 0 {
        Err(last_errno())
    } else {
        Ok(())
    }
}

pub fn remove(path: &Path, name: &OsStr) -> Result<(), Errno> {
    let (p, n) = (cstr(path.as_os_str().as_bytes())?, cstr(name.as_bytes())?);
    // SAFETY: NUL-terminated path and name.
    if unsafe { libc::removexattr(p.as_ptr(), n.as_ptr()) } < 0 {
        Err(last_errno())
    } else {
        Ok(())
    }
}

/// Creates a FIFO, a socket, an empty regular file or a whiteout (character device 0:0, which the kernel
/// lets anyone make: overlayfs's mark of a removed file) `name` in the directory `dir` (`mode` with its
/// type bits; the thread's umask applies). Other device nodes are refused with `EPERM`.
pub fn mknod(dir: std::os::fd::BorrowedFd<'_>, name: &OsStr, mode: u32, rdev: u32) -> Result<(), Errno> {
    use nix::sys::stat::{Mode, SFlag};
    let kind = mode & libc::S_IFMT;
    let whiteout = kind == libc::S_IFCHR && rdev == 0;
    if !whiteout && !matches!(kind, libc::S_IFIFO | libc::S_IFSOCK | libc::S_IFREG | 0) {
        return Err(Errno::EPERM);
    }
    let kind = if kind == 0 { SFlag::S_IFREG } else { SFlag::from_bits_truncate(kind) };
    // dev 0: no device node but the whiteout is made.
    nix::sys::stat::mknodat(dir, name, kind, Mode::from_bits_truncate(mode & 0o7777), 0)
        .map_err(|e| Errno::from_i32(e as i32))
}

/// Queues invalidations of the kernel's cached pages of a file for a thread that sends them.
#[derive(Clone)]
pub struct KernelCache {
    tx: mpsc::Sender<(u64, i64, i64)>,
}

impl KernelCache {
    /// Starts the sending thread; it ends when every `KernelCache` clone is dropped.
    pub fn start(notifier: Notifier) -> KernelCache {
        let (tx, rx) = mpsc::channel::<(u64, i64, i64)>();
        let spawned = std::thread::Builder::new().name("dd-fuse-inval".into()).spawn(move || {
            for (ino, offset, len) in rx {
                // ENOENT: the kernel has no such inode cached (nothing to drop); other errors after an
                // unmount are expected too. Neither is worth a log line per file.
                if let Err(e) = notifier.inval_inode(INodeNo(ino), offset, len) {
                    tracing::debug!(ino, "kernel cache invalidation: {e}");
                }
            }
        });
        if let Err(e) = spawned {
            tracing::warn!("no kernel cache invalidation thread ({e}): shared mappings may see old data");
        }
        KernelCache { tx }
    }

    /// Drops the kernel's pages of FUSE inode `ino` from `offset` for `len` bytes (0: to the end).
    pub fn invalidate(&self, ino: u64, offset: i64, len: i64) {
        let _ = self.tx.send((ino, offset, len));
    }
}
