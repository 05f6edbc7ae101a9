//! The `workload` table of a container: the Filebench personalities, the anonymous-memory key-value
//! store, YCSB against a Redis-, MongoDB- or MySQL-like store, and trace replay, each with its published
//! defaults; their validation and scaling. Only the settings live here: what a workload does is
//! `crate::model` (`model::workload`, `model::kvstore`, `model::ycsb`).

use super::d_one;
use crate::error::LabError;
use serde::{Deserialize, Serialize};

/// The file format of a `trace` workload.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum TraceFormat {
    /// Text with a header line, `object,index,pages,op` (op `R` or `W`).
    #[default]
    BlockCsv,
    /// libCacheSim's oracle-general binary records, plain or zstd-compressed (`dd_trace`): each request
    /// reads its object from page 0, `ceil(obj_size / 4 KiB)` pages (one with `ignore_obj_size`).
    OracleGeneral,
}

/// Which store a YCSB workload runs against.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum StoreKind {
    Redis,
    Mongo,
    Mysql,
}

/// The six core workloads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum YcsbWorkload {
    A,
    B,
    C,
    D,
    E,
    F,
}

/// File selection of a Filebench fileset.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Selection {
    /// Uniformly random file (Filebench's default pick).
    #[default]
    Random,
    /// A cursor walks the fileset in order and wraps (Filebench's in-order selection).
    InOrder,
}

/// A workload with its published defaults; every size field is scaled by `scale`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "lowercase", deny_unknown_fields)]
pub enum Workload {
    /// Filebench webserver: 10 x (open, read whole file, close), then append to a shared log.
    Webserver {
        #[serde(default = "d_1000")]
        nfiles: u64,
        #[serde(default = "d_16k")]
        filesize_kib: f64,
        #[serde(default = "d_100")]
        nthreads: u32,
        #[serde(default = "d_16k")]
        appendsize_kib: f64,
        #[serde(default)]
        selection: Selection,
    },
    /// Filebench webproxy: delete, create, append, close, then 5 x (open, read whole file, close).
    Webproxy {
        #[serde(default = "d_10000")]
        nfiles: u64,
        #[serde(default = "d_16k")]
        filesize_kib: f64,
        #[serde(default = "d_100")]
        nthreads: u32,
        #[serde(default = "d_16k")]
        appendsize_kib: f64,
        #[serde(default)]
        selection: Selection,
    },
    /// Filebench varmail: delete, create, append, fsync, close, open, read, append, fsync, close, open,
    /// read, close.
    Varmail {
        #[serde(default = "d_1000")]
        nfiles: u64,
        #[serde(default = "d_16k")]
        filesize_kib: f64,
        #[serde(default = "d_16")]
        nthreads: u32,
        #[serde(default = "d_16k")]
        appendsize_kib: f64,
        #[serde(default)]
        selection: Selection,
    },
    /// Filebench videoserver: readers stream active videos in `readiosize` chunks; one writer rewrites
    /// a passive video whole, then waits `repint_s`.
    Videoserver {
        #[serde(default = "d_32")]
        numactivevids: u64,
        #[serde(default = "d_194")]
        numpassivevids: u64,
        /// Default 10 GiB (Filebench's 10g).
        #[serde(default = "d_10g")]
        filesize_mib: f64,
        #[serde(default = "d_48")]
        nthreads: u32,
        #[serde(default = "d_256")]
        readiosize_kib: f64,
        #[serde(default = "d_1024")]
        writeiosize_kib: f64,
        #[serde(default = "d_10")]
        repint_s: f64,
        /// The readers' `bwlimit`, MiB/s (0: unlimited). Default 0.
        #[serde(default)]
        read_limit_mib_s: f64,
        #[serde(default)]
        selection: Selection,
    },
    /// An in-memory key-value store (Redis-like): random 4 KiB accesses to anonymous memory.
    Kv {
        /// Resident data, MiB.
        dataset_mib: f64,
        #[serde(default = "d_1")]
        nthreads: u32,
        /// Fraction of accesses that write. Default 0.5 (YCSB A).
        #[serde(default = "d_half")]
        write_fraction: f64,
    },
    /// A YCSB client (`workload`: a..f) against an emulated store: `redis` keeps the records in
    /// anonymous memory (swapped out on reclaim, faulted back on access), `mongo` in an mmap'd file
    /// (file pages through the page cache and the container's cleancache pool).
    Ycsb {
        store: StoreKind,
        workload: YcsbWorkload,
        /// Records loaded before the run (YCSB `recordcount`); scaled. Default 1000.
        #[serde(default = "d_1000")]
        record_count: u64,
        /// Bytes of one record in memory, KiB. Default 1 (YCSB's 10 fields of 100 bytes).
        #[serde(default = "d_one")]
        record_kib: f64,
        #[serde(default = "d_1")]
        nthreads: u32,
        /// Request rate of the client (YCSB `-target`), operations/s; 0 (default) runs closed-loop.
        #[serde(default)]
        target_ops_s: f64,
        /// `mysql` only: the buffer pool (`innodb_buffer_pool_size`), MiB; scaled. Default 128.
        #[serde(default = "d_pool")]
        buffer_pool_mib: f64,
        /// `mysql` only: the tablespace page size (`innodb_page_size`), KiB. Default 16.
        #[serde(default = "d_16k")]
        page_kib: f64,
        /// `mongo` and `mysql`: the load phase ran before the run, so the records start in the data file
        /// on the disk with nothing cached (read in as they are used), and the run is the workload's
        /// mix from the start. Default false (the run begins with the load phase).
        #[serde(default)]
        preload: bool,
    },
    /// Replay of a trace (`format`: a block-trace CSV or libCacheSim's oracle-general binary), as fast
    /// as the modelled latencies allow, looping at the end with `repeat`. The path is relative to the
    /// scenario file. The requests are held in memory (16 bytes each), at most `max_requests`.
    Trace {
        path: String,
        #[serde(default)]
        repeat: bool,
        #[serde(default)]
        format: TraceFormat,
        /// `oracle-general` only: every request reads one page, whatever its object's size
        /// (libCacheSim's `--ignore-obj-size`). Default false.
        #[serde(default)]
        ignore_obj_size: bool,
        /// Requests loaded at most; a longer trace is an error naming this field. Default 5,000,000.
        /// The memory plan counts 48 bytes for each (a row, and the object map while loading).
        #[serde(default = "d_trace_max_requests")]
        max_requests: u64,
    },
}

fn d_trace_max_requests() -> u64 {
    5_000_000
}
fn d_1() -> u32 {
    1
}
fn d_16() -> u32 {
    16
}
fn d_32() -> u64 {
    32
}
fn d_48() -> u32 {
    48
}
fn d_100() -> u32 {
    100
}
fn d_194() -> u64 {
    194
}
fn d_1000() -> u64 {
    1000
}
fn d_10000() -> u64 {
    10_000
}
fn d_16k() -> f64 {
    16.0
}
fn d_256() -> f64 {
    256.0
}
fn d_1024() -> f64 {
    1024.0
}
fn d_10g() -> f64 {
    10240.0
}
fn d_10() -> f64 {
    10.0
}
fn d_half() -> f64 {
    0.5
}
fn d_pool() -> f64 {
    128.0
}

/// File counts scale (the file set shrinks, file sizes stay, so per-operation costs are unchanged);
/// videos have no useful count to scale, so their size scales instead.
pub(super) fn scale_workload(w: &mut Workload, k: f64) {
    let n = |v: &mut u64| *v = ((*v as f64 * k).round() as u64).max(1);
    match w {
        Workload::Webserver { nfiles, .. }
        | Workload::Webproxy { nfiles, .. }
        | Workload::Varmail { nfiles, .. } => n(nfiles),
        Workload::Videoserver { filesize_mib, repint_s, .. } => {
            *filesize_mib *= k;
            *repint_s *= k;
        }
        Workload::Kv { dataset_mib, .. } => *dataset_mib *= k,
        Workload::Ycsb { record_count, buffer_pool_mib, .. } => {
            n(record_count);
            *buffer_pool_mib *= k;
        }
        Workload::Trace { .. } => {}
    }
}

pub(super) fn validate_workload(w: &Workload, p: &str) -> Result<(), LabError> {
    let pos = |v: f64, f: &str| -> Result<(), LabError> {
        if v.is_finite() && v > 0.0 {
            Ok(())
        } else {
            Err(LabError::invalid(&format!("{p}.{f}"), "must be positive"))
        }
    };
    let thr = |t: u32| -> Result<(), LabError> {
        if (1..=4096).contains(&t) {
            Ok(())
        } else {
            Err(LabError::invalid(&format!("{p}.nthreads"), "must be in 1..=4096"))
        }
    };
    match w {
        Workload::Webserver { nfiles, filesize_kib, nthreads, appendsize_kib, .. }
        | Workload::Webproxy { nfiles, filesize_kib, nthreads, appendsize_kib, .. }
        | Workload::Varmail { nfiles, filesize_kib, nthreads, appendsize_kib, .. } => {
            if *nfiles == 0 || *nfiles > (1 << 22) {
                return Err(LabError::invalid(&format!("{p}.nfiles"), "must be in 1..=4194304"));
            }
            pos(*filesize_kib, "filesize_kib")?;
            pos(*appendsize_kib, "appendsize_kib")?;
            thr(*nthreads)
        }
        Workload::Videoserver {
            numactivevids,
            numpassivevids,
            filesize_mib,
            nthreads,
            readiosize_kib,
            writeiosize_kib,
            repint_s,
            read_limit_mib_s,
            ..
        } => {
            if *numactivevids == 0 || *numactivevids > 100_000 {
                return Err(LabError::invalid(&format!("{p}.numactivevids"), "must be in 1..=100000"));
            }
            if *numpassivevids == 0 || *numpassivevids > 100_000 {
                return Err(LabError::invalid(&format!("{p}.numpassivevids"), "must be in 1..=100000"));
            }
            pos(*filesize_mib, "filesize_mib")?;
            pos(*readiosize_kib, "readiosize_kib")?;
            pos(*writeiosize_kib, "writeiosize_kib")?;
            if !(read_limit_mib_s.is_finite() && *read_limit_mib_s >= 0.0) {
                return Err(LabError::invalid(&format!("{p}.read_limit_mib_s"), "must be non-negative"));
            }
            if !(repint_s.is_finite() && *repint_s >= 0.0) {
                return Err(LabError::invalid(&format!("{p}.repint_s"), "must be non-negative"));
            }
            thr(*nthreads)
        }
        Workload::Kv { dataset_mib, nthreads, write_fraction } => {
            pos(*dataset_mib, "dataset_mib")?;
            if !(0.0..=1.0).contains(write_fraction) {
                return Err(LabError::invalid(&format!("{p}.write_fraction"), "must be in [0, 1]"));
            }
            thr(*nthreads)
        }
        Workload::Ycsb {
            store,
            record_count,
            record_kib,
            nthreads,
            target_ops_s,
            buffer_pool_mib,
            page_kib,
            preload,
            ..
        } => {
            if *preload && *store == StoreKind::Redis {
                return Err(LabError::invalid(
                    &format!("{p}.preload"),
                    "redis loads its records into memory",
                ));
            }
            if *record_count == 0 || *record_count > (1 << 30) {
                return Err(LabError::invalid(&format!("{p}.record_count"), "must be in 1..=2^30"));
            }
            pos(*record_kib, "record_kib")?;
            pos(*buffer_pool_mib, "buffer_pool_mib")?;
            if !(page_kib.is_finite() && *page_kib >= 4.0 && *page_kib <= 64.0) {
                return Err(LabError::invalid(&format!("{p}.page_kib"), "must be in [4, 64]"));
            }
            if !(target_ops_s.is_finite() && *target_ops_s >= 0.0) {
                return Err(LabError::invalid(&format!("{p}.target_ops_s"), "must be non-negative"));
            }
            thr(*nthreads)
        }
        Workload::Trace { path, max_requests, .. } => {
            if path.is_empty() {
                return Err(LabError::invalid(&format!("{p}.path"), "must not be empty"));
            }
            if *max_requests == 0 {
                return Err(LabError::invalid(&format!("{p}.max_requests"), "must be at least 1"));
            }
            Ok(())
        }
    }
}
