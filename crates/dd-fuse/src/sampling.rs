//! What the mount measures for the VM-level provisioner (SPEC section 10b, `doubledecker guest
//! provision`): every container's miss-ratio curve of the pages it reads through the mount, sampled with
//! SHARDS so that it can stay on, and the time its reads spend at each level.
//!
//! Owns [`Sampled`] (one container's fixed-size SHARDS model behind a filter that needs no lock for the
//! keys it does not sample) and [`ReadTimes`] (nanoseconds and pages per level). Cost per page read: one
//! hash and a comparison against the sampler copied under a read lock; a sampled page (a fraction that
//! falls as the model reaches `max_samples` keys) also takes the model's mutex. Both locks are leaves.
//!
//! Invariants: references the filter drops are counted (`skipped`) and handed to the model before the
//! curve is read, so the curve's `N` is every page read; the filter is refreshed from the model after
//! each sampled reference (fixed-size sampling lowers its threshold as keys arrive), and a key it lets
//! through by a stale threshold is filtered again by the model itself.

pub use dd_guest::mount_stats::ReadTimesSnapshot;
use dd_mrc::{Curve, Mrc, Sampler, Shards, Unit};
use parking_lot::{Mutex, RwLock};
use std::sync::atomic::{AtomicU64, Ordering};

/// A page's key for sampling: the backing inode and the page index, mixed.
#[inline]
pub fn page_key(object: u64, index: u64) -> u64 {
    object.wrapping_mul(0x9e37_79b9_7f4a_7c15).rotate_left(29) ^ index
}

/// One container's sampled curve.
pub struct Sampled {
    filter: RwLock<Sampler>,
    skipped: AtomicU64,
    model: Mutex<Shards>,
}

impl Sampled {
    /// A model that keeps at most `max_samples` keys; `seed` differs per container.
    pub fn new(max_samples: usize, seed: u64) -> Sampled {
        let model =
            Shards::fixed_size_seeded(max_samples.max(1), Unit::Pages, seed).expect("at least one sample");
        Sampled { filter: RwLock::new(model.sampler()), skipped: AtomicU64::new(0), model: Mutex::new(model) }
    }

    /// One page read.
    #[inline]
    pub fn access(&self, key: u64) {
        if !self.filter.read().sampled(key) {
            self.skipped.fetch_add(1, Ordering::Relaxed);
            return;
        }
        let mut m = self.model.lock();
        m.access(key);
        *self.filter.write() = m.sampler();
    }

    /// The curve at `points` evenly spaced sizes up to the footprint the model estimates (at least one
    /// page), and the footprint.
    pub fn curve(&self, points: usize) -> (Curve, u64) {
        let mut m = self.model.lock();
        m.skip(self.skipped.swap(0, Ordering::Relaxed));
        let foot = m.stats().footprint.max(1);
        (m.curve_at(&Curve::even_sizes(foot + foot / 10 + 1, points)), foot)
    }

    /// Ages the curve (see `dd_mrc::Shards::decay`).
    pub fn decay(&self, factor: f64) {
        if factor < 1.0 {
            let mut m = self.model.lock();
            m.skip(self.skipped.swap(0, Ordering::Relaxed));
            m.decay(factor);
        }
    }
}

/// Time a container's reads spend at each level (cumulative).
#[derive(Debug, Default)]
pub struct ReadTimes {
    /// Whole read requests: nanoseconds and pages.
    pub read_ns: AtomicU64,
    pub read_pages: AtomicU64,
    /// Gets from the container's pool: nanoseconds (for the pages asked for).
    pub pool_ns: AtomicU64,
    pub pool_pages: AtomicU64,
    /// Reads from the backing directory: nanoseconds and pages.
    pub backing_ns: AtomicU64,
    pub backing_pages: AtomicU64,
}

impl ReadTimes {
    pub fn add(counter: &AtomicU64, v: u64) {
        counter.fetch_add(v, Ordering::Relaxed);
    }

    pub fn snapshot(&self) -> ReadTimesSnapshot {
        let r = |a: &AtomicU64| a.load(Ordering::Relaxed);
        ReadTimesSnapshot {
            read_ns: r(&self.read_ns),
            read_pages: r(&self.read_pages),
            pool_ns: r(&self.pool_ns),
            pool_pages: r(&self.pool_pages),
            backing_ns: r(&self.backing_ns),
            backing_pages: r(&self.backing_pages),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_sampled_curve_shows_a_loop_and_counts_every_read() {
        let s = Sampled::new(512, 7);
        // A loop over 2000 pages of one file, 20 times: LRU misses below 2000 pages, hits above.
        for _ in 0..20 {
            for i in 0..2000 {
                s.access(page_key(42, i));
            }
        }
        let (c, foot) = s.curve(64);
        assert!((1700..2300).contains(&foot), "footprint {foot}");
        assert!(c.miss_ratio_at(1500.0) > 0.9, "{c:?}");
        assert!(c.miss_ratio_at(2300.0) < 0.15, "{c:?}");
        // Every read counted: N is 40 000 whatever was sampled.
        assert!(s.model.lock().stats().requests == 40_000);
    }
}
