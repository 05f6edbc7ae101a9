//! The input of the `peer_handler` target: a pin limit and typed steps of three peers (issue 15,
//! item 3; issue 17, item 4), and the writer the converter of recorded peer traffic uses (the inverse
//! of `arbitrary`'s decoding of [`Input`]). See `fuzz_targets/peer_handler.rs` for what is checked.

use crate::unarbitrary::Writer;
use arbitrary::Arbitrary;

/// Pages the target's host holds (`page(0..HELD)`); compares may name `page(HELD..HELD + 4)` too.
pub const HELD: u8 = 8;
/// Page indexes a compare can name.
pub const PAGES: u8 = HELD + 4;

#[derive(Arbitrary, Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Who {
    A,
    B,
    /// A session whose pin-table entry is gone.
    M,
}

/// A pin handle: one granted to some peer (by index into every handle the model knows), or any.
#[derive(Arbitrary, Debug, Clone, Copy, PartialEq, Eq)]
pub enum Handle {
    Granted(u8),
    Raw(u64),
}

#[derive(Arbitrary, Debug, Clone, PartialEq, Eq)]
pub enum Req {
    /// A compare of page `page % PAGES`, with one byte changed or the hash off by one.
    Compare {
        page: u8,
        alter: Option<u8>,
        wrong_hash: bool,
    },
    Fetch(Handle),
    Unpin(Vec<Handle>),
    /// A summary of `bytes` bytes (`m_bits` right or off by `skew`).
    Summary {
        bytes: u8,
        k: u8,
        skew: u8,
    },
    Hello {
        epoch: u64,
    },
    Auth,
    /// A raw op byte and payload.
    Raw {
        op: u8,
        payload: Vec<u8>,
    },
}

#[derive(Arbitrary, Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// A request of `from`, one byte of its encoded payload xor-ed when `flip` is given.
    Request { from: Who, req: Req, flip: Option<(u16, u8)> },
    /// `from` authenticates again (a reconnect in `epoch % 3`): a new epoch releases its pins. With
    /// `stale`, on another connection while the old session goes on with its old epoch.
    Reconnect { from: Who, epoch: u8, stale: bool },
    /// Time passes; peers silent for the pin TTL lose their entry and pins.
    Wait { ms: u16 },
}

#[derive(Arbitrary, Debug, Clone, PartialEq, Eq)]
pub struct Input {
    pub max_pins: u8,
    pub steps: Vec<Step>,
}

fn write_who(w: &mut Writer, who: Who) {
    w.variant(who as u32, 3);
}

fn write_handle(w: &mut Writer, h: &Handle) {
    match h {
        Handle::Granted(i) => w.variant(0, 2).u8(*i),
        Handle::Raw(v) => w.variant(1, 2).u64(*v),
    };
}

fn write_req(w: &mut Writer, r: &Req) {
    const N: u32 = 7;
    match r {
        Req::Compare { page, alter, wrong_hash } => {
            w.variant(0, N).u8(*page).option(alter.as_ref(), |w, a| {
                w.u8(*a);
            });
            w.bool(*wrong_hash);
        }
        Req::Fetch(h) => {
            w.variant(1, N);
            write_handle(w, h);
        }
        Req::Unpin(hs) => {
            w.variant(2, N).vec(hs, write_handle);
        }
        Req::Summary { bytes, k, skew } => {
            w.variant(3, N).u8(*bytes).u8(*k).u8(*skew);
        }
        Req::Hello { epoch } => {
            w.variant(4, N).u64(*epoch);
        }
        Req::Auth => {
            w.variant(5, N);
        }
        Req::Raw { op, payload } => {
            w.variant(6, N).u8(*op).vec(payload, |w, b| {
                w.u8(*b);
            });
        }
    }
}

fn write_step(w: &mut Writer, s: &Step) {
    match s {
        Step::Request { from, req, flip } => {
            w.variant(0, 3);
            write_who(w, *from);
            write_req(w, req);
            w.option(flip.as_ref(), |w, (at, x)| {
                w.u16(*at).u8(*x);
            });
        }
        Step::Reconnect { from, epoch, stale } => {
            w.variant(1, 3);
            write_who(w, *from);
            w.u8(*epoch).bool(*stale);
        }
        Step::Wait { ms } => {
            w.variant(2, 3).u16(*ms);
        }
    }
}

/// The bytes `fuzz_target!` decodes to `input` (`Input::arbitrary_take_rest`).
pub fn write_input(input: &Input) -> Vec<u8> {
    let mut w = Writer::new();
    w.u8(input.max_pins).rest_vec(&input.steps, write_step);
    w.bytes
}

#[cfg(test)]
mod tests {
    use super::*;
    use arbitrary::Unstructured;
    use rand::{Rng, SeedableRng};

    #[test]
    fn written_inputs_read_back_the_same() {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(15);
        for _ in 0..300 {
            let n = rng.gen_range(0..600);
            let bytes: Vec<u8> = (0..n).map(|_| rng.gen()).collect();
            let Ok(input) = Input::arbitrary_take_rest(Unstructured::new(&bytes)) else { continue };
            let again = Input::arbitrary_take_rest(Unstructured::new(&write_input(&input))).unwrap();
            assert_eq!(again, input);
        }
    }
}
