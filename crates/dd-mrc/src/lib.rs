//! Miss-ratio curves, online: feed references one at a time, read the curve at any moment.
//!
//! A miss-ratio curve (MRC) gives, for every cache size, the fraction of references that would miss in
//! a cache of that size. This crate computes them four ways, all behind one trait, [`Mrc`]:
//!
//! | type | what | memory | cost per reference |
//! | --- | --- | --- | --- |
//! | [`ExactLru`] | Mattson's stack algorithm: every reference's LRU stack distance, kept with an order-statistic tree (a Fenwick tree over last-access times) | O(distinct keys) | O(log distinct keys) |
//! | [`Shards`] fixed-rate | SHARDS (Waldspurger et al., FAST'15): the same over the keys whose hash falls under `R`, distances scaled by `1/R`, with the SHARDS_adj correction | O(R x distinct keys) | one hash, plus O(log) for the sampled fraction `R` |
//! | [`Shards`] fixed-size | the rate falls as keys arrive so that at most `max_samples` keys are tracked | O(max_samples) | as fixed-rate |
//! | [`MiniSim`] | miniature simulation (Waldspurger et al., ATC'17) of any [`Policy`] (LRU, FIFO, S3-FIFO): one cache of size `R x S` per size `S`, fed the sampled keys | O(sum of R x sizes) | one hash, plus one simulated access per size for the sampled fraction |
//!
//! LRU is a *stack algorithm* (a cache of size `S` holds a subset of a cache of size `S + 1`), so one pass
//! gives the whole curve; FIFO and S3-FIFO are not, so [`MiniSim`] simulates each size, cheaply. Use
//! [`MrcConfig`] to build any of them from plain data (scenario files, command lines).
//!
//! ```
//! use dd_mrc::{Mrc, Shards, Unit};
//! let mut mrc = Shards::fixed_rate(0.1, Unit::Pages).unwrap();
//! for i in 0..100_000u64 {
//!     mrc.access(i % 5_000); // a loop over 5,000 pages
//! }
//! let curve = mrc.curve();
//! assert!(curve.miss_ratio_at(4_000.0) > 0.9); // LRU thrashes below the loop's size
//! assert!(curve.miss_ratio_at(6_000.0) < 0.1); // and hits once it fits
//! ```
//!
//! # Units
//!
//! A model counts cache sizes in pages ([`Unit::Pages`]: every key is one slot, whatever its size) or in
//! bytes ([`Unit::Bytes`]: a key takes its size, given with [`Mrc::access_sized`]). Miss ratios are
//! always per reference (not per byte). A page curve converts to bytes with [`Curve::scaled`].
//!
//! # Accuracy
//!
//! The default sampling ([`Sampling::default`], so [`MrcConfig`]'s and `doubledecker mrc`'s without a
//! sampling flag) is fixed-size: [`DEFAULT_MAX_SAMPLES`] (32,768) keys. With it SHARDS and miniature
//! simulation stay within a mean absolute error of 0.01 of the exact curve on uniform, zipf,
//! scan-plus-hot and zipf-with-periodic-scans traces of a million references and more (the crate's
//! tests check it, SHARDS with five sampling seeds besides the default; over 60 seeds the largest SHARDS
//! error was 0.0078). The error falls roughly as one over the square root of the keys sampled, and a
//! fixed rate samples few keys of a small footprint: `R = 0.01` exceeds 0.01 for some seeds on all four
//! traces (0.0147 with the default seed on the periodic scans), and 8,192 samples does for 2 or 3 seeds
//! in 20 on three of them. The hardest curves have a cliff (a loop that fits above some size): a size just
//! below it reads the miss ratio above it if the sample places the cliff a percent too low.
//!
//! # Guests and the second-chance cache
//!
//! An exclusive second-level cache with FIFO order (the engine's per-pool FIFO behind a guest page
//! cache) fed by the evictions of an LRU first level holds exactly the keys ranked `m + 1 ..= m + c` by
//! recency (first level `m`, second level `c`): the two levels together are one LRU cache of `m + c`
//! (tested in `tests/exclusive.rs`). So the LRU curve of a container's accesses, read at `m + c`, gives
//! the misses that reach the disk; [`Curve::behind`] turns it into the second level's own curve.
//!
//! # Invariants
//!
//! * Curves have ascending sizes starting at 0 with miss ratio 1, and miss ratios in `[0, 1]`.
//! * Same keys, same seed, same curve: sampling hashes are seeded, never randomised per process.
//! * A fixed-size model never tracks more than `max_samples` keys.

mod config;
mod curve;
mod error;
mod hist;
mod keymap;
mod lru;
mod minisim;
#[cfg(feature = "plot")]
pub mod plot;
pub mod profile;
mod sampler;
mod sim;
mod stack;

pub use config::{Method, MrcConfig, Policy, Sampling, DEFAULT_MAX_SAMPLES};
pub use curve::{Curve, Unit};
pub use error::MrcError;
pub use keymap::{prefetch_slot, KeyMap};
pub use lru::{ExactLru, Shards};
pub use minisim::MiniSim;
pub use sampler::{sample_hash, Sampler, DEFAULT_SEED};
pub use sim::CacheSim;

/// Bytes of a page: the size [`Mrc::access`] gives a reference.
pub const PAGE_SIZE: u32 = 4096;

/// An online miss-ratio-curve model.
///
/// Models are plain single-threaded state (`Send`, not `Sync`): share one behind a mutex, or keep one
/// per thread and read their curves separately. For a cheap filter in front of a lock, see
/// [`Shards::sampler`].
pub trait Mrc: Send {
    /// Feeds one reference to a page (a key of [`PAGE_SIZE`] bytes).
    fn access(&mut self, key: u64) {
        self.access_sized(key, PAGE_SIZE);
    }

    /// Feeds references to pages, in order: the same as [`Mrc::access`] on each, but a model may overlap
    /// the memory accesses of neighbouring keys (the exact model prefetches its map entries), so feed
    /// batches where you have them.
    fn access_keys(&mut self, keys: &[u64]) {
        for &k in keys {
            self.access(k);
        }
    }

    /// Feeds one reference to an object of `size_bytes` (used by [`Unit::Bytes`] models; a
    /// [`Unit::Pages`] model counts every key as one slot).
    fn access_sized(&mut self, key: u64, size_bytes: u32);

    /// The curve at the model's own resolution: every distance for [`ExactLru`] in pages, every
    /// histogram bucket for the others, the configured sizes for [`MiniSim`]. Starts at size 0.
    fn curve(&self) -> Curve;

    /// The curve at `sizes` (in the model's unit, any order; the result is sorted and starts at 0).
    /// Stack models compute these points from their histograms; [`MiniSim`] interpolates between its
    /// configured sizes.
    fn curve_at(&self, sizes: &[u64]) -> Curve;

    /// Counts and estimates so far.
    fn stats(&self) -> MrcStats;
}

/// What a model has seen, with its estimates of the whole trace.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct MrcStats {
    /// References fed so far.
    pub requests: u64,
    /// References that passed the sampling filter.
    pub sampled_requests: u64,
    /// Distinct keys seen (exact), or the estimate sampled keys / rate.
    pub unique: u64,
    /// Total size of the distinct keys in the model's unit (= `unique` in pages).
    pub footprint: u64,
    /// The current sampling rate (1 for exact; falls over time for fixed-size sampling).
    pub sampling_rate: f64,
    /// Keys the model holds now (bounded by `max_samples` for fixed-size sampling).
    pub tracked_keys: u64,
}
