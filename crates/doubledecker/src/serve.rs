//! `doubledecker serve`, `doubledecker config default|check|coop-key`: run the host cache manager (`dd-server`)
//! on a multi-threaded tokio runtime until SIGINT/SIGTERM.

use anyhow::{Context, Result};
use clap::{Args, Subcommand};
use std::path::PathBuf;

#[derive(Args, Debug)]
pub struct ServeArgs {
    /// Configuration file (TOML), merged over the embedded default (`doubledecker config default`).
    #[arg(long)]
    config: Option<PathBuf>,
    /// Record what every data-plane and peer connection receives and sends into this folder, one file
    /// per connection (overrides `capture.dir`; bounded by the `[capture]` limits): the raw traffic the
    /// fuzz corpora are made from (fuzz/README.md). The files hold tokens and pages in clear. The
    /// environment variable reaches the daemons that benchmarks and tests start.
    #[arg(long, env = "DD_CAPTURE_DIR")]
    capture_dir: Option<PathBuf>,
}

#[derive(Subcommand, Debug)]
pub enum ConfigCommand {
    /// Print the embedded default configuration.
    Default,
    /// Check a configuration file without starting anything: exits non-zero with a message naming the
    /// bad field, else prints the configuration it gives (`serve`'s, with every default filled in).
    Check {
        /// The TOML file.
        file: PathBuf,
        /// Which command's configuration it is.
        #[arg(long = "for", value_enum, default_value_t = ConfigKind::Serve)]
        kind: ConfigKind,
        /// Print nothing when the file is good (for scripts and systemd's ExecStartPre).
        #[arg(long)]
        quiet: bool,
    },
    /// A co-operative de-duplication key (`coop.key_file`): creates FILE (mode 0600) if it does not
    /// exist, and prints its public key, which goes into the other members' `coop.peers`.
    CoopKey {
        /// The key file.
        file: PathBuf,
    },
}

/// The commands that read a TOML configuration.
#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConfigKind {
    /// `doubledecker serve --config`.
    Serve,
    /// `doubledecker guest watch --config` (the data token may come from DD_VM_DATA_TOKEN).
    GuestWatch,
    /// `doubledecker mount --config` (the data token may come from DD_VM_DATA_TOKEN).
    Mount,
    /// `doubledecker memctl run --config` and `memctl plan --config`.
    Memctl,
    /// `doubledecker guest provision --config` (the tokens may come from DD_VM_DATA_TOKEN and
    /// DD_VM_ADMIN_TOKEN).
    GuestProvision,
}

pub fn serve(a: ServeArgs) -> Result<()> {
    // An invalid configuration stops here with one message naming the field.
    let mut cfg = dd_server::ServerConfig::load(a.config.as_deref())?;
    if let Some(dir) = a.capture_dir.filter(|d| !d.as_os_str().is_empty()) {
        cfg.capture.dir = dir;
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        // Bounded: the runtime keeps an idle blocking thread for as long as work wakes it within its
        // keep-alive, so under steady load the pool only grows (`limits.max_blocking_threads`, of which
        // the session runtimes have the other half: `dd_server::sessions`).
        .max_blocking_threads(dd_server::sessions::main_blocking_threads(cfg.limits.max_blocking_threads))
        .thread_name("dd-serve")
        .build()
        .context("starting the async runtime")?;
    let signal = {
        let _in = rt.enter();
        dd_server::shutdown_signal()
    };
    rt.block_on(dd_server::run(cfg, signal, |b| {
        let tcp = match (b.tcp, b.tls_data_plane) {
            (None, _) => "off".to_string(),
            (Some(a), false) => a.to_string(),
            (Some(a), true) => format!("{a} (TLS)"),
        };
        let unix = b.unix.as_ref().map_or("off".to_string(), |p| p.display().to_string());
        let scheme = if b.tls_admin { "https" } else { "http" };
        errln!("doubledecker serve: data plane tcp {tcp}, unix {unix}; admin API {scheme}://{}", b.admin);
        if let Some(t) = &b.token_file {
            errln!("doubledecker serve: host admin token in {}", t.display());
        }
    }))?;
    errln!("doubledecker serve: stopped");
    Ok(())
}

pub fn config(c: ConfigCommand) -> Result<()> {
    match c {
        ConfigCommand::Default => out!("{}", dd_server::config::DEFAULT_TOML),
        ConfigCommand::Check { file, kind, quiet } => {
            // Each loader validates and names the bad field in its error.
            // The others carry tokens: only the verdict is printed for them.
            let text = match kind {
                ConfigKind::Serve => toml::to_string(&dd_server::ServerConfig::load(Some(&file))?)?,
                ConfigKind::GuestWatch => dd_guest::WatchConfig::from_file(&file).map(|_| String::new())?,
                ConfigKind::Mount => dd_fuse::FuseConfig::from_file(&file).map(|_| String::new())?,
                ConfigKind::GuestProvision => {
                    dd_guest::ProvisionFileConfig::load(&file, None).map(|_| String::new())?
                }
                ConfigKind::Memctl => {
                    // Valid as text and usable on this host: its cgroup parent is there.
                    let c = dd_memctl::daemon::MemctlConfig::from_file(&file)?;
                    c.check_host()?;
                    String::new()
                }
            };
            if !quiet {
                if text.is_empty() {
                    outln!("{}: a valid {kind:?} configuration", file.display());
                } else {
                    out!("{text}");
                }
            }
        }
        ConfigCommand::CoopKey { file } => {
            let key = dd_server::coop::load_or_create_key(&file)?;
            outln!("{}", key.public_text());
        }
    }
    Ok(())
}
