//! End-to-end tests of the lab's provisioning pieces: the MySQL-like store through the emulated guest,
//! preloaded stores, working-set windows, searching variants, the VM-level provisioner's decisions and
//! the targets and violation checks, and their determinism.

use dd_lab::results::report;
use dd_lab::{run_scenario, RunOptions, Scenario, ScenarioResult};

fn run(text: &str) -> ScenarioResult {
    let sc = Scenario::from_toml(text).unwrap_or_else(|e| panic!("{e}"));
    run_scenario(&sc, &RunOptions::default(), &mut |_, _| {}).unwrap()
}

fn totals<'a>(res: &'a ScenarioResult, variant: &str, ct: &str) -> &'a dd_lab::sim::CtTotals {
    let r = res.runs.iter().find(|r| r.variant == variant).unwrap();
    let i = r.containers.iter().position(|c| c.0 == ct).unwrap();
    &r.totals[i]
}

/// The top of every scenario here: `duration_s` seconds, a 64 MiB memory store, an SSD-class disk.
fn head(duration_s: f64) -> String {
    format!(
        "name = \"t\"\nsample_interval_s = 0.5\nduration_s = {duration_s}\n\
         [host]\nmem_capacity_mib = 64\ndisk = {{ kind = \"ssd\" }}\n"
    )
}

#[test]
fn mysql_swaps_its_buffer_pool_in_a_small_memcg_and_reads_its_tablespace_through_the_cache() {
    // A 16 MiB buffer pool over 24 MiB of records, in 28 MiB (the pool and some page cache: tablespace
    // pages go to the pool) or 12 MiB (the buffer pool does not fit).
    let sc = |limit: f64| {
        format!(
            "{}[[vms]]\nname = \"vm\"\nmemory_mib = 64\n[[vms.containers]]\nname = \"db\"\n\
             memory_limit_mib = {limit}\nworkload = {{ kind = \"ycsb\", store = \"mysql\", workload = \"b\", \
             record_count = 24576, buffer_pool_mib = 16, preload = true }}\n",
            head(8.0)
        )
    };
    let roomy = run(&sc(28.0));
    let t = totals(&roomy, "default", "db");
    assert!(t.swap_outs < 300, "the buffer pool fits: {t:?}");
    assert!(t.disk_reads > 0, "preloaded: the tablespace is read from the disk first");
    assert!(t.mem_hits > 0, "buffer-pool misses find tablespace pages in the container's pool: {t:?}");
    let tight = run(&sc(12.0));
    let u = totals(&tight, "default", "db");
    assert!(u.swap_outs > 1000, "the buffer pool's frames are swapped out: {u:?}");
    assert!(u.ops * 3 < t.ops * 2, "and the store runs slower: {} vs {}", u.ops, t.ops);
}

#[test]
fn a_working_set_window_confines_the_accesses() {
    // kv over 32 MiB with 12 MiB of memory: with the whole set in use it faults all the time; windowed to
    // a quarter (8 MiB) it runs from memory.
    let sc = |window: &str| {
        format!(
            "{}[[vms]]\nname = \"vm\"\nmemory_mib = 12\n[[vms.containers]]\nname = \"kv\"\n\
             cache = {{ type = \"none\" }}\nworkload = {{ kind = \"kv\", dataset_mib = 32 }}\n{window}",
            head(6.0)
        )
    };
    let all = run(&sc(""));
    let quarter = run(&sc(
        "[[timeline]]\nat_s = 0\naction = \"working_set\"\ncontainer = \"kv\"\nfraction = 0.25\noffset = 0.5\n",
    ));
    let (a, q) = (totals(&all, "default", "kv"), totals(&quarter, "default", "kv"));
    assert!(q.disk_reads * 10 < a.disk_reads, "windowed {} faults, whole {}", q.disk_reads, a.disk_reads);
    assert!(q.ops * 2 > a.ops * 3, "windowed {} ops, whole {}", q.ops, a.ops);
    let bad = Scenario::from_toml(&sc(
        "[[timeline]]\nat_s = 0\naction = \"working_set\"\ncontainer = \"kv\"\nfraction = 1.5\n",
    ));
    assert!(bad.unwrap_err().to_string().contains("timeline[0].fraction"));
}

/// Two containers in a 48 MiB VM with no cache: kv (uniform over 24 MiB) and web (about 14 MiB of
/// files), the provisioner deciding every second from 2 s.
fn provisioned(extra: &str) -> String {
    format!(
        r#"{}[[vms]]
name = "vm"
memory_mib = 48
[vms.provision]
start_s = 2
interval_s = 1
{extra}
[[vms.containers]]
name = "kv"
cache = {{ type = "none" }}
target = {{ kind = "throughput", ops_s = 15000 }}
workload = {{ kind = "kv", dataset_mib = 24 }}
[[vms.containers]]
name = "web"
cache = {{ type = "none" }}
target = {{ kind = "throughput", ops_s = 6000 }}
workload = {{ kind = "webserver", nfiles = 900, nthreads = 1 }}
[[checks]]
name = "both meet their targets once provisioned"
kind = "targets"
from_s = 10
"#,
        head(16.0)
    )
}

#[test]
fn the_provisioner_gives_each_container_the_memory_its_curves_call_for() {
    let res = run(&provisioned(""));
    assert!(res.all_passed(), "{:#?}", res.checks);
    let r = &res.runs[0];
    assert!(r.decisions.len() >= 10, "a decision every second from 2 s: {}", r.decisions.len());
    let last = r.decisions.last().unwrap();
    assert!(last.feasible, "{last:#?}");
    let limit = |n: &str| last.containers.iter().find(|c| c.name == n).unwrap().memory_limit_mib;
    // All of kv's 24 MiB in memory, or within the closed loop's `min_gain` (5%) of it: a plan that is
    // predicted better by less than that does not replace one measured to meet both targets.
    assert!(limit("kv") >= 24.0 * 0.95, "kv's 24 MiB in memory: {last:#?}");
    assert!((limit("kv") + limit("web") - 48.0).abs() < 0.01, "the limits share the VM: {last:#?}");
    // Applied: the memcg limits in the time series are the decisions'.
    let s = r.samples.iter().rev().find(|s| s.ct == 0).unwrap();
    assert!((s.limit_pages as f64 / 256.0 - limit("kv")).abs() < 0.01);
    // Reported: decisions in summary.json, the settings as columns of timeseries.csv, the curves' plot.
    assert!(report::summary_json(&res).contains("\"decisions\""));
    let csv = report::timeseries_csv(&res).unwrap();
    assert!(csv.lines().next().unwrap().ends_with("memory_limit_mib,cache_mem_weight,cache_ssd_weight"));
    assert_eq!(r.curves.len(), 2);
    let dir = tempfile::tempdir().unwrap();
    dd_lab::results::plot::write_plots_and_report(&res, dir.path()).unwrap();
    for f in ["curves_default.png", "limits_default.png", "target_kv.png", "report.html"] {
        assert!(dir.path().join(f).exists(), "{f}");
    }
}

/// Issue 27's heaps lost before the first decision: kv's 24 MiB heap beside a webserver reading about
/// 47 MiB of files in a 48 MiB VM, neither with a limit, the provisioner's first decision after the run
/// ends. Before the provisioner spared anonymous memory, VM-wide reclaim swapped the heap out as the
/// web's page cache grew (the heap's oldest pages are older than the cache's), and it came back one
/// fault at a time through the disk long after the first decision.
#[test]
fn regression_a_heap_is_not_swapped_out_before_the_first_decision() {
    let text = |extra: &str| {
        provisioned(extra)
            .replace("start_s = 2", "start_s = 30")
            .replace("nfiles = 900", "nfiles = 3000")
            .replace("duration_s = 16", "duration_s = 6")
            .replace("from_s = 10", "from_s = 5")
    };
    let spared = run(&text(""));
    let kv = totals(&spared, "default", "kv");
    let web = totals(&spared, "default", "web");
    assert!(spared.runs[0].decisions.is_empty(), "no decision in the run");
    assert!(kv.swap_outs == 0, "kv's heap stays in memory: {kv:?}");
    assert!(web.disk_reads > 0, "the web's page cache gave way instead: {web:?}");
    let unspared = run(&text("spare_anon = false"));
    let kv_off = totals(&unspared, "default", "kv");
    assert!(kv_off.swap_outs > 500, "without it the heap is swapped out: {kv_off:?}");
    assert!(kv.ops > kv_off.ops, "and kv runs slower: {} vs {}", kv.ops, kv_off.ops);
}

/// Issue 27's seed 11 of the first mix set: a Redis heap growing into a full VM before the first decision
/// swapped out most of a key-value store's heap that was there first (a global LRU took the store's
/// pages, older than Redis' new ones), and the store missed its target for the whole window. Here
/// kv's 24 MiB heap and Redis' 40 MiB of records in a 48 MiB VM, no page cache to drop: Redis, holding
/// the most, swaps its own pages out.
#[test]
fn regression_a_growing_heap_swaps_itself_out_not_a_smaller_one_before_the_first_decision() {
    let text = |extra: &str| {
        provisioned(extra)
            .replace("start_s = 2", "start_s = 30")
            .replace("duration_s = 16", "duration_s = 6")
            .replace("from_s = 10", "from_s = 5")
            .replace(
                "workload = { kind = \"webserver\", nfiles = 900, nthreads = 1 }",
                "workload = { kind = \"ycsb\", store = \"redis\", workload = \"e\", record_count = 40960, preload = false }",
            )
            .replace("ops_s = 6000", "ops_s = 100")
            .replace("name = \"web\"", "name = \"redis\"")
    };
    let res = run(&text(""));
    assert!(res.runs[0].decisions.is_empty(), "no decision in the run");
    let kv = totals(&res, "default", "kv");
    let redis = totals(&res, "default", "redis");
    assert!(kv.swap_outs < 100, "kv's heap stays in memory: {kv:?}");
    assert!(redis.swap_outs > 1000, "Redis swaps its own records out: {redis:?}");
    let oldest = run(&text("spare_anon = false"));
    let kv_lru = totals(&oldest, "default", "kv");
    assert!(kv_lru.swap_outs > 1000, "a global LRU takes kv's older pages: {kv_lru:?}");
    assert!(kv.ops > kv_lru.ops, "and kv runs slower: {} vs {}", kv.ops, kv_lru.ops);
}

#[test]
fn an_infeasible_target_is_reported_in_every_decision() {
    // kv cannot reach 40 000 ops/s (its operations take 51 us of CPU and memory): every decision says so.
    let text = provisioned("").replace("ops_s = 15000", "ops_s = 40000");
    let res = run(&text);
    let r = &res.runs[0];
    assert!(r.decisions.iter().all(|d| !d.feasible && d.infeasible == vec!["kv".to_string()]));
    assert!(!res.all_passed(), "the targets check fails too");
}

#[test]
fn provisioned_runs_are_deterministic() {
    let text = provisioned("");
    let (a, b) = (run(&text), run(&text));
    assert_eq!(report::summary_json(&a), report::summary_json(&b));
    assert_eq!(report::timeseries_csv(&a).unwrap(), report::timeseries_csv(&b).unwrap());
}

#[test]
fn a_search_runs_every_candidate_and_stands_for_the_best() {
    // The same two containers, no provisioner: a search over kv's limit (web gets the rest).
    let text = provisioned("enabled = false").replace(
        "[[checks]]",
        "[[variants]]\nname = \"static\"\n[variants.search]\nmemory_limit_mib = { kv = [8, 16, 28, 40] }\n\
         rest_of_memory = \"web\"\nfrom_s = 10\n[[checks]]",
    );
    let res = run(&text);
    assert_eq!(res.runs.len(), 1, "one run stands for the search");
    assert_eq!(res.runs[0].variant, "static");
    let s = &res.searches[0];
    let names: Vec<&str> = s.candidates.iter().map(|c| c.name.as_str()).collect();
    assert_eq!(
        names,
        [
            "static[kv=8M,web=40M]",
            "static[kv=16M,web=32M]",
            "static[kv=28M,web=20M]",
            "static[kv=40M,web=8M]"
        ]
    );
    // kv needs its 24 MiB: the splits that starve it miss its target.
    assert!(s.candidates[..2].iter().all(|c| c.targets_met < 2), "{s:#?}");
    let best = s.candidates.iter().find(|c| c.name == s.best).unwrap();
    assert_eq!(best.targets_met, 2);
    assert!(
        s.candidates.iter().all(|c| c.targets_met < 2 || c.throughput_ops_s <= best.throughput_ops_s),
        "{s:#?}"
    );
    assert!(res.all_passed(), "{:#?}", res.checks);
    assert!(report::summary_json(&res).contains("\"searches\""));
}

#[test]
fn targets_and_violation_checks_say_what_they_measured() {
    let text = provisioned("enabled = false").replace(
        "[[checks]]",
        "[[variants]]\nname = \"starved\"\ncontainers = { kv = { memory_limit_mib = 8 } }\n\
         [[variants]]\nname = \"auto\"\nprovision = { vm = true }\n\
         [[checks]]\nname = \"starved kv misses\"\nkind = \"targets\"\nvariant = \"starved\"\n\
         entities = [\"kv\"]\nexpect = \"missed\"\n\
         [[checks]]\nname = \"not all met\"\nkind = \"targets\"\nvariant = \"starved\"\nexpect = \"not_all_met\"\n\
         [[checks]]\nname = \"auto violates less\"\nkind = \"violation\"\nvariant = \"auto\"\n\
         baseline = \"starved\"\nmax_ratio = 0.5\nfrom_s = 4\n[[checks]]",
    );
    let res = run(&text);
    let by = |n: &str| res.checks.iter().find(|c| c.name == n).unwrap();
    assert!(by("starved kv misses").passed, "{:?}", by("starved kv misses"));
    assert!(by("not all met").passed);
    assert!(by("starved kv misses").detail.contains("kv"));
    let v = by("auto violates less");
    assert!(v.passed && v.detail.contains("time below target"), "{v:?}");
    // Unknown names are rejected by field.
    let bad = Scenario::from_toml(&text.replace("entities = [\"kv\"]", "entities = [\"nope\"]"));
    assert!(bad.unwrap_err().to_string().contains("entities"));
}

/// A run leaves out an SSD store that no spec uses (its file would take its whole capacity). The
/// provisioner sets pool specs at run time, so a VM that starts on the memory store may be moved to a
/// hybrid spec: the store was left out, the hybrid pool put nothing on SSD, and
/// thesis5-fig5.2-5.6-hybrid's `auto` variant fell to the memory-only throughput.
#[test]
fn regression_a_provisioned_vm_keeps_the_ssd_store_its_plan_may_use() {
    let text = format!(
        "{}ssd_capacity_mib = 64\n[[vms]]\nname = \"vm\"\nmemory_mib = 16\n[vms.provision]\n\
         [[vms.containers]]\nname = \"web\"\ncache = {{ type = \"mem\", weight = 100 }}\n\
         target = {{ kind = \"throughput\", ops_s = 1 }}\nworkload = {{ kind = \"webserver\" }}\n",
        head(4.0)
    );
    let sc = Scenario::from_toml(&text).unwrap_or_else(|e| panic!("{e}"));
    assert!(sc.uses_store(dd_engine::StoreKind::Ssd), "the provisioner may move web to the SSD store");
    let off = Scenario::from_toml(&text.replace("[vms.provision]\n", "[vms.provision]\nenabled = false\n"))
        .unwrap();
    assert!(!off.uses_store(dd_engine::StoreKind::Ssd), "no provisioner, no SSD spec: no SSD store");
}

/// Issue 27, seed 12 of the first recorded set, started from its balanced static allocation (the
/// operator's limits and weights from 5.8 s, `scripts/mixes-rescore --late-static 29 --then-provisioner`,
/// cut at 17 s): `mysql2`'s pool, entitled to 77 MiB, held nothing while `mysql2` was still filling its
/// 140 MiB limit, so the loop read its cache as none and its model's plan at 14 s gave it 10 MiB (the
/// store then fell from 51,440 to 22,954 ops/s against a target of 31,600). An empty pool behind a
/// container still filling its memory is judged by its entitlement.
#[test]
fn regression_an_empty_pool_behind_a_filling_container_was_read_as_no_cache() {
    let res = run(include_str!("data/mix-12-balanced.toml"));
    let r = &res.runs[0];
    let at = |t: f64| {
        let d = r.decisions.iter().find(|d| (d.t_s - t).abs() < 1e-6).unwrap_or_else(|| panic!("{t} s"));
        d.containers.iter().find(|c| c.name == "mysql2").unwrap().clone()
    };
    let first = at(6.0);
    assert!(first.mem_cache_mib > 70.0, "the balanced allocation's 77 MiB is in force: {first:?}");
    let plan = at(14.0);
    assert!(plan.mem_cache_mib >= 40.0, "the model's plan keeps most of mysql2's cache: {plan:?}");
    let later = at(16.0);
    assert!(later.measured_ops_s >= 31_600.0, "and mysql2 meets its target: {later:?}");
}

/// Two provisioned VMs sharing a 64 MiB memory store; `a`'s container starts out of it (spec `none`,
/// as the balanced static allocation of most two-VM mixes sets one VM), `b`'s in it with a working set
/// (4,000 files of 16 KiB) larger than its memory and half the store.
fn one_vm_out_of_the_store(extra: &str) -> String {
    format!(
        r#"{}[[vms]]
name = "a"
memory_mib = 32
[vms.provision]
start_s = 1
interval_s = 1
{extra}
[[vms.containers]]
name = "web_a"
cache = {{ type = "none" }}
target = {{ kind = "throughput", ops_s = 100 }}
workload = {{ kind = "webserver", nfiles = 900, nthreads = 1 }}
[[vms]]
name = "b"
memory_mib = 32
[vms.provision]
start_s = 1
interval_s = 1
[[vms.containers]]
name = "web_b"
cache = {{ type = "mem", weight = 100 }}
target = {{ kind = "throughput", ops_s = 100 }}
workload = {{ kind = "webserver", nfiles = 4000, nthreads = 1 }}
"#,
        head(10.0)
    )
}

/// VM `vm`'s decisions that set something (not the learning ones, which list no container).
fn decisions_of<'r>(r: &'r dd_lab::sim::RunResult, vm: &str) -> Vec<&'r dd_lab::sim::Decision> {
    r.decisions.iter().filter(|d| d.vm == vm && !d.containers.is_empty()).collect()
}

/// Issue 27, twenty-ninth session: in 19 of the 24 two-VM mixes of seeds 61-100 the balanced static
/// allocation keeps one VM out of the memory store so that the other gets all of it. Started from it,
/// the loop gave the out VM's pool one unit's weight (a plan with no cache keeps one unit), which made
/// the VM a user of the store again; the host splits the store between its users by VM weight, so the
/// other VM's share halved (seed 70: `scan2` at 1,000 ops/s against a target of 30,900). A VM out of the
/// memory store at its first decision while another uses it now stays out.
#[test]
fn regression_a_vm_kept_out_of_the_memory_store_was_let_back_in_by_one_unit() {
    let mem_weight = |s: &dd_engine::Spec| s.uses(dd_engine::StoreKind::Mem);
    let res = run(&one_vm_out_of_the_store(""));
    let r = &res.runs[0];
    let of = |vm: &str| decisions_of(r, vm);
    assert!(of("a").len() >= 4, "{:#?}", r.decisions);
    for d in of("a") {
        let c = &d.containers[0];
        assert!(!mem_weight(&c.spec) && c.mem_cache_mib == 0.0, "a stays out of the store: {d:#?}");
    }
    // The whole store is b's to plan with: more than the half a second user would leave it.
    assert!(of("b").iter().any(|d| d.containers[0].mem_cache_mib > 36.0), "{:#?}", r.decisions);

    // The mechanism, with the rule off: a's one unit makes it a user again, and b's plans halve.
    let res = run(&one_vm_out_of_the_store("keep_out_of_mem_store = false"));
    let r = &res.runs[0];
    let of = |vm: &str| decisions_of(r, vm);
    assert!(of("a").iter().any(|d| mem_weight(&d.containers[0].spec)), "{:#?}", r.decisions);
    assert!(
        of("b").iter().skip(1).all(|d| d.containers[0].mem_cache_mib <= 32.0 + 1e-9),
        "{:#?}",
        r.decisions
    );
}
