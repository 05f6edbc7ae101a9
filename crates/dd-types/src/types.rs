//! Identifiers and small value types: the engine's, the wire protocols' and the guest's.
//!
//! Keys follow tmem/cleancache: `(vm, pool, object, index)`. The pool id is allocated by the cache and
//! is globally unique, but every operation also names the calling VM, and a pool that belongs to another
//! VM is indistinguishable from a pool that does not exist.

use serde::{Deserialize, Serialize};
use std::fmt;

/// A virtual machine registered by the host administrator.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(transparent)]
pub struct VmId(pub u32);

/// A pool: one per container (cgroup) of a VM.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(transparent)]
pub struct PoolId(pub u32);

impl fmt::Display for VmId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}
impl fmt::Display for PoolId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// A page key inside a pool: the file (inode) and the page offset in it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Key {
    pub object: u64,
    pub index: u64,
}

impl Key {
    pub const fn new(object: u64, index: u64) -> Self {
        Key { object, index }
    }
}

/// The two storage tiers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum StoreKind {
    Mem,
    Ssd,
}

impl StoreKind {
    pub const ALL: [StoreKind; 2] = [StoreKind::Mem, StoreKind::Ssd];
    pub const fn idx(self) -> usize {
        match self {
            StoreKind::Mem => 0,
            StoreKind::Ssd => 1,
        }
    }
    pub const fn name(self) -> &'static str {
        match self {
            StoreKind::Mem => "mem",
            StoreKind::Ssd => "ssd",
        }
    }
}

impl fmt::Display for StoreKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Ephemeral pools hold clean page-cache pages and may drop any page; persistent pools hold swapped-out
/// anonymous pages and never drop one (a put that does not fit is refused instead).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PoolKind {
    Ephemeral,
    Persistent,
}

/// The container spec `<T, W>` of paper 002: which store(s) the pool uses and its relative weight in each.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(tag = "type", rename_all = "lowercase")]
pub enum Spec {
    /// Memory store only.
    Mem { weight: u32 },
    /// SSD store only.
    Ssd { weight: u32 },
    /// Both: puts go to memory, pages are demoted to SSD above the high watermark and promoted back below
    /// the low watermark (thesis 000, section 5.3).
    Hybrid { mem_weight: u32, ssd_weight: u32 },
    /// No second-chance caching: puts are refused, gets miss.
    None,
}

impl<'de> Deserialize<'de> for Spec {
    /// The tagged object form, with no field beyond its type's (issue 12: serde's internally tagged
    /// unit variant ignored `deny_unknown_fields`, so `{"type": "none", "weight": 5}` was accepted).
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Spec, D::Error> {
        #[derive(Deserialize)]
        #[serde(tag = "type", rename_all = "lowercase", deny_unknown_fields)]
        enum Tagged {
            Mem { weight: u32 },
            Ssd { weight: u32 },
            Hybrid { mem_weight: u32, ssd_weight: u32 },
            None {},
        }
        Ok(match Tagged::deserialize(d)? {
            Tagged::Mem { weight } => Spec::Mem { weight },
            Tagged::Ssd { weight } => Spec::Ssd { weight },
            Tagged::Hybrid { mem_weight, ssd_weight } => Spec::Hybrid { mem_weight, ssd_weight },
            Tagged::None {} => Spec::None,
        })
    }
}

impl Spec {
    /// The weight of this spec in `store`, 0 if the spec does not use the store.
    pub fn weight(&self, store: StoreKind) -> u32 {
        match (*self, store) {
            (Spec::Mem { weight }, StoreKind::Mem) => weight,
            (Spec::Ssd { weight }, StoreKind::Ssd) => weight,
            (Spec::Hybrid { mem_weight, .. }, StoreKind::Mem) => mem_weight,
            (Spec::Hybrid { ssd_weight, .. }, StoreKind::Ssd) => ssd_weight,
            _ => 0,
        }
    }
    /// Whether the spec places pages in `store` at all.
    pub fn uses(&self, store: StoreKind) -> bool {
        matches!(
            (*self, store),
            (Spec::Mem { .. }, StoreKind::Mem)
                | (Spec::Ssd { .. }, StoreKind::Ssd)
                | (Spec::Hybrid { .. }, _)
        )
    }
    pub fn is_hybrid(&self) -> bool {
        matches!(self, Spec::Hybrid { .. })
    }
}

/// Per-store weights of a VM, set by the host administrator.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct VmWeights {
    pub mem: u32,
    pub ssd: u32,
}

impl<'de> Deserialize<'de> for VmWeights {
    /// An object only (issue 12: the derived impl also took a sequence, `[mem, ssd]`, which the
    /// admin API's schema does not allow).
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<VmWeights, D::Error> {
        #[derive(Deserialize)]
        struct Fields {
            mem: u32,
            ssd: u32,
        }
        struct ObjectOnly;
        impl<'de> serde::de::Visitor<'de> for ObjectOnly {
            type Value = VmWeights;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("an object {\"mem\": weight, \"ssd\": weight}")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(self, m: A) -> Result<VmWeights, A::Error> {
                let f = Fields::deserialize(serde::de::value::MapAccessDeserializer::new(m))?;
                Ok(VmWeights { mem: f.mem, ssd: f.ssd })
            }
        }
        d.deserialize_map(ObjectOnly)
    }
}

impl VmWeights {
    pub const fn equal(w: u32) -> Self {
        VmWeights { mem: w, ssd: w }
    }
    pub fn get(&self, store: StoreKind) -> u32 {
        match store {
            StoreKind::Mem => self.mem,
            StoreKind::Ssd => self.ssd,
        }
    }
}

/// The order in which a pool gives up pages when it is the eviction victim.
///
/// The discriminants are the wire codes (the data plane's CREATE_POOL byte, `docs/protocol.md`) and
/// [`EvictionOrder::ALL`] lists every order by its code: this declaration and that list are the one
/// table a new order is added to; the protocol, the fuzz targets' typed inputs and the tests read it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
#[repr(u8)]
pub enum EvictionOrder {
    /// Insertion order (the paper's policy; equivalent to LRU for an exclusive cache).
    #[default]
    Fifo = 0,
    /// Least recently used: a replacing put or a non-exclusive hit refreshes the page.
    Lru = 1,
    /// Second-chance FIFO with a reference bit.
    Clock = 2,
    /// S3-FIFO (small probationary FIFO, main FIFO, ghost queue).
    S3Fifo = 3,
}

impl EvictionOrder {
    /// Every order, at the index of its wire code (codes are dense from 0; a unit test checks it).
    pub const ALL: [EvictionOrder; 4] =
        [EvictionOrder::Fifo, EvictionOrder::Lru, EvictionOrder::Clock, EvictionOrder::S3Fifo];

    /// The order's wire code. Codes are never reused for another order.
    pub const fn wire_code(self) -> u8 {
        self as u8
    }

    /// The order of a wire code, `None` for a code this version does not know.
    pub fn from_wire_code(code: u8) -> Option<EvictionOrder> {
        EvictionOrder::ALL.get(usize::from(code)).copied()
    }
}

/// Partitioned (DoubleDecker) or global (one FIFO over all pools, the papers' baseline).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    #[default]
    Partitioned,
    Global,
}

/// Options of a new pool.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct PoolOptions {
    pub kind: PoolKind,
    pub spec: Spec,
    pub order: EvictionOrder,
    /// Exclusive gets remove the page on a hit (cleancache semantics). Always true for ephemeral pools
    /// unless the operator asks for an inclusive second-chance cache; persistent pools keep pages on get.
    pub exclusive_gets: bool,
    /// Shards of the pool's index and queues (`pool.rs`): a power of two up to 256, or 0 (the default)
    /// for the engine's `pool_shards`. Not carried by the wire protocol (a daemon's pools take its
    /// configuration's count).
    #[serde(default)]
    pub shards: u32,
}

impl PoolOptions {
    pub fn ephemeral(spec: Spec) -> Self {
        PoolOptions {
            kind: PoolKind::Ephemeral,
            spec,
            order: EvictionOrder::Fifo,
            exclusive_gets: true,
            shards: 0,
        }
    }
    pub fn persistent(spec: Spec) -> Self {
        PoolOptions {
            kind: PoolKind::Persistent,
            spec,
            order: EvictionOrder::Fifo,
            exclusive_gets: false,
            shards: 0,
        }
    }
    pub fn with_order(mut self, order: EvictionOrder) -> Self {
        self.order = order;
        self
    }
    pub fn with_shards(mut self, shards: u32) -> Self {
        self.shards = shards;
        self
    }
}

/// Outcome of a put. A refused ephemeral put is not an error.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PutOutcome {
    Stored(StoreKind),
    Refused,
}

impl PutOutcome {
    pub fn is_stored(&self) -> bool {
        matches!(self, PutOutcome::Stored(_))
    }

    /// The store that took the page, `None` when the put was refused.
    pub fn tier(&self) -> Option<StoreKind> {
        match self {
            PutOutcome::Stored(s) => Some(*s),
            PutOutcome::Refused => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The wire table is dense, every code maps back to its order, and `ALL` holds every variant: the
    /// exhaustive match below stops compiling when an order is added, pointing here, to `ALL`.
    #[test]
    fn eviction_order_wire_table_is_complete_and_dense() {
        fn position(o: EvictionOrder) -> usize {
            match o {
                EvictionOrder::Fifo => 0,
                EvictionOrder::Lru => 1,
                EvictionOrder::Clock => 2,
                EvictionOrder::S3Fifo => 3,
            }
        }
        for (i, o) in EvictionOrder::ALL.into_iter().enumerate() {
            assert_eq!(position(o), i, "{o:?}");
            assert_eq!(usize::from(o.wire_code()), i, "{o:?}");
            assert_eq!(EvictionOrder::from_wire_code(o.wire_code()), Some(o));
        }
        assert_eq!(EvictionOrder::from_wire_code(EvictionOrder::ALL.len() as u8), None);
        assert_eq!(EvictionOrder::from_wire_code(u8::MAX), None);
    }

    /// The JSON names are the ones the admin API and the configuration files have always used.
    #[test]
    fn eviction_order_names_are_kebab_case() {
        let names: Vec<String> =
            EvictionOrder::ALL.iter().map(|o| serde_json::to_string(o).unwrap()).collect();
        assert_eq!(names, ["\"fifo\"", "\"lru\"", "\"clock\"", "\"s3-fifo\""]);
    }
}
