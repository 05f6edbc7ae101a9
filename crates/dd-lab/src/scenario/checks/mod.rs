//! The checks a scenario carries: one kind per module, each its settings (plain serde data) and its
//! [`CheckSpec`] (validate, scale, evaluate on a run's record), and the one table of kinds below
//! (`check_kinds!`), which writes [`CheckKind`] and its dispatch. A new kind is its own module plus one
//! line of the table (D38). [`measure`] holds what several kinds read: a metric of a container, VM or
//! pool over a variant's window, and the text of thresholds.
//!
//! Evaluation reads only the run's record (`crate::record`) and the scaled scenario, so a kind lives in
//! this layer beside its settings; `crate::results` calls [`evaluate`] and writes what it returns.

mod coherent;
mod entitlement;
mod exceed_gap;
pub mod measure;
mod mem_ratio;
mod protected;
mod ratio;
mod reclaim_mode;
mod spread;
pub mod targets;
mod value;
pub mod violation;

pub use coherent::CoherentCheck;
pub use entitlement::EntitlementCheck;
pub use exceed_gap::ExceedGapCheck;
pub use measure::{measure, Measure, Metric};
pub use mem_ratio::{MemRatioCheck, Stat};
pub use protected::ProtectedCheck;
pub use ratio::RatioCheck;
pub use reclaim_mode::ReclaimModeCheck;
pub use spread::SpreadCheck;
pub use targets::{Expect, TargetsCheck};
pub use value::ValueCheck;
pub use violation::ViolationCheck;

use super::Scenario;
use crate::error::LabError;
use crate::record::RunResult;
use serde::{Deserialize, Serialize};
use std::collections::HashSet;

/// What every check kind does.
pub trait CheckSpec {
    /// Checks that the names it refers to exist and its bounds make sense; `p` is its path in the
    /// scenario (`checks[3]`), which the error extends with the bad field.
    fn validate(&self, p: &str, names: &Names) -> Result<(), LabError>;
    /// Applies the scenario's `scale` to its windows and to bounds on sizes (not to rates or ratios).
    fn scale(&mut self, k: f64);
    /// Whether it passes on the runs, with what was measured as text; `Err` when it cannot be
    /// evaluated (a variant or container missing from the runs), which fails the check.
    fn evaluate(&self, sc: &Scenario, runs: &[RunResult]) -> Result<(bool, String), String>;
}

/// The names a check may refer to, for [`CheckSpec::validate`].
pub struct Names<'a> {
    pub containers: &'a HashSet<String>,
    pub vms: &'a HashSet<String>,
    pub variants: &'a HashSet<String>,
    /// Containers with a target.
    pub targeted: &'a HashSet<String>,
}

impl Names<'_> {
    /// A container or a VM.
    pub fn entity_ok(&self, e: &str) -> bool {
        self.containers.contains(e) || self.vms.contains(e)
    }

    /// A variant of the scenario, or none (the first).
    pub fn variant_ok(&self, v: &Option<String>) -> bool {
        v.as_ref().is_none_or(|v| self.variants.contains(v))
    }

    /// [`Self::variant_ok`], or the error naming `{p}.variant`.
    pub fn variant(&self, v: &Option<String>, p: &str) -> Result<(), LabError> {
        if self.variant_ok(v) {
            Ok(())
        } else {
            Err(LabError::invalid(&format!("{p}.variant"), "no such variant"))
        }
    }

    pub fn measure(&self, m: &Measure, p: &str) -> Result<(), LabError> {
        if !self.entity_ok(&m.entity) {
            return Err(LabError::invalid(&format!("{p}.entity"), "no such container or VM"));
        }
        self.variant(&m.variant, p)
    }
}

/// The table of check kinds: each line a variant of [`CheckKind`] (its `kind` in TOML is the name in
/// snake case) and the type that implements it.
macro_rules! check_kinds {
    ($($(#[$doc:meta])* $variant:ident($ty:ty),)*) => {
        #[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
        #[serde(tag = "kind", rename_all = "snake_case")]
        pub enum CheckKind {
            $($(#[$doc])* $variant($ty),)*
        }

        impl CheckKind {
            pub fn spec(&self) -> &dyn CheckSpec {
                match self {
                    $(CheckKind::$variant(c) => c,)*
                }
            }

            pub fn spec_mut(&mut self) -> &mut dyn CheckSpec {
                match self {
                    $(CheckKind::$variant(c) => c,)*
                }
            }
        }
    };
}

check_kinds! {
    /// `lhs / rhs` is at least `min` (and at most `max` if given).
    Ratio(RatioCheck),
    /// `lhs` is at least `min` (and at most `max`).
    Value(ValueCheck),
    /// The largest over the smallest of one measure across variants is at most `max_ratio`.
    Spread(SpreadCheck),
    /// Each entity's use of a store against its entitlement.
    Entitlement(EntitlementCheck),
    /// The run verified every second-chance hit's content and never saw stale data (always checked).
    Coherent(CoherentCheck),
    /// Memory usage ratio of two containers against a target, per sample (the memory controller).
    MemRatio(MemRatioCheck),
    /// Gap between two containers' exceeds over their soft limits, per sample.
    ExceedGap(ExceedGapCheck),
    /// Share of VM-wide reclaim that was directed rather than LRU.
    ReclaimMode(ReclaimModeCheck),
    /// A container keeps its memory while others can still give.
    Protected(ProtectedCheck),
    /// Containers meet (or miss) their targets over a window.
    Targets(TargetsCheck),
    /// A variant spends at most a fraction of a baseline's time below its targets.
    Violation(ViolationCheck),
}

/// A named check. (Unknown fields are rejected by each kind's type; serde cannot combine
/// `deny_unknown_fields` with `flatten` on this struct itself.)
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Check {
    pub name: String,
    #[serde(flatten)]
    pub kind: CheckKind,
}

/// A check's outcome as reported.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CheckResult {
    pub name: String,
    pub passed: bool,
    pub detail: String,
}

/// Evaluates the scenario's checks (plus the implicit coherency check) on its runs.
pub fn evaluate(sc: &Scenario, runs: &[RunResult]) -> Vec<CheckResult> {
    let mut out: Vec<CheckResult> = sc
        .checks
        .iter()
        .map(|c| match c.kind.spec().evaluate(sc, runs) {
            Ok((passed, detail)) => CheckResult { name: c.name.clone(), passed, detail },
            Err(e) => CheckResult {
                name: c.name.clone(),
                passed: false,
                detail: format!("could not evaluate: {e}"),
            },
        })
        .collect();
    if !sc.checks.iter().any(|c| matches!(c.kind, CheckKind::Coherent(_))) {
        // Every run verifies every hit; a stale page aborts it, so reaching here means none was seen.
        let verified: u64 = runs.iter().map(|r| r.verified_hits).sum();
        out.push(CheckResult {
            name: "coherency: every second-chance hit verified".into(),
            passed: true,
            detail: if verified == 0 {
                // Passing on nothing would read as proof; say that there was nothing to verify.
                "0 hits verified: no second-chance hit happened, so there was nothing to check (and no stale page)"
                    .into()
            } else {
                format!("{verified} hits verified against the expected (object, index, version)")
            },
        });
    }
    out
}
