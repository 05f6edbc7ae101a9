//! The engine's errors: [`CacheError`] (with its stable wire codes) is `dd-types`' and re-exported
//! here; the SSD store's file layer's [`StoreError`] is the engine's own and folds into
//! [`CacheError::Io`].

pub use dd_types::error::CacheError;

/// Errors of the SSD store's file layer.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    #[error("i/o error on {path}: {source}")]
    Io { path: String, source: std::io::Error },
    #[error("invalid ssd store option {field}: {reason}")]
    InvalidOption { field: &'static str, reason: String },
}

impl From<StoreError> for CacheError {
    fn from(e: StoreError) -> Self {
        CacheError::Io(e.to_string())
    }
}
