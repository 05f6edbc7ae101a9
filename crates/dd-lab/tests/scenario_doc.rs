//! `docs/scenario-format.md` against the parser (issue 13): every key and every value name the parser
//! accepts is named in the document, and every default in a table's `default` column is the parser's.
//!
//! Accepted keys are read from the parser itself: every table of the format rejects unknown fields, and
//! serde's error for one lists the fields (or the variants) it expected. Each probe below puts an
//! unknown key (or value) at one place of a valid scenario and collects that list. Defaults are read
//! from the tables the document marks with `<!-- defaults: PLACE -->`, and compared with the serialized
//! form of a scenario in which that place is left at its defaults.

use serde_json::Value;

const DOC: &str = include_str!("../../../docs/scenario-format.md");
const PROBE: &str = "zz_probe";

/// A valid scenario with one of every table; `(from, to)` replacements make the variations.
const BASE: &str = r#"name = "p"
duration_s = 10
[host]
mem_capacity_mib = 4
[timing]
[guest]
[[vms]]
name = "vm"
memory_mib = 16
[[vms.containers]]
name = "c"
workload = { kind = "webserver" }
"#;

fn with(repl: &[(&str, &str)]) -> String {
    let mut s = BASE.to_string();
    for (from, to) in repl {
        assert!(s.contains(from), "probe anchor `{from}` not in the base scenario");
        s = s.replacen(from, to, 1);
    }
    s
}

/// The names serde expected where the probe put an unknown key or value.
fn expected_names(text: &str) -> Vec<String> {
    let err = match toml::from_str::<dd_lab::Scenario>(text) {
        Ok(_) => panic!("the probe was accepted:\n{text}"),
        Err(e) => e.to_string(),
    };
    let Some(at) = err.find(&format!("`{PROBE}`, expected")) else {
        panic!(
            "no list of expected names in the error (does this table accept unknown keys?):\n{err}\n{text}"
        )
    };
    let list = &err[at + PROBE.len() + 2..];
    let list = list.lines().next().unwrap_or("");
    list.split('`').skip(1).step_by(2).map(str::to_string).collect()
}

fn probes() -> Vec<(&'static str, String)> {
    const CT: &str = "workload = { kind = \"webserver\" }";
    const VM: &str = "memory_mib = 16";
    let p = PROBE;
    let mut v: Vec<(&'static str, String)> = vec![
        ("top level", with(&[("duration_s = 10", &format!("duration_s = 10\n{p} = 1"))])),
        ("[host]", with(&[("mem_capacity_mib = 4", &format!("mem_capacity_mib = 4\n{p} = 1"))])),
        ("host.mode", with(&[("mem_capacity_mib = 4", &format!("mem_capacity_mib = 4\nmode = \"{p}\""))])),
        ("host.disk", with(&[("mem_capacity_mib = 4", &format!("mem_capacity_mib = 4\ndisk = {{ {p} = 1 }}"))])),
        ("disk.kind", with(&[("mem_capacity_mib = 4", &format!("mem_capacity_mib = 4\ndisk = {{ kind = \"{p}\" }}"))])),
        ("[timing]", with(&[("[timing]", &format!("[timing]\n{p} = 1"))])),
        ("[guest]", with(&[("[guest]", &format!("[guest]\n{p} = 1"))])),
        ("guest.lru", with(&[("[guest]", &format!("[guest]\nlru = \"{p}\""))])),
        ("[[vms]]", with(&[(VM, &format!("{VM}\n{p} = 1"))])),
        ("vms.memctl", with(&[(VM, &format!("{VM}\nmemctl = {{ {p} = 1 }}"))])),
        ("memctl.policy", with(&[(VM, &format!("{VM}\nmemctl = {{ policy = \"{p}\" }}"))])),
        ("memctl.containers", with(&[(VM, &format!("{VM}\nmemctl = {{ containers = {{ c = {{ {p} = 1 }} }} }}"))])),
        ("memctl class", with(&[(VM, &format!("{VM}\nmemctl = {{ containers = {{ c = {{ class = \"{p}\" }} }} }}"))])),
        ("[[vms.containers]]", with(&[(CT, &format!("{CT}\n{p} = 1"))])),
        ("spec type", with(&[(CT, &format!("{CT}\ncache = {{ type = \"{p}\" }}"))])),
        ("workload kind", with(&[(CT, &format!("workload = {{ kind = \"{p}\" }}"))])),
        ("selection", with(&[(CT, &format!("workload = {{ kind = \"webserver\", selection = \"{p}\" }}"))])),
        ("ycsb store", with(&[(CT, &format!("workload = {{ kind = \"ycsb\", workload = \"a\", store = \"{p}\" }}"))])),
        ("ycsb workload", with(&[(CT, &format!("workload = {{ kind = \"ycsb\", store = \"redis\", workload = \"{p}\" }}"))])),
        ("timeline action", format!("{BASE}[[timeline]]\nat_s = 1\naction = \"{p}\"\n")),
        ("[[variants]]", format!("{BASE}[[variants]]\nname = \"v\"\n{p} = 1\n")),
        ("variants.containers", format!("{BASE}[[variants]]\nname = \"v\"\ncontainers = {{ c = {{ {p} = 1 }} }}\n")),
        ("variants.memctl", format!("{BASE}[[variants]]\nname = \"v\"\nmemctl = {{ vm = {{ {p} = 1 }} }}\n")),
        ("vms.provision", with(&[(VM, &format!("{VM}\nprovision = {{ {p} = 1 }}"))])),
        ("provision.decision", with(&[(VM, &format!("{VM}\nprovision = {{ decision = {{ {p} = 1 }} }}"))])),
        ("decision objective", with(&[(VM, &format!("{VM}\nprovision = {{ decision = {{ objective = \"{p}\" }} }}"))])),
        ("target kind", with(&[(CT, &format!("{CT}\ntarget = {{ kind = \"{p}\" }}"))])),
        ("variants.search", format!("{BASE}[[variants]]\nname = \"v\"\nsearch = {{ {p} = 1 }}\n")),
        ("search pick", format!("{BASE}[[variants]]\nname = \"v\"\nsearch = {{ pick = \"{p}\" }}\n")),
        ("targets expect", format!("{BASE}[[checks]]\nname = \"k\"\nkind = \"targets\"\nexpect = \"{p}\"\n")),
        ("check kind", format!("{BASE}[[checks]]\nname = \"k\"\nkind = \"{p}\"\n")),
        ("measure", format!("{BASE}[[checks]]\nname = \"k\"\nkind = \"value\"\nmin = 0\nlhs = {{ entity = \"c\", metric = \"throughput\", {p} = 1 }}\n")),
        ("metric", format!("{BASE}[[checks]]\nname = \"k\"\nkind = \"value\"\nmin = 0\nlhs = {{ entity = \"c\", metric = \"{p}\" }}\n")),
        ("mem_ratio stat", format!("{BASE}[[checks]]\nname = \"k\"\nkind = \"mem_ratio\"\nlhs = \"c\"\nrhs = \"c\"\ntarget = 1\nfrom_s = 0\nstat = \"{p}\"\n")),
    ];
    // `none` and the `coherent` check are unit variants: they have no fields to list (serde does not
    // reject unknown keys beside the tag of a unit variant).
    for spec in ["mem", "ssd", "hybrid"] {
        v.push(("spec fields", with(&[(CT, &format!("{CT}\ncache = {{ type = \"{spec}\", {p} = 1 }}"))])));
    }
    for (kind, fields) in
        [("throughput", "ops_s = 1"), ("mean_latency", "ms = 1"), ("hit_ratio", "ratio = 0.5")]
    {
        v.push((
            "target fields",
            with(&[(CT, &format!("{CT}\ntarget = {{ kind = \"{kind}\", {fields}, {p} = 1 }}"))]),
        ));
    }
    for kind in ["webserver", "webproxy", "varmail", "videoserver", "kv", "ycsb", "trace"] {
        v.push(("workload fields", with(&[(CT, &format!("workload = {{ kind = \"{kind}\", {p} = 1 }}"))])));
    }
    for action in
        ["start", "stop", "set_cache", "set_vm_weights", "set_capacity", "set_mode", "balloon", "working_set"]
    {
        v.push((
            "timeline fields",
            format!("{BASE}[[timeline]]\nat_s = 1\naction = \"{action}\"\n{p} = 1\n"),
        ));
    }
    for kind in [
        "ratio",
        "value",
        "spread",
        "entitlement",
        "mem_ratio",
        "exceed_gap",
        "reclaim_mode",
        "protected",
        "targets",
        "violation",
    ] {
        v.push(("check fields", format!("{BASE}[[checks]]\nname = \"k\"\nkind = \"{kind}\"\n{p} = 1\n")));
    }
    v
}

#[test]
fn every_key_and_value_the_parser_accepts_is_documented() {
    assert!(toml::from_str::<dd_lab::Scenario>(BASE).is_ok(), "the base scenario parses");
    let mut missing = Vec::new();
    let mut seen = 0;
    for (place, text) in probes() {
        for name in expected_names(&text) {
            seen += 1;
            if !DOC.contains(&format!("`{name}`")) {
                missing.push(format!("{place}: `{name}`"));
            }
        }
    }
    assert!(seen > 150, "only {seen} names probed");
    assert!(
        missing.is_empty(),
        "accepted by the parser but not in docs/scenario-format.md:\n{}",
        missing.join("\n")
    );
}

/// A documented default as a JSON value: a number, `true`/`false`, `none`/`never` (null), or a
/// backticked TOML value or bare word. `None` for prose ("required", "the VM's memory", ...).
fn documented_default(cell: &str) -> Option<Value> {
    let cell = cell.trim();
    match cell {
        "none" | "never" => return Some(Value::Null),
        "true" | "false" => return Some(Value::Bool(cell == "true")),
        _ => {}
    }
    if let Ok(n) = cell.parse::<f64>() {
        return Some(serde_json::json!(n));
    }
    let inner = cell.strip_prefix('`')?.strip_suffix('`')?;
    if inner.contains('`') {
        return None;
    }
    match toml::from_str::<toml::Table>(&format!("v = {inner}")) {
        Ok(t) => serde_json::to_value(&t["v"]).ok(),
        Err(_) => Some(Value::String(inner.to_string())),
    }
}

/// Whether a documented default matches the parsed value: numbers by value, tables key by key (keys
/// the document leaves out must be null in the parsed value).
fn matches(doc: &Value, got: &Value) -> bool {
    match (doc, got) {
        (Value::Number(a), Value::Number(b)) => a.as_f64() == b.as_f64(),
        (Value::Object(a), Value::Object(b)) => {
            a.iter().all(|(k, v)| b.get(k).is_some_and(|g| matches(v, g)))
                && b.iter().all(|(k, v)| a.contains_key(k) || v.is_null())
        }
        (Value::Null, got) => got.is_null(),
        _ => doc == got,
    }
}

/// The parsed JSON at a documented place, from a scenario with that place at its defaults.
fn parsed_place(place: &str) -> Value {
    const CT: &str = "workload = { kind = \"webserver\" }";
    let text = match place {
        "memctl" => with(&[("memory_mib = 16", "memory_mib = 16\nmemctl = {}")]),
        "provision" | "provision_decision" | "provision_feedback" => {
            with(&[("memory_mib = 16", "memory_mib = 16\nprovision = {}")])
        }
        "memctl_container" => {
            with(&[("memory_mib = 16", "memory_mib = 16\nmemctl = { containers = { c = {} } }")])
        }
        "kv" => with(&[(CT, "workload = { kind = \"kv\", dataset_mib = 1 }")]),
        "ycsb" => with(&[(CT, "workload = { kind = \"ycsb\", store = \"redis\", workload = \"a\" }")]),
        "trace" => with(&[(CT, "workload = { kind = \"trace\", path = \"t.csv\" }")]),
        w @ ("webproxy" | "varmail" | "videoserver") => {
            with(&[(CT, &format!("workload = {{ kind = \"{w}\" }}"))])
        }
        _ => BASE.to_string(),
    };
    let sc: dd_lab::Scenario = toml::from_str(&text).unwrap_or_else(|e| panic!("{place}: {e}"));
    let v = serde_json::to_value(&sc).unwrap();
    let ct = &v["vms"][0]["containers"][0];
    match place {
        "top" => v.clone(),
        "host" => v["host"].clone(),
        "disk" => v["host"]["disk"].clone(),
        "timing" => v["timing"].clone(),
        "guest" => v["guest"].clone(),
        "vm" => v["vms"][0].clone(),
        "memctl" => v["vms"][0]["memctl"].clone(),
        "memctl_container" => v["vms"][0]["memctl"]["containers"]["c"].clone(),
        "provision" => v["vms"][0]["provision"].clone(),
        "provision_decision" => v["vms"][0]["provision"]["decision"].clone(),
        "provision_feedback" => v["vms"][0]["provision"]["decision"]["feedback"].clone(),
        "container" => ct.clone(),
        "webserver" | "webproxy" | "varmail" | "videoserver" | "kv" | "ycsb" | "trace" => {
            ct["workload"].clone()
        }
        other => panic!("the document marks an unknown place `{other}`"),
    }
}

#[test]
fn every_documented_default_is_the_parsers_default() {
    let mut checked = 0;
    let mut wrong = Vec::new();
    let mut lines = DOC.lines().peekable();
    while let Some(line) = lines.next() {
        let Some(place) = line.strip_prefix("<!-- defaults: ").and_then(|l| l.strip_suffix(" -->")) else {
            continue;
        };
        let parsed = parsed_place(place);
        // The table right after the marker: header, separator, rows.
        let rows: Vec<&str> = std::iter::from_fn(|| lines.next_if(|l| l.starts_with('|'))).skip(2).collect();
        assert!(!rows.is_empty(), "no table after the `{place}` marker");
        for row in rows {
            let cells: Vec<&str> = row.trim_matches('|').split(" | ").collect();
            let (Some(field), Some(default)) = (cells.first(), cells.get(1)) else { continue };
            let field = field.trim();
            let Some(key) = field.strip_prefix('`').and_then(|f| f.strip_suffix('`')) else { continue };
            if key.contains('`') {
                continue; // a row naming several tables
            }
            let Some(doc) = documented_default(default) else { continue };
            checked += 1;
            let got = parsed.get(key).cloned().unwrap_or(Value::Null);
            if !matches(&doc, &got) {
                wrong.push(format!("{place}.{key}: documented {doc}, parser {got}"));
            }
        }
    }
    assert!(checked >= 50, "only {checked} defaults checked");
    assert!(wrong.is_empty(), "documented defaults that are not the parser's:\n{}", wrong.join("\n"));
}
