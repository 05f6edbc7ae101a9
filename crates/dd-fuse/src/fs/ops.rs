//! The FUSE request handlers: the [`Filesystem`] implementation, one method per request, each mapping it
//! onto the backing directory (paths through the inode table) and, for file data, onto the frontend of
//! the caller's container.
//!
//! Invariants: the ones of `fs` (its module docs): the inode and handle tables are leaf locks, taken by
//! its helpers; errors of the backing file system reach the caller as their errno; entries and
//! attributes carry a zero TTL.

use super::{attr, errno, kind_of, DdFs, ROOT, TTL};
use crate::passthrough::{self, Xattr};
use fuser::{
    Errno, FileHandle, FileType, Filesystem, FopenFlags, Generation, INodeNo, InitFlags, KernelConfig,
    OpenAccMode, OpenFlags, RenameFlags, ReplyAttr, ReplyCreate, ReplyData, ReplyDirectory, ReplyEmpty,
    ReplyEntry, ReplyOpen, ReplyStatfs, ReplyWrite, Request, TimeOrNow, WriteFlags,
};
use std::ffi::OsStr;
use std::fs::{File, OpenOptions};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::SystemTime;

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
        empty_reply(self.child(parent, name).map(|rel| std::fs::remove_dir(self.full(&rel))), reply)
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
        empty_reply(r, reply)
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
        empty_reply(r, reply)
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

/// Answers a request that returns nothing: a missing inode or handle (`Err`) or the backing call's
/// result.
fn empty_reply(r: Result<std::io::Result<()>, Errno>, reply: ReplyEmpty) {
    match r {
        Ok(Ok(())) => reply.ok(),
        Ok(Err(e)) => reply.error(errno(&e)),
        Err(e) => reply.error(e),
    }
}

fn xattr_reply(r: Result<Xattr, Errno>, reply: fuser::ReplyXattr) {
    match r {
        Ok(Xattr::Size(n)) => reply.size(n),
        Ok(Xattr::Data(d)) => reply.data(&d),
        Err(e) => reply.error(e),
    }
}
