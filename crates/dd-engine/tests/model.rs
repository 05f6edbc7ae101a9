//! Model-based test: random operation sequences against a simple reference model (acceptance 2 of the
//! engine issue).
//!
//! The model is a map `(vm, pool, key) -> version` of what the cache *may* hold. The cache is allowed
//! to forget ephemeral pages (eviction), so for an ephemeral pool a get must either miss or return
//! exactly the model's latest version; for a persistent pool the get must hit with it (persistent pages
//! are never lost). Every page's bytes encode `(pool, key, version)`, so stale, flushed or foreign data is
//! detected byte for byte. After every operation the statistics identity is checked for every pool, VM
//! and the host; every 256 operations the engine's full invariant check runs.
//!
//! Two drivers share the op generator: a proptest (shrinking sequences) and a long seeded run of more
//! than 100 000 operations across several VMs, pools, stores, modes and reconfigurations.

mod common;

use common::*;
use dd_engine::{
    Cache, EvictionOrder, Key, Mode, PoolId, PoolKind, PoolOptions, PutOutcome, Spec, StoreKind, VmId,
    VmWeights,
};
use proptest::prelude::*;
use rand::{Rng, SeedableRng};
use std::collections::BTreeMap;

const VMS: u32 = 3;
const POOLS_PER_VM: usize = 3;
const OBJECTS: u64 = 6;
const INDICES: u64 = 24;

#[derive(Debug, Clone)]
enum Op {
    Put { vm: u32, slot: usize, obj: u64, idx: u64 },
    Get { vm: u32, slot: usize, obj: u64, idx: u64 },
    GetBatch { vm: u32, slot: usize, obj: u64 },
    PutBatch { vm: u32, slot: usize, obj: u64, n: u64 },
    FlushPage { vm: u32, slot: usize, obj: u64, idx: u64 },
    FlushObject { vm: u32, slot: usize, obj: u64 },
    Migrate { vm: u32, from: usize, to: usize, obj: u64 },
    SetSpec { vm: u32, slot: usize, spec: u8, w: u32 },
    Recreate { vm: u32, slot: usize, persistent: bool, order: u8 },
    SetVmWeights { vm: u32, mem: u32, ssd: u32 },
    SetCapacity { ssd: bool, pages: u64 },
    SetMode { global: bool },
    SetBatch { pages: u64 },
    CrossVmProbe { vm: u32, slot: usize, other: u32 },
}

fn spec_of(code: u8, w: u32) -> Spec {
    match code % 5 {
        0 => Spec::Mem { weight: w },
        1 => Spec::Ssd { weight: w },
        2 => Spec::Hybrid { mem_weight: w, ssd_weight: 1 + w / 2 },
        3 => Spec::Mem { weight: 1 + w * 2 },
        _ => Spec::None,
    }
}

fn order_of(code: u8) -> EvictionOrder {
    [EvictionOrder::Fifo, EvictionOrder::Lru, EvictionOrder::Clock, EvictionOrder::S3Fifo][code as usize % 4]
}

fn gen_op(rng: &mut impl Rng) -> Op {
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
}

struct Harness {
    _dir: tempfile::TempDir,
    cache: Cache,
    pools: BTreeMap<(u32, usize), PoolModel>,
    version: u64,
    ops: u64,
    /// Every third put writes one of four common contents (de-duplication runs).
    common_contents: bool,
}

impl Harness {
    fn new(seed: u64) -> Self {
        Self::with(seed, false, false)
    }

    fn with(seed: u64, dedup: bool, compress: bool) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let cache = if compress {
            small_compressed_cache(dir.path(), 96, 128, 4, dedup)
        } else if dedup {
            small_dedup_cache(dir.path(), 96, 128, 4)
        } else {
            small_cache(dir.path(), 96, 128, 4)
        };
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
                pools.insert((vm, slot), PoolModel { id, kind, pages: BTreeMap::new() });
            }
        }
        if dedup {
            // VMs 1 and 2 share a de-duplication group; VM 3 keeps its own domain (the default): its
            // pages must never share frames with the others'.
            cache.set_vm_dedup_group(VmId(1), Some(1)).unwrap();
            cache.set_vm_dedup_group(VmId(2), Some(1)).unwrap();
        }
        Harness { _dir: dir, cache, pools, version: 0, ops: 0, common_contents: dedup }
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
                assert_eq!(
                    m.kind,
                    PoolKind::Ephemeral,
                    "persistent page {key:?} {content:?} lost from pool {:?}",
                    m.id
                );
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

    fn apply(&mut self, op: &Op) {
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
                let mut buf = vec![0u8; keys.len() * PS];
                let hits = self.cache.get_batch(VmId(vm), id, &keys, &mut buf).unwrap();
                for (i, k) in keys.iter().enumerate() {
                    let bytes = buf[i * PS..(i + 1) * PS].to_vec();
                    self.check_get(vm, slot, *k, hits[i].then_some(bytes.as_slice()));
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
                self.pools.insert((vm, slot), PoolModel { id, kind: opts.kind, pages: BTreeMap::new() });
            }
            Op::SetVmWeights { vm, mem, ssd } => {
                self.cache.set_vm_weights(VmId(vm), VmWeights { mem, ssd }).unwrap()
            }
            Op::SetCapacity { ssd, pages } => {
                let store = if ssd { StoreKind::Ssd } else { StoreKind::Mem };
                self.cache.set_capacity(store, pages * PS as u64).unwrap();
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
        }
        assert_identity_fast(&self.cache);
        if self.ops.is_multiple_of(256) {
            self.cache.check_invariants().unwrap();
            self.check_persistent_counts();
        }
    }

    /// Persistent pools hold exactly the model's pages.
    fn check_persistent_counts(&self) {
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
        }
    }
}

fn assert_identity_fast(cache: &Cache) {
    let host = cache.host_stats();
    assert!(host.totals.identity_holds(), "host identity: {:?}", host.totals);
    for vm in &host.vms {
        assert!(vm.totals.identity_holds(), "vm identity: {:?}", vm.totals);
        for p in &vm.pools {
            assert!(p.counters.identity_holds(), "pool identity {:?}: {:?}", p.pool, p.counters);
        }
    }
}

fn run_ops(seed: u64, ops: &[Op]) {
    let mut h = Harness::new(seed);
    for op in ops {
        h.apply(op);
    }
    h.cache.check_invariants().unwrap();
    h.check_persistent_counts();
}

fn op_strategy() -> impl Strategy<Value = Op> {
    any::<u64>().prop_map(|s| gen_op(&mut rand_chacha::ChaCha8Rng::seed_from_u64(s)))
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    /// Random sequences with shrinking: a failure is reported as a minimal op list.
    #[test]
    fn random_sequences_agree_with_the_model(seed in any::<u64>(), ops in prop::collection::vec(op_strategy(), 1..1500)) {
        run_ops(seed, &ops);
    }
}

/// The model run with de-duplication and compression on, shared contents, and one VM in its own
/// de-dup domain (acceptance 3 of the de-duplication issue).
#[test]
fn long_seeded_run_with_dedup_and_compression_agrees_with_the_model() {
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(0xDED09);
    let mut h = Harness::with(11, true, true);
    for _ in 0..60_000 {
        let op = gen_op(&mut rng);
        h.apply(&op);
    }
    h.cache.check_invariants().unwrap();
    let t = h.cache.host_stats().totals;
    eprintln!("dedup run totals: {t:?}");
    assert!(t.mem.dedup_hits > 500 && t.mem.bytes_saved > t.mem.dedup_hits * PS as u64, "{t:?}");
}

/// The model run with compression only.
#[test]
fn long_seeded_run_with_compression_agrees_with_the_model() {
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(0xC0_4E55);
    let mut h = Harness::with(12, false, true);
    for _ in 0..60_000 {
        let op = gen_op(&mut rng);
        h.apply(&op);
    }
    h.cache.check_invariants().unwrap();
    let t = h.cache.host_stats().totals;
    assert!(t.mem.bytes_saved > 0 && t.mem.dedup_hits == 0, "{t:?}");
}

/// The long run: 120 000 operations from a fixed seed, across every op kind.
#[test]
fn long_seeded_run_agrees_with_the_model() {
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(0xD0_0B1E_DECC);
    let ops: Vec<Op> = (0..120_000).map(|_| gen_op(&mut rng)).collect();
    let mut h = Harness::new(7);
    for op in &ops {
        h.apply(op);
    }
    h.cache.check_invariants().unwrap();
    // The run must actually exercise what it claims to: hits from both stores, evictions, tier moves,
    // migrations and refusals.
    let t = h.cache.host_stats().totals;
    eprintln!("long run totals: {t:?}");
    assert_eq!(h.ops, 120_000);
    assert!(t.mem.gets_hit > 1_000 && t.ssd.gets_hit > 1_000, "{t:?}");
    assert!(t.mem.evictions > 100 && t.ssd.evictions > 100, "{t:?}");
    assert!(t.demotions > 100 && t.promotions > 10, "{t:?}");
    assert!(t.migrations_in > 100 && t.puts_refused > 100, "{t:?}");
}
