//! Acceptance tests of provisioning on a real guest: the real daemon, watcher, `doubledecker mount`
//! (sampling each container's reads with SHARDS) and `doubledecker guest provision` run as processes,
//! and real cgroups read files through the mount in loops.
//!
//! - Two hit-ratio targets (issue 14, acceptance 4): with a budget that can meet both, the provisioner
//!   must converge to settings that meet both within 60 s (a bound on the test, measured by the hit
//!   ratios it reports); with one that cannot, it must report the infeasibility (and a dry run must
//!   change nothing).
//! - A throughput target met only after the closed loop corrects the model (issue 27): a reader that
//!   pauses between its passes, which the model (time in the mount only) over-predicts several times
//!   over, starts with its loop in the cache, which the model says meets its target and where it
//!   measures below it; the loop must measure the miss, correct the model and move the loop into the
//!   first level (further than its bounded steps go), within 60 s.
//!
//! Skipped, with a message, where FUSE or a memory cgroup controller is unavailable (needs root).

mod common;
mod fusekit;

use common::*;
use fusekit::dd_bin;
use fusekit::*;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

const MIB: u64 = 1 << 20;

/// a's cgroup memory limit is this plus its first-level budget (the hit-ratio test).
const A_BASE: u64 = 64 * MIB;

/// A shell that reads a file through the mount in a loop from inside a container; its whole process
/// group (the shell and its `cat`) is killed on drop, so nothing holds the mount busy after it.
struct Reader(Proc);

impl Drop for Reader {
    fn drop(&mut self) {
        if let Some(c) = &self.0.child {
            // SAFETY: kill(2) of the process group our child leads (made with process_group(0)).
            unsafe { libc::kill(-(c.id() as libc::pid_t), libc::SIGKILL) };
        }
    }
}

/// One guest: a daemon with an 8 MiB memory store (VM 2's whole entitlement), containers `a` and `b`
/// (cgroups, and the watcher's pools with the given weights), files in a backing directory, and the
/// mount sampling the containers' reads (first levels of 256 KiB each until a plan says otherwise; it
/// publishes every 200 ms). Readers are the test's own (dropped before [`Guest::stop`]).
struct Guest {
    root: CgroupRoot,
    v: TestVm,
    d: Daemon,
    groups: Cgroups,
    work: tempfile::TempDir,
    mnt: PathBuf,
    mount: MountProc,
    watcher: Proc,
}

impl Guest {
    fn start(
        root: CgroupRoot,
        tag: &str,
        files: &[(&str, usize)],
        weights: [u32; 2],
        mount_extra: &str,
    ) -> Guest {
        let v = vm(2);
        let d = Daemon::start_with(&[&v], "", "capacity_bytes = 8388608\n", "");
        let groups = Cgroups::new(&root, tag, &["a", "b"]);
        let work = tempfile::tempdir().unwrap();
        let (back, mnt) = (work.path().join("back"), work.path().join("mnt"));
        std::fs::create_dir_all(&back).unwrap();
        std::fs::create_dir_all(&mnt).unwrap();
        for (seed, (name, len)) in files.iter().enumerate() {
            std::fs::write(back.join(name), bytes(seed as u64 + 1, *len)).unwrap();
        }
        let watch_cfg = watch_config(
            work.path(),
            &d.unix,
            2,
            &v.data_token,
            &groups.parent,
            &[("a", "mem", weights[0]), ("b", "mem", weights[1])],
        );
        let watcher = Proc::spawn(
            "guest watch",
            Command::new(dd_bin()).args(["guest", "watch", "--config"]).arg(&watch_cfg),
        );
        wait_for_file(&work.path().join("pools.json"), |t| t.contains("\"a\"") && t.contains("\"b\""));
        let cfg = mount_config(
            work.path(),
            &d.unix,
            2,
            &v.data_token,
            &groups.parent,
            &format!(
                "default_budget_bytes = 262144\n{mount_extra}\n[sampling]\nstats_file = {:?}\nbudgets_file = {:?}\n\
                 publish_interval_ms = 200\n",
                work.path().join("stats.json").display().to_string(),
                work.path().join("budgets.json").display().to_string()
            ),
        );
        let mount = MountProc::start(&back, &mnt, &cfg);
        Guest { root, v, d, groups, work, mnt, mount, watcher }
    }

    fn file(&self, name: &str) -> PathBuf {
        self.work.path().join(name)
    }

    /// A reader in container `name` of `files` through the mount (one `cat` of them all, a pass), running
    /// `pause` (a shell command) after each pass, if any.
    fn reader(&self, name: &str, files: &[&str], pause: &str) -> Reader {
        use std::os::unix::process::CommandExt;
        let files: Vec<String> = files.iter().map(|f| self.mnt.join(f).display().to_string()).collect();
        let script = format!(
            "echo $$ > {}/cgroup.procs && while true; do cat {} > /dev/null || exit 1; {pause} done",
            self.groups.child(name).display(),
            files.join(" ")
        );
        Reader(Proc::spawn(
            &format!("reader {name}"),
            Command::new("sh").arg("-c").arg(script).process_group(0),
        ))
    }

    /// Until the mount has published both containers.
    fn wait_published(&self) {
        wait_for_file(&self.file("stats.json"), |t| t.contains("\"a\"") && t.contains("\"b\""));
    }

    /// A container's page reads, reads from the backing directory, and the mount's uptime (ms).
    fn counters(&self, name: &str) -> (u64, u64, u64) {
        let s: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(self.file("stats.json")).unwrap()).unwrap();
        let c = s["containers"].as_array().unwrap().iter().find(|c| c["name"] == name).unwrap().clone();
        let hits = c["l1_hits"].as_u64().unwrap() + c["pool_hits"].as_u64().unwrap();
        let backing = c["backing_pages"].as_u64().unwrap();
        (hits + backing, backing, s["uptime_ms"].as_u64().unwrap())
    }

    /// Container `name`'s page reads per second (on the mount's clock) and hit ratio over `secs`.
    fn measure(&self, name: &str, secs: u64) -> (f64, f64) {
        let (r0, b0, t0) = self.counters(name);
        std::thread::sleep(Duration::from_secs(secs));
        let (r1, b1, t1) = self.counters(name);
        let reads = (r1 - r0).max(1) as f64;
        (reads * 1e3 / (t1 - t0).max(1) as f64, 1.0 - (b1 - b0) as f64 / reads)
    }

    /// A provisioner's configuration: the mount's files, the daemon, the VM's admin API, `memory` bytes
    /// of first level to share, the memory cache given (else the VM's entitlement), and `containers`
    /// (TOML tables).
    fn provision_config(&self, memory: u64, cache: Option<u64>, containers: &str) -> PathBuf {
        let p = self.file(&format!("provision-{memory}.toml"));
        let cache = cache.map(|c| format!("mem_cache_bytes = {c}\n")).unwrap_or_default();
        std::fs::write(
            &p,
            format!(
                "stats_file = {:?}\nbudgets_file = {:?}\nstate_file = {:?}\ninterval_ms = 500\n\
                 memory_bytes = {memory}\ncgroup_parent = {:?}\n{cache}[daemon]\nunix_socket = {:?}\nvm = 2\n\
                 data_token = {:?}\n[admin]\nurl = {:?}\ntoken = {:?}\n{containers}",
                self.file("stats.json").display().to_string(),
                self.file("budgets.json").display().to_string(),
                self.file("pools.json").display().to_string(),
                self.groups.parent.display().to_string(),
                self.d.unix.display().to_string(),
                self.v.data_token,
                self.d.admin,
                self.v.admin_token
            ),
        )
        .unwrap();
        p
    }

    /// `guest provision` with `config`, and its rounds (each JSON line it prints) as they come.
    fn provision(&self, config: &Path) -> (Proc, mpsc::Receiver<serde_json::Value>) {
        let mut cmd = Command::new(dd_bin());
        cmd.args(["guest", "provision", "--config"]).arg(config).stdout(Stdio::piped());
        let mut prov = Proc::spawn("guest provision", &mut cmd);
        let out = prov.child.as_mut().unwrap().stdout.take().unwrap();
        let (tx, rx) = mpsc::channel::<serde_json::Value>();
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines().map_while(Result::ok) {
                if let Ok(v) = serde_json::from_str(&line) {
                    if tx.send(v).is_err() {
                        break;
                    }
                }
            }
        });
        (prov, rx)
    }

    /// Unmounts and stops the watcher, both cleanly.
    fn stop(mut self) {
        let (ok, _) = self.mount.stop();
        assert!(ok, "the mount exits cleanly");
        let (ok, _) = self.watcher.term();
        assert!(ok, "the watcher exits cleanly");
    }
}

/// The two tests one at a time: each measures read rates, which the other's readers would move.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// One container of a round's report, by name.
fn container<'a>(round: &'a serde_json::Value, name: &str) -> &'a serde_json::Value {
    round["containers"].as_array().unwrap().iter().find(|c| c["name"] == name).unwrap()
}

/// Whether every container with a target read and measured at least its target in this round.
fn all_measured_met(round: &serde_json::Value) -> bool {
    round["containers"]
        .as_array()
        .unwrap()
        .iter()
        .all(|c| c["target"].is_null() || c["measured_target_met"] == true)
}

#[test]
fn the_provisioner_meets_two_hit_ratio_targets_and_reports_an_infeasible_budget() {
    let Some(root) = require("the_provisioner_meets_two_hit_ratio_targets_and_reports_an_infeasible_budget")
    else {
        return;
    };
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    // a loops over 3 MiB, b over 6 MiB: an LRU cache misses a loop until it holds all of it. The 8 MiB
    // memory store is less than the two loops need besides small first levels, so the split matters.
    let g = Guest::start(root, "prov", &[("fa", 3 << 20), ("fb", 6 << 20)], [90, 10], "");
    let _ra = g.reader("a", &["fa"], "");
    let _rb = g.reader("b", &["fb"], "");
    g.wait_published();

    // Before provisioning: a has most of the cache (weight 90 of 100) and b's 6 MiB loop does not fit in
    // its 256 KiB first level and 0.8 MiB share, so b misses its target.
    std::thread::sleep(Duration::from_secs(2));
    let (_, before) = g.measure("b", 3);
    eprintln!("b's hit ratio before provisioning: {before:.3}");
    assert!(before < 0.8, "b misses its target before provisioning: hit ratio {before}");

    // A budget that meets both: 4 MiB of first level for the two, and the VM's 8 MiB of memory store.
    let targets = format!(
        "[containers.a]\ntarget = {{ kind = \"hit_ratio\", ratio = 0.9 }}\nmemory_base_bytes = {A_BASE}\n\
         [containers.b]\ntarget = {{ kind = \"hit_ratio\", ratio = 0.8 }}\n"
    );
    let feasible = g.provision_config(4 * MIB, None, &targets);
    let (mut prov, rx) = g.provision(&feasible);
    // Converged: three rounds in a row in which both containers measured at least their targets, within
    // 60 s (the bound this test states).
    let started = Instant::now();
    let deadline = started + Duration::from_secs(60);
    let (mut streak, mut last) = (0, serde_json::Value::Null);
    while streak < 3 {
        let left = deadline.saturating_duration_since(Instant::now());
        let r = rx
            .recv_timeout(left)
            .unwrap_or_else(|_| panic!("not converged within 60 s; last round: {last:#}"));
        // Early rounds may find nothing reused yet (every read so far a first one): no plan then meets the
        // targets; once a loop has been read twice the curves show what it needs.
        let met =
            r["feasible"] == true && all_measured_met(&r) && r["containers"].as_array().unwrap().len() == 2;
        streak = if met { streak + 1 } else { 0 };
        last = r;
    }
    eprintln!("converged in {:.1} s: {last:#}", started.elapsed().as_secs_f64());
    let (ok, _) = prov.term();
    assert!(ok, "guest provision exits cleanly on SIGTERM");
    // Every applied round went to the daemon's admin API (for /ui/): the last one kept is the last
    // printed (with the VM's admin token; the host sees it too).
    let (status, kept) = g.d.http("GET", "/v1/vm/provisioner", Some(&g.v.admin_token), None);
    assert_eq!(status, 200, "{kept}");
    // (The rounds it printed before it stopped; the reader thread ends with its output.)
    while let Ok(r) = rx.recv_timeout(Duration::from_secs(10)) {
        last = r;
    }
    assert_eq!(kept["report"], last, "the daemon keeps the provisioner's last round");
    let (_, all) = g.d.http("GET", "/v1/provisioner", Some(HOST_TOKEN), None);
    assert_eq!(all[0]["vm"], 2);
    // Applied where the plan says: the mount's first levels (it reads the budgets file at its next
    // publication), the pools' specs, and a's cgroup memory limit (base plus first-level budget).
    let budget_of = |name: &str| -> u64 { container(&last, name)["budget_bytes"].as_u64().unwrap() };
    let want = (budget_of("a") / 4096, budget_of("b") / 4096);
    wait_for_file(&g.file("stats.json"), |t| {
        let s: serde_json::Value = serde_json::from_str(t).unwrap_or_default();
        let l1 = |n: &str| {
            s["containers"]
                .as_array()
                .and_then(|v| v.iter().find(|c| c["name"] == n))
                .map(|c| c["l1_budget_pages"].clone())
        };
        l1("a") == Some(want.0.into()) && l1("b") == Some(want.1.into())
    });
    let pools: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(g.file("pools.json")).unwrap()).unwrap();
    for c in last["containers"].as_array().unwrap() {
        let name = c["name"].as_str().unwrap();
        let pool = pools["pools"][name]["pool"].as_u64().unwrap() as u32;
        assert_eq!(c["pool"].as_u64(), Some(pool as u64), "{name}'s pool is the watcher's");
        let spec = g.d.unix_client(&g.v).pool_stats(dd_engine::PoolId(pool)).unwrap().spec;
        assert_eq!(serde_json::to_value(spec).unwrap(), c["spec"], "{name}'s pool has the planned spec");
    }
    let limit_file = if g.root.v1 { "memory.limit_in_bytes" } else { "memory.max" };
    let limit: u64 =
        std::fs::read_to_string(g.groups.child("a").join(limit_file)).unwrap().trim().parse().unwrap();
    assert_eq!(limit, A_BASE + budget_of("a"), "a's cgroup memory limit is its base plus its first level");
    assert_eq!(last["containers"][0]["memory_limit_bytes"].as_u64(), Some(limit));

    // A budget that cannot (1 MiB of first level and 2 MiB of cache for 9 MiB of loops): a dry run reports
    // the infeasibility (exit status 3) and applies nothing.
    let budgets_before = std::fs::read(g.file("budgets.json")).unwrap();
    let small = g.provision_config(MIB, Some(2 * MIB), &targets);
    let out = Command::new(dd_bin())
        .args(["guest", "provision", "--dry-run", "--config"])
        .arg(&small)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(3), "infeasible: {}", String::from_utf8_lossy(&out.stderr));
    let plan: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(plan["feasible"], false);
    assert_eq!(plan["applied"], false);
    let infeasible = plan["infeasible"].as_array().unwrap();
    assert!(infeasible.iter().any(|n| n == "b"), "b's 6 MiB loop cannot fit in 3 MiB: {plan:#}");
    eprintln!("with 1 MiB of first level and 2 MiB of cache: infeasible {infeasible:?}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("infeasible"));
    assert_eq!(std::fs::read(g.file("budgets.json")).unwrap(), budgets_before, "a dry run changes nothing");

    drop((_ra, _rb));
    g.stop();
}

#[test]
fn a_throughput_target_is_met_only_after_the_loop_corrects_the_model() {
    let Some(root) = require("a_throughput_target_is_met_only_after_the_loop_corrects_the_model") else {
        return;
    };
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    // The test needs a machine whose speed holds from the calibration to the end: a target met only in
    // the first level. Where it stops holding (another load ends and the cache path speeds up past the
    // target), the attempt says so and a fresh guest calibrates again.
    for attempt in 1..=3 {
        if correction_attempt(root.clone(), attempt) {
            return;
        }
    }
    panic!(
        "in three attempts, a's target was met with its loop out of its first level: no test of a correction"
    );
}

/// One attempt of [`a_throughput_target_is_met_only_after_the_loop_corrects_the_model`]: false when the
/// calibration stopped holding (a met its target, on average over six rounds or more, under plans that
/// kept its loop out of its first level); otherwise its assertions hold or it panics.
fn correction_attempt(root: CgroupRoot, attempt: u32) -> bool {
    // a loops over 2 MiB and pauses 2 ms after each pass: time outside the mount, which the model (what
    // the mount times) does not see, so it over-predicts what a gains from faster reads. b's two readers
    // loop over 1.5 MiB without a pause. 2.5 MiB of first level holds one loop or the other, not both; the
    // 8 MiB memory store holds both.
    let g = Guest::start(
        root,
        &format!("corr{attempt}"),
        &[("fa", 2 << 20), ("fb", 3 << 19)],
        [50, 50],
        "backing_read_latency_us = 500",
    );
    let _ra = g.reader("a", &["fa"], "sleep 0.002;");
    let _rb = [g.reader("b", &["fb"], ""), g.reader("b", &["fb"], "")];
    g.wait_published();

    // What a reads on this machine with its loop in its first level (b's in the cache), and with both
    // loops in the cache, where a guest starts (first levels set by hand through the budgets file,
    // which the mount reads at each publication); a's target lies between the two, so only the first
    // meets it. The provisioner then starts from the second: it takes what runs as the allocation in
    // force and plans its first change in bounded steps from it.
    let a_rate_with = |a_bytes: u64, b_bytes: u64| -> f64 {
        std::fs::write(g.file("budgets.json"), format!("{{\"a\": {a_bytes}, \"b\": {b_bytes}}}")).unwrap();
        std::thread::sleep(Duration::from_millis(1500));
        g.measure("a", 3).0
    };
    let in_first_level = a_rate_with(2304 << 10, 256 << 10);
    let in_cache = a_rate_with(256 << 10, 256 << 10);
    eprintln!("a reads {in_first_level:.0} pages/s from its first level, {in_cache:.0} from the cache");
    assert!(
        in_first_level >= 1.3 * in_cache,
        "the first level must be clearly faster than the cache for this test to tell them apart: \
         {in_first_level:.0} against {in_cache:.0} pages/s"
    );
    let target_a = (in_first_level * in_cache).sqrt().round();
    // b meets its target wherever its loop is.
    let target_b = (in_cache / 2.0).round();
    let targets = format!(
        "[containers.a]\ntarget = {{ kind = \"throughput\", ops_s = {target_a} }}\n\
         [containers.b]\ntarget = {{ kind = \"throughput\", ops_s = {target_b} }}\n"
    );
    let cfg = g.provision_config(5 * MIB / 2, None, &targets);
    let (mut prov, rx) = g.provision(&cfg);

    // The rounds, within 60 s (the bound this test states): while a's loop is out of its first level
    // under plans the model says meet a's target, a measures below it (on average over those rounds: one
    // round is half a second of a noisy machine); then its loop is moved into the first level and three
    // rounds in a row measure both targets met. A round measures the plan of the round before it.
    let started = Instant::now();
    let deadline = started + Duration::from_secs(60);
    let (mut prev, mut streak) = (serde_json::Value::Null, 0);
    let mut wrong: Vec<(u64, f64, f64)> = Vec::new();
    while streak < 3 {
        let left = deadline.saturating_duration_since(Instant::now());
        let r = rx.recv_timeout(left).unwrap_or_else(|_| {
            panic!("not converged within 60 s (a's target {target_a}; {wrong:?}); last round: {prev:#}")
        });
        let a = container(&r, "a");
        let a_prev = (!prev.is_null()).then(|| container(&prev, "a"));
        eprintln!(
            "round {} ({}): a {} KiB, cache {} KiB, predicted {} met {}, measured {} met {}, correction {}",
            r["round"],
            r["source"],
            a["budget_bytes"].as_u64().unwrap() >> 10,
            a["mem_cache_bytes"].as_u64().unwrap() >> 10,
            a["predicted_reads_per_s"],
            a["target_met"],
            a["reads_per_s"],
            a["measured_target_met"],
            a["correction"]
        );
        if let Some(p) = a_prev.filter(|p| p["target_met"] == true) {
            let budget = p["budget_bytes"].as_u64().unwrap();
            if budget < 2 * MIB {
                let predicted = p["predicted_reads_per_s"].as_f64().unwrap();
                wrong.push((budget, predicted, a["reads_per_s"].as_f64().unwrap()));
                let mean = wrong.iter().map(|w| w.2).sum::<f64>() / wrong.len() as f64;
                if wrong.len() >= 6 && mean >= target_a {
                    eprintln!(
                        "attempt {attempt}: a measured {mean:.0} on average out of its first level, above its \
                         target {target_a}: the calibration no longer holds ({wrong:?})"
                    );
                    prov.term();
                    drop((_ra, _rb));
                    g.stop();
                    return false;
                }
            }
        }
        streak = if all_measured_met(&r) && a["budget_bytes"].as_u64().unwrap() >= 2 * MIB {
            streak + 1
        } else {
            0
        };
        prev = r;
    }
    let (ok, _) = prov.term();
    assert!(ok, "guest provision exits cleanly on SIGTERM");
    eprintln!(
        "a's target {target_a}: with its loop out of its first level, predicted and measured {wrong:?}; \
         converged in {:.1} s: {prev:#}",
        started.elapsed().as_secs_f64()
    );
    assert!(!wrong.is_empty(), "the model's first plans kept a's loop out of its first level");
    let measured = wrong.iter().map(|w| w.2).sum::<f64>() / wrong.len() as f64;
    assert!(wrong.iter().all(|w| w.1 >= target_a), "predicted to meet the target: {wrong:?}");
    assert!(measured < target_a, "measured below it: {measured:.0} on average, {wrong:?}");
    let a = container(&prev, "a");
    assert_eq!(a["state"], "met");
    assert!(
        a["budget_bytes"].as_u64().unwrap() >= 2 * MIB,
        "a meets its target with its loop in its first level: {a:#}"
    );
    // The model was corrected, by more than the plan's headroom (10%): without the correction, the plan
    // it first made would still look good enough.
    let correction = a["correction"].as_f64().unwrap();
    assert!(correction < 1.0 / 1.1, "a's model corrected: measured over predicted {correction}");

    drop((_ra, _rb));
    g.stop();
    true
}
