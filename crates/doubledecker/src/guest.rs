//! `doubledecker guest ...`: the guest-side tools (inside a VM).

use anyhow::{Context, Result};
use clap::{Args, Subcommand};
use dd_guest::{WatchConfig, Watcher};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

#[derive(Subcommand, Debug)]
pub enum GuestCommand {
    /// Watch a cgroup hierarchy: a pool per container cgroup, created, respecified and destroyed as
    /// cgroups come, change and go.
    Watch(WatchArgs),
}

#[derive(Args, Debug)]
pub struct WatchArgs {
    /// The watcher's TOML configuration.
    #[arg(long)]
    config: PathBuf,
    /// This VM's data-plane token (printed by `vm add`); overrides the file's `daemon.data_token`.
    #[arg(long, env = "DD_VM_DATA_TOKEN", hide_env_values = true)]
    token: Option<String>,
    /// Reconcile once and exit, leaving the pools in place (for scripts).
    #[arg(long)]
    once: bool,
}

pub fn run(cmd: GuestCommand) -> Result<()> {
    match cmd {
        GuestCommand::Watch(a) => {
            let cfg = WatchConfig::load(&a.config, a.token.as_deref())?;
            let interval = Duration::from_millis(cfg.poll_interval_ms);
            let mut w = Watcher::new(cfg)?;
            if a.once {
                let ch = w.round()?;
                if ch.away {
                    anyhow::bail!("the daemon at {} cannot be reached", w.config().endpoint().address());
                }
                outln!("{}", serde_json::to_string(&ch)?);
                return Ok(());
            }
            let stop = Arc::new(AtomicBool::new(false));
            for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
                signal_hook::flag::register(sig, stop.clone()).context("installing signal handlers")?;
            }
            while !stop.load(Ordering::Relaxed) {
                let ch = w.round()?;
                if !ch.lost.is_empty() {
                    errln!(
                        "guest watch: the daemon restarted; creating the pools of {} again",
                        ch.lost.join(", ")
                    );
                }
                for n in &ch.adopted {
                    errln!("guest watch: {n}: pool {} adopted", w.pools()[n].pool.0);
                }
                for n in &ch.created {
                    errln!("guest watch: {n}: pool {} created", w.pools()[n].pool.0);
                }
                for n in &ch.respecified {
                    errln!("guest watch: {n}: spec {:?}", w.pools()[n].spec);
                }
                for n in &ch.destroyed {
                    errln!("guest watch: {n}: pool destroyed");
                }
                std::thread::sleep(interval);
            }
            // Nothing left behind: the pools this watcher created go with it.
            w.shutdown()?;
        }
    }
    Ok(())
}
