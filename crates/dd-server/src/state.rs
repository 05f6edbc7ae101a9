//! The state every part of the daemon shares: the engine, the token registry and its registrations
//! file, the daemon's instance id, the metrics, the limits, the shutdown flag and, once started, the
//! co-operative layer (as a `coop_types::CoopHandle`: `coop` imports this module, not the reverse).
//!
//! The **instance id** is a random non-zero 64-bit number drawn at every start and returned by HELLO
//! (protocol version 2): the engine starts empty, so a client that sees a new id knows that every pool
//! it had is gone (`docs/protocol.md`, "Restarts").
//!
//! **Registrations** start from the configuration's `[[vms]]`, then the registrations file's records
//! are applied over them (`persist`). Every registration change of the admin API goes through the
//! methods here, under the `persisted` mutex, so the file always matches the registry.
//!
//! Lock order: a registration's gate (`auth::Registration::enter`) -> the engine's locks (its own order,
//! see `dd_engine::cache`); the registry's map lock and the admission lock are leaves, never held
//! across an engine call. VM registration changes the engine and the registry in a fixed sequence: add
//! to the engine, then to the registry (a connection cannot authenticate as a VM the engine does not
//! know); removal is the reverse: the registration is revoked first (no session of it acts any more,
//! see `auth`), then the pools go. The `persisted` mutex is taken before both (admin changes only).

use crate::admission::Admission;
use crate::auth::{Registration, Registry};
use crate::config::{ServerConfig, VmConfig};
use crate::coop_types::CoopHandle;
use crate::metrics::Metrics;
use crate::persist::{Persisted, Record};
use crate::ServerError;
use dd_engine::{Cache, CacheError, VmId, VmWeights};
use parking_lot::Mutex;
use rand::RngCore;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

#[derive(Debug)]
pub struct ServerState {
    pub cache: Cache,
    pub registry: Registry,
    /// This start's instance id (never 0).
    pub instance: u64,
    /// The engine's default per-VM pool quota (a VM's record keeps only a quota of its own).
    default_pool_quota: usize,
    /// The registrations file; its lock serialises the admin API's registration changes.
    persisted: Mutex<Persisted>,
    pub metrics: Arc<Metrics>,
    /// Data-plane connection slots (global, per VM, handshakes displaced oldest first).
    pub admission: Arc<Admission>,
    pub handshake_timeout: Duration,
    /// `limits.handshake_fail_delay_ms`.
    pub handshake_fail_delay: Duration,
    /// `None`: idle sessions are never closed.
    pub idle_timeout: Option<Duration>,
    /// Batch limit of the protocol (the engine's `max_batch_pages`).
    pub max_batch: u32,
    pub max_payload: u32,
    pub max_connections: usize,
    pub write_buffer_bytes: usize,
    /// Whether engine calls may block on SSD I/O (decides whether connection tasks use
    /// `block_in_place`).
    pub has_ssd: bool,
    /// Co-operative de-duplication is configured: gets may wait (bounded) for a peer, so connection
    /// tasks use `block_in_place` too.
    pub coop_enabled: bool,
    /// The co-operative layer, once started by [`crate::run`].
    pub coop: std::sync::OnceLock<std::sync::Arc<dyn CoopHandle>>,
    shutting_down: AtomicBool,
    /// De-duplication group names and their engine numbers; each VM's group name (leaves).
    dedup_groups: parking_lot::Mutex<std::collections::HashMap<String, u32>>,
    dedup_group_names: parking_lot::Mutex<std::collections::HashMap<VmId, String>>,
    /// Each VM's last guest provisioner report (`crate::provisioner`; a leaf).
    pub provisioner: crate::provisioner::Reports,
    /// Samples of every VM and pool kept for `/ui/` (`crate::history`; a leaf).
    pub history: crate::history::History,
    /// Recording of connections (`capture.dir`); `None`: off.
    pub capture: Option<Arc<crate::capture::Capture>>,
}

impl ServerState {
    /// The recorder of a new connection on `channel`: off unless `capture.dir` is set (`crate::capture`).
    pub fn recorder(&self, channel: crate::capture::Channel) -> crate::capture::Recorder {
        self.capture.as_ref().map_or_else(crate::capture::Recorder::off, |c| c.start(channel))
    }

    /// Builds the engine, registers the configured VMs and applies the registrations file over them.
    pub fn new(cfg: &ServerConfig, host_token: &str) -> Result<ServerState, ServerError> {
        ServerState::with_ssd_faults(cfg, host_token, None)
    }

    /// [`ServerState::new`] over an SSD store whose I/O fails as `faults` says (tests and fuzzing only;
    /// `dd_engine::store::ssd::faults`: no configuration file can ask for it).
    pub fn with_ssd_faults(
        cfg: &ServerConfig,
        host_token: &str,
        faults: Option<Arc<dd_engine::store::ssd::faults::FaultInjector>>,
    ) -> Result<ServerState, ServerError> {
        let file = &cfg.auth.registrations_file;
        let file = (!file.as_os_str().is_empty()).then(|| cfg.in_data_dir(file));
        let mut persisted = Persisted::open(file, cfg.vms.iter().map(|v| v.id).collect())?;
        persisted.set_min_write_interval(Duration::from_millis(cfg.auth.registrations_min_write_interval_ms));
        let engine_cfg = cfg.engine_config();
        let default_pool_quota = engine_cfg.max_pools_per_vm;
        let has_ssd = engine_cfg.ssd.is_some();
        let cache = Cache::with_ssd_faults(engine_cfg, faults).map_err(ServerError::Engine)?;
        let metrics = Arc::new(Metrics::new());
        let l = &cfg.limits;
        let state = ServerState {
            cache,
            registry: Registry::new(host_token, persisted.salt()),
            instance: rand::rngs::OsRng.next_u64().max(1),
            default_pool_quota,
            admission: Admission::new(l.max_connections, l.max_connections_per_vm, metrics.clone()),
            metrics,
            handshake_timeout: Duration::from_millis(l.handshake_timeout_ms),
            handshake_fail_delay: Duration::from_millis(l.handshake_fail_delay_ms),
            idle_timeout: (l.idle_timeout_ms > 0).then(|| Duration::from_millis(l.idle_timeout_ms)),
            max_batch: cfg.engine.max_batch_pages as u32,
            max_payload: cfg.limits.max_payload_bytes,
            max_connections: cfg.limits.max_connections,
            write_buffer_bytes: cfg.limits.write_buffer_bytes,
            has_ssd,
            coop_enabled: cfg.coop.enabled,
            coop: std::sync::OnceLock::new(),
            persisted: Mutex::new(persisted),
            shutting_down: AtomicBool::new(false),
            dedup_groups: Default::default(),
            dedup_group_names: Default::default(),
            provisioner: Default::default(),
            history: crate::history::History::new(cfg.history.clone(), cfg.engine.page_size_bytes),
            capture: crate::capture::Capture::from_config(&cfg.capture)
                .map_err(|e| ServerError::Io(format!("capture.dir {}: {e}", cfg.capture.dir.display())))?,
        };
        for vm in &cfg.vms {
            state.register(vm).map_err(ServerError::Engine)?;
        }
        let records: Vec<Record> = state.persisted.lock().records().cloned().collect();
        for r in records {
            state.restore(&r).map_err(|e| {
                ServerError::Io(format!("restoring VM {} from the registrations file: {e}", r.id()))
            })?;
        }
        Ok(state)
    }

    /// Applies one record of the registrations file at start.
    fn restore(&self, r: &Record) -> Result<(), CacheError> {
        let id = VmId(r.id());
        if self.registry.remove(id) {
            self.dedup_group_names.lock().remove(&id);
            self.cache.remove_vm(id)?;
        }
        if let (Record::Registered { weights, max_pools, dedup_group, .. }, Some((d, a))) = (r, r.hashes()) {
            self.engine_add(id, *weights, *max_pools, dedup_group)?;
            self.registry.insert_hashed(id, d, a);
        }
        Ok(())
    }

    /// Adds a VM to the engine with its quota and de-duplication group (undone whole on a failure).
    fn engine_add(
        &self,
        vm: VmId,
        weights: VmWeights,
        max_pools: Option<usize>,
        dedup_group: &str,
    ) -> Result<(), CacheError> {
        self.cache.add_vm(vm, weights)?;
        let rest = || -> Result<(), CacheError> {
            if let Some(n) = max_pools {
                self.cache.set_vm_pool_quota(vm, n)?;
            }
            if !dedup_group.is_empty() {
                let g = self.dedup_group_id(dedup_group);
                self.cache.set_vm_dedup_group(vm, Some(g))?;
            }
            Ok(())
        };
        if let Err(e) = rest() {
            let _ = self.cache.remove_vm(vm);
            return Err(e);
        }
        self.dedup_group_names.lock().insert(vm, dedup_group.to_string());
        Ok(())
    }

    /// Registers a VM with its tokens (engine first, then the registry), without persisting it (the
    /// configuration's VMs, and tests).
    pub fn register(&self, vm: &VmConfig) -> Result<Arc<Registration>, CacheError> {
        self.engine_add(VmId(vm.id), vm.weights, vm.max_pools, &vm.dedup_group)?;
        Ok(self.registry.insert(VmId(vm.id), &vm.data_token, &vm.admin_token))
    }

    /// The record of a registered VM as it is now (`None`: not registered).
    fn record_of(&self, vm: VmId, quota: Option<usize>) -> Option<Record> {
        let reg = self.registry.get(vm)?;
        let weights = self.cache.vms().into_iter().find(|(id, _)| *id == vm)?.1;
        let (d, a) = reg.token_hashes();
        Some(Record::Registered {
            id: vm.0,
            weights,
            max_pools: quota,
            dedup_group: self.dedup_group_of(vm),
            data_token_sha256: d.to_hex(),
            admin_token_sha256: a.to_hex(),
        })
    }

    /// The quota a VM's record keeps: its own when it differs from the engine's default.
    fn own_quota(&self, vm: VmId) -> Option<usize> {
        let q = self.cache.vm_pool_quota(vm).ok()?;
        (q != self.default_pool_quota).then_some(q)
    }

    /// Registers a VM at run time (admin API) and keeps it in the registrations file; if the file
    /// cannot be written the VM is not registered.
    pub fn add_vm(&self, vm: &VmConfig) -> Result<Arc<Registration>, PersistError> {
        let mut p = self.persisted.lock();
        let reg = self.register(vm)?;
        let rec = self.record_of(VmId(vm.id), vm.max_pools).expect("just registered");
        if let Err(e) = p.set(rec) {
            let _ = self.registry.remove(VmId(vm.id));
            self.dedup_group_names.lock().remove(&VmId(vm.id));
            let _ = self.cache.remove_vm(VmId(vm.id));
            return Err(e.into());
        }
        Ok(reg)
    }

    /// Removes a VM: recorded first (a removal the file does not hold is not made), then its
    /// registration (every session of it is cut off, see `auth`), then its pools.
    pub fn remove_vm(&self, vm: VmId) -> Result<(), PersistError> {
        let mut p = self.persisted.lock();
        if !self.registry.contains(vm) {
            return Err(CacheError::UnknownVm(vm).into());
        }
        p.remove(vm.0)?;
        self.registry.remove(vm);
        self.dedup_group_names.lock().remove(&vm);
        self.provisioner.forget(vm);
        self.history.forget_vm(vm);
        Ok(self.cache.remove_vm(vm)?)
    }

    /// Entries of every table keyed by a VM, a pool or a connection, engine and daemon, by name (the
    /// `dd_table_entries` metric). Each is back to its earlier value once the VMs, pools and connections
    /// created since are gone, except those documented as bounded: `registry_retired_tokens` (at most
    /// `auth::RETIRED_KEPT`), `dedup_groups` (one per distinct group name ever used),
    /// `engine_pool_table_capacity` (within 4x the pools + 16 per shard) and
    /// `engine_pool_objects_alive` (at most one destroyed pool per runtime thread besides the pools).
    pub fn table_sizes(&self) -> Vec<(&'static str, u64)> {
        let e = self.cache.table_sizes();
        let (registrations, retired) = self.registry.table_sizes();
        let (handshaking, vms_in_session) = self.admission.table_sizes();
        let n = |x: usize| x as u64;
        vec![
            ("engine_vms", n(e.vms)),
            ("engine_pools", n(e.pools)),
            ("engine_pool_table_entries", n(e.pool_table_entries)),
            ("engine_pool_table_capacity", n(e.pool_table_capacity)),
            ("engine_pool_objects_alive", e.pool_objects_alive),
            ("engine_pins", n(e.pins)),
            ("registry_vms", n(registrations)),
            ("registry_retired_tokens", n(retired)),
            ("admission_handshaking", n(handshaking)),
            ("admission_vms_in_session", n(vms_in_session)),
            ("persisted_records", n(self.persisted.lock().record_count())),
            ("dedup_groups", n(self.dedup_groups.lock().len())),
            ("dedup_group_names", n(self.dedup_group_names.lock().len())),
            ("provisioner_reports", n(self.provisioner.count())),
            ("history_series", n(self.history.series())),
            ("history_samples", n(self.history.samples_kept())),
        ]
    }

    /// The engine's number of a de-duplication group name (stable for the daemon's life).
    pub fn dedup_group_id(&self, name: &str) -> u32 {
        let mut g = self.dedup_groups.lock();
        let n = g.len() as u32 + 1;
        *g.entry(name.to_string()).or_insert(n)
    }

    /// The de-duplication group of a VM ("" for its own domain).
    pub fn dedup_group_of(&self, vm: VmId) -> String {
        self.dedup_group_names.lock().get(&vm).cloned().unwrap_or_default()
    }

    /// Replaces a VM's tokens (its pools stay): recorded first (if the file cannot be written the old
    /// tokens stay in force), then every session and admin credential of the old tokens is cut off
    /// before this returns.
    pub fn replace_tokens(&self, vm: VmId, data_token: &str, admin_token: &str) -> Result<(), PersistError> {
        let mut p = self.persisted.lock();
        let Some(Record::Registered { id, weights, max_pools, dedup_group, .. }) =
            self.record_of(vm, self.own_quota(vm))
        else {
            return Err(CacheError::UnknownVm(vm).into());
        };
        let (d, a) = (self.registry.hash(data_token.as_bytes()), self.registry.hash(admin_token.as_bytes()));
        p.set(Record::Registered {
            id,
            weights,
            max_pools,
            dedup_group,
            data_token_sha256: d.to_hex(),
            admin_token_sha256: a.to_hex(),
        })?;
        self.registry.replace_tokens(vm, data_token, admin_token).ok_or(CacheError::UnknownVm(vm))?;
        // A report sent under the old tokens is not the new holder's.
        self.provisioner.forget(vm);
        Ok(())
    }

    /// Sets a VM's weights and records them (rolled back if the file cannot be written).
    pub fn set_vm_weights(&self, vm: VmId, w: VmWeights) -> Result<(), PersistError> {
        let mut p = self.persisted.lock();
        let old = self.cache.vms().into_iter().find(|(id, _)| *id == vm).ok_or(CacheError::UnknownVm(vm))?.1;
        self.cache.set_vm_weights(vm, w)?;
        let rec = self.record_of(vm, self.own_quota(vm)).ok_or(CacheError::UnknownVm(vm))?;
        if let Err(e) = p.set(rec) {
            let _ = self.cache.set_vm_weights(vm, old);
            return Err(e.into());
        }
        Ok(())
    }

    /// Sets a VM's pool quota and records it (rolled back if the file cannot be written).
    pub fn set_vm_pool_quota(&self, vm: VmId, n: usize) -> Result<(), PersistError> {
        let mut p = self.persisted.lock();
        let old = self.cache.vm_pool_quota(vm)?;
        self.cache.set_vm_pool_quota(vm, n)?;
        let rec = self.record_of(vm, Some(n)).ok_or(CacheError::UnknownVm(vm))?;
        if let Err(e) = p.set(rec) {
            let _ = self.cache.set_vm_pool_quota(vm, old);
            return Err(e.into());
        }
        Ok(())
    }

    pub fn begin_shutdown(&self) {
        self.shutting_down.store(true, Ordering::Release);
    }

    pub fn is_shutting_down(&self) -> bool {
        self.shutting_down.load(Ordering::Acquire)
    }
}

/// Why a registration change failed: the engine refused it, or the registrations file could not be
/// written (the change is then not in force).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PersistError {
    #[error(transparent)]
    Engine(#[from] CacheError),
    #[error("the registration change was not made: {0}")]
    File(#[from] ServerError),
}
