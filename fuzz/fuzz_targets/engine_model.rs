//! Fuzz target: the engine against the model test's reference model (issue 17, item 2).
//!
//! It is `crates/dd-engine/tests/model.rs` with libFuzzer choosing the operations instead of a seeded
//! random walk: the harness (`tests/model_harness/mod.rs`, with `tests/common/mod.rs`) is included
//! by path in `dd_fuzz::engine_model`, not copied, so both check the same model. The first input byte
//! picks the engine (plain; de-duplication and compression; compression only; an SSD store over the
//! fault injector) and the harness's seed (the pools' initial specs); every following chunk is one
//! `Op` (several VMs, pools, both stores, eviction orders, modes and reconfigurations, and under the
//! injector disk faults and heals). The harness asserts after every operation (hits are the latest
//! put, persistent pages are never lost unless reported, the statistics identity holds) and runs the
//! full checks every 256 operations (the identity as the statistics report it, the engine's
//! invariants, the persistent pools' counts); the end of an input runs them once more.
//!
//! Speed (BENCHMARKS.md, "Fuzzing"): each input builds a fresh engine, so that a failure reproduces
//! from its input alone; its SSD store is an unnamed scratch file with buffered I/O
//! (`Harness::fast`), and the identity after each operation is `Cache::check_identity`, not the
//! statistics.
#![no_main]

use dd_fuzz::engine_model::{assert_identity_stats, read_input, setup_of, Harness};
use libfuzzer_sys::fuzz_target;

/// Where every input's SSD file is made: unnamed (`O_TMPFILE`), so nothing is left behind.
fn scratch_dir() -> std::path::PathBuf {
    std::env::temp_dir()
}

fuzz_target!(|data: &[u8]| {
    let Some((selector, ops)) = read_input(data) else { return };
    let mut h = Harness::fast((selector >> 2) as u64, setup_of(selector), &scratch_dir());
    for o in &ops {
        h.apply(o);
    }
    h.cache.quiesce();
    h.cache.check_invariants().unwrap();
    assert_identity_stats(&h.cache);
    h.check_persistent_counts();
});
