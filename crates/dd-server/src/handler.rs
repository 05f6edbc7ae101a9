//! The data-plane request handler: one decoded frame in, one response frame out, no I/O.
//!
//! It is what a connection task calls for every frame, and what the `request_handler` fuzz target
//! drives directly. It owns the session rules of `docs/protocol.md`: HELLO first, version negotiation,
//! authentication, and the confinement of every operation to the authenticated VM (the VM id comes from
//! the session, never from the request, and the engine reports another VM's pool exactly like a missing
//! one).
//!
//! Invariants: exactly one response frame is appended to `out` per call (the session rules say when the
//! connection closes after it); nothing here panics on any input; a failed request has no effect.
//!
//! I/O: none, except that with co-operative de-duplication a get that misses locally on a remotified
//! page fetches it from its peer ([`crate::coop_types::CoopHandle::fetch`], bounded by the request timeout; the
//! connection loop runs handlers inside `block_in_place` then). No engine lock is held meanwhile.

use crate::auth::Registration;
use crate::state::ServerState;
use dd_engine::{CacheError, Key, PoolId, VmId};
use dd_proto::frame::{begin_response, finish_response, write_error, Header, Op};
use dd_proto::msg::encode_outcome;
use dd_proto::{Request, Response, Status, MIN_PROTOCOL_VERSION, PROTOCOL_VERSION};
use std::sync::Arc;

/// Per-connection state: the registration the connection authenticated against (never just a VM id:
/// a revoked registration stops every operation, see `auth`) and the negotiated version.
#[derive(Debug, Default)]
pub struct Session {
    reg: Option<Arc<Registration>>,
    version: u8,
}

impl Session {
    pub fn new() -> Session {
        Session::default()
    }
    /// The VM this connection authenticated as.
    pub fn vm(&self) -> Option<VmId> {
        self.reg.as_ref().map(|r| r.vm)
    }
    /// The version byte of an answer to the frame whose header starts `frame`: the negotiated version
    /// once HELLO succeeded, before it the client's own (`dd_proto::answer_version`).
    pub fn answer_version(&self, frame: &[u8]) -> u8 {
        if self.version == 0 {
            dd_proto::answer_version(frame.get(2).copied())
        } else {
            self.version
        }
    }
    /// The registration this connection authenticated against.
    pub fn registration(&self) -> Option<&Arc<Registration>> {
        self.reg.as_ref()
    }
}

/// What the connection does after the response is sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flow {
    Continue,
    Close,
}

/// Handles one well-framed request (header already split off by `dd_proto::frame::split_frame`). The
/// caller runs it inside the session's [`Registration::enter`] (see `net::process`).
pub fn handle_frame(
    state: &ServerState,
    sess: &mut Session,
    h: &Header,
    payload: &[u8],
    out: &mut Vec<u8>,
) -> Flow {
    let (status, flow) = handle_inner(state, sess, h, payload, out);
    state.metrics.record_request(h.op, status);
    flow
}

fn reply_error(sess: &Session, h: &Header, out: &mut Vec<u8>, status: Status, msg: &str) -> Status {
    let v = if sess.version == 0 { dd_proto::answer_version(Some(h.version)) } else { sess.version };
    write_error(out, v, h.op, h.request_id, status, msg);
    status
}

fn handle_inner(
    state: &ServerState,
    sess: &mut Session,
    h: &Header,
    payload: &[u8],
    out: &mut Vec<u8>,
) -> (Status, Flow) {
    let Some(vm) = sess.vm() else {
        let status = begin_session(state, sess, h, payload, out, |_| true);
        return (status, if sess.reg.is_some() { Flow::Continue } else { Flow::Close });
    };
    if state.is_shutting_down() {
        return (
            reply_error(sess, h, out, Status::SHUTTING_DOWN, "the server is shutting down"),
            Flow::Close,
        );
    }
    if h.flags != 0 || h.status != 0 {
        let msg = "a request must have flags 0 (reserved bits) and status 0";
        return (reply_error(sess, h, out, Status::MALFORMED, msg), Flow::Continue);
    }
    if h.version != sess.version {
        let msg = format!("frame version {} but the session negotiated {}", h.version, sess.version);
        return (reply_error(sess, h, out, Status::UNSUPPORTED_VERSION, &msg), Flow::Continue);
    }
    let req = match Request::decode(h.op, payload, state.max_batch) {
        Ok(r) => r,
        Err(e) => return (reply_error(sess, h, out, e.status(), &e.to_string()), Flow::Continue),
    };
    let status = match dispatch(state, vm, sess.version, h, req, out) {
        Ok(()) => Status::OK,
        Err(Failure::Engine(e)) => reply_error(sess, h, out, Status::from_engine(&e), &e.to_string()),
        Err(Failure::Proto(s, m)) => reply_error(sess, h, out, s, &m),
    };
    (status, Flow::Continue)
}

/// The first frame of a connection: checks that it is a well-formed HELLO, negotiates the version and
/// authenticates; `admit` then decides whether the VM may open another session (`false`: `busy`).
/// Writes exactly one response; the session is authenticated iff the returned status is ok.
pub fn begin_session(
    state: &ServerState,
    sess: &mut Session,
    h: &Header,
    payload: &[u8],
    out: &mut Vec<u8>,
    admit: impl FnOnce(VmId) -> bool,
) -> Status {
    if h.op != Op::Hello as u8 {
        return reply_error(sess, h, out, Status::NOT_AUTHENTICATED, "the first frame must be HELLO");
    }
    if h.flags != 0 || h.status != 0 {
        let msg = "HELLO must have flags 0 (reserved bits) and status 0";
        return reply_error(sess, h, out, Status::MALFORMED, msg);
    }
    let (min_v, max_v, vm, token) = match Request::decode(h.op, payload, state.max_batch) {
        Ok(Request::Hello { min_version, max_version, vm, token }) => (min_version, max_version, vm, token),
        Ok(_) => unreachable!("op checked above"),
        Err(e) => return reply_error(sess, h, out, e.status(), &e.to_string()),
    };
    let hi = max_v.min(PROTOCOL_VERSION as u16);
    if hi < min_v.max(MIN_PROTOCOL_VERSION as u16) {
        let msg = format!(
            "client speaks versions {min_v}..={max_v}, server {MIN_PROTOCOL_VERSION}..={PROTOCOL_VERSION}"
        );
        return reply_error(sess, h, out, Status::UNSUPPORTED_VERSION, &msg);
    }
    if state.is_shutting_down() {
        return reply_error(sess, h, out, Status::SHUTTING_DOWN, "the server is shutting down");
    }
    let Some(reg) = state.registry.authenticate_data(VmId(vm), token) else {
        return reply_error(sess, h, out, Status::AUTH_FAILED, "unknown vm or wrong token");
    };
    if !admit(reg.vm) {
        return reply_error(sess, h, out, Status::BUSY, "too many connections");
    }
    sess.reg = Some(reg);
    sess.version = hi as u8;
    Response::Hello {
        version: hi,
        vm,
        page_size: state.cache.page_size() as u32,
        max_batch: state.max_batch,
        max_payload: state.max_payload,
        instance: Some(state.instance),
    }
    .encode(sess.version, h.op, h.request_id, out);
    Status::OK
}

enum Failure {
    Engine(CacheError),
    Proto(Status, String),
}

impl From<CacheError> for Failure {
    fn from(e: CacheError) -> Self {
        Failure::Engine(e)
    }
}

fn dispatch(
    state: &ServerState,
    vm: VmId,
    v: u8,
    h: &Header,
    req: Request<'_>,
    out: &mut Vec<u8>,
) -> Result<(), Failure> {
    let cache = &state.cache;
    let ps = cache.page_size();
    let (op, id) = (h.op, h.request_id);
    let simple = |r: Response, out: &mut Vec<u8>| r.encode(v, op, id, out);
    match req {
        Request::Hello { .. } => {
            return Err(Failure::Proto(
                Status::ALREADY_AUTHENTICATED,
                "this connection is already authenticated".into(),
            ))
        }
        Request::Ping => simple(Response::Pong, out),
        Request::CreatePool(opts) => simple(Response::PoolCreated(cache.new_pool(vm, opts)?), out),
        Request::DestroyPool { pool } => {
            cache.destroy_pool(vm, pool)?;
            simple(Response::Done, out)
        }
        Request::SetSpec { pool, spec } => {
            cache.set_spec(vm, pool, spec)?;
            simple(Response::Done, out)
        }
        Request::SetLabel { pool, label } => {
            let label = std::str::from_utf8(label).map_err(|_| CacheError::InvalidConfig {
                field: "label".into(),
                reason: "is not UTF-8".into(),
            })?;
            cache.set_pool_label(vm, pool, (!label.is_empty()).then_some(label))?;
            simple(Response::Done, out)
        }
        Request::Put { pool, key, data } => simple(Response::Put(cache.put(vm, pool, key, data)?), out),
        Request::Get { pool, key } => {
            // The page is copied from the cache straight into the output buffer.
            let start = begin_response(out, v, op, id);
            out.push(1);
            let at = out.len();
            out.resize(at + ps, 0);
            match cache.get(vm, pool, key, &mut out[at..]).and_then(|hit| match hit {
                true => Ok(true),
                false => remote_get(state, vm, pool, key, &mut out[at..]),
            }) {
                Ok(true) => {}
                Ok(false) => {
                    out.truncate(at);
                    out[at - 1] = 0;
                }
                Err(e) => {
                    out.truncate(start);
                    return Err(e.into());
                }
            }
            finish_response(out, start, Status::OK);
        }
        Request::FlushPage { pool, key } => simple(Response::Flushed(cache.flush_page(vm, pool, key)?), out),
        Request::FlushObject { pool, object } => {
            simple(Response::Count(cache.flush_object(vm, pool, object)?), out)
        }
        Request::MigrateObject { from, to, object } => {
            simple(Response::Count(cache.migrate_object(vm, from, to, object)?), out)
        }
        Request::PutBatch { pool, keys, pages } => {
            let n = keys.len();
            if pages.len() != n * ps {
                let bad = CacheError::BadPageSize { expected: ps, got: 0 };
                let msg = format!(
                    "PUT_BATCH of {n} keys carries {} bytes of pages, expected {n} x {ps} = {}",
                    pages.len(),
                    n * ps
                );
                return Err(Failure::Proto(Status::from_engine(&bad), msg));
            }
            let items: Vec<(Key, &[u8])> = keys.iter().zip(pages.chunks_exact(ps.max(1))).collect();
            let outcomes = cache.put_batch(vm, pool, &items)?;
            let start = begin_response(out, v, op, id);
            out.extend_from_slice(&(n as u32).to_le_bytes());
            out.extend(outcomes.iter().map(|o| encode_outcome(*o)));
            finish_response(out, start, Status::OK);
        }
        Request::GetBatch { pool, keys } => get_batch(state, vm, v, h, pool, keys, out)?,
        Request::PoolStats { pool } => {
            let s = cache.pool_stats(vm, pool)?;
            simple(Response::Json(serde_json::to_vec(&s).map_err(internal)?), out)
        }
        Request::VmStats => {
            let s = cache.vm_stats(vm)?;
            simple(Response::Json(vm_stats_within(s, state.max_payload as usize)?), out)
        }
        Request::ListPools => simple(Response::Pools(cache.pools(vm)?), out),
    }
    Ok(())
}

/// A local miss: if the key was remotified, fetch it from its peer (a miss on any failure). An
/// exclusive pool forgot the record when it was taken, so the pin is released afterwards.
fn remote_get(
    state: &ServerState,
    vm: VmId,
    pool: PoolId,
    key: Key,
    out: &mut [u8],
) -> Result<bool, CacheError> {
    let Some(coop) = state.coop.get() else { return Ok(false) };
    let Some((r, removed)) = state.cache.take_remote(vm, pool, key)? else { return Ok(false) };
    let hit = coop.fetch(&r, out);
    state.cache.record_remote_get(vm, pool, hit);
    if removed {
        coop.release(r);
    }
    Ok(hit)
}

/// The VM's statistics as JSON of at most `limit` bytes: the totals always, and as many pools (in id
/// order) as fit; `pools_omitted` counts the others (POOL_STATS reaches each of them).
fn vm_stats_within(mut s: dd_engine::VmStats, limit: usize) -> Result<Vec<u8>, Failure> {
    let all = serde_json::to_vec(&s).map_err(internal)?;
    if all.len() <= limit {
        return Ok(all);
    }
    let pools = std::mem::take(&mut s.pools);
    s.pools_omitted = pools.len() as u64;
    // Room for the pools: the document without them, and a comma between two pools.
    let mut room = limit.saturating_sub(serde_json::to_vec(&s).map_err(internal)?.len());
    let mut keep = 0;
    for p in &pools {
        let n = serde_json::to_vec(p).map_err(internal)?.len() + 1;
        if n > room {
            break;
        }
        room -= n;
        keep += 1;
    }
    s.pools_omitted = (pools.len() - keep) as u64;
    s.pools = pools;
    s.pools.truncate(keep);
    let v = serde_json::to_vec(&s).map_err(internal)?;
    debug_assert!(v.len() <= limit, "{} > {limit}", v.len());
    Ok(v)
}

fn internal(e: impl std::fmt::Display) -> Failure {
    Failure::Proto(Status::INTERNAL, e.to_string())
}

fn get_batch(
    state: &ServerState,
    vm: VmId,
    v: u8,
    h: &Header,
    pool: PoolId,
    keys: dd_proto::KeyList<'_>,
    out: &mut Vec<u8>,
) -> Result<(), Failure> {
    let ps = state.cache.page_size();
    let n = keys.len();
    let ks: Vec<Key> = keys.iter().collect();
    // Without co-operative de-duplication (whose misses are fetched from peers into their slots, below)
    // a non-exclusive pool's hits are copied straight from the engine's frames into their slots of the
    // response, with no zero-fill first: one copy per page.
    if state.coop.get().is_none() && !state.cache.exclusive_gets(vm, pool)? {
        let start = begin_response(out, v, h.op, h.request_id);
        out.extend_from_slice(&(n as u32).to_le_bytes());
        let flags_at = out.len();
        out.resize(flags_at + n, 0);
        let pages_at = out.len();
        out.reserve(n * ps);
        let mut hit_flags = vec![false; n];
        let slots = &mut out.spare_capacity_mut()[..n * ps];
        let r = state.cache.get_batch_each(vm, pool, &ks, &mut |i, page| {
            hit_flags[i] = true;
            copy_into(&mut slots[i * ps..(i + 1) * ps], page);
        });
        if let Err(e) = r {
            out.truncate(start);
            return Err(e.into());
        }
        // Hits to the front, in index order (the engine hands them over shard by shard).
        let mut w = 0;
        for (i, hit) in hit_flags.iter().enumerate() {
            out[flags_at + i] = *hit as u8;
            if *hit {
                if i != w {
                    out.spare_capacity_mut().copy_within(i * ps..(i + 1) * ps, w * ps);
                }
                w += 1;
            }
        }
        // SAFETY: the first `w * ps` bytes of the spare capacity are the `w` hits' pages, each
        // written whole by `copy_into` (a hit's slot) and moved only to a slot below it.
        unsafe { out.set_len(pages_at + w * ps) };
        finish_response(out, start, Status::OK);
        return Ok(());
    }
    // Read every page into the output buffer at its slot, then compact the hits to the front: one
    // copy out of the cache, one memmove per hit that follows a miss.
    let start = begin_response(out, v, h.op, h.request_id);
    out.extend_from_slice(&(n as u32).to_le_bytes());
    let flags_at = out.len();
    out.resize(flags_at + n, 0);
    let pages_at = out.len();
    out.resize(pages_at + n * ps, 0);
    let mut hits = match state.cache.get_batch(vm, pool, &ks, &mut out[pages_at..]) {
        Ok(hits) => hits,
        Err(e) => {
            out.truncate(start);
            return Err(e.into());
        }
    };
    if state.coop.get().is_some() {
        for (i, hit) in hits.iter_mut().enumerate() {
            if !*hit {
                let page = &mut out[pages_at + i * ps..pages_at + (i + 1) * ps];
                *hit = remote_get(state, vm, pool, ks[i], page).unwrap_or(false);
            }
        }
    }
    let mut w = pages_at;
    for (i, hit) in hits.iter().enumerate() {
        out[flags_at + i] = *hit as u8;
        if *hit {
            let r = pages_at + i * ps;
            if r != w {
                out.copy_within(r..r + ps, w);
            }
            w += ps;
        }
    }
    out.truncate(w);
    finish_response(out, start, Status::OK);
    Ok(())
}

/// Copies `page` into `slot` (same length), initialising it.
fn copy_into(slot: &mut [std::mem::MaybeUninit<u8>], page: &[u8]) {
    debug_assert_eq!(slot.len(), page.len());
    // SAFETY: `MaybeUninit<u8>` has the layout of `u8`; the slices do not overlap (one is the
    // response's spare capacity, the other a store frame or a scratch page) and have equal lengths.
    unsafe { std::ptr::copy_nonoverlapping(page.as_ptr(), slot.as_mut_ptr().cast::<u8>(), page.len()) };
}
