//! `doubledecker guest ...`: the guest-side tools (inside a VM).

use anyhow::{Context, Result};
use clap::{Args, Subcommand};
use dd_guest::{GuestProvisioner, ProvisionFileConfig, WatchConfig, Watcher};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

#[derive(Subcommand, Debug)]
pub enum GuestCommand {
    /// Watch a cgroup hierarchy: a pool per container cgroup, created, respecified and destroyed as
    /// cgroups come, change and go.
    Watch(WatchArgs),
    /// Provision the containers of a `doubledecker mount` to targets: from the curves the mount samples,
    /// set each one's first-level budget, pool spec and (where configured) cgroup memory limit. Prints
    /// each round's plan as a JSON line; an infeasible target is reported on stderr.
    Provision(ProvisionArgs),
}

#[derive(Args, Debug)]
pub struct ProvisionArgs {
    /// The provisioner's TOML configuration (`dd_guest::ProvisionFileConfig`).
    #[arg(long)]
    config: PathBuf,
    /// Print the plan for what the mount published now, change nothing, exit (3 if a target is
    /// infeasible).
    #[arg(long)]
    dry_run: bool,
    /// One round, applied, then exit (3 if a target is infeasible).
    #[arg(long)]
    once: bool,
}

/// Exit status of a one-shot round whose plan cannot meet every target.
const INFEASIBLE_EXIT: i32 = 3;

fn provision(a: ProvisionArgs) -> Result<()> {
    let cfg = ProvisionFileConfig::from_file(&a.config)?;
    let interval = Duration::from_millis(cfg.interval_ms);
    let mut p = GuestProvisioner::new(cfg).context("starting the provisioner")?;
    let report = |r: &dd_guest::provision::RoundReport| -> Result<()> {
        println!("{}", serde_json::to_string(r)?);
        if !r.feasible {
            eprintln!("guest provision: infeasible: {} (no plan meets their targets)", r.infeasible.join(", "));
        }
        Ok(())
    };
    if a.dry_run || a.once {
        let Some(r) = p.round(a.dry_run)? else {
            anyhow::bail!("the mount has published no container yet ({})", p.config().stats_file.display());
        };
        if a.dry_run {
            println!("{}", serde_json::to_string_pretty(&r)?);
            if !r.feasible {
                eprintln!("guest provision: infeasible: {}", r.infeasible.join(", "));
            }
        } else {
            report(&r)?;
        }
        if !r.feasible {
            std::process::exit(INFEASIBLE_EXIT);
        }
        return Ok(());
    }
    let stop = Arc::new(AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        signal_hook::flag::register(sig, stop.clone()).context("installing signal handlers")?;
    }
    while !stop.load(Ordering::Relaxed) {
        if let Some(r) = p.round(false)? {
            report(&r)?;
        }
        std::thread::sleep(interval);
    }
    Ok(())
}

#[derive(Args, Debug)]
pub struct WatchArgs {
    /// The watcher's TOML configuration.
    #[arg(long)]
    config: PathBuf,
    /// Reconcile once and exit, leaving the pools in place (for scripts).
    #[arg(long)]
    once: bool,
}

pub fn run(cmd: GuestCommand) -> Result<()> {
    match cmd {
        GuestCommand::Provision(a) => provision(a)?,
        GuestCommand::Watch(a) => {
            let cfg = WatchConfig::from_file(&a.config)?;
            let interval = Duration::from_millis(cfg.poll_interval_ms);
            let mut w = Watcher::new(cfg).context("connecting to the daemon")?;
            if a.once {
                let ch = w.round()?;
                println!("{}", serde_json::to_string(&ch)?);
                return Ok(());
            }
            let stop = Arc::new(AtomicBool::new(false));
            for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
                signal_hook::flag::register(sig, stop.clone()).context("installing signal handlers")?;
            }
            while !stop.load(Ordering::Relaxed) {
                let ch = w.round()?;
                for n in &ch.created {
                    eprintln!("guest watch: {n}: pool {} created", w.pools()[n].pool.0);
                }
                for n in &ch.respecified {
                    eprintln!("guest watch: {n}: spec {:?}", w.pools()[n].spec);
                }
                for n in &ch.destroyed {
                    eprintln!("guest watch: {n}: pool destroyed");
                }
                std::thread::sleep(interval);
            }
            // Nothing left behind: the pools this watcher created go with it.
            w.shutdown()?;
        }
    }
    Ok(())
}
