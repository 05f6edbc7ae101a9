//! Fuzz target: structure-aware data-plane sessions of two VMs against a real (memory-only) engine,
//! checked after every request against a shadow model of the pages (issue 17, item 1).
//!
//! The input is a sequence of typed requests (`dd_fuzz::data_plane`, `arbitrary`-derived: pool
//! lifecycle, puts and gets single and batched, flushes, migrations, spec changes, statistics, a HELLO
//! in an authenticated session), each for VM 1 or VM 2, encoded with dd-proto's encoder and fed through `dd_server::net::drive`, the
//! connection code the `request_handler` target drives. A few steps flip one byte of the encoded frame
//! first (a raw mutation): the frame may then be another request, a malformed one, or lose the frame
//! boundary and close the connection (the VM then reconnects with a fresh HELLO).
//!
//! The model is driven by what was actually sent and answered, not by the typed request: the target
//! splits the bytes it sent into frames as the server does, decodes each, and pairs it with the next
//! response frame. So a mutated frame is modelled as whatever it decodes to. Per VM the model holds the
//! live pools (kind, whether gets are exclusive) and, per key, the bytes of its latest stored put.
//! After every request:
//! * every response is a whole frame within the frame limit (`net::check_responses`), answers its
//!   request (same id and op) and decodes;
//! * a failed request has no effect (the handler's invariant); a request naming a pool the VM does not
//!   have fails (another VM's pool is indistinguishable from a missing one), and LIST_POOLS is exactly
//!   the model's pools;
//! * a hit returns exactly the latest stored put of its key; an exclusive hit (ephemeral pools unless
//!   created inclusive; persistent pools never are, SPEC section 2) removes the page; a persistent page
//!   is never missed (no SSD store here, so nothing can lose it); a miss of an ephemeral page is allowed
//!   (eviction) and removes it from the model;
//! * VM 1's requests leave VM 2's pools and counters untouched except for evictions (Algorithm 1 may
//!   take VM 2's pages for VM 1's puts; nothing else may change);
//! * the engine's invariants hold (`Cache::check_invariants`).
//!
//! The state is fresh per input, so that a crash reproduces from its input alone. Pages are 512 bytes,
//! the memory store holds 64 of them and batches 4, and the frame limit (4 KiB) is small enough for
//! VM_STATS to reach its truncation path with a handful of pools.
#![no_main]

use dd_engine::{EvictionOrder, Key, PoolId, PoolKind, PoolOptions, PutOutcome, VmId};
use dd_fuzz::data_plane::{read_steps, PoolRef, Req, Step, MAX_BATCH};
use dd_proto::frame::split_frame;
use dd_proto::{KeyList, Request, Response, HEADER_LEN};
use dd_server::handler::{Flow, Session};
use dd_server::{ServerConfig, ServerState};
use libfuzzer_sys::fuzz_target;
use std::collections::BTreeMap;
use std::sync::OnceLock;

const PS: usize = 512;
const TOKENS: [&str; 2] = ["fuzz-data-token-0001", "fuzz-data-token-0002"];

/// A fresh daemon state. The configuration is parsed once: parsing it (with the embedded default)
/// cost most of an input's time and added the TOML parser's edges to every run's coverage.
fn new_state() -> ServerState {
    static CFG: OnceLock<ServerConfig> = OnceLock::new();
    let cfg = CFG.get_or_init(config);
    ServerState::new(cfg, "fuzz-host-token-0001").expect("fuzz state")
}

/// No registrations file: nothing is written outside the engine.
fn config() -> ServerConfig {
    ServerConfig::from_toml(&format!(
        "ssd_enabled = false\n[auth]\nhost_admin_token = \"fuzz-host-token-0001\"\nregistrations_file = \"\"\n\
         [limits]\nmax_payload_bytes = 4096\n\
         [engine]\nmaintenance = \"inline\"\npage_size_bytes = {PS}\nmax_batch_pages = {MAX_BATCH}\n\
         eviction_batch_bytes = 2048\nmax_pools_per_vm = 8\n[engine.mem]\ncapacity_bytes = {}\n\
         [[vms]]\nid = 1\ndata_token = \"{}\"\nadmin_token = \"fuzz-admin-token-001\"\n\
         [[vms]]\nid = 2\ndata_token = \"{}\"\nadmin_token = \"fuzz-admin-token-002\"\n",
        64 * PS,
        TOKENS[0],
        TOKENS[1]
    ))
    .expect("fuzz configuration")
}

#[derive(Debug)]
struct PoolModel {
    kind: PoolKind,
    /// Whether a hit removes the page.
    exclusive: bool,
    pages: BTreeMap<Key, Vec<u8>>,
}

struct Vm {
    id: u32,
    sess: Session,
    pools: BTreeMap<PoolId, PoolModel>,
}

struct World {
    st: ServerState,
    vms: [Vm; 2],
    next_request: u64,
    version: u64,
}

/// What VM 2 must keep across VM 1's request: its pools and their counters, eviction aside.
fn vm_view(st: &ServerState, vm: u32) -> Vec<(PoolId, String, u64)> {
    let cache = &st.cache;
    let mut v = Vec::new();
    for p in cache.pools(VmId(vm)).unwrap() {
        let mut s = cache.pool_stats(VmId(vm), p).unwrap();
        let used = s.counters.used_total();
        let evicted = s.counters.mem.evictions + s.counters.ssd.evictions;
        for c in [&mut s.counters.mem, &mut s.counters.ssd] {
            // Eviction (and the entitlements, which other VMs' usage lends out) may change.
            c.evictions = 0;
            c.used = 0;
            c.entitlement = 0;
            c.effective_entitlement = 0;
        }
        // Pages held plus pages evicted is what VM 1 cannot change.
        v.push((p, format!("{s:?}"), used + evicted));
    }
    v
}

impl World {
    fn new() -> World {
        let mk = |id| Vm { id, sess: Session::new(), pools: BTreeMap::new() };
        World { st: new_state(), vms: [mk(1), mk(2)], next_request: 1, version: 0 }
    }

    fn pool_id(&self, vm: usize, r: PoolRef) -> PoolId {
        let pools = &self.vms[vm].pools;
        if r.0 >= 240 || pools.is_empty() {
            return PoolId((r.0 % 16) as u32);
        }
        *pools.keys().nth(r.0 as usize % pools.len()).unwrap()
    }

    /// A page whose bytes say who wrote it and when: any stale or foreign page is detected.
    fn page(&mut self, vm: usize, pool: PoolId, key: Key) -> Vec<u8> {
        self.version += 1;
        let mut p = vec![(self.version as u8) ^ 0x5a; PS];
        p[0..4].copy_from_slice(&(vm as u32).to_le_bytes());
        p[4..8].copy_from_slice(&pool.0.to_le_bytes());
        p[8..16].copy_from_slice(&key.object.to_le_bytes());
        p[16..24].copy_from_slice(&key.index.to_le_bytes());
        p[24..32].copy_from_slice(&self.version.to_le_bytes());
        p
    }

    fn encode(&mut self, vm: usize, req: &Req) -> Vec<u8> {
        let id = self.next_request;
        self.next_request += 1;
        let mut out = Vec::new();
        let v = 1;
        match req {
            Req::CreatePool { persistent, order, exclusive, spec } => {
                let kind = if *persistent { PoolKind::Persistent } else { PoolKind::Ephemeral };
                let order = EvictionOrder::ALL[*order as usize % EvictionOrder::ALL.len()];
                let opts =
                    PoolOptions { kind, spec: spec.spec(), order, exclusive_gets: *exclusive, shards: 0 };
                Request::CreatePool(opts).encode(v, id, &mut out)
            }
            Req::DestroyPool(p) => {
                Request::DestroyPool { pool: self.pool_id(vm, *p) }.encode(v, id, &mut out)
            }
            Req::SetSpec(p, s) => {
                Request::SetSpec { pool: self.pool_id(vm, *p), spec: s.spec() }.encode(v, id, &mut out)
            }
            Req::Put(p, k) => {
                let (pool, key) = (self.pool_id(vm, *p), k.key());
                let data = self.page(vm, pool, key);
                Request::Put { pool, key, data: &data }.encode(v, id, &mut out)
            }
            Req::PutShort(p, k, len) => {
                let (pool, key) = (self.pool_id(vm, *p), k.key());
                let mut data = self.page(vm, pool, key);
                data.resize(*len as usize % (2 * PS), 1);
                Request::Put { pool, key, data: &data }.encode(v, id, &mut out)
            }
            Req::Get(p, k) => {
                Request::Get { pool: self.pool_id(vm, *p), key: k.key() }.encode(v, id, &mut out)
            }
            Req::FlushPage(p, k) => {
                Request::FlushPage { pool: self.pool_id(vm, *p), key: k.key() }.encode(v, id, &mut out)
            }
            Req::FlushObject(p, o) => {
                Request::FlushObject { pool: self.pool_id(vm, *p), object: *o as u64 % 4 }
                    .encode(v, id, &mut out)
            }
            Req::Migrate { from, to, object } => Request::MigrateObject {
                from: self.pool_id(vm, *from),
                to: self.pool_id(vm, *to),
                object: *object as u64 % 4,
            }
            .encode(v, id, &mut out),
            Req::PutBatch(p, n, ks) => {
                let pool = self.pool_id(vm, *p);
                let keys: Vec<Key> = ks.iter().take(*n as usize % (MAX_BATCH + 2)).map(|k| k.key()).collect();
                let pages: Vec<u8> = keys.iter().flat_map(|k| self.page(vm, pool, *k)).collect();
                Request::PutBatch { pool, keys: KeyList::Keys(&keys), pages: &pages }.encode(v, id, &mut out)
            }
            Req::GetBatch(p, n, ks) => {
                let keys: Vec<Key> = ks.iter().take(*n as usize % (MAX_BATCH + 2)).map(|k| k.key()).collect();
                Request::GetBatch { pool: self.pool_id(vm, *p), keys: KeyList::Keys(&keys) }
                    .encode(v, id, &mut out)
            }
            Req::PoolStats(p) => Request::PoolStats { pool: self.pool_id(vm, *p) }.encode(v, id, &mut out),
            Req::VmStats => Request::VmStats.encode(v, id, &mut out),
            Req::ListPools => Request::ListPools.encode(v, id, &mut out),
            Req::Ping => Request::Ping.encode(v, id, &mut out),
            Req::Hello => Request::Hello { min_version: 1, max_version: 1, vm: vm as u32 + 1, token: b"x" }
                .encode(v, id, &mut out),
        }
        out
    }

    /// Opens (or reopens) VM `vm`'s connection: a fresh session and a valid HELLO (version 1).
    fn connect(&mut self, vm: usize) {
        let mut hello = Vec::new();
        let token = TOKENS[vm].as_bytes();
        Request::Hello { min_version: 1, max_version: 1, vm: vm as u32 + 1, token }.encode(1, 0, &mut hello);
        let v = &mut self.vms[vm];
        v.sess = Session::new();
        let (out, flow) = dd_server::net::drive(&self.st, &mut v.sess, &hello);
        assert_eq!(flow, Flow::Continue);
        dd_server::net::check_responses(&self.st, &out, true).unwrap();
        let (h, n) = split_frame(&out, u32::MAX).unwrap().expect("a HELLO answer");
        assert_eq!(n, out.len());
        let r = Response::decode(&h, &out[HEADER_LEN..]).unwrap();
        assert!(matches!(r, Response::Hello { version: 1, .. }), "{r:?}");
    }

    fn step(&mut self, s: &Step) {
        let vm = s.vm2 as usize;
        if self.vms[vm].sess.registration().is_none() {
            self.connect(vm);
        }
        let mut bytes = self.encode(vm, &s.req);
        if s.mutate % 16 == 15 {
            let at = s.at as usize % bytes.len();
            bytes[at] ^= s.xor.max(1);
        }
        let before = (vm == 0).then(|| vm_view(&self.st, 2));
        let v = &mut self.vms[vm];
        let (out, flow) = dd_server::net::drive(&self.st, &mut v.sess, &bytes);
        dd_server::net::check_responses(&self.st, &out, true).unwrap();
        self.model(vm, &bytes, &out);
        if flow == Flow::Close {
            self.vms[vm].sess = Session::new();
        }
        if let Some(before) = before {
            let after = vm_view(&self.st, 2);
            assert_eq!(before, after, "VM 1's request changed VM 2's view");
        }
        self.st.cache.check_invariants().unwrap();
    }

    /// Pairs every complete frame of `sent` with its response in `out` and checks and updates the model.
    fn model(&mut self, vm: usize, sent: &[u8], out: &[u8]) {
        let max_payload = self.st.max_payload;
        let (mut at, mut rat) = (0, 0);
        while let Ok(Some((h, n))) = split_frame(&sent[at..], max_payload) {
            let payload = &sent[at + HEADER_LEN..at + n];
            at += n;
            let (rh, rn) = split_frame(&out[rat..], u32::MAX)
                .unwrap()
                .unwrap_or_else(|| panic!("no response to request {} (op {})", h.request_id, h.op));
            let resp = Response::decode(&rh, &out[rat + HEADER_LEN..rat + rn]).expect("the response decodes");
            rat += rn;
            assert_eq!((rh.request_id, rh.op), (h.request_id, h.op), "a response to another request");
            // A frame the handler refuses before decoding (header fields) is modelled as not decoding.
            let well_formed = h.flags == 0 && h.status == 0 && h.version == 1;
            match Request::decode(h.op, payload, MAX_BATCH as u32) {
                Ok(req) if well_formed => self.apply(vm, &req, resp),
                _ => assert!(matches!(resp, Response::Error { .. }), "a bad frame was answered {resp:?}"),
            }
        }
        // A frame that lost its boundary is answered with one error and closes the connection.
        assert!(rat == out.len() || at < sent.len(), "{} response bytes left over", out.len() - rat);
    }

    fn known(&self, vm: usize, pool: PoolId) -> bool {
        self.vms[vm].pools.contains_key(&pool)
    }

    fn apply(&mut self, vm: usize, req: &Request<'_>, resp: Response) {
        let pools_named: Vec<PoolId> = match req {
            Request::DestroyPool { pool }
            | Request::SetSpec { pool, .. }
            | Request::Put { pool, .. }
            | Request::Get { pool, .. }
            | Request::FlushPage { pool, .. }
            | Request::FlushObject { pool, .. }
            | Request::PutBatch { pool, .. }
            | Request::GetBatch { pool, .. }
            | Request::SetLabel { pool, .. }
            | Request::PoolStats { pool } => vec![*pool],
            Request::MigrateObject { from, to, .. } => vec![*from, *to],
            _ => vec![],
        };
        if matches!(resp, Response::Error { .. }) {
            // A failed request has no effect (the handler's invariant), so the model keeps its state:
            // were the failure partial, a later get would show it.
            return;
        }
        for p in &pools_named {
            assert!(
                self.known(vm, *p),
                "VM {} reached pool {p:?} it does not have: {req:?} -> {resp:?}",
                vm + 1
            );
        }
        let m = &mut self.vms[vm].pools;
        match (req, resp) {
            (Request::Ping, Response::Pong) => {}
            (Request::CreatePool(o), Response::PoolCreated(id)) => {
                let exclusive = o.kind == PoolKind::Ephemeral && o.exclusive_gets;
                let fresh = PoolModel { kind: o.kind, exclusive, pages: BTreeMap::new() };
                assert!(m.insert(id, fresh).is_none(), "pool id {id:?} handed out twice");
            }
            (Request::DestroyPool { pool }, Response::Done) => {
                m.remove(pool);
            }
            (Request::SetSpec { .. } | Request::SetLabel { .. }, Response::Done) => {}
            (Request::Put { pool, key, data }, Response::Put(o)) => {
                put(m.get_mut(pool).unwrap(), *key, data, o)
            }
            (Request::Get { pool, key }, Response::Get(got)) => {
                get(m.get_mut(pool).unwrap(), *key, got.as_deref())
            }
            (Request::FlushPage { pool, key }, Response::Flushed(was)) => {
                let p = m.get_mut(pool).unwrap();
                let modeled = p.pages.remove(key).is_some();
                assert!(!was || modeled, "flushed {key:?}, a page the model does not have");
                if p.kind == PoolKind::Persistent {
                    assert_eq!(was, modeled, "persistent flush of {key:?} disagrees with the model");
                }
            }
            (Request::FlushObject { pool, object }, Response::Count(n)) => {
                let p = m.get_mut(pool).unwrap();
                let before = p.pages.len();
                p.pages.retain(|k, _| k.object != *object);
                let modeled = (before - p.pages.len()) as u64;
                assert!(n <= modeled, "flushed {n} pages of object {object}, the model has {modeled}");
                if p.kind == PoolKind::Persistent {
                    assert_eq!(n, modeled);
                }
            }
            (Request::MigrateObject { from, to, object }, Response::Count(n)) => {
                if from == to {
                    assert_eq!(n, 0);
                    return;
                }
                let src = m.get_mut(from).unwrap();
                let kind = src.kind;
                let moving: Vec<(Key, Vec<u8>)> = src
                    .pages
                    .iter()
                    .filter(|(k, _)| k.object == *object)
                    .map(|(k, d)| (*k, d.clone()))
                    .collect();
                src.pages.retain(|k, _| k.object != *object);
                assert!(n <= moving.len() as u64, "migrated {n} pages, the model has {}", moving.len());
                if kind == PoolKind::Persistent {
                    assert_eq!(n, moving.len() as u64, "persistent pages lost in migration");
                }
                let dst = m.get_mut(to).unwrap();
                assert_eq!(dst.kind, kind, "migrated between pools of different kinds");
                // The target's pages of the object are flushed, then the source's arrive (those the engine
                // had already evicted do not: a later get of them misses, which the model allows).
                dst.pages.retain(|k, _| k.object != *object);
                dst.pages.extend(moving);
            }
            (Request::PutBatch { pool, keys, pages }, Response::PutBatch(outs)) => {
                assert_eq!(outs.len(), keys.len());
                let p = m.get_mut(pool).unwrap();
                for (i, (k, o)) in keys.iter().zip(outs).enumerate() {
                    put(p, k, &pages[i * PS..(i + 1) * PS], o);
                }
            }
            (Request::GetBatch { pool, keys }, Response::GetBatch { hits, pages }) => {
                assert_eq!(hits.len(), keys.len());
                assert_eq!(pages.len(), hits.iter().filter(|h| **h).count() * PS, "pages of a batch's hits");
                let p = m.get_mut(pool).unwrap();
                let mut at = 0;
                for (k, hit) in keys.iter().zip(hits) {
                    let got = hit.then(|| {
                        at += PS;
                        &pages[at - PS..at]
                    });
                    get(p, k, got);
                }
            }
            (Request::PoolStats { .. } | Request::VmStats, Response::Json(j)) => {
                assert!(j.len() <= self.st.max_payload as usize);
            }
            (Request::ListPools, Response::Pools(mut ids)) => {
                ids.sort();
                let modeled: Vec<PoolId> = m.keys().copied().collect();
                assert_eq!(ids, modeled, "LIST_POOLS of VM {}", vm + 1);
            }
            (req, resp) => panic!("{req:?} answered with {resp:?}"),
        }
    }

    /// End of input: persistent pools hold exactly the model's pages, no pool holds more.
    fn finish(&self) {
        for v in &self.vms {
            for (id, p) in &v.pools {
                let s = self.st.cache.pool_stats(VmId(v.id), *id).unwrap();
                let used = s.counters.used_total() as usize;
                assert!(used <= p.pages.len(), "pool {id:?} holds {used} pages, the model {}", p.pages.len());
                if p.kind == PoolKind::Persistent {
                    assert_eq!(used, p.pages.len(), "persistent pool {id:?}");
                }
            }
        }
    }
}

fn put(p: &mut PoolModel, key: Key, data: &[u8], o: PutOutcome) {
    match o {
        PutOutcome::Stored(_) => {
            p.pages.insert(key, data.to_vec());
        }
        // A refused put also removes the older copy of its key.
        PutOutcome::Refused => {
            p.pages.remove(&key);
        }
    }
}

fn get(p: &mut PoolModel, key: Key, got: Option<&[u8]>) {
    match (got, p.pages.get(&key)) {
        (Some(bytes), Some(want)) => {
            assert!(bytes == want.as_slice(), "stale or foreign bytes for {key:?}: {:?}", &bytes[..32]);
            if p.exclusive {
                p.pages.remove(&key);
            }
        }
        (Some(bytes), None) => panic!("a hit on {key:?}, which the model does not hold: {:?}", &bytes[..32]),
        (None, Some(_)) => {
            assert!(p.kind == PoolKind::Ephemeral, "persistent page {key:?} missed");
            p.pages.remove(&key);
        }
        (None, None) => {}
    }
}

fuzz_target!(|data: &[u8]| {
    let mut w = World::new();
    for s in read_steps(data) {
        w.step(&s);
    }
    w.finish();
});
