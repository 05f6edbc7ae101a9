//! `kind = "value"`: one measure, bounded.

use super::measure::{fmt_measure, measure, min_max_text, Measure};
use super::{CheckSpec, Names};
use crate::error::LabError;
use crate::record::RunResult;
use crate::scenario::Scenario;
use serde::{Deserialize, Serialize};

/// `lhs` is at least `min` (and at most `max`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ValueCheck {
    pub lhs: Measure,
    pub min: f64,
    #[serde(default)]
    pub max: Option<f64>,
}

impl CheckSpec for ValueCheck {
    fn validate(&self, p: &str, names: &Names) -> Result<(), LabError> {
        names.measure(&self.lhs, &format!("{p}.lhs"))
    }

    fn scale(&mut self, k: f64) {
        self.lhs.scale(k);
        // Sizes and page counts shrink with the scenario; rates and ratios do not.
        if self.lhs.metric.is_size() {
            self.min *= k;
            self.max = self.max.map(|x| x * k);
        }
    }

    fn evaluate(&self, _: &Scenario, runs: &[RunResult]) -> Result<(bool, String), String> {
        let a = measure(runs, &self.lhs)?;
        let ok = a >= self.min && self.max.is_none_or(|mx| a <= mx);
        Ok((ok, format!("{} = {a:.3} ({})", fmt_measure(&self.lhs), min_max_text(self.min, self.max))))
    }
}
