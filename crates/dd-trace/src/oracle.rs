//! libCacheSim's oracle-general binary trace format, plain or zstd-compressed.
//!
//! Layout (libCacheSim `traceReader/customizedReader/oracle/oracleGeneralBin.h`): packed little-endian
//! records of 24 bytes, `u32 clock_time, u64 obj_id, u32 obj_size, i64 next_access_vtime`, no header.
//! A zstd file is recognised by the zstd frame magic (`28 b5 2f fd`) at its start; concatenated frames
//! are read as one stream. A plain trace cannot start with those bytes by accident unless its first
//! `clock_time` is 4,247,762,216, which no published trace has (they start near 0).

use crate::{read_full, Request, Source, TraceError, TraceReader};
use std::io::{self, Cursor, Read, Write};

/// Bytes of one oracle-general record.
pub const ORACLE_GENERAL_RECORD_BYTES: usize = 24;

const ZSTD_MAGIC: [u8; 4] = [0x28, 0xb5, 0x2f, 0xfd];

/// Reads oracle-general records from a [`Source`].
pub struct OracleGeneralReader {
    source_name: String,
    stream: Box<dyn Read + Send>,
    counter: std::sync::Arc<std::sync::atomic::AtomicU64>,
    total: Option<u64>,
    buf: Vec<u8>,
    compressed: bool,
}

impl OracleGeneralReader {
    /// Starts reading `source`, decompressing it if it is a zstd stream.
    pub fn new(mut source: Source) -> Result<Self, TraceError> {
        let mut magic = [0u8; 4];
        let got = read_full(&mut source.inner, &mut magic).map_err(|e| source.io_error(e))?;
        let head = Cursor::new(magic[..got].to_vec());
        let Source { name, inner, counter, total } = source;
        let chained = head.chain(inner);
        let compressed = got == 4 && magic == ZSTD_MAGIC;
        let stream: Box<dyn Read + Send> = if compressed {
            let decoder = zstd::stream::read::Decoder::new(chained)
                .map_err(|e| TraceError::Zstd { path: name.clone(), message: e.to_string() })?;
            Box::new(decoder)
        } else {
            Box::new(chained)
        };
        Ok(OracleGeneralReader { source_name: name, stream, counter, total, buf: Vec::new(), compressed })
    }

    /// Whether the stream is zstd-compressed.
    pub fn is_compressed(&self) -> bool {
        self.compressed
    }

    fn error(&self, e: io::Error) -> TraceError {
        // zstd reports corrupt input as `Other` errors from inside the decoder.
        if self.compressed && e.kind() == io::ErrorKind::Other {
            TraceError::Zstd { path: self.source_name.clone(), message: e.to_string() }
        } else {
            TraceError::Io { path: self.source_name.clone(), source: e }
        }
    }
}

/// Decodes one 24-byte record.
#[inline]
pub(crate) fn decode(r: &[u8]) -> Request {
    let u32_at = |o: usize| u32::from_le_bytes(r[o..o + 4].try_into().expect("4 bytes"));
    let u64_at = |o: usize| u64::from_le_bytes(r[o..o + 8].try_into().expect("8 bytes"));
    Request { time: u32_at(0) as u64, id: u64_at(4), size: u32_at(12), next_access_vtime: u64_at(16) as i64 }
}

impl TraceReader for OracleGeneralReader {
    fn read_batch(&mut self, out: &mut Vec<Request>, max: usize) -> Result<usize, TraceError> {
        let want = max.max(1) * ORACLE_GENERAL_RECORD_BYTES;
        if self.buf.len() < want {
            self.buf.resize(want, 0);
        }
        let got = read_full(&mut self.stream, &mut self.buf[..want]).map_err(|e| self.error(e))?;
        let stray = got % ORACLE_GENERAL_RECORD_BYTES;
        if stray != 0 {
            // `read_full` is short only at the end of the stream.
            return Err(TraceError::Truncated { path: self.source_name.clone(), bytes: stray });
        }
        let n = got / ORACLE_GENERAL_RECORD_BYTES;
        out.reserve(n);
        out.extend(self.buf[..got].chunks_exact(ORACLE_GENERAL_RECORD_BYTES).map(decode));
        Ok(n)
    }

    fn bytes_read(&self) -> u64 {
        self.counter.load(std::sync::atomic::Ordering::Relaxed)
    }

    fn total_bytes(&self) -> Option<u64> {
        self.total
    }
}

/// Writes oracle-general records (wrap `inner` in a zstd encoder for a compressed trace).
pub struct OracleGeneralWriter<W: Write> {
    inner: W,
}

impl<W: Write> OracleGeneralWriter<W> {
    pub fn new(inner: W) -> Self {
        OracleGeneralWriter { inner }
    }

    /// Appends one record (`time` is truncated to the format's 32 bits).
    pub fn write(&mut self, r: &Request) -> io::Result<()> {
        let mut rec = [0u8; ORACLE_GENERAL_RECORD_BYTES];
        rec[0..4].copy_from_slice(&(r.time as u32).to_le_bytes());
        rec[4..12].copy_from_slice(&r.id.to_le_bytes());
        rec[12..16].copy_from_slice(&r.size.to_le_bytes());
        rec[16..24].copy_from_slice(&r.next_access_vtime.to_le_bytes());
        self.inner.write_all(&rec)
    }

    /// Flushes and returns the inner writer.
    pub fn finish(mut self) -> io::Result<W> {
        self.inner.flush()?;
        Ok(self.inner)
    }
}
