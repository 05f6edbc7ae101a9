//! The client side's decisions about peers (Algorithm 3 and the remotified get, SPEC section 9):
//! which peers to ask for a page, back-off after a failure, the unpins to send again, and whether
//! fetched bytes may be accepted.
//!
//! No I/O of its own and no engine: the state machines are pure, with time a parameter (`now`), never
//! read here; the loops of Algorithm 3 ([`ask_holders`]), the remotified get ([`fetch`]) and unpins
//! ([`unpin`]) send their requests through a [`PeerTransport`], which the daemon (`dd-server`'s
//! `coop`) implements over its sockets and the tests with a fake network.
//!
//! Invariants:
//! * **A failed peer is skipped for the back-off** ([`Backoff`]): no request goes to it until
//!   `peer_backoff_ms` after its last failure, or until a publication (the heartbeat) clears it. A
//!   failure is what [`starts_backoff`] says: no answer, or an answer that ends the session; never an
//!   answer about one request (see there for why). The daemon and the tests' fake network both gate
//!   their requests with [`Backoff::check`] and [`Backoff::record`], so they cannot disagree.
//! * **Holders in membership order, at most `max_holders`** ([`HolderSearch`]): candidates are the
//!   active peers whose fresh summary may contain the page's hash ([`is_candidate`]); they are asked
//!   in order until enough pinned an equal frame; holders are kept in the order they answered.
//! * **Never wrong data** ([`accept_fetched`]): fetched bytes are accepted only from a holder still in
//!   the epoch its pin was granted in, of the page's length, hashing to the recorded content hash.
//! * **Dead references are forgotten** ([`Liveness`]): a peer found in a new epoch at a connect has
//!   released every pin of its older epochs; one silent for the pin TTL has released all of ours.
//! * **Unpins are not lost** ([`UnpinQueue`]): an unpin that failed on the network is kept per
//!   (peer, epoch) and sent again; one that met another epoch is dropped (the restarted peer released
//!   it itself), and so is every unpin for an epoch found dead.

use crate::transport::{PeerTransport, TransportError};
use crate::wire::{PeerOp, PeerRequest, PeerResponse, PeerStatus, MAX_UNPIN};
use crate::BloomFilter;
use std::collections::HashMap;
use std::time::{Duration, Instant};

/// A peer's back-off after a failure.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Backoff {
    down_until: Option<Instant>,
}

impl Backoff {
    /// Whether requests to the peer are skipped at `now`.
    pub fn is_down(&self, now: Instant) -> bool {
        self.down_until.is_some_and(|t| now < t)
    }

    /// The gate before a request: [`TransportError::Down`] while the peer is skipped at `now`.
    pub fn check(&self, now: Instant) -> Result<(), TransportError> {
        if self.is_down(now) {
            Err(TransportError::Down)
        } else {
            Ok(())
        }
    }

    /// The gate after a request that failed with `e` at `now`: starts the back-off if
    /// [`starts_backoff`] says so. Returns whether it did (the caller then drops its connections,
    /// whose state is unknown, and counts the failure).
    pub fn record(&mut self, e: &TransportError, now: Instant, backoff: Duration) -> bool {
        let starts = starts_backoff(e);
        if starts {
            self.failed(now, backoff);
        }
        starts
    }

    /// The peer failed at `now`: skip it for `backoff`.
    pub fn failed(&mut self, now: Instant, backoff: Duration) {
        self.down_until = Some(now + backoff);
    }

    /// How long the peer is still skipped at `now` (zero when it is not).
    pub fn remaining(&self, now: Instant) -> Duration {
        self.down_until.map_or(Duration::ZERO, |t| t.saturating_duration_since(now))
    }

    /// Ends the back-off early (a publication is also the heartbeat that finds a peer back).
    pub fn clear(&mut self) {
        self.down_until = None;
    }
}

/// Whether a request that failed with `e` means the peer is unusable for now, so that it is skipped
/// for the back-off.
///
/// The back-off exists so that a dead or unreachable peer does not cost every eviction and every get a
/// timeout (or a connect and a signed handshake). So it starts when the peer gave no answer (a
/// timeout, a refused or closed connection, an address that does not resolve, a peer that did not
/// prove its name, a frame that does not parse) and when its answer ends the session
/// ([`PeerStatus::ends_session`]: authentication failed, or the listener could not read the frame; it
/// closes the connection, and every request would meet the same). It does not start on a status answer
/// about one request (malformed, unknown op, refused: a summary of another size, a pin-table entry that
/// expired): the peer is alive, answered at once and the connection is in step, so skipping it would
/// only lose its next answers. Negative answers (no equal frame, a pin no longer held) are successes
/// of the transport and never reach here. Nor does it start on [`TransportError::Down`] (the peer is
/// already skipped: the back-off is not extended by requests it refused to send) or
/// [`TransportError::EpochChanged`] (nothing was sent; a restarted peer is healthy).
pub fn starts_backoff(e: &TransportError) -> bool {
    match e {
        TransportError::Down | TransportError::EpochChanged => false,
        TransportError::Status(s) => PeerStatus(*s).ends_session(),
        TransportError::Timeout
        | TransportError::Refused
        | TransportError::Closed
        | TransportError::Other(_) => true,
    }
}

/// What this daemon knows of a peer's life, to forget references that can no longer hit: the epoch
/// it last connected in, and its last successful answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Liveness {
    /// 0: never reached, or forgotten after a silence.
    epoch: u64,
    last_ok: Instant,
}

/// What became of a peer's pins after a connect or a silence.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Forget {
    /// Nothing: keep every reference.
    Nothing,
    /// It restarted: the pins it granted in any epoch but `alive` are gone.
    EpochsBut { alive: u64 },
    /// It was unreachable for the pin TTL, so it has released our pins (it has not heard from us
    /// either): every reference to it is gone.
    Everything,
}

impl Liveness {
    /// A peer not reached yet, its silence counted from `now`.
    pub fn new(now: Instant) -> Self {
        Liveness { epoch: 0, last_ok: now }
    }

    /// The epoch it last connected in (0: not reached since start or since it was forgotten).
    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// A request to it succeeded at `now`.
    pub fn answered(&mut self, now: Instant) {
        self.last_ok = now;
    }

    /// A connect reached it in `epoch`.
    pub fn connected(&mut self, epoch: u64) -> Forget {
        let before = std::mem::replace(&mut self.epoch, epoch);
        if before != 0 && before != epoch {
            Forget::EpochsBut { alive: epoch }
        } else {
            Forget::Nothing
        }
    }

    /// At `now`: a peer once reached and silent for `ttl` is forgotten (once; it counts as not reached
    /// until its next connect).
    pub fn expire(&mut self, now: Instant, ttl: Duration) -> Forget {
        if self.epoch != 0 && now.saturating_duration_since(self.last_ok) >= ttl {
            self.epoch = 0;
            Forget::Everything
        } else {
            Forget::Nothing
        }
    }
}

impl Forget {
    /// Whether a reference granted in `epoch` is gone.
    pub fn is_dead(&self, epoch: u64) -> bool {
        match *self {
            Forget::Nothing => false,
            Forget::EpochsBut { alive } => epoch != alive,
            Forget::Everything => true,
        }
    }
}

/// Whether a peer may be asked to hold a page: it is active and its summary, received at
/// `received`, is younger than `ttl` at `now` and may contain `hash`.
pub fn is_candidate(
    active: bool,
    summary: Option<(&BloomFilter, Instant)>,
    hash: u128,
    now: Instant,
    ttl: Duration,
) -> bool {
    active
        && summary.is_some_and(|(filter, received)| {
            now.saturating_duration_since(received) < ttl && filter.may_contain(hash)
        })
}

/// A pin a peer granted: the peer (its index in the daemon's peer list), the epoch it ran in and
/// its handle.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Granted {
    pub peer: u32,
    pub epoch: u64,
    pub pin: u64,
}

/// What a peer answered to a remote compare.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum CompareAnswer {
    /// It pinned an equal frame under `pin`, in `epoch`.
    Pinned { epoch: u64, pin: u64 },
    /// It holds no equal frame (a Bloom false positive, or the frame went away).
    Mismatch,
    /// The request failed (back-off, network, status, a bad answer).
    Failed,
}

/// How Algorithm 3 ended for one page.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum SearchOutcome {
    /// No peer's summary may contain the page: abandon it without asking anyone.
    NoCandidate,
    /// These peers pinned it, in the order they answered: install them as the remote reference.
    Pinned(Vec<Granted>),
    /// Nobody pinned it; `errors` if some request failed (rather than every peer mismatching).
    Abandoned { errors: bool },
}

/// Algorithm 3's choice of holders for one page, one answer at a time.
#[derive(Debug)]
pub struct HolderSearch {
    candidates: std::vec::IntoIter<u32>,
    any_candidate: bool,
    want: usize,
    holders: Vec<Granted>,
    errors: bool,
}

impl HolderSearch {
    /// `candidates` in membership order (see [`is_candidate`]); `want` is `max_holders` (at least 1).
    pub fn new(candidates: Vec<u32>, want: usize) -> Self {
        HolderSearch {
            any_candidate: !candidates.is_empty(),
            candidates: candidates.into_iter(),
            want: want.max(1),
            holders: Vec::new(),
            errors: false,
        }
    }

    /// The next peer to ask, or `None` when enough pinned it or every candidate was asked.
    pub fn next_peer(&mut self) -> Option<u32> {
        if self.holders.len() >= self.want {
            return None;
        }
        self.candidates.next()
    }

    /// `peer`'s answer to the compare [`Self::next_peer`] chose it for.
    pub fn answer(&mut self, peer: u32, answer: CompareAnswer) {
        match answer {
            CompareAnswer::Pinned { epoch, pin } => self.holders.push(Granted { peer, epoch, pin }),
            CompareAnswer::Mismatch => {}
            CompareAnswer::Failed => self.errors = true,
        }
    }

    pub fn finish(self) -> SearchOutcome {
        if !self.any_candidate {
            SearchOutcome::NoCandidate
        } else if self.holders.is_empty() {
            SearchOutcome::Abandoned { errors: self.errors }
        } else {
            SearchOutcome::Pinned(self.holders)
        }
    }
}

/// The accept rule of a remotified get: bytes `page` fetched from a holder that answered in
/// `answered_epoch` for a pin granted in `granted_epoch` are the page only if the epoch is unchanged,
/// the length is the page's and the content hash is the recorded one. (The transport already refuses
/// to send to a peer in another epoch; the rule checks the epoch it answered in all the same, so no
/// transport can make a get accept bytes from a restarted holder.)
pub fn accept_fetched(
    granted_epoch: u64,
    answered_epoch: u64,
    hash: u128,
    page: &[u8],
    page_len: usize,
) -> bool {
    granted_epoch == answered_epoch && page.len() == page_len && twox_hash::XxHash3_128::oneshot(page) == hash
}

/// Algorithm 3 for one page of content `hash`: asks `candidates` (membership order, see
/// [`is_candidate`]) for a remote compare through `t` until `want` pinned it. Returns the outcome and
/// the number of peers that answered with no equal frame.
pub fn ask_holders<T: PeerTransport + ?Sized>(
    t: &T,
    candidates: Vec<u32>,
    want: usize,
    hash: u128,
    page: &[u8],
    page_size: usize,
) -> (SearchOutcome, u64) {
    let mut search = HolderSearch::new(candidates, want);
    let mut mismatches = 0;
    while let Some(peer) = search.next_peer() {
        let answer = match t.request(peer, &PeerRequest::Compare { hash, page }, None) {
            Ok((epoch, payload)) => match PeerResponse::decode(PeerOp::Compare as u8, &payload, page_size) {
                Ok(PeerResponse::Compared(Some(pin))) => CompareAnswer::Pinned { epoch, pin },
                Ok(_) => {
                    mismatches += 1;
                    CompareAnswer::Mismatch
                }
                Err(_) => CompareAnswer::Failed,
            },
            Err(_) => CompareAnswer::Failed,
        };
        search.answer(peer, answer);
    }
    (search.finish(), mismatches)
}

/// A remotified get: the page's bytes from the first of `holders` (in order) whose answer passes
/// [`accept_fetched`], into `out`; false (a clean miss) when none does. A holder backing off fails at
/// once in the transport, so a dead first holder costs one failed request, then nothing until its
/// back-off ends.
pub fn fetch<T: PeerTransport + ?Sized>(
    t: &T,
    holders: &[Granted],
    hash: u128,
    out: &mut [u8],
    page_size: usize,
) -> bool {
    holders.iter().any(|h| {
        let Ok((epoch, payload)) = t.request(h.peer, &PeerRequest::Fetch { pin: h.pin }, Some(h.epoch))
        else {
            return false;
        };
        match PeerResponse::decode(PeerOp::Fetch as u8, &payload, page_size) {
            Ok(PeerResponse::Fetched(Some(page)))
                if accept_fetched(h.epoch, epoch, hash, page, out.len()) =>
            {
                out.copy_from_slice(page);
                true
            }
            _ => false,
        }
    })
}

/// Sends unpins of `pins` granted by `peer` in `epoch` through `t` (in requests of at most
/// [`MAX_UNPIN`]) and records in `retry` those to send again. Returns the pins the peer released.
/// `retry` is a callback, not the [`UnpinQueue`], so the caller's lock on it is never held across
/// the network.
pub fn unpin<T: PeerTransport + ?Sized>(
    t: &T,
    peer: u32,
    epoch: u64,
    pins: &[u64],
    mut retry: impl FnMut(&[u64], UnpinResult),
) -> u64 {
    let mut sent = 0;
    for chunk in pins.chunks(MAX_UNPIN) {
        let result = match t.request(peer, &PeerRequest::Unpin { pins: chunk.to_vec() }, Some(epoch)) {
            Ok(_) => {
                sent += chunk.len() as u64;
                UnpinResult::Sent
            }
            Err(TransportError::EpochChanged) => UnpinResult::EpochChanged,
            Err(_) => UnpinResult::Failed,
        };
        retry(chunk, result);
    }
    sent
}

/// How an unpin request ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum UnpinResult {
    /// The peer released them.
    Sent,
    /// The peer runs in another epoch: it released them itself when it restarted.
    EpochChanged,
    /// The network or the peer failed: send them again later.
    Failed,
}

/// Unpins waiting to be sent again, by (peer, epoch).
#[derive(Debug, Default)]
pub struct UnpinQueue {
    pending: HashMap<(u32, u64), Vec<u64>>,
}

impl UnpinQueue {
    pub fn new() -> Self {
        Self::default()
    }

    /// Records how sending `pins` to `peer` in `epoch` ended: failed ones are kept for a retry.
    pub fn sent(&mut self, peer: u32, epoch: u64, pins: &[u64], result: UnpinResult) {
        if result == UnpinResult::Failed {
            self.pending.entry((peer, epoch)).or_default().extend_from_slice(pins);
        }
    }

    /// Every pending unpin, to send again (each ends in another [`Self::sent`]).
    pub fn take(&mut self) -> Vec<((u32, u64), Vec<u64>)> {
        self.pending.drain().collect()
    }

    /// Drops the unpins for `peer` in the epochs `dead` says are gone (it restarted or expired: it
    /// has released those pins itself).
    pub fn forget(&mut self, peer: u32, dead: impl Fn(u64) -> bool) {
        self.pending.retain(|(p, e), _| !(*p == peer && dead(*e)));
    }

    /// Pins waiting.
    pub fn len(&self) -> usize {
        self.pending.values().map(Vec::len).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Groups released holders' pins per (peer, epoch), one unpin request each.
pub fn group_unpins(holders: impl IntoIterator<Item = Granted>) -> HashMap<(u32, u64), Vec<u64>> {
    let mut by: HashMap<(u32, u64), Vec<u64>> = HashMap::new();
    for h in holders {
        by.entry((h.peer, h.epoch)).or_default().push(h.pin);
    }
    by
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn back_off_starts_on_no_answer_or_an_ended_session_never_on_an_answer_about_one_request() {
        let t0 = Instant::now();
        let d = Duration::from_millis(100);
        for e in [
            TransportError::Timeout,
            TransportError::Refused,
            TransportError::Closed,
            TransportError::Other("did not prove its name".into()),
            TransportError::Status(PeerStatus::AUTH_FAILED.0),
            TransportError::Status(PeerStatus::NOT_AUTHENTICATED.0),
            TransportError::Status(PeerStatus::TOO_LARGE.0),
            TransportError::Status(PeerStatus::BAD_FRAME.0),
        ] {
            let mut b = Backoff::default();
            assert_eq!(b.check(t0), Ok(()));
            assert!(b.record(&e, t0, d), "{e:?} must start the back-off");
            assert_eq!(b.check(t0 + d / 2), Err(TransportError::Down), "{e:?}");
            assert_eq!(b.remaining(t0 + d / 2), d / 2);
            assert_eq!(b.check(t0 + d), Ok(()), "{e:?}: the back-off ends");
        }
        for e in [
            TransportError::Down,
            TransportError::EpochChanged,
            TransportError::Status(PeerStatus::MALFORMED.0),
            TransportError::Status(PeerStatus::UNKNOWN_OP.0),
            TransportError::Status(PeerStatus::REFUSED.0),
            // A status this version does not know is still an answer.
            TransportError::Status(999),
        ] {
            let mut b = Backoff::default();
            assert!(!b.record(&e, t0, d), "{e:?} must not start the back-off");
            assert_eq!(b.check(t0), Ok(()), "{e:?}");
        }
        // Requests refused while down do not extend it; a publication's heartbeat ends it early.
        let mut b = Backoff::default();
        b.record(&TransportError::Timeout, t0, d);
        b.record(&TransportError::Down, t0 + d / 2, d);
        assert_eq!(b.check(t0 + d), Ok(()));
        b.record(&TransportError::Closed, t0 + d, d);
        b.clear();
        assert_eq!(b.check(t0 + d), Ok(()));
    }

    #[test]
    fn a_restart_or_a_silence_past_the_ttl_forgets_references_once() {
        let t0 = Instant::now();
        let ttl = Duration::from_millis(100);
        let mut l = Liveness::new(t0);
        // Never reached: nothing to forget, however long.
        assert_eq!(l.expire(t0 + ttl * 10, ttl), Forget::Nothing);
        assert_eq!(l.connected(7), Forget::Nothing);
        assert_eq!(l.connected(7), Forget::Nothing);
        l.answered(t0 + ttl * 10);
        assert_eq!(l.expire(t0 + ttl * 10 + ttl / 2, ttl), Forget::Nothing);
        // A restart: only the new epoch's pins are alive.
        let f = l.connected(8);
        assert_eq!(f, Forget::EpochsBut { alive: 8 });
        assert!(f.is_dead(7) && !f.is_dead(8));
        // Silence past the TTL: everything, once.
        let f = l.expire(t0 + ttl * 11, ttl);
        assert_eq!(f, Forget::Everything);
        assert!(f.is_dead(8));
        assert_eq!(l.epoch(), 0);
        assert_eq!(l.expire(t0 + ttl * 20, ttl), Forget::Nothing);
        // Back in the same epoch after being forgotten: nothing more to forget.
        assert_eq!(l.connected(8), Forget::Nothing);
    }
}
