//! The model test's harness (`tests/model.rs`), shared with the `engine_model` fuzz target
//! (`fuzz/fuzz_targets/engine_model.rs` includes this file and `tests/common/mod.rs` by path).
//!
//! A map `(vm, pool, key) -> content` of what the cache *may* hold. For an ephemeral pool a get must
//! either miss or return exactly the model's latest content; for a persistent pool it must hit with it,
//! unless the harness injects disk faults (`Harness::with_faults`): then a persistent miss must be a
//! page the engine counted in the pool's `pages_lost`, one for one. After every operation the statistics
//! identity is checked for every pool, VM and the host (`Cache::check_identity`); every 256 operations
//! the same identity as `Cache::host_stats` reports it, the engine's invariants and the persistent
//! pools' counts.
//!
//! The SSD file is a named file in a temporary folder of the harness's own, with the engine's default
//! I/O (direct I/O where the file system allows it), or, for the fuzz target, an unnamed scratch file
//! in a given folder with buffered I/O ([`Harness::fast`]): there a new engine is built for every input,
//! and each direct write and each folder made and removed waited for the disk.
#![allow(dead_code)]

use super::common::*;
use dd_engine::config::{Compression, DirectIo};
use dd_engine::store::ssd::faults::{Fault, FaultInjector, IoOp};
use dd_engine::{
    Cache, EvictionOrder, Key, Mode, PoolId, PoolKind, PoolOptions, PutOutcome, Spec, StoreKind, VmId,
    VmWeights,
};
use rand::{Rng, SeedableRng};
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

pub const VMS: u32 = 3;
pub const POOLS_PER_VM: usize = 3;
pub const OBJECTS: u64 = 6;
pub const INDICES: u64 = 24;

#[derive(Debug, Clone)]
pub enum Op {
    Put {
        vm: u32,
        slot: usize,
        obj: u64,
        idx: u64,
    },
    Get {
        vm: u32,
        slot: usize,
        obj: u64,
        idx: u64,
    },
    GetBatch {
        vm: u32,
        slot: usize,
        obj: u64,
    },
    PutBatch {
        vm: u32,
        slot: usize,
        obj: u64,
        n: u64,
    },
    FlushPage {
        vm: u32,
        slot: usize,
        obj: u64,
        idx: u64,
    },
    FlushObject {
        vm: u32,
        slot: usize,
        obj: u64,
    },
    Migrate {
        vm: u32,
        from: usize,
        to: usize,
        obj: u64,
    },
    SetSpec {
        vm: u32,
        slot: usize,
        spec: u8,
        w: u32,
    },
    Recreate {
        vm: u32,
        slot: usize,
        persistent: bool,
        order: u8,
    },
    SetVmWeights {
        vm: u32,
        mem: u32,
        ssd: u32,
    },
    SetCapacity {
        ssd: bool,
        pages: u64,
    },
    SetMode {
        global: bool,
    },
    SetBatch {
        pages: u64,
    },
    CrossVmProbe {
        vm: u32,
        slot: usize,
        other: u32,
    },
    /// Fault injection (only with `Harness::with_faults`; a no-op otherwise): `after` more operations
    /// of kind `op` (0 read, 1 write, 2 extend) pass, then `times` fail with `kind` (0 EIO, 1 ENOSPC,
    /// 2 short).
    Fault {
        op: u8,
        after: u8,
        kind: u8,
        times: u8,
    },
    /// The disk is healthy again.
    Heal,
}

pub fn spec_of(code: u8, w: u32) -> Spec {
    match code % 5 {
        0 => Spec::Mem { weight: w },
        1 => Spec::Ssd { weight: w },
        2 => Spec::Hybrid { mem_weight: w, ssd_weight: 1 + w / 2 },
        3 => Spec::Mem { weight: 1 + w * 2 },
        _ => Spec::None,
    }
}

/// Any byte picks an order: every order of the wire table (`EvictionOrder::ALL`), a new one included.
pub fn order_of(code: u8) -> EvictionOrder {
    EvictionOrder::ALL[code as usize % EvictionOrder::ALL.len()]
}

pub fn gen_op(rng: &mut impl Rng) -> Op {
    let vm = rng.gen_range(1..=VMS);
    let slot = rng.gen_range(0..POOLS_PER_VM);
    let obj = rng.gen_range(0..OBJECTS);
    let idx = rng.gen_range(0..INDICES);
    match rng.gen_range(0..1000) {
        0..=419 => Op::Put { vm, slot, obj, idx },
        420..=719 => Op::Get { vm, slot, obj, idx },
        720..=749 => Op::GetBatch { vm, slot, obj },
        750..=779 => Op::PutBatch { vm, slot, obj, n: rng.gen_range(1..16) },
        780..=849 => Op::FlushPage { vm, slot, obj, idx },
        850..=874 => Op::FlushObject { vm, slot, obj },
        875..=909 => Op::Migrate { vm, from: slot, to: rng.gen_range(0..POOLS_PER_VM), obj },
        910..=929 => Op::SetSpec { vm, slot, spec: rng.gen(), w: rng.gen_range(1..100) },
        930..=944 => Op::Recreate { vm, slot, persistent: rng.gen_bool(0.3), order: rng.gen() },
        945..=959 => Op::SetVmWeights { vm, mem: rng.gen_range(0..10), ssd: rng.gen_range(0..10) },
        960..=974 => Op::SetCapacity { ssd: rng.gen_bool(0.4), pages: rng.gen_range(8..160) },
        975..=979 => Op::SetMode { global: rng.gen_bool(0.3) },
        980..=989 => Op::SetBatch { pages: rng.gen_range(1..9) },
        _ => Op::CrossVmProbe { vm, slot, other: rng.gen_range(1..=VMS) },
    }
}

/// What a page's bytes are: unique to one write, or one of a few contents shared by many writes (so
/// that de-duplication has something to share).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Content {
    Unique(PoolId, u64),
    Common(u64),
}

impl Content {
    fn bytes(self, key: Key) -> Vec<u8> {
        match self {
            Content::Unique(pool, v) => page(pool, key, v),
            Content::Common(c) => vec![0xc0 | c as u8; PS],
        }
    }
}

struct PoolModel {
    id: PoolId,
    kind: PoolKind,
    /// key -> the content last put there; migrated pages keep their content.
    pages: BTreeMap<Key, Content>,
    /// Misses of pages the model holds in a persistent pool: with faults, each must be a reported loss.
    lost: u64,
}

/// Which engine a harness drives.
#[derive(Debug, Clone, Copy, Default)]
pub struct Setup {
    /// Content de-duplication in the memory store (VMs 1 and 2 in one group), and shared contents.
    pub dedup: bool,
    /// LZ4 compression in the memory store.
    pub compress: bool,
    /// The SSD store over a fault injector that `Op::Fault` arms.
    pub faults: bool,
    /// Shards of every pool (`EngineConfig::pool_shards`); 0 keeps the config's (one).
    pub shards: u32,
}

pub struct Harness {
    /// The folder of the SSD file, when the harness made it.
    _dir: Option<tempfile::TempDir>,
    pub cache: Cache,
    pools: BTreeMap<(u32, usize), PoolModel>,
    version: u64,
    pub ops: u64,
    /// The injector under the SSD store (`with_faults`).
    faults: Option<Arc<FaultInjector>>,
    /// Every third put writes one of four common contents (de-duplication runs).
    common_contents: bool,
}

impl Harness {
    pub fn new(seed: u64) -> Self {
        Self::with(seed, false, false)
    }

    /// A harness whose SSD store runs over a fault injector that `Op::Fault` arms.
    pub fn with_faults(seed: u64) -> Self {
        Self::in_temp_dir(seed, Setup { faults: true, ..Setup::default() })
    }

    pub fn with(seed: u64, dedup: bool, compress: bool) -> Self {
        Self::in_temp_dir(seed, Setup { dedup, compress, ..Setup::default() })
    }

    /// [`Self::new`] with every pool in `shards` shards.
    pub fn sharded(seed: u64, shards: u32) -> Self {
        Self::in_temp_dir(seed, Setup { shards, ..Setup::default() })
    }

    /// [`Self::with_faults`] with every pool in `shards` shards.
    pub fn sharded_with_faults(seed: u64, shards: u32) -> Self {
        Self::in_temp_dir(seed, Setup { faults: true, shards, ..Setup::default() })
    }

    fn in_temp_dir(seed: u64, setup: Setup) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let cfg = small_config(dir.path(), 96, 128, 4);
        let mut h = Self::build(seed, cfg, setup);
        h._dir = Some(dir);
        h
    }

    /// The engine of `setup` with its SSD store in an unnamed scratch file in `dir` and buffered I/O
    /// (the fuzz target: nothing to create or remove per input, no write waits for the disk). The
    /// model and every check are the same.
    pub fn fast(seed: u64, setup: Setup, dir: &Path) -> Self {
        let mut cfg = small_config(dir, 96, 128, 4);
        let ssd = cfg.ssd.as_mut().expect("an SSD store");
        ssd.path = dir.to_path_buf();
        ssd.scratch = true;
        ssd.direct_io = DirectIo::Off;
        Self::build(seed, cfg, setup)
    }

    fn build(seed: u64, mut cfg: dd_engine::EngineConfig, setup: Setup) -> Self {
        cfg.mem.dedup = setup.dedup;
        if setup.shards != 0 {
            cfg.pool_shards = setup.shards;
        }
        if setup.compress {
            cfg.mem.compression = Compression::Lz4;
        }
        let faults = setup.faults.then(FaultInjector::new);
        let cache = Cache::with_ssd_faults(cfg, faults.clone()).unwrap();
        let dedup = setup.dedup;
        let mut pools = BTreeMap::new();
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed ^ 0xabcdef);
        for vm in 1..=VMS {
            cache.add_vm(VmId(vm), VmWeights { mem: vm, ssd: 4 - vm }).unwrap();
            for slot in 0..POOLS_PER_VM {
                let persistent = slot == 2 && vm == 1;
                let spec = spec_of(rng.gen_range(0..4), rng.gen_range(1..50));
                let opts =
                    if persistent { PoolOptions::persistent(spec) } else { PoolOptions::ephemeral(spec) };
                let id = cache.new_pool(VmId(vm), opts).unwrap();
                let kind = opts.kind;
                pools.insert((vm, slot), PoolModel { id, kind, pages: BTreeMap::new(), lost: 0 });
            }
        }
        if dedup {
            // VMs 1 and 2 share a de-duplication group; VM 3 keeps its own domain (the default): its
            // pages must never share frames with the others'.
            cache.set_vm_dedup_group(VmId(1), Some(1)).unwrap();
            cache.set_vm_dedup_group(VmId(2), Some(1)).unwrap();
        }
        Harness { _dir: None, cache, pools, version: 0, ops: 0, faults, common_contents: dedup }
    }

    fn check_get(&mut self, vm: u32, slot: usize, key: Key, got: Option<&[u8]>) {
        let m = self.pools.get_mut(&(vm, slot)).unwrap();
        let expected = m.pages.get(&key).copied();
        match (got, expected) {
            (Some(bytes), Some(content)) => {
                assert_eq!(
                    bytes,
                    content.bytes(key).as_slice(),
                    "stale or foreign data for {key:?} in pool {:?}",
                    m.id
                );
                if m.kind == PoolKind::Ephemeral {
                    m.pages.remove(&key); // exclusive get
                }
            }
            (Some(bytes), None) => {
                panic!(
                    "get returned data the model says is flushed: {key:?} pool {:?} ({:?})",
                    m.id,
                    &bytes[..28]
                )
            }
            (None, Some(content)) => {
                if m.kind == PoolKind::Persistent {
                    assert!(
                        self.faults.is_some(),
                        "persistent page {key:?} {content:?} lost from pool {:?}",
                        m.id
                    );
                    m.lost += 1;
                }
                m.pages.remove(&key);
            }
            (None, None) => {}
        }
    }

    fn put(&mut self, vm: u32, slot: usize, key: Key) {
        self.version += 1;
        let v = self.version;
        let m = self.pools.get_mut(&(vm, slot)).unwrap();
        let content = if self.common_contents && v.is_multiple_of(3) {
            Content::Common(v % 4)
        } else {
            Content::Unique(m.id, v)
        };
        let out = self.cache.put(VmId(vm), m.id, key, &content.bytes(key)).unwrap();
        match out {
            PutOutcome::Stored(_) => {
                m.pages.insert(key, content);
            }
            PutOutcome::Refused => {
                m.pages.remove(&key);
            }
        }
    }

    pub fn apply(&mut self, op: &Op) {
        self.ops += 1;
        match *op {
            Op::Put { vm, slot, obj, idx } => self.put(vm, slot, Key::new(obj, idx)),
            Op::PutBatch { vm, slot, obj, n } => {
                let id = self.pools[&(vm, slot)].id;
                let keys: Vec<Key> = (0..n).map(|i| Key::new(obj, i * 3 % INDICES)).collect();
                let mut keys_dedup = keys.clone();
                keys_dedup.dedup();
                let pages: Vec<(Key, Vec<u8>, u64)> = keys_dedup
                    .iter()
                    .map(|k| {
                        self.version += 1;
                        (*k, page(id, *k, self.version), self.version)
                    })
                    .collect();
                let batch: Vec<(Key, &[u8])> = pages.iter().map(|(k, d, _)| (*k, d.as_slice())).collect();
                let out = self.cache.put_batch(VmId(vm), id, &batch).unwrap();
                let m = self.pools.get_mut(&(vm, slot)).unwrap();
                for ((k, _, v), o) in pages.iter().zip(out) {
                    if o.is_stored() {
                        m.pages.insert(*k, Content::Unique(id, *v));
                    } else {
                        m.pages.remove(k);
                    }
                }
            }
            Op::Get { vm, slot, obj, idx } => {
                let key = Key::new(obj, idx);
                let id = self.pools[&(vm, slot)].id;
                let mut out = vec![0u8; PS];
                let hit = self.cache.get(VmId(vm), id, key, &mut out).unwrap();
                self.check_get(vm, slot, key, hit.then_some(out.as_slice()));
            }
            Op::GetBatch { vm, slot, obj } => {
                let id = self.pools[&(vm, slot)].id;
                let keys: Vec<Key> = (0..INDICES).step_by(2).map(|i| Key::new(obj, i)).collect();
                let mut got: Vec<Option<Vec<u8>>> = vec![None; keys.len()];
                if obj % 2 == 1 {
                    // The daemon's path: hits handed over in place, each once (shard by shard).
                    let h = self.cache.pool_handle(VmId(vm), id).unwrap();
                    let n = h
                        .get_batch_each(&keys, &mut |i, page| {
                            assert!(got[i].is_none(), "hit {i} handed over twice");
                            got[i] = Some(page.to_vec());
                        })
                        .unwrap();
                    assert_eq!(n, got.iter().filter(|g| g.is_some()).count());
                } else {
                    let mut buf = vec![0u8; keys.len() * PS];
                    let hits = self.cache.get_batch(VmId(vm), id, &keys, &mut buf).unwrap();
                    for (i, page) in buf.chunks_exact(PS).enumerate() {
                        got[i] = hits[i].then(|| page.to_vec());
                    }
                }
                for (k, g) in keys.iter().zip(&got) {
                    self.check_get(vm, slot, *k, g.as_deref());
                }
            }
            Op::FlushPage { vm, slot, obj, idx } => {
                let m = self.pools.get_mut(&(vm, slot)).unwrap();
                let key = Key::new(obj, idx);
                let was = self.cache.flush_page(VmId(vm), m.id, key).unwrap();
                let modeled = m.pages.remove(&key).is_some();
                if m.kind == PoolKind::Persistent {
                    assert_eq!(was, modeled, "persistent flush disagrees with the model");
                } else {
                    assert!(!was || modeled, "flushed a page the model does not have");
                }
            }
            Op::FlushObject { vm, slot, obj } => {
                let m = self.pools.get_mut(&(vm, slot)).unwrap();
                let n = self.cache.flush_object(VmId(vm), m.id, obj).unwrap();
                let before = m.pages.len();
                m.pages.retain(|k, _| k.object != obj);
                let modeled = (before - m.pages.len()) as u64;
                assert!(n <= modeled);
                if m.kind == PoolKind::Persistent {
                    assert_eq!(n, modeled);
                }
            }
            Op::Migrate { vm, from, to, obj } => {
                let (a, b) = (self.pools[&(vm, from)].id, self.pools[&(vm, to)].id);
                let (ka, kb) = (self.pools[&(vm, from)].kind, self.pools[&(vm, to)].kind);
                let r = self.cache.migrate_object(VmId(vm), a, b, obj);
                if from == to {
                    assert_eq!(r, Ok(0));
                    return;
                }
                if ka != kb {
                    assert!(r.is_err());
                    return;
                }
                let moved = r.unwrap();
                let src = self.pools.get_mut(&(vm, from)).unwrap();
                let pages: Vec<(Key, Content)> =
                    src.pages.iter().filter(|(k, _)| k.object == obj).map(|(k, v)| (*k, *v)).collect();
                src.pages.retain(|k, _| k.object != obj);
                assert!(moved <= pages.len() as u64);
                if ka == PoolKind::Persistent {
                    assert_eq!(moved, pages.len() as u64, "persistent pages lost in migration");
                }
                let dst = self.pools.get_mut(&(vm, to)).unwrap();
                // The target's pages of the object are flushed, then the source's arrive (pages the cache
                // had already evicted from the source simply do not).
                dst.pages.retain(|k, _| k.object != obj);
                for (k, v) in pages {
                    dst.pages.insert(k, v);
                }
                let _ = (a, b);
            }
            Op::SetSpec { vm, slot, spec, w } => {
                let m = &self.pools[&(vm, slot)];
                self.cache.set_spec(VmId(vm), m.id, spec_of(spec, w)).unwrap();
            }
            Op::Recreate { vm, slot, persistent, order } => {
                let m = self.pools.remove(&(vm, slot)).unwrap();
                self.cache.destroy_pool(VmId(vm), m.id).unwrap();
                let spec = spec_of(order, 10 + order as u32 % 40);
                let opts =
                    if persistent { PoolOptions::persistent(spec) } else { PoolOptions::ephemeral(spec) };
                let id = self.cache.new_pool(VmId(vm), opts.with_order(order_of(order))).unwrap();
                self.pools
                    .insert((vm, slot), PoolModel { id, kind: opts.kind, pages: BTreeMap::new(), lost: 0 });
            }
            Op::SetVmWeights { vm, mem, ssd } => {
                self.cache.set_vm_weights(VmId(vm), VmWeights { mem, ssd }).unwrap()
            }
            Op::SetCapacity { ssd, pages } => {
                let store = if ssd { StoreKind::Ssd } else { StoreKind::Mem };
                let r = self.cache.set_capacity(store, pages * PS as u64);
                // Growing the SSD file may fail under injected faults; nothing else may.
                if self.faults.is_none() || !ssd {
                    r.unwrap();
                }
            }
            Op::SetMode { global } => {
                self.cache.set_mode(if global { Mode::Global } else { Mode::Partitioned })
            }
            Op::SetBatch { pages } => self.cache.set_eviction_batch(pages * PS as u64).unwrap(),
            Op::CrossVmProbe { vm, slot, other } => {
                if other == vm {
                    return;
                }
                let id = self.pools[&(vm, slot)].id;
                // Pool ids are numbered per VM: the same number may name one of `other`'s own pools.
                if self.pools.iter().any(|((v, _), m)| *v == other && m.id == id) {
                    return;
                }
                let mut out = vec![0u8; PS];
                assert!(self.cache.get(VmId(other), id, Key::new(0, 0), &mut out).is_err());
                assert!(self.cache.flush_object(VmId(other), id, 0).is_err());
                assert!(self.cache.pool_stats(VmId(other), id).is_err());
            }
            Op::Fault { op, after, kind, times } => {
                if let Some(f) = &self.faults {
                    let op = [IoOp::Read, IoOp::Write, IoOp::Extend][op as usize % 3];
                    let kind = [Fault::Eio, Fault::Enospc, Fault::Short][kind as usize % 3];
                    f.fail_after(op, after as u64, kind, times as u64);
                }
            }
            Op::Heal => {
                if let Some(f) = &self.faults {
                    f.heal();
                }
            }
        }
        if let Err(e) = self.cache.check_identity() {
            panic!("after {op:?}: {e}");
        }
        if self.ops.is_multiple_of(256) {
            assert_identity_stats(&self.cache);
            self.cache.check_invariants().unwrap();
            self.check_persistent_counts();
        }
    }

    /// Persistent pools hold exactly the model's pages, and every persistent page they lost to a disk
    /// fault was reported as lost.
    pub fn check_persistent_counts(&self) {
        for ((vm_id, _), m) in self.pools.iter().filter(|(_, m)| m.kind == PoolKind::Persistent) {
            let vm = self
                .cache
                .host_stats()
                .vms
                .iter()
                .flat_map(|v| v.pools.clone())
                .find(|p| p.pool == m.id && p.vm == VmId(*vm_id))
                .unwrap();
            assert_eq!(vm.counters.used_total() as usize, m.pages.len(), "persistent pool {:?}", m.id);
            assert_eq!(vm.counters.pages_lost, m.lost, "persistent pool {:?}: unreported loss", m.id);
        }
    }
}

/// The identity of every pool, VM and the host as `host_stats` reports it (every 256 operations: it
/// computes effective entitlements and allocates, which `check_identity` after each operation does not).
pub fn assert_identity_stats(cache: &Cache) {
    let host = cache.host_stats();
    assert!(host.totals.identity_holds(), "host identity: {:?}", host.totals);
    for vm in &host.vms {
        assert!(vm.totals.identity_holds(), "vm identity: {:?}", vm.totals);
        for p in &vm.pools {
            assert!(p.counters.identity_holds(), "pool identity {:?}: {:?}", p.pool, p.counters);
        }
    }
}
