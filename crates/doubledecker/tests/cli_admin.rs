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
