//! The page-level I/O path of the emulator: guest page cache -> second-chance cache -> disk. Reads
//! merged into one disk request per run of missing pages, whole-page writes under dirty throttling,
//! appends, fsync, deletes (a new generation), anonymous pages and swap, and the handling of the pages a
//! guest evicts (write-back of dirty pages, puts of clean mapped file pages, invalidation of unmapped
//! ones, swap-out to the swap pool or the disk).

use super::{Sim, SWAP_OBJECT};
use crate::error::LabError;
use crate::model::guest::{key, key_index, key_object, Evicted, Guest};
use crate::sim::backend::SecondChance;
use dd_engine::StoreKind;

impl<B: SecondChance> Sim<B> {
    /// Reads pages `start..start + n` of a file as one `read()` does: each page is looked up in the
    /// guest page cache, then in the container's pool (cleancache is asked page by page, as
    /// `mpage_readpages` does), and the pages found in neither are read from the disk with one request
    /// per run of consecutive pages (the kernel's bio merging and readahead window). Without the
    /// merging every missing page of a sequential 256 KiB read paid a disk access time, which made the
    /// videoserver's misses saturate the shared disk about ten times too early.
    pub(super) fn read_range(
        &mut self,
        c: usize,
        obj: u32,
        start: u32,
        n: u32,
        t: &mut u64,
    ) -> Result<(), LabError> {
        // Run of consecutive pages that missed both caches: (first index, length).
        let mut run: Option<(u32, u32)> = None;
        for i in start..start.saturating_add(n) {
            if self.lookup_page(c, obj, i, t)? {
                continue;
            }
            run = match run {
                Some((s, l)) if s + l == i => Some((s, l + 1)),
                Some((s, l)) => {
                    self.disk_read(c, obj, s, l, t);
                    Some((i, 1))
                }
                None => Some((i, 1)),
            };
        }
        if let Some((s, l)) = run {
            self.disk_read(c, obj, s, l, t);
        }
        Ok(())
    }

    /// One disk request for `len` consecutive pages of a file; the thread waits for it.
    pub(super) fn disk_read(&mut self, c: usize, obj: u32, first: u32, len: u32, t: &mut u64) {
        let d = self.disk.io(c, *t, key(obj, first), len as u64, false);
        self.io_wait += d - *t;
        if let Some(s) = self.streams[c].as_mut() {
            s.file_disk(len as u64, d - *t);
        }
        *t = d;
        self.cts[c].tot.disk_reads += len as u64;
    }

    /// The cached part of a page read: true when the page was in the guest page cache or the pool.
    /// Either way the page ends up in the page cache; on false the caller must read it from the disk.
    #[inline]
    pub(super) fn lookup_page(
        &mut self,
        c: usize,
        obj: u32,
        idx: u32,
        t: &mut u64,
    ) -> Result<bool, LabError> {
        self.accesses += 1;
        let (vm, cg) = (self.cts[c].vm, self.cts[c].cg);
        let k = key(obj, idx);
        if let Some(s) = self.streams[c].as_mut() {
            s.file_read(k);
        }
        if self.guests[vm].access(cg, k, false) {
            *t += self.timing.page_cache_hit_ns;
            return Ok(true);
        }
        *t += self.timing.cache_op_ns;
        let hit = match self.cts[c].pool {
            Some(p) => self.backend.get(vm as u32 + 1, p, obj as u64, idx as u64, self.gen[obj as usize])?,
            None => None,
        };
        match hit {
            Some(StoreKind::Mem) => {
                *t += self.timing.mem_store_hit_ns;
                self.cts[c].tot.mem_hits += 1;
            }
            Some(StoreKind::Ssd) => {
                *t += self.timing.ssd_store_hit_ns;
                self.io_wait += self.timing.ssd_store_hit_ns;
                self.cts[c].tot.ssd_hits += 1;
            }
            None => {}
        }
        *t += self.timing.page_cache_hit_ns;
        self.insert(c, k, false, false, t)?;
        Ok(hit.is_some())
    }

    /// Writes one whole page (no read of the old content).
    pub(super) fn write_page(&mut self, c: usize, obj: u32, idx: u32, t: &mut u64) -> Result<(), LabError> {
        self.accesses += 1;
        let (vm, cg) = (self.cts[c].vm, self.cts[c].cg);
        let k = key(obj, idx);
        // Dirty throttling paces writers at the disk's rate: waiting, not CPU.
        *t += self.timing.page_cache_hit_ns + self.disk.xfer;
        self.io_wait += self.disk.xfer;
        if self.guests[vm].access(cg, k, true) {
            return Ok(());
        }
        self.insert(c, k, true, false, t)
    }

    pub(super) fn append(&mut self, c: usize, f: u32, n: u32, t: &mut u64) -> Result<u64, LabError> {
        let start = self.size[f as usize];
        let n = n.min(u32::MAX / 2 - start);
        for i in start..start + n {
            self.write_page(c, f, i, t)?;
        }
        self.size[f as usize] = start + n;
        Ok(n as u64 * 4096)
    }

    /// Writes back the file's dirty pages and waits for them.
    pub(super) fn fsync(&mut self, c: usize, f: u32, t: &mut u64) {
        let vm = self.cts[c].vm;
        for i in 0..self.size[f as usize] {
            let k = key(f, i);
            if self.guests[vm].clean(k) {
                let d = self.disk.io(c, *t, k, 1, true);
                self.io_wait += d - *t;
                *t = d;
                self.cts[c].tot.writebacks += 1;
            }
        }
    }

    /// Deletes (and so empties) a file: its pages leave the page cache and the pool, and the next
    /// content gets a new generation.
    pub(super) fn delete(&mut self, c: usize, f: u32) -> Result<(), LabError> {
        let vm = self.cts[c].vm;
        for i in 0..self.size[f as usize] {
            self.guests[vm].remove(key(f, i));
        }
        if let Some(p) = self.cts[c].pool {
            self.backend.flush_object(vm as u32 + 1, p, f as u64)?;
        }
        self.gen[f as usize] = self.gen[f as usize].wrapping_add(1);
        self.size[f as usize] = 0;
        self.cursor[f as usize] = 0;
        Ok(())
    }

    pub(super) fn anon_access(
        &mut self,
        c: usize,
        idx: u32,
        write: bool,
        t: &mut u64,
    ) -> Result<(), LabError> {
        self.accesses += 1;
        let (vm, cg) = (self.cts[c].vm, self.cts[c].cg);
        let Some(anon) = self.cts[c].anon.as_mut() else { return Ok(()) };
        let obj = anon.object;
        let k = key(obj, idx);
        if let Some(s) = self.streams[c].as_mut() {
            s.anon_access(k);
        }
        if self.guests[vm].access(cg, k, write) {
            if write {
                anon.ver[idx as usize] = anon.ver[idx as usize].wrapping_add(1);
            }
            *t += self.timing.page_cache_hit_ns;
            return Ok(());
        }
        if anon.swapped[idx as usize] {
            anon.swapped[idx as usize] = false;
            let ver = anon.ver[idx as usize];
            let mut hit = false;
            if let Some(p) = self.cts[c].swap_pool {
                *t += self.timing.cache_op_ns;
                if self.backend.get(vm as u32 + 1, p, obj as u64, idx as u64, ver)?.is_some() {
                    hit = true;
                    *t += self.timing.mem_store_hit_ns;
                    self.cts[c].tot.mem_hits += 1;
                }
                // The page is in memory again; its swap copy is dropped (no swap cache modelled).
                self.backend.flush_page(vm as u32 + 1, p, obj as u64, idx as u64)?;
            }
            if !hit {
                let d = self.disk.io(c, *t, k, 1, false);
                self.io_wait += d - *t;
                if let Some(s) = self.streams[c].as_mut() {
                    s.anon_fault(d - *t);
                }
                *t = d;
                self.cts[c].tot.disk_reads += 1;
            }
        }
        *t += self.timing.page_cache_hit_ns;
        if write {
            if let Some(a) = self.cts[c].anon.as_mut() {
                a.ver[idx as usize] = a.ver[idx as usize].wrapping_add(1);
            }
        }
        self.insert(c, k, true, true, t)
    }

    pub(super) fn insert(
        &mut self,
        c: usize,
        k: u64,
        dirty: bool,
        anon: bool,
        t: &mut u64,
    ) -> Result<(), LabError> {
        let (vm, cg) = (self.cts[c].vm, self.cts[c].cg);
        let mut buf = std::mem::take(&mut self.evbuf);
        self.guests[vm].insert(cg, k, dirty, anon, &mut |e| buf.push(e));
        let r = if buf.is_empty() { Ok(()) } else { self.handle_evictions(vm, &mut buf, t) };
        buf.clear();
        self.evbuf = buf;
        r
    }

    /// Applies `change` to VM `v`'s guest now (a lowered limit, a balloon) and handles the pages it
    /// reclaims at the current time.
    pub(super) fn reclaim_now(
        &mut self,
        v: usize,
        change: impl FnOnce(&mut Guest, &mut dyn FnMut(Evicted)),
    ) -> Result<(), LabError> {
        let mut buf = std::mem::take(&mut self.evbuf);
        change(&mut self.guests[v], &mut |e| buf.push(e));
        let mut t = self.now;
        let r = self.handle_evictions(v, &mut buf, &mut t);
        buf.clear();
        self.evbuf = buf;
        r
    }

    /// Write-back, put or swap-out of the pages a guest dropped (direct reclaim: the allocating thread
    /// pays the hypercalls).
    pub(super) fn handle_evictions(
        &mut self,
        vm: usize,
        buf: &mut [Evicted],
        t: &mut u64,
    ) -> Result<(), LabError> {
        for e in buf.iter() {
            let c = self.vm_cts[vm][e.cg];
            let (obj, idx) = (key_object(e.key), key_index(e.key));
            if e.anon {
                self.cts[c].tot.swap_outs += 1;
                let Some(ver) = self.cts[c].anon.as_mut().map(|a| {
                    a.swapped[idx as usize] = true;
                    a.ver[idx as usize]
                }) else {
                    continue;
                };
                let stored = match self.cts[c].swap_pool {
                    Some(p) => {
                        *t += self.timing.cache_op_ns;
                        self.backend.put(vm as u32 + 1, p, obj as u64, idx as u64, ver)?.is_some()
                    }
                    None => false,
                };
                if !stored {
                    // Linux hands out swap slots in clusters, so the pages one reclaim pass swaps out
                    // are written one after the other: the swap device sees a sequential stream, not a
                    // seek per page (which queued minutes of writes behind a balloon of a few GiB).
                    self.swap_slot = self.swap_slot.wrapping_add(1);
                    self.disk.write_back(c, *t, key(SWAP_OBJECT, self.swap_slot));
                }
                continue;
            }
            if e.dirty {
                self.disk.write_back(c, *t, e.key);
                self.cts[c].tot.writebacks += 1;
            }
            if let Some(p) = self.cts[c].pool {
                *t += self.timing.cache_op_ns;
                if e.mapped {
                    self.backend.put(vm as u32 + 1, p, obj as u64, idx as u64, self.gen[obj as usize])?;
                } else {
                    // Linux invalidates instead of putting a page that was never mapped to disk; this
                    // also drops an older copy of an overwritten page (same generation) from the pool.
                    self.backend.flush_page(vm as u32 + 1, p, obj as u64, idx as u64)?;
                }
            }
        }
        Ok(())
    }
}
