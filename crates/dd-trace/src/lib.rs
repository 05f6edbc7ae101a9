//! Reference traces from files: what `doubledecker mrc` reads today and what the lab will replay.
//!
//! Two formats:
//! * **CSV**: one column of page or object ids (`Format::Csv { column }`, 1-based like `cut -f`), the
//!   first line a header that is always skipped. Ids that parse as unsigned decimal (or `0x` hex) are
//!   used as they are; any other text is hashed to 64 bits with xxh3, so string ids work too. Every
//!   CSV request is one 4 KiB page (`PAGE_SIZE`).
//! * **oracle-general**: libCacheSim's binary format, the one its published traces use. Each request is
//!   a packed little-endian 24-byte record `{u32 clock_time; u64 obj_id; u32 obj_size; i64
//!   next_access_vtime}` (`-1` for "never again"); the file is plain or one or more zstd frames, told
//!   apart by the zstd magic number at the start, not by the file name.
//!
//! Readers hand out requests in batches ([`TraceReader::read_batch`]): per-request virtual calls would
//! cost more than the miss-ratio-curve work done per request (SHARDS at 1% sampling is a hash and a
//! compare), and a batch is where progress is reported ([`TraceReader::bytes_read`] counts bytes of the
//! *file*, compressed or not, so a progress bar can run against the file's length).
//!
//! Invariant: a reader never returns a partial record; a file that ends inside one is an error
//! ([`TraceError::Truncated`]), never a silently shortened trace.
//!
//! Why a crate of its own: the miss-ratio curves (`dd-mrc`) read traces, and so will the lab's trace
//! replay; neither should depend on the other for it, and the readers are decoders that the fuzz target
//! `trace_reader` drives without anything else.
#![forbid(unsafe_code)] // nothing here needs it: unsafe code lives in dd-engine, dd-fuse, dd-memctl and the few FFI calls of the other crates

mod csv_reader;
mod oracle;

pub use csv_reader::CsvReader;
pub use oracle::{OracleGeneralReader, OracleGeneralWriter, ORACLE_GENERAL_RECORD_BYTES};

use std::fs::File;
use std::io::{self, BufReader, Read};
use std::path::Path;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use thiserror::Error;

/// Bytes of one page: the size of every CSV request.
pub const PAGE_SIZE: u32 = 4096;

/// A batch size that amortises the per-batch work well (about 0.5-1 ms of SHARDS work).
pub const DEFAULT_BATCH: usize = 16 * 1024;

/// One reference of a trace.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Request {
    /// The trace's clock (oracle-general `clock_time`, seconds); the row number for CSV.
    pub time: u64,
    /// Page or object id.
    pub id: u64,
    /// Object size in bytes (`PAGE_SIZE` for CSV).
    pub size: u32,
    /// Index of the next request to the same id (oracle-general), `-1` when there is none or unknown.
    pub next_access_vtime: i64,
}

/// A trace file's format.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Format {
    /// Comma-separated text; `column` is the 1-based column of the ids; the first line is a header.
    Csv { column: usize },
    /// libCacheSim's oracle-general binary records, plain or zstd-compressed.
    OracleGeneral,
}

impl Format {
    /// The format a path's name suggests: a `.csv` file is CSV with ids in column 1, anything else
    /// oracle-general.
    pub fn guess(path: &Path) -> Format {
        match path.extension().and_then(|e| e.to_str()) {
            Some(e) if e.eq_ignore_ascii_case("csv") => Format::Csv { column: 1 },
            _ => Format::OracleGeneral,
        }
    }
}

/// Errors of the trace readers. Stable codes: [`TraceError::code_name`].
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum TraceError {
    #[error("i/o on {path}: {source}")]
    Io { path: String, source: io::Error },
    /// The file ends in the middle of a record.
    #[error("{path}: ends inside a record ({bytes} stray bytes after the last whole record)")]
    Truncated { path: String, bytes: usize },
    /// A CSV line has fewer columns than the one asked for, or an empty id.
    #[error("{path}: line {line}: {message}")]
    Csv { path: String, line: u64, message: String },
    /// A zstd stream that does not decode.
    #[error("{path}: zstd: {message}")]
    Zstd { path: String, message: String },
    /// A parameter the reader cannot work with (`field` names it).
    #[error("`{field}`: {message}")]
    Invalid { field: &'static str, message: String },
}

impl TraceError {
    /// A stable name for scripts and logs.
    pub fn code_name(&self) -> &'static str {
        match self {
            TraceError::Io { .. } => "io",
            TraceError::Truncated { .. } => "truncated",
            TraceError::Csv { .. } => "csv",
            TraceError::Zstd { .. } => "zstd",
            TraceError::Invalid { .. } => "invalid",
        }
    }
}

/// A source of requests read in batches.
pub trait TraceReader: Send {
    /// Appends up to `max` requests to `out` (which it does not clear) and returns how many; 0 means
    /// the trace has ended.
    fn read_batch(&mut self, out: &mut Vec<Request>, max: usize) -> Result<usize, TraceError>;

    /// Bytes of the underlying file consumed so far (compressed bytes for a zstd file).
    fn bytes_read(&self) -> u64;

    /// The underlying file's length, when known (for progress bars).
    fn total_bytes(&self) -> Option<u64>;
}

/// Opens `path` in `format`.
pub fn open(path: &Path, format: &Format) -> Result<Box<dyn TraceReader>, TraceError> {
    let source = Source::open(path)?;
    Ok(match format {
        Format::Csv { column } => Box::new(CsvReader::new(source, *column)?),
        Format::OracleGeneral => Box::new(OracleGeneralReader::new(source)?),
    })
}

/// Reads every request of a trace into memory (tests and small traces).
pub fn read_all(reader: &mut dyn TraceReader) -> Result<Vec<Request>, TraceError> {
    let mut all = Vec::new();
    while reader.read_batch(&mut all, DEFAULT_BATCH)? > 0 {}
    Ok(all)
}

/// A file (or any byte stream) being read, with a shared count of the bytes taken from it.
pub struct Source {
    pub(crate) name: String,
    pub(crate) inner: Box<dyn Read + Send>,
    pub(crate) counter: Arc<AtomicU64>,
    pub(crate) total: Option<u64>,
}

impl Source {
    /// Opens a file, for any reader of this crate.
    pub fn open(path: &Path) -> Result<Source, TraceError> {
        let name = path.display().to_string();
        let file = File::open(path).map_err(|source| TraceError::Io { path: name.clone(), source })?;
        let total = file.metadata().ok().map(|m| m.len());
        Ok(Source::from_reader(name, file, total))
    }

    /// A trace already in memory: read as it is, without the stream buffer of [`Source::from_reader`]
    /// (1 MiB, zeroed at every source: the `trace_reader` fuzz target made four sources per input and
    /// spent two thirds of its time there).
    pub fn from_bytes(name: impl Into<String>, bytes: Vec<u8>) -> Source {
        let counter = Arc::new(AtomicU64::new(0));
        let total = Some(bytes.len() as u64);
        let counted = Counted { inner: std::io::Cursor::new(bytes), counter: counter.clone() };
        Source { name: name.into(), inner: Box::new(counted), counter, total }
    }

    /// Wraps any stream (`name` is used in error messages).
    pub fn from_reader(
        name: impl Into<String>,
        reader: impl Read + Send + 'static,
        total: Option<u64>,
    ) -> Source {
        let counter = Arc::new(AtomicU64::new(0));
        let counted = Counted { inner: reader, counter: counter.clone() };
        Source {
            name: name.into(),
            inner: Box::new(BufReader::with_capacity(1 << 20, counted)),
            counter,
            total,
        }
    }

    pub(crate) fn io_error(&self, source: io::Error) -> TraceError {
        TraceError::Io { path: self.name.clone(), source }
    }
}

/// Counts the bytes read from the file itself (beneath buffering and decompression).
struct Counted<R> {
    inner: R,
    counter: Arc<AtomicU64>,
}

impl<R: Read> Read for Counted<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.counter.fetch_add(n as u64, std::sync::atomic::Ordering::Relaxed);
        Ok(n)
    }
}

/// Fills `buf` as far as the stream allows; returns the bytes read (short only at the end).
pub(crate) fn read_full(r: &mut dyn Read, buf: &mut [u8]) -> io::Result<usize> {
    let mut filled = 0;
    while filled < buf.len() {
        match r.read(&mut buf[filled..]) {
            Ok(0) => break,
            Ok(n) => filled += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(filled)
}
