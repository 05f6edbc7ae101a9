//! Mounting: the FUSE session over the backing directory, the frontend's change hook that invalidates
//! the kernel's pages of files changed behind the mount, serving until unmounted, and unmounting from
//! another thread (detaching a busy mount).
//!
//! A mount point left by a mount that died (`kill -9`, a crash) answers every access with `ENOTCONN`
//! for as long as a process keeps a file of it open; mounting over it fails the same way. A new mount
//! detaches such a dead one first (`umount2(MNT_DETACH)`, one log line): the old open descriptors keep
//! failing, new opens reach the new mount.
//!
//! A session ends when the kernel tears the connection down (the mount unmounted, or detached and its
//! last file closed): server threads then read `ENODEV`, or `ECONNABORTED` for one that was taking a
//! request off the queue at that moment; both are a clean end ([`Mount::run`] returns the counters).
//!
//! Invariant: nothing is published or applied (`[sampling]`) after the mount is gone; either way
//! `Unmounter::unmount` leaves nothing mounted.

use super::{DdFs, FuseError};
use crate::config::FuseConfig;
use crate::frontend::{ContainerStats, Frontend};
use crate::passthrough::KernelCache;
use fuser::{MountOption, SessionACL};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

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

/// Detaches a dead FUSE mount on `mountpoint` (its server gone: `ENOTCONN`), saying so.
fn detach_if_dead(mountpoint: &Path) -> Result<(), FuseError> {
    match std::fs::metadata(mountpoint) {
        Err(e) if e.raw_os_error() == Some(libc::ENOTCONN) => {
            nix::mount::umount2(mountpoint, nix::mount::MntFlags::MNT_DETACH)
                .map_err(|e| FuseError::Mount { path: mountpoint.into(), source: e.into() })?;
            tracing::warn!(
                "{}: the mount there had died (transport endpoint not connected); detached it",
                mountpoint.display()
            );
            Ok(())
        }
        _ => Ok(()),
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
        let flags = nix::fcntl::OFlag::O_PATH | nix::fcntl::OFlag::O_DIRECTORY | nix::fcntl::OFlag::O_CLOEXEC;
        let root = nix::fcntl::open(&backing, flags, nix::sys::stat::Mode::empty())
            .map_err(|e| FuseError::Backing { path: backing.clone(), source: e.into() })?;
        detach_if_dead(mountpoint)?;
        let nofile = super::raise_nofile_limit();
        tracing::debug!(nofile, "open descriptor limit (one per inode the kernel caches, one per open file)");
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
        let fs = DdFs::new(backing.clone(), root, fe.clone())
            .map_err(|source| FuseError::Backing { path: backing, source })?;
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
        let served = session_end(self.session.run()).map_err(FuseError::Session);
        // Nothing is published or applied after the mount is gone.
        drop(self.publisher.take());
        served?;
        Ok(self.fe.stats())
    }
}

/// How a session's end reads: `ENODEV` (the connection gone, fuser's `Ok`) and `ECONNABORTED` both mean
/// the kernel tore the connection down, as it does when the last reference to an unmounted (or
/// detached) mount goes. `ECONNABORTED` is what a server thread reads when it takes a request off the
/// queue just as that teardown runs (fs/fuse/dev.c, `fuse_dev_do_read`): a race a busy mount stopped as
/// its last files close can lose (48 of 60 rounds in the scenario of the regression test
/// `regression_a_busy_mount_stopped_as_its_last_files_close_exits_cleanly`), not a failure of the mount.
fn session_end(served: std::io::Result<()>) -> std::io::Result<()> {
    match served {
        Err(e) if e.raw_os_error() == Some(libc::ECONNABORTED) => {
            tracing::debug!("the connection was torn down while a request was being read: ended");
            Ok(())
        }
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::session_end;

    #[test]
    fn a_connection_torn_down_mid_read_ends_the_session_and_other_errors_stay_errors() {
        assert!(session_end(Ok(())).is_ok());
        assert!(session_end(Err(std::io::Error::from_raw_os_error(libc::ECONNABORTED))).is_ok());
        for errno in [libc::EIO, libc::EPERM, libc::EINVAL] {
            let e = session_end(Err(std::io::Error::from_raw_os_error(errno))).unwrap_err();
            assert_eq!(e.raw_os_error(), Some(errno));
        }
    }
}
