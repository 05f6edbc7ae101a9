//! Data-plane listeners (Unix socket, TCP) and the per-connection loop.
//!
//! A connection reads into one input buffer, splits as many complete frames as it holds, handles them
//! in order (appending every response to one output buffer) and writes the responses out together:
//! pipelining costs one read and one write per burst, not per request.
//!
//! Bounded memory per connection: the input buffer never holds more than one incomplete frame, whose
//! payload is at most `max_payload` (a header announcing more is refused before its payload is read);
//! the output buffer is written out as soon as it passes `write_buffer_bytes`, so it holds at most that
//! plus one response. A client that does not read its responses blocks on TCP back-pressure alone.
//!
//! Blocking: engine calls are synchronous. Memory-store operations take microseconds and run on the
//! connection task. When an SSD store is configured an operation may wait for a read (or a full
//! write-behind queue), so each burst of frames is handled inside `tokio::task::block_in_place`, which
//! hands the worker's other tasks to another thread for the duration instead of stalling them. The same
//! holds with co-operative de-duplication on: a remotified get waits (bounded by
//! `coop.request_timeout_ms`) for a peer.
//!
//! Shutdown: on the shutdown signal a connection stops reading, finishes the frames it already holds,
//! writes their responses and closes.

use crate::handler::{handle_frame, Flow, Session};
use crate::state::ServerState;
use dd_proto::frame::{split_frame, write_error, Op};
use dd_proto::{Status, HEADER_LEN, PROTOCOL_VERSION};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::watch;

/// Bytes read per read call when no frame size is known yet.
const READ_CHUNK: usize = 64 * 1024;

/// Releases a connection slot when the connection ends.
struct Slot(Arc<ServerState>);
impl Drop for Slot {
    fn drop(&mut self) {
        self.0.metrics.connections_active.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Takes a connection slot, or refuses at the limit.
fn try_slot(state: &Arc<ServerState>) -> Option<Slot> {
    let m = &state.metrics;
    let prev = m.connections_active.fetch_add(1, Ordering::Relaxed);
    if prev as usize >= state.max_connections {
        m.connections_active.fetch_sub(1, Ordering::Relaxed);
        m.connections_rejected.fetch_add(1, Ordering::Relaxed);
        return None;
    }
    m.connections_total.fetch_add(1, Ordering::Relaxed);
    Some(Slot(state.clone()))
}

/// Takes a connection slot for an accepted stream (synchronously, in the accept loop, so the limit is
/// exact in accept order) and spawns its task. `done` is dropped when the connection ends.
pub fn spawn_connection<S, D>(state: &Arc<ServerState>, stream: S, shutdown: watch::Receiver<bool>, done: D)
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    D: Send + 'static,
{
    let slot = try_slot(state);
    let state = state.clone();
    tokio::spawn(async move {
        serve_connection(state, stream, shutdown, slot).await;
        drop(done);
    });
}

/// Serves one accepted stream until it closes, errs or the server shuts down. Without a slot it only
/// tells the peer `busy`.
async fn serve_connection<S>(
    state: Arc<ServerState>,
    stream: S,
    mut shutdown: watch::Receiver<bool>,
    slot: Option<Slot>,
) where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let (mut rd, mut wr) = tokio::io::split(stream);
    let Some(_slot) = slot else {
        let mut out = Vec::new();
        write_error(&mut out, PROTOCOL_VERSION, Op::Hello as u8, 0, Status::BUSY, "too many connections");
        let _ = wr.write_all(&out).await;
        let _ = wr.shutdown().await;
        return;
    };
    let mut inbuf: Vec<u8> = Vec::with_capacity(READ_CHUNK);
    let mut out: Vec<u8> = Vec::with_capacity(READ_CHUNK);
    let mut sess = Session::new();
    let mut closing = false;
    loop {
        // Handle every complete frame in the buffer, writing whenever the output passes its bound.
        let mut consumed = 0;
        loop {
            let (used, flow) = if state.has_ssd || state.coop_enabled {
                tokio::task::block_in_place(|| process(&state, &mut sess, &inbuf[consumed..], &mut out))
            } else {
                process(&state, &mut sess, &inbuf[consumed..], &mut out)
            };
            consumed += used;
            if !out.is_empty() && wr.write_all(&out).await.is_err() {
                return;
            }
            out.clear();
            if out.capacity() > state.write_buffer_bytes * 2 {
                out.shrink_to(READ_CHUNK);
            }
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
        tokio::select! {
            r = rd.read_buf(&mut inbuf) => match r {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            },
            _ = shutdown.changed() => closing = true,
        }
    }
}

/// Handles the complete frames at the start of `buf` until the output passes its bound, a frame asks
/// to close, or no complete frame is left. Returns the bytes consumed and the flow.
fn process(state: &ServerState, sess: &mut Session, buf: &[u8], out: &mut Vec<u8>) -> (usize, Flow) {
    let mut at = 0;
    while out.len() < state.write_buffer_bytes {
        match split_frame(&buf[at..], state.max_payload) {
            Ok(None) => break,
            Ok(Some((h, n))) => {
                let flow = handle_frame(state, sess, &h, &buf[at + HEADER_LEN..at + n], out);
                at += n;
                if flow == Flow::Close {
                    return (at, Flow::Close);
                }
            }
            Err(e) => {
                // The frame boundary is lost (bad magic) or the payload will not be read (too large).
                let id = if buf.len() - at >= 16 {
                    u64::from_le_bytes(buf[at + 8..at + 16].try_into().expect("8 bytes"))
                } else {
                    0
                };
                let op = buf.get(at + 3).copied().unwrap_or(0);
                write_error(out, PROTOCOL_VERSION, op, id, e.status(), &e.to_string());
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
        let (used, flow) = process(state, sess, &bytes[at..], &mut out);
        at += used;
        if flow == Flow::Close || used == 0 {
            return (out, flow);
        }
    }
}
