//! Stable status codes of the data plane.
//!
//! 0 is success. Codes 10-99 are the engine's (`dd_types::CacheError::code()`, reused unchanged so a
//! client sees the same number the engine defines); 100 and up are the protocol's own. A code is never
//! reused for another meaning; new codes are only ever added. `docs/protocol.md` lists them all.

use dd_types::CacheError;
use std::fmt;

/// A status code as carried in the frame header of a response.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Status(pub u16);

impl Status {
    pub const OK: Status = Status(0);
    pub const BAD_MAGIC: Status = Status(100);
    pub const UNSUPPORTED_VERSION: Status = Status(101);
    pub const UNKNOWN_OP: Status = Status(102);
    pub const MALFORMED: Status = Status(103);
    pub const FRAME_TOO_LARGE: Status = Status(104);
    pub const BATCH_TOO_LARGE: Status = Status(105);
    pub const NOT_AUTHENTICATED: Status = Status(106);
    pub const AUTH_FAILED: Status = Status(107);
    pub const ALREADY_AUTHENTICATED: Status = Status(108);
    pub const BUSY: Status = Status(109);
    pub const SHUTTING_DOWN: Status = Status(110);
    pub const INTERNAL: Status = Status(111);

    /// Every protocol-level code (for documentation tests and metrics).
    pub const PROTOCOL: [Status; 12] = [
        Status::BAD_MAGIC,
        Status::UNSUPPORTED_VERSION,
        Status::UNKNOWN_OP,
        Status::MALFORMED,
        Status::FRAME_TOO_LARGE,
        Status::BATCH_TOO_LARGE,
        Status::NOT_AUTHENTICATED,
        Status::AUTH_FAILED,
        Status::ALREADY_AUTHENTICATED,
        Status::BUSY,
        Status::SHUTTING_DOWN,
        Status::INTERNAL,
    ];

    /// The status of an engine error.
    pub fn from_engine(e: &CacheError) -> Status {
        Status(e.code())
    }

    pub fn is_ok(self) -> bool {
        self.0 == 0
    }

    /// Short stable name of the code (`"ok"`, `"unknown_pool"`, `"auth_failed"`, ...), or
    /// `"unknown_status"` for a code this version does not know.
    pub fn name(self) -> &'static str {
        match self.0 {
            0 => "ok",
            // The engine's codes; a unit test checks these names against CacheError::code_name().
            10 => "unknown_vm",
            11 => "unknown_pool",
            12 => "vm_exists",
            13 => "bad_page_size",
            14 => "batch_too_large",
            15 => "invalid_config",
            16 => "store_unavailable",
            17 => "pool_kind_mismatch",
            18 => "io_error",
            19 => "too_many_pools",
            100 => "bad_magic",
            101 => "unsupported_version",
            102 => "unknown_op",
            103 => "malformed",
            104 => "frame_too_large",
            105 => "proto_batch_too_large",
            106 => "not_authenticated",
            107 => "auth_failed",
            108 => "already_authenticated",
            109 => "busy",
            110 => "shutting_down",
            111 => "internal",
            _ => "unknown_status",
        }
    }
}

impl fmt::Display for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({})", self.name(), self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use dd_types::{PoolId, StoreKind, VmId};

    #[test]
    fn engine_codes_keep_their_engine_names() {
        let all = [
            CacheError::UnknownVm(VmId(1)),
            CacheError::UnknownPool(PoolId(1)),
            CacheError::VmExists(VmId(1)),
            CacheError::BadPageSize { expected: 1, got: 2 },
            CacheError::BatchTooLarge { limit: 1, got: 2 },
            CacheError::InvalidConfig { field: "f".into(), reason: "r".into() },
            CacheError::StoreUnavailable(StoreKind::Ssd),
            CacheError::PoolKindMismatch(PoolId(1), PoolId(2)),
            CacheError::Io("x".into()),
            CacheError::TooManyPools(1),
        ];
        for e in all {
            let s = Status::from_engine(&e);
            assert_eq!(s.name(), e.code_name(), "code {}", s.0);
            assert!(s.0 > 0 && s.0 < 100);
        }
    }

    #[test]
    fn protocol_codes_are_distinct_and_named() {
        let mut seen = std::collections::HashSet::new();
        for s in Status::PROTOCOL {
            assert!(seen.insert(s.0));
            assert_ne!(s.name(), "unknown_status");
            assert!(s.0 >= 100);
        }
        assert_eq!(Status(4242).name(), "unknown_status");
    }
}
