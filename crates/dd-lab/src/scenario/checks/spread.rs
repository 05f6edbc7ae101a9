//! `kind = "spread"`: one measure across variants, the largest over the smallest bounded.

use super::measure::{measure, serde_plain, threshold, Measure, Metric};
use super::{CheckSpec, Names};
use crate::error::LabError;
use crate::record::RunResult;
use crate::scenario::Scenario;
use serde::{Deserialize, Serialize};

/// The largest over the smallest of one measure across variants is at most `max_ratio`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SpreadCheck {
    pub entity: String,
    pub metric: Metric,
    pub variants: Vec<String>,
    pub max_ratio: f64,
    #[serde(default)]
    pub from_s: Option<f64>,
    #[serde(default)]
    pub to_s: Option<f64>,
}

impl CheckSpec for SpreadCheck {
    fn validate(&self, p: &str, names: &Names) -> Result<(), LabError> {
        if !names.entity_ok(&self.entity) {
            return Err(LabError::invalid(&format!("{p}.entity"), "no such container or VM"));
        }
        if self.variants.len() < 2 || self.variants.iter().any(|v| !names.variants.contains(v)) {
            return Err(LabError::invalid(&format!("{p}.variants"), "needs two or more existing variants"));
        }
        Ok(())
    }

    fn scale(&mut self, k: f64) {
        self.from_s = self.from_s.map(|x| x * k);
        self.to_s = self.to_s.map(|x| x * k);
    }

    fn evaluate(&self, _: &Scenario, runs: &[RunResult]) -> Result<(bool, String), String> {
        let mut vals = Vec::new();
        for v in &self.variants {
            let m = Measure {
                variant: Some(v.clone()),
                entity: self.entity.clone(),
                metric: self.metric,
                from_s: self.from_s,
                to_s: self.to_s,
            };
            vals.push((v.clone(), measure(runs, &m)?));
        }
        let mx = vals.iter().map(|v| v.1).fold(f64::MIN, f64::max);
        let mn = vals.iter().map(|v| v.1).fold(f64::MAX, f64::min);
        let ratio = if mn > 0.0 { mx / mn } else { f64::INFINITY };
        let list = vals.iter().map(|(v, x)| format!("{v}={x:.3}")).collect::<Vec<_>>().join(", ");
        Ok((
            ratio <= self.max_ratio,
            format!(
                "{}({}): {list}; max/min {ratio:.3} (want <= {})",
                serde_plain(&self.metric),
                self.entity,
                threshold(self.max_ratio)
            ),
        ))
    }
}
