//! The `doubledecker` command line. Thin: parses arguments, calls into the library crates, prints.
#![forbid(unsafe_code)] // nothing here needs it: unsafe code lives in dd-engine, dd-fuse, dd-memctl and the few FFI calls of the other crates

// `outln!`, `out!`, `errln!`: the printing that never panics, shared with the guest's binary
// (`doubledecker_guest::out`).
#[macro_use]
extern crate doubledecker_guest;

mod admin_cli;
mod bench;
mod bench_tenants;
mod lab;
mod lab_sweep;
mod memctl;
mod mrc;
mod serve;
mod soak;

use anyhow::Result;
use clap::{Parser, Subcommand};
use doubledecker_guest::{guest, mount};

/// DoubleDecker: differentiated, deterministic memory for containers in virtual machines.
#[derive(Parser, Debug)]
#[command(name = "doubledecker", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Benchmarks, each against a baseline measured in the same run (results as ratios).
    Bench {
        #[command(subcommand)]
        which: bench::BenchCommand,
    },
    /// The container memory controller on real cgroups: under memory pressure, usage follows the containers'
    /// weights.
    Memctl {
        #[command(subcommand)]
        which: memctl::MemctlCommand,
    },
    /// Run the host cache manager: data plane (Unix socket, TCP) and admin API.
    Serve(serve::ServeArgs),
    /// Host scope: register, list, reweigh and remove VMs (admin API).
    Vm {
        #[command(flatten)]
        conn: admin_cli::HostConn,
        #[command(subcommand)]
        which: admin_cli::VmCommand,
    },
    /// VM scope: a VM's pools (containers) and their specs (admin API, the VM's admin token).
    Pool {
        #[command(flatten)]
        conn: admin_cli::VmConn,
        #[command(subcommand)]
        which: admin_cli::PoolCommand,
    },
    /// Statistics of the host (host token) or of one VM (`--vm`, the VM's admin token); sizes in pages.
    Stats {
        #[command(flatten)]
        conn: admin_cli::StatsConn,
        #[command(flatten)]
        args: admin_cli::StatsArgs,
    },
    /// Mixed load on a real daemon for a while; checks bounded memory and the stats identity.
    Soak(soak::SoakArgs),
    /// The daemon's configuration.
    Config {
        #[command(subcommand)]
        which: serve::ConfigCommand,
    },
    /// Guest-side tools (inside a VM): the cgroup watcher (`watch`) and the provisioner (`provision`).
    Guest {
        #[command(subcommand)]
        which: guest::GuestCommand,
    },
    /// Serve a backing directory through DoubleDecker (FUSE): per-container first-level page caches whose
    /// evicted pages go to the containers' pools. Foreground; SIGINT/SIGTERM unmount.
    Mount(mount::MountArgs),
    /// A trace's miss-ratio curve: exact LRU, SHARDS, or miniature simulation of LRU / FIFO / S3-FIFO
    /// (CSV or libCacheSim oracle-general traces).
    Mrc(mrc::MrcArgs),
    /// The lab: a deterministic emulator of hosts, VMs, guest page caches and workloads (docs/scenario-format.md).
    Lab {
        #[command(subcommand)]
        which: lab::LabCommand,
    },
}

fn main() -> Result<()> {
    doubledecker_guest::logging::init();
    let cli = Cli::parse();
    match cli.command {
        Command::Bench { which } => bench::run(which),
        Command::Memctl { which } => memctl::run(which),
        Command::Serve(a) => {
            // One message, no backtrace: an operator reads this, and it names the bad field.
            if let Err(e) = serve::serve(a) {
                errln!("doubledecker serve: {e:#}");
                std::process::exit(2);
            }
            Ok(())
        }
        Command::Config { which } => serve::config(which),
        Command::Soak(a) => soak::run(a),
        Command::Vm { conn, which } => admin_cli::vm(&conn, which),
        Command::Pool { conn, which } => admin_cli::pool(&conn, which),
        Command::Stats { conn, args } => admin_cli::stats(&conn, args),
        Command::Lab { which } => lab::run(which),
        Command::Guest { which } => guest::run(which),
        Command::Mount(a) => mount::run(a),
        Command::Mrc(a) => mrc::run(a),
    }
}
