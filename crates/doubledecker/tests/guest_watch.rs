//! The cgroup watcher against the real daemon: directories shaped like a cgroup parent appear, change
//! annotation and disappear; the daemon's pools follow, and shutdown leaves nothing behind.

mod common;

use common::*;
use dd_engine::{PoolKind, Spec};
use dd_guest::{watch::ContainerSettings, WatchConfig, Watcher};
use std::path::{Path, PathBuf};
use std::process::Command;

fn set_annotation(dir: &Path, value: &str) -> bool {
    use std::os::unix::ffi::OsStrExt;
    let path = std::ffi::CString::new(dir.as_os_str().as_bytes()).unwrap();
    // SAFETY: NUL-terminated strings and a valid value buffer of the given length.
    unsafe {
        libc::setxattr(
            path.as_ptr(),
            c"user.doubledecker.spec".as_ptr(),
            value.as_ptr().cast(),
            value.len(),
            0,
        ) == 0
    }
}

#[test]
fn pools_follow_cgroups_and_shutdown_leaves_nothing() {
    let v = vm(2);
    let d = Daemon::start(&[&v], "");
    let groups = tempfile::tempdir().unwrap();
    let state = groups.path().join("pools.json");
    let mut cfg: WatchConfig = toml::from_str(&format!(
        "cgroup_parent = {:?}\nstate_file = {:?}\n[daemon]\nunix_socket = {:?}\nvm = 2\ndata_token = {:?}\n",
        groups.path().join("containers").display().to_string(),
        state.display().to_string(),
        d.unix.display().to_string(),
        v.data_token
    ))
    .unwrap();
    cfg.containers
        .insert("db".into(), ContainerSettings { spec: Spec::Ssd { weight: 7 }, kind: PoolKind::Persistent });
    let parent = groups.path().join("containers");
    std::fs::create_dir_all(parent.join("web")).unwrap();
    std::fs::create_dir_all(parent.join("db")).unwrap();
    let mut w = Watcher::new(cfg).unwrap();
    let ch = w.round().unwrap();
    assert_eq!(ch.created, vec!["db".to_string(), "web".to_string()]);

    let mut client = d.unix_client(&v);
    let mut listed = client.list_pools().unwrap();
    listed.sort();
    let mut ours: Vec<_> = w.pools().values().map(|o| o.pool).collect();
    ours.sort();
    assert_eq!(listed, ours, "the daemon holds exactly the watcher's pools");
    let db = client.pool_stats(w.pools()["db"].pool).unwrap();
    assert_eq!((db.spec, db.kind), (Spec::Ssd { weight: 7 }, PoolKind::Persistent));
    let web = client.pool_stats(w.pools()["web"].pool).unwrap();
    assert_eq!(web.spec, Spec::Mem { weight: 100 }, "unconfigured containers get the default spec");
    // Each pool carries its container's name (SET_LABEL), for the admin API, /metrics and /ui/.
    assert_eq!((db.label.as_deref(), web.label.as_deref()), (Some("db"), Some("web")));
    // The state file publishes the map for the other guest frontends.
    let published: serde_json::Value = serde_json::from_slice(&std::fs::read(&state).unwrap()).unwrap();
    assert_eq!(published["pools"]["web"]["pool"], web.pool.0);
    assert_eq!(published["instance"], client.info().instance.unwrap(), "and the daemon instance they are of");

    // An annotation overrides the configuration (where the file system has user xattrs).
    if set_annotation(&parent.join("web"), "hybrid:3:1") {
        let ch = w.round().unwrap();
        assert_eq!(ch.respecified, vec!["web".to_string()]);
        let web = client.pool_stats(w.pools()["web"].pool).unwrap();
        assert_eq!(web.spec, Spec::Hybrid { mem_weight: 3, ssd_weight: 1 });
    } else {
        // Not probed by .ci/run (user xattrs on cgroupfs depend on the kernel): visible, never fatal.
        dd_testkit::skipped(
            &["cgroup-user-xattr"],
            "guest_watch: no user xattrs on cgroupfs, annotation step",
        );
    }

    // A cgroup goes: its pool goes; a new one comes: a new pool.
    let old_web = w.pools()["web"].pool;
    std::fs::remove_dir(parent.join("web")).unwrap();
    std::fs::create_dir(parent.join("batch")).unwrap();
    let ch = w.round().unwrap();
    assert_eq!(ch.destroyed, vec!["web".to_string()]);
    assert_eq!(ch.created, vec!["batch".to_string()]);
    assert!(client.pool_stats(old_web).is_err(), "the destroyed pool is gone on the daemon");
    assert_eq!(w.round().unwrap(), Default::default(), "a quiet round changes nothing");

    w.shutdown().unwrap();
    assert!(client.list_pools().unwrap().is_empty(), "shutdown destroys every pool it created");
    assert!(!state.exists(), "and removes its state file");
}

/// A hierarchy under `dir` with one container cgroup, `c/one`, and a watcher configuration for VM `vm`
/// of daemon `d` over TCP; returns the configuration's path.
fn one_container_config(dir: &Path, d: &Daemon, vm: u32) -> PathBuf {
    std::fs::create_dir_all(dir.join("c/one")).unwrap();
    let cfg_path = dir.join("watch.toml");
    std::fs::write(
        &cfg_path,
        format!(
            "cgroup_parent = {:?}\nstate_file = {:?}\n[daemon]\ntcp = {:?}\nvm = {vm}\n",
            dir.join("c").display().to_string(),
            dir.join("s.json").display().to_string(),
            d.tcp.to_string()
        ),
    )
    .unwrap();
    cfg_path
}

#[test]
fn the_cli_runs_one_round() {
    let v = vm(3);
    let d = Daemon::start(&[&v], "");
    let groups = tempfile::tempdir().unwrap();
    let cfg_path = one_container_config(groups.path(), &d, 3);
    let out = Command::new(env!("CARGO_BIN_EXE_doubledecker"))
        .args(["guest", "watch", "--once", "--config"])
        .arg(&cfg_path)
        .env("DD_VM_DATA_TOKEN", &v.data_token)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stdout).contains("\"created\":[\"one\"]"));
    assert_eq!(d.tcp_client(&v).list_pools().unwrap().len(), 1);
    // Without a token the configuration is rejected with the field named.
    let out = Command::new(env!("CARGO_BIN_EXE_doubledecker"))
        .args(["guest", "watch", "--once", "--config"])
        .arg(&cfg_path)
        .env_remove("DD_VM_DATA_TOKEN")
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("daemon.data_token"));
}

/// Issue 31: `guest watch` for a VM the daemon does not know logged "going on without it, retrying
/// with back-off", then exited. Now it says the daemon refused it, and exits with the reason.
#[test]
fn regression_an_unregistered_vm_was_told_the_watcher_goes_on() {
    let d = Daemon::start(&[&vm(3)], "");
    let groups = tempfile::tempdir().unwrap();
    let cfg_path = one_container_config(groups.path(), &d, 9);
    let out = Command::new(env!("CARGO_BIN_EXE_doubledecker"))
        .args(["guest", "watch", "--once", "--config"])
        .arg(&cfg_path)
        .env("DD_VM_DATA_TOKEN", "not-a-registered-vms-token")
        .env("RUST_LOG", "warn")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(!err.contains("going on without it"), "{err}");
    assert!(err.contains("refused"), "{err}");
}
