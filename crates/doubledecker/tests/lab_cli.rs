//! `doubledecker lab` as a user runs it: output into a closed pipe, and a run killed with SIGKILL.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn lab() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_doubledecker"));
    c.arg("lab");
    c
}

/// A pipe whose reading end is already closed: every write to it fails with EPIPE, as under `| head`
/// once `head` has exited.
fn closed_pipe() -> std::io::PipeWriter {
    let (reader, writer) = std::io::pipe().expect("pipe");
    drop(reader);
    writer
}

/// Issue 13: `lab run ... | head` panicked on the broken pipe (`println!`).
#[test]
fn regression_lab_output_into_a_closed_pipe_does_not_panic() {
    let out = tempfile::tempdir().unwrap();
    let runs: [&[&str]; 2] = [
        &["list"],
        &["run", "fig3-4-global-share", "--scale", "0.01", "--quiet", "--out", out.path().to_str().unwrap()],
    ];
    for args in runs {
        let r = lab().args(args).stdout(closed_pipe()).stderr(Stdio::piped()).output().unwrap();
        let err = String::from_utf8_lossy(&r.stderr);
        assert!(!err.contains("panicked"), "lab {args:?}: {err}");
        assert!(r.status.success(), "lab {args:?}: {:?} {err}", r.status);
    }
    assert!(out.path().join("summary.json").is_file(), "the run wrote its outputs");
}

/// The open file descriptors of `pid` that point into `dir` (an unnamed file shows as
/// `DIR/#INODE (deleted)` or `DIR/NAME (deleted)`).
fn fds_into(pid: u32, dir: &std::path::Path) -> usize {
    let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fd")) else { return 0 };
    fds.filter_map(|e| std::fs::read_link(e.ok()?.path()).ok()).filter(|t| t.starts_with(dir)).count()
}

/// Issue 13: a lab run killed by a signal left its SSD store's scratch file behind (in `/dev/shm`,
/// memory that stayed taken until someone deleted the file).
#[test]
fn regression_a_lab_run_killed_with_sigkill_leaves_no_scratch_file() {
    let base = if std::path::Path::new("/dev/shm").is_dir() { "/dev/shm" } else { "/tmp" };
    let scratch = tempfile::Builder::new().prefix("dd-lab-kill-test").tempdir_in(base).unwrap();
    let out = tempfile::tempdir().unwrap();
    // Every variant of fig9-10 has an SSD store; at this scale a run lasts long enough to be killed.
    let mut child = lab()
        .args(["run", "fig9-10-table2-modes", "--scale", "0.005", "--jobs", "1", "--quiet", "--out"])
        .arg(out.path())
        .arg("--scratch-dir")
        .arg(scratch.path())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(120);
    while fds_into(child.id(), scratch.path()) == 0 {
        assert!(child.try_wait().unwrap().is_none(), "the run ended before its store was seen");
        assert!(Instant::now() < deadline, "no scratch file was opened in {}", scratch.path().display());
        std::thread::sleep(Duration::from_millis(20));
    }
    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();
    let left: Vec<_> = std::fs::read_dir(scratch.path()).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert!(left.is_empty(), "left behind after SIGKILL: {left:?}");
}

/// Issue 27: `lab mixes` writes its table, data and one case file per seed (into a closed pipe, too), and
/// with `--check` its exit status is the verdict the data says.
#[test]
fn lab_mixes_writes_the_table_and_exits_with_the_verdict_under_check() {
    let out = tempfile::tempdir().unwrap();
    let r = lab()
        .args(["mixes", "--seeds", "2", "--scale", "0.01", "--max-candidates", "4", "--jobs", "2", "--check"])
        .args(["--quiet", "--out"])
        .arg(out.path())
        .stdout(closed_pipe())
        .stderr(Stdio::piped())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&r.stderr);
    assert!(!err.contains("panicked"), "{err}");
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.path().join("mixes.json")).unwrap()).unwrap();
    let passed = json["verdicts"]["passed"].as_bool().unwrap();
    assert_eq!(r.status.success(), passed, "{:?} {err}", r.status);
    assert_eq!(json["mixes"][0]["seed"], 2);
    let md = std::fs::read_to_string(out.path().join("mixes.md")).unwrap();
    assert!(md.contains("lab mixes --seeds 2 --scale 0.01") && md.contains("| 2 |"), "{md}");
    assert!(std::fs::read_to_string(out.path().join("mixes.csv")).unwrap().starts_with("seed,"));
    let case = std::fs::read_to_string(out.path().join("mix-2.toml")).unwrap();
    let sc = dd_lab::Scenario::from_toml(&case).unwrap();
    assert!(sc.containers().any(|(_, _, c)| c.target.is_some()), "the case file carries the targets");
}

/// Issue 31: check names quote the paper's sizes ("90% of 1 GiB"); at a reduced scale the output now
/// says that they are the paper's and the run is scaled.
#[test]
fn regression_a_scaled_runs_check_names_read_as_its_own_sizes() {
    let out = tempfile::tempdir().unwrap();
    let r = lab()
        .args(["run", "fig3-4-global-share", "--scale", "0.01", "--quiet", "--jobs", "1", "--out"])
        .arg(out.path())
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&r.stdout);
    assert!(r.status.success(), "{text}");
    assert!(text.contains("this run is at scale 0.01"), "{text}");
}
