//! Model-based test: random operation sequences against a simple reference model (acceptance 2 of the
//! engine issue).
//!
//! The model is a map `(vm, pool, key) -> version` of what the cache *may* hold. The cache is allowed
//! to forget ephemeral pages (eviction), so for an ephemeral pool a get must either miss or return
//! exactly the model's latest version; for a persistent pool the get must hit with it (persistent pages
//! are never lost). Every page's bytes encode `(pool, key, version)`, so stale, flushed or foreign data is
//! detected byte for byte. After every operation the statistics identity is checked for every pool, VM
//! and the host; every 256 operations the engine's full invariant check runs.
//!
//! Two drivers share the op generator: a proptest (shrinking sequences) and a long seeded run of more
//! than 100 000 operations across several VMs, pools, stores, modes and reconfigurations.

mod common;
mod model_harness;

use common::*;
use model_harness::*;
use proptest::prelude::*;
use rand::{Rng, SeedableRng};

fn run_ops(seed: u64, ops: &[Op]) {
    let mut h = Harness::new(seed);
    for op in ops {
        h.apply(op);
    }
    h.cache.check_invariants().unwrap();
    h.check_persistent_counts();
}

fn op_strategy() -> impl Strategy<Value = Op> {
    any::<u64>().prop_map(|s| gen_op(&mut rand_chacha::ChaCha8Rng::seed_from_u64(s)))
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    /// Random sequences with shrinking: a failure is reported as a minimal op list.
    #[test]
    fn random_sequences_agree_with_the_model(seed in any::<u64>(), ops in prop::collection::vec(op_strategy(), 1..1500)) {
        run_ops(seed, &ops);
    }
}

/// The model run with de-duplication and compression on, shared contents, and one VM in its own
/// de-dup domain (acceptance 3 of the de-duplication issue).
#[test]
fn long_seeded_run_with_dedup_and_compression_agrees_with_the_model() {
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(0xDED09);
    let mut h = Harness::with(11, true, true);
    for _ in 0..60_000 {
        let op = gen_op(&mut rng);
        h.apply(&op);
    }
    h.cache.check_invariants().unwrap();
    let t = h.cache.host_stats().totals;
    eprintln!("dedup run totals: {t:?}");
    assert!(t.mem.dedup_hits > 500 && t.mem.bytes_saved > t.mem.dedup_hits * PS as u64, "{t:?}");
}

/// The model run with compression only.
#[test]
fn long_seeded_run_with_compression_agrees_with_the_model() {
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(0xC0_4E55);
    let mut h = Harness::with(12, false, true);
    for _ in 0..60_000 {
        let op = gen_op(&mut rng);
        h.apply(&op);
    }
    h.cache.check_invariants().unwrap();
    let t = h.cache.host_stats().totals;
    assert!(t.mem.bytes_saved > 0 && t.mem.dedup_hits == 0, "{t:?}");
}

/// The long run: 120 000 operations from a fixed seed, across every op kind.
#[test]
fn long_seeded_run_agrees_with_the_model() {
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(0xD0_0B1E_DECC);
    let ops: Vec<Op> = (0..120_000).map(|_| gen_op(&mut rng)).collect();
    let mut h = Harness::new(7);
    for op in &ops {
        h.apply(op);
    }
    h.cache.check_invariants().unwrap();
    // The run must actually exercise what it claims to: hits from both stores, evictions, tier moves,
    // migrations and refusals.
    let t = h.cache.host_stats().totals;
    eprintln!("long run totals: {t:?}");
    assert_eq!(h.ops, 120_000);
    assert!(t.mem.gets_hit > 1_000 && t.ssd.gets_hit > 1_000, "{t:?}");
    assert!(t.mem.evictions > 100 && t.ssd.evictions > 100, "{t:?}");
    assert!(t.demotions > 100 && t.promotions > 10, "{t:?}");
    assert!(t.migrations_in > 100 && t.puts_refused > 100, "{t:?}");
}

/// An operation of a run over a failing disk: one in a hundred starts a fault, one in a hundred heals
/// the disk, the rest are `gen_op`'s.
fn gen_op_over_failing_disk(rng: &mut impl Rng) -> Op {
    match rng.gen_range(0..100) {
        0 => Op::Fault {
            op: rng.gen(),
            after: rng.gen_range(0..40),
            kind: rng.gen(),
            times: rng.gen_range(1..20),
        },
        1 => Op::Heal,
        _ => gen_op(rng),
    }
}

/// The model run over a failing disk (issue 17): every so often the SSD store's reads, writes or
/// extensions start failing (EIO, ENOSPC, short transfers) and later heal. Every hit must still be the
/// latest put, and every persistent page the model holds but the cache lost must be in `pages_lost`.
#[test]
fn long_seeded_run_over_a_failing_disk_agrees_with_the_model() {
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(0xFA_17ED);
    let mut h = Harness::with_faults(13);
    for _ in 0..40_000 {
        h.apply(&gen_op_over_failing_disk(&mut rng));
    }
    h.cache.quiesce();
    h.cache.check_invariants().unwrap();
    h.check_persistent_counts();
    let io = h.cache.ssd_io_stats().unwrap();
    eprintln!("failing-disk run: {io:?} totals {:?}", h.cache.host_stats().totals);
    assert!(io.read_errors > 10 && io.write_errors > 10, "the run injected too few faults: {io:?}");
}

/// The long run with every pool in several shards (issue 28): 2, 4 and 8 shards, each the same checks
/// (the model's gets, the identity after every operation, the full invariant check, which verifies
/// every key is in its own shard).
#[test]
fn long_seeded_run_with_sharded_pools_agrees_with_the_model() {
    for shards in [2u32, 4, 8] {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(0x5A_4D00 + shards as u64);
        let mut h = Harness::sharded(17 + shards as u64, shards);
        for _ in 0..60_000 {
            h.apply(&gen_op(&mut rng));
        }
        h.cache.check_invariants().unwrap();
        h.check_persistent_counts();
        let t = h.cache.host_stats().totals;
        eprintln!("{shards} shards: {t:?}");
        assert!(t.mem.gets_hit > 500 && t.ssd.gets_hit > 500, "{t:?}");
        assert!(t.mem.evictions > 50 && t.ssd.evictions > 50, "{t:?}");
        assert!(t.demotions > 50 && t.promotions > 5 && t.migrations_in > 50, "{t:?}");
    }
}

/// The failing-disk run with sharded pools.
#[test]
fn long_seeded_run_over_a_failing_disk_with_sharded_pools_agrees_with_the_model() {
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(0xFA17_ED5A);
    let mut h = Harness::sharded_with_faults(19, 4);
    for _ in 0..30_000 {
        h.apply(&gen_op_over_failing_disk(&mut rng));
    }
    h.cache.quiesce();
    h.cache.check_invariants().unwrap();
    h.check_persistent_counts();
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    /// Random sequences over pools of 2, 4 or 8 shards.
    #[test]
    fn random_sequences_over_sharded_pools_agree_with_the_model(
        seed in any::<u64>(),
        shards_log in 1u32..4,
        ops in prop::collection::vec(op_strategy(), 1..1500),
    ) {
        let mut h = Harness::sharded(seed, 1 << shards_log);
        for op in &ops {
            h.apply(op);
        }
        h.cache.check_invariants().unwrap();
        h.check_persistent_counts();
    }
}
