//! `kind = "exceed_gap"`: two containers exceed their soft limits by about the same amount (thesis 000,
//! Figures 4.2-4.4).

use super::measure::{ct_of, in_range, range_text, run_of, scale_window, series};
use super::{CheckSpec, Names};
use crate::error::LabError;
use crate::record::RunResult;
use crate::scenario::{mib_pages, Scenario};
use serde::{Deserialize, Serialize};

/// Per sample, the difference between two containers' exceeds over their soft limits, `|(U_l - SL_l) -
/// (U_r - SL_r)|`, in MiB (scaled). Its largest value in the window must be at most `max_gap_mib` (and
/// at least `min_gap_mib` if given).
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

/// Soft limit of a container in pages (`u64::MAX` when none), from the scaled scenario.
fn soft_pages(sc: &Scenario, name: &str) -> u64 {
    sc.containers()
        .find(|(_, _, c)| c.name == name)
        .and_then(|(_, _, c)| c.soft_limit_mib)
        .map_or(u64::MAX, mib_pages)
}

impl CheckSpec for ExceedGapCheck {
    fn validate(&self, p: &str, names: &Names) -> Result<(), LabError> {
        if !(names.containers.contains(&self.lhs) && names.containers.contains(&self.rhs)) {
            return Err(LabError::invalid(&format!("{p}.lhs"), "lhs and rhs must be containers"));
        }
        names.variant(&self.variant, p)
    }

    fn scale(&mut self, k: f64) {
        scale_window(&mut self.from_s, &mut self.to_s, k);
        self.max_gap_mib = self.max_gap_mib.map(|g| g * k);
        self.min_gap_mib = self.min_gap_mib.map(|g| g * k);
    }

    fn evaluate(&self, sc: &Scenario, runs: &[RunResult]) -> Result<(bool, String), String> {
        let c = self;
        let r = run_of(runs, c.variant.as_ref())?;
        let (l, h) = (ct_of(r, &c.lhs)?, ct_of(r, &c.rhs)?);
        let (sl, sh) = (soft_pages(sc, &c.lhs), soft_pages(sc, &c.rhs));
        if sl == u64::MAX || sh == u64::MAX {
            return Err("both containers need a soft limit".into());
        }
        let (a, b) = (series(r, l, c.from_s, c.to_s), series(r, h, c.from_s, c.to_s));
        let gaps: Vec<f64> = a
            .iter()
            .zip(&b)
            .map(|(x, y)| {
                ((x.memcg_pages as f64 - sl as f64) - (y.memcg_pages as f64 - sh as f64)).abs() / 256.0
            })
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
}
