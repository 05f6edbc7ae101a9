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
                "connections announcing a 2 MiB frame before HELLO, then sending its payload as fast as the daemon \
                 takes it"
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
            Attack::OversizedPreauth => oversized(t.tcp, stop, tally),
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

/// The send buffer of each `oversized_preauth` connection (the kernel doubles it). The daemon reads at
/// most 256 KiB of a refused handshake (`FAIL_DISCARD_BYTES`, `dd-server`'s `net.rs`) and then shrinks its
/// receive buffer, so this keeps all it could take ready on every connection. Left to autotuning (up to
/// `tcp_wmem`'s 4 MiB), each connection queued about 3.3 MiB the daemon never reads: on a host that is
/// B's guest kernel's memory and B's vCPUs, here it was a copy of about 1.2 GiB a second on A's two cores
/// (the attacker thread 0.75-2.07 s of CPU over five 2.5 s attacked windows against 0.34-0.40 s with
/// this bound; BENCHMARKS.md, "twenty-sixth session"), and the daemon's side of each connection received
/// less, not more (51 KiB against 81 KiB on average, `ss -tni`).
const ATTACKER_SNDBUF: usize = 256 << 10;

/// Connections announcing a 2 MiB HELLO, then sending its payload as fast as the daemon takes it, up to
/// 64 at a time, each replaced when the daemon closes it.
fn oversized(tcp: SocketAddr, stop: &AtomicBool, tally: &Tally) {
    let mut frame = Vec::new();
    Header { version: 1, op: Op::Hello as u8, flags: 0, status: 0, request_id: 1, payload_len: 2 << 20 }
        .encode(&mut frame);
    let junk = vec![0x5au8; 64 << 10];
    let mut conns: Vec<TcpStream> = Vec::new();
    while !stop.load(Ordering::Relaxed) {
        conns.retain_mut(|s| !closed(s));
        while conns.len() < 64 {
            let Some(mut s) = connect(tcp) else { break };
            // Best effort: without it the attack is the same to the daemon, only dearer to this host.
            let _ = socket2::SockRef::from(&s).set_send_buffer_size(ATTACKER_SNDBUF);
            if s.write_all(&frame).is_ok() {
                tally.act(1);
                conns.push(s);
            }
        }
        // Megabytes of the announced payload, as far as the daemon takes them.
        for s in &mut conns {
            if let Ok(n) = s.write(&junk) {
                tally.sent(n);
            }
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;
    use std::sync::atomic::AtomicU64;
    use std::sync::Arc;
    use std::time::Instant;

    /// The attacker of `oversized_preauth` queued megabytes per connection in its own send buffers that
    /// no daemon ever reads (3.3 MiB a connection on this kernel's defaults): a copy on the benchmark's
    /// shared cores that a host would run on B's vCPUs, which set A's p99 in CI's failed run of
    /// `771018d` (p99 ratios 0.31, 0.44, 0.48 in its first three pairs). Against a listener that does
    /// what the daemon does with a refused HELLO (reads at most 256 KiB of it, holds the connection 1 s,
    /// closes), every connection must still deliver those 256 KiB, and queue at most 1.5 MiB (about 0.9 MiB
    /// with the bound, 4.1 MiB without on this machine).
    #[test]
    fn regression_oversized_attacker_filled_megabytes_of_its_own_send_buffers() {
        const TAKES: usize = 256 << 10;
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let addr = listener.local_addr().expect("addr");
        listener.set_nonblocking(true).expect("nonblocking");
        let stop = Arc::new(AtomicBool::new(false));
        let full = Arc::new(AtomicU64::new(0));
        let daemon = {
            let (stop, full) = (stop.clone(), full.clone());
            std::thread::spawn(move || {
                // (stream, bytes read, accepted at)
                let mut held: Vec<(TcpStream, usize, Instant)> = Vec::new();
                let mut buf = vec![0u8; 64 << 10];
                while !stop.load(Ordering::Relaxed) {
                    while let Ok((s, _)) = listener.accept() {
                        s.set_nonblocking(true).expect("nonblocking");
                        held.push((s, 0, Instant::now()));
                    }
                    for (s, got, _) in held.iter_mut() {
                        while *got < TAKES {
                            match s.read(&mut buf[..(TAKES - *got).min(64 << 10)]) {
                                Ok(0) | Err(_) => break,
                                Ok(n) => {
                                    *got += n;
                                    if *got >= TAKES {
                                        full.fetch_add(1, Ordering::Relaxed);
                                        // As the daemon's `stop_receiving`: the receive buffer shrunk.
                                        let _ = socket2::SockRef::from(&*s).set_recv_buffer_size(1);
                                    }
                                }
                            }
                        }
                    }
                    held.retain(|(_, _, at)| at.elapsed() < Duration::from_secs(1));
                    std::thread::sleep(Duration::from_millis(2));
                }
            })
        };
        let tally = Tally::default();
        let attacker = {
            let stop = stop.clone();
            std::thread::scope(|s| {
                let h = s.spawn(|| oversized(addr, &stop, &tally));
                std::thread::sleep(Duration::from_millis(2500));
                stop.store(true, Ordering::Relaxed);
                h.join()
            })
        };
        attacker.expect("attacker");
        daemon.join().expect("listener");
        let conns = tally.actions.load(Ordering::Relaxed);
        let sent = tally.bytes_sent.load(Ordering::Relaxed);
        let full = full.load(Ordering::Relaxed);
        // Two rounds of 64 connections at least (each held 1 s), every one of the first filled to what
        // the daemon takes.
        assert!(conns >= 128, "{conns} connections");
        assert!(
            full >= 64,
            "only {full} of {conns} connections delivered the {TAKES} bytes the daemon reads"
        );
        let per_conn = sent / conns;
        assert!(
            per_conn <= 3 << 19,
            "the attacker queued {} KiB a connection ({} MiB over {conns}), most of it never read",
            per_conn >> 10,
            sent >> 20
        );
    }
}
