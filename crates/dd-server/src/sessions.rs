//! The session runtimes: where authenticated sessions (the data plane's and the peers') are served.
//!
//! Several runtimes of one worker each, not one runtime of many: a tokio multi-thread runtime has one
//! reactor (one epoll instance, polled by whichever worker parks first) and one injection queue, and
//! on a 16-core host the daemon serving one pool stopped at about 6.5 busy cores with the machine a
//! quarter idle while memcached, one event loop per thread, used every core (issue 28, BENCHMARKS.md).
//! Here each runtime has its own reactor and timer, like memcached's worker threads with their own
//! event base, and a connection is homed on one for its life: [`SessionRuntimes::pick`] hands them out
//! round robin at HELLO. A runtime is a multi-thread runtime of one worker rather than a current-thread
//! runtime because sessions use `block_in_place` around engine calls that may wait (SSD reads, peers):
//! the worker hands its other sessions to a fresh thread for the duration.
//!
//! Bounds: `limits.max_blocking_threads` is split in two, half for the main runtime (the admin API's
//! blocking calls, [`main_blocking_threads`]) and the rest shared by the session runtimes (at least one
//! each), so the daemon's blocking threads stay within that limit plus at most one per session
//! runtime from the rounding (issue 35, D32).
//!
//! Invariant: the runtimes are shut down (in the background, never blocking the caller) only after
//! `run` has waited for the sessions to end or for the drain timeout.

use std::io;
use std::sync::atomic::{AtomicUsize, Ordering};
use tokio::runtime::{Builder, Handle, Runtime};

/// The blocking threads of the daemon's main runtime (the admin API, background work) out of
/// `limits.max_blocking_threads`: half, at least one; the session runtimes share the rest.
pub fn main_blocking_threads(max_blocking_threads: usize) -> usize {
    (max_blocking_threads / 2).max(1)
}

/// The session runtimes (see the module docs).
#[derive(Debug)]
pub struct SessionRuntimes {
    /// Taken out by [`SessionRuntimes::shutdown`] (or the drop).
    runtimes: parking_lot::Mutex<Vec<Runtime>>,
    handles: Vec<Handle>,
    next: AtomicUsize,
}

impl SessionRuntimes {
    /// Starts `threads` runtimes (0: one per available core), sharing what `max_blocking_threads`
    /// leaves after the main runtime's share ([`main_blocking_threads`]).
    pub fn start(threads: usize, max_blocking_threads: usize) -> io::Result<SessionRuntimes> {
        let n = match threads {
            0 => std::thread::available_parallelism().map_or(1, |n| n.get()),
            n => n,
        };
        let shared = max_blocking_threads.saturating_sub(main_blocking_threads(max_blocking_threads));
        let blocking = shared.div_ceil(n).max(1);
        let runtimes = (0..n)
            .map(|i| {
                Builder::new_multi_thread()
                    .worker_threads(1)
                    .max_blocking_threads(blocking)
                    .thread_name(format!("dd-session-{i}"))
                    .enable_all()
                    .build()
            })
            .collect::<io::Result<Vec<Runtime>>>()?;
        let handles = runtimes.iter().map(|r| r.handle().clone()).collect();
        Ok(SessionRuntimes {
            runtimes: parking_lot::Mutex::new(runtimes),
            handles,
            next: AtomicUsize::new(0),
        })
    }

    /// The runtime the next session is served on (round robin).
    pub fn pick(&self) -> Handle {
        let i = self.next.fetch_add(1, Ordering::Relaxed) % self.handles.len();
        self.handles[i].clone()
    }

    /// Stops every runtime without waiting for tasks still on them (their connections close). Never
    /// blocks, so it may run in async context (where dropping a runtime would panic).
    pub fn shutdown(&self) {
        let runtimes = std::mem::take(&mut *self.runtimes.lock());
        for rt in runtimes {
            rt.shutdown_background();
        }
    }
}

impl Drop for SessionRuntimes {
    fn drop(&mut self) {
        self.shutdown();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sessions_are_handed_out_round_robin_over_runtimes_of_their_own() {
        let rts = SessionRuntimes::start(3, 8).unwrap();
        assert_eq!(rts.handles.len(), 3);
        let names: Vec<String> = (0..6)
            .map(|_| {
                let h = rts.pick();
                h.block_on(h.spawn(async { std::thread::current().name().unwrap_or("").to_string() }))
                    .unwrap()
            })
            .collect();
        assert_eq!(names, ["dd-session-0", "dd-session-1", "dd-session-2"].repeat(2));
        rts.shutdown();
    }
}
