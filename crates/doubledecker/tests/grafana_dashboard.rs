//! `deploy/grafana/doubledecker.json` queries only what the daemon exports: every metric name in every
//! panel query and template variable is one a real daemon's `/metrics` serves (scraped here, with a VM,
//! a pool and a guest provisioner's report so that the per-VM, per-pool and provisioner families have
//! samples).

mod common;

use common::{vm, Daemon};
use std::collections::BTreeSet;
use std::path::Path;

/// Every query string of the dashboard: panel targets' `expr` and query variables' `query`.
fn queries(v: &serde_json::Value, out: &mut Vec<String>) {
    match v {
        serde_json::Value::Object(m) => {
            for (k, x) in m {
                match (k.as_str(), x) {
                    ("expr" | "definition", serde_json::Value::String(s)) => out.push(s.clone()),
                    ("query", serde_json::Value::String(s)) if s.contains('(') => out.push(s.clone()),
                    _ => queries(x, out),
                }
            }
        }
        serde_json::Value::Array(a) => a.iter().for_each(|x| queries(x, out)),
        _ => {}
    }
}

/// The identifiers of a PromQL expression that look like the daemon's metric names.
fn metric_names(expr: &str) -> Vec<String> {
    expr.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == ':'))
        .filter(|w| w.starts_with("dd_"))
        .map(str::to_string)
        .collect()
}

#[test]
fn every_grafana_query_names_a_metric_the_daemon_exports() {
    let v = vm(4);
    let d = Daemon::start(&[&v], "");
    let (status, _) = d.http(
        "POST",
        "/v1/vm/pools",
        Some(&v.admin_token),
        Some(r#"{"spec":{"type":"hybrid","mem_weight":1,"ssd_weight":1}}"#),
    );
    assert_eq!(status, 201, "creating a pool");
    let container = serde_json::json!({
        "name": "web", "pool": 1, "budget_bytes": 1048576, "mem_cache_bytes": 4194304,
        "ssd_cache_bytes": 0, "spec": {"type": "mem", "weight": 16}, "memory_limit_bytes": 67108864,
        "measured_hit_ratio": 0.75, "measured_latency_ms": 0.01, "reads_per_s": 1000.0,
        "predicted_hit_ratio": 0.95, "predicted_latency_ms": 0.005, "predicted_reads_per_s": 1000.0,
        "target": {"kind": "hit_ratio", "ratio": 0.9}, "target_met": true, "measured_target_met": false,
        "footprint_bytes": 8388608, "state": "met", "missed_intervals": 0
    });
    let report = serde_json::json!({
        "round": 3, "applied": true, "feasible": true, "infeasible": [], "missed": [], "source": "model",
        "kept_current": false, "memory_bytes": 16777216, "mem_cache_bytes": 16777216, "ssd_cache_bytes": 0,
        "containers": [container]
    });
    let (status, _) = d.http("PUT", "/v1/vm/provisioner", Some(&v.admin_token), Some(&report.to_string()));
    assert_eq!(status, 200, "a provisioner report");
    let text = d.metrics();
    let exported: BTreeSet<String> = text
        .lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .map(|l| l.split(['{', ' ']).next().unwrap().to_string())
        .collect();
    assert!(exported.contains("dd_pool_used_pages"), "no per-pool samples in /metrics:\n{text}");

    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy/grafana/doubledecker.json");
    let dash: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let mut qs = Vec::new();
    queries(&dash, &mut qs);
    assert!(qs.len() >= 10, "only {} queries found in the dashboard", qs.len());
    for q in &qs {
        let names = metric_names(q);
        assert!(!names.is_empty(), "query names no DoubleDecker metric: {q}");
        for n in names {
            assert!(
                exported.contains(&n),
                "query uses {n}, which the daemon does not export: {q}\nexported: {exported:?}"
            );
        }
    }
}
