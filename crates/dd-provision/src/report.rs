//! What a provisioner on a real guest reports after each round (`doubledecker guest provision`): its
//! targets, its decisions and what it measured, per container. Plain data, the body of the daemon's
//! `PUT /v1/vm/provisioner` (`docs/admin-api.yaml`, schema `ProvisionerReport`) and what `/ui/` shows; the
//! guest that sends it and the daemon that keeps it share this one type.
//!
//! [`RoundReport::validate`] is the daemon's check of a body from a guest (which it does not trust): the
//! sizes it keeps are bounded and every number is finite and in its domain, so the page that shows it
//! never meets NaN, a negative size or a name of a megabyte.

use crate::feedback::{Source, TargetState};
use crate::model::Target;
use dd_types::Spec;
use serde::{Deserialize, Serialize};

/// Most containers one report may name.
pub const MAX_CONTAINERS: usize = 256;
/// Longest container name, bytes.
pub const MAX_NAME_BYTES: usize = 128;

/// One container in a round's report.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ContainerReport {
    pub name: String,
    /// Its pool on the daemon (the watcher's), if any.
    pub pool: Option<u32>,
    /// The first-level budget planned (the container's page cache in the mount).
    pub budget_bytes: u64,
    /// Its planned shares of the VM's memory-store and SSD-store entitlements.
    pub mem_cache_bytes: u64,
    pub ssd_cache_bytes: u64,
    /// Its pool's spec, `<T, W>`, giving those shares.
    pub spec: Spec,
    /// The cgroup memory limit set (when `memory_base_bytes` is).
    pub memory_limit_bytes: Option<u64>,
    /// Since the last round (the first round: since the provisioner started).
    pub measured_hit_ratio: f64,
    pub measured_latency_ms: f64,
    pub reads_per_s: f64,
    /// What the model expects of the plan.
    pub predicted_hit_ratio: f64,
    pub predicted_latency_ms: f64,
    pub predicted_reads_per_s: f64,
    pub target: Option<Target>,
    /// The plan meets the target (as predicted); `None`: no target.
    pub target_met: Option<bool>,
    /// The measurement since the last round meets the target; `None`: no target or no reads.
    pub measured_target_met: Option<bool>,
    /// Distinct pages it read, as the sampled curve estimates, bytes.
    pub footprint_bytes: u64,
    /// How it stands against its target as measured (the closed loop's report: `missed` after
    /// `report_after` rounds below it in a row, `infeasible` when nothing measured or predicted within
    /// the budget meets it).
    pub state: TargetState,
    /// Rounds in a row its measurement missed the target.
    pub missed_intervals: u32,
    /// What the closed loop learnt of the model for it: measured over predicted throughput at the
    /// allocations it ran (1: the model was right; 0.5: it measured half of what the model said).
    /// Optional on the wire (1 when left out: a guest from before it was reported).
    #[serde(default = "no_correction")]
    pub correction: f64,
}

fn no_correction() -> f64 {
    1.0
}

/// What a round decided (and, unless a dry run, applied).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RoundReport {
    /// Rounds since the provisioner started, from 1.
    pub round: u64,
    pub applied: bool,
    /// Every target is met by the plan (as predicted).
    pub feasible: bool,
    /// Containers whose target nothing within the budget meets: no allocation measured, none predicted.
    pub infeasible: Vec<String>,
    /// Containers whose target was measured missed for the closed loop's `report_after` rounds in a row.
    pub missed: Vec<String>,
    /// Where the plan came from (the model, the best allocation measured, the one in force, an
    /// exploration).
    pub source: Source,
    /// The current allocation was kept (hysteresis).
    pub kept_current: bool,
    /// What the plan shared out, bytes: first-level memory, memory-cache and SSD-cache entitlements.
    pub memory_bytes: u64,
    pub mem_cache_bytes: u64,
    pub ssd_cache_bytes: u64,
    pub containers: Vec<ContainerReport>,
}

/// Why a report is refused: the field, and what is wrong with it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {reason}")]
pub struct ReportError {
    pub field: String,
    pub reason: &'static str,
}

fn check_name(field: String, n: &str) -> Result<(), ReportError> {
    if dd_types::names::name_problem(n, MAX_NAME_BYTES).is_some() {
        let reason = "a name of 1 to 128 bytes without control, direction or invisible characters";
        return Err(ReportError { field, reason });
    }
    Ok(())
}

impl RoundReport {
    /// Bounds and domains (see the module documentation).
    pub fn validate(&self) -> Result<(), ReportError> {
        if self.containers.len() > MAX_CONTAINERS
            || self.infeasible.len() > MAX_CONTAINERS
            || self.missed.len() > MAX_CONTAINERS
        {
            return Err(ReportError { field: "containers".into(), reason: "at most 256 containers" });
        }
        for (i, n) in self.infeasible.iter().enumerate() {
            check_name(format!("infeasible[{i}]"), n)?;
        }
        for (i, n) in self.missed.iter().enumerate() {
            check_name(format!("missed[{i}]"), n)?;
        }
        for (i, c) in self.containers.iter().enumerate() {
            let f = |n: &str| format!("containers[{i}].{n}");
            check_name(f("name"), &c.name)?;
            for (n, v) in [
                ("measured_latency_ms", c.measured_latency_ms),
                ("reads_per_s", c.reads_per_s),
                ("predicted_latency_ms", c.predicted_latency_ms),
                ("predicted_reads_per_s", c.predicted_reads_per_s),
                ("correction", c.correction),
            ] {
                if !(v.is_finite() && v >= 0.0) {
                    return Err(ReportError { field: f(n), reason: "must be finite and non-negative" });
                }
            }
            for (n, v) in
                [("measured_hit_ratio", c.measured_hit_ratio), ("predicted_hit_ratio", c.predicted_hit_ratio)]
            {
                if !(0.0..=1.0).contains(&v) {
                    return Err(ReportError { field: f(n), reason: "must be in [0, 1]" });
                }
            }
            if let Some(t) = &c.target {
                if t.validate("target").is_err() {
                    return Err(ReportError {
                        field: f("target"),
                        reason: "must be positive (a hit ratio: in [0, 1])",
                    });
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn container(name: &str) -> ContainerReport {
        ContainerReport {
            name: name.into(),
            pool: Some(1),
            budget_bytes: 4096,
            mem_cache_bytes: 0,
            ssd_cache_bytes: 0,
            spec: Spec::Mem { weight: 1 },
            memory_limit_bytes: None,
            measured_hit_ratio: 0.5,
            measured_latency_ms: 0.1,
            reads_per_s: 10.0,
            predicted_hit_ratio: 0.9,
            predicted_latency_ms: 0.01,
            predicted_reads_per_s: 10.0,
            target: Some(Target::HitRatio { ratio: 0.8 }),
            target_met: Some(true),
            measured_target_met: Some(false),
            footprint_bytes: 8192,
            state: TargetState::Below,
            missed_intervals: 1,
            correction: 0.5,
        }
    }

    #[test]
    fn validate_names_the_bad_field() {
        let mut r = RoundReport {
            round: 1,
            applied: true,
            feasible: true,
            infeasible: vec![],
            missed: vec![],
            source: Source::Model,
            kept_current: false,
            memory_bytes: 1 << 20,
            mem_cache_bytes: 0,
            ssd_cache_bytes: 0,
            containers: vec![container("web"), container("db")],
        };
        r.validate().unwrap();
        let json = serde_json::to_string(&r).unwrap();
        assert_eq!(serde_json::from_str::<RoundReport>(&json).unwrap(), r, "the wire form round-trips");
        r.containers[1].measured_hit_ratio = f64::NAN;
        assert_eq!(r.validate().unwrap_err().field, "containers[1].measured_hit_ratio");
        r.containers[1].measured_hit_ratio = 0.5;
        r.containers[0].name = "x".repeat(129);
        assert_eq!(r.validate().unwrap_err().field, "containers[0].name");
        r.containers[0].name = "web".into();
        r.containers[0].reads_per_s = -1.0;
        assert_eq!(r.validate().unwrap_err().field, "containers[0].reads_per_s");
        r.containers[0].reads_per_s = 1.0;
        r.containers[0].correction = f64::INFINITY;
        assert_eq!(r.validate().unwrap_err().field, "containers[0].correction");
        r.containers[0].correction = 1.0;
        r.containers[0].target = Some(Target::Throughput { ops_s: 0.0 });
        assert_eq!(r.validate().unwrap_err().field, "containers[0].target");
        r.containers[0].target = None;
        r.missed = vec!["bad\nname".into()];
        assert_eq!(r.validate().unwrap_err().field, "missed[0]");
        r.missed = vec![];
        r.containers = (0..257).map(|i| container(&format!("c{i}"))).collect();
        assert_eq!(r.validate().unwrap_err().field, "containers");
    }
}
