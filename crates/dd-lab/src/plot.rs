//! Plots and HTML pages of a scenario's results (filled in below).

use crate::error::LabError;
use crate::report::ScenarioResult;
use std::path::Path;

pub fn write_plots_and_report(_res: &ScenarioResult, _dir: &Path) -> Result<(), LabError> {
    Ok(())
}

pub fn write_index(_results: &[(&str, &ScenarioResult)], _dir: &Path) -> Result<(), LabError> {
    Ok(())
}
