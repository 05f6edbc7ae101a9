//! Hostile peers of co-operative de-duplication (issue 12, defects 7, 8 and 9, and the smaller peer
//! defects): the peer listener's handshake and bounds, per-node identities, pins confined to the node
//! they were granted to, no content oracle across hosts, dead references forgotten, failures logged.

mod common;
mod coopkit;

use common::{page, vm, HOST_TOKEN};
use coopkit::*;
use dd_engine::Key;

/// The peer listener: a name outside the membership, a wrong key or a first frame other than HELLO is
/// refused and the connection closed; an authenticated peer can pin only content the daemon holds and
/// fetch only its own pins.
#[test]
fn peer_listener_authenticates_and_confines_pins_to_their_owner() {
    use dd_coop::wire::{PeerOp, PeerRequest, PeerResponse, PeerStatus};
    let v = vm(1);
    let (b, m, e) = (node("b"), node("m"), node("e"));
    let db = start_node(&b, &[&m, &e], &v, 1024);
    let mut cb = db.tcp_client(&v);
    let pb = pool(&mut cb);
    put_file(&mut cb, pb, 1, 1, 4);
    let p0 = page(1, 1, 0);
    let h0 = xxhash_rust::xxh3::xxh3_128(&p0);

    let mut s = peer_conn(b.port);
    assert_eq!(peer_handshake(&mut s, "m", 5, &e.key), Some(PeerStatus::AUTH_FAILED.0), "m with e's key");
    assert!(peer_call(&mut s, &PeerRequest::Fetch { pin: 1 }).is_none(), "closed after a wrong key");
    let mut s = peer_conn(b.port);
    assert_eq!(peer_handshake(&mut s, "x", 5, &m.key), Some(PeerStatus::AUTH_FAILED.0), "not a member");
    let mut s = peer_conn(b.port);
    let (st, _) = peer_call(&mut s, &PeerRequest::Fetch { pin: 1 }).unwrap();
    assert_eq!(st, PeerStatus::NOT_AUTHENTICATED.0);
    assert!(peer_handshake(&mut s, "m", 5, &m.key).is_none(), "closed after a frame before HELLO");

    let compare = |s: &mut dd_server::coop::SecureStream, hash: u128, page: &[u8]| {
        let (st, payload) = peer_call(s, &PeerRequest::Compare { hash, page }).unwrap();
        assert_eq!(st, 0);
        match PeerResponse::decode(PeerOp::Compare as u8, &payload, 4096).unwrap() {
            PeerResponse::Compared(pin) => pin,
            other => panic!("{other:?}"),
        }
    };
    let fetch = |s: &mut dd_server::coop::SecureStream, pin: u64| {
        let (st, payload) = peer_call(s, &PeerRequest::Fetch { pin }).unwrap();
        assert_eq!(st, 0);
        matches!(PeerResponse::decode(PeerOp::Fetch as u8, &payload, 4096).unwrap(), PeerResponse::Fetched(Some(p)) if p == p0.as_slice())
    };
    let mut ms = peer_conn(b.port);
    assert_eq!(peer_handshake(&mut ms, "m", 5, &m.key), Some(0));
    let pin = compare(&mut ms, h0, &p0).expect("b holds the page");
    let other = page(2, 2, 2);
    assert_eq!(compare(&mut ms, xxhash_rust::xxh3::xxh3_128(&other), &other), None, "b lacks this one");
    assert_eq!(compare(&mut ms, h0 ^ 1, &p0), None, "a hash that does not match the bytes");
    assert!(fetch(&mut ms, pin));
    // Another member cannot read or release m's pin.
    let mut es = peer_conn(b.port);
    assert_eq!(peer_handshake(&mut es, "e", 5, &e.key), Some(0));
    assert!(!fetch(&mut es, pin));
    let (_, r) = peer_call(&mut es, &PeerRequest::Unpin { pins: vec![pin] }).unwrap();
    assert_eq!(PeerResponse::decode(PeerOp::Unpin as u8, &r, 4096).unwrap(), PeerResponse::Unpinned(0));
    assert_eq!(pins_held(&db), 1);
    let (_, r) = peer_call(&mut ms, &PeerRequest::Unpin { pins: vec![pin] }).unwrap();
    assert_eq!(PeerResponse::decode(PeerOp::Unpin as u8, &r, 4096).unwrap(), PeerResponse::Unpinned(1));
    assert_eq!(pins_held(&db), 0);
    assert!(!fetch(&mut ms, pin), "an unpinned page is gone");
}
/// Defect 9: co-operative de-duplication was a content oracle across hosts. VM 2 on host C put copies of
/// pages VM 1 held on host A and wrong guesses; its own `remotified`, its hits and its latencies told
/// the right guesses from the wrong ones, because every VM's evicted pages were offered to peers. Now
/// only the pages of the co-operative de-dup group leave their VM (the administrator's choice on each
/// host): VM 2, in its own domain (the default), offers nothing and learns nothing.
#[test]
fn regression_coop_content_oracle_across_hosts() {
    let (a_node, c_node) = (node("a"), node("c"));
    let (v1, v2) = (vm(1), vm(2));
    let a = start_node(&a_node, &[&c_node], &v1, 4096);
    let c = start_node_in(&c_node, &[&a_node], &v2, MEM_PAGES, "");
    let mut ca = a.tcp_client(&v1);
    let pa = pool(&mut ca);
    put_file(&mut ca, pa, 1, 1, 64);
    publish(&a, 1);
    // VM 2 puts 32 right guesses (VM 1's bytes) and 32 wrong ones, then pushes them all out.
    let mut cc = c.tcp_client(&v2);
    let pc = pool(&mut cc);
    for i in 0..32 {
        cc.put(pc, Key::new(5, i), &page(1, 1, i)).unwrap();
        cc.put(pc, Key::new(6, i), &page(9, 9, i)).unwrap();
    }
    put_file(&mut cc, pc, 3, 7, 4 * MEM_PAGES);
    let report = settle(&c);
    let stats = cc.pool_stats(pc).unwrap().counters;
    assert_eq!((stats.remotified, stats.remote_pages), (0, 0), "VM 2's statistics saw remote matches");
    assert_eq!(n(&report, "offered"), 0, "pages outside the co-operative group were offered to a peer");
    let (hits, _) = get_file(&mut cc, pc, 1, 5, 32);
    assert_eq!(hits, 0, "a right guess came back from the peer");
}

/// Defect 7: the peer listener had no deadline and no connection limit: connections that sent nothing
/// stayed open for ever (300 of them, with 256 file descriptors, kept the daemon from accepting anyone).
/// Now a connection that does not complete its HELLO within `coop.handshake_timeout_ms` (5 s by
/// default) is closed, the listener holds at most `coop.max_connections` (64), a newer connection
/// displacing the oldest silent one, and a real peer still gets in meanwhile.
#[test]
fn regression_peer_listener_without_deadline_or_limit() {
    use dd_coop::wire::PeerStatus;
    let v = vm(1);
    let (b, m) = (node("b"), node("m"));
    let db = start_node(&b, &[&m], &v, 1024);
    let mut silent: Vec<std::net::TcpStream> = (0..150).map(|_| raw_conn(b.port)).collect();
    // A peer that says HELLO is served although 150 silent connections came first.
    let mut s = peer_conn(b.port);
    let st = peer_handshake(&mut s, "m", 5, &m.key).expect("a HELLO answer past 150 silent connections");
    assert_eq!(st, PeerStatus::OK.0);
    // Every silent connection is closed (displaced or by the handshake deadline).
    for c in &mut silent {
        let mut buf = [0u8; 16];
        let r = std::io::Read::read(c, &mut buf);
        assert!(
            matches!(r, Ok(0) | Err(_))
                && !matches!(&r, Err(e) if e.kind() == std::io::ErrorKind::WouldBlock),
            "a silent peer connection stayed open: {r:?}"
        );
    }
    // The data plane and the admin API were served throughout.
    db.tcp_client(&v).ping().unwrap();
    assert_eq!(db.http("GET", "/healthz", None, None).0, 200);
}

/// Defect 8: one shared secret let any holder be any node. A holder of `peer_secret` said HELLO under
/// names outside the membership, fetched and unpinned other nodes' pins (numbered 1, 2, 3...), and a
/// HELLO under another node's name with a new epoch released every pin held for it. Now each node
/// proves its name with its own key: a member (here `a`, holding only its own key) cannot pass for
/// `c`, a name outside the membership is refused, and pin handles are unguessable and only `c`'s.
#[test]
fn regression_one_shared_secret_lets_any_holder_be_any_node() {
    use dd_coop::wire::{PeerOp, PeerRequest, PeerResponse, PeerStatus};
    let v = vm(1);
    let (a, b, c, mallory) = (node("a"), node("b"), node("c"), node("mallory"));
    let db = start_node(&b, &[&c, &a], &v, 4096);
    let dc = start_node(&c, &[&b], &v, MEM_PAGES);
    let mut cb = db.tcp_client(&v);
    let pb = pool(&mut cb);
    put_file(&mut cb, pb, 1, 1, 40);
    publish(&db, 1);
    let mut cc = dc.tcp_client(&v);
    let pc = pool(&mut cc);
    put_file(&mut cc, pc, 1, 1, 40);
    put_file(&mut cc, pc, 5, 5, MEM_PAGES);
    let remotified = n(&settle(&dc), "remotified");
    assert_eq!((remotified, pins_held(&db)), (40, 40));

    // A name outside the membership is refused at its HELLO, whatever key it signs with.
    let mut s = peer_conn(b.port);
    assert_eq!(peer_handshake(&mut s, "mallory", 5, &mallory.key), Some(PeerStatus::AUTH_FAILED.0));
    // A member cannot say HELLO as c (new epoch): refused, and c's pins stay.
    let mut s = peer_conn(b.port);
    assert_eq!(peer_handshake(&mut s, "c", 77, &a.key), Some(PeerStatus::AUTH_FAILED.0), "a passed for c");
    assert_eq!(pins_held(&db), remotified, "a HELLO under c's name released c's pins");
    // As itself, a finds none of c's pins, however it numbers them, and releases none.
    let mut s = peer_conn(b.port);
    assert_eq!(peer_handshake(&mut s, "a", 5, &a.key), Some(0));
    let guesses: Vec<u64> = (0..=4 * remotified).chain([u64::MAX, 1 << 32, 1 << 63]).collect();
    for &pin in &guesses {
        let (st, p) = peer_call(&mut s, &PeerRequest::Fetch { pin }).unwrap();
        assert_eq!(st, 0);
        let got = PeerResponse::decode(PeerOp::Fetch as u8, &p, 4096).unwrap();
        assert_eq!(got, PeerResponse::Fetched(None), "a fetched pin {pin} of c's");
    }
    let (_, r) = peer_call(&mut s, &PeerRequest::Unpin { pins: guesses }).unwrap();
    assert_eq!(PeerResponse::decode(PeerOp::Unpin as u8, &r, 4096).unwrap(), PeerResponse::Unpinned(0));
    assert_eq!(pins_held(&db), remotified);
    // c, the real node, still gets every page back from b.
    assert_eq!(get_file(&mut cc, pc, 1, 1, 40), (40, 0));
    assert!(n(&coop(&db), "auth_failures") >= 2);
}

/// Smaller defect: references to a dead peer's epoch were never cleaned. C remotified 40 pages to B;
/// B was killed and restarted empty (a new epoch, every pin gone), yet C's pool kept counting the 40
/// references in `remote_pages` for ever. Now the first connect that sees B's new epoch drops them.
#[test]
fn regression_dead_peer_epoch_references_never_cleaned() {
    let v = vm(1);
    let (b, c) = (node("b"), node("c"));
    let (mut db, dc, mut cc, pc, remotified) = remotified_pair(&b, &c, &v, 40);
    assert_eq!(cc.pool_stats(pc).unwrap().counters.remote_pages, remotified);
    assert!(db.stop());
    let _db2 = start_node(&b, &[&c], &v, 4096);
    wait_for("C to reach the restarted B", || {
        let (s, j) = dc.http("POST", "/v1/host/coop/publish", Some(HOST_TOKEN), None);
        s == 200 && n(&j, "peers_reached") == 1
    });
    let counters = cc.pool_stats(pc).unwrap().counters;
    assert_eq!(counters.remote_pages, 0, "references to B's old epoch are still counted");
    assert_eq!(n(&coop(&dc), "references_dropped"), remotified);
    // Nothing is fetched for them any more: they are plain misses.
    let mut out = vec![0u8; 4096];
    assert!(!cc.get(pc, Key::new(1, 0), &mut out).unwrap());
    assert_eq!(n(&coop(&dc), "remote_gets_missed"), 0);
}

/// Smaller defect: `gets_missed` counted remote hits as misses (the local miss was counted before the
/// peer answered). A get served by the peer is a hit: `gets_missed` stays 0.
#[test]
fn regression_gets_missed_counts_remote_hits() {
    let v = vm(1);
    let (b, c) = (node("b"), node("c"));
    let (_db, _dc, mut cc, pc, remotified) = remotified_pair(&b, &c, &v, 24);
    assert_eq!(get_file(&mut cc, pc, 1, 1, 24), (24, 0));
    let counters = cc.pool_stats(pc).unwrap().counters;
    assert_eq!(counters.remote_gets_hit, remotified);
    assert_eq!(counters.gets_missed, 0, "remote hits counted as misses: {counters:?}");
    // A real miss still counts.
    let mut out = vec![0u8; 4096];
    assert!(!cc.get(pc, Key::new(99, 0), &mut out).unwrap());
    assert_eq!(cc.pool_stats(pc).unwrap().counters.gets_missed, 1);
}

/// Smaller defect: peer failures showed only in counters, never in the log. C's peer B is not
/// running: publishing fails to reach it, and C's log names the peer and the error (once per
/// `LOG_EVERY`, however many requests fail).
#[test]
fn regression_peer_failures_only_in_counters() {
    let v = vm(1);
    let (b, c) = (node("b"), node("c"));
    let dc = start_node_logged(&c, &[&b], &v, MEM_PAGES);
    for _ in 0..3 {
        let (s, j) = dc.http("POST", "/v1/host/coop/publish", Some(HOST_TOKEN), None);
        assert_eq!((s, n(&j, "peers_reached")), (200, 0), "{j}");
        std::thread::sleep(std::time::Duration::from_millis(600)); // past the back-off
    }
    assert!(n(&coop(&dc), "peer_failures") >= 2);
    let log = dc.log();
    let lines: Vec<&str> =
        log.lines().filter(|l| l.contains("peer b (127.0.0.1:") && l.contains("failed")).collect();
    assert_eq!(lines.len(), 1, "one failure report per LOG_EVERY, naming the peer: {log}");
}

/// Smaller defect: a remotified page named exactly one peer, so when that peer died the copy another
/// peer held was not used. A and B both hold file 1; C evicts it. Its references name both holders
/// (A first, in membership order); A is then killed, and every page still comes back from B.
#[test]
fn regression_remotified_page_names_exactly_one_peer() {
    let v = vm(1);
    let (a, b, c) = (node("a"), node("b"), node("c"));
    let mut da = start_node(&a, &[&b, &c], &v, 4096);
    let db = start_node(&b, &[&a, &c], &v, 4096);
    let dc = start_node(&c, &[&a, &b], &v, MEM_PAGES);
    const F: u64 = 32;
    let (mut ca, mut cb) = (da.tcp_client(&v), db.tcp_client(&v));
    let (pa, pb) = (pool(&mut ca), pool(&mut cb));
    put_file(&mut ca, pa, 1, 1, F);
    put_file(&mut cb, pb, 1, 1, F);
    publish(&da, 2);
    publish(&db, 2);
    let mut cc = dc.tcp_client(&v);
    let pc = pool(&mut cc);
    put_file(&mut cc, pc, 1, 1, F);
    put_file(&mut cc, pc, 5, 5, MEM_PAGES);
    let remotified = n(&settle(&dc), "remotified");
    assert_eq!(remotified, F);
    assert_eq!(
        cc.pool_stats(pc).unwrap().counters.remote_pages,
        F,
        "one record per page, however many holders"
    );
    assert!(da.stop());
    assert_eq!(get_file(&mut cc, pc, 1, 1, F), (F, 0), "the copy B holds was not used once A died");
    let rc = coop(&dc);
    assert_eq!((n(&rc, "remote_gets_hit"), n(&rc, "remote_gets_missed")), (F, 0), "{rc}");
    assert_eq!(n(&coop(&db), "fetches_served"), F);
    // The exclusive gets released every holder's pin on the live peer.
    wait_pins(&db, 0);
    assert_eq!(cc.pool_stats(pc).unwrap().counters.remote_pages, 0);
}
