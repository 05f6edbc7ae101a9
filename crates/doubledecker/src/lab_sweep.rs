//! `doubledecker lab sweep FILE`: a sweep file's points (`dd_lab::sweep`) run on this machine's cores,
//! one point at a time (`--point N`, what a Slurm array task runs), or written out as an `sbatch
//! --array` script; the done points gathered into `results.csv` and `results.json`. Resumable: done
//! points are skipped.

use anyhow::{bail, Context, Result};
use clap::{Args, ValueEnum};
use dd_lab::sweep::{self, Sweep};
use dd_lab::RunOptions;
use indicatif::{ProgressBar, ProgressStyle};
use std::path::{Path, PathBuf};
use std::time::Instant;

#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Executor {
    /// This machine's cores, `--jobs` points at a time.
    Local,
}

#[derive(Args, Debug)]
pub struct SweepArgs {
    /// The sweep file (TOML; docs/scenario-format.md, "Sweeps").
    file: PathBuf,
    /// Output folder: `points/NNNN/` per point, `results.csv` and `results.json`.
    #[arg(long)]
    out: PathBuf,
    /// Where the missing points run (from Python: `doubledecker.sweep(..., executor="ray")`).
    #[arg(long, value_enum, default_value_t = Executor::Local)]
    executor: Executor,
    /// Points run side by side (default: one per core); each point's variants run one after the other
    /// and plan their memory with a share of what the host has.
    #[arg(long)]
    jobs: Option<usize>,
    /// Run only point N (0-based; done already: nothing to do). Does not gather.
    #[arg(long, conflicts_with_all = ["print_slurm", "gather", "list"])]
    point: Option<usize>,
    /// Write an `sbatch --array` script running every point as an array task (`--point
    /// $SLURM_ARRAY_TASK_ID`) to this file (`-`: standard output), and run nothing.
    #[arg(long, value_name = "PATH", conflicts_with_all = ["gather", "list"])]
    print_slurm: Option<String>,
    /// Extra `#SBATCH` lines for `--print-slurm` (e.g. `--sbatch=--time=01:00:00`), repeatable.
    #[arg(long = "sbatch", requires = "print_slurm")]
    sbatch: Vec<String>,
    /// Only gather the done points into results.csv / results.json (an error if some are missing).
    #[arg(long, conflicts_with = "list")]
    gather: bool,
    /// List the points (index, done or not, label) and run nothing.
    #[arg(long)]
    list: bool,
    /// Directory for SSD scratch files (as `lab run`).
    #[arg(long)]
    scratch_dir: Option<PathBuf>,
    /// No progress bar.
    #[arg(long)]
    quiet: bool,
}

pub fn run(a: &SweepArgs) -> Result<()> {
    let sw = Sweep::load(&a.file).with_context(|| format!("sweep file {}", a.file.display()))?;
    let opts = RunOptions { scratch_dir: a.scratch_dir.clone(), ..Default::default() };
    if a.list {
        for p in &sw.points {
            let done = if sw.is_done(&a.out, p.index)? { "done" } else { "todo" };
            outln!("{:>5}  {done}  {}", p.index, p.label);
        }
        return Ok(());
    }
    if let Some(path) = &a.print_slurm {
        // Absolute paths: the array tasks start wherever Slurm starts them.
        let abs = |p: &Path| std::path::absolute(p).unwrap_or_else(|_| p.to_path_buf());
        let binary = std::env::current_exe().context("the path of this binary")?;
        let text = sweep::slurm_script(&sw, &binary, &abs(&a.file), &abs(&a.out), &a.sbatch);
        if path == "-" {
            out!("{text}");
        } else {
            std::fs::write(path, text).with_context(|| format!("writing {path}"))?;
            outln!("{path}: {} array task(s); submit with `sbatch {path}`", sw.points.len());
        }
        return Ok(());
    }
    if let Some(n) = a.point {
        let t0 = Instant::now();
        let (_, ran) = sw.run_point(&a.out, n, &opts, &mut |_| {}).with_context(|| format!("point {n}"))?;
        if !a.quiet {
            let what = if ran {
                format!("ran in {:.1} s", t0.elapsed().as_secs_f64())
            } else {
                "already done".into()
            };
            errln!("point {n} ({}): {what}", sw.point(n)?.label);
        }
        return Ok(());
    }
    if !a.gather {
        match a.executor {
            Executor::Local => run_local(&sw, a, &opts)?,
        }
    }
    let g = sweep::gather(&sw, &a.out)?;
    if let Some(best) = &g.best {
        outln!("best candidate of the search: {best}");
    }
    let failed = g.rows.iter().filter(|r| !r.all_passed).count();
    outln!(
        "{} point(s) gathered into {} and {}{}",
        g.rows.len(),
        a.out.join("results.csv").display(),
        a.out.join("results.json").display(),
        if failed > 0 { format!("; {failed} with failed checks") } else { String::new() }
    );
    Ok(())
}

fn run_local(sw: &Sweep, a: &SweepArgs, opts: &RunOptions) -> Result<()> {
    let missing = sw.missing(&a.out)?;
    let total = sw.points.len();
    let jobs = a.jobs.unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    if !a.quiet {
        errln!(
            "{}: {} point(s), {} done, {} to run on {} job(s)",
            sw.file.name,
            total,
            total - missing.len(),
            missing.len(),
            jobs.clamp(1, missing.len().max(1))
        );
    }
    let pb = if a.quiet { ProgressBar::hidden() } else { ProgressBar::new(missing.len() as u64) };
    pb.set_style(
        ProgressStyle::with_template("{prefix:>12} [{bar:40}] {pos}/{len} {elapsed} eta {eta} {msg}")
            .unwrap_or_else(|_| ProgressStyle::default_bar())
            .progress_chars("=> "),
    );
    pb.set_prefix("lab sweep");
    let t0 = Instant::now();
    let ran = sw.run_local(&a.out, jobs, opts, &mut |index, r| {
        pb.inc(1);
        if let Err(e) = r {
            pb.suspend(|| errln!("point {index}: {e}"));
        }
    });
    pb.finish_and_clear();
    let ran = ran.context("lab sweep")?;
    if !a.quiet {
        errln!("{} point(s) ran in {:.1} s wall", ran.len(), t0.elapsed().as_secs_f64());
    }
    if ran.len() != missing.len() {
        bail!("{} point(s) were to run, {} ran", missing.len(), ran.len());
    }
    Ok(())
}
