//! LRU: a hit moves the entry to the back of the queue; the head is always the victim.

use super::{OnHit, Order};

pub(super) struct Lru;

impl Order for Lru {
    const ON_HIT: OnHit = OnHit::Requeue;
}
