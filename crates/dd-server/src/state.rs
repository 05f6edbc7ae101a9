//! The state every part of the daemon shares: the engine, the token registry, the metrics, the limits
//! and the shutdown flag.
//!
//! Lock order: the registry's lock is a leaf and is never held across an engine call; the engine has its
//! own internal order (see `dd_engine::cache`). VM registration therefore changes the two in a fixed
//! sequence: add to the engine, then to the registry (a connection cannot authenticate as a VM the
//! engine does not know); removal is the reverse (new connections are refused before the pools go).

use crate::auth::Registry;
use crate::config::{ServerConfig, VmConfig};
use crate::metrics::Metrics;
use crate::ServerError;
use dd_engine::{Cache, CacheError, VmId, VmWeights};
use std::sync::atomic::{AtomicBool, Ordering};

#[derive(Debug)]
pub struct ServerState {
    pub cache: Cache,
    pub registry: Registry,
    pub metrics: Metrics,
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
}

impl ServerState {
    /// Builds the engine and registers the configured VMs.
    pub fn new(cfg: &ServerConfig, host_token: &str) -> Result<ServerState, ServerError> {
        let engine_cfg = cfg.engine_config();
        let has_ssd = engine_cfg.ssd.is_some();
        let cache = Cache::new(engine_cfg).map_err(ServerError::Engine)?;
        let state = ServerState {
            cache,
            registry: Registry::new(host_token),
            metrics: Metrics::new(),
            max_batch: cfg.engine.max_batch_pages as u32,
            max_payload: cfg.limits.max_payload_bytes,
            max_connections: cfg.limits.max_connections,
            write_buffer_bytes: cfg.limits.write_buffer_bytes,
            has_ssd,
            coop_enabled: cfg.coop.enabled,
            coop: std::sync::OnceLock::new(),
            shutting_down: AtomicBool::new(false),
        };
        for vm in &cfg.vms {
            state.add_vm(vm).map_err(ServerError::Engine)?;
        }
        Ok(state)
    }

    /// Registers a VM with its tokens (engine first, then the registry).
    pub fn add_vm(&self, vm: &VmConfig) -> Result<(), CacheError> {
        self.cache.add_vm(VmId(vm.id), vm.weights)?;
        self.registry.insert(VmId(vm.id), &vm.data_token, &vm.admin_token);
        Ok(())
    }

    /// Removes a VM: its tokens first, then its pools.
    pub fn remove_vm(&self, vm: VmId) -> Result<(), CacheError> {
        if !self.registry.remove(vm) {
            return Err(CacheError::UnknownVm(vm));
        }
        self.cache.remove_vm(vm)
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
