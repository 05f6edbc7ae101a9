//! The per-page constants of the lab's memory estimate (`dd_lab::sim::budget`) against the resident memory
//! of a real engine and a real guest model filled to capacity in the worst case the estimate assumes
//! (one page per object), with churn. One test in its own process, so no other test's allocations
//! move the resident-set figures.

use dd_engine::{Cache, Key, Mode, PoolOptions, Spec, VmId, VmWeights};
use dd_lab::sim::backend::{engine_config, BackendConfig, ENGINE_PAGE};
use dd_lab::sim::budget::{ENGINE_INDEX_BYTES_PER_PAGE, GUEST_BYTES_PER_PAGE};

fn status_kib(field: &str) -> u64 {
    let s = std::fs::read_to_string("/proc/self/status").unwrap();
    s.lines()
        .find_map(|l| l.strip_prefix(field)?.split_whitespace().next()?.parse::<u64>().ok())
        .unwrap_or_else(|| panic!("{field} in /proc/self/status"))
}

/// Peak resident bytes since the last reset (writing 5 to `clear_refs` resets `VmHWM`).
fn reset_peak() -> u64 {
    std::fs::write("/proc/self/clear_refs", "5").unwrap();
    status_kib("VmRSS:") * 1024
}
fn peak_since(base: u64) -> u64 {
    (status_kib("VmHWM:") * 1024).saturating_sub(base)
}

#[test]
fn the_estimates_per_page_constants_bound_a_full_engine_and_guest() {
    const N: u64 = 1 << 18;

    let base = reset_peak();
    let mut g = dd_lab::model::guest::Guest::new(N, dd_lab::scenario::LruMode::TwoList, 32);
    let cg = g.add_memcg(N, u64::MAX);
    // Twice the guest's memory, so reclaim runs and the lists churn at capacity.
    for i in 0..2 * N {
        g.insert(cg, dd_lab::model::guest::key(i as u32, 0), false, false, &mut |_| {});
    }
    let guest = peak_since(base);
    drop(g);
    eprintln!("guest: {} B/page (estimate {GUEST_BYTES_PER_PAGE})", guest / N);
    assert!(guest <= N * GUEST_BYTES_PER_PAGE, "guest model: {} B/page over the estimate", guest / N);

    let base = reset_peak();
    let cfg = BackendConfig {
        mem_pages: N,
        mem_max_pages: N,
        ssd_pages: 0,
        mode: Mode::Partitioned,
        batch_pages: 4096,
        scratch_dir: std::env::temp_dir(),
    };
    let cache = Cache::new(engine_config(&cfg)).unwrap();
    cache.add_vm(VmId(1), VmWeights::equal(100)).unwrap();
    let pool = cache.new_pool(VmId(1), PoolOptions::ephemeral(Spec::Mem { weight: 100 })).unwrap();
    let page = vec![1u8; ENGINE_PAGE];
    let mut out = vec![0u8; ENGINE_PAGE];
    // Fill, then churn: exclusive gets of half the pages and twice the capacity in new puts (evictions).
    for i in 0..N {
        cache.put(VmId(1), pool, Key::new(i, 0), &page).unwrap();
    }
    for i in 0..N / 2 {
        cache.get(VmId(1), pool, Key::new(i * 2, 0), &mut out).unwrap();
    }
    for i in N..3 * N {
        cache.put(VmId(1), pool, Key::new(i, 0), &page).unwrap();
    }
    let engine = peak_since(base);
    drop(cache);
    let per_page = ENGINE_PAGE as u64 + ENGINE_INDEX_BYTES_PER_PAGE;
    eprintln!("engine: {} B/page with its frame (estimate {per_page})", engine / N);
    assert!(engine <= N * per_page, "engine: {} B/page over the estimate", engine / N);
}
