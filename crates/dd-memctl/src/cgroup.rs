//! Real cgroups: discovering containers, reading their memory, and reclaiming bounded chunks.
//!
//! * **cgroup v2**: reclaim writes the chunk size to `memory.reclaim` (the kernel reclaims up to that
//!   much from the cgroup and its descendants and returns `EAGAIN` if it could not).
//! * **cgroup v1** has no reclaim file. We lower `memory.limit_in_bytes` to `usage - chunk` for a short
//!   while so the kernel reclaims down to it, then **always** restore the previous limit: the restore
//!   lives in a guard's `Drop`, so every path out of [`Cgroup::reclaim`] (success, `EBUSY` from the
//!   kernel, a read error, the cgroup vanishing) puts the limit back. If the restore itself fails the
//!   guard retries and reports it; a cgroup that vanished has no limit left to restore.
//!
//! All file access goes through [`CgroupIo`] so that tests can run on temporary directories shaped
//! like cgroupfs and inject errors (`EBUSY`, `EAGAIN`, `ENOENT`).

use std::io;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// File operations on a cgroup hierarchy.
pub trait CgroupIo: Send + Sync {
    fn read(&self, path: &Path) -> io::Result<String>;
    fn write(&self, path: &Path, data: &str) -> io::Result<()>;
    /// Sub-directories of `path` (the child cgroups).
    fn children(&self, path: &Path) -> io::Result<Vec<PathBuf>>;
}

/// The real file system.
#[derive(Debug, Default, Clone, Copy)]
pub struct RealIo;

impl CgroupIo for RealIo {
    fn read(&self, path: &Path) -> io::Result<String> {
        std::fs::read_to_string(path)
    }
    fn write(&self, path: &Path, data: &str) -> io::Result<()> {
        // cgroupfs wants one write(2) per value; fs::write does exactly that for short strings.
        std::fs::write(path, data)
    }
    fn children(&self, path: &Path) -> io::Result<Vec<PathBuf>> {
        let mut out = Vec::new();
        for e in std::fs::read_dir(path)? {
            let e = e?;
            if e.file_type()?.is_dir() {
                out.push(e.path());
            }
        }
        out.sort();
        Ok(out)
    }
}

/// Which cgroup interface a hierarchy speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Version {
    V1,
    V2,
}

impl Version {
    /// v2 hierarchies have `cgroup.controllers`; v1 memory hierarchies have `memory.limit_in_bytes`.
    pub fn detect(io: &dyn CgroupIo, dir: &Path) -> Option<Version> {
        if io.read(&dir.join("cgroup.controllers")).is_ok() {
            Some(Version::V2)
        } else if io.read(&dir.join("memory.limit_in_bytes")).is_ok()
            || io.read(&dir.join("memory.usage_in_bytes")).is_ok()
        {
            Some(Version::V1)
        } else {
            None
        }
    }
}

/// Errors of cgroup access.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CgroupError {
    #[error("{path}: {source}")]
    Io { path: PathBuf, source: io::Error },
    #[error("{path}: cannot parse {what}: {text:?}")]
    Parse { path: PathBuf, what: &'static str, text: String },
    #[error("the cgroup {0} vanished")]
    Vanished(PathBuf),
    #[error("could not restore memory.limit_in_bytes of {path} to {limit}: {source}")]
    RestoreFailed { path: PathBuf, limit: String, source: io::Error },
}

fn io_err(path: &Path, source: io::Error) -> CgroupError {
    if source.kind() == io::ErrorKind::NotFound {
        CgroupError::Vanished(path.parent().unwrap_or(path).to_path_buf())
    } else {
        CgroupError::Io { path: path.to_path_buf(), source }
    }
}

/// Memory figures of one cgroup, in bytes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct MemoryInfo {
    pub usage: u64,
    pub file: u64,
    pub anon: u64,
    /// `memory.soft_limit_in_bytes` (v1) or `memory.low` (v2); `u64::MAX` when unlimited.
    pub soft_limit: u64,
    /// `memory.limit_in_bytes` (v1) or `memory.max` (v2); `u64::MAX` when unlimited.
    pub limit: u64,
}

/// One container's cgroup.
#[derive(Debug, Clone)]
pub struct Cgroup {
    pub name: String,
    pub dir: PathBuf,
    pub version: Version,
}

/// How v1 reclaim waits for the kernel.
#[derive(Debug, Clone, Copy)]
pub struct ReclaimOptions {
    /// Longest time the lowered v1 limit stays in place.
    pub v1_hold: Duration,
    /// Poll period while it does.
    pub v1_poll: Duration,
}

impl Default for ReclaimOptions {
    fn default() -> Self {
        ReclaimOptions { v1_hold: Duration::from_millis(500), v1_poll: Duration::from_millis(10) }
    }
}

/// What a reclaim did.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct ReclaimOutcome {
    pub asked: u64,
    /// Usage before minus usage after (0 if usage grew meanwhile).
    pub freed: u64,
}

fn parse_limit(path: &Path, text: &str) -> Result<u64, CgroupError> {
    let t = text.trim();
    if t == "max" {
        return Ok(u64::MAX);
    }
    let v: u64 = t.parse().map_err(|_| CgroupError::Parse {
        path: path.into(),
        what: "a byte count",
        text: t.into(),
    })?;
    // v1 reports "unlimited" as a huge page-aligned number.
    Ok(if v >= (1u64 << 62) { u64::MAX } else { v })
}

fn stat_field(stat: &str, key: &str) -> Option<u64> {
    stat.lines().find_map(|l| {
        let mut it = l.split_whitespace();
        (it.next() == Some(key)).then(|| it.next().and_then(|v| v.parse().ok())).flatten()
    })
}

impl Cgroup {
    fn read(&self, io: &dyn CgroupIo, file: &str) -> Result<String, CgroupError> {
        let p = self.dir.join(file);
        io.read(&p).map_err(|e| io_err(&p, e))
    }

    fn read_limit(&self, io: &dyn CgroupIo, file: &str) -> Result<u64, CgroupError> {
        let p = self.dir.join(file);
        parse_limit(&p, &self.read(io, file)?)
    }

    pub fn usage(&self, io: &dyn CgroupIo) -> Result<u64, CgroupError> {
        match self.version {
            Version::V1 => self.read_limit(io, "memory.usage_in_bytes"),
            Version::V2 => self.read_limit(io, "memory.current"),
        }
    }

    pub fn info(&self, io: &dyn CgroupIo) -> Result<MemoryInfo, CgroupError> {
        let usage = self.usage(io)?;
        let stat = self.read(io, "memory.stat")?;
        let (file, anon, soft, limit) = match self.version {
            Version::V1 => (
                stat_field(&stat, "total_cache").or_else(|| stat_field(&stat, "cache")).unwrap_or(0),
                stat_field(&stat, "total_rss").or_else(|| stat_field(&stat, "rss")).unwrap_or(0),
                self.read_limit(io, "memory.soft_limit_in_bytes")?,
                self.read_limit(io, "memory.limit_in_bytes")?,
            ),
            Version::V2 => (
                stat_field(&stat, "file").unwrap_or(0),
                stat_field(&stat, "anon").unwrap_or(0),
                self.read_limit(io, "memory.low").unwrap_or(0),
                self.read_limit(io, "memory.max")?,
            ),
        };
        Ok(MemoryInfo {
            usage,
            file,
            anon,
            soft_limit: if soft == 0 && self.version == Version::V2 { u64::MAX } else { soft },
            limit,
        })
    }

    /// Reclaims up to `bytes` from this cgroup. On v1 the limit in force before the call is always
    /// restored before this returns, whatever happens (see the module docs).
    pub fn reclaim(
        &self,
        io: &dyn CgroupIo,
        bytes: u64,
        opts: &ReclaimOptions,
    ) -> Result<ReclaimOutcome, CgroupError> {
        let before = self.usage(io)?;
        match self.version {
            Version::V2 => {
                let p = self.dir.join("memory.reclaim");
                match io.write(&p, &bytes.to_string()) {
                    Ok(()) => {}
                    // EAGAIN: the kernel reclaimed less than asked. Not an error for a controller that
                    // will simply ask again next round.
                    Err(e) if e.raw_os_error() == Some(libc_eagain()) => {}
                    Err(e) => return Err(io_err(&p, e)),
                }
            }
            Version::V1 => {
                let p = self.dir.join("memory.limit_in_bytes");
                let old = self.read(io, "memory.limit_in_bytes")?.trim().to_string();
                let guard = RestoreLimit { io, path: p.clone(), old, restored: false };
                let target = before.saturating_sub(bytes);
                match io.write(&p, &target.to_string()) {
                    Ok(()) => {
                        let start = Instant::now();
                        while start.elapsed() < opts.v1_hold {
                            if self.usage(io)? <= target {
                                break;
                            }
                            std::thread::sleep(opts.v1_poll);
                        }
                    }
                    // EBUSY: the kernel could not get usage under the new limit right away; it has
                    // still reclaimed what it could. The guard restores the old limit.
                    Err(e) if e.raw_os_error() == Some(libc_ebusy()) => {}
                    Err(e) => return Err(io_err(&p, e)),
                }
                guard.restore()?;
            }
        }
        let after = self.usage(io).unwrap_or(before);
        Ok(ReclaimOutcome { asked: bytes, freed: before.saturating_sub(after) })
    }
}

const fn libc_ebusy() -> i32 {
    16
}
const fn libc_eagain() -> i32 {
    11
}

/// Puts a v1 limit back on every path out of a reclaim.
struct RestoreLimit<'a> {
    io: &'a dyn CgroupIo,
    path: PathBuf,
    old: String,
    restored: bool,
}

impl RestoreLimit<'_> {
    fn try_restore(&mut self) -> io::Result<()> {
        let mut last = None;
        // A restore that races the kernel's own writeback can see EBUSY/EAGAIN; raising a limit does not
        // need reclaim, so a few retries are enough.
        for _ in 0..5 {
            match self.io.write(&self.path, &self.old) {
                Ok(()) => {
                    self.restored = true;
                    return Ok(());
                }
                Err(e) if e.kind() == io::ErrorKind::NotFound => {
                    // The cgroup is gone, and its limit with it.
                    self.restored = true;
                    return Ok(());
                }
                Err(e) => last = Some(e),
            }
            std::thread::sleep(Duration::from_millis(2));
        }
        Err(last.unwrap_or_else(|| io::Error::other("restore failed")))
    }

    fn restore(mut self) -> Result<(), CgroupError> {
        self.try_restore().map_err(|source| CgroupError::RestoreFailed {
            path: self.path.clone(),
            limit: self.old.clone(),
            source,
        })
    }
}

impl Drop for RestoreLimit<'_> {
    fn drop(&mut self) {
        if !self.restored {
            if let Err(e) = self.try_restore() {
                tracing::error!(path = %self.path.display(), limit = %self.old, "could not restore limit: {e}");
            }
        }
    }
}

/// The containers under `parent`: its child directories that are cgroups.
pub fn discover(io: &dyn CgroupIo, parent: &Path, version: Version) -> Result<Vec<Cgroup>, CgroupError> {
    let dirs = io.children(parent).map_err(|e| io_err(parent, e))?;
    Ok(dirs
        .into_iter()
        .filter_map(|dir| {
            let name = dir.file_name()?.to_string_lossy().into_owned();
            Some(Cgroup { name, dir, version })
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_limits_and_stats() {
        let p = Path::new("x");
        assert_eq!(parse_limit(p, "max\n").unwrap(), u64::MAX);
        assert_eq!(parse_limit(p, "9223372036854771712\n").unwrap(), u64::MAX);
        assert_eq!(parse_limit(p, "1048576").unwrap(), 1 << 20);
        assert!(parse_limit(p, "lots").is_err());
        let stat = "cache 10\nrss 20\ntotal_cache 100\ntotal_rss 200\n";
        assert_eq!(stat_field(stat, "total_cache"), Some(100));
        assert_eq!(stat_field(stat, "rss"), Some(20));
        assert_eq!(stat_field(stat, "nope"), None);
    }
}
