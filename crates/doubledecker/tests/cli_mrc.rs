//! `doubledecker mrc` as a user runs it: the JSON document issue 14 specifies, CSV and oracle-general
//! (plain and zstd) traces giving the same curve, the plot file, the default sampling (issue 27), and
//! flag combinations that make no sense refused with a message.

use std::io::Write;
use std::path::Path;
use std::process::Command;

fn mrc(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_doubledecker")).arg("mrc").args(args).output().unwrap()
}

fn json(args: &[&str]) -> serde_json::Value {
    let out = mrc(args);
    assert!(out.status.success(), "{args:?}: {}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap()
}

/// A loop over 50 pages, 20 times, then 100 fresh pages: known exact LRU misses at every size.
fn ids() -> Vec<u64> {
    (0..1000).map(|i| i % 50).chain(1000..1100).collect()
}

fn write_oracle(path: &Path, compress: bool) {
    let mut bytes = Vec::new();
    for (t, id) in ids().into_iter().enumerate() {
        bytes.extend_from_slice(&(t as u32).to_le_bytes());
        bytes.extend_from_slice(&(id * 7919).to_le_bytes());
        bytes.extend_from_slice(&4096u32.to_le_bytes());
        bytes.extend_from_slice(&(-1i64).to_le_bytes());
    }
    if compress {
        bytes = zstd_encode(&bytes);
    }
    std::fs::write(path, bytes).unwrap();
}

fn zstd_encode(bytes: &[u8]) -> Vec<u8> {
    // The library, not the zstd command line, which is not on every machine.
    zstd::encode_all(bytes, 3).unwrap()
}

#[test]
fn mrc_json_has_the_issue_shape_and_the_exact_values() {
    let dir = tempfile::tempdir().unwrap();
    let bin = dir.path().join("t.oracleGeneral.bin");
    write_oracle(&bin, false);
    let v = json(&["--trace", bin.to_str().unwrap(), "--method", "exact", "--sizes", "49,50,200", "--json"]);
    let keys: Vec<&str> = v.as_object().unwrap().keys().map(|k| k.as_str()).collect();
    let mut want =
        vec!["method", "policy", "requests", "unique", "sampling_rate", "sizes_pages", "miss_ratio"];
    want.sort_unstable();
    let mut got = keys.clone();
    got.sort_unstable();
    assert_eq!(got, want);
    assert_eq!(v["method"], "exact");
    assert_eq!(v["policy"], "lru");
    assert_eq!(v["requests"], 1100);
    assert_eq!(v["unique"], 150);
    assert_eq!(v["sampling_rate"], 1.0);
    assert_eq!(v["sizes_pages"], serde_json::json!([49, 50, 200]));
    // LRU below the loop's size misses everything; at 50 only the 50 + 100 first references miss.
    assert_eq!(v["miss_ratio"][0], 1.0);
    let at50 = v["miss_ratio"][1].as_f64().unwrap();
    assert!((at50 - 150.0 / 1100.0).abs() < 1e-12, "{at50}");
}

#[test]
fn mrc_reads_csv_plain_and_zstd_traces_alike_and_plots() {
    let dir = tempfile::tempdir().unwrap();
    let (bin, zst, csv) = (dir.path().join("a.bin"), dir.path().join("a.zst"), dir.path().join("a.csv"));
    write_oracle(&bin, false);
    write_oracle(&zst, true);
    let mut f = std::fs::File::create(&csv).unwrap();
    writeln!(f, "time,id").unwrap();
    for (t, id) in ids().into_iter().enumerate() {
        writeln!(f, "{t},{}", id * 7919).unwrap();
    }
    drop(f);
    let png = dir.path().join("mrc.png");
    let common = ["--method", "exact", "--points", "10", "--json"];
    let a = json(&[&["--trace", bin.to_str().unwrap()][..], &common[..]].concat());
    let b =
        json(&[&["--trace", zst.to_str().unwrap(), "--format", "oracle-general"][..], &common[..]].concat());
    let c = json(
        &[
            &["--trace", csv.to_str().unwrap(), "--column", "2", "--plot", png.to_str().unwrap()][..],
            &common[..],
        ]
        .concat(),
    );
    assert_eq!(a, b);
    assert_eq!(a, c);
    assert_eq!(a["sizes_pages"].as_array().unwrap().len(), 10);
    let header = std::fs::read(&png).unwrap();
    assert_eq!(&header[..8], b"\x89PNG\r\n\x1a\n");
    // Sampled and simulated methods run on the same file.
    let s = json(&["--trace", bin.to_str().unwrap(), "--max-samples", "64", "--json", "--quiet"]);
    assert_eq!(s["method"], "shards");
    assert!(s["sampling_rate"].as_f64().unwrap() < 1.0);
    let m = json(&[
        "--trace",
        bin.to_str().unwrap(),
        "--method",
        "minisim",
        "--policy",
        "fifo",
        "--sampling",
        "1",
        "--sizes",
        "50",
        "--json",
    ]);
    assert_eq!(m["policy"], "fifo");
    // FIFO with all 50 loop pages resident hits like LRU does.
    assert!((m["miss_ratio"][0].as_f64().unwrap() - 150.0 / 1100.0).abs() < 1e-12);
}

#[test]
fn mrc_without_sampling_flags_samples_a_fixed_number_of_ids() {
    // Issue 27: the default is fixed-size SHARDS (`Sampling::default()`), which tracks a trace with
    // fewer ids than its bound whole (rate 1, the exact curve); `R = 0.01` would sample 1 or 2 of these
    // 150 ids.
    let dir = tempfile::tempdir().unwrap();
    let bin = dir.path().join("t.bin");
    write_oracle(&bin, false);
    let v = json(&["--trace", bin.to_str().unwrap(), "--sizes", "49,50", "--json"]);
    assert_eq!(v["method"], "shards");
    assert_eq!(v["sampling_rate"], 1.0);
    assert_eq!(v["unique"], 150);
    assert_eq!(v["miss_ratio"][0], 1.0);
    let at50 = v["miss_ratio"][1].as_f64().unwrap();
    assert!((at50 - 150.0 / 1100.0).abs() < 1e-12, "{at50}");
    // The help states the bound the library uses.
    let help = String::from_utf8(mrc(&["--help"]).stdout).unwrap();
    let help = help.split_whitespace().collect::<Vec<_>>().join(" "); // clap wraps at 100 columns
    let bound = dd_mrc::DEFAULT_MAX_SAMPLES.to_string();
    assert!(help.contains(&format!("default {bound}")), "{help}");
    assert_eq!(dd_mrc::Sampling::default(), dd_mrc::Sampling::MaxSamples(dd_mrc::DEFAULT_MAX_SAMPLES));
}

#[test]
fn mrc_refuses_flags_that_make_no_sense() {
    let dir = tempfile::tempdir().unwrap();
    let bin = dir.path().join("t.bin");
    write_oracle(&bin, false);
    let t = bin.to_str().unwrap();
    for (args, says) in [
        (vec!["--trace", t, "--method", "exact", "--sampling", "0.1"], "samples nothing"),
        (vec!["--trace", t, "--method", "shards", "--policy", "fifo"], "policy"),
        (vec!["--trace", t, "--sampling", "1.5"], "sampling.rate"),
        (vec!["--trace", t, "--column", "2"], "--column is for CSV"),
        (vec!["--trace", &format!("{t}.missing")], "No such file"),
    ] {
        let out = mrc(&args);
        assert!(!out.status.success(), "{args:?} should fail");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(says), "{args:?}: {err}");
    }
}
