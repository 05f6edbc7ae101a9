//! The mount's side of provisioning: every `sampling.publish_interval_ms` a thread publishes each
//! container's curve, counters and read times to `sampling.stats_file` and applies the first-level
//! budgets found in `sampling.budgets_file` (`doubledecker guest provision` writes the one and reads the
//! other).
//!
//! Owns [`Publisher`] (the thread); the document's schema, [`MountStats`], lives with its reader in
//! `dd_guest::mount_stats`. Invariants: the stats file is replaced atomically (temporary file and
//! rename), so a reader never sees half of it; a budgets file that cannot be read or parsed changes
//! nothing (logged); a budget is applied only when it differs from the container's current one, and
//! never below one page. The thread stops when its handle is dropped (at unmount).

use crate::config::{SamplingConfig, PAGE_SIZE};
use crate::frontend::Frontend;
pub use dd_guest::mount_stats::{MountStats, PublishedContainer};
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// Points published per curve.
const CURVE_POINTS: usize = 128;

impl Frontend {
    /// What the stats file holds now.
    pub fn published(&self, uptime_ms: u64) -> MountStats {
        let stats = self.stats();
        let mut out = Vec::new();
        for c in self.containers() {
            let Some(s) = stats.iter().find(|s| s.name == c.name) else { continue };
            let (curve, footprint_pages) = match &c.sampled {
                Some(sm) => {
                    let (curve, foot) = sm.curve(CURVE_POINTS);
                    (Some(curve), foot)
                }
                None => (None, 0),
            };
            out.push(PublishedContainer {
                counters: s.clone(),
                times: c.times.snapshot(),
                curve,
                footprint_pages,
            });
        }
        MountStats { page_size: PAGE_SIZE, uptime_ms, containers: out }
    }

    /// Ages every container's curve.
    pub fn decay_curves(&self, factor: f64) {
        for c in self.containers() {
            if let Some(sm) = &c.sampled {
                sm.decay(factor);
            }
        }
    }

    /// Applies a budgets document (container name -> bytes).
    pub fn apply_budgets(&self, budgets: &BTreeMap<String, u64>) {
        let current: BTreeMap<String, usize> =
            self.stats().into_iter().map(|s| (s.name, s.l1_budget_pages)).collect();
        for (name, bytes) in budgets {
            let pages = ((*bytes / PAGE_SIZE as u64) as usize).max(1);
            if current.get(name) != Some(&pages) {
                tracing::info!("container {name}: first-level budget {pages} pages");
                self.set_budget(name, pages);
            }
        }
    }
}

/// Writes `body` to `path` through a temporary file and a rename.
pub fn write_atomically(path: &Path, body: &[u8]) -> std::io::Result<()> {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, body)?;
    std::fs::rename(&tmp, path)
}

/// The publishing thread.
pub struct Publisher {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Publisher {
    /// Starts the thread if the configuration names a stats or budgets file.
    pub fn start(cfg: &SamplingConfig, fe: Arc<Frontend>) -> Option<Publisher> {
        if !cfg.enabled || (cfg.stats_file.is_none() && cfg.budgets_file.is_none()) {
            return None;
        }
        let (cfg, stop) = (cfg.clone(), Arc::new(AtomicBool::new(false)));
        let flag = stop.clone();
        let thread = std::thread::Builder::new()
            .name("dd-publish".into())
            .spawn(move || {
                // The counters' clock: they start with the mount, a moment before this thread.
                let started = std::time::Instant::now();
                let tick = Duration::from_millis(cfg.publish_interval_ms);
                while !flag.load(Ordering::Relaxed) {
                    publish_once(&cfg, &fe, started.elapsed().as_millis() as u64);
                    // Sleep in short steps so that unmounting does not wait a whole interval.
                    let mut left = tick;
                    while !left.is_zero() && !flag.load(Ordering::Relaxed) {
                        let step = left.min(Duration::from_millis(50));
                        std::thread::sleep(step);
                        left -= step;
                    }
                }
            })
            .ok()?;
        Some(Publisher { stop, thread: Some(thread) })
    }
}

fn publish_once(cfg: &SamplingConfig, fe: &Frontend, uptime_ms: u64) {
    if let Some(p) = &cfg.budgets_file {
        match std::fs::read(p) {
            Ok(b) => match serde_json::from_slice::<BTreeMap<String, u64>>(&b) {
                Ok(budgets) => fe.apply_budgets(&budgets),
                Err(e) => tracing::warn!("budgets file {}: {e}", p.display()),
            },
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => tracing::warn!("budgets file {}: {e}", p.display()),
        }
    }
    if let Some(p) = &cfg.stats_file {
        let body = serde_json::to_vec(&fe.published(uptime_ms)).expect("plain data serialises");
        if let Err(e) = write_atomically(p, &body) {
            tracing::warn!("stats file {}: {e}", p.display());
        }
    }
    fe.decay_curves(cfg.history_decay);
}

impl Drop for Publisher {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
