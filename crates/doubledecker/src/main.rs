//! The `doubledecker` command line. Thin: parses arguments, calls into the library crates, prints.

mod bench;
mod serve;

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
    /// Run the host cache manager: data plane (Unix socket, TCP) and admin API.
    Serve(serve::ServeArgs),
    /// The daemon's configuration.
    Config {
        #[command(subcommand)]
        which: serve::ConfigCommand,
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
        Command::Serve(a) => {
            // One message, no backtrace: an operator reads this, and it names the bad field.
            if let Err(e) = serve::serve(a) {
                eprintln!("doubledecker serve: {e:#}");
                std::process::exit(2);
            }
            Ok(())
        }
        Command::Config { which } => serve::config(which),
    }
}
