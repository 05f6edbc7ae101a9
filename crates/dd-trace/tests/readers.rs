//! The readers against files written byte by byte in the documented layouts (not with our writer), so
//! a wrong field order or width in the reader cannot be hidden by the same mistake in the writer.

use dd_trace::{open, read_all, Format, OracleGeneralWriter, Request, TraceError, PAGE_SIZE};
use std::io::Write;

/// libCacheSim's `oracleGeneralBin.h`: `struct { uint32_t real_time; uint64_t obj_id; uint32_t obj_size;
/// int64_t next_access_vtime; }`, packed, little-endian, 24 bytes, no header.
fn libcachesim_layout(records: &[(u32, u64, u32, i64)]) -> Vec<u8> {
    let mut bytes = Vec::new();
    for &(t, id, size, next) in records {
        bytes.extend_from_slice(&t.to_le_bytes());
        bytes.extend_from_slice(&id.to_le_bytes());
        bytes.extend_from_slice(&size.to_le_bytes());
        bytes.extend_from_slice(&next.to_le_bytes());
    }
    assert_eq!(bytes.len(), records.len() * 24);
    bytes
}

fn sample_records() -> Vec<(u32, u64, u32, i64)> {
    vec![
        (0, 42, 4096, 2),
        (1, u64::MAX - 7, 1, -1),
        (1, 42, 512, -1),
        (u32::MAX, 0x0123_4567_89ab_cdef, u32::MAX, i64::MAX),
    ]
}

fn expected(records: &[(u32, u64, u32, i64)]) -> Vec<Request> {
    records
        .iter()
        .map(|&(t, id, size, next)| Request { time: t as u64, id, size, next_access_vtime: next })
        .collect()
}

#[test]
fn oracle_general_reader_reads_libcachesim_layout_plain() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.oracleGeneral.bin");
    std::fs::write(&path, libcachesim_layout(&sample_records())).unwrap();
    let mut r = open(&path, &Format::OracleGeneral).unwrap();
    assert_eq!(read_all(r.as_mut()).unwrap(), expected(&sample_records()));
    assert_eq!(r.bytes_read(), 96);
    assert_eq!(r.total_bytes(), Some(96));
}

#[test]
fn oracle_general_reader_reads_libcachesim_layout_zstd_multi_frame() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.oracleGeneral.zst");
    let recs = sample_records();
    // Two concatenated frames, as `zstd a b > c` or a streaming writer that flushed a frame produces.
    let mut bytes = zstd::encode_all(&libcachesim_layout(&recs[..2])[..], 3).unwrap();
    bytes.extend(zstd::encode_all(&libcachesim_layout(&recs[2..])[..], 19).unwrap());
    std::fs::write(&path, bytes).unwrap();
    let mut r = open(&path, &Format::OracleGeneral).unwrap();
    assert_eq!(read_all(r.as_mut()).unwrap(), expected(&recs));
}

#[test]
fn oracle_general_reader_batches_across_many_records() {
    let recs: Vec<_> = (0..100_003u64).map(|i| (i as u32, i * 7 % 1000, 4096, -1)).collect();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("big.bin");
    std::fs::write(&path, libcachesim_layout(&recs)).unwrap();
    let mut r = open(&path, &Format::OracleGeneral).unwrap();
    let mut out = Vec::new();
    let mut batches = 0;
    loop {
        let n = r.read_batch(&mut out, 4096).unwrap();
        if n == 0 {
            break;
        }
        assert!(n <= 4096);
        batches += 1;
    }
    assert_eq!(batches, 100_003usize.div_ceil(4096));
    assert_eq!(out, expected(&recs));
}

#[test]
fn oracle_general_truncated_file_is_an_error_not_a_shorter_trace() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("cut.bin");
    let mut bytes = libcachesim_layout(&sample_records());
    bytes.truncate(bytes.len() - 5);
    std::fs::write(&path, bytes).unwrap();
    let mut r = open(&path, &Format::OracleGeneral).unwrap();
    let err = read_all(r.as_mut()).unwrap_err();
    assert!(matches!(err, TraceError::Truncated { bytes: 19, .. }), "{err}");
}

#[test]
fn oracle_general_corrupt_zstd_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bad.zst");
    let mut bytes = zstd::encode_all(&libcachesim_layout(&sample_records())[..], 3).unwrap();
    let n = bytes.len();
    bytes[n / 2] ^= 0xff;
    bytes.truncate(n - 3);
    std::fs::write(&path, bytes).unwrap();
    let mut r = open(&path, &Format::OracleGeneral).unwrap();
    assert!(read_all(r.as_mut()).is_err());
}

#[test]
fn oracle_general_writer_round_trips_through_the_reader() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("w.bin");
    let mut w = OracleGeneralWriter::new(std::fs::File::create(&path).unwrap());
    let reqs = expected(&sample_records());
    for r in &reqs {
        w.write(r).unwrap();
    }
    w.finish().unwrap();
    assert_eq!(std::fs::read(&path).unwrap(), libcachesim_layout(&sample_records()));
}

#[test]
fn csv_reader_skips_the_header_and_reads_the_named_column() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.csv");
    let mut f = std::fs::File::create(&path).unwrap();
    writeln!(f, "time,page,op").unwrap();
    writeln!(f, "1,17,r").unwrap();
    writeln!(f, "2,0x10,w").unwrap();
    writeln!(f, "3,/var/lib/file-a,r").unwrap();
    writeln!(f, "4,17,r").unwrap();
    writeln!(f, "5,/var/lib/file-a,r").unwrap();
    drop(f);
    let mut r = open(&path, &Format::Csv { column: 2 }).unwrap();
    let got = read_all(r.as_mut()).unwrap();
    let ids: Vec<u64> = got.iter().map(|r| r.id).collect();
    assert_eq!(ids[..2], [17, 16]);
    assert_eq!(ids[2], ids[4], "equal text, equal id");
    assert_eq!(ids[1..], [16, ids[2], 17, ids[2]]);
    assert!(got.iter().all(|r| r.size == PAGE_SIZE));
    assert_eq!(got.iter().map(|r| r.time).collect::<Vec<_>>(), [0, 1, 2, 3, 4]);
}

#[test]
fn csv_reader_reports_a_missing_column_with_its_line() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.csv");
    std::fs::write(&path, "a,b\n1,2\n3\n").unwrap();
    let mut r = open(&path, &Format::Csv { column: 2 }).unwrap();
    let err = read_all(r.as_mut()).unwrap_err();
    assert!(matches!(err, TraceError::Csv { line: 3, .. }), "{err}");
    assert!(open(&path, &Format::Csv { column: 0 }).is_err());
}

#[test]
fn format_guess_follows_the_extension() {
    use std::path::Path;
    assert_eq!(Format::guess(Path::new("a/b.CSV")), Format::Csv { column: 1 });
    assert_eq!(Format::guess(Path::new("a/b.oracleGeneral.zst")), Format::OracleGeneral);
}

/// What the `trace_reader` fuzz target checks, over seeded random inputs (so `./scripts/test` covers
/// it on machines without cargo-fuzz): no panic, and plain oracle-general streams decode record for
/// record or report the stray bytes.
#[test]
fn readers_survive_random_bytes() {
    use dd_trace::{CsvReader, OracleGeneralReader, Source, ORACLE_GENERAL_RECORD_BYTES};
    let mut x = 0x2545_f491_4f6c_dd1du64;
    let mut next = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    for case in 0..3000 {
        let len = (next() % 400) as usize;
        let mut data: Vec<u8> = (0..len).map(|_| next() as u8).collect();
        match case % 4 {
            0 if len >= 4 => data[..4].copy_from_slice(&[0x28, 0xb5, 0x2f, 0xfd]), // zstd magic, garbage after
            1 => data.iter_mut().for_each(|b| *b = b",\n0123456789xa\"\r"[*b as usize % 16]), // CSV-ish
            _ => {}
        }
        let src = |d: &Vec<u8>| Source::from_reader("random", std::io::Cursor::new(d.clone()), None);
        let mut og = OracleGeneralReader::new(src(&data)).unwrap();
        let compressed = og.is_compressed();
        match read_all(&mut og) {
            Ok(r) if !compressed => assert_eq!(r.len() * ORACLE_GENERAL_RECORD_BYTES, data.len()),
            Err(TraceError::Truncated { bytes, .. }) => {
                assert_eq!(bytes, data.len() % ORACLE_GENERAL_RECORD_BYTES)
            }
            _ => {}
        }
        for column in 1..=3 {
            let _ = read_all(&mut CsvReader::new(src(&data), column).unwrap());
        }
    }
}

/// A trace in memory (`Source::from_bytes`, no stream buffer) reads exactly as the same bytes through a
/// stream: plain and zstd oracle-general and CSV, in batches of any size, with every byte counted.
#[test]
fn a_trace_in_memory_reads_as_the_same_bytes_streamed() {
    use dd_trace::{CsvReader, OracleGeneralReader, Source, TraceReader};
    let plain = libcachesim_layout(&sample_records());
    let zst = zstd::encode_all(&plain[..], 3).unwrap();
    let csv = b"time,page\n1,17\n2,0x10\n3,/var/lib/file-a\n".to_vec();
    let streamed = |d: &[u8]| Source::from_reader("s", std::io::Cursor::new(d.to_vec()), None);
    let in_memory = |d: &[u8]| Source::from_bytes("m", d.to_vec());
    for data in [&plain, &zst] {
        let mut a = OracleGeneralReader::new(streamed(data)).unwrap();
        let mut b = OracleGeneralReader::new(in_memory(data)).unwrap();
        let want = read_all(&mut a).unwrap();
        let mut got = Vec::new();
        while b.read_batch(&mut got, 1).unwrap() > 0 {}
        assert_eq!(got, want);
        assert_eq!(want, expected(&sample_records()));
        assert_eq!((b.bytes_read(), b.total_bytes()), (data.len() as u64, Some(data.len() as u64)));
    }
    let want = read_all(&mut CsvReader::new(streamed(&csv), 2).unwrap()).unwrap();
    let mut b = CsvReader::new(in_memory(&csv), 2).unwrap();
    assert_eq!(read_all(&mut b).unwrap(), want);
    assert_eq!(want.len(), 3);
    assert_eq!(b.bytes_read(), csv.len() as u64);
}
