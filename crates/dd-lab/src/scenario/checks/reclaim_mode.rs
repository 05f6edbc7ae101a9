//! `kind = "reclaim_mode"`: how much of VM-wide reclaim the memory controller directed rather than left
//! to the LRU fallback (thesis 000, chapter 4).

use super::measure::{ct_of, mib, run_of, scale_window, series, threshold};
use super::{CheckSpec, Names};
use crate::error::LabError;
use crate::record::RunResult;
use crate::scenario::Scenario;
use serde::{Deserialize, Serialize};

/// Of the pages VM-wide reclaim took from `entities` in the window, the fraction taken by directed
/// reclaim (soft-limit exceed, or proportional exceed) rather than by the LRU fallback must lie in
/// `[min, max]`.
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

/// Directed and LRU pages reclaimed from `ct` between the window's first and last sample.
fn reclaimed(r: &RunResult, ct: usize, from: f64, to: Option<f64>) -> (u64, u64) {
    let before = r.samples.iter().rfind(|s| s.ct == ct && s.t_s <= from + 1e-9);
    let w = series(r, ct, from, to);
    let (d0, l0) = before.map_or((0, 0), |s| (s.reclaimed_directed, s.reclaimed_lru));
    w.last().map_or((0, 0), |s| (s.reclaimed_directed - d0, s.reclaimed_lru - l0))
}

impl CheckSpec for ReclaimModeCheck {
    fn validate(&self, p: &str, names: &Names) -> Result<(), LabError> {
        if self.entities.is_empty() || self.entities.iter().any(|e| !names.containers.contains(e)) {
            return Err(LabError::invalid(&format!("{p}.entities"), "needs existing containers"));
        }
        names.variant(&self.variant, p)
    }

    fn scale(&mut self, k: f64) {
        scale_window(&mut self.from_s, &mut self.to_s, k);
    }

    fn evaluate(&self, _: &Scenario, runs: &[RunResult]) -> Result<(bool, String), String> {
        let c = self;
        let r = run_of(runs, c.variant.as_ref())?;
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
                threshold(c.min),
                threshold(c.max)
            ),
        ))
    }
}
