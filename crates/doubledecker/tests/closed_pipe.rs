//! No command panics when its reader goes away (`doubledecker lab list | head -1`, `... 2>&1 | head`):
//! every command runs here with standard output and standard error both pipes whose read ends are
//! closed, and must end with its normal exit status (0), never the panic status 101. The daemon, the
//! watcher and the memory controller must also go on working with nobody reading them.

mod common;

use common::*;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// A pipe whose read end is already closed: every write to it fails with `EPIPE`.
fn closed() -> Stdio {
    let (reader, writer) = std::io::pipe().expect("pipe");
    drop(reader);
    Stdio::from(writer)
}

fn dd() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_doubledecker"));
    c.stdin(Stdio::null()).stdout(closed()).stderr(closed());
    c
}

#[track_caller]
fn runs_cleanly(args: &[&str], env: &[(&str, &str)]) {
    let mut c = dd();
    c.args(args);
    for (k, v) in env {
        c.env(k, v);
    }
    let status = c.status().expect("spawn doubledecker");
    assert_ne!(status.code(), Some(101), "{args:?} panicked on a closed pipe");
    assert!(status.success(), "{args:?} failed on a closed pipe: {status}");
}

#[test]
fn closed_pipe_never_panics() {
    let tmp = tempfile::tempdir().unwrap();
    let p = |name: &str| tmp.path().join(name).display().to_string();
    std::fs::write(p("t.csv"), "time,page\n1,17\n2,18\n3,17\n").unwrap();
    std::fs::write(p("serve.toml"), "ssd_enabled = false\n").unwrap();

    // Commands without a daemon.
    for args in [
        vec!["--help"],
        vec!["vm", "--help"],
        vec!["--version"],
        vec!["lab", "list"],
        vec!["config", "default"],
        vec!["config", "check", &p("serve.toml")],
        vec!["mrc", "--trace", &p("t.csv"), "--column", "2", "--method", "exact", "--sizes", "1,2"],
        vec!["mrc", "--trace", &p("t.csv"), "--column", "2", "--method", "exact", "--sizes", "1,2", "--json"],
        vec!["bench", "store", "--seconds", "0.01", "--working-set-pages", "64"],
    ] {
        runs_cleanly(&args, &[]);
    }

    // The admin commands against a real daemon.
    let v = vm(3);
    let d = Daemon::start(&[&v], "");
    let host =
        [("DD_ADMIN_URL", d.admin.as_str()), ("DD_HOST_TOKEN", HOST_TOKEN), ("DD_ADMIN_TOKEN", HOST_TOKEN)];
    runs_cleanly(&["vm", "add", "4"], &host);
    runs_cleanly(&["vm", "list"], &host);
    runs_cleanly(&["stats"], &host);
    runs_cleanly(&["stats", "--json"], &host);
    let vm_env = [
        ("DD_ADMIN_URL", d.admin.as_str()),
        ("DD_VM_ADMIN_TOKEN", v.admin_token.as_str()),
        ("DD_VM_TOKEN", v.admin_token.as_str()),
    ];
    runs_cleanly(&["pool", "create", "--store", "mem", "--weight", "10"], &vm_env);
    runs_cleanly(&["pool", "list"], &vm_env);
    runs_cleanly(&["stats", "--vm"], &vm_env);

    // `guest watch --once` prints its changes as JSON.
    let parent = tmp.path().join("cg");
    std::fs::create_dir_all(parent.join("web")).unwrap();
    std::fs::write(
        p("watch.toml"),
        format!(
            "cgroup_parent = {:?}\nstate_file = {:?}\n[daemon]\nunix_socket = {:?}\nvm = 3\n",
            parent.display().to_string(),
            p("pools.json"),
            d.unix.display().to_string()
        ),
    )
    .unwrap();
    runs_cleanly(
        &["guest", "watch", "--config", &p("watch.toml"), "--once"],
        &[("DD_VM_DATA_TOKEN", &v.data_token)],
    );
}

/// The daemon says where it listens on standard error; with nobody reading, it must still serve and
/// stop cleanly.
#[test]
fn serve_survives_closed_output_streams() {
    let tmp = tempfile::tempdir().unwrap();
    let ready = tmp.path().join("ready.json");
    let cfg = tmp.path().join("dd.toml");
    std::fs::write(
        &cfg,
        format!(
            "data_dir = {:?}\nssd_enabled = false\n[listen]\ntcp = \"127.0.0.1:0\"\nadmin = \"127.0.0.1:0\"\nready_file = {:?}\n",
            tmp.path().display().to_string(),
            ready.display().to_string()
        ),
    )
    .unwrap();
    let mut child = dd().args(["serve", "--config"]).arg(&cfg).spawn().unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    while !ready.exists() {
        if let Some(s) = child.try_wait().unwrap() {
            panic!("serve exited with closed output streams: {s}");
        }
        assert!(Instant::now() < deadline, "serve did not become ready");
        std::thread::sleep(Duration::from_millis(20));
    }
    let bound: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&ready).unwrap()).unwrap();
    let health = ureq::get(&format!("http://{}/healthz", bound["admin"].as_str().unwrap())).call().unwrap();
    assert_eq!(health.status(), 200);
    // SAFETY: kill(2) on the pid of a child we spawned and have not reaped.
    unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGTERM) };
    let status = child.wait().unwrap();
    assert!(status.success(), "serve did not stop cleanly: {status}");
}
