//! Test support shared by the workspace's tests (a dev-dependency only; nothing ships with it).
//!
//! # Skips
//! Some tests need something a machine may lack: root, `/dev/fuse`, a memory cgroup controller, O_DIRECT
//! on the scratch file system, io_uring, a program such as `sqlite3`. Where it is missing such a test
//! returns early, and a silent early return would be a pass that tested nothing. So a skip goes through
//! [`skipped`], which
//! * prints `SKIPPED <why>` on standard error and appends it to the file `DD_SKIP_LOG` names (`.ci/run`
//!   prints that file after the tests), and
//! * **fails the test** when every feature the test needs is listed in `DD_REQUIRE_FEATURES`
//!   (comma-separated). `.ci/run` probes the machine and lists what it has, so a test that skips on a
//!   machine with the feature (a broken probe in the test, a regression in the code) is a failure there,
//!   not a silent pass.
//!
//! Feature names: `root`, `fuse` (`/dev/fuse`), `memcg` (a cgroup v1 or v2 memory controller), `odirect`
//! (O_DIRECT on the disk scratch directory), `uring` (io_uring allowed), `shm-tmpfs` (`/dev/shm` is a
//! tmpfs), a program's name for programs (`sqlite3`, `python3`, `fio`); `cgroup-user-xattr` is never
//! probed (a skip for it is only reported).
#![forbid(unsafe_code)]

/// The environment variable `.ci/run` sets to the features the machine has.
pub const REQUIRE_VAR: &str = "DD_REQUIRE_FEATURES";

/// Whether the machine is declared to have every one of `needs` (and so the test must not skip).
pub fn required(needs: &[&str]) -> bool {
    let have = std::env::var(REQUIRE_VAR).unwrap_or_default();
    let have: Vec<&str> = have.split(',').map(str::trim).filter(|f| !f.is_empty()).collect();
    !needs.is_empty() && needs.iter().all(|n| have.contains(n))
}

/// Records that a test is skipped because something in `needs` is missing (see the module docs), or
/// panics if the machine is declared to have all of `needs`.
pub fn skipped(needs: &[&str], why: &str) {
    if required(needs) {
        panic!("would be SKIPPED ({why}), but {REQUIRE_VAR} says this machine has {}", needs.join(", "));
    }
    eprintln!("SKIPPED {why}");
    if let Some(path) = std::env::var_os("DD_SKIP_LOG") {
        use std::io::Write;
        if let Ok(mut f) = std::fs::OpenOptions::new().append(true).create(true).open(path) {
            let _ = writeln!(f, "SKIPPED {why}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // One test: the environment is process-wide, so the cases run in sequence.
    #[test]
    fn a_skip_fails_only_where_every_needed_feature_is_declared() {
        std::env::remove_var("DD_SKIP_LOG"); // this test's own skip is not one `.ci/run` should report
        std::env::set_var(REQUIRE_VAR, "root, fuse,memcg");
        assert!(required(&["root", "fuse"]));
        assert!(!required(&["root", "uring"]));
        assert!(!required(&[]));
        skipped(&["uring"], "dd-testkit self-test: no io_uring"); // declared absent: a plain skip
        let r = std::panic::catch_unwind(|| skipped(&["fuse", "memcg"], "dd-testkit self-test"));
        assert!(r.is_err(), "a skip of a declared feature must fail");
        std::env::remove_var(REQUIRE_VAR);
        assert!(!required(&["root"]));
    }
}
