//! Harness of the FUSE tests: real cgroups, the real watcher and the real `doubledecker mount` as
//! processes, each behind a guard that cleans up on every exit path (a failing assertion included):
//! processes are signalled by their own PID and reaped, the mount is unmounted (lazily if a process is
//! still inside), cgroups are emptied back into the test's own cgroup and removed.
#![allow(dead_code)]

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The `doubledecker` binary under test: this build's, or `DD_TEST_BINARY` (an older build, to see a
/// regression test fail before its fix).
pub fn dd_bin() -> PathBuf {
    std::env::var_os("DD_TEST_BINARY").map_or_else(|| env!("CARGO_BIN_EXE_doubledecker").into(), Into::into)
}

/// Where containers' cgroups can be made: a v1 memory hierarchy or a v2 one with the memory controller.
#[derive(Clone)]
pub struct CgroupRoot {
    pub root: PathBuf,
    pub v1: bool,
}

/// Why these tests cannot run here, or where cgroups go.
pub fn environment() -> Result<CgroupRoot, String> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Err("not root".into());
    }
    if !Path::new("/dev/fuse").exists() {
        return Err("no /dev/fuse".into());
    }
    let v1 = Path::new("/sys/fs/cgroup/memory/cgroup.procs");
    if v1.exists() {
        return Ok(CgroupRoot { root: "/sys/fs/cgroup/memory".into(), v1: true });
    }
    let ctl = std::fs::read_to_string("/sys/fs/cgroup/cgroup.controllers").unwrap_or_default();
    if ctl.split_whitespace().any(|c| c == "memory") {
        return Ok(CgroupRoot { root: "/sys/fs/cgroup".into(), v1: false });
    }
    Err("no cgroup v1 or v2 memory controller".into())
}

/// Says that a test is skipped for want of `needs` (visible in `.ci/run`; a failure where `.ci/run`
/// declared the machine has them: see `dd_testkit`).
pub use dd_testkit::skipped;

/// Skips (returns None with a message) where FUSE or a memory cgroup controller is unavailable.
pub fn require(test: &str) -> Option<CgroupRoot> {
    match environment() {
        Ok(r) => Some(r),
        Err(why) => {
            let why = format!("{test}: {why} (needs root, /dev/fuse and a memory cgroup controller)");
            skipped(&["root", "fuse", "memcg"], &why);
            None
        }
    }
}

/// The cgroup directory the test process is in now (to return to).
fn own_cgroup(root: &CgroupRoot) -> PathBuf {
    let text = std::fs::read_to_string("/proc/self/cgroup").unwrap();
    let rel = dd_fuse::attrib::parse_proc_cgroup(&text, root.v1).unwrap_or_else(|| "/".into());
    root.root.join(rel.trim_start_matches('/'))
}

/// A parent cgroup with container children, removed on drop.
pub struct Cgroups {
    pub parent: PathBuf,
    pub children: Vec<PathBuf>,
    home: PathBuf,
}

impl Cgroups {
    pub fn new(root: &CgroupRoot, tag: &str, names: &[&str]) -> Cgroups {
        let parent = root.root.join(format!("dd-fuse-{tag}-{}", std::process::id()));
        std::fs::create_dir(&parent).unwrap();
        let mut g = Cgroups { parent: parent.clone(), children: Vec::new(), home: own_cgroup(root) };
        for n in names {
            let c = parent.join(n);
            std::fs::create_dir(&c).unwrap();
            g.children.push(c);
        }
        g
    }

    pub fn child(&self, name: &str) -> PathBuf {
        self.parent.join(name)
    }

    /// Moves the test process (all its threads) into a container.
    pub fn enter(&self, name: &str) {
        std::fs::write(self.child(name).join("cgroup.procs"), std::process::id().to_string()).unwrap();
    }
}

impl Drop for Cgroups {
    fn drop(&mut self) {
        for c in self.children.iter().rev() {
            // Whatever is still inside (this process, or a child of ours being reaped) goes home first.
            if let Ok(procs) = std::fs::read_to_string(c.join("cgroup.procs")) {
                for pid in procs.lines() {
                    let _ = std::fs::write(self.home.join("cgroup.procs"), pid);
                }
            }
            let _ = std::fs::remove_dir(c);
        }
        let _ = std::fs::remove_dir(&self.parent);
    }
}

/// A child process killed and reaped on drop.
pub struct Proc {
    pub child: Option<Child>,
    pub name: String,
}

impl Proc {
    pub fn spawn(name: &str, cmd: &mut Command) -> Proc {
        let child = cmd.stdin(Stdio::null()).spawn().unwrap_or_else(|e| panic!("starting {name}: {e}"));
        Proc { child: Some(child), name: name.into() }
    }

    /// SIGTERM and wait; returns (success, stdout if it was piped).
    pub fn term(&mut self) -> (bool, String) {
        let Some(mut c) = self.child.take() else { return (true, String::new()) };
        // SAFETY: kill(2) on the pid of a child we spawned and have not reaped.
        unsafe { libc::kill(c.id() as libc::pid_t, libc::SIGTERM) };
        let st = c.wait().unwrap();
        let mut out = String::new();
        if let Some(mut o) = c.stdout.take() {
            let _ = o.read_to_string(&mut out);
        }
        (st.success(), out)
    }

    pub fn is_running(&mut self) -> bool {
        self.child.as_mut().is_some_and(|c| matches!(c.try_wait(), Ok(None)))
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

pub fn is_mounted(mountpoint: &Path) -> bool {
    let m = mountpoint.display().to_string();
    std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap_or_default()
        .lines()
        .any(|l| l.split(' ').nth(4) == Some(m.as_str()))
}

/// `doubledecker mount` as a process; unmounted on drop whatever happened.
pub struct MountProc {
    pub proc_: Proc,
    pub mountpoint: PathBuf,
}

impl MountProc {
    pub fn start(backing: &Path, mountpoint: &Path, config: &Path) -> MountProc {
        MountProc::start_logged(backing, mountpoint, config, None)
    }

    /// [`MountProc::start`] with the mount's standard error (its log) written to `log`.
    pub fn start_logged(backing: &Path, mountpoint: &Path, config: &Path, log: Option<&Path>) -> MountProc {
        let mut cmd = Command::new(dd_bin());
        cmd.arg("mount").arg(backing).arg(mountpoint).arg("--config").arg(config).stdout(Stdio::piped());
        if let Some(log) = log {
            cmd.stderr(std::fs::File::create(log).unwrap());
        }
        let mut m =
            MountProc { proc_: Proc::spawn("doubledecker mount", &mut cmd), mountpoint: mountpoint.into() };
        // A bound on start-up, not a timing assertion.
        let deadline = Instant::now() + Duration::from_secs(60);
        while !is_mounted(mountpoint) {
            assert!(m.proc_.is_running(), "doubledecker mount exited before mounting");
            assert!(Instant::now() < deadline, "not mounted after 60 s");
            std::thread::sleep(Duration::from_millis(20));
        }
        m
    }

    /// SIGTERM: returns (clean exit, the containers' counters it printed). Bounded: a mount process
    /// still there after 60 s is detached and killed (the test then fails on the exit status).
    pub fn stop(&mut self) -> (bool, serde_json::Value) {
        let Some(mut c) = self.proc_.child.take() else { return (false, serde_json::Value::Null) };
        // SAFETY: kill(2) on the pid of a child we spawned and have not reaped.
        unsafe { libc::kill(c.id() as libc::pid_t, libc::SIGTERM) };
        let deadline = Instant::now() + Duration::from_secs(60);
        let ok = loop {
            match c.try_wait().unwrap() {
                Some(st) => break st.success(),
                None if Instant::now() > deadline => {
                    let _ = Command::new("umount").arg("-l").arg(&self.mountpoint).status();
                    let _ = c.kill();
                    let _ = c.wait();
                    break false;
                }
                None => std::thread::sleep(Duration::from_millis(20)),
            }
        };
        let mut out = String::new();
        if let Some(mut o) = c.stdout.take() {
            let _ = o.read_to_string(&mut out);
        }
        (ok, serde_json::from_str(out.trim()).unwrap_or(serde_json::Value::Null))
    }
}

impl Drop for MountProc {
    fn drop(&mut self) {
        self.stop();
        if is_mounted(&self.mountpoint) {
            let _ = Command::new("umount").arg("-l").arg(&self.mountpoint).status();
        }
    }
}

/// Waits until `path` exists and `ok` accepts its content (bounded, not a timing assertion).
pub fn wait_for_file(path: &Path, ok: impl Fn(&str) -> bool) -> String {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Ok(t) = std::fs::read_to_string(path) {
            if ok(&t) {
                return t;
            }
        }
        assert!(Instant::now() < deadline, "{} not ready after 60 s", path.display());
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Runs a shell command inside a container's cgroup (the shell moves itself in, then runs it).
pub fn sh_in(cgroup: &Path, script: &str) -> String {
    let full = format!("echo $$ > {}/cgroup.procs && {script}", cgroup.display());
    let out = Command::new("sh").arg("-c").arg(&full).output().unwrap();
    assert!(
        out.status.success(),
        "`{script}` in {} failed: {}",
        cgroup.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// Deterministic pseudo-random bytes.
pub fn bytes(seed: u64, len: usize) -> Vec<u8> {
    use rand::{RngCore, SeedableRng};
    let mut v = vec![0u8; len];
    rand_chacha::ChaCha8Rng::seed_from_u64(seed).fill_bytes(&mut v);
    v
}

/// The mount's configuration file for a daemon at `unix` (VM `vm`).
pub fn mount_config(dir: &Path, unix: &Path, vm: u32, token: &str, parent: &Path, extra: &str) -> PathBuf {
    let p = dir.join("mount.toml");
    std::fs::write(
        &p,
        format!(
            "cgroup_parent = {:?}\nstate_file = {:?}\nattribution_refresh_ms = 100\n{extra}\n\
             [daemon]\nunix_socket = {:?}\nvm = {vm}\ndata_token = {token:?}\n",
            parent.display().to_string(),
            dir.join("pools.json").display().to_string(),
            unix.display().to_string(),
        ),
    )
    .unwrap();
    p
}

/// The watcher's configuration file for a daemon at `unix` (VM `vm`, polling every 100 ms; its state file
/// is the mount's, `dir/pools.json`), with one pool per `(container, store type, weight)`.
pub fn watch_config(
    dir: &Path,
    unix: &Path,
    vm: u32,
    token: &str,
    parent: &Path,
    containers: &[(&str, &str, u32)],
) -> PathBuf {
    let p = dir.join("watch.toml");
    let mut text = format!(
        "cgroup_parent = {:?}\nstate_file = {:?}\npoll_interval_ms = 100\n[daemon]\nunix_socket = {:?}\n\
         vm = {vm}\ndata_token = {token:?}\n",
        parent.display().to_string(),
        dir.join("pools.json").display().to_string(),
        unix.display().to_string(),
    );
    for (name, store, weight) in containers {
        text += &format!("[containers.{name}]\nspec = {{ type = {store:?}, weight = {weight} }}\n");
    }
    std::fs::write(&p, text).unwrap();
    p
}
