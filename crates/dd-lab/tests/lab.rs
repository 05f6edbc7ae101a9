//! End-to-end tests of the lab: exact LRU against an independent reference (acceptance 3) and
//! determinism (acceptance 4).

use dd_lab::results::report;
use dd_lab::sim::budget::HostMemory;
use dd_lab::{bundled, run_scenario, LabError, RunOptions, Scenario};
use rand::{Rng, SeedableRng};
use std::collections::VecDeque;

/// A reference LRU written independently of the guest model: a queue, most recent at the back.
fn reference_lru_misses(trace: &[(u32, u32)], capacity: usize) -> u64 {
    let mut q: VecDeque<(u32, u32)> = VecDeque::new();
    let mut misses = 0;
    for k in trace {
        if let Some(pos) = q.iter().position(|x| x == k) {
            q.remove(pos);
        } else {
            misses += 1;
            if q.len() == capacity {
                q.pop_front();
            }
        }
        q.push_back(*k);
    }
    misses
}

#[test]
fn plain_lru_mode_matches_reference_lru_miss_counts() {
    let dir = tempfile::tempdir().unwrap();
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(42);
    // A skewed trace over 3 files: a hot set and a long tail, so cache size matters.
    let mut trace = Vec::new();
    for _ in 0..4000 {
        let hot = rng.gen::<f64>() < 0.6;
        let obj = rng.gen_range(0..3u32);
        let idx = if hot { rng.gen_range(0..60u32) } else { rng.gen_range(0..800u32) };
        trace.push((obj, idx));
    }
    let mut csv = String::from("object,index,pages,op\n");
    for (o, i) in &trace {
        csv.push_str(&format!("{},{},1,R\n", o + 100, i));
    }
    std::fs::write(dir.path().join("t.csv"), csv).unwrap();
    for pages in [64usize, 256, 512, 1024] {
        let mut sc = Scenario::trace_replay("t.csv", pages as u64, 0.0, 100_000.0);
        sc.sample_interval_s = 1000.0;
        let opts = RunOptions { base_dir: Some(dir.path().to_path_buf()), ..Default::default() };
        let res = run_scenario(&sc, &opts, &mut |_, _| {}).unwrap();
        let t = &res.runs[0].totals[0];
        assert_eq!(t.pc_hits + t.pc_misses, trace.len() as u64, "the whole trace was replayed once");
        let want = reference_lru_misses(&trace, pages);
        assert_eq!(t.pc_misses, want, "cache of {pages} pages");
    }
}

const GIB: u64 = 1 << 30;

/// A host with room for anything these tests run, so the memory plan never cuts the jobs asked for.
fn roomy_host() -> Option<HostMemory> {
    Some(HostMemory { total_bytes: 64 * GIB, available_bytes: 64 * GIB })
}

fn outputs(seed: u64, jobs: usize) -> (String, String) {
    let sc = bundled::get("fig3-4-global-share").unwrap();
    let opts = RunOptions {
        scale: Some(0.02),
        seed: Some(seed),
        jobs: Some(jobs),
        host_memory: roomy_host(),
        ..Default::default()
    };
    let res = run_scenario(&sc, &opts, &mut |_, _| {}).unwrap();
    (report::summary_json(&res), report::timeseries_csv(&res).unwrap())
}

#[test]
fn same_seed_gives_identical_outputs_and_different_seeds_differ() {
    let a = outputs(3, 1);
    let b = outputs(3, 1);
    assert!(a.0 == b.0, "summary.json differs between two runs with the same seed");
    assert!(a.1 == b.1, "timeseries.csv differs between two runs with the same seed");
    let c = outputs(4, 1);
    assert!(a.1 != c.1, "a different seed gave the same time series");
}

#[test]
fn variants_run_side_by_side_give_the_same_bytes() {
    // fig3-4 has five variants: three threads interleave them in an order that varies from run to run.
    let one = outputs(3, 1);
    let three = outputs(3, 3);
    assert!(one.0 == three.0, "summary.json depends on the number of threads");
    assert!(one.1 == three.1, "timeseries.csv depends on the number of threads");
}

#[test]
fn a_failing_variant_fails_the_run_on_any_number_of_threads() {
    let mut sc = Scenario::trace_replay("no-such-trace.csv", 16, 1.0, 10.0);
    let dir = tempfile::tempdir().unwrap();
    sc.variants = ["a", "b", "c"]
        .iter()
        .map(|n| dd_lab::scenario::Variant { name: n.to_string(), ..Default::default() })
        .collect();
    for jobs in [1, 2, 3] {
        let opts =
            RunOptions { base_dir: Some(dir.path().to_path_buf()), jobs: Some(jobs), ..Default::default() };
        let e = run_scenario(&sc, &opts, &mut |_, _| {}).unwrap_err();
        assert!(e.to_string().contains("no-such-trace.csv"), "{jobs} threads: {e}");
    }
}

/// The issue-13 case: `fig9-10-table2-modes` at its own scale on a host that cannot hold it is refused
/// before anything runs, with one message naming the memory needed and available and the options.
#[test]
fn a_run_that_does_not_fit_in_memory_is_refused_before_it_starts() {
    let sc = bundled::get("fig9-10-table2-modes").unwrap();
    let dir = tempfile::tempdir().unwrap();
    let opts = RunOptions {
        scratch_dir: Some(dir.path().to_path_buf()),
        host_memory: Some(HostMemory { total_bytes: 24 * GIB, available_bytes: 12 * GIB }),
        ..Default::default()
    };
    let mut progressed = false;
    let e = run_scenario(&sc, &opts, &mut |_, _| progressed = true).unwrap_err();
    assert!(!progressed, "a variant started");
    let LabError::NotEnoughMemory { needed_bytes, available_bytes, .. } = &e else { panic!("{e}") };
    assert!(*needed_bytes > 12 * GIB && *available_bytes == 12 * GIB, "{e}");
    let msg = e.to_string();
    for want in ["--scale", "--jobs", "--scratch-dir", "12.00 GiB", "24.00 GiB"] {
        assert!(msg.contains(want), "`{want}` missing from: {msg}");
    }
}

#[test]
fn variants_side_by_side_are_cut_to_what_fits() {
    let sc = bundled::get("fig3-4-global-share").unwrap();
    let opts =
        RunOptions { scale: Some(0.02), jobs: Some(4), host_memory: roomy_host(), ..Default::default() };
    let roomy = dd_lab::prepare(&sc, &opts).unwrap();
    assert_eq!(roomy.plan.jobs, 4);
    // Room for the process and one variant (plus a little), above the 20% margin.
    let one = roomy.plan.estimates.iter().map(|e| e.total()).max().unwrap();
    let need = dd_lab::sim::budget::PROCESS_BASE_BYTES + one + (one / 2);
    let total = 10 * need;
    let tight = HostMemory { total_bytes: total, available_bytes: need + total / 5 };
    let p = dd_lab::prepare(&sc, &RunOptions { host_memory: Some(tight), ..opts }).unwrap();
    assert_eq!(p.plan.jobs, 1, "{:?}", p.plan);
    assert!(p.plan.peak_bytes <= tight.budget_bytes());
}

/// A small scenario with an SSD store (hybrid pool), for the scratch-file tests.
const SSD_SCENARIO: &str = r#"
name = "ssd-small"
duration_s = 60
sample_interval_s = 10
[host]
mem_capacity_mib = 4
ssd_capacity_mib = 32
[[vms]]
name = "vm"
memory_mib = 16
[[vms.containers]]
name = "web"
memory_limit_mib = 8
cache = { type = "hybrid", mem_weight = 100, ssd_weight = 100 }
workload = { kind = "webserver", nfiles = 2000, nthreads = 4 }
[[checks]]
name = "coherent"
kind = "coherent"
"#;

#[test]
fn the_scratch_files_place_changes_no_output_and_leaves_nothing_behind() {
    let sc = Scenario::from_toml(SSD_SCENARIO).unwrap();
    let mut dirs = vec![tempfile::tempdir_in(std::env::temp_dir()).unwrap()];
    if std::path::Path::new("/dev/shm").is_dir() {
        dirs.push(tempfile::tempdir_in("/dev/shm").unwrap());
    }
    let mut outs = Vec::new();
    for d in &dirs {
        let opts = RunOptions { scratch_dir: Some(d.path().to_path_buf()), ..Default::default() };
        let res = run_scenario(&sc, &opts, &mut |_, _| {}).unwrap();
        assert!(res.all_passed());
        assert!(res.runs[0].totals[0].pc_misses > 0);
        outs.push((report::summary_json(&res), report::timeseries_csv(&res).unwrap()));
        let left: Vec<_> = std::fs::read_dir(d.path()).unwrap().collect();
        assert!(left.is_empty(), "{} left in {}", left.len(), d.path().display());
    }
    assert!(outs.windows(2).all(|w| w[0] == w[1]), "the scratch directory changed an output");
}

/// Issue 13: `set_vm_weights` needed both weights; a weight left out now keeps its value.
#[test]
fn set_vm_weights_may_change_one_weight() {
    let one = format!(
        "{SSD_SCENARIO}[[timeline]]\nat_s = 30\naction = \"set_vm_weights\"\nvm = \"vm\"\nmem = 50\n"
    );
    let sc = Scenario::from_toml(&one).unwrap();
    let res = run_scenario(&sc, &RunOptions::default(), &mut |_, _| {}).unwrap();
    assert!(res.all_passed());
    let none = format!("{SSD_SCENARIO}[[timeline]]\nat_s = 30\naction = \"set_vm_weights\"\nvm = \"vm\"\n");
    let e = Scenario::from_toml(&none).unwrap_err().to_string();
    assert!(e.contains("timeline[0].mem"), "{e}");
}

/// A memory-only run gets no SSD store (its file would take the store's whole capacity of disk for the
/// length of the run, fig9's memory-only variants 16 GiB) and gives the same result as with one; a
/// scenario whose specs use the store, or whose timeline resizes it, keeps it.
#[test]
fn a_store_no_spec_uses_is_left_out_and_changes_no_output() {
    use dd_lab::sim::backend::EngineBackend;
    let mem_only = SSD_SCENARIO.replace(
        r#"cache = { type = "hybrid", mem_weight = 100, ssd_weight = 100 }"#,
        r#"cache = { type = "mem", weight = 100 }"#,
    );
    let sc = Scenario::from_toml(&mem_only).unwrap().scaled();
    let dir = tempfile::tempdir().unwrap();
    let cfg = dd_lab::backend_config(&sc, dir.path());
    assert_eq!(cfg.ssd_pages, 0, "an SSD store nothing uses");
    let with_store = dd_lab::sim::backend::BackendConfig { ssd_pages: 32 * 2048, ..cfg.clone() };
    let v = sc.variant_list().remove(0);
    let run = |cfg: &dd_lab::sim::backend::BackendConfig| {
        let s = dd_lab::sim::apply_variant(&sc, &v);
        let r = dd_lab::sim::Sim::new(&s, &v, EngineBackend::new(cfg).unwrap(), &|_: &str| {
            Ok(Box::new(std::io::empty()))
        })
        .unwrap()
        .run(&mut |_| {})
        .unwrap();
        format!("{r:?}")
    };
    assert!(run(&cfg) == run(&with_store), "leaving the unused SSD store out changed the result");

    let hybrid = Scenario::from_toml(SSD_SCENARIO).unwrap().scaled();
    assert!(dd_lab::backend_config(&hybrid, dir.path()).ssd_pages > 0, "a spec uses it");
    let mut resized = sc.clone();
    resized.timeline.push(dd_lab::scenario::Event::SetCapacity {
        at_s: 10.0,
        store: dd_engine::StoreKind::Ssd,
        mib: 16.0,
    });
    assert!(dd_lab::backend_config(&resized, dir.path()).ssd_pages > 0, "the timeline resizes it");
}

/// `cache_order` reaches the engine. A file A is read, pushed out of the pool by a scan, read again,
/// then a second scan runs and A is read a third time. A FIFO pool has given A up to the second scan,
/// so the third read misses. An S3-FIFO pool remembers A in its ghost queue when A comes back, keeps it
/// in the main queue, and lets the second scan's pages (new, never seen) go through the small queue
/// alone, so the third read of A hits. LRU evicts as FIFO does in an exclusive pool (every hit removes
/// the page). An unknown order is refused naming the field.
#[test]
fn a_containers_cache_order_is_its_pools_eviction_order() {
    let dir = tempfile::tempdir().unwrap();
    let csv = "object,index,pages,op\n1,0,100,R\n2,0,300,R\n1,0,100,R\n3,0,300,R\n1,0,100,R\n";
    std::fs::write(dir.path().join("scan.csv"), csv).unwrap();
    let mem_hits = |order: &str| {
        let mut sc = Scenario::trace_replay("scan.csv", 16, 1.0, 100_000.0);
        sc.vms[0].containers[0].cache_order = serde_json::from_value(serde_json::json!(order)).unwrap();
        // One page at a time, so that the order alone picks what goes (a 2 MiB batch empties the pool).
        sc.host.eviction_batch_mib = 1.0 / 256.0;
        sc.sample_interval_s = 1000.0;
        let opts = RunOptions { base_dir: Some(dir.path().to_path_buf()), ..Default::default() };
        let res = run_scenario(&sc, &opts, &mut |_, _| {}).unwrap();
        let t = &res.runs[0].totals[0];
        assert_eq!(t.pc_hits + t.pc_misses, 900, "the whole trace was replayed once");
        t.mem_hits
    };
    let (fifo, lru, s3) = (mem_hits("fifo"), mem_hits("lru"), mem_hits("s3-fifo"));
    assert_eq!(fifo, 0, "the scans push A out of a FIFO pool");
    assert_eq!(lru, fifo, "an exclusive LRU pool evicts in FIFO order");
    assert_eq!(s3, 100, "S3-FIFO's main queue keeps all of A through the second scan");
    let bad = "name = \"x\"\nduration_s = 10\n[[vms]]\nname = \"vm\"\nmemory_mib = 64\n[[vms.containers]]\n\
               name = \"c\"\ncache_order = \"mru\"\nworkload = { kind = \"trace\", path = \"scan.csv\" }\n";
    let err = Scenario::from_toml(bad).unwrap_err().to_string();
    assert!(err.contains("cache_order"), "{err}");
}
