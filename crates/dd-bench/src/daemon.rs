//! A real `doubledecker serve` process for the benchmarks that drive the daemon (`server`, `soak`), and
//! the two pieces the integration tests' harness (`crates/doubledecker/tests/common`) starts its daemons
//! with too, so that there is one way to configure and start a daemon: [`ServeConfig`] (the
//! configuration file) and [`spawn_serve`] (spawn, then wait for the ready file).
//!
//! Owns: the child process, its temporary data folder and configuration, and the addresses it bound.
//! The daemon is started from the binary path the caller gives (the CLI passes its own executable), on
//! 127.0.0.1 with port 0 for the data plane and the admin API; the bound addresses come from the
//! daemon's ready file, which it writes atomically once every listener is up.
//!
//! Invariants: only the process spawned here is ever signalled, by its PID; dropping a [`Daemon`] kills
//! and reaps it (so a failing benchmark never leaves a daemon behind); the temporary folder lives as long
//! as the daemon.

use dd_client::admin::{AdminClient, AdminError};
use serde::de::DeserializeOwned;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Errors that stop a run of load against a daemon before its checks (`soak`'s [`crate::soak::SoakError`]
/// and `tenants`' [`crate::tenants::TenantsBenchError`] are this type): a failed check is a report with
/// `pass = false`, not an error.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LoadError {
    #[error("invalid option {field}: {reason}")]
    InvalidOption { field: &'static str, reason: String },
    #[error(transparent)]
    Daemon(#[from] DaemonError),
    #[error("client: {0}")]
    Client(#[from] dd_client::ClientError),
    #[error("i/o: {0}")]
    Io(#[from] std::io::Error),
}

/// Errors of starting, driving or stopping the daemon.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DaemonError {
    #[error("i/o: {0}")]
    Io(#[from] std::io::Error),
    #[error("starting {exe}: {source}")]
    Spawn { exe: String, source: std::io::Error },
    #[error("the daemon exited before it was ready ({0}); its stderr is above")]
    Exited(std::process::ExitStatus),
    #[error("the daemon was not ready after {0:?}")]
    NotReady(Duration),
    #[error("ready file: {0}")]
    ReadyFile(String),
    #[error("admin API {0}")]
    Admin(#[from] AdminError),
    #[error("data plane: {0}")]
    DataPlane(#[from] dd_client::ClientError),
}

/// One VM registered through the configuration file.
#[derive(Debug, Clone)]
pub struct BenchVm {
    pub id: u32,
    pub data_token: String,
    pub admin_token: String,
    /// The de-duplication group of the VM (`vms[].dedup_group`); empty: its own domain.
    pub dedup_group: String,
}

impl BenchVm {
    /// A VM with tokens derived from its id (the daemon is private to the benchmark and bound to
    /// 127.0.0.1 with ephemeral ports, so fixed tokens protect nothing and make runs reproducible).
    pub fn new(id: u32) -> BenchVm {
        BenchVm {
            id,
            data_token: format!("bench-data-token-vm-{id:06}"),
            admin_token: format!("bench-admin-token-vm-{id:06}"),
            dedup_group: String::new(),
        }
    }
}

/// The host admin token of a benchmark daemon.
pub const HOST_TOKEN: &str = "bench-host-admin-token-000001";

/// A daemon's configuration file: loopback listeners on ephemeral ports, a ready file, a host token,
/// the memory store, optionally the SSD store, and the VMs. The tests and the benchmarks differ only in
/// the fields here.
#[derive(Debug, Clone)]
pub struct ServeConfig<'a> {
    pub data_dir: &'a Path,
    pub ready_file: &'a Path,
    /// `listen.unix_socket` ("" : no Unix socket; a relative path is under `data_dir`).
    pub unix_socket: &'a str,
    pub host_token: &'a str,
    /// Top-level keys, written before any table.
    pub top: &'a str,
    /// The `[engine.mem]` table's body.
    pub mem: &'a str,
    /// The `[engine.ssd]` table's body; `None`: no such table.
    pub ssd: Option<&'a str>,
    /// Tables appended after the engine's.
    pub extra: &'a str,
    /// `(id, data token, admin token, dedup group)` of each `[[vms]]` entry.
    pub vms: Vec<(u32, &'a str, &'a str, &'a str)>,
}

impl ServeConfig<'_> {
    pub fn to_toml(&self) -> String {
        let mut cfg = format!(
            "data_dir = {:?}\n{}[listen]\nunix_socket = {:?}\ntcp = \"127.0.0.1:0\"\nadmin = \"127.0.0.1:0\"\n\
             ready_file = {:?}\n[auth]\nhost_admin_token = {:?}\n[engine.mem]\n{}",
            self.data_dir.display().to_string(),
            self.top,
            self.unix_socket,
            self.ready_file.display().to_string(),
            self.host_token,
            self.mem,
        );
        if let Some(ssd) = self.ssd {
            cfg.push_str("[engine.ssd]\n");
            cfg.push_str(ssd);
        }
        cfg.push_str(self.extra);
        cfg.push('\n');
        for (id, data, admin, group) in &self.vms {
            cfg.push_str(&format!("[[vms]]\nid = {id}\ndata_token = {data:?}\nadmin_token = {admin:?}\n"));
            // Only when set (the default is ""), so that an older daemon (a test's DD_TEST_BINARY)
            // starts too.
            if !group.is_empty() {
                cfg.push_str(&format!("dedup_group = {group:?}\n"));
            }
        }
        cfg
    }
}

/// What a daemon's ready file says it bound.
#[derive(Debug, Clone)]
pub struct Bound {
    pub tcp: SocketAddr,
    pub admin: SocketAddr,
    /// The Unix socket's path, when it listens on one.
    pub unix: Option<PathBuf>,
}

/// Spawns `exe serve --config cfg` and waits for its ready file (a bound on start-up of 60 s, which
/// opening a large SSD file can take, not a timing assertion). On an error the child is killed and
/// reaped.
pub fn spawn_serve(
    exe: &Path,
    cfg: &Path,
    ready: &Path,
    stdout: Stdio,
    stderr: Stdio,
) -> Result<(Child, Bound), DaemonError> {
    let mut child = Command::new(exe)
        .args(["serve", "--config"])
        .arg(cfg)
        .stdin(Stdio::null())
        .stdout(stdout)
        .stderr(stderr)
        .spawn()
        .map_err(|source| DaemonError::Spawn { exe: exe.display().to_string(), source })?;
    match wait_ready(&mut child, ready) {
        Ok(b) => Ok((child, b)),
        Err(e) => {
            let _ = child.kill();
            let _ = child.wait();
            Err(e)
        }
    }
}

fn wait_ready(child: &mut Child, ready: &Path) -> Result<Bound, DaemonError> {
    let limit = Duration::from_secs(60);
    let deadline = Instant::now() + limit;
    loop {
        if let Ok(t) = std::fs::read_to_string(ready) {
            let v: serde_json::Value =
                serde_json::from_str(&t).map_err(|e| DaemonError::ReadyFile(e.to_string()))?;
            let addr = |k: &str| -> Result<SocketAddr, DaemonError> {
                v[k].as_str()
                    .and_then(|s| s.parse().ok())
                    .ok_or_else(|| DaemonError::ReadyFile(format!("no {k} address in {t}")))
            };
            let unix = v["unix"].as_str().filter(|s| !s.is_empty()).map(PathBuf::from);
            return Ok(Bound { tcp: addr("tcp")?, admin: addr("admin")?, unix });
        }
        if let Some(st) = child.try_wait()? {
            return Err(DaemonError::Exited(st));
        }
        if Instant::now() > deadline {
            return Err(DaemonError::NotReady(limit));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// What the daemon is started with.
#[derive(Debug, Clone)]
pub struct DaemonOptions {
    /// The `doubledecker` executable.
    pub exe: PathBuf,
    pub mem_capacity_bytes: u64,
    /// 0 runs memory-only (`ssd_enabled = false`).
    pub ssd_capacity_bytes: u64,
    pub vms: Vec<BenchVm>,
    /// Extra TOML appended to the configuration (top-level tables only).
    pub extra_toml: String,
}

/// A running daemon.
#[derive(Debug)]
pub struct Daemon {
    child: Option<Child>,
    _dir: tempfile::TempDir,
    pub tcp: SocketAddr,
    pub admin: SocketAddr,
    pub pid: u32,
}

impl Daemon {
    /// Writes the configuration, spawns `exe serve --config ...` and waits for its ready file.
    pub fn start(opts: &DaemonOptions) -> Result<Daemon, DaemonError> {
        let dir = tempfile::Builder::new().prefix("dd-bench-daemon.").tempdir()?;
        let ready = dir.path().join("ready.json");
        let top = format!("ssd_enabled = {}\n", opts.ssd_capacity_bytes > 0);
        let mem = format!("capacity_bytes = {}\n", opts.mem_capacity_bytes);
        let ssd = format!("capacity_bytes = {}\n", opts.ssd_capacity_bytes);
        let cfg = ServeConfig {
            data_dir: dir.path(),
            ready_file: &ready,
            unix_socket: "",
            host_token: HOST_TOKEN,
            top: &top,
            mem: &mem,
            ssd: (opts.ssd_capacity_bytes > 0).then_some(ssd.as_str()),
            extra: &opts.extra_toml,
            vms: opts
                .vms
                .iter()
                .map(|v| (v.id, v.data_token.as_str(), v.admin_token.as_str(), v.dedup_group.as_str()))
                .collect(),
        };
        let cfg_path = dir.path().join("dd.toml");
        std::fs::write(&cfg_path, cfg.to_toml())?;
        let (child, bound) = spawn_serve(&opts.exe, &cfg_path, &ready, Stdio::null(), Stdio::inherit())?;
        Ok(Daemon { pid: child.id(), child: Some(child), _dir: dir, tcp: bound.tcp, admin: bound.admin })
    }

    /// Whether the process is still running (not exited).
    pub fn is_running(&mut self) -> bool {
        match self.child.as_mut() {
            Some(c) => matches!(c.try_wait(), Ok(None)),
            None => false,
        }
    }

    /// Resident set size of the daemon in bytes (`VmRSS` of `/proc/<pid>/status`).
    pub fn rss_bytes(&self) -> Result<u64, DaemonError> {
        let s = std::fs::read_to_string(format!("/proc/{}/status", self.pid))?;
        parse_vm_rss(&s).ok_or_else(|| DaemonError::Io(std::io::Error::other("no VmRSS line")))
    }

    /// An admin API call with `token`; decodes a JSON answer (use `serde_json::Value` for "any").
    pub fn admin<T: DeserializeOwned>(
        &self,
        method: &str,
        path: &str,
        token: &str,
        body: Option<&serde_json::Value>,
    ) -> Result<T, DaemonError> {
        Ok(AdminClient::new(&self.admin.to_string()).call(method, path, token, body)?)
    }

    /// SIGTERM, then waits up to `grace`; returns whether it exited successfully. Past the grace the
    /// process is killed and `false` returned.
    pub fn stop(&mut self, grace: Duration) -> Result<bool, DaemonError> {
        let Some(mut c) = self.child.take() else { return Ok(false) };
        // SAFETY: kill(2) on the PID of a child we spawned and have not reaped yet, so the PID
        // cannot have been reused by another process.
        unsafe { libc::kill(c.id() as libc::pid_t, libc::SIGTERM) };
        let deadline = Instant::now() + grace;
        loop {
            if let Some(st) = c.try_wait()? {
                return Ok(st.success());
            }
            if Instant::now() > deadline {
                let _ = c.kill();
                let _ = c.wait();
                return Ok(false);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            // Child::kill signals this child's PID only (SIGKILL), then we reap it.
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// `VmRSS:   12345 kB` -> bytes.
pub fn parse_vm_rss(status: &str) -> Option<u64> {
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kb: u64 = line["VmRSS:".len()..].trim().trim_end_matches("kB").trim().parse().ok()?;
    Some(kb * 1024)
}

/// A TCP port on 127.0.0.1 that is free now, for a listener whose address must be known before it
/// starts (a coop peer, memcached). It is taken from below the kernel's ephemeral range: a port from
/// `bind(port 0)` could be handed out again to any other socket binding port 0 (another daemon's data
/// plane, say) before our listener binds it, which made a test fail with "Address already in use".
/// Ports below the range are never handed out that way. Successive calls in a process return distinct
/// ports (a counter), offset by the process id so that concurrent processes rarely try the same ones.
pub fn free_port() -> Result<u16, DaemonError> {
    static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    const LOWEST: u32 = 10_000;
    let low = ephemeral_range().0 as u32;
    let span = low.saturating_sub(LOWEST);
    for _ in 0..span.min(4096) {
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let port = LOWEST + (std::process::id().wrapping_mul(997).wrapping_add(n)) % span;
        if std::net::TcpListener::bind(("127.0.0.1", port as u16)).is_ok() {
            return Ok(port as u16);
        }
    }
    // No room below the range (an unusual ip_local_port_range): fall back to the kernel's choice.
    let l = std::net::TcpListener::bind("127.0.0.1:0")?;
    Ok(l.local_addr()?.port())
}

/// The kernel's ephemeral port range (`/proc/sys/net/ipv4/ip_local_port_range`), Linux's default when
/// it cannot be read.
pub fn ephemeral_range() -> (u16, u16) {
    let text = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range").unwrap_or_default();
    let mut it = text.split_whitespace().filter_map(|w| w.parse().ok());
    match (it.next(), it.next()) {
        (Some(a), Some(b)) => (a, b),
        _ => (32768, 60999),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn free_ports_are_distinct_and_below_the_ephemeral_range() {
        // Regression: coop tests took peer ports from bind(port 0); another daemon binding port 0 got
        // the same port first and the peer failed with "Address already in use".
        let low = ephemeral_range().0;
        let ports: Vec<u16> = (0..32).map(|_| free_port().unwrap()).collect();
        for p in &ports {
            assert!(*p < low, "port {p} is inside the ephemeral range from {low}");
            std::net::TcpListener::bind(("127.0.0.1", *p)).unwrap();
        }
        let mut sorted = ports.clone();
        sorted.sort_unstable();
        sorted.dedup();
        assert_eq!(sorted.len(), ports.len(), "{ports:?}");
    }

    #[test]
    fn serve_config_puts_each_field_in_its_table() {
        let cfg = ServeConfig {
            data_dir: Path::new("/tmp/d"),
            ready_file: Path::new("/tmp/d/ready.json"),
            unix_socket: "dd.sock",
            host_token: "t",
            top: "ssd_enabled = false\n",
            mem: "capacity_bytes = 4096\n",
            ssd: None,
            extra: "[limits]\nmax_connections = 8\n",
            vms: vec![(1, "d1", "a1", ""), (2, "d2", "a2", "g")],
        };
        let v: toml::Value = toml::from_str(&cfg.to_toml()).unwrap();
        assert_eq!(v["ssd_enabled"].as_bool(), Some(false));
        assert_eq!(v["listen"]["unix_socket"].as_str(), Some("dd.sock"));
        assert_eq!(v["listen"]["ready_file"].as_str(), Some("/tmp/d/ready.json"));
        assert_eq!(v["engine"]["mem"]["capacity_bytes"].as_integer(), Some(4096));
        assert!(v["engine"].get("ssd").is_none());
        assert_eq!(v["limits"]["max_connections"].as_integer(), Some(8));
        let vms = v["vms"].as_array().unwrap();
        assert_eq!(vms.len(), 2);
        assert!(vms[0].get("dedup_group").is_none(), "an empty group is left to the default");
        assert_eq!(vms[1]["dedup_group"].as_str(), Some("g"));
    }

    #[test]
    fn parses_vm_rss() {
        let s = "Name:\tdoubledecker\nVmPeak:\t  100 kB\nVmRSS:\t   20480 kB\nThreads:\t4\n";
        assert_eq!(parse_vm_rss(s), Some(20 * 1024 * 1024));
        assert_eq!(parse_vm_rss("Name: x\n"), None);
    }
}
