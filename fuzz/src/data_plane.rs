//! The input of the `data_plane` target: typed data-plane requests of two VMs (issue 17, item 1), how
//! the target reads them (`read_steps`) and how the converter of recorded traffic writes them
//! (`write_steps`, the inverse).
//!
//! An input is a sequence of [`Step`]s read one after another until the input ends (not a
//! `Vec<Step>`, whose layout puts a continue flag before each element: random bytes would stop after
//! two). The target maps a [`PoolRef`] onto the VM's live pools and a [`KeyIn`] onto a small key space;
//! see `fuzz_targets/data_plane.rs` for what is checked.

use crate::unarbitrary::Writer;
use arbitrary::{Arbitrary, Unstructured};
use dd_engine::{Key, Spec};

/// Pages per batch the target's daemon allows (`engine.max_batch_pages`).
pub const MAX_BATCH: usize = 4;
/// Steps of one input at most.
pub const MAX_STEPS: usize = 256;

#[derive(Arbitrary, Debug, Clone, Copy, PartialEq, Eq)]
pub enum SpecIn {
    None,
    Mem(u8),
    Ssd(u8),
    Hybrid(u8, u8),
}

impl SpecIn {
    pub fn spec(self) -> Spec {
        match self {
            SpecIn::None => Spec::None,
            SpecIn::Mem(w) => Spec::Mem { weight: w as u32 },
            SpecIn::Ssd(w) => Spec::Ssd { weight: w as u32 },
            SpecIn::Hybrid(m, s) => Spec::Hybrid { mem_weight: m as u32, ssd_weight: s as u32 },
        }
    }

    /// The nearest typed spec of a recorded one (weights above 255 become 255).
    pub fn of(s: Spec) -> SpecIn {
        let w = |v: u32| v.min(255) as u8;
        match s {
            Spec::None => SpecIn::None,
            Spec::Mem { weight } => SpecIn::Mem(w(weight)),
            Spec::Ssd { weight } => SpecIn::Ssd(w(weight)),
            Spec::Hybrid { mem_weight, ssd_weight } => SpecIn::Hybrid(w(mem_weight), w(ssd_weight)),
        }
    }

    fn write(self, w: &mut Writer) {
        match self {
            SpecIn::None => w.variant(0, 4),
            SpecIn::Mem(x) => w.variant(1, 4).u8(x),
            SpecIn::Ssd(x) => w.variant(2, 4).u8(x),
            SpecIn::Hybrid(m, s) => w.variant(3, 4).u8(m).u8(s),
        };
    }
}

/// A pool reference: one of the VM's live pools by position (below 240), or a raw id
/// (`r % 16`) that may be a destroyed pool, another VM's, or none at all.
#[derive(Arbitrary, Debug, Clone, Copy, PartialEq, Eq)]
pub struct PoolRef(pub u8);

/// Keys come from a small space (4 objects of 8 pages) so that puts, gets and flushes meet.
#[derive(Arbitrary, Debug, Clone, Copy, PartialEq, Eq)]
pub struct KeyIn(pub u8);

impl KeyIn {
    pub fn key(self) -> Key {
        Key::new((self.0 >> 3) as u64 % 4, (self.0 & 7) as u64)
    }

    /// The key of the small space a recorded key folds onto (object modulo 4, index modulo 8).
    pub fn of(k: Key) -> KeyIn {
        KeyIn((((k.object % 4) as u8) << 3) | (k.index % 8) as u8)
    }
}

#[derive(Arbitrary, Debug, Clone, PartialEq, Eq)]
pub enum Req {
    CreatePool {
        persistent: bool,
        order: u8,
        exclusive: bool,
        spec: SpecIn,
    },
    DestroyPool(PoolRef),
    SetSpec(PoolRef, SpecIn),
    Put(PoolRef, KeyIn),
    /// A put whose page is not page-sized (refused with bad_page_size).
    PutShort(PoolRef, KeyIn, u16),
    Get(PoolRef, KeyIn),
    FlushPage(PoolRef, KeyIn),
    FlushObject(PoolRef, u8),
    Migrate {
        from: PoolRef,
        to: PoolRef,
        object: u8,
    },
    /// The first `n % 6` keys: up to one more than the batch limit. (A fixed array, not a `Vec`:
    /// `arbitrary` sizes a `Vec` from the input's tail, so one batch would swallow the rest of a session.)
    PutBatch(PoolRef, u8, [KeyIn; MAX_BATCH + 1]),
    GetBatch(PoolRef, u8, [KeyIn; MAX_BATCH + 1]),
    PoolStats(PoolRef),
    VmStats,
    ListPools,
    Ping,
    Hello,
}

const REQ_VARIANTS: u32 = 16;

impl Req {
    fn write(&self, w: &mut Writer) {
        let v = |w: &mut Writer, i: u32| {
            w.variant(i, REQ_VARIANTS);
        };
        let keys = |w: &mut Writer, ks: &[KeyIn; MAX_BATCH + 1]| {
            for k in ks {
                w.u8(k.0);
            }
        };
        match self {
            Req::CreatePool { persistent, order, exclusive, spec } => {
                v(w, 0);
                w.bool(*persistent).u8(*order).bool(*exclusive);
                spec.write(w);
            }
            Req::DestroyPool(p) => {
                v(w, 1);
                w.u8(p.0);
            }
            Req::SetSpec(p, s) => {
                v(w, 2);
                w.u8(p.0);
                s.write(w);
            }
            Req::Put(p, k) => {
                v(w, 3);
                w.u8(p.0).u8(k.0);
            }
            Req::PutShort(p, k, len) => {
                v(w, 4);
                w.u8(p.0).u8(k.0).u16(*len);
            }
            Req::Get(p, k) => {
                v(w, 5);
                w.u8(p.0).u8(k.0);
            }
            Req::FlushPage(p, k) => {
                v(w, 6);
                w.u8(p.0).u8(k.0);
            }
            Req::FlushObject(p, o) => {
                v(w, 7);
                w.u8(p.0).u8(*o);
            }
            Req::Migrate { from, to, object } => {
                v(w, 8);
                w.u8(from.0).u8(to.0).u8(*object);
            }
            Req::PutBatch(p, n, ks) => {
                v(w, 9);
                w.u8(p.0).u8(*n);
                keys(w, ks);
            }
            Req::GetBatch(p, n, ks) => {
                v(w, 10);
                w.u8(p.0).u8(*n);
                keys(w, ks);
            }
            Req::PoolStats(p) => {
                v(w, 11);
                w.u8(p.0);
            }
            Req::VmStats => v(w, 12),
            Req::ListPools => v(w, 13),
            Req::Ping => v(w, 14),
            Req::Hello => v(w, 15),
        }
    }
}

#[derive(Arbitrary, Debug, Clone, PartialEq, Eq)]
pub struct Step {
    pub vm2: bool,
    pub req: Req,
    /// 1 in 16 steps flips byte `at` (modulo the frame's length) with `xor`.
    pub mutate: u8,
    pub at: u16,
    pub xor: u8,
}

impl Step {
    /// A step of `vm2`'s connection sending `req` as it is (no flipped byte).
    pub fn plain(vm2: bool, req: Req) -> Step {
        Step { vm2, req, mutate: 0, at: 0, xor: 0 }
    }

    fn write(&self, w: &mut Writer) {
        w.bool(self.vm2);
        self.req.write(w);
        w.u8(self.mutate).u16(self.at).u8(self.xor);
    }
}

/// The steps of an input, as the target reads them (at most [`MAX_STEPS`]).
pub fn read_steps(data: &[u8]) -> Vec<Step> {
    let mut u = Unstructured::new(data);
    let mut steps = Vec::new();
    while steps.len() < MAX_STEPS && !u.is_empty() {
        let Ok(s) = Step::arbitrary(&mut u) else { break };
        steps.push(s);
    }
    steps
}

/// The input whose steps are `steps` (the inverse of [`read_steps`] for at most [`MAX_STEPS`] steps).
pub fn write_steps(steps: &[Step]) -> Vec<u8> {
    let mut w = Writer::new();
    for s in steps {
        s.write(&mut w);
    }
    w.bytes
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};

    /// Random steps of every kind, written and read back.
    #[test]
    fn written_steps_read_back_the_same() {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(17);
        for _ in 0..200 {
            let n = rng.gen_range(0..40);
            // Random bytes decode to random steps of every kind; writing those must give them back.
            let bytes: Vec<u8> = (0..n * 12).map(|_| rng.gen()).collect();
            let steps = read_steps(&bytes);
            assert_eq!(read_steps(&write_steps(&steps)), steps);
        }
    }
}
