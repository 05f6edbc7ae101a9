//! Results of a scenario: the named checks, `summary.json`, `timeseries.csv`, and (with `plot`) the
//! PNGs and `report.html`.
//!
//! Everything written here is a function of the runs' emulated results only: no wall-clock time, no
//! host name, no map with random iteration order, so the same scenario and seed give byte-identical
//! `summary.json` and `timeseries.csv`. Timing fields (wall seconds, accesses per second) are printed by
//! the command line and never written into these two files.

use crate::error::LabError;
use crate::scenario::{CheckKind, Measure, Metric, Scenario};
use crate::sim::{RunResult, Sample};
use serde::Serialize;
use std::path::Path;

/// A scenario's runs (one per variant) and its checks.
#[derive(Debug, Clone)]
pub struct ScenarioResult {
    /// The scenario as run (scaled).
    pub scenario: Scenario,
    /// The scale factor that was applied.
    pub scale: f64,
    pub runs: Vec<RunResult>,
    pub checks: Vec<CheckResult>,
}

impl ScenarioResult {
    pub fn all_passed(&self) -> bool {
        self.checks.iter().all(|c| c.passed)
    }
    pub fn accesses(&self) -> u64 {
        self.runs.iter().map(|r| r.accesses).sum()
    }
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CheckResult {
    pub name: String,
    pub passed: bool,
    pub detail: String,
}

fn run_of<'a>(runs: &'a [RunResult], variant: &Option<String>) -> Result<&'a RunResult, String> {
    match variant {
        None => runs.first().ok_or_else(|| "no run".to_string()),
        Some(v) => runs.iter().find(|r| &r.variant == v).ok_or_else(|| format!("no variant {v}")),
    }
}

/// Container indices an entity name stands for (a container, or every container of a VM).
fn members(run: &RunResult, entity: &str) -> Vec<usize> {
    run.containers
        .iter()
        .enumerate()
        .filter(|(_, (c, vm, en))| *en && (c == entity || vm == entity))
        .map(|(i, _)| i)
        .collect()
}

/// Samples of `cts` with `from < t <= to`, grouped by sample time.
fn window<'a>(run: &'a RunResult, cts: &[usize], from: f64, to: f64) -> Vec<&'a Sample> {
    run.samples.iter().filter(|s| s.t_s > from + 1e-9 && s.t_s <= to + 1e-9 && cts.contains(&s.ct)).collect()
}

/// The value of a measure, with the unit in the docs of [`Metric`] (cache sizes in MiB).
pub fn measure(runs: &[RunResult], m: &Measure) -> Result<f64, String> {
    let run = run_of(runs, &m.variant)?;
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

fn fmt_measure(m: &Measure) -> String {
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

fn serde_plain<T: Serialize>(v: &T) -> String {
    serde_json::to_string(v).unwrap_or_default().trim_matches('"').to_string()
}

/// Evaluates the scenario's checks (plus the implicit coherency check) on its runs.
pub fn evaluate(sc: &Scenario, runs: &[RunResult]) -> Vec<CheckResult> {
    let mut out = Vec::new();
    let verified: u64 = runs.iter().map(|r| r.verified_hits).sum();
    let mut has_coherent = false;
    for c in &sc.checks {
        let r: Result<(bool, String), String> = (|| match &c.kind {
            CheckKind::Ratio { lhs, rhs, min, max } => {
                let (a, b) = (measure(runs, lhs)?, measure(runs, rhs)?);
                let ratio = if b == 0.0 {
                    if a > 0.0 {
                        f64::INFINITY
                    } else {
                        0.0
                    }
                } else {
                    a / b
                };
                let ok = ratio >= *min && max.is_none_or(|mx| ratio <= mx);
                Ok((
                    ok,
                    format!(
                        "{} = {a:.3} / {} = {b:.3} -> ratio {ratio:.3} (want >= {}{})",
                        fmt_measure(lhs),
                        fmt_measure(rhs),
                        threshold(*min),
                        max.map(|m| format!(", <= {}", threshold(m))).unwrap_or_default()
                    ),
                ))
            }
            CheckKind::Value { lhs, min, max } => {
                let a = measure(runs, lhs)?;
                let ok = a >= *min && max.is_none_or(|mx| a <= mx);
                Ok((
                    ok,
                    format!(
                        "{} = {a:.3} (want >= {}{})",
                        fmt_measure(lhs),
                        threshold(*min),
                        max.map(|m| format!(", <= {}", threshold(m))).unwrap_or_default()
                    ),
                ))
            }
            CheckKind::Spread { entity, metric, variants, max_ratio, from_s, to_s } => {
                let mut vals = Vec::new();
                for v in variants {
                    let m = Measure {
                        variant: Some(v.clone()),
                        entity: entity.clone(),
                        metric: *metric,
                        from_s: *from_s,
                        to_s: *to_s,
                    };
                    vals.push((v.clone(), measure(runs, &m)?));
                }
                let mx = vals.iter().map(|v| v.1).fold(f64::MIN, f64::max);
                let mn = vals.iter().map(|v| v.1).fold(f64::MAX, f64::min);
                let ratio = if mn > 0.0 { mx / mn } else { f64::INFINITY };
                let list = vals.iter().map(|(v, x)| format!("{v}={x:.3}")).collect::<Vec<_>>().join(", ");
                Ok((
                    ratio <= *max_ratio,
                    format!(
                        "{}({entity}): {list}; max/min {ratio:.3} (want <= {})",
                        serde_plain(metric),
                        threshold(*max_ratio)
                    ),
                ))
            }
            CheckKind::Entitlement {
                variant,
                entities,
                from_s,
                to_s,
                tolerance,
                store,
                exact,
                effective,
            } => {
                let run = run_of(runs, variant)?;
                let ssd = matches!(store, Some(dd_engine::StoreKind::Ssd));
                let mut ok = true;
                let mut parts = Vec::new();
                for e in entities {
                    let cts = members(run, e);
                    let w = window(run, &cts, *from_s, *to_s);
                    let times =
                        w.iter().map(|s| s.t_s.to_bits()).collect::<std::collections::BTreeSet<_>>().len();
                    if times == 0 {
                        return Err(format!("no samples of {e} in the window"));
                    }
                    let n = times as f64;
                    let used =
                        w.iter().map(|s| if ssd { s.ssd_used } else { s.mem_used }).sum::<u64>() as f64 / n;
                    let ent = w
                        .iter()
                        .map(|s| match (ssd, *effective) {
                            (false, false) => s.mem_ent,
                            (true, false) => s.ssd_ent,
                            (false, true) => s.mem_eff,
                            (true, true) => s.ssd_eff,
                        })
                        .sum::<u64>() as f64
                        / n;
                    let ev: u64 = w.iter().map(|s| s.evictions).sum();
                    let dev = if ent > 0.0 { (used - ent) / ent } else { f64::INFINITY };
                    let this = if dev.abs() <= *tolerance {
                        true
                    } else if used < ent {
                        ev == 0
                    } else {
                        !*exact
                    };
                    ok &= this;
                    parts.push(format!(
                        "{e}: used {:.1} MiB, entitled {:.1} MiB ({:+.1}%), {ev} evictions{}",
                        used / 256.0,
                        ent / 256.0,
                        dev * 100.0,
                        if this { "" } else { " FAIL" }
                    ));
                }
                Ok((
                    ok,
                    format!(
                        "{} (tolerance {:.0}%{}{})",
                        parts.join("; "),
                        tolerance * 100.0,
                        if *exact { ", exact" } else { "" },
                        if *effective { ", effective entitlement" } else { "" }
                    ),
                ))
            }
            CheckKind::MemRatio(m) => crate::memctl::eval_mem_ratio(runs, m),
            CheckKind::ExceedGap(m) => crate::memctl::eval_exceed_gap(sc, runs, m),
            CheckKind::ReclaimMode(m) => crate::memctl::eval_reclaim_mode(runs, m),
            CheckKind::Protected(m) => crate::memctl::eval_protected(sc, runs, m),
            CheckKind::Coherent => {
                has_coherent = true;
                Ok((verified > 0, format!("{verified} second-chance hits verified, none stale")))
            }
        })();
        out.push(match r {
            Ok((passed, detail)) => CheckResult { name: c.name.clone(), passed, detail },
            Err(e) => CheckResult {
                name: c.name.clone(),
                passed: false,
                detail: format!("could not evaluate: {e}"),
            },
        });
    }
    if !has_coherent {
        // Every run verifies every hit; a stale page aborts it, so reaching here means none was seen.
        out.push(CheckResult {
            name: "coherency: every second-chance hit verified".into(),
            passed: true,
            detail: if verified == 0 {
                // Passing on nothing would read as proof; say that there was nothing to verify.
                "0 hits verified: no second-chance hit happened, so there was nothing to check (and no stale page)"
                    .into()
            } else {
                format!("{verified} hits verified against the expected (object, index, version)")
            },
        });
    }
    out
}

#[derive(Serialize)]
struct ContainerSummary {
    name: String,
    vm: String,
    throughput_ops_s: f64,
    throughput_mib_s: f64,
    mean_latency_ms: f64,
    lookup_to_store_pct: f64,
    puts: u64,
    gets_hit: u64,
    gets_missed: u64,
    evictions: u64,
    cache_used_mean_mib: f64,
    cache_used_max_mib: f64,
    mem_hits: u64,
    ssd_hits: u64,
    disk_reads: u64,
    page_cache_hit_pct: f64,
    writebacks: u64,
    swap_outs: u64,
}

#[derive(Serialize)]
struct VariantSummary {
    name: String,
    verified_hits: u64,
    page_accesses: u64,
    containers: Vec<ContainerSummary>,
}

#[derive(Serialize)]
struct Summary<'a> {
    scenario: &'a str,
    description: &'a str,
    seed: u64,
    scale: f64,
    duration_s: f64,
    variants: Vec<VariantSummary>,
    checks: &'a [CheckResult],
    all_passed: bool,
}

fn r3(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}

/// The `summary.json` text.
pub fn summary_json(res: &ScenarioResult) -> String {
    let mut variants = Vec::new();
    for run in &res.runs {
        let mut cs = Vec::new();
        for (i, (name, vm, en)) in run.containers.iter().enumerate() {
            if !*en {
                continue;
            }
            let t = &run.totals[i];
            let run_s = t.run_s.max(1e-9);
            let used: Vec<u64> =
                run.samples.iter().filter(|s| s.ct == i).map(|s| s.mem_used + s.ssd_used).collect();
            let puts = t.cache.mem.puts + t.cache.ssd.puts;
            let hits = t.cache.mem.gets_hit + t.cache.ssd.gets_hit;
            let pc = t.pc_hits + t.pc_misses;
            cs.push(ContainerSummary {
                name: name.clone(),
                vm: vm.clone(),
                throughput_ops_s: r3(t.ops as f64 / run_s),
                throughput_mib_s: r3(t.bytes as f64 / 1048576.0 / run_s),
                mean_latency_ms: r3(if t.ops > 0 { t.lat_ns as f64 / t.ops as f64 / 1e6 } else { 0.0 }),
                lookup_to_store_pct: r3(if puts > 0 { hits as f64 / puts as f64 * 100.0 } else { 0.0 }),
                puts,
                gets_hit: hits,
                gets_missed: t.cache.gets_missed,
                evictions: t.cache.mem.evictions + t.cache.ssd.evictions,
                cache_used_mean_mib: r3(if used.is_empty() {
                    0.0
                } else {
                    used.iter().sum::<u64>() as f64 / used.len() as f64 / 256.0
                }),
                cache_used_max_mib: r3(used.iter().copied().max().unwrap_or(0) as f64 / 256.0),
                mem_hits: t.mem_hits,
                ssd_hits: t.ssd_hits,
                disk_reads: t.disk_reads,
                page_cache_hit_pct: r3(if pc > 0 { t.pc_hits as f64 / pc as f64 * 100.0 } else { 0.0 }),
                writebacks: t.writebacks,
                swap_outs: t.swap_outs,
            });
        }
        variants.push(VariantSummary {
            name: run.variant.clone(),
            verified_hits: run.verified_hits,
            page_accesses: run.accesses,
            containers: cs,
        });
    }
    let s = Summary {
        scenario: &res.scenario.name,
        description: &res.scenario.description,
        seed: res.scenario.seed,
        scale: res.scale,
        duration_s: res.scenario.duration_s,
        variants,
        checks: &res.checks,
        all_passed: res.all_passed(),
    };
    let mut t = serde_json::to_string_pretty(&s).unwrap_or_default();
    t.push('\n');
    t
}

/// The `timeseries.csv` text.
pub fn timeseries_csv(res: &ScenarioResult) -> Result<String, LabError> {
    let mut w = csv::Writer::from_writer(Vec::new());
    let e = |e: csv::Error| LabError::Plot(format!("csv: {e}"));
    w.write_record([
        "variant",
        "time_s",
        "container",
        "vm",
        "running",
        "memcg_mib",
        "mem_used_mib",
        "mem_entitlement_mib",
        "ssd_used_mib",
        "ssd_entitlement_mib",
        "puts",
        "puts_refused",
        "hits",
        "misses",
        "flushes",
        "evictions",
        "promotions",
        "demotions",
        "app_ops",
        "app_mib",
        "mean_latency_ms",
        "page_cache_hits",
        "page_cache_misses",
        "disk_reads",
        "mem_effective_entitlement_mib",
        "ssd_effective_entitlement_mib",
    ])
    .map_err(e)?;
    let mib = |p: u64| format!("{:.3}", p as f64 / 256.0);
    for run in &res.runs {
        for s in &run.samples {
            let (name, vm, _) = &run.containers[s.ct];
            let lat = if s.ops > 0 { s.lat_ns as f64 / s.ops as f64 / 1e6 } else { 0.0 };
            w.write_record([
                run.variant.clone(),
                format!("{:.3}", s.t_s),
                name.clone(),
                vm.clone(),
                (s.running as u8).to_string(),
                mib(s.memcg_pages),
                mib(s.mem_used),
                mib(s.mem_ent),
                mib(s.ssd_used),
                mib(s.ssd_ent),
                s.puts.to_string(),
                s.puts_refused.to_string(),
                s.hits.to_string(),
                s.misses.to_string(),
                s.flushes.to_string(),
                s.evictions.to_string(),
                s.promotions.to_string(),
                s.demotions.to_string(),
                s.ops.to_string(),
                format!("{:.3}", s.bytes as f64 / 1048576.0),
                format!("{lat:.4}"),
                s.pc_hits.to_string(),
                s.pc_misses.to_string(),
                s.disk_reads.to_string(),
                mib(s.mem_eff),
                mib(s.ssd_eff),
            ])
            .map_err(e)?;
        }
    }
    let bytes = w.into_inner().map_err(|x| LabError::Plot(format!("csv: {x}")))?;
    String::from_utf8(bytes).map_err(|x| LabError::Plot(format!("csv: {x}")))
}

/// Writes `summary.json` and `timeseries.csv` into `dir`.
pub fn write_data(res: &ScenarioResult, dir: &Path) -> Result<(), LabError> {
    std::fs::create_dir_all(dir).map_err(|e| LabError::io(dir, e))?;
    let p = dir.join("summary.json");
    std::fs::write(&p, summary_json(res)).map_err(|e| LabError::io(&p, e))?;
    let p = dir.join("timeseries.csv");
    std::fs::write(&p, timeseries_csv(res)?).map_err(|e| LabError::io(&p, e))?;
    Ok(())
}
