//! `kind = "targets"`: containers meet (or miss) their targets over a window; and how a container stands
//! against its target in a run ([`standing`]), which searches and the generated mixes score with too.

use super::measure::{measure, Measure, Metric};
use super::{CheckSpec, Names};
use crate::error::LabError;
use crate::record::RunResult;
use crate::scenario::Scenario;
use dd_provision::Target;
use serde::{Deserialize, Serialize};

/// A check on the containers' targets.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TargetsCheck {
    /// Variant (a searching variant stands for its best candidate); default the first.
    #[serde(default)]
    pub variant: Option<String>,
    /// Containers; default every container with a target.
    #[serde(default)]
    pub entities: Vec<String>,
    /// `met` (default): each meets its target over the window; `missed`: each misses it;
    /// `not_all_met`: at least one misses it.
    #[serde(default)]
    pub expect: Expect,
    #[serde(default)]
    pub from_s: Option<f64>,
    #[serde(default)]
    pub to_s: Option<f64>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Expect {
    #[default]
    Met,
    Missed,
    NotAllMet,
}

/// Containers with a target, with it.
pub fn targeted(sc: &Scenario) -> Vec<(String, Target)> {
    sc.containers().filter_map(|(_, _, c)| c.target.map(|t| (c.name.clone(), t))).collect()
}

/// The containers named (all with a target when none is), with their targets.
pub(super) fn names_or_all(sc: &Scenario, entities: &[String]) -> Vec<(String, Target)> {
    let all = targeted(sc);
    if entities.is_empty() {
        all
    } else {
        all.into_iter().filter(|(n, _)| entities.contains(n)).collect()
    }
}

/// Validates the containers and variants a targets or violation check names.
pub(super) fn validate_names(
    p: &str,
    variants: &[&Option<String>],
    entities: &[String],
    names: &Names,
) -> Result<(), LabError> {
    if variants.iter().any(|v| !names.variant_ok(v)) {
        return Err(LabError::invalid(&format!("{p}.variant"), "no such variant"));
    }
    if let Some(e) = entities.iter().find(|e| !names.targeted.contains(*e)) {
        return Err(LabError::invalid(
            &format!("{p}.entities"),
            format!("{e} is not a container with a target"),
        ));
    }
    if names.targeted.is_empty() {
        return Err(LabError::invalid(p, "no container has a target"));
    }
    Ok(())
}

/// A throughput or latency measure of one container of one run over a window.
pub fn window_measure(
    run: &str,
    entity: &str,
    metric: Metric,
    from: Option<f64>,
    to: Option<f64>,
) -> Measure {
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

impl CheckSpec for TargetsCheck {
    fn validate(&self, p: &str, names: &Names) -> Result<(), LabError> {
        validate_names(p, &[&self.variant], &self.entities, names)
    }

    fn scale(&mut self, k: f64) {
        self.from_s = self.from_s.map(|x| x * k);
        self.to_s = self.to_s.map(|x| x * k);
    }

    fn evaluate(&self, sc: &Scenario, runs: &[RunResult]) -> Result<(bool, String), String> {
        let c = self;
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
}
