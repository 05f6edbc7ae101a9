//! Requests and responses: payload layouts of every op (little-endian, no padding), with encode and
//! decode. `docs/protocol.md` has the same tables.
//!
//! Requests borrow from the payload they were decoded from ([`Request<'a>`]), so the server hands a
//! put's page to the engine without copying it first. Responses are owned ([`Response`]): they are what
//! the client decodes. The server writes its responses with [`Response::encode`] or, for the hot get
//! paths, directly into its output buffer with `frame::begin_response` / `frame::finish_response`.
//!
//! Invariant: every `decode` checks lengths before reading and before sizing any `Vec` (a batch count
//! is validated against the bytes actually present), and rejects trailing bytes.

use crate::frame::{begin_response, finish_response, Header, Op, HEADER_LEN};
use crate::status::Status;
use crate::{ProtoError, MAX_TOKEN_BYTES};
use dd_types::{EvictionOrder, Key, PoolId, PoolKind, PoolOptions, PutOutcome, Spec, StoreKind};

/// Bytes of one key on the wire: object u64, index u64.
pub const KEY_LEN: usize = 16;
/// Bytes of a spec on the wire: tag u8, two u32 weights.
pub const SPEC_LEN: usize = 9;

/// The keys of a batch: either the raw wire bytes (decoded requests) or a slice of keys (to encode).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyList<'a> {
    Wire(&'a [u8]),
    Keys(&'a [Key]),
}

impl KeyList<'_> {
    pub fn len(&self) -> usize {
        match self {
            KeyList::Wire(b) => b.len() / KEY_LEN,
            KeyList::Keys(k) => k.len(),
        }
    }
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// The i-th key; panics if `i >= len()`.
    pub fn get(&self, i: usize) -> Key {
        match self {
            KeyList::Wire(b) => {
                let c = &b[i * KEY_LEN..(i + 1) * KEY_LEN];
                Key::new(
                    u64::from_le_bytes(c[..8].try_into().expect("8 bytes")),
                    u64::from_le_bytes(c[8..].try_into().expect("8 bytes")),
                )
            }
            KeyList::Keys(k) => k[i],
        }
    }
    pub fn iter(&self) -> impl Iterator<Item = Key> + '_ {
        (0..self.len()).map(move |i| self.get(i))
    }
}

/// A request, borrowing its variable-length parts from the payload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Request<'a> {
    /// Must be the first frame of a connection: picks a protocol version and authenticates as `vm`.
    Hello {
        min_version: u16,
        max_version: u16,
        vm: u32,
        token: &'a [u8],
    },
    Ping,
    /// CREATE_CGROUP: a new pool for a container.
    CreatePool(PoolOptions),
    /// DESTROY_CGROUP: frees every page of the pool.
    DestroyPool {
        pool: PoolId,
    },
    /// SET_CG_WEIGHT: the container's `<T, W>`.
    SetSpec {
        pool: PoolId,
        spec: Spec,
    },
    Put {
        pool: PoolId,
        key: Key,
        data: &'a [u8],
    },
    Get {
        pool: PoolId,
        key: Key,
    },
    FlushPage {
        pool: PoolId,
        key: Key,
    },
    FlushObject {
        pool: PoolId,
        object: u64,
    },
    /// MIGRATE_OBJECT between two pools of the same VM.
    MigrateObject {
        from: PoolId,
        to: PoolId,
        object: u64,
    },
    /// `pages` holds `keys.len()` pages back to back.
    PutBatch {
        pool: PoolId,
        keys: KeyList<'a>,
        pages: &'a [u8],
    },
    GetBatch {
        pool: PoolId,
        keys: KeyList<'a>,
    },
    /// GET_STATS of one pool (JSON `PoolStats`).
    PoolStats {
        pool: PoolId,
    },
    /// GET_STATS of the calling VM (JSON `VmStats`).
    VmStats,
    ListPools,
    /// Names a pool (its container's name, UTF-8, at most `MAX_LABEL_BYTES`); an empty label takes
    /// the name away.
    SetLabel {
        pool: PoolId,
        label: &'a [u8],
    },
}

/// The longest label SET_LABEL carries (the engine's `names::MAX_POOL_LABEL_BYTES`).
pub const MAX_LABEL_BYTES: usize = 255;

struct Rd<'a> {
    b: &'a [u8],
    op: &'static str,
}

impl<'a> Rd<'a> {
    fn err(&self, reason: &'static str) -> ProtoError {
        ProtoError::Malformed { op: self.op, reason }
    }
    fn take(&mut self, n: usize) -> Result<&'a [u8], ProtoError> {
        if self.b.len() < n {
            return Err(self.err("payload too short"));
        }
        let (h, t) = self.b.split_at(n);
        self.b = t;
        Ok(h)
    }
    fn u8(&mut self) -> Result<u8, ProtoError> {
        Ok(self.take(1)?[0])
    }
    fn u16(&mut self) -> Result<u16, ProtoError> {
        Ok(u16::from_le_bytes(self.take(2)?.try_into().expect("2 bytes")))
    }
    fn u32(&mut self) -> Result<u32, ProtoError> {
        Ok(u32::from_le_bytes(self.take(4)?.try_into().expect("4 bytes")))
    }
    fn u64(&mut self) -> Result<u64, ProtoError> {
        Ok(u64::from_le_bytes(self.take(8)?.try_into().expect("8 bytes")))
    }
    fn pool(&mut self) -> Result<PoolId, ProtoError> {
        Ok(PoolId(self.u32()?))
    }
    fn key(&mut self) -> Result<Key, ProtoError> {
        Ok(Key::new(self.u64()?, self.u64()?))
    }
    fn rest(&mut self) -> &'a [u8] {
        std::mem::take(&mut self.b)
    }
    fn spec(&mut self) -> Result<Spec, ProtoError> {
        let tag = self.u8()?;
        let a = self.u32()?;
        let b = self.u32()?;
        Ok(match tag {
            0 => Spec::None,
            1 => Spec::Mem { weight: a },
            2 => Spec::Ssd { weight: a },
            3 => Spec::Hybrid { mem_weight: a, ssd_weight: b },
            _ => return Err(self.err("unknown spec type")),
        })
    }
    fn end(&self) -> Result<(), ProtoError> {
        if self.b.is_empty() {
            Ok(())
        } else {
            Err(self.err("trailing bytes"))
        }
    }
    /// A batch count followed by that many keys; the count is checked against the limit and against the
    /// bytes present before anything is sized by it.
    fn keys(&mut self, max_batch: u32) -> Result<KeyList<'a>, ProtoError> {
        let n = self.u32()?;
        if n > max_batch {
            return Err(ProtoError::BatchTooLarge { got: n, limit: max_batch });
        }
        let bytes = (n as usize).checked_mul(KEY_LEN).ok_or_else(|| self.err("batch count overflows"))?;
        Ok(KeyList::Wire(self.take(bytes)?))
    }
}

fn put_spec(out: &mut Vec<u8>, s: &Spec) {
    let (tag, a, b) = match *s {
        Spec::None => (0u8, 0u32, 0u32),
        Spec::Mem { weight } => (1, weight, 0),
        Spec::Ssd { weight } => (2, weight, 0),
        Spec::Hybrid { mem_weight, ssd_weight } => (3, mem_weight, ssd_weight),
    };
    out.push(tag);
    out.extend_from_slice(&a.to_le_bytes());
    out.extend_from_slice(&b.to_le_bytes());
}

fn put_key(out: &mut Vec<u8>, k: Key) {
    out.extend_from_slice(&k.object.to_le_bytes());
    out.extend_from_slice(&k.index.to_le_bytes());
}

fn outcome_to_u8(o: PutOutcome) -> u8 {
    match o {
        PutOutcome::Refused => 0,
        PutOutcome::Stored(StoreKind::Mem) => 1,
        PutOutcome::Stored(StoreKind::Ssd) => 2,
    }
}

fn outcome_from_u8(v: u8, rd: &Rd<'_>) -> Result<PutOutcome, ProtoError> {
    Ok(match v {
        0 => PutOutcome::Refused,
        1 => PutOutcome::Stored(StoreKind::Mem),
        2 => PutOutcome::Stored(StoreKind::Ssd),
        _ => return Err(rd.err("unknown put outcome")),
    })
}

impl<'a> Request<'a> {
    pub fn op(&self) -> Op {
        match self {
            Request::Hello { .. } => Op::Hello,
            Request::Ping => Op::Ping,
            Request::CreatePool(_) => Op::CreatePool,
            Request::DestroyPool { .. } => Op::DestroyPool,
            Request::SetSpec { .. } => Op::SetSpec,
            Request::Put { .. } => Op::Put,
            Request::Get { .. } => Op::Get,
            Request::FlushPage { .. } => Op::FlushPage,
            Request::FlushObject { .. } => Op::FlushObject,
            Request::MigrateObject { .. } => Op::MigrateObject,
            Request::PutBatch { .. } => Op::PutBatch,
            Request::GetBatch { .. } => Op::GetBatch,
            Request::PoolStats { .. } => Op::PoolStats,
            Request::VmStats => Op::VmStats,
            Request::ListPools => Op::ListPools,
            Request::SetLabel { .. } => Op::SetLabel,
        }
    }

    /// Decodes the payload of a request frame with op byte `op`. `max_batch` bounds batch counts.
    pub fn decode(op: u8, payload: &'a [u8], max_batch: u32) -> Result<Request<'a>, ProtoError> {
        let op = Op::from_u8(op).ok_or(ProtoError::UnknownOp(op))?;
        let mut r = Rd { b: payload, op: op.name() };
        let req = match op {
            Op::Hello => {
                let min_version = r.u16()?;
                let max_version = r.u16()?;
                let vm = r.u32()?;
                let n = r.u16()? as usize;
                if n > MAX_TOKEN_BYTES {
                    return Err(r.err("token longer than 256 bytes"));
                }
                Request::Hello { min_version, max_version, vm, token: r.take(n)? }
            }
            Op::Ping => Request::Ping,
            Op::CreatePool => {
                let kind = match r.u8()? {
                    0 => PoolKind::Ephemeral,
                    1 => PoolKind::Persistent,
                    _ => return Err(r.err("unknown pool kind")),
                };
                let order =
                    EvictionOrder::from_wire_code(r.u8()?).ok_or_else(|| r.err("unknown eviction order"))?;
                let exclusive_gets = match r.u8()? {
                    0 => false,
                    1 => true,
                    _ => return Err(r.err("exclusive_gets must be 0 or 1")),
                };
                let spec = r.spec()?;
                Request::CreatePool(PoolOptions { kind, spec, order, exclusive_gets, shards: 0 })
            }
            Op::DestroyPool => Request::DestroyPool { pool: r.pool()? },
            Op::SetSpec => Request::SetSpec { pool: r.pool()?, spec: r.spec()? },
            Op::Put => Request::Put { pool: r.pool()?, key: r.key()?, data: r.rest() },
            Op::Get => Request::Get { pool: r.pool()?, key: r.key()? },
            Op::FlushPage => Request::FlushPage { pool: r.pool()?, key: r.key()? },
            Op::FlushObject => Request::FlushObject { pool: r.pool()?, object: r.u64()? },
            Op::MigrateObject => Request::MigrateObject { from: r.pool()?, to: r.pool()?, object: r.u64()? },
            Op::PutBatch => {
                let pool = r.pool()?;
                let keys = r.keys(max_batch)?;
                // The page size is the server's: the handler checks `pages` against `keys` (one code,
                // bad_page_size, for every page-size mismatch).
                let pages = r.rest();
                Request::PutBatch { pool, keys, pages }
            }
            Op::GetBatch => Request::GetBatch { pool: r.pool()?, keys: r.keys(max_batch)? },
            Op::PoolStats => Request::PoolStats { pool: r.pool()? },
            Op::VmStats => Request::VmStats,
            Op::ListPools => Request::ListPools,
            Op::SetLabel => {
                let pool = r.pool()?;
                let label = r.rest();
                if label.len() > MAX_LABEL_BYTES {
                    return Err(r.err("label longer than 255 bytes"));
                }
                Request::SetLabel { pool, label }
            }
        };
        r.end()?;
        Ok(req)
    }

    /// Appends the whole request frame (header and payload) to `out`.
    pub fn encode(&self, version: u8, request_id: u64, out: &mut Vec<u8>) {
        let start = out.len();
        Header { version, op: self.op() as u8, flags: 0, status: 0, request_id, payload_len: 0 }.encode(out);
        match self {
            Request::Hello { min_version, max_version, vm, token } => {
                out.extend_from_slice(&min_version.to_le_bytes());
                out.extend_from_slice(&max_version.to_le_bytes());
                out.extend_from_slice(&vm.to_le_bytes());
                out.extend_from_slice(&(token.len() as u16).to_le_bytes());
                out.extend_from_slice(token);
            }
            Request::Ping | Request::VmStats | Request::ListPools => {}
            Request::CreatePool(o) => {
                out.push(match o.kind {
                    PoolKind::Ephemeral => 0,
                    PoolKind::Persistent => 1,
                });
                out.push(o.order.wire_code());
                out.push(o.exclusive_gets as u8);
                put_spec(out, &o.spec);
            }
            Request::DestroyPool { pool } | Request::PoolStats { pool } => {
                out.extend_from_slice(&pool.0.to_le_bytes())
            }
            Request::SetSpec { pool, spec } => {
                out.extend_from_slice(&pool.0.to_le_bytes());
                put_spec(out, spec);
            }
            Request::Put { pool, key, data } => {
                out.extend_from_slice(&pool.0.to_le_bytes());
                put_key(out, *key);
                out.extend_from_slice(data);
            }
            Request::Get { pool, key } | Request::FlushPage { pool, key } => {
                out.extend_from_slice(&pool.0.to_le_bytes());
                put_key(out, *key);
            }
            Request::FlushObject { pool, object } => {
                out.extend_from_slice(&pool.0.to_le_bytes());
                out.extend_from_slice(&object.to_le_bytes());
            }
            Request::MigrateObject { from, to, object } => {
                out.extend_from_slice(&from.0.to_le_bytes());
                out.extend_from_slice(&to.0.to_le_bytes());
                out.extend_from_slice(&object.to_le_bytes());
            }
            Request::PutBatch { pool, keys, pages } => {
                out.extend_from_slice(&pool.0.to_le_bytes());
                out.extend_from_slice(&(keys.len() as u32).to_le_bytes());
                keys.iter().for_each(|k| put_key(out, k));
                out.extend_from_slice(pages);
            }
            Request::GetBatch { pool, keys } => {
                out.extend_from_slice(&pool.0.to_le_bytes());
                out.extend_from_slice(&(keys.len() as u32).to_le_bytes());
                keys.iter().for_each(|k| put_key(out, k));
            }
            Request::SetLabel { pool, label } => {
                out.extend_from_slice(&pool.0.to_le_bytes());
                out.extend_from_slice(label);
            }
        }
        let len = (out.len() - start - HEADER_LEN) as u32;
        out[start + 16..start + 20].copy_from_slice(&len.to_le_bytes());
    }
}

/// A response, as the client decodes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Response {
    Hello {
        version: u16,
        vm: u32,
        page_size: u32,
        max_batch: u32,
        max_payload: u32,
        /// The daemon's instance id, drawn at each start (version 2 on; `None` in version 1): a client
        /// that sees a new one knows that every pool it had is gone.
        instance: Option<u64>,
    },
    Pong,
    PoolCreated(PoolId),
    /// DestroyPool, SetSpec, SetLabel.
    Done,
    Put(PutOutcome),
    Get(Option<Vec<u8>>),
    /// FlushPage: whether a page was there.
    Flushed(bool),
    /// FlushObject (pages dropped), MigrateObject (pages moved).
    Count(u64),
    PutBatch(Vec<PutOutcome>),
    /// `pages` holds the pages of the hits, back to back, in key order.
    GetBatch {
        hits: Vec<bool>,
        pages: Vec<u8>,
    },
    /// PoolStats / VmStats: a UTF-8 JSON document (`PoolStats` / `VmStats` of the admin API schema).
    Json(Vec<u8>),
    Pools(Vec<PoolId>),
    /// Any non-zero status: the code and a human-readable message.
    Error {
        status: Status,
        message: String,
    },
}

impl Response {
    /// Decodes a response frame's payload, given its header (the op says which layout).
    pub fn decode(h: &Header, payload: &[u8]) -> Result<Response, ProtoError> {
        if !h.status().is_ok() {
            return Ok(Response::Error {
                status: h.status(),
                message: String::from_utf8_lossy(payload).into_owned(),
            });
        }
        let op = Op::from_u8(h.op).ok_or(ProtoError::UnknownOp(h.op))?;
        let mut r = Rd { b: payload, op: op.name() };
        let resp = match op {
            Op::Hello => Response::Hello {
                version: r.u16()?,
                vm: r.u32()?,
                page_size: r.u32()?,
                max_batch: r.u32()?,
                max_payload: r.u32()?,
                // The layout is the negotiated version's, which the response frame carries.
                instance: if h.version >= 2 { Some(r.u64()?) } else { None },
            },
            Op::Ping => Response::Pong,
            Op::CreatePool => Response::PoolCreated(r.pool()?),
            Op::DestroyPool | Op::SetSpec | Op::SetLabel => Response::Done,
            Op::Put => {
                let v = r.u8()?;
                Response::Put(outcome_from_u8(v, &r)?)
            }
            Op::Get => match r.u8()? {
                0 => Response::Get(None),
                1 => Response::Get(Some(r.rest().to_vec())),
                _ => return Err(r.err("hit flag must be 0 or 1")),
            },
            Op::FlushPage => Response::Flushed(r.u8()? != 0),
            Op::FlushObject | Op::MigrateObject => Response::Count(r.u64()?),
            Op::PutBatch => {
                let n = r.u32()? as usize;
                let raw = r.take(n)?;
                let mut v = Vec::with_capacity(n);
                for &b in raw {
                    v.push(outcome_from_u8(b, &r)?);
                }
                Response::PutBatch(v)
            }
            Op::GetBatch => {
                let n = r.u32()? as usize;
                let hits: Vec<bool> = r.take(n)?.iter().map(|&b| b != 0).collect();
                Response::GetBatch { hits, pages: r.rest().to_vec() }
            }
            Op::PoolStats | Op::VmStats => Response::Json(r.rest().to_vec()),
            Op::ListPools => {
                let n = r.u32()? as usize;
                let raw = r.take(n.checked_mul(4).ok_or_else(|| r.err("count overflows"))?)?;
                Response::Pools(
                    raw.chunks_exact(4)
                        .map(|c| PoolId(u32::from_le_bytes(c.try_into().expect("4 bytes"))))
                        .collect(),
                )
            }
        };
        r.end()?;
        Ok(resp)
    }

    /// Appends the whole response frame to `out`, for a request of op `op` with id `request_id`.
    pub fn encode(&self, version: u8, op: u8, request_id: u64, out: &mut Vec<u8>) {
        let start = begin_response(out, version, op, request_id);
        let mut status = Status::OK;
        match self {
            Response::Hello { version: v, vm, page_size, max_batch, max_payload, instance } => {
                out.extend_from_slice(&v.to_le_bytes());
                out.extend_from_slice(&vm.to_le_bytes());
                out.extend_from_slice(&page_size.to_le_bytes());
                out.extend_from_slice(&max_batch.to_le_bytes());
                out.extend_from_slice(&max_payload.to_le_bytes());
                if version >= 2 {
                    out.extend_from_slice(&instance.unwrap_or(0).to_le_bytes());
                }
            }
            Response::Pong | Response::Done => {}
            Response::PoolCreated(p) => out.extend_from_slice(&p.0.to_le_bytes()),
            Response::Put(o) => out.push(outcome_to_u8(*o)),
            Response::Get(None) => out.push(0),
            Response::Get(Some(d)) => {
                out.push(1);
                out.extend_from_slice(d);
            }
            Response::Flushed(b) => out.push(*b as u8),
            Response::Count(n) => out.extend_from_slice(&n.to_le_bytes()),
            Response::PutBatch(v) => {
                out.extend_from_slice(&(v.len() as u32).to_le_bytes());
                out.extend(v.iter().map(|o| outcome_to_u8(*o)));
            }
            Response::GetBatch { hits, pages } => {
                out.extend_from_slice(&(hits.len() as u32).to_le_bytes());
                out.extend(hits.iter().map(|&h| h as u8));
                out.extend_from_slice(pages);
            }
            Response::Json(j) => out.extend_from_slice(j),
            Response::Pools(p) => {
                out.extend_from_slice(&(p.len() as u32).to_le_bytes());
                p.iter().for_each(|p| out.extend_from_slice(&p.0.to_le_bytes()));
            }
            Response::Error { status: s, message } => {
                status = *s;
                out.extend_from_slice(message.as_bytes());
            }
        }
        finish_response(out, start, status);
    }
}

/// The wire byte of a put outcome (for servers writing batch responses directly).
pub fn encode_outcome(o: PutOutcome) -> u8 {
    outcome_to_u8(o)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::frame::split_frame;
    use proptest::prelude::*;

    fn roundtrip(req: &Request<'_>) {
        let mut out = Vec::new();
        req.encode(1, 77, &mut out);
        let (h, n) = split_frame(&out, u32::MAX).unwrap().unwrap();
        assert_eq!(n, out.len());
        assert_eq!(h.request_id, 77);
        let back = Request::decode(h.op, &out[HEADER_LEN..], 256).unwrap();
        // Keys decode as wire bytes: compare key by key.
        match (req, &back) {
            (Request::PutBatch { keys: a, pages: pa, .. }, Request::PutBatch { keys: b, pages: pb, .. }) => {
                assert!(a.iter().eq(b.iter()));
                assert_eq!(pa, pb);
            }
            (Request::GetBatch { keys: a, .. }, Request::GetBatch { keys: b, .. }) => {
                assert!(a.iter().eq(b.iter()))
            }
            _ => assert_eq!(req, &back),
        }
    }

    #[test]
    fn every_request_round_trips() {
        let page = vec![5u8; 4096];
        let keys = [Key::new(1, 2), Key::new(3, 4)];
        let pages = vec![9u8; 8192];
        let reqs = [
            Request::Hello { min_version: 1, max_version: 3, vm: 7, token: b"secret" },
            Request::Ping,
            Request::CreatePool(PoolOptions::ephemeral(Spec::Hybrid { mem_weight: 3, ssd_weight: 4 })),
            Request::CreatePool(
                PoolOptions::persistent(Spec::Ssd { weight: 2 }).with_order(EvictionOrder::S3Fifo),
            ),
            Request::DestroyPool { pool: PoolId(3) },
            Request::SetSpec { pool: PoolId(3), spec: Spec::None },
            Request::SetLabel { pool: PoolId(3), label: "web-frontend".as_bytes() },
            Request::SetLabel { pool: PoolId(3), label: b"" },
            Request::Put { pool: PoolId(3), key: Key::new(u64::MAX, 0), data: &page },
            Request::Get { pool: PoolId(3), key: Key::new(1, 1) },
            Request::FlushPage { pool: PoolId(3), key: Key::new(1, 1) },
            Request::FlushObject { pool: PoolId(3), object: 5 },
            Request::MigrateObject { from: PoolId(1), to: PoolId(2), object: 5 },
            Request::PutBatch { pool: PoolId(1), keys: KeyList::Keys(&keys), pages: &pages },
            Request::GetBatch { pool: PoolId(1), keys: KeyList::Keys(&keys) },
            Request::PoolStats { pool: PoolId(1) },
            Request::VmStats,
            Request::ListPools,
        ];
        for r in &reqs {
            roundtrip(r);
        }
        let ops: std::collections::HashSet<u8> = reqs.iter().map(|r| r.op() as u8).collect();
        assert_eq!(ops.len(), Op::ALL.len(), "every op is covered");
    }

    #[test]
    fn get_request_layout_is_pinned() {
        let mut out = Vec::new();
        Request::Get { pool: PoolId(2), key: Key::new(3, 4) }.encode(1, 5, &mut out);
        let mut want = vec![b'D', b'D', 1, 7, 0, 0, 0, 0, 5, 0, 0, 0, 0, 0, 0, 0, 20, 0, 0, 0];
        want.extend_from_slice(&[2, 0, 0, 0, 3, 0, 0, 0, 0, 0, 0, 0, 4, 0, 0, 0, 0, 0, 0, 0]);
        assert_eq!(out, want);
    }

    #[test]
    fn bad_payloads_are_typed_errors() {
        assert_eq!(Request::decode(0, &[], 8), Err(ProtoError::UnknownOp(0)));
        assert_eq!(Request::decode(200, &[], 8), Err(ProtoError::UnknownOp(200)));
        assert!(matches!(Request::decode(Op::Get as u8, &[1, 2, 3], 8), Err(ProtoError::Malformed { .. })));
        assert!(matches!(Request::decode(Op::Ping as u8, &[1], 8), Err(ProtoError::Malformed { .. })));
        // A batch count far larger than the payload: refused by the limit, never allocated.
        let mut p = vec![1, 0, 0, 0];
        p.extend_from_slice(&u32::MAX.to_le_bytes());
        assert_eq!(
            Request::decode(Op::GetBatch as u8, &p, 256),
            Err(ProtoError::BatchTooLarge { got: u32::MAX, limit: 256 })
        );
        // Within the limit but not backed by bytes.
        let mut p = vec![1, 0, 0, 0];
        p.extend_from_slice(&100u32.to_le_bytes());
        assert!(matches!(Request::decode(Op::GetBatch as u8, &p, 256), Err(ProtoError::Malformed { .. })));
        // Spec tag out of range.
        let mut p = vec![1, 0, 0, 0];
        p.extend_from_slice(&[9, 0, 0, 0, 0, 0, 0, 0, 0]);
        assert!(matches!(Request::decode(Op::SetSpec as u8, &p, 256), Err(ProtoError::Malformed { .. })));
        // A label past MAX_LABEL_BYTES.
        let mut p = 3u32.to_le_bytes().to_vec();
        p.extend_from_slice(&[b'a'; MAX_LABEL_BYTES + 1]);
        assert!(matches!(Request::decode(Op::SetLabel as u8, &p, 256), Err(ProtoError::Malformed { .. })));
        // Put batch whose page bytes do not divide by the count: a layout the decoder keeps (the server
        // answers bad_page_size, as for every page-size mismatch).
        let mut out = Vec::new();
        let keys = [Key::new(1, 1), Key::new(1, 2)];
        Request::PutBatch { pool: PoolId(1), keys: KeyList::Keys(&keys), pages: &[0u8; 8193] }
            .encode(1, 1, &mut out);
        assert!(matches!(
            Request::decode(Op::PutBatch as u8, &out[HEADER_LEN..], 256),
            Ok(Request::PutBatch { pages, .. }) if pages.len() == 8193
        ));
    }

    #[test]
    fn every_response_round_trips() {
        let resps = [
            (
                Op::Hello,
                Response::Hello {
                    version: 2,
                    vm: 2,
                    page_size: 4096,
                    max_batch: 256,
                    max_payload: 9,
                    instance: Some(0x0123_4567_89ab_cdef),
                },
            ),
            (Op::Ping, Response::Pong),
            (Op::CreatePool, Response::PoolCreated(PoolId(4))),
            (Op::SetSpec, Response::Done),
            (Op::Put, Response::Put(PutOutcome::Stored(StoreKind::Ssd))),
            (Op::Put, Response::Put(PutOutcome::Refused)),
            (Op::Get, Response::Get(Some(vec![1, 2, 3]))),
            (Op::Get, Response::Get(None)),
            (Op::FlushPage, Response::Flushed(true)),
            (Op::MigrateObject, Response::Count(12)),
            (Op::PutBatch, Response::PutBatch(vec![PutOutcome::Refused, PutOutcome::Stored(StoreKind::Mem)])),
            (Op::GetBatch, Response::GetBatch { hits: vec![true, false], pages: vec![7; 10] }),
            (Op::VmStats, Response::Json(b"{}".to_vec())),
            (Op::ListPools, Response::Pools(vec![PoolId(1), PoolId(9)])),
            (Op::Get, Response::Error { status: Status(11), message: "unknown pool 3".into() }),
        ];
        for (op, r) in resps {
            let mut out = Vec::new();
            r.encode(2, op as u8, 3, &mut out);
            let (h, n) = split_frame(&out, u32::MAX).unwrap().unwrap();
            assert_eq!(n, out.len());
            assert!(h.is_response());
            assert_eq!(Response::decode(&h, &out[HEADER_LEN..]).unwrap(), r);
        }
    }

    /// The HELLO response's layout is the negotiated version's: version 1 ends at `max_payload`,
    /// version 2 adds the instance id.
    #[test]
    fn hello_response_layouts_are_pinned_per_version() {
        let hello = |version: u16, instance| Response::Hello {
            version,
            vm: 7,
            page_size: 4096,
            max_batch: 256,
            max_payload: 0x0020_0000,
            instance,
        };
        let common = [1u8, 0, 7, 0, 0, 0, 0, 0x10, 0, 0, 0, 1, 0, 0, 0, 0, 0x20, 0];
        let mut v1 = Vec::new();
        hello(1, None).encode(1, Op::Hello as u8, 9, &mut v1);
        assert_eq!(v1[2], 1, "frame version");
        assert_eq!(&v1[HEADER_LEN..], &common);
        let (h, _) = split_frame(&v1, u32::MAX).unwrap().unwrap();
        assert_eq!(Response::decode(&h, &v1[HEADER_LEN..]).unwrap(), hello(1, None));

        let mut v2 = Vec::new();
        hello(2, Some(0x1122_3344_5566_7788)).encode(2, Op::Hello as u8, 9, &mut v2);
        let mut want = common.to_vec();
        want[0] = 2;
        want.extend_from_slice(&[0x88, 0x77, 0x66, 0x55, 0x44, 0x33, 0x22, 0x11]);
        assert_eq!(&v2[HEADER_LEN..], &want[..]);
        let (h, _) = split_frame(&v2, u32::MAX).unwrap().unwrap();
        assert_eq!(Response::decode(&h, &v2[HEADER_LEN..]).unwrap(), hello(2, Some(0x1122_3344_5566_7788)));
        // A version-1 body under a version-2 header is short: malformed, never a made-up id.
        assert!(Response::decode(&h, &v1[HEADER_LEN..]).is_err());
    }

    proptest! {
        /// Arbitrary bytes never panic the decoders, whatever the op.
        #[test]
        fn decoders_never_panic(op in any::<u8>(), payload in proptest::collection::vec(any::<u8>(), 0..200)) {
            let _ = Request::decode(op, &payload, 16);
            let h = Header { version: 1, op, flags: 1, status: 0, request_id: 0, payload_len: payload.len() as u32 };
            let _ = Response::decode(&h, &payload);
        }
    }
}
