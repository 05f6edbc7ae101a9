//! `deploy/systemd/`: every unit passes `systemd-analyze verify` (with the unit's binary path pointed at
//! the binary under test, since verify checks that the executable exists), its `config check` step runs
//! as written, and `config check --for KIND` rejects a bad file naming the field.

use std::path::{Path, PathBuf};
use std::process::Command;

const BIN: &str = env!("CARGO_BIN_EXE_doubledecker");
const UNITS: [&str; 5] = [
    "doubledecker.service",
    "doubledecker-guest-watch.service",
    "doubledecker-mount.service",
    "doubledecker-memctl.service",
    "doubledecker-provision.service",
];

fn units_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy/systemd")
}

/// The unit's text with the installed paths replaced by the binary under test and `etc`.
fn localized(unit: &str, etc: &Path) -> String {
    std::fs::read_to_string(units_dir().join(unit))
        .unwrap()
        .replace("/usr/local/bin/doubledecker", BIN)
        .replace("/etc/doubledecker", &etc.display().to_string())
}

#[test]
fn systemd_units_pass_systemd_analyze_verify() {
    let tmp = tempfile::tempdir().unwrap();
    let mut paths = Vec::new();
    for u in UNITS {
        let p = tmp.path().join(u);
        std::fs::write(&p, localized(u, Path::new("/etc/doubledecker"))).unwrap();
        paths.push(p);
    }
    let out = Command::new("systemd-analyze")
        .arg("verify")
        .args(&paths)
        .output()
        .expect("systemd-analyze (Debian package `systemd`; .ci/run installs it)");
    let err = String::from_utf8_lossy(&out.stderr);
    // Unknown keys are only warned about (exit status 0): any output is a finding.
    assert!(out.status.success() && err.trim().is_empty(), "systemd-analyze verify: {}\n{err}", out.status);
}

/// The commands of every `ExecStartPre=` line, with the unit's paths under `etc`.
fn exec_start_pre(unit: &str, etc: &Path) -> Vec<Vec<String>> {
    localized(unit, etc)
        .lines()
        .filter_map(|l| l.strip_prefix("ExecStartPre="))
        .map(|l| l.split_whitespace().map(str::to_string).collect())
        .collect()
}

fn write_configs(etc: &Path) {
    std::fs::create_dir_all(etc).unwrap();
    std::fs::write(etc.join("serve.toml"), "ssd_enabled = false\n").unwrap();
    std::fs::write(
        etc.join("watch.toml"),
        "cgroup_parent = \"/sys/fs/cgroup\"\n[daemon]\ntcp = \"10.0.0.1:7411\"\nvm = 2\n",
    )
    .unwrap();
    std::fs::write(etc.join("mount.toml"), "[daemon]\ntcp = \"10.0.0.1:7411\"\nvm = 2\n").unwrap();
    std::fs::write(
        etc.join("provision.toml"),
        "stats_file = \"s.json\"\nbudgets_file = \"b.json\"\nstate_file = \"p.json\"\nmemory_bytes = 67108864\n\
         [daemon]\ntcp = \"10.0.0.1:7411\"\nvm = 2\n[containers.web]\ntarget = { kind = \"hit_ratio\", ratio = 0.9 }\n",
    )
    .unwrap();
    // `config check --for memctl` checks the parent is a cgroup memory directory of this host: the one
    // the host has (v2's root, or v1's memory controller).
    let parent = if Path::new("/sys/fs/cgroup/cgroup.controllers").exists() {
        "/sys/fs/cgroup"
    } else {
        "/sys/fs/cgroup/memory"
    };
    std::fs::write(
        etc.join("memctl.toml"),
        format!("[cgroup]\nparent = \"{parent}\"\n[pressure]\ntarget_total_usage_bytes = 1073741824\n"),
    )
    .unwrap();
}

#[test]
fn units_config_check_steps_accept_good_files_and_name_the_bad_field() {
    let tmp = tempfile::tempdir().unwrap();
    let etc = tmp.path().join("etc");
    write_configs(&etc);
    let mut checked = 0;
    for u in UNITS {
        for cmd in exec_start_pre(u, &etc) {
            let out = Command::new(&cmd[0])
                .args(&cmd[1..])
                .env("DD_VM_DATA_TOKEN", "data-token-for-the-unit-test")
                .output()
                .unwrap();
            assert!(out.status.success(), "{u}: {cmd:?}: {}", String::from_utf8_lossy(&out.stderr));
            assert!(out.stdout.is_empty(), "{u}: --quiet printed {}", String::from_utf8_lossy(&out.stdout));
            checked += 1;
        }
    }
    assert_eq!(checked, UNITS.len(), "every unit checks its configuration before it starts");

    // A bad value in each kind of file: refused, and the message names the field.
    for (kind, file, text, field) in [
        ("serve", "serve.toml", "[engine.mem]\neviction_batch_pages = 0\n", "eviction_batch_pages"),
        (
            "guest-watch",
            "watch.toml",
            "poll_interval_ms = 0\n[daemon]\ntcp = \"10.0.0.1:1\"\nvm = 2\n",
            "poll_interval_ms",
        ),
        ("mount", "mount.toml", "threads = 0\n", "threads"),
        (
            "guest-provision",
            "provision.toml",
            "stats_file = \"s\"\nbudgets_file = \"b\"\nstate_file = \"p\"\nmemory_bytes = 1\n",
            "memory_bytes",
        ),
        ("memctl", "memctl.toml", "interval_ms = 0\n[cgroup]\nparent = \"/sys/fs/cgroup\"\n", "interval_ms"),
    ] {
        let p = tmp.path().join(format!("bad-{file}"));
        std::fs::write(&p, text).unwrap();
        let out = Command::new(BIN)
            .args(["config", "check", "--for", kind])
            .arg(&p)
            .env("DD_VM_DATA_TOKEN", "data-token-for-the-unit-test")
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "config check --for {kind} accepted {text:?}");
        assert!(err.contains(field), "config check --for {kind}: the message does not name {field}: {err}");
    }
}
