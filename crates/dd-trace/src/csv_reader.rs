//! CSV traces: one column of page or object ids, a header line first.
//!
//! Ids are unsigned decimal or `0x` hex integers, used as they are; anything else (a path, a UUID) is
//! hashed with xxh3-64, so two rows name the same page exactly when their text is equal. Rows may have
//! different numbers of columns (`flexible`), but each must reach the id column.

use crate::{Request, Source, TraceError, TraceReader, PAGE_SIZE};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// Reads the ids of one column of a CSV file.
pub struct CsvReader {
    name: String,
    reader: csv::Reader<Box<dyn std::io::Read + Send>>,
    column: usize,
    record: csv::ByteRecord,
    row: u64,
    counter: Arc<AtomicU64>,
    total: Option<u64>,
}

impl CsvReader {
    /// `column` is 1-based (as `cut -f` counts).
    pub fn new(source: Source, column: usize) -> Result<Self, TraceError> {
        if column == 0 {
            return Err(TraceError::Invalid { field: "column", message: "columns count from 1".into() });
        }
        let Source { name, inner, counter, total } = source;
        let reader = csv::ReaderBuilder::new().has_headers(true).flexible(true).from_reader(inner);
        Ok(CsvReader { name, reader, column, record: csv::ByteRecord::new(), row: 0, counter, total })
    }
}

/// The id a CSV field names (see the module comment).
pub fn parse_id(field: &[u8]) -> u64 {
    let text = std::str::from_utf8(field).map(str::trim).unwrap_or("");
    if let Ok(v) = text.parse::<u64>() {
        return v;
    }
    if let Some(hex) = text.strip_prefix("0x").or_else(|| text.strip_prefix("0X")) {
        if let Ok(v) = u64::from_str_radix(hex, 16) {
            return v;
        }
    }
    xxhash_rust::xxh3::xxh3_64(field)
}

impl TraceReader for CsvReader {
    fn read_batch(&mut self, out: &mut Vec<Request>, max: usize) -> Result<usize, TraceError> {
        let mut n = 0;
        while n < max.max(1) {
            let more = self.reader.read_byte_record(&mut self.record).map_err(|e| {
                let line = e.position().map_or(self.row + 2, |p| p.line());
                match e.into_kind() {
                    csv::ErrorKind::Io(source) => TraceError::Io { path: self.name.clone(), source },
                    other => TraceError::Csv { path: self.name.clone(), line, message: format!("{other:?}") },
                }
            })?;
            if !more {
                break;
            }
            let line = self.record.position().map_or(self.row + 2, |p| p.line());
            let field = self.record.get(self.column - 1).ok_or_else(|| TraceError::Csv {
                path: self.name.clone(),
                line,
                message: format!("no column {} (the row has {})", self.column, self.record.len()),
            })?;
            if field.iter().all(u8::is_ascii_whitespace) {
                return Err(TraceError::Csv { path: self.name.clone(), line, message: "empty id".into() });
            }
            out.push(Request { time: self.row, id: parse_id(field), size: PAGE_SIZE, next_access_vtime: -1 });
            self.row += 1;
            n += 1;
        }
        Ok(n)
    }

    fn bytes_read(&self) -> u64 {
        self.counter.load(Ordering::Relaxed)
    }

    fn total_bytes(&self) -> Option<u64> {
        self.total
    }
}
