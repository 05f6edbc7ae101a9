//! `doubledecker guest provision`'s configuration (TOML, plain serde data with documented defaults and
//! one `validate()` that names the bad field) and its errors.

use crate::watch::DaemonConfig;
use dd_provision::{Objective, ProvisionConfig, Target};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// Bytes of a page of the mount's first levels.
pub const PAGE: u64 = 4096;

/// One container's goal.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ContainerGoal {
    /// `{ kind = "hit_ratio", ratio }` (of its page reads through the mount, served without the backing
    /// directory), `{ kind = "mean_latency", ms }` (per page read through the mount) or `{ kind =
    /// "throughput", ops_s }` (pages read per second through the mount; its readers are taken as a
    /// closed loop). Default none: the container only takes what the others leave.
    #[serde(default)]
    pub target: Option<Target>,
    /// First-level bytes it keeps whatever the plan. Default 0 (one page).
    #[serde(default)]
    pub min_budget_bytes: u64,
    /// When set, the container's cgroup memory limit is this plus its first-level budget (the mount
    /// serves its files with `direct_io`, so its first level *is* its page cache, held for it by the
    /// mount; the base is the rest of what it needs: anonymous memory, kernel memory). Default none: the
    /// limit is left alone.
    #[serde(default)]
    pub memory_base_bytes: Option<u64>,
}

/// Where the rounds' reports go: the daemon's admin API (`PUT /v1/vm/provisioner`), for `/ui/`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AdminReportConfig {
    /// The admin API, `http://HOST:PORT`, or `https://HOST:PORT` with `tls_ca_file`.
    pub url: String,
    /// The VM's admin token; `DD_VM_ADMIN_TOKEN` in the environment overrides it.
    #[serde(default)]
    pub token: String,
    /// For an `https://` URL: the PEM file of the CA that signed the daemon's certificate (the only CA
    /// trusted). Default: none.
    #[serde(default)]
    pub tls_ca_file: Option<PathBuf>,
}

fn d_state() -> PathBuf {
    PathBuf::from("dd-guest-pools.json")
}
fn d_interval() -> u64 {
    2000
}
fn d_decision() -> ProvisionConfig {
    ProvisionConfig { objective: Objective::Hits, ..ProvisionConfig::default() }
}

/// The provisioner's configuration file (TOML).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProvisionFileConfig {
    /// The mount's `[sampling] stats_file`.
    pub stats_file: PathBuf,
    /// The mount's `[sampling] budgets_file`.
    pub budgets_file: PathBuf,
    /// The watcher's state file (container -> pool). Default `dd-guest-pools.json`.
    #[serde(default = "d_state")]
    pub state_file: PathBuf,
    /// Between rounds. Default 2000 ms.
    #[serde(default = "d_interval")]
    pub interval_ms: u64,
    /// First-level memory the containers share, bytes.
    pub memory_bytes: u64,
    /// The VM's share of the daemon's memory store to plan with, bytes. Default: the VM's entitlement
    /// the daemon reports (0 without a daemon).
    #[serde(default)]
    pub mem_cache_bytes: Option<u64>,
    /// Same for the SSD store.
    #[serde(default)]
    pub ssd_cache_bytes: Option<u64>,
    /// The daemon's data plane, to set the pools' specs and read the VM's entitlements. Without it only
    /// first-level budgets (and limits) are set.
    #[serde(default)]
    pub daemon: Option<DaemonConfig>,
    /// The daemon's admin API, to report each applied round (targets, decisions, measurements) for
    /// `/ui/`. Default none.
    #[serde(default)]
    pub admin: Option<AdminReportConfig>,
    /// Containers are the child cgroups of this directory (for `memory_base_bytes`).
    #[serde(default)]
    pub cgroup_parent: Option<PathBuf>,
    /// Goals by container name; a published container not listed has no target.
    #[serde(default)]
    pub containers: BTreeMap<String, ContainerGoal>,
    /// The decision's settings (default objective `hits`: pages per second served without the backing
    /// directory).
    #[serde(default = "d_decision")]
    pub decision: ProvisionConfig,
}

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum GuestProvisionError {
    #[error("invalid provisioner configuration: {field}: {reason}")]
    Config { field: String, reason: String },
    #[error("cannot read {path}: {source}")]
    Read { path: PathBuf, source: std::io::Error },
    #[error("cannot parse {path}: {message}")]
    Parse { path: PathBuf, message: String },
    #[error("cannot write {path}: {source}")]
    Write { path: PathBuf, source: std::io::Error },
    #[error("daemon: {0}")]
    Daemon(#[from] dd_client::ClientError),
    #[error("reporting to the admin API: {0}")]
    Admin(#[from] dd_client::admin::AdminError),
    #[error("provisioner: {0}")]
    Provision(#[from] dd_provision::ProvisionError),
    #[error("{0}")]
    Tls(#[from] dd_client::TlsError),
}

pub(crate) fn bad(field: &str, reason: &str) -> GuestProvisionError {
    GuestProvisionError::Config { field: field.into(), reason: reason.into() }
}

impl ProvisionFileConfig {
    /// Reads a TOML file. The data token is, in order, `data_token` (a command-line flag),
    /// `DD_VM_DATA_TOKEN`, or the file's; the admin token `DD_VM_ADMIN_TOKEN` or the file's.
    pub fn load(path: &Path, data_token: Option<&str>) -> Result<ProvisionFileConfig, GuestProvisionError> {
        let text = std::fs::read_to_string(path)
            .map_err(|source| GuestProvisionError::Read { path: path.into(), source })?;
        let mut cfg: ProvisionFileConfig = toml::from_str(&text)
            .map_err(|e| GuestProvisionError::Parse { path: path.into(), message: e.to_string() })?;
        let env = |v: &str| std::env::var(v).ok().filter(|t| !t.is_empty());
        if let (Some(d), Some(t)) =
            (cfg.daemon.as_mut(), data_token.map(str::to_owned).or_else(|| env("DD_VM_DATA_TOKEN")))
        {
            d.data_token = t;
        }
        if let (Some(a), Some(t)) = (cfg.admin.as_mut(), env("DD_VM_ADMIN_TOKEN")) {
            a.token = t;
        }
        cfg.validate()?;
        Ok(cfg)
    }

    pub fn validate(&self) -> Result<(), GuestProvisionError> {
        if self.interval_ms == 0 {
            return Err(bad("interval_ms", "must be at least 1"));
        }
        if self.memory_bytes < PAGE {
            return Err(bad("memory_bytes", "must be at least one page (4096)"));
        }
        if let Some(Err((field, reason))) = self.daemon.as_ref().map(|d| d.check()) {
            return Err(bad(field, &reason));
        }
        if let Some(a) = &self.admin {
            match (a.url.split_once("://").map(|(scheme, _)| scheme), &a.tls_ca_file) {
                (Some("http"), None) | (Some("https"), Some(_)) => {}
                (Some("https"), None) => {
                    return Err(bad("admin.tls_ca_file", "an https:// admin.url needs it"))
                }
                (Some("http"), Some(_)) => {
                    return Err(bad("admin.tls_ca_file", "set for an http:// admin.url (TLS is https://)"))
                }
                _ => return Err(bad("admin.url", "must be http://HOST:PORT or https://HOST:PORT")),
            }
            if a.token.is_empty() {
                return Err(bad("admin.token", "empty (set it or DD_VM_ADMIN_TOKEN)"));
            }
        }
        let floors: u64 = self.containers.values().map(|c| c.min_budget_bytes.max(PAGE)).sum();
        if floors > self.memory_bytes {
            return Err(bad("containers.min_budget_bytes", "the floors exceed memory_bytes"));
        }
        if self.containers.values().any(|c| c.memory_base_bytes.is_some()) && self.cgroup_parent.is_none() {
            return Err(bad("cgroup_parent", "memory_base_bytes needs the containers' cgroup parent"));
        }
        for (name, c) in &self.containers {
            if name.is_empty() || name.contains('/') || name == "." || name == ".." {
                return Err(bad("containers", "a container name is a cgroup directory name"));
            }
            if let Some(Target::HitRatio { ratio }) = c.target {
                if !(0.0..=1.0).contains(&ratio) {
                    return Err(bad(&format!("containers.{name}.target.ratio"), "must be in [0, 1]"));
                }
            }
        }
        self.decision.validate().map_err(|e| bad("decision", &e.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_parses_and_validate_names_the_field() {
        let cfg: ProvisionFileConfig = toml::from_str(
            r#"
            stats_file = "s.json"
            budgets_file = "b.json"
            memory_bytes = 16777216
            [containers.web]
            target = { kind = "hit_ratio", ratio = 0.9 }
            [containers.db]
            target = { kind = "mean_latency", ms = 0.2 }
            min_budget_bytes = 1048576
            "#,
        )
        .unwrap();
        cfg.validate().unwrap();
        assert_eq!(cfg.decision.objective, Objective::Hits);
        assert_eq!(cfg.interval_ms, 2000);
        let mut c = cfg.clone();
        c.containers.get_mut("db").unwrap().memory_base_bytes = Some(1 << 20);
        assert!(c.validate().unwrap_err().to_string().contains("cgroup_parent"));
        let mut c = cfg.clone();
        c.containers.get_mut("db").unwrap().min_budget_bytes = 1 << 30;
        assert!(c.validate().unwrap_err().to_string().contains("min_budget_bytes"));
        let mut c = cfg.clone();
        c.containers.get_mut("web").unwrap().target = Some(Target::HitRatio { ratio: 1.5 });
        assert!(c.validate().unwrap_err().to_string().contains("containers.web.target.ratio"));
        let admin = |url: &str, ca: Option<&str>| AdminReportConfig {
            url: url.into(),
            token: "a-vm-admin-token-0001".into(),
            tls_ca_file: ca.map(PathBuf::from),
        };
        let mut c = cfg.clone();
        c.admin = Some(AdminReportConfig { token: String::new(), ..admin("http://127.0.0.1:7412", None) });
        assert!(c.validate().unwrap_err().to_string().contains("admin.token"));
        for (url, ca, field) in [
            ("https://127.0.0.1:7412", None, Some("admin.tls_ca_file")),
            ("http://127.0.0.1:7412", Some("ca.pem"), Some("admin.tls_ca_file")),
            ("127.0.0.1:7412", None, Some("admin.url")),
            ("https://127.0.0.1:7412", Some("ca.pem"), None),
        ] {
            let mut c = cfg.clone();
            c.admin = Some(admin(url, ca));
            match (c.validate(), field) {
                (Ok(()), None) => {}
                (Err(e), Some(f)) => assert!(e.to_string().contains(f), "{url} {ca:?}: {e}"),
                (r, f) => panic!("{url} {ca:?}: {r:?}, wanted {f:?}"),
            }
        }
    }
}
