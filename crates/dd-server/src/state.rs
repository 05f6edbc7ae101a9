//! The state every part of the daemon shares: the engine, the token registry, the metrics, the limits
//! and the shutdown flag.
//!
//! Lock order: a registration's gate (`auth::Registration::enter`) -> the engine's locks (its own order,
//! see `dd_engine::cache`); the registry's map lock and the admission lock are leaves, never held
//! across an engine call. VM registration changes the engine and the registry in a fixed sequence: add
//! to the engine, then to the registry (a connection cannot authenticate as a VM the engine does not
//! know); removal is the reverse: the registration is revoked first (no session of it acts any more,
//! see `auth`), then the pools go.

use crate::admission::Admission;
use crate::auth::{Registration, Registry};
use crate::config::{ServerConfig, VmConfig};
use crate::metrics::Metrics;
use crate::ServerError;
use dd_engine::{Cache, CacheError, VmId, VmWeights};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

#[derive(Debug)]
pub struct ServerState {
    pub cache: Cache,
    pub registry: Registry,
    pub metrics: Arc<Metrics>,
    /// Data-plane connection slots (global, per VM, handshakes displaced oldest first).
    pub admission: Arc<Admission>,
    pub handshake_timeout: Duration,
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
    pub coop: std::sync::OnceLock<std::sync::Arc<crate::coop::Coop>>,
    shutting_down: AtomicBool,
    /// De-duplication group names and their engine numbers; each VM's group name (leaves).
    dedup_groups: parking_lot::Mutex<std::collections::HashMap<String, u32>>,
    dedup_group_names: parking_lot::Mutex<std::collections::HashMap<VmId, String>>,
}

impl ServerState {
    /// Builds the engine and registers the configured VMs.
    pub fn new(cfg: &ServerConfig, host_token: &str) -> Result<ServerState, ServerError> {
        let engine_cfg = cfg.engine_config();
        let has_ssd = engine_cfg.ssd.is_some();
        let cache = Cache::new(engine_cfg).map_err(ServerError::Engine)?;
        let metrics = Arc::new(Metrics::new());
        let l = &cfg.limits;
        let state = ServerState {
            cache,
            registry: Registry::new(host_token),
            admission: Admission::new(l.max_connections, l.max_connections_per_vm, metrics.clone()),
            metrics,
            handshake_timeout: Duration::from_millis(l.handshake_timeout_ms),
            idle_timeout: (l.idle_timeout_ms > 0).then(|| Duration::from_millis(l.idle_timeout_ms)),
            max_batch: cfg.engine.max_batch_pages as u32,
            max_payload: cfg.limits.max_payload_bytes,
            max_connections: cfg.limits.max_connections,
            write_buffer_bytes: cfg.limits.write_buffer_bytes,
            has_ssd,
            coop_enabled: cfg.coop.enabled,
            coop: std::sync::OnceLock::new(),
            shutting_down: AtomicBool::new(false),
            dedup_groups: Default::default(),
            dedup_group_names: Default::default(),
        };
        for vm in &cfg.vms {
            state.add_vm(vm).map_err(ServerError::Engine)?;
        }
        Ok(state)
    }

    /// Registers a VM with its tokens (engine first, then the registry).
    pub fn add_vm(&self, vm: &VmConfig) -> Result<Arc<Registration>, CacheError> {
        self.cache.add_vm(VmId(vm.id), vm.weights)?;
        if let Some(n) = vm.max_pools {
            if let Err(e) = self.cache.set_vm_pool_quota(VmId(vm.id), n) {
                let _ = self.cache.remove_vm(VmId(vm.id));
                return Err(e);
            }
        }
        if !vm.dedup_group.is_empty() {
            let g = self.dedup_group_id(&vm.dedup_group);
            self.cache.set_vm_dedup_group(VmId(vm.id), Some(g))?;
        }
        self.dedup_group_names.lock().insert(VmId(vm.id), vm.dedup_group.clone());
        Ok(self.registry.insert(VmId(vm.id), &vm.data_token, &vm.admin_token))
    }

    /// Removes a VM: its registration first (every session of it is cut off, see `auth`), then its
    /// pools.
    pub fn remove_vm(&self, vm: VmId) -> Result<(), CacheError> {
        if !self.registry.remove(vm) {
            return Err(CacheError::UnknownVm(vm));
        }
        self.dedup_group_names.lock().remove(&vm);
        self.cache.remove_vm(vm)
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

    /// Replaces a VM's tokens (its pools stay): every session and admin credential of the old tokens
    /// is cut off before this returns.
    pub fn replace_tokens(&self, vm: VmId, data_token: &str, admin_token: &str) -> Result<(), CacheError> {
        self.registry.replace_tokens(vm, data_token, admin_token).map(|_| ()).ok_or(CacheError::UnknownVm(vm))
    }

    pub fn set_vm_weights(&self, vm: VmId, w: VmWeights) -> Result<(), CacheError> {
        self.cache.set_vm_weights(vm, w)
    }

    pub fn begin_shutdown(&self) {
        self.shutting_down.store(true, Ordering::Release);
    }

    pub fn is_shutting_down(&self) -> bool {
        self.shutting_down.load(Ordering::Acquire)
    }
}
