//! Workloads: the Filebench personalities, a Redis-like anonymous-memory store and block-trace replay,
//! as generators of file-level operations for the emulator.
//!
//! Our reading of Filebench (`workloads/*.f` of Filebench 1.4/1.5):
//! * **webserver** (nfiles 1000, meandirwidth 20, filesize 16k gamma 1.5, nthreads 100, iosize 1m,
//!   meanappendsize 16k): each thread loops `10 x (openfile, readwholefile, closefile)` then
//!   `appendfilerand` of ~16 KiB to one log file shared by the container's threads.
//! * **webproxy** (nfiles 10000, filesize 16k, nthreads 100, meanappendsize 16k): `deletefile,
//!   createfile, appendfilerand, closefile`, then `5 x (openfile, readwholefile, closefile)`.
//! * **varmail** (nfiles 1000, filesize 16k, nthreads 16, meanappendsize 16k): `deletefile, createfile,
//!   appendfilerand, fsync, closefile, openfile, readwholefile, appendfilerand, fsync, closefile,
//!   openfile, readwholefile, closefile`.
//! * **videoserver** (filesize 10g, numactivevids 32, numpassivevids 194, nthreads 48, readiosize 256k,
//!   writeiosize 1m, repintval 10): 48 reader threads each `read` 256 KiB from an active video (each
//!   file keeps its own sequential offset, wrapping at the end); one writer thread `deletefile,
//!   createfile, writewholefile (1m ios), closefile, delay repintval` over the passive videos. The
//!   `bwlimit` event generator of the reference file is not modelled (readers run closed-loop).
//! * File selection: Filebench picks a random file of the fileset by default; with in-order selection
//!   (`selection = "in-order"`) a cursor per fileset walks the files 0, 1, 2, ... and wraps, as a fileset
//!   walked by index does. File sizes are drawn once from a gamma distribution (shape 1.5) with the
//!   given mean; files are preallocated on disk (not in memory) at the start.
//! * Appends are rounded up to whole pages and start on a fresh page, so every page has one writer
//!   generation (the version the cache stamps check).
//! * Operation counting: every flowop counts one operation, as Filebench's ops/s; `open`/`close`/
//!   `delete`/`create` cost only CPU time.
//!
//! **kv** (Redis-like): the dataset lives in anonymous memory; each operation touches one uniformly
//! random 4 KiB page (a write with probability `write_fraction`). **trace**: rows `object,index,pages,op`
//! replayed by one thread, one row per operation.

use crate::error::LabError;
use crate::scenario::workload::TraceFormat;
use crate::scenario::{Selection, Workload, PAGE};
use rand::Rng;
use rand_chacha::ChaCha8Rng;

/// One fileset of a container: a contiguous range of object ids.
#[derive(Debug, Clone)]
pub struct Fileset {
    pub first_object: u32,
    pub nfiles: u32,
    pub selection: Selection,
    cursor: u32,
    /// The files in use (`working_set` events): `len` files from `start`, wrapping; `None`: all.
    window: Option<Window>,
}

/// A window of `len` items of `n` from `start`, wrapping (see `Event::WorkingSet`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Window {
    pub start: u64,
    pub len: u64,
}

impl Window {
    /// The window of `fraction` of `n` items from `offset` of the way in (at least one item).
    pub fn of(n: u64, fraction: f64, offset: f64) -> Window {
        let n = n.max(1);
        let start = ((offset * n as f64) as u64).min(n - 1);
        let len = ((fraction * n as f64).round() as u64).clamp(1, n);
        Window { start, len }
    }

    /// Item `i` of the window (`i < len`), as an item of the whole range of `n`.
    pub fn item(&self, i: u64, n: u64) -> u64 {
        (self.start + i % self.len) % n.max(1)
    }
}

impl Fileset {
    pub fn new(first_object: u32, nfiles: u32, selection: Selection) -> Fileset {
        Fileset { first_object, nfiles, selection, cursor: 0, window: None }
    }

    /// Uses only the files of the window from now on.
    pub fn set_window(&mut self, fraction: f64, offset: f64) {
        self.window = Some(Window::of(self.nfiles as u64, fraction, offset));
        self.cursor = 0;
    }

    /// The next file to use, by the fileset's selection rule.
    pub fn pick(&mut self, rng: &mut ChaCha8Rng) -> u32 {
        let n = self.window.map_or(self.nfiles, |w| w.len as u32);
        let i = match self.selection {
            Selection::Random => rng.gen_range(0..n),
            Selection::InOrder => {
                let i = self.cursor;
                self.cursor = (self.cursor + 1) % n;
                i
            }
        };
        let i = self.window.map_or(i, |w| w.item(i as u64, self.nfiles as u64) as u32);
        self.first_object + i
    }
}

/// A sample of a gamma distribution with shape `k >= 1` and the given mean (Marsaglia and Tsang).
pub fn gamma(rng: &mut ChaCha8Rng, k: f64, mean: f64) -> f64 {
    let d = k - 1.0 / 3.0;
    let c = 1.0 / (9.0 * d).sqrt();
    loop {
        // Box-Muller normal.
        let u1: f64 = rng.gen_range(f64::MIN_POSITIVE..1.0);
        let u2: f64 = rng.gen();
        let x = (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos();
        let v = (1.0 + c * x).powi(3);
        if v <= 0.0 {
            continue;
        }
        let u: f64 = rng.gen_range(f64::MIN_POSITIVE..1.0);
        if u.ln() < 0.5 * x * x + d - d * v + d * v.ln() {
            return d * v * mean / k;
        }
    }
}

/// Pages of a size drawn from Filebench's gamma(1.5) around `mean_kib`.
pub fn gamma_pages(rng: &mut ChaCha8Rng, mean_kib: f64) -> u32 {
    let bytes = gamma(rng, 1.5, mean_kib * 1024.0);
    ((bytes / PAGE as f64).ceil() as u32).max(1)
}

/// What one thread does next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// The generic loop of a personality; `step` is the position in its flowop list.
    Loop { step: u32 },
    /// Videoserver writer: writing `file` up to `done` of `total` pages.
    VideoWriter { file: u32, done: u32, total: u32, step: u32 },
    /// Trace replay position.
    Trace { row: usize },
}

/// A loaded trace: rows of `(object, index, pages, write)`, objects numbered densely in order of first
/// appearance.
#[derive(Debug, Clone, Default)]
pub struct Trace {
    pub rows: Vec<(u32, u32, u32, bool)>,
    pub objects: u32,
}

/// An opened trace file (or a bundled trace), read once as it is parsed.
pub type TraceStream = Box<dyn std::io::Read + Send>;

/// Opens a trace by its path in the scenario.
pub type OpenTrace<'a> = &'a dyn Fn(&str) -> Result<TraceStream, LabError>;

/// How a trace is read (the `trace` workload's fields).
#[derive(Debug, Clone, Copy)]
pub struct TraceLoad {
    pub format: TraceFormat,
    pub ignore_obj_size: bool,
    pub max_requests: u64,
}

/// Renumbers object ids densely, in order of first appearance. The map is `dd_mrc::KeyMap` (one cache
/// miss per cold lookup, and a prefetch): with the standard library's SipHash map the numbering took a
/// fifth of a plain-LRU replay's CPU (`scripts/lab-vs-libcachesim.sh`), and two thirds of the load with
/// a foldhash one, nearly all of it cache misses on a map of every distinct object.
#[derive(Default)]
struct Ids(dd_mrc::KeyMap);

/// How many requests ahead of the one numbered the loader prefetches an object's map entry.
const PREFETCH_AHEAD: usize = 16;

impl Ids {
    fn get(&mut self, id: u64) -> Option<u32> {
        if let Some(o) = self.0.get(id) {
            return Some(o);
        }
        // `u32::MAX` is the map's empty marker, so ids stop one short of it.
        let next = u32::try_from(self.0.len()).ok().filter(|&n| n != u32::MAX)?;
        self.0.insert(id, next);
        Some(next)
    }

    fn prefetch(&self, id: u64) {
        self.0.prefetch(id);
    }
}

impl Trace {
    /// Reads a trace from `input` (`path` names it in errors).
    pub fn load(
        input: impl std::io::Read + Send + 'static,
        path: &str,
        how: TraceLoad,
    ) -> Result<Trace, LabError> {
        match how.format {
            TraceFormat::BlockCsv => Trace::parse_block_csv(input, path, how.max_requests),
            TraceFormat::OracleGeneral => Trace::parse_oracle_general(input, path, how),
        }
    }

    fn parse_block_csv(input: impl std::io::Read, path: &str, max: u64) -> Result<Trace, LabError> {
        let mut rd = csv::ReaderBuilder::new().has_headers(true).trim(csv::Trim::All).from_reader(input);
        let mut ids = Ids::default();
        let mut rows = Vec::new();
        let err = |line: usize, m: &str| LabError::Trace {
            path: path.to_string(),
            message: format!("row {line}: {m}"),
        };
        for (n, rec) in rd.records().enumerate() {
            let rec = rec.map_err(|e| err(n + 2, &e.to_string()))?;
            if rows.len() as u64 >= max {
                return Err(too_long(path, max));
            }
            if rec.len() != 4 {
                return Err(err(n + 2, "expected 4 fields: object,index,pages,op"));
            }
            let obj: u64 = rec[0].parse().map_err(|_| err(n + 2, "object is not an integer"))?;
            let idx: u32 = rec[1].parse().map_err(|_| err(n + 2, "index is not a 32-bit integer"))?;
            let pages: u32 = rec[2].parse().map_err(|_| err(n + 2, "pages is not an integer"))?;
            if pages == 0 || idx.checked_add(pages).is_none() {
                return Err(err(n + 2, "pages must be at least 1 and index+pages fit 32 bits"));
            }
            let write = match &rec[3] {
                "R" | "r" => false,
                "W" | "w" => true,
                _ => return Err(err(n + 2, "op must be R or W")),
            };
            let o = ids.get(obj).ok_or_else(|| err(n + 2, "more than 2^32 distinct objects"))?;
            rows.push((o, idx, pages, write));
        }
        if rows.is_empty() {
            return Err(err(1, "the trace has no rows"));
        }
        Ok(Trace { rows, objects: ids.0.len() as u32 })
    }

    /// Reads libCacheSim's oracle-general records (plain or zstd): every request reads its object.
    fn parse_oracle_general(
        input: impl std::io::Read + Send + 'static,
        path: &str,
        how: TraceLoad,
    ) -> Result<Trace, LabError> {
        let terr =
            |e: dd_trace::TraceError| LabError::Trace { path: path.to_string(), message: e.to_string() };
        let mut rd = dd_trace::OracleGeneralReader::new(dd_trace::Source::from_reader(path, input, None))
            .map_err(terr)?;
        let mut ids = Ids::default();
        let mut rows = Vec::new();
        let mut batch = Vec::new();
        loop {
            batch.clear();
            if dd_trace::TraceReader::read_batch(&mut rd, &mut batch, dd_trace::DEFAULT_BATCH)
                .map_err(terr)?
                == 0
            {
                break;
            }
            if (rows.len() + batch.len()) as u64 > how.max_requests {
                return Err(too_long(path, how.max_requests));
            }
            for (i, r) in batch.iter().enumerate() {
                if let Some(ahead) = batch.get(i + PREFETCH_AHEAD) {
                    ids.prefetch(ahead.id);
                }
                let o = ids.get(r.id).ok_or_else(|| LabError::Trace {
                    path: path.to_string(),
                    message: "more than 2^32 distinct objects".into(),
                })?;
                let pages = if how.ignore_obj_size { 1 } else { r.size.div_ceil(PAGE as u32).max(1) };
                rows.push((o, 0, pages, false));
            }
        }
        if rows.is_empty() {
            return Err(LabError::Trace {
                path: path.to_string(),
                message: "the trace has no requests".into(),
            });
        }
        Ok(Trace { rows, objects: ids.0.len() as u32 })
    }
}

fn too_long(path: &str, max: u64) -> LabError {
    LabError::Trace {
        path: path.to_string(),
        message: format!("more than max_requests = {max} requests (raise the workload's max_requests)"),
    }
}

/// Number of objects a workload needs (files, log, anonymous region).
pub fn objects_needed(w: &Workload, trace: Option<&Trace>) -> u64 {
    match w {
        Workload::Webserver { nfiles, .. } => nfiles + 1,
        Workload::Webproxy { nfiles, .. } | Workload::Varmail { nfiles, .. } => *nfiles,
        Workload::Videoserver { numactivevids, numpassivevids, .. } => numactivevids + numpassivevids,
        // MySQL has a heap (the buffer pool) and a data file; the other stores one of them.
        Workload::Ycsb { store: crate::scenario::StoreKind::Mysql, .. } => 2,
        Workload::Kv { .. } | Workload::Ycsb { .. } => 1,
        Workload::Trace { .. } => trace.map_or(0, |t| t.objects as u64),
    }
}

/// The roles of a workload's threads.
pub fn thread_roles(w: &Workload) -> Vec<Role> {
    match w {
        Workload::Webserver { nthreads, .. }
        | Workload::Webproxy { nthreads, .. }
        | Workload::Varmail { nthreads, .. }
        | Workload::Kv { nthreads, .. }
        | Workload::Ycsb { nthreads, .. } => vec![Role::Loop { step: 0 }; *nthreads as usize],
        Workload::Videoserver { nthreads, .. } => {
            let mut v = vec![Role::Loop { step: 0 }; *nthreads as usize];
            v.push(Role::VideoWriter { file: 0, done: 0, total: 0, step: 0 });
            v
        }
        Workload::Trace { .. } => vec![Role::Trace { row: 0 }],
    }
}
