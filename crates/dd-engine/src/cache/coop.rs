//! Co-operative de-duplication (thesis 004, Algorithms 3 and 4), the engine's side: remote records of
//! evicted pages (pending, installed, abandoned, dropped), gets that report remotified pages, and pins
//! held for peers (`remote.rs` holds the record types).
//!
//! The engine never waits for a peer: the sink's calls return at once. Only pages of the co-operative
//! group's domain are offered, published or pinned. The pin table is a leaf lock; a pinned frame holds a
//! de-duplication reference, so it is not freed while pinned (`read_pin` copies under the pin-table lock).
//! Remote records a pool operation removed are handed to the sink after the pool lock is released.

use super::{Cache, GetOutcome, Shared, NO_DOMAIN};
use crate::error::CacheError;
use crate::pool::{Loc, Pool};
use crate::remote::{Evicted, Holder, RemoteRef, RemoteSink};
use crate::store::dedup::Lookup;
use crate::store::frame::hash_page;
use crate::types::{Key, PoolId, VmId};
use std::sync::atomic::Ordering;
use std::sync::Arc;

impl Cache {
    // ------------------------------------------------------------------------------------------
    // Co-operative de-duplication (remote.rs)
    // ------------------------------------------------------------------------------------------

    /// Installs the remotifier. Only the first call takes effect (returns false afterwards); remotification
    /// needs the memory store's de-duplication (`mem.dedup`), without it the call is refused too.
    pub fn set_remote_sink(&self, sink: Arc<dyn RemoteSink>) -> bool {
        self.shared.dedup.is_some() && self.shared.sink.set(sink).is_ok()
    }

    /// Makes the pending record of an offered page remote. False when the key changed since the offer
    /// (put, flushed, pool gone): the caller must release the pin.
    pub fn install_remote(&self, vm: VmId, pool: PoolId, key: Key, token: u64, r: RemoteRef) -> bool {
        let Ok(p) = self.shared.pool(vm, pool) else { return false };
        let mut g = p.lock(key);
        if g.dead {
            return false;
        }
        g.install_remote(key, token, r)
    }

    /// Drops the pending record of an offered page that no peer took.
    pub fn abandon_remote(&self, vm: VmId, pool: PoolId, key: Key, token: u64) {
        if let Ok(p) = self.shared.pool(vm, pool) {
            p.lock(key).abandon_remote(key, token);
        }
    }

    /// A get that also reports remotified pages: on a local miss of a remotified key returns its
    /// [`RemoteRef`] (an exclusive pool forgets the record; the caller releases the pin after fetching).
    pub fn get_or_remote(
        &self,
        vm: VmId,
        pool: PoolId,
        key: Key,
        out: &mut [u8],
    ) -> Result<GetOutcome, CacheError> {
        if self.get(vm, pool, key, out)? {
            return Ok(GetOutcome::Hit);
        }
        Ok(match self.take_remote(vm, pool, key)? {
            Some((r, _)) => GetOutcome::Remote(r),
            None => GetOutcome::Miss,
        })
    }

    /// The remote record of a key that just missed locally (see [`Self::get_or_remote`]), and whether
    /// it was removed (exclusive pools): then the caller releases the pin once it has fetched the page.
    pub fn take_remote(
        &self,
        vm: VmId,
        pool: PoolId,
        key: Key,
    ) -> Result<Option<(RemoteRef, bool)>, CacheError> {
        let p = self.shared.pool(vm, pool)?;
        let mut g = p.lock(key);
        Ok(g.take_remote(key, p.exclusive_gets).map(|r| (r, p.exclusive_gets)))
    }

    /// Forgets every holder of a remotified record for which `dead` holds (pins of a peer that
    /// restarted, or that has been unreachable for longer than it keeps pins): they could only miss.
    /// A record left with no holder goes, so `remote_pages` counts only records that can still hit.
    /// Walks every pool once (rare: on a peer's epoch change or expiry). Returns the records dropped.
    pub fn drop_dead_remote(&self, dead: &dyn Fn(&Holder) -> bool) -> u64 {
        let pools: Vec<Arc<Pool>> = self
            .shared
            .pools
            .iter()
            .flat_map(|shard| shard.read().values().cloned().collect::<Vec<_>>())
            .collect();
        pools
            .iter()
            .flat_map(|p| (0..p.shard_count()).map(move |i| (p, i)))
            .map(|(p, i)| p.lock_shard(i).drop_dead_remote(dead))
            .sum()
    }

    /// Counts the result of fetching a remotified page for a pool's statistics. A hit turns the get's
    /// local miss into a hit: `gets_missed` counts only gets that found the page nowhere.
    pub fn record_remote_get(&self, vm: VmId, pool: PoolId, hit: bool) {
        if let Ok(p) = self.shared.pool(vm, pool) {
            if !hit {
                p.lock_shard(0).counters.remote_gets_missed += 1;
                return;
            }
            // The local miss was counted in the key's shard, which this call does not know: take it back
            // from the first shard that counted one (the pool's sum is what statistics show).
            for i in 0..p.shard_count() {
                let mut g = p.lock_shard(i);
                if g.counters.gets_missed > 0 || i + 1 == p.shard_count() {
                    g.counters.remote_gets_hit += 1;
                    g.counters.gets_missed = g.counters.gets_missed.saturating_sub(1);
                    return;
                }
            }
        }
    }

    /// A peer's remote compare (Algorithm 4): if a frame of the co-operative group's domain
    /// ([`Cache::set_coop_group`]) holds exactly `data`, takes a reference on it for the peer and returns
    /// the pin number.
    pub fn pin(&self, hash: u128, data: &[u8]) -> Option<u64> {
        let idx = self.shared.dedup.as_ref()?;
        let domain = self.shared.coop_domain.load(Ordering::Relaxed);
        if domain == NO_DOMAIN || data.len() != self.shared.page_size || hash_page(data) != hash {
            return None;
        }
        let Lookup::Shared(f) = idx.lookup(&self.shared.mem, domain, hash, data) else { return None };
        let pin = self.shared.next_pin.fetch_add(1, Ordering::Relaxed);
        self.shared.pins.lock().insert(pin, f);
        self.shared.pins_granted.fetch_add(1, Ordering::Relaxed);
        Some(pin)
    }

    /// Copies a pinned frame into `out`. False for an unknown (released) pin.
    pub fn read_pin(&self, pin: u64, out: &mut [u8]) -> bool {
        if out.len() != self.shared.page_size {
            return false;
        }
        // Read under the pin-table lock so a concurrent unpin cannot free the frame mid-copy.
        let pins = self.shared.pins.lock();
        let Some(f) = pins.get(&pin) else { return false };
        self.shared.mem.read(*f, out);
        true
    }

    /// Releases a pin (its frame is freed if nothing else references it). False for an unknown pin.
    pub fn unpin(&self, pin: u64) -> bool {
        let Some(f) = self.shared.pins.lock().remove(&pin) else { return false };
        self.shared.release_frames(&[f]);
        true
    }

    /// Pins held now.
    pub fn pins_held(&self) -> u64 {
        self.shared.pins.lock().len() as u64
    }

    /// Content hashes of the frames of the co-operative group's domain (the summary a daemon
    /// publishes); none without a co-operative group.
    pub fn content_hashes(&self) -> Vec<u128> {
        let domain = self.shared.coop_domain.load(Ordering::Relaxed);
        match (&self.shared.dedup, domain) {
            (Some(idx), d) if d != NO_DOMAIN => idx.hashes(d),
            _ => Vec::new(),
        }
    }
}

impl Shared {
    /// Frees evicted memory pages, first offering the ones no other local page shares (thesis 004,
    /// Algorithm 3: only "remote sharing candidates" are remotified). Offers that were not made are
    /// abandoned under the pool lock again.
    pub(super) fn offer_evicted(
        &self,
        p: &Pool,
        sink: &dyn RemoteSink,
        offers: Vec<(Key, u64, crate::store::frame::FrameId)>,
    ) {
        let idx = self.dedup.as_ref().expect("a sink is only installed with de-duplication");
        let mut not_offered = Vec::new();
        let mut freed = 0;
        for (key, token, f) in offers {
            if !idx.release(f) {
                not_offered.push((key, token)); // still shared locally: stays a local page
                continue;
            }
            // The last reference is gone: this thread owns the frame until it frees it.
            let mut data = vec![0u8; self.page_size].into_boxed_slice();
            self.mem.read(f, &mut data);
            if self.mem.free(f) {
                freed += 1;
            }
            let hash = hash_page(&data);
            if !sink.offer(Evicted { vm: p.vm, pool: p.id, key, token, hash, data }) {
                not_offered.push((key, token));
            }
        }
        if freed > 0 {
            self.stores[0].release(freed);
        }
        for (key, token) in not_offered {
            p.lock(key).abandon_remote(key, token);
        }
    }

    /// Hands the remote records a pool operation removed to the sink (call after unlocking the pool):
    /// every shard's.
    pub(super) fn release_remote(&self, p: &Pool) {
        let Some(sink) = self.sink.get() else { return };
        for i in 0..p.shard_count() {
            let released = std::mem::take(&mut p.lock_shard(i).released);
            for r in released {
                sink.release(r);
            }
        }
    }

    /// [`Self::release_remote`] after an operation on one key: only the key's shard can hold records
    /// it removed.
    pub(super) fn release_remote_of(&self, p: &Pool, key: Key) {
        let Some(sink) = self.sink.get() else { return };
        let released = std::mem::take(&mut p.lock(key).released);
        for r in released {
            sink.release(r);
        }
    }

    /// Drops references to memory frames (pins), freeing frames that become unreferenced.
    fn release_frames(&self, frames: &[crate::store::frame::FrameId]) {
        let locs: Vec<Loc> = frames.iter().map(|f| Loc::Mem(*f)).collect();
        self.free_locs(&locs);
    }
}
