//! The results layer: what a scenario's runs mean and what is written about them. Reads the runs
//! (`crate::sim::RunResult`) and the scenario (`crate::scenario`); nothing below it imports it.
//!
//! Owns [`ScenarioResult`] (the runs, checks and searches of one scenario), [`search`] (searches
//! collapsed to their best candidate; the checks themselves are `crate::scenario::checks`), [`report`]
//! (`summary.json`, `timeseries.csv`) and [`plot`] (PNGs, `report.html`, the index page).
//!
//! Everything written here is a function of the runs' emulated results only: no wall-clock time, no
//! host name, no map with random iteration order, so the same scenario and seed give byte-identical
//! `summary.json` and `timeseries.csv`. Timing fields (wall seconds, accesses per second) are printed by
//! the command line and never written into these two files.

pub mod plot;
pub mod report;
pub mod search;

pub use crate::scenario::checks::CheckResult;

use crate::scenario::Scenario;
use crate::sim::RunResult;

/// A scenario's runs (one per variant) and its checks.
#[derive(Debug, Clone)]
pub struct ScenarioResult {
    /// The scenario as run (scaled).
    pub scenario: Scenario,
    /// The scale factor that was applied.
    pub scale: f64,
    pub runs: Vec<RunResult>,
    pub checks: Vec<CheckResult>,
    /// Searching variants: every candidate tried and the one in `runs` under the variant's name.
    pub searches: Vec<search::SearchResult>,
}

impl ScenarioResult {
    pub fn all_passed(&self) -> bool {
        self.checks.iter().all(|c| c.passed)
    }
    pub fn accesses(&self) -> u64 {
        self.runs.iter().map(|r| r.accesses).sum()
    }
}
