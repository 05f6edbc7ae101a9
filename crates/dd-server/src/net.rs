//! Data-plane listeners (Unix socket, TCP) and the per-connection loop.
//!
//! A connection reads into one input buffer, splits as many complete frames as it holds, handles them
//! in order (appending every response to one output buffer) and writes the responses out together:
//! pipelining costs one read and one write per burst, not per request.
//!
//! **Handshake** (until HELLO succeeds): the connection holds a handshake slot (`admission`: displaced
//! oldest first when every slot is taken), reads into a fixed 512-byte buffer, refuses from its header
//! alone any frame larger than a HELLO can be (`frame_too_large`), and is closed when
//! `limits.handshake_timeout_ms` passes first. So an unauthenticated connection costs its task and
//! that buffer: a few KiB. A failed handshake (bad frame, wrong token, ...) is answered only after
//! `limits.handshake_fail_delay_ms`, unread meanwhile, still in its displaceable slot: a client that
//! reconnects on every refusal waits instead of making the daemon (and the kernel under it) accept and
//! close connections as fast as it can open them. The session's buffers are allocated only after
//! HELLO. Accepting and the handshake run on the handshake thread (its own runtime, at a lower CPU
//! priority: `handshake`);
//! after its HELLO a connection moves to the session runtime, so a flood of connections that never
//! authenticate does not queue in front of other VMs' requests.
//!
//! **Session**: bounded memory per connection: the input buffer never holds more than one incomplete
//! frame, whose payload is at most `max_payload` (a header announcing more is refused before its
//! payload is read); the output buffer is written out as soon as it passes `write_buffer_bytes`, so it
//! holds at most that plus one response, and every response fits `max_payload` (the handler caps the
//! variable ones). A session holds an output buffer only from the start of a burst until its
//! responses are written: the runtime thread lends it one it used a moment ago, still in the CPU
//! caches, and keeps it for the next burst of any session (at most `SPARE_OUT_BUFFERS` per thread). A client that does not read its responses blocks on TCP back-pressure alone, and is
//! closed after `limits.idle_timeout_ms` without progress, like one that sends nothing. Every burst of
//! frames runs inside the session's registration (`auth::Registration::enter`); a revoked registration
//! (VM removed, tokens replaced) closes the connection at once, idle or not.
//!
//! **Refused** connections (every slot held by a session) are answered `busy` in place of the HELLO
//! response: the HELLO is read first (at most 1 s), so the client sees the answer rather than a reset.
//!
//! Blocking: engine calls are synchronous. Memory-store operations take microseconds and run on the
//! connection task. When an SSD store is configured an operation may wait for a read (or a full
//! write-behind queue), so each burst of frames is handled inside `tokio::task::block_in_place`, which
//! hands the worker's other tasks to another thread for the duration instead of stalling them. The same
//! holds with co-operative de-duplication on: a remotified get waits (bounded by
//! `coop.request_timeout_ms`) for a peer.
//!
//! Recording (`capture.dir`, off by default): what a connection reads and writes is written to its
//! capture file (`crate::capture`) as it is read and before it is written; refused connections are not
//! recorded.
//!
//! Shutdown: on the shutdown signal a connection stops reading, finishes the frames it already holds,
//! writes their responses and closes.

use crate::admission::{HandshakeSlot, SessionSlot, MAX_REFUSING};
use crate::auth::Registration;
use crate::capture::{Channel, Recorder};
use crate::handler::{begin_session, handle_frame, Flow, Session};
use crate::handshake::Rehome;
use crate::state::ServerState;
use dd_proto::frame::{split_frame, write_error, Op};
use dd_proto::{Status, HEADER_LEN, MAX_HELLO_PAYLOAD_BYTES};
use std::future::Future;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::runtime::Handle;
use tokio::sync::watch;
use tokio::time::Instant;

/// Bytes read per read call when no frame size is known yet.
const READ_CHUNK: usize = 64 * 1024;
/// The handshake's buffer: a whole HELLO frame (at most 286 bytes) and the start of what follows it.
const HANDSHAKE_BUF: usize = 512;
/// What a failed handshake's receive queue may hold when it stops being read, at most, discarded
/// (a client's first window on Linux is at most 64 KiB, or 128 KiB with window scaling).
const FAIL_DISCARD_BYTES: usize = 256 << 10;
/// How long a refused connection is given to send its HELLO before it is answered `busy` anyway.
const REFUSE_WAIT: Duration = Duration::from_secs(1);
/// Output buffers a runtime thread keeps between bursts (see [`lend_out`]).
const SPARE_OUT_BUFFERS: usize = 2;

thread_local! {
    /// Empty output buffers of this runtime thread, lent to one session's burst at a time.
    static SPARE_OUT: std::cell::RefCell<Vec<Vec<u8>>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// An empty output buffer for one burst of a session: one this thread used last if there is one.
/// Why not a buffer per connection: a burst's responses are written before the session waits for
/// its next read, so between bursts its buffer is empty, and with many connections their buffers
/// (64 KiB and up each) are cold in the CPU caches by the time each is used again: at 64 connections
/// the kernel's copy out of them took twice the daemon's time it takes at 4 (BENCHMARKS.md, `bench
/// server`, 2026-11-26). A buffer lent per burst is one the thread wrote a moment ago.
fn lend_out() -> Vec<u8> {
    SPARE_OUT.with(|s| s.borrow_mut().pop()).unwrap_or_else(|| Vec::with_capacity(READ_CHUNK))
}

/// Gives a burst's output buffer back to this thread's spares (emptied; shrunk if a large burst
/// grew it past `max_capacity`; dropped when the thread already keeps [`SPARE_OUT_BUFFERS`]).
fn return_out(mut out: Vec<u8>, max_capacity: usize) {
    out.clear();
    if out.capacity() > max_capacity {
        out.shrink_to(READ_CHUNK);
    }
    SPARE_OUT.with(|s| {
        let mut s = s.borrow_mut();
        if s.len() < SPARE_OUT_BUFFERS {
            s.push(out);
        }
    });
}

/// Takes a connection slot for an accepted stream (synchronously, in the accept loop, so the limit is
/// exact in accept order) and spawns its task on the current runtime (the handshake thread's, see
/// [`crate::handshake`]); after its HELLO the connection moves to `sessions`. `done` is dropped when
/// the connection ends.
pub fn spawn_connection<S, D>(
    state: &Arc<ServerState>,
    sessions: &Handle,
    stream: S,
    shutdown: watch::Receiver<bool>,
    done: D,
) where
    S: AsyncRead + AsyncWrite + Rehome + Unpin + Send + 'static,
    D: Send + 'static,
{
    let slot = state.admission.accept();
    let (state, sessions) = (state.clone(), sessions.clone());
    tokio::spawn(run_connection(state, sessions, slot, stream, shutdown, done));
}

/// [`spawn_connection`] for the TCP listener under TLS (`crate::tls`): the TLS handshake runs first,
/// in the connection's slot and within `limits.handshake_timeout_ms`, then the HELLO as on any stream,
/// within the same time again (a refused connection is told `busy` inside TLS).
pub fn spawn_tls_connection<D>(
    state: &Arc<ServerState>,
    sessions: &Handle,
    acceptor: &tokio_rustls::TlsAcceptor,
    stream: tokio::net::TcpStream,
    shutdown: watch::Receiver<bool>,
    done: D,
) where
    D: Send + 'static,
{
    let slot = state.admission.accept();
    let (state, sessions, acceptor) = (state.clone(), sessions.clone(), acceptor.clone());
    let limit = state.handshake_timeout;
    tokio::spawn(async move {
        if let Some(stream) = crate::tls::accept(&acceptor, stream, limit).await {
            run_connection(state, sessions, slot, stream, shutdown, done).await;
        }
    });
}

/// A connection's life from its slot (`None`: every slot is held by a session) to its end.
async fn run_connection<S, D>(
    state: Arc<ServerState>,
    sessions: Handle,
    slot: Option<HandshakeSlot>,
    stream: S,
    shutdown: watch::Receiver<bool>,
    done: D,
) where
    S: AsyncRead + AsyncWrite + Rehome + Unpin + Send + 'static,
    D: Send + 'static,
{
    match slot {
        Some(slot) => {
            let mut rec = state.recorder(Channel::Data);
            if let Some((stream, sess, session_slot, leftover)) =
                handshake(&state, stream, shutdown.clone(), slot, &mut rec).await
            {
                // Registered with the session runtime's reactor, then served there.
                match stream.rehome(&sessions) {
                    Ok(stream) => {
                        sessions.spawn(async move {
                            serve_session(state, stream, sess, leftover, shutdown, rec).await;
                            drop(session_slot);
                            drop(done);
                        });
                    }
                    Err(e) => {
                        tracing::warn!("moving an authenticated connection to the session runtime: {e}")
                    }
                }
            }
        }
        None => {
            refuse(&state, stream).await;
            drop(done);
        }
    }
}

/// Sleeps `d`, or forever for `None`.
async fn sleep_or_never(d: Option<Duration>) {
    match d {
        Some(d) => tokio::time::sleep(d).await,
        None => std::future::pending().await,
    }
}

/// The request id and op of the frame at the start of `buf`, as far as they arrived.
fn frame_ids(buf: &[u8]) -> (u64, u8) {
    let id = buf.get(8..16).map_or(0, |b| u64::from_le_bytes(b.try_into().expect("8 bytes")));
    (id, buf.get(3).copied().unwrap_or(Op::Hello as u8))
}

/// Writes `buf` unless `stop` completes first; false if the write failed or was stopped.
async fn write_or<W: AsyncWrite + Unpin>(wr: &mut W, buf: &[u8], stop: impl Future<Output = ()>) -> bool {
    tokio::select! {
        r = wr.write_all(buf) => r.is_ok(),
        _ = stop => false,
    }
}

/// Answers `busy` in place of the HELLO response (read first, for its request id) and closes.
async fn refuse<S: AsyncRead + AsyncWrite + Unpin>(state: &ServerState, stream: S) {
    let adm = &state.admission;
    if adm.refusing.fetch_add(1, Ordering::Relaxed) >= MAX_REFUSING {
        adm.refusing.fetch_sub(1, Ordering::Relaxed);
        return;
    }
    let (mut rd, mut wr) = tokio::io::split(stream);
    let wait = state.handshake_timeout.min(REFUSE_WAIT);
    let deadline = Instant::now() + wait;
    let mut hs = [0u8; HANDSHAKE_BUF];
    let mut have = 0;
    while matches!(split_frame(&hs[..have], MAX_HELLO_PAYLOAD_BYTES), Ok(None)) && have < HANDSHAKE_BUF {
        tokio::select! {
            r = rd.read(&mut hs[have..]) => match r {
                Ok(0) | Err(_) => break,
                Ok(n) => have += n,
            },
            _ = tokio::time::sleep_until(deadline) => break,
        }
    }
    let (id, op) = frame_ids(&hs[..have]);
    let mut out = Vec::new();
    let v = dd_proto::answer_version(hs[..have].get(2).copied());
    write_error(&mut out, v, op, id, Status::BUSY, "too many connections");
    state.metrics.record_request(op, Status::BUSY);
    if write_or(&mut wr, &out, tokio::time::sleep(wait)).await {
        let _ = wr.shutdown().await;
    }
    adm.refusing.fetch_sub(1, Ordering::Relaxed);
}

/// Reads and answers the HELLO of an accepted stream. Returns the authenticated stream, its session,
/// its session slot and the bytes that followed the HELLO; `None` when the connection ends here
/// (refused, timed out, displaced, closed, or the server shuts down). `rec` records what is read and
/// written.
async fn handshake<S>(
    state: &ServerState,
    mut stream: S,
    mut shutdown: watch::Receiver<bool>,
    mut slot: HandshakeSlot,
    rec: &mut Recorder,
) -> Option<(S, Session, SessionSlot, Vec<u8>)>
where
    S: AsyncRead + AsyncWrite + Rehome + Unpin,
{
    let mut sess = Session::new();
    let mut out: Vec<u8> = Vec::new();
    // A fixed small buffer, a deadline, and a frame limit of one HELLO.
    let deadline = Instant::now() + state.handshake_timeout;
    let mut hs = [0u8; HANDSHAKE_BUF];
    let mut have = 0;
    loop {
        match split_frame(&hs[..have], MAX_HELLO_PAYLOAD_BYTES) {
            Ok(Some((h, n))) => {
                let (mut slot, mut session_slot) = (Some(slot), None);
                let status = begin_session(state, &mut sess, &h, &hs[HEADER_LEN..n], &mut out, |vm| {
                    session_slot = slot.take().and_then(|s| s.authenticate(vm).ok());
                    session_slot.is_some()
                });
                state.metrics.record_request(h.op, status);
                // A failed HELLO never reached `authenticate`: its slot is still here.
                let deadline = match slot.as_mut().filter(|_| fails_handshake(status)) {
                    Some(slot) => fail_delay(state, &mut stream, slot, &mut shutdown, deadline).await?,
                    None => deadline,
                };
                rec.sent(&out);
                let sent = write_or(&mut stream, &out, tokio::time::sleep_until(deadline)).await;
                return match session_slot {
                    Some(s) if sent && status.is_ok() => Some((stream, sess, s, hs[n..have].to_vec())),
                    _ => {
                        let _ = stream.shutdown().await;
                        None
                    }
                };
            }
            Ok(None) => {}
            Err(e) => {
                let (id, op) = frame_ids(&hs[..have]);
                let v = sess.answer_version(&hs[..have]);
                write_error(&mut out, v, op, id, e.status(), &e.to_string());
                state.metrics.record_request(op, e.status());
                let deadline = fail_delay(state, &mut stream, &mut slot, &mut shutdown, deadline).await?;
                rec.sent(&out);
                if write_or(&mut stream, &out, tokio::time::sleep_until(deadline)).await {
                    let _ = stream.shutdown().await;
                }
                return None;
            }
        }
        tokio::select! {
            r = stream.read(&mut hs[have..]) => match r {
                Ok(0) | Err(_) => return None,
                Ok(n) => {
                    rec.received(&hs[have..have + n]);
                    have += n;
                }
            },
            _ = tokio::time::sleep_until(deadline) => {
                state.metrics.connections_timed_out.fetch_add(1, Ordering::Relaxed);
                return None;
            }
            _ = &mut slot.displaced => return None,
            _ = shutdown.changed() => return None,
        }
    }
}

/// Whether a HELLO answered `status` is a failed handshake (answered after the fail delay): every
/// refusal but the load signals (`busy`, shutting down), which a client is expected to retry.
fn fails_handshake(status: Status) -> bool {
    !status.is_ok() && status != Status::BUSY && status != Status::SHUTTING_DOWN
}

/// The fail delay of a failed handshake (`limits.handshake_fail_delay_ms`): the connection is not read
/// (its receive buffer shrunk) and keeps its handshake slot, which a newer connection may displace.
/// Without it, a client that is refused and reconnects at once made the daemon accept, refuse and
/// close thousands of connections a second, and the kernel's work for them cost other VMs' requests
/// up to 4x their p99 on two cores (`bench tenants`, attack `oversized_preauth`, BENCHMARKS.md).
/// Returns the deadline of the answer's write (the handshake's `deadline`, or `REFUSE_WAIT` from the
/// end of the delay if that is later), or `None` when the connection is to close without its answer
/// (displaced, or the server shuts down).
async fn fail_delay<S: Rehome>(
    state: &ServerState,
    stream: &mut S,
    slot: &mut HandshakeSlot,
    shutdown: &mut watch::Receiver<bool>,
    deadline: Instant,
) -> Option<Instant> {
    if !state.handshake_fail_delay.is_zero() {
        state.metrics.handshakes_delayed.fetch_add(1, Ordering::Relaxed);
        let _ = stream.stop_receiving(FAIL_DISCARD_BYTES);
        tokio::select! {
            _ = tokio::time::sleep(state.handshake_fail_delay) => {}
            _ = &mut slot.displaced => return None,
            _ = shutdown.changed() => return None,
        }
    }
    Some(deadline.max(Instant::now() + REFUSE_WAIT))
}

/// Serves an authenticated stream until it closes, errs, times out or is revoked, or the server shuts
/// down. `leftover`: what the client sent after its HELLO (already recorded). `rec` records what is
/// read and written.
async fn serve_session<S>(
    state: Arc<ServerState>,
    stream: S,
    mut sess: Session,
    leftover: Vec<u8>,
    mut shutdown: watch::Receiver<bool>,
    mut rec: Recorder,
) where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let (mut rd, mut wr) = tokio::io::split(stream);
    // Lent by the thread for each burst, given back once it is written (`lend_out`).
    let mut out: Vec<u8> = Vec::new();
    let reg = sess.registration().expect("authenticated").clone();
    let mut revoked = reg.revoked();
    if !reg.is_live() {
        return;
    }
    let idle = state.idle_timeout;
    let mut inbuf: Vec<u8> = Vec::with_capacity(READ_CHUNK);
    inbuf.extend_from_slice(&leftover);
    let mut closing = false;
    loop {
        // Handle every complete frame in the buffer, writing whenever the output passes its bound.
        let mut consumed = 0;
        loop {
            if out.capacity() == 0 {
                out = lend_out();
            }
            let (used, flow) = if state.has_ssd || state.coop_enabled {
                tokio::task::block_in_place(|| {
                    process(&state, &mut sess, Some(&reg), &inbuf[consumed..], &mut out)
                })
            } else {
                process(&state, &mut sess, Some(&reg), &inbuf[consumed..], &mut out)
            };
            consumed += used;
            if !out.is_empty() {
                let stop = async {
                    tokio::select! {
                        _ = revoked.changed() => {}
                        _ = sleep_or_never(idle) => {
                            state.metrics.connections_timed_out.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                };
                rec.sent(&out);
                if !write_or(&mut wr, &out, stop).await {
                    return;
                }
            }
            return_out(std::mem::take(&mut out), state.write_buffer_bytes * 2);
            match flow {
                Flow::Close => {
                    let _ = wr.shutdown().await;
                    return;
                }
                // `process` stops early only when the output passed its bound: go on with the rest.
                Flow::Continue if used > 0 && consumed < inbuf.len() => continue,
                Flow::Continue => break,
            }
        }
        inbuf.drain(..consumed);
        if closing {
            let _ = wr.shutdown().await;
            return;
        }
        // Make room for the rest of the pending frame (bounded by max_payload), or for a fresh chunk.
        let want = match split_frame(&inbuf, state.max_payload) {
            Ok(None) if inbuf.len() >= HEADER_LEN => {
                let len = u32::from_le_bytes(inbuf[16..20].try_into().expect("4 bytes")) as usize;
                (HEADER_LEN + len - inbuf.len()).max(READ_CHUNK)
            }
            _ => READ_CHUNK,
        };
        inbuf.reserve(want);
        if inbuf.capacity() > 2 * (HEADER_LEN + state.max_payload as usize) + READ_CHUNK {
            inbuf.shrink_to(inbuf.len() + want);
        }
        let read_from = inbuf.len();
        tokio::select! {
            r = rd.read_buf(&mut inbuf) => match r {
                Ok(0) | Err(_) => return,
                Ok(_) => rec.received(&inbuf[read_from..]),
            },
            _ = shutdown.changed() => closing = true,
            _ = revoked.changed() => {
                state.metrics.connections_revoked.fetch_add(1, Ordering::Relaxed);
                let _ = wr.shutdown().await;
                return;
            }
            _ = sleep_or_never(idle) => {
                state.metrics.connections_timed_out.fetch_add(1, Ordering::Relaxed);
                let _ = wr.shutdown().await;
                return;
            }
        }
    }
}

/// Handles the complete frames at the start of `buf` until the output passes its bound, a frame asks
/// to close, or no complete frame is left. Returns the bytes consumed and the flow. An authenticated
/// session's frames run inside its registration; a revoked one gets `auth_failed` and is closed. An
/// unauthenticated session handles one frame (its HELLO) at most, with the HELLO frame limit. `reg` is
/// the session's registration (`None` before HELLO), passed in rather than cloned from `sess`: the
/// `Arc` is shared by every session of the VM, and a clone per burst would write its count from every
/// core.
fn process(
    state: &ServerState,
    sess: &mut Session,
    reg: Option<&Registration>,
    buf: &[u8],
    out: &mut Vec<u8>,
) -> (usize, Flow) {
    debug_assert_eq!(reg.map(|r| r.generation), sess.registration().map(|r| r.generation));
    let _live = match reg {
        Some(r) => match r.enter() {
            Some(g) => Some(g),
            None => {
                if buf.len() >= HEADER_LEN {
                    let (id, op) = frame_ids(buf);
                    let msg = "this session's VM registration was removed or its tokens were replaced";
                    write_error(out, sess.answer_version(buf), op, id, Status::AUTH_FAILED, msg);
                    state.metrics.record_request(op, Status::AUTH_FAILED);
                }
                state.metrics.connections_revoked.fetch_add(1, Ordering::Relaxed);
                return (buf.len(), Flow::Close);
            }
        },
        None => None,
    };
    let limit = if reg.is_some() { state.max_payload } else { MAX_HELLO_PAYLOAD_BYTES };
    let mut at = 0;
    while out.len() < state.write_buffer_bytes {
        match split_frame(&buf[at..], limit) {
            Ok(None) => break,
            Ok(Some((h, n))) => {
                let flow = handle_frame(state, sess, &h, &buf[at + HEADER_LEN..at + n], out);
                at += n;
                if flow == Flow::Close {
                    return (at, Flow::Close);
                }
                if reg.is_none() {
                    break;
                }
            }
            Err(e) => {
                // The frame boundary is lost (bad magic) or the payload will not be read (too large).
                let (id, op) = frame_ids(&buf[at..]);
                write_error(out, sess.answer_version(&buf[at..]), op, id, e.status(), &e.to_string());
                state.metrics.record_request(op, e.status());
                return (buf.len(), Flow::Close);
            }
        }
    }
    (at, Flow::Continue)
}

/// Feeds `bytes` through the frame splitter and the handler as a connection would, collecting every
/// response. Used by the fuzz target and tests to drive the request path without sockets.
pub fn drive(state: &ServerState, sess: &mut Session, bytes: &[u8]) -> (Vec<u8>, Flow) {
    let mut out = Vec::new();
    let mut at = 0;
    loop {
        let reg = sess.registration().cloned();
        let (used, flow) = process(state, sess, reg.as_deref(), &bytes[at..], &mut out);
        at += used;
        if flow == Flow::Close || used == 0 {
            return (out, flow);
        }
    }
}

/// Checks what the server wrote on one connection (the oracle of the `request_handler` fuzz target
/// and of the tests below): whole frames only, each within the frame limit (`max_payload`), and on a
/// connection that never authenticated only short frames (an error message of at most
/// `MAX_ERROR_MESSAGE_BYTES`): an unauthenticated client gets nothing large. Returns what is wrong.
pub fn check_responses(state: &ServerState, out: &[u8], authenticated: bool) -> Result<(), String> {
    let mut at = 0;
    while at < out.len() {
        let (h, n) = match split_frame(&out[at..], u32::MAX) {
            Ok(Some(f)) => f,
            Ok(None) => return Err(format!("a partial response frame at byte {at}")),
            Err(e) => return Err(format!("a response frame at byte {at} does not parse: {e}")),
        };
        if h.payload_len > state.max_payload {
            return Err(format!(
                "a {}-byte response exceeds the frame limit {}",
                h.payload_len, state.max_payload
            ));
        }
        if !authenticated && h.payload_len as usize > dd_proto::MAX_ERROR_MESSAGE_BYTES {
            return Err(format!("a {}-byte response before authentication", h.payload_len));
        }
        at += n;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use dd_proto::frame::Header;
    use rand::{Rng, SeedableRng};

    const TOKEN: &str = "test-data-token-0001";

    fn state(max_payload: u32) -> ServerState {
        let cfg = crate::ServerConfig::from_toml(&format!(
            "ssd_enabled = false\n[auth]\nhost_admin_token = \"test-host-token-0001\"\n\
             [limits]\nmax_payload_bytes = {max_payload}\n\
             [engine]\nmaintenance = \"inline\"\nmax_batch_pages = 2\n[engine.mem]\ncapacity_bytes = 1048576\n\
             [[vms]]\nid = 1\ndata_token = \"{TOKEN}\"\nadmin_token = \"test-admin-token-001\"\n"
        ))
        .unwrap();
        ServerState::new(&cfg, "test-host-token-0001").unwrap()
    }

    fn hello(token: &str, out: &mut Vec<u8>) {
        dd_proto::Request::Hello { min_version: 1, max_version: 1, vm: 1, token: token.as_bytes() }
            .encode(1, 0, out);
    }

    /// The fuzz target's checks on seeded random connections: no HELLO (the pre-authentication path),
    /// a wrong token, a valid HELLO; random frames (some announcing large payloads) and random tails.
    #[test]
    fn drive_random_inputs_answers_within_the_frame_limit() {
        let st = state(65536);
        let mut rng = rand::rngs::StdRng::seed_from_u64(12);
        for case in 0..3000u64 {
            let mut sess = Session::new();
            let mut input = Vec::new();
            match case % 3 {
                1 => hello(TOKEN, &mut input),
                2 => hello("not-the-token-of-vm-1", &mut input),
                _ => {}
            }
            for _ in 0..rng.gen_range(0..5) {
                let op = rng.gen_range(0..18u8);
                let len: u32 =
                    if rng.gen_bool(0.1) { rng.gen_range(0..3_000_000) } else { rng.gen_range(0..48) };
                let flags = if rng.gen_bool(0.05) { rng.gen() } else { 0 };
                Header { version: 1, op, flags, status: 0, request_id: case, payload_len: len }
                    .encode(&mut input);
                let body = len.min(4096) as usize;
                input.extend((0..body).map(|_| rng.gen::<u8>()));
            }
            if rng.gen_bool(0.2) {
                input.extend((0..rng.gen_range(1..64)).map(|_| rng.gen::<u8>()));
            }
            let (out, _) = drive(&st, &mut sess, &input);
            check_responses(&st, &out, sess.registration().is_some())
                .unwrap_or_else(|e| panic!("case {case}: {e}"));
        }
    }

    /// Before HELLO a frame larger than a HELLO is refused at its header (nothing of it is read) and
    /// the connection closed; VM_STATS of a VM with many pools stays within a small frame limit.
    #[test]
    fn pre_authentication_limit_and_stats_within_the_frame_limit() {
        let st = state(16384);
        let mut sess = Session::new();
        let mut input = Vec::new();
        Header {
            version: 1,
            op: 1,
            flags: 0,
            status: 0,
            request_id: 1,
            payload_len: MAX_HELLO_PAYLOAD_BYTES + 1,
        }
        .encode(&mut input);
        let (out, flow) = drive(&st, &mut sess, &input);
        assert_eq!(flow, Flow::Close);
        check_responses(&st, &out, false).unwrap();
        let (h, _) = split_frame(&out, u32::MAX).unwrap().unwrap();
        assert_eq!(h.status(), Status::FRAME_TOO_LARGE);

        let mut sess = Session::new();
        let mut input = Vec::new();
        hello(TOKEN, &mut input);
        let spec = dd_engine::PoolOptions::ephemeral(dd_engine::Spec::Mem { weight: 1 });
        for i in 0..200u64 {
            dd_proto::Request::CreatePool(spec).encode(1, i + 2, &mut input);
        }
        dd_proto::Request::VmStats.encode(1, 999, &mut input);
        let (out, _) = drive(&st, &mut sess, &input);
        assert!(sess.registration().is_some());
        check_responses(&st, &out, true).unwrap();
    }

    /// Issue 30, item 4: `bad_magic` and `frame_too_large` on a version-1 session, and a failed HELLO
    /// of a version-1 client, were answered with version byte 2.
    #[test]
    fn version_one_answers_carry_version_one() {
        let st = state(16384);
        let version_of = |out: &[u8]| out[2];
        // A failed HELLO (wrong token) of a version-1 client.
        let mut sess = Session::new();
        let mut input = Vec::new();
        hello("not-the-token-of-vm-1", &mut input);
        let (out, _) = drive(&st, &mut sess, &input);
        let (h, _) = split_frame(&out, u32::MAX).unwrap().unwrap();
        assert_eq!(h.status(), Status::AUTH_FAILED);
        assert_eq!(version_of(&out), 1, "failed HELLO");
        // bad_magic, then frame_too_large, on a version-1 session.
        for (what, frame) in [
            ("bad_magic", b"XX\x01\x01\0\0\0\0\x07\0\0\0\0\0\0\0\0\0\0\0".to_vec()),
            ("frame_too_large", {
                let mut f = Vec::new();
                Header { version: 1, op: 3, flags: 0, status: 0, request_id: 7, payload_len: 1 << 30 }
                    .encode(&mut f);
                f
            }),
        ] {
            let mut sess = Session::new();
            let mut input = Vec::new();
            hello(TOKEN, &mut input);
            input.extend_from_slice(&frame);
            let (out, flow) = drive(&st, &mut sess, &input);
            assert_eq!(flow, Flow::Close, "{what}");
            let (first, used) = split_frame(&out, u32::MAX).unwrap().unwrap();
            assert!(first.status().is_ok(), "{what}: HELLO");
            assert_eq!(version_of(&out[used..]), 1, "{what}: {:?}", &out[used..]);
        }
    }
}
