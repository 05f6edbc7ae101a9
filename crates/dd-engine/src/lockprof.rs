//! Lock-wait profile (issue 28, item 1): how long threads waited for each class of lock, with the
//! `lock-profile` feature; without it, [`acquire`] is the plain lock and nothing is counted.
//!
//! Each acquisition first tries the lock; only when that fails is the blocking acquisition timed, so an
//! uncontended lock costs one extra branch and the counters (process-wide relaxed atomics, written by
//! every acquisition: the profile build is for measuring, never for serving) say how often each class
//! was contended and for how long in total. [`snapshot`] reads them; [`reset`] zeroes them.

use serde::Serialize;

/// The locks profiled: those the data path takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum LockClass {
    /// A pool shard's mutex (`pool.rs`).
    PoolShard,
    /// A store's eviction lock (`cache/evict.rs`).
    EvictLock,
    /// A shard of the pool table (read lock on the data path by id).
    PoolTable,
    /// The memory store's free stacks (`store/mem.rs`).
    FreeStack,
}

const CLASSES: [(LockClass, &str); 4] = [
    (LockClass::PoolShard, "pool_shard"),
    (LockClass::EvictLock, "evict_lock"),
    (LockClass::PoolTable, "pool_table"),
    (LockClass::FreeStack, "mem_free_stack"),
];

/// What one class of lock saw.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct LockStat {
    pub lock: &'static str,
    pub acquisitions: u64,
    /// Acquisitions that found the lock held and waited.
    pub contended: u64,
    /// Total time those waited, nanoseconds.
    pub wait_ns: u64,
}

#[cfg(feature = "lock-profile")]
mod counters {
    use std::sync::atomic::AtomicU64;
    pub static ACQ: [AtomicU64; 4] = [const { AtomicU64::new(0) }; 4];
    pub static CONTENDED: [AtomicU64; 4] = [const { AtomicU64::new(0) }; 4];
    pub static WAIT_NS: [AtomicU64; 4] = [const { AtomicU64::new(0) }; 4];
}

/// Takes a lock: `try_lock` first, then (timed, with the feature) `lock`.
#[inline(always)]
pub(crate) fn acquire<G>(
    class: LockClass,
    try_lock: impl FnOnce() -> Option<G>,
    lock: impl FnOnce() -> G,
) -> G {
    #[cfg(feature = "lock-profile")]
    {
        use std::sync::atomic::Ordering::Relaxed;
        let i = class as usize;
        counters::ACQ[i].fetch_add(1, Relaxed);
        if let Some(g) = try_lock() {
            return g;
        }
        let t0 = std::time::Instant::now();
        let g = lock();
        counters::CONTENDED[i].fetch_add(1, Relaxed);
        counters::WAIT_NS[i].fetch_add(t0.elapsed().as_nanos() as u64, Relaxed);
        g
    }
    #[cfg(not(feature = "lock-profile"))]
    {
        let _ = (class, try_lock);
        lock()
    }
}

/// Whether this build counts (the `lock-profile` feature).
pub fn enabled() -> bool {
    cfg!(feature = "lock-profile")
}

/// The counters since the start or the last [`reset`]; empty without the feature.
pub fn snapshot() -> Vec<LockStat> {
    #[cfg(feature = "lock-profile")]
    {
        use std::sync::atomic::Ordering::Relaxed;
        CLASSES
            .iter()
            .map(|(c, name)| LockStat {
                lock: name,
                acquisitions: counters::ACQ[*c as usize].load(Relaxed),
                contended: counters::CONTENDED[*c as usize].load(Relaxed),
                wait_ns: counters::WAIT_NS[*c as usize].load(Relaxed),
            })
            .collect()
    }
    #[cfg(not(feature = "lock-profile"))]
    {
        let _ = CLASSES;
        Vec::new()
    }
}

/// Zeroes the counters.
pub fn reset() {
    #[cfg(feature = "lock-profile")]
    for i in 0..CLASSES.len() {
        use std::sync::atomic::Ordering::Relaxed;
        counters::ACQ[i].store(0, Relaxed);
        counters::CONTENDED[i].store(0, Relaxed);
        counters::WAIT_NS[i].store(0, Relaxed);
    }
}
