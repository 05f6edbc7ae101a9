//! Per-thread stripes: the one place that hands each thread its stripe index.
//!
//! State written by every operation of every thread (request counters, the stores' reservation
//! credit, the memory store's free stacks, a registration's gate) is kept as an array of stripes, each
//! on cache lines of its own; a thread writes only its own stripe, and a reader folds them. Two threads
//! on different cores then never write one cache line per operation (issue 28, item 3: nothing shared
//! written per request). A thread's index is chosen once, round robin over the process, so the first
//! [`STRIPES`] threads that touch striped state each get a stripe to themselves; with more threads,
//! some share one, which stays correct (every stripe is atomic) and only costs speed.

use std::sync::atomic::{AtomicUsize, Ordering};

/// Stripes of process-wide striped state. A power of two at least the cores of a large host, so that
/// a daemon's runtime threads (one per core) rarely share one.
pub const STRIPES: usize = 64;

static NEXT: AtomicUsize = AtomicUsize::new(0);

thread_local! {
    static MINE: usize = NEXT.fetch_add(1, Ordering::Relaxed) % STRIPES;
}

/// This thread's stripe, in `0..STRIPES`; the same on every call from one thread.
#[inline]
pub fn index() -> usize {
    MINE.with(|s| *s)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_thread_keeps_its_stripe_and_threads_spread() {
        let here = index();
        assert_eq!(index(), here, "a thread's stripe changed between calls");
        let others: Vec<usize> = (0..8).map(|_| std::thread::spawn(index).join().unwrap()).collect();
        assert!(others.iter().all(|&s| s < STRIPES));
        // Round robin: eight threads started one after another take eight different stripes (other
        // tests' threads may take indices in between, never the same one twice within STRIPES).
        let mut distinct = others.clone();
        distinct.sort_unstable();
        distinct.dedup();
        assert_eq!(distinct.len(), others.len(), "threads shared a stripe: {others:?}");
    }
}
