//! `doubledecker guest watch`: cgroups in, pools out.
//!
//! Every `poll_interval_ms` the watcher lists the child directories of `cgroup.parent` (v1 memory or
//! v2: the containers), and reconciles the daemon with what it sees, over one data-plane connection
//! authenticated as this VM:
//! * a new cgroup gets a pool with its desired spec;
//! * a cgroup whose desired spec changed gets `set_cg_weight`;
//! * a pool whose cgroup is gone is destroyed.
//!
//! The desired spec of a container is, in order: the `user.doubledecker.spec` extended attribute of its
//! cgroup directory (cgroup v2 accepts `user.*` xattrs; the value is `mem:W`, `ssd:W`, `hybrid:WM:WS` or
//! `none`), the `[containers.NAME]` entry of the configuration, then `default_spec`. Polling (rather than
//! inotify) keeps the watcher correct on every cgroupfs and catches xattr changes, at the cost of up to
//! one interval of delay.
//!
//! Invariants: the watcher owns exactly the pools in its map; after each round the map holds one pool
//! per container cgroup present, and the state file (written atomically: temporary file and rename) is
//! that map. On shutdown ([`Watcher::shutdown`]) every pool it created is destroyed and the state file
//! removed: nothing is left behind.

use dd_client::Client;
use dd_engine::{PoolId, PoolKind, PoolOptions, Spec};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// Where the daemon is and who we are.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DaemonConfig {
    /// Unix socket of the daemon's data plane (preferred), or...
    pub unix_socket: Option<PathBuf>,
    /// ...its TCP address (`host:port`).
    pub tcp: Option<String>,
    pub vm: u32,
    /// The VM's data-plane token; `DD_VM_DATA_TOKEN` in the environment overrides it.
    #[serde(default)]
    pub data_token: String,
}

/// A container's settings.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ContainerSettings {
    pub spec: Spec,
    #[serde(default = "ephemeral")]
    pub kind: PoolKind,
}

fn ephemeral() -> PoolKind {
    PoolKind::Ephemeral
}

/// The watcher's configuration file (TOML).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WatchConfig {
    pub daemon: DaemonConfig,
    /// Containers are the child cgroups of this directory.
    pub cgroup_parent: PathBuf,
    /// Default 500 ms.
    #[serde(default = "default_interval")]
    pub poll_interval_ms: u64,
    /// Spec of containers not otherwise configured. Default `mem` with weight 100.
    #[serde(default = "default_spec")]
    pub default_spec: Spec,
    #[serde(default)]
    pub containers: BTreeMap<String, ContainerSettings>,
    /// Where the cgroup -> pool map is published. Default `dd-guest-pools.json`.
    #[serde(default = "default_state")]
    pub state_file: PathBuf,
}

fn default_interval() -> u64 {
    500
}
fn default_spec() -> Spec {
    Spec::Mem { weight: 100 }
}
fn default_state() -> PathBuf {
    PathBuf::from("dd-guest-pools.json")
}

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum WatchError {
    #[error("invalid watcher configuration: {field}: {reason}")]
    Config { field: &'static str, reason: String },
    #[error("cannot read {path}: {source}")]
    Read { path: PathBuf, source: std::io::Error },
    #[error("cannot parse {path}: {message}")]
    Parse { path: PathBuf, message: String },
    #[error("cannot list {path}: {source}")]
    List { path: PathBuf, source: std::io::Error },
    #[error("cannot write the state file {path}: {source}")]
    State { path: PathBuf, source: std::io::Error },
    #[error("daemon: {0}")]
    Daemon(#[from] dd_client::ClientError),
}

impl WatchConfig {
    pub fn from_file(path: &Path) -> Result<WatchConfig, WatchError> {
        let text =
            std::fs::read_to_string(path).map_err(|source| WatchError::Read { path: path.into(), source })?;
        let mut cfg: WatchConfig = toml::from_str(&text)
            .map_err(|e| WatchError::Parse { path: path.into(), message: e.to_string() })?;
        if let Ok(t) = std::env::var("DD_VM_DATA_TOKEN") {
            cfg.daemon.data_token = t;
        }
        cfg.validate()?;
        Ok(cfg)
    }

    pub fn validate(&self) -> Result<(), WatchError> {
        let bad = |field, reason: &str| Err(WatchError::Config { field, reason: reason.into() });
        if self.daemon.unix_socket.is_none() && self.daemon.tcp.is_none() {
            return bad("daemon.unix_socket", "set it or daemon.tcp");
        }
        if self.daemon.data_token.is_empty() {
            return bad("daemon.data_token", "empty (set it or DD_VM_DATA_TOKEN)");
        }
        if self.poll_interval_ms == 0 {
            return bad("poll_interval_ms", "must be at least 1");
        }
        Ok(())
    }

    pub fn connect(&self) -> Result<Client, WatchError> {
        Ok(match (&self.daemon.unix_socket, &self.daemon.tcp) {
            (Some(p), _) => Client::connect_unix(p, self.daemon.vm, &self.daemon.data_token)?,
            (None, Some(a)) => Client::connect_tcp(a.as_str(), self.daemon.vm, &self.daemon.data_token)?,
            (None, None) => unreachable!("validate() requires one of them"),
        })
    }
}

/// Parses an annotation: `mem:W`, `ssd:W`, `hybrid:WM:WS` or `none`.
pub fn parse_spec(text: &str) -> Option<Spec> {
    let parts: Vec<&str> = text.trim().split(':').collect();
    let w = |s: &str| s.parse::<u32>().ok();
    match parts.as_slice() {
        ["none"] => Some(Spec::None),
        ["mem", a] => Some(Spec::Mem { weight: w(a)? }),
        ["ssd", a] => Some(Spec::Ssd { weight: w(a)? }),
        ["hybrid", a, b] => Some(Spec::Hybrid { mem_weight: w(a)?, ssd_weight: w(b)? }),
        _ => None,
    }
}

/// The `user.doubledecker.spec` extended attribute of a directory, if set and valid.
fn annotation(dir: &Path) -> Option<Spec> {
    use std::os::unix::ffi::OsStrExt;
    let path = std::ffi::CString::new(dir.as_os_str().as_bytes()).ok()?;
    let name = c"user.doubledecker.spec";
    let mut buf = [0u8; 128];
    // SAFETY: path and name are NUL-terminated C strings that outlive the call; buf is a valid writable
    // buffer of the length passed.
    let n = unsafe { libc::getxattr(path.as_ptr(), name.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
    if n <= 0 {
        return None;
    }
    parse_spec(std::str::from_utf8(&buf[..n as usize]).ok()?)
}

/// One pool the watcher owns.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Owned {
    pub pool: PoolId,
    pub spec: Spec,
    pub kind: PoolKind,
    /// The cgroup directory.
    pub path: PathBuf,
}

/// What a round changed.
#[derive(Debug, Default, Clone, PartialEq, Eq, Serialize)]
pub struct RoundChanges {
    pub created: Vec<String>,
    pub respecified: Vec<String>,
    pub destroyed: Vec<String>,
}

pub struct Watcher {
    cfg: WatchConfig,
    client: Client,
    owned: BTreeMap<String, Owned>,
    /// When the connection last carried a request: a round after a quiet minute pings first, so the
    /// daemon's idle timeout (`limits.idle_timeout_ms`) never closes a watcher that is merely waiting.
    last_request: std::time::Instant,
}

/// A quiet connection is pinged after this long (well under the daemon's default idle timeout).
const KEEPALIVE: std::time::Duration = std::time::Duration::from_secs(60);

impl Watcher {
    pub fn new(cfg: WatchConfig) -> Result<Watcher, WatchError> {
        cfg.validate()?;
        let client = cfg.connect()?;
        Ok(Watcher { cfg, client, owned: BTreeMap::new(), last_request: std::time::Instant::now() })
    }

    pub fn config(&self) -> &WatchConfig {
        &self.cfg
    }

    /// The cgroup -> pool map.
    pub fn pools(&self) -> &BTreeMap<String, Owned> {
        &self.owned
    }

    fn desired(&self, name: &str, dir: &Path) -> (Spec, PoolKind) {
        let configured = self.cfg.containers.get(name);
        let kind = configured.map_or(PoolKind::Ephemeral, |c| c.kind);
        let spec = annotation(dir).or(configured.map(|c| c.spec)).unwrap_or(self.cfg.default_spec);
        (spec, kind)
    }

    /// One reconciliation.
    pub fn round(&mut self) -> Result<RoundChanges, WatchError> {
        if self.last_request.elapsed() >= KEEPALIVE {
            self.client.ping()?;
        }
        self.last_request = std::time::Instant::now();
        let parent = &self.cfg.cgroup_parent;
        let mut present = BTreeMap::new();
        let entries =
            std::fs::read_dir(parent).map_err(|source| WatchError::List { path: parent.clone(), source })?;
        for e in entries.flatten() {
            if e.file_type().map(|t| t.is_dir()).unwrap_or(false) {
                present.insert(e.file_name().to_string_lossy().into_owned(), e.path());
            }
        }
        let mut ch = RoundChanges::default();
        // Gone first, so a cgroup recreated under the same name gets a fresh pool.
        let gone: Vec<String> = self.owned.keys().filter(|n| !present.contains_key(*n)).cloned().collect();
        for name in gone {
            let o = self.owned.remove(&name).expect("listed above");
            match self.client.destroy_cgroup(o.pool) {
                Ok(()) => {}
                // Already gone on the daemon (e.g. it restarted): nothing left to free.
                Err(e) if e.status().is_some() => tracing::warn!("destroying pool of {name}: {e}"),
                Err(e) => return Err(e.into()),
            }
            ch.destroyed.push(name);
        }
        for (name, dir) in &present {
            let (spec, kind) = self.desired(name, dir);
            match self.owned.get_mut(name) {
                None => {
                    let opts = match kind {
                        PoolKind::Ephemeral => PoolOptions::ephemeral(spec),
                        PoolKind::Persistent => PoolOptions::persistent(spec),
                    };
                    let pool = self.client.create_cgroup(opts)?;
                    self.owned.insert(name.clone(), Owned { pool, spec, kind, path: dir.clone() });
                    ch.created.push(name.clone());
                }
                Some(o) if o.spec != spec => {
                    self.client.set_cg_weight(o.pool, spec)?;
                    o.spec = spec;
                    ch.respecified.push(name.clone());
                }
                Some(_) => {}
            }
        }
        if ch != RoundChanges::default() || !self.cfg.state_file.exists() {
            self.write_state()?;
        }
        Ok(ch)
    }

    fn write_state(&self) -> Result<(), WatchError> {
        let path = &self.cfg.state_file;
        let tmp = path.with_extension("json.tmp");
        let body = serde_json::to_vec_pretty(&self.owned).expect("plain data serialises");
        std::fs::write(&tmp, body)
            .and_then(|_| std::fs::rename(&tmp, path))
            .map_err(|source| WatchError::State { path: path.clone(), source })
    }

    /// Destroys every pool the watcher created and removes the state file.
    pub fn shutdown(mut self) -> Result<(), WatchError> {
        for (name, o) in std::mem::take(&mut self.owned) {
            if let Err(e) = self.client.destroy_cgroup(o.pool) {
                tracing::warn!("destroying pool of {name} at shutdown: {e}");
            }
        }
        match std::fs::remove_file(&self.cfg.state_file) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(source) => Err(WatchError::State { path: self.cfg.state_file.clone(), source }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn annotations_parse() {
        assert_eq!(parse_spec("mem:60"), Some(Spec::Mem { weight: 60 }));
        assert_eq!(parse_spec("ssd:5\n"), Some(Spec::Ssd { weight: 5 }));
        assert_eq!(parse_spec("hybrid:3:1"), Some(Spec::Hybrid { mem_weight: 3, ssd_weight: 1 }));
        assert_eq!(parse_spec("none"), Some(Spec::None));
        assert_eq!(parse_spec("mem"), None);
        assert_eq!(parse_spec("mem:-1"), None);
        assert_eq!(parse_spec("disk:1"), None);
    }

    #[test]
    fn config_parses_and_validates() {
        let cfg: WatchConfig = toml::from_str(
            r#"
            cgroup_parent = "/sys/fs/cgroup/memory/doubledecker"
            [daemon]
            unix_socket = "dd-data/dd.sock"
            vm = 2
            data_token = "t"
            [containers.web]
            spec = { type = "mem", weight = 60 }
            [containers.db]
            spec = { type = "hybrid", mem_weight = 1, ssd_weight = 3 }
            kind = "persistent"
            "#,
        )
        .unwrap();
        cfg.validate().unwrap();
        assert_eq!(cfg.containers["db"].kind, PoolKind::Persistent);
        assert_eq!(cfg.default_spec, Spec::Mem { weight: 100 });
        let mut bad = cfg.clone();
        bad.daemon.data_token.clear();
        assert!(bad.validate().unwrap_err().to_string().contains("daemon.data_token"));
    }
}
