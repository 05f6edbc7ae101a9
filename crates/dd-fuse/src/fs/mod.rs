//! The FUSE side: inode numbers, file handles and the mapping of FUSE requests onto the backing
//! directory and the [`Frontend`].
//!
//! Owns: the inode table (FUSE inode -> path relative to the backing directory; one FUSE inode per
//! backing `(device, inode)`), open file handles (backing `File`, its [`Object`], the opener's
//! container) and directory listings of open directories.
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
//! Invariants: the root is FUSE inode 1 and the empty relative path; a rename updates the paths of the
//! renamed entry and of everything below it; the inode table and handle tables are leaf locks (no I/O
//! under them except `read_dir` of an `opendir`, which holds only the directory table's lock for the
//! insert). Inodes are never forgotten during a mount (a few dozen bytes per file seen).
//!
//! Files: this one holds the tables and the helpers the request handlers share; `ops` is the
//! `fuser::Filesystem` implementation (one handler per FUSE request); `mount` mounts, serves and unmounts.

mod mount;
mod ops;

pub use mount::{Mount, Unmounter};

use crate::frontend::{Container, Frontend, FrontendError, Object};
use crate::passthrough::KernelCache;
use fuser::{Errno, FileAttr, FileHandle, FileType, INodeNo, OpenAccMode, OpenFlags, Request, TimeOrNow};
use parking_lot::{Mutex, RwLock};
use std::collections::HashMap;
use std::ffi::OsStr;
use std::fs::{File, Metadata, OpenOptions};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, UNIX_EPOCH};

const TTL: Duration = Duration::ZERO;
const ROOT: u64 = 1;

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

struct Inodes {
    paths: HashMap<u64, PathBuf>,
    by_backing: HashMap<(u64, u64), u64>,
    next: u64,
}

/// An open directory's entries: (FUSE inode, type, name), `.` and `..` first.
type Listing = Arc<Vec<(u64, FileType, std::ffi::OsString)>>;

struct Handle {
    file: File,
    obj: Arc<Object>,
    append: bool,
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

fn kind_of(m: &Metadata) -> FileType {
    FileType::from_std(m.file_type()).unwrap_or(FileType::RegularFile)
}

fn attr(ino: u64, m: &Metadata) -> FileAttr {
    let t = |s: i64, n: i64| {
        if s >= 0 {
            UNIX_EPOCH + Duration::new(s as u64, n as u32)
        } else {
            UNIX_EPOCH
        }
    };
    FileAttr {
        ino: INodeNo(ino),
        size: m.size(),
        blocks: m.blocks(),
        atime: t(m.atime(), m.atime_nsec()),
        mtime: t(m.mtime(), m.mtime_nsec()),
        ctime: t(m.ctime(), m.ctime_nsec()),
        crtime: UNIX_EPOCH,
        kind: kind_of(m),
        perm: (m.mode() & 0o7777) as u16,
        nlink: m.nlink() as u32,
        uid: m.uid(),
        gid: m.gid(),
        rdev: m.rdev() as u32,
        blksize: 4096,
        flags: 0,
    }
}

impl DdFs {
    pub fn new(backing: PathBuf, fe: Arc<Frontend>) -> DdFs {
        let mut paths = HashMap::new();
        paths.insert(ROOT, PathBuf::new());
        DdFs {
            backing,
            fe,
            inodes: Arc::new(RwLock::new(Inodes { paths, by_backing: HashMap::new(), next: ROOT + 1 })),
            kernel: Arc::new(std::sync::OnceLock::new()),
            handles: RwLock::new(HashMap::new()),
            dirs: Mutex::new(HashMap::new()),
            next_fh: AtomicU64::new(1),
        }
    }

    fn rel(&self, ino: INodeNo) -> Result<PathBuf, Errno> {
        self.inodes.read().paths.get(&ino.0).cloned().ok_or(Errno::ENOENT)
    }

    fn full(&self, rel: &Path) -> PathBuf {
        self.backing.join(rel)
    }

    fn child(&self, parent: INodeNo, name: &OsStr) -> Result<PathBuf, Errno> {
        Ok(self.rel(parent)?.join(name))
    }

    /// The FUSE inode of a backing file (allocated on first sight), and its path is `rel` from now on.
    fn intern(&self, rel: &Path, m: &Metadata) -> u64 {
        if rel.as_os_str().is_empty() {
            return ROOT;
        }
        let mut t = self.inodes.write();
        let key = (m.dev(), m.ino());
        let ino = match t.by_backing.get(&key) {
            Some(&i) => i,
            None => {
                let i = t.next;
                t.next += 1;
                t.by_backing.insert(key, i);
                i
            }
        };
        t.paths.insert(ino, rel.to_path_buf());
        ino
    }

    fn entry_of(&self, rel: &Path) -> Result<FileAttr, Errno> {
        let m = std::fs::symlink_metadata(self.full(rel)).map_err(|e| errno(&e))?;
        Ok(attr(self.intern(rel, &m), &m))
    }

    fn handle(&self, fh: FileHandle) -> Result<Arc<Handle>, Errno> {
        self.handles.read().get(&fh.0).cloned().ok_or(Errno::EBADF)
    }

    fn add_handle(&self, file: File, flags: i32, opener: Arc<Container>) -> Result<u64, Errno> {
        let m = file.metadata().map_err(|e| errno(&e))?;
        let obj = self.fe.object(m.ino());
        let fh = self.next_fh.fetch_add(1, Ordering::Relaxed);
        let h = Handle { file, obj, append: flags & libc::O_APPEND != 0, opener };
        self.handles.write().insert(fh, Arc::new(h));
        Ok(fh)
    }

    fn open_options(flags: i32) -> OpenOptions {
        let mut o = OpenOptions::new();
        match OpenFlags(flags).acc_mode() {
            OpenAccMode::O_RDONLY => o.read(true),
            OpenAccMode::O_WRONLY => o.write(true),
            OpenAccMode::O_RDWR => o.read(true).write(true),
        };
        // O_APPEND is kept on the backing file so concurrent appenders through the mount land at the end.
        o.append(flags & libc::O_APPEND != 0);
        o
    }

    fn chown_to_caller(path: &Path, req: &Request) {
        if req.uid() != 0 {
            if let Err(e) = std::os::unix::fs::lchown(path, Some(req.uid()), Some(req.gid())) {
                tracing::warn!("chown {}: {e}", path.display());
            }
        }
    }

    /// Drops and flushes a regular file's cached pages around `f` (which removes or replaces it).
    fn with_file_invalidated<T>(
        &self,
        path: &Path,
        f: impl FnOnce() -> std::io::Result<T>,
    ) -> std::io::Result<T> {
        match std::fs::symlink_metadata(path) {
            Ok(m) if m.is_file() => {
                let obj = self.fe.object(m.ino());
                self.fe.change_whole(&obj, f)
            }
            _ => f(),
        }
    }

    fn set_times(path: &Path, atime: Option<TimeOrNow>, mtime: Option<TimeOrNow>) -> std::io::Result<()> {
        use std::os::unix::ffi::OsStrExt;
        let ts = |t: Option<TimeOrNow>| match t {
            None => libc::timespec { tv_sec: 0, tv_nsec: libc::UTIME_OMIT },
            Some(TimeOrNow::Now) => libc::timespec { tv_sec: 0, tv_nsec: libc::UTIME_NOW },
            Some(TimeOrNow::SpecificTime(t)) => {
                let d = t.duration_since(UNIX_EPOCH).unwrap_or_default();
                libc::timespec { tv_sec: d.as_secs() as libc::time_t, tv_nsec: d.subsec_nanos() as _ }
            }
        };
        let times = [ts(atime), ts(mtime)];
        let c = std::ffi::CString::new(path.as_os_str().as_bytes()).map_err(std::io::Error::other)?;
        // SAFETY: c is a NUL-terminated path and times an array of two timespecs, both outliving the call.
        let rc =
            unsafe { libc::utimensat(libc::AT_FDCWD, c.as_ptr(), times.as_ptr(), libc::AT_SYMLINK_NOFOLLOW) };
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
