//! The `[vms.memctl]` table and the memory controller's checks as plain scenario data (thesis 000,
//! chapter 4): the policy, chunk cap and per-container weight, class and floor of a VM's controller,
//! a variant's override of it, and the settings of the `mem_ratio`, `exceed_gap`, `reclaim_mode` and
//! `protected` checks with their validation and scaling. The controller itself is
//! `crate::model::guest::memctl`; the checks are evaluated in `crate::results::checks::memctl`.

use crate::error::LabError;
use dd_memctl::{Class, Policy};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

fn d_chunk() -> f64 {
    50.0
}
fn d_weight() -> u32 {
    1
}

/// `[vms.memctl]`: the VM's memory-controller policy. Without it the guest keeps Linux's built-in
/// reclaim (the same behaviour as `policy = "linux-default"`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VmMemctl {
    /// `linux-default`, `proportional` or `proportional-classes`. Default `proportional`.
    #[serde(default)]
    pub policy: Policy,
    /// Most memory one reclaim request takes from one container, MiB (scaled). Default 50.
    #[serde(default = "d_chunk")]
    pub chunk_cap_mib: f64,
    /// Weight, class and floor per container name; a container not listed has weight 1, class silver,
    /// floor 0.
    #[serde(default)]
    pub containers: BTreeMap<String, CtMemctl>,
}

/// One container's controller settings.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CtMemctl {
    /// Relative weight (eq. 4.2). Default 1.
    #[serde(default = "d_weight")]
    pub weight: u32,
    /// `gold`, `silver` (default) or `bronze`.
    #[serde(default)]
    pub class: Class,
    /// Memory the controller never takes from it, MiB (scaled). Default 0.
    #[serde(default)]
    pub floor_mib: f64,
}

/// A variant's override of a VM's controller (`[variants.memctl.VM]`).
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MemctlOverride {
    #[serde(default)]
    pub policy: Option<Policy>,
    #[serde(default)]
    pub chunk_cap_mib: Option<f64>,
}

impl VmMemctl {
    /// `p` is the table's path, e.g. `vms[0].memctl`; `containers` the VM's container names.
    pub fn validate(&self, p: &str, containers: &[&str]) -> Result<(), LabError> {
        if !(self.chunk_cap_mib.is_finite() && self.chunk_cap_mib > 0.0) {
            return Err(LabError::invalid(&format!("{p}.chunk_cap_mib"), "must be positive"));
        }
        for (name, c) in &self.containers {
            if !containers.contains(&name.as_str()) {
                return Err(LabError::invalid(
                    &format!("{p}.containers.{name}"),
                    "no such container in this VM",
                ));
            }
            if !(c.floor_mib.is_finite() && c.floor_mib >= 0.0) {
                return Err(LabError::invalid(
                    &format!("{p}.containers.{name}.floor_mib"),
                    "must be non-negative",
                ));
            }
        }
        Ok(())
    }

    pub fn scale(&mut self, k: f64) {
        self.chunk_cap_mib *= k;
        for c in self.containers.values_mut() {
            c.floor_mib *= k;
        }
    }

    pub fn apply(&mut self, o: &MemctlOverride) {
        if let Some(p) = o.policy {
            self.policy = p;
        }
        if let Some(c) = o.chunk_cap_mib {
            self.chunk_cap_mib = c;
        }
    }
}

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

/// `kind = "mem_ratio"`: per sample, the memory usage ratio `lhs / rhs` of two containers against
/// `target`; the deviation is `|ratio / target - 1|`. For each listed variant the chosen statistic must
/// lie in `[min_dev, max_dev]`; with `increasing = true` it must also grow along the variant list
/// (strictly from the first to the last, never falling in between by more than 1%).
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

/// `kind = "exceed_gap"`: per sample, the difference between two containers' exceeds over their soft
/// limits, `|(U_l - SL_l) - (U_r - SL_r)|`, in MiB (scaled). Its largest value in the window must be at
/// most `max_gap_mib` (and at least `min_gap_mib` if given).
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

/// `kind = "reclaim_mode"`: of the pages VM-wide reclaim took from `entities` in the window, the
/// fraction taken by directed reclaim (soft-limit exceed, or proportional exceed) rather than by the
/// LRU fallback must lie in `[min, max]`.
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

/// `kind = "protected"`: while any of `others` is above its floor plus `slack_mib`, `protected` loses
/// at most `slack_mib` below the most it held since `from_s`; and the others must reach their floors in
/// the window (so the check is about the order of reclaim, not about the absence of pressure).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProtectedCheck {
    #[serde(default)]
    pub variant: Option<String>,
    pub protected: String,
    pub others: Vec<String>,
    pub from_s: f64,
    #[serde(default)]
    pub to_s: Option<f64>,
    pub slack_mib: f64,
}

impl MemRatioCheck {
    pub fn scale(&mut self, k: f64) {
        self.from_s *= k;
        self.to_s = self.to_s.map(|t| t * k);
    }
}
impl ExceedGapCheck {
    pub fn scale(&mut self, k: f64) {
        self.from_s *= k;
        self.to_s = self.to_s.map(|t| t * k);
        self.max_gap_mib = self.max_gap_mib.map(|g| g * k);
        self.min_gap_mib = self.min_gap_mib.map(|g| g * k);
    }
}
impl ReclaimModeCheck {
    pub fn scale(&mut self, k: f64) {
        self.from_s *= k;
        self.to_s = self.to_s.map(|t| t * k);
    }
}
impl ProtectedCheck {
    pub fn scale(&mut self, k: f64) {
        self.from_s *= k;
        self.to_s = self.to_s.map(|t| t * k);
        self.slack_mib *= k;
    }
}
