//! The engine's typed errors, with the stable codes every wire carries.
//!
//! Every variant carries a stable numeric code ([`CacheError::code`]) that the data-plane protocol and
//! the admin API put on the wire, so clients can match on codes that never change meaning. Misses and
//! refused ephemeral puts are *not* errors: they are normal outcomes reported in return values.

use crate::types::{PoolId, StoreKind, VmId};

/// Errors returned by the cache engine.
#[derive(Debug, thiserror::Error, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum CacheError {
    /// The VM is not registered with this cache.
    #[error("unknown vm {0}")]
    UnknownVm(VmId),
    /// The pool does not exist *for the calling VM*. A pool of another VM is reported the same way, so a
    /// VM cannot detect another VM's pools.
    #[error("unknown pool {0}")]
    UnknownPool(PoolId),
    /// A VM with this id is already registered.
    #[error("vm {0} already exists")]
    VmExists(VmId),
    /// A page buffer had the wrong length.
    #[error("page buffer is {got} bytes, the cache's page size is {expected}")]
    BadPageSize { expected: usize, got: usize },
    /// A batch was larger than the configured limit.
    #[error("batch of {got} exceeds the limit of {limit}")]
    BatchTooLarge { limit: usize, got: usize },
    /// A configuration value was rejected; names the field.
    #[error("invalid configuration: {field}: {reason}")]
    InvalidConfig { field: String, reason: String },
    /// The requested store is not configured on this host.
    #[error("store {0} is not configured")]
    StoreUnavailable(StoreKind),
    /// Migration between pools of different kinds (ephemeral vs persistent) is not allowed.
    #[error("pools {0} and {1} are of different kinds")]
    PoolKindMismatch(PoolId, PoolId),
    /// An I/O error of the SSD store (opening, growing). Page-level I/O errors surface as misses.
    #[error("store i/o error: {0}")]
    Io(String),
    /// The VM holds as many pools as its quota allows (the quota is the VM's own: it says nothing about
    /// other VMs).
    #[error("too many pools: this VM's quota is {0}")]
    TooManyPools(usize),
    /// The host holds as many pools as it may (all VMs together). No number: it would tell one VM how
    /// many pools the others hold.
    #[error("too many pools: the host's pool limit is reached")]
    HostPoolLimit,
}

impl CacheError {
    /// Stable wire code of this error. Codes are never reused; 0 means success on the wire.
    pub fn code(&self) -> u16 {
        match self {
            CacheError::UnknownVm(_) => 10,
            CacheError::UnknownPool(_) => 11,
            CacheError::VmExists(_) => 12,
            CacheError::BadPageSize { .. } => 13,
            CacheError::BatchTooLarge { .. } => 14,
            CacheError::InvalidConfig { .. } => 15,
            CacheError::StoreUnavailable(_) => 16,
            CacheError::PoolKindMismatch(..) => 17,
            CacheError::Io(_) => 18,
            CacheError::TooManyPools(_) | CacheError::HostPoolLimit => 19,
        }
    }

    /// Short stable name of the error code (used by the admin API's JSON errors).
    pub fn code_name(&self) -> &'static str {
        match self {
            CacheError::UnknownVm(_) => "unknown_vm",
            CacheError::UnknownPool(_) => "unknown_pool",
            CacheError::VmExists(_) => "vm_exists",
            CacheError::BadPageSize { .. } => "bad_page_size",
            CacheError::BatchTooLarge { .. } => "batch_too_large",
            CacheError::InvalidConfig { .. } => "invalid_config",
            CacheError::StoreUnavailable(_) => "store_unavailable",
            CacheError::PoolKindMismatch(..) => "pool_kind_mismatch",
            CacheError::Io(_) => "io_error",
            CacheError::TooManyPools(_) | CacheError::HostPoolLimit => "too_many_pools",
        }
    }

    /// An [`CacheError::InvalidConfig`] naming `field`.
    pub fn invalid(field: impl Into<String>, reason: impl Into<String>) -> Self {
        CacheError::InvalidConfig { field: field.into(), reason: reason.into() }
    }
}
