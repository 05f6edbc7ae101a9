//! The FUSE side: inode numbers, file handles and the mapping of FUSE requests onto the backing
//! directory and the [`Frontend`].
//!
//! Owns: the inode table (`inode`: FUSE inode -> an `O_PATH` descriptor on its backing file; one FUSE
//! inode per backing `(device, inode)`), open file handles (a backing descriptor of their own, its
//! [`Object`], the opener's container) and directory listings of open directories.
//!
//! Every operation reaches the backing file through descriptors, never a path looked up again: an
//! inode's `O_PATH` descriptor, an open file's own descriptor (the FUSE request's `fh` when it names one:
//! `fstat`, `ftruncate`, `fchmod`, `futimens`, `fallocate` act on the file opened, whatever has been
//! renamed over its name since), and for names, the parent directory's descriptor (`openat`,
//! `mkdirat`, `renameat2`, ...). So an open file keeps its identity across rename, unlink and link as on a
//! local file system, and paths are as deep and long as the backing file system allows.
//!
//! Every open file is opened `FOPEN_DIRECT_IO`, so the kernel keeps no page cache of its own for
//! `read`/`write`: the first-level caches of the frontend are the containers' page caches, and every read
//! reaches them. Mappings are allowed (`FUSE_DIRECT_IO_ALLOW_MMAP`, Linux 6.6+): a mapped file's pages
//! live in the kernel's page cache, faulted in through the frontend and written back through it; how
//! they stay coherent is argued in `frontend.rs` ("Shared mappings"). Extended attributes and special
//! nodes pass through to the backing directory (`passthrough`); ioctls are answered `ENOTTY`, quietly.
//! Attributes and entries are given a zero TTL, so the kernel asks again each time and sizes changed by
//! other processes or behind the mount's back are seen at once.
//!
//! Permissions as the creator asked: the mount takes `FUSE_DONT_MASK`, so the kernel passes the mode and
//! the caller's umask unmasked, and each worker thread creates with the caller's umask as its own
//! (`unshare(CLONE_FS)` gives each thread its umask), so the backing file system applies it exactly as a
//! local create would (default ACLs included). Files are created by the server and given to the caller
//! (owner, and group unless the directory is set-group-ID). A write or truncation by anyone but root
//! clears set-user-ID (and set-group-ID with group execute), as the kernel does for local files.
//!
//! Invariants: the root is FUSE inode 1; the inode and handle tables are leaf locks (no I/O under
//! them); every entry reply counts one lookup in the inode table, matched by the kernel's `forget`.
//!
//! Files: this one holds the tables and the helpers the request handlers share; `inode` the inode table;
//! `ops` is the `fuser::Filesystem` implementation (one handler per FUSE request); `ops_data` the
//! handlers of file contents beyond read and write (`fallocate`, `lseek`, `copy_file_range`); `mount`
//! mounts, serves and unmounts.

mod inode;
mod mount;
mod ops;
mod ops_data;

pub use inode::raise_nofile_limit;
pub use mount::{Mount, Unmounter};

use crate::frontend::{Container, Frontend, FrontendError, Object};
use crate::passthrough::KernelCache;
use fuser::{Errno, FileAttr, FileHandle, FileType, INodeNo, OpenAccMode, OpenFlags, Request, TimeOrNow};
use inode::{attr, Inode, Inodes};
use nix::fcntl::{AtFlags, OFlag};
use nix::sys::stat::{FchmodatFlags, FileStat, Mode};
use parking_lot::{Mutex, RwLock};
use std::collections::HashMap;
use std::ffi::OsStr;
use std::fs::File;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, UNIX_EPOCH};

const TTL: Duration = Duration::ZERO;

/// Errors of mounting.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum FuseError {
    #[error("{0}")]
    Frontend(#[from] FrontendError),
    #[error("backing directory {path}: {source}")]
    Backing { path: PathBuf, source: std::io::Error },
    #[error("mounting on {path}: {source}")]
    Mount { path: PathBuf, source: std::io::Error },
    #[error("serving the mount: {0}")]
    Session(std::io::Error),
}

/// An open directory's entries: (FUSE inode, type, name), `.` and `..` first.
type Listing = Arc<Vec<(u64, FileType, std::ffi::OsString)>>;

struct Handle {
    /// The file's own descriptor, opened with the opener's access mode.
    file: File,
    obj: Arc<Object>,
    append: bool,
    writable: bool,
    opener: Arc<Container>,
}

/// The filesystem served on the mount point.
pub struct DdFs {
    backing: PathBuf,
    fe: Arc<Frontend>,
    /// Shared with the frontend's change hook, which maps backing files to FUSE inodes.
    inodes: Arc<RwLock<Inodes>>,
    /// Set once the session exists (its notifier is what sends invalidations).
    kernel: Arc<std::sync::OnceLock<KernelCache>>,
    handles: RwLock<HashMap<u64, Arc<Handle>>>,
    dirs: Mutex<HashMap<u64, Listing>>,
    next_fh: AtomicU64,
}

fn errno(e: &std::io::Error) -> Errno {
    Errno::from_i32(e.raw_os_error().unwrap_or(libc::EIO))
}

fn nix_errno(e: nix::Error) -> Errno {
    Errno::from_i32(e as i32)
}

/// The attributes of the file `fd` refers to (an `O_PATH` descriptor included; a symlink's own).
fn stat_fd(fd: BorrowedFd<'_>) -> Result<FileStat, Errno> {
    nix::sys::stat::fstatat(fd, "", AtFlags::AT_EMPTY_PATH | AtFlags::AT_SYMLINK_NOFOLLOW).map_err(nix_errno)
}

impl DdFs {
    /// A filesystem over the backing directory open as `root` (an `O_PATH` directory descriptor).
    pub fn new(backing: PathBuf, root: OwnedFd, fe: Arc<Frontend>) -> Result<DdFs, std::io::Error> {
        let st = stat_fd(root.as_fd()).map_err(|e| std::io::Error::from_raw_os_error(e.code()))?;
        Ok(DdFs {
            backing,
            fe,
            inodes: Arc::new(RwLock::new(Inodes::new(root, inode::key(&st)))),
            kernel: Arc::new(std::sync::OnceLock::new()),
            handles: RwLock::new(HashMap::new()),
            dirs: Mutex::new(HashMap::new()),
            next_fh: AtomicU64::new(1),
        })
    }

    fn inode(&self, ino: INodeNo) -> Result<Arc<Inode>, Errno> {
        self.inodes.read().get(ino)
    }

    /// Looks `name` up in `parent` and counts the lookup the entry reply gives the kernel.
    fn entry(&self, parent: &Inode, name: &OsStr) -> Result<FileAttr, Errno> {
        let flags = OFlag::O_PATH | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
        let fd = nix::fcntl::openat(parent.fd(), name, flags, Mode::empty()).map_err(nix_errno)?;
        let st = stat_fd(fd.as_fd())?;
        let ino = self.inodes.write().remember(fd, &st);
        Ok(attr(ino, &st))
    }

    /// The FUSE inode number `name` in `parent` has or will have (a listing's `d_ino`), without a lookup.
    fn number_of(&self, dir: &Inode, name: &OsStr) -> Option<u64> {
        let st = nix::sys::stat::fstatat(dir.fd(), name, AtFlags::AT_SYMLINK_NOFOLLOW).ok()?;
        Some(self.inodes.write().number(inode::key(&st)))
    }

    fn handle(&self, fh: FileHandle) -> Result<Arc<Handle>, Errno> {
        self.handles.read().get(&fh.0).cloned().ok_or(Errno::EBADF)
    }

    fn add_handle(&self, file: File, flags: i32, opener: Arc<Container>) -> Result<u64, Errno> {
        let st = stat_fd(file.as_fd())?;
        let obj = self.fe.object(st.st_ino);
        let fh = self.next_fh.fetch_add(1, Ordering::Relaxed);
        let writable = OpenFlags(flags).acc_mode() != OpenAccMode::O_RDONLY;
        let h = Handle { file, obj, append: flags & libc::O_APPEND != 0, writable, opener };
        self.handles.write().insert(fh, Arc::new(h));
        Ok(fh)
    }

    /// The backing open flags of a FUSE open: the caller's access mode and the flags that change what
    /// reads and writes do. `O_TRUNC` is left out: truncation is done under the object's lock (it
    /// invalidates the cache); creation flags are the caller of this one's to add.
    fn open_flags(flags: i32) -> OFlag {
        let kept = libc::O_ACCMODE | libc::O_APPEND | libc::O_SYNC | libc::O_DSYNC | libc::O_NOATIME;
        // O_APPEND is kept on the backing file so concurrent appenders through the mount land at the end.
        OFlag::from_bits_truncate(flags & kept) | OFlag::O_CLOEXEC
    }

    /// Gives a file just created by the server (as root) in `parent` to the caller: owner, and group
    /// unless the directory is set-group-ID (then the group it inherited stays). The set-ID bits a
    /// `chown` clears are put back: the creator asked for them.
    fn give_to_caller(&self, parent: &Inode, name: &OsStr, req: &Request) -> Result<(), Errno> {
        let nofollow = AtFlags::AT_SYMLINK_NOFOLLOW;
        let st = nix::sys::stat::fstatat(parent.fd(), name, nofollow).map_err(nix_errno)?;
        let pst = stat_fd(parent.fd())?;
        let gid = if pst.st_mode & libc::S_ISGID != 0 { st.st_gid } else { req.gid() };
        if (st.st_uid, st.st_gid) == (req.uid(), gid) {
            return Ok(());
        }
        let (u, g) = (nix::unistd::Uid::from_raw(req.uid()), nix::unistd::Gid::from_raw(gid));
        nix::unistd::fchownat(parent.fd(), name, Some(u), Some(g), nofollow).map_err(nix_errno)?;
        let ids = st.st_mode & (libc::S_ISUID | libc::S_ISGID);
        if ids != 0 && st.st_mode & libc::S_IFMT != libc::S_IFLNK {
            // Not a symlink: the name is followed to the file itself.
            let (mode, how) = (Mode::from_bits_truncate(st.st_mode & 0o7777), FchmodatFlags::FollowSymlink);
            nix::sys::stat::fchmodat(parent.fd(), name, mode, how).map_err(nix_errno)?;
        }
        Ok(())
    }

    /// Drops and flushes the cached pages of the regular file `name` in `parent` around `f` (which
    /// removes or replaces that name).
    fn with_file_invalidated<T>(
        &self,
        parent: &Inode,
        name: &OsStr,
        f: impl FnOnce() -> std::io::Result<T>,
    ) -> std::io::Result<T> {
        match nix::sys::stat::fstatat(parent.fd(), name, AtFlags::AT_SYMLINK_NOFOLLOW) {
            Ok(st) if st.st_mode & libc::S_IFMT == libc::S_IFREG => {
                let obj = self.fe.object(st.st_ino);
                self.fe.change_whole(&obj, f)
            }
            _ => f(),
        }
    }

    /// Sets the times of the file `fd` refers to (an `O_PATH` descriptor included, and a symlink's own).
    fn set_times(
        fd: BorrowedFd<'_>,
        atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
    ) -> std::io::Result<()> {
        use std::os::fd::AsRawFd;
        let ts = |t: Option<TimeOrNow>| match t {
            None => libc::timespec { tv_sec: 0, tv_nsec: libc::UTIME_OMIT },
            Some(TimeOrNow::Now) => libc::timespec { tv_sec: 0, tv_nsec: libc::UTIME_NOW },
            Some(TimeOrNow::SpecificTime(t)) => {
                let d = t.duration_since(UNIX_EPOCH).unwrap_or_default();
                libc::timespec { tv_sec: d.as_secs() as libc::time_t, tv_nsec: d.subsec_nanos() as _ }
            }
        };
        let times = [ts(atime), ts(mtime)];
        // SAFETY: the path is a NUL-terminated empty string and times an array of two timespecs, both
        // outliving the call; fd is a descriptor borrowed for the call.
        let rc = unsafe {
            libc::utimensat(
                fd.as_raw_fd(),
                c"".as_ptr(),
                times.as_ptr(),
                libc::AT_EMPTY_PATH | libc::AT_SYMLINK_NOFOLLOW,
            )
        };
        if rc == 0 {
            Ok(())
        } else {
            Err(std::io::Error::last_os_error())
        }
    }

    fn container_of(&self, req: &Request, h: Option<&Handle>) -> Arc<Container> {
        // Requests the kernel makes on its own behalf carry no pid: charge the opener.
        match (req.pid(), h) {
            (0, Some(h)) => h.opener.clone(),
            (pid, _) => self.fe.container_for_pid(pid),
        }
    }
}

/// Runs `f` (a creation) with this thread's umask set to the caller's, so the backing file system
/// applies it as a local create would (with `FUSE_DONT_MASK` the kernel has not). Each worker thread
/// gets a umask of its own once (`unshare(CLONE_FS)`); where that is refused, the umask is applied to
/// the mode `f` is given instead and the process umask is left alone.
fn with_umask<T>(umask: u32, mode: u32, f: impl FnOnce(u32) -> T) -> T {
    use std::cell::Cell;
    thread_local!(static OWN_UMASK: Cell<Option<bool>> = const { Cell::new(None) });
    let own = OWN_UMASK.with(|c| {
        *c.get().get_or_insert_with(|| match nix::sched::unshare(nix::sched::CloneFlags::CLONE_FS) {
            Ok(()) => true,
            Err(e) => {
                tracing::warn!("unshare(CLONE_FS): {e}; creating with the umask applied to the mode");
                false
            }
        })
    });
    if !own {
        return f(mode & !umask);
    }
    let old = nix::sys::stat::umask(Mode::from_bits_truncate(umask & 0o777));
    let r = f(mode);
    nix::sys::stat::umask(old);
    r
}

/// Clears set-user-ID, and set-group-ID if group-executable, of a regular file written or truncated by
/// a caller other than root, as the kernel does for a local file (the server itself, root, would keep
/// them: it has `CAP_FSETID`).
fn kill_suid(req: &Request, fd: BorrowedFd<'_>) -> Result<(), Errno> {
    if req.uid() == 0 {
        return Ok(());
    }
    let st = stat_fd(fd)?;
    let mut kill = st.st_mode & libc::S_ISUID;
    if st.st_mode & (libc::S_ISGID | libc::S_IXGRP) == libc::S_ISGID | libc::S_IXGRP {
        kill |= libc::S_ISGID;
    }
    if kill == 0 || st.st_mode & libc::S_IFMT != libc::S_IFREG {
        return Ok(());
    }
    nix::sys::stat::fchmod(fd, Mode::from_bits_truncate(st.st_mode & 0o7777 & !kill)).map_err(nix_errno)
}
