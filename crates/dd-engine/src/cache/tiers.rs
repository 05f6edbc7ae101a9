//! Hybrid maintenance (thesis 000, sections 5.3-5.4): the background worker, the watermarks, demotion of
//! a hybrid pool's oldest memory pages to the SSD tier and promotion of its youngest SSD pages back.
//!
//! A page moves only if it is still the same page (same key and version) when the move is published,
//! so a put, flush or get racing with a move wins and the stale copy is dropped; each page stays in
//! exactly one tier. A sharded pool's batch is split over its shards by `Pool::quotas` (the fullest first).
//! Demotion copies at most `DEMOTE_CHUNK` pages per shard-lock hold; promotion uses only
//! free memory (it never evicts). Each maintenance step moves at most one batch and strictly reduces the
//! pool's distance to its watermarks, so maintenance converges.

use super::{Cache, Shared};
use crate::pool::{Loc, Pool};
use crate::store::frame::hash_page;
use crate::types::{Key, PoolKind, StoreKind};
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// Pages a demotion copies per pool-lock hold (bounds the time others wait on the pool).
const DEMOTE_CHUNK: usize = 32;

impl Cache {
    /// Runs hybrid maintenance to a fixed point and drains the SSD write queue: after it returns, with no
    /// concurrent operations, every watermark is satisfied and no move is in flight (a pass of the
    /// background worker under way is waited for: passes take `evictor.pass`). Tests and shutdown use it.
    pub fn quiesce(&self) {
        self.shared.maintain_all_until_idle();
        if let Some(ssd) = &self.shared.place.ssd {
            ssd.sync();
        }
    }
}

pub(super) fn maintenance_loop(weak: std::sync::Weak<Shared>) {
    loop {
        let Some(shared) = weak.upgrade() else { return };
        if shared.evictor.shutdown.load(Ordering::Acquire) {
            return;
        }
        shared.maintain_all_until_idle();
        let interval = shared.evictor.maintenance_interval;
        {
            let (lock, cv) = &shared.evictor.wake;
            let mut woken = lock.lock();
            if !*woken {
                cv.wait_for(&mut woken, interval);
            }
            *woken = false;
        }
    }
}

impl Shared {
    // --------------------------------------------------------------------------------------------
    // Hybrid maintenance (thesis 000, sections 5.3-5.4)
    // --------------------------------------------------------------------------------------------

    pub(super) fn high_watermark(&self, limit: u64) -> u64 {
        let ppm = self.evictor.settings.read().hybrid.high_watermark_margin_ppm as u128;
        limit - (limit as u128 * ppm / 1_000_000) as u64
    }

    pub(super) fn maintain_all_until_idle(&self) {
        // One pass at a time (see `Evictor::pass`); a later pass at the fixed point moves nothing.
        let _pass = self.evictor.pass.lock();
        let pools: Vec<Arc<Pool>> = {
            let tree = self.tree.read();
            tree.vms
                .values()
                .flat_map(|n| n.pools.values().cloned())
                .filter(|p| p.spec.load().is_hybrid())
                .collect()
        };
        for p in pools {
            // Each step moves at most one batch; a pool converges in a bounded number of steps because
            // every step strictly reduces its distance to the watermarks (or does nothing).
            let mut steps = 0u64;
            while self.maintain_pool(&p) && !self.evictor.shutdown.load(Ordering::Relaxed) {
                steps += 1;
                if steps > 1_000_000 {
                    tracing::warn!(pool = p.id.0, "hybrid maintenance did not converge");
                    break;
                }
            }
        }
    }

    /// One maintenance step for a hybrid pool: demote, evict from the SSD tier, or promote one batch.
    /// Returns whether anything moved.
    pub(super) fn maintain_pool(&self, p: &Arc<Pool>) -> bool {
        let spec = p.spec.load();
        if !spec.is_hybrid() {
            return false;
        }
        let (batch, low_margin) = {
            let s = self.evictor.settings.read();
            (
                (s.hybrid.move_batch_bytes / self.page_size as u64).max(1),
                s.hybrid.low_watermark_margin_bytes / self.page_size as u64,
            )
        };
        let mem_limit = p.entitlement(StoreKind::Mem);
        let ssd_limit = p.entitlement(StoreKind::Ssd);
        let mem_used = p.used(StoreKind::Mem);
        let ssd_used = p.used(StoreKind::Ssd);
        let mem_high = self.high_watermark(mem_limit);
        let ssd_high = self.high_watermark(ssd_limit);
        let can_demote = self.place.store_available(StoreKind::Ssd) && spec.weight(StoreKind::Ssd) > 0;

        if ssd_used > ssd_high && p.kind == PoolKind::Ephemeral {
            return self.evict_from_pool(p, StoreKind::Ssd, batch.min(ssd_used), None) > 0;
        }
        if mem_used > mem_high {
            let n = batch.min(mem_used);
            if can_demote {
                return self.demote(p, n) > 0;
            }
            return self.evict_from_pool(p, StoreKind::Mem, n, None) > 0;
        }
        // Promotion stops at the high watermark even where the low margin is the smaller of the two
        // (a limit above `low_margin * 1e6 / ppm`: 4 GiB with the defaults): promoting past it made the
        // next step demote what it had promoted, and maintenance never reached a fixed point.
        let low = mem_limit.saturating_sub(low_margin).min(mem_high);
        if mem_used < low && ssd_used > 0 {
            return self.promote(p, batch.min(low - mem_used).min(ssd_used)) > 0;
        }
        false
    }

    /// Moves up to `n` of the oldest memory pages of `p` to the SSD tier. Returns pages moved.
    fn demote(&self, p: &Arc<Pool>, n: u64) -> u64 {
        let mut moved = 0u64;
        for (shard, quota) in p.quotas(StoreKind::Mem, n) {
            let (m, room) = self.demote_in(p, shard, quota);
            moved += m;
            if !room {
                // No SSD room at all: fall back to dropping the pages so memory stays bounded.
                return moved + self.evict_from_pool(p, StoreKind::Mem, n - moved, None);
            }
        }
        moved
    }

    /// Demotes up to `n` of the oldest memory pages of one shard of `p`. Returns pages moved and whether
    /// the SSD had room (false: it took none of a chunk).
    fn demote_in(&self, p: &Arc<Pool>, shard: usize, n: u64) -> (u64, bool) {
        let Some(ssd) = self.place.ssd.as_ref() else { return (0, true) };
        let ps = self.page_size;
        let mut moved = 0u64;
        let mut buf = vec![0u8; ps * DEMOTE_CHUNK];
        while moved < n {
            let want = (n - moved).min(DEMOTE_CHUNK as u64) as usize;
            // 1. Copy the oldest pages out under the lock (they stay indexed and readable).
            let picked: Vec<(Key, u64)> = {
                let g = p.lock_shard(shard);
                let mut picked = Vec::with_capacity(want);
                for id in g.oldest_in(StoreKind::Mem, want) {
                    let e = g.entry(id);
                    let Loc::Mem(f) = e.loc else {
                        crate::invariant!(false, "memory queue holds a page located on SSD");
                        continue;
                    };
                    let i = picked.len();
                    self.place.mem.read(f, &mut buf[i * ps..(i + 1) * ps]);
                    picked.push((e.key, e.version));
                }
                picked
            };
            if picked.is_empty() {
                break;
            }
            // 2. Write them to fresh SSD slots outside the lock.
            let mut staged = Vec::with_capacity(picked.len());
            for (i, (key, version)) in picked.iter().enumerate() {
                if !ssd.accepting() || !self.reserve(StoreKind::Ssd, p) {
                    break;
                }
                let Some(slot) = ssd.alloc() else {
                    self.place.stores[1].release(1);
                    break;
                };
                ssd.write(slot, &buf[i * ps..(i + 1) * ps]);
                staged.push((*key, *version, slot));
            }
            if staged.is_empty() {
                return (moved, false);
            }
            // 3. Switch each entry that is still the same page to its SSD slot.
            let mut to_free = Vec::new();
            {
                let mut g = p.lock_shard(shard);
                for (key, version, slot) in staged {
                    match g.lookup(key) {
                        Some(id) if g.entry(id).version == version && !g.dead => {
                            let old = g.relocate(id, Loc::Ssd(slot));
                            g.counters.demotions += 1;
                            to_free.push(old);
                            moved += 1;
                        }
                        // Replaced, flushed or got meanwhile: the SSD copy is stale, drop it.
                        _ => to_free.push(Loc::Ssd(slot)),
                    }
                }
                p.publish(&g);
            }
            self.place.free_locs(&to_free);
        }
        (moved, true)
    }

    /// Moves up to `n` of the youngest SSD pages of `p` back to memory, using only free memory.
    fn promote(&self, p: &Arc<Pool>, n: u64) -> u64 {
        let mut moved = 0;
        for (shard, quota) in p.quotas(StoreKind::Ssd, n) {
            let (m, room) = self.promote_in(p, shard, quota);
            moved += m;
            if !room {
                break;
            }
        }
        moved
    }

    /// Promotes up to `n` of the youngest SSD pages of one shard of `p`. Returns pages moved and whether
    /// memory had room for all it tried.
    fn promote_in(&self, p: &Arc<Pool>, shard: usize, n: u64) -> (u64, bool) {
        let Some(ssd) = self.place.ssd.as_ref() else { return (0, false) };
        let picked: Vec<(Key, u64, crate::store::ssd::SlotId)> = {
            let g = p.lock_shard(shard);
            g.youngest_in(StoreKind::Ssd, n as usize)
                .into_iter()
                .filter_map(|id| {
                    let e = g.entry(id);
                    match e.loc {
                        Loc::Ssd(s) => Some((e.key, e.version, s)),
                        Loc::Mem(_) => None,
                    }
                })
                .collect()
        };
        let mut staged = Vec::with_capacity(picked.len());
        let mut room = true;
        for (key, version, slot) in picked {
            if !self.place.stores[0].try_reserve(1) {
                room = false;
                break;
            }
            let Some(frame) = self.place.mem.alloc() else {
                self.place.stores[0].release(1);
                room = false;
                break;
            };
            let mut page = vec![0u8; self.page_size];
            if ssd.read(slot, &mut page).is_err() {
                self.place.mem.free(frame);
                self.place.stores[0].release(1);
                continue;
            }
            self.place.mem.write(frame, &page);
            let frame = match &self.place.dedup {
                Some(idx) => {
                    let used = idx.insert(
                        &self.place.mem,
                        p.dedup_domain.load(Ordering::Relaxed),
                        hash_page(&page),
                        frame,
                        &page,
                    );
                    if used != frame {
                        self.place.mem.free(frame);
                        self.place.stores[0].release(1);
                    }
                    used
                }
                None => frame,
            };
            staged.push((key, version, slot, frame));
        }
        let mut moved = 0;
        let mut to_free = Vec::new();
        {
            let mut g = p.lock_shard(shard);
            for (key, version, slot, frame) in staged {
                match g.lookup(key) {
                    Some(id)
                        if g.entry(id).version == version && g.entry(id).loc == Loc::Ssd(slot) && !g.dead =>
                    {
                        let old = g.relocate(id, Loc::Mem(frame));
                        g.counters.promotions += 1;
                        to_free.push(old);
                        moved += 1;
                    }
                    _ => to_free.push(Loc::Mem(frame)),
                }
            }
            p.publish(&g);
        }
        self.place.free_locs(&to_free);
        (moved, room)
    }
}
