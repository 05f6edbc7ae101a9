//! Issue 12, the smaller defects an independent client found (data plane, admin API and documents),
//! each against a real daemon process and named after the defect.

mod common;

use common::raw::{self, closed, connect, header, read_frame};
use common::{page, vm, Daemon, HOST_TOKEN};
use dd_engine::{Key, PoolOptions, Spec};
use dd_proto::frame::Header;
use dd_proto::{Status, HEADER_LEN};
use std::io::{Read, Write};

/// A header with chosen flags and status.
fn header_with(op: u8, flags: u16, status: u16, len: u32) -> Vec<u8> {
    let mut v = Vec::new();
    Header { version: 1, op, flags, status, request_id: 7, payload_len: len }.encode(&mut v);
    v
}

fn status_of(s: &mut std::net::TcpStream) -> Option<Status> {
    read_frame(s).map(|(h, _)| h.status())
}

/// HELLO accepted reserved flag bits and a non-zero status field (protocol.md says `malformed`).
#[test]
fn regression_hello_accepts_reserved_flags_and_a_nonzero_status() {
    let v = vm(1);
    let d = Daemon::start(&[&v], "");
    let frame = raw::hello_frame(v.id, &v.data_token);
    for (flags, status) in [(0x0002u16, 0u16), (0, 5), (0x8000, 0)] {
        let mut s = connect(d.tcp);
        let mut f = header_with(1, flags, status, (frame.len() - HEADER_LEN) as u32);
        f.extend_from_slice(&frame[HEADER_LEN..]);
        s.write_all(&f).unwrap();
        assert_eq!(
            status_of(&mut s),
            Some(Status::MALFORMED),
            "HELLO with flags {flags:#x}, status {status}"
        );
    }
    // The well-formed HELLO still works.
    let mut s = connect(d.tcp);
    assert_eq!(raw::hello(&mut s, v.id, &v.data_token), Some(Status::OK));
}

/// The status field of requests was never checked (protocol.md: 0 in requests, otherwise `malformed`).
#[test]
fn regression_request_status_field_unchecked() {
    let v = vm(1);
    let d = Daemon::start(&[&v], "");
    let mut s = connect(d.tcp);
    assert_eq!(raw::hello(&mut s, v.id, &v.data_token), Some(Status::OK));
    s.write_all(&header_with(2, 0, 9, 0)).unwrap(); // PING with status 9
    assert_eq!(status_of(&mut s), Some(Status::MALFORMED));
    s.write_all(&header(2, 8, 0)).unwrap(); // and the session goes on
    assert_eq!(status_of(&mut s), Some(Status::OK));
}

/// PUT_BATCH whose pages are not `page_size` bytes gave two different codes (one `malformed` with a
/// misleading message), depending on how the payload was off. Both are `bad_page_size` now.
#[test]
fn regression_put_batch_wrong_page_size_two_codes() {
    let v = vm(1);
    let d = Daemon::start(&[&v], "");
    let mut c = d.tcp_client(&v);
    let pool = c.create_cgroup(PoolOptions::ephemeral(Spec::Mem { weight: 100 })).unwrap();
    let mut s = connect(d.tcp);
    assert_eq!(raw::hello(&mut s, v.id, &v.data_token), Some(Status::OK));
    // Pages of the wrong size, and page bytes that are not even a multiple of the key count.
    for total in [2 * 4095usize, 2 * 4097, 2 * 4096 + 1, 2 * 4096 - 3, 4096] {
        let mut p = Vec::new();
        p.extend_from_slice(&pool.0.to_le_bytes());
        p.extend_from_slice(&2u32.to_le_bytes());
        for i in 0..2u64 {
            p.extend_from_slice(&1u64.to_le_bytes());
            p.extend_from_slice(&i.to_le_bytes());
        }
        p.extend(std::iter::repeat_n(0xabu8, total));
        let mut f = header(11, 3, p.len() as u32);
        f.extend_from_slice(&p);
        s.write_all(&f).unwrap();
        let (h, msg) = read_frame(&mut s).expect("an answer");
        assert_eq!(
            h.status(),
            Status(13),
            "{total} page bytes for 2 keys: {}",
            String::from_utf8_lossy(&msg)
        );
    }
}

/// GET_BATCH with zero keys failed with `bad_page_size` while PUT_BATCH with zero was ok.
#[test]
fn regression_zero_key_get_batch() {
    let v = vm(1);
    let d = Daemon::start(&[&v], "");
    let mut c = d.tcp_client(&v);
    let pool = c.create_cgroup(PoolOptions::ephemeral(Spec::Mem { weight: 100 })).unwrap();
    assert_eq!(c.get_batch(pool, &[], &mut []).unwrap(), Vec::<bool>::new());
    assert_eq!(c.put_batch(pool, &[]).unwrap().len(), 0);
}

/// `busy` was sent on accept, before anything was read (protocol.md: instead of the HELLO answer); a
/// Unix client writing its HELLO then got EPIPE. Now the HELLO is read and answered `busy`.
#[test]
fn regression_busy_sent_on_accept() {
    let v = vm(1);
    let d = Daemon::start(&[&v], "[limits]\nmax_connections = 1\n");
    let _session = d.unix_client(&v);
    let mut s = std::os::unix::net::UnixStream::connect(&d.unix).unwrap();
    s.set_read_timeout(Some(std::time::Duration::from_millis(500))).unwrap();
    // Nothing arrives before the HELLO (the read times out rather than returning a frame or EOF).
    let mut b = [0u8; 1];
    let early = s.read(&mut b);
    assert!(
        matches!(&early, Err(e) if e.kind() == std::io::ErrorKind::WouldBlock),
        "something came before the HELLO: {early:?}"
    );
    s.write_all(&raw::hello_frame(v.id, &v.data_token)).expect("the HELLO is read, not EPIPE");
    s.set_read_timeout(Some(std::time::Duration::from_secs(20))).unwrap();
    let mut hb = [0u8; HEADER_LEN];
    s.read_exact(&mut hb).unwrap();
    assert_eq!(Header::decode(&hb).unwrap().status(), Status::BUSY);
}

fn admin_call(d: &Daemon, method: &str, path: &str, auth: &str, body: Option<&str>) -> u16 {
    let req = ureq::request(method, &format!("{}{path}", d.admin)).set("Authorization", auth);
    let r = match body {
        Some(b) => req.set("Content-Type", "application/json").send_string(b),
        None => req.call(),
    };
    match r {
        Ok(r) => r.status(),
        Err(ureq::Error::Status(code, _)) => code,
        Err(e) => panic!("{method} {path}: {e}"),
    }
}

/// `Authorization: Bearer  TOKEN` (two spaces) was accepted.
#[test]
fn regression_bearer_with_two_spaces_accepted() {
    let d = Daemon::start(&[], "");
    assert_eq!(admin_call(&d, "GET", "/v1/host", &format!("Bearer {HOST_TOKEN}"), None), 200);
    for auth in
        [format!("Bearer  {HOST_TOKEN}"), format!("Bearer\t{HOST_TOKEN}"), format!("Bearer {HOST_TOKEN}x")]
    {
        assert_eq!(admin_call(&d, "GET", "/v1/host", &auth, None), 401, "{auth:?}");
    }
}

/// The 256-character token limit counted bytes: 200 two-byte characters were refused as too long,
/// while the data plane (bytes) and the admin API (characters) disagreed on what a token is. Tokens
/// are printable ASCII now (one byte a character), 16 to 256 of them.
#[test]
fn regression_token_limit_counts_bytes() {
    let d = Daemon::start(&[], "");
    let register = |id: u32, data: &str| {
        let body = serde_json::json!({ "id": id, "data_token": data, "admin_token": format!("admin-token-{id:08}") });
        d.http("POST", "/v1/vms", Some(HOST_TOKEN), Some(&body.to_string()))
    };
    let (s, j) = register(1, &"é".repeat(200));
    assert_eq!(s, 400, "{j}");
    assert!(j["message"].as_str().unwrap().contains("printable ASCII"), "{j}");
    assert_eq!(register(2, &"x".repeat(256)).0, 201);
    assert_eq!(register(3, &"x".repeat(257)).0, 400);
}

/// VmWeights was accepted as a JSON array (`[1, 2]`); the schema says an object.
#[test]
fn regression_vm_weights_as_json_array() {
    let v = vm(1);
    let d = Daemon::start(&[&v], "");
    let (s, j) = d.http("PUT", "/v1/vms/1/weights", Some(HOST_TOKEN), Some("[300, 400]"));
    assert_eq!((s, j["code"].as_str()), (400, Some("malformed_json")), "{j}");
    let (s, j) = d.http("PUT", "/v1/vms/1/weights", Some(HOST_TOKEN), Some(r#"{"mem": 300, "ssd": 400}"#));
    assert_eq!(s, 200, "{j}");
    let body = serde_json::json!({ "id": 2, "data_token": "data-token-0000002", "admin_token": "admin-token-000002",
        "weights": [1, 2] });
    let (s, j) = d.http("POST", "/v1/vms", Some(HOST_TOKEN), Some(&body.to_string()));
    assert_eq!(s, 400, "{j}");
}

/// A `none` spec with extra fields (`{"type": "none", "weight": 5}`) was accepted although the schema
/// forbids them.
#[test]
fn regression_none_spec_with_extra_fields() {
    let v = vm(1);
    let d = Daemon::start(&[&v], "");
    let mut c = d.tcp_client(&v);
    let pool = c.create_cgroup(PoolOptions::ephemeral(Spec::Mem { weight: 100 })).unwrap();
    let path = format!("/v1/vm/pools/{}/spec", pool.0);
    let put = |body: &str| d.http("PUT", &path, Some(&v.admin_token), Some(body));
    for bad in [
        r#"{"type": "none", "weight": 5}"#,
        r#"{"type": "none", "x": 1}"#,
        r#"{"type": "mem", "weight": 5, "ssd_weight": 1}"#,
    ] {
        let (s, j) = put(bad);
        assert_eq!(s, 400, "{bad}: {j}");
    }
    assert_eq!(put(r#"{"type": "none"}"#).0, 200);
    assert_eq!(put(r#"{"type": "hybrid", "mem_weight": 1, "ssd_weight": 2}"#).0, 200);
}

/// Shrinking a store to 0 did not evict persistent pages while admin-api.yaml said shrinking evicts
/// down to the new capacity. Decided: persistent pages are the guest's only copy and are never
/// evicted; a shrink evicts ephemeral pages, and persistent ones stay (readable, the store above its
/// capacity, new persistent puts refused) until they are flushed. The document says so.
#[test]
fn regression_shrink_to_zero_vs_persistent_pages() {
    let v = vm(1);
    let d = Daemon::start(&[&v], "");
    let mut c = d.tcp_client(&v);
    let eph = c.create_cgroup(PoolOptions::ephemeral(Spec::Mem { weight: 100 })).unwrap();
    let per = c.create_cgroup(PoolOptions::persistent(Spec::Mem { weight: 100 })).unwrap();
    for i in 0..8 {
        c.put(eph, Key::new(1, i), &page(1, 1, i)).unwrap();
        c.put(per, Key::new(2, i), &page(2, 2, i)).unwrap();
    }
    let (s, j) = d.http("PATCH", "/v1/host", Some(HOST_TOKEN), Some(r#"{"mem_capacity_bytes": 0}"#));
    assert_eq!(s, 200, "{j}");
    let mut out = vec![0u8; 4096];
    for i in 0..8 {
        assert!(!c.get(eph, Key::new(1, i), &mut out).unwrap(), "ephemeral page {i} survived the shrink");
        assert!(c.get(per, Key::new(2, i), &mut out).unwrap(), "persistent page {i} was evicted");
        assert_eq!(out, page(2, 2, i));
    }
    let mem = &j["stores"].as_array().unwrap().iter().find(|s| s["kind"] == "mem").unwrap().clone();
    assert_eq!(mem["capacity_bytes"], 0, "{j}");
    let (_, j) = d.http("GET", "/v1/host", Some(HOST_TOKEN), None);
    let mem = j["stores"].as_array().unwrap().iter().find(|s| s["kind"] == "mem").unwrap().clone();
    assert_eq!(mem["used_bytes"], 8 * 4096, "the persistent pages stay, above the capacity: {j}");
    assert_eq!(c.put(per, Key::new(3, 0), &page(3, 3, 0)).unwrap(), dd_engine::PutOutcome::Refused);
    let doc =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/admin-api.yaml")).unwrap();
    assert!(
        doc.contains("Persistent pages are never evicted"),
        "admin-api.yaml still says shrinking evicts everything down to the new capacity"
    );
}

/// The admin body limit (64 KiB) was undocumented: admin-api.yaml states it, and a larger body gets
/// 413 `payload_too_large`.
#[test]
fn regression_admin_body_limit_undocumented() {
    let v = vm(1);
    let d = Daemon::start(&[&v], "");
    let doc =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/admin-api.yaml")).unwrap();
    assert!(
        doc.contains("Request bodies are at most 64 KiB"),
        "admin-api.yaml does not state the body limit"
    );
    let big = format!(r#"{{"mem": 1, "ssd": 1, "pad": "{}"}}"#, "x".repeat(70 * 1024));
    let (s, j) = d.http("PUT", "/v1/vms/1/weights", Some(HOST_TOKEN), Some(&big));
    assert_eq!((s, j["code"].as_str()), (413, Some("payload_too_large")), "{j}");
}

/// The `ready_file` comment of the default configuration listed four of the ready file's six keys.
#[test]
fn regression_ready_file_comment_lists_four_keys_of_six() {
    let d = Daemon::start(&[], "");
    let ready: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(d.dir.path().join("ready.json")).unwrap()).unwrap();
    let default = include_str!("../../dd-server/src/default.toml");
    // The comment block right above `ready_file = ...`.
    let mut block: Vec<&str> = Vec::new();
    for l in default.lines() {
        if l.starts_with("ready_file") {
            break;
        }
        if l.starts_with('#') {
            block.push(l);
        } else {
            block.clear();
        }
    }
    let comment = block.join(" ");
    let keys: Vec<&String> = ready.as_object().unwrap().keys().collect();
    assert!(keys.len() >= 6, "{ready}");
    for k in keys {
        assert!(comment.contains(&format!("\"{k}\"")), "the ready_file comment does not list {k:?}");
    }
}

/// A closed connection is told apart from a silent one (the helpers above rely on it).
#[test]
fn raw_helpers_tell_a_closed_connection() {
    let v = vm(1);
    let d = Daemon::start(&[&v], "");
    let mut s = connect(d.tcp);
    s.write_all(&header(2, 1, 0)).unwrap(); // PING before HELLO
    assert_eq!(status_of(&mut s), Some(Status::NOT_AUTHENTICATED));
    assert!(closed(&mut s));
}
