//! `doubledecker lab sweep` (issue 33): every point run alone (`--point N`, through the generated Slurm
//! script) equals the local executor's run byte for byte; the Slurm script passes `bash -n` and names
//! each point once; a point whose result was never written runs again on resume and only it; Table 4's
//! Morai++ search as a sweep gives the search's candidates, scores and pick.

use std::path::{Path, PathBuf};
use std::process::Command;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn sweep_file(name: &str) -> PathBuf {
    repo().join("crates/dd-lab/sweeps").join(name)
}

fn lab(args: &[&str]) -> std::process::Output {
    let out = Command::new(env!("CARGO_BIN_EXE_doubledecker")).arg("lab").args(args).output().expect("run");
    assert!(
        out.status.success(),
        "lab {args:?}: {}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

fn read(p: &Path) -> Vec<u8> {
    std::fs::read(p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

/// Every file of every point folder, and the gathered tables, equal between two output folders.
fn assert_same_outputs(a: &Path, b: &Path, points: usize) {
    for i in 0..points {
        for f in ["point.toml", "summary.json", "timeseries.csv", "result.json"] {
            let (pa, pb) = (a.join(format!("points/{i:04}/{f}")), b.join(format!("points/{i:04}/{f}")));
            assert!(read(&pa) == read(&pb), "{} differs from {}", pa.display(), pb.display());
        }
    }
    for f in ["results.csv", "results.json"] {
        assert!(read(&a.join(f)) == read(&b.join(f)), "{f} differs");
    }
}

#[test]
fn every_point_alone_through_the_slurm_script_equals_the_local_executor_and_resume_runs_only_missing() {
    let file = sweep_file("fig3-cache-sizes.toml");
    let f = file.to_str().unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let (local, array) = (tmp.path().join("local"), tmp.path().join("array"));
    lab(&["sweep", f, "--out", local.to_str().unwrap(), "--executor", "local", "--jobs", "2", "--quiet"]);
    let csv = String::from_utf8(read(&local.join("results.csv"))).unwrap();
    assert_eq!(csv.lines().count(), 7, "a header and six rows:\n{csv}");

    // The Slurm script: valid bash, an array of exactly the six points, each named once.
    let script = tmp.path().join("sweep.sbatch");
    lab(&["sweep", f, "--out", array.to_str().unwrap(), "--print-slurm", script.to_str().unwrap()]);
    let text = std::fs::read_to_string(&script).unwrap();
    let n = Command::new("bash").arg("-n").arg(&script).status().unwrap();
    assert!(n.success(), "bash -n fails on\n{text}");
    assert!(text.contains("#SBATCH --array=0-5\n"), "{text}");
    for i in 0..6 {
        assert_eq!(text.matches(&format!("# point {i}: ")).count(), 1, "point {i} in\n{text}");
    }
    assert!(!text.contains("# point 6:"), "{text}");
    // Each array task as Slurm would start it, then the gather.
    for i in 0..6 {
        let st =
            Command::new("bash").arg(&script).env("SLURM_ARRAY_TASK_ID", i.to_string()).status().unwrap();
        assert!(st.success(), "array task {i}");
    }
    lab(&["sweep", f, "--out", array.to_str().unwrap(), "--gather", "--quiet"]);
    assert_same_outputs(&local, &array, 6);

    // A point killed before its result was written (no result.json; a temporary file left behind)
    // runs again on resume, and no other point does.
    let p3 = local.join("points/0003");
    std::fs::remove_file(p3.join("result.json")).unwrap();
    std::fs::write(p3.join(".result.json.tmp999"), b"{\"half\":").unwrap();
    let listed =
        String::from_utf8(lab(&["sweep", f, "--out", local.to_str().unwrap(), "--list"]).stdout).unwrap();
    let todo: Vec<&str> = listed.lines().filter(|l| l.contains("todo")).collect();
    assert_eq!(todo.len(), 1, "{listed}");
    assert!(todo[0].trim_start().starts_with("3 "), "{listed}");
    let before: Vec<_> = (0..6)
        .filter(|i| *i != 3)
        .map(|i| {
            std::fs::metadata(local.join(format!("points/{i:04}/result.json"))).unwrap().modified().unwrap()
        })
        .collect();
    let out = lab(&["sweep", f, "--out", local.to_str().unwrap(), "--jobs", "2"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("6 point(s), 5 done, 1 to run") && err.contains("1 point(s) ran"), "{err}");
    let after: Vec<_> = (0..6)
        .filter(|i| *i != 3)
        .map(|i| {
            std::fs::metadata(local.join(format!("points/{i:04}/result.json"))).unwrap().modified().unwrap()
        })
        .collect();
    assert_eq!(before, after, "a done point ran again");
    assert_same_outputs(&local, &array, 6);

    // A point folder of another sweep is refused, not mixed in.
    std::fs::write(local.join("points/0001/point.toml"), "name = \"other\"\n").unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_doubledecker"))
        .args(["lab", "sweep", f, "--out", local.to_str().unwrap(), "--gather"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("point 1 of another sweep"), "{err}");
}

#[test]
fn table4_morai_search_as_a_sweep_gives_the_searchs_candidates_scores_and_pick() {
    let file = sweep_file("table4-morai-search.toml");
    let tmp = tempfile::tempdir().unwrap();
    let (run, sweep) = (tmp.path().join("run"), tmp.path().join("sweep"));
    lab(&[
        "run",
        "table4-morai-vs-doubledecker",
        "--variant",
        "morai++",
        "--scale",
        "0.02",
        "--quiet",
        "--out",
        run.to_str().unwrap(),
    ]);
    lab(&["sweep", file.to_str().unwrap(), "--out", sweep.to_str().unwrap(), "--quiet"]);
    let summary: serde_json::Value = serde_json::from_slice(&read(&run.join("summary.json"))).unwrap();
    let results: serde_json::Value = serde_json::from_slice(&read(&sweep.join("results.json"))).unwrap();
    let search = &summary["searches"][0];
    let cands = search["candidates"].as_array().unwrap();
    let rows = results["rows"].as_array().unwrap();
    assert_eq!(cands.len(), 34, "Table 4's search runs 34 candidates");
    assert_eq!(rows.len(), cands.len());
    for (c, r) in cands.iter().zip(rows) {
        let s = &r["search"];
        assert_eq!(c["name"], s["candidate"]);
        for k in ["targets_met", "throughput_ops_s", "violation_s"] {
            assert_eq!(c[k], s[k], "{k} of {}", c["name"]);
        }
    }
    assert_eq!(search["best"], results["best"]);
    // The best candidate's point ran the searching variant as the search's winner: its time series is
    // the lab run's, byte for byte.
    let best = rows.iter().position(|r| r["search"]["candidate"] == results["best"]).unwrap();
    assert!(
        read(&run.join("timeseries.csv")) == read(&sweep.join(format!("points/{best:04}/timeseries.csv"))),
        "the best point's timeseries.csv differs from the search's"
    );
}

#[test]
fn a_bad_parameter_path_is_refused_naming_the_point_and_path() {
    let tmp = tempfile::tempdir().unwrap();
    let file = tmp.path().join("bad.toml");
    std::fs::write(
        &file,
        "name = \"bad\"\nscenario = \"fig3-4-global-share\"\n[grid]\n\"vms.nosuchvm.memory_mib\" = [1, 2]\n",
    )
    .unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_doubledecker"))
        .args(["lab", "sweep", file.to_str().unwrap(), "--out", tmp.path().join("o").to_str().unwrap()])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(err.contains("point 0: vms.nosuchvm.memory_mib") && err.contains("nosuchvm"), "{err}");
}
