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
    #[arg(long)]
    config: PathBuf,
    /// Plan for this many bytes instead of the pressure signals' need.
    #[arg(long)]
    need_bytes: Option<u64>,
    #[arg(long)]
    json: bool,
}

const MIB: f64 = 1024.0 * 1024.0;

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
                    println!("{}", serde_json::to_string(r).unwrap_or_default());
                } else if r.need_bytes > 0 || !r.actions.is_empty() {
                    let freed: u64 = r.actions.iter().map(|x| x.freed).sum();
                    let usage: Vec<String> = r
                        .containers
                        .iter()
                        .map(|c| format!("{}={:.0}MiB", c.name, c.usage_after as f64 / MIB))
                        .collect();
                    println!(
                        "need {:.0} MiB, {} actions, freed {:.0} MiB; {}",
                        r.need_bytes as f64 / MIB,
                        r.actions.len(),
                        freed as f64 / MIB,
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
                println!(
                    "{}",
                    serde_json::json!({ "need_bytes": need, "containers": snap, "actions": actions })
                );
            } else {
                println!("need {:.1} MiB", need as f64 / MIB);
                println!(
                    "{:<20} {:>10} {:>7} {:>7} {:>12}",
                    "container", "usage MiB", "weight", "class", "exceed MiB"
                );
                let ex = dd_memctl::exceeds(&snap);
                for (c, e) in snap.iter().zip(ex) {
                    println!(
                        "{:<20} {:>10.1} {:>7} {:>7} {:>12.1}",
                        c.name,
                        c.usage_bytes as f64 / MIB,
                        c.weight,
                        format!("{:?}", c.class).to_lowercase(),
                        e as f64 / MIB
                    );
                }
                if actions.is_empty() {
                    println!("nothing to do");
                }
                for a in actions {
                    match a {
                        Action::Reclaim { index, bytes, reason } => {
                            println!(
                                "reclaim {:.1} MiB from {} ({reason:?})",
                                bytes as f64 / MIB,
                                snap[index].name
                            )
                        }
                        Action::Lru { members, bytes } => {
                            let names: Vec<&str> = members.iter().map(|&i| snap[i].name.as_str()).collect();
                            println!(
                                "reclaim {:.1} MiB from the LRU of {}",
                                bytes as f64 / MIB,
                                names.join(", ")
                            )
                        }
                        Action::None => println!("nothing to do"),
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
