//! Test harness: starts the real `doubledecker serve` binary on a temporary data folder with
//! ephemeral ports, reads its ready file, and stops it with SIGTERM. The configuration file and the
//! start-up are `dd-daemonkit`'s (`ServeConfig`, `spawn_serve`), which the benchmarks' daemons use too:
//! one way to start a daemon for both; this module adds what tests need on top (Unix socket, restarts,
//! logs, clients).
#![allow(dead_code)]

pub mod raw;

use std::path::PathBuf;
use std::process::{Child, Stdio};

pub const HOST_TOKEN: &str = "host-admin-token-for-tests-0001";

/// The environment variables the commands read an admin URL or a token from (the older names too): a
/// test that runs commands as a user would removes them, so that the runner's own do not leak in.
pub const CLI_ENV_VARS: &[&str] = &[
    "DD_ADMIN_URL",
    "DD_HOST_TOKEN",
    "DD_ADMIN_TOKEN",
    "DD_VM_ADMIN_TOKEN",
    "DD_VM_TOKEN",
    "DD_VM_DATA_TOKEN",
];

#[derive(Clone)]
pub struct TestVm {
    pub id: u32,
    pub data_token: String,
    pub admin_token: String,
    /// `vms[].dedup_group` ("" : the VM's own de-dup domain).
    pub dedup_group: String,
}

pub fn vm(id: u32) -> TestVm {
    TestVm {
        id,
        data_token: format!("data-token-of-vm-{id:04}"),
        admin_token: format!("admin-token-of-vm-{id:04}"),
        dedup_group: String::new(),
    }
}

pub struct Daemon {
    pub child: Option<Child>,
    pub dir: tempfile::TempDir,
    pub tcp: std::net::SocketAddr,
    pub unix: PathBuf,
    pub admin: String,
}

impl Daemon {
    /// Starts a daemon with `vms` registered and `extra` TOML appended to the test configuration.
    pub fn start(vms: &[&TestVm], extra: &str) -> Daemon {
        Daemon::start_with(vms, "", "capacity_bytes = 16777216\n", extra)
    }

    /// [`Daemon::start`] with top-level keys `top` (before any table) and the `[engine.mem]` table's
    /// body `mem` chosen by the test.
    pub fn start_with(vms: &[&TestVm], top: &str, mem: &str, extra: &str) -> Daemon {
        Daemon::start_inner(vms, top, mem, extra, false)
    }

    /// [`Daemon::start_with`] with the daemon's stderr (its log) kept in a file: see [`Daemon::log`].
    pub fn start_logged(vms: &[&TestVm], top: &str, mem: &str, extra: &str) -> Daemon {
        Daemon::start_inner(vms, top, mem, extra, true)
    }

    /// The daemon's log so far (daemons started with [`Daemon::start_logged`]).
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("stderr.log")).expect("a logged daemon")
    }

    fn start_inner(vms: &[&TestVm], top: &str, mem: &str, extra: &str, logged: bool) -> Daemon {
        let dir = tempfile::tempdir().expect("temp dir");
        let ready = dir.path().join("ready.json");
        let cfg = dd_daemonkit::ServeConfig {
            data_dir: dir.path(),
            ready_file: &ready,
            unix_socket: "dd.sock",
            host_token: HOST_TOKEN,
            top,
            mem,
            ssd: Some("capacity_bytes = 16777216\n"),
            extra,
            vms: vms
                .iter()
                .map(|v| (v.id, v.data_token.as_str(), v.admin_token.as_str(), v.dedup_group.as_str()))
                .collect(),
        }
        .to_toml();
        let cfg_path = dir.path().join("dd.toml");
        std::fs::write(&cfg_path, cfg).expect("write config");
        let stderr = if logged {
            Stdio::from(std::fs::File::create(dir.path().join("stderr.log")).expect("log file"))
        } else {
            Stdio::inherit()
        };
        let (child, bound) = spawn_and_wait(&cfg_path, &ready, stderr);
        Daemon {
            child: Some(child),
            tcp: bound.tcp,
            unix: bound.unix.expect("the test daemon listens on a Unix socket"),
            admin: format!("http://{}", bound.admin),
            dir,
        }
    }

    /// SIGKILLs the daemon and starts it again on the same configuration and data directory (a new
    /// instance: its TCP and admin ports may change, the Unix socket path does not).
    pub fn kill_and_restart(&mut self) {
        self.kill();
        self.restart();
    }

    /// SIGKILLs the daemon and reaps it.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Starts the daemon again (after [`Daemon::kill`]) and waits until it is ready.
    pub fn restart(&mut self) {
        let ready = self.dir.path().join("ready.json");
        let _ = std::fs::remove_file(&ready);
        // A logged daemon's log goes on in the same file.
        let log = self.dir.path().join("stderr.log");
        let stderr = match std::fs::OpenOptions::new().append(true).open(&log) {
            Ok(f) => Stdio::from(f),
            Err(_) => Stdio::inherit(),
        };
        let (child, bound) = spawn_and_wait(&self.dir.path().join("dd.toml"), &ready, stderr);
        self.child = Some(child);
        self.tcp = bound.tcp;
        self.admin = format!("http://{}", bound.admin);
    }

    pub fn tcp_client(&self, v: &TestVm) -> dd_client::Client {
        dd_client::Client::connect_tcp(self.tcp, v.id, &v.data_token).expect("tcp connect")
    }

    /// The daemon's process id.
    pub fn pid(&self) -> u32 {
        self.child.as_ref().expect("running").id()
    }

    pub fn unix_client(&self, v: &TestVm) -> dd_client::Client {
        dd_client::Client::connect_unix(&self.unix, v.id, &v.data_token).expect("unix connect")
    }

    /// Where a reconnecting `dd_client::Session` of `v` finds this daemon: its Unix socket, which
    /// stays the same path across restarts.
    pub fn unix_endpoint(&self, v: &TestVm) -> dd_client::Endpoint {
        dd_client::Endpoint {
            unix_socket: Some(self.unix.clone()),
            tcp: None,
            tls: None,
            vm: v.id,
            token: v.data_token.clone(),
        }
    }

    /// SIGTERM, then waits; returns whether the daemon exited successfully.
    pub fn stop(&mut self) -> bool {
        let Some(mut c) = self.child.take() else { return true };
        // SAFETY: kill(2) on the pid of a child we spawned and have not reaped.
        unsafe { libc::kill(c.id() as libc::pid_t, libc::SIGTERM) };
        c.wait().expect("wait for daemon").success()
    }

    /// `GET /metrics` with the host token: the Prometheus text.
    pub fn metrics(&self) -> String {
        ureq::get(&format!("{}/metrics", self.admin))
            .set("Authorization", &format!("Bearer {HOST_TOKEN}"))
            .call()
            .expect("GET /metrics")
            .into_string()
            .expect("metrics text")
    }

    /// An admin API call; returns (status, JSON body or Null).
    pub fn http(
        &self,
        method: &str,
        path: &str,
        token: Option<&str>,
        body: Option<&str>,
    ) -> (u16, serde_json::Value) {
        let url = format!("{}{}", self.admin, path);
        let mut req = ureq::request(method, &url);
        if let Some(t) = token {
            req = req.set("Authorization", &format!("Bearer {t}"));
        }
        let r = match body {
            Some(b) => req.set("Content-Type", "application/json").send_string(b),
            None => req.call(),
        };
        let resp = match r {
            Ok(r) => r,
            Err(ureq::Error::Status(_, r)) => r,
            Err(e) => panic!("{method} {path}: {e}"),
        };
        let status = resp.status();
        let text = resp.into_string().unwrap_or_default();
        (status, serde_json::from_str(&text).unwrap_or(serde_json::Value::Null))
    }
}

/// The `doubledecker` binary under test: this build's, or `DD_TEST_BINARY` (to see a regression test fail
/// against an older build, e.g. one of `main` before a fix).
pub fn dd_bin() -> std::path::PathBuf {
    std::env::var_os("DD_TEST_BINARY").map_or_else(|| env!("CARGO_BIN_EXE_doubledecker").into(), Into::into)
}

/// Starts `doubledecker serve --config cfg` and waits for its ready file (written atomically once every
/// listener is bound); the daemon's stdout is the test's.
fn spawn_and_wait(
    cfg: &std::path::Path,
    ready: &std::path::Path,
    stderr: Stdio,
) -> (Child, dd_daemonkit::Bound) {
    dd_daemonkit::spawn_serve(&dd_bin(), cfg, ready, Stdio::inherit(), stderr)
        .unwrap_or_else(|e| panic!("start doubledecker serve: {e}"))
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// A deterministic page: its content depends on (seed, object, index).
pub fn page(seed: u64, object: u64, index: u64) -> Vec<u8> {
    use rand::{RngCore, SeedableRng};
    let mut r = rand_chacha::ChaCha8Rng::seed_from_u64(
        seed ^ object.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ index << 7,
    );
    let mut p = vec![0u8; 4096];
    r.fill_bytes(&mut p);
    p
}
