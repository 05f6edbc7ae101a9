//! The admin CLI (`vm`, `pool`, `stats`) against a real daemon, as the README uses it.

mod common;

use common::{Daemon, HOST_TOKEN};
use std::process::Command;

fn dd(d: &Daemon, args: &[&str], token: &str) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_doubledecker"))
        .args(args)
        .env("DD_ADMIN_URL", &d.admin)
        .env("DD_ADMIN_TOKEN", token)
        .env("DD_VM_TOKEN", token)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "{args:?}: {}{stdout}", String::from_utf8_lossy(&out.stderr));
    stdout
}

#[test]
fn vm_pool_and_stats_commands_work() {
    let d = Daemon::start(&[], "");
    let cred: serde_json::Value =
        serde_json::from_str(&dd(&d, &["vm", "add", "7", "--mem-weight", "60", "--json"], HOST_TOKEN))
            .unwrap();
    let vm_token = cred["admin_token"].as_str().unwrap();
    assert!(dd(&d, &["vm", "list"], HOST_TOKEN).contains("     7         60"));
    dd(&d, &["vm", "set-weights", "7", "--mem", "80", "--ssd", "20"], HOST_TOKEN);
    let created =
        dd(&d, &["pool", "create", "--store", "hybrid", "--weight", "3", "--ssd-weight", "4"], vm_token);
    assert!(created.contains("created (hybrid 3/4)"), "{created}");
    let pool: String = created.split_whitespace().nth(1).unwrap().to_string();
    dd(&d, &["pool", "set-spec", &pool, "--store", "mem", "--weight", "9"], vm_token);
    assert!(dd(&d, &["pool", "list"], vm_token).contains("mem 9"));
    let host = dd(&d, &["stats"], HOST_TOKEN);
    assert!(host.contains("mode partitioned") && host.contains("mem 9"), "{host}");
    let j: serde_json::Value = serde_json::from_str(&dd(&d, &["stats", "--json", "--vm"], vm_token)).unwrap();
    assert_eq!(j["vm"], 7);
    dd(&d, &["pool", "destroy", &pool], vm_token);
    dd(&d, &["vm", "remove", "7"], HOST_TOKEN);
    assert!(!dd(&d, &["vm", "list"], HOST_TOKEN).contains("     7 "));
}

#[test]
fn config_check_prints_the_effective_configuration() {
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("c.toml");
    std::fs::write(&f, "[engine.mem]\ncapacity_bytes = 1048576\n").unwrap();
    let out =
        Command::new(env!("CARGO_BIN_EXE_doubledecker")).args(["config", "check"]).arg(&f).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8(out.stdout).unwrap();
    let back = dd_server::ServerConfig::from_toml(&text).unwrap();
    assert_eq!(back.engine.mem.capacity_bytes, 1 << 20);
}

#[test]
fn admin_client_errors_keep_the_api_code() {
    use dd_client::admin::{AdminClient, AdminError};
    let mut d = Daemon::start(&[], "");
    let api = AdminClient::new(&d.admin);
    let vms: serde_json::Value = api.call("GET", "/v1/vms", HOST_TOKEN, None).unwrap();
    assert!(vms.is_array() || vms.is_object(), "{vms}");
    match api.call::<serde_json::Value>("GET", "/v1/vms", "not-the-token", None) {
        Err(e @ AdminError::Status { status: 401, .. }) => assert_eq!(e.code(), Some("unauthorized")),
        other => panic!("wrong token: {other:?}"),
    }
    match api.call::<serde_json::Value>("DELETE", "/v1/vms/99", HOST_TOKEN, None) {
        Err(e @ AdminError::Status { .. }) => assert_eq!(e.code(), Some("unknown_vm"), "{e}"),
        other => panic!("unknown VM: {other:?}"),
    }
    // The CLI reports the same code.
    let out = Command::new(env!("CARGO_BIN_EXE_doubledecker"))
        .args(["vm", "remove", "99"])
        .env("DD_ADMIN_URL", &d.admin)
        .env("DD_ADMIN_TOKEN", HOST_TOKEN)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("DELETE /v1/vms/99: HTTP 404 unknown_vm"), "{stderr}");
    // No daemon behind the address: a transport error, not a status.
    let base = d.admin.clone();
    d.stop();
    match AdminClient::new(&base).call::<serde_json::Value>("GET", "/v1/vms", HOST_TOKEN, None) {
        Err(AdminError::Transport { .. }) => {}
        other => panic!("stopped daemon: {other:?}"),
    }
}

/// The admin API reports per VM and per pool both the static entitlement (the weight share) and the
/// effective one (under-used shares lent out by weight), in host and VM scope and in `/metrics`.
#[test]
fn stats_report_static_and_effective_entitlements() {
    use common::{page, vm};
    use dd_engine::{Key, PoolOptions, Spec};
    let (v1, v2) = (vm(1), vm(2));
    let d = Daemon::start(&[&v1, &v2], "");
    // VM 1 (weight 100) barely uses its half of the 4096-page memory store; VM 2 (weight 100) fills
    // the store with two pools of weights 1 and 3.
    let mut c1 = d.tcp_client(&v1);
    let idle = c1.create_cgroup(PoolOptions::ephemeral(Spec::Mem { weight: 1 })).unwrap();
    for i in 0..10 {
        c1.put(idle, Key::new(1, i), &page(1, 1, i)).unwrap();
    }
    let mut c2 = d.tcp_client(&v2);
    let small = c2.create_cgroup(PoolOptions::ephemeral(Spec::Mem { weight: 1 })).unwrap();
    let big = c2.create_cgroup(PoolOptions::ephemeral(Spec::Mem { weight: 3 })).unwrap();
    for i in 0..3000 {
        c2.put(small, Key::new(1, i), &page(2, 1, i)).unwrap();
        c2.put(big, Key::new(2, i), &page(2, 2, i)).unwrap();
    }
    let (status, host) = d.http("GET", "/v1/stats", Some(HOST_TOKEN), None);
    assert_eq!(status, 200, "{host}");
    let vm_of = |id: u64| host["vms"].as_array().unwrap().iter().find(|v| v["vm"] == id).unwrap().clone();
    let (h1, h2) = (vm_of(1), vm_of(2));
    let mem = |v: &serde_json::Value, f: &str| v["totals"]["mem"][f].as_u64().unwrap();
    assert_eq!((mem(&h1, "entitlement"), mem(&h2, "entitlement")), (2048, 2048), "{host}");
    // VM 1 is under-used: its effective entitlement is what it uses, the rest goes to VM 2.
    assert_eq!(mem(&h1, "effective_entitlement"), 10, "{h1}");
    assert_eq!(mem(&h2, "effective_entitlement"), 4096 - 10, "{h2}");
    // VM 2's pools: static 1:3 of 2048; effective adds up to the VM's effective entitlement.
    let pools = h2["pools"].as_array().unwrap();
    let pool_mem = |p: &serde_json::Value, f: &str| p["counters"]["mem"][f].as_u64().unwrap();
    let statics: Vec<u64> = pools.iter().map(|p| pool_mem(p, "entitlement")).collect();
    assert_eq!(statics, [512, 1536], "{h2}");
    let effs: Vec<u64> = pools.iter().map(|p| pool_mem(p, "effective_entitlement")).collect();
    let sum: u64 = effs.iter().sum();
    assert!((4086 - 2..=4086).contains(&sum), "pools' effective entitlements {effs:?} do not add up to 4086");
    // VM scope sees the same numbers for its VM.
    let (status, own) = d.http("GET", "/v1/vm/stats", Some(&v2.admin_token), None);
    assert_eq!(status, 200);
    assert_eq!(own["totals"]["mem"]["effective_entitlement"], h2["totals"]["mem"]["effective_entitlement"]);
    assert_eq!(own["pools"], h2["pools"]);
    // And /metrics.
    let text = d.metrics();
    for line in [
        "dd_vm_effective_entitlement_pages{vm=\"1\",store=\"mem\"} 10",
        "dd_vm_effective_entitlement_pages{vm=\"2\",store=\"mem\"} 4086",
        "dd_vm_entitlement_pages{vm=\"2\",store=\"mem\"} 2048",
    ] {
        assert!(text.contains(line), "no `{line}` in /metrics:\n{text}");
    }
    assert!(text.contains("dd_pool_effective_entitlement_pages{vm=\"2\",pool="), "{text}");
}
