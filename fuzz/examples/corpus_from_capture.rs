//! Turns the daemon's capture files into inputs of every fuzz target (issue 17, item 5):
//!
//! ```text
//! cargo +nightly run --release --manifest-path fuzz/Cargo.toml --example corpus_from_capture -- \
//!     --out OUT_DIR LABEL=CAPTURE_DIR [LABEL=CAPTURE_DIR ...] [--max-per-target N]
//! ```
//!
//! Each `CAPTURE_DIR` holds the `.ddcap` files of one recorded run (`doubledecker serve --capture-dir`,
//! or `DD_CAPTURE_DIR` for the daemons a benchmark or test starts); `LABEL` names the run in the
//! inputs' names. Inputs go to `OUT_DIR/<target>/<label>-...`; of each target's inputs of one run at
//! most `N` (default 200), taken evenly. The oracle-general traces are also written zstd-compressed.
//! What could not be mapped onto a target's typed form is printed (see `dd_fuzz::convert`).
//! `scripts/record-fuzz-corpora` runs the recordings, this, and `cargo fuzz cmin`.

use dd_fuzz::convert::{convert, Capture};
use std::path::PathBuf;

fn main() {
    let mut out: Option<PathBuf> = None;
    let mut runs: Vec<(String, PathBuf)> = Vec::new();
    let mut max = 200usize;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--out" => out = args.next().map(PathBuf::from),
            "--max-per-target" => max = args.next().and_then(|v| v.parse().ok()).expect("--max-per-target N"),
            _ => match a.split_once('=') {
                Some((label, dir)) => runs.push((label.to_string(), PathBuf::from(dir))),
                None => panic!("unexpected argument {a:?}: LABEL=CAPTURE_DIR, --out DIR, --max-per-target N"),
            },
        }
    }
    let out = out.expect("--out DIR");
    for (label, dir) in runs {
        let mut captures = Vec::new();
        let mut names: Vec<_> = std::fs::read_dir(&dir)
            .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
            .map(|e| e.expect("directory entry").path())
            .filter(|p| p.extension().is_some_and(|x| x == "ddcap"))
            .collect();
        names.sort();
        for p in names {
            let bytes = std::fs::read(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
            let name = p.file_name().expect("a file").to_string_lossy().into_owned();
            let rec = dd_server::capture::parse(&name, &bytes).unwrap_or_else(|e| panic!("{e}"));
            captures.push(Capture { name, rec });
        }
        let (inputs, report) = convert(&label, &captures);
        let mut written = std::collections::BTreeMap::<&str, usize>::new();
        let mut by_target = std::collections::BTreeMap::<&str, Vec<_>>::new();
        for i in inputs {
            by_target.entry(i.target).or_default().push(i);
        }
        for (target, v) in by_target {
            let dir = out.join(target);
            std::fs::create_dir_all(&dir).expect("output folder");
            // Evenly spread over the run, so that every part of it is represented.
            let step = v.len().div_ceil(max).max(1);
            for i in v.iter().step_by(step) {
                std::fs::write(dir.join(&i.name), &i.bytes).expect("writing an input");
                *written.entry(target).or_default() += 1;
                // An oracle-general trace (not CSV text) also goes in compressed.
                if target == "trace_reader" && !i.bytes.starts_with(b"id,") {
                    let z = zstd::encode_all(&i.bytes[..], 3).expect("zstd in memory");
                    std::fs::write(dir.join(format!("{}.zst", i.name)), z).expect("writing an input");
                    *written.entry(target).or_default() += 1;
                }
            }
        }
        println!("{label}: {} capture files", captures.len());
        for (t, n) in &report.inputs {
            println!("  {t}: {n} inputs made, {} written", written.get(t).copied().unwrap_or(0));
        }
        for (what, n) in &report.unmapped {
            println!("  not mapped: {what}: {n}");
        }
    }
}
