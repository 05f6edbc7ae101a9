//! The attacks of `bench tenants`: each one plays VM B (or an unauthenticated client, or a stranger on
//! the peer listener) for as long as the stop flag is down, as fast as one thread can, and counts what it
//! did. They are the defects of issue 12, replayed: slow handshakes (4), oversized pre-authentication
//! frames (3), statistics requests never read (5), pool exhaustion (6), re-registration under an open
//! session (1) and idle connections to the peer listener (7); and issue 30's peer attacks (`peers`).
//!
//! Invariant: every socket an attack opens goes to 127.0.0.1 (the daemon it was given) and is closed
//! when the attack returns.

use super::tally::Tally;
use crate::daemon::{BenchVm, HOST_TOKEN};
use dd_client::admin::AdminClient;
use dd_client::Client;
use dd_engine::{Key, PoolOptions, Spec};
use dd_proto::frame::{split_frame, Header, Op};
use dd_proto::{Request, Status};
use serde::Serialize;
use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

/// One attack of `bench tenants`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Attack {
    SlowConnections,
    OversizedPreauth,
    UnreadStats,
    PoolExhaustion,
    Reregistration,
    PeerIdle,
    PeerSessions,
    PeerFlood,
    PeerInject,
}

/// Where the attacks aim.
#[derive(Debug, Clone)]
pub struct Target {
    pub tcp: SocketAddr,
    pub admin: SocketAddr,
    pub coop: SocketAddr,
    pub b: BenchVm,
    /// The key of member `bench-m`, which the peer attacker holds.
    pub member: std::sync::Arc<dd_coop::identity::NodeKey>,
}

impl Attack {
    pub const ALL: [Attack; 9] = [
        Attack::SlowConnections,
        Attack::OversizedPreauth,
        Attack::UnreadStats,
        Attack::PoolExhaustion,
        Attack::Reregistration,
        Attack::PeerIdle,
        Attack::PeerSessions,
        Attack::PeerFlood,
        Attack::PeerInject,
    ];

    /// Whether the victim peer publishes during the attacked window (the peer attacks of issue 30).
    pub fn on_peers(self) -> bool {
        matches!(self, Attack::PeerSessions | Attack::PeerFlood | Attack::PeerInject)
    }

    pub fn name(self) -> &'static str {
        match self {
            Attack::SlowConnections => "slow_connections",
            Attack::OversizedPreauth => "oversized_preauth",
            Attack::UnreadStats => "unread_stats",
            Attack::PoolExhaustion => "pool_exhaustion",
            Attack::Reregistration => "reregistration",
            Attack::PeerIdle => "peer_idle",
            Attack::PeerSessions => "peer_sessions",
            Attack::PeerFlood => "peer_flood",
            Attack::PeerInject => "peer_inject",
        }
    }

    pub fn what(self) -> &'static str {
        match self {
            Attack::SlowConnections => {
                "keeps every connection slot busy with connections that sent one byte and never a HELLO"
            }
            Attack::OversizedPreauth => {
                "connections announcing a 2 MiB frame before HELLO, then sending megabytes of it"
            }
            Attack::UnreadStats => {
                "B's sessions (its maximum) send VM_STATS of 256 pools without ever reading an answer"
            }
            Attack::PoolExhaustion => "B creates pools until refused, destroys them all, again",
            Attack::Reregistration => {
                "VM 3 is registered, used, removed and registered again with new tokens while its old \
                 session keeps asking (an answer to it is a leak)"
            }
            Attack::PeerIdle => "connections to the peer listener that never say anything",
            Attack::PeerSessions => {
                "a member holds 64 authenticated sessions on the peer listener while a peer 10 ms away \
                 publishes through new sessions"
            }
            Attack::PeerFlood => {
                "silent connections from another address, as fast as they open, while a peer 10 ms away \
                 publishes through new sessions"
            }
            Attack::PeerInject => {
                "a record of the attacker's own (a FETCH) written into a peer's relayed session after each \
                 of its publications: each must be refused unanswered"
            }
        }
    }

    /// Runs until `stop`.
    pub fn run(self, t: &Target, stop: &AtomicBool, tally: &Tally) {
        match self {
            Attack::SlowConnections => hold(stop, tally, super::MAX_CONNECTIONS, || {
                let mut s = connect(t.tcp)?;
                s.write_all(b"D").ok()?;
                Some(s)
            }),
            Attack::OversizedPreauth => oversized(t, stop, tally),
            Attack::UnreadStats => unread_stats(t, stop, tally),
            Attack::PoolExhaustion => pools(t, stop, tally),
            Attack::Reregistration => reregistration(t, stop, tally),
            Attack::PeerIdle => hold(stop, tally, super::COOP_MAX_CONNECTIONS, || connect(t.coop)),
            Attack::PeerSessions => super::peers::hold_sessions(t.coop, &t.member, stop, tally),
            Attack::PeerFlood => super::peers::flood(t.coop, stop, tally),
            // The injections are the victim publisher's (`peers::publish_loop`): they follow its
            // publications.
            Attack::PeerInject => {
                while !stop.load(Ordering::Relaxed) {
                    std::thread::sleep(Duration::from_millis(20));
                }
            }
        }
    }
}

impl std::str::FromStr for Attack {
    type Err = String;
    fn from_str(s: &str) -> Result<Attack, String> {
        Attack::ALL
            .into_iter()
            .find(|a| a.name() == s)
            .ok_or_else(|| format!("unknown attack {s:?} (one of {:?})", Attack::ALL.map(|a| a.name())))
    }
}

fn connect(addr: SocketAddr) -> Option<TcpStream> {
    let s = TcpStream::connect_timeout(&addr, Duration::from_secs(2)).ok()?;
    s.set_nonblocking(true).ok()?;
    Some(s)
}

/// Whether the daemon closed `s` (EOF or an error; answers are read and dropped).
fn closed(s: &mut TcpStream) -> bool {
    let mut buf = [0u8; 4096];
    loop {
        match s.read(&mut buf) {
            Ok(0) => return true,
            Ok(_) => continue,
            Err(e) if e.kind() == ErrorKind::WouldBlock => return false,
            Err(_) => return true,
        }
    }
}

/// Keeps up to `n` connections from `open` alive, replacing those the daemon closes. `n` is the
/// listener's limit: every slot taken; more would only displace the attacker's own connections.
fn hold(stop: &AtomicBool, tally: &Tally, n: usize, mut open: impl FnMut() -> Option<TcpStream>) {
    let mut conns: Vec<TcpStream> = Vec::new();
    while !stop.load(Ordering::Relaxed) {
        conns.retain_mut(|s| !closed(s));
        while conns.len() < n && !stop.load(Ordering::Relaxed) {
            match open() {
                Some(s) => {
                    tally.act(1);
                    conns.push(s);
                }
                None => break,
            }
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn oversized(t: &Target, stop: &AtomicBool, tally: &Tally) {
    let mut frame = Vec::new();
    Header { version: 1, op: Op::Hello as u8, flags: 0, status: 0, request_id: 1, payload_len: 2 << 20 }
        .encode(&mut frame);
    let junk = vec![0x5au8; 64 << 10];
    let mut conns: Vec<TcpStream> = Vec::new();
    while !stop.load(Ordering::Relaxed) {
        conns.retain_mut(|s| !closed(s));
        while conns.len() < 64 {
            let Some(mut s) = connect(t.tcp) else { break };
            if s.write_all(&frame).is_ok() {
                tally.act(1);
                conns.push(s);
            }
        }
        // Megabytes of the announced payload, as far as the daemon takes them.
        for s in &mut conns {
            let _ = s.write(&junk);
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// A HELLO of `vm`, read back on a blocking socket; the session or `None`.
fn session(addr: SocketAddr, vm: u32, token: &str) -> Option<TcpStream> {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(2)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    let mut out = Vec::new();
    Request::Hello { min_version: 1, max_version: 1, vm, token: token.as_bytes() }.encode(1, 1, &mut out);
    s.write_all(&out).ok()?;
    let mut buf = Vec::new();
    let mut chunk = [0u8; 1024];
    loop {
        if let Ok(Some((h, _))) = split_frame(&buf, 1 << 20) {
            return (h.status() == Status::OK).then(|| s.set_nonblocking(true).ok().map(|_| s)).flatten();
        }
        match s.read(&mut chunk) {
            Ok(0) | Err(_) => return None,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    }
}

fn unread_stats(t: &Target, stop: &AtomicBool, tally: &Tally) {
    // B's statistics are large: as many pools as its quota allows.
    if let Ok(mut c) = Client::connect_tcp(t.tcp, t.b.id, &t.b.data_token) {
        while c.create_cgroup(PoolOptions::ephemeral(Spec::Mem { weight: 1 })).is_ok() {}
    }
    let mut req = Vec::new();
    for i in 0..64u64 {
        Header { version: 1, op: Op::VmStats as u8, flags: 0, status: 0, request_id: i, payload_len: 0 }
            .encode(&mut req);
    }
    let mut conns: Vec<TcpStream> = Vec::new();
    while !stop.load(Ordering::Relaxed) {
        while conns.len() < super::MAX_CONNECTIONS_PER_VM && !stop.load(Ordering::Relaxed) {
            match session(t.tcp, t.b.id, &t.b.data_token) {
                Some(s) => conns.push(s),
                None => break,
            }
        }
        // Nothing is ever read; a session the daemon closed (its write fails) is replaced.
        conns.retain_mut(|s| match s.write(&req) {
            Ok(n) => {
                tally.act((n / dd_proto::HEADER_LEN) as u64);
                true
            }
            Err(e) => e.kind() == ErrorKind::WouldBlock,
        });
        std::thread::sleep(Duration::from_millis(5));
    }
}

fn pools(t: &Target, stop: &AtomicBool, tally: &Tally) {
    let Ok(mut c) = Client::connect_tcp(t.tcp, t.b.id, &t.b.data_token) else { return };
    // Pools B made in an earlier attack count against its quota too: they are its to destroy.
    let mut held = c.list_pools().unwrap_or_default();
    while !stop.load(Ordering::Relaxed) {
        match c.create_cgroup(PoolOptions::ephemeral(Spec::Mem { weight: 1 })) {
            Ok(p) => {
                tally.act(1);
                held.push(p);
            }
            Err(_) => {
                for p in held.drain(..) {
                    let _ = c.destroy_cgroup(p);
                    tally.act(1);
                }
            }
        }
    }
    for p in held {
        let _ = c.destroy_cgroup(p);
    }
}

fn reregistration(t: &Target, stop: &AtomicBool, tally: &Tally) {
    let admin = AdminClient::new(&t.admin.to_string());
    let page = vec![0x33u8; 4096];
    let mut out = vec![0u8; 4096];
    let mut round = 0u64;
    let mut old: Option<(Client, dd_engine::PoolId)> = None;
    while !stop.load(Ordering::Relaxed) {
        round += 1;
        let data = format!("rereg-data-token-{round:08}");
        let body = serde_json::json!({"id": 3, "data_token": data, "admin_token": format!("rereg-admin-token-{round:08}")});
        if admin.call::<serde_json::Value>("POST", "/v1/vms", HOST_TOKEN, Some(&body)).is_err() {
            std::thread::sleep(Duration::from_millis(10));
            continue;
        }
        let Ok(mut c) = Client::connect_tcp(t.tcp, 3, &data) else { continue };
        let Ok(p) = c.create_cgroup(PoolOptions::ephemeral(Spec::Mem { weight: 1 })) else { continue };
        let _ = c.put(p, Key::new(1, round), &page);
        // The previous registration's session asks for this tenant's page, in its pool id.
        if let Some((mut o, _)) = old.take() {
            if matches!(o.get(p, Key::new(1, round), &mut out), Ok(true)) || o.list_pools().is_ok() {
                tally.leaks.fetch_add(1, Ordering::Relaxed);
            }
        }
        let _ = admin.call::<serde_json::Value>("DELETE", "/v1/vms/3", HOST_TOKEN, None);
        tally.act(1);
        old = Some((c, p));
    }
    let _ = admin.call::<serde_json::Value>("DELETE", "/v1/vms/3", HOST_TOKEN, None);
}
