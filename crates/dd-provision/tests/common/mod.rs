//! Curves and a latency model shared by the provisioner's test files.
#![allow(dead_code)] // each test file uses its own subset

use dd_provision::{Curve, LatencyModel, Unit};

/// Miss ratio 1 below `wss` pages, 0 from it (every page reused, all of them needed).
pub fn cliff(wss: u64) -> Curve {
    Curve::new(Unit::Pages, vec![wss - 1, wss], vec![1.0, 0.0]).unwrap()
}

/// Miss ratio falling linearly to 0 at `wss` pages (uniform reuse over a working set).
pub fn linear(wss: u64) -> Curve {
    Curve::new(Unit::Pages, vec![wss], vec![0.0]).unwrap()
}

/// Every access misses whatever the size.
pub fn all_misses() -> Curve {
    Curve::new(Unit::Pages, vec![0], vec![1.0]).unwrap()
}

/// Memory 1 us, memory cache 6 us, SSD cache 90 us, a disk of 4 ms.
pub fn lat() -> LatencyModel {
    LatencyModel {
        memory_hit_ns: 1_000.0,
        mem_cache_hit_ns: 6_000.0,
        ssd_cache_hit_ns: 90_000.0,
        file_miss_ns: 4_000_000.0,
        anon_miss_ns: 4_000_000.0,
    }
}
