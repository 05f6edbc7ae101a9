//! Acceptance 3 (tests half): truncated, oversized, unknown-op, malformed, wrong-version, wrong-token
//! frames and malformed JSON get clear error codes, while another client's traffic carries on.

mod common;

use common::{page, vm, Daemon, TestVm};
use dd_client::Client;
use dd_engine::{Key, PoolId, PoolOptions, Spec};
use dd_proto::frame::{split_frame, Header};
use dd_proto::{Request, Response, Status, HEADER_LEN};
use std::io::{Read, Write};
use std::net::TcpStream;

/// A well-behaved client that checks its own data after every bad-input step.
struct Bystander {
    c: Client,
    pool: PoolId,
    round: u64,
}

impl Bystander {
    fn new(d: &Daemon, v: &TestVm) -> Bystander {
        let mut c = d.tcp_client(v);
        let pool = c.create_cgroup(PoolOptions::persistent(Spec::Mem { weight: 100 })).unwrap();
        Bystander { c, pool, round: 0 }
    }
    fn check(&mut self) {
        self.round += 1;
        for i in 0..8 {
            self.c.put(self.pool, Key::new(self.round, i), &page(self.round, self.round, i)).unwrap();
        }
        let mut buf = vec![0u8; 4096];
        for r in 1..=self.round {
            for i in 0..8 {
                assert!(self.c.get(self.pool, Key::new(r, i), &mut buf).unwrap(), "round {r} page {i} lost");
                assert_eq!(buf, page(r, r, i));
            }
        }
    }
}

fn raw(d: &Daemon) -> TcpStream {
    TcpStream::connect(d.tcp).unwrap()
}

fn hello(s: &mut TcpStream, v: &TestVm) {
    let mut out = Vec::new();
    Request::Hello { min_version: 1, max_version: 1, vm: v.id, token: v.data_token.as_bytes() }
        .encode(1, 1, &mut out);
    s.write_all(&out).unwrap();
    let (h, r) = read_frame(s).unwrap();
    assert!(h.status().is_ok(), "{r:?}");
}

/// Reads one response frame; None at end of stream.
fn read_frame(s: &mut TcpStream) -> Option<(Header, Response)> {
    let mut hb = [0u8; HEADER_LEN];
    if s.read_exact(&mut hb).is_err() {
        return None;
    }
    let h = Header::decode(&hb).unwrap();
    let mut p = vec![0u8; h.payload_len as usize];
    s.read_exact(&mut p).unwrap();
    Some((h, Response::decode(&h, &p).unwrap()))
}

fn expect_status(s: &mut TcpStream, want: Status) -> Header {
    let (h, r) = read_frame(s).expect("an error response before the close");
    assert_eq!(h.status(), want, "{r:?}");
    h
}

fn closed(s: &mut TcpStream) -> bool {
    let mut b = [0u8; 1];
    matches!(s.read(&mut b), Ok(0) | Err(_))
}

fn header(op: u8, id: u64, len: u32) -> Vec<u8> {
    let mut v = Vec::new();
    Header { version: 1, op, flags: 0, status: 0, request_id: id, payload_len: len }.encode(&mut v);
    v
}

#[test]
fn bad_frames_get_error_codes_and_hurt_no_one_else() {
    let (good, bad) = (vm(1), vm(2));
    let d = Daemon::start(&[&good, &bad], "[limits]\nmax_connections = 6\n");
    let mut by = Bystander::new(&d, &good);
    by.check();

    // Truncated: half a header, then a header with half its payload, then close.
    let mut s = raw(&d);
    hello(&mut s, &bad);
    s.write_all(&header(7, 5, 20)[..10]).unwrap();
    drop(s);
    let mut s = raw(&d);
    hello(&mut s, &bad);
    let mut f = header(6, 5, 20 + 4096);
    f.extend_from_slice(&[1u8; 100]);
    s.write_all(&f).unwrap();
    drop(s);
    by.check();

    // Oversized: refused from the header alone, then closed.
    let mut s = raw(&d);
    hello(&mut s, &bad);
    s.write_all(&header(6, 9, 64 * 1024 * 1024)).unwrap();
    let h = expect_status(&mut s, Status::FRAME_TOO_LARGE);
    assert_eq!(h.request_id, 9);
    assert!(closed(&mut s));
    by.check();

    // Unknown op, malformed payload, reserved flags, wrong version, second HELLO: each answered with
    // its code, and the connection stays usable.
    let mut s = raw(&d);
    hello(&mut s, &bad);
    s.write_all(&header(200, 1, 0)).unwrap();
    expect_status(&mut s, Status::UNKNOWN_OP);
    let mut f = header(7, 2, 3);
    f.extend_from_slice(&[1, 2, 3]);
    s.write_all(&f).unwrap();
    expect_status(&mut s, Status::MALFORMED);
    let mut f = Vec::new();
    Header { version: 1, op: 2, flags: 0x80, status: 0, request_id: 3, payload_len: 0 }.encode(&mut f);
    s.write_all(&f).unwrap();
    expect_status(&mut s, Status::MALFORMED);
    let mut f = Vec::new();
    Header { version: 9, op: 2, flags: 0, status: 0, request_id: 4, payload_len: 0 }.encode(&mut f);
    s.write_all(&f).unwrap();
    expect_status(&mut s, Status::UNSUPPORTED_VERSION);
    let mut f = Vec::new();
    Request::Hello { min_version: 1, max_version: 1, vm: 2, token: bad.data_token.as_bytes() }
        .encode(1, 5, &mut f);
    s.write_all(&f).unwrap();
    expect_status(&mut s, Status::ALREADY_AUTHENTICATED);
    // A batch count above the limit, and a put of the wrong size: protocol and engine codes.
    let mut f = header(12, 6, 8);
    f.extend_from_slice(&[1, 0, 0, 0]);
    f.extend_from_slice(&100_000u32.to_le_bytes());
    s.write_all(&f).unwrap();
    expect_status(&mut s, Status::BATCH_TOO_LARGE);
    let mut f = Vec::new();
    Request::Put { pool: PoolId(1), key: Key::new(1, 1), data: &[0u8; 100] }.encode(1, 7, &mut f);
    s.write_all(&f).unwrap();
    let (h, _) = read_frame(&mut s).unwrap();
    assert!(
        h.status() == Status(13) || h.status() == Status(11),
        "bad_page_size or unknown_pool: {:?}",
        h.status()
    );
    let mut f = Vec::new();
    Request::Ping.encode(1, 8, &mut f);
    s.write_all(&f).unwrap();
    let (h, r) = read_frame(&mut s).unwrap();
    assert_eq!((h.request_id, r), (8, Response::Pong), "still usable after every error");
    drop(s);
    by.check();

    // Bad magic: answered, then closed.
    let mut s = raw(&d);
    hello(&mut s, &bad);
    s.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
    expect_status(&mut s, Status::BAD_MAGIC);
    assert!(closed(&mut s));

    // Wrong token, unknown VM, op before HELLO, no common version: refused and closed.
    for (vm_id, token) in
        [(2u32, "not-the-token-of-vm-2"), (77, "data-token-of-vm-0002"), (1, "data-token-of-vm-0002")]
    {
        let mut s = raw(&d);
        let mut f = Vec::new();
        Request::Hello { min_version: 1, max_version: 1, vm: vm_id, token: token.as_bytes() }
            .encode(1, 1, &mut f);
        s.write_all(&f).unwrap();
        expect_status(&mut s, Status::AUTH_FAILED);
        assert!(closed(&mut s));
    }
    let mut s = raw(&d);
    let mut f = Vec::new();
    Request::Get { pool: PoolId(1), key: Key::new(0, 0) }.encode(1, 1, &mut f);
    s.write_all(&f).unwrap();
    expect_status(&mut s, Status::NOT_AUTHENTICATED);
    assert!(closed(&mut s));
    let mut s = raw(&d);
    let mut f = Vec::new();
    Request::Hello { min_version: 5, max_version: 9, vm: 2, token: bad.data_token.as_bytes() }
        .encode(5, 1, &mut f);
    s.write_all(&f).unwrap();
    expect_status(&mut s, Status::UNSUPPORTED_VERSION);
    assert!(closed(&mut s));
    by.check();

    // Malformed JSON and bad paths on the admin API: 400 with stable codes.
    let t = Some(common::HOST_TOKEN);
    for body in ["{", "[]", r#"{"id": "x"}"#, r#"{"id": 5, "surprise": 1}"#, "\u{0}"] {
        let (s, j) = d.http("POST", "/v1/vms", t, Some(body));
        assert_eq!((s, j["code"].as_str()), (400, Some("malformed_json")), "{body}");
    }
    let (s, j) = d.http("PATCH", "/v1/host", t, Some(r#"{"mode": "sideways"}"#));
    assert_eq!((s, j["code"].as_str()), (400, Some("malformed_json")));
    let (s, j) = d.http("GET", "/v1/vms/notanumber", t, None);
    assert_eq!((s, j["code"].as_str()), (400, Some("bad_request")));
    let (s, j) = d.http("GET", "/v1/nothing", t, None);
    assert_eq!((s, j["code"].as_str()), (404, Some("not_found")));
    let (s, j) =
        d.http("POST", "/v1/vm/pools", Some(&good.admin_token), Some(r#"{"spec": {"type": "mem"}}"#));
    assert_eq!((s, j["code"].as_str()), (400, Some("malformed_json")));
    let (s, j) = d.http(
        "POST",
        "/v1/vm/pools",
        Some(&good.admin_token),
        Some(r#"{"spec": {"type": "mem", "weight": 4000000000}}"#),
    );
    assert_eq!((s, j["code"].as_str()), (400, Some("invalid_config")), "{j}");
    by.check();

    // Connection limit (6): the bystander holds one session, five more fill it; a new connection is
    // answered `busy` in place of its HELLO response (connections still in their handshake would be
    // displaced instead: hostile_tenants.rs).
    let held: Vec<Client> = (0..5).map(|_| d.tcp_client(&good)).collect();
    let mut s = raw(&d);
    let mut f = Vec::new();
    Request::Hello { min_version: 1, max_version: 1, vm: bad.id, token: bad.data_token.as_bytes() }
        .encode(1, 77, &mut f);
    s.write_all(&f).unwrap();
    let h = expect_status(&mut s, Status::BUSY);
    assert_eq!(h.request_id, 77, "busy answers the HELLO");
    assert!(closed(&mut s));
    drop(held);
    by.check();

    // The bystander's connection saw every request succeed; the daemon counted the errors.
    let (s, text) = {
        let r = ureq::get(&format!("{}/metrics", d.admin))
            .set("Authorization", &format!("Bearer {}", common::HOST_TOKEN))
            .call()
            .unwrap();
        (r.status(), r.into_string().unwrap())
    };
    assert_eq!(s, 200);
    for needle in [
        r#"dd_requests_total{op="unknown",status="unknown_op"} 1"#,
        r#"status="frame_too_large"} 1"#,
        r#"status="auth_failed"} 3"#,
        r#"dd_connections_rejected_total 1"#,
    ] {
        assert!(text.contains(needle), "metrics lack {needle}:\n{text}");
    }
}

/// The splitter and handler reject what they must without a daemon in the way (sanity of the frames
/// this test builds).
#[test]
fn test_frames_are_what_they_claim() {
    let f = header(200, 1, 0);
    let (h, n) = split_frame(&f, 100).unwrap().unwrap();
    assert_eq!((h.op, n), (200, HEADER_LEN));
}
