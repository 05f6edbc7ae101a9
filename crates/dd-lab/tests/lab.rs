//! End-to-end tests of the lab: exact LRU against an independent reference (acceptance 3) and
//! determinism (acceptance 4).

use dd_lab::{bundled, report, run_scenario, RunOptions, Scenario};
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

fn outputs(seed: u64, jobs: usize) -> (String, String) {
    let sc = bundled::get("fig3-4-global-share").unwrap();
    let opts = RunOptions { scale: Some(0.02), seed: Some(seed), jobs: Some(jobs), ..Default::default() };
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
