//! Evaluation of a scenario's named checks on its runs: measures (a metric of a container, VM or pool
//! over a variant's time window), thresholds, ratios, entitlement shares, the implicit coherency check,
//! and the check kinds of [`memctl`] (the VM memory controller) and [`provision`] (targets, searches).

pub mod memctl;
pub mod provision;

use super::CheckResult;
use crate::scenario::{CheckKind, Measure, Metric, Scenario};
use crate::sim::{RunResult, Sample};
use serde::Serialize;

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
            CheckKind::MemRatio(m) => memctl::eval_mem_ratio(runs, m),
            CheckKind::ExceedGap(m) => memctl::eval_exceed_gap(sc, runs, m),
            CheckKind::ReclaimMode(m) => memctl::eval_reclaim_mode(runs, m),
            CheckKind::Protected(m) => memctl::eval_protected(sc, runs, m),
            CheckKind::Targets(m) => provision::eval_targets(sc, runs, m),
            CheckKind::Violation(m) => provision::eval_violation(sc, runs, m),
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
