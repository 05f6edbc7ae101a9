//! CLOCK: second-chance FIFO. A hit sets the entry's reference (a frequency above 0); a referenced
//! head loses its reference and goes to the back instead of being evicted.

use super::{AtHead, List, OnHit, Order};

pub(super) struct Clock;

impl Order for Clock {
    const ON_HIT: OnHit = OnHit::Count;
    #[inline]
    fn at_head(_list: List, freq: u8) -> AtHead {
        if freq > 0 {
            AtHead::Requeue { to: List::Main, freq: 0 }
        } else {
            AtHead::Evict
        }
    }
}
