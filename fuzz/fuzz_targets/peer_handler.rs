//! Fuzz target: the peer listener's answer to authenticated requests (`dd_coop::serve::handle`,
//! Algorithm 4) over an in-memory host (`dd_coop::testing::MemHost`: frames by hash, the real pin
//! table), checked after every request against a model of the pins (issue 15, item 3; issue 17,
//! item 4).
//!
//! The input is a pin limit and a sequence of steps (`dd_fuzz::peer_handler`), `arbitrary`-derived: requests of two
//! authenticated peers (`a`, `b`) and of a session whose pin-table entry is gone (`m`, as after the
//! TTL removed it while the connection stayed open) — compares of held, absent,
//! altered pages or with the wrong hash, fetches and unpins of handles granted to any peer (so a peer
//! reaches for another's pins) or made up, summaries, HELLO and AUTH after authentication, raw ops
//! with raw payloads — some with one byte of the encoded payload flipped; and, between requests, a
//! peer's new HELLO (same or new epoch; on the same connection, or on another while the old session
//! goes on asking) and time passing with the pin TTL's expiry.
//!
//! The model follows what the handler was given, not the typed step: each payload is decoded as the
//! handler decodes it, so a flipped or raw payload is modelled as whatever it decodes to. It holds
//! each peer's session epoch and, per peer with a pin-table entry, its epoch, when it was last heard
//! from and its handles with the content hash pinned under each; a well-formed request of a session
//! whose entry is gone enters it again. After every request:
//! * the engine's pins are exactly the pin table's (`MemHost::check`: no pin without an owner), never
//!   more than `max_pins`, and every modelled handle names an engine pin of its content;
//! * the answer is one frame answering the request (response flag, op and id echoed), within the frame
//!   bound a client reads (`max(page + 64, 4096)` bytes of payload), an error exactly when the request
//!   cannot be served;
//! * a fetch returns bytes only for the peer's own handle, and then the bytes of the frame pinned under
//!   it (their hash is the one the compare pinned); an own handle is always served;
//! * an unpin releases exactly the peer's own handles among those listed, and nothing of another peer;
//! * a compare pins exactly when an equal frame is held under that hash, the limit allows it and the
//!   session's epoch is the entry's (a stale session's pin is released at once and the compare
//!   refused: nothing stays pinned for it).
//!
//! The state is fresh per input, so that a crash reproduces from its input alone.
#![no_main]

use dd_coop::serve::{self, PinHost, Served};
use dd_coop::testing::MemHost;
use dd_coop::wire::{
    max_answer_payload, parse_header, PeerHeader, PeerRequest, PeerResponse, ABSOLUTE_MAX_PAYLOAD,
    FLAG_RESPONSE, HEADER_LEN,
};
use dd_fuzz::peer_handler::{Handle, Input, Req, Step, Who, HELD, PAGES};
use libfuzzer_sys::fuzz_target;
use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

/// A small page keeps compares and fetches cheap and reachable.
const PAGE: usize = 64;
const TTL: Duration = Duration::from_millis(1000);

fn page(i: u8) -> Vec<u8> {
    (0..PAGE as u32).map(|b| (i as u32 * 31 + b * 7) as u8).collect()
}

/// The content hash of de-duplication (what a compare names and a fetch is checked against).
fn hash(p: &[u8]) -> u128 {
    xxhash_rust::xxh3::xxh3_128(p)
}

/// The name of each requester (`Who::A`, `B`, `M`).
const PEERS: [&str; 3] = ["a", "b", "m"];

fn peer_name(w: Who) -> &'static str {
    PEERS[w as usize]
}

/// A peer's pin-table entry as the model sees it.
#[derive(Debug)]
struct Owner {
    epoch: u64,
    heard: Instant,
    /// Handle → content hash of the frame pinned under it.
    pins: BTreeMap<u64, u128>,
}

struct Model {
    owners: HashMap<&'static str, Owner>,
    /// The epoch each peer's requesting session authenticated in.
    sessions: HashMap<&'static str, u64>,
}

impl Model {
    /// Every handle granted so far that is still held, for steps to name.
    fn handles(&self) -> Vec<u64> {
        let mut v: Vec<u64> = self.owners.values().flat_map(|o| o.pins.keys().copied()).collect();
        v.sort_unstable();
        v
    }

    fn resolve(&self, h: Handle) -> u64 {
        match h {
            Handle::Granted(i) => {
                let all = self.handles();
                if all.is_empty() {
                    1
                } else {
                    all[i as usize % all.len()]
                }
            }
            Handle::Raw(v) => v,
        }
    }

    fn pins(&self) -> usize {
        self.owners.values().map(|o| o.pins.len()).sum()
    }
}

/// Encodes the typed request as the bytes a peer would send: (op, payload).
fn encode(model: &Model, req: &Req) -> (u8, Vec<u8>) {
    let mut frame = Vec::new();
    let bits;
    let p;
    let r = match req {
        Req::Compare { page: i, alter, wrong_hash } => {
            let mut bytes = page(i % PAGES);
            let h = hash(&bytes) ^ *wrong_hash as u128;
            if let Some(at) = alter {
                bytes[*at as usize % PAGE] ^= 0x5a;
            }
            p = bytes;
            PeerRequest::Compare { hash: h, page: &p }
        }
        Req::Fetch(h) => PeerRequest::Fetch { pin: model.resolve(*h) },
        Req::Unpin(hs) => PeerRequest::Unpin { pins: hs.iter().map(|h| model.resolve(*h)).collect() },
        Req::Summary { bytes, k, skew } => {
            bits = vec![0xa5u8; *bytes as usize];
            PeerRequest::Summary {
                m_bits: (*bytes as u64 * 8).wrapping_add(*skew as u64),
                k_hashes: *k as u32,
                bits: &bits,
            }
        }
        Req::Hello { epoch } => PeerRequest::Hello { name: "a", epoch: *epoch, nonce: [7; 32] },
        Req::Auth => PeerRequest::Auth { signature: [9; 64] },
        Req::Raw { op, payload } => return (*op, payload.clone()),
    };
    r.encode(1, &mut frame);
    (frame[3], frame[HEADER_LEN..].to_vec())
}

fn check(host: &MemHost, model: &Model) {
    host.check();
    assert!(
        host.pins_held() <= host.max_pins(),
        "{} pins held past max_pins {}",
        host.pins_held(),
        host.max_pins()
    );
    let s = host.state();
    assert_eq!(s.table.len(), model.pins(), "the pin table and the model disagree");
    for (name, o) in &model.owners {
        assert_eq!(s.table.pins_of(name), o.pins.len(), "pins of {name}");
        for (&handle, &h) in &o.pins {
            let pin =
                s.table.lookup(name, handle).unwrap_or_else(|| panic!("{name}'s handle {handle} is gone"));
            assert_eq!(s.engine.get(&pin), Some(&h), "{name}'s handle {handle} pins other content");
        }
    }
}

/// Sends one request of `from` and checks the answer against the model, which it then updates.
fn request(host: &MemHost, model: &mut Model, now: Instant, from: Who, op: u8, payload: &[u8], id: u64) {
    let name = peer_name(from);
    let h = PeerHeader { op, flags: 0, status: 0, request_id: id, payload_len: payload.len() as u32 };
    let held_before = host.pins_held();
    let mut out = Vec::new();
    let epoch = model.sessions[name];
    let served = serve::handle(host, name, epoch, &h, payload, now, &mut out);
    // One frame, answering this request, within the bound a client reads.
    let a = parse_header(&out, ABSOLUTE_MAX_PAYLOAD).expect("answer header").expect("whole header");
    assert_eq!(a.payload_len as usize, out.len() - HEADER_LEN, "one frame");
    assert!(
        a.payload_len as usize <= max_answer_payload(PAGE),
        "answer of {} bytes past the bound",
        a.payload_len
    );
    assert!(a.flags & FLAG_RESPONSE != 0 && a.op == op && a.request_id == id, "{a:?} does not answer {h:?}");
    // An error answer is a refusal, but for a compare whose pin was released at once because the
    // session is stale (`Served` counts it as pinned; checked below).
    let stale = model.owners.get(name).is_some_and(|o| o.epoch != epoch);
    let released_at_once = matches!(served, Served::Compared { pinned: true }) && stale;
    assert_eq!(
        matches!(served, Served::Refused) || released_at_once,
        a.status != 0,
        "{served:?} with status {}",
        a.status
    );
    let answer = &out[HEADER_LEN..];
    let Ok(req) = PeerRequest::decode(op, payload, PAGE) else {
        assert_ne!(a.status, 0, "a payload that does not decode was served");
        return;
    };
    // Any well-formed request keeps its session's pins alive, and enters a session whose entry is
    // gone again.
    let o = model.owners.entry(name).or_insert(Owner { epoch, heard: now, pins: BTreeMap::new() });
    if o.epoch == epoch {
        o.heard = now;
    }
    match req {
        PeerRequest::Hello { .. } | PeerRequest::Auth { .. } => {
            assert_ne!(a.status, 0, "a second handshake was served")
        }
        PeerRequest::Summary { m_bits, k_hashes, .. } => {
            let cfg = dd_coop::BloomConfig { m_bits, k_hashes, removal: dd_coop::Removal::NoUnset };
            let valid = dd_coop::BloomFilter::from_summary(cfg, &vec![0; (m_bits / 8) as usize]).is_ok();
            assert_eq!(a.status == 0, valid, "summary of {m_bits} bits, {k_hashes} hashes");
        }
        PeerRequest::Compare { hash: h, page: p } => {
            let held = host.state().frames.get(&h).is_some_and(|f| f == p);
            let room = held_before < host.max_pins();
            match model.owners.get_mut(name).filter(|o| o.epoch == epoch) {
                Some(o) => {
                    assert_eq!(a.status, 0);
                    let resp = PeerResponse::decode(op, answer, PAGE).expect("compare answer");
                    match resp {
                        PeerResponse::Compared(Some(handle)) => {
                            assert!(held && room, "pinned: held {held}, room {room}");
                            assert!(
                                o.pins.insert(handle, h).is_none(),
                                "handle {handle} granted twice to {name}"
                            );
                        }
                        PeerResponse::Compared(None) => {
                            assert!(!(held && room), "an equal frame with room was not pinned")
                        }
                        other => panic!("compare answered {other:?}"),
                    }
                }
                // A stale session: nothing may stay pinned for it (refused if a pin was taken and
                // released).
                None => assert_eq!(a.status != 0, held && room, "a stale session's compare"),
            }
        }
        PeerRequest::Fetch { pin: handle } => {
            assert_eq!(a.status, 0);
            let own = model.owners.get(name).and_then(|o| o.pins.get(&handle).copied());
            match (PeerResponse::decode(op, answer, PAGE).expect("fetch answer"), own) {
                (PeerResponse::Fetched(Some(bytes)), Some(h)) => {
                    assert_eq!(hash(bytes), h, "fetched other bytes")
                }
                (PeerResponse::Fetched(Some(_)), None) => {
                    panic!("{name} fetched handle {handle}, not its own")
                }
                (PeerResponse::Fetched(None), Some(_)) => {
                    panic!("{name}'s own handle {handle} was not served")
                }
                (PeerResponse::Fetched(None), None) => {}
                (other, _) => panic!("fetch answered {other:?}"),
            }
        }
        PeerRequest::Unpin { pins } => {
            assert_eq!(a.status, 0);
            let mut released = 0u32;
            if let Some(o) = model.owners.get_mut(name) {
                for handle in pins {
                    released += o.pins.remove(&handle).is_some() as u32;
                }
            }
            assert_eq!(
                PeerResponse::decode(op, answer, PAGE).expect("unpin answer"),
                PeerResponse::Unpinned(released)
            );
        }
    }
}

fuzz_target!(|input: Input| {
    let frames: HashMap<u128, Vec<u8>> = (0..HELD).map(|i| (hash(&page(i)), page(i))).collect();
    let host = MemHost::new(PAGE, frames, 1);
    host.state_mut().max_pins = input.max_pins as u64 % 16;
    let mut now = Instant::now();
    let mut model = Model { owners: HashMap::new(), sessions: PEERS.iter().map(|&p| (p, 1)).collect() };
    for name in ["a", "b"] {
        host.state_mut().table.hello(name, 1, now);
        model.owners.insert(name, Owner { epoch: 1, heard: now, pins: BTreeMap::new() });
    }
    for (id, step) in input.steps.iter().take(256).enumerate() {
        match step {
            Step::Request { from, req, flip } => {
                let (op, mut payload) = encode(&model, req);
                if let Some((at, x)) = flip {
                    if !payload.is_empty() {
                        let at = *at as usize % payload.len();
                        payload[at] ^= x;
                    }
                }
                request(&host, &mut model, now, *from, op, &payload, id as u64);
            }
            Step::Reconnect { from, epoch, stale } => {
                let name = peer_name(*from);
                let epoch = *epoch as u64 % 3;
                if !stale {
                    model.sessions.insert(name, epoch);
                }
                let released = host.state_mut().table.hello(name, epoch, now);
                host.release(released);
                let o =
                    model.owners.entry(name).or_insert(Owner { epoch, heard: now, pins: BTreeMap::new() });
                o.heard = now;
                if o.epoch != epoch {
                    o.epoch = epoch;
                    o.pins.clear();
                }
            }
            Step::Wait { ms } => {
                now += Duration::from_millis(*ms as u64);
                let released = host.state_mut().table.expire(now, TTL);
                host.release(released);
                model.owners.retain(|_, o| now.saturating_duration_since(o.heard) < TTL);
            }
        }
        check(&host, &model);
    }
});
