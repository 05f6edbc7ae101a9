//! The filesystem's configuration: plain serde data with documented defaults and one `validate()` that
//! names the bad field.
//!
//! Invariant: a [`FuseConfig`] that passed [`FuseConfig::validate`] has a budget of at least one page for
//! every container, at least one request thread, and, if it names a daemon, a way to reach it and a
//! token.

use dd_guest::watch::DaemonConfig;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// Page size of the first-level caches and of the daemon's pools.
pub const PAGE_SIZE: usize = 4096;

/// One container's overrides.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ContainerBudget {
    /// Bytes of this container's first-level page cache (rounded down to whole pages).
    pub budget_bytes: u64,
}

/// `doubledecker mount`'s configuration file (TOML).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FuseConfig {
    /// The daemon (the second level). Without it the filesystem runs with first-level caches only, which
    /// is the baseline of `bench fuse`.
    #[serde(default)]
    pub daemon: Option<DaemonConfig>,
    /// Containers are the child cgroups of this directory (v1 memory or v2), as for `guest watch`.
    /// Without it every request is unattributed (one shared first-level cache, no pool).
    #[serde(default)]
    pub cgroup_parent: Option<PathBuf>,
    /// The state file `guest watch` publishes (container name -> pool). Default `dd-guest-pools.json`.
    #[serde(default = "default_state")]
    pub state_file: PathBuf,
    /// First-level cache of a container without an override, and of unattributed requests.
    /// Default 64 MiB.
    #[serde(default = "default_budget")]
    pub default_budget_bytes: u64,
    /// Per-container overrides, by cgroup directory name.
    #[serde(default)]
    pub containers: BTreeMap<String, ContainerBudget>,
    /// Artificial latency added to every read request to the backing directory (a network disk stand-in).
    /// Default 0.
    #[serde(default)]
    pub backing_read_latency_us: u64,
    /// FUSE request threads. Default 2.
    #[serde(default = "default_threads")]
    pub threads: usize,
    /// How long a process's container and the state file are trusted before they are read again.
    /// Default 1000 ms.
    #[serde(default = "default_refresh")]
    pub attribution_refresh_ms: u64,
    /// Sampling of the containers' reads for the provisioner (`doubledecker guest provision`).
    #[serde(default)]
    pub sampling: SamplingConfig,
}

/// `[sampling]`: each container's miss-ratio curve of the pages it reads through the mount (SHARDS,
/// `crate::sampling`) and the time its reads spend at each level, published for the provisioner; the
/// first-level budgets it decides, read back.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SamplingConfig {
    /// Sample the reads. Default true (cheap enough to stay on).
    #[serde(default = "default_true")]
    pub enabled: bool,
    /// Sampled keys each container's curve keeps. Default 32768 (`dd_mrc::DEFAULT_MAX_SAMPLES`, the
    /// sampling whose curves meet a mean absolute error of 0.01, issue 27).
    #[serde(default = "default_samples")]
    pub max_samples: u32,
    /// Where the curves and counters are published (JSON, replaced atomically). Default none.
    #[serde(default)]
    pub stats_file: Option<PathBuf>,
    /// Where first-level budgets are read from (`{"container": bytes}`); a container listed gets its
    /// budget changed (pages over it are evicted to its pool). Default none.
    #[serde(default)]
    pub budgets_file: Option<PathBuf>,
    /// Between two publications (and readings of the budgets). Default 1000 ms.
    #[serde(default = "default_refresh")]
    pub publish_interval_ms: u64,
    /// After each publication the curves' counts are multiplied by this (1: the whole history counts).
    /// Default 1.
    #[serde(default = "default_decay")]
    pub history_decay: f64,
}

fn default_true() -> bool {
    true
}
fn default_samples() -> u32 {
    dd_mrc::DEFAULT_MAX_SAMPLES as u32
}
fn default_decay() -> f64 {
    1.0
}

impl Default for SamplingConfig {
    fn default() -> Self {
        SamplingConfig {
            enabled: true,
            max_samples: default_samples(),
            stats_file: None,
            budgets_file: None,
            publish_interval_ms: default_refresh(),
            history_decay: default_decay(),
        }
    }
}

fn default_state() -> PathBuf {
    PathBuf::from("dd-guest-pools.json")
}
fn default_budget() -> u64 {
    64 << 20
}
fn default_threads() -> usize {
    2
}
fn default_refresh() -> u64 {
    1000
}

impl Default for FuseConfig {
    fn default() -> Self {
        FuseConfig {
            daemon: None,
            cgroup_parent: None,
            state_file: default_state(),
            default_budget_bytes: default_budget(),
            containers: BTreeMap::new(),
            backing_read_latency_us: 0,
            threads: default_threads(),
            attribution_refresh_ms: default_refresh(),
            sampling: SamplingConfig::default(),
        }
    }
}

/// Errors of the configuration.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    #[error("invalid mount configuration: {field}: {reason}")]
    Invalid { field: String, reason: String },
    #[error("cannot read {path}: {source}")]
    Read { path: PathBuf, source: std::io::Error },
    #[error("cannot parse {path}: {message}")]
    Parse { path: PathBuf, message: String },
}

impl FuseConfig {
    /// Reads a TOML file; `DD_VM_DATA_TOKEN` in the environment overrides the daemon's token.
    pub fn from_file(path: &Path) -> Result<FuseConfig, ConfigError> {
        let text = std::fs::read_to_string(path)
            .map_err(|source| ConfigError::Read { path: path.into(), source })?;
        let mut cfg: FuseConfig = toml::from_str(&text)
            .map_err(|e| ConfigError::Parse { path: path.into(), message: e.to_string() })?;
        if let (Some(d), Ok(t)) = (cfg.daemon.as_mut(), std::env::var("DD_VM_DATA_TOKEN")) {
            d.data_token = t;
        }
        cfg.validate()?;
        Ok(cfg)
    }

    pub fn validate(&self) -> Result<(), ConfigError> {
        let bad = |field: &str, reason: &str| {
            Err(ConfigError::Invalid { field: field.to_string(), reason: reason.to_string() })
        };
        if let Some(Err((field, reason))) = self.daemon.as_ref().map(|d| d.check()) {
            return bad(field, &reason);
        }
        if self.default_budget_bytes < PAGE_SIZE as u64 {
            return bad("default_budget_bytes", "must be at least one page (4096)");
        }
        for (name, c) in &self.containers {
            if c.budget_bytes < PAGE_SIZE as u64 {
                return bad(&format!("containers.{name}.budget_bytes"), "must be at least one page (4096)");
            }
        }
        if self.threads == 0 || self.threads > 64 {
            return bad("threads", "must be 1..=64");
        }
        if self.attribution_refresh_ms == 0 {
            return bad("attribution_refresh_ms", "must be at least 1");
        }
        if self.backing_read_latency_us > 10_000_000 {
            return bad("backing_read_latency_us", "more than 10 s per read is not a disk");
        }
        let s = &self.sampling;
        if !(64..=1 << 20).contains(&s.max_samples) {
            return bad("sampling.max_samples", "must be in 64..=1048576");
        }
        if s.publish_interval_ms == 0 {
            return bad("sampling.publish_interval_ms", "must be at least 1");
        }
        if !(s.history_decay > 0.0 && s.history_decay <= 1.0) {
            return bad("sampling.history_decay", "must be in (0, 1]");
        }
        if !s.enabled && (s.stats_file.is_some() || s.budgets_file.is_some()) {
            return bad("sampling.enabled", "stats_file and budgets_file need sampling on");
        }
        Ok(())
    }

    /// First-level budget of a container, in pages.
    pub fn budget_pages(&self, container: &str) -> usize {
        let bytes = self.containers.get(container).map_or(self.default_budget_bytes, |c| c.budget_bytes);
        (bytes / PAGE_SIZE as u64) as usize
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_defaults_and_overrides() {
        let cfg: FuseConfig = toml::from_str(
            r#"
            cgroup_parent = "/sys/fs/cgroup/memory/doubledecker"
            backing_read_latency_us = 500
            [daemon]
            unix_socket = "dd-data/dd.sock"
            vm = 2
            data_token = "t"
            [containers.web]
            budget_bytes = 8192
            "#,
        )
        .unwrap();
        cfg.validate().unwrap();
        assert_eq!(cfg.budget_pages("web"), 2);
        assert_eq!(cfg.budget_pages("db"), (64 << 20) / 4096);
        assert_eq!(cfg.threads, 2);
        assert_eq!(cfg.state_file, PathBuf::from("dd-guest-pools.json"));
    }

    #[test]
    fn validate_names_the_field() {
        let mut cfg = FuseConfig::default();
        cfg.containers.insert("db".into(), ContainerBudget { budget_bytes: 100 });
        assert!(cfg.validate().unwrap_err().to_string().contains("containers.db.budget_bytes"));
        let cfg = FuseConfig { threads: 0, ..FuseConfig::default() };
        assert!(cfg.validate().unwrap_err().to_string().contains("threads"));
        let cfg = FuseConfig {
            daemon: Some(DaemonConfig {
                unix_socket: None,
                tcp: Some("x:1".into()),
                vm: 1,
                data_token: "".into(),
                ..DaemonConfig::default()
            }),
            ..FuseConfig::default()
        };
        assert!(cfg.validate().unwrap_err().to_string().contains("daemon.data_token"));
    }
}
