//! Acceptance 4: the admin API conforms to `docs/admin-api.yaml`. Every documented operation is called
//! (with successful and failing requests) against the real daemon; each response's status must be
//! documented for that operation, its content type must match, and its JSON body must validate against
//! the documented schema (response schemas forbid undocumented fields). Every request body the test
//! sends that the server accepts must validate against the documented request schema too. The test
//! fails on any drift, and if any documented operation was never exercised.

mod common;

use common::{vm, Daemon, HOST_TOKEN};
use serde_json::{json, Value};
use std::collections::BTreeSet;

struct Checker {
    doc: Value,
    d: Daemon,
    covered: BTreeSet<(String, String)>,
}

fn resolve<'a>(doc: &'a Value, v: &'a Value) -> &'a Value {
    match v.get("$ref").and_then(Value::as_str) {
        Some(r) => {
            let p = r.strip_prefix('#').expect("local ref");
            resolve(doc, doc.pointer(p).unwrap_or_else(|| panic!("dangling ref {r}")))
        }
        None => v,
    }
}

impl Checker {
    fn validate(&self, schema: &Value, instance: &Value, what: &str) {
        let mut root = json!({ "components": self.doc["components"].clone() });
        root["allOf"] = json!([schema]);
        let v = jsonschema::validator_for(&root).unwrap_or_else(|e| panic!("{what}: bad schema: {e}"));
        let errors: Vec<String> =
            v.iter_errors(instance).map(|e| format!("{e} at {}", e.instance_path)).collect();
        assert!(errors.is_empty(), "{what}: {instance} does not match the document: {errors:?}");
    }

    /// The documented template of a concrete path.
    fn template(&self, path: &str) -> String {
        let path = path.split('?').next().unwrap_or(path);
        let segs: Vec<&str> = path.split('/').collect();
        for t in self.doc["paths"].as_object().unwrap().keys() {
            let ts: Vec<&str> = t.split('/').collect();
            if ts.len() == segs.len() && ts.iter().zip(&segs).all(|(a, b)| a == b || a.starts_with('{')) {
                return t.clone();
            }
        }
        panic!("{path} is not documented");
    }

    fn call(&mut self, method: &str, path: &str, token: Option<&str>, body: Option<Value>) -> (u16, Value) {
        let tpl = self.template(path);
        let op = self.doc["paths"][&tpl][method.to_lowercase()].clone();
        assert!(op.is_object(), "{method} {tpl} is not documented");
        let url = format!("{}{}", self.d.admin, path);
        let mut req = ureq::request(method, &url);
        if let Some(t) = token {
            req = req.set("Authorization", &format!("Bearer {t}"));
        }
        let r = match &body {
            Some(b) => req.send_json(b.clone()),
            None => req.call(),
        };
        let resp = match r {
            Ok(r) => r,
            Err(ureq::Error::Status(_, r)) => r,
            Err(e) => panic!("{method} {path}: {e}"),
        };
        let status = resp.status();
        let ctype = resp.content_type().to_string();
        let text = resp.into_string().unwrap();
        let what = format!("{method} {path} -> {status}");
        let documented = op["responses"]
            .get(status.to_string())
            .unwrap_or_else(|| panic!("{what}: status not documented"));
        let documented = resolve(&self.doc, documented);
        let body_json = match documented.get("content").and_then(Value::as_object) {
            None => {
                assert!(text.is_empty(), "{what}: undocumented body {text}");
                Value::Null
            }
            Some(content) => {
                let (mt, m) = content.iter().next().unwrap();
                assert!(ctype.starts_with(mt.as_str()), "{what}: content type {ctype}, documented {mt}");
                if mt == "application/json" {
                    let v: Value =
                        serde_json::from_str(&text).unwrap_or_else(|e| panic!("{what}: not JSON: {e}"));
                    self.validate(&m["schema"], &v, &what);
                    v
                } else {
                    Value::String(text)
                }
            }
        };
        if let (Some(b), true) = (&body, status < 300) {
            let rb = &op["requestBody"]["content"]["application/json"]["schema"];
            self.validate(rb, b, &format!("{what} request body"));
        }
        self.covered.insert((method.to_lowercase(), tpl));
        (status, body_json)
    }
}

#[test]
fn admin_api_matches_its_openapi_document() {
    let text =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/admin-api.yaml")).unwrap();
    let doc: Value = serde_yaml::from_str(&text).unwrap();
    let v1 = vm(1);
    // Co-operative de-duplication on (no peers) so its routes answer 200.
    // (Its key file is created in the data folder at start.)
    let coop = "[coop]\nenabled = true\nlisten = \"127.0.0.1:0\"\ndedup_group = \"peers\"\n";
    let d = Daemon::start_with(&[&v1], "", "capacity_bytes = 16777216\ndedup = true\n", coop);
    let mut c = Checker { doc, d, covered: BTreeSet::new() };
    let h = Some(HOST_TOKEN);
    let t1 = Some(v1.admin_token.as_str());

    assert_eq!(c.call("GET", "/healthz", None, None).0, 200);
    assert_eq!(c.call("GET", "/v1/host", h, None).0, 200);
    assert_eq!(c.call("GET", "/v1/host", None, None).0, 401);
    let (s, info) =
        c.call("PATCH", "/v1/host", h, Some(json!({"mem_capacity_bytes": 33554432, "mode": "partitioned"})));
    assert_eq!((s, info["stores"][0]["capacity_bytes"].as_u64()), (200, Some(33554432)));
    assert_eq!(c.call("PATCH", "/v1/host", h, Some(json!({"eviction_batch_bytes": 1}))).0, 400);
    assert_eq!(c.call("PATCH", "/v1/host", t1, Some(json!({}))).0, 401);

    let (s, cred) = c.call(
        "POST",
        "/v1/vms",
        h,
        Some(json!({"id": 2, "weights": {"mem": 50, "ssd": 10}, "max_pools": 8, "dedup_group": "g"})),
    );
    assert_eq!(s, 201);
    let t2 = cred["admin_token"].as_str().unwrap().to_string();
    assert_eq!(c.call("POST", "/v1/vms", h, Some(json!({"id": 2}))).0, 409);
    assert_eq!(c.call("POST", "/v1/vms", h, Some(json!({"id": 3, "data_token": "short"}))).0, 400);
    assert_eq!(c.call("GET", "/v1/vms", h, None).1.as_array().unwrap().len(), 2);
    assert_eq!(c.call("GET", "/v1/vms/2", h, None).1["weights"]["mem"], 50);
    assert_eq!(c.call("GET", "/v1/vms/2", h, None).1["dedup_group"], "g");
    assert_eq!(c.call("GET", "/v1/vms/9", h, None).0, 404);
    assert_eq!(c.call("GET", "/v1/vms/x", h, None).0, 400);
    assert_eq!(
        c.call("PUT", "/v1/vms/2/weights", h, Some(json!({"mem": 70, "ssd": 70}))).1["weights"]["mem"],
        70
    );
    assert_eq!(c.call("PUT", "/v1/vms/9/weights", h, Some(json!({"mem": 1, "ssd": 1}))).0, 404);
    assert_eq!(c.call("PUT", "/v1/vms/2/quota", h, Some(json!({"max_pools": 3}))).1["max_pools"], 3);
    assert_eq!(c.call("PUT", "/v1/vms/2/quota", h, Some(json!({"max_pools": 0}))).0, 400);
    assert_eq!(c.call("PUT", "/v1/vms/9/quota", h, Some(json!({"max_pools": 3}))).0, 404);
    // Token replacement: the old admin token is dead at once, the new one (returned only here) works.
    let (s, cred) =
        c.call("POST", "/v1/vms/2/tokens", h, Some(json!({"data_token": "data-token-vm2-rotated"})));
    assert_eq!((s, cred["data_token"].as_str()), (200, Some("data-token-vm2-rotated")));
    assert_eq!(c.call("GET", "/v1/vm/stats", Some(&t2), None).0, 401, "the replaced admin token is dead");
    let t2 = cred["admin_token"].as_str().unwrap().to_string();
    assert_eq!(c.call("POST", "/v1/vms/9/tokens", h, Some(json!({}))).0, 404);
    assert_eq!(
        c.call("POST", "/v1/vms/2/tokens", h, Some(json!({"admin_token": "has a space 0123"}))).0,
        400
    );

    let (s, p) = c.call("POST", "/v1/vm/pools", t1, Some(json!({"spec": {"type": "mem", "weight": 100}})));
    assert_eq!(s, 201);
    let pool = p["pool"].as_u64().unwrap();
    let body = json!({"kind": "persistent", "spec": {"type": "hybrid", "mem_weight": 1, "ssd_weight": 2}, "order": "s3-fifo"});
    assert_eq!(c.call("POST", "/v1/vm/pools", t1, Some(body)).0, 201);
    assert_eq!(c.call("POST", "/v1/vm/pools", h, Some(json!({"spec": {"type": "none"}}))).0, 401);
    assert_eq!(c.call("GET", "/v1/vm/pools", t1, None).1.as_array().unwrap().len(), 2);
    assert_eq!(c.call("GET", &format!("/v1/vm/pools/{pool}"), t1, None).0, 200);
    assert_eq!(c.call("GET", &format!("/v1/vm/pools/{pool}"), Some(&t2), None).0, 404);
    let (s, p) =
        c.call("PUT", &format!("/v1/vm/pools/{pool}/spec"), t1, Some(json!({"type": "ssd", "weight": 5})));
    assert_eq!((s, p["spec"]["type"].as_str()), (200, Some("ssd")));
    assert_eq!(c.call("PUT", "/v1/vm/pools/999/spec", t1, Some(json!({"type": "none"}))).0, 404);
    let (s, p) = c.call("PUT", &format!("/v1/vm/pools/{pool}/label"), t1, Some(json!({"label": "web"})));
    assert_eq!((s, p["label"].as_str()), (200, Some("web")));
    let (s, e) = c.call("PUT", &format!("/v1/vm/pools/{pool}/label"), t1, Some(json!({"label": "a\nb"})));
    assert_eq!((s, e["code"].as_str()), (400, Some("invalid_config")), "a name with a newline: {e}");
    assert_eq!(c.call("PUT", &format!("/v1/vm/pools/{pool}/label"), Some(&t2), Some(json!({}))).0, 404);
    assert_eq!(c.call("PUT", &format!("/v1/vm/pools/{pool}/label"), h, Some(json!({}))).0, 401);
    // History: the host's has every VM, a VM's its own; wait for the first sample (every 2 s).
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let hist = loop {
        let (s, hist) = c.call("GET", "/v1/history", h, None);
        assert_eq!(s, 200);
        if hist["vms"].as_array().unwrap().len() == 2
            && !hist["vms"][0]["pools"].as_array().unwrap().is_empty()
        {
            break hist;
        }
        assert!(std::time::Instant::now() < deadline, "no history sample within 10 s: {hist}");
        std::thread::sleep(std::time::Duration::from_millis(200));
    };
    assert_eq!(hist["vms"][0]["pools"][0]["label"], "web");
    let (s, own) = c.call("GET", "/v1/vm/history", t1, None);
    assert_eq!((s, own["vms"].as_array().unwrap().len(), own["vms"][0]["vm"].as_u64()), (200, 1, Some(1)));
    let newest = own["vms"][0]["series"]["t_unix_ms"].as_array().unwrap().last().unwrap().as_u64().unwrap();
    let (_, none) = c.call("GET", &format!("/v1/vm/history?since_unix_ms={newest}"), t1, None);
    assert!(none["vms"][0]["series"]["t_unix_ms"].as_array().unwrap().len() <= 1, "since: {none}");
    assert_eq!(c.call("GET", "/v1/vm/history?since_unix_ms=x", t1, None).0, 400);
    assert_eq!(c.call("GET", "/v1/history", t1, None).0, 401);
    assert_eq!(c.call("GET", "/v1/vm/history", h, None).0, 401);
    assert_eq!(c.call("GET", "/v1/vm/stats", t1, None).1["pools"].as_array().unwrap().len(), 2);
    assert_eq!(c.call("GET", "/v1/vm/stats", None, None).0, 401);
    let (s, stats) = c.call("GET", "/v1/stats", h, None);
    assert_eq!((s, stats["vms"].as_array().unwrap().len()), (200, 2));
    let (s, r) = c.call("GET", "/v1/host/coop", h, None);
    assert_eq!((s, r["peers"].as_array().unwrap().len()), (200, 0));
    assert_eq!(c.call("GET", "/v1/host/coop", t1, None).0, 401);
    assert_eq!(c.call("POST", "/v1/host/coop/publish", h, None).1["peers_reached"], 0);
    let (s, m) = c.call("GET", "/metrics", h, None);
    assert_eq!(s, 200);
    assert!(m.as_str().unwrap().contains("dd_pool_used_pages"));
    assert_eq!(c.call("GET", "/metrics", t1, None).0, 401);
    // A guest provisioner's reports: kept per VM, shown to that VM and to the host; refused with a
    // stable code when out of bounds.
    assert_eq!(c.call("GET", "/v1/vm/provisioner", t1, None).1["code"], "no_report");
    let container = json!({
        "name": "web", "pool": pool, "budget_bytes": 1048576, "mem_cache_bytes": 4194304,
        "ssd_cache_bytes": 0, "spec": {"type": "mem", "weight": 16}, "memory_limit_bytes": null,
        "measured_hit_ratio": 0.75, "measured_latency_ms": 0.01, "reads_per_s": 1000.0,
        "predicted_hit_ratio": 0.95, "predicted_latency_ms": 0.005, "predicted_reads_per_s": 1000.0,
        "target": {"kind": "hit_ratio", "ratio": 0.9}, "target_met": true, "measured_target_met": false,
        "footprint_bytes": 8388608, "state": "met", "missed_intervals": 0, "correction": 0.25
    });
    let report = json!({
        "round": 3, "applied": true, "feasible": true, "infeasible": [], "missed": [], "source": "model",
        "kept_current": false,
        "memory_bytes": 16777216, "mem_cache_bytes": 16777216, "ssd_cache_bytes": 0,
        "containers": [container]
    });
    let (s, kept) = c.call("PUT", "/v1/vm/provisioner", t1, Some(report.clone()));
    assert_eq!((s, kept["vm"].as_u64(), kept["report"]["round"].as_u64()), (200, Some(1), Some(3)));
    assert_eq!(c.call("GET", "/v1/vm/provisioner", t1, None).1["report"], report);
    let mut bad = report.clone();
    bad["containers"][0]["measured_hit_ratio"] = json!(1.5);
    let (s, e) = c.call("PUT", "/v1/vm/provisioner", t1, Some(bad));
    assert_eq!((s, e["code"].as_str()), (400, Some("invalid_report")));
    assert!(e["message"].as_str().unwrap().contains("containers[0].measured_hit_ratio"), "{e}");
    assert_eq!(
        c.call("PUT", "/v1/vm/provisioner", t1, Some(json!({"round": 1}))).1["code"],
        "malformed_json"
    );
    assert_eq!(c.call("PUT", "/v1/vm/provisioner", h, Some(report.clone())).0, 401);
    assert_eq!(c.call("GET", "/v1/vm/provisioner", None, None).0, 401);
    assert_eq!(c.call("PUT", "/v1/vm/provisioner", Some(&t2), Some(report.clone())).0, 200);
    let (s, all) = c.call("GET", "/v1/provisioner", h, None);
    assert_eq!((s, all.as_array().unwrap().len()), (200, 2), "the host sees every VM's report");
    assert_eq!(c.call("GET", "/v1/provisioner", t1, None).0, 401);
    assert_eq!(c.call("DELETE", &format!("/v1/vm/pools/{pool}"), t1, None).0, 204);
    assert_eq!(c.call("DELETE", &format!("/v1/vm/pools/{pool}"), t1, None).0, 404);
    assert_eq!(c.call("DELETE", "/v1/vms/2", h, None).0, 204);
    assert_eq!(c.call("DELETE", "/v1/vms/2", h, None).0, 404);
    assert_eq!(c.call("GET", "/v1/vm/stats", Some(&t2), None).0, 401, "a removed VM's token is dead");
    let (s, all) = c.call("GET", "/v1/provisioner", h, None);
    assert_eq!(
        (s, all[0]["vm"].as_u64(), all.as_array().unwrap().len()),
        (200, Some(1), 1),
        "a removed VM's report goes with it"
    );

    // Every documented operation was exercised.
    let mut documented = BTreeSet::new();
    for (p, item) in c.doc["paths"].as_object().unwrap() {
        for m in item.as_object().unwrap().keys().filter(|k| *k != "parameters") {
            documented.insert((m.clone(), p.clone()));
        }
    }
    let missing: Vec<_> = documented.difference(&c.covered).collect();
    assert!(missing.is_empty(), "documented but not tested: {missing:?}");
}

/// The checker itself rejects a body that drifts from the document (so the test above can fail).
#[test]
fn the_checker_catches_drift() {
    let text =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/admin-api.yaml")).unwrap();
    let doc: Value = serde_yaml::from_str(&text).unwrap();
    let schema = json!({"$ref": "#/components/schemas/VmInfo"});
    let mut root = json!({ "components": doc["components"].clone() });
    root["allOf"] = json!([schema]);
    let v = jsonschema::validator_for(&root).unwrap();
    let w = json!({"mem": 1, "ssd": 2});
    assert!(v.is_valid(&json!({"id": 1, "weights": w, "pools": 0, "max_pools": 4})));
    assert!(v.is_valid(&json!({"id": 1, "weights": w, "pools": 0, "max_pools": 4, "dedup_group": null})));
    assert!(!v.is_valid(&json!({"id": 1, "weights": w, "pools": 0, "max_pools": 4, "extra": 1})));
    assert!(!v.is_valid(&json!({"id": 1, "weights": w, "max_pools": 4})));
    assert!(!v.is_valid(&json!({"id": -1, "weights": w, "pools": 0, "max_pools": 4})));
}
