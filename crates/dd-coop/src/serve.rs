//! Algorithm 4 on the listener's side (SPEC section 9): one request of an authenticated peer —
//! summaries, remote compares that pin an equal frame for it, fetches and unpins of its own pins —
//! answered into a response frame, with the engine behind [`PinHost`].
//!
//! No I/O: the daemon (`dd-server`'s `coop/listener.rs`) reads the frame after the handshake and
//! writes what this returns; the tests and fuzzing call it directly.
//!
//! Invariants:
//! * **No pin without an owner, none past `max_pins`.** A compare pins only while fewer than
//!   `max_pins` pins are held; a pin that cannot be recorded for the session (another epoch of the
//!   peer authenticated since) is released at once and the compare refused.
//! * **A session outlives its pin-table entry**: a request of a session whose entry the TTL removed
//!   enters the peer again (`PinTable::touch`), so its compares pin again.
//! * **A peer reaches only its own pins**: fetches and unpins look handles up among the pins
//!   granted to the authenticated name (`pins::PinTable`).
//! * **Any well-formed request keeps the peer's pins alive** (it is heard from).
//! * Bad input is an error answer, never a panic.

use crate::pins::PinTable;
use crate::wire::{self, PeerHeader, PeerRequest, PeerResponse, PeerStatus};
use crate::{BloomConfig, BloomFilter, Removal};
use std::time::Instant;

/// What the listener needs of the daemon: the engine's pins, the pin table behind its lock, handles.
pub trait PinHost {
    /// The only page length accepted.
    fn page_size(&self) -> usize;
    /// The most pins held for all peers together.
    fn max_pins(&self) -> u64;
    /// Pins the engine holds for every peer.
    fn pins_held(&self) -> u64;
    /// Pins a local frame equal to `page` (of content `hash`), if there is one.
    fn pin(&self, hash: u128, page: &[u8]) -> Option<u64>;
    /// Copies a pinned frame into `out`; false if the pin is gone.
    fn read_pin(&self, pin: u64, out: &mut [u8]) -> bool;
    fn unpin(&self, pin: u64);
    /// Runs `f` on the pin table under the daemon's lock (no engine call is made inside).
    fn with_pins<R>(&self, f: impl FnOnce(&mut PinTable) -> R) -> R;
    /// An unguessable pin handle.
    fn draw_handle(&self) -> u64;
}

/// What one request did, for the daemon's counters and summaries.
#[derive(Debug)]
#[non_exhaustive]
pub enum Served {
    /// A summary to keep as the peer's.
    Summary(BloomFilter),
    /// A remote compare; `pinned` if an equal frame was pinned (even one released at once because the
    /// session is stale: another epoch of the peer authenticated since).
    Compared {
        pinned: bool,
    },
    Fetched,
    /// Unpins, `released` of which were the peer's.
    Unpinned {
        released: usize,
    },
    /// An error answer (malformed, refused, out of place).
    Refused,
}

/// Answers one request frame (`h`, `payload`) of the peer `from`, authenticated on this connection in
/// `epoch`, at `now` into `out`.
pub fn handle<H: PinHost>(
    host: &H,
    from: &str,
    epoch: u64,
    h: &PeerHeader,
    payload: &[u8],
    now: Instant,
    out: &mut Vec<u8>,
) -> Served {
    let page_size = host.page_size();
    let req = match PeerRequest::decode(h.op, payload, page_size) {
        Ok(r) => r,
        Err(e) => {
            wire::encode_error(h.op, h.request_id, e.status(), &e.to_string(), out);
            return Served::Refused;
        }
    };
    host.with_pins(|t| t.touch(from, epoch, now));
    let mut refuse = |status: PeerStatus, msg: &str| {
        wire::encode_error(h.op, h.request_id, status, msg, out);
        Served::Refused
    };
    let resp_served;
    let page;
    let resp = match req {
        PeerRequest::Hello { .. } | PeerRequest::Auth { .. } => {
            return refuse(PeerStatus::MALFORMED, "already authenticated")
        }
        PeerRequest::Summary { m_bits, k_hashes, bits } => {
            let cfg = BloomConfig { m_bits, k_hashes, removal: Removal::NoUnset };
            let Ok(filter) = BloomFilter::from_summary(cfg, bits) else {
                return refuse(PeerStatus::REFUSED, "bad summary");
            };
            resp_served = Served::Summary(filter);
            PeerResponse::Done
        }
        PeerRequest::Compare { hash, page } => {
            let pin = if host.pins_held() >= host.max_pins() { None } else { host.pin(hash, page) };
            let handle = match pin {
                Some(pin) => match host.with_pins(|t| t.grant(from, epoch, pin, || host.draw_handle())) {
                    Ok(handle) => Some(handle),
                    Err(e) => {
                        // A stale session (the peer authenticated again since): keep no pin nobody
                        // can release.
                        host.unpin(pin);
                        refuse(PeerStatus::REFUSED, &e.to_string());
                        return Served::Compared { pinned: true };
                    }
                },
                None => None,
            };
            resp_served = Served::Compared { pinned: handle.is_some() };
            PeerResponse::Compared(handle)
        }
        PeerRequest::Fetch { pin } => {
            resp_served = Served::Fetched;
            let owned = host.with_pins(|t| t.lookup(from, pin));
            let mut bytes = vec![0u8; page_size];
            if owned.is_some_and(|pin| host.read_pin(pin, &mut bytes)) {
                page = bytes;
                PeerResponse::Fetched(Some(&page))
            } else {
                PeerResponse::Fetched(None)
            }
        }
        PeerRequest::Unpin { pins } => {
            let mine = host.with_pins(|t| t.unpin(from, pins));
            for p in &mine {
                host.unpin(*p);
            }
            resp_served = Served::Unpinned { released: mine.len() };
            PeerResponse::Unpinned(mine.len() as u32)
        }
    };
    resp.encode(h.op, h.request_id, out);
    resp_served
}
