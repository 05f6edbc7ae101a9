//! The SSD store's file: creating it (named, or as an unnamed scratch file), re-initialising it,
//! reserving its blocks, and choosing between direct and buffered I/O.
//!
//! Invariants:
//! * **Old contents are discarded before anything else** (truncate to zero, then extend), so whatever
//!   fails later, no page from before the open can be read back (SPEC section 4).
//! * **A scratch file never has a name that outlives the open**: it is created with `O_TMPFILE`, or, on a
//!   file system without it, created under a fresh name and unlinked before the open returns. So no exit
//!   path of the process (a panic, SIGKILL, the OOM killer) can leave it behind: the kernel frees its
//!   blocks when the last descriptor closes.
//! * **Nothing is reserved on a memory-backed file system** (tmpfs, ramfs): there `fallocate` would
//!   commit the store's whole capacity as memory at once (issue 13: a 16 GiB lab store in `/dev/shm`
//!   took 16 GiB of RAM before its first page). The file is only extended (sparse), so it costs memory
//!   as pages are written. On a real file system the blocks are reserved, so a full disk shows up at
//!   open rather than as failed background writes.

use super::buf::AlignedBuf;
use super::SsdOptions;
use crate::config::DirectIo;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

/// `statfs` magic numbers of file systems whose files live in memory (`linux/magic.h`).
const TMPFS_MAGIC: i64 = 0x0102_1994;
const RAMFS_MAGIC: i64 = 0x8584_58f6;

/// Whether `path` (a file or directory) is on a memory-backed file system (tmpfs, ramfs), where a file's
/// pages are memory. Callers use it to count such files in a memory budget.
pub fn is_memory_backed(path: &Path) -> io::Result<bool> {
    let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "path contains a NUL byte"))?;
    // SAFETY: `statfs` is plain data for which all-zero bytes is a valid value.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: a NUL-terminated path and a pointer to a `statfs` we own that the kernel fills.
    if unsafe { libc::statfs(c.as_ptr(), &mut st) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(is_memory_magic(st.f_type as i64))
}

fn is_memory_magic(f_type: i64) -> bool {
    f_type == TMPFS_MAGIC || f_type == RAMFS_MAGIC
}

fn file_is_memory_backed(file: &File) -> bool {
    // SAFETY: as in `is_memory_backed`.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: a valid fd and a pointer to a `statfs` we own that the kernel fills.
    let r = unsafe { libc::fstatfs(file.as_raw_fd(), &mut st) };
    // When the kernel does not say, reserve as before (the safe choice on a disk).
    r == 0 && is_memory_magic(st.f_type as i64)
}

/// Creates an unnamed file in `dir`: `O_TMPFILE` where the file system supports it, else a fresh name
/// created exclusively and unlinked at once.
fn create_scratch(dir: &Path) -> io::Result<File> {
    let tmpfile =
        OpenOptions::new().read(true).write(true).mode(0o600).custom_flags(libc::O_TMPFILE).open(dir);
    match tmpfile {
        Ok(f) => return Ok(f),
        // Not supported by this file system (or kernel): fall back to create-and-unlink.
        Err(e) if matches!(e.raw_os_error(), Some(libc::EOPNOTSUPP | libc::EISDIR | libc::EINVAL)) => {}
        Err(e) => return Err(e),
    }
    create_and_unlink(dir)
}

/// The fallback of [`create_scratch`]: a fresh name, created exclusively (mode 0600) and unlinked
/// before the file is used.
fn create_and_unlink(dir: &Path) -> io::Result<File> {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    loop {
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let name = dir.join(format!(".dd-ssd-scratch-{}-{n}", std::process::id()));
        match OpenOptions::new().read(true).write(true).create_new(true).mode(0o600).open(&name) {
            Ok(f) => {
                std::fs::remove_file(&name)?;
                return Ok(f);
            }
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(e),
        }
    }
}

/// Opens (and re-initialises) the store file; returns it, whether `O_DIRECT` is on, and the memory
/// alignment a caller's buffer needs for I/O on it. With `opts.scratch`, `opts.path` is a directory and
/// the file has no name.
pub(crate) fn open_file(opts: &SsdOptions, len: u64) -> io::Result<(File, bool, usize)> {
    // Discard the old contents first: whatever happens next, no old page can be read back.
    let file = if opts.scratch {
        create_scratch(&opts.path)?
    } else {
        OpenOptions::new().read(true).write(true).create(true).truncate(false).open(&opts.path)?
    };
    file.set_len(0)?;
    reserve(&file, 0, len)?;
    // Slots are read at random: readahead of neighbouring slots would only waste I/O and page cache
    // (buffered mode; direct I/O never reads ahead). A hint, so a refusal does not matter.
    // SAFETY: posix_fadvise on a valid fd; offset 0 and length 0 cover the whole file.
    let _ = unsafe { libc::posix_fadvise(file.as_raw_fd(), 0, 0, libc::POSIX_FADV_RANDOM) };
    if opts.direct_io == DirectIo::Off {
        return Ok((file, false, 1));
    }
    let refused = |why: String| {
        if opts.direct_io == DirectIo::On {
            Err(io::Error::new(io::ErrorKind::Unsupported, format!("direct i/o refused: {why}")))
        } else {
            tracing::info!(path = %opts.path.display(), why, "direct i/o unavailable, using buffered i/o");
            Ok(())
        }
    };
    // A second open of the same file, with O_DIRECT: through its name, or through /proc for a scratch
    // file (which has none).
    let reopen: PathBuf = if opts.scratch {
        PathBuf::from(format!("/proc/self/fd/{}", file.as_raw_fd()))
    } else {
        opts.path.clone()
    };
    let direct = match OpenOptions::new().read(true).write(true).custom_flags(libc::O_DIRECT).open(&reopen) {
        Ok(f) => f,
        Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
            refused(format!("open with O_DIRECT: {e}"))?;
            return Ok((file, false, 1));
        }
        Err(e) => return Err(e),
    };
    let (mem_align, offset_align) = dio_alignment(&direct).unwrap_or((4096, 512));
    if !offset_align.is_power_of_two()
        || !opts.page_size.is_multiple_of(offset_align)
        || !mem_align.is_power_of_two()
    {
        refused(format!(
            "the file system's direct-i/o alignment (memory {mem_align}, offset {offset_align}) does not fit \
             pages of {} bytes",
            opts.page_size
        ))?;
        return Ok((file, false, 1));
    }
    // Probe one real transfer: some file systems accept the flag and refuse the I/O.
    if len > 0 {
        let mut probe = AlignedBuf::new(opts.page_size, opts.page_size.max(mem_align));
        let r = direct.write_all_at(&probe, 0).and_then(|()| direct.read_exact_at(&mut probe, 0));
        if let Err(e) = r {
            refused(format!("probe transfer: {e}"))?;
            return Ok((file, false, 1));
        }
    }
    Ok((direct, true, mem_align))
}

/// `(memory, offset)` alignment of direct I/O on `file` as the kernel reports it (`statx`, Linux 6.1+);
/// `(0, 0)` if the file does not support direct I/O, `None` if the kernel does not say.
fn dio_alignment(file: &File) -> Option<(usize, usize)> {
    // SAFETY: `statx` is plain data for which all-zero bytes is a valid value.
    let mut stx: libc::statx = unsafe { std::mem::zeroed() };
    // SAFETY: a valid fd, a NUL-terminated empty path with AT_EMPTY_PATH, and a pointer to a `statx` we
    // own that the kernel fills.
    let r = unsafe {
        libc::statx(file.as_raw_fd(), c"".as_ptr(), libc::AT_EMPTY_PATH, libc::STATX_DIOALIGN, &mut stx)
    };
    if r != 0 || stx.stx_mask & libc::STATX_DIOALIGN == 0 {
        return None;
    }
    Some((stx.stx_dio_mem_align as usize, stx.stx_dio_offset_align as usize))
}

/// Extends `file` from `from` to `to` bytes, reserving the blocks where the file system supports it, so a
/// full disk shows up here rather than as failed background writes. On a memory-backed file system the
/// file is only extended (see the module documentation).
pub(crate) fn reserve(file: &File, from: u64, to: u64) -> io::Result<()> {
    if to > from && !file_is_memory_backed(file) {
        // SAFETY: fallocate on a valid fd with in-range offsets (checked against i64::MAX by file_len).
        let r =
            unsafe { libc::fallocate(file.as_raw_fd(), 0, from as libc::off_t, (to - from) as libc::off_t) };
        if r != 0 {
            let e = io::Error::last_os_error();
            if !matches!(e.raw_os_error(), Some(libc::EOPNOTSUPP | libc::ENOSYS)) {
                return Err(e);
            }
        }
    }
    file.set_len(to)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::IoBackend;
    use std::os::unix::fs::MetadataExt;

    const MIB: u64 = 1 << 20;

    fn options(path: PathBuf, scratch: bool) -> SsdOptions {
        SsdOptions {
            path,
            scratch,
            slots: 0,
            page_size: 4096,
            direct_io: DirectIo::Auto,
            io_backend: IoBackend::Sync,
            write_queue_pages: 16,
            faults: None,
        }
    }

    /// A fresh directory on tmpfs (`/dev/shm`), or `None` where there is none.
    fn shm_dir() -> Option<tempfile::TempDir> {
        let shm = Path::new("/dev/shm");
        if !is_memory_backed(shm).unwrap_or(false) {
            dd_testkit::skipped(&["shm-tmpfs"], "store::ssd::file: /dev/shm is not a tmpfs here");
            return None;
        }
        Some(
            tempfile::Builder::new()
                .prefix("dd-ssd-file-test")
                .tempdir_in(shm)
                .expect("temp dir in /dev/shm"),
        )
    }

    fn disk_dir() -> tempfile::TempDir {
        let base =
            if Path::new("/var/tmp").is_dir() { PathBuf::from("/var/tmp") } else { std::env::temp_dir() };
        tempfile::Builder::new().prefix("dd-ssd-file-test").tempdir_in(base).expect("temp dir")
    }

    fn names_in(dir: &Path) -> Vec<String> {
        std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect()
    }

    /// Issue 13: a 16 GiB lab store in `/dev/shm` was fallocated whole, taking 16 GiB of memory before
    /// its first page.
    #[test]
    fn regression_a_store_on_tmpfs_takes_no_memory_before_its_pages_are_written() {
        let Some(dir) = shm_dir() else { return };
        for scratch in [false, true] {
            let path = if scratch { dir.path().to_path_buf() } else { dir.path().join("store.bin") };
            let (file, _, _) = open_file(&options(path, scratch), 64 * MIB).unwrap();
            let md = file.metadata().unwrap();
            assert_eq!(md.len(), 64 * MIB, "the file has the store's size");
            assert!(
                md.blocks() * 512 < MIB,
                "scratch {scratch}: {} bytes allocated up front",
                md.blocks() * 512
            );
            file.write_all_at(&[7u8; 4096], 32 * MIB).unwrap();
            let md = file.metadata().unwrap();
            assert!(md.blocks() * 512 >= 4096, "a written page takes its memory");
        }
    }

    #[test]
    fn a_store_on_a_disk_still_reserves_its_blocks() {
        let dir = disk_dir();
        let (file, _, _) = open_file(&options(dir.path().join("store.bin"), false), 16 * MIB).unwrap();
        let allocated = file.metadata().unwrap().blocks() * 512;
        if is_memory_backed(dir.path()).unwrap() {
            let why = format!("store::ssd::file: {} is memory-backed", dir.path().display());
            dd_testkit::skipped(&["odirect"], &why);
            return;
        }
        // A file system without fallocate leaves the file sparse; ext4, xfs and btrfs reserve.
        assert!(allocated >= 16 * MIB || allocated == 0, "{allocated} bytes reserved");
    }

    #[test]
    fn a_scratch_file_never_has_a_name_and_its_data_works() {
        let mut dirs = vec![disk_dir()];
        dirs.extend(shm_dir());
        for dir in dirs {
            let (file, direct, align) = open_file(&options(dir.path().to_path_buf(), true), 4 * MIB).unwrap();
            assert!(
                names_in(dir.path()).is_empty(),
                "{:?} left in {}",
                names_in(dir.path()),
                dir.path().display()
            );
            let mut page = AlignedBuf::new(4096, 4096.max(align));
            page.fill(0x5a);
            file.write_all_at(&page, 8192).unwrap();
            let mut back = AlignedBuf::new(4096, 4096.max(align));
            file.read_exact_at(&mut back, 8192).unwrap();
            assert!(back.iter().all(|&b| b == 0x5a), "direct {direct}: read back what was written");
        }
    }

    #[test]
    fn the_create_and_unlink_fallback_leaves_no_name_either() {
        // The path taken where O_TMPFILE is refused, exercised directly.
        let dir = disk_dir();
        let f = create_and_unlink(dir.path()).unwrap();
        assert!(names_in(dir.path()).is_empty(), "{:?}", names_in(dir.path()));
        assert_eq!(f.metadata().unwrap().mode() & 0o777, 0o600);
        assert_eq!(f.metadata().unwrap().nlink(), 0, "unlinked");
        f.write_all_at(b"still usable", 0).unwrap();
    }
}
