//! A running DoubleDecker daemon (`doubledecker serve`) as the lab's cache: [`Daemon`] implements
//! [`CacheOps`] over the real service, so a scenario exercises the daemon's data plane and admin API
//! exactly as guests and operators do.
//!
//! Mapping: each scenario VM is registered as a daemon VM (admin API `POST /v1/vms`, host token) with
//! its weights and its own data-plane tokens, and gets one authenticated data-plane connection; each
//! container's pool is created on that connection (`CREATE_CGROUP`), so pools belong to their VM as
//! they do for real guests. Store capacities, the eviction mode and the eviction batch are set through
//! `PATCH /v1/host`; VM weights through `PUT /v1/vms/{vm}/weights`.
//!
//! Invariants: the lab issues one request at a time and waits for its answer, so the daemon sees the
//! same calls in the same order as the in-process engine and (run with the engine settings of
//! [`crate::sim::backend::engine_config`]) reaches the same states; the VMs this value registered are removed
//! again when it is dropped, which also destroys their pools, so the next variant starts from an empty
//! cache. VM ids that are already registered are an error, never taken over.

use crate::error::LabError;
use crate::sim::backend::{BackendConfig, CacheOps, Lookup, ENGINE_PAGE};
use dd_client::admin::AdminClient;
use dd_client::Client;
use dd_engine::{Counters, Key, Mode, PoolId, PoolOptions, Spec, StoreKind, VmWeights};
use std::collections::BTreeMap;
use std::path::PathBuf;

/// Where the daemon listens and the host administrator's token.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DaemonTarget {
    pub data: DataAddr,
    /// Admin API address, `host:port`.
    pub admin: String,
    pub host_token: String,
}

/// The data plane's address.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DataAddr {
    Unix(PathBuf),
    Tcp(String),
}

impl DataAddr {
    /// Parses `unix:/path/to/sock` or `tcp:127.0.0.1:7411`.
    pub fn parse(s: &str) -> Result<DataAddr, LabError> {
        if let Some(p) = s.strip_prefix("unix:") {
            Ok(DataAddr::Unix(PathBuf::from(p)))
        } else if let Some(a) = s.strip_prefix("tcp:") {
            Ok(DataAddr::Tcp(a.to_string()))
        } else {
            Err(LabError::invalid("daemon", format!("`{s}`: expected unix:PATH or tcp:HOST:PORT")))
        }
    }
}

/// The daemon as a [`CacheOps`]: admin calls over HTTP, data-plane calls over one connection per VM.
pub struct Daemon {
    target: DaemonTarget,
    api: AdminClient,
    clients: BTreeMap<u32, Client>,
}

fn err(what: &str, e: impl std::fmt::Display) -> LabError {
    LabError::Daemon(format!("{what}: {e}"))
}

impl Daemon {
    /// Checks that the daemon runs the lab's engine page size and sets the host settings of `cfg`.
    pub fn connect(target: &DaemonTarget, cfg: &BackendConfig) -> Result<Daemon, LabError> {
        let d =
            Daemon { target: target.clone(), api: AdminClient::new(&target.admin), clients: BTreeMap::new() };
        let host = d.admin("GET", "/v1/host", None)?;
        let ps = host.get("page_size_bytes").and_then(|v| v.as_u64()).unwrap_or(0);
        if ps != ENGINE_PAGE as u64 {
            return Err(LabError::Daemon(format!(
                "the daemon's engine.page_size_bytes is {ps}; the lab needs {ENGINE_PAGE} (see \
                 docs/scenario-format.md, \"Running against a daemon\")"
            )));
        }
        let ps = ENGINE_PAGE as u64;
        let mut patch = serde_json::json!({
            "mem_capacity_bytes": cfg.mem_pages * ps,
            "mode": cfg.mode,
            "eviction_batch_bytes": cfg.batch_pages.max(1) * ps,
        });
        // The SSD store's capacity shows in every pool's entitlements, so a daemon with an SSD store
        // gets the scenario's (0 when the scenario has none, as the in-process engine has none).
        let ssd_configured = host
            .get("stores")
            .and_then(|v| v.as_array())
            .is_some_and(|a| a.iter().any(|st| st["kind"] == "ssd" && st["configured"] == true));
        if ssd_configured {
            patch["ssd_capacity_bytes"] = serde_json::json!(cfg.ssd_pages * ps);
        } else if cfg.ssd_pages > 0 {
            return Err(LabError::Daemon("the scenario uses an SSD store; the daemon has none".into()));
        }
        d.admin("PATCH", "/v1/host", Some(&patch))?;
        Ok(d)
    }

    fn admin(
        &self,
        method: &str,
        path: &str,
        body: Option<&serde_json::Value>,
    ) -> Result<serde_json::Value, LabError> {
        self.api
            .call(method, path, &self.target.host_token, body)
            .map_err(|e| LabError::Daemon(e.to_string()))
    }

    fn client(&mut self, vm: u32) -> Result<&mut Client, LabError> {
        self.clients.get_mut(&vm).ok_or_else(|| LabError::Daemon(format!("VM {vm} is not registered")))
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let vms: Vec<u32> = self.clients.keys().copied().collect();
        self.clients.clear();
        for vm in vms {
            // Best effort: a daemon that went away has nothing left to clean up.
            let _ = self.admin("DELETE", &format!("/v1/vms/{vm}"), None);
        }
    }
}

impl CacheOps for Daemon {
    const REPORTS_TIER: bool = false;
    fn add_vm(&mut self, vm: u32, weights: VmWeights) -> Result<(), LabError> {
        // Tokens are per run (process id) and per VM; the daemon rejects one already in use.
        let data = format!("dd-lab-{}-vm-{vm}-data", std::process::id());
        let body = serde_json::json!({
            "id": vm,
            "weights": weights,
            "data_token": data,
            "admin_token": format!("dd-lab-{}-vm-{vm}-admin", std::process::id()),
        });
        self.admin("POST", "/v1/vms", Some(&body))?;
        let c = match &self.target.data {
            DataAddr::Unix(p) => Client::connect_unix(p, vm, &data),
            DataAddr::Tcp(a) => Client::connect_tcp(a.as_str(), vm, &data),
        };
        match c {
            Ok(c) => {
                self.clients.insert(vm, c);
                Ok(())
            }
            Err(e) => {
                let _ = self.admin("DELETE", &format!("/v1/vms/{vm}"), None);
                Err(err("data-plane connection", e))
            }
        }
    }
    fn set_vm_weights(&mut self, vm: u32, weights: VmWeights) -> Result<(), LabError> {
        self.admin("PUT", &format!("/v1/vms/{vm}/weights"), Some(&serde_json::json!(weights)))?;
        Ok(())
    }
    fn new_pool(&mut self, vm: u32, opts: PoolOptions) -> Result<u32, LabError> {
        Ok(self.client(vm)?.create_cgroup(opts).map_err(|e| err("CREATE_CGROUP", e))?.0)
    }
    fn destroy_pool(&mut self, vm: u32, pool: u32) -> Result<(), LabError> {
        self.client(vm)?.destroy_cgroup(PoolId(pool)).map_err(|e| err("DESTROY_CGROUP", e))
    }
    fn set_spec(&mut self, vm: u32, pool: u32, spec: Spec) -> Result<(), LabError> {
        self.client(vm)?.set_cg_weight(PoolId(pool), spec).map_err(|e| err("SET_CG_WEIGHT", e))
    }
    fn set_capacity(&mut self, store: StoreKind, bytes: u64) -> Result<(), LabError> {
        let field = match store {
            StoreKind::Mem => "mem_capacity_bytes",
            StoreKind::Ssd => "ssd_capacity_bytes",
        };
        self.admin("PATCH", "/v1/host", Some(&serde_json::json!({ field: bytes })))?;
        Ok(())
    }
    fn set_mode(&mut self, mode: Mode) -> Result<(), LabError> {
        self.admin("PATCH", "/v1/host", Some(&serde_json::json!({ "mode": mode })))?;
        Ok(())
    }
    fn put(&mut self, vm: u32, pool: u32, key: Key, page: &[u8]) -> Result<Option<StoreKind>, LabError> {
        Ok(self.client(vm)?.put(PoolId(pool), key, page).map_err(|e| err("PUT", e))?.tier())
    }
    fn get(&mut self, vm: u32, pool: u32, key: Key, out: &mut [u8]) -> Result<Lookup, LabError> {
        let hit = self.client(vm)?.get(PoolId(pool), key, out).map_err(|e| err("GET", e))?;
        Ok(if hit { Lookup::Hit(None) } else { Lookup::Miss })
    }
    fn flush_page(&mut self, vm: u32, pool: u32, key: Key) -> Result<(), LabError> {
        self.client(vm)?.flush_page(PoolId(pool), key).map_err(|e| err("FLUSH_PAGE", e))?;
        Ok(())
    }
    fn flush_object(&mut self, vm: u32, pool: u32, object: u64) -> Result<(), LabError> {
        self.client(vm)?.flush_object(PoolId(pool), object).map_err(|e| err("FLUSH_OBJECT", e))?;
        Ok(())
    }
    fn pool_counters(&mut self, vm: u32, pool: u32) -> Result<Counters, LabError> {
        Ok(self.client(vm)?.pool_stats(PoolId(pool)).map_err(|e| err("POOL_STATS", e))?.counters)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn data_addresses_parse() {
        assert_eq!(DataAddr::parse("unix:/tmp/dd.sock").unwrap(), DataAddr::Unix("/tmp/dd.sock".into()));
        assert_eq!(DataAddr::parse("tcp:127.0.0.1:7411").unwrap(), DataAddr::Tcp("127.0.0.1:7411".into()));
        assert!(DataAddr::parse("/tmp/dd.sock").is_err());
    }
}
