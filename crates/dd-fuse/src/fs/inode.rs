//! The inode table: which backing file each FUSE inode is, held by a descriptor rather than a path.
//!
//! Owns: for every inode the kernel currently knows (looked up and not yet forgotten), an `O_PATH`
//! descriptor on its backing file and the kernel's lookup count; and for every backing file seen (by its
//! `(device, inode)`), its FUSE inode number.
//!
//! Why descriptors: a path names whatever file is there *now*. After a rename over the name, an unlink,
//! or the removal of the name last looked up of a hard link, an operation on an open file or a known
//! inode must still reach the file itself, as on a local file system (libfuse's `passthrough_ll`,
//! virtiofsd). Operations relative to a directory's descriptor (`openat`, `mkdirat`, ...) also leave
//! path depth and length to the backing file system's limits.
//!
//! Invariants: the root is inode 1, its descriptor is held for the life of the mount and never
//! forgotten; one backing `(device, inode)` has one FUSE inode number for the life of the mount (a few
//! dozen bytes per file seen), so `d_ino` of a listing and `st_ino` agree; an inode's descriptor is held
//! while its lookup count is above zero and closed by the `forget` that brings it to zero. That is the
//! mount's descriptor budget: one per inode the kernel caches, plus one per open file (the limit is
//! raised to the hard limit at start, `raise_nofile_limit`). The table is a leaf lock: no I/O under it.

use fuser::{Errno, FileAttr, FileType, INodeNo};
use nix::sys::stat::FileStat;
use std::collections::HashMap;
use std::os::fd::{AsRawFd, BorrowedFd, OwnedFd};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, UNIX_EPOCH};

pub(super) const ROOT: u64 = 1;

/// A backing file the kernel knows as an inode.
pub(super) struct Inode {
    /// `O_PATH | O_NOFOLLOW` on the backing file (a symlink's own inode for a symlink).
    fd: OwnedFd,
}

impl Inode {
    pub fn fd(&self) -> BorrowedFd<'_> {
        use std::os::fd::AsFd;
        self.fd.as_fd()
    }

    /// `/proc/self/fd/N`: what calls that take no `AT_EMPTY_PATH` (`open` again with access flags,
    /// `chmod`, extended attributes, `linkat` without `CAP_DAC_READ_SEARCH`) follow to the file itself,
    /// even once it has no name left.
    pub fn proc_path(&self) -> PathBuf {
        PathBuf::from(format!("/proc/self/fd/{}", self.fd.as_raw_fd()))
    }
}

struct Live {
    inode: Arc<Inode>,
    nlookup: u64,
}

pub(crate) struct Inodes {
    live: HashMap<u64, Live>,
    /// Backing `(device, inode)` -> FUSE inode; also how the frontend's change hook finds the inode of
    /// a backing file.
    pub by_backing: HashMap<(u64, u64), u64>,
    next: u64,
}

impl Inodes {
    pub fn new(root: OwnedFd, root_key: (u64, u64)) -> Inodes {
        let mut live = HashMap::new();
        live.insert(ROOT, Live { inode: Arc::new(Inode { fd: root }), nlookup: 1 });
        let mut by_backing = HashMap::new();
        by_backing.insert(root_key, ROOT);
        Inodes { live, by_backing, next: ROOT + 1 }
    }

    /// The inode the kernel knows as `ino` (`ESTALE` once forgotten: the kernel no longer has it).
    pub fn get(&self, ino: INodeNo) -> Result<Arc<Inode>, Errno> {
        self.live.get(&ino.0).map(|l| l.inode.clone()).ok_or(Errno::ESTALE)
    }

    /// The FUSE inode number of a backing file (allocated on first sight, held for the mount's life).
    pub fn number(&mut self, key: (u64, u64)) -> u64 {
        if let Some(&i) = self.by_backing.get(&key) {
            return i;
        }
        let i = self.next;
        self.next += 1;
        self.by_backing.insert(key, i);
        i
    }

    /// Counts one more kernel lookup of the backing file `fd` (whose stat is `st`); keeps `fd` if the
    /// inode was not known, else drops it (the known descriptor is the same file). Returns the inode.
    pub fn remember(&mut self, fd: OwnedFd, st: &FileStat) -> u64 {
        let ino = self.number(key(st));
        self.live
            .entry(ino)
            .and_modify(|l| l.nlookup += 1)
            .or_insert_with(|| Live { inode: Arc::new(Inode { fd }), nlookup: 1 });
        ino
    }

    /// The kernel dropped `n` lookups of `ino`; at zero the descriptor is closed.
    pub fn forget(&mut self, ino: u64, n: u64) {
        if ino == ROOT {
            return;
        }
        if let Some(l) = self.live.get_mut(&ino) {
            l.nlookup = l.nlookup.saturating_sub(n);
            if l.nlookup == 0 {
                self.live.remove(&ino);
            }
        }
    }
}

pub(super) fn key(st: &FileStat) -> (u64, u64) {
    (st.st_dev, st.st_ino)
}

pub(super) fn kind_of(mode: u32) -> FileType {
    match mode & libc::S_IFMT {
        libc::S_IFDIR => FileType::Directory,
        libc::S_IFLNK => FileType::Symlink,
        libc::S_IFIFO => FileType::NamedPipe,
        libc::S_IFSOCK => FileType::Socket,
        libc::S_IFCHR => FileType::CharDevice,
        libc::S_IFBLK => FileType::BlockDevice,
        _ => FileType::RegularFile,
    }
}

/// The attributes the kernel is given for FUSE inode `ino` whose backing file has `st`.
pub(super) fn attr(ino: u64, st: &FileStat) -> FileAttr {
    let t = |s: i64, n: i64| {
        if s >= 0 {
            UNIX_EPOCH + Duration::new(s as u64, n as u32)
        } else {
            UNIX_EPOCH
        }
    };
    FileAttr {
        ino: INodeNo(ino),
        size: st.st_size as u64,
        blocks: st.st_blocks as u64,
        atime: t(st.st_atime, st.st_atime_nsec),
        mtime: t(st.st_mtime, st.st_mtime_nsec),
        ctime: t(st.st_ctime, st.st_ctime_nsec),
        crtime: UNIX_EPOCH,
        kind: kind_of(st.st_mode),
        perm: (st.st_mode & 0o7777) as u16,
        nlink: st.st_nlink as u32,
        uid: st.st_uid,
        gid: st.st_gid,
        rdev: st.st_rdev as u32,
        blksize: 4096,
        flags: 0,
    }
}

/// Raises the soft limit on open descriptors to the hard limit (each inode the kernel caches holds
/// one); returns the limit now in force.
pub fn raise_nofile_limit() -> u64 {
    use nix::sys::resource::{getrlimit, setrlimit, Resource};
    match getrlimit(Resource::RLIMIT_NOFILE) {
        Ok((soft, hard)) if soft < hard => match setrlimit(Resource::RLIMIT_NOFILE, hard, hard) {
            Ok(()) => hard,
            Err(_) => soft,
        },
        Ok((soft, _)) => soft,
        Err(_) => 0,
    }
}
