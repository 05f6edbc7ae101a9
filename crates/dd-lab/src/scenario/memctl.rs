//! The `[vms.memctl]` table as plain scenario data (thesis 000, chapter 4): the policy, chunk cap and
//! per-container weight, class and floor of a VM's controller, and a variant's override of it. The
//! controller itself is `crate::model::guest::memctl`; its checks (`mem_ratio`, `exceed_gap`,
//! `reclaim_mode`, `protected`) are kinds of `super::checks`.

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
