//! # dd-bench: DoubleDecker's benchmarks
//!
//! Each benchmark measures our code against a baseline run in the same process or the same run (SPEC
//! section 11), and returns a serialisable report; the CLI prints it (`doubledecker bench ... --json`).
//!
//! * [`store`]: in-process put / get-hit / get-miss rates against a memcpy loop over the same bytes in
//!   the same order, for one thread and several, each on its own pool or all on one.
//! * [`dedup`]: put cost with content de-duplication against without, same run.
//! * [`lab`]: the lab emulator's page accesses per second on one core, full stack (absolute target).
//! * [`mrc`]: references per CPU second of the miss-ratio-curve methods on one binary trace (absolute
//!   targets), with SHARDS's error against the exact curve of the same run.
//! * [`ssd`]: the SSD store's 4 KiB random-read IOPS against fio on the same file system.
//! * [`server`]: the daemon over TCP loopback against memcached, one load generator for both; the
//!   connections on one pool, or spread over several VMs or pools.
//! * [`shards`]: a sharded pool's miss ratio against a single queue's on a synthetic trace (issue 28).
//! * [`soak`]: mixed load on the daemon for a long time; checks bounded memory and the stats identity.
//! * [`tenants`]: VM A's verified load with and without each attack of VM B on the same daemon.
//! * [`remote`]: remotify and remotified-get latency with two daemons (co-operative de-duplication).
//! * [`daemon`]: starts and stops a real `doubledecker serve` process for `server` and `soak`.
//! * [`relay`]: a loopback TCP relay with latency that can cut or inject into a connection (the peer
//!   attacks of `tenants`, and the daemon's tests).
//! * [`cpu`]: another process's CPU time from `/proc/<pid>/stat` (what `server` charges each server).

pub mod certs;
pub mod cpu;
pub mod daemon;
pub mod dedup;
pub mod fuse;
pub mod lab;
pub mod mrc;
pub mod relay;
pub mod remote;
pub mod server;
pub mod shards;
pub mod soak;
pub mod ssd;
pub mod store;
pub mod tenants;

/// CPU time consumed so far by the calling thread, in seconds (what the absolute-rate benchmarks
/// divide by, so that other work on the machine changes their wall time, not their figure).
pub fn thread_cpu_s() -> f64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: `ts` is a valid, writable timespec for the duration of the call, and
    // CLOCK_THREAD_CPUTIME_ID is supported by every Linux the project runs on; on failure `ts` keeps
    // its zero value, which only makes the reported rate wrong, never unsound.
    unsafe {
        libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts);
    }
    ts.tv_sec as f64 + ts.tv_nsec as f64 * 1e-9
}
