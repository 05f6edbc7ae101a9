//! S3-FIFO (Yang et al., SOSP'23): new keys enter a small FIFO unless the ghost remembers them, in which
//! case they enter the main FIFO; a hit raises a 2-bit frequency. The small list is evicted from while
//! it holds at least 10% of the units (or main is empty): its head moves to main if it was hit,
//! otherwise it leaves and is remembered as a ghost. Main's head is re-queued with its frequency
//! decremented while that is non-zero. The ghost itself is its user's (its keys are the user's).

use super::{AtHead, List, OnHit, Order};

pub(super) struct S3Fifo;

impl Order for S3Fifo {
    const PROBATION: bool = true;
    const ON_HIT: OnHit = OnHit::Count;
    #[inline]
    fn victim_list(small: u64, main: u64) -> List {
        // The small list is kept at about 10% of the units (S3-FIFO's default).
        if small > 0 && (small * 10 >= small + main || main == 0) {
            List::Small
        } else {
            List::Main
        }
    }
    #[inline]
    fn at_head(list: List, freq: u8) -> AtHead {
        match (list, freq) {
            (_, 0) => AtHead::Evict,
            (List::Small, _) => AtHead::Requeue { to: List::Main, freq: 0 },
            (List::Main, f) => AtHead::Requeue { to: List::Main, freq: f - 1 },
        }
    }
}
