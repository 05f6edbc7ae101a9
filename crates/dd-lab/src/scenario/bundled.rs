//! The scenarios shipped with the binary (`crates/dd-lab/scenarios/*.toml`, embedded at build time),
//! and the small traces they use. Each scenario states in its `description` which figure or table of
//! which paper it reproduces and carries the checks that must pass.

use crate::error::LabError;
use crate::scenario::Scenario;

/// `(name, TOML text)` of every bundled scenario, in the order `lab list` shows them.
pub const SCENARIOS: &[(&str, &str)] = &[
    ("fig3-4-global-share", include_str!("../../scenarios/fig3-4-global-share.toml")),
    ("fig5-table1-split", include_str!("../../scenarios/fig5-table1-split.toml")),
    ("fig9-10-table2-modes", include_str!("../../scenarios/fig9-10-table2-modes.toml")),
    ("fig11-12-table3-policies", include_str!("../../scenarios/fig11-12-table3-policies.toml")),
    ("fig13-dynamic-containers", include_str!("../../scenarios/fig13-dynamic-containers.toml")),
    ("fig14-dynamic-vms", include_str!("../../scenarios/fig14-dynamic-vms.toml")),
    ("thesis4-fig4.2-4.4-soft-limits", include_str!("../../scenarios/thesis4-fig4.2-4.4-soft-limits.toml")),
    ("thesis001-few-exceed", include_str!("../../scenarios/thesis001-few-exceed.toml")),
    ("thesis4-fig4.6-4.7-ratio", include_str!("../../scenarios/thesis4-fig4.6-4.7-ratio.toml")),
    ("thesis4-fig4.8-gold", include_str!("../../scenarios/thesis4-fig4.8-gold.toml")),
    ("thesis4-fig4.9-chunk", include_str!("../../scenarios/thesis4-fig4.9-chunk.toml")),
    ("table4-morai-vs-doubledecker", include_str!("../../scenarios/table4-morai-vs-doubledecker.toml")),
    ("thesis5-fig5.2-5.6-hybrid", include_str!("../../scenarios/thesis5-fig5.2-5.6-hybrid.toml")),
    ("thesis5-fig5.7-table5.2", include_str!("../../scenarios/thesis5-fig5.7-table5.2.toml")),
    ("phases-provisioning", include_str!("../../scenarios/phases-provisioning.toml")),
];

/// Bundled traces by path (`bundled:NAME`).
pub const TRACES: &[(&str, &str)] = &[];

pub fn trace(path: &str) -> Option<&'static str> {
    TRACES.iter().find(|(n, _)| *n == path).map(|(_, t)| *t)
}

/// Parses a bundled scenario by name.
pub fn get(name: &str) -> Result<Scenario, LabError> {
    let (_, text) =
        SCENARIOS.iter().find(|(n, _)| *n == name).ok_or_else(|| LabError::UnknownScenario(name.into()))?;
    Scenario::from_toml(text)
}

#[cfg(test)]
mod tests {
    #[test]
    fn every_bundled_scenario_parses_and_validates() {
        for (name, _) in super::SCENARIOS {
            let s = super::get(name).unwrap_or_else(|e| panic!("{name}: {e}"));
            assert_eq!(&s.name, name);
            assert!(!s.checks.is_empty(), "{name} has no checks");
        }
    }
}
