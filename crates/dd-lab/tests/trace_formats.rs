//! Trace replay from libCacheSim's oracle-general format (issue 16, item 4): the same requests as a
//! block-trace CSV, a plain oracle-general file and a zstd-compressed one give the same run, request
//! for request; `ignore_obj_size` reads one page per request; a trace longer than `max_requests` and a
//! file cut inside a record are errors that say so.

use dd_lab::results::report;
use dd_lab::scenario::workload::{TraceFormat, Workload};
use dd_lab::{run_scenario, RunOptions, Scenario};
use dd_trace::{OracleGeneralWriter, Request};
use rand::{Rng, SeedableRng};
use std::path::Path;

/// 3,000 requests over 400 objects of 1 byte to 20 KiB, skewed towards a hot fifth.
fn requests() -> Vec<Request> {
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(7);
    let sizes: Vec<u32> = (0..400).map(|_| rng.gen_range(1..20_000)).collect();
    (0..3000u64)
        .map(|t| {
            let o = if rng.gen::<f64>() < 0.7 { rng.gen_range(0..80) } else { rng.gen_range(0..400) };
            Request { time: t, id: 1_000_003 * o as u64 + 17, size: sizes[o], next_access_vtime: -1 }
        })
        .collect()
}

fn write_csv(dir: &Path, name: &str, reqs: &[Request], one_page: bool) {
    let mut csv = String::from("object,index,pages,op\n");
    for r in reqs {
        let pages = if one_page { 1 } else { r.size.div_ceil(4096).max(1) };
        csv.push_str(&format!("{},0,{pages},R\n", r.id));
    }
    std::fs::write(dir.join(name), csv).unwrap();
}

fn write_oracle(dir: &Path, name: &str, reqs: &[Request], zstd: bool) {
    let mut bytes = Vec::new();
    let mut w = OracleGeneralWriter::new(&mut bytes);
    for r in reqs {
        w.write(r).unwrap();
    }
    w.finish().unwrap();
    let bytes = if zstd { zstd::encode_all(&bytes[..], 3).unwrap() } else { bytes };
    std::fs::write(dir.join(name), bytes).unwrap();
}

/// A 128-page plain-LRU guest with 2 MiB of memory store behind it, replaying `path` once.
fn scenario(path: &str, format: TraceFormat, ignore_obj_size: bool, max_requests: u64) -> Scenario {
    let mut sc = Scenario::trace_replay(path, 128, 2.0, 100_000.0);
    sc.sample_interval_s = 1000.0;
    sc.vms[0].containers[0].workload =
        Workload::Trace { path: path.into(), repeat: false, format, ignore_obj_size, max_requests };
    sc
}

fn run(dir: &Path, sc: &Scenario) -> Result<(u64, u64, String), dd_lab::LabError> {
    let opts = RunOptions { base_dir: Some(dir.to_path_buf()), ..Default::default() };
    let res = run_scenario(sc, &opts, &mut |_, _| {})?;
    let t = &res.runs[0].totals[0];
    Ok((t.pc_hits, t.pc_misses, report::timeseries_csv(&res).unwrap()))
}

#[test]
fn oracle_general_plain_and_zstd_replay_as_the_same_block_trace() {
    let dir = tempfile::tempdir().unwrap();
    let reqs = requests();
    write_csv(dir.path(), "t.csv", &reqs, false);
    write_csv(dir.path(), "t1.csv", &reqs, true);
    write_oracle(dir.path(), "t.oracleGeneral.bin", &reqs, false);
    write_oracle(dir.path(), "t.oracleGeneral.bin.zst", &reqs, true);
    let csv = run(dir.path(), &scenario("t.csv", TraceFormat::BlockCsv, false, 1 << 20)).unwrap();
    let pages: u64 = reqs.iter().map(|r| r.size.div_ceil(4096).max(1) as u64).sum();
    assert_eq!(csv.0 + csv.1, pages, "every page of every request was read once");
    assert!(csv.0 > 0 && csv.1 > 0, "the guest both hit and missed: {csv:?}");
    for f in ["t.oracleGeneral.bin", "t.oracleGeneral.bin.zst"] {
        let og = run(dir.path(), &scenario(f, TraceFormat::OracleGeneral, false, 1 << 20)).unwrap();
        assert!(og == csv, "{f} replayed differently from the same requests as CSV");
    }
    let one = run(dir.path(), &scenario("t1.csv", TraceFormat::BlockCsv, false, 1 << 20)).unwrap();
    let og1 =
        run(dir.path(), &scenario("t.oracleGeneral.bin.zst", TraceFormat::OracleGeneral, true, 1 << 20));
    assert!(og1.unwrap() == one, "ignore_obj_size did not read one page per request");
    assert_eq!(one.0 + one.1, reqs.len() as u64);
}

#[test]
fn a_trace_over_max_requests_or_cut_inside_a_record_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let reqs = requests();
    write_oracle(dir.path(), "t.bin", &reqs, false);
    let e = run(dir.path(), &scenario("t.bin", TraceFormat::OracleGeneral, false, 2999)).unwrap_err();
    assert!(e.to_string().contains("max_requests = 2999"), "{e}");
    write_csv(dir.path(), "t.csv", &reqs, false);
    let e = run(dir.path(), &scenario("t.csv", TraceFormat::BlockCsv, false, 100)).unwrap_err();
    assert!(e.to_string().contains("max_requests = 100"), "{e}");
    let mut cut = std::fs::read(dir.path().join("t.bin")).unwrap();
    cut.truncate(cut.len() - 5);
    std::fs::write(dir.path().join("cut.bin"), cut).unwrap();
    let e = run(dir.path(), &scenario("cut.bin", TraceFormat::OracleGeneral, false, 1 << 20)).unwrap_err();
    assert!(e.to_string().contains("ends inside a record"), "{e}");
}
