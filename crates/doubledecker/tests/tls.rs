//! TLS on the daemon's TCP listeners (issue 30: "optional TLS on the data plane's and the admin API's
//! TCP listeners"; `dd_server::tls`, docs/decisions.md D30), against the real binary with certificates
//! made here (a CA and a server certificate for 127.0.0.1 and localhost):
//!
//! * the data plane over TLS serves a VM as plain TCP does, the Unix socket stays plain;
//! * a plain client on the TLS port, a client trusting another CA, and a client expecting another
//!   server name are all refused, and the daemon serves the next client;
//! * the CLI reaches the admin API over `https://` with `--tls-ca`, says what is missing without it,
//!   and plain HTTP on the TLS port gets no answer;
//! * the admin listener's framing check reads the decrypted bytes (a smuggling head is answered 400
//!   inside TLS), and clients that never finish their TLS handshake keep nobody out.

mod common;

use common::{page, vm, Daemon, HOST_TOKEN};
use dd_bench::certs::Certs;
use dd_client::{Client, Endpoint, TlsClient};
use dd_engine::{Key, PoolOptions, Spec};
use std::io::{Read, Write};
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

fn make_certs(dir: &Path) -> Certs {
    dd_bench::certs::make_certs(dir).expect("test certificates")
}

fn tls_daemon(v: &common::TestVm, certs: &Certs) -> Daemon {
    Daemon::start(&[v], &certs.tls_toml())
}

fn https(d: &Daemon) -> String {
    d.admin.replacen("http://", "https://", 1)
}

fn cli(args: &[&str]) -> std::process::Output {
    let mut c = Command::new(env!("CARGO_BIN_EXE_doubledecker"));
    for v in common::CLI_ENV_VARS.iter().chain(&["DD_TLS_CA_FILE"]) {
        c.env_remove(v);
    }
    c.args(args).output().unwrap()
}

#[test]
fn the_data_plane_over_tls_serves_and_refuses_what_it_must() {
    let certs_dir = tempfile::tempdir().unwrap();
    let certs = make_certs(certs_dir.path());
    let v = vm(1);
    let d = tls_daemon(&v, &certs);
    let tls = TlsClient { ca_file: certs.ca.clone(), server_name: None };
    let addr = d.tcp.to_string();

    // Served over TLS: a page goes in and comes back (through the guest side's reconnecting endpoint).
    let ep = Endpoint {
        unix_socket: None,
        tcp: Some(addr.clone()),
        tls: Some(tls.clone()),
        vm: v.id,
        token: v.data_token.clone(),
    };
    assert_eq!(ep.address(), format!("tls:{addr}"));
    let mut c = ep.connect().expect("a TLS client connects");
    let pool = c.create_cgroup(PoolOptions::ephemeral(Spec::Mem { weight: 100 })).unwrap();
    for i in 0..64 {
        c.put(pool, Key::new(7, i), &page(3, 7, i)).unwrap();
    }
    let mut buf = vec![0u8; 4096];
    for i in 0..64 {
        assert!(c.get(pool, Key::new(7, i), &mut buf).unwrap(), "page {i}");
        assert_eq!(buf, page(3, 7, i));
    }
    // A batch larger than one TLS record (16 KiB) round-trips too.
    let pages: Vec<Vec<u8>> = (100..132).map(|i| page(4, 8, i)).collect();
    let items: Vec<(Key, &[u8])> =
        (100..132).zip(&pages).map(|(i, p)| (Key::new(8, i), p.as_slice())).collect();
    c.put_batch(pool, &items).unwrap();
    let keys: Vec<Key> = (100..132).map(|i| Key::new(8, i)).collect();
    let mut out = vec![0u8; 32 * 4096];
    let got = c.get_batch(pool, &keys, &mut out).unwrap();
    assert_eq!(got.iter().filter(|&&hit| hit).count(), 32);
    assert_eq!(&out[31 * 4096..], pages[31].as_slice());

    // The Unix socket stays plain.
    d.unix_client(&v).ping().unwrap();

    // A plain client on the TLS port gets no HELLO answer.
    assert!(Client::connect_tcp(d.tcp, v.id, &v.data_token).is_err(), "plain TCP on the TLS port");
    // A client trusting another CA refuses the daemon's certificate.
    let other = tempfile::tempdir().unwrap();
    let (_, _, other_ca) = dd_bench::certs::make_ca(other.path(), "other-ca").unwrap();
    let e =
        Client::connect_tls(&addr, &TlsClient { ca_file: other_ca, server_name: None }, v.id, &v.data_token)
            .unwrap_err();
    assert!(e.to_string().to_lowercase().contains("certificate"), "{e}");
    // A client expecting another name refuses it too.
    let wrong_name = TlsClient { ca_file: certs.ca.clone(), server_name: Some("daemon.example".into()) };
    assert!(Client::connect_tls(&addr, &wrong_name, v.id, &v.data_token).is_err());
    // A wrong token over TLS is the data plane's own refusal.
    match Client::connect_tls(&addr, &tls, v.id, "not-the-token-of-vm-1") {
        Err(e) => assert_eq!(e.code_name(), "auth_failed", "{e}"),
        Ok(_) => panic!("a wrong token was accepted"),
    }
    // After all that, the next client is served.
    Client::connect_tls(&addr, &tls, v.id, &v.data_token).unwrap().ping().unwrap();
}

#[test]
fn the_admin_api_over_tls_with_the_cli_and_without() {
    let certs_dir = tempfile::tempdir().unwrap();
    let certs = make_certs(certs_dir.path());
    let v = vm(1);
    let d = tls_daemon(&v, &certs);
    let url = https(&d);
    let ca = certs.ca.display().to_string();

    let out = cli(&["vm", "list", "--admin-url", &url, "--tls-ca", &ca, "--token", HOST_TOKEN]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stdout).contains('1'), "{}", String::from_utf8_lossy(&out.stdout));

    // https without the CA: says what to give.
    let out = cli(&["vm", "list", "--admin-url", &url, "--token", HOST_TOKEN]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("--tls-ca"), "{err}");

    // Plain HTTP on the TLS port: no HTTP answer.
    let out = cli(&["vm", "list", "--admin-url", &d.admin, "--token", HOST_TOKEN]);
    assert!(!out.status.success());
}

/// Opens a TLS connection to the admin listener trusting `ca`.
fn tls_stream(d: &Daemon, ca: &Path) -> rustls::StreamOwned<rustls::ClientConnection, std::net::TcpStream> {
    let addr = d.admin.trim_start_matches("http://").to_string();
    let cfg = dd_client::tls::client_config(ca).unwrap();
    let name = rustls::pki_types::ServerName::try_from("127.0.0.1").unwrap();
    let conn = rustls::ClientConnection::new(cfg, name).unwrap();
    let s = std::net::TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    rustls::StreamOwned::new(conn, s)
}

#[test]
fn the_admin_framing_check_and_stalled_handshakes_under_tls() {
    let certs_dir = tempfile::tempdir().unwrap();
    let certs = make_certs(certs_dir.path());
    let v = vm(1);
    let d = tls_daemon(&v, &certs);

    // A head with both framings is refused inside TLS, never reaching a handler.
    let mut s = tls_stream(&d, &certs.ca);
    s.write_all(
        format!(
            "POST /v1/vms HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {HOST_TOKEN}\r\n\
             Content-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n"
        )
        .as_bytes(),
    )
    .unwrap();
    s.flush().unwrap();
    let mut answer = Vec::new();
    let _ = s.read_to_end(&mut answer);
    let answer = String::from_utf8_lossy(&answer);
    assert!(answer.starts_with("HTTP/1.1 400") && answer.contains("conflicting_framing"), "{answer}");

    // Connections that never start their TLS handshake keep nobody out.
    let addr = d.admin.trim_start_matches("http://").to_string();
    let stalled: Vec<std::net::TcpStream> =
        (0..80).map(|_| std::net::TcpStream::connect(&addr).unwrap()).collect();
    let t = Instant::now();
    let mut s = tls_stream(&d, &certs.ca);
    s.write_all(format!("GET /v1/vms HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {HOST_TOKEN}\r\nConnection: close\r\n\r\n").as_bytes())
        .unwrap();
    let mut answer = Vec::new();
    let _ = s.read_to_end(&mut answer);
    assert!(
        String::from_utf8_lossy(&answer).starts_with("HTTP/1.1 200"),
        "{}",
        String::from_utf8_lossy(&answer)
    );
    assert!(t.elapsed() < Duration::from_secs(3), "served after {:?}", t.elapsed());
    drop(stalled);
}

#[test]
fn a_key_that_does_not_fit_the_certificate_fails_the_start_naming_the_field() {
    let certs_dir = tempfile::tempdir().unwrap();
    let certs = make_certs(certs_dir.path());
    let other = tempfile::tempdir().unwrap();
    let other_certs = make_certs(other.path());
    let cfg = certs_dir.path().join("dd.toml");
    std::fs::write(
        &cfg,
        format!(
            "data_dir = {:?}\n[listen]\ntcp = \"127.0.0.1:0\"\nadmin = \"127.0.0.1:0\"\n[auth]\nhost_admin_token = \"{HOST_TOKEN}\"\n\
             [tls]\ncert_file = {:?}\nkey_file = {:?}\n",
            certs_dir.path().join("data").display().to_string(),
            certs.cert.display().to_string(),
            other_certs.key.display().to_string(),
        ),
    )
    .unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_doubledecker"))
        .args(["serve", "--config"])
        .arg(&cfg)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("tls.key_file"), "{err}");
}
