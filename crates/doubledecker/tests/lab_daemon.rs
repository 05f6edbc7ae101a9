//! The lab against a real daemon (lab issue, acceptance 6): the same scenario run with the cache
//! in-process and against `doubledecker serve` gives the same `summary.json` and `timeseries.csv`
//! (neither holds a timing field), so the lab exercises the real service: its admin API (VM
//! registration, weights, capacities, mode) and its data plane (pools, puts, gets, flushes, stats).

mod common;

use dd_lab::results::report;
use dd_lab::sim::remote::{DaemonTarget, DataAddr};
use dd_lab::{bundled, run_scenario, RunOptions};

#[test]
fn a_scenario_gives_the_same_summary_in_process_and_against_the_daemon() {
    // The lab's engine settings (dd_lab::sim::backend::engine_config): 512-byte pages, inline maintenance.
    let mut d = common::Daemon::start(
        &[],
        "[engine]\npage_size_bytes = 512\nmaintenance = \"inline\"\npool_shards = 1\n",
    );
    // Figures 3/4: five variants, global and partitioned modes, containers starting late.
    let sc = bundled::get("fig3-4-global-share").unwrap();
    let local = RunOptions { scale: Some(0.01), ..Default::default() };
    let target = DaemonTarget {
        data: DataAddr::Unix(d.unix.clone()),
        admin: d.admin.trim_start_matches("http://").to_string(),
        host_token: common::HOST_TOKEN.to_string(),
    };
    let remote = RunOptions { daemon: Some(target), ..local.clone() };
    let a = run_scenario(&sc, &local, &mut |_, _| {}).unwrap();
    let b = run_scenario(&sc, &remote, &mut |_, _| {}).unwrap();
    assert!(a.runs.iter().map(|r| r.verified_hits).sum::<u64>() > 0, "the scenario reaches the cache");
    assert_eq!(report::summary_json(&a), report::summary_json(&b));
    assert_eq!(report::timeseries_csv(&a).unwrap(), report::timeseries_csv(&b).unwrap());
    // Every VM the lab registered was removed again after its variant.
    let (status, vms) = d.http("GET", "/v1/vms", Some(common::HOST_TOKEN), None);
    assert_eq!(status, 200);
    assert_eq!(vms.as_array().map(Vec::len), Some(0), "{vms}");
    assert!(d.stop());
}

#[test]
fn a_daemon_with_another_page_size_is_refused() {
    let d = common::Daemon::start(&[], "");
    let sc = bundled::get("fig3-4-global-share").unwrap();
    let opts = RunOptions {
        scale: Some(0.01),
        daemon: Some(DaemonTarget {
            data: DataAddr::Tcp(d.tcp.to_string()),
            admin: d.admin.trim_start_matches("http://").to_string(),
            host_token: common::HOST_TOKEN.to_string(),
        }),
        ..Default::default()
    };
    let e = run_scenario(&sc, &opts, &mut |_, _| {}).unwrap_err();
    assert!(e.to_string().contains("page_size_bytes is 4096"), "{e}");
}

#[test]
fn lab_run_with_daemon_flags_writes_the_same_summary() {
    let mut d = common::Daemon::start(
        &[],
        "[engine]\npage_size_bytes = 512\nmaintenance = \"inline\"\npool_shards = 1\n",
    );
    let out = tempfile::tempdir().unwrap();
    let run = |dir: &str, extra: &[&str]| {
        let st = std::process::Command::new(env!("CARGO_BIN_EXE_doubledecker"))
            .args(["lab", "run", "fig3-4-global-share", "--scale", "0.005", "--quiet", "--out"])
            .arg(out.path().join(dir))
            .args(extra)
            .status()
            .unwrap();
        assert!(st.success(), "lab run {extra:?}");
        std::fs::read_to_string(out.path().join(dir).join("summary.json")).unwrap()
    };
    let local = run("local", &[]);
    let unix = format!("unix:{}", d.unix.display());
    let admin = d.admin.trim_start_matches("http://").to_string();
    let remote = run("daemon", &["--daemon", &unix, "--admin", &admin, "--token", common::HOST_TOKEN]);
    assert_eq!(local, remote);
    assert!(d.stop());
}

/// Issue 31: `lab run --daemon` wanted `--token` or `$DD_HOST_TOKEN` where every other host command
/// falls back to the daemon's token file.
#[test]
fn regression_lab_run_did_not_read_the_token_file() {
    let mut d = common::Daemon::start(
        &[],
        "[engine]\npage_size_bytes = 512\nmaintenance = \"inline\"\npool_shards = 1\n",
    );
    let out = tempfile::tempdir().unwrap();
    let token_file = out.path().join("admin.token");
    std::fs::write(&token_file, format!("{}\n", common::HOST_TOKEN)).unwrap();
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_doubledecker"));
    cmd.args(["lab", "run", "fig3-4-global-share", "--scale", "0.005", "--quiet", "--out"])
        .arg(out.path().join("run"))
        .args(["--daemon", &format!("unix:{}", d.unix.display()), "--admin-url", &d.admin, "--token-file"])
        .arg(&token_file);
    for v in common::CLI_ENV_VARS {
        cmd.env_remove(v);
    }
    let o = cmd.output().unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(out.path().join("run/summary.json").exists());
    assert!(d.stop());
}
