//! The provisioner's errors: only invalid input (the decision itself cannot fail; a target that cannot
//! be met is a result, reported in the plan, not an error).

/// Errors of [`crate::provision`] and of building its inputs.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum ProvisionError {
    /// An input field is out of its domain; `field` is its path (e.g. `containers[1].target.ops_s`).
    #[error("invalid provisioning input: {field}: {reason}")]
    Invalid { field: String, reason: String },
}

impl ProvisionError {
    pub fn invalid(field: &str, reason: &str) -> ProvisionError {
        ProvisionError::Invalid { field: field.to_string(), reason: reason.to_string() }
    }

    /// Stable name of the error kind (for logs and JSON reports).
    pub fn code_name(&self) -> &'static str {
        match self {
            ProvisionError::Invalid { .. } => "invalid_input",
        }
    }
}
