//! Recorded traffic turned into inputs of every fuzz target (issue 17, item 5).
//!
//! The daemon records each data-plane and peer connection when asked (`[capture]`,
//! `dd_server::capture`: what it received and what it sent, timed). [`convert`] reads such recordings
//! and writes, for each target, inputs in that target's format:
//!
//! * `frame_decoder`: the frames a client sent and the frames the daemon answered, as they were on the
//!   wire, a few whole frames per input.
//! * `request_handler`: a selector byte for a valid HELLO the target sends of its own first (0x82:
//!   offering version 2, when the recorded frames carry it), then the frames a client sent after its
//!   HELLO; a connection whose HELLO the daemon refused (or that sent no HELLO) goes in whole after
//!   selector 0 (no HELLO of the target's).
//! * Raw inputs end with what followed a connection's last whole frame, if anything did (bytes after
//!   a lost frame boundary: a hostile client's).
//! * `peer_decoder`: the frames a peer sent and the frames the listener answered.
//! * `data_plane`: typed steps ([`crate::data_plane`]). Two VMs of a daemon become VM 1 and VM 2, their
//!   requests interleaved in the order they reached the daemon; pools map onto the target's live pools
//!   by position (pool ids come from the recorded CREATE_POOL answers), keys fold onto the target's 32
//!   keys (object % 4, index % 8), batches split into batches of at most 4 keys, weights above 255
//!   become 255. Each input starts by creating the pools that were live where it starts.
//! * `engine_model`: model operations ([`crate::engine_model`]). Three VMs of a daemon become the
//!   harness's VMs 1-3, their pools its three slots per VM in creation order (a recorded CREATE_POOL is
//!   a `Recreate` of the next slot, with the recorded kind and order, then a `SetSpec` with its spec),
//!   objects and indexes fold modulo 6 and 24; inputs go round the four engines.
//! * `peer_handler`: typed steps ([`crate::peer_handler`]). Two peers of a daemon become peers `a` and
//!   `b`; a peer's later connection is a reconnect (its epochs mapped in order onto 1, 2, 0, ...);
//!   compares of content the daemon pinned become compares of a page the target's host holds, the
//!   others of a page it does not; fetched and unpinned handles become the granted handle at the same
//!   position in grant order; gaps of a millisecond or more become waits.
//! * `trace_reader`: the keys of the recorded puts and gets as trace files, libCacheSim
//!   oracle-general records (through `dd_trace::OracleGeneralWriter`) and CSV rows.
//!
//! What the typed forms cannot hold is left out and counted in [`Report::unmapped`]: page contents
//! (each target writes pages of its own, which its model can check), other pool ids than the ones
//! answered, VMs and peers beyond the target's, the admin API's changes (they are not on these
//! connections), wall-clock waits past the target's 1 s pin TTL (the daemons ran with 360 s), and
//! handshakes (the typed targets start authenticated).
//!
//! Every typed input written is read back with the target's own reader and must give what was
//! meant (`arbitrary`'s layout is checked, not assumed).

use crate::data_plane::{self, KeyIn, PoolRef, SpecIn, Step, MAX_BATCH};
use crate::engine_model::{self as em, Op};
use crate::peer_handler::{self as ph, Handle, Who, HELD, PAGES};
use dd_coop::wire::{self as pw, PeerRequest, PeerResponse};
use dd_engine::{Key, PoolId, PoolKind, PoolOptions, Spec};
use dd_proto::frame::split_frame;
use dd_proto::{Request, Response, HEADER_LEN};
use dd_server::capture::{Channel, Direction, Recording};
use std::collections::{BTreeMap, HashMap};

/// Frames per raw input at most, and bytes (a frame larger than this is an input alone, up to
/// [`MAX_FRAME`]).
const RAW_FRAMES: usize = 32;
const RAW_BYTES: usize = 16 << 10;
/// Frames larger than this are left out of the raw inputs (a GET_BATCH answer of 256 pages is 1 MiB:
/// libFuzzer's mutations of it would be slow and find nothing a small one does not).
const MAX_FRAME: usize = 64 << 10;
/// Typed steps or operations per input at most (well below the targets' limits: shorter inputs run
/// faster, and the libFuzzer's mutations splice them).
const TYPED_STEPS: usize = 64;
/// Trace records per trace input.
const TRACE_RECORDS: usize = 160;

/// One capture file, read.
pub struct Capture {
    /// The file's name (`<pid>-<data|peer>-<n>.ddcap`): the pid groups the connections of one daemon.
    pub name: String,
    pub rec: Recording,
}

impl Capture {
    fn daemon(&self) -> &str {
        self.name.split('-').next().unwrap_or("")
    }
}

/// One input of one target.
pub struct Input {
    pub target: &'static str,
    pub name: String,
    pub bytes: Vec<u8>,
}

/// What was converted and what could not be.
#[derive(Debug, Default)]
pub struct Report {
    pub inputs: BTreeMap<&'static str, usize>,
    /// What could not be mapped, and how often.
    pub unmapped: BTreeMap<String, u64>,
}

impl Report {
    fn skip(&mut self, what: impl Into<String>) {
        *self.unmapped.entry(what.into()).or_default() += 1;
    }
}

/// A frame as it was on the wire, with the time its first byte arrived (µs since the Unix epoch).
struct Frame {
    at: u64,
    raw: Vec<u8>,
}

/// One direction of a recording: its whole frames, and what followed the last of them (a frame cut
/// short by the end of the recording, or bytes after a lost frame boundary: a hostile client's).
struct Frames {
    whole: Vec<Frame>,
    rest: Vec<u8>,
}

/// Splits one direction of a recording into whole frames. `header` parses a frame header and gives
/// its whole length (`None`: incomplete; `Err`: the boundary is lost, the rest is not split).
fn split(rec: &Recording, dir: Direction, header: impl Fn(&[u8]) -> Result<Option<usize>, ()>) -> Frames {
    let mut stream = Vec::new();
    let mut starts = Vec::new(); // (offset in the stream, time of the record starting there)
    for r in rec.records.iter().filter(|r| r.direction == dir) {
        starts.push((stream.len(), rec.accepted_us + r.at_us));
        stream.extend_from_slice(&r.bytes);
    }
    let time_at = |off: usize| starts[starts.partition_point(|s| s.0 <= off).saturating_sub(1)].1;
    let mut out = Vec::new();
    let mut at = 0;
    while let Ok(Some(n)) = header(&stream[at..]) {
        out.push(Frame { at: time_at(at), raw: stream[at..at + n].to_vec() });
        at += n;
    }
    Frames { whole: out, rest: stream[at..].to_vec() }
}

fn data_frames(rec: &Recording, dir: Direction) -> Frames {
    split(rec, dir, |b| match split_frame(b, u32::MAX) {
        Ok(f) => Ok(f.map(|(_, n)| n)),
        Err(_) => Err(()),
    })
}

fn peer_frames(rec: &Recording, dir: Direction) -> Frames {
    split(rec, dir, |b| match pw::parse_header(b, u32::MAX) {
        Ok(Some(h)) => {
            let n = pw::HEADER_LEN + h.payload_len as usize;
            Ok((b.len() >= n).then_some(n))
        }
        Ok(None) => Ok(None),
        Err(_) => Err(()),
    })
}

/// Raw inputs of one direction: its whole frames (the first `skip` left out) in groups of at most
/// `RAW_FRAMES` frames and `RAW_BYTES` bytes, then what followed them (up to `RAW_BYTES`), each after
/// `prefix`.
fn raw_of(f: &Frames, skip: usize, prefix: &[u8]) -> Vec<Vec<u8>> {
    let mut v = raw_inputs(f.whole.iter().skip(skip).map(|f| &f.raw[..]), prefix);
    if !f.rest.is_empty() {
        let mut tail = prefix.to_vec();
        tail.extend_from_slice(&f.rest[..f.rest.len().min(RAW_BYTES)]);
        v.push(tail);
    }
    v
}

/// Groups whole frames into raw inputs of at most `RAW_FRAMES` frames and `RAW_BYTES` bytes.
fn raw_inputs<'a>(frames: impl Iterator<Item = &'a [u8]>, prefix: &[u8]) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    let mut cur = prefix.to_vec();
    let mut n = 0;
    for f in frames.filter(|f| f.len() <= MAX_FRAME) {
        if n > 0 && (n == RAW_FRAMES || cur.len() + f.len() > RAW_BYTES) {
            out.push(std::mem::replace(&mut cur, prefix.to_vec()));
            n = 0;
        }
        cur.extend_from_slice(f);
        n += 1;
    }
    if n > 0 {
        out.push(cur);
    }
    out
}

/// A data-plane request as far as the typed targets can use it (owned; keys decoded).
#[derive(Debug, Clone)]
enum Call {
    Hello,
    Ping,
    CreatePool(PoolOptions),
    DestroyPool(PoolId),
    SetSpec(PoolId, Spec),
    Put(PoolId, Key, usize),
    Get(PoolId, Key),
    FlushPage(PoolId, Key),
    FlushObject(PoolId, u64),
    Migrate(PoolId, PoolId, u64),
    PutBatch(PoolId, Vec<Key>),
    GetBatch(PoolId, Vec<Key>),
    PoolStats(PoolId),
    VmStats,
    ListPools,
    /// Labels are not typed requests: the converter skips them.
    SetLabel,
}

impl Call {
    fn of(r: &Request<'_>) -> Call {
        match r {
            Request::Hello { .. } => Call::Hello,
            Request::Ping => Call::Ping,
            Request::CreatePool(o) => Call::CreatePool(*o),
            Request::DestroyPool { pool } => Call::DestroyPool(*pool),
            Request::SetSpec { pool, spec } => Call::SetSpec(*pool, *spec),
            Request::Put { pool, key, data } => Call::Put(*pool, *key, data.len()),
            Request::Get { pool, key } => Call::Get(*pool, *key),
            Request::FlushPage { pool, key } => Call::FlushPage(*pool, *key),
            Request::FlushObject { pool, object } => Call::FlushObject(*pool, *object),
            Request::MigrateObject { from, to, object } => Call::Migrate(*from, *to, *object),
            Request::PutBatch { pool, keys, .. } => Call::PutBatch(*pool, keys.iter().collect()),
            Request::GetBatch { pool, keys } => Call::GetBatch(*pool, keys.iter().collect()),
            Request::PoolStats { pool } => Call::PoolStats(*pool),
            Request::VmStats => Call::VmStats,
            Request::ListPools => Call::ListPools,
            Request::SetLabel { .. } => Call::SetLabel,
        }
    }
}

/// One request of a VM and what it was answered.
#[derive(Debug, Clone)]
struct Exchange {
    at: u64,
    vm: u32,
    call: Call,
    /// The pool a successful CREATE_POOL was given.
    created: Option<PoolId>,
}

/// The requests of one data-plane connection, paired with their answers by request id.
fn exchanges(c: &Capture, report: &mut Report) -> Vec<Exchange> {
    let mut answers: HashMap<(u64, u8), Vec<Response>> = HashMap::new();
    for f in data_frames(&c.rec, Direction::Sent).whole {
        let (h, _) = split_frame(&f.raw, u32::MAX).expect("split before").expect("whole");
        if let Ok(r) = Response::decode(&h, &f.raw[HEADER_LEN..]) {
            answers.entry((h.request_id, h.op)).or_default().push(r);
        }
    }
    for v in answers.values_mut() {
        v.reverse(); // popped in the order they were sent
    }
    let mut vm = None;
    let mut out = Vec::new();
    for f in data_frames(&c.rec, Direction::Received).whole {
        let (h, _) = split_frame(&f.raw, u32::MAX).expect("split before").expect("whole");
        let answer = answers.get_mut(&(h.request_id, h.op)).and_then(Vec::pop);
        let req = match Request::decode(h.op, &f.raw[HEADER_LEN..], u32::MAX) {
            Ok(r) => r,
            Err(_) => {
                report.skip("data-plane frame that does not decode");
                continue;
            }
        };
        if let Request::Hello { vm: v, .. } = req {
            if vm.is_none() {
                vm = Some(v);
                continue; // the handshake: the typed targets start authenticated
            }
        }
        let Some(vm) = vm else {
            report.skip("data-plane request before a HELLO");
            continue;
        };
        let created = match answer {
            Some(Response::PoolCreated(id)) => Some(id),
            _ => None,
        };
        out.push(Exchange { at: f.at, vm, call: Call::of(&req), created });
    }
    out
}

/// Every exchange of one daemon's data plane, in the order they reached it, and its VMs in the order
/// they first appeared.
fn daemon_exchanges(caps: &[&Capture], report: &mut Report) -> (Vec<Exchange>, Vec<u32>) {
    let mut all: Vec<Exchange> = caps.iter().flat_map(|c| exchanges(c, report)).collect();
    all.sort_by_key(|e| e.at); // stable: a connection's own order is kept at equal times
    let mut vms = Vec::new();
    for e in &all {
        if !vms.contains(&e.vm) {
            vms.push(e.vm);
        }
    }
    (all, vms)
}

/// The data_plane target's view of one VM's pools: recorded id -> the target's pool, by position.
#[derive(Default, Clone)]
struct DpPools {
    /// The target's live pools in creation order (its ids only grow, so this is its sorted order):
    /// the recorded pool each stands for (if any) and its options.
    live: Vec<(Option<PoolId>, PoolOptions)>,
}

/// The target's quota of pools per VM (`max_pools_per_vm` of `fuzz_targets/data_plane.rs`).
const DP_MAX_POOLS: usize = 8;

impl DpPools {
    fn pos(&self, p: PoolId) -> Option<PoolRef> {
        self.live.iter().position(|(r, _)| *r == Some(p)).map(|i| PoolRef(i as u8))
    }
}

fn create_req(o: &PoolOptions) -> data_plane::Req {
    data_plane::Req::CreatePool {
        persistent: o.kind == PoolKind::Persistent,
        order: o.order.wire_code(),
        exclusive: o.exclusive_gets,
        spec: SpecIn::of(o.spec),
    }
}

fn batch_keys(keys: &[Key]) -> [KeyIn; MAX_BATCH + 1] {
    let mut out = [KeyIn(0); MAX_BATCH + 1];
    for (o, k) in out.iter_mut().zip(keys) {
        *o = KeyIn::of(*k);
    }
    out
}

/// The typed steps of one exchange of VM `side` (0 or 1); updates the pools.
fn dp_steps(
    e: &Exchange,
    side: usize,
    pools: &mut [DpPools; 2],
    report: &mut Report,
) -> Vec<data_plane::Req> {
    use data_plane::Req as R;
    let p = &mut pools[side];
    let at = |id: PoolId, report: &mut Report| {
        let r = p.pos(id);
        if r.is_none() {
            report.skip("data_plane: a pool the target does not have");
        }
        r
    };
    let one = |r: Option<R>| r.into_iter().collect::<Vec<R>>();
    match &e.call {
        Call::Hello => vec![R::Hello],
        Call::Ping => vec![R::Ping],
        Call::VmStats => vec![R::VmStats],
        Call::ListPools => vec![R::ListPools],
        Call::CreatePool(o) => {
            if p.live.len() < DP_MAX_POOLS {
                p.live.push((e.created, *o));
            } else {
                report.skip("data_plane: a pool past the target's quota of 8");
            }
            vec![create_req(o)]
        }
        Call::DestroyPool(id) => {
            let r = at(*id, report);
            if let Some(r) = r {
                p.live.remove(r.0 as usize);
            }
            one(r.map(R::DestroyPool))
        }
        Call::SetSpec(id, s) => one(at(*id, report).map(|r| R::SetSpec(r, SpecIn::of(*s)))),
        Call::Put(id, k, len) => one(at(*id, report).map(|r| {
            // The recorded page size is the daemon's; a put of another size stays one.
            if *len % 512 == 0 && *len > 0 {
                R::Put(r, KeyIn::of(*k))
            } else {
                R::PutShort(r, KeyIn::of(*k), *len as u16)
            }
        })),
        Call::Get(id, k) => one(at(*id, report).map(|r| R::Get(r, KeyIn::of(*k)))),
        Call::FlushPage(id, k) => one(at(*id, report).map(|r| R::FlushPage(r, KeyIn::of(*k)))),
        Call::FlushObject(id, o) => one(at(*id, report).map(|r| R::FlushObject(r, (*o % 256) as u8))),
        Call::Migrate(a, b, o) => match (at(*a, report), at(*b, report)) {
            (Some(from), Some(to)) => vec![R::Migrate { from, to, object: (*o % 256) as u8 }],
            _ => vec![],
        },
        Call::PutBatch(id, keys) | Call::GetBatch(id, keys) => {
            let Some(r) = at(*id, report) else { return vec![] };
            let put = matches!(e.call, Call::PutBatch(..));
            keys.chunks(MAX_BATCH)
                .map(|c| {
                    if put {
                        R::PutBatch(r, c.len() as u8, batch_keys(c))
                    } else {
                        R::GetBatch(r, c.len() as u8, batch_keys(c))
                    }
                })
                .collect()
        }
        Call::PoolStats(id) => one(at(*id, report).map(R::PoolStats)),
        Call::SetLabel => {
            report.skip("data_plane: SET_LABEL (the typed requests carry no label)");
            vec![]
        }
    }
}

/// data_plane inputs of one daemon: its VMs in pairs.
fn data_plane_inputs(all: &[Exchange], vms: &[u32], report: &mut Report) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    for pair in vms.chunks(2) {
        let mut pools: [DpPools; 2] = Default::default();
        let mut steps: Vec<Step> = Vec::new();
        let mut start_pools = pools.clone();
        let flush = |steps: &mut Vec<Step>, start: &[DpPools; 2], out: &mut Vec<Vec<u8>>| {
            if steps.is_empty() {
                return;
            }
            // Re-create the pools live at the chunk's start, in order, so positions hold.
            let mut input: Vec<Step> = Vec::new();
            for (side, p) in start.iter().enumerate() {
                input.extend(p.live.iter().map(|(_, o)| Step::plain(side == 1, create_req(o))));
            }
            input.append(steps);
            let bytes = data_plane::write_steps(&input);
            assert_eq!(data_plane::read_steps(&bytes), input, "data_plane input does not read back");
            out.push(bytes);
        };
        for e in all {
            let Some(side) = pair.iter().position(|v| *v == e.vm) else { continue };
            for req in dp_steps(e, side, &mut pools, report) {
                steps.push(Step::plain(side == 1, req));
            }
            if steps.len() >= TYPED_STEPS {
                flush(&mut steps, &start_pools, &mut out);
                start_pools = pools.clone();
            }
        }
        flush(&mut steps, &start_pools, &mut out);
    }
    out
}

/// The harness's slots of one VM: which recorded pool each holds and with what options.
#[derive(Default, Clone)]
struct EmSlots {
    held: [Option<(PoolId, PoolOptions)>; em::POOLS_PER_VM],
    next: usize,
}

impl EmSlots {
    fn slot(&self, p: PoolId) -> Option<usize> {
        self.held.iter().position(|h| h.is_some_and(|(id, _)| id == p))
    }
}

/// The harness's spec code and weight nearest to a recorded spec (`model_harness::spec_of`).
fn spec_code(s: Spec) -> (u8, u32) {
    let w = |v: u32| v.clamp(1, 99);
    match s {
        Spec::Mem { weight } => (0, w(weight)),
        Spec::Ssd { weight } => (1, w(weight)),
        Spec::Hybrid { mem_weight, .. } => (2, w(mem_weight)),
        Spec::None => (4, 1),
    }
}

/// The operations a pool's recorded options come to: recreate the slot, then set its spec.
fn em_recreate(vm: u32, slot: usize, o: &PoolOptions) -> [Op; 2] {
    let (spec, w) = spec_code(o.spec);
    [
        Op::Recreate { vm, slot, persistent: o.kind == PoolKind::Persistent, order: o.order.wire_code() },
        Op::SetSpec { vm, slot, spec, w },
    ]
}

fn em_ops(e: &Exchange, vm: u32, slots: &mut EmSlots, report: &mut Report) -> Vec<Op> {
    let s = |id: PoolId, report: &mut Report| {
        let r = slots.slot(id);
        if r.is_none() {
            report.skip("engine_model: a pool not in the harness's slots");
        }
        r
    };
    let obj = |k: &Key| k.object % em::OBJECTS;
    let idx = |k: &Key| k.index % em::INDICES;
    match &e.call {
        Call::CreatePool(o) => {
            let slot = slots.next;
            slots.next = (slots.next + 1) % em::POOLS_PER_VM;
            match e.created {
                Some(id) => {
                    slots.held[slot] = Some((id, *o));
                    em_recreate(vm, slot, o).to_vec()
                }
                None => {
                    report.skip("engine_model: a refused CREATE_POOL");
                    vec![]
                }
            }
        }
        Call::SetSpec(id, spec) => s(*id, report)
            .map(|slot| {
                let (spec, w) = spec_code(*spec);
                vec![Op::SetSpec { vm, slot, spec, w }]
            })
            .unwrap_or_default(),
        Call::Put(id, k, _) => s(*id, report)
            .map(|slot| vec![Op::Put { vm, slot, obj: obj(k), idx: idx(k) }])
            .unwrap_or_default(),
        Call::Get(id, k) => s(*id, report)
            .map(|slot| vec![Op::Get { vm, slot, obj: obj(k), idx: idx(k) }])
            .unwrap_or_default(),
        Call::FlushPage(id, k) => s(*id, report)
            .map(|slot| vec![Op::FlushPage { vm, slot, obj: obj(k), idx: idx(k) }])
            .unwrap_or_default(),
        Call::FlushObject(id, o) => s(*id, report)
            .map(|slot| vec![Op::FlushObject { vm, slot, obj: o % em::OBJECTS }])
            .unwrap_or_default(),
        Call::Migrate(a, b, o) => match (s(*a, report), s(*b, report)) {
            (Some(from), Some(to)) => vec![Op::Migrate { vm, from, to, obj: o % em::OBJECTS }],
            _ => vec![],
        },
        // The harness's batches name their keys themselves (an object's even indexes; `n` indexes
        // 3 apart): the recorded batch gives the object and the size.
        Call::PutBatch(id, keys) => match (s(*id, report), keys.first()) {
            (Some(slot), Some(k)) => {
                vec![Op::PutBatch { vm, slot, obj: obj(k), n: (keys.len() as u64).clamp(1, 15) }]
            }
            _ => vec![],
        },
        Call::GetBatch(id, keys) => match (s(*id, report), keys.first()) {
            (Some(slot), Some(k)) => vec![Op::GetBatch { vm, slot, obj: obj(k) }],
            _ => vec![],
        },
        Call::DestroyPool(id) => {
            // The harness's slots always hold a pool; the slot is free for the next CREATE_POOL.
            if let Some(slot) = slots.slot(*id) {
                slots.held[slot] = None;
            }
            report.skip("engine_model: DESTROY_POOL (the harness's slots always hold a pool)");
            vec![]
        }
        Call::Hello | Call::Ping | Call::VmStats | Call::ListPools | Call::PoolStats(_) | Call::SetLabel => {
            report.skip("engine_model: a request without an engine operation (HELLO, PING, stats, lists)");
            vec![]
        }
    }
}

/// engine_model inputs of one daemon: its VMs in threes; the inputs go round the four engines.
fn engine_model_inputs(all: &[Exchange], vms: &[u32], report: &mut Report) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    for group in vms.chunks(em::VMS as usize) {
        let mut slots: Vec<EmSlots> = vec![EmSlots::default(); group.len()];
        let mut start = slots.clone();
        let mut ops: Vec<Op> = Vec::new();
        let flush = |ops: &mut Vec<Op>, start: &[EmSlots], out: &mut Vec<Vec<u8>>| {
            if ops.is_empty() {
                return;
            }
            let mut input = Vec::new();
            for (i, s) in start.iter().enumerate() {
                for (slot, h) in s.held.iter().enumerate() {
                    if let Some((_, o)) = h {
                        input.extend(em_recreate(i as u32 + 1, slot, o));
                    }
                }
            }
            input.append(ops);
            // Round the engines (selector % 4); the seed bits vary the pools' initial specs.
            let n = out.len() as u8;
            let selector = (n % 4) | ((n / 4) << 2);
            let bytes = em::write_input(selector, &input);
            let (sel, back) = em::read_input(&bytes).expect("a selector");
            assert_eq!((sel, format!("{back:?}")), (selector, format!("{input:?}")), "engine_model input");
            out.push(bytes);
        };
        for e in all {
            let Some(i) = group.iter().position(|v| *v == e.vm) else { continue };
            ops.extend(em_ops(e, i as u32 + 1, &mut slots[i], report));
            if ops.len() >= TYPED_STEPS {
                flush(&mut ops, &start, &mut out);
                start = slots.clone();
            }
        }
        flush(&mut ops, &start, &mut out);
    }
    out
}

/// trace_reader inputs of one daemon: the keys its puts and gets named, as oracle-general files and
/// as CSV files (id in column 1, the op in 2, the VM in 3).
fn trace_inputs(all: &[Exchange], page_size: u32) -> Vec<Vec<u8>> {
    let mut refs: Vec<(u64, u64, &'static str, u32)> = Vec::new(); // (time µs, id, op, vm)
    for e in all {
        let id = |p: PoolId, k: &Key| {
            let mut b = [0u8; 28];
            b[..4].copy_from_slice(&e.vm.to_le_bytes());
            b[4..8].copy_from_slice(&p.0.to_le_bytes());
            b[8..16].copy_from_slice(&k.object.to_le_bytes());
            b[16..24].copy_from_slice(&k.index.to_le_bytes());
            xxhash_rust::xxh3::xxh3_64(&b)
        };
        match &e.call {
            Call::Put(p, k, _) => refs.push((e.at, id(*p, k), "put", e.vm)),
            Call::Get(p, k) => refs.push((e.at, id(*p, k), "get", e.vm)),
            Call::PutBatch(p, ks) => refs.extend(ks.iter().map(|k| (e.at, id(*p, k), "put", e.vm))),
            Call::GetBatch(p, ks) => refs.extend(ks.iter().map(|k| (e.at, id(*p, k), "get", e.vm))),
            _ => {}
        }
    }
    let mut out = Vec::new();
    let t0 = refs.first().map_or(0, |r| r.0);
    for chunk in refs.chunks(TRACE_RECORDS) {
        // next_access_vtime: the index of the next reference to the same id in this file, -1 if none.
        let mut next = vec![-1i64; chunk.len()];
        let mut seen: HashMap<u64, usize> = HashMap::new();
        for (i, r) in chunk.iter().enumerate().rev() {
            if let Some(j) = seen.insert(r.1, i) {
                next[i] = j as i64;
            }
        }
        let mut og = dd_trace::OracleGeneralWriter::new(Vec::new());
        for (r, n) in chunk.iter().zip(&next) {
            let req = dd_trace::Request {
                time: (r.0 - t0) / 1_000_000,
                id: r.1,
                size: page_size,
                next_access_vtime: *n,
            };
            og.write(&req).expect("writing to memory");
        }
        out.push(og.finish().expect("writing to memory"));
        let mut csv = String::from("id,op,vm\n");
        for r in chunk {
            csv.push_str(&format!("{:#x},{},{}\n", r.1, r.2, r.3));
        }
        out.push(csv.into_bytes());
    }
    out
}

/// One peer connection to a daemon's listener, decoded.
struct PeerConn {
    name: String,
    epoch: u64,
    /// Whether its AUTH was accepted (only such connections reach the request handler).
    authenticated: bool,
    /// After AUTH: each request with what it was answered, and when it arrived.
    requests: Vec<(u64, PeerCall)>,
}

/// A peer request and its answer, as far as peer_handler can use them.
enum PeerCall {
    Compare { hash: u128, pinned: Option<u64> },
    Fetch(u64),
    Unpin(Vec<u64>),
    Summary { m_bits: u64, k_hashes: u32 },
}

/// The page size of a peer recording: a compare's payload is a 16-byte hash and a page.
fn peer_page_size(frames: &[Frame]) -> usize {
    frames
        .iter()
        .find_map(|f| {
            let h = pw::parse_header(&f.raw, u32::MAX).ok()??;
            (h.op == pw::PeerOp::Compare as u8).then(|| f.raw.len() - pw::HEADER_LEN - 16)
        })
        .unwrap_or(4096)
}

fn peer_conn(c: &Capture, report: &mut Report) -> Option<PeerConn> {
    let received = peer_frames(&c.rec, Direction::Received).whole;
    let sent = peer_frames(&c.rec, Direction::Sent).whole;
    let page = peer_page_size(&received);
    let mut answers: HashMap<(u64, u8), Vec<&Frame>> = HashMap::new();
    for f in sent.iter().rev() {
        let h = pw::parse_header(&f.raw, u32::MAX).ok()??;
        answers.entry((h.request_id, h.op)).or_default().push(f);
    }
    let mut conn: Option<PeerConn> = None;
    for f in &received {
        let h = pw::parse_header(&f.raw, u32::MAX).ok()??;
        let payload = &f.raw[pw::HEADER_LEN..];
        let answer = answers.get_mut(&(h.request_id, h.op)).and_then(Vec::pop);
        let ok =
            |a: &&Frame| pw::parse_header(&a.raw, u32::MAX).is_ok_and(|h| h.is_some_and(|h| h.status == 0));
        let resp =
            answer.filter(ok).and_then(|a| PeerResponse::decode(h.op, &a.raw[pw::HEADER_LEN..], page).ok());
        let Ok(req) = PeerRequest::decode(h.op, payload, page) else {
            report.skip("peer frame that does not decode");
            continue;
        };
        let call = match (req, &mut conn) {
            (PeerRequest::Hello { name, epoch, .. }, None) => {
                conn = Some(PeerConn {
                    name: name.to_string(),
                    epoch,
                    authenticated: false,
                    requests: Vec::new(),
                });
                continue;
            }
            (PeerRequest::Auth { .. }, Some(c)) => {
                c.authenticated = resp == Some(PeerResponse::Done);
                continue;
            }
            (_, None) => {
                report.skip("peer request before a HELLO");
                continue;
            }
            (PeerRequest::Hello { .. }, Some(_)) => {
                report.skip("peer_handler: a second HELLO on one connection");
                continue;
            }
            (PeerRequest::Compare { hash, .. }, _) => {
                let pinned = match resp {
                    Some(PeerResponse::Compared(p)) => p,
                    _ => None,
                };
                PeerCall::Compare { hash, pinned }
            }
            (PeerRequest::Fetch { pin }, _) => PeerCall::Fetch(pin),
            (PeerRequest::Unpin { pins }, _) => PeerCall::Unpin(pins),
            (PeerRequest::Summary { m_bits, k_hashes, .. }, _) => PeerCall::Summary { m_bits, k_hashes },
        };
        conn.as_mut().expect("after HELLO").requests.push((f.at, call));
    }
    if conn.as_ref().is_some_and(|c| !c.authenticated) {
        report.skip("peer_handler: a connection whose handshake failed");
        return None;
    }
    conn
}

/// peer_handler inputs of one daemon's listener: its peers in pairs.
fn peer_handler_inputs(conns: &[PeerConn], report: &mut Report) -> Vec<Vec<u8>> {
    // Peers in order of first appearance (connections are in accept order).
    let mut names: Vec<&str> = Vec::new();
    for c in conns {
        if !names.contains(&c.name.as_str()) {
            names.push(&c.name);
        }
    }
    let mut out = Vec::new();
    for pair in names.chunks(2) {
        // Every event of the pair: (time, peer, a reconnect's epoch or a request).
        enum Ev<'a> {
            Connect(u64),
            Call(&'a PeerCall),
        }
        let mut evs: Vec<(u64, Who, Ev)> = Vec::new();
        let mut seen = [false; 2];
        for c in conns {
            let Some(i) = pair.iter().position(|n| *n == c.name) else { continue };
            let who = [Who::A, Who::B][i];
            let t0 = c.requests.first().map_or(0, |r| r.0);
            if seen[i] {
                evs.push((t0.saturating_sub(1), who, Ev::Connect(c.epoch)));
            }
            seen[i] = true;
            evs.extend(c.requests.iter().map(|(t, call)| (*t, who, Ev::Call(call))));
        }
        evs.sort_by_key(|e| e.0);
        // Contents pinned anywhere in the recording map onto held pages, the others onto absent ones.
        let mut pages: HashMap<u128, u8> = HashMap::new();
        let (mut held, mut absent) = (0u8, 0u8);
        for (_, _, ev) in &evs {
            if let Ev::Call(PeerCall::Compare { hash, pinned }) = ev {
                if pinned.is_some() && !pages.contains_key(hash) {
                    pages.insert(*hash, held % HELD);
                    held = held.wrapping_add(1);
                }
            }
        }
        for (_, _, ev) in &evs {
            if let Ev::Call(PeerCall::Compare { hash, .. }) = ev {
                pages.entry(*hash).or_insert_with(|| {
                    absent = absent.wrapping_add(1);
                    HELD + (absent - 1) % (PAGES - HELD)
                });
            }
        }
        // Epochs: each peer starts in epoch 1 (the target's); later ones go round 2, 0, 1.
        let mut epochs: HashMap<(Who, u64), u8> = HashMap::new();
        let mut next_epoch = [1u8; 2];
        for c in conns {
            if let Some(i) = pair.iter().position(|n| *n == c.name) {
                let who = [Who::A, Who::B][i];
                epochs.entry((who, c.epoch)).or_insert_with(|| {
                    let e = next_epoch[i];
                    next_epoch[i] = (e + 1) % 3;
                    e
                });
            }
        }
        let mut granted: Vec<u64> = Vec::new();
        let handle = |granted: &Vec<u64>, pin: u64| match granted.iter().position(|g| *g == pin) {
            Some(i) => Handle::Granted(i as u8),
            None => Handle::Raw(pin),
        };
        let mut steps: Vec<ph::Step> = Vec::new();
        let mut last = evs.first().map_or(0, |e| e.0);
        let flush = |steps: &mut Vec<ph::Step>, out: &mut Vec<Vec<u8>>| {
            if steps.is_empty() {
                return;
            }
            let input = ph::Input { max_pins: 15, steps: std::mem::take(steps) };
            let bytes = ph::write_input(&input);
            let back = <ph::Input as arbitrary::Arbitrary>::arbitrary_take_rest(
                arbitrary::Unstructured::new(&bytes),
            );
            assert_eq!(back.ok().as_ref(), Some(&input), "peer_handler input does not read back");
            out.push(bytes);
        };
        for (t, who, ev) in &evs {
            let gap_ms = t.saturating_sub(last) / 1000;
            last = *t;
            if gap_ms >= 1 {
                if gap_ms >= 1000 {
                    report.skip("peer_handler: a wait past the target's 1 s pin TTL (shortened to 999 ms)");
                }
                steps.push(ph::Step::Wait { ms: gap_ms.min(999) as u16 });
            }
            let req = match ev {
                Ev::Connect(epoch) => {
                    steps.push(ph::Step::Reconnect {
                        from: *who,
                        epoch: epochs[&(*who, *epoch)],
                        stale: false,
                    });
                    continue;
                }
                Ev::Call(PeerCall::Compare { hash, pinned }) => {
                    if let Some(p) = pinned {
                        granted.push(*p);
                    }
                    ph::Req::Compare { page: pages[hash], alter: None, wrong_hash: false }
                }
                Ev::Call(PeerCall::Fetch(pin)) => ph::Req::Fetch(handle(&granted, *pin)),
                Ev::Call(PeerCall::Unpin(pins)) => {
                    let hs = pins.iter().map(|p| handle(&granted, *p)).collect();
                    granted.retain(|g| !pins.contains(g));
                    ph::Req::Unpin(hs)
                }
                Ev::Call(PeerCall::Summary { m_bits, k_hashes }) => {
                    // The target's summaries are at most 255 bytes: the largest whole 64-bit words.
                    if *m_bits > 248 * 8 {
                        report.skip("peer_handler: a summary larger than the target's (shortened)");
                    }
                    let bytes = ((m_bits / 8).min(248) / 8 * 8) as u8;
                    ph::Req::Summary { bytes, k: (*k_hashes).min(255) as u8, skew: 0 }
                }
            };
            steps.push(ph::Step::Request { from: *who, req, flip: None });
            if steps.len() >= TYPED_STEPS {
                flush(&mut steps, &mut out);
            }
        }
        flush(&mut steps, &mut out);
    }
    out
}

/// Turns the captures of one recorded run (`label`: where they came from, in the inputs' names) into
/// inputs of every target.
pub fn convert(label: &str, captures: &[Capture]) -> (Vec<Input>, Report) {
    let mut report = Report::default();
    let mut inputs = Vec::new();
    let mut push = |target: &'static str, kind: &str, bytes: Vec<Vec<u8>>, report: &mut Report| {
        for (i, b) in bytes.into_iter().enumerate() {
            inputs.push(Input { target, name: format!("{label}-{kind}-{i:04}"), bytes: b });
            *report.inputs.entry(target).or_default() += 1;
        }
    };
    let mut daemons: Vec<&str> = captures.iter().map(Capture::daemon).collect();
    daemons.sort();
    daemons.dedup();
    for d in daemons {
        let of = |ch: Channel| -> Vec<&Capture> {
            captures.iter().filter(|c| c.daemon() == d && c.rec.channel == ch).collect()
        };
        let data = of(Channel::Data);
        for (n, c) in data.iter().enumerate() {
            let recv = data_frames(&c.rec, Direction::Received);
            let sent = data_frames(&c.rec, Direction::Sent);
            let kind = format!("{d}-c{n}");
            push("frame_decoder", &format!("{kind}-in"), raw_of(&recv, 0, &[]), &mut report);
            push("frame_decoder", &format!("{kind}-out"), raw_of(&sent, 0, &[]), &mut report);
            // After a HELLO the daemon accepted, the target sends its own instead (selector 1: valid;
            // 0x82: valid, version 2 offered, as the recorded frames' version says) and the recorded
            // one is left out. A connection that never authenticated is sent as it was (selector 0: no
            // HELLO of the target's).
            let accepted = sent
                .whole
                .first()
                .is_some_and(|f| f.raw[3] == dd_proto::Op::Hello as u8 && f.raw[6..8] == [0, 0]);
            let (selector, skip) = match recv.whole.get(1) {
                _ if !accepted => (0, 0),
                Some(f) if f.raw[2] == 1 => (1, 1),
                _ => (0x82, 1),
            };
            push("request_handler", &kind, raw_of(&recv, skip, &[selector]), &mut report);
        }
        let (all, vms) = daemon_exchanges(&data, &mut report);
        if vms.len() > 2 {
            report.skip(format!("data_plane: VMs of one daemon beyond a pair ({} VMs: in pairs)", vms.len()));
        }
        push("data_plane", d, data_plane_inputs(&all, &vms, &mut report), &mut report);
        push("engine_model", d, engine_model_inputs(&all, &vms, &mut report), &mut report);
        let page = all.iter().find_map(|e| match e.call {
            Call::Put(_, _, len) => Some(len as u32),
            _ => None,
        });
        push("trace_reader", d, trace_inputs(&all, page.unwrap_or(4096)), &mut report);

        let peer = of(Channel::Peer);
        for (n, c) in peer.iter().enumerate() {
            let kind = format!("{d}-p{n}");
            let recv = peer_frames(&c.rec, Direction::Received);
            let sent = peer_frames(&c.rec, Direction::Sent);
            push("peer_decoder", &format!("{kind}-in"), raw_of(&recv, 0, &[]), &mut report);
            push("peer_decoder", &format!("{kind}-out"), raw_of(&sent, 0, &[]), &mut report);
        }
        let mut conns: Vec<(u64, PeerConn)> = Vec::new();
        for c in &peer {
            if let Some(pc) = peer_conn(c, &mut report) {
                conns.push((c.rec.accepted_us, pc));
            }
        }
        conns.sort_by_key(|c| c.0);
        let conns: Vec<PeerConn> = conns.into_iter().map(|c| c.1).collect();
        push("peer_handler", d, peer_handler_inputs(&conns, &mut report), &mut report);
    }
    (inputs, report)
}
