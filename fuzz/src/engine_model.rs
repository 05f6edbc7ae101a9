//! The input of the `engine_model` target (issue 17, item 2): a selector byte, then one model
//! operation per chunk, read with `Unstructured` as [`read_input`] says; and [`write_input`], its
//! inverse, for the converter of recorded traffic.
//!
//! The operations are the model test's (`crates/dd-engine/tests/model_harness/mod.rs`, included here
//! by path with `tests/common/mod.rs`, not copied, so that the test and the target check the same
//! model). The selector picks the engine (`selector % 4`: plain; de-duplication and compression;
//! compression only; an SSD store over the fault injector) and the harness's seed (`selector >> 2`:
//! the pools' initial specs).

#[path = "../../crates/dd-engine/tests/common/mod.rs"]
mod common;
#[path = "../../crates/dd-engine/tests/model_harness/mod.rs"]
pub mod model_harness;

use crate::unarbitrary::Writer;
use arbitrary::{Result, Unstructured};
pub use model_harness::{assert_identity_stats, Harness, Op, Setup, INDICES, OBJECTS, POOLS_PER_VM, VMS};

/// Operations of one input at most.
pub const MAX_OPS: usize = 1024;

/// The engine a selector byte picks: its low two bits the stores, the next two the pools' shard count
/// (1, 2, 4 or 8; issue 28).
pub fn setup_of(selector: u8) -> Setup {
    let shards = 1 << ((selector / 4) % 4);
    let stores = match selector % 4 {
        0 => Setup::default(),
        1 => Setup { dedup: true, compress: true, ..Setup::default() },
        2 => Setup { compress: true, ..Setup::default() },
        _ => Setup { faults: true, ..Setup::default() },
    };
    Setup { shards, ..stores }
}

/// One operation from the input, in the harness's ranges (VM, pool slot, object and index are
/// reduced modulo the model's sizes, so that every chunk is a valid operation).
pub fn op(u: &mut Unstructured) -> Result<Op> {
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

/// The selector and the operations of an input, as the target reads them.
pub fn read_input(data: &[u8]) -> Option<(u8, Vec<Op>)> {
    let mut u = Unstructured::new(data);
    let selector = u.arbitrary::<u8>().ok()?;
    let mut ops = Vec::new();
    while ops.len() < MAX_OPS && !u.is_empty() {
        let Ok(o) = op(&mut u) else { break };
        ops.push(o);
    }
    Some((selector, ops))
}

/// Writes the chunk `op` reads back as `o` (the inverse of [`op`] for operations in its ranges).
pub fn write_op(w: &mut Writer, o: &Op) {
    // VM, slot, object and index first (values of no use to an operation are written as the lowest),
    // then the kind in 0..=19 and the kind's own fields.
    let head = |w: &mut Writer, vm: u32, slot: usize, obj: u64, idx: u64, kind: u64| {
        w.in_range(vm as u64, 1, VMS as u64)
            .in_range(slot as u64, 0, POOLS_PER_VM as u64 - 1)
            .in_range(obj, 0, OBJECTS - 1)
            .in_range(idx, 0, INDICES - 1)
            .in_range(kind, 0, 19);
    };
    let host = |w: &mut Writer, sub: u64| {
        head(w, 1, 0, 0, 0, 17);
        w.in_range(sub, 0, 5);
    };
    match *o {
        Op::Put { vm, slot, obj, idx } => head(w, vm, slot, obj, idx, 0),
        Op::Get { vm, slot, obj, idx } => head(w, vm, slot, obj, idx, 6),
        Op::GetBatch { vm, slot, obj } => head(w, vm, slot, obj, 0, 10),
        Op::PutBatch { vm, slot, obj, n } => {
            head(w, vm, slot, obj, 0, 11);
            w.in_range(n, 1, 15);
        }
        Op::FlushPage { vm, slot, obj, idx } => head(w, vm, slot, obj, idx, 12),
        Op::FlushObject { vm, slot, obj } => head(w, vm, slot, obj, 0, 13),
        Op::Migrate { vm, from, to, obj } => {
            head(w, vm, from, obj, 0, 14);
            w.in_range(to as u64, 0, POOLS_PER_VM as u64 - 1);
        }
        Op::SetSpec { vm, slot, spec, w: weight } => {
            head(w, vm, slot, 0, 0, 15);
            w.u8(spec).in_range(weight as u64, 1, 99);
        }
        Op::Recreate { vm, slot, persistent, order } => {
            head(w, vm, slot, 0, 0, 16);
            w.bool(persistent).u8(order);
        }
        Op::SetVmWeights { vm, mem, ssd } => {
            head(w, vm, 0, 0, 0, 17);
            w.in_range(0, 0, 5).in_range(mem as u64, 0, 9).in_range(ssd as u64, 0, 9);
        }
        Op::SetCapacity { ssd, pages } => {
            host(w, 1);
            w.bool(ssd).in_range(pages, 8, 159);
        }
        Op::SetMode { global } => {
            host(w, 2);
            w.bool(global);
        }
        Op::SetBatch { pages } => {
            host(w, 3);
            w.in_range(pages, 1, 8);
        }
        Op::Fault { op, after, kind, times } => {
            host(w, 4);
            w.u8(op).in_range(after as u64, 0, 39).u8(kind).in_range(times as u64, 1, 19);
        }
        Op::Heal => host(w, 5),
        Op::CrossVmProbe { vm, slot, other } => {
            head(w, vm, slot, 0, 0, 18);
            w.in_range(other as u64, 1, VMS as u64);
        }
    }
}

/// The input [`read_input`] reads as `(selector, ops)`.
pub fn write_input(selector: u8, ops: &[Op]) -> Vec<u8> {
    let mut w = Writer::new();
    w.u8(selector);
    for o in ops {
        write_op(&mut w, o);
    }
    w.bytes
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};

    /// Random inputs read as operations of every kind; writing those must give them back.
    #[test]
    fn written_ops_read_back_the_same() {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(2);
        let mut kinds = std::collections::BTreeSet::new();
        for _ in 0..300 {
            let bytes: Vec<u8> = (0..rng.gen_range(1..400)).map(|_| rng.gen()).collect();
            let (sel, ops) = read_input(&bytes).unwrap();
            kinds.extend(ops.iter().map(|o| format!("{o:?}").split([' ', '{']).next().unwrap().to_string()));
            let (sel2, ops2) = read_input(&write_input(sel, &ops)).unwrap();
            assert_eq!((sel2, format!("{ops2:?}")), (sel, format!("{ops:?}")));
        }
        assert_eq!(kinds.len(), 16, "every kind of operation was tried: {kinds:?}");
    }
}
