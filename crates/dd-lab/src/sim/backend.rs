//! The second-chance cache as the emulated guests see it: the [`SecondChance`] trait (cleancache and
//! frontswap operations plus the control calls a scenario's timeline makes), implemented by
//! [`Stamped`] over any [`CacheOps`]: the real engine in-process ([`EngineBackend`]) or a running daemon
//! (`crate::remote`). Both are driven by the same calls in the same order, so they give the same run.
//!
//! Every stored page carries a stamp `(magic, pool, object, index, version)` in the first 28 bytes of
//! its 512-byte engine page; every hit is compared with the stamp the guest expects, so each lab run is
//! also a coherency test of the engine (SPEC section 2: a get never returns data older than the latest
//! put of its key). A mismatch is a [`LabError::Coherency`] and stops the run.
//!
//! Sizes: the engine runs with `page_size_bytes = 512` (the engine's smallest page) so the host's memory
//! use stays small; one engine page stands for one 4 KiB guest page, and capacities are passed and
//! reported in guest pages.
//!
//! A cleancache pool of spec `none` holds nothing: its puts are refused, and a change of spec to `none`
//! drops its pages (`Cache::set_spec`). [`Stamped`] answers that pool's puts, gets and flushes itself
//! and counts the refused puts and missed gets the engine would have counted, adding them to the pool's
//! counters; a run without a second-chance cache (every container `none`, as in the trace replay against
//! libCacheSim) then makes no calls into the engine on its data path, and its outputs are the same.
//! A persistent (frontswap) pool keeps its pages under spec `none`, so its calls always go through.

use crate::error::LabError;
use dd_engine::config::{DirectIo, IoBackend, Maintenance, SsdStoreConfig};
use dd_engine::{
    Cache, Counters, EngineConfig, Key, Mode, PoolHandle, PoolId, PoolOptions, Spec, StoreKind, VmId,
    VmWeights,
};
use std::path::PathBuf;

/// Engine page size used by the lab (bytes of payload per emulated 4 KiB page).
pub const ENGINE_PAGE: usize = 512;
const MAGIC: u32 = 0xdd1a_b5a7;

/// What the guest needs from the hypervisor cache.
pub trait SecondChance {
    fn add_vm(&mut self, vm: u32, mem_weight: u32, ssd_weight: u32) -> Result<(), LabError>;
    fn set_vm_weights(&mut self, vm: u32, mem_weight: u32, ssd_weight: u32) -> Result<(), LabError>;
    fn new_pool(&mut self, vm: u32, opts: PoolOptions) -> Result<u32, LabError>;
    fn destroy_pool(&mut self, vm: u32, pool: u32) -> Result<(), LabError>;
    fn set_spec(&mut self, vm: u32, pool: u32, spec: Spec) -> Result<(), LabError>;
    fn set_capacity(&mut self, store: StoreKind, pages: u64) -> Result<(), LabError>;
    fn set_mode(&mut self, mode: Mode) -> Result<(), LabError>;
    /// Stores a page stamped with `version`. Returns the tier it went to, `None` if refused.
    fn put(
        &mut self,
        vm: u32,
        pool: u32,
        object: u64,
        index: u64,
        version: u32,
    ) -> Result<Option<StoreKind>, LabError>;
    /// Looks a page up; on a hit verifies its stamp against `version` and returns the tier it came from.
    fn get(
        &mut self,
        vm: u32,
        pool: u32,
        object: u64,
        index: u64,
        version: u32,
    ) -> Result<Option<StoreKind>, LabError>;
    fn flush_page(&mut self, vm: u32, pool: u32, object: u64, index: u64) -> Result<(), LabError>;
    fn flush_object(&mut self, vm: u32, pool: u32, object: u64) -> Result<(), LabError>;
    /// The pool's counters (pages).
    fn pool_counters(&mut self, vm: u32, pool: u32) -> Result<Counters, LabError>;
    /// Hits whose stamp was verified so far.
    fn verified_hits(&self) -> u64;
}

/// Host-level settings of the cache, in guest pages.
#[derive(Debug, Clone)]
pub struct BackendConfig {
    pub mem_pages: u64,
    /// Largest memory capacity the run will set (the arena is reserved for it).
    pub mem_max_pages: u64,
    /// SSD store capacity (largest the run will set); 0: none.
    pub ssd_pages: u64,
    pub mode: Mode,
    pub batch_pages: u64,
    /// Directory for the SSD store's file.
    pub scratch_dir: PathBuf,
}

/// What a get found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lookup {
    Miss,
    /// A hit, with the tier that held the page when the cache says (the in-process engine does; the
    /// data-plane protocol does not, and the stamped backend then reads it from the pool's counters).
    Hit(Option<StoreKind>),
}

/// The cache calls the stamped backend makes, in guest pages and engine-page buffers: implemented by
/// the engine in-process ([`InProcess`]) and by a running daemon ([`crate::sim::remote::Daemon`]).
pub trait CacheOps {
    fn add_vm(&mut self, vm: u32, weights: VmWeights) -> Result<(), LabError>;
    fn set_vm_weights(&mut self, vm: u32, weights: VmWeights) -> Result<(), LabError>;
    fn new_pool(&mut self, vm: u32, opts: PoolOptions) -> Result<u32, LabError>;
    fn destroy_pool(&mut self, vm: u32, pool: u32) -> Result<(), LabError>;
    fn set_spec(&mut self, vm: u32, pool: u32, spec: Spec) -> Result<(), LabError>;
    fn set_capacity(&mut self, store: StoreKind, bytes: u64) -> Result<(), LabError>;
    fn set_mode(&mut self, mode: Mode) -> Result<(), LabError>;
    fn put(&mut self, vm: u32, pool: u32, key: Key, page: &[u8]) -> Result<Option<StoreKind>, LabError>;
    fn get(&mut self, vm: u32, pool: u32, key: Key, out: &mut [u8]) -> Result<Lookup, LabError>;
    fn flush_page(&mut self, vm: u32, pool: u32, key: Key) -> Result<(), LabError>;
    fn flush_object(&mut self, vm: u32, pool: u32, object: u64) -> Result<(), LabError>;
    fn pool_counters(&mut self, vm: u32, pool: u32) -> Result<Counters, LabError>;
    /// Whether [`Self::get`] reports the tier of every hit.
    const REPORTS_TIER: bool;
}

/// The engine configuration a lab run needs: 512-byte engine pages, inline maintenance (deterministic),
/// the memory arena reserved for the largest capacity the run sets, hybrid margins in guest pages. A
/// daemon serving the lab must run the same (`docs/scenario-format.md`, "Running against a daemon").
pub fn engine_config(cfg: &BackendConfig) -> EngineConfig {
    let ps = ENGINE_PAGE as u64;
    let ecfg = EngineConfig {
        page_size_bytes: ENGINE_PAGE,
        mem: dd_engine::config::MemStoreConfig {
            capacity_bytes: cfg.mem_pages * ps,
            max_capacity_bytes: Some(cfg.mem_max_pages.max(cfg.mem_pages).max(1) * ps),
            ..Default::default()
        },
        // An unnamed scratch file in the scratch directory: nothing is left behind by any exit of the
        // lab (a SIGKILL included), and on a memory-backed directory nothing is reserved up front.
        ssd: (cfg.ssd_pages > 0).then(|| SsdStoreConfig {
            path: cfg.scratch_dir.clone(),
            scratch: true,
            capacity_bytes: cfg.ssd_pages * ps,
            direct_io: DirectIo::Off,
            io_backend: IoBackend::Sync,
            write_queue_pages: 4096,
        }),
        mode: cfg.mode,
        eviction_batch_bytes: cfg.batch_pages.max(1) * ps,
        maintenance: Maintenance::Inline,
        // One shard: a single queue per pool, the order the lab's results were measured with (its
        // outputs are byte-identical to the unsharded engine's; issue 28).
        pool_shards: 1,
        ..Default::default()
    };
    let mut hybrid = ecfg.hybrid.clone();
    // The defaults are in bytes of 4 KiB pages; keep them in guest pages.
    hybrid.low_watermark_margin_bytes = hybrid.low_watermark_margin_bytes / 4096 * ps;
    hybrid.move_batch_bytes = (hybrid.move_batch_bytes / 4096 * ps).max(ps);
    EngineConfig { hybrid, ..ecfg }
}

/// The real engine, in-process, with inline maintenance (deterministic).
pub struct InProcess {
    cache: Cache,
    /// Pool handles indexed by VM id, then pool id (the lab numbers VMs from 1, the engine numbers each
    /// VM's pools from 1, one per emulated container; pool ids are per VM, so the VM is part of the
    /// index): the data path skips the engine's pool-table lookup (`bench lab` measured it at about 8% of
    /// a run).
    handles: Vec<Vec<Option<PoolHandle>>>,
}

impl InProcess {
    pub fn new(cfg: &BackendConfig) -> Result<InProcess, LabError> {
        let cache = Cache::new(engine_config(cfg))?;
        Ok(InProcess { cache, handles: Vec::new() })
    }

    /// The handle of a live pool of `vm`. Every live pool has one, so a missing handle is the engine's
    /// answer for a pool that does not exist or belongs to another VM.
    fn handle(&self, vm: u32, pool: u32) -> Result<&PoolHandle, LabError> {
        match self.handles.get(vm as usize).and_then(|p| p.get(pool as usize)).and_then(Option::as_ref) {
            Some(h) => {
                debug_assert_eq!(h.vm(), VmId(vm), "a handle is filed under its own VM");
                Ok(h)
            }
            None => Err(dd_engine::CacheError::UnknownPool(PoolId(pool)).into()),
        }
    }
}

impl CacheOps for InProcess {
    const REPORTS_TIER: bool = true;
    fn add_vm(&mut self, vm: u32, weights: VmWeights) -> Result<(), LabError> {
        Ok(self.cache.add_vm(VmId(vm), weights)?)
    }
    fn set_vm_weights(&mut self, vm: u32, weights: VmWeights) -> Result<(), LabError> {
        Ok(self.cache.set_vm_weights(VmId(vm), weights)?)
    }
    fn new_pool(&mut self, vm: u32, opts: PoolOptions) -> Result<u32, LabError> {
        let id = self.cache.new_pool(VmId(vm), opts)?;
        let h = self.cache.pool_handle(VmId(vm), id)?;
        let (v, i) = (vm as usize, id.0 as usize);
        if self.handles.len() <= v {
            self.handles.resize_with(v + 1, Vec::new);
        }
        let pools = &mut self.handles[v];
        if pools.len() <= i {
            pools.resize(i + 1, None);
        }
        pools[i] = Some(h);
        Ok(id.0)
    }
    fn destroy_pool(&mut self, vm: u32, pool: u32) -> Result<(), LabError> {
        self.cache.destroy_pool(VmId(vm), PoolId(pool))?;
        if let Some(h) = self.handles.get_mut(vm as usize).and_then(|p| p.get_mut(pool as usize)) {
            *h = None;
        }
        Ok(())
    }
    fn set_spec(&mut self, vm: u32, pool: u32, spec: Spec) -> Result<(), LabError> {
        Ok(self.cache.set_spec(VmId(vm), PoolId(pool), spec)?)
    }
    fn set_capacity(&mut self, store: StoreKind, bytes: u64) -> Result<(), LabError> {
        Ok(self.cache.set_capacity(store, bytes)?)
    }
    fn set_mode(&mut self, mode: Mode) -> Result<(), LabError> {
        self.cache.set_mode(mode);
        Ok(())
    }
    fn put(&mut self, vm: u32, pool: u32, key: Key, page: &[u8]) -> Result<Option<StoreKind>, LabError> {
        Ok(self.handle(vm, pool)?.put(key, page)?.tier())
    }
    fn get(&mut self, vm: u32, pool: u32, key: Key, out: &mut [u8]) -> Result<Lookup, LabError> {
        Ok(self.handle(vm, pool)?.get(key, out)?.map_or(Lookup::Miss, |t| Lookup::Hit(Some(t))))
    }
    fn flush_page(&mut self, vm: u32, pool: u32, key: Key) -> Result<(), LabError> {
        self.cache.flush_page(VmId(vm), PoolId(pool), key)?;
        Ok(())
    }
    fn flush_object(&mut self, vm: u32, pool: u32, object: u64) -> Result<(), LabError> {
        self.cache.flush_object(VmId(vm), PoolId(pool), object)?;
        Ok(())
    }
    fn pool_counters(&mut self, vm: u32, pool: u32) -> Result<Counters, LabError> {
        Ok(self.cache.pool_stats(VmId(vm), PoolId(pool))?.counters)
    }
}

/// The guest's view of a cache: stamps every page it puts and verifies every page it gets.
pub struct Stamped<C: CacheOps> {
    ops: C,
    buf: Vec<u8>,
    verified: u64,
    /// Each live pool, indexed by VM id, then pool id: pool ids are numbered per VM, so the VM is part
    /// of the key. Looked up on every call of the data path.
    pools: Vec<Vec<Option<PoolState>>>,
}

/// What the stamped backend keeps of a live pool.
#[derive(Debug, Clone, Copy)]
struct PoolState {
    /// The tier of a hit follows from it.
    spec: Spec,
    ephemeral: bool,
    /// Refused puts and missed gets answered here while the pool was idle (see [`PoolState::idle`]).
    puts_refused: u64,
    gets_missed: u64,
}

impl PoolState {
    /// A cleancache pool of spec `none`: it holds no page and takes none (module documentation).
    fn idle(&self) -> bool {
        self.ephemeral && self.spec == Spec::None
    }
}

/// The in-process engine as the lab's second-chance cache.
pub type EngineBackend = Stamped<InProcess>;

impl EngineBackend {
    pub fn new(cfg: &BackendConfig) -> Result<EngineBackend, LabError> {
        Ok(Stamped::over(InProcess::new(cfg)?))
    }

    pub fn cache(&self) -> &Cache {
        &self.ops.cache
    }
}

impl<C: CacheOps> Stamped<C> {
    pub fn over(ops: C) -> Stamped<C> {
        Stamped { ops, buf: vec![0u8; ENGINE_PAGE], verified: 0, pools: Vec::new() }
    }

    fn state(&self, vm: u32, pool: u32) -> Option<&PoolState> {
        self.pools.get(vm as usize).and_then(|p| p.get(pool as usize)).and_then(Option::as_ref)
    }

    fn state_mut(&mut self, vm: u32, pool: u32) -> Option<&mut PoolState> {
        self.pools.get_mut(vm as usize).and_then(|p| p.get_mut(pool as usize)).and_then(Option::as_mut)
    }

    /// Whether `vm`'s pool `pool` is idle (a pool the lab did not create is not: the engine answers).
    fn idle(&self, vm: u32, pool: u32) -> bool {
        self.state(vm, pool).is_some_and(PoolState::idle)
    }

    fn set_state(&mut self, vm: u32, pool: u32, state: Option<PoolState>) {
        let (v, p) = (vm as usize, pool as usize);
        if self.pools.len() <= v {
            self.pools.resize_with(v + 1, Vec::new);
        }
        let pools = &mut self.pools[v];
        if pools.len() <= p {
            pools.resize(p + 1, None);
        }
        pools[p] = state;
    }

    /// Debug builds: an idle pool really holds nothing (what answering for it relies on).
    fn debug_check_idle(&mut self, vm: u32, pool: u32) -> Result<(), LabError> {
        if cfg!(debug_assertions) {
            let c = self.ops.pool_counters(vm, pool)?;
            debug_assert_eq!(c.mem.used + c.ssd.used, 0, "an idle pool (spec none) holds pages");
        }
        Ok(())
    }

    pub fn ops(&self) -> &C {
        &self.ops
    }

    fn stamp(buf: &mut [u8], pool: u32, object: u64, index: u64, version: u32) {
        buf[0..4].copy_from_slice(&MAGIC.to_le_bytes());
        buf[4..8].copy_from_slice(&pool.to_le_bytes());
        buf[8..16].copy_from_slice(&object.to_le_bytes());
        buf[16..24].copy_from_slice(&index.to_le_bytes());
        buf[24..28].copy_from_slice(&version.to_le_bytes());
    }
}

impl<C: CacheOps> SecondChance for Stamped<C> {
    fn add_vm(&mut self, vm: u32, mem_weight: u32, ssd_weight: u32) -> Result<(), LabError> {
        self.ops.add_vm(vm, VmWeights { mem: mem_weight, ssd: ssd_weight })
    }
    fn set_vm_weights(&mut self, vm: u32, mem_weight: u32, ssd_weight: u32) -> Result<(), LabError> {
        self.ops.set_vm_weights(vm, VmWeights { mem: mem_weight, ssd: ssd_weight })
    }
    fn new_pool(&mut self, vm: u32, opts: PoolOptions) -> Result<u32, LabError> {
        let p = self.ops.new_pool(vm, opts)?;
        let ephemeral = opts.kind == dd_engine::PoolKind::Ephemeral;
        self.set_state(
            vm,
            p,
            Some(PoolState { spec: opts.spec, ephemeral, puts_refused: 0, gets_missed: 0 }),
        );
        Ok(p)
    }
    fn destroy_pool(&mut self, vm: u32, pool: u32) -> Result<(), LabError> {
        self.set_state(vm, pool, None);
        self.ops.destroy_pool(vm, pool)
    }
    fn set_spec(&mut self, vm: u32, pool: u32, spec: Spec) -> Result<(), LabError> {
        self.ops.set_spec(vm, pool, spec)?;
        if let Some(st) = self.state_mut(vm, pool) {
            st.spec = spec;
        }
        Ok(())
    }
    fn set_capacity(&mut self, store: StoreKind, pages: u64) -> Result<(), LabError> {
        self.ops.set_capacity(store, pages * ENGINE_PAGE as u64)
    }
    fn set_mode(&mut self, mode: Mode) -> Result<(), LabError> {
        self.ops.set_mode(mode)
    }
    fn put(
        &mut self,
        vm: u32,
        pool: u32,
        object: u64,
        index: u64,
        version: u32,
    ) -> Result<Option<StoreKind>, LabError> {
        if self.idle(vm, pool) {
            self.debug_check_idle(vm, pool)?;
            if let Some(st) = self.state_mut(vm, pool) {
                st.puts_refused += 1;
            }
            return Ok(None);
        }
        Self::stamp(&mut self.buf, pool, object, index, version);
        self.ops.put(vm, pool, Key::new(object, index), &self.buf)
    }
    fn get(
        &mut self,
        vm: u32,
        pool: u32,
        object: u64,
        index: u64,
        version: u32,
    ) -> Result<Option<StoreKind>, LabError> {
        let state = self.state_mut(vm, pool);
        if let Some(st) = state.filter(|st| st.idle()) {
            st.gets_missed += 1;
            return Ok(None);
        }
        // A pool the lab did not create goes to the engine, whose answer is the error.
        let spec = self.state(vm, pool).map_or(Spec::None, |st| st.spec);
        // A cache that does not say which tier hit: for a hybrid pool read the tier from the counters
        // (slower, only hybrid pools pay it).
        let before =
            if spec.is_hybrid() && !C::REPORTS_TIER { Some(self.ops.pool_counters(vm, pool)?) } else { None };
        let Lookup::Hit(reported) = self.ops.get(vm, pool, Key::new(object, index), &mut self.buf)? else {
            return Ok(None);
        };
        let mut want = [0u8; 28];
        Self::stamp(&mut want, pool, object, index, version);
        if self.buf[..28] != want {
            let got =
                |a: usize, b: usize| u64::from_le_bytes(self.buf[a..a + 8].try_into().unwrap_or([0; 8])) >> b;
            return Err(LabError::Coherency(format!(
                "pool {pool} object {object} index {index}: expected version {version}, got object {} index {} \
                 version {}",
                got(8, 0),
                got(16, 0),
                u32::from_le_bytes(self.buf[24..28].try_into().unwrap_or([0; 4]))
            )));
        }
        self.verified += 1;
        let tier = match spec {
            Spec::Mem { .. } => StoreKind::Mem,
            Spec::Ssd { .. } => StoreKind::Ssd,
            _ => match (reported, before) {
                (Some(t), _) => t,
                (None, Some(b)) => {
                    let a = self.ops.pool_counters(vm, pool)?;
                    if a.ssd.gets_hit > b.ssd.gets_hit {
                        StoreKind::Ssd
                    } else {
                        StoreKind::Mem
                    }
                }
                (None, None) => StoreKind::Mem,
            },
        };
        Ok(Some(tier))
    }
    fn flush_page(&mut self, vm: u32, pool: u32, object: u64, index: u64) -> Result<(), LabError> {
        if self.idle(vm, pool) {
            return Ok(());
        }
        self.ops.flush_page(vm, pool, Key::new(object, index))
    }
    fn flush_object(&mut self, vm: u32, pool: u32, object: u64) -> Result<(), LabError> {
        if self.idle(vm, pool) {
            return Ok(());
        }
        self.ops.flush_object(vm, pool, object)
    }
    fn pool_counters(&mut self, vm: u32, pool: u32) -> Result<Counters, LabError> {
        let mut c = self.ops.pool_counters(vm, pool)?;
        if let Some(st) = self.state(vm, pool) {
            c.puts_refused += st.puts_refused;
            c.gets_missed += st.gets_missed;
        }
        Ok(c)
    }
    fn verified_hits(&self) -> u64 {
        self.verified
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use dd_engine::PoolKind;

    /// A memory store of `mem` pages and an SSD store of `ssd` pages (none if 0, else its file in `dir`).
    fn config(mem: u64, ssd: u64, dir: &std::path::Path) -> BackendConfig {
        BackendConfig {
            mem_pages: mem,
            mem_max_pages: mem,
            ssd_pages: ssd,
            mode: Mode::Partitioned,
            batch_pages: 1,
            scratch_dir: dir.to_path_buf(),
        }
    }

    /// A 64-page memory store with VM 1 and one memory pool of `kind` in it.
    fn one_pool(kind: PoolKind) -> (EngineBackend, u32) {
        let mut b = EngineBackend::new(&config(64, 0, &std::env::temp_dir())).unwrap();
        b.add_vm(1, 100, 100).unwrap();
        let spec = Spec::Mem { weight: 100 };
        let opts = match kind {
            PoolKind::Ephemeral => PoolOptions::ephemeral(spec),
            PoolKind::Persistent => PoolOptions::persistent(spec),
        };
        let p = b.new_pool(1, opts).unwrap();
        (b, p)
    }

    #[test]
    fn a_page_got_from_a_cleancache_pool_leaves_the_pool() {
        let (mut b, p) = one_pool(PoolKind::Ephemeral);
        assert_eq!(b.put(1, p, 7, 3, 1).unwrap(), Some(StoreKind::Mem));
        assert_eq!(b.pool_counters(1, p).unwrap().mem.used, 1);
        assert_eq!(b.get(1, p, 7, 3, 1).unwrap(), Some(StoreKind::Mem));
        // Exclusive: the guest now holds the page, the pool does not.
        assert_eq!(b.pool_counters(1, p).unwrap().mem.used, 0);
        assert_eq!(b.get(1, p, 7, 3, 1).unwrap(), None);
        assert_eq!(b.verified_hits(), 1);
    }

    #[test]
    fn a_swap_pool_keeps_the_page_until_it_is_flushed() {
        let (mut b, p) = one_pool(PoolKind::Persistent);
        b.put(1, p, 1, 0, 5).unwrap();
        assert_eq!(b.get(1, p, 1, 0, 5).unwrap(), Some(StoreKind::Mem));
        assert_eq!(b.get(1, p, 1, 0, 5).unwrap(), Some(StoreKind::Mem), "frontswap gets do not remove");
        b.flush_page(1, p, 1, 0).unwrap();
        assert_eq!(b.get(1, p, 1, 0, 5).unwrap(), None);
    }

    /// A memory store of `mem` pages and an SSD store of `ssd` pages (its file in `dir`), with VM 1.
    fn mem_and_ssd(mem: u64, ssd: u64, dir: &std::path::Path) -> EngineBackend {
        let mut b = EngineBackend::new(&config(mem, ssd, dir)).unwrap();
        b.add_vm(1, 100, 100).unwrap();
        b
    }

    #[test]
    fn a_hybrid_hit_names_the_tier_the_counters_name() {
        let dir = tempfile::tempdir().unwrap();
        let mut b = mem_and_ssd(16, 256, dir.path());
        let p =
            b.new_pool(1, PoolOptions::ephemeral(Spec::Hybrid { mem_weight: 100, ssd_weight: 100 })).unwrap();
        for i in 0..64 {
            b.put(1, p, 1, i, 1).unwrap();
        }
        let mut seen = [0u32; 2];
        for i in 0..64 {
            let before = b.pool_counters(1, p).unwrap();
            let tier = b.get(1, p, 1, i, 1).unwrap();
            let after = b.pool_counters(1, p).unwrap();
            let by_counters = if after.ssd.gets_hit > before.ssd.gets_hit {
                Some(StoreKind::Ssd)
            } else if after.mem.gets_hit > before.mem.gets_hit {
                Some(StoreKind::Mem)
            } else {
                None
            };
            assert_eq!(tier, by_counters, "page {i}");
            if let Some(t) = tier {
                seen[t.idx()] += 1;
            }
        }
        assert!(seen[0] > 0 && seen[1] > 0, "both tiers hit: {seen:?}");
    }

    #[test]
    fn an_unknown_or_foreign_pool_is_the_engines_unknown_pool() {
        let (mut b, p) = one_pool(PoolKind::Ephemeral);
        b.add_vm(2, 100, 100).unwrap();
        for (vm, pool) in [(1, p + 7), (2, p)] {
            let want = format!("{}", dd_engine::CacheError::UnknownPool(PoolId(pool)));
            assert!(b.put(vm, pool, 1, 0, 1).unwrap_err().to_string().contains(&want));
            assert!(b.get(vm, pool, 1, 0, 1).unwrap_err().to_string().contains(&want));
        }
        b.destroy_pool(1, p).unwrap();
        assert!(b.put(1, p, 1, 0, 1).is_err(), "a destroyed pool");
    }

    /// Pool ids are numbered per VM, so two emulated VMs each get pool 1. The in-process backend once
    /// kept its pool handles by pool id alone: VM 2's pool 1 replaced VM 1's, and VM 1's next put
    /// failed with `unknown pool 1` (CI's fig5-table1-split run).
    #[test]
    fn regression_two_vms_with_the_same_pool_id_keep_their_own_pools() {
        let (mut b, p1) = one_pool(PoolKind::Ephemeral);
        b.add_vm(2, 100, 100).unwrap();
        let p2 = b.new_pool(2, PoolOptions::ephemeral(Spec::Mem { weight: 100 })).unwrap();
        assert_eq!(p1, p2, "pool ids are per VM: both VMs' first pool has the same id");
        b.put(1, p1, 7, 3, 1).unwrap();
        b.put(2, p2, 7, 3, 2).unwrap();
        assert_eq!(b.get(1, p1, 7, 3, 1).unwrap(), Some(StoreKind::Mem));
        assert_eq!(b.get(2, p2, 7, 3, 2).unwrap(), Some(StoreKind::Mem));
        b.destroy_pool(2, p2).unwrap();
        b.put(1, p1, 7, 4, 1).unwrap();
        assert_eq!(b.get(1, p1, 7, 4, 1).unwrap(), Some(StoreKind::Mem), "VM 2's destroy left VM 1's pool");
        assert!(b.put(2, p2, 7, 4, 1).is_err(), "VM 2's destroyed pool is gone");
    }

    /// Pool ids are per VM, and the stamped backend once kept each pool's spec by pool id alone: VM 2's
    /// SSD-only pool 1 replaced VM 1's memory pool 1 in it, and every memory hit of VM 1 from then on
    /// was reported (and timed) as an SSD hit (fig14-dynamic-vms: VM 3 is SSD-only).
    #[test]
    fn regression_two_vms_with_the_same_pool_id_kept_one_spec_for_the_tier_of_a_hit() {
        let dir = tempfile::tempdir().unwrap();
        let mut b = mem_and_ssd(64, 64, dir.path());
        b.add_vm(2, 100, 100).unwrap();
        let p1 = b.new_pool(1, PoolOptions::ephemeral(Spec::Mem { weight: 100 })).unwrap();
        let p2 = b.new_pool(2, PoolOptions::ephemeral(Spec::Ssd { weight: 100 })).unwrap();
        assert_eq!(p1, p2, "both VMs' first pool has the same id");
        b.put(1, p1, 7, 0, 1).unwrap();
        b.put(2, p2, 7, 0, 1).unwrap();
        assert_eq!(b.get(1, p1, 7, 0, 1).unwrap(), Some(StoreKind::Mem), "VM 1's pool is a memory pool");
        assert_eq!(b.get(2, p2, 7, 0, 1).unwrap(), Some(StoreKind::Ssd), "VM 2's pool is an SSD pool");
        // A spec change of one VM's pool leaves the other's alone.
        b.set_spec(1, p1, Spec::Ssd { weight: 100 }).unwrap();
        b.set_spec(2, p2, Spec::Mem { weight: 100 }).unwrap();
        b.put(1, p1, 7, 1, 1).unwrap();
        b.put(2, p2, 7, 1, 1).unwrap();
        assert_eq!(b.get(1, p1, 7, 1, 1).unwrap(), Some(StoreKind::Ssd));
        assert_eq!(b.get(2, p2, 7, 1, 1).unwrap(), Some(StoreKind::Mem));
    }

    /// A cleancache pool of spec `none` is answered by the stamped backend without the engine; its
    /// counters must be what the engine itself counts for the same calls, through a spec change to
    /// memory and back (which drops the pool's pages).
    #[test]
    fn a_pool_of_spec_none_counts_what_the_engine_counts() {
        let cfg = config(64, 0, &std::env::temp_dir());
        let mut stamped = EngineBackend::new(&cfg).unwrap();
        let mut direct = InProcess::new(&cfg).unwrap();
        stamped.add_vm(1, 100, 100).unwrap();
        direct.add_vm(1, VmWeights { mem: 100, ssd: 100 }).unwrap();
        let opts = PoolOptions::ephemeral(Spec::None);
        let (p, q) = (stamped.new_pool(1, opts).unwrap(), direct.new_pool(1, opts).unwrap());
        let page = vec![0u8; ENGINE_PAGE];
        let mut out = vec![0u8; ENGINE_PAGE];
        let mut both = |s: &mut EngineBackend, d: &mut InProcess, i: u64| {
            let put = s.put(1, p, 3, i, 1).unwrap();
            assert_eq!(put, d.put(1, q, Key::new(3, i), &page).unwrap());
            let got = s.get(1, p, 3, i, 1).unwrap();
            assert_eq!(got.is_some(), d.get(1, q, Key::new(3, i), &mut out).unwrap() != Lookup::Miss);
            s.flush_page(1, p, 3, i + 2).unwrap();
            d.flush_page(1, q, Key::new(3, i + 2)).unwrap();
        };
        for i in 0..10 {
            both(&mut stamped, &mut direct, i);
        }
        let mem = Spec::Mem { weight: 100 };
        stamped.set_spec(1, p, mem).unwrap();
        direct.set_spec(1, q, mem).unwrap();
        for i in 10..20 {
            both(&mut stamped, &mut direct, i);
        }
        stamped.set_spec(1, p, Spec::None).unwrap();
        direct.set_spec(1, q, Spec::None).unwrap();
        for i in 20..30 {
            both(&mut stamped, &mut direct, i);
        }
        stamped.flush_object(1, p, 3).unwrap();
        direct.flush_object(1, q, 3).unwrap();
        let (s, d) = (stamped.pool_counters(1, p).unwrap(), direct.pool_counters(1, q).unwrap());
        assert_eq!(s, d);
        assert_eq!(
            (s.puts_refused, s.gets_missed, s.mem.gets_hit),
            (20, 20, 10),
            "refused and missed under none"
        );
    }

    #[test]
    fn a_stale_version_is_a_coherency_error() {
        let (mut b, p) = one_pool(PoolKind::Ephemeral);
        b.put(1, p, 2, 9, 4).unwrap();
        match b.get(1, p, 2, 9, 5) {
            Err(LabError::Coherency(m)) => assert!(m.contains("expected version 5"), "{m}"),
            other => panic!("stale page not caught: {other:?}"),
        }
    }
}
