//! `kind = "mem_ratio"`: the memory controller keeps two containers' usage in a target ratio (thesis 000,
//! chapter 4: Figures 4.6-4.9).

use super::measure::{ct_of, in_range, range_text, run_of, scale_window, series};
use super::{CheckSpec, Names};
use crate::error::LabError;
use crate::record::RunResult;
use crate::scenario::Scenario;
use serde::{Deserialize, Serialize};

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

/// Per sample, the memory usage ratio `lhs / rhs` of two containers against `target`; the deviation is
/// `|ratio / target - 1|`. For each listed variant the chosen statistic must lie in `[min_dev, max_dev]`;
/// with `increasing = true` it must also grow along the variant list (strictly from the first to the
/// last, never falling in between by more than 1%).
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

impl CheckSpec for MemRatioCheck {
    fn validate(&self, p: &str, names: &Names) -> Result<(), LabError> {
        let bad = |f: &str, m: &str| Err(LabError::invalid(&format!("{p}.{f}"), m));
        if !(names.containers.contains(&self.lhs) && names.containers.contains(&self.rhs)) {
            return bad("lhs", "lhs and rhs must be containers");
        }
        if self.variants.iter().any(|v| !names.variants.contains(v)) {
            return bad("variants", "no such variant");
        }
        if !(self.target.is_finite() && self.target > 0.0) {
            return bad("target", "must be positive");
        }
        Ok(())
    }

    fn scale(&mut self, k: f64) {
        scale_window(&mut self.from_s, &mut self.to_s, k);
    }

    fn evaluate(&self, _: &Scenario, runs: &[RunResult]) -> Result<(bool, String), String> {
        let c = self;
        let variants: Vec<Option<&String>> =
            if c.variants.is_empty() { vec![None] } else { c.variants.iter().map(Some).collect() };
        let mut ok = true;
        let mut stats = Vec::new();
        let mut parts = Vec::new();
        for v in variants {
            let r = run_of(runs, v)?;
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
}
