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

/// How keys are sampled.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Sampling {
    /// A fixed fraction of the keys, in `(0, 1]`.
    Rate(f64),
    /// At most this many keys tracked; the rate falls as the trace's keys are seen.
    MaxSamples(usize),
}

impl Default for Sampling {
    /// `Rate(0.01)`, the SHARDS paper's standard rate.
    fn default() -> Self {
        Sampling::Rate(0.01)
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

/// A model as plain data. Defaults: SHARDS of LRU at `R = 0.01`, in pages, the default seed.
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
