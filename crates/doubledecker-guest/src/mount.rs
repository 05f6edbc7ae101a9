//! `doubledecker mount BACKING MOUNTPOINT`: serves the DoubleDecker FUSE filesystem in the foreground
//! until SIGINT or SIGTERM, then unmounts (nothing is left mounted) and prints the containers' counters.

use anyhow::{Context, Result};
use clap::Args;
use dd_fuse::{FuseConfig, Mount};
use dd_guest::watch::DaemonConfig;
use signal_hook::consts::{SIGINT, SIGTERM};
use std::path::PathBuf;

#[derive(Args, Debug)]
pub struct MountArgs {
    /// The directory whose files are served.
    backing: PathBuf,
    /// Where to mount it (an existing empty directory).
    mountpoint: PathBuf,
    /// TOML configuration (the keys of README's "Mounting for a container"); the flags below override it.
    #[arg(long)]
    config: Option<PathBuf>,
    /// The daemon's data-plane Unix socket (the second level; without a daemon only first levels run).
    #[arg(long)]
    socket: Option<PathBuf>,
    /// The daemon's data-plane TCP address, instead of --socket.
    #[arg(long)]
    tcp: Option<String>,
    /// TLS to --tcp: the PEM file of the CA that signed the daemon's certificate (the daemon's `[tls]`).
    #[arg(long, env = "DD_TLS_CA_FILE")]
    tls_ca: Option<PathBuf>,
    /// This VM's id on the daemon.
    #[arg(long)]
    vm: Option<u32>,
    /// This VM's data-plane token (printed by `vm add`); overrides the file's `daemon.data_token`.
    #[arg(long, env = "DD_VM_DATA_TOKEN", hide_env_values = true)]
    token: Option<String>,
    /// Containers are the child cgroups of this directory (as for `guest watch`).
    #[arg(long)]
    cgroup_parent: Option<PathBuf>,
    /// The state file of `guest watch` (container -> pool).
    #[arg(long)]
    state_file: Option<PathBuf>,
    /// First-level page cache per container, in bytes.
    #[arg(long)]
    budget_bytes: Option<u64>,
    /// Artificial latency of each backing-store read request, in microseconds.
    #[arg(long)]
    backing_read_latency_us: Option<u64>,
    /// FUSE request threads.
    #[arg(long)]
    threads: Option<usize>,
}

fn config(a: &MountArgs) -> Result<FuseConfig> {
    let mut cfg = match &a.config {
        Some(p) => FuseConfig::from_file(p)?,
        None => FuseConfig::default(),
    };
    if a.socket.is_some() || a.tcp.is_some() || a.vm.is_some() {
        let d = cfg.daemon.get_or_insert_with(DaemonConfig::default);
        if a.socket.is_some() || a.tcp.is_some() {
            d.unix_socket = a.socket.clone();
            d.tcp = a.tcp.clone();
        }
        if let Some(vm) = a.vm {
            d.vm = vm;
        }
    }
    if let (Some(d), Some(t)) = (cfg.daemon.as_mut(), &a.token) {
        d.data_token = t.clone();
    }
    if let (Some(d), Some(ca)) = (cfg.daemon.as_mut(), &a.tls_ca) {
        d.tls_ca_file = Some(ca.clone());
    }
    if let Some(p) = &a.cgroup_parent {
        cfg.cgroup_parent = Some(p.clone());
    }
    if let Some(p) = &a.state_file {
        cfg.state_file = p.clone();
    }
    if let Some(b) = a.budget_bytes {
        cfg.default_budget_bytes = b;
    }
    if let Some(l) = a.backing_read_latency_us {
        cfg.backing_read_latency_us = l;
    }
    if let Some(t) = a.threads {
        cfg.threads = t;
    }
    cfg.validate()?;
    Ok(cfg)
}

pub fn run(a: MountArgs) -> Result<()> {
    let cfg = config(&a)?;
    let mut m = Mount::new(cfg, &a.backing, &a.mountpoint).context("mounting")?;
    let mut unmounter = m.unmounter();
    let mut signals =
        signal_hook::iterator::Signals::new([SIGINT, SIGTERM]).context("installing signal handlers")?;
    let handle = signals.handle();
    let mountpoint = a.mountpoint.clone();
    let waiter = std::thread::spawn(move || {
        if signals.forever().next().is_some() {
            if let Err(e) = unmounter.unmount() {
                errln!("doubledecker mount: unmounting {}: {e}", mountpoint.display());
            }
        }
    });
    errln!("doubledecker mount: {} on {}", a.backing.display(), a.mountpoint.display());
    let stats = m.run();
    handle.close();
    let _ = waiter.join();
    let stats = stats?;
    outln!("{}", serde_json::to_string(&serde_json::json!({ "containers": stats }))?);
    Ok(())
}
