//! Where pages live: the memory store (frames, halves, read holds), the SSD store, the content index of
//! de-duplication, compression, and each store's capacity and reservation ([`StoreState`]). Owns
//! [`Placement`], the part of the engine's state that knows nothing of pools, VMs or eviction: the put
//! path (`data.rs`) asks it for room through the evictor (`evict.rs`: `Shared::reserve` evicts until a
//! reservation fits) and places bytes with it; every path that takes a location out of an index frees
//! it here ([`Placement::free_locs`]).

use crate::config::{Compression, EngineConfig};
use crate::error::CacheError;
use crate::pool::Loc;
use crate::store::dedup::ContentIndex;
use crate::store::frame::FrameId;
use crate::store::mem::MemStore;
use crate::store::ssd::{SsdOptions, SsdStore};
use crate::types::StoreKind;
use crossbeam_utils::CachePadded;
use parking_lot::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// The stores and what places pages in them.
pub(super) struct Placement {
    pub(super) mem: MemStore,
    /// LZ4-compress memory pages into half frames (`mem.compression`).
    pub(super) compress: bool,
    /// Content index when the memory store de-duplicates (`mem.dedup`).
    pub(super) dedup: Option<ContentIndex>,
    pub(super) ssd: Option<SsdStore>,
    pub(super) stores: [StoreState; 2],
}

impl Placement {
    /// Opens the stores of a validated configuration (the SSD store's file is created or emptied).
    pub(super) fn open(
        cfg: &EngineConfig,
        faults: Option<Arc<crate::store::ssd::faults::FaultInjector>>,
    ) -> Result<Placement, CacheError> {
        let ps = cfg.page_size_bytes;
        let mem_cap = cfg.pages(cfg.mem.capacity_bytes);
        let mem_max = cfg.pages(cfg.mem.max_bytes());
        let mem =
            MemStore::new(ps, mem_max as u32, mem_cap as u32).map_err(|e| CacheError::Io(e.to_string()))?;
        if cfg.mem.huge_pages {
            // A hint (see `MemStoreConfig::huge_pages`): without THP the arena works the same, slower.
            let _ = mem.advise_huge_pages();
        }
        let (ssd, ssd_cap) = match &cfg.ssd {
            Some(s) => {
                let slots = cfg.pages(s.capacity_bytes);
                let dir = if s.scratch { Some(s.path.as_path()) } else { s.path.parent() };
                if let Some(dir) = dir.filter(|d| !d.as_os_str().is_empty()) {
                    std::fs::create_dir_all(dir)
                        .map_err(|e| CacheError::Io(format!("creating {}: {e}", dir.display())))?;
                }
                let store = SsdStore::open(SsdOptions {
                    path: s.path.clone(),
                    scratch: s.scratch,
                    slots: slots as u32,
                    page_size: ps,
                    direct_io: s.direct_io,
                    io_backend: s.io_backend,
                    write_queue_pages: s.write_queue_pages,
                    faults,
                })?;
                (Some(store), slots)
            }
            None => (None, 0),
        };
        Ok(Placement {
            dedup: cfg.mem.dedup.then(|| ContentIndex::new(mem_max as u32)),
            compress: cfg.mem.compression == Compression::Lz4,
            mem,
            ssd,
            stores: [StoreState::new(mem_cap), StoreState::new(ssd_cap)],
        })
    }

    /// Frees locations taken out of every index: drops de-duplication references, frees frames and
    /// slots that become unreferenced, and gives their reservations back.
    pub(super) fn free_locs(&self, locs: &[Loc]) {
        let mut n = [0u64; 2];
        for l in locs {
            match *l {
                Loc::Mem(f) => {
                    if let Some(idx) = &self.dedup {
                        if !idx.release(f) {
                            continue; // still shared: no frame freed, no reservation released
                        }
                    }
                    if !self.mem.free(f) {
                        continue; // a half whose buddy still holds the frame
                    }
                }
                Loc::Ssd(s) => {
                    if let Some(ssd) = &self.ssd {
                        ssd.free(s)
                    }
                }
            }
            n[l.store().idx()] += 1;
        }
        for s in StoreKind::ALL {
            if n[s.idx()] > 0 {
                self.stores[s.idx()].release(n[s.idx()]);
            }
        }
    }

    /// Starts loading a memory page into the CPU caches (the copy follows shortly).
    #[inline] // on every get; its callers are in `data.rs`
    pub(super) fn prefetch(&self, loc: Loc) {
        if let Loc::Mem(f) = loc {
            self.mem.prefetch(f);
        }
    }

    /// Ends a read hold on a memory frame (`store::mem`); a frame freed while held is freed by its last
    /// reader, who then gives its reservation back.
    #[inline] // on every get; its callers are in `data.rs`
    pub(super) fn end_read(&self, f: FrameId) {
        if self.mem.end_read(f) {
            self.stores[0].release(1);
        }
    }

    /// Copies a location the caller owns (taken out of the index) into `out`.
    #[inline] // on every get; its callers are in `data.rs`
    pub(super) fn read_owned(&self, loc: Loc, out: &mut [u8]) -> bool {
        match loc {
            Loc::Mem(f) => {
                self.mem.read(f, out);
                true
            }
            Loc::Ssd(s) => self.ssd.as_ref().is_some_and(|ssd| ssd.read(s, out).is_ok()),
        }
    }

    pub(super) fn store_available(&self, s: StoreKind) -> bool {
        s == StoreKind::Mem || self.ssd.is_some()
    }
}

/// Reservation credit a stripe takes from a store's shared counter at once; a stripe holding more than
/// twice this after frees gives the excess back.
const CREDIT_BLOCK: u64 = 32;

/// A store's capacity and reservation. The reservation is split so that a put and a get write no cache
/// line shared by all threads (issue 28, item 3): `reserved` counts pages in use plus the **credit** the
/// stripes hold (reserved, not yet used), and each thread takes pages from and gives freed pages back to
/// its own stripe's credit (`crate::stripe`), touching `reserved` once per [`CREDIT_BLOCK`] pages.
///
/// A store never refuses or evicts while it has room: a reservation the shared counter cannot give
/// first gathers every stripe's credit back into it ([`Self::drain_credit`]) and tries again, so with one
/// thread a put fails exactly when the pages in use reach the capacity, as with one counter. Concurrent
/// threads can still race as they could with one counter (a page freed just after a put found the
/// store full).
pub(super) struct StoreState {
    pub(super) capacity: AtomicU64,
    /// Pages in use plus the stripes' credit; at most `capacity` (except just after a shrink).
    pub(super) reserved: CachePadded<AtomicU64>,
    /// Per stripe: pages reserved in `reserved` and not in use.
    pub(super) credit: Box<[CachePadded<AtomicU64>]>,
    pub(super) evict_lock: Mutex<()>,
}

impl StoreState {
    pub(super) fn new(capacity: u64) -> Self {
        StoreState {
            capacity: AtomicU64::new(capacity),
            reserved: CachePadded::new(AtomicU64::new(0)),
            credit: (0..crate::stripe::STRIPES).map(|_| CachePadded::new(AtomicU64::new(0))).collect(),
            evict_lock: Mutex::new(()),
        }
    }

    /// Reserves `n` pages: from this thread's credit, else from the shared counter (with a block of
    /// credit while the store has room for it), else from every stripe's credit gathered back.
    pub(super) fn try_reserve(&self, n: u64) -> bool {
        let credit = &self.credit[crate::stripe::index()];
        let mut cur = credit.load(Ordering::Relaxed);
        while cur >= n {
            match credit.compare_exchange_weak(cur, cur - n, Ordering::AcqRel, Ordering::Relaxed) {
                Ok(_) => return true,
                Err(now) => cur = now,
            }
        }
        if self.take_shared(n + CREDIT_BLOCK) {
            credit.fetch_add(CREDIT_BLOCK, Ordering::AcqRel);
            return true;
        }
        if self.take_shared(n) {
            return true;
        }
        self.drain_credit() > 0 && self.take_shared(n)
    }

    /// Takes `n` pages of the shared counter if they fit the capacity.
    pub(super) fn take_shared(&self, n: u64) -> bool {
        let cap = self.capacity.load(Ordering::Relaxed);
        let mut cur = self.reserved.load(Ordering::Relaxed);
        loop {
            if cur + n > cap {
                return false;
            }
            match self.reserved.compare_exchange_weak(cur, cur + n, Ordering::AcqRel, Ordering::Relaxed) {
                Ok(_) => return true,
                Err(now) => cur = now,
            }
        }
    }

    /// Gives back `n` pages no longer in use, to this thread's credit (the excess over one block to the
    /// shared counter once the credit passes two blocks).
    pub(super) fn release(&self, n: u64) {
        let credit = &self.credit[crate::stripe::index()];
        let now = credit.fetch_add(n, Ordering::AcqRel) + n;
        if now > 2 * CREDIT_BLOCK
            && credit.compare_exchange(now, CREDIT_BLOCK, Ordering::AcqRel, Ordering::Relaxed).is_ok()
        {
            let prev = self.reserved.fetch_sub(now - CREDIT_BLOCK, Ordering::AcqRel);
            debug_assert!(prev >= now - CREDIT_BLOCK, "store reservation underflow");
        }
    }

    /// Moves every stripe's credit back into the shared counter; returns how many pages that freed.
    pub(super) fn drain_credit(&self) -> u64 {
        let mut freed = 0;
        for c in self.credit.iter() {
            // Read first: most stripes hold nothing, and a swap would take each line exclusively.
            if c.load(Ordering::Relaxed) == 0 {
                continue;
            }
            let x = c.swap(0, Ordering::AcqRel);
            if x > 0 {
                let prev = self.reserved.fetch_sub(x, Ordering::AcqRel);
                debug_assert!(prev >= x, "store reservation underflow");
                freed += x;
            }
        }
        freed
    }

    /// Pages in use (reserved and not held as credit). Exact when no reservation is in flight.
    pub(super) fn used(&self) -> u64 {
        let credit: u64 = self.credit.iter().map(|c| c.load(Ordering::Acquire)).sum();
        self.reserved.load(Ordering::Acquire).saturating_sub(credit)
    }
}
