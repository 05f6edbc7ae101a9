//! Sweeps (issue 33): a sweep file names a base scenario and the points to run it at (a grid of
//! parameter paths and values, a list of points, or the candidates of one of the scenario's `search`
//! variants); each point is an independent, deterministic run of the lab that writes its own folder.
//! `doubledecker lab sweep` runs them on this machine's cores or one at a time (`--point N`, a Slurm
//! array task), the Python package on Ray tasks; [`gather`] makes one table of them all.
//!
//! Invariants:
//! * The points, their order and their scenarios are a function of the sweep file (and the base
//!   scenario it names) only: point `N` is the same run on every machine and executor, so any subset of
//!   points run anywhere gathers into the same table as one local run.
//! * A point is done exactly when `points/NNNN/result.json` exists. It is written last, and every file
//!   of a point is written to a temporary name in the same folder and renamed into place, so a point
//!   killed halfway leaves no `result.json` and runs again on resume, and a done point is never half
//!   written. A point folder whose `point.toml` differs from the point's scenario now (the sweep file
//!   changed) is an error, never silently mixed in.
//! * Nothing written depends on the wall clock, the executor or the number of jobs.
//!
//! A search as a sweep: each candidate's point runs the searching variant with its `search` narrowed to
//! that candidate (`scenario::provision::candidates`), so the candidate runs under its own name with its
//! own overrides and is scored as the whole search scores it; [`gather`] picks the best with the same
//! rule (`results::search::best`). A candidate's run does not depend on the others, so the
//! candidates' scores and the pick equal `summary.json`'s `searches` entry of `lab run`.

use crate::error::LabError;
use crate::results::search::{self as prov_checks, Candidate};
use crate::scenario::provision::Pick;
use crate::scenario::{bundled, Scenario};
use crate::sim::budget;
use crate::{run_scenario, RunOptions};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// Most points a sweep may have (a Slurm array's usual `MaxArraySize` is 1001; bigger studies are
/// several sweep files).
pub const MAX_POINTS: usize = 100_000;

/// The sweep file (TOML), as written.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SweepFile {
    /// The sweep's name (the Slurm job's name, `results.json`).
    pub name: String,
    /// The base scenario: a bundled scenario's name or a scenario file's path (relative to the sweep
    /// file). Exactly one of `scenario` and `base`.
    #[serde(default)]
    pub scenario: Option<String>,
    /// The base scenario inline (a scenario's tables under `[base]`).
    #[serde(default)]
    pub base: Option<toml::Table>,
    /// Replaces every point's `scale` (as `lab run --scale`); a grid may vary `scale` instead.
    #[serde(default)]
    pub scale: Option<f64>,
    /// Run only these variants at each point (default: all).
    #[serde(default)]
    pub variants: Vec<String>,
    /// `{ "PATH" = [v1, v2, ...] }`: every combination, paths in sorted order, the last varying
    /// fastest.
    #[serde(default)]
    pub grid: BTreeMap<String, Vec<toml::Value>>,
    /// `[{ "PATH" = v, ... }, ...]`: these points, in order.
    #[serde(default)]
    pub points: Vec<BTreeMap<String, toml::Value>>,
    /// The name of one of the base scenario's searching variants: its candidates are the points.
    #[serde(default)]
    pub search: Option<String>,
}

/// One point: its index, the parameters that make it, and the scenario it runs.
#[derive(Debug, Clone)]
pub struct Point {
    pub index: usize,
    /// `(path, value)` in the sweep's order (for a search: the candidate's settings).
    pub params: Vec<(String, serde_json::Value)>,
    /// `path=value,...` (a search's candidate: its variant name).
    pub label: String,
    pub scenario: Scenario,
    /// The point's scenario as TOML (written as `point.toml`; what resume compares).
    pub toml: String,
}

/// A sweep file read and expanded into its points.
#[derive(Debug, Clone)]
pub struct Sweep {
    pub file: SweepFile,
    /// Where relative trace paths of the base scenario resolve (its file's folder).
    pub base_dir: Option<PathBuf>,
    /// The parameter paths (columns of the gathered table), in order.
    pub paths: Vec<String>,
    pub points: Vec<Point>,
    /// For a search sweep: how the search picks its best.
    pub pick: Option<Pick>,
}

/// A point run (or found done): its row and whether it ran, or its error.
pub type PointOutcome = Result<(PointResult, bool), LabError>;

/// What a point's `result.json` holds: one row of the gathered table.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PointResult {
    pub point: usize,
    pub label: String,
    /// `[[path, value], ...]` in the sweep's order.
    pub params: Vec<(String, serde_json::Value)>,
    pub all_passed: bool,
    pub checks_failed: usize,
    /// `VARIANT/CONTAINER/METRIC` (metrics of `summary.json`'s containers), sorted.
    pub metrics: BTreeMap<String, serde_json::Value>,
    /// A search sweep's point: its candidate's score.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub search: Option<SearchScore>,
}

/// A candidate's score, as `summary.json`'s `searches` lists it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SearchScore {
    pub candidate: String,
    pub targets_met: usize,
    pub throughput_ops_s: f64,
    pub violation_s: f64,
    /// The unrounded throughput the pick compares, as Rust prints an `f64` (exact when read back).
    pub throughput_ops_s_exact: String,
}

/// The metrics of each container in `summary.json` that a point's row carries.
const ROW_METRICS: &[&str] = &[
    "throughput_ops_s",
    "throughput_mib_s",
    "mean_latency_ms",
    "lookup_to_store_pct",
    "page_cache_hit_pct",
    "cache_used_mean_mib",
    "evictions",
    "disk_reads",
];

impl SweepFile {
    pub fn from_toml(text: &str) -> Result<SweepFile, LabError> {
        toml::from_str(text).map_err(|e| LabError::Parse(format!("sweep file: {e}")))
    }

    pub fn validate(&self) -> Result<(), LabError> {
        if self.name.trim().is_empty() {
            return Err(LabError::invalid("name", "a sweep needs a name"));
        }
        match (&self.scenario, &self.base) {
            (None, None) => {
                return Err(LabError::invalid("scenario", "name a base `scenario` or give `[base]`"))
            }
            (Some(_), Some(_)) => {
                return Err(LabError::invalid("base", "give `scenario` or `[base]`, not both"))
            }
            _ => {}
        }
        let kinds = [!self.grid.is_empty(), !self.points.is_empty(), self.search.is_some()];
        if kinds.iter().filter(|k| **k).count() != 1 {
            return Err(LabError::invalid("grid", "give exactly one of `grid`, `points` and `search`"));
        }
        for (path, values) in &self.grid {
            if values.is_empty() {
                return Err(LabError::invalid(&format!("grid.{path}"), "needs at least one value"));
            }
        }
        if let Some(s) = self.scale {
            if !(s.is_finite() && s > 0.0) {
                return Err(LabError::invalid("scale", "must be a positive number"));
            }
        }
        Ok(())
    }
}

impl Sweep {
    /// Reads a sweep file; relative paths in it resolve against its folder.
    pub fn load(path: &Path) -> Result<Sweep, LabError> {
        let text = std::fs::read_to_string(path).map_err(|e| LabError::io(path, e))?;
        Sweep::from_toml(&text, path.parent())
    }

    /// Expands a sweep file's text; `dir` is the folder relative paths resolve against.
    pub fn from_toml(text: &str, dir: Option<&Path>) -> Result<Sweep, LabError> {
        let file = SweepFile::from_toml(text)?;
        file.validate()?;
        let dir = dir.map(|d| if d.as_os_str().is_empty() { Path::new(".") } else { d });
        let (base, base_dir) = match (&file.scenario, &file.base) {
            (Some(name), _) => match bundled::SCENARIOS.iter().find(|(n, _)| n == name) {
                Some((_, t)) => (parse_table(t, "scenario")?, None),
                None => {
                    let p = dir.map_or_else(|| PathBuf::from(name), |d| d.join(name));
                    let t = std::fs::read_to_string(&p).map_err(|e| {
                        LabError::invalid(
                            "scenario",
                            format!("no bundled scenario `{name}`, and {}: {e}", p.display()),
                        )
                    })?;
                    (parse_table(&t, "scenario")?, p.parent().map(Path::to_path_buf))
                }
            },
            (None, Some(t)) => (t.clone(), dir.map(Path::to_path_buf)),
            (None, None) => unreachable!("validate() requires a base"),
        };
        let mut sweep =
            Sweep { file: file.clone(), base_dir, paths: Vec::new(), points: Vec::new(), pick: None };
        let settings: Vec<Vec<(String, toml::Value)>> = if let Some(v) = &file.search {
            return sweep.expand_search(&base, v);
        } else if !file.grid.is_empty() {
            sweep.paths = file.grid.keys().cloned().collect();
            let total = file.grid.values().try_fold(1usize, |n, v| n.checked_mul(v.len()));
            let total = total
                .filter(|n| *n <= MAX_POINTS)
                .ok_or_else(|| LabError::invalid("grid", format!("more than {MAX_POINTS} points")))?;
            (0..total)
                .map(|mut i| {
                    let mut out: Vec<(String, toml::Value)> = Vec::new();
                    for (path, values) in file.grid.iter().rev() {
                        out.push((path.clone(), values[i % values.len()].clone()));
                        i /= values.len();
                    }
                    out.reverse();
                    out
                })
                .collect()
        } else {
            if file.points.len() > MAX_POINTS {
                return Err(LabError::invalid("points", format!("more than {MAX_POINTS} points")));
            }
            for p in &file.points {
                for k in p.keys() {
                    if !sweep.paths.contains(k) {
                        sweep.paths.push(k.clone());
                    }
                }
            }
            file.points.iter().map(|p| p.iter().map(|(k, v)| (k.clone(), v.clone())).collect()).collect()
        };
        for (index, params) in settings.into_iter().enumerate() {
            let mut table = base.clone();
            for (path, value) in &params {
                set_path(&mut table, path, value.clone())
                    .map_err(|m| LabError::invalid(&format!("point {index}: {path}"), m))?;
            }
            let label =
                params.iter().map(|(p, v)| format!("{p}={}", value_text(v))).collect::<Vec<_>>().join(",");
            let scenario = sweep.point_scenario(&table, index, &label)?;
            let params = params.into_iter().map(|(p, v)| (p, toml_to_json(&v))).collect();
            sweep.push(index, params, label, scenario)?;
        }
        Ok(sweep)
    }

    /// The points of a search: one per candidate, each the searching variant narrowed to it.
    fn expand_search(mut self, base: &toml::Table, variant: &str) -> Result<Sweep, LabError> {
        let sc = self.point_scenario(base, 0, "")?;
        let Some(v) = sc.variants.iter().find(|v| v.name == variant && v.search.is_some()) else {
            return Err(LabError::invalid(
                "search",
                format!("the scenario has no searching variant `{variant}`"),
            ));
        };
        self.pick = v.search.as_ref().map(|s| s.pick);
        let vm_memory = |c: &str| -> Option<(String, f64)> {
            sc.containers().find(|(_, _, ct)| ct.name == c).map(|(_, vm, _)| (vm.name.clone(), vm.memory_mib))
        };
        let cands = crate::scenario::provision::candidates(v, &vm_memory);
        if cands.len() > MAX_POINTS {
            return Err(LabError::invalid("search", format!("more than {MAX_POINTS} candidates")));
        }
        let mut only = sc.only_variants(&[variant.to_string()])?;
        for (index, (cand, narrowed)) in cands.into_iter().enumerate() {
            let mut params = Vec::new();
            for (c, w) in &narrowed.cache_weights {
                params.push((format!("cache_weights.{c}"), serde_json::json!(w[0])));
            }
            for (c, m) in &narrowed.memory_limit_mib {
                params.push((format!("memory_limit_mib.{c}"), serde_json::json!(m[0])));
            }
            for (p, _) in &params {
                if !self.paths.contains(p) {
                    self.paths.push(p.clone());
                }
            }
            let sv = only.variants.iter_mut().find(|x| x.name == variant).expect("kept above");
            sv.search = Some(narrowed);
            self.push(index, params, cand.name, only.clone())?;
        }
        Ok(self)
    }

    /// A point's scenario from its TOML table: parsed and validated (errors name the point), the
    /// sweep's `scale` and `variants` applied.
    fn point_scenario(&self, table: &toml::Table, index: usize, label: &str) -> Result<Scenario, LabError> {
        let mut table = table.clone();
        if let Some(s) = self.file.scale {
            table.insert("scale".into(), toml::Value::Float(s));
        }
        let text = toml::to_string(&table).map_err(|e| LabError::Parse(e.to_string()))?;
        let at = |e: LabError| match e {
            LabError::Invalid { field, message } => {
                LabError::Invalid { field, message: format!("{message} (point {index}: {label})") }
            }
            LabError::Parse(m) => LabError::Parse(format!("point {index} ({label}): {m}")),
            e => e,
        };
        let sc = Scenario::from_toml(&text).map_err(at)?;
        if self.file.variants.is_empty() {
            Ok(sc)
        } else {
            sc.only_variants(&self.file.variants)
        }
    }

    fn push(
        &mut self,
        index: usize,
        params: Vec<(String, serde_json::Value)>,
        label: String,
        scenario: Scenario,
    ) -> Result<(), LabError> {
        let toml = crate::scenario::mixgen::case_toml(&scenario)?;
        self.points.push(Point { index, params, label, scenario, toml });
        Ok(())
    }

    /// The folder of point `index` under `out`.
    pub fn point_dir(out: &Path, index: usize) -> PathBuf {
        out.join("points").join(format!("{index:04}"))
    }

    /// Whether point `index` is done under `out` (its `result.json` exists and its `point.toml` is this
    /// point's); an error when its folder holds another sweep's point.
    pub fn is_done(&self, out: &Path, index: usize) -> Result<bool, LabError> {
        let p = self.point(index)?;
        let dir = Sweep::point_dir(out, index);
        let toml_path = dir.join("point.toml");
        match std::fs::read_to_string(&toml_path) {
            Ok(t) if t != p.toml => Err(LabError::invalid(
                "out",
                format!(
                    "{} holds point {index} of another sweep (its point.toml differs): use another output folder",
                    dir.display()
                ),
            )),
            Ok(_) => Ok(dir.join("result.json").exists()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
            Err(e) => Err(LabError::io(&toml_path, e)),
        }
    }

    pub fn point(&self, index: usize) -> Result<&Point, LabError> {
        self.points.get(index).ok_or_else(|| {
            LabError::invalid(
                "point",
                format!(
                    "no point {index}: the sweep has {} (0-{})",
                    self.points.len(),
                    self.points.len().saturating_sub(1)
                ),
            )
        })
    }

    /// Runs point `index` into `out/points/NNNN/` unless it is done; returns its row and whether it ran.
    /// `opts` are the lab's run options (`base_dir` is the sweep's). The files: `point.toml` (the point's
    /// scenario), `summary.json`, `timeseries.csv` (as `lab run` writes them) and, last,
    /// `result.json`.
    pub fn run_point(
        &self,
        out: &Path,
        index: usize,
        opts: &RunOptions,
        progress: &mut dyn FnMut(f64),
    ) -> Result<(PointResult, bool), LabError> {
        if self.is_done(out, index)? {
            return Ok((read_result(out, index)?, false));
        }
        let p = self.point(index)?;
        let dir = Sweep::point_dir(out, index);
        std::fs::create_dir_all(&dir).map_err(|e| LabError::io(&dir, e))?;
        write_atomic(&dir.join("point.toml"), p.toml.as_bytes())?;
        let opts = RunOptions { base_dir: self.base_dir.clone(), ..opts.clone() };
        let nvar = p.scenario.run_list().len().max(1);
        let mut done = vec![0f64; nvar];
        let res = run_scenario(&p.scenario, &opts, &mut |vi, f| {
            if let Some(d) = done.get_mut(vi) {
                *d = f;
            }
            progress(done.iter().sum::<f64>() / nvar as f64);
        })?;
        let summary = crate::results::report::summary_json(&res);
        write_atomic(&dir.join("summary.json"), summary.as_bytes())?;
        write_atomic(&dir.join("timeseries.csv"), crate::results::report::timeseries_csv(&res)?.as_bytes())?;
        let search = if self.file.search.is_some() {
            let s =
                res.searches.first().and_then(|s| s.candidates.first()).ok_or_else(|| {
                    LabError::invalid("search", format!("point {index} scored no candidate"))
                })?;
            Some(SearchScore {
                candidate: s.name.clone(),
                targets_met: s.targets_met,
                throughput_ops_s: s.throughput_ops_s,
                violation_s: s.violation_s,
                throughput_ops_s_exact: format!("{:?}", s.unrounded_throughput_ops_s),
            })
        } else {
            None
        };
        let row = PointResult {
            point: index,
            label: p.label.clone(),
            params: p.params.clone(),
            all_passed: res.all_passed(),
            checks_failed: res.checks.iter().filter(|c| !c.passed).count(),
            metrics: row_metrics(&summary),
            search,
        };
        let text = serde_json::to_string_pretty(&row).map_err(|e| LabError::Parse(e.to_string()))? + "\n";
        write_atomic(&dir.join("result.json"), text.as_bytes())?;
        Ok((row, true))
    }

    /// The points not done under `out`, in order.
    pub fn missing(&self, out: &Path) -> Result<Vec<usize>, LabError> {
        let mut v = Vec::new();
        for p in &self.points {
            if !self.is_done(out, p.index)? {
                v.push(p.index);
            }
        }
        Ok(v)
    }

    /// Runs every missing point on `jobs` threads (each point's variants one after the other; each
    /// point plans its memory with a `1/jobs` share of what the host has above the lab's margin).
    /// `on_done(index, ran)` is called on the calling thread as points finish. Returns the points that
    /// ran; on an error, the points started finish, none starts after, and the first error (in point
    /// order) is returned.
    pub fn run_local(
        &self,
        out: &Path,
        jobs: usize,
        opts: &RunOptions,
        on_done: &mut dyn FnMut(usize, &PointOutcome),
    ) -> Result<Vec<usize>, LabError> {
        use std::sync::atomic::{AtomicUsize, Ordering};
        let todo = self.missing(out)?;
        let jobs = jobs.clamp(1, todo.len().max(1));
        let host = match opts.host_memory {
            Some(h) => h,
            None => budget::HostMemory::read()?,
        };
        let margin = host.total_bytes - host.budget_bytes().min(host.total_bytes);
        let share = budget::HostMemory {
            total_bytes: host.total_bytes,
            available_bytes: margin.min(host.available_bytes) + host.budget_bytes() / jobs as u64,
        };
        let opts = RunOptions { jobs: Some(1), host_memory: Some(share), ..opts.clone() };
        let next = AtomicUsize::new(0);
        let stop = AtomicUsize::new(0);
        let mut errors: Vec<(usize, LabError)> = Vec::new();
        let mut ran = Vec::new();
        std::thread::scope(|scope| {
            let (tx, rx) = std::sync::mpsc::channel();
            for _ in 0..jobs {
                let tx = tx.clone();
                let (next, stop, todo, opts) = (&next, &stop, &todo, &opts);
                scope.spawn(move || loop {
                    if stop.load(Ordering::Relaxed) != 0 {
                        break;
                    }
                    let Some(&index) = todo.get(next.fetch_add(1, Ordering::Relaxed)) else { break };
                    let r = self.run_point(out, index, opts, &mut |_| {});
                    if r.is_err() {
                        stop.store(1, Ordering::Relaxed);
                    }
                    // A closed channel only means nobody listens any more.
                    let _ = tx.send((index, r));
                });
            }
            drop(tx);
            for (index, r) in rx {
                on_done(index, &r);
                match r {
                    Ok((_, true)) => ran.push(index),
                    Ok(_) => {}
                    Err(e) => errors.push((index, e)),
                }
            }
        });
        errors.sort_by_key(|e| e.0);
        match errors.into_iter().next() {
            Some((index, e)) => Err(annotate(e, index)),
            None => {
                ran.sort_unstable();
                Ok(ran)
            }
        }
    }

    /// The rows of the done points under `out`, in point order, and the points still missing.
    pub fn collect(&self, out: &Path) -> Result<(Vec<PointResult>, Vec<usize>), LabError> {
        let mut rows = Vec::new();
        let mut missing = Vec::new();
        for p in &self.points {
            if self.is_done(out, p.index)? {
                rows.push(read_result(out, p.index)?);
            } else {
                missing.push(p.index);
            }
        }
        Ok((rows, missing))
    }
}

/// One table of a sweep's points: `results.csv` (one row per point) and `results.json` (the rows, and
/// for a search the best candidate as the search picks it), written into `out`. Every point must be
/// done (the error lists the missing ones).
pub fn gather(sweep: &Sweep, out: &Path) -> Result<Gathered, LabError> {
    let (rows, missing) = sweep.collect(out)?;
    if !missing.is_empty() {
        let list: Vec<String> = missing.iter().take(20).map(usize::to_string).collect();
        return Err(LabError::invalid(
            "points",
            format!(
                "{} of {} points not done ({}{}): run them first",
                missing.len(),
                sweep.points.len(),
                list.join(", "),
                if missing.len() > 20 { ", ..." } else { "" }
            ),
        ));
    }
    let best = match sweep.pick {
        Some(pick) => {
            let cands: Vec<Candidate> = rows
                .iter()
                .map(|r| {
                    let s = r.search.as_ref().ok_or_else(|| {
                        LabError::invalid("search", format!("point {} has no search score", r.point))
                    })?;
                    Ok(Candidate {
                        name: s.candidate.clone(),
                        targets_met: s.targets_met,
                        throughput_ops_s: s.throughput_ops_s,
                        violation_s: s.violation_s,
                        unrounded_throughput_ops_s: s.throughput_ops_s_exact.parse().map_err(|_| {
                            LabError::invalid(
                                "search",
                                format!("point {}: bad throughput_ops_s_exact", r.point),
                            )
                        })?,
                    })
                })
                .collect::<Result<_, LabError>>()?;
            prov_checks::best(pick, &cands).map(|i| cands[i].name.clone())
        }
        None => None,
    };
    let csv = results_csv(sweep, &rows)?;
    let json = serde_json::json!({
        "sweep": sweep.file.name,
        "points": rows.len(),
        "best": best,
        "rows": rows,
    });
    let json = serde_json::to_string_pretty(&json).map_err(|e| LabError::Parse(e.to_string()))? + "\n";
    write_atomic(&out.join("results.csv"), csv.as_bytes())?;
    write_atomic(&out.join("results.json"), json.as_bytes())?;
    Ok(Gathered { rows, best, csv, json })
}

/// What [`gather`] wrote.
#[derive(Debug, Clone)]
pub struct Gathered {
    pub rows: Vec<PointResult>,
    /// A search sweep's best candidate.
    pub best: Option<String>,
    pub csv: String,
    pub json: String,
}

/// The `results.csv` text: `point`, `label`, the parameter paths, `all_passed`, `checks_failed`, a
/// search's `candidate`, `targets_met`, `throughput_ops_s`, `violation_s`, then every metric (sorted).
pub fn results_csv(sweep: &Sweep, rows: &[PointResult]) -> Result<String, LabError> {
    let metrics: std::collections::BTreeSet<&String> = rows.iter().flat_map(|r| r.metrics.keys()).collect();
    let mut header: Vec<String> = vec!["point".into(), "label".into()];
    header.extend(sweep.paths.iter().cloned());
    header.extend(["all_passed".into(), "checks_failed".into()]);
    let search = sweep.pick.is_some();
    if search {
        header.extend(["candidate", "targets_met", "throughput_ops_s", "violation_s"].map(String::from));
    }
    header.extend(metrics.iter().map(|m| (*m).clone()));
    let e = |e: csv::Error| LabError::Parse(format!("csv: {e}"));
    let mut w = csv::Writer::from_writer(Vec::new());
    w.write_record(&header).map_err(e)?;
    for r in rows {
        let mut rec = vec![r.point.to_string(), r.label.clone()];
        for p in &sweep.paths {
            rec.push(r.params.iter().find(|(k, _)| k == p).map(|(_, v)| json_text(v)).unwrap_or_default());
        }
        rec.extend([r.all_passed.to_string(), r.checks_failed.to_string()]);
        if search {
            match &r.search {
                Some(s) => rec.extend([
                    s.candidate.clone(),
                    s.targets_met.to_string(),
                    json_text(&serde_json::json!(s.throughput_ops_s)),
                    json_text(&serde_json::json!(s.violation_s)),
                ]),
                None => rec.extend(std::iter::repeat_n(String::new(), 4)),
            }
        }
        for m in &metrics {
            rec.push(r.metrics.get(*m).map(json_text).unwrap_or_default());
        }
        w.write_record(&rec).map_err(e)?;
    }
    let bytes = w.into_inner().map_err(|x| LabError::Parse(format!("csv: {x}")))?;
    String::from_utf8(bytes).map_err(|x| LabError::Parse(format!("csv: {x}")))
}

/// An `sbatch` script whose array tasks run the points: task `N` runs `lab sweep FILE --out OUT --point
/// N` with `binary`. Paths are quoted for the shell. Each point is named once, in a comment.
pub fn slurm_script(
    sweep: &Sweep,
    binary: &Path,
    file: &Path,
    out: &Path,
    extra_sbatch: &[String],
) -> String {
    let q = |p: &Path| shell_quote(&p.display().to_string());
    let mut s = String::new();
    s.push_str("#!/bin/bash\n");
    // `#SBATCH` lines are read by sbatch, not by a shell: no quoting there, so no spaces either.
    let bare = |t: &str| t.replace(char::is_whitespace, "_");
    s.push_str(&format!("#SBATCH --job-name={}\n", bare(&sweep.file.name)));
    s.push_str(&format!("#SBATCH --array=0-{}\n", sweep.points.len().saturating_sub(1)));
    s.push_str("#SBATCH --cpus-per-task=1\n");
    s.push_str(&format!("#SBATCH --output={}\n", bare(&out.join("slurm-%A_%a.log").display().to_string())));
    for x in extra_sbatch {
        s.push_str(&format!("#SBATCH {x}\n"));
    }
    s.push_str(&format!(
        "# Generated by `doubledecker lab sweep --print-slurm`: {} point(s); after the array ends,\n\
         # `doubledecker lab sweep {} --out {} --gather` writes results.csv and results.json.\n",
        sweep.points.len(),
        q(file),
        q(out)
    ));
    for p in &sweep.points {
        s.push_str(&format!("# point {}: {}\n", p.index, p.label.replace('\n', " ")));
    }
    s.push_str("set -euo pipefail\n");
    s.push_str(&format!(
        "exec {} lab sweep {} --out {} --point \"$SLURM_ARRAY_TASK_ID\" --quiet\n",
        q(binary),
        q(file),
        q(out)
    ));
    s
}

fn shell_quote(s: &str) -> String {
    if !s.is_empty() && s.chars().all(|c| c.is_ascii_alphanumeric() || "/._-+=:,".contains(c)) {
        s.to_string()
    } else {
        format!("'{}'", s.replace('\'', "'\\''"))
    }
}

fn annotate(e: LabError, index: usize) -> LabError {
    match e {
        LabError::Invalid { field, message } => {
            LabError::Invalid { field, message: format!("{message} (point {index})") }
        }
        e => e,
    }
}

fn read_result(out: &Path, index: usize) -> Result<PointResult, LabError> {
    let p = Sweep::point_dir(out, index).join("result.json");
    let t = std::fs::read_to_string(&p).map_err(|e| LabError::io(&p, e))?;
    serde_json::from_str(&t).map_err(|e| LabError::Parse(format!("{}: {e}", p.display())))
}

/// Writes `path` by a temporary file in the same folder renamed over it: readers see the old file or
/// the whole new one.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<(), LabError> {
    use std::io::Write as _;
    let dir = path.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir).map_err(|e| LabError::io(dir, e))?;
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let tmp = dir.join(format!(".{name}.tmp{}", std::process::id()));
    let mut f = std::fs::File::create(&tmp).map_err(|e| LabError::io(&tmp, e))?;
    f.write_all(bytes).and_then(|_| f.sync_all()).map_err(|e| LabError::io(&tmp, e))?;
    std::fs::rename(&tmp, path).map_err(|e| LabError::io(path, e))
}

fn parse_table(text: &str, field: &str) -> Result<toml::Table, LabError> {
    text.parse::<toml::Table>().map_err(|e| LabError::Parse(format!("{field}: {e}")))
}

/// Sets `path` (dot-separated) in a scenario table to `value`. A segment into an array picks the
/// element by index or by its `name` (`vms.vm.containers.web.memory_limit_mib`); a missing key of a
/// table is created (tables along the way too).
pub fn set_path(table: &mut toml::Table, path: &str, value: toml::Value) -> Result<(), String> {
    let segs: Vec<&str> = path.split('.').collect();
    if segs.iter().any(|s| s.is_empty()) {
        return Err("an empty segment in the path".into());
    }
    // Work on a copy so that an error leaves the table as it was.
    let mut root = toml::Value::Table(table.clone());
    let mut cur = &mut root;
    for (i, seg) in segs.iter().enumerate() {
        let last = i + 1 == segs.len();
        cur = match cur {
            toml::Value::Table(t) => {
                if last {
                    t.insert((*seg).to_string(), value);
                    break;
                }
                t.entry((*seg).to_string()).or_insert_with(|| toml::Value::Table(toml::Table::new()))
            }
            toml::Value::Array(a) => {
                let pos = match seg.parse::<usize>() {
                    Ok(n) if n < a.len() => n,
                    _ => a
                        .iter()
                        .position(|x| x.get("name").and_then(toml::Value::as_str) == Some(seg))
                        .ok_or_else(|| format!("`{seg}` is neither an index nor the name of an element"))?,
                };
                if last {
                    a[pos] = value;
                    break;
                }
                &mut a[pos]
            }
            _ => return Err(format!("`{}` is not a table or an array", segs[..i].join("."))),
        };
    }
    match root {
        toml::Value::Table(t) => *table = t,
        _ => unreachable!("the root is a table"),
    }
    Ok(())
}

fn value_text(v: &toml::Value) -> String {
    match v {
        toml::Value::String(s) => s.clone(),
        v => v.to_string(),
    }
}

fn json_text(v: &serde_json::Value) -> String {
    match v {
        serde_json::Value::String(s) => s.clone(),
        v => v.to_string(),
    }
}

fn toml_to_json(v: &toml::Value) -> serde_json::Value {
    serde_json::to_value(v).unwrap_or(serde_json::Value::Null)
}

/// `VARIANT/CONTAINER/METRIC` of [`ROW_METRICS`] from a `summary.json` text.
fn row_metrics(summary: &str) -> BTreeMap<String, serde_json::Value> {
    let mut m = BTreeMap::new();
    let Ok(v) = serde_json::from_str::<serde_json::Value>(summary) else { return m };
    for var in v["variants"].as_array().into_iter().flatten() {
        let vn = var["name"].as_str().unwrap_or_default();
        for c in var["containers"].as_array().into_iter().flatten() {
            let cn = c["name"].as_str().unwrap_or_default();
            for k in ROW_METRICS {
                if c[*k].is_number() {
                    m.insert(format!("{vn}/{cn}/{k}"), c[*k].clone());
                }
            }
        }
    }
    m
}

#[cfg(test)]
mod tests {
    use super::*;

    const BASE: &str = "name = \"s\"\nscenario = \"fig3-4-global-share\"\n";

    #[test]
    fn a_grid_expands_in_path_order_with_the_last_path_fastest() {
        let sw = Sweep::from_toml(
            &format!("{BASE}[grid]\nseed = [1, 2]\n\"host.mem_capacity_mib\" = [64, 128, 256]\n"),
            None,
        )
        .unwrap();
        let labels: Vec<&str> = sw.points.iter().map(|p| p.label.as_str()).collect();
        assert_eq!(labels[0], "host.mem_capacity_mib=64,seed=1");
        assert_eq!(labels[1], "host.mem_capacity_mib=64,seed=2");
        assert_eq!(labels[5], "host.mem_capacity_mib=256,seed=2");
        assert_eq!(sw.points[5].scenario.seed, 2);
        assert_eq!(sw.points[5].scenario.host.mem_capacity_mib, 256.0);
        assert_eq!(sw.paths, ["host.mem_capacity_mib", "seed"]);
    }

    #[test]
    fn paths_pick_array_elements_by_name_or_index() {
        let sw = Sweep::from_toml(
            &format!("{BASE}[[points]]\n\"vms.vm1.containers.c2.memory_limit_mib\" = 100\n[[points]]\n\"vms.0.containers.0.memory_limit_mib\" = 50\n"),
            None,
        )
        .unwrap();
        assert_eq!(sw.points[0].scenario.vms[0].containers[1].memory_limit_mib, Some(100.0));
        assert_eq!(sw.points[1].scenario.vms[0].containers[0].memory_limit_mib, Some(50.0));
        let e =
            Sweep::from_toml(&format!("{BASE}[grid]\n\"vms.nope.memory_mib\" = [1]\n"), None).unwrap_err();
        assert!(
            matches!(&e, LabError::Invalid { field, .. } if field == "point 0: vms.nope.memory_mib"),
            "{e}"
        );
    }

    #[test]
    fn a_bad_value_at_a_point_names_the_scenario_field_and_the_point() {
        let e = Sweep::from_toml(&format!("{BASE}[grid]\nduration_s = [10, -1]\n"), None).unwrap_err();
        match e {
            LabError::Invalid { field, message } => {
                assert_eq!(field, "duration_s");
                assert!(message.contains("point 1: duration_s=-1"), "{message}");
            }
            e => panic!("{e}"),
        }
    }

    #[test]
    fn only_variants_keeps_the_checks_of_the_variants_kept() {
        let sc = crate::bundled::get("fig3-4-global-share").unwrap();
        let one = sc.only_variants(&["alone-c1".into()]).unwrap();
        assert_eq!(one.variants.len(), 1);
        assert!(!one.checks.is_empty() && one.checks.len() < sc.checks.len());
        assert!(one.checks.iter().all(|c| !c.name.contains("container 2 alone")), "{:?}", one.checks);
        let e = sc.only_variants(&["nope".into()]).unwrap_err();
        assert!(matches!(&e, LabError::Invalid { field, .. } if field == "variants"), "{e}");
    }

    #[test]
    fn a_search_sweep_has_one_point_per_candidate_named_as_the_search_names_it() {
        let sw = Sweep::from_toml(
            "name = \"t\"\nscenario = \"table4-morai-vs-doubledecker\"\nsearch = \"morai++\"\n",
            None,
        )
        .unwrap();
        let sc = crate::bundled::get("table4-morai-vs-doubledecker").unwrap();
        let names: Vec<String> = sc
            .run_list()
            .into_iter()
            .filter(|v| v.search_of.as_deref() == Some("morai++"))
            .map(|v| v.name)
            .collect();
        let labels: Vec<String> = sw.points.iter().map(|p| p.label.clone()).collect();
        assert_eq!(labels, names);
        assert_eq!(sw.points.len(), 34);
        for p in &sw.points {
            let expanded = p.scenario.run_list();
            assert_eq!(expanded.len(), 1);
            assert_eq!(expanded[0].name, p.label);
        }
    }
}
