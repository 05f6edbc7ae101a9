//! What several check kinds read from a run's record: a [`Measure`] (a [`Metric`] of a container or VM
//! over a variant's window) and its value, a container's samples in a window, and the text of
//! thresholds and bounds as people write them.

use crate::record::{RunResult, Sample};
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

impl Measure {
    pub(super) fn scale(&mut self, k: f64) {
        self.from_s = self.from_s.map(|x| x * k);
        self.to_s = self.to_s.map(|x| x * k);
    }
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

impl Metric {
    /// Whether the metric is a size or a page count, which shrinks with the scenario (rates and ratios
    /// do not).
    pub fn is_size(self) -> bool {
        matches!(
            self,
            Metric::CacheUsed
                | Metric::MemUsed
                | Metric::SsdUsed
                | Metric::MemEntitlement
                | Metric::MemEffectiveEntitlement
                | Metric::SsdEntitlement
                | Metric::SsdEffectiveEntitlement
                | Metric::Evictions
        )
    }
}

/// The run of a variant (`None`: the first run).
pub(crate) fn run_of<'a>(runs: &'a [RunResult], variant: Option<&String>) -> Result<&'a RunResult, String> {
    match variant {
        None => runs.first().ok_or_else(|| "no run".to_string()),
        Some(v) => runs.iter().find(|r| &r.variant == v).ok_or_else(|| format!("no variant {v}")),
    }
}

/// Container indices an entity name stands for (a container, or every container of a VM).
pub(crate) fn members(run: &RunResult, entity: &str) -> Vec<usize> {
    run.containers
        .iter()
        .enumerate()
        .filter(|(_, (c, vm, en))| *en && (c == entity || vm == entity))
        .map(|(i, _)| i)
        .collect()
}

/// Samples of `cts` with `from < t <= to`, grouped by sample time.
pub(crate) fn window<'a>(run: &'a RunResult, cts: &[usize], from: f64, to: f64) -> Vec<&'a Sample> {
    run.samples.iter().filter(|s| s.t_s > from + 1e-9 && s.t_s <= to + 1e-9 && cts.contains(&s.ct)).collect()
}

/// The value of a measure, with the unit in the docs of [`Metric`] (cache sizes in MiB).
pub fn measure(runs: &[RunResult], m: &Measure) -> Result<f64, String> {
    let run = run_of(runs, m.variant.as_ref())?;
    let cts = members(run, &m.entity);
    if cts.is_empty() {
        return Err(format!("{} does not run in variant {}", m.entity, run.variant));
    }
    let from = m.from_s.unwrap_or(0.0);
    let to = m.to_s.unwrap_or(run.duration_s).min(run.duration_s);
    let w = window(run, &cts, from, to);
    let span = (to - from).max(1e-9);
    let sum = |f: &dyn Fn(&Sample) -> u64| w.iter().map(|s| f(s)).sum::<u64>() as f64;
    let times =
        w.iter().map(|s| s.t_s.to_bits()).collect::<std::collections::BTreeSet<_>>().len().max(1) as f64;
    Ok(match m.metric {
        Metric::Throughput => sum(&|s| s.ops) / span,
        Metric::ThroughputMib => sum(&|s| s.bytes) / (1024.0 * 1024.0) / span,
        Metric::LatencyMs => {
            let ops = sum(&|s| s.ops);
            if ops == 0.0 {
                0.0
            } else {
                sum(&|s| s.lat_ns) / ops / 1e6
            }
        }
        Metric::CacheUsed => sum(&|s| s.mem_used + s.ssd_used) / times / 256.0,
        Metric::MemUsed => sum(&|s| s.mem_used) / times / 256.0,
        Metric::SsdUsed => sum(&|s| s.ssd_used) / times / 256.0,
        Metric::MemEntitlement => sum(&|s| s.mem_ent) / times / 256.0,
        Metric::MemEffectiveEntitlement => sum(&|s| s.mem_eff) / times / 256.0,
        Metric::SsdEntitlement => sum(&|s| s.ssd_ent) / times / 256.0,
        Metric::SsdEffectiveEntitlement => sum(&|s| s.ssd_eff) / times / 256.0,
        Metric::Evictions => sum(&|s| s.evictions),
        Metric::LookupToStorePct => {
            let puts = sum(&|s| s.puts);
            if puts == 0.0 {
                0.0
            } else {
                sum(&|s| s.hits) / puts * 100.0
            }
        }
    })
}

pub(crate) fn fmt_measure(m: &Measure) -> String {
    format!(
        "{}({}{})",
        serde_plain(&m.metric),
        m.entity,
        m.variant.as_ref().map(|v| format!("@{v}")).unwrap_or_default()
    )
}

/// A check's threshold as people write it: scaled thresholds (`0.1 * 3`) print as 0.3, not
/// 0.30000000000000004; at most 4 decimals, trailing zeros dropped.
pub(crate) fn threshold(x: f64) -> String {
    let s = format!("{x:.4}");
    let s = s.trim_end_matches('0').trim_end_matches('.');
    if s == "-0" {
        "0".into()
    } else {
        s.to_string()
    }
}

/// `min` and `max` as a check's text says them: ` (want >= MIN, <= MAX)` without the parenthesis.
pub(crate) fn min_max_text(min: f64, max: Option<f64>) -> String {
    format!("want >= {}{}", threshold(min), max.map(|m| format!(", <= {}", threshold(m))).unwrap_or_default())
}

/// A bound as written in a scenario (scaled bounds print without float noise).
pub(crate) fn range_text(min: Option<f64>, max: Option<f64>) -> String {
    let (min, max) = (min.map(threshold), max.map(threshold));
    match (min, max) {
        (Some(a), Some(b)) => format!("want in [{a}, {b}]"),
        (Some(a), None) => format!("want >= {a}"),
        (None, Some(b)) => format!("want <= {b}"),
        (None, None) => "no bound".into(),
    }
}

pub(crate) fn in_range(x: f64, min: Option<f64>, max: Option<f64>) -> bool {
    min.is_none_or(|m| x >= m) && max.is_none_or(|m| x <= m)
}

pub(crate) fn serde_plain<T: Serialize>(v: &T) -> String {
    serde_json::to_string(v).unwrap_or_default().trim_matches('"').to_string()
}

/// The index of a container that takes part in a run.
pub(crate) fn ct_of(r: &RunResult, name: &str) -> Result<usize, String> {
    r.containers
        .iter()
        .position(|(c, _, en)| c == name && *en)
        .ok_or_else(|| format!("{name} does not run in variant {}", r.variant))
}

/// Samples of container `ct` in `(from, to]`, in time order.
pub(crate) fn series(r: &RunResult, ct: usize, from: f64, to: Option<f64>) -> Vec<&Sample> {
    let to = to.unwrap_or(r.duration_s);
    r.samples.iter().filter(|s| s.ct == ct && s.t_s > from + 1e-9 && s.t_s <= to + 1e-9).collect()
}

/// Scales a window that starts at a time and may run to the end.
pub(crate) fn scale_window(from_s: &mut f64, to_s: &mut Option<f64>, k: f64) {
    *from_s *= k;
    *to_s = to_s.map(|t| t * k);
}

pub(crate) fn mib(pages: u64) -> f64 {
    pages as f64 / 256.0
}
