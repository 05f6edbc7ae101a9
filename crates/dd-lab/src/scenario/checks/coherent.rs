//! `kind = "coherent"`: every second-chance hit was verified and none was stale. Checked on every run
//! whether a scenario names it or not (`super::evaluate` adds it); naming it makes it fail on a run
//! without a single hit to verify.

use super::{CheckSpec, Names};
use crate::error::LabError;
use crate::record::RunResult;
use crate::scenario::Scenario;
use serde::{Deserialize, Serialize};

/// The run verified every second-chance hit's content and never saw stale data.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CoherentCheck {}

impl CheckSpec for CoherentCheck {
    fn validate(&self, _: &str, _: &Names) -> Result<(), LabError> {
        Ok(())
    }

    fn scale(&mut self, _: f64) {}

    fn evaluate(&self, _: &Scenario, runs: &[RunResult]) -> Result<(bool, String), String> {
        let verified: u64 = runs.iter().map(|r| r.verified_hits).sum();
        Ok((verified > 0, format!("{verified} second-chance hits verified, none stale")))
    }
}
