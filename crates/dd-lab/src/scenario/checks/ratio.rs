//! `kind = "ratio"`: one measure over another, bounded.

use super::measure::{fmt_measure, measure, min_max_text, Measure};
use super::{CheckSpec, Names};
use crate::error::LabError;
use crate::record::RunResult;
use crate::scenario::Scenario;
use serde::{Deserialize, Serialize};

/// `lhs / rhs` is at least `min` (and at most `max` if given).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RatioCheck {
    pub lhs: Measure,
    pub rhs: Measure,
    pub min: f64,
    #[serde(default)]
    pub max: Option<f64>,
}

impl CheckSpec for RatioCheck {
    fn validate(&self, p: &str, names: &Names) -> Result<(), LabError> {
        names.measure(&self.lhs, &format!("{p}.lhs"))?;
        names.measure(&self.rhs, &format!("{p}.rhs"))
    }

    fn scale(&mut self, k: f64) {
        self.lhs.scale(k);
        self.rhs.scale(k);
    }

    fn evaluate(&self, _: &Scenario, runs: &[RunResult]) -> Result<(bool, String), String> {
        let (a, b) = (measure(runs, &self.lhs)?, measure(runs, &self.rhs)?);
        let ratio = if b == 0.0 {
            if a > 0.0 {
                f64::INFINITY
            } else {
                0.0
            }
        } else {
            a / b
        };
        let ok = ratio >= self.min && self.max.is_none_or(|mx| ratio <= mx);
        Ok((
            ok,
            format!(
                "{} = {a:.3} / {} = {b:.3} -> ratio {ratio:.3} ({})",
                fmt_measure(&self.lhs),
                fmt_measure(&self.rhs),
                min_max_text(self.min, self.max)
            ),
        ))
    }
}
