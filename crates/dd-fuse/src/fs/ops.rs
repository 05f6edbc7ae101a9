//! The FUSE request handlers: the [`Filesystem`] implementation, one method per request, each mapping it
//! onto the backing directory (through the inode table's descriptors, never a path looked up again) and,
//! for file data, onto the frontend of the caller's container.
//!
//! Invariants: the ones of `fs` (its module docs): the inode and handle tables are leaf locks, taken by
//! its helpers; every entry reply is preceded by exactly one counted lookup (`DdFs::entry`); errors of
//! the backing file system reach the caller as their errno; entries and attributes carry a zero TTL.

use super::inode::{attr, ROOT};
use super::{errno, kill_suid, nix_errno, stat_fd, with_umask, DdFs, TTL};
use crate::passthrough::{self, Xattr};
use fuser::{
    Errno, FileHandle, FileType, Filesystem, FopenFlags, Generation, INodeNo, InitFlags, KernelConfig,
    OpenAccMode, OpenFlags, RenameFlags, ReplyAttr, ReplyCreate, ReplyData, ReplyDirectory, ReplyEmpty,
    ReplyEntry, ReplyOpen, ReplyStatfs, ReplyWrite, Request, TimeOrNow, WriteFlags,
};
use nix::fcntl::{AtFlags, OFlag};
use nix::sys::stat::Mode;
use std::ffi::OsStr;
use std::fs::File;
use std::os::fd::AsFd;
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
        // The creator's umask is applied by the backing file system (`with_umask`), not by the kernel.
        if let Err(missing) = config.add_capabilities(InitFlags::FUSE_DONT_MASK) {
            tracing::info!("the kernel lacks {missing:?}: it applies the umask itself");
        }
        Ok(())
    }

    fn destroy(&mut self) {
        self.fe.shutdown();
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        entry_reply(self.inode(parent).and_then(|p| self.entry(&p, name)), reply)
    }

    fn forget(&self, _req: &Request, ino: INodeNo, nlookup: u64) {
        self.inodes.write().forget(ino.0, nlookup);
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, fh: Option<FileHandle>, reply: ReplyAttr) {
        let st = match fh.and_then(|fh| self.handle(fh).ok()) {
            Some(h) => stat_fd(h.file.as_fd()),
            None => self.inode(ino).and_then(|i| stat_fd(i.fd())),
        };
        match st {
            Ok(st) => reply.attr(&TTL, &attr(ino.0, &st)),
            Err(e) => reply.error(e),
        }
    }

    fn setattr(
        &self,
        req: &Request,
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
        let inode = match self.inode(ino) {
            Ok(i) => i,
            Err(e) => return reply.error(e),
        };
        // The open file the request names, if any: what ftruncate and friends act on.
        let h = fh.and_then(|fh| self.handle(fh).ok());
        let r = (|| -> Result<(), Errno> {
            if let Some(mode) = mode {
                let mode = Mode::from_bits_truncate(mode & 0o7777);
                match &h {
                    Some(h) => nix::sys::stat::fchmod(h.file.as_fd(), mode),
                    // The O_PATH descriptor takes no fchmod: its /proc name leads to the file itself.
                    None => nix::sys::stat::fchmodat(
                        nix::fcntl::AT_FDCWD,
                        &inode.proc_path(),
                        mode,
                        nix::sys::stat::FchmodatFlags::FollowSymlink,
                    ),
                }
                .map_err(nix_errno)?;
            }
            if uid.is_some() || gid.is_some() {
                let (u, g) = (uid.map(nix::unistd::Uid::from_raw), gid.map(nix::unistd::Gid::from_raw));
                let how = AtFlags::AT_EMPTY_PATH | AtFlags::AT_SYMLINK_NOFOLLOW;
                nix::unistd::fchownat(inode.fd(), "", u, g, how).map_err(nix_errno)?;
            }
            if let Some(size) = size {
                let reopened;
                let file = match &h {
                    Some(h) if h.writable => &h.file,
                    _ => {
                        let flags = OFlag::O_WRONLY | OFlag::O_CLOEXEC;
                        let fd =
                            nix::fcntl::open(&inode.proc_path(), flags, Mode::empty()).map_err(nix_errno)?;
                        reopened = File::from(fd);
                        &reopened
                    }
                };
                let obj = self.fe.object(stat_fd(file.as_fd())?.st_ino);
                kill_suid(req, file.as_fd())?;
                self.fe.change_whole(&obj, || file.set_len(size)).map_err(|e| errno(&e))?;
            }
            if atime.is_some() || mtime.is_some() {
                let fd = h.as_ref().map_or(inode.fd(), |h| h.file.as_fd());
                DdFs::set_times(fd, atime, mtime).map_err(|e| errno(&e))?;
            }
            Ok(())
        })();
        let st = r.and_then(|_| stat_fd(h.as_ref().map_or(inode.fd(), |h| h.file.as_fd())));
        match st {
            Ok(st) => reply.attr(&TTL, &attr(ino.0, &st)),
            Err(e) => reply.error(e),
        }
    }

    fn mkdir(&self, req: &Request, parent: INodeNo, name: &OsStr, mode: u32, umask: u32, reply: ReplyEntry) {
        let made = self.inode(parent).and_then(|p| {
            with_umask(umask, mode, |mode| {
                nix::sys::stat::mkdirat(p.fd(), name, Mode::from_bits_truncate(mode & 0o7777))
            })
            .map_err(nix_errno)?;
            self.give_to_caller(&p, name, req)?;
            self.entry(&p, name)
        });
        entry_reply(made, reply)
    }

    fn symlink(
        &self,
        req: &Request,
        parent: INodeNo,
        link_name: &OsStr,
        target: &std::path::Path,
        reply: ReplyEntry,
    ) {
        let made = self.inode(parent).and_then(|p| {
            nix::unistd::symlinkat(target, p.fd(), link_name).map_err(nix_errno)?;
            self.give_to_caller(&p, link_name, req)?;
            self.entry(&p, link_name)
        });
        entry_reply(made, reply)
    }

    fn readlink(&self, _req: &Request, ino: INodeNo, reply: ReplyData) {
        use std::os::unix::ffi::OsStrExt;
        match self.inode(ino).and_then(|i| nix::fcntl::readlinkat(i.fd(), "").map_err(nix_errno)) {
            Ok(t) => reply.data(t.as_bytes()),
            Err(e) => reply.error(e),
        }
    }

    fn link(&self, _req: &Request, ino: INodeNo, newparent: INodeNo, newname: &OsStr, reply: ReplyEntry) {
        // Both names reach one backing inode, hence one object and one lock: coherence is unchanged.
        let made = self.inode(ino).and_then(|i| {
            let p = self.inode(newparent)?;
            // Through /proc (followed): the file itself, even with no name left (then ENOENT, as locally).
            let (from, how) = (i.proc_path(), AtFlags::AT_SYMLINK_FOLLOW);
            nix::unistd::linkat(nix::fcntl::AT_FDCWD, &from, p.fd(), newname, how).map_err(nix_errno)?;
            self.entry(&p, newname)
        });
        entry_reply(made, reply)
    }

    fn unlink(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let r = self.inode(parent).map(|p| {
            self.with_file_invalidated(&p, name, || {
                nix::unistd::unlinkat(p.fd(), name, nix::unistd::UnlinkatFlags::NoRemoveDir)
                    .map_err(std::io::Error::from)
            })
        });
        empty_reply(r, reply)
    }

    fn rmdir(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let r = self.inode(parent).map(|p| {
            nix::unistd::unlinkat(p.fd(), name, nix::unistd::UnlinkatFlags::RemoveDir)
                .map_err(std::io::Error::from)
        });
        empty_reply(r, reply)
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
        let r = self.inode(parent).and_then(|p| Ok((p, self.inode(newparent)?))).map(|(p, np)| {
            // renameat2 as asked (RENAME_NOREPLACE, RENAME_EXCHANGE, RENAME_WHITEOUT: what the backing
            // file system supports). Identity is the inodes', so nothing is renamed in the tables.
            let how = nix::fcntl::RenameFlags::from_bits_retain(flags.bits());
            let rename =
                || nix::fcntl::renameat2(p.fd(), name, np.fd(), newname, how).map_err(std::io::Error::from);
            if flags.contains(RenameFlags::RENAME_EXCHANGE) {
                // Both files stay, each with its bytes (and its cached pages, keyed by backing inode).
                rename()
            } else {
                // An overwritten target file is gone: its cached pages go with it.
                self.with_file_invalidated(&np, newname, rename)
            }
        });
        empty_reply(r, reply)
    }

    fn open(&self, req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        let r = self.inode(ino).and_then(|i| {
            // The file itself, through its inode's descriptor, with a descriptor of its own.
            let fd = nix::fcntl::open(&i.proc_path(), DdFs::open_flags(flags.0), Mode::empty())
                .map_err(nix_errno)?;
            let f = File::from(fd);
            if flags.0 & libc::O_TRUNC != 0 && flags.acc_mode() != OpenAccMode::O_RDONLY {
                let obj = self.fe.object(stat_fd(f.as_fd())?.st_ino);
                kill_suid(req, f.as_fd())?;
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
        let r = self.inode(parent).and_then(|p| {
            let how = DdFs::open_flags(flags) | OFlag::O_CREAT | OFlag::O_NOFOLLOW;
            let how = how | (OFlag::from_bits_truncate(flags) & OFlag::O_EXCL);
            let fd = with_umask(umask, mode, |mode| {
                nix::fcntl::openat(p.fd(), name, how, Mode::from_bits_truncate(mode & 0o7777))
            })
            .map_err(nix_errno)?;
            let f = File::from(fd);
            self.give_to_caller(&p, name, req)?;
            if flags & libc::O_TRUNC != 0 && flags & libc::O_ACCMODE != libc::O_RDONLY {
                let obj = self.fe.object(stat_fd(f.as_fd())?.st_ino);
                self.fe.change_whole(&obj, || f.set_len(0)).map_err(|e| errno(&e))?;
            }
            let fh = self.add_handle(f, flags, self.container_of(req, None))?;
            match self.entry(&p, name) {
                Ok(a) => Ok((fh, a)),
                Err(e) => {
                    self.handles.write().remove(&fh);
                    Err(e)
                }
            }
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
        req: &Request,
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
        // Not for a write-back of mapped pages: the kernel's own, whoever dirtied them.
        if !write_flags.contains(WriteFlags::FUSE_WRITE_CACHE) {
            if let Err(e) = kill_suid(req, h.file.as_fd()) {
                return reply.error(e);
            }
        }
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
        let r = self.inode(ino).and_then(|dir| {
            let parent = match ino.0 {
                ROOT => ROOT,
                _ => self.number_of(&dir, OsStr::new("..")).unwrap_or(ROOT),
            };
            let mut v =
                vec![(ino.0, FileType::Directory, ".".into()), (parent, FileType::Directory, "..".into())];
            // A descriptor of its own to read the directory (std skips `.` and `..`).
            for e in std::fs::read_dir(dir.proc_path()).map_err(|e| errno(&e))? {
                let e = e.map_err(|e| errno(&e))?;
                // Entries that vanish while listed are skipped.
                let Ok(t) = e.file_type() else { continue };
                let Some(n) = self.number_of(&dir, &e.file_name()) else { continue };
                let kind = FileType::from_std(t).unwrap_or(FileType::RegularFile);
                v.push((n, kind, e.file_name()));
            }
            Ok(v)
        });
        match r {
            Ok(v) => {
                let fh = self.next_fh.fetch_add(1, Ordering::Relaxed);
                self.dirs.lock().insert(fh, Arc::new(v));
                reply.opened(FileHandle(fh), FopenFlags::empty());
            }
            Err(e) => reply.error(e),
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
        let r = self.inode(ino).map(|d| File::open(d.proc_path()).and_then(|d| d.sync_all()));
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
        xattr_reply(self.inode(ino).and_then(|i| passthrough::get(&i.proc_path(), Some(name), size)), reply)
    }

    fn listxattr(&self, _req: &Request, ino: INodeNo, size: u32, reply: fuser::ReplyXattr) {
        xattr_reply(self.inode(ino).and_then(|i| passthrough::get(&i.proc_path(), None, size)), reply)
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
        match self.inode(ino).and_then(|i| passthrough::set(&i.proc_path(), name, value, flags)) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn removexattr(&self, _req: &Request, ino: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        match self.inode(ino).and_then(|i| passthrough::remove(&i.proc_path(), name)) {
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
        rdev: u32,
        reply: ReplyEntry,
    ) {
        let made = self.inode(parent).and_then(|p| {
            with_umask(umask, mode, |mode| passthrough::mknod(p.fd(), name, mode, rdev))?;
            self.give_to_caller(&p, name, req)?;
            self.entry(&p, name)
        });
        entry_reply(made, reply)
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

    fn fallocate(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        length: u64,
        mode: i32,
        reply: ReplyEmpty,
    ) {
        match self.do_fallocate(req, ino, fh, (offset, length), mode) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn lseek(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: i64,
        whence: i32,
        reply: fuser::ReplyLseek,
    ) {
        match self.do_lseek(fh, offset, whence) {
            Ok(o) => reply.offset(o),
            Err(e) => reply.error(e),
        }
    }

    fn copy_file_range(
        &self,
        req: &Request,
        _ino_in: INodeNo,
        fh_in: FileHandle,
        offset_in: u64,
        ino_out: INodeNo,
        fh_out: FileHandle,
        offset_out: u64,
        len: u64,
        _flags: fuser::CopyFileRangeFlags,
        reply: ReplyWrite,
    ) {
        match self.do_copy_file_range(req, (fh_in, offset_in), (ino_out, fh_out, offset_out), len) {
            Ok(n) => reply.written(n as u32),
            Err(e) => reply.error(e),
        }
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

/// Answers a request that makes or finds an entry (its lookup already counted by `DdFs::entry`).
fn entry_reply(r: Result<fuser::FileAttr, Errno>, reply: ReplyEntry) {
    match r {
        Ok(a) => reply.entry(&TTL, &a, Generation(0)),
        Err(e) => reply.error(e),
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
