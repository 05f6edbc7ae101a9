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
