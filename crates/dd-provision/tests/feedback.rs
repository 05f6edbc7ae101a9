//! The closed loop (`dd_provision::feedback`) against synthetic systems whose real throughput differs
//! from what the model predicts: the regression tests of issue 27 (a prediction above a learnt ceiling,
//! a silent miss, oscillation between two plans, decisions before the curves have data), and the loop
//! never settling below an allocation it measured.

mod common;

use common::*;
use dd_provision::*;

fn ct(name: &str, file: Curve, anon: Option<Curve>, target: Option<f64>) -> ContainerInput {
    let anon_per_op = if anon.is_some() { 1.0 } else { 0.0 };
    ContainerInput {
        name: name.into(),
        file_curve: file,
        anon_curve: anon,
        demand: Demand {
            concurrency: 1.0,
            max_ops_s: None,
            file_reads_per_op: if anon_per_op > 0.0 { 0.0 } else { 1.0 },
            anon_accesses_per_op: anon_per_op,
            other_ns_per_op: 50_000.0,
            file_miss_ns: None,
            anon_miss_ns: None,
        },
        target: target.map(|ops_s| Target::Throughput { ops_s }),
        min_memory_pages: 0,
        observed: None,
    }
}

fn budget(memory: u64) -> Budget {
    Budget { memory_pages: memory, mem_cache_pages: 0, ssd_cache_pages: 0 }
}

fn cfg() -> ProvisionConfig {
    ProvisionConfig { steps: 16, ..ProvisionConfig::default() }
}

fn measured(ops_s: f64) -> Option<Measured> {
    Some(Measured { ops_s, latency_ms: 1e3 / ops_s.max(1e-9), hit_ratio: 1.0 })
}

/// Runs the loop `rounds` decisions against `truth` (container index, its allocation -> real ops/s),
/// returning every decision. Before its first plan the containers run with an even split of memory,
/// which the loop is told is in force.
fn drive(
    inputs: &[ContainerInput],
    b: &Budget,
    cfg: &ProvisionConfig,
    rounds: usize,
    truth: impl Fn(usize, &Allocation) -> f64,
) -> Vec<Decision> {
    let even = Allocation { memory_pages: b.memory_pages / inputs.len() as u64, ..Default::default() };
    drive_from(inputs, b, cfg, rounds, (vec![even; inputs.len()], true), truth)
}

/// [`drive`] from allocation `start.0` before the first plan; told to the loop (`in_force`) if `start.1`
/// (a real guest's provisioner is not: it starts from whatever the mount and the pools had).
fn drive_from(
    inputs: &[ContainerInput],
    b: &Budget,
    cfg: &ProvisionConfig,
    rounds: usize,
    start: (Vec<Allocation>, bool),
    truth: impl Fn(usize, &Allocation) -> f64,
) -> Vec<Decision> {
    let mut c = Controller::new();
    let mut applied: Option<Vec<Allocation>> = None;
    let mut out = Vec::new();
    for _ in 0..rounds {
        let now = applied.clone().unwrap_or_else(|| start.0.clone());
        if applied.is_none() && start.1 {
            let names: Vec<String> = inputs.iter().map(|c| c.name.clone()).collect();
            c.in_force(&names, &now, false);
        }
        let m: Vec<Option<Measured>> = (0..inputs.len()).map(|i| measured(truth(i, &now[i]))).collect();
        let d = c.decide(inputs, &m, &lat(), b, cfg).unwrap();
        if let Some(p) = &d.plan {
            applied = Some(p.containers.iter().map(|c| c.allocation).collect());
        }
        out.push(d);
    }
    out
}

fn allocs(d: &Decision) -> Vec<u64> {
    d.plan.as_ref().unwrap().containers.iter().map(|c| c.allocation.memory_pages).collect()
}

#[test]
fn regression_a_single_thread_was_predicted_above_what_it_can_issue() {
    // The review's scanner: one thread, 50 us of CPU per operation, so at most 20 000 ops/s. Its measured
    // time per operation was less than the model's memory part at its residency (the model charged
    // misses the real run did not have), and the calibration set its non-memory time to nothing: the
    // plan predicted ten times what one thread can issue.
    let mut scan = ct("scan", linear(1000), None, None);
    scan.observed = Some(reading(100.0, 60_000.0));
    let p = provision(&[scan], None, &lat(), &budget(2000), &cfg()).unwrap();
    let x = p.containers[0].predicted.ops_s;
    assert!(x <= 1e9 / 50_000.0 * 1.0001, "predicted {x} ops/s for one thread of 50 us per operation");
}

#[test]
fn regression_a_prediction_above_a_learnt_ceiling() {
    // The model believes the container's working set fits in 600 pages (a cliff); in truth it never
    // goes above 2 400 ops/s whatever it gets (starved by something the model does not see). Once the
    // loop has measured it at a large allocation, no allocation up to that one is predicted above it.
    let a = ct("a", all_misses(), Some(cliff(600)), Some(15_000.0));
    let b = ct("b", linear(1000), None, None);
    let ds = drive(&[a, b], &budget(1600), &cfg(), 16, |i, al| {
        if i == 0 {
            2_400.0
        } else {
            1e9 / (50_000.0 + 4e6 * (1.0 - (al.memory_pages as f64 / 1000.0).min(1.0)))
        }
    });
    // (The first decision waits out the start; a plan's first interval is its transient; a bound needs
    // an allocation measured in two intervals, and the loop first tries steps towards the target, each
    // measured once: by the twelfth decision it has them.)
    for d in &ds[11..] {
        let p = d.plan.as_ref().unwrap();
        let pred = p.containers[0].predicted.ops_s;
        assert!(pred <= 2_400.0 * 1.06, "predicted {pred} after measuring 2 400: {d:#?}");
        assert_eq!(d.containers[0].state, TargetState::Infeasible, "{d:#?}");
    }
    // And the correction says how far off the model was.
    assert!(ds.last().unwrap().containers[0].correction < 0.5);
}

#[test]
fn regression_a_missed_target_was_reported_feasible() {
    // The model predicts that the scanner meets 15 738 ops/s; it measures 11 259 at every allocation.
    // Every decision of the open loop said "feasible" with nothing reported: now the miss is reported
    // after `report_after` intervals, with what was predicted and measured, and the plan is not
    // feasible.
    let scan = ct("scan", linear(800), None, Some(15_738.0));
    let web = ct("web", linear(800), None, None);
    let ds = drive(&[scan, web], &budget(1600), &cfg(), 6, |i, _| if i == 0 { 11_259.0 } else { 5_000.0 });
    let after = cfg().feedback.report_after as usize;
    for d in &ds[after..] {
        let s = &d.containers[0];
        assert!(matches!(s.state, TargetState::Missed | TargetState::Infeasible), "{d:#?}");
        assert!(s.missed_intervals as usize > after - 1);
        assert_eq!(s.measured_ops_s, Some(11_259.0));
        assert!(s.predicted_ops_s.is_some());
        let p = d.plan.as_ref().unwrap();
        assert!(!p.feasible, "{d:#?}");
    }
    assert!(
        ds.last().unwrap().missed().contains(&"scan".to_string())
            || !ds.last().unwrap().plan.as_ref().unwrap().infeasible.is_empty()
    );
}

#[test]
fn regression_the_plan_oscillated_between_two_allocations() {
    // Two containers whose real curves are not what the model sees: the model believes `a` gains from
    // every page up to 1 200, but `a` is flat above 400 in truth, while `b` gains up to 1 200. The open
    // loop keeps moving memory to `a`; the closed loop measures, goes to what measured best, and stays.
    let a = ct("a", linear(1200), None, None);
    let b = ct("b", linear(300), None, None);
    let truth = |i: usize, al: &Allocation| {
        let m = al.memory_pages as f64;
        let miss = if i == 0 { 1.0 - (m / 400.0).min(1.0) } else { 1.0 - (m / 1200.0).min(1.0) };
        1e9 / (50_000.0 + 4e6 * miss * 0.05)
    };
    let ds = drive(&[a, b], &budget(1600), &cfg(), 30, truth);
    let tail: Vec<Vec<u64>> = ds[15..].iter().map(allocs).collect();
    let changes = tail.windows(2).filter(|w| w[0] != w[1]).count();
    assert_eq!(changes, 0, "the plan still moves after 15 decisions: {tail:?}");
    // And it settled where the truth is best, not where the model said.
    let last = &tail[tail.len() - 1];
    let total = |al: &[u64]| {
        al.iter()
            .enumerate()
            .map(|(i, &m)| truth(i, &Allocation { memory_pages: m, ..Default::default() }))
            .sum::<f64>()
    };
    let best = (1..16u64).map(|k| total(&[k * 100, 1600 - k * 100])).fold(0.0, f64::max);
    // (The grid's unit is 100 pages and the plan shares unused memory evenly, so the truth's best split,
    // 400 and 1 200, is between two points it can take.)
    assert!(total(last) >= best * 0.9, "settled at {last:?}: {} of the best {best}", total(last));
}

#[test]
fn regression_early_decisions_before_the_curves_had_data() {
    // A decision before any container was measured: the open loop planned from empty curves, listed
    // containers as infeasible and gave one a memory limit of one page. Now it waits (no plan), reports
    // the containers as learning, and once they are measured no container gets less than a unit.
    let a = ct("a", all_misses(), None, Some(1_000.0));
    let b = ct("b", all_misses(), Some(cliff(1500)), Some(1_000.0));
    let mut c = Controller::new();
    let d = c.decide(&[a.clone(), b.clone()], &[None, None], &lat(), &budget(1600), &cfg()).unwrap();
    assert!(d.plan.is_none(), "{d:#?}");
    assert_eq!(d.source, Source::Learning);
    assert!(d.containers.iter().all(|s| s.state == TargetState::Learning));
    let d = c.decide(&[a, b], &[measured(900.0), measured(900.0)], &lat(), &budget(1600), &cfg()).unwrap();
    let p = d.plan.unwrap();
    assert!(p.containers.iter().all(|c| c.allocation.memory_pages >= 1600 / 16), "{p:#?}");
}

#[test]
fn never_settles_below_a_measured_allocation() {
    // The even split, measured first, meets both targets; the model (wrong about `b`) proposes to move
    // memory away from `b`. Whatever it explores, the loop settles on an allocation that measured at
    // least as well as the even split.
    let a = ct("a", linear(1600), None, Some(2_000.0));
    let b = ct("b", linear(100), None, Some(2_000.0));
    let truth = |i: usize, al: &Allocation| {
        let m = al.memory_pages as f64;
        let miss = if i == 0 { 1.0 - (m / 1600.0).min(1.0) } else { 1.0 - (m / 800.0).min(1.0) };
        1e9 / (50_000.0 + 4e6 * miss * 0.1)
    };
    let ds = drive(&[a, b], &budget(1600), &cfg(), 25, truth);
    let even = truth(0, &Allocation { memory_pages: 800, ..Default::default() })
        + truth(1, &Allocation { memory_pages: 800, ..Default::default() });
    // Where it settles: the allocation it held most over the last ten decisions (a model plan the loop
    // has not measured may still be tried now and then, and left at the next decision if worse).
    let tail: Vec<Vec<u64>> = ds[ds.len() - 10..].iter().map(allocs).collect();
    let last = tail.iter().max_by_key(|a| tail.iter().filter(|b| b == a).count()).unwrap().clone();
    let got: f64 = last
        .iter()
        .enumerate()
        .map(|(i, &m)| truth(i, &Allocation { memory_pages: m, ..Default::default() }))
        .sum();
    let met = last
        .iter()
        .enumerate()
        .filter(|&(i, &m)| truth(i, &Allocation { memory_pages: m, ..Default::default() }) >= 2_000.0)
        .count();
    assert_eq!(met, 2, "both targets met at the end: {last:?}");
    assert!(got >= even * (1.0 - 0.05), "settled at {last:?} with {got}, the even split measured {even}");
}

#[test]
fn feedback_settings_are_validated_by_name() {
    let mut c = cfg();
    c.feedback.smoothing = 0.0;
    let e = Controller::new().decide(&[], &[], &lat(), &budget(10), &c).unwrap_err();
    assert!(e.to_string().contains("feedback.smoothing"), "{e}");
    let e = Controller::new().decide(&[ct("a", linear(10), None, None)], &[], &lat(), &budget(10), &cfg());
    assert!(e.unwrap_err().to_string().contains("measured"));
}

#[test]
fn regression_a_far_missed_target_crept_up_in_two_unit_steps() {
    // The mixes' preloaded database: the model sees no gain from memory (its curve is all first
    // references), in truth it needs 1 200 of the VM's 1 600 pages and runs at half its target below
    // them. Explorations of two units from the even split (800, then 1 000: no better, so a failed
    // exploration) never reached 1 200; a step sized by the shortfall (half the target: about twice the
    // memory) does, from the container without a target.
    let mut a = ct("a", all_misses(), None, Some(2_000.0));
    a.demand.other_ns_per_op = 1e6;
    let b = ct("b", linear(1600), None, None);
    let truth = |i: usize, al: &Allocation| {
        let m = al.memory_pages as f64;
        if i == 0 {
            if m >= 1200.0 {
                4_000.0
            } else {
                1_000.0
            }
        } else {
            1e9 / (50_000.0 + 4e6 * (1.0 - (m / 1600.0).min(1.0)) * 0.01)
        }
    };
    let ds = drive(&[a, b], &budget(1600), &cfg(), 16, truth);
    let first_met = ds.iter().position(|d| allocs(d)[0] >= 1200);
    assert!(
        first_met.is_some_and(|k| k <= 4),
        "a never got its 1 200 pages soon: {:?}",
        ds.iter().map(allocs).collect::<Vec<_>>()
    );
    let last = allocs(ds.last().unwrap());
    assert!(last[0] >= 1200, "the loop left the allocation that meets the target: {last:?}");
    assert!(last[1] >= 100, "b keeps its floor: {last:?}");
}

#[test]
fn regression_a_cliff_the_corrected_model_saw_was_never_crossed_in_bounded_steps() {
    // Seen on a real guest (`doubledecker guest provision` over the FUSE mount, 2026-11-28): a reader that
    // pauses 2-10 ms between passes over a 2 MiB file beside two busy readers of a 1.5 MiB one, with
    // 2.5 MiB of first level for both. Here: a's loop of 1 000 pages fits in memory or in the memory
    // cache, and the model, which does not see its 20 us pause an operation, predicts the cache meets
    // its target. So the first plan gives b's loop
    // the memory and a the cache, where a measures below its target. Corrected, the model sees a meet
    // it only with its whole loop in memory: 600 pages more than it has, more than bounded steps (8 of
    // 48 units) move, and nothing in between gains (a cliff). The loop must jump to the corrected plan.
    let mut a = ct("a", cliff(1000), None, Some(43_000.0));
    a.demand.other_ns_per_op = 1_000.0;
    let mut b = ct("b", cliff(1200), None, None);
    b.demand.other_ns_per_op = 1_000.0;
    b.demand.concurrency = 2.0;
    let budget = Budget { memory_pages: 1600, mem_cache_pages: 1600, ssd_cache_pages: 0 };
    let cfg = ProvisionConfig { steps: 48, ..ProvisionConfig::default() };
    // Truth: a read costs 1 us from memory, 6 us from the cache, 4 ms from the disk, plus a's pause.
    let truth = |i: usize, al: &Allocation| {
        let (wss, conc, pause) = if i == 0 { (1000, 1.0, 20_000.0) } else { (1200, 2.0, 1_000.0) };
        let read = if al.memory_pages >= wss {
            1_000.0
        } else if al.memory_pages + al.mem_cache_pages >= wss {
            6_000.0
        } else {
            4e6
        };
        conc * 1e9 / (pause + read)
    };
    // Before the loop: first levels of 64 pages each, the cache shared evenly (the pools' weights).
    let start = Allocation { memory_pages: 64, mem_cache_pages: 800, ssd_cache_pages: 0 };
    let ds = drive_from(&[a, b], &budget, &cfg, 30, (vec![start; 2], false), truth);
    let mem = |d: &Decision| allocs(d)[0];
    // The model's first plan leaves a's loop out of memory, predicted to meet the target from the cache.
    let first = ds.iter().find(|d| d.plan.is_some()).unwrap();
    assert!(mem(first) < 1000, "the first plan gives a the cache: {:?}", allocs(first));
    let crossed = ds.iter().position(|d| mem(d) >= 1000);
    assert!(
        crossed.is_some_and(|k| k <= 12),
        "a's loop never got into memory soon: {:?}",
        ds.iter().map(allocs).collect::<Vec<_>>()
    );
    let last = ds.last().unwrap();
    assert!(mem(last) >= 1000, "the loop left the allocation that meets the target: {:?}", allocs(last));
    let st = &last.containers[0];
    assert!(st.correction < 0.5, "a's model corrected: {st:?}");
}

/// 30 decisions of `first`, whose working set of 1 000 of the VM's 1 600 pages fits or misses entirely
/// (a cliff), running with 1 100 pages and meeting its target, beside a reader that misses its own (its
/// misses fall linearly with memory). Returns the decisions that left `first` less than its working set,
/// with their allocations.
fn shrunk_below_a_fitting_working_set(first: ContainerInput) -> Vec<(usize, Vec<u64>)> {
    let reader = ct("reader", linear(1600), None, Some(10_000.0));
    let truth = |i: usize, al: &Allocation| {
        let m = al.memory_pages as f64;
        let miss = match i {
            0 if m >= 1000.0 => 0.0,
            0 => 1.0,
            _ => 1.0 - (m / 1600.0).min(1.0),
        };
        1e9 / (50_000.0 + 1_000.0 + 4e6 * miss)
    };
    let start = vec![
        Allocation { memory_pages: 1100, ..Default::default() },
        Allocation { memory_pages: 500, ..Default::default() },
    ];
    let ds = drive_from(&[first, reader], &budget(1600), &cfg(), 30, (start, true), truth);
    ds.iter().map(allocs).enumerate().filter(|(_, a)| a[0] < 1000).collect()
}

#[test]
fn regression_an_exploration_took_memory_from_a_container_holding_anonymous_pages() {
    // Seen on the generated mixes (seed 26 held out, started from its balanced static allocation): a
    // key-value store whose anonymous working set fits meets its target; a file reader beside it misses
    // its own. The loop's exploration (two units moved on an optimistic bound: the donor assumed to keep
    // what it measured with more) took memory from the store, which swapped: both collapsed for the
    // rest of the window (swap-ins queue on the shared disk). Exploration takes memory only from
    // containers without anonymous memory; a step the model predicts harmless still may.
    let shrunk =
        shrunk_below_a_fitting_working_set(ct("kv", all_misses(), Some(cliff(1000)), Some(15_000.0)));
    assert!(shrunk.is_empty(), "the store was left less than its working set: {shrunk:?}");
}

#[test]
fn regression_a_shortfall_step_took_memory_from_a_heap_its_curve_underestimated() {
    // The step towards a missed target (`shortfall`) took memory from any donor its corrected
    // prediction said could spare it, a key-value store too, whose anonymous curve, built while its
    // heap was still being touched, can put the heap below its real size: the store swaps, and its
    // swap-ins, queued on the shared disk, slow every container's reads. Here the curve says 600 pages,
    // the heap is 1 000, the reader beside it misses its target: the step took the store to 600 pages
    // (then 700, 800, 900, each measured worse and undone). Exploration already took no memory from a
    // heap; the shortfall's step now takes none either.
    let shrunk = shrunk_below_a_fitting_working_set(ct("kv", all_misses(), Some(cliff(600)), Some(15_000.0)));
    assert!(shrunk.is_empty(), "the store was left less than its working set: {shrunk:?}");
}

#[test]
fn regression_an_exploration_took_a_scanner_below_its_loop_against_its_own_prediction() {
    // Seen on the generated mixes (seed 24 held out, started from its balanced static allocation): a
    // scanner whose loop fits in its memory meets its target; a reader beside it misses its own. The
    // exploration's optimistic bound assumed the scanner would keep what it measured with more, and
    // moved two units from it, below its loop, where its own corrected prediction was a collapse: its
    // misses went to the shared disk and every container on it fell 2-20x. A donor now gives only what
    // its corrected prediction says leaves its target met with the decision's headroom.
    let shrunk = shrunk_below_a_fitting_working_set(ct("scan", cliff(1000), None, Some(15_000.0)));
    assert!(shrunk.is_empty(), "the scanner was left less than its loop: {shrunk:?}");
}

/// The loop from a start allocation told to it (`in_force`) as chosen, against a container `a` whose
/// throughput climbs over the first intervals under it (`ramp`, then 19 000 ops/s), whatever the loop
/// does meanwhile; `b` reads files. Returns `a`'s memory at every decision and the last decision.
fn from_a_recovering_chosen_start() -> (Vec<u64>, Decision) {
    let a = ct("a", all_misses(), Some(cliff(800)), Some(15_000.0));
    let b = ct("b", linear(1000), None, None);
    let inputs = [a, b];
    let names: Vec<String> = inputs.iter().map(|c| c.name.clone()).collect();
    let start = vec![
        Allocation { memory_pages: 900, ..Default::default() },
        Allocation { memory_pages: 700, ..Default::default() },
    ];
    let ramp = [1_500.0, 4_000.0, 9_000.0, 19_000.0];
    let mut c = Controller::new();
    c.in_force(&names, &start, true);
    let mut now = start;
    let (mut a_memory, mut last) = (Vec::new(), None);
    for round in 0..12 {
        let a_ops = if now[0].memory_pages < 800 { 2_000.0 } else { *ramp.get(round).unwrap_or(&19_000.0) };
        let b_ops = 1e9 / (50_000.0 + 4e6 * (1.0 - (now[1].memory_pages as f64 / 1000.0).min(1.0)));
        let d =
            c.decide(&inputs, &[measured(a_ops), measured(b_ops)], &lat(), &budget(1600), &cfg()).unwrap();
        if let Some(p) = &d.plan {
            now = p.containers.iter().map(|c| c.allocation).collect();
        }
        a_memory.push(now[0].memory_pages);
        last = Some(d);
    }
    (a_memory, last.unwrap())
}

#[test]
fn regression_a_chosen_start_allocation_was_left_on_its_recovery_transient() {
    // The mixes of issue 27 from their balanced start: the allocation is set after a warm-up that swapped
    // a heap out, and the container climbs back over several intervals. Judged on the first of them
    // (the start settled one interval), the allocation looked like one that fails and the loop moved
    // memory away from it, so the heap never came back. A chosen start settles as a change does.
    let (a_memory, last) = from_a_recovering_chosen_start();
    assert!(a_memory[..4].iter().all(|&m| m == 900), "a's memory during its recovery: {a_memory:?}");
    assert!(a_memory.iter().all(|&m| m >= 800), "a's memory: {a_memory:?}");
    assert_eq!(last.containers[0].state, TargetState::Met, "{last:#?}");
}

#[test]
fn regression_a_filling_container_had_its_memory_taken_while_it_filled() {
    // The mixes of issue 27 (seed 14 from its balanced start): a database given 80 MiB fills it from the
    // disk at 1.7 MiB/s, 1-2 k ops/s until its working set is in, then 34 k. The loop read the fill as
    // what the allocation gives and took its memory (80 -> 59 -> 40 -> 19 MiB): the fill never finished.
    // While a container's memory grows at the limits it was given and its throughput does not fall, its
    // measurement is not recorded and no plan takes that memory.
    let (a_memory, last) = from_a_filling_chosen_start(&cfg());
    assert!(a_memory.iter().all(|&m| m >= 900), "a's memory while and after it filled: {a_memory:?}");
    assert_eq!(last.containers[0].state, TargetState::Met, "{last:#?}");
}

#[test]
fn a_fill_floor_turned_off_lets_the_loop_take_a_filling_containers_memory() {
    // The same system with `max_fill_intervals = 0`: the loop judges the fill as the allocation and
    // moves memory away (what the regression test above guards against, shown to happen without it).
    let mut off = cfg();
    off.feedback.max_fill_intervals = 0;
    let (a_memory, _) = from_a_filling_chosen_start(&off);
    assert!(a_memory.iter().any(|&m| m < 900), "a's memory: {a_memory:?}");
}

/// What a container that reads only files observed: `file_pages` of page cache, no heap, nothing in the
/// caches.
fn reading(file_pages: f64, ns_per_op: f64) -> Observed {
    Observed { file_pages, anon_pages: 0.0, mem_cache_pages: 0.0, ssd_cache_pages: 0.0, ns_per_op }
}

/// The time per operation of `b` in the chosen-start systems below: 50 us, plus a 4 ms disk read for the
/// share of its 1,000 pages of files that `pages` of memory leave out.
fn b_ns_per_op(pages: f64) -> f64 {
    50_000.0 + 4e6 * (1.0 - (pages / 1000.0).min(1.0))
}

/// A controller told that someone chose the start allocation: 900 pages for the first container, 700
/// for the second. Returns it and that allocation.
fn from_900_and_700(inputs: &[ContainerInput]) -> (Controller, Vec<Allocation>) {
    let names: Vec<String> = inputs.iter().map(|c| c.name.clone()).collect();
    let start = vec![
        Allocation { memory_pages: 900, ..Default::default() },
        Allocation { memory_pages: 700, ..Default::default() },
    ];
    let mut c = Controller::new();
    c.in_force(&names, &start, true);
    (c, start)
}

/// The loop from a chosen start that gives `a` 900 pages and `b` 700, against an `a` that fills its
/// memory from the disk at 60 pages an interval (throughput rising slowly with what it holds, file hit
/// ratio below 1) and reaches 19 000 ops/s once 800 pages are in (its target is 15 000); `b` reads
/// files. Returns `a`'s memory at every decision and the last decision.
fn from_a_filling_chosen_start(cfg: &ProvisionConfig) -> (Vec<u64>, Decision) {
    let inputs = [ct("a", linear(1000), None, Some(15_000.0)), ct("b", linear(1000), None, None)];
    let (mut c, mut now) = from_900_and_700(&inputs);
    let mut held_a = 100.0_f64;
    let (mut a_memory, mut last) = (Vec::new(), None);
    for _ in 0..24 {
        held_a = (held_a + 60.0).min(now[0].memory_pages as f64);
        let filled = held_a >= 800.0;
        let a_ops = if filled { 19_000.0 } else { 1_000.0 + held_a };
        let b_pages = now[1].memory_pages as f64;
        let b_ops = 1e9 / b_ns_per_op(b_pages);
        let mut ins = inputs.clone();
        ins[0].observed = Some(reading(held_a, 1e9 / a_ops));
        ins[1].observed = Some(reading(b_pages, 1e9 / b_ops));
        let m = [
            Some(Measured {
                ops_s: a_ops,
                latency_ms: 1e3 / a_ops,
                hit_ratio: if filled { 1.0 } else { held_a / 1000.0 },
            }),
            measured(b_ops),
        ];
        let d = c.decide(&ins, &m, &lat(), &budget(1600), cfg).unwrap();
        if let Some(p) = &d.plan {
            now = p.containers.iter().map(|c| c.allocation).collect();
        }
        a_memory.push(now[0].memory_pages);
        last = Some(d);
    }
    (a_memory, last.unwrap())
}

#[test]
fn regression_a_target_was_judged_infeasible_while_its_container_read_its_data_for_the_first_time() {
    // The mixes of issue 27 (seed 94 from its balanced start): a web server reading its 75 MiB for the
    // first time climbed 1,554 -> 12,617 ops/s over four intervals towards its 28,600 target, which it
    // meets from the next one when its allocation is held. Its first references from the disk were in
    // its measured time, so in the model's `other`: its ceiling came out at 14,140 ops/s, its target was
    // judged infeasible, and the plan gave its neighbours the cache it needed. While a container's
    // first references take a large part of its time and their share falls fast, its target is not
    // judged infeasible and no plan takes its memory.
    let (a_memory, states, last) = from_a_first_pass(&cfg());
    assert!(!states.contains(&TargetState::Infeasible), "a's states: {states:?}");
    assert!(a_memory.iter().all(|&m| m >= 800), "a's memory during and after its first pass: {a_memory:?}");
    assert_eq!(last.containers[0].state, TargetState::Met, "{last:#?}");
}

#[test]
fn first_pass_detection_turned_off_lets_the_loop_give_up_a_target_during_the_first_pass() {
    // The same system with `first_pass_time_share = 1`: the target is judged infeasible while the data
    // comes in and the container's memory goes to its neighbour (what the test above guards against).
    let mut off = cfg();
    off.feedback.first_pass_time_share = 1.0;
    let (a_memory, states, _) = from_a_first_pass(&off);
    assert!(states.contains(&TargetState::Infeasible), "a's states: {states:?}");
    assert!(a_memory.iter().any(|&m| m < 800), "a's memory: {a_memory:?}");
}

/// The loop from a chosen start that gives `a` 900 pages and `b` 700. `a` needs its 800 pages (a cliff)
/// and reads each page once per operation; the share of its references that are first references
/// starts at 0.6 and falls by 45% each interval (its first pass ends), and every one of them is a 4 ms
/// read from the disk; its target is 12,000 ops/s, which it reaches once the share is below about 1%.
/// `b` reads files over 1,000 pages, gaining with every page (no target). Returns `a`'s memory and state
/// at every decision and the last decision.
fn from_a_first_pass(cfg: &ProvisionConfig) -> (Vec<u64>, Vec<TargetState>, Decision) {
    let a_curve = |floor: f64| Curve::new(Unit::Pages, vec![799, 800], vec![1.0, floor]).unwrap();
    let inputs = [ct("a", a_curve(0.6), None, Some(12_000.0)), ct("b", linear(1000), None, None)];
    let (mut c, mut now) = from_900_and_700(&inputs);
    let mut floor = 0.6_f64;
    let (mut a_memory, mut states, mut last) = (Vec::new(), Vec::new(), None);
    for _ in 0..24 {
        let a_pages = now[0].memory_pages as f64;
        let a_ns = if a_pages >= 800.0 { 51_000.0 + floor * 4e6 } else { 50_000.0 + 4e6 };
        let b_pages = now[1].memory_pages as f64;
        let b_ns = b_ns_per_op(b_pages);
        let mut ins = inputs.clone();
        ins[0].file_curve = a_curve(floor);
        ins[0].observed = Some(reading(a_pages.min(800.0), a_ns));
        ins[1].observed = Some(reading(b_pages.min(1000.0), b_ns));
        let a_hit = if a_pages >= 800.0 { 1.0 - floor } else { 0.0 };
        let m = [
            Some(Measured { ops_s: 1e9 / a_ns, latency_ms: a_ns / 1e6, hit_ratio: a_hit }),
            measured(1e9 / b_ns),
        ];
        let d = c.decide(&ins, &m, &lat(), &budget(1600), cfg).unwrap();
        if let Some(p) = &d.plan {
            now = p.containers.iter().map(|c| c.allocation).collect();
        }
        a_memory.push(now[0].memory_pages);
        states.push(d.containers[0].state);
        last = Some(d);
        floor = if floor > 0.002 { floor * 0.55 } else { 0.0 };
    }
    (a_memory, states, last.unwrap())
}
