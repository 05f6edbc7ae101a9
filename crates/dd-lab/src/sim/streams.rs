//! What the VM-level provisioner observes of one container: the online miss-ratio curves of its two
//! access streams and the counters its performance model needs.
//!
//! Owns, per container: a fixed-size SHARDS model (`dd_mrc::Shards`) of its page-cache reads (every
//! file page it reads, hit or miss: the guest's page cache and the pool behind it together act as one
//! LRU cache, see `dd_provision::model`) and one of its anonymous-memory accesses, and counters of the
//! reads, the accesses, and the pages read from the disk (or faulted back from swap) with the time the
//! container waited for them (queueing included). Writes of file pages are not fed to the curve: a
//! written page is not read from anywhere, and pages written once and never read again (logs) leave the
//! page cache first under Linux's two lists.
//!
//! Invariants: feeding is deterministic (seeded sampling hash, no clock), so the curves are part of the
//! run's emulated state; a container's models never track more than `max_samples` keys each.

use dd_mrc::{Curve, Mrc, Shards, Unit};

/// Counters of one container's streams (cumulative).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StreamCounters {
    pub file_reads: u64,
    pub anon_accesses: u64,
    /// File pages read from the disk and the nanoseconds the container waited for them.
    pub file_disk_pages: u64,
    pub file_disk_ns: u64,
    /// Anonymous pages faulted back from the swap device and the wait.
    pub anon_faults: u64,
    pub anon_fault_ns: u64,
}

impl StreamCounters {
    pub fn since(&self, earlier: &StreamCounters) -> StreamCounters {
        StreamCounters {
            file_reads: self.file_reads - earlier.file_reads,
            anon_accesses: self.anon_accesses - earlier.anon_accesses,
            file_disk_pages: self.file_disk_pages - earlier.file_disk_pages,
            file_disk_ns: self.file_disk_ns - earlier.file_disk_ns,
            anon_faults: self.anon_faults - earlier.anon_faults,
            anon_fault_ns: self.anon_fault_ns - earlier.anon_fault_ns,
        }
    }
}

/// One container's observed streams.
pub struct Streams {
    file: Shards,
    anon: Shards,
    pub counters: StreamCounters,
}

impl std::fmt::Debug for Streams {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Streams").field("counters", &self.counters).finish_non_exhaustive()
    }
}

impl Streams {
    /// Models that keep at most `max_samples` sampled keys each; `seed` makes the sampling hash of each
    /// container its own (so that two containers' samples are independent).
    pub fn new(max_samples: usize, seed: u64) -> Streams {
        let m =
            |s| Shards::fixed_size_seeded(max_samples.max(1), Unit::Pages, s).expect("at least one sample");
        Streams { file: m(seed), anon: m(seed ^ 0x616e_6f6e), counters: StreamCounters::default() }
    }

    #[inline]
    pub fn file_read(&mut self, key: u64) {
        self.counters.file_reads += 1;
        self.file.access(key);
    }

    #[inline]
    pub fn anon_access(&mut self, key: u64) {
        self.counters.anon_accesses += 1;
        self.anon.access(key);
    }

    pub fn file_disk(&mut self, pages: u64, waited_ns: u64) {
        self.counters.file_disk_pages += pages;
        self.counters.file_disk_ns += waited_ns;
    }

    pub fn anon_fault(&mut self, waited_ns: u64) {
        self.counters.anon_faults += 1;
        self.counters.anon_fault_ns += waited_ns;
    }

    /// Ages both curves (see `dd_mrc::Shards::decay`).
    pub fn decay(&mut self, factor: f64) {
        self.file.decay(factor);
        self.anon.decay(factor);
    }

    /// The file-read curve at `sizes` pages, if there were any reads.
    pub fn file_curve(&self, sizes: &[u64]) -> Option<Curve> {
        (self.counters.file_reads > 0).then(|| self.file.curve_at(sizes))
    }

    /// The anonymous-access curve at `sizes` pages, if there were any accesses.
    pub fn anon_curve(&self, sizes: &[u64]) -> Option<Curve> {
        (self.counters.anon_accesses > 0).then(|| self.anon.curve_at(sizes))
    }
}
