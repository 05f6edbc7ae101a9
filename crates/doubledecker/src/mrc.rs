//! `doubledecker mrc`: a trace file's miss-ratio curve (crate `dd-mrc`), as a table or JSON, with a
//! progress bar on long traces and an optional PNG plot.

use anyhow::{bail, Context, Result};
use clap::{Args, ValueEnum};
use dd_mrc::profile::{profile, Profile, SizeGrid};
use dd_mrc::{Method, MrcConfig, Policy, Sampling, Unit, DEFAULT_SEED};
use dd_trace::Format;
use indicatif::{ProgressBar, ProgressStyle};
use std::path::PathBuf;

#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum FormatArg {
    /// One column of page or object ids (`--column`), a header line first.
    Csv,
    /// libCacheSim's binary oracle-general records, plain or zstd-compressed.
    OracleGeneral,
}

#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum MethodArg {
    /// Every reference (Mattson's stack algorithm): LRU only.
    Exact,
    /// SHARDS sampling with SHARDS_adj: LRU only.
    Shards,
    /// Miniature simulation at each size: any policy.
    Minisim,
}

#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum PolicyArg {
    Lru,
    Fifo,
    S3fifo,
}

#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum UnitArg {
    /// Every id takes one cache slot.
    Pages,
    /// Ids take their object size (oracle-general `obj_size`; 4096 for CSV rows).
    Bytes,
}

#[derive(Args, Debug)]
pub struct MrcArgs {
    /// The trace file.
    #[arg(long)]
    trace: PathBuf,
    /// Its format (default: `csv` for a `.csv` file, `oracle-general` otherwise).
    #[arg(long, value_enum)]
    format: Option<FormatArg>,
    /// CSV: the column of the ids, counting from 1 (the first line is a header and is skipped).
    #[arg(long)]
    column: Option<usize>,
    /// How the curve is computed: exact LRU, SHARDS sampling (LRU), or miniature simulation.
    #[arg(long, value_enum, default_value_t = MethodArg::Shards)]
    method: MethodArg,
    /// Fixed-rate sampling: the fraction of ids sampled (shards, minisim). Without this flag or
    /// --max-samples: fixed-size sampling of 32768 ids.
    #[arg(long, conflicts_with = "max_samples")]
    sampling: Option<f64>,
    /// Fixed-size sampling: at most this many ids tracked (shards, minisim; default 32768, which keeps
    /// the mean absolute error under 0.01; a trace with fewer ids gets its exact curve).
    #[arg(long)]
    max_samples: Option<usize>,
    /// The eviction policy (exact and shards: lru only).
    #[arg(long, value_enum, default_value_t = PolicyArg::Lru)]
    policy: PolicyArg,
    /// Cache sizes to report, comma-separated (in pages, or bytes with `--unit bytes`).
    #[arg(long, value_delimiter = ',', conflicts_with = "points")]
    sizes: Option<Vec<u64>>,
    /// Report this many sizes, evenly spaced up to the trace's footprint (default 100).
    #[arg(long)]
    points: Option<usize>,
    /// Cache sizes in pages (each id one slot) or in bytes (each id its object size).
    #[arg(long, value_enum, default_value_t = UnitArg::Pages)]
    unit: UnitArg,
    /// Also draw the curve as a PNG.
    #[arg(long)]
    plot: Option<PathBuf>,
    /// Print one JSON object instead of a table.
    #[arg(long)]
    json: bool,
    /// No progress bar.
    #[arg(long)]
    quiet: bool,
}

/// The configuration the flags describe, or the flag combination that makes no sense.
fn config(a: &MrcArgs) -> Result<(MrcConfig, SizeGrid)> {
    let method = match a.method {
        MethodArg::Exact => Method::Exact,
        MethodArg::Shards => Method::Shards,
        MethodArg::Minisim => Method::MiniSim,
    };
    if method == Method::Exact && (a.sampling.is_some() || a.max_samples.is_some()) {
        bail!("--method exact samples nothing: drop --sampling / --max-samples");
    }
    let sampling = match (a.sampling, a.max_samples) {
        (_, Some(n)) => Sampling::MaxSamples(n),
        (Some(r), None) => Sampling::Rate(r),
        (None, None) => Sampling::default(),
    };
    let policy = match a.policy {
        PolicyArg::Lru => Policy::Lru,
        PolicyArg::Fifo => Policy::Fifo,
        PolicyArg::S3fifo => Policy::S3Fifo,
    };
    let unit = match a.unit {
        UnitArg::Pages => Unit::Pages,
        UnitArg::Bytes => Unit::Bytes,
    };
    let grid = match (&a.sizes, a.points) {
        (Some(s), _) if s.is_empty() => bail!("--sizes needs at least one size"),
        (Some(s), _) => SizeGrid::Sizes(s.clone()),
        (None, Some(0)) => bail!("--points must be at least 1"),
        (None, p) => SizeGrid::Points(p.unwrap_or(100)),
    };
    // MiniSim's sizes come from the grid (profile() fills them in); validate the rest here.
    let c = MrcConfig { method, policy, sampling, unit, seed: DEFAULT_SEED, sizes: vec![1] };
    c.validate().context("bad flags")?;
    Ok((MrcConfig { sizes: Vec::new(), ..c }, grid))
}

pub fn run(a: MrcArgs) -> Result<()> {
    let (config, grid) = config(&a)?;
    let format = match (a.format, a.column) {
        (Some(FormatArg::OracleGeneral), Some(_)) => bail!("--column is for CSV traces"),
        (Some(FormatArg::Csv), c) => Format::Csv { column: c.unwrap_or(1) },
        (Some(FormatArg::OracleGeneral), None) => Format::OracleGeneral,
        (None, c) => match Format::guess(&a.trace) {
            Format::Csv { .. } => Format::Csv { column: c.unwrap_or(1) },
            _ if c.is_some() => bail!("--column is for CSV traces (give --format csv)"),
            f => f,
        },
    };
    let bar = if a.quiet { ProgressBar::hidden() } else { ProgressBar::new(0) };
    bar.set_style(
        ProgressStyle::with_template("{prefix} [{bar:40}] {bytes}/{total_bytes} {msg} ({eta})")
            .expect("a valid template")
            .progress_chars("=> "),
    );
    let trace = a.trace.clone();
    let mut open = || dd_trace::open(&trace, &format);
    let mut on_progress = |p: dd_mrc::profile::Progress| {
        if let Some(total) = p.total_bytes {
            bar.set_length(total);
        }
        bar.set_prefix(if p.pass == 0 { "footprint" } else { "curve" });
        bar.set_position(p.bytes_read);
        bar.set_message(format!("{:.1} M requests", p.requests as f64 / 1e6));
    };
    let start = dd_bench::thread_cpu_s();
    let result = profile(&mut open, &config, &grid, &mut on_progress)
        .with_context(|| format!("profiling {}", a.trace.display()))?;
    let cpu = dd_bench::thread_cpu_s() - start;
    bar.finish_and_clear();
    if !a.quiet {
        errln!(
            "{} requests in {cpu:.2} CPU s: {:.1} M requests per CPU second",
            result.requests,
            result.requests as f64 / cpu.max(1e-9) / 1e6
        );
    }
    if let Some(path) = &a.plot {
        let label = format!("{} {}", method_name(result.method), policy_name(result.policy));
        let title = format!("{} ({} requests)", a.trace.display(), result.requests);
        dd_mrc::plot::write_png(path, &title, &[(&label, &result.curve)], &[])?;
    }
    if a.json {
        outln!("{}", serde_json::to_string(&json(&result, config.unit))?);
    } else {
        print_table(&result, config.unit);
    }
    Ok(())
}

fn method_name(m: Method) -> &'static str {
    match m {
        Method::Exact => "exact",
        Method::Shards => "shards",
        Method::MiniSim => "minisim",
    }
}

fn policy_name(p: Policy) -> &'static str {
    match p {
        Policy::Lru => "lru",
        Policy::Fifo => "fifo",
        Policy::S3Fifo => "s3fifo",
    }
}

/// The document issue 14 specifies; in bytes the sizes are under `sizes_bytes` instead.
fn json(p: &Profile, unit: Unit) -> serde_json::Value {
    let sizes_key = match unit {
        Unit::Pages => "sizes_pages",
        Unit::Bytes => "sizes_bytes",
    };
    let mut doc = serde_json::json!({
        "method": method_name(p.method),
        "policy": policy_name(p.policy),
        "requests": p.requests,
        "unique": p.unique,
        "sampling_rate": p.sampling_rate,
        "miss_ratio": p.miss_ratio,
    });
    doc[sizes_key] = serde_json::json!(p.sizes);
    doc
}

fn print_table(p: &Profile, unit: Unit) {
    outln!(
        "method {}, policy {}, {} requests, {} unique ids{}, sampling rate {}",
        method_name(p.method),
        policy_name(p.policy),
        p.requests,
        p.unique,
        if p.method == Method::Exact { "" } else { " (estimated)" },
        p.sampling_rate
    );
    let unit = match unit {
        Unit::Pages => "pages",
        Unit::Bytes => "bytes",
    };
    outln!("{:>14}  miss_ratio", format!("size_{unit}"));
    for (s, m) in p.sizes.iter().zip(&p.miss_ratio) {
        outln!("{s:>14}  {m:.6}");
    }
}
