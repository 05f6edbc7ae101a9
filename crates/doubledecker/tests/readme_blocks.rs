//! The README's shell blocks, run in order in one shell as a newcomer would (issue 18, acceptance 4):
//! the test fails when one of them does not work, naming the README line.
//!
//! What it changes, and why (everything else runs as written):
//! * **Paths it must not touch** get a temporary prefix: absolute paths under `/etc/`, `/srv/`, `/mnt/`,
//!   `/opt/`, `/usr/local/` and `/var/lib/` go under a temporary root (with the directories every
//!   machine has there made in it), and the README's cgroup parent (`.../doubledecker`) gets a name of
//!   this run's own. The blocks run in a temporary copy of the checkout (its top-level entries linked)
//!   whose `target/release/doubledecker` is the binary under test.
//! * **Its own network namespace** (`unshare --net`, loopback up): the README's fixed ports (7411,
//!   7412, 7511...) are this run's own, so other daemons on the machine neither collide nor are reached.
//! * **Commands that would change the machine or rebuild** are shell functions defined before the
//!   blocks: `cargo build --release -p doubledecker` checks that the binary exists, `cargo run --release
//!   -p doubledecker -- ARGS` runs it with ARGS (any other cargo call fails); `apt-get install -y PKGS`
//!   checks that PKGS are installed (it installs nothing); `systemctl daemon-reload` does nothing and
//!   `systemctl enable --now UNITS` checks that each unit was installed under the prefix, starting
//!   nothing (the test machine's systemd is not ours to change, and need not be PID 1; the units
//!   themselves are verified by `deploy_systemd.rs`).
//! * **Blocks that must not run** are marked in the README with `<!-- readme-test: skip (why) -->` on
//!   the line before the fence: few and explicit, so that every new block runs unless someone says why
//!   not. The test prints which it skipped.
//!
//! The shell has `set -eEuo pipefail`: a command that fails stops the run, and the test names the README
//! line it came from. Background processes the blocks leave running are stopped at the end; the mount
//! is unmounted, the cgroups removed.
//!
//! `#[ignore]`d in `./scripts/test` (it takes a few minutes with the release build): `.ci/run`'s
//! `README blocks` section runs it against `target/release/doubledecker` (`DD_TEST_BINARY`). Needs root,
//! /dev/fuse and a memory cgroup controller (the mount section); prints SKIPPED where they are missing.

mod common;
mod fusekit;

use fusekit::{dd_bin, require};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// The marker of a block that must not run, on the line before its fence.
const SKIP_MARKER: &str = "<!-- readme-test: skip";
/// Roots of absolute paths the blocks must not touch on the test machine.
const PREFIXED_ROOTS: &[&str] = &["/etc/", "/srv/", "/mnt/", "/opt/", "/usr/local/", "/var/lib/"];
/// Directories a machine has under those roots (the blocks install into them).
const SKELETON: &[&str] = &["etc/systemd/system", "srv", "mnt", "opt", "usr/local/bin", "var/lib"];
/// The whole run's deadline: generous, a failure to finish is a failure, not a measurement.
const DEADLINE: Duration = Duration::from_secs(30 * 60);

/// One shell block of the README.
#[derive(Debug)]
struct Block {
    /// README line of the first line inside the fence (1-based).
    first_line: usize,
    lines: Vec<String>,
    /// `Some(why)` for a block marked not to run.
    skip: Option<String>,
}

/// The `sh`/`bash`/`shell` fenced blocks of `md`, in order.
fn shell_blocks(md: &str) -> Vec<Block> {
    let lines: Vec<&str> = md.lines().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        let fence = lines[i].trim_start();
        let lang = fence.strip_prefix("```").map(str::trim);
        if let Some(lang) = lang.filter(|l| !l.is_empty()) {
            let shell = matches!(lang, "sh" | "bash" | "shell" | "console");
            let skip = (i > 0)
                .then(|| lines[i - 1].trim())
                .and_then(|prev| prev.strip_prefix(SKIP_MARKER))
                .map(|rest| {
                    rest.trim_end_matches("-->").trim().trim_matches(|c| c == '(' || c == ')').to_string()
                });
            let start = i + 1;
            let mut end = start;
            while end < lines.len() && !lines[end].trim_start().starts_with("```") {
                end += 1;
            }
            if shell {
                out.push(Block {
                    first_line: start + 1,
                    lines: lines[start..end].iter().map(|l| l.to_string()).collect(),
                    skip,
                });
            }
            i = end + 1;
        } else {
            i += 1;
        }
    }
    out
}

/// `line` with the paths it must not touch under `prefix` and the README's cgroup parent renamed.
fn relocate(line: &str, prefix: &Path, cgroup_name: &str) -> String {
    let mut s = line
        .replace("/sys/fs/cgroup/memory/doubledecker", &format!("/sys/fs/cgroup/memory/{cgroup_name}"))
        .replace("/sys/fs/cgroup/doubledecker", &format!("/sys/fs/cgroup/{cgroup_name}"));
    for root in PREFIXED_ROOTS {
        let mut out = String::with_capacity(s.len());
        let mut rest = s.as_str();
        while let Some(pos) = rest.find(root) {
            // Only at the start of a path: not inside another path (`/sys/fs/...`, `dd-data/etc/`).
            let before = rest[..pos].chars().last().or_else(|| out.chars().last());
            let starts_path = before.is_none_or(|c| " \t'\"=(:|>,".contains(c));
            out.push_str(&rest[..pos]);
            if starts_path {
                out.push_str(&prefix.display().to_string());
            }
            out.push_str(root);
            rest = &rest[pos + root.len()..];
        }
        out.push_str(rest);
        s = out;
    }
    s
}

/// The shell functions standing in for commands that would rebuild or change the machine (module
/// documentation).
const SHIMS: &str = r#"
cargo() {
  if [ "$*" = "build --release -p doubledecker" ]; then
    [ -x target/release/doubledecker ] || { echo "readme-test: no target/release/doubledecker" >&2; return 1; }
    return 0
  fi
  if [ "${1:-}" = run ] && [ "${2:-}" = --release ] && [ "${3:-}" = -p ] && [ "${4:-}" = doubledecker ] && [ "${5:-}" = -- ]; then
    shift 5
    target/release/doubledecker "$@"
    return
  fi
  echo "readme-test: unexpected cargo call: cargo $*" >&2
  return 1
}
apt-get() {
  [ "${1:-}" = install ] || { echo "readme-test: unexpected apt-get call: apt-get $*" >&2; return 1; }
  shift
  local p
  for p in "$@"; do
    case "$p" in -*) continue ;; esac
    dpkg-query -W -f='${Status}\n' "$p" 2>/dev/null | grep -q 'install ok installed' \
      || { echo "readme-test: package $p is not installed" >&2; return 1; }
  done
}
systemctl() {
  case "${1:-}" in
    daemon-reload) return 0 ;;
    enable)
      shift
      local u f
      for u in "$@"; do
        case "$u" in -*) continue ;; esac
        case "$u" in *.*) f="$u" ;; *) f="$u.service" ;; esac
        [ -f "$DD_README_PREFIX/etc/systemd/system/$f" ] \
          || { echo "readme-test: unit $f was not installed" >&2; return 1; }
      done ;;
    *) echo "readme-test: unexpected systemctl call: systemctl $*" >&2; return 1 ;;
  esac
}
"#;

/// The script: the shims, then every block that runs, each announced; a failing command prints the
/// script line it failed on (mapped back to the README by the caller). Returns the script and, per
/// script line (0-based), the README line it came from.
fn script(blocks: &[Block], prefix: &Path, cgroup_name: &str) -> (String, Vec<Option<usize>>) {
    let mut text = Vec::<String>::new();
    let mut origin = Vec::new();
    let mut push = |t: String, o: Option<usize>, text: &mut Vec<String>| {
        for l in t.lines() {
            text.push(l.to_string());
            origin.push(o);
        }
    };
    push("set -eEuo pipefail".into(), None, &mut text);
    push(format!("export DD_README_PREFIX='{}'", prefix.display()), None, &mut text);
    push("export PATH=\"$DD_README_PREFIX/usr/local/bin:$PATH\"".into(), None, &mut text);
    push(
        "trap 'echo \"readme-test: FAILED at script line $LINENO: $BASH_COMMAND\" >&2; exit 1' ERR".into(),
        None,
        &mut text,
    );
    push(SHIMS.into(), None, &mut text);
    for b in blocks.iter().filter(|b| b.skip.is_none()) {
        push(format!("echo '::readme block at line {}' >&2", b.first_line), None, &mut text);
        for (k, l) in b.lines.iter().enumerate() {
            push(relocate(l, prefix, cgroup_name), Some(b.first_line + k), &mut text);
        }
    }
    // Background processes the blocks left running (the daemon, the watcher) stop here.
    push("trap - ERR; kill $(jobs -p) 2>/dev/null || true; wait || true".into(), None, &mut text);
    push("echo '::readme blocks done' >&2".into(), None, &mut text);
    (text.join("\n") + "\n", origin)
}

/// Stops what a run left behind: its processes (by process group), the mount, the cgroups.
struct Cleanup {
    pgid: Option<i32>,
    prefix: PathBuf,
    cgroups: Vec<PathBuf>,
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        if let Some(pg) = self.pgid {
            // SAFETY: kill with a negative pid signals the process group we created for the run.
            unsafe { libc::kill(-pg, libc::SIGKILL) };
        }
        let mnt = self.prefix.join("mnt/dd");
        if std::fs::read_to_string("/proc/self/mounts")
            .unwrap_or_default()
            .contains(&mnt.display().to_string())
        {
            let _ = Command::new("umount").arg("-l").arg(&mnt).status();
        }
        for cg in &self.cgroups {
            if let Ok(rd) = std::fs::read_dir(cg) {
                for e in rd.flatten().filter(|e| e.path().is_dir()) {
                    let _ = std::fs::remove_dir(e.path());
                }
            }
            let _ = std::fs::remove_dir(cg);
        }
        let _ = std::fs::remove_dir_all(&self.prefix);
    }
}

/// Runs the README at `readme` (the repository's, or a broken copy) and returns Err(why) when a block
/// does not work.
fn run_readme(readme: &Path, repo: &Path, name: &str) -> Result<String, String> {
    let md = std::fs::read_to_string(readme).unwrap();
    let blocks = shell_blocks(&md);
    let tag = format!("dd-readme-{name}-{}", std::process::id());
    let prefix = std::env::temp_dir().join(&tag);
    let _ = std::fs::remove_dir_all(&prefix);
    let mut cleanup = Cleanup {
        pgid: None,
        prefix: prefix.clone(),
        cgroups: vec![
            PathBuf::from(format!("/sys/fs/cgroup/memory/{tag}")),
            PathBuf::from(format!("/sys/fs/cgroup/{tag}")),
        ],
    };
    for d in SKELETON {
        std::fs::create_dir_all(prefix.join(d)).unwrap();
    }
    // The checkout the blocks run in: its top-level entries linked, target/release/doubledecker the
    // binary under test.
    let work = prefix.join("checkout");
    std::fs::create_dir_all(work.join("target/release")).unwrap();
    for e in std::fs::read_dir(repo).unwrap().flatten() {
        let name = e.file_name();
        if name != "target" && name != ".git" {
            std::os::unix::fs::symlink(e.path(), work.join(&name)).unwrap();
        }
    }
    std::os::unix::fs::symlink(dd_bin(), work.join("target/release/doubledecker")).unwrap();
    for b in blocks.iter().filter(|b| b.skip.is_some()) {
        eprintln!("README block at line {} not run: {}", b.first_line, b.skip.as_deref().unwrap_or(""));
    }
    let (text, origin) = script(&blocks, &prefix, &tag);
    let path = prefix.join("readme.sh");
    std::fs::write(&path, &text).unwrap();
    let log = prefix.join("readme.log");
    // One file description for both streams (appends in order).
    let log_file = std::fs::File::create(&log).unwrap();
    let mut cmd = Command::new("unshare");
    cmd.args(["--net", "sh", "-c", "ip link set lo up && exec bash \"$0\""])
        .arg(&path)
        .current_dir(&work)
        .stdin(Stdio::null())
        .stdout(log_file.try_clone().unwrap())
        .stderr(log_file)
        .process_group(0);
    for v in common::CLI_ENV_VARS {
        cmd.env_remove(v);
    }
    let mut child = cmd.spawn().unwrap();
    cleanup.pgid = Some(child.id() as i32);
    let start = Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break Some(s);
        }
        if start.elapsed() > DEADLINE {
            break None;
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    let output = std::fs::read_to_string(&log).unwrap_or_default();
    drop(cleanup);
    let tail = |o: &str| {
        o.lines().rev().take(40).collect::<Vec<_>>().into_iter().rev().collect::<Vec<_>>().join("\n")
    };
    match status {
        Some(s) if s.success() && output.contains("::readme blocks done") => Ok(output),
        Some(_) => {
            let at = output.lines().find_map(|l| {
                let rest = l.strip_prefix("readme-test: FAILED at script line ")?;
                let (n, cmd) = rest.split_once(": ")?;
                let n: usize = n.parse().ok()?;
                Some((origin.get(n.checked_sub(1)?).copied().flatten(), cmd.to_string()))
            });
            let place = match at {
                Some((Some(line), cmd)) => format!("README.md line {line} failed: {cmd}"),
                Some((None, cmd)) => format!("the runner failed: {cmd}"),
                None => "the run ended early".to_string(),
            };
            Err(format!("{place}\n--- last lines of the run ---\n{}", tail(&output)))
        }
        None => Err(format!("not done within {DEADLINE:?}\n{}", tail(&output))),
    }
}

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..").canonicalize().unwrap()
}

#[test]
#[ignore = "a few minutes with the release build; .ci/run's `README blocks` section runs it"]
fn readme_shell_blocks_run_in_order() {
    if require("readme_shell_blocks_run_in_order").is_none() {
        return;
    }
    let repo = repo_root();
    match run_readme(&repo.join("README.md"), &repo, "ok") {
        Ok(out) => {
            let n = out.lines().filter(|l| l.starts_with("::readme block at line")).count();
            eprintln!("{out}\n{n} README blocks ran");
            assert!(n >= 8, "only {n} blocks ran:\n{out}");
        }
        Err(why) => panic!("{why}"),
    }
}

/// The runner must be able to fail: the README with one block broken (a command changed into one that
/// does not exist) is reported, at that line. Only the blocks up to the broken one run.
#[test]
#[ignore = "runs the README's first blocks with the release build; .ci/run's `README blocks` section runs it"]
fn a_broken_readme_block_fails_the_run_at_its_line() {
    if require("a_broken_readme_block_fails_the_run_at_its_line").is_none() {
        return;
    }
    let repo = repo_root();
    let md = std::fs::read_to_string(repo.join("README.md")).unwrap();
    let needle = "doubledecker pool create --store mem --weight 100";
    let line = md.lines().position(|l| l.contains(needle)).expect("the README creates a pool") + 1;
    let broken = md.replacen(needle, "doubledecker pool create --store nvram --weight 100", 1);
    let dir = std::env::temp_dir().join(format!("dd-readme-broken-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let copy = dir.join("README.md");
    std::fs::write(&copy, broken).unwrap();
    let r = run_readme(&copy, &repo, "broken");
    let _ = std::fs::remove_dir_all(&dir);
    let why = r.expect_err("a README whose pool create names an unknown store ran through");
    eprintln!("the broken README was refused as it must be: {}", why.lines().next().unwrap_or(""));
    assert!(why.contains(&format!("README.md line {line} failed")), "{why}");
}

#[test]
fn blocks_are_found_with_their_lines_and_skip_markers() {
    let md = "text\n```sh\necho a\n```\n<!-- readme-test: skip (runs forever) -->\n```sh\nserve\n```\n```rust\nx\n```\n```toml\ny\n```\n";
    let b = shell_blocks(md);
    assert_eq!(b.len(), 2);
    assert_eq!(
        (b[0].first_line, b[0].lines.clone(), b[0].skip.clone()),
        (3, vec!["echo a".to_string()], None)
    );
    assert_eq!(b[1].skip.as_deref(), Some("runs forever"));
}

#[test]
fn paths_it_must_not_touch_get_the_prefix() {
    let p = Path::new("/tmp/x");
    assert_eq!(
        relocate("install -d /etc/doubledecker && mkdir -p /srv/dd-backing /mnt/dd", p, "t"),
        "install -d /tmp/x/etc/doubledecker && mkdir -p /tmp/x/srv/dd-backing /tmp/x/mnt/dd"
    );
    assert_eq!(
        relocate("data_dir = \"/var/lib/doubledecker\"|", p, "t"),
        "data_dir = \"/tmp/x/var/lib/doubledecker\"|"
    );
    assert_eq!(relocate("CG=/sys/fs/cgroup/memory/doubledecker", p, "t"), "CG=/sys/fs/cgroup/memory/t");
    // Not inside another path, not the cgroup hierarchy or /dev.
    assert_eq!(
        relocate("cat dd-data/etc/x /dev/urandom /sys/fs/cgroup/cgroup.procs", p, "t"),
        "cat dd-data/etc/x /dev/urandom /sys/fs/cgroup/cgroup.procs"
    );
}
