//! Fuzz target: the engine against the model test's reference model (issue 17, item 2).
//!
//! It is `crates/dd-engine/tests/model.rs` with libFuzzer choosing the operations instead of a seeded
//! random walk: the harness (`tests/model_harness/mod.rs`, with `tests/common/mod.rs`) is included
//! here by path, not copied, so both check the same model. The first input byte picks the engine (plain;
//! de-duplication and compression; compression only; an SSD store over the fault injector) and the
//! harness's seed (the pools' initial specs); every following chunk is one `Op` (several VMs, pools,
//! both stores, eviction orders, modes and reconfigurations, and under the injector disk faults and
//! heals). The harness asserts after every operation (hits are the latest put, persistent pages are
//! never lost unless reported, the statistics identity holds) and runs the full invariant check every
//! 256 operations; the end of an input runs it once more, with the persistent pools' counts.
#![no_main]

#[path = "../../crates/dd-engine/tests/common/mod.rs"]
mod common;
#[path = "../../crates/dd-engine/tests/model_harness/mod.rs"]
mod model_harness;

use arbitrary::{Result, Unstructured};
use libfuzzer_sys::fuzz_target;
use model_harness::{Harness, Op, INDICES, OBJECTS, POOLS_PER_VM, VMS};

/// One operation from the input, in the harness's ranges (VM, pool slot, object and index are
/// reduced modulo the model's sizes, so that every chunk is a valid operation).
fn op(u: &mut Unstructured) -> Result<Op> {
    let vm = u.int_in_range(1..=VMS)?;
    let slot = u.choose_index(POOLS_PER_VM)?;
    let obj = u.int_in_range(0..=OBJECTS - 1)?;
    let idx = u.int_in_range(0..=INDICES - 1)?;
    // Puts and gets most often, as in `gen_op`: they are what the reconfigurations act on.
    Ok(match u.int_in_range(0..=19u8)? {
        0..=5 => Op::Put { vm, slot, obj, idx },
        6..=9 => Op::Get { vm, slot, obj, idx },
        10 => Op::GetBatch { vm, slot, obj },
        11 => Op::PutBatch { vm, slot, obj, n: u.int_in_range(1..=15)? },
        12 => Op::FlushPage { vm, slot, obj, idx },
        13 => Op::FlushObject { vm, slot, obj },
        14 => Op::Migrate { vm, from: slot, to: u.choose_index(POOLS_PER_VM)?, obj },
        15 => Op::SetSpec { vm, slot, spec: u.arbitrary()?, w: u.int_in_range(1..=99)? },
        16 => Op::Recreate { vm, slot, persistent: u.arbitrary()?, order: u.arbitrary()? },
        17 => match u.int_in_range(0..=5u8)? {
            0 => Op::SetVmWeights { vm, mem: u.int_in_range(0..=9)?, ssd: u.int_in_range(0..=9)? },
            1 => Op::SetCapacity { ssd: u.arbitrary()?, pages: u.int_in_range(8..=159)? },
            2 => Op::SetMode { global: u.arbitrary()? },
            3 => Op::SetBatch { pages: u.int_in_range(1..=8)? },
            4 => Op::Fault {
                op: u.arbitrary()?,
                after: u.int_in_range(0..=39)?,
                kind: u.arbitrary()?,
                times: u.int_in_range(1..=19)?,
            },
            _ => Op::Heal,
        },
        _ => Op::CrossVmProbe { vm, slot, other: u.int_in_range(1..=VMS)? },
    })
}

fuzz_target!(|data: &[u8]| {
    let mut u = Unstructured::new(data);
    let Ok(sel) = u.arbitrary::<u8>() else { return };
    let seed = (sel >> 2) as u64;
    let mut h = match sel % 4 {
        0 => Harness::new(seed),
        1 => Harness::with(seed, true, true),
        2 => Harness::with(seed, false, true),
        _ => Harness::with_faults(seed),
    };
    let mut n = 0;
    while n < 1024 && !u.is_empty() {
        let Ok(o) = op(&mut u) else { break };
        h.apply(&o);
        n += 1;
    }
    h.cache.quiesce();
    h.cache.check_invariants().unwrap();
    h.check_persistent_counts();
});
