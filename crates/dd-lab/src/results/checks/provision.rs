//! Results of provisioning: searches collapsed to their best candidate, the `targets` and `violation`
//! checks, and the measured standing of each container against its target.
//!
//! A searching variant's candidates run as variants of their own; [`collapse`] then puts the best one in
//! the searching variant's place, under its name, so that every check, plot and summary treats it as the
//! variant, and keeps each candidate's score for `summary.json`. Scores use only emulated results, so
//! the pick is as deterministic as the runs.

use super::measure;
use crate::scenario::provision::{Expect, Pick, TargetsCheck, ViolationCheck};
use crate::scenario::{Measure, Metric, Scenario, Variant};
use crate::sim::RunResult;
use dd_provision::Target;
use serde::Serialize;

/// One candidate of a search and how it did.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Candidate {
    pub name: String,
    pub targets_met: usize,
    /// Rounded to 0.001 ops/s as `summary.json` shows it.
    pub throughput_ops_s: f64,
    pub violation_s: f64,
    /// The throughput the pick compares (before rounding): a sweep's points carry it so that the best
    /// of a search run as points is the one the search itself picks ([`best`]).
    #[serde(skip)]
    pub unrounded_throughput_ops_s: f64,
}

/// A searching variant: every candidate tried, and the one that stands for it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SearchResult {
    pub variant: String,
    pub best: String,
    pub candidates: Vec<Candidate>,
}

/// Containers with a target, with it.
fn targeted(sc: &Scenario) -> Vec<(String, Target)> {
    sc.containers().filter_map(|(_, _, c)| c.target.map(|t| (c.name.clone(), t))).collect()
}

fn window_measure(run: &str, entity: &str, metric: Metric, from: Option<f64>, to: Option<f64>) -> Measure {
    Measure { variant: Some(run.to_string()), entity: entity.to_string(), metric, from_s: from, to_s: to }
}

/// Whether a container meets its target in a run over a window (the `targets` check's test: the mean
/// over the window against the target), with the measured value as text.
pub fn standing(
    runs: &[RunResult],
    run: &str,
    name: &str,
    t: &Target,
    from: Option<f64>,
    to: Option<f64>,
) -> Result<(bool, String), String> {
    let m = |metric| measure(runs, &window_measure(run, name, metric, from, to));
    Ok(match *t {
        Target::Throughput { ops_s } => {
            let x = m(Metric::Throughput)?;
            (x >= ops_s, format!("{name} {x:.1} ops/s (target {ops_s})"))
        }
        Target::MeanLatency { ms } => {
            let x = m(Metric::LatencyMs)?;
            (x <= ms, format!("{name} {x:.3} ms (target {ms})"))
        }
        Target::HitRatio { ratio } => {
            let x = hit_ratio(runs, run, name, from, to)?;
            (x >= ratio, format!("{name} hit ratio {x:.3} (target {ratio})"))
        }
    })
}

/// Of a container's page accesses in the window, the fraction not read from the disk.
fn hit_ratio(
    runs: &[RunResult],
    run: &str,
    name: &str,
    from: Option<f64>,
    to: Option<f64>,
) -> Result<f64, String> {
    let r = runs.iter().find(|r| r.variant == run).ok_or_else(|| format!("no variant {run}"))?;
    let ct = r.containers.iter().position(|c| c.0 == name).ok_or_else(|| format!("no container {name}"))?;
    let (from, to) = (from.unwrap_or(0.0), to.unwrap_or(r.duration_s));
    let (mut acc, mut disk) = (0u64, 0u64);
    for s in r.samples.iter().filter(|s| s.ct == ct && s.t_s > from + 1e-9 && s.t_s <= to + 1e-9) {
        acc += s.pc_hits + s.pc_misses;
        disk += s.disk_reads;
    }
    Ok(if acc == 0 { 0.0 } else { 1.0 - (disk.min(acc) as f64 / acc as f64) })
}

/// Seconds a container of a run spends below its target in the window, sample by sample (the
/// `violation` check's measure).
pub fn violation_s(sc: &Scenario, run: &RunResult, name: &str, t: &Target, from: f64, to: f64) -> f64 {
    let Some(ct) = run.containers.iter().position(|c| c.0 == name && c.2) else { return 0.0 };
    let dt = sc.sample_interval_s;
    run.samples
        .iter()
        .filter(|s| s.ct == ct && s.running && s.t_s > from + 1e-9 && s.t_s <= to + 1e-9)
        .filter(|s| {
            let ops_s = s.ops as f64 / dt;
            let ms = if s.ops > 0 { s.lat_ns as f64 / s.ops as f64 / 1e6 } else { f64::INFINITY };
            let acc = s.pc_hits + s.pc_misses;
            let hit = if acc == 0 { 0.0 } else { 1.0 - s.disk_reads.min(acc) as f64 / acc as f64 };
            !t.met_by_measured(ops_s, ms, hit)
        })
        .count() as f64
        * dt
}

/// Puts each searching variant's best candidate in its place (see the module doc). `ran` are the
/// variants in the order `runs` came back.
pub fn collapse(sc: &Scenario, ran: &[Variant], runs: Vec<RunResult>) -> (Vec<RunResult>, Vec<SearchResult>) {
    if ran.iter().all(|v| v.search_of.is_none()) {
        return (runs, Vec::new());
    }
    let targets = targeted(sc);
    let mut out = Vec::new();
    let mut searches = Vec::new();
    let mut slots: Vec<Option<RunResult>> = runs.into_iter().map(Some).collect();
    for v in sc.variant_list() {
        let Some(search) = &v.search else {
            if let Some(i) = ran.iter().position(|r| r.name == v.name && r.search_of.is_none()) {
                out.extend(slots[i].take());
            }
            continue;
        };
        let members: Vec<usize> = ran
            .iter()
            .enumerate()
            .filter(|(_, r)| r.search_of.as_deref() == Some(&v.name))
            .map(|(i, _)| i)
            .collect();
        let all: Vec<RunResult> = members.iter().filter_map(|&i| slots[i].clone()).collect();
        let mut cands = Vec::new();
        for r in &all {
            let mut met = 0;
            let mut viol = 0.0;
            let (from, to) = (search.from_s.unwrap_or(0.0), search.to_s.unwrap_or(r.duration_s));
            for (n, t) in &targets {
                if standing(&all, &r.variant, n, t, search.from_s, search.to_s).is_ok_and(|s| s.0) {
                    met += 1;
                }
                viol += violation_s(sc, r, n, t, from, to);
            }
            let x: f64 = r
                .containers
                .iter()
                .filter(|c| c.2)
                .filter_map(|c| {
                    measure(
                        &all,
                        &window_measure(&r.variant, &c.0, Metric::Throughput, search.from_s, search.to_s),
                    )
                    .ok()
                })
                .sum();
            cands.push(Candidate {
                name: r.variant.clone(),
                targets_met: met,
                throughput_ops_s: x,
                violation_s: viol,
                unrounded_throughput_ops_s: x,
            });
        }
        let Some(best) = best(search.pick, &cands) else {
            continue;
        };
        if let Some(mut r) = slots[members[best]].take() {
            r.variant = v.name.clone();
            out.push(r);
        }
        for c in &mut cands {
            c.throughput_ops_s = (c.throughput_ops_s * 1000.0).round() / 1000.0;
        }
        searches.push(SearchResult {
            variant: v.name.clone(),
            best: cands[best].name.clone(),
            candidates: cands,
        });
    }
    (out, searches)
}

/// The index of the candidate a search picks (the first of the best, in candidate order), `None` when
/// there are none. Compares the unrounded throughputs.
pub fn best(pick: Pick, cands: &[Candidate]) -> Option<usize> {
    let better = |a: &Candidate, b: &Candidate| match pick {
        Pick::Throughput => {
            (a.targets_met, a.unrounded_throughput_ops_s) > (b.targets_met, b.unrounded_throughput_ops_s)
        }
        Pick::Violation => {
            a.violation_s < b.violation_s
                || (a.violation_s == b.violation_s
                    && a.unrounded_throughput_ops_s > b.unrounded_throughput_ops_s)
        }
    };
    (0..cands.len()).reduce(|b, i| if better(&cands[i], &cands[b]) { i } else { b })
}

fn names_or_all(sc: &Scenario, entities: &[String]) -> Vec<(String, Target)> {
    let all = targeted(sc);
    if entities.is_empty() {
        all
    } else {
        all.into_iter().filter(|(n, _)| entities.contains(n)).collect()
    }
}

/// `targets`: every listed container meets (or, with `expect = "missed"`, misses) its target.
pub fn eval_targets(sc: &Scenario, runs: &[RunResult], c: &TargetsCheck) -> Result<(bool, String), String> {
    let run = match &c.variant {
        Some(v) => v.clone(),
        None => runs.first().map(|r| r.variant.clone()).ok_or("no run")?,
    };
    let mut all = true;
    let mut any = false;
    let mut parts = Vec::new();
    for (n, t) in names_or_all(sc, &c.entities) {
        let (met, text) = standing(runs, &run, &n, &t, c.from_s, c.to_s)?;
        let this = match c.expect {
            Expect::Met => met,
            Expect::Missed => !met,
            // Each one that misses is what the check looks for.
            Expect::NotAllMet => !met,
        };
        all &= this;
        any |= this;
        let mark = match (c.expect, this) {
            (Expect::NotAllMet, true) => " MISSED",
            (Expect::NotAllMet, false) | (_, true) => "",
            (_, false) => " FAIL",
        };
        parts.push(format!("{text}{mark}"));
    }
    let (ok, want) = match c.expect {
        Expect::Met => (all, "every target met"),
        Expect::Missed => (all, "every target missed"),
        Expect::NotAllMet => (any, "at least one target missed"),
    };
    Ok((ok, format!("{run}: {} (want {want})", parts.join("; "))))
}

/// `violation`: the variant's total time below target is at most `max_ratio` of the baseline's.
pub fn eval_violation(
    sc: &Scenario,
    runs: &[RunResult],
    c: &ViolationCheck,
) -> Result<(bool, String), String> {
    let find = |v: &str| runs.iter().find(|r| r.variant == v).ok_or_else(|| format!("no variant {v}"));
    let (run, base) = (find(&c.variant)?, find(&c.baseline)?);
    let (from, to) = (c.from_s.unwrap_or(0.0), c.to_s.unwrap_or(run.duration_s));
    let total = |r: &RunResult| -> f64 {
        names_or_all(sc, &c.entities).iter().map(|(n, t)| violation_s(sc, r, n, t, from, to)).sum()
    };
    let (a, b) = (total(run), total(base));
    // A baseline that never misses a target leaves nothing to compare with: that fails the check.
    let ok = b > 0.0 && a <= c.max_ratio * b;
    Ok((
        ok,
        format!(
            "time below target: {} {a:.1} s, {} {b:.1} s -> ratio {} (want <= {})",
            c.variant,
            c.baseline,
            if b > 0.0 { format!("{:.3}", a / b) } else { "n/a".into() },
            c.max_ratio
        ),
    ))
}
