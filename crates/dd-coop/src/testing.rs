//! An in-memory [`PinHost`] for tests and fuzzing (feature `testing`): frames by content hash instead
//! of an engine, the real [`PinTable`], and pin handles from a seeded generator, so that
//! [`serve::handle`](crate::serve::handle) runs without a daemon. The fake network of
//! `tests/fake_net.rs` answers with it, and so does the fuzz target `peer_handler`; both check
//! [`MemHost::check`] after every request.
//!
//! Not for production: it holds every frame in a map and never evicts.

use crate::pins::PinTable;
use crate::serve::PinHost;
use std::cell::{Cell, RefCell};
use std::collections::HashMap;

/// What a [`MemHost`] holds, open to the test that drives it.
#[derive(Debug, Default)]
pub struct HostState {
    /// The pin table the listener keeps for its peers.
    pub table: PinTable,
    /// The frames it holds, by content hash.
    pub frames: HashMap<u128, Vec<u8>>,
    /// Engine pins held for peers: pin → content hash of the pinned frame.
    pub engine: HashMap<u64, u128>,
    /// Answers reads of pins with other bytes (a corrupt holder).
    pub corrupt: bool,
    /// At most this many pins for all peers together.
    pub max_pins: u64,
    next_pin: u64,
}

/// An in-memory host of pinned frames (see the module docs).
#[derive(Debug)]
pub struct MemHost {
    page_size: usize,
    state: RefCell<HostState>,
    /// The handle generator's state, apart from `state`: handles are drawn inside `with_pins`.
    handles: Cell<u64>,
}

impl MemHost {
    /// A host of pages of `page_size` bytes holding `frames`, handles drawn from `seed`, no pin limit.
    pub fn new(page_size: usize, frames: HashMap<u128, Vec<u8>>, seed: u64) -> Self {
        MemHost {
            page_size,
            state: RefCell::new(HostState {
                frames,
                max_pins: u64::MAX,
                next_pin: 1,
                ..HostState::default()
            }),
            handles: Cell::new(seed),
        }
    }

    /// Reads what the host holds.
    pub fn state(&self) -> std::cell::Ref<'_, HostState> {
        self.state.borrow()
    }

    /// Changes what the host holds (not while a `handle` call runs: there is none across calls).
    pub fn state_mut(&self) -> std::cell::RefMut<'_, HostState> {
        self.state.borrow_mut()
    }

    /// Releases `pins` of the engine that the pin table returned (a HELLO in a new epoch, a TTL
    /// expiry). Panics on a pin the engine did not hold: the table released something it never had.
    pub fn release(&self, pins: impl IntoIterator<Item = u64>) {
        let mut s = self.state.borrow_mut();
        for pin in pins {
            assert!(s.engine.remove(&pin).is_some(), "released pin {pin}, which the engine did not hold");
        }
    }

    /// The host's invariant: the engine's pins are exactly those of the pin table, so no pin is held
    /// without an owner and none the table names is gone.
    pub fn check(&self) {
        let s = self.state.borrow();
        assert_eq!(s.engine.len(), s.table.len(), "engine pins and the pin table disagree");
    }
}

impl PinHost for MemHost {
    fn page_size(&self) -> usize {
        self.page_size
    }
    fn max_pins(&self) -> u64 {
        self.state.borrow().max_pins
    }
    fn pins_held(&self) -> u64 {
        self.state.borrow().engine.len() as u64
    }
    fn pin(&self, hash: u128, page: &[u8]) -> Option<u64> {
        let mut s = self.state.borrow_mut();
        if s.frames.get(&hash).is_none_or(|f| f != page) {
            return None;
        }
        let pin = s.next_pin;
        s.next_pin += 1;
        s.engine.insert(pin, hash);
        Some(pin)
    }
    fn read_pin(&self, pin: u64, out: &mut [u8]) -> bool {
        let s = self.state.borrow();
        let Some(hash) = s.engine.get(&pin) else { return false };
        out.copy_from_slice(&s.frames[hash]);
        if s.corrupt {
            out[0] ^= 1;
        }
        true
    }
    fn unpin(&self, pin: u64) {
        self.state.borrow_mut().engine.remove(&pin);
    }
    fn with_pins<R>(&self, f: impl FnOnce(&mut PinTable) -> R) -> R {
        f(&mut self.state.borrow_mut().table)
    }
    fn draw_handle(&self) -> u64 {
        // splitmix64: deterministic per seed, which is all a test needs (the daemon draws from the OS).
        let mut z = self.handles.get().wrapping_add(0x9e37_79b9_7f4a_7c15);
        self.handles.set(z);
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
}
