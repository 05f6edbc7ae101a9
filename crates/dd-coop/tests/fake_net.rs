//! The co-operative decisions (`dd_coop::peers`, `dd_coop::pins`) over a fake network: peers that answer
//! with the listener's real handler (`dd_coop::serve`) over a real `PinTable` and frames by content
//! hash, reached through a `PeerTransport` that loses requests
//! and responses, delays messages (delivered later, out of order), duplicates them, refuses while a
//! peer is down and restarts peers with a new epoch, every choice drawn from a seeded generator. No
//! sockets, no threads, no clocks: time is a counter advanced per request.

use dd_coop::peers::{self, accept_fetched, Backoff, Granted, SearchOutcome, UnpinQueue, UnpinResult};
use dd_coop::serve::{self, Served};
use dd_coop::testing::MemHost;
use dd_coop::transport::{PeerTransport, TransportError};
use dd_coop::wire::{parse_header, PeerRequest, PeerStatus, ABSOLUTE_MAX_PAYLOAD, HEADER_LEN};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::time::{Duration, Instant};

const PAGE: usize = 64;
const ME: &str = "me";
const BACKOFF: Duration = Duration::from_millis(50);
const TTL: Duration = Duration::from_millis(1000);

struct FakePeer {
    epoch: u64,
    /// Its engine and pin table, as the listener's handler sees them.
    host: MemHost,
    /// Whether our HELLO reached it in its current epoch.
    greeted: bool,
    up: bool,
    delivered: usize,
}

impl FakePeer {
    fn new(epoch: u64, frames: &HashMap<u128, Vec<u8>>) -> Self {
        FakePeer {
            epoch,
            host: MemHost::new(PAGE, frames.clone(), epoch),
            greeted: false,
            up: true,
            delivered: 0,
        }
    }
}

#[derive(Clone, Copy, Default)]
struct Faults {
    lose_request: f64,
    lose_response: f64,
    delay: f64,
    duplicate: f64,
}

struct FakeNet {
    my_epoch: Cell<u64>,
    peers: RefCell<Vec<FakePeer>>,
    backoff: RefCell<Vec<Backoff>>,
    rng: RefCell<ChaCha8Rng>,
    faults: Faults,
    /// Requests delayed in the network: (peer, encoded frame), delivered later in random order.
    delayed: RefCell<Vec<(u32, Vec<u8>)>>,
    now: Cell<Instant>,
    next_id: Cell<u64>,
}

fn page(i: u64) -> Vec<u8> {
    (0..PAGE as u64).map(|b| (i * 31 + b * 7) as u8).collect()
}

fn hash(p: &[u8]) -> u128 {
    twox_hash::XxHash3_128::oneshot(p)
}

impl FakeNet {
    fn new(seed: u64, peers: usize, pages: u64, faults: Faults) -> Self {
        let frames: HashMap<u128, Vec<u8>> = (0..pages).map(|i| (hash(&page(i)), page(i))).collect();
        FakeNet {
            my_epoch: Cell::new(1),
            peers: RefCell::new((0..peers).map(|i| FakePeer::new(100 + i as u64, &frames)).collect()),
            backoff: RefCell::new(vec![Backoff::default(); peers]),
            rng: RefCell::new(ChaCha8Rng::seed_from_u64(seed)),
            faults,
            delayed: RefCell::new(Vec::new()),
            now: Cell::new(Instant::now()),
            next_id: Cell::new(1),
        }
    }

    fn roll(&self, p: f64) -> bool {
        p > 0.0 && self.rng.borrow_mut().gen_bool(p)
    }

    fn advance(&self, d: Duration) {
        self.now.set(self.now.get() + d);
    }

    /// The peer handles one request frame (as the daemon's listener would) and returns the response
    /// payload, or the status of an error answer.
    fn deliver(&self, idx: u32, frame: &[u8]) -> Result<Vec<u8>, u16> {
        let now = self.now.get();
        let mut peers = self.peers.borrow_mut();
        let p = &mut peers[idx as usize];
        if !p.up {
            // Only a delayed frame meets a peer that went down since it was sent (`send` checks
            // first), and its answer is dropped: the frame is lost with the connection.
            return Err(PeerStatus::BAD_FRAME.0);
        }
        p.delivered += 1;
        if !p.greeted {
            // The connection's handshake: a new epoch of ours releases what the old one held.
            let released = p.host.state_mut().table.hello(ME, self.my_epoch.get(), now);
            p.host.release(released);
            p.greeted = true;
        }
        let h = parse_header(&frame[..HEADER_LEN], ABSOLUTE_MAX_PAYLOAD).unwrap().unwrap();
        let mut out = Vec::new();
        let served = serve::handle(&p.host, ME, self.my_epoch.get(), &h, &frame[HEADER_LEN..], now, &mut out);
        p.host.check();
        // An error answer (status other than 0) is what the daemon's client turns into a failure.
        let answer = parse_header(&out[..HEADER_LEN], ABSOLUTE_MAX_PAYLOAD).unwrap().unwrap();
        if matches!(served, Served::Refused) {
            assert_ne!(answer.status, 0);
        }
        if answer.status == 0 {
            Ok(out[HEADER_LEN..].to_vec())
        } else {
            Err(answer.status)
        }
    }

    /// Delivers some of the delayed requests (a random one at a time: reordered), responses lost.
    fn drain_some_delayed(&self) {
        while !self.delayed.borrow().is_empty() && self.roll(0.5) {
            let i = self.rng.borrow_mut().gen_range(0..self.delayed.borrow().len());
            let (peer, frame) = self.delayed.borrow_mut().swap_remove(i);
            let _ = self.deliver(peer, &frame);
        }
    }

    fn drain_all_delayed(&self) {
        while let Some((peer, frame)) = self.delayed.borrow_mut().pop() {
            let _ = self.deliver(peer, &frame);
        }
    }

    fn restart(&self, idx: u32, frames: &HashMap<u128, Vec<u8>>) {
        let mut peers = self.peers.borrow_mut();
        let epoch = peers[idx as usize].epoch + 1000;
        peers[idx as usize] = FakePeer::new(epoch, frames);
    }

    /// We restarted: a new epoch, greeted again on every peer's next request.
    fn restart_me(&self) {
        self.my_epoch.set(self.my_epoch.get() + 1);
        for p in self.peers.borrow_mut().iter_mut() {
            p.greeted = false;
        }
    }

    fn pins_held(&self) -> usize {
        self.peers.borrow().iter().map(|p| p.host.state().table.len()).sum()
    }
}

/// The daemon's `request`: the back-off gate of `dd_coop::peers` (the daemon's rule, not a copy of
/// it) around the epoch guard and the network.
impl PeerTransport for FakeNet {
    fn request(
        &self,
        peer: u32,
        req: &PeerRequest<'_>,
        epoch: Option<u64>,
    ) -> Result<(u64, Vec<u8>), TransportError> {
        self.advance(Duration::from_millis(1));
        let now = self.now.get();
        self.backoff.borrow()[peer as usize].check(now)?;
        let r = self.send(peer, req, epoch);
        if let Err(e) = &r {
            self.backoff.borrow_mut()[peer as usize].record(e, now, BACKOFF);
        }
        r
    }
}

impl FakeNet {
    /// One request through the faulty network, without the back-off gate.
    fn send(
        &self,
        peer: u32,
        req: &PeerRequest<'_>,
        epoch: Option<u64>,
    ) -> Result<(u64, Vec<u8>), TransportError> {
        let (up, peer_epoch) = {
            let peers = self.peers.borrow();
            (peers[peer as usize].up, peers[peer as usize].epoch)
        };
        if !up {
            return Err(TransportError::Refused);
        }
        if epoch.is_some_and(|e| e != peer_epoch) {
            return Err(TransportError::EpochChanged);
        }
        self.drain_some_delayed();
        let id = self.next_id.get();
        self.next_id.set(id + 1);
        let mut frame = Vec::new();
        req.encode(id, &mut frame);
        if self.roll(self.faults.lose_request) {
            return Err(TransportError::Timeout);
        }
        if self.roll(self.faults.delay) {
            self.delayed.borrow_mut().push((peer, frame));
            return Err(TransportError::Timeout);
        }
        let payload = self.deliver(peer, &frame).map_err(TransportError::Status)?;
        if self.roll(self.faults.duplicate) {
            let _ = self.deliver(peer, &frame);
        }
        if self.roll(self.faults.lose_response) {
            return Err(TransportError::Closed);
        }
        Ok((peer_epoch, payload))
    }
}

fn lossy() -> Faults {
    Faults { lose_request: 0.1, lose_response: 0.1, delay: 0.1, duplicate: 0.1 }
}

/// Remotifies `pages` pages (Algorithm 3 over every peer, `want` holders), letting back-offs end.
fn remotify_all(net: &FakeNet, pages: u64, want: usize) -> Vec<(u128, Vec<Granted>)> {
    let peers = net.peers.borrow().len() as u32;
    let mut refs = Vec::new();
    for i in 0..pages {
        let p = page(i);
        let (outcome, _) = peers::ask_holders(net, (0..peers).collect(), want, hash(&p), &p, PAGE);
        if let SearchOutcome::Pinned(holders) = outcome {
            assert!(holders.len() <= want);
            refs.push((hash(&p), holders));
        }
        net.advance(Duration::from_millis(5));
    }
    refs
}

fn release(net: &FakeNet, queue: &mut UnpinQueue, holders: impl IntoIterator<Item = Granted>) {
    for ((peer, epoch), pins) in peers::group_unpins(holders) {
        peers::unpin(net, peer, epoch, &pins, |chunk, r| queue.sent(peer, epoch, chunk, r));
    }
}

#[test]
fn no_pin_leaks_after_a_restart_or_silence_past_the_ttl() {
    for seed in 0..16 {
        for restart in [true, false] {
            let net = FakeNet::new(seed, 3, 40, lossy());
            let refs = remotify_all(&net, 40, 2);
            assert!(!refs.is_empty(), "seed {seed}: nothing was remotified");
            // Release half the references (some unpins get lost; they are not retried here).
            let mut queue = UnpinQueue::new();
            release(&net, &mut queue, refs.iter().step_by(2).flat_map(|(_, h)| h.iter().copied()));
            net.drain_all_delayed();
            assert!(net.pins_held() > 0);
            let t = net.now.get();
            for p in net.peers.borrow_mut().iter_mut() {
                let released = if restart {
                    // We restarted: our HELLO in a new epoch releases everything the old one held.
                    p.host.state_mut().table.hello(ME, 999, t)
                } else {
                    // We fell silent: the TTL releases it all.
                    p.host.state_mut().table.expire(t + TTL, TTL)
                };
                p.host.release(released);
                let left = p.host.state().engine.len();
                assert_eq!(left, 0, "seed {seed}: {left} engine pins leaked");
                p.host.check();
            }
        }
    }
}

/// Regression (issue 15; found while writing the peer_handler fuzz target): a peer silent past the pin
/// TTL lost its pin-table entry at the listener while its connection stayed open, and every compare on
/// that connection was then answered "say hello again", which neither ends the session nor starts a
/// back-off: remotification to that peer stopped for as long as the connection lived.
#[test]
fn regression_a_connection_that_outlived_its_pin_ttl_entry_was_refused_every_compare() {
    let net = FakeNet::new(11, 1, 20, Faults::default());
    assert_eq!(remotify_all(&net, 10, 1).len(), 10);
    // Silence past the TTL: the listener forgets us and releases our pins; the connection stays
    // (no new HELLO is sent: `greeted` stays true).
    net.advance(TTL);
    {
        let peers = net.peers.borrow();
        let t = net.now.get();
        let released = peers[0].host.state_mut().table.expire(t, TTL);
        assert_eq!(released.len(), 10);
        peers[0].host.release(released);
    }
    // The same session asks again: its next request renews its entry and the compares pin.
    let refs = remotify_all(&net, 20, 1);
    assert_eq!(refs.len(), 20, "compares on a connection that outlived its entry were refused");
    assert_eq!(net.pins_held(), 20);
    net.peers.borrow()[0].host.check();
}

#[test]
fn a_restart_of_ours_releases_pins_at_the_next_hello() {
    let net = FakeNet::new(7, 2, 20, Faults::default());
    assert_eq!(remotify_all(&net, 20, 2).len(), 20);
    assert_eq!(net.pins_held(), 40);
    net.restart_me();
    // Any request carries the new HELLO: a compare that matches nothing releases the old epoch's pins.
    let other = vec![0xAAu8; PAGE];
    for peer in 0..2 {
        peers::ask_holders(&net, vec![peer], 1, hash(&other), &other, PAGE);
    }
    assert_eq!(net.pins_held(), 0);
    for p in net.peers.borrow().iter() {
        assert!(p.host.state().engine.is_empty());
    }
}

#[test]
fn back_off_skips_a_failed_peer_and_retries_it_after_the_back_off() {
    let net = FakeNet::new(1, 2, 4, Faults::default());
    net.peers.borrow_mut()[0].up = false;
    let p = page(0);
    let (outcome, _) = peers::ask_holders(&net, vec![0, 1], 1, hash(&p), &p, PAGE);
    // Peer 0 refused; peer 1, next in order, holds it.
    let SearchOutcome::Pinned(holders) = outcome else { panic!("{outcome:?}") };
    assert_eq!(holders.iter().map(|h| h.peer).collect::<Vec<_>>(), vec![1]);
    // Peer 0 is back, but skipped (nothing delivered) until its back-off ends.
    net.peers.borrow_mut()[0].up = true;
    let p = page(1);
    let (outcome, _) = peers::ask_holders(&net, vec![0], 1, hash(&p), &p, PAGE);
    assert_eq!(outcome, SearchOutcome::Abandoned { errors: true });
    assert_eq!(net.peers.borrow()[0].delivered, 0);
    net.advance(BACKOFF);
    let (outcome, _) = peers::ask_holders(&net, vec![0], 1, hash(&p), &p, PAGE);
    assert!(matches!(outcome, SearchOutcome::Pinned(ref h) if h[0].peer == 0), "{outcome:?}");
    assert_eq!(net.peers.borrow()[0].delivered, 1);
    // A publication's heartbeat ends a back-off early.
    let mut b = Backoff::default();
    let t = Instant::now();
    b.failed(t, BACKOFF);
    assert!(b.is_down(t + BACKOFF / 2));
    assert!(!b.is_down(t + BACKOFF));
    b.clear();
    assert!(!b.is_down(t));
}

#[test]
fn holders_come_in_membership_order_up_to_max_holders() {
    let net = FakeNet::new(2, 4, 4, Faults::default());
    let p = page(2);
    // Peer 1 does not hold it (a Bloom false positive): a mismatch, and the search goes on.
    net.peers.borrow()[1].host.state_mut().frames.clear();
    let (outcome, mismatches) = peers::ask_holders(&net, vec![3, 1, 0, 2], 2, hash(&p), &p, PAGE);
    let SearchOutcome::Pinned(holders) = outcome else { panic!() };
    assert_eq!(holders.iter().map(|h| h.peer).collect::<Vec<_>>(), vec![3, 0]);
    assert_eq!(mismatches, 1);
    assert_eq!(net.peers.borrow()[2].delivered, 0, "asked past max_holders");
    assert_eq!(peers::ask_holders(&net, vec![], 2, hash(&p), &p, PAGE).0, SearchOutcome::NoCandidate);
    assert_eq!(
        peers::ask_holders(&net, vec![1], 2, hash(&p), &p, PAGE).0,
        SearchOutcome::Abandoned { errors: false }
    );
}

#[test]
fn a_get_never_accepts_bytes_from_a_restarted_holder_or_with_another_hash() {
    for seed in 0..16 {
        let net = FakeNet::new(seed, 3, 30, lossy());
        let frames: HashMap<u128, Vec<u8>> = (0..30).map(|i| (hash(&page(i)), page(i))).collect();
        let refs = remotify_all(&net, 30, 3);
        let mut rng = ChaCha8Rng::seed_from_u64(seed ^ 0x5eed);
        for (i, (h, holders)) in refs.iter().enumerate() {
            // Break some holders: a restart (new epoch, same content) or bytes that hash otherwise.
            for g in holders {
                match rng.gen_range(0..4) {
                    0 => net.restart(g.peer, &frames),
                    1 => net.peers.borrow()[g.peer as usize].host.state_mut().corrupt = true,
                    _ => {}
                }
            }
            let mut out = vec![0u8; PAGE];
            if peers::fetch(&net, holders, *h, &mut out, PAGE) {
                assert_eq!(hash(&out), *h, "seed {seed} ref {i}: accepted wrong bytes");
                let ok = holders.iter().any(|g| {
                    let peers = net.peers.borrow();
                    peers[g.peer as usize].epoch == g.epoch && !peers[g.peer as usize].host.state().corrupt
                });
                assert!(ok, "seed {seed} ref {i}: a hit from no intact holder");
            }
            for p in net.peers.borrow().iter() {
                p.host.state_mut().corrupt = false;
            }
            net.advance(BACKOFF);
        }
    }
    // The rule itself.
    let p = page(3);
    assert!(accept_fetched(5, 5, hash(&p), &p, PAGE));
    assert!(!accept_fetched(5, 6, hash(&p), &p, PAGE));
    assert!(!accept_fetched(5, 5, hash(&p) ^ 1, &p, PAGE));
    assert!(!accept_fetched(5, 5, hash(&p[..32]), &p[..32], PAGE));
}

#[test]
fn unpins_lost_in_transit_are_retried_until_released() {
    for seed in 0..16 {
        let faults = Faults { lose_request: 0.3, lose_response: 0.2, delay: 0.1, duplicate: 0.2 };
        let net = FakeNet::new(seed, 3, 40, Faults::default());
        let refs = remotify_all(&net, 40, 2);
        let granted: Vec<Granted> = refs.iter().flat_map(|(_, h)| h.iter().copied()).collect();
        assert_eq!(net.pins_held(), granted.len());
        let net = FakeNet { faults, ..net };
        let mut queue = UnpinQueue::new();
        release(&net, &mut queue, granted.iter().copied());
        let mut rounds = 0;
        while !queue.is_empty() {
            rounds += 1;
            assert!(rounds < 200, "seed {seed}: unpins never got through");
            net.advance(BACKOFF);
            for ((peer, epoch), pins) in queue.take() {
                peers::unpin(&net, peer, epoch, &pins, |chunk, r| queue.sent(peer, epoch, chunk, r));
            }
        }
        net.drain_all_delayed();
        let peers = net.peers.borrow();
        for g in &granted {
            assert_eq!(
                peers[g.peer as usize].host.state().table.lookup(ME, g.pin),
                None,
                "seed {seed}: {g:?} leaked"
            );
        }
        assert_eq!(net.pins_held(), 0);
    }
    // A peer that restarted released them itself: nothing is retried for its old epoch.
    let mut queue = UnpinQueue::new();
    queue.sent(0, 1, &[1, 2], UnpinResult::Failed);
    queue.sent(0, 1, &[3], UnpinResult::EpochChanged);
    queue.sent(1, 1, &[4], UnpinResult::Sent);
    assert_eq!(queue.len(), 2);
    queue.forget(0, |e| e == 1);
    assert!(queue.is_empty());
}

#[test]
fn the_listener_pins_nothing_past_max_pins_or_for_a_stale_session() {
    let frames: HashMap<u128, Vec<u8>> = (0..4).map(|i| (hash(&page(i)), page(i))).collect();
    let host = MemHost::new(PAGE, frames, 3);
    let t0 = Instant::now();
    host.state_mut().table.hello(ME, 1, t0);
    host.state_mut().max_pins = 1;
    let ask = |i: u64, epoch: u64, now: Instant| {
        let p = page(i);
        let mut frame = Vec::new();
        PeerRequest::Compare { hash: hash(&p), page: &p }.encode(1, &mut frame);
        let h = parse_header(&frame[..HEADER_LEN], ABSOLUTE_MAX_PAYLOAD).unwrap().unwrap();
        let mut out = Vec::new();
        let served = serve::handle(&host, ME, epoch, &h, &frame[HEADER_LEN..], now, &mut out);
        let status = parse_header(&out[..HEADER_LEN], ABSOLUTE_MAX_PAYLOAD).unwrap().unwrap().status;
        (served, status, out)
    };
    let (served, status, _) = ask(0, 1, t0);
    assert!(matches!(served, Served::Compared { pinned: true }) && status == 0);
    // Full: an equal frame, but no pin.
    let (served, status, out) = ask(1, 1, t0);
    assert!(matches!(served, Served::Compared { pinned: false }) && status == 0);
    assert_eq!(
        dd_coop::wire::PeerResponse::decode(out[3], &out[HEADER_LEN..], PAGE).unwrap(),
        dd_coop::wire::PeerResponse::Compared(None)
    );
    // The peer restarted and authenticated in epoch 2 elsewhere: a compare of the old session pins
    // nothing it could keep (the pin is released at once and the compare refused).
    host.state_mut().max_pins = 10;
    let released = host.state_mut().table.hello(ME, 2, t0);
    host.release(released);
    let (served, status, _) = ask(2, 1, t0);
    assert!(matches!(served, Served::Compared { pinned: true }));
    assert_eq!(status, PeerStatus::REFUSED.0);
    assert!(host.state().engine.is_empty(), "a pin nobody can release was kept");
    host.check();
}
