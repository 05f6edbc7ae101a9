//! Identifiers and small value types: the engine's, the wire protocols' and the guest's.
//!
//! Keys follow tmem/cleancache: `(vm, pool, object, index)`. The pool id is allocated by the cache and
//! is globally unique, but every operation also names the calling VM, and a pool that belongs to another
//! VM is indistinguishable from a pool that does not exist.

pub use crate::order::EvictionOrder;
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
