//! The controller on temporary directories shaped like cgroup v1 and v2 hierarchies, with a small
//! "kernel" that reclaims page cache when a limit is lowered or `memory.reclaim` is written, and with
//! injected errors: `EBUSY`, `EAGAIN`, `ENOENT` and a cgroup vanishing mid-round. Whatever happens, every
//! v1 limit the controller lowered is restored and the controller carries on.

use dd_memctl::cgroup::{CgroupIo, RealIo};
use dd_memctl::daemon::{CgroupConfig, ContainerConfig, Controller, MemctlConfig, VersionSetting};
use dd_memctl::decide::{DecisionConfig, Policy, MIB};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

const UNLIMITED_V1: &str = "9223372036854771712";

#[derive(Clone, Copy, PartialEq, Eq)]
enum Op {
    Read,
    Write,
}

struct Rule {
    suffix: String,
    op: Op,
    errno: i32,
    /// How many more times to fire (usize::MAX = always).
    times: usize,
    /// Delete the cgroup directory instead of returning an error.
    vanish: bool,
    /// Matching operations to let through before firing.
    skip: usize,
}

/// Real files plus a kernel model and fault injection.
struct FakeKernel {
    io: RealIo,
    rules: Mutex<Vec<Rule>>,
    /// Every write to a limit file, in order (path, value).
    limit_writes: Mutex<Vec<(PathBuf, String)>>,
}

fn read_u64(p: &Path) -> u64 {
    std::fs::read_to_string(p).unwrap().trim().parse().unwrap()
}

impl FakeKernel {
    fn new() -> Self {
        FakeKernel { io: RealIo, rules: Mutex::new(Vec::new()), limit_writes: Mutex::new(Vec::new()) }
    }

    fn inject(&self, suffix: &str, op: Op, errno: i32, times: usize) {
        self.rules.lock().unwrap().push(Rule {
            suffix: suffix.into(),
            op,
            errno,
            times,
            vanish: false,
            skip: 0,
        });
    }

    /// Lets the next write to `suffix` through, then fails `times` writes with `errno`.
    fn inject_after_first_write(&self, suffix: &str, errno: i32, times: usize) {
        self.rules.lock().unwrap().push(Rule {
            suffix: suffix.into(),
            op: Op::Write,
            errno,
            times,
            vanish: false,
            skip: 1,
        });
    }

    fn vanish_on(&self, suffix: &str) {
        self.rules.lock().unwrap().push(Rule {
            suffix: suffix.into(),
            op: Op::Write,
            errno: 0,
            times: 1,
            vanish: true,
            skip: 0,
        });
    }

    fn check(&self, path: &Path, op: Op) -> io::Result<()> {
        let mut rules = self.rules.lock().unwrap();
        for r in rules.iter_mut() {
            if r.op == op && r.times > 0 && path.to_string_lossy().ends_with(&r.suffix) {
                if r.skip > 0 {
                    r.skip -= 1;
                    continue;
                }
                if r.times != usize::MAX {
                    r.times -= 1;
                }
                if r.vanish {
                    std::fs::remove_dir_all(path.parent().unwrap()).unwrap();
                    return Err(io::Error::from_raw_os_error(2));
                }
                return Err(io::Error::from_raw_os_error(r.errno));
            }
        }
        Ok(())
    }

    /// Reclaims up to `bytes` of page cache of the cgroup in `dir`.
    fn reclaim_cache(dir: &Path, bytes: u64) -> u64 {
        let usage_file =
            if dir.join("memory.current").exists() { "memory.current" } else { "memory.usage_in_bytes" };
        let stat = std::fs::read_to_string(dir.join("memory.stat")).unwrap();
        let key = if usage_file == "memory.current" { "file" } else { "total_cache" };
        let cache: u64 = stat
            .lines()
            .find_map(|l| l.strip_prefix(&format!("{key} ")).map(|v| v.trim().parse().unwrap()))
            .unwrap();
        let take = bytes.min(cache);
        let usage = read_u64(&dir.join(usage_file));
        std::fs::write(dir.join(usage_file), (usage - take).to_string()).unwrap();
        std::fs::write(dir.join("memory.stat"), format!("{key} {}\n", cache - take)).unwrap();
        take
    }
}

impl CgroupIo for FakeKernel {
    fn read(&self, path: &Path) -> io::Result<String> {
        self.check(path, Op::Read)?;
        self.io.read(path)
    }
    fn write(&self, path: &Path, data: &str) -> io::Result<()> {
        self.check(path, Op::Write)?;
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        let dir = path.parent().unwrap();
        if !dir.exists() {
            return Err(io::Error::from_raw_os_error(2));
        }
        match name.as_str() {
            "memory.limit_in_bytes" => {
                self.limit_writes.lock().unwrap().push((path.to_path_buf(), data.to_string()));
                let limit: u64 = data.trim().parse().map_err(|_| io::Error::from_raw_os_error(22))?;
                let usage = read_u64(&dir.join("memory.usage_in_bytes"));
                if limit < usage {
                    FakeKernel::reclaim_cache(dir, usage - limit);
                }
                self.io.write(path, data)
            }
            "memory.reclaim" => {
                let want: u64 = data.trim().parse().map_err(|_| io::Error::from_raw_os_error(22))?;
                if FakeKernel::reclaim_cache(dir, want) < want {
                    return Err(io::Error::from_raw_os_error(11));
                }
                Ok(())
            }
            _ => self.io.write(path, data),
        }
    }
    fn children(&self, path: &Path) -> io::Result<Vec<PathBuf>> {
        self.io.children(path)
    }
}

fn make_v1(root: &Path, groups: &[(&str, u64)]) {
    std::fs::write(root.join("memory.limit_in_bytes"), UNLIMITED_V1).unwrap();
    std::fs::write(root.join("memory.usage_in_bytes"), "0").unwrap();
    for (name, mib) in groups {
        let d = root.join(name);
        std::fs::create_dir_all(&d).unwrap();
        std::fs::write(d.join("memory.usage_in_bytes"), (mib * MIB).to_string()).unwrap();
        std::fs::write(d.join("memory.limit_in_bytes"), UNLIMITED_V1).unwrap();
        std::fs::write(d.join("memory.soft_limit_in_bytes"), UNLIMITED_V1).unwrap();
        std::fs::write(d.join("memory.stat"), format!("total_cache {}\n", mib * MIB)).unwrap();
    }
}

fn make_v2(root: &Path, groups: &[(&str, u64)]) {
    std::fs::write(root.join("cgroup.controllers"), "memory").unwrap();
    for (name, mib) in groups {
        let d = root.join(name);
        std::fs::create_dir_all(&d).unwrap();
        std::fs::write(d.join("memory.current"), (mib * MIB).to_string()).unwrap();
        std::fs::write(d.join("memory.max"), "max").unwrap();
        std::fs::write(d.join("memory.low"), "0").unwrap();
        std::fs::write(d.join("memory.reclaim"), "").unwrap();
        std::fs::write(d.join("memory.stat"), format!("file {}\n", mib * MIB)).unwrap();
    }
}

fn config(root: &Path, version: VersionSetting, target_mib: u64) -> MemctlConfig {
    let mut cfg = MemctlConfig {
        cgroup: CgroupConfig { parent: root.to_path_buf(), version },
        decision: DecisionConfig { policy: Policy::Proportional, chunk_cap_bytes: 50 * MIB },
        v1_hold_ms: 0,
        max_requests_per_round: 1000,
        ..Default::default()
    };
    cfg.pressure.target_total_usage_bytes = target_mib * MIB;
    for (n, w) in [("a", 4), ("b", 2), ("c", 1)] {
        cfg.containers.insert(n.into(), ContainerConfig { weight: w, class: Default::default() });
    }
    cfg
}

fn usage_mib(root: &Path, name: &str) -> f64 {
    let f = if root.join(name).join("memory.current").exists() {
        "memory.current"
    } else {
        "memory.usage_in_bytes"
    };
    read_u64(&root.join(name).join(f)) as f64 / MIB as f64
}

fn assert_limits_unlimited(root: &Path) {
    for e in std::fs::read_dir(root).unwrap() {
        let d = e.unwrap().path();
        if d.is_dir() {
            let l = std::fs::read_to_string(d.join("memory.limit_in_bytes")).unwrap();
            assert_eq!(l.trim(), UNLIMITED_V1, "limit of {} left lowered", d.display());
        }
    }
}

fn assert_ratio_4_2_1(root: &Path, tolerance: f64) {
    let (a, b, c) = (usage_mib(root, "a"), usage_mib(root, "b"), usage_mib(root, "c"));
    assert!(((a / c) / 4.0 - 1.0).abs() <= tolerance, "a:c = {a}:{c}");
    assert!(((b / c) / 2.0 - 1.0).abs() <= tolerance, "b:c = {b}:{c}");
}

#[test]
fn v1_reclaims_to_the_weight_ratio_and_restores_every_limit() {
    let dir = tempfile::tempdir().unwrap();
    make_v1(dir.path(), &[("a", 1000), ("b", 1000), ("c", 1000)]);
    let kernel = FakeKernel::new();
    let mut ctl = Controller::new(config(dir.path(), VersionSetting::Auto, 1400), kernel).unwrap();
    let r = ctl.round(None);
    assert!(r.errors.is_empty(), "{:?}", r.errors);
    assert_eq!(r.need_bytes, 1600 * MIB);
    assert_ratio_4_2_1(dir.path(), 0.05);
    assert_limits_unlimited(dir.path());
    // Every lowering was followed by a restore of the same file.
    let writes = ctl_writes(&ctl);
    assert!(writes.len() >= 2 && writes.len().is_multiple_of(2));
    for pair in writes.chunks(2) {
        assert_eq!(pair[0].0, pair[1].0);
        assert_eq!(pair[1].1, UNLIMITED_V1);
    }
}

fn ctl_writes(ctl: &Controller<FakeKernel>) -> Vec<(PathBuf, String)> {
    ctl.io().limit_writes.lock().unwrap().clone()
}

#[test]
fn v1_ebusy_on_lowering_still_restores_and_carries_on() {
    let dir = tempfile::tempdir().unwrap();
    make_v1(dir.path(), &[("a", 1000), ("b", 1000), ("c", 1000)]);
    let kernel = FakeKernel::new();
    kernel.inject("a/memory.limit_in_bytes", Op::Write, 16, 3);
    let mut ctl = Controller::new(config(dir.path(), VersionSetting::V1, 1400), kernel).unwrap();
    for _ in 0..5 {
        ctl.round(None);
        assert_limits_unlimited(dir.path());
    }
    assert_ratio_4_2_1(dir.path(), 0.05);
}

#[test]
fn v1_eagain_on_restore_is_retried() {
    let dir = tempfile::tempdir().unwrap();
    make_v1(dir.path(), &[("a", 1000), ("b", 100), ("c", 100)]);
    let kernel = FakeKernel::new();
    // The first lowering of a succeeds; the next two writes (the restore) fail with EAGAIN.
    let mut ctl = Controller::new(config(dir.path(), VersionSetting::V1, 1100), kernel).unwrap();
    ctl.io().inject_after_first_write("a/memory.limit_in_bytes", 11, 2);
    let r = ctl.round(None);
    assert!(r.errors.is_empty(), "{:?}", r.errors);
    assert_limits_unlimited(dir.path());
}

#[test]
fn v1_cgroup_vanishing_mid_round_is_survived() {
    let dir = tempfile::tempdir().unwrap();
    make_v1(dir.path(), &[("a", 1000), ("b", 1000), ("c", 1000)]);
    let kernel = FakeKernel::new();
    kernel.vanish_on("a/memory.limit_in_bytes");
    let mut ctl = Controller::new(config(dir.path(), VersionSetting::V1, 1000), kernel).unwrap();
    let r = ctl.round(None);
    assert!(!dir.path().join("a").exists());
    assert!(r.errors.iter().any(|e| e.contains("vanished")), "{:?}", r.errors);
    // The others were still reclaimed from, and their limits are back.
    assert!(r.actions.iter().any(|a| a.freed > 0));
    assert_limits_unlimited(dir.path());
    // Next round works on what is left.
    let r2 = ctl.round(None);
    assert!(r2.containers.iter().all(|c| c.name != "a"));
}

#[test]
fn v1_restore_that_keeps_failing_is_reported() {
    let dir = tempfile::tempdir().unwrap();
    make_v1(dir.path(), &[("a", 1000), ("b", 100), ("c", 100)]);
    let kernel = FakeKernel::new();
    let mut ctl = Controller::new(config(dir.path(), VersionSetting::V1, 1100), kernel).unwrap();
    ctl.io().inject_after_first_write("a/memory.limit_in_bytes", 16, usize::MAX);
    let r = ctl.round(None);
    assert!(r.errors.iter().any(|e| e.contains("could not restore")), "{:?}", r.errors);
}

#[test]
fn v2_uses_memory_reclaim_and_tolerates_eagain() {
    let dir = tempfile::tempdir().unwrap();
    make_v2(dir.path(), &[("a", 1000), ("b", 1000), ("c", 1000)]);
    let kernel = FakeKernel::new();
    kernel.inject("b/memory.reclaim", Op::Write, 11, 2);
    let mut ctl = Controller::new(config(dir.path(), VersionSetting::Auto, 1400), kernel).unwrap();
    for _ in 0..3 {
        let r = ctl.round(None);
        assert!(r.errors.is_empty(), "{:?}", r.errors);
    }
    assert_ratio_4_2_1(dir.path(), 0.05);
}

#[test]
fn enoent_on_read_drops_the_container_from_the_round() {
    let dir = tempfile::tempdir().unwrap();
    make_v1(dir.path(), &[("a", 1000), ("b", 1000), ("c", 1000)]);
    let kernel = FakeKernel::new();
    kernel.inject("c/memory.stat", Op::Read, 2, 1);
    let mut ctl = Controller::new(config(dir.path(), VersionSetting::V1, 1400), kernel).unwrap();
    let r = ctl.round(None);
    assert_eq!(r.containers.len(), 2);
    assert!(!r.errors.is_empty());
    assert_limits_unlimited(dir.path());
}

#[test]
fn plan_does_nothing() {
    let dir = tempfile::tempdir().unwrap();
    make_v1(dir.path(), &[("a", 1000), ("b", 1000), ("c", 1000)]);
    let mut ctl = Controller::new(config(dir.path(), VersionSetting::V1, 1400), FakeKernel::new()).unwrap();
    let (need, snap, actions) = ctl.plan(None);
    assert_eq!(need, 1600 * MIB);
    assert_eq!(snap.len(), 3);
    assert!(!actions.is_empty());
    assert!(ctl_writes(&ctl).is_empty());
    assert_eq!(usage_mib(dir.path(), "a"), 1000.0);
}
