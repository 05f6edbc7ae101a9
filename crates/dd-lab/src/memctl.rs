//! The VM-level memory controller of thesis 000, chapter 4, in the emulated guest: scenario settings,
//! the VM-wide reclaim that asks `dd_memctl::decide` what to take, the checks of the chapter's figures
//! and the memory-usage plots.
//!
//! Owns [`VmMemctl`] (the `[vms.memctl]` table: policy, chunk cap, per-container weight, class and
//! floor), [`GuestMemctl`] (the same, resolved to memcg indices and pages, held by a [`Guest`]) and
//! [`reclaim`], which replaces the guest's built-in soft-limit/global-LRU victim choice when a VM has a
//! controller. The decision itself is never re-implemented here: every VM-wide reclaim request builds a
//! `ContainerSnapshot` per memcg from the guest model and carries out the one `Action` `decide` returns.
//!
//! Request size: under `linux-default` a request is the guest's reclaim batch, so the policy reproduces
//! the built-in soft-limit reclaim page for page (a test holds the two equal). Under the proportional
//! policies a request is one chunk (`chunk_cap_mib`), as the thesis's modified kswapd path asks the
//! victim for up to 50 MB per soft-reclaim request; the victim gives at most its exceed, so the memory
//! freed beyond what the allocation needed is headroom that every container then allocates from.
//!
//! Invariants: a memcg with no pages is left out of the snapshot (it has nothing to give and no share to
//! defend, e.g. a container not started yet); a container never gives below its floor; all arithmetic on
//! sizes is in pages here and in bytes inside `decide`.

use crate::error::LabError;
use crate::guest::{Evicted, Guest};
use crate::report::ScenarioResult;
use crate::scenario::{mib_pages, Scenario, PAGE};
use crate::sim::{RunResult, Sample};
use dd_memctl::{decide, Action, Class, ContainerSnapshot, DecisionConfig, Policy, Reason};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

fn d_chunk() -> f64 {
    50.0
}
fn d_weight() -> u32 {
    1
}

/// `[vms.memctl]`: the VM's memory-controller policy. Without it the guest keeps Linux's built-in
/// reclaim (the same behaviour as `policy = "linux-default"`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VmMemctl {
    /// `linux-default`, `proportional` or `proportional-classes`. Default `proportional`.
    #[serde(default)]
    pub policy: Policy,
    /// Most memory one reclaim request takes from one container, MiB (scaled). Default 50.
    #[serde(default = "d_chunk")]
    pub chunk_cap_mib: f64,
    /// Weight, class and floor per container name; a container not listed has weight 1, class silver,
    /// floor 0.
    #[serde(default)]
    pub containers: BTreeMap<String, CtMemctl>,
}

/// One container's controller settings.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CtMemctl {
    /// Relative weight (eq. 4.2). Default 1.
    #[serde(default = "d_weight")]
    pub weight: u32,
    /// `gold`, `silver` (default) or `bronze`.
    #[serde(default)]
    pub class: Class,
    /// Memory the controller never takes from it, MiB (scaled). Default 0.
    #[serde(default)]
    pub floor_mib: f64,
}

/// A variant's override of a VM's controller (`[variants.memctl.VM]`).
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MemctlOverride {
    #[serde(default)]
    pub policy: Option<Policy>,
    #[serde(default)]
    pub chunk_cap_mib: Option<f64>,
}

impl VmMemctl {
    /// `p` is the table's path, e.g. `vms[0].memctl`; `containers` the VM's container names.
    pub fn validate(&self, p: &str, containers: &[&str]) -> Result<(), LabError> {
        if !(self.chunk_cap_mib.is_finite() && self.chunk_cap_mib > 0.0) {
            return Err(LabError::invalid(&format!("{p}.chunk_cap_mib"), "must be positive"));
        }
        for (name, c) in &self.containers {
            if !containers.contains(&name.as_str()) {
                return Err(LabError::invalid(
                    &format!("{p}.containers.{name}"),
                    "no such container in this VM",
                ));
            }
            if !(c.floor_mib.is_finite() && c.floor_mib >= 0.0) {
                return Err(LabError::invalid(
                    &format!("{p}.containers.{name}.floor_mib"),
                    "must be non-negative",
                ));
            }
        }
        Ok(())
    }

    pub fn scale(&mut self, k: f64) {
        self.chunk_cap_mib *= k;
        for c in self.containers.values_mut() {
            c.floor_mib *= k;
        }
    }

    pub fn apply(&mut self, o: &MemctlOverride) {
        if let Some(p) = o.policy {
            self.policy = p;
        }
        if let Some(c) = o.chunk_cap_mib {
            self.chunk_cap_mib = c;
        }
    }

    /// The guest-side form for a VM whose memcgs are its containers in order.
    pub fn resolve(&self, containers: &[&str]) -> GuestMemctl {
        let get = |n: &str| self.containers.get(n);
        GuestMemctl {
            cfg: DecisionConfig {
                policy: self.policy,
                chunk_cap_bytes: (mib_pages(self.chunk_cap_mib).max(1)) * PAGE,
            },
            weight: containers.iter().map(|n| get(n).map_or(1, |c| c.weight)).collect(),
            class: containers.iter().map(|n| get(n).map_or(Class::Silver, |c| c.class)).collect(),
            floor: containers.iter().map(|n| get(n).map_or(0, |c| mib_pages(c.floor_mib))).collect(),
        }
    }
}

/// A VM's controller as the guest applies it; vectors are indexed by memcg.
#[derive(Debug, Clone, PartialEq)]
pub struct GuestMemctl {
    pub cfg: DecisionConfig,
    pub weight: Vec<u32>,
    pub class: Vec<Class>,
    /// Pages.
    pub floor: Vec<u64>,
}

/// One VM-wide reclaim request of at least `n` pages under the guest's controller (see the module doc
/// for its size). Returns the pages freed; 0 when nothing can be freed.
pub fn reclaim(g: &mut Guest, n: u64, sink: &mut dyn FnMut(Evicted)) -> u64 {
    let Some(m) = g.memctl.as_ref() else { return 0 };
    let need_pages = match m.cfg.policy {
        Policy::LinuxDefault => n,
        _ => n.max(m.cfg.chunk_cap_bytes / PAGE),
    };
    // Snapshot indices -> memcg indices.
    let idx: Vec<usize> = (0..g.cgs.len()).filter(|&i| g.cgs[i].usage > 0).collect();
    let snap: Vec<ContainerSnapshot> = idx
        .iter()
        .map(|&i| {
            let c = &g.cgs[i];
            ContainerSnapshot {
                name: String::new(),
                usage_bytes: c.usage * PAGE,
                weight: m.weight.get(i).copied().unwrap_or(1),
                class: m.class.get(i).copied().unwrap_or_default(),
                soft_limit_bytes: c.soft.saturating_mul(PAGE),
                reclaimable_bytes: c.usage.saturating_sub(m.floor.get(i).copied().unwrap_or(0)) * PAGE,
            }
        })
        .collect();
    match decide(&snap, need_pages * PAGE, &m.cfg) {
        Action::Reclaim { index, bytes, reason } => {
            let cg = idx[index];
            // At least one page: an exceed under a page still names the victim.
            let freed = g.reclaim_memcg(cg, bytes.div_ceil(PAGE).max(1), true, sink);
            let c = &mut g.cgs[cg].counters;
            match reason {
                Reason::SoftLimitExceed | Reason::ProportionalExceed => c.reclaimed_directed += freed,
            }
            freed
        }
        Action::Lru { members, bytes } => {
            let members: Vec<usize> = members.iter().map(|&i| idx[i]).collect();
            let floors: Vec<u64> = members.iter().map(|&i| m.floor.get(i).copied().unwrap_or(0)).collect();
            let mut freed = 0;
            let want = bytes.div_ceil(PAGE).max(1);
            // The LRU of the members together, a batch at a time from the one with the oldest page,
            // never below a floor.
            while freed < want {
                let eligible: Vec<usize> = members
                    .iter()
                    .zip(&floors)
                    .filter(|(&i, &f)| g.cgs[i].usage > f)
                    .map(|(&i, _)| i)
                    .collect();
                let Some(cg) = g.oldest_memcg(eligible.iter().copied()) else { break };
                let room = g.cgs[cg].usage - floors[members.iter().position(|&i| i == cg).unwrap_or(0)];
                let got = g.reclaim_memcg(cg, (want - freed).min(g.batch()).min(room), true, sink);
                if got == 0 {
                    break;
                }
                g.cgs[cg].counters.reclaimed_lru += got;
                freed += got;
            }
            freed
        }
        Action::None => 0,
    }
}

// ---------------------------------------------------------------------------------------------------
// Checks.

/// Which deviation statistic a [`MemRatioCheck`] bounds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Stat {
    /// Largest deviation over the window's samples.
    #[default]
    Max,
    /// Mean deviation over the window's samples.
    Mean,
}

/// `kind = "mem_ratio"`: per sample, the memory usage ratio `lhs / rhs` of two containers against
/// `target`; the deviation is `|ratio / target - 1|`. For each listed variant the chosen statistic must
/// lie in `[min_dev, max_dev]`; with `increasing = true` it must also grow along the variant list
/// (strictly from the first to the last, never falling in between by more than 1%).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MemRatioCheck {
    /// Variants; default the first.
    #[serde(default)]
    pub variants: Vec<String>,
    pub lhs: String,
    pub rhs: String,
    pub target: f64,
    pub from_s: f64,
    #[serde(default)]
    pub to_s: Option<f64>,
    #[serde(default)]
    pub stat: Stat,
    #[serde(default)]
    pub min_dev: Option<f64>,
    #[serde(default)]
    pub max_dev: Option<f64>,
    #[serde(default)]
    pub increasing: bool,
}

/// `kind = "exceed_gap"`: per sample, the difference between two containers' exceeds over their soft
/// limits, `|(U_l - SL_l) - (U_r - SL_r)|`, in MiB (scaled). Its largest value in the window must be at
/// most `max_gap_mib` (and at least `min_gap_mib` if given).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExceedGapCheck {
    #[serde(default)]
    pub variant: Option<String>,
    pub lhs: String,
    pub rhs: String,
    pub from_s: f64,
    #[serde(default)]
    pub to_s: Option<f64>,
    #[serde(default)]
    pub max_gap_mib: Option<f64>,
    #[serde(default)]
    pub min_gap_mib: Option<f64>,
}

/// `kind = "reclaim_mode"`: of the pages VM-wide reclaim took from `entities` in the window, the
/// fraction taken by directed reclaim (soft-limit exceed, or proportional exceed) rather than by the
/// LRU fallback must lie in `[min, max]`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReclaimModeCheck {
    #[serde(default)]
    pub variant: Option<String>,
    pub entities: Vec<String>,
    pub from_s: f64,
    #[serde(default)]
    pub to_s: Option<f64>,
    #[serde(default)]
    pub min: f64,
    #[serde(default = "d_one")]
    pub max: f64,
}

fn d_one() -> f64 {
    1.0
}

/// `kind = "protected"`: while any of `others` is above its floor plus `slack_mib`, `protected` loses
/// at most `slack_mib` below the most it held since `from_s`; and the others must reach their floors in
/// the window (so the check is about the order of reclaim, not about the absence of pressure).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProtectedCheck {
    #[serde(default)]
    pub variant: Option<String>,
    pub protected: String,
    pub others: Vec<String>,
    pub from_s: f64,
    #[serde(default)]
    pub to_s: Option<f64>,
    pub slack_mib: f64,
}

impl MemRatioCheck {
    pub fn scale(&mut self, k: f64) {
        self.from_s *= k;
        self.to_s = self.to_s.map(|t| t * k);
    }
}
impl ExceedGapCheck {
    pub fn scale(&mut self, k: f64) {
        self.from_s *= k;
        self.to_s = self.to_s.map(|t| t * k);
        self.max_gap_mib = self.max_gap_mib.map(|g| g * k);
        self.min_gap_mib = self.min_gap_mib.map(|g| g * k);
    }
}
impl ReclaimModeCheck {
    pub fn scale(&mut self, k: f64) {
        self.from_s *= k;
        self.to_s = self.to_s.map(|t| t * k);
    }
}
impl ProtectedCheck {
    pub fn scale(&mut self, k: f64) {
        self.from_s *= k;
        self.to_s = self.to_s.map(|t| t * k);
        self.slack_mib *= k;
    }
}

fn run<'a>(runs: &'a [RunResult], v: Option<&String>) -> Result<&'a RunResult, String> {
    match v {
        None => runs.first().ok_or_else(|| "no run".to_string()),
        Some(v) => runs.iter().find(|r| &r.variant == v).ok_or_else(|| format!("no variant {v}")),
    }
}

fn ct_of(r: &RunResult, name: &str) -> Result<usize, String> {
    r.containers
        .iter()
        .position(|(c, _, en)| c == name && *en)
        .ok_or_else(|| format!("{name} does not run in variant {}", r.variant))
}

/// Samples of container `ct` in `(from, to]`, in time order.
fn series(r: &RunResult, ct: usize, from: f64, to: Option<f64>) -> Vec<&Sample> {
    let to = to.unwrap_or(r.duration_s);
    r.samples.iter().filter(|s| s.ct == ct && s.t_s > from + 1e-9 && s.t_s <= to + 1e-9).collect()
}

fn mib(pages: u64) -> f64 {
    pages as f64 / 256.0
}

/// Per-sample deviations `|lhs/rhs / target - 1|` (samples where `rhs` holds nothing are skipped).
fn ratio_devs(r: &RunResult, c: &MemRatioCheck) -> Result<Vec<f64>, String> {
    let (l, h) = (ct_of(r, &c.lhs)?, ct_of(r, &c.rhs)?);
    let (a, b) = (series(r, l, c.from_s, c.to_s), series(r, h, c.from_s, c.to_s));
    let d: Vec<f64> = a
        .iter()
        .zip(&b)
        .filter(|(_, y)| y.memcg_pages > 0)
        .map(|(x, y)| (x.memcg_pages as f64 / y.memcg_pages as f64 / c.target - 1.0).abs())
        .collect();
    if d.is_empty() {
        return Err(format!("no samples of {} and {} in the window", c.lhs, c.rhs));
    }
    Ok(d)
}

fn in_range(x: f64, min: Option<f64>, max: Option<f64>) -> bool {
    min.is_none_or(|m| x >= m) && max.is_none_or(|m| x <= m)
}

/// A bound as written in a scenario (scaled bounds print without float noise).
fn range_text(min: Option<f64>, max: Option<f64>) -> String {
    let (min, max) = (min.map(crate::report::threshold), max.map(crate::report::threshold));
    match (min, max) {
        (Some(a), Some(b)) => format!("want in [{a}, {b}]"),
        (Some(a), None) => format!("want >= {a}"),
        (None, Some(b)) => format!("want <= {b}"),
        (None, None) => "no bound".into(),
    }
}

pub fn eval_mem_ratio(runs: &[RunResult], c: &MemRatioCheck) -> Result<(bool, String), String> {
    let variants: Vec<Option<&String>> =
        if c.variants.is_empty() { vec![None] } else { c.variants.iter().map(Some).collect() };
    let mut ok = true;
    let mut stats = Vec::new();
    let mut parts = Vec::new();
    for v in variants {
        let r = run(runs, v)?;
        let d = ratio_devs(r, c)?;
        let mean = d.iter().sum::<f64>() / d.len() as f64;
        let max = d.iter().copied().fold(0.0, f64::max);
        let s = match c.stat {
            Stat::Max => max,
            Stat::Mean => mean,
        };
        let this = in_range(s, c.min_dev, c.max_dev);
        ok &= this;
        stats.push(s);
        parts.push(format!(
            "{}: mean dev {:.1}%, max dev {:.1}% over {} samples{}",
            r.variant,
            mean * 100.0,
            max * 100.0,
            d.len(),
            if this { "" } else { " FAIL" }
        ));
    }
    let mut text = format!(
        "usage {}/{} vs {} ({} dev {}): {}",
        c.lhs,
        c.rhs,
        c.target,
        if c.stat == Stat::Max { "max" } else { "mean" },
        range_text(c.min_dev, c.max_dev),
        parts.join("; ")
    );
    if c.increasing {
        let grows = stats.windows(2).all(|w| w[1] >= w[0] * 0.99)
            && stats.len() >= 2
            && stats[stats.len() - 1] > stats[0];
        ok &= grows;
        text.push_str(&format!("; increasing along the variants: {}", if grows { "yes" } else { "NO" }));
    }
    Ok((ok, text))
}

/// Soft limit of a container in pages (`u64::MAX` when none), from the scaled scenario.
fn soft_pages(sc: &Scenario, name: &str) -> u64 {
    sc.containers()
        .find(|(_, _, c)| c.name == name)
        .and_then(|(_, _, c)| c.soft_limit_mib)
        .map_or(u64::MAX, mib_pages)
}

pub fn eval_exceed_gap(
    sc: &Scenario,
    runs: &[RunResult],
    c: &ExceedGapCheck,
) -> Result<(bool, String), String> {
    let r = run(runs, c.variant.as_ref())?;
    let (l, h) = (ct_of(r, &c.lhs)?, ct_of(r, &c.rhs)?);
    let (sl, sh) = (soft_pages(sc, &c.lhs), soft_pages(sc, &c.rhs));
    if sl == u64::MAX || sh == u64::MAX {
        return Err("both containers need a soft limit".into());
    }
    let (a, b) = (series(r, l, c.from_s, c.to_s), series(r, h, c.from_s, c.to_s));
    let gaps: Vec<f64> = a
        .iter()
        .zip(&b)
        .map(|(x, y)| ((x.memcg_pages as f64 - sl as f64) - (y.memcg_pages as f64 - sh as f64)).abs() / 256.0)
        .collect();
    if gaps.is_empty() {
        return Err("no samples in the window".into());
    }
    let max = gaps.iter().copied().fold(0.0, f64::max);
    let mean = gaps.iter().sum::<f64>() / gaps.len() as f64;
    let ok = in_range(max, c.min_gap_mib, c.max_gap_mib);
    Ok((
        ok,
        format!(
            "exceed gap {}-{} over {} samples: max {max:.1} MiB, mean {mean:.1} MiB ({})",
            c.lhs,
            c.rhs,
            gaps.len(),
            range_text(c.min_gap_mib, c.max_gap_mib)
        ),
    ))
}

/// Directed and LRU pages reclaimed from `ct` between the window's first and last sample.
fn reclaimed(r: &RunResult, ct: usize, from: f64, to: Option<f64>) -> (u64, u64) {
    let before = r.samples.iter().rfind(|s| s.ct == ct && s.t_s <= from + 1e-9);
    let w = series(r, ct, from, to);
    let (d0, l0) = before.map_or((0, 0), |s| (s.reclaimed_directed, s.reclaimed_lru));
    w.last().map_or((0, 0), |s| (s.reclaimed_directed - d0, s.reclaimed_lru - l0))
}

pub fn eval_reclaim_mode(runs: &[RunResult], c: &ReclaimModeCheck) -> Result<(bool, String), String> {
    let r = run(runs, c.variant.as_ref())?;
    let (mut d, mut l) = (0, 0);
    for e in &c.entities {
        let (a, b) = reclaimed(r, ct_of(r, e)?, c.from_s, c.to_s);
        d += a;
        l += b;
    }
    if d + l == 0 {
        return Ok((false, "no VM-wide reclaim in the window".into()));
    }
    let f = d as f64 / (d + l) as f64;
    Ok((
        (c.min..=c.max).contains(&f),
        format!(
            "directed {:.1} MiB, LRU {:.1} MiB: directed fraction {f:.3} (want in [{}, {}])",
            mib(d),
            mib(l),
            crate::report::threshold(c.min),
            crate::report::threshold(c.max)
        ),
    ))
}

fn floor_pages(sc: &Scenario, name: &str) -> u64 {
    sc.vms
        .iter()
        .filter_map(|v| v.memctl.as_ref())
        .find_map(|m| m.containers.get(name))
        .map_or(0, |c| mib_pages(c.floor_mib))
}

pub fn eval_protected(
    sc: &Scenario,
    runs: &[RunResult],
    c: &ProtectedCheck,
) -> Result<(bool, String), String> {
    let r = run(runs, c.variant.as_ref())?;
    let slack = mib_pages(c.slack_mib);
    let g = series(r, ct_of(r, &c.protected)?, c.from_s, c.to_s);
    let others: Vec<(Vec<&Sample>, u64)> = c
        .others
        .iter()
        .map(|o| Ok((series(r, ct_of(r, o)?, c.from_s, c.to_s), floor_pages(sc, o))))
        .collect::<Result<_, String>>()?;
    let mut peak = 0u64;
    let mut worst_loss = 0u64;
    let mut reached_at = None;
    let mut guarded = 0;
    for (k, s) in g.iter().enumerate() {
        peak = peak.max(s.memcg_pages);
        let others_can_give = others.iter().any(|(o, f)| o.get(k).is_some_and(|x| x.memcg_pages > f + slack));
        if others_can_give {
            guarded += 1;
            worst_loss = worst_loss.max(peak - s.memcg_pages);
        } else if reached_at.is_none() {
            reached_at = Some(s.t_s);
        }
    }
    let min_after = reached_at
        .map(|t| g.iter().filter(|s| s.t_s >= t).map(|s| s.memcg_pages).min().unwrap_or(0))
        .unwrap_or(peak);
    let ok = worst_loss <= slack && reached_at.is_some() && guarded > 0;
    Ok((
        ok,
        format!(
            "{}: peak {:.1} MiB, largest loss while others could give {:.1} MiB over {guarded} samples (want \
             <= {:.1}); others at their floors from {}; {} then went down to {:.1} MiB",
            c.protected,
            mib(peak),
            mib(worst_loss),
            mib(slack),
            reached_at.map_or("never (FAIL)".into(), |t| format!("{t:.1} s")),
            c.protected,
            mib(min_after)
        ),
    ))
}

// ---------------------------------------------------------------------------------------------------
// Plots.

/// Whether a scenario uses the controller's outputs (a VM with `memctl`, or one of its checks).
pub fn wants_memory_plots(sc: &Scenario) -> bool {
    sc.vms.iter().any(|v| v.memctl.is_some())
}

/// Memory usage of every container over time (`memory_<variant>.png`), and for each pair of containers
/// a `mem_ratio` check names, their usage ratio over time in every variant against the target
/// (`ratio_<lhs>_<rhs>.png`, as Figures 4.6d, 4.7c and 4.9). Returns the file names.
pub fn memory_plots(res: &ScenarioResult, dir: &std::path::Path) -> Result<Vec<String>, LabError> {
    use crate::plot::{file_safe, time_chart, Line};
    use plotters::style::{Color, Palette, Palette99};
    let color = |i: usize| Palette99::pick(i).to_rgba();
    let mut out = Vec::new();
    let mut pairs: Vec<(&str, &str, f64)> = Vec::new();
    for c in &res.scenario.checks {
        if let crate::scenario::CheckKind::MemRatio(m) = &c.kind {
            if !pairs.iter().any(|p| p.0 == m.lhs && p.1 == m.rhs) {
                pairs.push((&m.lhs, &m.rhs, m.target));
            }
        }
    }
    for (lhs, rhs, target) in pairs {
        let mut lines = Vec::new();
        for r in &res.runs {
            let (Ok(l), Ok(h)) = (ct_of(r, lhs), ct_of(r, rhs)) else { continue };
            let (a, b) = (series(r, l, 0.0, None), series(r, h, 0.0, None));
            let pts: Vec<(f64, f64)> = a
                .iter()
                .zip(&b)
                .filter(|(_, y)| y.memcg_pages > 0)
                .map(|(x, y)| (x.t_s, x.memcg_pages as f64 / y.memcg_pages as f64))
                .collect();
            lines.push(Line { label: r.variant.clone(), color: color(lines.len()), pts, dashed: Vec::new() });
        }
        let dur = res.runs.first().map_or(1.0, |r| r.duration_s);
        let ymax = lines
            .iter()
            .flat_map(|l| l.pts.iter().map(|p| p.1))
            .fold(target * 1.5, f64::max)
            .min(target * 4.0);
        let f = format!("ratio_{lhs}_{rhs}.png");
        let title = format!("{}: usage {lhs} / {rhs}", res.scenario.name);
        time_chart(&dir.join(&f), &title, "ratio", dur, ymax, &[(0.0, target), (dur, target)], lines)?;
        out.push(f);
    }
    for run in &res.runs {
        let lines = run
            .containers
            .iter()
            .enumerate()
            .filter(|(_, (_, _, enabled))| *enabled)
            .map(|(ci, (name, _, _))| Line {
                label: name.clone(),
                color: color(ci),
                pts: run.samples.iter().filter(|s| s.ct == ci).map(|s| (s.t_s, mib(s.memcg_pages))).collect(),
                dashed: Vec::new(),
            })
            .collect();
        let ymax = run.samples.iter().map(|s| mib(s.memcg_pages)).fold(1.0f64, f64::max) * 1.1;
        let f = format!("memory_{}.png", file_safe(&run.variant));
        let title = format!("{}: memcg usage ({})", res.scenario.name, run.variant);
        time_chart(&dir.join(&f), &title, "MiB", run.duration_s, ymax, &[], lines)?;
        out.push(f);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::guest::key;
    use crate::scenario::LruMode;
    use rand::{Rng, SeedableRng};

    fn ctl(policy: Policy, chunk_pages: u64, weight: &[u32], class: &[Class], floor: &[u64]) -> GuestMemctl {
        GuestMemctl {
            cfg: DecisionConfig { policy, chunk_cap_bytes: chunk_pages * PAGE },
            weight: weight.to_vec(),
            class: class.to_vec(),
            floor: floor.to_vec(),
        }
    }

    /// Fills a guest of `limit` pages with random inserts into memcgs with the given soft limits, and
    /// returns the sequence of evictions.
    fn churn(memctl: Option<GuestMemctl>, seed: u64) -> Vec<Evicted> {
        let mut g = Guest::new(300, LruMode::TwoList, 8);
        for soft in [60, 100, u64::MAX] {
            g.add_memcg(1000, soft);
        }
        g.memctl = memctl;
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
        let mut ev = Vec::new();
        for i in 0..3000u32 {
            let cg = rng.gen_range(0..3usize);
            let k = key(cg as u32 + 1, rng.gen_range(0..400));
            if !g.access(cg, k, false) {
                g.insert(cg, k, false, i % 3 == 0, &mut |e| ev.push(e));
            }
        }
        g.set_limit(200, &mut |e| ev.push(e));
        g.check_invariants().unwrap();
        ev
    }

    #[test]
    fn linux_default_through_decide_is_the_built_in_reclaim_page_for_page() {
        for seed in 0..4 {
            let builtin = churn(None, seed);
            let s = [Class::Silver; 3];
            let via = churn(Some(ctl(Policy::LinuxDefault, 12800, &[1, 1, 1], &s, &[0, 0, 0])), seed);
            assert!(builtin.len() > 1000);
            assert_eq!(builtin, via, "seed {seed}");
        }
    }

    fn filled(memctl: GuestMemctl, usage: &[u64]) -> Guest {
        let mut g = Guest::new(usage.iter().sum(), LruMode::TwoList, 32);
        for _ in usage {
            g.add_memcg(u64::MAX, u64::MAX);
        }
        g.memctl = Some(memctl);
        let mut none = |_: Evicted| panic!("no eviction while filling");
        for (cg, &n) in usage.iter().enumerate() {
            for i in 0..n {
                g.insert(cg, key(cg as u32 + 1, i as u32), false, false, &mut none);
            }
        }
        g
    }

    #[test]
    fn proportional_reclaim_brings_usage_to_the_weights() {
        // 1:2 weights but 3000 and 3000 pages: ballooning down to 4500 must take from the first only,
        // down to the 1:2 ratio (1500 : 3000).
        let s = [Class::Silver; 2];
        let mut g = filled(ctl(Policy::Proportional, 256, &[1, 2], &s, &[0, 0]), &[3000, 3000]);
        g.set_limit(4500, &mut |_| {});
        assert_eq!(g.cgs[1].usage, 3000, "the under-share container gives nothing");
        assert_eq!(g.cgs[0].usage, 1500);
        // Further down, both give in ratio.
        g.set_limit(3000, &mut |_| {});
        // The last request is a whole chunk (256 pages) bounded by the victim's exceed, so the ratio is
        // kept to within a chunk's share of the total.
        let r = g.cgs[1].usage as f64 / g.cgs[0].usage as f64;
        assert!((r - 2.0).abs() < 0.05, "ratio {r}");
        assert!(g.used <= 3000 && g.used > 3000 - 256);
        assert!(g.cgs[0].counters.reclaimed_directed > 0 && g.cgs[1].counters.reclaimed_directed > 0);
        g.check_invariants().unwrap();
    }

    #[test]
    fn classes_spare_gold_until_the_others_reach_their_floor() {
        let c = [Class::Gold, Class::Silver, Class::Silver];
        let mut g = filled(
            ctl(Policy::ProportionalClasses, 256, &[1000, 1, 1], &c, &[0, 200, 300]),
            &[1000, 1000, 1000],
        );
        g.set_limit(1600, &mut |_| {});
        assert_eq!(g.cgs[0].usage, 1000, "gold untouched while silver can give");
        assert!(g.cgs[1].usage >= 200 && g.cgs[2].usage >= 300, "floors hold");
        assert!(g.cgs[1].usage + g.cgs[2].usage <= 600);
        g.set_limit(1300, &mut |_| {});
        assert_eq!((g.cgs[1].usage, g.cgs[2].usage), (200, 300), "silver down to the floors first");
        assert!((800 - 256..=800).contains(&g.cgs[0].usage), "then gold gives: {}", g.cgs[0].usage);
        g.check_invariants().unwrap();
    }

    #[test]
    fn a_proportional_request_is_one_chunk_bounded_by_the_exceed() {
        let s = [Class::Silver; 2];
        // Exceed of the first: 3000 - 6000/3 = 1000 pages; the chunk (256) bounds the request.
        let mut g = filled(ctl(Policy::Proportional, 256, &[1, 2], &s, &[0, 0]), &[3000, 3000]);
        assert_eq!(reclaim(&mut g, 32, &mut |_| {}), 256);
        // With a chunk larger than the exceed, the exceed bounds it.
        let mut g = filled(ctl(Policy::Proportional, 5000, &[1, 2], &s, &[0, 0]), &[3000, 3000]);
        assert_eq!(reclaim(&mut g, 32, &mut |_| {}), 1000);
        assert_eq!(g.cgs[1].usage, 3000);
    }
}
