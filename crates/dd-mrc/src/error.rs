//! The crate's error type: only configuration can be wrong (feeding references never fails).

use thiserror::Error;

#[derive(Debug, Error, Clone, PartialEq)]
#[non_exhaustive]
pub enum MrcError {
    /// A parameter out of its range; `field` names it as in [`crate::MrcConfig`].
    #[error("`{field}`: {message}")]
    Invalid { field: &'static str, message: String },
}

impl MrcError {
    pub(crate) fn invalid(field: &'static str, message: impl Into<String>) -> MrcError {
        MrcError::Invalid { field, message: message.into() }
    }

    /// A stable name for scripts and APIs.
    pub fn code_name(&self) -> &'static str {
        match self {
            MrcError::Invalid { .. } => "invalid",
        }
    }
}
