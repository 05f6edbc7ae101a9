//! `summary.json` and `timeseries.csv` of a scenario's result (the PNGs and `report.html` are
//! [`crate::results::plot`]).
//!
//! Both are functions of the emulated results only (see [`crate::results`]), so the same scenario and
//! seed give byte-identical files.

use super::{CheckResult, ScenarioResult};
use crate::error::LabError;
use serde::Serialize;
use std::path::Path;

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
struct VariantSummary<'a> {
    name: String,
    verified_hits: u64,
    page_accesses: u64,
    containers: Vec<ContainerSummary>,
    /// The VM-level provisioners' decisions (only in variants that run one).
    #[serde(skip_serializing_if = "<[_]>::is_empty")]
    decisions: &'a [crate::sim::Decision],
}

#[derive(Serialize)]
struct Summary<'a> {
    scenario: &'a str,
    description: &'a str,
    seed: u64,
    scale: f64,
    duration_s: f64,
    variants: Vec<VariantSummary<'a>>,
    #[serde(skip_serializing_if = "<[_]>::is_empty")]
    searches: &'a [super::search::SearchResult],
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
            decisions: &run.decisions,
        });
    }
    let s = Summary {
        scenario: &res.scenario.name,
        description: &res.scenario.description,
        seed: res.scenario.seed,
        scale: res.scale,
        duration_s: res.scenario.duration_s,
        variants,
        searches: &res.searches,
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
    // A scenario with a provisioner or targets gets the settings in force as extra columns.
    let provisioning = res.scenario.vms.iter().any(|v| v.provision.is_some())
        || res.scenario.containers().any(|(_, _, c)| c.target.is_some());
    let mut header = vec![
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
    ];
    if provisioning {
        header.extend(["memory_limit_mib", "cache_mem_weight", "cache_ssd_weight"]);
    }
    w.write_record(&header).map_err(e)?;
    let mib = |p: u64| format!("{:.3}", p as f64 / 256.0);
    for run in &res.runs {
        for s in &run.samples {
            let (name, vm, _) = &run.containers[s.ct];
            let lat = if s.ops > 0 { s.lat_ns as f64 / s.ops as f64 / 1e6 } else { 0.0 };
            let mut extra = Vec::new();
            if provisioning {
                // The settings in force: what the provisioner (or the scenario) decided.
                extra.extend([mib(s.limit_pages), s.mem_weight.to_string(), s.ssd_weight.to_string()]);
            }
            let mut row = vec![
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
            ];
            row.extend(extra);
            w.write_record(&row).map_err(e)?;
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
