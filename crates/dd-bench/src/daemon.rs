//! A real `doubledecker serve` process for the benchmarks that drive the daemon (`server`, `soak`).
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
        let mut cfg = format!(
            "data_dir = {:?}\nssd_enabled = {}\n[listen]\nunix_socket = \"\"\ntcp = \"127.0.0.1:0\"\n\
             admin = \"127.0.0.1:0\"\nready_file = {:?}\n[auth]\nhost_admin_token = {HOST_TOKEN:?}\n\
             [engine.mem]\ncapacity_bytes = {}\n",
            dir.path().display().to_string(),
            opts.ssd_capacity_bytes > 0,
            ready.display().to_string(),
            opts.mem_capacity_bytes,
        );
        if opts.ssd_capacity_bytes > 0 {
            cfg.push_str(&format!("[engine.ssd]\ncapacity_bytes = {}\n", opts.ssd_capacity_bytes));
        }
        cfg.push_str(&opts.extra_toml);
        cfg.push('\n');
        for v in &opts.vms {
            cfg.push_str(&format!(
                "[[vms]]\nid = {}\ndata_token = {:?}\nadmin_token = {:?}\ndedup_group = {:?}\n",
                v.id, v.data_token, v.admin_token, v.dedup_group
            ));
        }
        let cfg_path = dir.path().join("dd.toml");
        std::fs::write(&cfg_path, cfg)?;
        let child = Command::new(&opts.exe)
            .args(["serve", "--config"])
            .arg(&cfg_path)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .spawn()
            .map_err(|source| DaemonError::Spawn { exe: opts.exe.display().to_string(), source })?;
        let pid = child.id();
        let mut d = Daemon {
            child: Some(child),
            _dir: dir,
            tcp: "127.0.0.1:0".parse().expect("literal"),
            admin: "127.0.0.1:0".parse().expect("literal"),
            pid,
        };
        let (tcp, admin) = d.wait_ready(&ready)?;
        d.tcp = tcp;
        d.admin = admin;
        Ok(d)
    }

    fn wait_ready(&mut self, ready: &Path) -> Result<(SocketAddr, SocketAddr), DaemonError> {
        // A bound on start-up time (opening a large SSD file can take a while), not a timing assertion.
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
                return Ok((addr("tcp")?, addr("admin")?));
            }
            if let Some(st) = self.child.as_mut().expect("running").try_wait()? {
                self.child = None;
                return Err(DaemonError::Exited(st));
            }
            if Instant::now() > deadline {
                return Err(DaemonError::NotReady(limit));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
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
    fn parses_vm_rss() {
        let s = "Name:\tdoubledecker\nVmPeak:\t  100 kB\nVmRSS:\t   20480 kB\nThreads:\t4\n";
        assert_eq!(parse_vm_rss(s), Some(20 * 1024 * 1024));
        assert_eq!(parse_vm_rss("Name: x\n"), None);
    }
}
