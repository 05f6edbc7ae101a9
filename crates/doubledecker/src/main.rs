//! The `doubledecker` command line. Thin: parses arguments, calls into the library crates, prints.

mod bench;
mod lab;

use anyhow::Result;
use clap::{Parser, Subcommand};

/// DoubleDecker: differentiated, deterministic memory for containers in virtual machines.
#[derive(Parser, Debug)]
#[command(name = "doubledecker", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Benchmarks against same-run baselines (SPEC section 11).
    Bench {
        #[command(subcommand)]
        which: bench::BenchCommand,
    },
    /// The lab: a deterministic emulator of hosts, VMs, guest page caches and workloads (SPEC section 10).
    Lab {
        #[command(subcommand)]
        which: lab::LabCommand,
    },
}

fn main() -> Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    match cli.command {
        Command::Bench { which } => bench::run(which),
        Command::Lab { which } => lab::run(which),
    }
}
