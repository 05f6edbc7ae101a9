//! The writer thread: drains the write-behind queue in batches (module invariant 2 of the store: one
//! batch in flight at a time, formed and completed under the state lock, written outside it) and keeps
//! the store's *failing* state (a failed write sets it, a successful one clears it).

use super::{bump, AlignedBuf, Shared, MAX_WRITE_BATCH};
use crate::store::ssd::backend::WriteOp;
use std::io;
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// One write of the writer's current batch.
struct Job {
    slot: u32,
    gen: u64,
    buf: Arc<AlignedBuf>,
}

/// The writer's batch size (and the size of an io_uring for it).
pub(super) fn ring_entries(write_queue_pages: usize) -> u32 {
    write_queue_pages.clamp(1, MAX_WRITE_BATCH).next_power_of_two() as u32
}

impl Shared {
    /// Test hook: the writer issues nothing while paused (except to drain at shutdown).
    fn writer_paused(&self) -> bool {
        #[cfg(test)]
        return self.hooks.paused.load(Ordering::Acquire);
        #[cfg(not(test))]
        false
    }

    /// The writer thread's body; returns at shutdown once the queue is drained.
    pub(super) fn writer_main(&self) {
        let max_batch = ring_entries(self.write_queue_pages) as usize;
        let mut jobs: Vec<Job> = Vec::with_capacity(max_batch);
        loop {
            {
                let mut st = self.state.lock();
                loop {
                    while jobs.len() < max_batch && (!self.writer_paused() || st.shutdown) {
                        let Some((slot, gen)) = st.queue.pop_front() else { break };
                        if let Some(entry) = st.pending.get_mut(&slot) {
                            if entry.gen == gen && !entry.issued {
                                entry.issued = true;
                                let buf = Arc::clone(&entry.buf);
                                jobs.push(Job { slot, gen, buf });
                            }
                        }
                    }
                    if !jobs.is_empty() {
                        st.writer_busy = true;
                        break;
                    }
                    if st.shutdown {
                        return;
                    }
                    self.work.wait(&mut st);
                }
            }

            let results: Vec<io::Result<()>> = {
                let mut ops: Vec<WriteOp<'_>> = jobs
                    .iter()
                    .map(|j| WriteOp { buf: &j.buf, offset: self.offset(j.slot), result: Ok(()) })
                    .collect();
                self.io.write(&mut ops);
                ops.into_iter().map(|op| op.result).collect()
            };
            self.complete(&mut jobs, results);
        }
    }

    /// Completes a written batch under the state lock: counts it, retires the entries it wrote, marks
    /// the slots whose current write failed bad, and updates the failing state.
    fn complete(&self, jobs: &mut Vec<Job>, results: Vec<io::Result<()>>) {
        let mut done: Vec<Arc<AlignedBuf>> = Vec::with_capacity(jobs.len() * 2);
        let mut any_failed = false;
        {
            let mut st = self.state.lock();
            for (job, result) in jobs.drain(..).zip(results) {
                match &result {
                    Ok(()) => {
                        bump(&self.stats.writes, 1);
                        bump(&self.stats.bytes_written, self.page_size as u64);
                    }
                    Err(e) => {
                        bump(&self.stats.write_errors, 1);
                        tracing::warn!(path = %self.path, slot = job.slot, error = %e, "ssd store write failed");
                    }
                }
                any_failed |= result.is_err();
                // Only the write of the slot's current entry completes it: a freed or rewritten slot
                // has moved on, and a newer write will land after this one.
                if st.pending.get(&job.slot).is_some_and(|e| e.gen == job.gen) {
                    if let Some(entry) = st.pending.remove(&job.slot) {
                        done.push(entry.buf);
                    }
                    if result.is_err() {
                        st.bad.insert(job.slot);
                    }
                }
                done.push(job.buf);
            }
            // One failure in a batch makes the disk suspect; a batch written whole clears the doubt.
            if self.failing.swap(any_failed, Ordering::AcqRel) != any_failed {
                tracing::warn!(path = %self.path, failing = any_failed, "ssd store failing state changed");
            }
            st.writer_busy = false;
            self.pending_or_bad.store(st.pending_or_bad(), Ordering::Release);
        }
        self.progress.notify_all();
        // The entry's reference is dropped first, so the job's one is the last and the buffer returns
        // to the pool.
        for buf in done {
            self.recycle(buf);
        }
    }
}
