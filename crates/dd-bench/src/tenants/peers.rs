//! The peer attacks of `bench tenants` (issue 30, acceptance 2): against the daemon under test (node
//! `bench-a`) while a real victim peer (`bench-v`, a second daemon 10 ms away each way through a
//! [`Relay`]) publishes to it, opening a new session each time:
//!
//! * `peer_sessions`: a member (`bench-m`, whose key the attacker holds) keeps 64 authenticated
//!   sessions open on the listener (all of them, before per-node limits), reopening any that closes;
//! * `peer_flood`: connections from another address (`127.0.0.2`) that never say anything, as fast as
//!   one thread opens them, the latest 100 kept open;
//! * `peer_inject`: after each of the victim's publications, a record of the attacker's own (a FETCH
//!   frame and a tag's worth of bytes) is written into the victim's relayed session; each must be
//!   refused: the session closed with no byte of answer.
//!
//! The victim's publications during the attacked window are counted (`publishes_delivered` of
//! `publishes_attempted`, at least 95% to pass), as are the injected records and those refused.
//! Invariant: every socket goes to 127.0.0.1 (from 127.0.0.1 or 127.0.0.2) and is closed when the
//! attack returns.

use super::tally::Tally;
use crate::daemon::{BenchVm, Daemon, DaemonError, DaemonOptions, HOST_TOKEN};
use crate::relay::Relay;
use dd_coop::identity::{NodeKey, Role, Transcript};
use dd_coop::wire::{PeerOp, PeerRequest, PeerResponse};
use dd_server::coop::SecureStream;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Latency the relay adds each way between the victim and the daemon under test.
pub const VICTIM_DELAY: Duration = Duration::from_millis(10);
/// Sessions the `peer_sessions` attacker holds (the listener's shared limit before issue 30).
const HELD_SESSIONS: usize = 64;
/// Silent connections the flood keeps open.
const FLOOD_OPEN: usize = 100;
/// Pause between the victim's publications.
const PUBLISH_EVERY: Duration = Duration::from_millis(100);

/// The victim peer, the relay in front of the daemon under test, and the attacker's member key.
pub struct PeerSetup {
    pub victim: Daemon,
    pub relay: Relay,
    pub member: NodeKey,
}

/// What the victim saw during an attacked window.
#[derive(Debug, Default)]
pub struct Delivery {
    pub attempted: AtomicU64,
    pub delivered: AtomicU64,
    pub injected: AtomicU64,
    pub refused: AtomicU64,
}

/// The victim's daemon: one VM, co-operative de-duplication with the daemon under test (`target`,
/// reached through `relay_port`), its pooled sessions kept only briefly so that each publication
/// opens a new one.
pub fn start_victim(
    exe: &std::path::Path,
    me: &crate::remote::BenchNode,
    target: &crate::remote::BenchNode,
    relay_port: u16,
) -> Result<Daemon, DaemonError> {
    let extra = format!(
        "dedup = true\n[coop]\nenabled = true\nlisten = \"127.0.0.1:{}\"\nnode_name = {:?}\n\
         dedup_group = \"peers\"\nkey_file = {:?}\npublish_interval_ms = 3600000\nrequest_timeout_ms = 2000\n\
         connect_timeout_ms = 2000\npeer_backoff_ms = 50\n\
         peers = [{{ name = {:?}, addr = \"127.0.0.1:{relay_port}\", public_key = {:?} }}]\n",
        me.port,
        me.name,
        me.key_file.display().to_string(),
        target.name,
        target.key.public_text(),
    );
    Daemon::start(&DaemonOptions {
        exe: exe.to_path_buf(),
        mem_capacity_bytes: 16 << 20,
        ssd_capacity_bytes: 0,
        vms: vec![BenchVm::new(9)],
        extra_toml: extra,
    })
}

/// The peer handshake as `name` with `key` on a new connection to `coop`; the session, or `None`
/// when the listener refused it (`busy`, closed).
fn member_session(coop: SocketAddr, name: &str, key: &NodeKey) -> Option<SecureStream> {
    let deadline = Instant::now() + Duration::from_secs(2);
    let mut s = SecureStream::connect(coop, Duration::from_secs(2), deadline).ok()?;
    let call = |s: &mut SecureStream, req: &PeerRequest<'_>| -> Option<Vec<u8>> {
        let mut buf = Vec::new();
        req.encode(1, &mut buf);
        s.send(&buf, Duration::from_secs(2)).ok()?;
        let (h, payload) = s.read_frame(4096, deadline).ok()?;
        (h.status == 0).then_some(payload)
    };
    let nonce = [0x42; 32];
    let payload = call(&mut s, &PeerRequest::Hello { name, epoch: 7, nonce })?;
    let Ok(PeerResponse::Hello { name: server, epoch, nonce: theirs, .. }) =
        PeerResponse::decode(PeerOp::Hello as u8, &payload, 4096)
    else {
        return None;
    };
    let binding = *s.binding();
    let t = Transcript {
        client: name,
        server,
        client_epoch: 7,
        server_epoch: epoch,
        client_nonce: &nonce,
        server_nonce: &theirs,
        binding: &binding,
    };
    call(&mut s, &PeerRequest::Auth { signature: key.sign(Role::Client, &t) })?;
    s.tcp().set_nonblocking(true).ok()?;
    Some(s)
}

/// Whether the listener closed `s` (nonblocking peek).
fn closed(s: &SecureStream) -> bool {
    let mut b = [0u8; 1];
    match s.tcp().peek(&mut b) {
        Ok(0) => true,
        Ok(_) => false,
        Err(e) => e.kind() != std::io::ErrorKind::WouldBlock,
    }
}

/// `peer_sessions`: holds [`HELD_SESSIONS`] sessions as `bench-m` until `stop`.
pub fn hold_sessions(coop: SocketAddr, member: &NodeKey, stop: &AtomicBool, tally: &Tally) {
    let mut held: Vec<SecureStream> = Vec::new();
    while !stop.load(Ordering::Relaxed) {
        held.retain(|s| !closed(s));
        while held.len() < HELD_SESSIONS && !stop.load(Ordering::Relaxed) {
            tally.act(1);
            match member_session(coop, "bench-m", member) {
                Some(s) => held.push(s),
                // Refused (the per-node limit): try again after the pause.
                None => break,
            }
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// `peer_flood`: silent connections from `127.0.0.2` until `stop`.
pub fn flood(coop: SocketAddr, stop: &AtomicBool, tally: &Tally) {
    use socket2::{Domain, Socket, Type};
    let from: SocketAddr = ([127, 0, 0, 2], 0).into();
    let mut open = std::collections::VecDeque::new();
    while !stop.load(Ordering::Relaxed) {
        let Ok(s) = Socket::new(Domain::IPV4, Type::STREAM, None) else { continue };
        if s.bind(&from.into()).is_err() || s.connect_timeout(&coop.into(), Duration::from_secs(1)).is_err() {
            std::thread::sleep(Duration::from_millis(1));
            continue;
        }
        tally.act(1);
        open.push_back(s);
        if open.len() > FLOOD_OPEN {
            open.pop_front();
        }
    }
}

/// The victim's publications until `stop`: each through a new session (the relay's last one is cut
/// first, or, with `inject`, killed by the record injected after the previous publication).
pub fn publish_loop(p: &PeerSetup, inject: bool, stop: &AtomicBool, d: &Delivery) {
    // A FETCH frame as a record: a length, the frame, 16 bytes where the tag would be.
    let mut fetch = Vec::new();
    PeerRequest::Fetch { pin: 1 }.encode(77, &mut fetch);
    fetch.extend_from_slice(&[0; 16]);
    let mut record = (fetch.len() as u16).to_le_bytes().to_vec();
    record.extend_from_slice(&fetch);
    while !stop.load(Ordering::Relaxed) {
        if !inject {
            p.relay.cut();
        }
        d.attempted.fetch_add(1, Ordering::Relaxed);
        let reached = p
            .victim
            .admin::<serde_json::Value>("POST", "/v1/host/coop/publish", HOST_TOKEN, None)
            .ok()
            .and_then(|v| v["peers_reached"].as_u64())
            .unwrap_or(0);
        if reached == 1 {
            d.delivered.fetch_add(1, Ordering::Relaxed);
        }
        if inject {
            let before = p.relay.from_upstream();
            if p.relay.inject(&record) {
                d.injected.fetch_add(1, Ordering::Relaxed);
                if p.relay.wait_upstream_closed(Duration::from_secs(2)) && p.relay.from_upstream() == before {
                    d.refused.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
        std::thread::sleep(PUBLISH_EVERY);
    }
}
