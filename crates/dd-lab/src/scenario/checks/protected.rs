//! `kind = "protected"`: a gold container keeps its memory while others can still give (thesis 000,
//! Figure 4.8).

use super::measure::{ct_of, mib, run_of, scale_window, series};
use super::{CheckSpec, Names};
use crate::error::LabError;
use crate::record::{RunResult, Sample};
use crate::scenario::{mib_pages, Scenario};
use serde::{Deserialize, Serialize};

/// While any of `others` is above its floor plus `slack_mib`, `protected` loses at most `slack_mib` below
/// the most it held since `from_s`; and the others must reach their floors in the window (so the check
/// is about the order of reclaim, not about the absence of pressure).
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

/// A container's floor: the controller's `floor_mib` where the VM's controller configures the container,
/// else its soft limit (what Linux's own reclaim takes a container down to before it falls back to the
/// global LRU), else nothing.
fn floor_pages(sc: &Scenario, name: &str) -> u64 {
    let configured = sc.vms.iter().filter_map(|v| v.memctl.as_ref()).find_map(|m| m.containers.get(name));
    match configured {
        Some(c) => mib_pages(c.floor_mib),
        None => sc
            .vms
            .iter()
            .flat_map(|v| &v.containers)
            .find(|c| c.name == name)
            .and_then(|c| c.soft_limit_mib)
            .map_or(0, mib_pages),
    }
}

impl CheckSpec for ProtectedCheck {
    fn validate(&self, p: &str, names: &Names) -> Result<(), LabError> {
        let known = |c: &String| names.containers.contains(c);
        if !known(&self.protected) || !self.others.iter().all(known) {
            return Err(LabError::invalid(
                &format!("{p}.protected"),
                "protected and others must be containers",
            ));
        }
        names.variant(&self.variant, p)
    }

    fn scale(&mut self, k: f64) {
        scale_window(&mut self.from_s, &mut self.to_s, k);
        self.slack_mib *= k;
    }

    fn evaluate(&self, sc: &Scenario, runs: &[RunResult]) -> Result<(bool, String), String> {
        let c = self;
        let r = run_of(runs, c.variant.as_ref())?;
        let slack = mib_pages(c.slack_mib);
        let g = series(r, ct_of(r, &c.protected)?, c.from_s, c.to_s);
        let others: Vec<(Vec<&Sample>, u64)> = c
            .others
            .iter()
            .map(|o| Ok((series(r, ct_of(r, o)?, c.from_s, c.to_s), floor_pages(sc, o))))
            .collect::<Result<_, String>>()?;
        let mut peak = 0u64;
        let mut worst_loss = 0u64;
        let mut reached_at = None;
        let mut guarded = 0;
        for (k, s) in g.iter().enumerate() {
            peak = peak.max(s.memcg_pages);
            let others_can_give =
                others.iter().any(|(o, f)| o.get(k).is_some_and(|x| x.memcg_pages > f + slack));
            if others_can_give {
                guarded += 1;
                worst_loss = worst_loss.max(peak - s.memcg_pages);
            } else if reached_at.is_none() {
                reached_at = Some(s.t_s);
            }
        }
        let min_after = reached_at
            .map(|t| g.iter().filter(|s| s.t_s >= t).map(|s| s.memcg_pages).min().unwrap_or(0))
            .unwrap_or(peak);
        let ok = worst_loss <= slack && reached_at.is_some() && guarded > 0;
        Ok((
            ok,
            format!(
                "{}: peak {:.1} MiB, largest loss while others could give {:.1} MiB over {guarded} samples \
                 (want <= {:.1}); others at their floors from {}; {} then went down to {:.1} MiB",
                c.protected,
                mib(peak),
                mib(worst_loss),
                mib(slack),
                reached_at.map_or("never (FAIL)".into(), |t| format!("{t:.1} s")),
                c.protected,
                mib(min_after)
            ),
        ))
    }
}
