//! The checks a scenario carries: what a check measures (a metric of a container, VM or pool in a
//! variant and time window) and the kinds of check (thresholds, ratios, entitlement shares, coherency,
//! the memory controller's and the provisioner's). Plain data; `crate::results::checks` evaluates them.

use super::{memctl, provision};
use serde::{Deserialize, Serialize};

/// What a check measures for one container or VM of one variant.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Measure {
    /// Variant name; default: the first (or only) variant.
    #[serde(default)]
    pub variant: Option<String>,
    /// A container name, or a VM name for cache-use metrics.
    pub entity: String,
    pub metric: Metric,
    /// Window start (emulated s, scaled); default 0.
    #[serde(default)]
    pub from_s: Option<f64>,
    /// Window end; default the end of the run.
    #[serde(default)]
    pub to_s: Option<f64>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Metric {
    /// Application operations per second over the window.
    Throughput,
    /// MiB/s read and written by the application over the window.
    ThroughputMib,
    /// Mean operation latency, ms.
    LatencyMs,
    /// Mean pages held in the second-chance cache (both stores), over the window's samples.
    CacheUsed,
    /// Mean pages in the memory store.
    MemUsed,
    /// Mean pages in the SSD store.
    SsdUsed,
    /// Mean static entitlement in the memory store (the weight share, as the engine reports it).
    MemEntitlement,
    /// Mean effective entitlement in the memory store (`crate::sim::effective`: under-used shares
    /// redistributed by weight).
    MemEffectiveEntitlement,
    SsdEntitlement,
    SsdEffectiveEntitlement,
    /// Pages evicted from the pool(s) in the window.
    Evictions,
    /// Gets that hit, per 100 puts (Table 2's lookup-to-store ratio), in the window.
    LookupToStorePct,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum CheckKind {
    /// `lhs / rhs` is at least `min` (and at most `max` if given).
    Ratio {
        lhs: Measure,
        rhs: Measure,
        min: f64,
        #[serde(default)]
        max: Option<f64>,
    },
    /// `lhs` is at least `min` (and at most `max`).
    Value {
        lhs: Measure,
        min: f64,
        #[serde(default)]
        max: Option<f64>,
    },
    /// The largest over the smallest of one measure across variants is at most `max_ratio`.
    Spread {
        entity: String,
        metric: Metric,
        variants: Vec<String>,
        max_ratio: f64,
        #[serde(default)]
        from_s: Option<f64>,
        #[serde(default)]
        to_s: Option<f64>,
    },
    /// Each entity's mean memory-store use over the window is within `tolerance` (fraction) of its
    /// mean entitlement, or below it without evictions in the window (it does not demand more). With
    /// `exact = false` (default) using more than the entitlement passes too (resource conservation lets a
    /// demanding entity take what others leave unused); `exact = true` also bounds it from above.
    /// `effective = true` compares with the effective entitlement (`crate::sim::effective`) instead of the
    /// static weight share, so `exact` holds a resource-conserving result to what it may really use.
    Entitlement {
        #[serde(default)]
        exact: bool,
        #[serde(default)]
        effective: bool,
        #[serde(default)]
        variant: Option<String>,
        entities: Vec<String>,
        from_s: f64,
        to_s: f64,
        #[serde(default = "d_tol")]
        tolerance: f64,
        #[serde(default)]
        store: Option<dd_engine::StoreKind>,
    },
    /// The run verified every second-chance hit's content and never saw stale data (always checked).
    Coherent,
    /// Memory usage ratio of two containers against a target, per sample (`memctl`).
    MemRatio(memctl::MemRatioCheck),
    /// Gap between two containers' exceeds over their soft limits, per sample (`memctl`).
    ExceedGap(memctl::ExceedGapCheck),
    /// Share of VM-wide reclaim that was directed rather than LRU (`memctl`).
    ReclaimMode(memctl::ReclaimModeCheck),
    /// A container keeps its memory while others can still give (`memctl`).
    Protected(memctl::ProtectedCheck),
    /// Containers meet (or miss) their targets over a window.
    Targets(provision::TargetsCheck),
    /// A variant spends at most a fraction of a baseline's time below its targets.
    Violation(provision::ViolationCheck),
}

fn d_tol() -> f64 {
    0.05
}

/// A named check. (Unknown fields are rejected by the flattened [`CheckKind`]; serde cannot combine
/// `deny_unknown_fields` with `flatten` on this struct itself.)
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Check {
    pub name: String,
    #[serde(flatten)]
    pub kind: CheckKind,
}
