//! Peers that cannot be hijacked or starved (issue 30, items 1-3): one member holding every session of
//! a peer listener, a flood of silent connections against a member's slow handshake, and a relay that
//! injects its own frame into a member's session. Each test reproduces the attack the review ran.

mod common;
mod coopkit;

use common::vm;
use coopkit::*;
use dd_bench::relay::Relay;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

fn relay(to: u16, delay: Duration) -> Relay {
    Relay::start(to, delay).unwrap()
}

/// Item 1: node c, a member, held 64 idle sessions on b (all of the listener's) and a, restarted
/// meanwhile, reached b in 0 of 5 publishes. Now each node holds at most `coop.max_sessions_per_peer`
/// (8) sessions and the others are not held back.
#[test]
fn regression_one_member_holds_every_peer_session() {
    let v = vm(1);
    let (a, b, c) = (node("a"), node("b"), node("c"));
    let db = start_node(&b, &[&a, &c], &v, 1024);
    let mut held = Vec::new();
    for _ in 0..80 {
        let mut s = peer_conn(b.port);
        if peer_handshake(&mut s, "c", 5, &c.key) == Some(0) {
            held.push(s);
        }
    }
    assert!(held.len() <= 8, "c holds {} sessions on b", held.len());
    let da = start_node(&a, &[&b], &v, 1024);
    for _ in 0..5 {
        publish(&da, 1);
    }
    drop((held, db));
}

/// Connections from `127.0.0.2` (not a member's address) to `port`, opened as fast as they go and
/// never used (the latest 100 kept open), until `stop`.
fn silent_flood(port: u16, stop: Arc<AtomicBool>) -> std::thread::JoinHandle<u64> {
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread().enable_io().build().unwrap();
        let mut open = std::collections::VecDeque::new();
        let mut opened = 0;
        while !stop.load(Ordering::SeqCst) {
            let s = tokio::net::TcpSocket::new_v4().unwrap();
            s.bind("127.0.0.2:0".parse().unwrap()).unwrap();
            let Ok(c) = rt.block_on(s.connect(([127, 0, 0, 1], port).into())) else { continue };
            opened += 1;
            open.push_back(c);
            if open.len() > 100 {
                open.pop_front();
            }
        }
        opened
    })
}

/// Item 3: each new connection displaced the oldest handshake, so with 10 ms each way between peers
/// a flood of silent connections lost 3 of 13 publishes. Now a member's address has handshake slots
/// of its own that connections from elsewhere never displace: every publish gets through.
#[test]
fn regression_silent_flood_displaces_a_slow_member_handshake() {
    let v = vm(1);
    let (a, b) = (node("a"), node("b"));
    let db = start_node(&b, &[&a], &v, 1024);
    let slow = relay(b.port, Duration::from_millis(10));
    let da = start_node(&a, &[&via(&b, slow.port)], &v, 1024);
    let stop = Arc::new(AtomicBool::new(false));
    let flood: Vec<_> = (0..4).map(|_| silent_flood(b.port, stop.clone())).collect();
    std::thread::sleep(Duration::from_millis(300));
    let mut reached = 0;
    for _ in 0..13 {
        // Each counted publish opens a new session through the flood: the last one is cut, and the
        // publish that finds it cut is not counted.
        slow.cut();
        da.http("POST", "/v1/host/coop/publish", Some(common::HOST_TOKEN), None);
        let (s, v) = da.http("POST", "/v1/host/coop/publish", Some(common::HOST_TOKEN), None);
        assert_eq!(s, 200, "{v}");
        reached += n(&v, "peers_reached");
    }
    stop.store(true, Ordering::SeqCst);
    let opened: u64 = flood.into_iter().map(|f| f.join().unwrap()).sum();
    // Not a rate to meet: only that the flood ran (a listener that keeps up backs it up in its queue).
    assert!(opened >= 200, "the flood opened only {opened} connections");
    assert_eq!(reached, 13, "publishes through a silent flood ({opened} connections)");
    drop(db);
}

/// Item 2: keys were checked only in the handshake. A relay passed a's real handshake through to b,
/// then sent its own FETCH on a's session and got an answer. Now every frame travels in the session's
/// encrypted channel: the injected bytes fail authentication and b closes the session unanswered.
#[test]
fn regression_relay_injects_a_frame_into_a_members_session() {
    let v = vm(1);
    let (a, b) = (node("a"), node("b"));
    let db = start_node(&b, &[&a], &v, 1024);
    let r = relay(b.port, Duration::ZERO);
    let da = start_node(&a, &[&via(&b, r.port)], &v, 1024);
    publish(&da, 1);
    let before = r.from_upstream();
    // A FETCH frame, framed as a record (a length and a tag's worth of bytes after it).
    let mut fetch = Vec::new();
    dd_coop::wire::PeerRequest::Fetch { pin: 1 }.encode(77, &mut fetch);
    fetch.extend_from_slice(&[0; 16]);
    let mut frame = (fetch.len() as u16).to_le_bytes().to_vec();
    frame.extend_from_slice(&fetch);
    assert!(r.inject(&frame), "a's session through the relay");
    let closed = r.wait_upstream_closed(Duration::from_secs(5));
    assert_eq!(r.from_upstream() - before, 0, "b answered the injected frame");
    assert!(closed, "b kept the session after an injected frame");
    assert_eq!(n(&coop(&db), "records_refused"), 1);
    // a's next publication finds its session closed; the one after opens a new one.
    da.http("POST", "/v1/host/coop/publish", Some(common::HOST_TOKEN), None);
    publish(&da, 1);
}

/// Item 1, the other half: sessions had no idle timeout. Now a session silent for
/// `coop.idle_timeout_ms` is closed by the listener, and the client drops its pooled sessions idle
/// for half of it, so a publication after a pause opens a new one instead of failing on a closed one.
#[test]
fn idle_peer_sessions_are_closed_and_the_client_never_uses_a_closed_one() {
    let v = vm(1);
    let (a, b, c) = (node("a"), node("b"), node("c"));
    let idle = "idle_timeout_ms = 400\n";
    let db = start_node_with(&b, &[&a, &c], &v, 1024, idle);
    let da = start_node_with(&a, &[&b], &v, 1024, idle);
    let mut s = peer_conn(b.port);
    assert_eq!(peer_handshake(&mut s, "c", 5, &c.key), Some(0));
    publish(&da, 1);
    std::thread::sleep(Duration::from_millis(900));
    assert!(peer_call(&mut s, &dd_coop::wire::PeerRequest::Fetch { pin: 1 }).is_none(), "still open");
    assert!(n(&coop(&db), "sessions_idle_closed") >= 2, "{}", coop(&db));
    publish(&da, 1);
    assert_eq!(n(&coop(&da), "peer_failures"), 0, "a used a closed session: {}", coop(&da));
}

/// A pooled session that the peer (its idle timeout, a restart) or the path closed failed the next
/// request on it and started a back-off: a publication after a cut session reached nobody. Now a
/// request that finds its reused session closed is sent again, once, on a new session.
#[test]
fn regression_a_pooled_session_closed_under_a_request_fails_it() {
    let v = vm(1);
    let (a, b) = (node("a"), node("b"));
    let _db = start_node(&b, &[&a], &v, 1024);
    let r = relay(b.port, Duration::ZERO);
    let da = start_node(&a, &[&via(&b, r.port)], &v, 1024);
    for _ in 0..3 {
        publish(&da, 1);
        r.cut();
        std::thread::sleep(Duration::from_millis(50));
    }
    publish(&da, 1);
    assert_eq!(n(&coop(&da), "peer_failures"), 0, "{}", coop(&da));
}

/// With 4 handshake slots per membership address and 8 sessions per node, a member that opened its
/// sessions at once (a burst of remote gets on a fresh daemon) displaced its own handshakes, and each
/// displaced one was a failed request and a back-off. Now every membership address has at least as
/// many handshake slots as a node may hold sessions (`coop.handshakes_per_member` >=
/// `coop.max_sessions_per_peer`, checked by the configuration).
#[test]
fn regression_a_member_opening_its_sessions_at_once_displaces_its_own_handshakes() {
    let v = vm(1);
    let (b, c) = (node("b"), node("c"));
    let _db = start_node(&b, &[&c], &v, 1024);
    // Eight connections in their handshake at once (channels open, no HELLO yet), then each completes.
    let mut conns: Vec<_> = (0..8).map(|_| peer_conn(b.port)).collect();
    let done =
        conns.iter_mut().map(|s| peer_handshake(s, "c", 5, &c.key)).filter(|st| *st == Some(0)).count();
    assert_eq!(done, 8, "handshakes of one member displaced by its own");
}
