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

use crate::config::FuseConfig;
use crate::frontend::{Container, ContainerStats, Frontend, FrontendError, Object};
use crate::passthrough::{self, KernelCache, Xattr};
use fuser::{
    Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, Generation, INodeNo, InitFlags,
    KernelConfig, MountOption, OpenAccMode, OpenFlags, RenameFlags, ReplyAttr, ReplyCreate, ReplyData,
    ReplyDirectory, ReplyEmpty, ReplyEntry, ReplyOpen, ReplyStatfs, ReplyWrite, Request, SessionACL,
    TimeOrNow, WriteFlags,
};
use parking_lot::{Mutex, RwLock};
use std::collections::HashMap;
use std::ffi::OsStr;
use std::fs::{File, Metadata, OpenOptions};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

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

impl Filesystem for DdFs {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        if let Err(missing) = config.add_capabilities(InitFlags::FUSE_DIRECT_IO_ALLOW_MMAP) {
            tracing::info!(
                "the kernel lacks {missing:?} (Linux 6.6+): files on the mount cannot be mapped shared"
            );
        }
        Ok(())
    }

    fn destroy(&mut self) {
        self.fe.shutdown();
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        match self.child(parent, name).and_then(|rel| self.entry_of(&rel)) {
            Ok(a) => reply.entry(&TTL, &a, Generation(0)),
            Err(e) => reply.error(e),
        }
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, fh: Option<FileHandle>, reply: ReplyAttr) {
        let m = match fh.and_then(|fh| self.handle(fh).ok()) {
            Some(h) => h.file.metadata(),
            None => match self.rel(ino) {
                Ok(rel) => std::fs::symlink_metadata(self.full(&rel)),
                Err(e) => return reply.error(e),
            },
        };
        match m {
            Ok(m) => reply.attr(&TTL, &attr(ino.0, &m)),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn setattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
        _ctime: Option<SystemTime>,
        fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        let path = match self.rel(ino) {
            Ok(rel) => self.full(&rel),
            Err(e) => return reply.error(e),
        };
        let r = (|| -> std::io::Result<()> {
            if let Some(mode) = mode {
                std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode & 0o7777))?;
            }
            if uid.is_some() || gid.is_some() {
                std::os::unix::fs::lchown(&path, uid, gid)?;
            }
            if let Some(size) = size {
                let h = fh.and_then(|fh| self.handle(fh).ok()).filter(|h| h.file.metadata().is_ok());
                let file = match &h {
                    Some(h) if !h.append => None,
                    _ => Some(OpenOptions::new().write(true).open(&path)?),
                };
                let (f, obj) = match (&file, &h) {
                    (Some(f), _) => (f, self.fe.object(f.metadata()?.ino())),
                    (None, Some(h)) => (&h.file, h.obj.clone()),
                    (None, None) => unreachable!("a file is opened when there is no usable handle"),
                };
                self.fe.change_whole(&obj, || f.set_len(size))?;
            }
            if atime.is_some() || mtime.is_some() {
                DdFs::set_times(&path, atime, mtime)?;
            }
            Ok(())
        })();
        match r.and_then(|_| std::fs::symlink_metadata(&path)) {
            Ok(m) => reply.attr(&TTL, &attr(ino.0, &m)),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn mkdir(&self, req: &Request, parent: INodeNo, name: &OsStr, mode: u32, umask: u32, reply: ReplyEntry) {
        let rel = match self.child(parent, name) {
            Ok(r) => r,
            Err(e) => return reply.error(e),
        };
        let path = self.full(&rel);
        let r = std::fs::create_dir(&path).and_then(|_| {
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode & !umask & 0o7777))
        });
        if let Err(e) = r {
            return reply.error(errno(&e));
        }
        DdFs::chown_to_caller(&path, req);
        match self.entry_of(&rel) {
            Ok(a) => reply.entry(&TTL, &a, Generation(0)),
            Err(e) => reply.error(e),
        }
    }

    fn symlink(&self, req: &Request, parent: INodeNo, link_name: &OsStr, target: &Path, reply: ReplyEntry) {
        let rel = match self.child(parent, link_name) {
            Ok(r) => r,
            Err(e) => return reply.error(e),
        };
        let path = self.full(&rel);
        if let Err(e) = std::os::unix::fs::symlink(target, &path) {
            return reply.error(errno(&e));
        }
        DdFs::chown_to_caller(&path, req);
        match self.entry_of(&rel) {
            Ok(a) => reply.entry(&TTL, &a, Generation(0)),
            Err(e) => reply.error(e),
        }
    }

    fn readlink(&self, _req: &Request, ino: INodeNo, reply: ReplyData) {
        use std::os::unix::ffi::OsStrExt;
        match self.rel(ino).map(|rel| std::fs::read_link(self.full(&rel))) {
            Ok(Ok(t)) => reply.data(t.as_os_str().as_bytes()),
            Ok(Err(e)) => reply.error(errno(&e)),
            Err(e) => reply.error(e),
        }
    }

    fn link(&self, _req: &Request, ino: INodeNo, newparent: INodeNo, newname: &OsStr, reply: ReplyEntry) {
        // Both names reach one backing inode, hence one object and one lock: coherence is unchanged.
        let (from, to) = match (self.rel(ino), self.child(newparent, newname)) {
            (Ok(a), Ok(b)) => (a, b),
            (Err(e), _) | (_, Err(e)) => return reply.error(e),
        };
        if let Err(e) = std::fs::hard_link(self.full(&from), self.full(&to)) {
            return reply.error(errno(&e));
        }
        match self.entry_of(&to) {
            Ok(a) => reply.entry(&TTL, &a, Generation(0)),
            Err(e) => reply.error(e),
        }
    }

    fn unlink(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let path = match self.child(parent, name) {
            Ok(rel) => self.full(&rel),
            Err(e) => return reply.error(e),
        };
        match self.with_file_invalidated(&path, || std::fs::remove_file(&path)) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn rmdir(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        match self.child(parent, name).map(|rel| std::fs::remove_dir(self.full(&rel))) {
            Ok(Ok(())) => reply.ok(),
            Ok(Err(e)) => reply.error(errno(&e)),
            Err(e) => reply.error(e),
        }
    }

    fn rename(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        let (from, to) = match (self.child(parent, name), self.child(newparent, newname)) {
            (Ok(a), Ok(b)) => (a, b),
            (Err(e), _) | (_, Err(e)) => return reply.error(e),
        };
        let (src, dst) = (self.full(&from), self.full(&to));
        if flags.contains(RenameFlags::RENAME_EXCHANGE) {
            return reply.error(Errno::EINVAL);
        }
        if flags.contains(RenameFlags::RENAME_NOREPLACE) && std::fs::symlink_metadata(&dst).is_ok() {
            return reply.error(Errno::EEXIST);
        }
        // An overwritten target file is gone: its cached pages go with it.
        if let Err(e) = self.with_file_invalidated(&dst, || std::fs::rename(&src, &dst)) {
            return reply.error(errno(&e));
        }
        let mut t = self.inodes.write();
        for p in t.paths.values_mut() {
            if let Ok(rest) = p.strip_prefix(&from) {
                *p = if rest.as_os_str().is_empty() { to.clone() } else { to.join(rest) };
            }
        }
        reply.ok();
    }

    fn open(&self, req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        let path = match self.rel(ino) {
            Ok(rel) => self.full(&rel),
            Err(e) => return reply.error(e),
        };
        let r = DdFs::open_options(flags.0).open(&path).map_err(|e| errno(&e)).and_then(|f| {
            if flags.0 & libc::O_TRUNC != 0 && flags.acc_mode() != OpenAccMode::O_RDONLY {
                let obj = self.fe.object(f.metadata().map_err(|e| errno(&e))?.ino());
                self.fe.change_whole(&obj, || f.set_len(0)).map_err(|e| errno(&e))?;
            }
            self.add_handle(f, flags.0, self.container_of(req, None))
        });
        match r {
            Ok(fh) => reply.opened(FileHandle(fh), FopenFlags::FOPEN_DIRECT_IO),
            Err(e) => reply.error(e),
        }
    }

    fn create(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        flags: i32,
        reply: ReplyCreate,
    ) {
        let rel = match self.child(parent, name) {
            Ok(r) => r,
            Err(e) => return reply.error(e),
        };
        let path = self.full(&rel);
        let mut o = DdFs::open_options(flags);
        if OpenFlags(flags).acc_mode() == OpenAccMode::O_RDONLY {
            // create(2) with O_RDONLY still creates the file; the backing open needs write access to.
            o.write(true);
        }
        o.create(true).mode(mode & !umask & 0o7777).custom_flags(flags & libc::O_EXCL);
        let r = o.open(&path).map_err(|e| errno(&e)).and_then(|f| {
            DdFs::chown_to_caller(&path, req);
            if flags & libc::O_TRUNC != 0 {
                let obj = self.fe.object(f.metadata().map_err(|e| errno(&e))?.ino());
                self.fe.change_whole(&obj, || f.set_len(0)).map_err(|e| errno(&e))?;
            }
            let a = self.entry_of(&rel)?;
            Ok((self.add_handle(f, flags, self.container_of(req, None))?, a))
        });
        match r {
            Ok((fh, a)) => {
                reply.created(&TTL, &a, Generation(0), FileHandle(fh), FopenFlags::FOPEN_DIRECT_IO)
            }
            Err(e) => reply.error(e),
        }
    }

    fn read(
        &self,
        req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<fuser::LockOwner>,
        reply: ReplyData,
    ) {
        let h = match self.handle(fh) {
            Ok(h) => h,
            Err(e) => return reply.error(e),
        };
        let c = self.container_of(req, Some(&h));
        match self.fe.read(&c, &h.obj, &h.file, offset, size as usize) {
            Ok(data) => reply.data(&data),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn write(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        data: &[u8],
        write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<fuser::LockOwner>,
        reply: ReplyWrite,
    ) {
        let h = match self.handle(fh) {
            Ok(h) => h,
            Err(e) => return reply.error(e),
        };
        match self.fe.write(&h.obj, &h.file, offset, data, h.append) {
            Ok(n) => {
                reply.written(n as u32);
                // A write(2) through the mount makes the kernel's mapped pages of the range stale; a
                // write-back of those very pages (FUSE_WRITE_CACHE) does not.
                if !write_flags.contains(WriteFlags::FUSE_WRITE_CACHE) {
                    if let Some(k) = self.kernel.get() {
                        let (off, len) = if h.append { (0, 0) } else { (offset as i64, n as i64) };
                        k.invalidate(ino.0, off, len);
                    }
                }
            }
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn flush(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _lo: fuser::LockOwner,
        reply: ReplyEmpty,
    ) {
        // Writes are synchronous to the backing file: nothing is buffered here.
        reply.ok();
    }

    fn release(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        _lock_owner: Option<fuser::LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        self.handles.write().remove(&fh.0);
        reply.ok();
    }

    fn fsync(&self, _req: &Request, _ino: INodeNo, fh: FileHandle, datasync: bool, reply: ReplyEmpty) {
        let r = self.handle(fh).map(|h| if datasync { h.file.sync_data() } else { h.file.sync_all() });
        match r {
            Ok(Ok(())) => reply.ok(),
            Ok(Err(e)) => reply.error(errno(&e)),
            Err(e) => reply.error(e),
        }
    }

    fn opendir(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        let rel = match self.rel(ino) {
            Ok(r) => r,
            Err(e) => return reply.error(e),
        };
        let dir = self.full(&rel);
        let r = (|| -> std::io::Result<Vec<(u64, FileType, std::ffi::OsString)>> {
            let parent_ino = match rel.parent() {
                Some(p) => std::fs::metadata(self.full(p)).map(|m| self.intern(p, &m)).unwrap_or(ROOT),
                None => ROOT,
            };
            let mut v = vec![
                (ino.0, FileType::Directory, ".".into()),
                (parent_ino, FileType::Directory, "..".into()),
            ];
            for e in std::fs::read_dir(&dir)? {
                let e = e?;
                let child = rel.join(e.file_name());
                // Entries that vanish while listed are skipped.
                let Ok(m) = e.metadata() else { continue };
                v.push((self.intern(&child, &m), kind_of(&m), e.file_name()));
            }
            Ok(v)
        })();
        match r {
            Ok(v) => {
                let fh = self.next_fh.fetch_add(1, Ordering::Relaxed);
                self.dirs.lock().insert(fh, Arc::new(v));
                reply.opened(FileHandle(fh), FopenFlags::empty());
            }
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn readdir(&self, _req: &Request, _ino: INodeNo, fh: FileHandle, offset: u64, mut reply: ReplyDirectory) {
        let Some(list) = self.dirs.lock().get(&fh.0).cloned() else { return reply.error(Errno::EBADF) };
        for (i, (ino, kind, name)) in list.iter().enumerate().skip(offset as usize) {
            if reply.add(INodeNo(*ino), i as u64 + 1, *kind, name) {
                break;
            }
        }
        reply.ok();
    }

    fn fsyncdir(&self, _req: &Request, ino: INodeNo, _fh: FileHandle, _datasync: bool, reply: ReplyEmpty) {
        // sqlite3 fsyncs the directory after creating its journal: make the entry durable in the backing.
        let r = self.rel(ino).map(|rel| File::open(self.full(&rel)).and_then(|d| d.sync_all()));
        match r {
            Ok(Ok(())) => reply.ok(),
            Ok(Err(e)) => reply.error(errno(&e)),
            Err(e) => reply.error(e),
        }
    }

    fn releasedir(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        reply: ReplyEmpty,
    ) {
        self.dirs.lock().remove(&fh.0);
        reply.ok();
    }

    fn getxattr(&self, _req: &Request, ino: INodeNo, name: &OsStr, size: u32, reply: fuser::ReplyXattr) {
        xattr_reply(self.rel(ino).and_then(|rel| passthrough::get(&self.full(&rel), Some(name), size)), reply)
    }

    fn listxattr(&self, _req: &Request, ino: INodeNo, size: u32, reply: fuser::ReplyXattr) {
        xattr_reply(self.rel(ino).and_then(|rel| passthrough::get(&self.full(&rel), None, size)), reply)
    }

    fn setxattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        name: &OsStr,
        value: &[u8],
        flags: i32,
        _position: u32,
        reply: ReplyEmpty,
    ) {
        match self.rel(ino).and_then(|rel| passthrough::set(&self.full(&rel), name, value, flags)) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn removexattr(&self, _req: &Request, ino: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        match self.rel(ino).and_then(|rel| passthrough::remove(&self.full(&rel), name)) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn mknod(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        _rdev: u32,
        reply: ReplyEntry,
    ) {
        let made = self.child(parent, name).and_then(|rel| {
            let full = self.full(&rel);
            passthrough::mknod(&full, mode & !umask)?;
            Self::chown_to_caller(&full, req);
            self.entry_of(&rel)
        });
        match made {
            Ok(a) => reply.entry(&TTL, &a, Generation(0)),
            Err(e) => reply.error(e),
        }
    }

    /// No ioctl is served: `ENOTTY` ("not a terminal", what `isatty` expects of a file), without a log
    /// line (Python asks TCGETS of every file it opens).
    fn ioctl(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _flags: fuser::IoctlFlags,
        _cmd: u32,
        _in_data: &[u8],
        _out_size: u32,
        reply: fuser::ReplyIoctl,
    ) {
        reply.error(Errno::ENOTTY);
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        use std::os::unix::ffi::OsStrExt;
        let Ok(c) = std::ffi::CString::new(self.backing.as_os_str().as_bytes()) else {
            return reply.error(Errno::EINVAL);
        };
        // SAFETY: an all-zero statvfs is a valid value of this plain C struct.
        let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
        // SAFETY: c is a NUL-terminated path and st a valid writable statvfs, both outliving the call.
        if unsafe { libc::statvfs(c.as_ptr(), &mut st) } != 0 {
            return reply.error(errno(&std::io::Error::last_os_error()));
        }
        reply.statfs(
            st.f_blocks,
            st.f_bfree,
            st.f_bavail,
            st.f_files,
            st.f_ffree,
            st.f_bsize as u32,
            st.f_namemax as u32,
            st.f_frsize as u32,
        );
    }
}

fn xattr_reply(r: Result<Xattr, Errno>, reply: fuser::ReplyXattr) {
    match r {
        Ok(Xattr::Size(n)) => reply.size(n),
        Ok(Xattr::Data(d)) => reply.data(&d),
        Err(e) => reply.error(e),
    }
}

/// A mounted filesystem, not yet serving.
pub struct Mount {
    session: fuser::Session<DdFs>,
    fe: Arc<Frontend>,
    mountpoint: PathBuf,
    /// Publishes the sampled curves and applies budgets while the mount serves (`[sampling]`).
    publisher: Option<crate::publish::Publisher>,
}

/// Unmounts from another thread (a signal handler thread); [`Mount::run`] then returns.
pub struct Unmounter {
    session: fuser::SessionUnmounter,
    mountpoint: PathBuf,
}

impl Unmounter {
    /// Unmounts; if the mount is busy (a process has a file open or its working directory inside), it
    /// is detached instead (`MNT_DETACH`): gone from the namespace at once, served until the last open
    /// file is closed, then the session ends. Either way nothing stays mounted.
    pub fn unmount(&mut self) -> std::io::Result<()> {
        use std::os::unix::ffi::OsStrExt;
        let Err(e) = self.session.unmount() else { return Ok(()) };
        tracing::warn!("unmounting {}: {e}; detaching it", self.mountpoint.display());
        let c =
            std::ffi::CString::new(self.mountpoint.as_os_str().as_bytes()).map_err(std::io::Error::other)?;
        // SAFETY: c is a NUL-terminated path that outlives the call.
        if unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) } == 0 {
            Ok(())
        } else {
            Err(std::io::Error::last_os_error())
        }
    }
}

impl Mount {
    /// Connects to the daemon (if configured) and mounts `backing` on `mountpoint`.
    pub fn new(cfg: FuseConfig, backing: &Path, mountpoint: &Path) -> Result<Mount, FuseError> {
        let backing =
            backing.canonicalize().map_err(|source| FuseError::Backing { path: backing.into(), source })?;
        if !backing.is_dir() {
            let source = std::io::Error::new(std::io::ErrorKind::NotADirectory, "not a directory");
            return Err(FuseError::Backing { path: backing, source });
        }
        let threads = cfg.threads;
        let sampling = cfg.sampling.clone();
        let fe = Arc::new(Frontend::new(cfg)?);
        let mut options = fuser::Config::default();
        options.mount_options = vec![
            MountOption::FSName(format!("doubledecker:{}", backing.display())),
            MountOption::Subtype("doubledecker".into()),
            // The kernel checks permissions against the caller: the server itself acts as its own user.
            MountOption::DefaultPermissions,
        ];
        // Containers run as any user: everyone may use the mount (permission bits still apply).
        options.acl = SessionACL::All;
        options.n_threads = Some(threads);
        let backing_dev = std::fs::metadata(&backing).map(|m| m.dev()).unwrap_or(0);
        let fs = DdFs::new(backing, fe.clone());
        let (inodes, kernel) = (fs.inodes.clone(), fs.kernel.clone());
        let session = fuser::Session::new(fs, mountpoint, &options)
            .map_err(|source| FuseError::Mount { path: mountpoint.into(), source })?;
        let kc = KernelCache::start(session.notifier());
        let _ = kernel.set(kc.clone());
        // A backing file changed behind the mount: drop the kernel's pages of its FUSE inode (files on
        // another device below the backing directory are not mapped back; see `frontend.rs`).
        fe.on_change(Box::new(move |object, offset, len| {
            let ino = inodes.read().by_backing.get(&(backing_dev, object)).copied();
            if let Some(ino) = ino {
                kc.invalidate(ino, offset, len);
            }
        }));
        let mountpoint = mountpoint.canonicalize().unwrap_or_else(|_| mountpoint.to_path_buf());
        let publisher = crate::publish::Publisher::start(&sampling, fe.clone());
        Ok(Mount { session, fe, mountpoint, publisher })
    }

    pub fn unmounter(&mut self) -> Unmounter {
        Unmounter { session: self.session.unmount_callable(), mountpoint: self.mountpoint.clone() }
    }

    /// Serves requests until the filesystem is unmounted; returns the containers' counters.
    pub fn run(mut self) -> Result<Vec<ContainerStats>, FuseError> {
        let served = self.session.run().map_err(FuseError::Session);
        // Nothing is published or applied after the mount is gone.
        drop(self.publisher.take());
        served?;
        Ok(self.fe.stats())
    }
}
