//! `doubledecker memctl ...`: the proportional memory controller on real cgroups.

use anyhow::{Context, Result};
use clap::{Args, Subcommand};
use dd_memctl::cgroup::RealIo;
use dd_memctl::daemon::{Controller, MemctlConfig};
use dd_memctl::decide::Action;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

#[derive(Subcommand, Debug)]
pub enum MemctlCommand {
    /// Run the controller: every interval, reclaim bounded chunks so usage follows the weights.
    Run(RunArgs),
    /// Print the snapshot and what one round would do, without doing it.
    Plan(PlanArgs),
}

#[derive(Args, Debug)]
pub struct RunArgs {
    /// The controller's TOML configuration.
    #[arg(long)]
    config: PathBuf,
    /// Run one round and exit.
    #[arg(long)]
    once: bool,
    /// Print each round's report as one JSON line.
    #[arg(long)]
    json: bool,
}

#[derive(Args, Debug)]
pub struct PlanArgs {
    /// The controller's TOML configuration (as for `memctl run`).
    #[arg(long)]
    config: PathBuf,
    /// Plan for this many bytes instead of the pressure signals' need.
    #[arg(long)]
    need_bytes: Option<u64>,
    /// Print the plan as one JSON document.
    #[arg(long)]
    json: bool,
}

/// How far a container is above (positive) or below (negative) its weight's share, for people.
fn signed_size(e: i128) -> String {
    let abs = size(u64::try_from(e.unsigned_abs()).unwrap_or(u64::MAX));
    if e < 0 {
        format!("-{abs}")
    } else {
        abs
    }
}

/// A size for people: bytes, KiB, MiB or GiB with one decimal, never "0.0 MiB" for a few pages.
fn size(b: u64) -> String {
    const UNITS: [(&str, u64); 3] = [("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)];
    for (unit, n) in UNITS {
        if b >= n {
            return format!("{:.1} {unit}", b as f64 / n as f64);
        }
    }
    format!("{b} B")
}

pub fn run(cmd: MemctlCommand) -> Result<()> {
    match cmd {
        MemctlCommand::Run(a) => {
            let cfg = MemctlConfig::from_file(&a.config)?;
            let mut ctl = Controller::new(cfg, RealIo).context("starting the memory controller")?;
            let stop = Arc::new(AtomicBool::new(false));
            for sig in [libc_sigint(), libc_sigterm()] {
                signal_hook_flag(sig, stop.clone());
            }
            let json = a.json;
            let print = move |r: &dd_memctl::daemon::RoundReport| {
                if json {
                    outln!("{}", serde_json::to_string(r).unwrap_or_default());
                } else if r.need_bytes > 0 || !r.actions.is_empty() {
                    let freed: u64 = r.actions.iter().map(|x| x.freed).sum();
                    let usage: Vec<String> =
                        r.containers.iter().map(|c| format!("{}={}", c.name, size(c.usage_after))).collect();
                    outln!(
                        "need {}, {} actions, freed {}; {}",
                        size(r.need_bytes),
                        r.actions.len(),
                        size(freed),
                        usage.join(" ")
                    );
                }
            };
            if a.once {
                print(&ctl.round(None));
            } else {
                ctl.run(print, || stop.load(Ordering::Relaxed));
            }
        }
        MemctlCommand::Plan(a) => {
            let cfg = MemctlConfig::from_file(&a.config)?;
            let mut ctl = Controller::new(cfg, RealIo).context("starting the memory controller")?;
            let (need, snap, actions) = ctl.plan(a.need_bytes);
            if a.json {
                outln!(
                    "{}",
                    serde_json::json!({ "need_bytes": need, "containers": snap, "actions": actions })
                );
            } else {
                outln!("need {}", size(need));
                outln!(
                    "{:<20} {:>10} {:>7} {:>7} {:>12}",
                    "container",
                    "usage",
                    "weight",
                    "class",
                    "exceeds by"
                );
                let ex = dd_memctl::exceeds(&snap);
                for (c, e) in snap.iter().zip(ex) {
                    outln!(
                        "{:<20} {:>10} {:>7} {:>7} {:>12}",
                        c.name,
                        size(c.usage_bytes),
                        c.weight,
                        format!("{:?}", c.class).to_lowercase(),
                        signed_size(e)
                    );
                }
                if actions.is_empty() {
                    outln!("nothing to do");
                }
                for a in actions {
                    match a {
                        Action::Reclaim { index, bytes, reason } => {
                            outln!("reclaim {} from {} ({reason:?})", size(bytes), snap[index].name)
                        }
                        Action::Lru { members, bytes } => {
                            let names: Vec<&str> = members.iter().map(|&i| snap[i].name.as_str()).collect();
                            outln!("reclaim {} from the LRU of {}", size(bytes), names.join(", "))
                        }
                        Action::None => outln!("nothing to do"),
                    }
                }
            }
        }
    }
    Ok(())
}

fn libc_sigint() -> i32 {
    2
}
fn libc_sigterm() -> i32 {
    15
}

/// Sets `flag` when the signal arrives; the controller checks it between rounds, so a round in progress
/// (and the limit restores in it) always completes.
fn signal_hook_flag(sig: i32, flag: Arc<AtomicBool>) {
    let _ = signal_hook::flag::register(sig, flag);
}
