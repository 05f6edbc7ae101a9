//! The lab's error type. Library code returns `LabError`; the binary wraps it with `anyhow` context.

use thiserror::Error;

#[derive(Debug, Error)]
#[non_exhaustive]
pub enum LabError {
    /// The scenario text is not valid TOML or does not match the format.
    #[error("scenario: {0}")]
    Parse(String),
    /// A field has a value the lab cannot run; `field` is its path in the scenario.
    #[error("scenario field `{field}`: {message}")]
    Invalid { field: String, message: String },
    /// No bundled scenario has this name and no file has this path.
    #[error("no bundled scenario or file named `{0}`")]
    UnknownScenario(String),
    /// The cache returned a page whose stamp does not match the key and version the guest expects.
    #[error("coherency violation: {0}")]
    Coherency(String),
    #[error("cache engine: {0}")]
    Engine(#[from] dd_engine::CacheError),
    #[error("trace {path}: {message}")]
    Trace { path: String, message: String },
    #[error("i/o on {path}: {source}")]
    Io { path: String, source: std::io::Error },
    #[error("plot: {0}")]
    Plot(String),
    /// A call to a running daemon (admin API or data plane) failed.
    #[error("daemon: {0}")]
    Daemon(String),
    /// The run's estimated peak memory does not fit the memory available above the lab's margin
    /// (`budget`); the message names both and the options.
    #[error("{message}")]
    NotEnoughMemory { needed_bytes: u64, available_bytes: u64, message: String },
}

impl LabError {
    pub fn invalid(field: &str, message: impl Into<String>) -> LabError {
        LabError::Invalid { field: field.to_string(), message: message.into() }
    }
    pub fn io(path: impl AsRef<std::path::Path>, source: std::io::Error) -> LabError {
        LabError::Io { path: path.as_ref().display().to_string(), source }
    }
}
