//! FIFO: insertion order, hits change nothing (the paper's order; for an exclusive cache, whose gets
//! remove the page, it is also LRU).

use super::{OnHit, Order};

pub(super) struct Fifo;

impl Order for Fifo {
    const ON_HIT: OnHit = OnHit::Nothing;
}
