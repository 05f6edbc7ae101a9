//! `doubledecker guest watch`: cgroups in, pools out.
//!
//! Every `poll_interval_ms` the watcher lists the child directories of `cgroup.parent` (v1 memory or
//! v2: the containers), and reconciles the daemon with what it sees, over one data-plane connection
//! authenticated as this VM:
//! * a new cgroup gets a pool with its desired spec, named after the cgroup (SET_LABEL);
//! * a cgroup whose desired spec changed gets `set_cg_weight`;
//! * a pool whose cgroup is gone is destroyed.
//!
//! The desired spec of a container is, in order: the `user.doubledecker.spec` extended attribute of its
//! cgroup directory (cgroup v2 accepts `user.*` xattrs; the value is `mem:W`, `ssd:W`, `hybrid:WM:WS` or
//! `none`), the `[containers.NAME]` entry of the configuration, then `default_spec`. Polling (rather than
//! inotify) keeps the watcher correct on every cgroupfs and catches xattr changes, at the cost of up to
//! one interval of delay.
//!
//! Restarts (issue 13). The connection heals itself (`dd_client::Session`: capped exponential back-off
//! with jitter); a round that cannot reach the daemon changes nothing and says so. Every pool belongs to
//! the daemon instance that made it (HELLO's instance id, written in the state file): when the watcher
//! reaches a new instance (the daemon restarted and lost every pool), it creates every container's pool
//! again with its spec and rewrites the state file. A watcher started again (killed, upgraded) adopts
//! the pools its predecessor's state file names, if the daemon is still that instance and still holds
//! them, instead of creating duplicates.
//!
//! Invariants: the watcher owns exactly the pools in its map, all of one daemon instance; after each
//! round that reached the daemon the map holds one pool per container cgroup present, and the state file
//! (written atomically: temporary file and rename) is that map and instance. On shutdown
//! ([`Watcher::shutdown`]) every pool it created is destroyed and the state file removed: nothing is
//! left behind. (A watcher killed between creating a pool and writing the state file leaves that pool
//! behind, unowned, until the VM's pools are reset; the window is one request.)

use dd_client::{BackoffPolicy, ClientError, Endpoint, PoolRef, Session};
use dd_types::{PoolId, PoolKind, PoolOptions, Spec};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// Where the daemon is and who we are.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
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
    /// TLS to `tcp` (the daemon's `[tls]` on): the PEM file of the CA that signed the daemon's
    /// certificate, the only CA trusted. Default: none (plain TCP). Never used on the Unix socket.
    #[serde(default)]
    pub tls_ca_file: Option<PathBuf>,
    /// The name the daemon's certificate must carry. Default: the host part of `tcp`.
    #[serde(default)]
    pub tls_server_name: Option<String>,
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
    /// Reads and validates `path`; the data token is `DD_VM_DATA_TOKEN` when set, else the file's.
    pub fn from_file(path: &Path) -> Result<WatchConfig, WatchError> {
        WatchConfig::load(path, None)
    }

    /// Reads and validates `path` with the data token taken, in order, from `token` (a command-line
    /// flag), `DD_VM_DATA_TOKEN`, or the file (which may then leave it out).
    pub fn load(path: &Path, token: Option<&str>) -> Result<WatchConfig, WatchError> {
        let text =
            std::fs::read_to_string(path).map_err(|source| WatchError::Read { path: path.into(), source })?;
        let mut cfg: WatchConfig = toml::from_str(&text)
            .map_err(|e| WatchError::Parse { path: path.into(), message: e.to_string() })?;
        if let Some(t) = token.map(str::to_owned).or_else(|| std::env::var("DD_VM_DATA_TOKEN").ok()) {
            cfg.daemon.data_token = t;
        }
        cfg.validate()?;
        Ok(cfg)
    }

    pub fn validate(&self) -> Result<(), WatchError> {
        let bad = |field, reason: &str| Err(WatchError::Config { field, reason: reason.into() });
        if let Err((field, reason)) = self.daemon.check() {
            return bad(field, &reason);
        }
        if self.poll_interval_ms == 0 {
            return bad("poll_interval_ms", "must be at least 1");
        }
        Ok(())
    }

    /// Where the daemon is, for `dd_client`'s reconnecting connections.
    pub fn endpoint(&self) -> Endpoint {
        self.daemon.endpoint()
    }
}

impl DaemonConfig {
    /// Where the daemon is, for `dd_client`'s reconnecting connections.
    pub fn endpoint(&self) -> Endpoint {
        Endpoint {
            unix_socket: self.unix_socket.clone(),
            tcp: self.tcp.clone(),
            tls: self.tls_ca_file.as_ref().map(|ca| dd_client::TlsClient {
                ca_file: ca.clone(),
                server_name: self.tls_server_name.clone(),
            }),
            vm: self.vm,
            token: self.data_token.clone(),
        }
    }

    /// The first unusable field (`daemon.` path and reason), for the validate() of each configuration
    /// that holds a `[daemon]` table (the watcher's, the mount's, the guest provisioner's).
    pub fn check(&self) -> Result<(), (&'static str, String)> {
        if self.unix_socket.is_none() && self.tcp.is_none() {
            return Err(("daemon.unix_socket", "set it or daemon.tcp".into()));
        }
        if self.data_token.is_empty() {
            return Err(("daemon.data_token", "empty (set it or DD_VM_DATA_TOKEN)".into()));
        }
        if self.tls_server_name.is_some() && self.tls_ca_file.is_none() {
            return Err((
                "daemon.tls_server_name",
                "set daemon.tls_ca_file too (TLS is off without it)".into(),
            ));
        }
        if self.tls_ca_file.is_some() && self.tcp.is_none() {
            return Err(("daemon.tls_ca_file", "TLS is for daemon.tcp (the Unix socket is plain)".into()));
        }
        Ok(())
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

/// Layout version of the state file.
pub const STATE_VERSION: u32 = 2;

/// The state file: the daemon instance the pools belong to and the cgroup -> pool map. Readers (the
/// FUSE mount) use a pool only while the daemon they reach is that instance.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StateFile {
    pub version: u32,
    pub vm: u32,
    /// The daemon instance (HELLO's instance id) that made every pool below.
    pub instance: u64,
    pub pools: BTreeMap<String, Owned>,
}

impl StateFile {
    /// Reads a state file; `None` when it is missing or not a state file of this layout.
    pub fn read(path: &Path) -> Option<StateFile> {
        let text = std::fs::read(path).ok()?;
        match serde_json::from_slice::<StateFile>(&text) {
            Ok(s) if s.version == STATE_VERSION => Some(s),
            Ok(s) => {
                tracing::warn!("ignoring state file {}: layout version {}", path.display(), s.version);
                None
            }
            Err(e) => {
                tracing::warn!("ignoring state file {}: {e}", path.display());
                None
            }
        }
    }
}

/// What a round changed.
#[derive(Debug, Default, Clone, PartialEq, Eq, Serialize)]
pub struct RoundChanges {
    pub created: Vec<String>,
    pub respecified: Vec<String>,
    pub destroyed: Vec<String>,
    /// Pools lost with a daemon restart (a new instance); they are created again in the same round.
    pub lost: Vec<String>,
    /// Pools taken over from the state file of an earlier watcher (same daemon instance).
    pub adopted: Vec<String>,
    /// The daemon could not be reached: nothing was changed on it this round.
    pub away: bool,
}

pub struct Watcher {
    cfg: WatchConfig,
    session: Session,
    owned: BTreeMap<String, Owned>,
    /// The daemon instance the owned pools belong to (`None` before the first connection).
    instance: Option<u64>,
    /// The state file an earlier watcher left, to adopt its pools if the daemon is the same instance.
    adopt: Option<StateFile>,
}

impl Watcher {
    /// A watcher; it connects in its first round (a daemon that is not up yet is waited for). An
    /// earlier watcher's state file (same VM) is kept to adopt its pools.
    pub fn new(cfg: WatchConfig) -> Result<Watcher, WatchError> {
        cfg.validate()?;
        let session = Session::new(cfg.endpoint(), BackoffPolicy::default(), "guest watch");
        let adopt = StateFile::read(&cfg.state_file).filter(|s| s.vm == cfg.daemon.vm);
        Ok(Watcher { cfg, session, owned: BTreeMap::new(), instance: None, adopt })
    }

    pub fn config(&self) -> &WatchConfig {
        &self.cfg
    }

    /// The cgroup -> pool map.
    pub fn pools(&self) -> &BTreeMap<String, Owned> {
        &self.owned
    }

    /// The daemon instance the pools belong to.
    pub fn instance(&self) -> Option<u64> {
        self.instance
    }

    fn desired(&self, name: &str, dir: &Path) -> (Spec, PoolKind) {
        let configured = self.cfg.containers.get(name);
        let kind = configured.map_or(PoolKind::Ephemeral, |c| c.kind);
        let spec = annotation(dir).or(configured.map(|c| c.spec)).unwrap_or(self.cfg.default_spec);
        (spec, kind)
    }

    fn pool_ref(&self, o: &Owned) -> PoolRef {
        PoolRef { id: o.pool, instance: self.instance.unwrap_or(0) }
    }

    /// One reconciliation. A daemon that cannot be reached is not an error: the round says `away`, the
    /// map stays as it is, and a later round catches up (re-creating the pools if the daemon restarted).
    pub fn round(&mut self) -> Result<RoundChanges, WatchError> {
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
        let before = (self.instance, self.owned.clone());
        match self.reconcile(&present, &mut ch) {
            Ok(()) => {}
            // Unreachable, or it restarted in the middle of the round (a pool of the old instance): the
            // next round reconnects and takes over.
            Err(WatchError::Daemon(e)) if e.is_transport() || matches!(e, ClientError::PoolLost { .. }) => {
                ch.away = true
            }
            Err(e) => return Err(e),
        }
        let changed = before != (self.instance, self.owned.clone()) || !self.cfg.state_file.exists();
        if changed && self.instance.is_some() {
            self.write_state()?;
        }
        Ok(ch)
    }

    fn reconcile(
        &mut self,
        present: &BTreeMap<String, PathBuf>,
        ch: &mut RoundChanges,
    ) -> Result<(), WatchError> {
        // Every round pings: a round that changes nothing sends nothing else, and a daemon that restarted
        // in between must be noticed now (its pools are gone), not at the next change. A broken
        // connection shows here; the connect below then tries again at once. The ping also keeps the
        // daemon's idle timeout (`limits.idle_timeout_ms`) from closing a watcher that is merely waiting.
        if self.session.instance().is_some() {
            let _ = self.session.call(|c| c.ping());
        }
        let instance = self.session.connect()?;
        if self.instance != Some(instance) {
            self.take_over(instance, ch)?;
        }
        // Gone first, so a cgroup recreated under the same name gets a fresh pool.
        let gone: Vec<String> = self.owned.keys().filter(|n| !present.contains_key(*n)).cloned().collect();
        for name in gone {
            let pool = self.pool_ref(&self.owned[&name]);
            match self.session.on_pool(pool, |c, id| c.destroy_cgroup(id)) {
                Ok(()) => {}
                // Already gone on the daemon: nothing left to free.
                Err(e) if e.status().is_some() => tracing::warn!("destroying pool of {name}: {e}"),
                Err(e) => return Err(e.into()),
            }
            self.owned.remove(&name);
            ch.destroyed.push(name);
        }
        for (name, dir) in present {
            let (spec, kind) = self.desired(name, dir);
            match self.owned.get(name) {
                None => {
                    let opts = match kind {
                        PoolKind::Ephemeral => PoolOptions::ephemeral(spec),
                        PoolKind::Persistent => PoolOptions::persistent(spec),
                    };
                    let pool = self
                        .session
                        .on_pool(PoolRef { id: PoolId(0), instance }, |c, _| c.create_cgroup(opts))?;
                    self.owned.insert(name.clone(), Owned { pool, spec, kind, path: dir.clone() });
                    // The pool carries its container's name, so that the admin API, `/metrics` and
                    // `/ui/` show "web" rather than "pool 3". A daemon that refuses the name (an old
                    // daemon without SET_LABEL, a name it does not accept) leaves the pool unnamed:
                    // the container still gets its cache.
                    match self.session.on_pool(PoolRef { id: pool, instance }, |c, id| c.set_label(id, name))
                    {
                        Ok(()) => {}
                        Err(e) if e.status().is_some() => tracing::warn!("naming the pool of {name}: {e}"),
                        Err(e) => return Err(e.into()),
                    }
                    ch.created.push(name.clone());
                }
                Some(o) if o.spec != spec => {
                    let pool = self.pool_ref(o);
                    self.session.on_pool(pool, |c, id| c.set_cg_weight(id, spec))?;
                    self.owned.get_mut(name).expect("present").spec = spec;
                    ch.respecified.push(name.clone());
                }
                Some(_) => {}
            }
        }
        Ok(())
    }

    /// The daemon answering is another instance than the one our pools belong to (or the first one we
    /// reach): adopt an earlier watcher's pools if they are of this instance and still exist, otherwise
    /// the pools are gone (a restart) and the rest of the round creates them again.
    fn take_over(&mut self, instance: u64, ch: &mut RoundChanges) -> Result<(), WatchError> {
        if let Some(st) = self.adopt.take().filter(|s| s.instance == instance) {
            let listed: std::collections::BTreeSet<PoolId> =
                self.session.call(|c| c.list_pools())?.into_iter().collect();
            for (name, o) in st.pools {
                if listed.contains(&o.pool) {
                    ch.adopted.push(name.clone());
                    self.owned.insert(name, o);
                }
            }
        } else {
            ch.lost = std::mem::take(&mut self.owned).into_keys().collect();
        }
        self.instance = Some(instance);
        Ok(())
    }

    fn write_state(&self) -> Result<(), WatchError> {
        let path = &self.cfg.state_file;
        let tmp = path.with_extension("json.tmp");
        let st = StateFile {
            version: STATE_VERSION,
            vm: self.cfg.daemon.vm,
            instance: self.instance.unwrap_or(0),
            pools: self.owned.clone(),
        };
        let body = serde_json::to_vec_pretty(&st).expect("plain data serialises");
        std::fs::write(&tmp, body)
            .and_then(|_| std::fs::rename(&tmp, path))
            .map_err(|source| WatchError::State { path: path.clone(), source })
    }

    /// Destroys every pool the watcher created and removes the state file. Pools of a daemon that is
    /// unreachable, or that restarted since (they are gone with it), are skipped.
    pub fn shutdown(mut self) -> Result<(), WatchError> {
        for (name, o) in std::mem::take(&mut self.owned) {
            let pool = self.pool_ref(&o);
            match self.session.on_pool(pool, |c, id| c.destroy_cgroup(id)) {
                Ok(()) => {}
                Err(ClientError::PoolLost { .. }) => {}
                Err(e) if e.is_transport() => {}
                Err(e) => tracing::warn!("destroying pool of {name} at shutdown: {e}"),
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

    /// TLS keys of `[daemon]`: the CA makes the TCP endpoint TLS; a server name without a CA, or a CA
    /// with only the (always plain) Unix socket, names the field.
    #[test]
    fn daemon_tls_keys_make_a_tls_endpoint_or_name_the_bad_field() {
        let d: DaemonConfig = toml::from_str(
            "tcp = \"host.example:7421\"\nvm = 2\ndata_token = \"t\"\ntls_ca_file = \"/etc/dd/ca.pem\"\n",
        )
        .unwrap();
        d.check().unwrap();
        let ep = d.endpoint();
        assert_eq!(ep.address(), "tls:host.example:7421");
        assert_eq!(ep.tls.as_ref().map(|t| t.ca_file.clone()), Some(PathBuf::from("/etc/dd/ca.pem")));
        let name_only = DaemonConfig { tls_ca_file: None, tls_server_name: Some("h".into()), ..d.clone() };
        assert_eq!(name_only.check().unwrap_err().0, "daemon.tls_server_name");
        let unix_only = DaemonConfig { tcp: None, unix_socket: Some("dd.sock".into()), ..d };
        assert_eq!(unix_only.check().unwrap_err().0, "daemon.tls_ca_file");
    }
}
