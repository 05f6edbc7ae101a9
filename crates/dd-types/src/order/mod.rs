//! Eviction orders: the one table of orders with their wire codes, the one trait every order
//! implements, and the lazy-deletion list both of their users keep (docs/decisions.md D37).
//!
//! An order is one file here (`fifo.rs`, `lru.rs`, `clock.rs`, `s3fifo.rs`) implementing [`Order`]:
//! what a hit does, which list the next victim comes from, and what becomes of the entry found at a
//! list's head (the last two with defaults: the main list, and evict). It holds no storage: the engine's per-pool queues (`dd-engine/src/order.rs`, entries in
//! a slab, counted in pages) and `dd-mrc`'s miniature simulation (`dd-mrc/src/sim.rs`, entries in a
//! map, counted in slots or bytes) keep their own entries and ask the order for every decision, so an
//! order is written once and both run it.
//!
//! Adding an order touches its own file and this one: a variant with its wire code in
//! [`EvictionOrder`], its place in [`EvictionOrder::ALL`], its `mod` line and its arm in
//! `with_order!`. Everything that enumerates orders (the data-plane protocol, the model harness, the
//! fuzz targets) reads [`EvictionOrder::ALL`]; every `match` on an order outside this file is a
//! compile error when an order is added, pointing back here.
//!
//! Dispatch is static: [`EvictionOrder`]'s methods match once on the variant and call the order's
//! associated functions, which inline; nothing here is a `dyn` call (the engine asks per page).

mod clock;
mod fifo;
mod lazy;
mod lru;
mod s3fifo;

pub use lazy::LazyList;

use serde::{Deserialize, Serialize};

/// The order in which a pool gives up pages when it is the eviction victim.
///
/// The discriminants are the wire codes (the data plane's CREATE_POOL byte, `docs/protocol.md`) and
/// [`EvictionOrder::ALL`] lists every order by its code: this declaration and that list are the one
/// table a new order is added to; the protocol, the fuzz targets' typed inputs and the tests read it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
#[repr(u8)]
pub enum EvictionOrder {
    /// Insertion order (the paper's policy; equivalent to LRU for an exclusive cache).
    #[default]
    Fifo = 0,
    /// Least recently used: a replacing put or a non-exclusive hit refreshes the page.
    Lru = 1,
    /// Second-chance FIFO with a reference bit.
    Clock = 2,
    /// S3-FIFO (small probationary FIFO, main FIFO, ghost queue).
    S3Fifo = 3,
}

/// Calls `$body` with `$P` the type implementing [`Order`] for `$order`: the one `match` from an order's
/// wire-table variant to its file.
macro_rules! with_order {
    ($order:expr, $P:ident => $body:expr) => {
        match $order {
            EvictionOrder::Fifo => {
                type $P = fifo::Fifo;
                $body
            }
            EvictionOrder::Lru => {
                type $P = lru::Lru;
                $body
            }
            EvictionOrder::Clock => {
                type $P = clock::Clock;
                $body
            }
            EvictionOrder::S3Fifo => {
                type $P = s3fifo::S3Fifo;
                $body
            }
        }
    };
}

impl EvictionOrder {
    /// Every order, at the index of its wire code (codes are dense from 0; a unit test checks it).
    pub const ALL: [EvictionOrder; 4] =
        [EvictionOrder::Fifo, EvictionOrder::Lru, EvictionOrder::Clock, EvictionOrder::S3Fifo];

    /// The order's wire code. Codes are never reused for another order.
    pub const fn wire_code(self) -> u8 {
        self as u8
    }

    /// The order of a wire code, `None` for a code this version does not know.
    pub fn from_wire_code(code: u8) -> Option<EvictionOrder> {
        EvictionOrder::ALL.get(usize::from(code)).copied()
    }

    /// Whether new entries go to the small (probationary) list unless the ghost remembers their key,
    /// and entries evicted from the small list are remembered as ghosts ([`Order::PROBATION`]).
    #[inline]
    pub fn probation(self) -> bool {
        with_order!(self, P => P::PROBATION)
    }

    /// What a hit on a queued entry does ([`Order::ON_HIT`]).
    #[inline]
    pub fn on_hit(self) -> OnHit {
        with_order!(self, P => P::ON_HIT)
    }

    /// The list the next victim is sought in ([`Order::victim_list`]).
    #[inline]
    pub fn victim_list(self, small: u64, main: u64) -> List {
        with_order!(self, P => P::victim_list(small, main))
    }

    /// What becomes of the live entry at the head of `list` ([`Order::at_head`]).
    #[inline]
    pub fn at_head(self, list: List, freq: u8) -> AtHead {
        with_order!(self, P => P::at_head(list, freq))
    }
}

/// The highest frequency a counting order ([`OnHit::Count`]) records: two bits, as S3-FIFO's paper.
pub const MAX_FREQ: u8 = 3;

/// One of an order's two lists. Orders without probation use [`List::Main`] only.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum List {
    Main = 0,
    /// S3-FIFO's small probationary FIFO.
    Small = 1,
}

impl List {
    /// The list's index (`0` main, `1` small), as its users store it in an entry's position.
    pub const fn index(self) -> usize {
        self as usize
    }

    /// The list of an index from [`List::index`] (anything but 1 is main).
    pub const fn from_index(i: u8) -> List {
        if i == 1 {
            List::Small
        } else {
            List::Main
        }
    }
}

/// What a hit on a queued entry does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnHit {
    /// Nothing (FIFO).
    Nothing,
    /// The entry moves to the back of its list (LRU).
    Requeue,
    /// The entry's frequency rises by one, up to [`MAX_FREQ`] (CLOCK's reference bit, S3-FIFO).
    Count,
}

/// What becomes of the live entry at the head of the list a victim is sought in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AtHead {
    /// It is the victim. From the small list of a [`Order::PROBATION`] order, its key becomes a ghost.
    Evict,
    /// It moves to the back of list `to` with frequency `freq`, and the search goes on.
    Requeue { to: List, freq: u8 },
}

/// An eviction order: the decisions a queue of entries asks it for. Implemented once per order, in the
/// order's own file; called through [`EvictionOrder`]'s methods.
pub trait Order {
    /// New entries enter [`List::Small`] unless the ghost remembers their key (which it then forgets);
    /// a victim evicted from the small list is remembered. `false`: every entry is in [`List::Main`].
    const PROBATION: bool = false;
    /// What a hit does.
    const ON_HIT: OnHit;
    /// The list the next victim is sought in, given the units (entries, slots or bytes) each holds.
    #[inline]
    fn victim_list(small: u64, main: u64) -> List {
        let _ = (small, main);
        List::Main
    }
    /// What becomes of the live entry at the head of `list`, whose frequency is `freq`. By default it
    /// is the victim (FIFO, LRU).
    #[inline]
    fn at_head(list: List, freq: u8) -> AtHead {
        let _ = (list, freq);
        AtHead::Evict
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The wire table is dense, every code maps back to its order, and `ALL` holds every variant: the
    /// exhaustive match below stops compiling when an order is added, pointing here, to `ALL`.
    #[test]
    fn eviction_order_wire_table_is_complete_and_dense() {
        fn position(o: EvictionOrder) -> usize {
            match o {
                EvictionOrder::Fifo => 0,
                EvictionOrder::Lru => 1,
                EvictionOrder::Clock => 2,
                EvictionOrder::S3Fifo => 3,
            }
        }
        for (i, o) in EvictionOrder::ALL.into_iter().enumerate() {
            assert_eq!(position(o), i, "{o:?}");
            assert_eq!(usize::from(o.wire_code()), i, "{o:?}");
            assert_eq!(EvictionOrder::from_wire_code(o.wire_code()), Some(o));
        }
        assert_eq!(EvictionOrder::from_wire_code(EvictionOrder::ALL.len() as u8), None);
        assert_eq!(EvictionOrder::from_wire_code(u8::MAX), None);
    }

    /// The JSON names are the ones the admin API and the configuration files have always used.
    #[test]
    fn eviction_order_names_are_kebab_case() {
        let names: Vec<String> =
            EvictionOrder::ALL.iter().map(|o| serde_json::to_string(o).unwrap()).collect();
        assert_eq!(names, ["\"fifo\"", "\"lru\"", "\"clock\"", "\"s3-fifo\""]);
    }

    /// Every order's decisions keep an entry's frequency within two bits and send requeues to a list
    /// the order uses (no order without probation ever names the small list).
    #[test]
    fn every_order_stays_within_its_lists_and_frequency() {
        for o in EvictionOrder::ALL {
            for (small, main) in [(0, 0), (0, 5), (5, 0), (1, 9), (1, 10), (3, 100)] {
                let l = o.victim_list(small, main);
                assert!(o.probation() || l == List::Main, "{o:?}");
                if small == 0 {
                    assert_eq!(l, List::Main, "{o:?}: an empty small list is never the victim's");
                }
            }
            for list in [List::Main, List::Small] {
                if list == List::Small && !o.probation() {
                    continue;
                }
                for freq in 0..=MAX_FREQ {
                    if let AtHead::Requeue { to, freq: f } = o.at_head(list, freq) {
                        assert!(f <= MAX_FREQ && f < freq.max(1), "{o:?} {list:?} {freq}: {f}");
                        assert!(o.probation() || to == List::Main, "{o:?}");
                    }
                }
                // An unreferenced head is always the victim: the search ends.
                assert_eq!(o.at_head(list, 0), AtHead::Evict, "{o:?} {list:?}");
            }
        }
    }
}
