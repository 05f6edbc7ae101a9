//! `doubledecker lab ...`: lists and runs the lab's scenarios (crate `dd-lab`), with a progress bar,
//! and writes their outputs. Exits non-zero when a check fails. `lab mixes` runs generated mixes
//! against the VM-level provisioner (`dd_lab::mixes`) and writes their table.

use anyhow::{bail, Context, Result};
use clap::{Args, Subcommand};
use dd_lab::{bundled, RunOptions, Scenario};
use indicatif::{ProgressBar, ProgressStyle};
use std::path::{Path, PathBuf};
use std::time::Instant;

#[derive(Subcommand, Debug)]
pub enum LabCommand {
    /// Shows the bundled scenarios.
    List,
    /// Runs a bundled scenario (by name) or a scenario file (by path), or all bundled ones.
    Run(RunArgs),
    /// Generated mixes (issue 27): for each seed a mix of workloads in one or two VMs, its static grid
    /// swept, targets derived from the sweep, and the VM-level provisioner against the best static
    /// allocation. Prints and writes (mixes.md, .json, .csv, one mix-SEED.toml each) the table and the
    /// verdicts against the targets.
    Mixes(MixesArgs),
    /// A sweep file's points (a base scenario at a grid or list of parameter values, or a search's
    /// candidates), each an independent run into its own folder: on this machine's cores, one point
    /// (`--point N`), or as a Slurm array (`--print-slurm`); gathered into results.csv / results.json.
    /// Resumable: done points are skipped.
    Sweep(crate::lab_sweep::SweepArgs),
}

#[derive(Args, Debug)]
pub struct MixesArgs {
    /// Seeds: `1-20`, `3`, or a list of both (`1-5,9`).
    #[arg(long, default_value = "1-20")]
    seeds: String,
    /// Size and time scale of every mix.
    #[arg(long, default_value_t = 1.0)]
    scale: f64,
    /// Output folder.
    #[arg(long)]
    out: PathBuf,
    /// Containers per mix, `MIN-MAX`.
    #[arg(long, default_value = "3-5")]
    containers: String,
    /// VMs per mix, `MIN-MAX`.
    #[arg(long, default_value = "1-2")]
    vms: String,
    /// Most candidates of a mix's static search.
    #[arg(long, default_value_t = 60)]
    max_candidates: usize,
    /// Each target is this fraction of the balanced static candidate's throughput.
    #[arg(long, default_value_t = 0.9)]
    target_fraction: f64,
    /// Candidates run side by side on up to this many threads (default: one per core), as `lab run`.
    #[arg(long)]
    jobs: Option<usize>,
    /// Directory for SSD scratch files (the mixes have none; as `lab run`).
    #[arg(long)]
    scratch_dir: Option<PathBuf>,
    /// Exit non-zero when the mixes miss the targets.
    #[arg(long)]
    check: bool,
    /// No progress bar.
    #[arg(long)]
    quiet: bool,
}

#[derive(Args, Debug)]
pub struct RunArgs {
    /// A bundled scenario's name or a scenario file's path.
    #[arg(required_unless_present = "all")]
    scenario: Option<String>,
    /// Run every bundled scenario (each into its own subfolder) and write an index page.
    #[arg(long, conflicts_with = "scenario")]
    all: bool,
    /// Output folder.
    #[arg(long)]
    out: PathBuf,
    /// Overrides the scenario's size and time scale.
    #[arg(long)]
    scale: Option<f64>,
    /// Overrides the scenario's seed.
    #[arg(long)]
    seed: Option<u64>,
    /// Run only this variant (repeatable; default: all). Checks that name a variant left out are
    /// dropped.
    #[arg(long = "variant", value_name = "NAME", conflicts_with = "all")]
    variants: Vec<String>,
    /// Overrides the scenario's disk scheduler: `fifo` (one queue) or `fair` (a queue per container,
    /// served by `io_weight`).
    #[arg(long, value_parser = parse_disk_scheduler)]
    disk_scheduler: Option<dd_lab::scenario::DiskScheduler>,
    /// Directory for the SSD store's unnamed scratch file (default: /dev/shm when the run fits in memory
    /// with it there, else /var/tmp). A memory-backed directory counts as memory.
    #[arg(long)]
    scratch_dir: Option<PathBuf>,
    /// No progress bar.
    #[arg(long)]
    quiet: bool,
    /// Variants run side by side on up to this many threads (default: one per core), never more than fit
    /// in the memory available above 20% of the total. Each has its own engine, so the outputs do not
    /// depend on it.
    #[arg(long)]
    jobs: Option<usize>,
    /// Run against a running daemon's data plane (`unix:PATH` or `tcp:HOST:PORT`) instead of the
    /// in-process engine; it must run the lab's engine settings (docs/scenario-format.md).
    #[arg(long, requires = "admin")]
    daemon: Option<String>,
    /// The daemon's admin API, `http://HOST:PORT` as for every other command (`--admin HOST:PORT`, the
    /// older form, still works).
    #[arg(long = "admin-url", alias = "admin", env = "DD_ADMIN_URL")]
    admin: Option<String>,
    /// The daemon's host admin token (registers the scenario's VMs, sets capacities and mode); default
    /// $DD_HOST_TOKEN, else the token file.
    #[arg(long, env = "DD_HOST_TOKEN", hide_env_values = true)]
    token: Option<String>,
    /// The file holding the host admin token, read with --daemon when neither --token nor
    /// $DD_HOST_TOKEN is given; the daemon writes it in its data directory.
    #[arg(long, default_value = "dd-data/admin.token")]
    token_file: PathBuf,
}

pub fn run(cmd: LabCommand) -> Result<()> {
    match cmd {
        LabCommand::List => {
            let width = bundled::SCENARIOS.iter().map(|(n, _)| n.len()).max().unwrap_or(0);
            for (name, _) in bundled::SCENARIOS {
                let s = bundled::get(name)?;
                let what = format!("{} variant(s), {} check(s)", s.variant_list().len(), s.checks.len());
                outln!("{name:<width$}  {what:<24}  {}", summary(&s.description, 72));
            }
            Ok(())
        }
        LabCommand::Run(a) => {
            let targets: Vec<(Scenario, Option<PathBuf>)> = if a.all {
                bundled::SCENARIOS.iter().map(|(n, _)| Ok((bundled::get(n)?, None))).collect::<Result<_>>()?
            } else {
                let name = a.scenario.clone().unwrap_or_default();
                vec![load(&name)?]
            };
            let targets = if a.variants.is_empty() {
                targets
            } else {
                targets
                    .into_iter()
                    .map(|(s, b)| Ok((s.only_variants(&a.variants)?, b)))
                    .collect::<Result<_>>()?
            };
            let daemon = match (&a.daemon, &a.admin) {
                (Some(d), Some(admin)) => Some(dd_lab::sim::remote::DaemonTarget {
                    data: dd_lab::sim::remote::DataAddr::parse(d)?,
                    // `AdminClient` takes `http://HOST:PORT` and `HOST:PORT` alike.
                    admin: admin.clone(),
                    // As every host command: the flag ($DD_HOST_TOKEN), else the daemon's token file.
                    host_token: crate::admin_cli::host_token(&a.token, &a.token_file)?,
                }),
                (None, _) => None,
                _ => bail!("--daemon needs --admin-url (or DD_ADMIN_URL)"),
            };
            let mut results = Vec::new();
            let mut failed = Vec::new();
            for (sc, base) in &targets {
                let dir = if a.all { a.out.join(&sc.name) } else { a.out.clone() };
                let opts = RunOptions {
                    scale: a.scale,
                    seed: a.seed,
                    base_dir: base.clone(),
                    scratch_dir: a.scratch_dir.clone(),
                    daemon: daemon.clone(),
                    jobs: a.jobs,
                    host_memory: None,
                    disk_scheduler: a.disk_scheduler,
                };
                let res = run_one(sc, &opts, &dir, a.quiet)?;
                if !res.all_passed() {
                    failed.push(sc.name.clone());
                }
                results.push((sc.name.clone(), res));
            }
            if a.all {
                let refs: Vec<(&str, &dd_lab::ScenarioResult)> =
                    results.iter().map(|(n, r)| (n.as_str(), r)).collect();
                dd_lab::results::plot::write_index(&refs, &a.out)?;
                outln!("index: {}", a.out.join("index.html").display());
            }
            if !failed.is_empty() {
                bail!("checks failed in: {}", failed.join(", "));
            }
            Ok(())
        }
        LabCommand::Mixes(a) => mixes(&a),
        LabCommand::Sweep(a) => crate::lab_sweep::run(&a),
    }
}

/// `1-20`, `3`, `1-5,9` to the seeds in order (duplicates kept out).
fn parse_seeds(text: &str) -> Result<Vec<u64>> {
    let mut out = Vec::new();
    for part in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let (a, b) = part.split_once('-').unwrap_or((part, part));
        let (a, b): (u64, u64) = (
            a.trim().parse().with_context(|| format!("--seeds: `{part}`"))?,
            b.trim().parse().with_context(|| format!("--seeds: `{part}`"))?,
        );
        if a > b || b - a >= 10_000 {
            bail!("--seeds: `{part}` is not a range LOW-HIGH of at most 10000 seeds");
        }
        for s in a..=b {
            if !out.contains(&s) {
                out.push(s);
            }
        }
    }
    if out.is_empty() {
        bail!("--seeds: no seed");
    }
    Ok(out)
}

/// `MIN-MAX` or `N`.
fn parse_range(flag: &str, text: &str) -> Result<(usize, usize)> {
    let (a, b) = text.split_once('-').unwrap_or((text, text));
    let p = |x: &str| x.trim().parse::<usize>().with_context(|| format!("{flag}: `{text}` is not MIN-MAX"));
    Ok((p(a)?, p(b)?))
}

fn mixes(a: &MixesArgs) -> Result<()> {
    use dd_lab::mixes::{self, MixOptions};
    use dd_lab::scenario::mixgen::MixConfig;
    let seeds = parse_seeds(&a.seeds)?;
    let (min_containers, max_containers) = parse_range("--containers", &a.containers)?;
    let (min_vms, max_vms) = parse_range("--vms", &a.vms)?;
    let opts = MixOptions {
        generator: MixConfig {
            min_containers,
            max_containers,
            min_vms,
            max_vms,
            scale: a.scale,
            max_candidates: a.max_candidates,
            ..Default::default()
        },
        target_fraction: a.target_fraction,
        jobs: a.jobs,
        scratch_dir: a.scratch_dir.clone(),
        host_memory: None,
    };
    opts.validate()?;
    std::fs::create_dir_all(&a.out).with_context(|| format!("creating {}", a.out.display()))?;
    let pb = if a.quiet { ProgressBar::hidden() } else { ProgressBar::new(seeds.len() as u64 * 1000) };
    pb.set_style(
        ProgressStyle::with_template("{prefix:>12} [{bar:40}] {percent:>3}% {elapsed} eta {eta} {msg}")
            .unwrap_or_else(|_| ProgressStyle::default_bar())
            .progress_chars("=> "),
    );
    pb.set_prefix("lab mixes");
    let started = Instant::now();
    let mut outcomes = Vec::with_capacity(seeds.len());
    for (i, &seed) in seeds.iter().enumerate() {
        let t0 = Instant::now();
        pb.set_message(format!("seed {seed}"));
        let run = mixes::run_mix(seed, &opts, &mut |f| pb.set_position(((i as f64 + f) * 1000.0) as u64))
            .with_context(|| format!("mix of seed {seed}"))?;
        let path = a.out.join(format!("mix-{seed}.toml"));
        let text = dd_lab::scenario::mixgen::case_toml(&run.scenario)?;
        std::fs::write(&path, text).with_context(|| format!("writing {}", path.display()))?;
        let o = &run.outcome;
        // Wall-clock figures go to the terminal only, never into the files.
        pb.suspend(|| {
            errln!(
                "seed {seed}: {} candidates + provisioner, {:.1} s wall, {:.1} M page accesses; provisioner \
                 {}/{} targets (static {}/{}), total {:.3}",
                o.candidates,
                t0.elapsed().as_secs_f64(),
                run.accesses as f64 / 1e6,
                o.provisioner_met,
                o.targets,
                o.static_met,
                o.targets,
                o.total_ratio
            )
        });
        outcomes.push(run.outcome);
    }
    pb.finish_and_clear();
    let v = mixes::verdicts(&outcomes);
    let table = mixes::markdown(&outcomes, &v);
    let command = format!(
        "doubledecker lab mixes --seeds {} --scale {} --containers {} --vms {} --max-candidates {} \
         --target-fraction {} --out DIR",
        a.seeds, a.scale, a.containers, a.vms, a.max_candidates, a.target_fraction
    );
    let md = format!("Generated by `{command}`.\n\n{table}");
    std::fs::write(a.out.join("mixes.md"), &md).context("writing mixes.md")?;
    let json = serde_json::json!({ "command": command, "config": opts.generator, "target_fraction": a.target_fraction,
        "mixes": outcomes, "verdicts": v });
    std::fs::write(a.out.join("mixes.json"), serde_json::to_string_pretty(&json)? + "\n")
        .context("writing mixes.json")?;
    std::fs::write(a.out.join("mixes.csv"), mixes::csv(&outcomes)?).context("writing mixes.csv")?;
    out!("{table}");
    outln!(
        "{} mixes in {:.1} s wall; outputs in {}",
        outcomes.len(),
        started.elapsed().as_secs_f64(),
        a.out.display()
    );
    if a.check && !v.passed {
        bail!("the provisioner misses the issue's targets on these mixes (see the verdicts above)");
    }
    Ok(())
}

/// The description on one line, cut at a word boundary to at most `max` characters ("..." marks a cut).
fn summary(description: &str, max: usize) -> String {
    let words: Vec<&str> = description.split_whitespace().collect();
    let mut line = String::new();
    for (i, w) in words.iter().enumerate() {
        let room = if i + 1 == words.len() { max } else { max.saturating_sub(3) };
        if line.chars().count() + usize::from(!line.is_empty()) + w.chars().count() > room {
            return format!("{line}...");
        }
        if !line.is_empty() {
            line.push(' ');
        }
        line.push_str(w);
    }
    line
}

fn load(name: &str) -> Result<(Scenario, Option<PathBuf>)> {
    if bundled::SCENARIOS.iter().any(|(n, _)| *n == name) {
        return Ok((bundled::get(name)?, None));
    }
    let p = Path::new(name);
    let text = std::fs::read_to_string(p)
        .with_context(|| format!("no bundled scenario or readable file `{name}`"))?;
    let sc = Scenario::from_toml(&text).with_context(|| format!("in {}", p.display()))?;
    Ok((sc, p.parent().map(Path::to_path_buf)))
}

/// Says what the memory plan is (stderr, unless quiet): the estimate, the jobs and the scratch file.
fn report_plan(sc: &Scenario, p: &dd_lab::Prepared, opts: &RunOptions, quiet: bool) {
    use dd_lab::sim::budget::gib;
    let plan = &p.plan;
    let want = opts.jobs.unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    let nvar = plan.estimates.len();
    if plan.jobs < want.min(nvar) {
        // Always said: the user asked for more (or has more cores) than fit.
        errln!(
            "{}: {} variant(s) side by side instead of {} (what fits in {} of memory above the 20% margin)",
            sc.name,
            plan.jobs,
            want.min(nvar),
            gib(plan.host.budget_bytes())
        );
    }
    if quiet {
        return;
    }
    let scratch = if opts.daemon.is_some() || plan.estimates.iter().all(|e| e.scratch_bytes == 0) {
        String::new()
    } else {
        format!(", SSD scratch in {} (memory-backed)", plan.scratch_dir.display())
    };
    errln!(
        "{}: estimated peak memory {} with {} variant(s) side by side, {} available of {}{scratch}",
        sc.name,
        gib(plan.peak_bytes),
        plan.jobs,
        gib(plan.host.available_bytes),
        gib(plan.host.total_bytes),
    );
}

/// The process's peak resident memory (`VmHWM`), if the kernel says.
fn peak_rss_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:")?.split_whitespace().next()?.parse::<u64>().ok())
        .map(|k| k * 1024)
}

fn run_one(sc: &Scenario, opts: &RunOptions, dir: &Path, quiet: bool) -> Result<dd_lab::ScenarioResult> {
    let prepared = dd_lab::prepare(sc, opts).with_context(|| format!("scenario {}", sc.name))?;
    report_plan(sc, &prepared, opts, quiet);
    // Progress is per run: a searching variant runs each of its candidates.
    let nvar = sc.run_list().len() as u64;
    let pb = if quiet { ProgressBar::hidden() } else { ProgressBar::new(nvar * 1000) };
    pb.set_style(
        ProgressStyle::with_template("{prefix:>28} [{bar:40}] {percent:>3}% {elapsed} eta {eta} {msg}")
            .unwrap_or_else(|_| ProgressStyle::default_bar())
            .progress_chars("=> "),
    );
    pb.set_prefix(sc.name.clone());
    let names: Vec<String> = sc.run_list().into_iter().map(|v| v.name).collect();
    let started = Instant::now();
    // Variants may run side by side: the bar is the sum of their fractions, the message the running ones.
    let mut done = vec![0f64; names.len()];
    let res = dd_lab::run_prepared(&prepared, opts, &mut |vi, f| {
        if let Some(d) = done.get_mut(vi) {
            *d = f;
        }
        pb.set_position((done.iter().sum::<f64>() * 1000.0) as u64);
        let running: Vec<&str> = names
            .iter()
            .zip(&done)
            .filter(|(_, d)| **d > 0.0 && **d < 1.0)
            .map(|(n, _)| n.as_str())
            .collect();
        pb.set_message(running.join(" "));
    })
    .with_context(|| format!("scenario {}", sc.name))?;
    pb.finish_and_clear();
    let wall = started.elapsed().as_secs_f64();
    dd_lab::results::report::write_data(&res, dir)?;
    dd_lab::results::plot::write_plots_and_report(&res, dir)?;
    // Wall-clock and memory figures go to the terminal only (never into summary.json / timeseries.csv).
    outln!(
        "{}: {} variant(s), {:.1} s wall, {:.2} M page accesses ({:.2} M/s), peak RSS {} MiB, outputs in {}",
        sc.name,
        res.runs.len(),
        wall,
        res.accesses() as f64 / 1e6,
        res.accesses() as f64 / wall.max(1e-9) / 1e6,
        peak_rss_bytes().map_or_else(|| "?".to_string(), |b| (b >> 20).to_string()),
        dir.display()
    );
    if res.scale != 1.0 && !res.checks.is_empty() {
        // Check names quote the paper's sizes and times; the details are this run's (issue 31: "90% of
        // 1 GiB" read as a claim about a 51 MiB run).
        outln!(
            "  (check names give the paper's sizes and times; this run is at scale {}, so they are {} times \
             those, as the details' figures are)",
            res.scale,
            res.scale
        );
    }
    for c in &res.checks {
        outln!("  [{}] {}: {}", if c.passed { "pass" } else { "FAIL" }, c.name, c.detail);
    }
    Ok(res)
}

fn parse_disk_scheduler(s: &str) -> Result<dd_lab::scenario::DiskScheduler, String> {
    match s {
        "fifo" => Ok(dd_lab::scenario::DiskScheduler::Fifo),
        "fair" => Ok(dd_lab::scenario::DiskScheduler::Fair),
        _ => Err(format!("`{s}`: want fifo or fair")),
    }
}
