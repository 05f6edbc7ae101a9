//! A real `doubledecker serve` process for the benchmarks that drive the daemon (`server`, `soak`,
//! `tenants`): [`Daemon`] adds registered VMs, the admin client, RSS sampling and shutdown on top of
//! `dd-daemonkit`'s [`ServeConfig`] (the configuration file) and [`spawn_serve`] (spawn, then wait for
//! the ready file), re-exported here; the integration tests start their daemons with `dd-daemonkit`
//! directly, so that there is one way to configure and start a daemon.
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
use std::path::PathBuf;
use std::process::{Child, Stdio};
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
    #[error(transparent)]
    Start(#[from] StartError),
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

/// The pool the benchmarks load through a daemon (`bench server`, `bench tenants`): an ephemeral memory
/// pool of weight 100 whose gets leave the page, so every get of a filled key space hits; FIFO; the
/// daemon's shard count.
pub fn load_pool() -> dd_engine::PoolOptions {
    dd_engine::PoolOptions {
        exclusive_gets: false,
        ..dd_engine::PoolOptions::ephemeral(dd_engine::Spec::Mem { weight: 100 })
    }
}

/// The host admin token of a benchmark daemon.
pub const HOST_TOKEN: &str = "bench-host-admin-token-000001";

pub use dd_daemonkit::{ephemeral_range, free_port, spawn_serve, Bound, ServeConfig, StartError};

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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_vm_rss() {
        let s = "Name:\tdoubledecker\nVmPeak:\t  100 kB\nVmRSS:\t   20480 kB\nThreads:\t4\n";
        assert_eq!(parse_vm_rss(s), Some(20 * 1024 * 1024));
        assert_eq!(parse_vm_rss("Name: x\n"), None);
    }
}
