//! `kind = "violation"`: a variant's time below its targets against a baseline's; and a container's time
//! below its target in a run ([`violation_s`]), which searches and the generated mixes score with too.

use super::targets::{names_or_all, validate_names};
use super::{CheckSpec, Names};
use crate::error::LabError;
use crate::record::RunResult;
use crate::scenario::Scenario;
use dd_provision::Target;
use serde::{Deserialize, Serialize};

/// Time below target of one variant against another's.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ViolationCheck {
    pub variant: String,
    pub baseline: String,
    /// Containers; default every container with a target.
    #[serde(default)]
    pub entities: Vec<String>,
    /// The variant's total time in violation is at most this fraction of the baseline's.
    pub max_ratio: f64,
    #[serde(default)]
    pub from_s: Option<f64>,
    #[serde(default)]
    pub to_s: Option<f64>,
}

/// Seconds a container of a run spends below its target in the window, sample by sample.
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

impl CheckSpec for ViolationCheck {
    fn validate(&self, p: &str, names: &Names) -> Result<(), LabError> {
        let (v, b) = (Some(self.variant.clone()), Some(self.baseline.clone()));
        validate_names(p, &[&v, &b], &self.entities, names)?;
        if !(self.max_ratio.is_finite() && self.max_ratio >= 0.0) {
            return Err(LabError::invalid(&format!("{p}.max_ratio"), "must be non-negative"));
        }
        Ok(())
    }

    fn scale(&mut self, k: f64) {
        self.from_s = self.from_s.map(|x| x * k);
        self.to_s = self.to_s.map(|x| x * k);
    }

    fn evaluate(&self, sc: &Scenario, runs: &[RunResult]) -> Result<(bool, String), String> {
        let c = self;
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
}
