//! A run's record: what one variant's run produced (samples per container and interval, totals, the
//! provisioners' decisions and curves). Plain data, written by `crate::sim` and read by the checks
//! (`crate::scenario::checks`), the reports and the plots (`crate::results`); it sits above every other
//! layer so that a check kind can be written in one module beside its settings (D38).

use dd_engine::{Counters, Spec};
use dd_provision::{Allocation, Curve, Source, Target, TargetState};
use serde::Serialize;

/// One sampling interval of one container (counters are deltas over the interval, levels are at its
/// end). Sizes are 4 KiB pages.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Sample {
    pub t_s: f64,
    pub ct: usize,
    pub running: bool,
    pub memcg_pages: u64,
    pub mem_used: u64,
    pub mem_ent: u64,
    pub ssd_used: u64,
    pub ssd_ent: u64,
    /// Effective entitlements (`crate::sim::effective`): the static ones with the under-used shares
    /// redistributed by weight; filled in when the run ends.
    pub mem_eff: u64,
    pub ssd_eff: u64,
    pub puts: u64,
    pub puts_refused: u64,
    pub hits: u64,
    pub misses: u64,
    pub flushes: u64,
    pub evictions: u64,
    pub promotions: u64,
    pub demotions: u64,
    pub ops: u64,
    pub bytes: u64,
    pub lat_ns: u64,
    pub pc_hits: u64,
    pub pc_misses: u64,
    pub disk_reads: u64,
    /// Cumulative pages a VM memory controller took from the container by a directed decision and by
    /// its LRU fallback (levels, not deltas; 0 without a controller).
    pub reclaimed_directed: u64,
    pub reclaimed_lru: u64,
    /// Settings in force at the sample: the memcg hard limit (pages) and the pool's weights.
    pub limit_pages: u64,
    pub mem_weight: u32,
    pub ssd_weight: u32,
}

/// Per-container totals of a run.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct CtTotals {
    pub ops: u64,
    pub bytes: u64,
    pub lat_ns: u64,
    pub disk_reads: u64,
    pub mem_hits: u64,
    pub ssd_hits: u64,
    pub writebacks: u64,
    pub swap_outs: u64,
    pub run_s: f64,
    pub cache: Counters,
    pub pc_hits: u64,
    pub pc_misses: u64,
}

/// The result of one variant's run.
#[derive(Debug, Clone)]
pub struct RunResult {
    pub variant: String,
    pub duration_s: f64,
    /// Container names, their VM names, and whether they took part.
    pub containers: Vec<(String, String, bool)>,
    pub samples: Vec<Sample>,
    pub totals: Vec<CtTotals>,
    pub verified_hits: u64,
    /// Page accesses emulated (guest page-cache lookups).
    pub accesses: u64,
    /// The VM-level provisioners' decisions, in time order.
    pub decisions: Vec<Decision>,
    /// Each provisioned container's curves at its VM's last decision.
    pub curves: Vec<CurveSnapshot>,
}

/// One container in one decision.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct DecidedContainer {
    pub name: String,
    pub memory_limit_mib: f64,
    pub mem_cache_mib: f64,
    pub ssd_cache_mib: f64,
    pub spec: Spec,
    /// What the container did since the last decision.
    pub measured_ops_s: f64,
    pub predicted_ops_s: f64,
    pub predicted_latency_ms: f64,
    pub predicted_hit_ratio: f64,
    pub target: Option<Target>,
    pub target_met: Option<bool>,
    /// How it stands against its target as measured (`missed`: below it for the loop's
    /// `report_after` intervals in a row).
    pub state: TargetState,
    pub missed_intervals: u32,
}

/// One decision of one VM's provisioner.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Decision {
    pub t_s: f64,
    pub vm: String,
    pub feasible: bool,
    pub infeasible: Vec<String>,
    /// Containers whose target was measured missed for the loop's `report_after` intervals in a row.
    pub missed: Vec<String>,
    pub kept_current: bool,
    /// Where the plan came from (`learning`: nothing was changed).
    pub source: Source,
    pub containers: Vec<DecidedContainer>,
}

/// A container's curves at the last decision of its VM, and what the plan gave it (pages).
#[derive(Debug, Clone, PartialEq)]
pub struct CurveSnapshot {
    pub container: String,
    pub t_s: f64,
    /// `None` for a stream the container never used.
    pub file: Option<Curve>,
    pub anon: Option<Curve>,
    pub allocation: Allocation,
    /// The model's split of the memory between file and anonymous pages.
    pub file_pages: f64,
    pub anon_pages: f64,
}
