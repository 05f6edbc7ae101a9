//! `kind = "entitlement"`: each entity's use of a store against its entitlement.

use super::measure::{members, run_of, window};
use super::{CheckSpec, Names};
use crate::error::LabError;
use crate::record::RunResult;
use crate::scenario::Scenario;
use serde::{Deserialize, Serialize};

/// Each entity's mean memory-store use over the window is within `tolerance` (fraction) of its mean
/// entitlement, or below it without evictions in the window (it does not demand more). With `exact =
/// false` (default) using more than the entitlement passes too (resource conservation lets a demanding
/// entity take what others leave unused); `exact = true` also bounds it from above. `effective = true`
/// compares with the effective entitlement (`crate::sim::effective`) instead of the static weight share,
/// so `exact` holds a resource-conserving result to what it may really use.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EntitlementCheck {
    #[serde(default)]
    pub exact: bool,
    #[serde(default)]
    pub effective: bool,
    #[serde(default)]
    pub variant: Option<String>,
    pub entities: Vec<String>,
    pub from_s: f64,
    pub to_s: f64,
    #[serde(default = "d_tol")]
    pub tolerance: f64,
    #[serde(default)]
    pub store: Option<dd_engine::StoreKind>,
}

fn d_tol() -> f64 {
    0.05
}

impl CheckSpec for EntitlementCheck {
    fn validate(&self, p: &str, names: &Names) -> Result<(), LabError> {
        let bad = |f: &str, m: &str| Err(LabError::invalid(&format!("{p}.{f}"), m));
        names.variant(&self.variant, p)?;
        if self.entities.is_empty() || self.entities.iter().any(|e| !names.entity_ok(e)) {
            return bad("entities", "needs existing containers or VMs");
        }
        if !(self.from_s.is_finite() && self.from_s >= 0.0 && self.to_s > self.from_s) {
            return bad("to_s", "window must be non-empty");
        }
        if !(self.tolerance.is_finite() && self.tolerance > 0.0) {
            return bad("tolerance", "must be positive");
        }
        Ok(())
    }

    fn scale(&mut self, k: f64) {
        self.from_s *= k;
        self.to_s *= k;
    }

    fn evaluate(&self, _: &Scenario, runs: &[RunResult]) -> Result<(bool, String), String> {
        let run = run_of(runs, self.variant.as_ref())?;
        let ssd = matches!(self.store, Some(dd_engine::StoreKind::Ssd));
        let mut ok = true;
        let mut parts = Vec::new();
        for e in &self.entities {
            let cts = members(run, e);
            let w = window(run, &cts, self.from_s, self.to_s);
            let times = w.iter().map(|s| s.t_s.to_bits()).collect::<std::collections::BTreeSet<_>>().len();
            if times == 0 {
                return Err(format!("no samples of {e} in the window"));
            }
            let n = times as f64;
            let used = w.iter().map(|s| if ssd { s.ssd_used } else { s.mem_used }).sum::<u64>() as f64 / n;
            let ent = w
                .iter()
                .map(|s| match (ssd, self.effective) {
                    (false, false) => s.mem_ent,
                    (true, false) => s.ssd_ent,
                    (false, true) => s.mem_eff,
                    (true, true) => s.ssd_eff,
                })
                .sum::<u64>() as f64
                / n;
            let ev: u64 = w.iter().map(|s| s.evictions).sum();
            let dev = if ent > 0.0 { (used - ent) / ent } else { f64::INFINITY };
            let this = if dev.abs() <= self.tolerance {
                true
            } else if used < ent {
                ev == 0
            } else {
                !self.exact
            };
            ok &= this;
            parts.push(format!(
                "{e}: used {:.1} MiB, entitled {:.1} MiB ({:+.1}%), {ev} evictions{}",
                used / 256.0,
                ent / 256.0,
                dev * 100.0,
                if this { "" } else { " FAIL" }
            ));
        }
        Ok((
            ok,
            format!(
                "{} (tolerance {:.0}%{}{})",
                parts.join("; "),
                self.tolerance * 100.0,
                if self.exact { ", exact" } else { "" },
                if self.effective { ", effective entitlement" } else { "" }
            ),
        ))
    }
}
