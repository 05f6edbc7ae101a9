//! # dd-daemonkit: a real `doubledecker serve` for tests and benchmarks
//!
//! The one way to configure and start a daemon that the integration tests (`crates/doubledecker/tests/
//! common`, `capture.rs`, `coopkit`) and the benchmarks (`dd_bench::daemon`, which adds VMs, RSS
//! sampling and shutdown on top) share: [`ServeConfig`] (the configuration file: loopback listeners on
//! ephemeral ports, a ready file), [`spawn_serve`] (spawn, then wait for the ready file) and
//! [`free_port`] (a port for a listener the caller configures itself). A crate of its own so that a test
//! starts daemons without the benchmarks.
//!
//! Invariants: only the child spawned here is ever signalled, by its PID; a start that fails kills and
//! reaps its child, so no error path leaves a daemon behind.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Errors of starting a daemon.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StartError {
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
}

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
) -> Result<(Child, Bound), StartError> {
    let mut child = Command::new(exe)
        .args(["serve", "--config"])
        .arg(cfg)
        .stdin(Stdio::null())
        .stdout(stdout)
        .stderr(stderr)
        .spawn()
        .map_err(|source| StartError::Spawn { exe: exe.display().to_string(), source })?;
    match wait_ready(&mut child, ready) {
        Ok(b) => Ok((child, b)),
        Err(e) => {
            let _ = child.kill();
            let _ = child.wait();
            Err(e)
        }
    }
}

fn wait_ready(child: &mut Child, ready: &Path) -> Result<Bound, StartError> {
    let limit = Duration::from_secs(60);
    let deadline = Instant::now() + limit;
    loop {
        if let Ok(t) = std::fs::read_to_string(ready) {
            let v: serde_json::Value =
                serde_json::from_str(&t).map_err(|e| StartError::ReadyFile(e.to_string()))?;
            let addr = |k: &str| -> Result<SocketAddr, StartError> {
                v[k].as_str()
                    .and_then(|s| s.parse().ok())
                    .ok_or_else(|| StartError::ReadyFile(format!("no {k} address in {t}")))
            };
            let unix = v["unix"].as_str().filter(|s| !s.is_empty()).map(PathBuf::from);
            return Ok(Bound { tcp: addr("tcp")?, admin: addr("admin")?, unix });
        }
        if let Some(st) = child.try_wait()? {
            return Err(StartError::Exited(st));
        }
        if Instant::now() > deadline {
            return Err(StartError::NotReady(limit));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A TCP port on 127.0.0.1 that is free now, for a listener whose address must be known before it
/// starts (a coop peer, memcached). It is taken from below the kernel's ephemeral range: a port from
/// `bind(port 0)` could be handed out again to any other socket binding port 0 (another daemon's data
/// plane, say) before our listener binds it, which made a test fail with "Address already in use".
/// Ports below the range are never handed out that way. Successive calls in a process return distinct
/// ports (a counter), offset by the process id so that concurrent processes rarely try the same ones.
pub fn free_port() -> std::io::Result<u16> {
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
}
