//! Which container a request belongs to, and which pool that container has.
//!
//! FUSE gives the pid of the calling thread. Its memory cgroup comes from `/proc/PID/cgroup` (the line
//! of the v1 `memory` controller when `cgroup_parent` is on a v1 hierarchy, the `0::` line on v2); the
//! container is the first path component below `cgroup_parent`, as `guest watch` names containers. The
//! container's pool comes from the watcher's state file (container name -> pool, and the daemon
//! instance the pools belong to), re-read when it changes. The filesystem never creates pools itself: the watcher owns their lifecycle (D-entry in
//! `docs/decisions.md`).
//!
//! Invariants: a process outside `cgroup_parent` (or whose cgroup cannot be read, e.g. it exited) is
//! unattributed, the empty name, which has no pool. Both caches here are bounded in time by
//! `attribution_refresh_ms` (a process moved between containers is attributed anew after at most that
//! long) and the pid cache in size. The locks here are leaves: nothing else is taken under them.

use dd_client::PoolRef;
use dd_guest::watch::StateFile;
use parking_lot::Mutex;
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime};

/// The name of unattributed requests.
pub const UNATTRIBUTED: &str = "";

const CGROUP_SUPER_MAGIC: i64 = 0x0027_e0eb;
const CGROUP2_SUPER_MAGIC: i64 = 0x6367_7270;
const PID_CACHE_MAX: usize = 4096;

/// Where `cgroup_parent` sits in its hierarchy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParentCgroup {
    /// The path of the parent as `/proc/PID/cgroup` shows it (relative to the hierarchy's root).
    pub rel: String,
    /// Whether the hierarchy is cgroup v1 (then the `memory` controller's line is the one to read).
    pub v1: bool,
}

fn fs_magic(p: &Path) -> Option<i64> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(p.as_os_str().as_bytes()).ok()?;
    // SAFETY: an all-zero statfs is a valid value of this plain C struct.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: c is a NUL-terminated path that outlives the call; st is a valid writable statfs.
    let rc = unsafe { libc::statfs(c.as_ptr(), &mut st) };
    (rc == 0).then_some(st.f_type as i64)
}

impl ParentCgroup {
    /// Finds the hierarchy root of `dir` (the highest ancestor still on the same cgroup filesystem).
    pub fn locate(dir: &Path) -> Option<ParentCgroup> {
        let magic = fs_magic(dir)?;
        if magic != CGROUP_SUPER_MAGIC && magic != CGROUP2_SUPER_MAGIC {
            return None;
        }
        let mut root = dir.to_path_buf();
        while let Some(up) = root.parent() {
            if fs_magic(up) != Some(magic) {
                break;
            }
            root = up.to_path_buf();
        }
        let rel = dir.strip_prefix(&root).ok()?;
        Some(ParentCgroup { rel: format!("/{}", rel.display()), v1: magic == CGROUP_SUPER_MAGIC })
    }
}

/// The cgroup path of interest in a `/proc/PID/cgroup` text.
pub fn parse_proc_cgroup(text: &str, v1: bool) -> Option<String> {
    for line in text.lines() {
        let mut it = line.splitn(3, ':');
        let (Some(id), Some(ctrls), Some(path)) = (it.next(), it.next(), it.next()) else { continue };
        let hit = if v1 { ctrls.split(',').any(|c| c == "memory") } else { id == "0" && ctrls.is_empty() };
        if hit {
            return Some(path.to_string());
        }
    }
    None
}

/// The container of a cgroup path: its first component below the parent's.
pub fn container_name(parent_rel: &str, cgroup: &str) -> Option<String> {
    let parent = parent_rel.trim_end_matches('/');
    let rest = cgroup.strip_prefix(parent)?;
    let rest = rest.strip_prefix('/')?;
    let name = rest.split('/').next()?;
    (!name.is_empty()).then(|| name.to_string())
}

struct StateCache {
    checked: Option<Instant>,
    mtime: Option<SystemTime>,
    pools: BTreeMap<String, PoolRef>,
}

/// Maps pids to containers and containers to pools.
pub struct Attributor {
    parent: Option<ParentCgroup>,
    state_file: PathBuf,
    refresh: Duration,
    pids: Mutex<HashMap<u32, (String, Instant)>>,
    state: Mutex<StateCache>,
}

impl Attributor {
    pub fn new(parent: Option<ParentCgroup>, state_file: PathBuf, refresh: Duration) -> Attributor {
        Attributor {
            parent,
            state_file,
            refresh,
            pids: Mutex::new(HashMap::new()),
            state: Mutex::new(StateCache { checked: None, mtime: None, pools: BTreeMap::new() }),
        }
    }

    /// The container of a process ([`UNATTRIBUTED`] if none).
    pub fn container_of(&self, pid: u32) -> String {
        let Some(parent) = &self.parent else { return UNATTRIBUTED.to_string() };
        if pid == 0 {
            return UNATTRIBUTED.to_string();
        }
        let now = Instant::now();
        if let Some((name, at)) = self.pids.lock().get(&pid) {
            if now.duration_since(*at) < self.refresh {
                return name.clone();
            }
        }
        let name = std::fs::read_to_string(format!("/proc/{pid}/cgroup"))
            .ok()
            .and_then(|t| parse_proc_cgroup(&t, parent.v1))
            .and_then(|cg| container_name(&parent.rel, &cg))
            .unwrap_or_default();
        let mut pids = self.pids.lock();
        if pids.len() >= PID_CACHE_MAX {
            pids.clear();
        }
        pids.insert(pid, (name.clone(), now));
        name
    }

    /// The pool of a container, from the watcher's state file.
    pub fn pool_of(&self, container: &str) -> Option<PoolRef> {
        if container == UNATTRIBUTED {
            return None;
        }
        let mut st = self.state.lock();
        let now = Instant::now();
        if st.checked.is_none_or(|t| now.duration_since(t) >= self.refresh) {
            st.checked = Some(now);
            let mtime = std::fs::metadata(&self.state_file).and_then(|m| m.modified()).ok();
            if mtime != st.mtime || mtime.is_none() {
                st.mtime = mtime;
                st.pools = read_state(&self.state_file);
            }
        }
        st.pools.get(container).copied()
    }

    /// Every pool the state file names now.
    pub fn all_pools(&self) -> Vec<PoolRef> {
        read_state(&self.state_file).into_values().collect()
    }
}

/// The watcher's state file as container -> pool (with the daemon instance that made it); empty when
/// it is missing or unreadable (the watcher is not running: no second level).
pub fn read_state(path: &Path) -> BTreeMap<String, PoolRef> {
    let Some(st) = StateFile::read(path) else { return BTreeMap::new() };
    st.pools.into_iter().map(|(k, o)| (k, PoolRef { id: o.pool, instance: st.instance })).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use dd_types::PoolId;

    #[test]
    fn proc_cgroup_v1_and_v2() {
        let v1 = "12:pids:/x\n5:memory:/doubledecker/web/inner\n0::/user.slice\n";
        assert_eq!(parse_proc_cgroup(v1, true).as_deref(), Some("/doubledecker/web/inner"));
        assert_eq!(parse_proc_cgroup(v1, false).as_deref(), Some("/user.slice"));
        let v1b = "4:cpu,memory,blkio:/a\n";
        assert_eq!(parse_proc_cgroup(v1b, true).as_deref(), Some("/a"));
        assert_eq!(parse_proc_cgroup("3:memory-x:/a\n", true), None);
    }

    #[test]
    fn container_names() {
        assert_eq!(container_name("/doubledecker", "/doubledecker/web/inner").as_deref(), Some("web"));
        assert_eq!(container_name("/doubledecker", "/doubledecker/web").as_deref(), Some("web"));
        assert_eq!(container_name("/doubledecker", "/doubledecker"), None);
        assert_eq!(container_name("/doubledecker", "/doubledeckerx/web"), None);
        assert_eq!(container_name("/", "/web/x").as_deref(), Some("web"));
        assert_eq!(container_name("/doubledecker/", "/other"), None);
    }

    #[test]
    fn hierarchy_roots_are_found() {
        // Whatever cgroup hierarchies this machine mounts: a root is its own parent ("/"), the version
        // follows the file system, and a directory elsewhere is refused.
        for (dir, v1) in [("/sys/fs/cgroup/memory", true), ("/sys/fs/cgroup/unified", false)] {
            if let Some(p) = ParentCgroup::locate(Path::new(dir)) {
                assert_eq!(p, ParentCgroup { rel: "/".into(), v1 }, "{dir}");
            }
        }
        if let Some(p) = ParentCgroup::locate(Path::new("/sys/fs/cgroup")) {
            assert_eq!(p.rel, "/", "a v2-only machine mounts the unified hierarchy at /sys/fs/cgroup");
        }
        assert_eq!(ParentCgroup::locate(Path::new("/tmp")), None);
    }

    #[test]
    fn state_file_maps_names_to_pools() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("s.json");
        std::fs::write(
            &p,
            r#"{"version":2,"vm":1,"instance":99,"pools":{"web":{"pool":7,"spec":{"type":"mem","weight":60},"kind":"ephemeral","path":"/x/web"}}}"#,
        )
        .unwrap();
        let a = Attributor::new(None, p.clone(), Duration::from_millis(1));
        assert_eq!(a.pool_of("web"), Some(PoolRef { id: PoolId(7), instance: 99 }));
        assert_eq!(a.pool_of("db"), None);
        assert_eq!(a.pool_of(UNATTRIBUTED), None);
        // Without a parent every process is unattributed.
        assert_eq!(a.container_of(std::process::id()), UNATTRIBUTED);
        std::fs::write(&p, "not json").unwrap();
        assert!(read_state(&p).is_empty());
    }
}
