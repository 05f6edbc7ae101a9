//! Remotified pages and pins: the engine's side of co-operative de-duplication (thesis 004, sections
//! 5.2.5-5.2.7). The network lives in the daemon (`dd-server`'s `coop` module); the engine only keeps
//! records and never blocks on a peer.
//!
//! **Remotification.** When a [`RemoteSink`] is installed, evicting an ephemeral memory page whose frame
//! no other local page shares leaves a *pending* record (`key → token`) in the pool, and the page's bytes
//! are offered to the sink (a non-blocking hand-off to the daemon's remotifier). If a peer confirms it
//! holds equal bytes and pins them, the daemon calls [`crate::Cache::install_remote`] with the token and
//! the record becomes *remote*: the entry holds a [`RemoteRef`] (every peer that pinned a copy, at most
//! [`MAX_HOLDERS`]) and no local memory. Any put, flush,
//! migration or destroy of the key removes the record (and hands a remote one back to the sink to be
//! unpinned), so an install whose token no longer matches fails: a remote copy can never resurrect a page
//! the guest has replaced or dropped since it was evicted (Algorithm 3, steps 7-18).
//!
//! **Pins.** A peer asks this host to keep a frame for it ([`crate::Cache::pin`]): a pin is one extra
//! reference on a de-duplicated frame in domain 0, so the frame stays allocated (and immutable) while
//! pinned even when every local page using it is gone. Pins are numbered; a pin number never repeats
//! within one cache instance.
//!
//! **Invariants.** A key has at most one record per pool and never a record while it is indexed locally;
//! a remote record's bytes are only ever returned after the caller verified their content hash; the pin
//! table is a leaf lock (no engine lock is taken while it is held, and the frame of a pin is read under
//! it so an unpin cannot free the frame mid-copy).

use crate::types::{Key, PoolId, VmId};
use serde::{Deserialize, Serialize};

/// Most peers one remotified page names. A bounded list keeps the record a small `Copy` value (about
/// 100 bytes in place of a 4 KiB page); `coop.max_holders` says how many are asked for (at most this).
pub const MAX_HOLDERS: usize = 3;

/// One peer's copy of a remotified page: a pin, valid while the peer keeps its restart epoch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Holder {
    /// The daemon's number for the peer (its position in the membership).
    pub peer: u32,
    /// The peer's restart epoch when it granted the pin; another epoch means the pin is gone.
    pub epoch: u64,
    /// The pin number on the peer.
    pub pin: u64,
}

/// Where a remotified page lives: every peer known to hold a pinned copy of it (at most
/// [`MAX_HOLDERS`], in the order a get tries them), and the page's content hash.
///
/// Invariant: `len >= 1` for an installed record, and the slots past `len` are `Holder::default()` (so
/// the derived equality compares only what is named).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct RemoteRef {
    holders: [Holder; MAX_HOLDERS],
    len: u8,
    /// xxh3-128 of the page; a fetched page that hashes otherwise is a miss.
    pub hash: u128,
}

impl RemoteRef {
    /// A record naming one holder.
    pub fn new(first: Holder, hash: u128) -> RemoteRef {
        let mut holders = [Holder::default(); MAX_HOLDERS];
        holders[0] = first;
        RemoteRef { holders, len: 1, hash }
    }

    /// Adds another holder; false (and nothing changes) when the list is full.
    pub fn push(&mut self, h: Holder) -> bool {
        let at = self.len as usize;
        if at >= MAX_HOLDERS {
            return false;
        }
        self.holders[at] = h;
        self.len += 1;
        true
    }

    /// The holders, in the order a get tries them.
    pub fn holders(&self) -> &[Holder] {
        &self.holders[..self.len as usize]
    }

    /// Keeps only the holders `keep` accepts (order kept); returns how many went.
    pub fn retain(&mut self, mut keep: impl FnMut(&Holder) -> bool) -> usize {
        let mut kept = [Holder::default(); MAX_HOLDERS];
        let mut n = 0;
        for h in self.holders() {
            if keep(h) {
                kept[n] = *h;
                n += 1;
            }
        }
        let gone = self.len as usize - n;
        self.holders = kept;
        self.len = n as u8;
        gone
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

/// An evicted page offered for remotification.
#[derive(Debug)]
pub struct Evicted {
    pub vm: VmId,
    pub pool: PoolId,
    pub key: Key,
    /// Must be passed back to [`crate::Cache::install_remote`] or [`crate::Cache::abandon_remote`].
    pub token: u64,
    pub hash: u128,
    pub data: Box<[u8]>,
}

/// The daemon's remotifier, as the engine sees it. Both calls are made from the data path (possibly with
/// the eviction lock held) and must return without waiting for the network.
pub trait RemoteSink: Send + Sync + std::fmt::Debug {
    /// Offers a page. Returning false (a full queue) makes the eviction a plain one.
    fn offer(&self, page: Evicted) -> bool;
    /// A remote record left the cache: its pin should be released on the peer (best effort).
    fn release(&self, r: RemoteRef);
}

/// A record of a key that is not indexed locally.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RemoteState {
    /// Evicted and offered to the sink under this token; no data yet.
    Pending(u64),
    Remote(RemoteRef),
}
