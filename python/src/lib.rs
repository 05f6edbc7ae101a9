//! `doubledecker._native`: the Rust half of the Python package (issue 33). Thin calls into the lab
//! (`dd-lab`), the miss-ratio curves (`dd-mrc`), the trace readers (`dd-trace`) and sweeps
//! (`dd_lab::sweep`); the Python half (`python/doubledecker/`) turns what they return into pandas
//! DataFrames and numpy arrays and holds the executors (Ray).
//!
//! Invariants:
//! * Every call that runs Rust work for more than a moment releases the GIL (`Python::allow_threads`):
//!   its inputs are copied into owned Rust values first, so nothing borrowed from Python is touched
//!   while other Python threads run.
//! * What the lab returns is the text `lab run` writes (`summary.json`, `timeseries.csv`), produced by
//!   the same functions (`dd_lab::results::report`), so a Python run equals the CLI's byte for byte.
//! * Every Rust error becomes an exception of `doubledecker.errors` (`LabError`, `TraceError`,
//!   `MrcError`) carrying the error's message and, where the error names one, its `field`.
#![forbid(unsafe_code)] // nothing here needs it; PyO3 and rust-numpy hold the FFI

use dd_lab::{LabError, RunOptions, Scenario};
use dd_mrc::profile::{profile, SizeGrid};
use dd_mrc::{MrcConfig, MrcError};
use dd_trace::{Format, Request, TraceError, TraceReader};
use numpy::{IntoPyArray, PyReadonlyArray1};
use pyo3::prelude::*;
use pyo3::types::PyDict;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// An exception of `doubledecker.errors` (class `class`) with the message and the field it names.
fn raise(class: &str, message: String, field: Option<String>) -> PyErr {
    Python::with_gil(|py| {
        let made = py
            .import("doubledecker.errors")
            .and_then(|m| m.getattr(class))
            .and_then(|c| c.call1((message.clone(), field)));
        match made {
            Ok(v) => PyErr::from_value(v),
            Err(e) => e,
        }
    })
}

fn lab_err(e: LabError) -> PyErr {
    let field = match &e {
        LabError::Invalid { field, .. } => Some(field.clone()),
        _ => None,
    };
    raise("LabError", e.to_string(), field)
}

fn trace_err(e: TraceError) -> PyErr {
    let field = match &e {
        TraceError::Invalid { field, .. } => Some((*field).to_string()),
        _ => None,
    };
    raise("TraceError", e.to_string(), field)
}

fn mrc_err(e: MrcError) -> PyErr {
    let field = match &e {
        MrcError::Invalid { field, .. } => Some((*field).to_string()),
        _ => None,
    };
    raise("MrcError", e.to_string(), field)
}

/// The scenario from its text: `kind` is `toml` or `json` (a dict from Python).
fn parse_scenario(text: &str, kind: &str) -> Result<Scenario, LabError> {
    match kind {
        "json" => {
            let sc: Scenario = serde_json::from_str(text).map_err(|e| LabError::Parse(e.to_string()))?;
            sc.validate()?;
            Ok(sc)
        }
        _ => Scenario::from_toml(text),
    }
}

/// The text of a bundled scenario, or `None`.
#[pyfunction]
fn bundled_scenario(name: &str) -> Option<&'static str> {
    dd_lab::bundled::SCENARIOS.iter().find(|(n, _)| *n == name).map(|(_, t)| *t)
}

/// The bundled scenarios' names, in `lab list` order.
#[pyfunction]
fn bundled_names() -> Vec<&'static str> {
    dd_lab::bundled::SCENARIOS.iter().map(|(n, _)| *n).collect()
}

/// `(summary_json, timeseries_csv, checks)`, each check `(name, passed, detail)`.
type LabRun = (String, String, Vec<(String, bool, String)>);

/// Runs a scenario as `lab run` does. Returns `(summary_json, timeseries_csv, checks)` with checks as
/// `(name, passed, detail)`.
#[pyfunction]
#[pyo3(signature = (text, kind, base_dir=None, scale=None, seed=None, variants=None, jobs=None, scratch_dir=None))]
#[allow(clippy::too_many_arguments)] // the lab's run options, each a Python keyword argument
fn lab_run(
    py: Python<'_>,
    text: String,
    kind: String,
    base_dir: Option<PathBuf>,
    scale: Option<f64>,
    seed: Option<u64>,
    variants: Option<Vec<String>>,
    jobs: Option<usize>,
    scratch_dir: Option<PathBuf>,
) -> PyResult<LabRun> {
    let run = move || -> Result<_, LabError> {
        let mut sc = parse_scenario(&text, &kind)?;
        if let Some(v) = variants.filter(|v| !v.is_empty()) {
            sc = sc.only_variants(&v)?;
        }
        let opts = RunOptions { scale, seed, base_dir, jobs, scratch_dir, ..Default::default() };
        let res = dd_lab::run_scenario(&sc, &opts, &mut |_, _| {})?;
        let checks = res.checks.iter().map(|c| (c.name.clone(), c.passed, c.detail.clone())).collect();
        Ok((
            dd_lab::results::report::summary_json(&res),
            dd_lab::results::report::timeseries_csv(&res)?,
            checks,
        ))
    };
    py.allow_threads(run).map_err(lab_err)
}

/// Requests held in memory (keys handed over from Python), read as a trace.
struct MemoryTrace {
    requests: Arc<Vec<Request>>,
    pos: usize,
}

impl TraceReader for MemoryTrace {
    fn read_batch(&mut self, out: &mut Vec<Request>, max: usize) -> Result<usize, TraceError> {
        let end = (self.pos + max).min(self.requests.len());
        out.extend_from_slice(&self.requests[self.pos..end]);
        let n = end - self.pos;
        self.pos = end;
        Ok(n)
    }
    fn bytes_read(&self) -> u64 {
        self.pos as u64
    }
    fn total_bytes(&self) -> Option<u64> {
        Some(self.requests.len() as u64)
    }
}

fn trace_format(format: Option<&str>, column: Option<usize>, path: &Path) -> PyResult<Format> {
    match (format, column) {
        (Some("csv"), c) => Ok(Format::Csv { column: c.unwrap_or(1) }),
        (Some("oracle-general"), None) => Ok(Format::OracleGeneral),
        (Some("oracle-general"), Some(_)) => {
            Err(raise("TraceError", "`column` is for CSV traces".into(), Some("column".into())))
        }
        (Some(f), _) => Err(raise(
            "TraceError",
            format!("format `{f}`: want `csv` or `oracle-general`"),
            Some("format".into()),
        )),
        (None, c) => Ok(match Format::guess(path) {
            Format::Csv { .. } => Format::Csv { column: c.unwrap_or(1) },
            f => f,
        }),
    }
}

/// A miss-ratio curve as `doubledecker mrc` computes it, of `keys` (with `obj_sizes` for byte curves)
/// or of the trace at `path`. `config_json` is a `dd_mrc::MrcConfig` without `sizes`; `sizes` or
/// `points` the grid. Returns a dict: method, policy, requests, unique, sampling_rate, sizes (numpy
/// uint64), miss_ratio (numpy float64).
#[pyfunction]
#[pyo3(signature = (config_json, keys=None, obj_sizes=None, path=None, format=None, column=None, sizes=None, points=None))]
#[allow(clippy::too_many_arguments)] // the `mrc` command's flags, each a Python keyword argument
fn mrc<'py>(
    py: Python<'py>,
    config_json: &str,
    keys: Option<PyReadonlyArray1<'py, u64>>,
    obj_sizes: Option<PyReadonlyArray1<'py, u32>>,
    path: Option<PathBuf>,
    format: Option<&str>,
    column: Option<usize>,
    sizes: Option<Vec<u64>>,
    points: Option<usize>,
) -> PyResult<Bound<'py, PyDict>> {
    let config: MrcConfig = serde_json::from_str(config_json)
        .map_err(|e| raise("MrcError", format!("configuration: {e}"), None))?;
    // As the command does: minisim's sizes come from the grid, so validate everything else first.
    MrcConfig { sizes: vec![1], ..config.clone() }.validate().map_err(mrc_err)?;
    let grid = match (sizes, points) {
        (Some(s), _) if s.is_empty() => {
            return Err(raise("MrcError", "`sizes`: needs at least one size".into(), Some("sizes".into())))
        }
        (Some(s), _) => SizeGrid::Sizes(s),
        (None, Some(0)) => {
            return Err(raise("MrcError", "`points`: must be at least 1".into(), Some("points".into())))
        }
        (None, p) => SizeGrid::Points(p.unwrap_or(100)),
    };
    let source: Result<Arc<Vec<Request>>, (PathBuf, Format)> = match (keys, path) {
        (Some(k), None) => {
            let k = k.as_slice()?;
            let s = match &obj_sizes {
                Some(s) => {
                    let s = s.as_slice()?;
                    if s.len() != k.len() {
                        return Err(raise(
                            "MrcError",
                            format!("`obj_sizes`: {} sizes for {} keys", s.len(), k.len()),
                            Some("obj_sizes".into()),
                        ));
                    }
                    s.to_vec()
                }
                None => vec![dd_trace::PAGE_SIZE; k.len()],
            };
            let reqs = k
                .iter()
                .zip(s)
                .enumerate()
                .map(|(i, (&id, size))| Request { time: i as u64, id, size, next_access_vtime: -1 })
                .collect();
            Ok(Arc::new(reqs))
        }
        (None, Some(p)) => {
            let f = trace_format(format, column, &p)?;
            Err((p, f))
        }
        _ => {
            return Err(raise("MrcError", "give either keys or a trace path".into(), Some("keys".into())));
        }
    };
    let result = py.allow_threads(move || {
        let mut open = || -> Result<Box<dyn TraceReader>, TraceError> {
            match &source {
                Ok(reqs) => Ok(Box::new(MemoryTrace { requests: reqs.clone(), pos: 0 })),
                Err((p, f)) => dd_trace::open(p, f),
            }
        };
        profile(&mut open, &config, &grid, &mut |_| {})
    });
    let p = result.map_err(|e| match e {
        dd_mrc::profile::ProfileError::Trace(t) => trace_err(t),
        dd_mrc::profile::ProfileError::Config(c) => mrc_err(c),
        e => raise("MrcError", e.to_string(), None),
    })?;
    let d = PyDict::new(py);
    d.set_item("method", serde_name(&p.method))?;
    d.set_item("policy", serde_name(&p.policy))?;
    d.set_item("requests", p.requests)?;
    d.set_item("unique", p.unique)?;
    d.set_item("sampling_rate", p.sampling_rate)?;
    d.set_item("sizes", p.sizes.into_pyarray(py))?;
    d.set_item("miss_ratio", p.miss_ratio.into_pyarray(py))?;
    Ok(d)
}

/// The name `doubledecker mrc --json` prints for a method or a policy (its serde name).
fn serde_name<T: serde::Serialize>(v: &T) -> String {
    serde_json::to_value(v).ok().and_then(|v| v.as_str().map(str::to_string)).unwrap_or_default()
}

/// Every request of a trace file as numpy arrays: a dict of `time` (uint64), `id` (uint64), `size`
/// (uint32) and `next_access_vtime` (int64). `max_requests` bounds what is read (an error beyond it).
#[pyfunction]
#[pyo3(signature = (path, format=None, column=None, max_requests=None))]
fn read_trace<'py>(
    py: Python<'py>,
    path: PathBuf,
    format: Option<&str>,
    column: Option<usize>,
    max_requests: Option<usize>,
) -> PyResult<Bound<'py, PyDict>> {
    let f = trace_format(format, column, &path)?;
    let limit = max_requests.unwrap_or(usize::MAX);
    let all = py.allow_threads(move || -> Result<Vec<Request>, TraceError> {
        let mut r = dd_trace::open(&path, &f)?;
        let mut all = Vec::new();
        while r.read_batch(&mut all, dd_trace::DEFAULT_BATCH)? > 0 {
            if all.len() > limit {
                return Err(TraceError::Invalid {
                    field: "max_requests",
                    message: format!("{} has more than {limit} requests", path.display()),
                });
            }
        }
        Ok(all)
    });
    let all = all.map_err(trace_err)?;
    let d = PyDict::new(py);
    d.set_item("time", all.iter().map(|r| r.time).collect::<Vec<_>>().into_pyarray(py))?;
    d.set_item("id", all.iter().map(|r| r.id).collect::<Vec<_>>().into_pyarray(py))?;
    d.set_item("size", all.iter().map(|r| r.size).collect::<Vec<_>>().into_pyarray(py))?;
    d.set_item(
        "next_access_vtime",
        all.iter().map(|r| r.next_access_vtime).collect::<Vec<_>>().into_pyarray(py),
    )?;
    Ok(d)
}

fn load_sweep(py: Python<'_>, file: &Path) -> PyResult<dd_lab::sweep::Sweep> {
    let file = file.to_path_buf();
    py.allow_threads(move || dd_lab::sweep::Sweep::load(&file)).map_err(lab_err)
}

/// A sweep's points: `(index, label, params_json)`.
#[pyfunction]
fn sweep_points(py: Python<'_>, file: PathBuf) -> PyResult<Vec<(usize, String, String)>> {
    let sw = load_sweep(py, &file)?;
    Ok(sw
        .points
        .iter()
        .map(|p| (p.index, p.label.clone(), serde_json::to_string(&p.params).unwrap_or_default()))
        .collect())
}

/// The points of a sweep not done under `out`.
#[pyfunction]
fn sweep_missing(py: Python<'_>, file: PathBuf, out: PathBuf) -> PyResult<Vec<usize>> {
    let sw = load_sweep(py, &file)?;
    sw.missing(&out).map_err(lab_err)
}

/// Runs one point (nothing when done); returns `(result_json, ran)`.
#[pyfunction]
#[pyo3(signature = (file, out, index, scratch_dir=None))]
fn sweep_run_point(
    py: Python<'_>,
    file: PathBuf,
    out: PathBuf,
    index: usize,
    scratch_dir: Option<PathBuf>,
) -> PyResult<(String, bool)> {
    let sw = load_sweep(py, &file)?;
    let r = py.allow_threads(move || {
        let opts = RunOptions { scratch_dir, jobs: Some(1), ..Default::default() };
        sw.run_point(&out, index, &opts, &mut |_| {})
    });
    let (row, ran) = r.map_err(lab_err)?;
    Ok((serde_json::to_string(&row).unwrap_or_default(), ran))
}

/// Runs every missing point on `jobs` threads (`lab sweep --executor local`); returns the points that ran.
#[pyfunction]
#[pyo3(signature = (file, out, jobs=None, scratch_dir=None))]
fn sweep_run_local(
    py: Python<'_>,
    file: PathBuf,
    out: PathBuf,
    jobs: Option<usize>,
    scratch_dir: Option<PathBuf>,
) -> PyResult<Vec<usize>> {
    let sw = load_sweep(py, &file)?;
    let jobs = jobs.unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    py.allow_threads(move || {
        let opts = RunOptions { scratch_dir, ..Default::default() };
        sw.run_local(&out, jobs, &opts, &mut |_, _| {})
    })
    .map_err(lab_err)
}

/// Gathers a sweep's done points into `out/results.csv` and `out/results.json`; returns
/// `(csv, json)`. An error when points are missing.
#[pyfunction]
fn sweep_gather(py: Python<'_>, file: PathBuf, out: PathBuf) -> PyResult<(String, String)> {
    let sw = load_sweep(py, &file)?;
    let g = py.allow_threads(move || dd_lab::sweep::gather(&sw, &out)).map_err(lab_err)?;
    Ok((g.csv, g.json))
}

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add_function(wrap_pyfunction!(bundled_scenario, m)?)?;
    m.add_function(wrap_pyfunction!(bundled_names, m)?)?;
    m.add_function(wrap_pyfunction!(lab_run, m)?)?;
    m.add_function(wrap_pyfunction!(mrc, m)?)?;
    m.add_function(wrap_pyfunction!(read_trace, m)?)?;
    m.add_function(wrap_pyfunction!(sweep_points, m)?)?;
    m.add_function(wrap_pyfunction!(sweep_missing, m)?)?;
    m.add_function(wrap_pyfunction!(sweep_run_point, m)?)?;
    m.add_function(wrap_pyfunction!(sweep_run_local, m)?)?;
    m.add_function(wrap_pyfunction!(sweep_gather, m)?)?;
    Ok(())
}
