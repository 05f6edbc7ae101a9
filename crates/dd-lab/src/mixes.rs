//! The evaluation harness of generated mixes (issue 27): for each seed, the mix of
//! [`crate::scenario::mixgen`], its static grid swept without targets, targets derived from the sweep,
//! the VM-level provisioner run against them, and how it did against the best static allocation.
//!
//! One mix ([`run_mix`]):
//! 1. **Sweep.** Every candidate of the `static` search runs as a variant of its own (the candidates of
//!    the scaled scenario, as `lab run` expands them), with no targets: the runs do not depend on targets
//!    (only the provisioner reads them), so these are the search's own runs.
//! 2. **Targets.** The *balanced* candidate is the one whose worst container does best relative to that
//!    container's best throughput over the grid (ties: the higher total); each container's target is
//!    `target_fraction` of its mean throughput there over the window, rounded down to three significant
//!    figures. So a static allocation meets every target by construction.
//! 3. **Runs.** The provisioner variant runs with those targets; the best static allocation is the
//!    sweep's runs collapsed as the lab collapses a search (`results::search::collapse`: most
//!    targets met over the window, then the highest total throughput).
//! 4. **Scores** ([`MixOutcome`]), with the lab's check semantics: a target is met when the mean over the
//!    window meets it (`targets`), time below target is the sum of the sampling intervals below it
//!    (`violation`), total throughput is the sum of the containers' mean throughputs over the window;
//!    a missed target is *reported* when a decision of the provisioner in the window named it missed or
//!    infeasible ([`reported_misses`]).
//!
//! [`verdicts`] holds a set of mixes to the targets ([`ALL_MET_MIN`], [`TOTAL_RATIO_MIN`],
//! [`BELOW_RATIO_MAX`], every miss reported). Everything here is a function of the emulated runs, so the
//! same seeds and knobs give the same outcomes, tables and files, whatever `jobs`.

use crate::error::LabError;
use crate::results::search as prov_checks;
use crate::scenario::checks::measure;
use crate::scenario::checks::targets::standing;
use crate::scenario::checks::violation::violation_s;
use crate::scenario::mixgen::{self, MixConfig, MixKind, PROVISIONER, STATIC};
use crate::scenario::{Measure, Metric, Scenario};
use crate::sim::Decision;
use crate::sim::{budget, RunResult};
use crate::{prepare, run_prepared, RunOptions};
use dd_provision::Target;
use serde::Serialize;
use std::collections::BTreeSet;
use std::fmt::Write as _;
use std::path::PathBuf;

/// The targets: in at least this fraction of the feasible mixes the provisioner meets every
/// target,
pub const ALL_MET_MIN: f64 = 0.9;
/// its total throughput is at least this fraction of the best static allocation's in every mix,
pub const TOTAL_RATIO_MIN: f64 = 0.95;
/// and its time below target at most this fraction of the best static allocation's.
pub const BELOW_RATIO_MAX: f64 = 0.25;

/// How to run mixes.
#[derive(Debug, Clone)]
pub struct MixOptions {
    pub generator: MixConfig,
    /// Targets are this fraction of the balanced candidate's throughput. Default 0.9.
    pub target_fraction: f64,
    /// Variants side by side (see [`RunOptions::jobs`]).
    pub jobs: Option<usize>,
    /// See [`RunOptions::scratch_dir`].
    pub scratch_dir: Option<PathBuf>,
    /// See [`RunOptions::host_memory`].
    pub host_memory: Option<budget::HostMemory>,
}

impl Default for MixOptions {
    fn default() -> Self {
        MixOptions {
            generator: MixConfig::default(),
            target_fraction: 0.9,
            jobs: None,
            scratch_dir: None,
            host_memory: None,
        }
    }
}

impl MixOptions {
    pub fn validate(&self) -> Result<(), LabError> {
        self.generator.validate()?;
        if !(self.target_fraction > 0.0 && self.target_fraction <= 1.0) {
            return Err(LabError::invalid("target_fraction", "must be in (0, 1]"));
        }
        Ok(())
    }

    fn run_options(&self) -> RunOptions {
        RunOptions {
            jobs: self.jobs,
            scratch_dir: self.scratch_dir.clone(),
            host_memory: self.host_memory,
            ..Default::default()
        }
    }
}

/// One container of a mix and how it did.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ContainerOutcome {
    pub name: String,
    pub vm: String,
    pub kind: MixKind,
    /// At scale 1.
    pub working_set_mib: f64,
    pub nthreads: u32,
    /// None when it did nothing in the balanced candidate's window.
    pub target_ops_s: Option<f64>,
    /// Mean throughput over the window.
    pub static_ops_s: f64,
    pub provisioner_ops_s: f64,
    pub static_met: bool,
    pub provisioner_met: bool,
    /// Time below target in the window, emulated s (at the run's scale).
    pub static_below_s: f64,
    pub provisioner_below_s: f64,
    /// A decision of the provisioner in the window said it would miss its target.
    pub reported: bool,
}

/// One mix and how the provisioner did against the best static allocation.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct MixOutcome {
    pub seed: u64,
    pub vms: usize,
    /// `vm1: redis1, scan2 | vm2: web3`.
    pub mix: String,
    /// Static candidates swept.
    pub candidates: usize,
    /// The candidate the targets come from.
    pub balanced: String,
    /// The best static allocation (the search's pick with the targets).
    pub best_static: String,
    pub targets: usize,
    pub static_met: usize,
    pub provisioner_met: usize,
    /// Sums of the containers' mean throughputs over the window.
    pub static_total_ops_s: f64,
    pub provisioner_total_ops_s: f64,
    /// Provisioner total / best static total.
    pub total_ratio: f64,
    pub static_below_s: f64,
    pub provisioner_below_s: f64,
    pub containers: Vec<ContainerOutcome>,
}

impl MixOutcome {
    /// The best static allocation meets every target.
    pub fn feasible(&self) -> bool {
        self.static_met == self.targets
    }
    pub fn all_met(&self) -> bool {
        self.provisioner_met == self.targets
    }
    /// Containers with a target the provisioner missed.
    pub fn missed(&self) -> impl Iterator<Item = &ContainerOutcome> {
        self.containers.iter().filter(|c| c.target_ops_s.is_some() && !c.provisioner_met)
    }
}

/// A mix's outcome, the targeted scenario (unscaled, `scale` set: `lab run` reproduces both variants)
/// and the page accesses its runs emulated.
#[derive(Debug, Clone)]
pub struct MixRun {
    pub outcome: MixOutcome,
    pub scenario: Scenario,
    pub accesses: u64,
}

/// The window's start, emulated s of the scaled scenario: the static search's `from_s`.
fn window_from(scaled: &Scenario) -> f64 {
    scaled.variants.iter().find_map(|v| v.search.as_ref().and_then(|s| s.from_s)).unwrap_or(0.0)
}

fn mean_ops_s(runs: &[RunResult], variant: &str, container: &str, from: f64) -> f64 {
    let m = Measure {
        variant: Some(variant.to_string()),
        entity: container.to_string(),
        metric: Metric::Throughput,
        from_s: Some(from),
        to_s: None,
    };
    measure(runs, &m).unwrap_or(0.0)
}

/// `x` rounded down to three significant figures.
fn floor_3(x: f64) -> f64 {
    if !(x.is_finite() && x > 0.0) {
        return 0.0;
    }
    let unit = 10f64.powi(x.log10().floor() as i32 - 2);
    (x / unit).floor() * unit
}

/// Runs the mix of `seed` (see the module doc). `progress` gets the fraction of the mix done.
pub fn run_mix(seed: u64, opts: &MixOptions, progress: &mut dyn FnMut(f64)) -> Result<MixRun, LabError> {
    opts.validate()?;
    let mix = mixgen::generate(seed, &opts.generator)?;
    let run_opts = opts.run_options();
    let base = mix.scenario.scaled();
    let from = window_from(&base);
    let names: Vec<String> = mix.containers.iter().map(|c| c.name.clone()).collect();

    // 1. The sweep: the static candidates as plain variants.
    let mut sweep = base.clone();
    sweep.variants = base
        .run_list()
        .into_iter()
        .filter(|v| v.search_of.as_deref() == Some(STATIC))
        .map(|mut v| {
            v.search_of = None;
            v
        })
        .collect();
    let n = sweep.variants.len();
    let steps = (n + 1) as f64;
    let mut done = vec![0f64; n];
    let prepared = prepare(&sweep, &run_opts)?;
    let swept = run_prepared(&prepared, &run_opts, &mut |vi, f| {
        if let Some(d) = done.get_mut(vi) {
            *d = f;
        }
        progress(done.iter().sum::<f64>() / steps);
    })?;

    // 2. Targets from the balanced candidate.
    let thr: Vec<Vec<f64>> = swept
        .runs
        .iter()
        .map(|r| names.iter().map(|c| mean_ops_s(&swept.runs, &r.variant, c, from)).collect())
        .collect();
    let best: Vec<f64> = (0..names.len()).map(|i| thr.iter().map(|t| t[i]).fold(0.0, f64::max)).collect();
    let score = |t: &[f64]| -> (f64, f64) {
        let worst = t.iter().zip(&best).filter(|(_, b)| **b > 0.0).map(|(x, b)| x / b).fold(1.0, f64::min);
        (worst, t.iter().sum())
    };
    let balanced = (0..thr.len())
        .reduce(|b, i| if score(&thr[i]) > score(&thr[b]) { i } else { b })
        .ok_or_else(|| LabError::invalid("max_candidates", "the static search has no candidate"))?;
    let mut targeted = mix.scenario.clone();
    let mut targets = Vec::new();
    for (i, (_, _, c)) in base.containers().enumerate() {
        let ops_s = floor_3(opts.target_fraction * thr[balanced][i]);
        targets.push((c.name.clone(), (ops_s > 0.0).then_some(Target::Throughput { ops_s })));
    }
    for vm in &mut targeted.vms {
        for c in &mut vm.containers {
            c.target = targets.iter().find(|t| t.0 == c.name).and_then(|t| t.1);
        }
    }
    targeted.validate()?;
    let scaled = targeted.scaled();

    // 3. The provisioner with the targets; the sweep collapsed to the best static allocation.
    let mut alone = scaled.clone();
    alone.variants.retain(|v| v.name == PROVISIONER);
    let prepared = prepare(&alone, &run_opts)?;
    let provisioned = run_prepared(&prepared, &run_opts, &mut |_, f| progress((n as f64 + f) / steps))?;
    let accesses = swept.accesses() + provisioned.accesses();
    let mut runs = swept.runs;
    runs.extend(provisioned.runs);
    let (runs, searches) = prov_checks::collapse(&scaled, &scaled.run_list(), runs);
    let best_static = searches.first().map(|s| s.best.clone()).unwrap_or_default();

    // 4. Scores.
    let run = |v: &str| runs.iter().find(|r| r.variant == v);
    let (Some(st), Some(pr)) = (run(STATIC), run(PROVISIONER)) else {
        return Err(LabError::invalid("variants", "a mix runs the static search and the provisioner"));
    };
    let reported = reported_misses(&pr.decisions, from);
    let mut containers = Vec::with_capacity(names.len());
    for (c, (_, t)) in mix.containers.iter().zip(&targets) {
        let score = |r: &RunResult| -> (bool, f64) {
            match t {
                Some(t) => (
                    standing(&runs, &r.variant, &c.name, t, Some(from), None).is_ok_and(|s| s.0),
                    violation_s(&scaled, r, &c.name, t, from, r.duration_s),
                ),
                None => (true, 0.0),
            }
        };
        let ((static_met, static_below), (provisioner_met, provisioner_below)) = (score(st), score(pr));
        containers.push(ContainerOutcome {
            name: c.name.clone(),
            vm: c.vm.clone(),
            kind: c.kind,
            working_set_mib: c.working_set_mib,
            nthreads: c.nthreads,
            target_ops_s: t.map(|t| match t {
                Target::Throughput { ops_s } => ops_s,
                Target::MeanLatency { ms } => ms,
                Target::HitRatio { ratio } => ratio,
            }),
            static_ops_s: round3(mean_ops_s(&runs, STATIC, &c.name, from)),
            provisioner_ops_s: round3(mean_ops_s(&runs, PROVISIONER, &c.name, from)),
            static_met,
            provisioner_met,
            static_below_s: round3(static_below),
            provisioner_below_s: round3(provisioner_below),
            reported: reported.contains(&c.name),
        });
    }
    let with_target = || containers.iter().filter(|c| c.target_ops_s.is_some());
    let sum = |f: &dyn Fn(&ContainerOutcome) -> f64| round3(containers.iter().map(f).sum());
    let (static_total, prov_total) = (sum(&|c| c.static_ops_s), sum(&|c| c.provisioner_ops_s));
    let outcome = MixOutcome {
        seed,
        vms: mix.scenario.vms.len(),
        mix: mix.describe(),
        candidates: n,
        balanced: swept_name(&scaled, balanced),
        best_static,
        targets: with_target().count(),
        static_met: with_target().filter(|c| c.static_met).count(),
        provisioner_met: with_target().filter(|c| c.provisioner_met).count(),
        static_total_ops_s: static_total,
        provisioner_total_ops_s: prov_total,
        total_ratio: if static_total > 0.0 { round3(prov_total / static_total) } else { 0.0 },
        static_below_s: sum(&|c| c.static_below_s),
        provisioner_below_s: sum(&|c| c.provisioner_below_s),
        containers,
    };
    progress(1.0);
    Ok(MixRun { outcome, scenario: targeted, accesses })
}

/// The name of the `i`-th static candidate.
fn swept_name(scaled: &Scenario, i: usize) -> String {
    scaled
        .run_list()
        .into_iter()
        .filter(|v| v.search_of.as_deref() == Some(STATIC))
        .nth(i)
        .map(|v| v.name)
        .unwrap_or_default()
}

fn round3(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}

/// Containers that a decision of the provisioner at or after `from_s` reported as missing their
/// targets: named in its `missed` (measured below the target for the closed loop's `report_after`
/// decisions in a row) or `infeasible` (nothing measured or predicted within the budget meets it).
pub fn reported_misses(decisions: &[Decision], from_s: f64) -> BTreeSet<String> {
    decisions
        .iter()
        .filter(|d| d.t_s + 1e-9 >= from_s)
        .flat_map(|d| d.missed.iter().chain(&d.infeasible).cloned())
        .collect()
}

/// A set of mixes against the targets.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Verdicts {
    pub mixes: usize,
    /// Mixes whose best static allocation meets every target.
    pub feasible: usize,
    /// Feasible mixes in which the provisioner meets every target, and their fraction (1 with none).
    pub all_met: usize,
    pub all_met_fraction: f64,
    pub all_met_pass: bool,
    /// The smallest provisioner total / best static total over the mixes.
    pub min_total_ratio: f64,
    pub total_ratio_pass: bool,
    /// Time below target over the feasible mixes, s, and the ratio (provisioner / static; None when
    /// static's is 0, which passes only when the provisioner's is 0 too).
    pub static_below_s: f64,
    pub provisioner_below_s: f64,
    pub below_ratio: Option<f64>,
    pub below_pass: bool,
    /// Targets the provisioner missed, and how many of them its decisions reported.
    pub missed: usize,
    pub missed_reported: usize,
    pub reported_pass: bool,
    pub passed: bool,
}

/// The verdicts on a set of mixes (see the constants).
pub fn verdicts(mixes: &[MixOutcome]) -> Verdicts {
    let feasible: Vec<&MixOutcome> = mixes.iter().filter(|m| m.feasible()).collect();
    let all_met = feasible.iter().filter(|m| m.all_met()).count();
    let all_met_fraction = if feasible.is_empty() { 1.0 } else { all_met as f64 / feasible.len() as f64 };
    let min_total_ratio = mixes.iter().map(|m| m.total_ratio).fold(f64::INFINITY, f64::min);
    let min_total_ratio = if mixes.is_empty() { 1.0 } else { min_total_ratio };
    let static_below_s = round3(feasible.iter().map(|m| m.static_below_s).sum());
    let provisioner_below_s = round3(feasible.iter().map(|m| m.provisioner_below_s).sum());
    let below_ratio = (static_below_s > 0.0).then(|| round3(provisioner_below_s / static_below_s));
    let below_pass = match below_ratio {
        Some(r) => r <= BELOW_RATIO_MAX,
        None => provisioner_below_s == 0.0,
    };
    let missed = mixes.iter().map(|m| m.missed().count()).sum();
    let missed_reported = mixes.iter().map(|m| m.missed().filter(|c| c.reported).count()).sum();
    let all_met_pass = all_met_fraction >= ALL_MET_MIN;
    let total_ratio_pass = min_total_ratio >= TOTAL_RATIO_MIN;
    let reported_pass = missed_reported == missed;
    Verdicts {
        mixes: mixes.len(),
        feasible: feasible.len(),
        all_met,
        all_met_fraction: round3(all_met_fraction),
        all_met_pass,
        min_total_ratio,
        total_ratio_pass,
        static_below_s,
        provisioner_below_s,
        below_ratio,
        below_pass,
        missed,
        missed_reported,
        reported_pass,
        passed: all_met_pass && total_ratio_pass && below_pass && reported_pass,
    }
}

fn missed_text(m: &MixOutcome) -> String {
    let parts: Vec<String> = m
        .missed()
        .map(|c| format!("{} ({})", c.name, if c.reported { "reported" } else { "NOT reported" }))
        .collect();
    if parts.is_empty() {
        "-".into()
    } else {
        parts.join(", ")
    }
}

fn below_ratio_text(m: &MixOutcome) -> String {
    if m.static_below_s > 0.0 {
        format!("{:.2}", m.provisioner_below_s / m.static_below_s)
    } else if m.provisioner_below_s > 0.0 {
        "inf".into()
    } else {
        "-".into()
    }
}

fn mark(pass: bool) -> &'static str {
    if pass {
        "pass"
    } else {
        "FAIL"
    }
}

/// The markdown table of the mixes (one row each) and the verdicts under it.
pub fn markdown(mixes: &[MixOutcome], v: &Verdicts) -> String {
    let mut s = String::new();
    s.push_str(
        "| seed | VMs | containers | targets met: provisioner / best static | total: provisioner / static \
         | time below target, s: provisioner / static (ratio) | missed by the provisioner |\n\
         | --- | --- | --- | --- | --- | --- | --- |\n",
    );
    for m in mixes {
        let _ = writeln!(
            s,
            "| {} | {} | {} | {}/{} / {}/{} | {:.3} ({:.0} / {:.0} ops/s) | {:.1} / {:.1} ({}) | {} |",
            m.seed,
            m.vms,
            m.mix,
            m.provisioner_met,
            m.targets,
            m.static_met,
            m.targets,
            m.total_ratio,
            m.provisioner_total_ops_s,
            m.static_total_ops_s,
            m.provisioner_below_s,
            m.static_below_s,
            below_ratio_text(m),
            missed_text(m)
        );
    }
    let ratio = v.below_ratio.map_or_else(|| "n/a".to_string(), |r| format!("{r:.3}"));
    let _ = write!(
        s,
        "\n* all targets met by the provisioner in {}/{} feasible mixes ({:.0}%; want >= {:.0}%): {}\n\
         * smallest total ratio {:.3} (want >= {}): {}\n\
         * time below target, feasible mixes: provisioner {:.1} s, best static {:.1} s, ratio {ratio} (want <= {}): {}\n\
         * missed targets reported by the provisioner: {}/{}: {}\n",
        v.all_met,
        v.feasible,
        v.all_met_fraction * 100.0,
        ALL_MET_MIN * 100.0,
        mark(v.all_met_pass),
        v.min_total_ratio,
        TOTAL_RATIO_MIN,
        mark(v.total_ratio_pass),
        v.provisioner_below_s,
        v.static_below_s,
        BELOW_RATIO_MAX,
        mark(v.below_pass),
        v.missed_reported,
        v.missed,
        mark(v.reported_pass),
    );
    s
}

/// One CSV row per container of each mix.
pub fn csv(mixes: &[MixOutcome]) -> Result<String, LabError> {
    let mut w = csv::Writer::from_writer(Vec::new());
    let err = |e: csv::Error| LabError::invalid("csv", e.to_string());
    w.write_record([
        "seed",
        "vms",
        "candidates",
        "container",
        "vm",
        "kind",
        "working_set_mib",
        "nthreads",
        "target_ops_s",
        "static_ops_s",
        "provisioner_ops_s",
        "static_met",
        "provisioner_met",
        "static_below_s",
        "provisioner_below_s",
        "reported",
    ])
    .map_err(err)?;
    for m in mixes {
        for c in &m.containers {
            w.write_record([
                m.seed.to_string(),
                m.vms.to_string(),
                m.candidates.to_string(),
                c.name.clone(),
                c.vm.clone(),
                c.kind.label().to_string(),
                c.working_set_mib.to_string(),
                c.nthreads.to_string(),
                c.target_ops_s.map(|t| t.to_string()).unwrap_or_default(),
                c.static_ops_s.to_string(),
                c.provisioner_ops_s.to_string(),
                c.static_met.to_string(),
                c.provisioner_met.to_string(),
                c.static_below_s.to_string(),
                c.provisioner_below_s.to_string(),
                c.reported.to_string(),
            ])
            .map_err(err)?;
        }
    }
    let bytes = w.into_inner().map_err(|e| LabError::invalid("csv", e.to_string()))?;
    String::from_utf8(bytes).map_err(|e| LabError::invalid("csv", e.to_string()))
}
