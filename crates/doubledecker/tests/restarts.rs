//! Daemon restarts (issue 13, item 1) against the real daemon process, SIGKILLed and started again on
//! the same data directory: run-time registrations survive (kept as token hashes, mode 0600), HELLO
//! returns a new instance id, and a client of a persistent pool is told the pool was lost.

mod common;

use common::*;
use dd_client::{BackoffPolicy, ClientError, PoolRef, Session};
use dd_engine::{Key, PoolOptions, Spec};
use std::os::unix::fs::PermissionsExt;
use std::time::{Duration, Instant};

const DATA_7: &str = "run-time-data-token-0007";
const ADMIN_7: &str = "run-time-admin-token-0007";

fn host(d: &Daemon, method: &str, path: &str, body: Option<&str>) -> (u16, serde_json::Value) {
    d.http(method, path, Some(HOST_TOKEN), body)
}

/// Issue 13: VMs registered at run time through the admin API were gone after a restart, so their
/// tokens stopped working.
#[test]
fn regression_vms_registered_at_run_time_survive_a_restart() {
    let configured = vm(2);
    let mut d = Daemon::start(&[&configured], "");
    let body = format!(r#"{{"id":7,"data_token":"{DATA_7}","admin_token":"{ADMIN_7}","max_pools":5}}"#);
    assert_eq!(host(&d, "POST", "/v1/vms", Some(&body)).0, 201);
    assert_eq!(host(&d, "PUT", "/v1/vms/7/weights", Some(r#"{"mem":30,"ssd":70}"#)).0, 200);
    // VM 8: generated tokens, then replaced; VM 9 registered and removed again; VM 2 (configured)
    // removed at run time.
    let (_, v8) = host(&d, "POST", "/v1/vms", Some(r#"{"id":8}"#));
    let old8 = v8["data_token"].as_str().unwrap().to_string();
    let (_, v8) = host(&d, "POST", "/v1/vms/8/tokens", Some("{}"));
    let new8 = v8["data_token"].as_str().unwrap().to_string();
    assert_eq!(host(&d, "POST", "/v1/vms", Some(r#"{"id":9}"#)).0, 201);
    assert_eq!(host(&d, "DELETE", "/v1/vms/9", None).0, 204);
    assert_eq!(host(&d, "DELETE", "/v1/vms/2", None).0, 204);
    let (_, before) = host(&d, "GET", "/v1/host", None);

    d.kill_and_restart();

    let (_, vms) = host(&d, "GET", "/v1/vms", None);
    let ids: Vec<u64> = vms.as_array().unwrap().iter().map(|v| v["id"].as_u64().unwrap()).collect();
    assert_eq!(ids, vec![7, 8], "run-time VMs kept, removed ones (run-time or configured) stay removed");
    let (_, after) = host(&d, "GET", "/v1/host", None);
    assert_ne!(before["instance"], after["instance"], "a restart is a new instance");
    let (_, v7) = host(&d, "GET", "/v1/vms/7", None);
    assert_eq!(v7["weights"], serde_json::json!({"mem": 30, "ssd": 70}));
    assert_eq!(v7["max_pools"], 5);
    // The guests' tokens work; the replaced and the removed ones do not.
    dd_client::Client::connect_unix(&d.unix, 7, DATA_7).expect("VM 7's data token after the restart");
    dd_client::Client::connect_unix(&d.unix, 8, &new8).expect("VM 8's new token after the restart");
    let refused = |vm, t: &str| dd_client::Client::connect_unix(&d.unix, vm, t).unwrap_err().status();
    assert_eq!(refused(8, &old8), Some(dd_proto::Status::AUTH_FAILED));
    assert_eq!(refused(2, &configured.data_token), Some(dd_proto::Status::AUTH_FAILED));
    assert_eq!(d.http("GET", "/v1/vm/stats", Some(ADMIN_7), None).0, 200, "VM 7's admin token");

    // Kept as hashes, readable by the daemon's user only.
    let file = d.dir.path().join("registrations.json");
    assert_eq!(std::fs::metadata(&file).unwrap().permissions().mode() & 0o777, 0o600);
    let text = std::fs::read_to_string(&file).unwrap();
    for t in [DATA_7, ADMIN_7, &new8, &old8] {
        assert!(!text.contains(t), "a token in clear in {}", file.display());
    }
}

/// Waits (bounded) until the session reaches the daemon again, then runs `f` once more.
fn after_reconnect<T: std::fmt::Debug>(
    s: &mut Session,
    mut f: impl FnMut(&mut Session) -> Result<T, ClientError>,
) -> Result<T, ClientError> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        match f(s) {
            Err(e) if e.is_transport() && Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(20))
            }
            r => return r,
        }
    }
}

/// Issue 13: a persistent (frontswap) pool's pages lost at a restart came back as an ordinary miss:
/// after the restart a new pool of the VM got the old pool's id, and a get on it missed.
#[test]
fn regression_a_persistent_pools_pages_lost_at_a_restart_are_reported_as_lost_not_missed() {
    let v = vm(3);
    let mut d = Daemon::start(&[&v], "");
    let ep = d.unix_endpoint(&v);
    let policy = BackoffPolicy { initial: Duration::from_millis(10), max: Duration::from_millis(200) };
    let mut s = Session::new(ep, policy, "test");
    let pool = s.create_pool(PoolOptions::persistent(Spec::Mem { weight: 100 })).unwrap();
    let key = Key::new(1, 2);
    s.on_pool(pool, |c, id| c.put(id, key, &page(1, 1, 2))).unwrap();
    let mut buf = vec![0u8; 4096];
    assert!(s.on_pool(pool, |c, id| c.get(id, key, &mut buf)).unwrap(), "a persistent page is there");

    d.kill_and_restart();
    // Another frontend of the VM makes a pool on the new instance: it gets the lost pool's id.
    let again = d.unix_client(&v).create_cgroup(PoolOptions::persistent(Spec::Mem { weight: 100 })).unwrap();
    assert_eq!(again, pool.id);

    let r = after_reconnect(&mut s, |s| s.on_pool(pool, |c, id| c.get(id, key, &mut buf)));
    assert!(matches!(r, Err(ClientError::PoolLost { pool: p }) if p == pool.id), "{r:?}");
    assert_eq!(r.unwrap_err().code_name(), "pool_lost");
    // A pool made on the new instance works.
    let fresh = s.create_pool(PoolOptions::persistent(Spec::Mem { weight: 100 })).unwrap();
    assert_ne!(fresh.instance, pool.instance);
    s.on_pool(fresh, |c, id| c.put(id, key, &page(1, 1, 2))).unwrap();
    assert_eq!(
        s.on_pool(PoolRef { id: fresh.id, instance: pool.instance }, |_, _| Ok(())).unwrap_err().code_name(),
        "pool_lost"
    );
}

/// HELLO's instance id is the admin API's, and a version-1 client still gets the version-1 layout.
#[test]
fn hello_returns_the_instance_id_and_version_one_still_works() {
    let v = vm(4);
    let d = Daemon::start(&[&v], "");
    let (_, h) = host(&d, "GET", "/v1/host", None);
    let c = d.unix_client(&v);
    assert_eq!(c.info().version, 2);
    assert_eq!(format!("{:016x}", c.info().instance.unwrap()), h["instance"].as_str().unwrap());
    let mut s = raw::connect(d.tcp);
    std::io::Write::write_all(&mut s, &raw::hello_frame(v.id, &v.data_token)).unwrap();
    let (h, body) = raw::read_frame(&mut s).expect("an answer");
    assert!(h.status().is_ok() && h.version == 1);
    assert_eq!(body.len(), 18, "version 1's HELLO response has no instance id");
}

fn watch_config(d: &Daemon, v: &TestVm, dir: &std::path::Path) -> dd_guest::WatchConfig {
    let mut cfg: dd_guest::WatchConfig = toml::from_str(&format!(
        "cgroup_parent = {:?}\nstate_file = {:?}\n[daemon]\nunix_socket = {:?}\nvm = {}\ndata_token = {:?}\n",
        dir.join("containers").display().to_string(),
        dir.join("pools.json").display().to_string(),
        d.unix.display().to_string(),
        v.id,
        v.data_token
    ))
    .unwrap();
    cfg.containers.insert(
        "db".into(),
        dd_guest::watch::ContainerSettings {
            spec: Spec::Ssd { weight: 7 },
            kind: dd_engine::PoolKind::Persistent,
        },
    );
    std::fs::create_dir_all(dir.join("containers/web")).unwrap();
    std::fs::create_dir_all(dir.join("containers/db")).unwrap();
    cfg
}

/// The daemon's pools, as (spec, kind), in pool id order.
fn pools_on(d: &Daemon, v: &TestVm) -> Vec<(u32, Spec, dd_engine::PoolKind)> {
    let mut c = d.unix_client(v);
    let mut ids = c.list_pools().unwrap();
    ids.sort();
    ids.into_iter()
        .map(|p| {
            let s = c.pool_stats(p).unwrap();
            (p.0, s.spec, s.kind)
        })
        .collect()
}

/// Issue 13: after a daemon restart `guest watch` never noticed that the daemon had no pools, and never
/// created them again (its shutdown then failed with `Broken pipe`).
#[test]
fn regression_the_watcher_recreates_its_pools_with_their_specs_after_a_daemon_restart() {
    let v = vm(5);
    let mut d = Daemon::start(&[&v], "");
    let dir = tempfile::tempdir().unwrap();
    let mut w = dd_guest::Watcher::new(watch_config(&d, &v, dir.path())).unwrap();
    assert_eq!(w.round().unwrap().created, vec!["db".to_string(), "web".to_string()]);
    let first = w.instance();

    d.kill_and_restart();
    // Bounded wait for the reconnection (back-off), not a timing assertion.
    let deadline = Instant::now() + Duration::from_secs(60);
    let ch = loop {
        let ch = w.round().unwrap();
        if !ch.away {
            break ch;
        }
        assert!(Instant::now() < deadline, "the watcher never reached the restarted daemon");
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_eq!(ch.lost, vec!["db".to_string(), "web".to_string()], "{ch:?}");
    assert_eq!(ch.created, vec!["db".to_string(), "web".to_string()], "{ch:?}");
    assert_ne!(w.instance(), first);
    let specs: Vec<(Spec, dd_engine::PoolKind)> =
        pools_on(&d, &v).into_iter().map(|(_, s, k)| (s, k)).collect();
    let mut want = vec![
        (Spec::Ssd { weight: 7 }, dd_engine::PoolKind::Persistent),
        (Spec::Mem { weight: 100 }, dd_engine::PoolKind::Ephemeral),
    ];
    want.sort_by_key(|(s, _)| format!("{s:?}"));
    let mut got = specs.clone();
    got.sort_by_key(|(s, _)| format!("{s:?}"));
    assert_eq!(got, want, "the pools exist again with their specs");
    let st = dd_guest::watch::StateFile::read(&dir.path().join("pools.json")).unwrap();
    assert_eq!(Some(st.instance), w.instance(), "the state file names the new instance");
    assert_eq!(st.pools, *w.pools());
    w.shutdown().unwrap();
    assert!(pools_on(&d, &v).is_empty(), "shutdown destroys the re-created pools");
}

/// Issue 13: a watcher killed and started again created a second set of pools next to the first.
#[test]
fn regression_a_restarted_watcher_adopts_its_pools_instead_of_duplicating_them() {
    let v = vm(6);
    let d = Daemon::start(&[&v], "");
    let dir = tempfile::tempdir().unwrap();
    let mut w = dd_guest::Watcher::new(watch_config(&d, &v, dir.path())).unwrap();
    w.round().unwrap();
    let before = pools_on(&d, &v);
    let owned = w.pools().clone();
    drop(w); // killed: no shutdown, the state file stays

    let mut again = dd_guest::Watcher::new(watch_config(&d, &v, dir.path())).unwrap();
    let ch = again.round().unwrap();
    assert_eq!(ch.adopted, vec!["db".to_string(), "web".to_string()], "{ch:?}");
    assert!(ch.created.is_empty(), "{ch:?}");
    assert_eq!(pools_on(&d, &v), before, "no duplicate pools");
    assert_eq!(*again.pools(), owned);
    again.shutdown().unwrap();
    assert!(pools_on(&d, &v).is_empty());
}
