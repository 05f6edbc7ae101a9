//! `doubledecker guest ...`: the guest-side tools (inside a VM).

use anyhow::{Context, Result};
use clap::{Args, Subcommand};
use dd_guest::{GuestProvisioner, ProvisionFileConfig, RoundReport, WatchConfig, Watcher};
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
    /// each round's plan as a JSON line; an infeasible target is reported on stderr; with `[admin]` each
    /// round is also reported to the daemon's admin API (`DD_VM_ADMIN_TOKEN`), where `/ui/` shows it.
    Provision(ProvisionArgs),
    /// Put (or, with `--get`, get back and check) pages of known content in one of this VM's pools, as
    /// a guest's page cache would: a load for demonstrations and smoke tests (README, "Two daemons as
    /// peers"). Page `i` of object `--object` holds bytes drawn from `--content` and `i`, so two runs with
    /// the same `--content` write equal pages (on two daemons: pages a peer holds too). Prints one JSON
    /// line: the pool, pages put and stored, or gets, hits and wrong pages (exit status 1 on a wrong page).
    Pages(PagesArgs),
}

#[derive(Args, Debug)]
pub struct PagesArgs {
    /// The daemon's data plane, `host:port`.
    #[arg(long)]
    tcp: String,
    /// This VM's id.
    #[arg(long)]
    vm: u32,
    /// This VM's data-plane token (printed by `vm add`).
    #[arg(long, env = "DD_VM_DATA_TOKEN", hide_env_values = true)]
    token: String,
    /// The pool; without it a new memory pool (weight 100) is created and its id printed.
    #[arg(long)]
    pool: Option<u32>,
    /// The object (file) the pages belong to.
    #[arg(long, default_value_t = 1)]
    object: u64,
    /// How many pages, indices 0 to N - 1.
    #[arg(long)]
    pages: u64,
    /// What the pages hold: equal values give equal pages.
    #[arg(long, default_value_t = 1)]
    content: u64,
    /// Get the pages back instead of putting them, and check every hit's bytes.
    #[arg(long)]
    get: bool,
}

#[derive(Args, Debug)]
pub struct ProvisionArgs {
    /// The provisioner's TOML configuration (README "Provisioning to targets", "On a real guest").
    #[arg(long)]
    config: PathBuf,
    /// This VM's data-plane token (printed by `vm add`); overrides the file's `daemon.data_token`.
    #[arg(long, env = "DD_VM_DATA_TOKEN", hide_env_values = true)]
    token: Option<String>,
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

fn say_infeasible(r: &RoundReport) {
    if !r.feasible {
        errln!(
            "guest provision: infeasible: {} (no plan within the budget meets their targets)",
            r.infeasible.join(", ")
        );
    }
}

/// Sends an applied round to the admin API (`[admin]`); a daemon that cannot take it is said, and the
/// rounds go on (the settings are applied whether or not anyone watches).
fn report_to_admin(p: &GuestProvisioner, r: &RoundReport) {
    if let Err(e) = p.publish(r) {
        errln!("guest provision: {e}");
    }
}

fn provision(a: ProvisionArgs) -> Result<()> {
    let cfg = ProvisionFileConfig::load(&a.config, a.token.as_deref())?;
    let interval = Duration::from_millis(cfg.interval_ms);
    let mut p = GuestProvisioner::new(cfg).context("starting the provisioner")?;
    if a.dry_run || a.once {
        let Some(r) = p.round(a.dry_run)? else {
            anyhow::bail!(
                "the mount has published no container, or no container's curve, yet ({})",
                p.config().stats_file.display()
            );
        };
        if a.dry_run {
            outln!("{}", serde_json::to_string_pretty(&r)?);
        } else {
            outln!("{}", serde_json::to_string(&r)?);
            report_to_admin(&p, &r);
        }
        say_infeasible(&r);
        if !r.feasible {
            std::process::exit(INFEASIBLE_EXIT);
        }
        return Ok(());
    }
    let stop = Arc::new(AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        signal_hook::flag::register(sig, stop.clone()).context("installing signal handlers")?;
    }
    let mut p = p.in_a_loop();
    while !stop.load(Ordering::Relaxed) {
        match p.round(false) {
            Ok(Some(r)) => {
                outln!("{}", serde_json::to_string(&r)?);
                say_infeasible(&r);
                report_to_admin(&p, &r);
            }
            Ok(None) => {}
            // The daemon away, a file being replaced: said, and the next round tries again.
            Err(e) => errln!("guest provision: {e}"),
        }
        // Sleep in short steps so that a signal does not wait a whole interval.
        let until = std::time::Instant::now() + interval;
        while !stop.load(Ordering::Relaxed) && std::time::Instant::now() < until {
            std::thread::sleep(Duration::from_millis(50).min(interval));
        }
    }
    Ok(())
}

/// Page `index` of content `seed`: SplitMix64 of both, so that every page differs from every other.
fn page_bytes(seed: u64, object: u64, index: u64, out: &mut [u8]) {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ object.rotate_left(32) ^ index;
    for chunk in out.chunks_mut(8) {
        x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = x;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        chunk.copy_from_slice(&(z ^ (z >> 31)).to_le_bytes()[..chunk.len()]);
    }
}

fn pages(a: PagesArgs) -> Result<()> {
    use dd_types::{Key, PoolId, PoolOptions, PutOutcome, Spec};
    let mut c = dd_client::Client::connect_tcp(&a.tcp, a.vm, &a.token)
        .with_context(|| format!("connecting to {} as VM {}", a.tcp, a.vm))?;
    let pool = match a.pool {
        Some(p) => PoolId(p),
        None => c.create_cgroup(PoolOptions::ephemeral(Spec::Mem { weight: 100 }))?,
    };
    let ps = c.info().page_size;
    let mut page = vec![0u8; ps];
    let mut got = vec![0u8; ps];
    let (mut done, mut hits, mut wrong) = (0u64, 0u64, 0u64);
    for i in 0..a.pages {
        page_bytes(a.content, a.object, i, &mut page);
        let key = Key::new(a.object, i);
        if a.get {
            if c.get(pool, key, &mut got)? {
                hits += 1;
                wrong += u64::from(got != page);
            }
        } else if matches!(c.put(pool, key, &page)?, PutOutcome::Stored(_)) {
            done += 1;
        }
    }
    if a.get {
        outln!("{}", serde_json::json!({"pool": pool.0, "gets": a.pages, "hits": hits, "wrong": wrong}));
        anyhow::ensure!(wrong == 0, "{wrong} page(s) came back with other bytes than were put");
    } else {
        outln!("{}", serde_json::json!({"pool": pool.0, "put": a.pages, "stored": done}));
    }
    Ok(())
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
        GuestCommand::Provision(a) => provision(a)?,
        GuestCommand::Pages(a) => pages(a)?,
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
