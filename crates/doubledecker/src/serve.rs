//! `doubledecker serve` and `doubledecker config default`: run the host cache manager (`dd-server`)
//! on a multi-threaded tokio runtime until SIGINT/SIGTERM.

use anyhow::{Context, Result};
use clap::{Args, Subcommand};
use std::path::PathBuf;

#[derive(Args, Debug)]
pub struct ServeArgs {
    /// Configuration file (TOML), merged over the embedded default (`doubledecker config default`).
    #[arg(long)]
    config: Option<PathBuf>,
}

#[derive(Subcommand, Debug)]
pub enum ConfigCommand {
    /// Print the embedded default configuration.
    Default,
    /// Check a configuration file and print the configuration it gives.
    Check { file: PathBuf },
}

pub fn serve(a: ServeArgs) -> Result<()> {
    // An invalid configuration stops here with one message naming the field.
    let cfg = dd_server::ServerConfig::load(a.config.as_deref())?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("dd-serve")
        .build()
        .context("starting the async runtime")?;
    rt.block_on(dd_server::run(cfg, dd_server::shutdown_signal(), |b| {
        let tcp = b.tcp.map_or("off".to_string(), |a| a.to_string());
        let unix = b.unix.as_ref().map_or("off".to_string(), |p| p.display().to_string());
        errln!("doubledecker serve: data plane tcp {tcp}, unix {unix}; admin API http://{}", b.admin);
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
        ConfigCommand::Check { file } => {
            let cfg = dd_server::ServerConfig::load(Some(&file))?;
            out!("{}", toml::to_string(&cfg)?);
        }
    }
    Ok(())
}
