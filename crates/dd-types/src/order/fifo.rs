//! FIFO: insertion order, hits change nothing (the paper's order; for an exclusive cache, whose gets
//! remove the page, it is also LRU).

use super::{AtHead, List, OnHit, Order};

pub(super) struct Fifo;

impl Order for Fifo {
    const ON_HIT: OnHit = OnHit::Nothing;
    #[inline]
    fn at_head(_list: List, _freq: u8) -> AtHead {
        AtHead::Evict
    }
}
