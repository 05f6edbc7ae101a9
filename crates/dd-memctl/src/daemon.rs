//! `doubledecker memctl`: the controller on real cgroups.
//!
//! Every `interval_ms` the controller runs one **round**: it discovers the containers (the child cgroups
//! of `cgroup.parent`, so containers that come and go are picked up), takes a snapshot of their memory,
//! works out how much memory is needed from the configured pressure signal, and then asks [`decide`] for
//! one action at a time and carries it out, re-reading the victim after each reclaim, until the need is
//! met, nothing more can be freed, or `max_requests_per_round` is reached. A round never fails as a
//! whole: a cgroup that vanishes or an `EBUSY` is logged in the round's report and the round carries on.
//!
//! Pressure signals (any combination; the largest need wins):
//! * `target_total_usage_bytes`: keep the containers' total usage at or below this;
//! * `min_available_bytes`: keep `MemAvailable` of `/proc/meminfo` at or above this;
//! * `psi_some_avg10_percent` (cgroup v2): when the parent's `memory.pressure` "some avg10" is above it,
//!   reclaim `pressure_reclaim_bytes`;
//! * `v1_pressure_level` (cgroup v1): registers an eventfd on the parent's `memory.pressure_level` at
//!   the given level; each round that saw an event reclaims `pressure_reclaim_bytes`.

use crate::cgroup::{discover, Cgroup, CgroupError, CgroupIo, MemoryInfo, ReclaimOptions, Version};
use crate::decide::{decide, Action, Class, ContainerSnapshot, DecisionConfig};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Per-container settings, by cgroup directory name.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ContainerConfig {
    pub weight: u32,
    #[serde(default)]
    pub class: Class,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum VersionSetting {
    #[default]
    Auto,
    V1,
    V2,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct CgroupConfig {
    /// Containers are the child cgroups of this directory. Default `/sys/fs/cgroup/memory/doubledecker`.
    pub parent: PathBuf,
    pub version: VersionSetting,
}

impl Default for CgroupConfig {
    fn default() -> Self {
        CgroupConfig {
            parent: PathBuf::from("/sys/fs/cgroup/memory/doubledecker"),
            version: VersionSetting::Auto,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
#[serde(default, deny_unknown_fields)]
pub struct PressureConfig {
    /// 0 = off.
    pub target_total_usage_bytes: u64,
    /// 0 = off.
    pub min_available_bytes: u64,
    /// 0 = off (cgroup v2 only).
    pub psi_some_avg10_percent: f64,
    /// "low", "medium" or "critical" (cgroup v1 only); empty = off.
    pub v1_pressure_level: String,
    /// What one pressure event asks for. Default (0) means 4 chunks.
    pub pressure_reclaim_bytes: u64,
}

/// The controller's configuration file (TOML).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct MemctlConfig {
    pub cgroup: CgroupConfig,
    pub decision: DecisionConfig,
    pub pressure: PressureConfig,
    /// Default 1000 ms.
    pub interval_ms: u64,
    /// Reclaim requests per round at most. Default 64.
    pub max_requests_per_round: usize,
    /// Weight of containers not listed in `containers`. Default 1.
    pub default_weight: u32,
    pub containers: BTreeMap<String, ContainerConfig>,
    /// How long a lowered v1 limit may stay in place per request. Default 500 ms.
    pub v1_hold_ms: u64,
}

impl Default for MemctlConfig {
    fn default() -> Self {
        MemctlConfig {
            cgroup: CgroupConfig::default(),
            decision: DecisionConfig::default(),
            pressure: PressureConfig::default(),
            interval_ms: 1000,
            max_requests_per_round: 64,
            default_weight: 1,
            containers: BTreeMap::new(),
            v1_hold_ms: 500,
        }
    }
}

/// Errors of the controller's setup (a round itself never fails).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum MemctlError {
    #[error("invalid memctl configuration: {field}: {reason}")]
    Config { field: String, reason: String },
    #[error("cannot read {path}: {source}")]
    Read { path: PathBuf, source: std::io::Error },
    #[error("cannot parse {path}: {message}")]
    Parse { path: PathBuf, message: String },
    #[error(transparent)]
    Cgroup(#[from] CgroupError),
}

impl MemctlConfig {
    pub fn from_file(path: &Path) -> Result<MemctlConfig, MemctlError> {
        let text = std::fs::read_to_string(path)
            .map_err(|source| MemctlError::Read { path: path.into(), source })?;
        let cfg: MemctlConfig = toml::from_str(&text)
            .map_err(|e| MemctlError::Parse { path: path.into(), message: e.to_string() })?;
        cfg.validate()?;
        Ok(cfg)
    }

    pub fn validate(&self) -> Result<(), MemctlError> {
        let bad = |field: &str, reason: &str| {
            Err(MemctlError::Config { field: field.into(), reason: reason.into() })
        };
        if self.decision.chunk_cap_bytes == 0 {
            return bad("decision.chunk_cap_bytes", "must be at least 1");
        }
        if self.interval_ms == 0 {
            return bad("interval_ms", "must be at least 1");
        }
        if self.max_requests_per_round == 0 {
            return bad("max_requests_per_round", "must be at least 1");
        }
        if !["", "low", "medium", "critical"].contains(&self.pressure.v1_pressure_level.as_str()) {
            return bad("pressure.v1_pressure_level", "must be low, medium or critical");
        }
        if self.pressure.psi_some_avg10_percent < 0.0 || self.pressure.psi_some_avg10_percent > 100.0 {
            return bad("pressure.psi_some_avg10_percent", "must be within 0..=100");
        }
        Ok(())
    }

    fn pressure_bytes(&self) -> u64 {
        if self.pressure.pressure_reclaim_bytes > 0 {
            self.pressure.pressure_reclaim_bytes
        } else {
            4 * self.decision.chunk_cap_bytes
        }
    }
}

/// One container in a round's report.
#[derive(Debug, Clone, Serialize)]
pub struct ContainerReport {
    pub name: String,
    pub weight: u32,
    pub class: Class,
    pub before: MemoryInfo,
    pub usage_after: u64,
}

/// One executed action.
#[derive(Debug, Clone, Serialize)]
pub struct Executed {
    pub action: Action,
    pub freed: u64,
}

/// What a round saw and did.
#[derive(Debug, Clone, Serialize, Default)]
pub struct RoundReport {
    pub need_bytes: u64,
    pub containers: Vec<ContainerReport>,
    pub actions: Vec<Executed>,
    pub errors: Vec<String>,
}

/// The controller: configuration plus the cgroup I/O it works through.
pub struct Controller<I: CgroupIo> {
    pub cfg: MemctlConfig,
    io: I,
    version: Version,
    pressure_events: Option<PressureEvents>,
}

/// The error of a `cgroup.parent` that is no cgroup memory directory, saying what this host has
/// instead (issue 31: the default is a v1 path, and on a v2 host the error said only that it is not one).
fn parent_error(parent: &Path, io: &dyn CgroupIo) -> MemctlError {
    let root = Path::new("/sys/fs/cgroup");
    let host = match (Version::detect(io, root), Version::detect(io, &root.join("memory"))) {
        (Some(Version::V2), _) => {
            "this host has cgroup v2 at /sys/fs/cgroup: set `[cgroup] parent` to the group holding the \
             containers, e.g. \"/sys/fs/cgroup/doubledecker\" (created with the memory controller enabled \
             in its parent's cgroup.subtree_control)"
        }
        (_, Some(_)) => {
            "this host has the cgroup v1 memory controller at /sys/fs/cgroup/memory: create the group \
             (mkdir) or set `[cgroup] parent` to the one holding the containers"
        }
        _ => "this host has no cgroup memory controller mounted at /sys/fs/cgroup",
    };
    MemctlError::Config {
        field: "cgroup.parent".into(),
        reason: format!("{} is not a cgroup v1 memory or v2 directory; {host}", parent.display()),
    }
}

impl MemctlConfig {
    /// Checks what [`MemctlConfig::validate`] cannot: that `cgroup.parent` is a cgroup memory directory
    /// of the version configured on this host (`config check` runs it).
    pub fn check_host(&self) -> Result<(), MemctlError> {
        let io = crate::cgroup::RealIo;
        let found = Version::detect(&io, &self.cgroup.parent);
        let ok = match self.cgroup.version {
            VersionSetting::Auto => found.is_some(),
            VersionSetting::V1 => found == Some(Version::V1),
            VersionSetting::V2 => found == Some(Version::V2),
        };
        if ok {
            Ok(())
        } else {
            Err(parent_error(&self.cgroup.parent, &io))
        }
    }
}

impl<I: CgroupIo> Controller<I> {
    pub fn new(cfg: MemctlConfig, io: I) -> Result<Self, MemctlError> {
        cfg.validate()?;
        let version = match cfg.cgroup.version {
            VersionSetting::V1 => Version::V1,
            VersionSetting::V2 => Version::V2,
            VersionSetting::Auto => Version::detect(&io, &cfg.cgroup.parent)
                .ok_or_else(|| parent_error(&cfg.cgroup.parent, &io))?,
        };
        let pressure_events = if version == Version::V1 && !cfg.pressure.v1_pressure_level.is_empty() {
            match PressureEvents::register(&cfg.cgroup.parent, &cfg.pressure.v1_pressure_level) {
                Ok(p) => Some(p),
                Err(e) => {
                    tracing::warn!("memory.pressure_level events unavailable: {e}");
                    None
                }
            }
        } else {
            None
        };
        Ok(Controller { cfg, io, version, pressure_events })
    }

    /// The cgroup I/O (tests inspect their fakes through it).
    pub fn io(&self) -> &I {
        &self.io
    }

    fn settings_of(&self, name: &str) -> (u32, Class) {
        self.cfg
            .containers
            .get(name)
            .map_or((self.cfg.default_weight, Class::Silver), |c| (c.weight, c.class))
    }

    /// One container as the decision function sees it.
    fn container(&self, g: &Cgroup, info: &MemoryInfo) -> ContainerSnapshot {
        let (weight, class) = self.settings_of(&g.name);
        ContainerSnapshot {
            name: g.name.clone(),
            usage_bytes: info.usage,
            weight,
            class,
            soft_limit_bytes: info.soft_limit,
            reclaimable_bytes: reclaimable(info),
        }
    }

    /// Discovers containers and reads their memory; containers that vanish while being read are left out
    /// (and noted in `errors`).
    fn snapshot(&self, errors: &mut Vec<String>) -> Vec<(Cgroup, MemoryInfo)> {
        let groups = match discover(&self.io, &self.cfg.cgroup.parent, self.version) {
            Ok(g) => g,
            Err(e) => {
                errors.push(e.to_string());
                return Vec::new();
            }
        };
        groups
            .into_iter()
            .filter_map(|g| match g.info(&self.io) {
                Ok(info) => Some((g, info)),
                Err(e) => {
                    errors.push(e.to_string());
                    None
                }
            })
            .collect()
    }

    fn need(&mut self, total_usage: u64, errors: &mut Vec<String>) -> u64 {
        let p = &self.cfg.pressure;
        let mut need = 0u64;
        if p.target_total_usage_bytes > 0 {
            need = need.max(total_usage.saturating_sub(p.target_total_usage_bytes));
        }
        if p.min_available_bytes > 0 {
            match mem_available() {
                Ok(avail) => need = need.max(p.min_available_bytes.saturating_sub(avail)),
                Err(e) => errors.push(format!("/proc/meminfo: {e}")),
            }
        }
        if p.psi_some_avg10_percent > 0.0 && self.version == Version::V2 {
            let path = self.cfg.cgroup.parent.join("memory.pressure");
            match self.io.read(&path) {
                Ok(text) => {
                    if psi_some_avg10(&text).is_some_and(|v| v > p.psi_some_avg10_percent) {
                        need = need.max(self.cfg.pressure_bytes());
                    }
                }
                Err(e) => errors.push(format!("{}: {e}", path.display())),
            }
        }
        if let Some(ev) = &self.pressure_events {
            if ev.take() > 0 {
                need = need.max(self.cfg.pressure_bytes());
            }
        }
        need
    }

    /// Runs one round with the given need (`None`: from the pressure signals).
    pub fn round(&mut self, need: Option<u64>) -> RoundReport {
        let mut report = RoundReport::default();
        let mut groups = self.snapshot(&mut report.errors);
        let total: u64 = groups.iter().map(|(_, i)| i.usage).sum();
        let need = need.unwrap_or_else(|| self.need(total, &mut report.errors));
        report.need_bytes = need;
        let mut snap: Vec<ContainerSnapshot> =
            groups.iter().map(|(g, info)| self.container(g, info)).collect();
        let opts =
            ReclaimOptions { v1_hold: Duration::from_millis(self.cfg.v1_hold_ms), ..Default::default() };
        let mut left = need;
        let mut requests = 0;
        while left > 0 && requests < self.cfg.max_requests_per_round {
            let action = decide(&snap, left, &self.cfg.decision);
            let targets: Vec<(usize, u64)> = match &action {
                Action::None => break,
                Action::Reclaim { index, bytes, .. } => vec![(*index, *bytes)],
                Action::Lru { members, bytes } => {
                    // No shared LRU across cgroups: split by what each can give, as the plan assumes.
                    let total: u128 = members.iter().map(|&i| snap[i].reclaimable_bytes as u128).sum();
                    members
                        .iter()
                        .map(|&i| {
                            (i, ((*bytes as u128 * snap[i].reclaimable_bytes as u128) / total.max(1)) as u64)
                        })
                        .filter(|(_, b)| *b > 0)
                        .collect()
                }
            };
            requests += 1;
            let mut freed_total = 0;
            for (i, bytes) in targets {
                let g = &groups[i].0;
                match g.reclaim(&self.io, bytes, &opts) {
                    Ok(out) => freed_total += out.freed,
                    Err(e) => report.errors.push(e.to_string()),
                }
                // Refresh the victim's figures; a vanished cgroup can give nothing more.
                match g.info(&self.io) {
                    Ok(info) => {
                        snap[i].usage_bytes = info.usage;
                        snap[i].reclaimable_bytes = reclaimable(&info);
                        groups[i].1 = info;
                    }
                    Err(e) => {
                        report.errors.push(e.to_string());
                        snap[i].reclaimable_bytes = 0;
                    }
                }
            }
            report.actions.push(Executed { action, freed: freed_total });
            if freed_total == 0 {
                // Nothing moved: asking again this round would spin. The next round re-reads everything.
                break;
            }
            left = left.saturating_sub(freed_total);
        }
        report.containers = groups
            .iter()
            .zip(&snap)
            .map(|((g, before), s)| ContainerReport {
                name: g.name.clone(),
                weight: s.weight,
                class: s.class,
                before: *before,
                usage_after: s.usage_bytes,
            })
            .collect();
        report
    }

    /// What a round would do, without doing it.
    pub fn plan(&mut self, need: Option<u64>) -> (u64, Vec<ContainerSnapshot>, Vec<Action>) {
        let mut errors = Vec::new();
        let groups = self.snapshot(&mut errors);
        let total: u64 = groups.iter().map(|(_, i)| i.usage).sum();
        let need = need.unwrap_or_else(|| self.need(total, &mut errors));
        let snap: Vec<ContainerSnapshot> = groups.iter().map(|(g, info)| self.container(g, info)).collect();
        let actions = crate::decide::plan(&snap, need, &self.cfg.decision);
        (need, snap, actions)
    }

    /// Runs rounds every `interval_ms` until `stop` returns true.
    pub fn run(&mut self, mut on_round: impl FnMut(&RoundReport), stop: impl Fn() -> bool) {
        while !stop() {
            let r = self.round(None);
            for e in &r.errors {
                tracing::warn!("memctl: {e}");
            }
            on_round(&r);
            std::thread::sleep(Duration::from_millis(self.cfg.interval_ms));
        }
    }
}

/// What a reclaim can take from a container: without swap, only its page cache.
fn reclaimable(info: &MemoryInfo) -> u64 {
    info.file.min(info.usage)
}

fn mem_available() -> std::io::Result<u64> {
    let text = std::fs::read_to_string("/proc/meminfo")?;
    text.lines()
        .find_map(|l| l.strip_prefix("MemAvailable:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map(|kb| kb * 1024)
        .ok_or_else(|| std::io::Error::other("no MemAvailable line"))
}

/// `some avg10=1.23 ...` from a PSI file.
fn psi_some_avg10(text: &str) -> Option<f64> {
    let line = text.lines().find(|l| l.starts_with("some "))?;
    line.split_whitespace().find_map(|f| f.strip_prefix("avg10=")).and_then(|v| v.parse().ok())
}

/// A v1 `memory.pressure_level` eventfd registration.
struct PressureEvents {
    efd: std::os::fd::OwnedFd,
    _level_file: std::fs::File,
}

impl PressureEvents {
    fn register(parent: &Path, level: &str) -> std::io::Result<PressureEvents> {
        use std::os::fd::{AsRawFd, FromRawFd};
        // SAFETY: eventfd has no pointer arguments; the result is checked and owned below.
        let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: fd is a fresh descriptor we own exclusively.
        let efd = unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) };
        let level_file = std::fs::File::open(parent.join("memory.pressure_level"))?;
        let line = format!("{} {} {}", efd.as_raw_fd(), level_file.as_raw_fd(), level);
        std::fs::write(parent.join("cgroup.event_control"), line)?;
        Ok(PressureEvents { efd, _level_file: level_file })
    }

    /// Events since the last call.
    fn take(&self) -> u64 {
        use std::os::fd::AsRawFd;
        let mut buf = [0u8; 8];
        // SAFETY: reads at most 8 bytes into a valid 8-byte buffer from a descriptor we own.
        let n = unsafe { libc::read(self.efd.as_raw_fd(), buf.as_mut_ptr().cast(), 8) };
        if n == 8 {
            u64::from_ne_bytes(buf)
        } else {
            0
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_psi_and_config() {
        assert_eq!(
            psi_some_avg10("some avg10=12.50 avg60=1.00 avg300=0.00 total=1\nfull avg10=0.00"),
            Some(12.5)
        );
        assert_eq!(psi_some_avg10("full avg10=1.0"), None);
        let cfg: MemctlConfig = toml::from_str(
            r#"
            interval_ms = 200
            [cgroup]
            parent = "/tmp/x"
            version = "v1"
            [decision]
            policy = "proportional-classes"
            chunk_cap_bytes = 1048576
            [pressure]
            target_total_usage_bytes = 1000
            [containers.web]
            weight = 4
            class = "gold"
            "#,
        )
        .unwrap();
        cfg.validate().unwrap();
        assert_eq!(cfg.containers["web"].weight, 4);
        let bad: MemctlConfig = toml::from_str("interval_ms = 0").unwrap();
        assert!(bad.validate().unwrap_err().to_string().contains("interval_ms"));
        assert!(toml::from_str::<MemctlConfig>("nonsense = 1").is_err());
    }
}
