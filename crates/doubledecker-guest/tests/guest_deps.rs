//! The guest's crates build without the host's engine (issue 32, acceptance 1; docs/decisions.md D35):
//! `cargo tree` of `dd-client`, `dd-fuse`, `dd-guest`, `dd-provision` and this binary's package, every
//! kind of dependency (normal, build, dev) on every target, names no `dd-engine`, `io-uring` or `lz4`
//! crate, and no other host crate.

use std::process::Command;

/// The package names of `cargo tree -p <each of packages>` (every edge kind, every target).
fn tree(packages: &[&str]) -> Vec<String> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let manifest = concat!(env!("CARGO_MANIFEST_DIR"), "/../../Cargo.toml");
    let mut cmd = Command::new(cargo);
    cmd.args(["tree", "--manifest-path", manifest, "--target", "all", "--prefix", "none"]);
    cmd.args(["--format", "{p}", "--edges", "normal,build,dev"]);
    for p in packages {
        cmd.args(["-p", p]);
    }
    let out = cmd.output().expect("running cargo tree");
    assert!(out.status.success(), "cargo tree failed: {}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8(out.stdout).unwrap();
    let mut names: Vec<String> =
        text.lines().filter_map(|l| l.split_whitespace().next()).map(str::to_string).collect();
    names.sort();
    names.dedup();
    names
}

/// Whether `name` is a crate the guest must not build: the engine, its I/O and codec crates, or a
/// host crate.
fn forbidden(name: &str) -> bool {
    name == "dd-engine"
        || name.starts_with("io-uring")
        || name.contains("lz4")
        || ["dd-server", "dd-bench", "dd-lab", "doubledecker"].contains(&name)
}

#[test]
fn guest_crates_build_no_engine_io_uring_or_lz4() {
    let names = tree(&["dd-client", "dd-fuse", "dd-guest", "dd-provision", "doubledecker-guest"]);
    // The command listed the packages themselves and their vocabulary: an empty or failed listing
    // must not pass.
    for expected in ["dd-client", "dd-fuse", "dd-guest", "dd-provision", "dd-types", "doubledecker-guest"] {
        assert!(names.iter().any(|n| n == expected), "{expected} missing from {names:?}");
    }
    let bad: Vec<&String> = names.iter().filter(|n| forbidden(n)).collect();
    assert!(bad.is_empty(), "the guest's crates depend on host crates: {bad:?}");
}

/// The check sees the engine where it is: the daemon's tree has `dd-engine`, `io-uring` and an LZ4
/// crate.
#[test]
fn the_check_finds_the_engine_in_the_hosts_tree() {
    let names = tree(&["dd-server"]);
    for expected in ["dd-engine", "io-uring"] {
        assert!(names.iter().any(|n| n == expected), "{expected} missing from {names:?}");
    }
    assert!(names.iter().any(|n| n.contains("lz4")), "no lz4 crate in {names:?}");
}
