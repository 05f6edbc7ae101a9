//! Fuzz target: arbitrary bytes as a trace file through `dd_trace`'s readers (oracle-general, plain or
//! zstd by its magic, and CSV with the id in column 1 to 3). Nothing may panic or loop; a plain
//! oracle-general stream yields one request per whole 24-byte record, or a `Truncated` error.
//!
//! The bytes are read from memory (`Source::from_bytes`: a streamed source's 1 MiB buffer, zeroed for
//! each of the four readers, took two thirds of the time) in batches of a few records, so that the
//! readers' batch boundaries are crossed too.
#![no_main]

use dd_trace::{
    CsvReader, OracleGeneralReader, Request, Source, TraceError, TraceReader, ORACLE_GENERAL_RECORD_BYTES,
};
use libfuzzer_sys::fuzz_target;

/// Requests per `read_batch`.
const BATCH: usize = 7;

fn source(data: &[u8]) -> Source {
    Source::from_bytes("fuzz", data.to_vec())
}

/// Every request of `r`, a few at a time.
fn read_all(r: &mut dyn TraceReader) -> Result<Vec<Request>, TraceError> {
    let mut all = Vec::new();
    while r.read_batch(&mut all, BATCH)? > 0 {}
    Ok(all)
}

fuzz_target!(|data: &[u8]| {
    let mut og = OracleGeneralReader::new(source(data)).expect("opening never reads past the magic");
    let compressed = og.is_compressed();
    match read_all(&mut og) {
        Ok(reqs) if !compressed => {
            assert_eq!(data.len() % ORACLE_GENERAL_RECORD_BYTES, 0);
            assert_eq!(reqs.len(), data.len() / ORACLE_GENERAL_RECORD_BYTES);
            if let Some(first) = reqs.first() {
                assert_eq!(first.id, u64::from_le_bytes(data[4..12].try_into().unwrap()));
            }
        }
        Err(TraceError::Truncated { bytes, .. }) if !compressed => {
            assert_eq!(bytes, data.len() % ORACLE_GENERAL_RECORD_BYTES)
        }
        _ => {}
    }
    for column in 1..=3 {
        let mut csv = CsvReader::new(source(data), column).expect("a column above 0 is valid");
        let _ = read_all(&mut csv);
    }
});
