//! The client side of a peer session, blocking std sockets with deadlines: the encrypted channel
//! ([`SecureStream`]: `dd_coop::channel` over a TCP stream), the identity handshake inside it, one
//! request and its answer ([`Coop::exchange`]), and the per-peer bound on open sessions.
//!
//! **Per-peer sessions** (issue 30, item 1): the listener of every node accepts at most
//! `coop.max_sessions_per_peer` sessions of one node, so this side never holds more than that many
//! connections to one peer (a request that finds them all busy waits for one, within its own timeout),
//! and drops a pooled connection idle for half of `coop.idle_timeout_ms`, before the listener closes it
//! and a request would meet a closed connection.
//!
//! Used by the daemon (`Coop`'s requests: called on the remotifier thread, on connection threads
//! inside `block_in_place`, and on the blocking pool) and by the tests and benchmarks that speak the
//! peer protocol by hand ([`SecureStream`] is public for them).

use super::{Coop, Peer, PeerError};
use dd_coop::channel::{self, Channel, RECORD_HEADER};
use dd_coop::identity::{Role, Transcript};
use dd_coop::wire::{self, PeerHeader, PeerRequest, PeerResponse, HEADER_LEN};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

/// A TCP stream inside a peer session's encrypted channel.
#[derive(Debug)]
pub struct SecureStream {
    stream: TcpStream,
    channel: Channel,
    /// Plaintext received and not yet taken, from `at`.
    plain: Vec<u8>,
    at: usize,
    /// One record's ciphertext.
    record: Vec<u8>,
    /// Sealed bytes to write.
    out: Vec<u8>,
}

impl SecureStream {
    /// Runs the channel's handshake (`dd_coop::channel`, the connecting side) on an open stream.
    pub fn over(mut stream: TcpStream, deadline: Instant) -> Result<SecureStream, PeerError> {
        let (init, first) = channel::initiate()?;
        stream.set_write_timeout(Some(left(deadline)?))?;
        stream.write_all(&first)?;
        let mut head = [0u8; RECORD_HEADER];
        read_until(&mut stream, &mut head, deadline)?;
        let n = u16::from_le_bytes(head) as usize;
        if n > channel::MAX_HANDSHAKE_MESSAGE {
            return Err(dd_coop::channel::ChannelError::Length(n).into());
        }
        let mut msg = vec![0u8; n];
        read_until(&mut stream, &mut msg, deadline)?;
        let channel = init.finish(&msg)?;
        Ok(SecureStream { stream, channel, plain: Vec::new(), at: 0, record: Vec::new(), out: Vec::new() })
    }

    /// Connects to `addr` within `connect_timeout` and runs the channel's handshake by `deadline`.
    pub fn connect(
        addr: SocketAddr,
        connect_timeout: Duration,
        deadline: Instant,
    ) -> Result<SecureStream, PeerError> {
        let stream = TcpStream::connect_timeout(&addr, connect_timeout)?;
        stream.set_nodelay(true)?;
        SecureStream::over(stream, deadline)
    }

    /// The channel's handshake hash (what the identity signatures must cover).
    pub fn binding(&self) -> &[u8; channel::BINDING_LEN] {
        self.channel.binding()
    }

    /// The TCP stream under the channel.
    pub fn tcp(&self) -> &TcpStream {
        &self.stream
    }

    /// Seals and writes `plain` (whole frames), within `timeout`.
    pub fn send(&mut self, plain: &[u8], timeout: Duration) -> Result<(), PeerError> {
        self.out.clear();
        self.channel.seal(plain, &mut self.out)?;
        self.stream.set_write_timeout(Some(timeout))?;
        self.stream.write_all(&self.out)?;
        Ok(())
    }

    /// Fills `buf` with plaintext, reading and opening records as needed, by `deadline`.
    pub fn read_exact(&mut self, buf: &mut [u8], deadline: Instant) -> Result<(), PeerError> {
        while self.plain.len() - self.at < buf.len() {
            if self.at > 0 {
                self.plain.drain(..self.at);
                self.at = 0;
            }
            let mut head = [0u8; RECORD_HEADER];
            read_until(&mut self.stream, &mut head, deadline)?;
            let n = channel::record_len(head)?;
            self.record.resize(n, 0);
            read_until(&mut self.stream, &mut self.record, deadline)?;
            self.channel.open(&self.record, &mut self.plain)?;
        }
        buf.copy_from_slice(&self.plain[self.at..self.at + buf.len()]);
        self.at += buf.len();
        Ok(())
    }

    /// Reads one frame (header and payload of at most `max_payload` bytes) by `deadline`.
    pub fn read_frame(
        &mut self,
        max_payload: u32,
        deadline: Instant,
    ) -> Result<(PeerHeader, Vec<u8>), PeerError> {
        let mut head = [0u8; HEADER_LEN];
        self.read_exact(&mut head, deadline)?;
        let h = wire::parse_header(&head, max_payload)?.ok_or(wire::WireError::BadFrame)?;
        let mut payload = vec![0u8; h.payload_len as usize];
        self.read_exact(&mut payload, deadline)?;
        Ok((h, payload))
    }
}

fn left(deadline: Instant) -> std::io::Result<Duration> {
    let left = deadline.saturating_duration_since(Instant::now());
    if left.is_zero() {
        return Err(std::io::ErrorKind::TimedOut.into());
    }
    Ok(left)
}

/// `read_exact` bounded by a deadline (the socket timeout is re-armed with the time left).
fn read_until(s: &mut TcpStream, buf: &mut [u8], deadline: Instant) -> std::io::Result<()> {
    let mut at = 0;
    while at < buf.len() {
        s.set_read_timeout(Some(left(deadline)?))?;
        match s.read(&mut buf[at..]) {
            Ok(0) => return Err(std::io::ErrorKind::UnexpectedEof.into()),
            Ok(n) => at += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// An authenticated session with a peer.
pub(super) struct Conn {
    stream: SecureStream,
    /// The peer's epoch from this connection's HELLO.
    pub(super) epoch: u64,
    next_id: u64,
    /// When it last finished a request (pooled connections idle too long are dropped).
    pub(super) used: Instant,
}

/// A peer's open sessions: the idle ones, and how many exist (idle or in use).
#[derive(Default)]
pub(super) struct Pool {
    pub(super) idle: Vec<Conn>,
    pub(super) open: usize,
}

impl Coop {
    /// Opens a session with `peer`: the channel, then HELLO and AUTH inside it (the peer's name,
    /// epoch, nonce and signature checked against the key the membership lists for the node we
    /// dialled, over a transcript holding the channel's hash; then our own signature).
    pub(super) fn connect(&self, peer: &Peer) -> Result<Conn, PeerError> {
        let addr_s = peer.addr.read().clone();
        let addr: SocketAddr = addr_s
            .to_socket_addrs()
            .ok()
            .and_then(|mut a| a.next())
            .ok_or_else(|| PeerError::Address(addr_s.clone()))?;
        let key = self.members.get(&peer.name).ok_or(PeerError::Identity)?;
        let connect_timeout = Duration::from_millis(self.cfg.connect_timeout_ms);
        let stream = SecureStream::connect(addr, connect_timeout, Instant::now() + self.timeout())?;
        let mut conn = Conn { stream, epoch: 0, next_id: 1, used: Instant::now() };
        let nonce = self.nonce();
        let req = PeerRequest::Hello { name: &self.me, epoch: self.epoch, nonce };
        let (h, payload) = self.exchange(&mut conn, &req)?;
        let PeerResponse::Hello { name, epoch, nonce: theirs, signature } =
            PeerResponse::decode(h.op, &payload, self.page_size)?
        else {
            return Err(PeerError::Identity);
        };
        let binding = *conn.stream.binding();
        let t = Transcript {
            client: &self.me,
            server: name,
            client_epoch: self.epoch,
            server_epoch: epoch,
            client_nonce: &nonce,
            server_nonce: &theirs,
            binding: &binding,
        };
        if name != peer.name || !t.verify(Role::Server, key, &signature) {
            return Err(PeerError::Identity);
        }
        let signature = self.key.sign(Role::Client, &t);
        self.exchange(&mut conn, &PeerRequest::Auth { signature })?;
        conn.epoch = epoch;
        self.saw_epoch(peer, epoch);
        Ok(conn)
    }

    /// Sends one request and reads its response within the request timeout.
    pub(super) fn exchange(
        &self,
        conn: &mut Conn,
        req: &PeerRequest<'_>,
    ) -> Result<(PeerHeader, Vec<u8>), PeerError> {
        let deadline = Instant::now() + self.timeout();
        let id = conn.next_id;
        conn.next_id += 1;
        let mut buf = Vec::with_capacity(HEADER_LEN + 64);
        req.encode(id, &mut buf);
        conn.stream.send(&buf, self.timeout())?;
        let max = wire::max_answer_payload(self.page_size) as u32;
        let (h, payload) = conn.stream.read_frame(max, deadline)?;
        if h.request_id != id || h.op != req.op() as u8 || h.flags & wire::FLAG_RESPONSE == 0 {
            return Err(wire::WireError::Malformed("response header").into());
        }
        if h.status != 0 {
            return Err(PeerError::Status(h.status));
        }
        conn.used = Instant::now();
        Ok((h, payload))
    }

    /// A session with `peer`, and whether it was used before: an idle pooled one (those idle past half
    /// of `coop.idle_timeout_ms` are dropped first), a new one while fewer than
    /// `coop.max_sessions_per_peer` are open, or else the first one given back within the request
    /// timeout.
    pub(super) fn checkout(&self, peer: &Peer) -> Result<(Conn, bool), PeerError> {
        let stale = Duration::from_millis(self.cfg.idle_timeout_ms / 2);
        let deadline = Instant::now() + self.timeout();
        let mut pool = peer.conns.lock();
        loop {
            let before = pool.idle.len();
            pool.idle.retain(|c| c.used.elapsed() < stale);
            pool.open -= before - pool.idle.len();
            if let Some(c) = pool.idle.pop() {
                return Ok((c, true));
            }
            if pool.open < self.cfg.max_sessions_per_peer {
                pool.open += 1;
                drop(pool);
                let c = self.connect(peer);
                if c.is_err() {
                    self.closed(peer);
                }
                return c.map(|c| (c, false));
            }
            if peer.returned.wait_until(&mut pool, deadline).timed_out() {
                return Err(PeerError::Io(std::io::ErrorKind::TimedOut.into()));
            }
        }
    }

    /// Gives a session back to `peer`'s pool.
    pub(super) fn pool(&self, peer: &Peer, conn: Conn) {
        peer.conns.lock().idle.push(conn);
        peer.returned.notify_one();
    }

    /// A session of `peer`'s was dropped (failed, or its state unknown).
    pub(super) fn closed(&self, peer: &Peer) {
        let mut pool = peer.conns.lock();
        pool.open = pool.open.saturating_sub(1);
        drop(pool);
        peer.returned.notify_one();
    }
}
