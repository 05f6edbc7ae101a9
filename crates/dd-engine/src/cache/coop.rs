//! Co-operative de-duplication (thesis 004, Algorithms 3 and 4), the engine's side: remote records of
//! evicted pages (pending, installed, abandoned, dropped), gets that report remotified pages, and pins
//! held for peers (`remote.rs` holds the record types).
//!
//! Owns [`Coop`], the part of the engine's state that only co-operative de-duplication uses (the sink,
//! the group's domain, record tokens, pins, host-scope counters). The put and eviction paths reach it
//! through four calls: [`Coop::offering`] (whether and where an eviction offers pages),
//! [`Coop::count_group_dedup`], and [`Coop::release_remote`] / [`Coop::release_remote_of`] after a pool
//! operation; without a sink each is a load and a branch.
//!
//! The engine never waits for a peer: the sink's calls return at once. Only pages of the co-operative
//! group's domain are offered, published or pinned. The pin table is a leaf lock; a pinned frame holds a
//! de-duplication reference, so it is not freed while pinned (`read_pin` copies under the pin-table lock).
//! Remote records a pool operation removed are handed to the sink after the pool lock is released.

use super::{Cache, GetOutcome, Shared, NO_DOMAIN};
use crate::error::CacheError;
use crate::pool::{Hasher, Loc, Map, Pool};
use crate::remote::{Evicted, Holder, RemoteRef, RemoteSink};
use crate::store::dedup::Lookup;
use crate::store::frame::{hash_page, FrameId};
use crate::types::{Key, PoolId, StoreKind, VmId};
use parking_lot::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

/// Pending remote records a pool may hold; beyond it its evictions are plain.
const MAX_PENDING_PER_POOL: usize = 4096;

/// Co-operative de-duplication's state.
pub(super) struct Coop {
    /// The daemon's remotifier, once installed (`remote.rs`).
    sink: OnceLock<Arc<dyn RemoteSink>>,
    /// Tokens of pending remote records (never repeat within this cache).
    tokens: AtomicU64,
    /// The domain co-operative de-duplication shares ([`Cache::set_coop_group`]); `NO_DOMAIN`: none.
    domain: AtomicU64,
    /// De-dup hits and bytes saved in group domains: counted in host scope only, so that no VM's own
    /// statistics reveal a match with another VM's content.
    group_dedup_hits: AtomicU64,
    group_bytes_saved: AtomicU64,
    /// Pins held for peers: pin number -> frame (a leaf lock).
    pins: Mutex<Map<u64, FrameId>>,
    next_pin: AtomicU64,
    pins_granted: AtomicU64,
}

/// What an eviction from one pool offers to peers (from [`Coop::offering`]).
pub(super) struct Offering<'a> {
    pub(super) sink: &'a dyn RemoteSink,
    /// The pool's bound on pending records, split evenly over its shards.
    pub(super) max_pending_per_shard: usize,
    tokens: &'a AtomicU64,
}

impl Offering<'_> {
    /// A fresh token for a pending record.
    pub(super) fn token(&self) -> u64 {
        self.tokens.fetch_add(1, Ordering::Relaxed)
    }
}

impl Coop {
    pub(super) fn new() -> Coop {
        Coop {
            sink: OnceLock::new(),
            tokens: AtomicU64::new(1),
            domain: AtomicU64::new(NO_DOMAIN),
            group_dedup_hits: AtomicU64::new(0),
            group_bytes_saved: AtomicU64::new(0),
            pins: Mutex::new(Map::with_hasher(Hasher::default())),
            next_pin: AtomicU64::new(1),
            pins_granted: AtomicU64::new(0),
        }
    }

    pub(super) fn set_domain(&self, domain: u64) {
        self.domain.store(domain, Ordering::Relaxed);
    }

    /// Whether evicting `store`'s pages of `p` offers them to peers, and to what: only memory pages, and
    /// only of pools in the co-operative group's domain (the rule of SPEC section 6 across hosts: content
    /// leaves a VM's domain only where the administrator said so).
    pub(super) fn offering(&self, p: &Pool, store: StoreKind) -> Option<Offering<'_>> {
        let sink = self.sink.get()?;
        let domain = self.domain.load(Ordering::Relaxed);
        if store != StoreKind::Mem || domain == NO_DOMAIN || p.dedup_domain.load(Ordering::Relaxed) != domain
        {
            return None;
        }
        Some(Offering {
            sink: sink.as_ref(),
            max_pending_per_shard: (MAX_PENDING_PER_POOL / p.shard_count()).max(1),
            tokens: &self.tokens,
        })
    }

    /// Counts a de-duplication hit in a group's domain (host scope).
    pub(super) fn count_group_dedup(&self, bytes: u64) {
        self.group_dedup_hits.fetch_add(1, Ordering::Relaxed);
        self.group_bytes_saved.fetch_add(bytes, Ordering::Relaxed);
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

    pub(super) fn pins_held(&self) -> u64 {
        self.pins.lock().len() as u64
    }

    /// Pins granted since the start, de-dup hits and bytes saved in group domains.
    pub(super) fn counters(&self) -> (u64, u64, u64) {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        (get(&self.pins_granted), get(&self.group_dedup_hits), get(&self.group_bytes_saved))
    }
}

impl Cache {
    // ------------------------------------------------------------------------------------------
    // Co-operative de-duplication (remote.rs)
    // ------------------------------------------------------------------------------------------

    /// Installs the remotifier. Only the first call takes effect (returns false afterwards); remotification
    /// needs the memory store's de-duplication (`mem.dedup`), without it the call is refused too.
    pub fn set_remote_sink(&self, sink: Arc<dyn RemoteSink>) -> bool {
        self.shared.place.dedup.is_some() && self.shared.coop.sink.set(sink).is_ok()
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
        let idx = self.shared.place.dedup.as_ref()?;
        let coop = &self.shared.coop;
        let domain = coop.domain.load(Ordering::Relaxed);
        if domain == NO_DOMAIN || data.len() != self.shared.page_size || hash_page(data) != hash {
            return None;
        }
        let Lookup::Shared(f) = idx.lookup(&self.shared.place.mem, domain, hash, data) else { return None };
        let pin = coop.next_pin.fetch_add(1, Ordering::Relaxed);
        coop.pins.lock().insert(pin, f);
        coop.pins_granted.fetch_add(1, Ordering::Relaxed);
        Some(pin)
    }

    /// Copies a pinned frame into `out`. False for an unknown (released) pin.
    pub fn read_pin(&self, pin: u64, out: &mut [u8]) -> bool {
        if out.len() != self.shared.page_size {
            return false;
        }
        // Read under the pin-table lock so a concurrent unpin cannot free the frame mid-copy.
        let pins = self.shared.coop.pins.lock();
        let Some(f) = pins.get(&pin) else { return false };
        self.shared.place.mem.read(*f, out);
        true
    }

    /// Releases a pin (its frame is freed if nothing else references it). False for an unknown pin.
    pub fn unpin(&self, pin: u64) -> bool {
        let Some(f) = self.shared.coop.pins.lock().remove(&pin) else { return false };
        self.shared.release_frames(&[f]);
        true
    }

    /// Pins held now.
    pub fn pins_held(&self) -> u64 {
        self.shared.coop.pins_held()
    }

    /// Content hashes of the frames of the co-operative group's domain (the summary a daemon
    /// publishes); none without a co-operative group.
    pub fn content_hashes(&self) -> Vec<u128> {
        let domain = self.shared.coop.domain.load(Ordering::Relaxed);
        match (&self.shared.place.dedup, domain) {
            (Some(idx), d) if d != NO_DOMAIN => idx.hashes(d),
            _ => Vec::new(),
        }
    }
}

impl Shared {
    /// Frees evicted memory pages, first offering the ones no other local page shares (thesis 004,
    /// Algorithm 3: only "remote sharing candidates" are remotified). Offers that were not made are
    /// abandoned under the pool lock again.
    pub(super) fn offer_evicted(&self, p: &Pool, sink: &dyn RemoteSink, offers: Vec<(Key, u64, FrameId)>) {
        let idx = self.place.dedup.as_ref().expect("a sink is only installed with de-duplication");
        let mut not_offered = Vec::new();
        let mut freed = 0;
        for (key, token, f) in offers {
            if !idx.release(f) {
                not_offered.push((key, token)); // still shared locally: stays a local page
                continue;
            }
            // The last reference is gone: this thread owns the frame until it frees it.
            let mut data = vec![0u8; self.page_size].into_boxed_slice();
            self.place.mem.read(f, &mut data);
            if self.place.mem.free(f) {
                freed += 1;
            }
            let hash = hash_page(&data);
            if !sink.offer(Evicted { vm: p.vm, pool: p.id, key, token, hash, data }) {
                not_offered.push((key, token));
            }
        }
        if freed > 0 {
            self.place.stores[0].release(freed);
        }
        for (key, token) in not_offered {
            p.lock(key).abandon_remote(key, token);
        }
    }

    /// Drops references to memory frames (pins), freeing frames that become unreferenced.
    fn release_frames(&self, frames: &[FrameId]) {
        let locs: Vec<Loc> = frames.iter().map(|f| Loc::Mem(*f)).collect();
        self.place.free_locs(&locs);
    }
}
