//! The `doubledecker-guest` command line: the guest's commands only, built without the host's crates
//! (its size against the host binary's: README, "Installing").
#![forbid(unsafe_code)] // nothing here needs it: unsafe code lives in dd-engine, dd-fuse, dd-memctl and the few FFI calls of the other crates

use anyhow::Result;
use clap::{Parser, Subcommand};
use doubledecker_guest::{guest, logging, mount};

/// DoubleDecker inside a VM: the cgroup watcher, the provisioner and the FUSE mount (the same commands
/// and flags as `doubledecker guest ...` and `doubledecker mount`).
#[derive(Parser, Debug)]
#[command(name = "doubledecker-guest", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    #[command(flatten)]
    Guest(guest::GuestCommand),
    /// Serve a backing directory through DoubleDecker (FUSE): per-container first-level page caches whose
    /// evicted pages go to the containers' pools. Foreground; SIGINT/SIGTERM unmount.
    Mount(mount::MountArgs),
}

fn main() -> Result<()> {
    logging::init();
    match Cli::parse().command {
        Command::Guest(which) => guest::run(which),
        Command::Mount(a) => mount::run(a),
    }
}
