//! End-to-end tests of the lab's memory-controller pieces: the two YCSB stores under a gradual balloon
//! (where their pages go on reclaim and where faults are served from), the controller's effect on the
//! usage ratio, and the validation of the new scenario keys.

use dd_lab::{run_scenario, RunOptions, Scenario};

/// A 12-s run of one 256 MiB VM on a 512 MiB memory store and an SSD; its containers follow.
const ONE_VM: &str = r#"name = "t"
duration_s = 12
sample_interval_s = 0.5
[host]
mem_capacity_mib = 512
disk = { kind = "ssd" }
[[vms]]
name = "vm"
memory_mib = 256
"#;

/// Two stores of the same kind, weights 1:2, ballooned from 256 MiB to 96 MiB over 4 s from 4 s.
fn two_stores(store: &str, policy: &str, pool: bool) -> String {
    let cache = if pool { "" } else { "cache = { type = \"none\" }" };
    format!(
        r#"
{ONE_VM}[vms.memctl]
policy = "{policy}"
chunk_cap_mib = 1
containers = {{ low = {{ weight = 1 }}, high = {{ weight = 2 }} }}
[[vms.containers]]
name = "low"
soft_limit_mib = 16
{cache}
workload = {{ kind = "ycsb", store = "{store}", workload = "a", record_count = 20000, record_kib = 2, nthreads = 2 }}
[[vms.containers]]
name = "high"
soft_limit_mib = 16
{cache}
workload = {{ kind = "ycsb", store = "{store}", workload = "a", record_count = 40000, record_kib = 2, nthreads = 2 }}
[[timeline]]
at_s = 4
action = "balloon"
vm = "vm"
memory_mib = 96
over_s = 4
[[checks]]
name = "ratio"
kind = "mem_ratio"
lhs = "high"
rhs = "low"
target = 2.0
from_s = 8.5
"#
    )
}

fn run(text: &str) -> dd_lab::ScenarioResult {
    let sc = Scenario::from_toml(text).unwrap();
    run_scenario(&sc, &RunOptions::default(), &mut |_, _| {}).unwrap()
}

/// Mean usage ratio high/low once the balloon is down (after 9 s). A single sample can be off by up to a
/// chunk (1 MiB of the low container's 32 MiB): the headroom a request frees goes to whoever faults next.
fn final_ratio(res: &dd_lab::ScenarioResult) -> f64 {
    let r = &res.runs[0];
    let mean = |ct: usize| {
        let v: Vec<f64> =
            r.samples.iter().filter(|s| s.ct == ct && s.t_s > 9.0).map(|s| s.memcg_pages as f64).collect();
        v.iter().sum::<f64>() / v.len() as f64
    };
    mean(1) / mean(0)
}

#[test]
fn redis_records_are_swapped_out_and_faulted_back() {
    let res = run(&two_stores("redis", "proportional", false));
    let t = &res.runs[0].totals;
    for c in t {
        assert!(c.swap_outs > 0, "reclaim swaps the heap out");
        assert!(c.disk_reads > 0, "faults read the swap device");
        assert_eq!(c.writebacks, 0, "heap pages are never written back as file pages");
        assert!(c.ops > 40_000, "load phase and requests ran: {}", c.ops);
    }
    // All 60000 records of 2 KiB were loaded: 29.3 + 58.6 MiB were resident before the balloon.
    let r = &res.runs[0];
    let before: u64 = r.samples.iter().filter(|s| (s.t_s - 4.0).abs() < 1e-9).map(|s| s.memcg_pages).sum();
    assert_eq!(before, 30_000);
    assert!((final_ratio(&res) - 2.0).abs() < 0.1, "ratio {}", final_ratio(&res));
}

#[test]
fn mongo_pages_go_through_the_page_cache_and_the_cleancache_pool() {
    let res = run(&two_stores("mongo", "proportional", true));
    let t = &res.runs[0].totals;
    for c in t {
        assert_eq!(c.swap_outs, 0, "file pages are never swapped");
        assert!(c.writebacks > 0, "dirty records are written back before their pages are dropped");
        assert!(c.cache.mem.puts > 0, "clean pages dropped by reclaim are put to the pool");
        assert!(c.mem_hits > 0, "faults are served from the pool");
    }
    assert!(res.runs[0].verified_hits > 0);
    // Without a pool every fault goes to the disk.
    let none = run(&two_stores("mongo", "proportional", false));
    let reads = |r: &dd_lab::ScenarioResult| r.runs[0].totals.iter().map(|c| c.disk_reads).sum::<u64>();
    assert!(reads(&none) > reads(&res), "{} vs {}", reads(&none), reads(&res));
}

#[test]
fn linux_default_lets_the_ratio_drift_and_the_controller_holds_it() {
    // Equal soft limits, 20000 vs 40000 records: Linux takes from the larger exceed (high) until the
    // exceeds are equal, so high/low falls towards 1; the proportional controller keeps 2.
    let linux = run(&two_stores("redis", "linux-default", false));
    let prop = run(&two_stores("redis", "proportional", false));
    assert!(final_ratio(&linux) < 1.6, "linux ratio {}", final_ratio(&linux));
    assert!((final_ratio(&prop) - 2.0).abs() < 0.1, "proportional ratio {}", final_ratio(&prop));
    assert!(!linux.checks.is_empty() && linux.checks[0].detail.contains("max dev"));
}

#[test]
fn gradual_balloon_shrinks_the_vm_in_steps() {
    let res = run(&two_stores("redis", "proportional", false));
    let r = &res.runs[0];
    let total = |t: f64| -> u64 {
        r.samples.iter().filter(|s| (s.t_s - t).abs() < 1e-9).map(|s| s.memcg_pages).sum()
    };
    // 256 -> 96 MiB over 4..8 s: half-way (6 s) the VM has about 176 MiB, at 8 s 96 MiB.
    assert_eq!(total(4.0), 30_000);
    let mid = total(6.0);
    assert!((22_000..=176 * 256).contains(&mid), "mid-way {mid} pages");
    assert!(total(8.0) <= 96 * 256);
}

#[test]
fn memctl_settings_are_validated_by_field() {
    let ok = two_stores("redis", "proportional", false);
    let bad = |from: &str, to: &str| Scenario::from_toml(&ok.replace(from, to)).unwrap_err().to_string();
    assert!(bad("chunk_cap_mib = 1", "chunk_cap_mib = 0").contains("vms[0].memctl.chunk_cap_mib"));
    assert!(bad("low = { weight = 1 }", "lo = { weight = 1 }").contains("vms[0].memctl.containers.lo"));
    assert!(bad("over_s = 4", "over_s = -1").contains("timeline[0].over_s"));
    assert!(bad("record_count = 20000", "record_count = 0").contains("record_count"));
    assert!(Scenario::from_toml(&ok.replace("policy = \"proportional\"", "policy = \"fair\"")).is_err());
}

#[test]
fn thesis4_scenarios_are_deterministic_and_pass_at_small_scale() {
    for name in ["thesis4-fig4.6-4.7-ratio", "thesis4-fig4.8-gold"] {
        let sc = dd_lab::bundled::get(name).unwrap();
        let opts = RunOptions { scale: Some(0.05), ..Default::default() };
        let a = run_scenario(&sc, &opts, &mut |_, _| {}).unwrap();
        let b = run_scenario(&sc, &opts, &mut |_, _| {}).unwrap();
        assert_eq!(
            dd_lab::results::report::summary_json(&a),
            dd_lab::results::report::summary_json(&b),
            "{name}"
        );
        assert!(a.all_passed(), "{name}: {:?}", a.checks.iter().filter(|c| !c.passed).collect::<Vec<_>>());
    }
}

/// One store loaded to 58.6 MiB, limited to 16 MiB at 4 s and lifted at 8 s (`set_memory_limit`).
fn limited_store(limit: &str, lift: &str) -> String {
    format!(
        r#"
{ONE_VM}[[vms.containers]]
name = "db"
cache = {{ type = "none" }}
workload = {{ kind = "ycsb", store = "redis", workload = "a", record_count = 30000, record_kib = 2, nthreads = 2 }}
[[timeline]]
at_s = 4
action = "set_memory_limit"
container = "db"
{limit}
[[timeline]]
at_s = 8
action = "set_memory_limit"
container = "{lift}"
"#
    )
}

#[test]
fn set_memory_limit_reclaims_at_once_and_lifting_it_lets_the_container_grow_again() {
    let res = run(&limited_store("mib = 16", "db"));
    let r = &res.runs[0];
    let at = |t: f64| r.samples.iter().find(|s| (s.t_s - t).abs() < 1e-9).map(|s| s.memcg_pages).unwrap();
    let limit = 16 * 256;
    assert_eq!(at(3.5), 15_000, "all 30 000 records of 2 KiB resident before the limit");
    for t in [4.5, 6.0, 8.0] {
        assert!(at(t) <= limit, "{} pages at {t} s under a limit of {limit}", at(t));
    }
    assert!(at(12.0) > 2 * limit, "the lifted limit lets it fault its records back: {} pages", at(12.0));
}

#[test]
fn set_memory_limit_is_validated_by_field() {
    let err = |text: &str| Scenario::from_toml(text).and_then(|s| s.validate()).unwrap_err().to_string();
    let e = err(&limited_store("mib = 0", "db"));
    assert!(e.contains("timeline[0].mib"), "{e}");
    let e = err(&limited_store("mib = 16", "nosuch"));
    assert!(e.contains("timeline[1].container"), "{e}");
}
