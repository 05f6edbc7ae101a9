//! The server side of the peer protocol: the socket, the encrypted channel (`dd_coop::channel`), the
//! handshake inside it (HELLO and AUTH: a peer proves the name it claims with the key the membership
//! lists for it, over a transcript holding the channel's hash, `dd_coop::identity`), then one
//! authenticated peer's requests (summaries, remote compares that pin frames for it, fetches and unpins
//! of its own pins), answered by `dd_coop::serve` over the engine and the pin table (`Host`); and the
//! pins released on a new epoch or after `pin_ttl_ms` of silence (the rules are
//! `dd_coop::pins::PinTable`'s; this module holds its lock and makes the engine calls).
//!
//! Pin handles are random 64-bit numbers, kept per owner: a handle means something only to the
//! authenticated node it was granted to, so no node can fetch or release another's pins by guessing.
//! Lock order: `owners` is taken alone, or with `rng` inside it to draw a handle (engine calls on the
//! pins happen after it is released).

use super::{Coop, PeerError, Summary};
use crate::capture::Channel as Channel_;
use crate::state::ServerState;
use dd_coop::channel::{self, Channel, RECORD_HEADER};
use dd_coop::identity::{Role, Transcript, NONCE_LEN};
use dd_coop::pins::PinTable;
use dd_coop::serve::{self, PinHost, Served};
use dd_coop::wire::{self, PeerHeader, PeerOp, PeerRequest, PeerResponse, PeerStatus, HEADER_LEN};
use rand::RngCore;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

impl Coop {
    pub(super) fn expire_owners(&self) {
        let ttl = Duration::from_millis(self.cfg.pin_ttl_ms);
        let expired = self.owners.lock().expire(Instant::now(), ttl);
        if let Some(state) = self.state.upgrade() {
            for pin in &expired {
                state.cache.unpin(*pin);
            }
        }
        self.stats.pins_released_ttl.fetch_add(expired.len() as u64, Ordering::Relaxed);
    }

    // ------------------------------------------------------------------------------------------
    // Server side: one authenticated peer connection
    // ------------------------------------------------------------------------------------------

    /// Handles one request of an authenticated peer `from` (`dd_coop::serve`; no I/O, engine calls
    /// are memory-only), and keeps what it served in the counters and the peer's summary.
    fn handle(
        &self,
        state: &ServerState,
        from: &str,
        epoch: u64,
        h: &PeerHeader,
        payload: &[u8],
        out: &mut Vec<u8>,
    ) {
        let host = Host { coop: self, state };
        let count = |c: &std::sync::atomic::AtomicU64| c.fetch_add(1, Ordering::Relaxed);
        match serve::handle(&host, from, epoch, h, payload, Instant::now(), out) {
            Served::Summary(filter) => {
                if let Some(p) = self.peers.read().iter().find(|p| p.name == from) {
                    *p.summary.write() = Some(Summary { filter, received: Instant::now() });
                    count(&self.stats.summaries_received);
                }
            }
            Served::Compared { pinned } => {
                count(&self.stats.compares_served);
                if pinned {
                    count(&self.stats.remote_dedups);
                }
            }
            Served::Fetched => {
                count(&self.stats.fetches_served);
            }
            _ => {}
        }
    }

    /// A peer proved its name (HELLO and AUTH): a new epoch means it restarted and holds none of its
    /// old references. Only an authenticated peer gets here, so nobody else can release its pins.
    fn hello(&self, state: &ServerState, from: &str, epoch: u64) {
        let released = self.owners.lock().hello(from, epoch, Instant::now());
        for p in &released {
            state.cache.unpin(*p);
        }
        self.stats.pins_released_epoch.fetch_add(released.len() as u64, Ordering::Relaxed);
    }
}

/// The engine and the pin table as `dd_coop::serve` sees them.
struct Host<'a> {
    coop: &'a Coop,
    state: &'a ServerState,
}

impl PinHost for Host<'_> {
    fn page_size(&self) -> usize {
        self.coop.page_size
    }
    fn max_pins(&self) -> u64 {
        self.coop.cfg.max_pins
    }
    fn pins_held(&self) -> u64 {
        self.state.cache.pins_held()
    }
    fn pin(&self, hash: u128, page: &[u8]) -> Option<u64> {
        self.state.cache.pin(hash, page)
    }
    fn read_pin(&self, pin: u64, out: &mut [u8]) -> bool {
        self.state.cache.read_pin(pin, out)
    }
    fn unpin(&self, pin: u64) {
        self.state.cache.unpin(pin);
    }
    fn with_pins<R>(&self, f: impl FnOnce(&mut PinTable) -> R) -> R {
        f(&mut self.coop.owners.lock())
    }
    fn draw_handle(&self) -> u64 {
        self.coop.rng.lock().next_u64()
    }
}

/// Where a peer connection's handshake stands.
enum Handshake {
    /// Waiting for HELLO.
    Hello,
    /// HELLO answered with our signature; waiting for the peer's AUTH over the same transcript.
    Auth { name: String, epoch: u64, client_nonce: [u8; NONCE_LEN], server_nonce: [u8; NONCE_LEN] },
}

/// One peer connection's stream inside its encrypted channel (`dd_coop::channel`): reads open records
/// into a plaintext buffer, writes seal whole frames.
struct Secure {
    stream: tokio::net::TcpStream,
    channel: Channel,
    plain: Vec<u8>,
    at: usize,
    record: Vec<u8>,
    sealed: Vec<u8>,
}

impl Secure {
    /// Fills `buf` with plaintext. An error (closed, a record that fails authentication) ends the
    /// session.
    async fn read_exact(&mut self, buf: &mut [u8]) -> Result<(), PeerError> {
        while self.plain.len() - self.at < buf.len() {
            if self.at > 0 {
                self.plain.drain(..self.at);
                self.at = 0;
            }
            let mut head = [0u8; RECORD_HEADER];
            self.stream.read_exact(&mut head).await?;
            let n = channel::record_len(head)?;
            self.record.resize(n, 0);
            self.stream.read_exact(&mut self.record).await?;
            self.channel.open(&self.record, &mut self.plain)?;
        }
        buf.copy_from_slice(&self.plain[self.at..self.at + buf.len()]);
        self.at += buf.len();
        Ok(())
    }

    async fn write_all(&mut self, plain: &[u8]) -> Result<(), PeerError> {
        self.sealed.clear();
        self.channel.seal(plain, &mut self.sealed)?;
        self.stream.write_all(&self.sealed).await?;
        Ok(())
    }
}

/// The channel's handshake on a new connection (the accepting side). A connection that opens with
/// the peer frame magic is a peer of an older protocol version: it is told `bad_frame` in the clear.
async fn open_channel(stream: &mut tokio::net::TcpStream) -> Option<Channel> {
    let mut head = [0u8; RECORD_HEADER];
    stream.read_exact(&mut head).await.ok()?;
    if head == wire::MAGIC {
        let mut out = Vec::new();
        let msg = "this node speaks peer protocol version 3: every session is encrypted";
        wire::encode_error(PeerOp::Hello as u8, 0, PeerStatus::BAD_FRAME, msg, &mut out);
        let _ = stream.write_all(&out).await;
        return None;
    }
    let n = u16::from_le_bytes(head) as usize;
    if n > channel::MAX_HANDSHAKE_MESSAGE {
        return None;
    }
    let mut msg = vec![0u8; n];
    stream.read_exact(&mut msg).await.ok()?;
    let (ch, answer) = channel::respond(&msg).ok()?;
    stream.write_all(&answer).await.ok()?;
    Some(ch)
}

/// Why reading a frame stopped.
enum Stop {
    /// Closed, timed out, displaced, shutting down, or a frame refused (its answer sent).
    Ended,
}

/// Reads one frame (payload at most `max`), answering a refused header; records what it read.
async fn read_frame(
    coop: &Coop,
    s: &mut Secure,
    max: u32,
    rec: &mut crate::capture::Recorder,
) -> Result<(PeerHeader, Vec<u8>), Stop> {
    let mut head = [0u8; HEADER_LEN];
    if let Err(e) = s.read_exact(&mut head).await {
        if matches!(e, PeerError::Channel(_)) {
            coop.stats.records_refused.fetch_add(1, Ordering::Relaxed);
        }
        return Err(Stop::Ended);
    }
    rec.received(&head);
    let h = match wire::parse_header(&head, max) {
        Ok(Some(h)) => h,
        Ok(None) => return Err(Stop::Ended),
        Err(e) => {
            let mut out = Vec::new();
            wire::encode_error(head[3], 0, e.status(), &e.to_string(), &mut out);
            rec.sent(&out);
            let _ = s.write_all(&out).await;
            return Err(Stop::Ended);
        }
    };
    let mut payload = vec![0u8; h.payload_len as usize];
    match tokio::time::timeout(Duration::from_secs(30), s.read_exact(&mut payload)).await {
        Ok(Ok(())) => {}
        Ok(Err(PeerError::Channel(_))) => {
            coop.stats.records_refused.fetch_add(1, Ordering::Relaxed);
            return Err(Stop::Ended);
        }
        _ => return Err(Stop::Ended),
    }
    rec.received(&payload);
    Ok((h, payload))
}

/// Serves one peer connection: the encrypted channel, HELLO and AUTH inside it (the peer proves its
/// name with its key, over a transcript holding the channel's hash), then requests in order.
///
/// Called on the handshake thread (`crate::handshake`, lower CPU priority), where everything before
/// AUTH runs: a flood of connections that never authenticate gets only the CPU the sessions leave.
/// The authenticated session moves to the `sessions` runtime. Before AUTH the connection holds a
/// handshake slot (`slots`: displaced only by a newer connection of its own pool), reads at most 4096
/// payload bytes per frame, and must finish within `coop.handshake_timeout_ms`: a connection that
/// says nothing costs its task and a few hundred bytes, for a few seconds. A name outside the
/// membership is refused at its HELLO, a wrong signature at AUTH, a node that already holds
/// `coop.max_sessions_per_peer` sessions is answered `busy`; none of them touches any pin. An
/// authenticated session that sends nothing for `coop.idle_timeout_ms` is closed. A record that fails
/// authentication (tampered, injected, replayed) closes the connection at once. With `capture.dir`
/// set, the connection's plaintext frames are recorded (`crate::capture`).
pub async fn serve_peer(
    coop: Arc<Coop>,
    state: Arc<ServerState>,
    stream: tokio::net::TcpStream,
    stop: tokio::sync::watch::Receiver<bool>,
    slot: super::slots::Handshake,
    sessions: tokio::runtime::Handle,
) {
    let mut rec = state.recorder(Channel_::Peer);
    let Some((s, name, epoch, session)) =
        handshake(&coop, &state, stream, stop.clone(), slot, &mut rec).await
    else {
        return;
    };
    let Secure { stream, channel, plain, at, record, sealed } = s;
    let stream = match crate::handshake::Rehome::rehome(stream, &sessions) {
        Ok(s) => s,
        Err(e) => {
            tracing::warn!("moving an authenticated peer connection to the session runtime: {e}");
            return;
        }
    };
    let s = Secure { stream, channel, plain, at, record, sealed };
    sessions.spawn(async move {
        serve_session(&coop, &state, s, &name, epoch, stop, &mut rec).await;
        drop(session);
    });
}

/// The channel and the identity handshake; the authenticated stream, its node's name and epoch and
/// its session slot, or `None` (refused, timed out, displaced, shutting down).
async fn handshake(
    coop: &Coop,
    state: &ServerState,
    mut stream: tokio::net::TcpStream,
    mut stop: tokio::sync::watch::Receiver<bool>,
    mut slot: super::slots::Handshake,
    rec: &mut crate::capture::Recorder,
) -> Option<(Secure, String, u64, super::slots::Session)> {
    let deadline = tokio::time::Instant::now() + Duration::from_millis(coop.cfg.handshake_timeout_ms);
    let ch = tokio::select! {
        c = open_channel(&mut stream) => c,
        _ = tokio::time::sleep_until(deadline) => None,
        _ = &mut slot.displaced => None,
        _ = stop.changed() => None,
    };
    let mut s =
        Secure { stream, channel: ch?, plain: Vec::new(), at: 0, record: Vec::new(), sealed: Vec::new() };
    let mut hs = Handshake::Hello;
    let mut out = Vec::new();
    loop {
        let (h, payload) = tokio::select! {
            r = read_frame(coop, &mut s, 4096, rec) => r.ok()?,
            _ = tokio::time::sleep_until(deadline) => return None,
            _ = &mut slot.displaced => return None,
            _ = stop.changed() => return None,
        };
        out.clear();
        let refuse = |status: PeerStatus, msg: &str, out: &mut Vec<u8>| {
            if status == PeerStatus::AUTH_FAILED {
                coop.stats.auth_failures.fetch_add(1, Ordering::Relaxed);
            }
            wire::encode_error(h.op, h.request_id, status, msg, out);
        };
        let binding = *s.channel.binding();
        let mut done = None;
        match (&hs, PeerRequest::decode(h.op, &payload, coop.page_size)) {
            (Handshake::Hello, Ok(PeerRequest::Hello { name, epoch, nonce }))
                if coop.members.contains_key(name) && name != coop.me =>
            {
                let server_nonce = coop.nonce();
                let t = Transcript {
                    client: name,
                    server: &coop.me,
                    client_epoch: epoch,
                    server_epoch: coop.epoch,
                    client_nonce: &nonce,
                    server_nonce: &server_nonce,
                    binding: &binding,
                };
                let signature = coop.key.sign(Role::Server, &t);
                PeerResponse::Hello { name: &coop.me, epoch: coop.epoch, nonce: server_nonce, signature }
                    .encode(h.op, h.request_id, &mut out);
                hs = Handshake::Auth { name: name.to_string(), epoch, client_nonce: nonce, server_nonce };
            }
            (Handshake::Hello, Ok(PeerRequest::Hello { .. })) => {
                refuse(PeerStatus::AUTH_FAILED, "not a member of this daemon's co-operative group", &mut out);
                done = Some(None);
            }
            (
                Handshake::Auth { name, epoch, client_nonce, server_nonce },
                Ok(PeerRequest::Auth { signature }),
            ) => {
                let t = Transcript {
                    client: name,
                    server: &coop.me,
                    client_epoch: *epoch,
                    server_epoch: coop.epoch,
                    client_nonce,
                    server_nonce,
                    binding: &binding,
                };
                let key = coop.members.get(name).expect("checked at HELLO");
                if !t.verify(Role::Client, key, &signature) {
                    refuse(PeerStatus::AUTH_FAILED, "the signature does not prove this name", &mut out);
                    done = Some(None);
                } else if let Some(session) = slot.authenticate(name) {
                    coop.hello(state, name, *epoch);
                    PeerResponse::Done.encode(h.op, h.request_id, &mut out);
                    rec.sent(&out);
                    s.write_all(&out).await.ok()?;
                    return Some((s, name.clone(), *epoch, session));
                } else {
                    coop.stats.sessions_refused.fetch_add(1, Ordering::Relaxed);
                    let msg = "this node holds its maximum of sessions here (coop.max_sessions_per_peer)";
                    refuse(PeerStatus::BUSY, msg, &mut out);
                    // The slot went with the refused authentication.
                    rec.sent(&out);
                    let _ = s.write_all(&out).await;
                    return None;
                }
            }
            _ => {
                refuse(PeerStatus::NOT_AUTHENTICATED, "the first frames must be HELLO, then AUTH", &mut out);
                done = Some(None);
            }
        }
        rec.sent(&out);
        if s.write_all(&out).await.is_err() {
            return None;
        }
        if let Some(end) = done {
            return end;
        }
    }
}

/// One authenticated node's requests, in order, until it closes, a record fails, it stays silent for
/// `coop.idle_timeout_ms`, or the daemon stops.
async fn serve_session(
    coop: &Coop,
    state: &ServerState,
    mut s: Secure,
    name: &str,
    epoch: u64,
    mut stop: tokio::sync::watch::Receiver<bool>,
    rec: &mut crate::capture::Recorder,
) {
    let idle = Duration::from_millis(coop.cfg.idle_timeout_ms);
    let mut out = Vec::new();
    loop {
        let (h, payload) = tokio::select! {
            r = read_frame(coop, &mut s, wire::ABSOLUTE_MAX_PAYLOAD, rec) => match r {
                Ok(f) => f,
                Err(Stop::Ended) => return,
            },
            _ = tokio::time::sleep(idle) => {
                coop.stats.sessions_idle_closed.fetch_add(1, Ordering::Relaxed);
                return;
            }
            _ = stop.changed() => return,
        };
        out.clear();
        coop.handle(state, name, epoch, &h, &payload, &mut out);
        rec.sent(&out);
        if s.write_all(&out).await.is_err() {
            return;
        }
    }
}
