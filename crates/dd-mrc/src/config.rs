//! [`MrcConfig`]: a model described as plain data (scenario files, command lines), and its builder.

use crate::minisim::MiniSim;
use crate::{ExactLru, Mrc, MrcError, Shards, Unit, DEFAULT_SEED};
use serde::{Deserialize, Serialize};

/// How a curve is computed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum Method {
    /// Every reference, exact (LRU only).
    Exact,
    /// SHARDS, sampled (LRU only).
    #[default]
    Shards,
    /// Miniature simulation, sampled (any policy).
    MiniSim,
}

/// The eviction policy whose curve is wanted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum Policy {
    #[default]
    Lru,
    /// Insertion order; hits change nothing (the engine's per-pool order, the paper's).
    Fifo,
    /// S3-FIFO as the engine runs it (see `sim.rs`).
    S3Fifo,
}

impl Policy {
    /// The engine's eviction order this policy simulates (`sim.rs` runs the order's own code).
    pub fn eviction_order(self) -> dd_types::EvictionOrder {
        match self {
            Policy::Lru => dd_types::EvictionOrder::Lru,
            Policy::Fifo => dd_types::EvictionOrder::Fifo,
            Policy::S3Fifo => dd_types::EvictionOrder::S3Fifo,
        }
    }
}

/// How keys are sampled.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Sampling {
    /// A fixed fraction of the keys, in `(0, 1]`.
    Rate(f64),
    /// At most this many keys tracked; the rate falls as the trace's keys are seen.
    MaxSamples(usize),
}

/// The keys the default sampling tracks: [`Sampling::default`] is `MaxSamples(DEFAULT_MAX_SAMPLES)`.
///
/// The smallest power of two whose SHARDS curve stays within a mean absolute error of 0.01 of the exact
/// LRU curve for every sampling seed tried (60 seeds on each of the accuracy tests' uniform, zipf,
/// scan-plus-hot and zipf-with-periodic-scans traces: at most 0.0078); 8,192 exceeds 0.01 for 2 or 3 of
/// 20 seeds on three of them, `R = 0.01` for 3 to 11 of 20 on all four (BENCHMARKS.md, "Miss-ratio
/// curves"). A model's key map and heap take about 2 MiB at this bound.
pub const DEFAULT_MAX_SAMPLES: usize = 32_768;

impl Default for Sampling {
    /// Fixed-size sampling of [`DEFAULT_MAX_SAMPLES`] keys (the SHARDS paper's fixed-size variant):
    /// bounded memory, and the sample holds that many keys whatever the trace's footprint (a fixed
    /// rate samples few keys of a small footprint, and its error grows as the sample shrinks); a
    /// footprint below the bound is tracked whole, so its curve is exact.
    fn default() -> Self {
        Sampling::MaxSamples(DEFAULT_MAX_SAMPLES)
    }
}

impl Sampling {
    pub fn validate(&self) -> Result<(), MrcError> {
        match *self {
            Sampling::Rate(r) if !(r > 0.0 && r <= 1.0) => {
                Err(MrcError::invalid("sampling.rate", format!("{r} is not in (0, 1]")))
            }
            Sampling::MaxSamples(0) => Err(MrcError::invalid("sampling.max_samples", "must be at least 1")),
            _ => Ok(()),
        }
    }
}

fn default_seed() -> u64 {
    DEFAULT_SEED
}

/// A model as plain data. Defaults: SHARDS of LRU with fixed-size sampling of [`DEFAULT_MAX_SAMPLES`]
/// keys, in pages, the default seed.
///
/// In TOML: `method = "minisim"`, `policy = "s3fifo"`, `sampling = { max_samples = 8192 }`,
/// `unit = "bytes"`, `sizes = [1024, 2048]`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MrcConfig {
    #[serde(default)]
    pub method: Method,
    #[serde(default)]
    pub policy: Policy,
    /// Ignored by `exact`.
    #[serde(default)]
    pub sampling: Sampling,
    #[serde(default)]
    pub unit: Unit,
    #[serde(default = "default_seed")]
    pub seed: u64,
    /// The sizes miniature simulation simulates (in `unit`); required by `minisim`, ignored otherwise.
    #[serde(default)]
    pub sizes: Vec<u64>,
}

impl Default for MrcConfig {
    fn default() -> Self {
        MrcConfig {
            method: Method::default(),
            policy: Policy::default(),
            sampling: Sampling::default(),
            unit: Unit::default(),
            seed: DEFAULT_SEED,
            sizes: Vec::new(),
        }
    }
}

impl MrcConfig {
    /// Checks the combination; the error names the bad field.
    pub fn validate(&self) -> Result<(), MrcError> {
        match self.method {
            Method::Exact | Method::Shards if self.policy != Policy::Lru => Err(MrcError::invalid(
                "policy",
                "exact and shards compute LRU curves; use method minisim for fifo and s3fifo",
            )),
            Method::Exact => Ok(()),
            Method::Shards => self.sampling.validate(),
            Method::MiniSim => {
                self.sampling.validate()?;
                if !self.sizes.iter().any(|&s| s > 0) {
                    return Err(MrcError::invalid("sizes", "minisim needs the sizes to simulate"));
                }
                Ok(())
            }
        }
    }

    /// Builds the model.
    pub fn build(&self) -> Result<Box<dyn Mrc>, MrcError> {
        self.validate()?;
        Ok(match (self.method, self.sampling) {
            (Method::Exact, _) => Box::new(ExactLru::new(self.unit)),
            (Method::Shards, Sampling::Rate(r)) => {
                Box::new(Shards::fixed_rate_seeded(r, self.unit, self.seed)?)
            }
            (Method::Shards, Sampling::MaxSamples(n)) => {
                Box::new(Shards::fixed_size_seeded(n, self.unit, self.seed)?)
            }
            (Method::MiniSim, s) => {
                Box::new(MiniSim::seeded(self.policy, &self.sizes, s, self.unit, self.seed)?)
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn toml_round_trip_and_defaults() {
        let c: MrcConfig = toml::from_str(
            "method = \"minisim\"\npolicy = \"s3fifo\"\nsampling = { max_samples = 8192 }\nsizes = [10, 20]",
        )
        .unwrap();
        assert_eq!(c.method, Method::MiniSim);
        assert_eq!(c.policy, Policy::S3Fifo);
        assert_eq!(c.sampling, Sampling::MaxSamples(8192));
        assert_eq!(c.unit, Unit::Pages);
        assert!(c.build().is_ok());
        let d: MrcConfig = toml::from_str("").unwrap();
        assert_eq!(d, MrcConfig::default());
        assert_eq!(d.method, Method::Shards);
        assert_eq!(d.sampling, Sampling::MaxSamples(DEFAULT_MAX_SAMPLES));
        let r: MrcConfig = toml::from_str("sampling = { rate = 0.01 }").unwrap();
        assert_eq!(r.sampling, Sampling::Rate(0.01));
        assert!(toml::from_str::<MrcConfig>("rate = 1").is_err());
    }

    #[test]
    fn validate_names_the_field() {
        let bad = MrcConfig { policy: Policy::Fifo, ..MrcConfig::default() };
        assert!(matches!(bad.validate(), Err(MrcError::Invalid { field: "policy", .. })));
        let bad = MrcConfig { sampling: Sampling::Rate(2.0), ..MrcConfig::default() };
        assert!(matches!(bad.validate(), Err(MrcError::Invalid { field: "sampling.rate", .. })));
        let bad = MrcConfig { method: Method::MiniSim, ..MrcConfig::default() };
        assert!(matches!(bad.validate(), Err(MrcError::Invalid { field: "sizes", .. })));
    }
}
