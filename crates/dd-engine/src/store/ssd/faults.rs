//! Fault injection under the SSD store, for tests and fuzzing (never configured by the daemon's
//! configuration file: a [`FaultInjector`] can only be handed in through code, `SsdOptions::faults` or
//! `Cache::with_ssd_faults`).
//!
//! [`FaultyIo`] wraps a real backend. For each kind of operation (reads, writes, extensions of the file)
//! a rule says: let `after` more operations through, then fail the next `times` ones with a [`Fault`].
//! That countdown, as in redb's fuzzer, lets a test or a fuzz input put the failure at any point of a
//! sequence deterministically. A write delay slows the writer thread, so the write-behind queue fills
//! and back-pressure and full-queue paths run.
//!
//! Faults:
//! * `Eio`: the operation fails with `EIO` and transfers nothing;
//! * `Enospc`: the operation fails with `ENOSPC` and transfers nothing;
//! * `Short`: half the buffer is transferred, then the operation fails (a short read or write that the
//!   retry could not complete): the file holds a torn page, and the buffer a half-read one.
//!
//! Invariant: a faulted operation always reports an error. The injector never lies about success, so
//! whatever the store does with an error is what it would do with a real disk's.

use super::backend::{PageIo, ReadOp, WriteOp};
use parking_lot::Mutex;
use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// The kind of failure an operation gets. See the module documentation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Fault {
    Eio,
    Enospc,
    Short,
}

/// Which operations a rule applies to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum IoOp {
    /// Page reads from the file (not reads served from the write-behind queue).
    Read,
    /// Background page writes.
    Write,
    /// Extensions of the file (`grow`): the store's only space reservation after open.
    Extend,
}

#[derive(Debug, Clone, Copy)]
struct Rule {
    after: u64,
    fault: Fault,
    times: u64,
}

/// A countdown of failures per operation kind; shared by the test and the store. See the module
/// documentation.
#[derive(Debug, Default)]
pub struct FaultInjector {
    rules: Mutex<[Option<Rule>; 3]>,
    write_delay_us: AtomicU64,
    injected: AtomicU64,
    seen: [AtomicU64; 3],
}

impl FaultInjector {
    pub fn new() -> Arc<FaultInjector> {
        Arc::new(FaultInjector::default())
    }

    /// From now on, let `after` operations of kind `op` through, then fail the next `times` of them
    /// with `fault` (`u64::MAX`: for ever). Replaces the kind's previous rule.
    pub fn fail_after(&self, op: IoOp, after: u64, fault: Fault, times: u64) {
        self.rules.lock()[op as usize] = Some(Rule { after, fault, times });
    }

    /// Removes every rule and the write delay: the disk is healthy again.
    pub fn heal(&self) {
        *self.rules.lock() = [None; 3];
        self.write_delay_us.store(0, Ordering::Relaxed);
    }

    /// Every batch of background writes waits this long first (a slow disk).
    pub fn set_write_delay(&self, delay: Duration) {
        self.write_delay_us.store(delay.as_micros().min(u64::MAX as u128) as u64, Ordering::Relaxed);
    }

    /// Operations failed so far.
    pub fn injected(&self) -> u64 {
        self.injected.load(Ordering::Relaxed)
    }

    /// Operations of kind `op` that reached the injector (failed or not).
    pub fn seen(&self, op: IoOp) -> u64 {
        self.seen[op as usize].load(Ordering::Relaxed)
    }

    /// The fault for the next operation of kind `op`, if it is to fail.
    fn next(&self, op: IoOp) -> Option<Fault> {
        self.seen[op as usize].fetch_add(1, Ordering::Relaxed);
        let mut rules = self.rules.lock();
        let rule = rules[op as usize].as_mut()?;
        if rule.after > 0 {
            rule.after -= 1;
            return None;
        }
        if rule.times == 0 {
            return None;
        }
        rule.times = rule.times.saturating_sub(if rule.times == u64::MAX { 0 } else { 1 });
        self.injected.fetch_add(1, Ordering::Relaxed);
        Some(rule.fault)
    }
}

fn error(fault: Fault, what: &str) -> io::Error {
    match fault {
        Fault::Eio => io::Error::from_raw_os_error(libc::EIO),
        Fault::Enospc => io::Error::from_raw_os_error(libc::ENOSPC),
        Fault::Short => io::Error::new(io::ErrorKind::UnexpectedEof, format!("injected short {what}")),
    }
}

/// A backend whose operations fail as a [`FaultInjector`] says. See the module documentation.
pub(crate) struct FaultyIo {
    inner: Box<dyn PageIo>,
    faults: Arc<FaultInjector>,
}

impl FaultyIo {
    pub(crate) fn new(inner: Box<dyn PageIo>, faults: Arc<FaultInjector>) -> FaultyIo {
        FaultyIo { inner, faults }
    }
}

impl PageIo for FaultyIo {
    fn read(&self, ops: &mut [ReadOp<'_>]) {
        let verdicts: Vec<Option<Fault>> = ops.iter().map(|_| self.faults.next(IoOp::Read)).collect();
        // The healthy reads go to the real backend as one batch, the short ones as half pages.
        let mut real: Vec<ReadOp<'_>> = Vec::with_capacity(ops.len());
        let mut which: Vec<usize> = Vec::with_capacity(ops.len());
        for (i, (op, verdict)) in ops.iter_mut().zip(&verdicts).enumerate() {
            let len = match verdict {
                None => op.buf.len(),
                Some(Fault::Short) => op.buf.len() / 2,
                Some(_) => continue,
            };
            real.push(ReadOp { buf: &mut op.buf[..len], offset: op.offset, result: Ok(()) });
            which.push(i);
        }
        self.inner.read(&mut real);
        let outcomes: Vec<io::Result<()>> = real.into_iter().map(|op| op.result).collect();
        for (i, r) in which.into_iter().zip(outcomes) {
            ops[i].result = r;
        }
        for (op, verdict) in ops.iter_mut().zip(verdicts) {
            if let Some(fault) = verdict {
                op.result = Err(error(fault, "read"));
            }
        }
    }

    fn write(&self, ops: &mut [WriteOp<'_>]) {
        let delay = self.faults.write_delay_us.load(Ordering::Relaxed);
        if delay > 0 {
            std::thread::sleep(Duration::from_micros(delay));
        }
        let verdicts: Vec<Option<Fault>> = ops.iter().map(|_| self.faults.next(IoOp::Write)).collect();
        let mut real: Vec<WriteOp<'_>> = Vec::with_capacity(ops.len());
        let mut which: Vec<usize> = Vec::with_capacity(ops.len());
        for (i, (op, verdict)) in ops.iter().zip(&verdicts).enumerate() {
            let len = match verdict {
                None => op.buf.len(),
                Some(Fault::Short) => op.buf.len() / 2,
                Some(_) => continue,
            };
            real.push(WriteOp { buf: &op.buf[..len], offset: op.offset, result: Ok(()) });
            which.push(i);
        }
        self.inner.write(&mut real);
        let outcomes: Vec<io::Result<()>> = real.into_iter().map(|op| op.result).collect();
        for (i, r) in which.into_iter().zip(outcomes) {
            ops[i].result = r;
        }
        for (op, verdict) in ops.iter_mut().zip(verdicts) {
            if let Some(fault) = verdict {
                op.result = Err(error(fault, "write"));
            }
        }
    }

    fn extend(&self, from: u64, to: u64) -> io::Result<()> {
        match self.faults.next(IoOp::Extend) {
            Some(Fault::Short) => {
                // Part of the space, then the failure: the store must not count the rest as usable.
                self.inner.extend(from, from + (to - from) / 2)?;
                Err(error(Fault::Enospc, "extend"))
            }
            Some(fault) => Err(error(fault, "extend")),
            None => self.inner.extend(from, to),
        }
    }

    fn uses_uring(&self) -> bool {
        self.inner.uses_uring()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_rule_lets_after_through_then_fails_times() {
        let f = FaultInjector::new();
        f.fail_after(IoOp::Write, 2, Fault::Enospc, 2);
        let got: Vec<Option<Fault>> = (0..5).map(|_| f.next(IoOp::Write)).collect();
        assert_eq!(got, [None, None, Some(Fault::Enospc), Some(Fault::Enospc), None]);
        assert_eq!(f.next(IoOp::Read), None, "other kinds are untouched");
        f.fail_after(IoOp::Read, 0, Fault::Eio, u64::MAX);
        assert!((0..100).all(|_| f.next(IoOp::Read) == Some(Fault::Eio)), "for ever");
        assert_eq!(f.injected(), 102);
        assert_eq!(f.seen(IoOp::Read), 101);
        f.heal();
        assert_eq!(f.next(IoOp::Read), None);
    }
}
