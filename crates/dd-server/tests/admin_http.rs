//! The admin API over a real TCP connection (hyper's parsing included), for what only shows on the
//! wire: conflicting framing headers, and names refused in a request body.

use dd_server::state::ServerState;
use std::io::{Read, Write};
use std::sync::Arc;

const HOST: &str = "test-host-token-0001";

/// A daemon state with the admin API served on a loopback port; returns the port.
fn serve() -> (tokio::runtime::Runtime, tempfile::TempDir, std::net::SocketAddr) {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dd_server::ServerConfig::from_toml(&format!(
        "ssd_enabled = false\ndata_dir = \"{}\"\n[auth]\nhost_admin_token = \"{HOST}\"\n\
         [engine]\nmaintenance = \"inline\"\n[engine.mem]\ncapacity_bytes = 1048576\ndedup = true\n",
        dir.path().display()
    ))
    .unwrap();
    let state = Arc::new(ServerState::new(&cfg, HOST).unwrap());
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
    let listener = rt.block_on(tokio::net::TcpListener::bind("127.0.0.1:0")).unwrap();
    let addr = listener.local_addr().unwrap();
    rt.spawn(async move {
        axum::serve(
            dd_server::admin_listener::AdminListener::plain(listener).unwrap(),
            dd_server::admin::router(state),
        )
        .await
    });
    (rt, dir, addr)
}

/// Sends `request` as it is and returns the answer's status code and body.
fn exchange(addr: std::net::SocketAddr, request: &[u8]) -> (u16, String) {
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(std::time::Duration::from_secs(10))).unwrap();
    s.write_all(request).unwrap();
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    // Until the whole answer is in (the server closes, or the body of its Content-Length arrived).
    loop {
        match s.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => got.extend_from_slice(&buf[..n]),
        }
        let text = String::from_utf8_lossy(&got);
        if let Some(end) = text.find("\r\n\r\n") {
            let len = text[..end]
                .lines()
                .find_map(|l| {
                    l.to_ascii_lowercase().strip_prefix("content-length:").map(|v| v.trim().to_string())
                })
                .and_then(|v| v.parse::<usize>().ok());
            if len.is_some_and(|n| got.len() >= end + 4 + n) {
                break;
            }
        }
    }
    let text = String::from_utf8_lossy(&got).to_string();
    let code = text.get(9..12).and_then(|c| c.parse().ok()).unwrap_or(0);
    let body = text.split_once("\r\n\r\n").map(|(_, b)| b.to_string()).unwrap_or_default();
    (code, body)
}

fn post_vm(addr: std::net::SocketAddr, body: &str) -> (u16, String) {
    let req = format!(
        "POST /v1/vms HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {HOST}\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    exchange(addr, req.as_bytes())
}

/// Issue 30, item 6: a request with both Content-Length and Transfer-Encoding was accepted (the two
/// framings disagree on where the body ends: the opening of request smuggling behind a proxy).
#[test]
fn conflicting_framing_headers_get_400() {
    let (_rt, _dir, addr) = serve();
    let body = r#"{"id": 5}"#;
    let chunked = format!("{:x}\r\n{body}\r\n0\r\n\r\n", body.len());
    let req = format!(
        "POST /v1/vms HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {HOST}\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n{chunked}",
        chunked.len()
    );
    let (code, answer) = exchange(addr, req.as_bytes());
    assert_eq!(code, 400, "{answer}");
    // Nothing was registered.
    let list = format!(
        "GET /v1/vms HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {HOST}\r\nConnection: close\r\n\r\n"
    );
    let (code, answer) = exchange(addr, list.as_bytes());
    assert_eq!((code, answer.as_str()), (200, "[]"));
    // Either framing alone is served.
    let (code, answer) = post_vm(addr, body);
    assert_eq!(code, 201, "{answer}");
}

/// Issue 30, item 6: a host-scope de-dup group name took NUL, newlines, direction overrides,
/// invisible characters and 60 KB.
#[test]
fn names_with_hidden_characters_or_too_long_are_refused() {
    let (_rt, _dir, addr) = serve();
    let long = "g".repeat(60_000);
    for (i, bad) in ["a\\u0000b", "a\\nb", "\\u202Eevil", "a\\u200Bb", "a\\u2028b", "\\uFEFFa", long.as_str()]
        .into_iter()
        .enumerate()
    {
        let (code, answer) = post_vm(addr, &format!(r#"{{"id": {}, "dedup_group": "{bad}"}}"#, i + 10));
        assert_eq!(code, 400, "{bad:.40}: {answer}");
        assert!(answer.contains("dedup_group"), "the error names the field: {answer}");
    }
    let (code, answer) = post_vm(addr, r#"{"id": 30, "dedup_group": "tenants-é"}"#);
    assert_eq!(code, 201, "{answer}");
}

fn get(addr: std::net::SocketAddr, path: &str, token: Option<&str>) -> (u16, String) {
    let auth = token.map(|t| format!("Authorization: Bearer {t}\r\n")).unwrap_or_default();
    let req = format!("GET {path} HTTP/1.1\r\nHost: x\r\n{auth}Connection: close\r\n\r\n");
    exchange(addr, req.as_bytes())
}

/// Issue 31: every token mistake got the same `401 missing or invalid bearer token for this scope`.
/// Now the answer says which token the endpoint wants and which kind it got, never the token itself.
#[test]
fn regression_every_token_mistake_got_the_same_401() {
    let (_rt, _dir, addr) = serve();
    let (data, admin) = ("vm-seven-data-0123456789", "vm-seven-admin-0123456789");
    let (code, answer) =
        post_vm(addr, &format!(r#"{{"id": 7, "data_token": "{data}", "admin_token": "{admin}"}}"#));
    assert_eq!(code, 201, "{answer}");
    let cases: [(&str, Option<&str>, &str, &str); 6] = [
        ("/v1/vms", None, "wants the host admin token", "no bearer token"),
        ("/v1/vms", Some(admin), "wants the host admin token", "the admin token of VM 7"),
        ("/v1/vm/pools", Some(HOST), "wants a VM's admin token", "the host admin token"),
        ("/v1/vm/pools", Some(data), "wants a VM's admin token", "the data-plane token of VM 7"),
        ("/v1/vm/pools", Some("someone-elses-token-01"), "wants a VM's admin token", "does not know"),
        ("/v1/vms", Some("someone-elses-token-01"), "wants the host admin token", "does not know"),
    ];
    for (path, token, want, got) in cases {
        let (code, answer) = get(addr, path, token);
        assert_eq!(code, 401, "{path} {token:?}: {answer}");
        assert!(answer.contains(want) && answer.contains(got), "{path} {token:?}: {answer}");
        assert!(token.is_none_or(|t| !answer.contains(t)), "the answer echoes the token: {answer}");
    }
    // A removed VM's token says so.
    let del = format!(
        "DELETE /v1/vms/7 HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {HOST}\r\nConnection: close\r\n\r\n"
    );
    let (code, answer) = exchange(addr, del.as_bytes());
    assert!(code == 200 || code == 204, "{code} {answer}");
    let (code, answer) = get(addr, "/v1/vm/pools", Some(admin));
    assert_eq!(code, 401, "{answer}");
    assert!(answer.contains("VM 7 no longer has"), "{answer}");
}
