//! The daemon's configuration: plain serde data, an embedded default (`default.toml`, printed by
//! `doubledecker config default`), a file merged over it key by key, and one [`ServerConfig::validate`]
//! that names the first bad field.
//!
//! Invariants: [`ServerConfig::default()`] equals the parsed embedded default (a unit test checks it);
//! a configuration that passed `validate` starts the engine and the listeners or fails with an I/O
//! error naming the address or path, never with a panic. Units are in the field names.

use crate::ServerError;
use dd_engine::{EngineConfig, VmWeights};
use serde::{Deserialize, Serialize};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

/// The embedded default configuration.
pub const DEFAULT_TOML: &str = include_str!("default.toml");

/// Shortest token accepted in the configuration or the admin API.
pub const MIN_TOKEN_LEN: usize = 16;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServerConfig {
    /// Folder of the SSD file, the socket and the token file. Default `dd-data`.
    pub data_dir: PathBuf,
    /// Open the SSD store of `engine.ssd`. Default true.
    pub ssd_enabled: bool,
    pub listen: ListenConfig,
    pub limits: LimitsConfig,
    pub auth: AuthConfig,
    pub engine: EngineConfig,
    /// Co-operative de-duplication with peer daemons (thesis 004, chapter 5). Default off.
    pub coop: CoopConfig,
    /// Recording of connections for fuzzing corpora (`capture` module). Default off.
    #[serde(default)]
    pub capture: CaptureConfig,
    /// TLS on the data plane's TCP listener and the admin API (`tls` module). Default off.
    #[serde(default)]
    pub tls: TlsConfig,
    /// What the daemon keeps of the recent past for `/ui/` (`history` module). Default an hour at 2 s.
    #[serde(default)]
    pub history: crate::history::HistoryConfig,
    /// VMs registered at start. Default none.
    #[serde(default)]
    pub vms: Vec<VmConfig>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ListenConfig {
    /// Unix socket path, relative to `data_dir`; empty disables. Default `dd.sock`.
    pub unix_socket: PathBuf,
    /// TCP address of the data plane; empty disables. Default `127.0.0.1:7411`.
    pub tcp: String,
    /// Admin API address. Default `127.0.0.1:7412`.
    pub admin: String,
    /// Where to write the bound addresses as JSON once listening; empty: nowhere. Default empty.
    pub ready_file: PathBuf,
}

/// TLS on the TCP listeners that guests and operators may reach over a network (`crate::tls`,
/// docs/decisions.md D30). Off while `cert_file` is empty.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TlsConfig {
    /// PEM file of the daemon's certificate chain, leaf first, relative to `data_dir`; empty: TLS off.
    /// Default empty.
    pub cert_file: PathBuf,
    /// PEM file of the certificate's private key (PKCS#8, PKCS#1 or SEC1), relative to `data_dir`.
    /// Default empty.
    pub key_file: PathBuf,
    /// TLS on the data plane's TCP listener (the Unix socket stays plain). Default true.
    pub data_plane: bool,
    /// TLS on the admin API's listener (`https://`). Default true.
    pub admin: bool,
}

impl Default for TlsConfig {
    fn default() -> Self {
        TlsConfig { cert_file: PathBuf::new(), key_file: PathBuf::new(), data_plane: true, admin: true }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LimitsConfig {
    /// Data-plane connections, in their handshake or authenticated. Default 1024.
    pub max_connections: usize,
    /// Authenticated data-plane connections of one VM. Default 64.
    pub max_connections_per_vm: usize,
    /// Time from accept to a completed HELLO; a connection that takes longer is closed. Default 5000.
    pub handshake_timeout_ms: u64,
    /// CPU priority (nice, 0..=19) of the thread that accepts data-plane connections and reads their
    /// HELLO: unauthenticated work gets what authenticated sessions leave. 0: the daemon's own.
    /// Default 10.
    pub handshake_nice: u8,
    /// A handshake that fails (a malformed or oversized frame, an unsupported version, an unknown VM or
    /// a wrong token) is answered this long after the failure, and the connection is not read
    /// meanwhile (its receive buffer shrunk to the minimum): a client cannot make the daemon accept,
    /// refuse and close connections faster than one per this delay per connection slot it holds. The
    /// connection keeps a handshake slot meanwhile, which a newer connection may displace. 0: answered
    /// at once. Default 1000.
    pub handshake_fail_delay_ms: u64,
    /// An authenticated connection that sends nothing (or reads nothing of its answers) this long is
    /// closed; 0 disables. Default 600000 (10 minutes).
    pub idle_timeout_ms: u64,
    /// Default 2 MiB.
    pub max_payload_bytes: u32,
    /// Default 256 KiB.
    pub write_buffer_bytes: usize,
    /// Default 5000.
    pub drain_timeout_ms: u64,
    /// Threads the daemon's runtime may add beyond its workers for blocking work (engine calls that may
    /// wait on the SSD or a peer, the admin API's). Every thread keeps per-thread state (spare output
    /// buffers, the allocator's cache), and the runtime keeps an idle thread for as long as work comes
    /// often enough to wake it, so without a limit the threads, and the memory, grew with every burst
    /// for the daemon's life (issue 35: 51 to 101 threads and 17 to 34 MB of heap in 11 minutes of
    /// `soak`). Past the limit, blocking work waits for a thread. Default 64.
    pub max_blocking_threads: usize,
    /// Runtimes serving authenticated sessions, one worker thread and one reactor each (`sessions`):
    /// 0, the default, is one per available core.
    pub session_threads: usize,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AuthConfig {
    /// Host scope bearer token; empty means "use token_file". Default empty.
    pub host_admin_token: String,
    /// Relative to `data_dir`. Default `admin.token`.
    pub token_file: PathBuf,
    /// VM registrations made or changed at run time, kept across restarts (token hashes only, mode
    /// 0600; `persist` module). Relative to `data_dir`; empty: not kept (every restart starts from the
    /// configuration alone). Default `registrations.json`.
    pub registrations_file: PathBuf,
    /// Writes of the registrations file are at least this far apart; a change made sooner waits for
    /// its turn (its admin call still returns only once the change is on disk). Each write is two
    /// syncs, and storage is shared with every tenant: unpaced, an admin client changing
    /// registrations in a loop made 2,000 syncs a second and cost another VM's p99 half of its value
    /// (`bench tenants`, `reregistration`). 0: unpaced. Default 10.
    pub registrations_min_write_interval_ms: u64,
}

/// Co-operative de-duplication between daemons (`coop` module, `docs/protocol.md` "Peer protocol").
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CoopConfig {
    /// Default false. Needs `engine.mem.dedup = true` (remote compares use the content index).
    pub enabled: bool,
    /// Address of the peer listener (peer traffic only, never guests). Default `127.0.0.1:7413`.
    pub listen: String,
    /// This daemon's name among its peers; empty: the `listen` address. Default empty.
    pub node_name: String,
    /// The de-duplication group (`vms[].dedup_group`) whose pages are shared with peers: only they are
    /// offered when evicted, published in the summary and pinned for peers. Required when enabled.
    /// Default empty.
    #[serde(default)]
    pub dedup_group: String,
    /// This daemon's private ed25519 key (base64 of the 32-byte seed), relative to `data_dir`; created
    /// (mode 0600) at the first start when missing. Its public key goes into the other members'
    /// `peers` lists (`doubledecker config coop-key FILE` prints it, and so does `GET /v1/host/coop`).
    /// Default `coop.key`.
    pub key_file: PathBuf,
    /// Where the live peers and their addresses come from: `static` (`peers` below) or `etcd`. Default
    /// `static`.
    pub membership: Membership,
    /// The membership: every other daemon's name and public key (and, for `static`, its address).
    /// Only these names are accepted on the peer listener, each proving its name with its key; with
    /// `etcd` a registered name outside this list is ignored. Default none.
    #[serde(default)]
    pub peers: Vec<PeerConfig>,
    /// How often the summary is rebuilt and pushed to every peer. Default 120000 (120 s).
    pub publish_interval_ms: u64,
    /// Bound on one peer request (write + read), e.g. a remotified get. Default 500.
    pub request_timeout_ms: u64,
    /// Bound on connecting to a peer. Default 500.
    pub connect_timeout_ms: u64,
    /// After a failed request a peer is skipped for this long (gets miss at once). Default 1000.
    pub peer_backoff_ms: u64,
    /// Evicted pages waiting for remotification; beyond it evictions are plain. Default 4096.
    pub remotify_queue_pages: usize,
    /// Pins this daemon holds for all peers together; further compares are refused. Default 262144.
    pub max_pins: u64,
    /// Pins of a peer not heard from for this long are released (dead peer). Default 360000
    /// (three publication periods).
    pub pin_ttl_ms: u64,
    /// Peers asked to pin each remotified page (1 to `dd_engine::MAX_HOLDERS`, 3): the page's record
    /// names every one that did, and a get tries them in turn, so the page survives the death of all
    /// but one. Each holder costs a remote compare at remotification and a pinned frame on that peer.
    /// Default 2.
    #[serde(default = "default_coop_max_holders")]
    pub max_holders: usize,
    /// Peer-listener connections in their handshake from addresses outside the membership, together;
    /// when all are taken a new one displaces the oldest of them (`coop::slots`). Default 64.
    #[serde(default = "default_coop_max_connections")]
    pub max_connections: usize,
    /// Peer-listener handshake slots of each membership address (a peer's `addr` IP), which
    /// connections from other addresses never displace; at least `max_sessions_per_peer`, so that a
    /// node opening all its sessions at once never displaces its own handshakes. Default 16.
    #[serde(default = "default_coop_handshakes_per_member")]
    pub handshakes_per_member: usize,
    /// Sessions one authenticated node may hold on this listener (its next AUTH is answered `busy`);
    /// the client side opens at most as many to one peer. Default 8.
    #[serde(default = "default_coop_max_sessions_per_peer")]
    pub max_sessions_per_peer: usize,
    /// An authenticated peer session without a frame for this long is closed by the listener; the
    /// client drops pooled sessions idle for half of it. Default 60000 (60 s).
    #[serde(default = "default_coop_idle_timeout_ms")]
    pub idle_timeout_ms: u64,
    /// Time from accept to a completed peer HELLO; slower connections are closed. Default 5000.
    #[serde(default = "default_coop_handshake_ms")]
    pub handshake_timeout_ms: u64,
    /// The summary: `m_bits`, `k_hashes`, `removal` (`no-unset` or `counting`). Default 8 Mi bits, 7.
    pub bloom: dd_coop::BloomConfig,
    pub etcd: EtcdConfig,
}

/// Recording of what data-plane and peer connections exchange, into files the fuzz corpora are made
/// from (`capture` module, `fuzz/README.md`). The files hold pages in clear (tokens redacted): for
/// test and benchmark daemons only.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct CaptureConfig {
    /// Folder of the capture files (created with mode 0700 if missing); empty: nothing is recorded.
    /// `doubledecker serve --capture-dir` (or `DD_CAPTURE_DIR`) overrides it. Default empty.
    pub dir: PathBuf,
    /// Connections recorded per daemon process, the first ones accepted. Default 64.
    pub max_connections: u64,
    /// Bytes of one connection's file; its exchange is recorded up to the record that would pass it.
    /// Default 1048576 (1 MiB).
    pub max_bytes_per_connection: u64,
    /// Bytes of all capture files of the process together. Default 67108864 (64 MiB).
    pub max_total_bytes: u64,
}

impl Default for CaptureConfig {
    fn default() -> Self {
        CaptureConfig {
            dir: PathBuf::new(),
            max_connections: 64,
            max_bytes_per_connection: 1 << 20,
            max_total_bytes: 64 << 20,
        }
    }
}

/// How peers are found.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Membership {
    Static,
    Etcd,
}

/// One member of the co-operative group.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PeerConfig {
    /// The peer's `coop.node_name`.
    pub name: String,
    /// The peer's `coop.listen` address (static membership; with etcd it comes from etcd and may be
    /// left out).
    #[serde(default)]
    pub addr: String,
    /// The peer's public key (base64, 32 bytes: what `doubledecker config coop-key` prints).
    pub public_key: String,
}

/// etcd membership: each daemon keeps `prefix + node_name -> listen address` under a lease.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EtcdConfig {
    /// etcd's v3 JSON gateway. Default `http://127.0.0.1:2379`.
    pub endpoint: String,
    /// Default `/doubledecker/peers/`.
    pub prefix: String,
    /// Lease time to live; a daemon that stops renewing drops out after it. Default 10.
    pub lease_ttl_s: u64,
}

/// A VM registered from the configuration file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VmConfig {
    pub id: u32,
    #[serde(default = "default_weights")]
    pub weights: VmWeights,
    /// Token of the data plane's HELLO.
    pub data_token: String,
    /// Bearer token of the admin API's VM scope; must differ from `data_token`.
    pub admin_token: String,
    /// The VM's pool quota; default `engine.max_pools_per_vm`.
    #[serde(default)]
    pub max_pools: Option<usize>,
    /// The de-duplication group the VM's pages share content with (its VMs can learn about each
    /// other's content: see docs/protocol.md "Security"); empty (the default): a domain of its own.
    #[serde(default)]
    pub dedup_group: String,
}

/// Longest de-duplication group name, bytes.
pub const MAX_GROUP_NAME_BYTES: usize = 128;

/// Why a VM's de-duplication group name is refused (`dd_engine::names`; empty is no group).
pub fn group_name_problem(name: &str) -> Option<&'static str> {
    if name.is_empty() {
        return None;
    }
    dd_engine::names::name_problem(name, MAX_GROUP_NAME_BYTES)
}

fn default_coop_max_holders() -> usize {
    2
}

fn default_coop_max_connections() -> usize {
    64
}

fn default_coop_handshakes_per_member() -> usize {
    16
}

fn default_coop_max_sessions_per_peer() -> usize {
    8
}

fn default_coop_idle_timeout_ms() -> u64 {
    60_000
}

fn default_coop_handshake_ms() -> u64 {
    5000
}

fn default_weights() -> VmWeights {
    VmWeights::equal(100)
}

impl Default for ServerConfig {
    fn default() -> Self {
        toml::from_str(DEFAULT_TOML).expect("the embedded default configuration parses")
    }
}

fn invalid(field: impl Into<String>, reason: impl Into<String>) -> ServerError {
    ServerError::Config { field: field.into(), reason: reason.into() }
}

fn at_line(line: Option<usize>, msg: &str) -> String {
    match line {
        Some(l) => format!("line {l}: {msg}"),
        None => msg.to_string(),
    }
}

/// 1-based line of byte offset `at`.
fn line_of(text: &str, at: usize) -> usize {
    text[..at.min(text.len())].bytes().filter(|&b| b == b'\n').count() + 1
}

/// Byte offset of the key at `path` (table keys, array indices) in `text`, if the text has it.
fn span_of(text: &str, path: &[String]) -> Option<usize> {
    let doc = toml_edit::ImDocument::parse(text).ok()?;
    let mut table: &dyn toml_edit::TableLike = doc.as_table();
    let mut at = None;
    let mut i = 0;
    while i < path.len() {
        let (k, v) = table.get_key_value(&path[i])?;
        at = k.span().map(|s| s.start).or(at);
        i += 1;
        match v {
            toml_edit::Item::Table(t) => table = t,
            toml_edit::Item::Value(toml_edit::Value::InlineTable(t)) => table = t,
            toml_edit::Item::ArrayOfTables(a) if i < path.len() => {
                let t = a.get(path[i].parse().ok()?)?;
                at = t.span().map(|s| s.start).or(at);
                table = t;
                i += 1;
            }
            _ => return at,
        }
    }
    at
}

/// Merges `over` into `base`: tables recursively, every other value replaced.
fn merge(base: &mut toml::Value, over: toml::Value) {
    match (base, over) {
        (toml::Value::Table(b), toml::Value::Table(o)) => {
            for (k, v) in o {
                match b.get_mut(&k) {
                    Some(slot) => merge(slot, v),
                    None => {
                        b.insert(k, v);
                    }
                }
            }
        }
        (b, o) => *b = o,
    }
}

impl ServerConfig {
    /// Parses a configuration text merged over the embedded default. Errors name the field's full path
    /// and, where the text has it, its line.
    pub fn from_toml(text: &str) -> Result<ServerConfig, ServerError> {
        let mut base: toml::Value = toml::from_str(DEFAULT_TOML).expect("embedded default parses");
        let over: toml::Value = toml::from_str(text).map_err(|e| {
            let line = e.span().map(|s| line_of(text, s.start));
            invalid("(syntax)", at_line(line, e.message()))
        })?;
        merge(&mut base, over);
        // The merge loses the text's spans: the path of a bad field comes from the deserializer, its
        // line from looking the path up in the text.
        let cfg: ServerConfig = serde_path_to_error::deserialize(base).map_err(|e| {
            let inner = e.inner().message().to_string();
            let mut path: Vec<String> = e
                .path()
                .iter()
                .filter_map(|seg| match seg {
                    serde_path_to_error::Segment::Map { key } => Some(key.clone()),
                    serde_path_to_error::Segment::Seq { index } => Some(index.to_string()),
                    _ => None,
                })
                .collect();
            // An unknown field is named by the message; the path may stop at its table.
            if let Some(key) = inner.strip_prefix("unknown field `").and_then(|r| r.split('`').next()) {
                if path.last().is_none_or(|l| l != key) {
                    path.push(key.to_string());
                }
            }
            let line = span_of(text, &path).map(|at| line_of(text, at));
            let field = if path.is_empty() { "(top level)".to_string() } else { path.join(".") };
            invalid(field, at_line(line, &inner))
        })?;
        cfg.validate()?;
        Ok(cfg)
    }

    /// Reads and parses a file; `None` gives the validated embedded default.
    pub fn load(path: Option<&Path>) -> Result<ServerConfig, ServerError> {
        match path {
            None => {
                let c = ServerConfig::default();
                c.validate()?;
                Ok(c)
            }
            Some(p) => {
                let text = std::fs::read_to_string(p)
                    .map_err(|e| ServerError::Io(format!("reading {}: {e}", p.display())))?;
                ServerConfig::from_toml(&text).map_err(|e| match e {
                    ServerError::Config { field, reason } => {
                        ServerError::Config { field, reason: format!("{reason} (in {})", p.display()) }
                    }
                    e => e,
                })
            }
        }
    }

    /// Resolves a path relative to `data_dir`.
    pub fn in_data_dir(&self, p: &Path) -> PathBuf {
        if p.is_absolute() {
            p.to_path_buf()
        } else {
            self.data_dir.join(p)
        }
    }

    /// The engine configuration the daemon runs: SSD path resolved, SSD dropped if disabled.
    pub fn engine_config(&self) -> EngineConfig {
        let mut e = self.engine.clone();
        match (&mut e.ssd, self.ssd_enabled) {
            (Some(s), true) => s.path = self.in_data_dir(&s.path),
            (s, _) => *s = None,
        }
        e
    }

    /// The certificate and key files (resolved in `data_dir`) when TLS is on.
    pub fn tls_files(&self) -> Option<(PathBuf, PathBuf)> {
        (!self.tls.cert_file.as_os_str().is_empty())
            .then(|| (self.in_data_dir(&self.tls.cert_file), self.in_data_dir(&self.tls.key_file)))
    }

    pub fn unix_socket_path(&self) -> Option<PathBuf> {
        (!self.listen.unix_socket.as_os_str().is_empty()).then(|| self.in_data_dir(&self.listen.unix_socket))
    }

    /// Checks every field; the error names the first bad one.
    pub fn validate(&self) -> Result<(), ServerError> {
        if self.data_dir.as_os_str().is_empty() {
            return Err(invalid("data_dir", "must not be empty"));
        }
        self.engine_config().validate().map_err(|e| match e {
            dd_engine::CacheError::InvalidConfig { field, reason } => {
                invalid(format!("engine.{field}"), reason)
            }
            other => invalid("engine", other.to_string()),
        })?;
        if !self.listen.tcp.is_empty() {
            let a: SocketAddr = self
                .listen
                .tcp
                .parse()
                .map_err(|_| invalid("listen.tcp", "not an address like 127.0.0.1:7411"))?;
            let _ = a;
        }
        let (cert, key) = (&self.tls.cert_file, &self.tls.key_file);
        match (cert.as_os_str().is_empty(), key.as_os_str().is_empty()) {
            (true, false) => return Err(invalid("tls.cert_file", "empty while tls.key_file is set")),
            (false, true) => return Err(invalid("tls.key_file", "empty while tls.cert_file is set")),
            (false, false) if !self.tls.data_plane && !self.tls.admin => {
                return Err(invalid(
                    "tls.data_plane",
                    "false with tls.admin false: the certificate is unused",
                ))
            }
            _ => {}
        }
        if self.listen.tcp.is_empty() && self.listen.unix_socket.as_os_str().is_empty() {
            return Err(invalid("listen", "at least one of listen.tcp and listen.unix_socket is needed"));
        }
        if let Some(p) = self.unix_socket_path() {
            // sockaddr_un holds 108 bytes including the terminating NUL.
            if p.as_os_str().len() > 107 {
                return Err(invalid("listen.unix_socket", "path longer than 107 bytes"));
            }
        }
        self.listen
            .admin
            .parse::<SocketAddr>()
            .map_err(|_| invalid("listen.admin", "not an address like 127.0.0.1:7412"))?;
        let l = &self.limits;
        if l.max_connections == 0 {
            return Err(invalid("limits.max_connections", "must be at least 1"));
        }
        if l.max_connections_per_vm == 0 {
            return Err(invalid("limits.max_connections_per_vm", "must be at least 1"));
        }
        if l.handshake_timeout_ms == 0 {
            return Err(invalid("limits.handshake_timeout_ms", "must be at least 1"));
        }
        if l.handshake_nice > 19 {
            return Err(invalid("limits.handshake_nice", "must be 0..=19"));
        }
        if self.auth.registrations_min_write_interval_ms > 1000 {
            return Err(invalid("auth.registrations_min_write_interval_ms", "must be at most 1000"));
        }
        if l.handshake_fail_delay_ms > 60_000 {
            return Err(invalid("limits.handshake_fail_delay_ms", "must be at most 60000"));
        }
        if l.max_payload_bytes > dd_proto::ABSOLUTE_MAX_PAYLOAD_BYTES {
            return Err(invalid("limits.max_payload_bytes", "above the protocol's 64 MiB ceiling"));
        }
        let batch = self.engine.max_batch_pages as u64;
        let need = batch * (self.engine.page_size_bytes as u64 + 16) + 8;
        if (l.max_payload_bytes as u64) < need {
            return Err(invalid(
                "limits.max_payload_bytes",
                format!("{} cannot hold a full batch ({need} bytes)", l.max_payload_bytes),
            ));
        }
        if batch > u32::MAX as u64 {
            return Err(invalid("engine.max_batch_pages", "above 2^32"));
        }
        if l.write_buffer_bytes < 4096 {
            return Err(invalid("limits.write_buffer_bytes", "must be at least 4096"));
        }
        if l.max_blocking_threads == 0 || l.max_blocking_threads > 4096 {
            return Err(invalid("limits.max_blocking_threads", "must be 1 to 4096"));
        }
        if l.session_threads > 1024 {
            return Err(invalid("limits.session_threads", "must be 0 (one per core) to 1024"));
        }
        if !self.auth.host_admin_token.is_empty() && self.auth.host_admin_token.len() < MIN_TOKEN_LEN {
            return Err(invalid("auth.host_admin_token", "shorter than 16 characters"));
        }
        if self.auth.host_admin_token.is_empty() && self.auth.token_file.as_os_str().is_empty() {
            return Err(invalid("auth.token_file", "needed when auth.host_admin_token is empty"));
        }
        self.validate_coop()?;
        let c = &self.capture;
        for (field, v) in [
            ("capture.max_connections", c.max_connections),
            ("capture.max_bytes_per_connection", c.max_bytes_per_connection),
            ("capture.max_total_bytes", c.max_total_bytes),
        ] {
            if v == 0 {
                return Err(invalid(field, "must be at least 1"));
            }
        }
        if let Some((field, reason)) = self.history.problem() {
            return Err(invalid(field, reason));
        }
        let mut ids = std::collections::HashSet::new();
        let mut tokens = std::collections::HashSet::new();
        tokens.insert(self.auth.host_admin_token.clone());
        for (i, vm) in self.vms.iter().enumerate() {
            if !ids.insert(vm.id) {
                return Err(invalid(format!("vms[{i}].id"), format!("vm {} is listed twice", vm.id)));
            }
            for (name, t) in [("data_token", &vm.data_token), ("admin_token", &vm.admin_token)] {
                if t.len() < MIN_TOKEN_LEN {
                    return Err(invalid(format!("vms[{i}].{name}"), "shorter than 16 characters"));
                }
                if !tokens.insert(t.clone()) {
                    return Err(invalid(format!("vms[{i}].{name}"), "the same token is used twice"));
                }
            }
            for (name, w) in [("weights.mem", vm.weights.mem), ("weights.ssd", vm.weights.ssd)] {
                if w > 1_000_000 {
                    return Err(invalid(format!("vms[{i}].{name}"), "above 1 000 000"));
                }
            }
            if let Some(p) = group_name_problem(&vm.dedup_group) {
                return Err(invalid(format!("vms[{i}].dedup_group"), p));
            }
        }
        Ok(())
    }
}

impl ServerConfig {
    /// The name this daemon goes by among its peers.
    pub fn coop_node_name(&self) -> String {
        if self.coop.node_name.is_empty() {
            self.coop.listen.clone()
        } else {
            self.coop.node_name.clone()
        }
    }

    fn validate_coop(&self) -> Result<(), ServerError> {
        let c = &self.coop;
        c.bloom.validate().map_err(|e| match e {
            dd_coop::bloom::BloomError::Invalid { field, reason } => {
                invalid(format!("coop.bloom.{field}"), reason)
            }
            other => invalid("coop.bloom", other.to_string()),
        })?;
        if c.bloom.m_bits > 1 << 29 {
            return Err(invalid("coop.bloom.m_bits", "above 2^29 (a 64 MiB summary)"));
        }
        for (field, v) in [
            ("coop.publish_interval_ms", c.publish_interval_ms),
            ("coop.request_timeout_ms", c.request_timeout_ms),
            ("coop.connect_timeout_ms", c.connect_timeout_ms),
            ("coop.pin_ttl_ms", c.pin_ttl_ms),
            ("coop.handshake_timeout_ms", c.handshake_timeout_ms),
            ("coop.max_connections", c.max_connections as u64),
            ("coop.handshakes_per_member", c.handshakes_per_member as u64),
            ("coop.max_sessions_per_peer", c.max_sessions_per_peer as u64),
            ("coop.idle_timeout_ms", c.idle_timeout_ms),
            ("coop.etcd.lease_ttl_s", c.etcd.lease_ttl_s),
        ] {
            if v == 0 {
                return Err(invalid(field, "must be at least 1"));
            }
        }
        if c.handshakes_per_member < c.max_sessions_per_peer {
            return Err(invalid(
                "coop.handshakes_per_member",
                "must be at least coop.max_sessions_per_peer (a peer opening its sessions at once would displace its own handshakes)",
            ));
        }
        if !(1..=dd_engine::MAX_HOLDERS).contains(&c.max_holders) {
            return Err(invalid("coop.max_holders", format!("must be 1 to {}", dd_engine::MAX_HOLDERS)));
        }
        if !c.enabled {
            return Ok(());
        }
        if !self.engine.mem.dedup {
            return Err(invalid("coop.enabled", "needs engine.mem.dedup = true"));
        }
        if c.dedup_group.is_empty() {
            return Err(invalid(
                "coop.dedup_group",
                "name the de-duplication group whose pages are shared with peers (VMs join it with dedup_group)",
            ));
        }
        if let Some(p) = group_name_problem(&c.dedup_group) {
            return Err(invalid("coop.dedup_group", p));
        }
        c.listen
            .parse::<SocketAddr>()
            .map_err(|_| invalid("coop.listen", "not an address like 127.0.0.1:7413"))?;
        if c.key_file.as_os_str().is_empty() {
            return Err(invalid("coop.key_file", "must not be empty"));
        }
        let me = self.coop_node_name();
        if let Some(p) = dd_engine::names::name_problem(&me, dd_coop::wire::MAX_NAME) {
            return Err(invalid("coop.node_name", format!("{p} (1 to 255 bytes)")));
        }
        let mut names = std::collections::HashSet::new();
        for (i, p) in c.peers.iter().enumerate() {
            if let Some(e) = dd_engine::names::name_problem(&p.name, dd_coop::wire::MAX_NAME) {
                return Err(invalid(format!("coop.peers[{i}].name"), format!("{e} (1 to 255 bytes)")));
            }
            if p.name == me || !names.insert(p.name.clone()) {
                return Err(invalid(
                    format!("coop.peers[{i}].name"),
                    "names this daemon or another peer twice",
                ));
            }
            if c.membership == Membership::Static || !p.addr.is_empty() {
                p.addr.parse::<SocketAddr>().map_err(|_| {
                    invalid(format!("coop.peers[{i}].addr"), "not an address like 127.0.0.1:7413")
                })?;
            }
            dd_coop::identity::parse_public(&p.public_key)
                .map_err(|e| invalid(format!("coop.peers[{i}].public_key"), e.to_string()))?;
        }
        if c.membership == Membership::Etcd && !c.etcd.endpoint.starts_with("http://") {
            return Err(invalid("coop.etcd.endpoint", "must be an http:// URL"));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn field_of(e: ServerError) -> String {
        match e {
            ServerError::Config { field, .. } => field,
            other => panic!("not a config error: {other}"),
        }
    }

    #[test]
    fn embedded_default_is_valid_and_complete() {
        let d = ServerConfig::default();
        d.validate().unwrap();
        assert_eq!(ServerConfig::from_toml("").unwrap(), d);
        assert!(d.engine_config().ssd.unwrap().path.starts_with("dd-data"));
        assert_eq!(d.unix_socket_path().unwrap(), PathBuf::from("dd-data/dd.sock"));
    }

    #[test]
    fn a_file_changes_only_what_it_names() {
        let c =
            ServerConfig::from_toml("ssd_enabled = false\n[engine.mem]\ncapacity_bytes = 1048576\n").unwrap();
        assert_eq!(c.engine.mem.capacity_bytes, 1 << 20);
        assert_eq!(c.engine.page_size_bytes, 4096, "untouched keys keep the default");
        assert!(c.engine_config().ssd.is_none());
    }

    #[test]
    fn bad_values_name_their_field() {
        let cases = [
            ("[listen]\ntcp = \"nope\"", "listen.tcp"),
            ("[listen]\nadmin = \"\"", "listen.admin"),
            ("[limits]\nmax_connections = 0", "limits.max_connections"),
            ("[limits]\nmax_connections_per_vm = 0", "limits.max_connections_per_vm"),
            ("[limits]\nhandshake_timeout_ms = 0", "limits.handshake_timeout_ms"),
            ("[limits]\nhandshake_nice = 20", "limits.handshake_nice"),
            ("[limits]\nhandshake_fail_delay_ms = 60001", "limits.handshake_fail_delay_ms"),
            (
                "[auth]\nregistrations_min_write_interval_ms = 1001",
                "auth.registrations_min_write_interval_ms",
            ),
            ("[limits]\nmax_payload_bytes = 1000", "limits.max_payload_bytes"),
            ("[engine]\npage_size_bytes = 1000", "engine.page_size_bytes"),
            ("[auth]\nhost_admin_token = \"short\"", "auth.host_admin_token"),
            (
                "[[vms]]\nid = 1\ndata_token = \"0123456789abcdef\"\nadmin_token = \"0123456789abcdef\"",
                "vms[0].admin_token",
            ),
            ("[[vms]]\nid = 1\ndata_token = \"x\"\nadmin_token = \"0123456789abcdefg\"", "vms[0].data_token"),
            ("[coop]\nenabled = true", "coop.enabled"),
            ("[coop]\nhandshakes_per_member = 4\nmax_sessions_per_peer = 8", "coop.handshakes_per_member"),
            (
                "[engine.mem]\ndedup = true\n[coop]\nenabled = true\ndedup_group = \"a\\u202eb\"",
                "coop.dedup_group",
            ),
            ("[engine.mem]\ndedup = true\n[coop]\nenabled = true", "coop.dedup_group"),
            (
                "[engine.mem]\ndedup = true\n[coop]\nenabled = true\ndedup_group = \"g\"\nkey_file = \"\"",
                "coop.key_file",
            ),
            (
                "[engine.mem]\ndedup = true\n[coop]\nenabled = true\ndedup_group = \"g\"\n\
                 [[coop.peers]]\nname = \"b\"\naddr = \"nowhere\"\npublic_key = \"\"",
                "coop.peers[0].addr",
            ),
            (
                "[engine.mem]\ndedup = true\n[coop]\nenabled = true\ndedup_group = \"g\"\n\
                 [[coop.peers]]\nname = \"b\"\naddr = \"127.0.0.1:1\"\npublic_key = \"AAAA\"",
                "coop.peers[0].public_key",
            ),
            ("[coop.bloom]\nm_bits = 100", "coop.bloom.m_bits"),
            ("[coop]\npublish_interval_ms = 0", "coop.publish_interval_ms"),
            ("[capture]\nmax_total_bytes = 0", "capture.max_total_bytes"),
            ("[history]\ninterval_ms = 10", "history.interval_ms"),
            ("[history]\nsamples = 1", "history.samples"),
        ];
        for (text, field) in cases {
            assert_eq!(field_of(ServerConfig::from_toml(text).unwrap_err()), field, "{text}");
        }
    }

    #[test]
    fn unknown_keys_are_refused_with_their_name() {
        let e = ServerConfig::from_toml("[limits]\nmax_conections = 3").unwrap_err();
        assert!(e.to_string().contains("max_conections"), "{e}");
        let e = ServerConfig::from_toml("[engine.mem]\ncapacity = 3").unwrap_err();
        assert!(e.to_string().contains("capacity"), "{e}");
    }
}
