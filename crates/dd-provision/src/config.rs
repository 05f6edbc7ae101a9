//! The provisioner's settings as plain data (serde, documented defaults, one `validate()` naming the
//! bad field): [`ProvisionConfig`], the decision's (`[vms.provision.decision]` in a scenario,
//! `[decision]` of `guest provision`), and [`FeedbackConfig`], the closed loop's within it. A module of
//! its own so that the programme (`plan`) and the closed loop (`feedback`) both read them without
//! importing each other.

use crate::error::ProvisionError;
use serde::{Deserialize, Serialize};

/// What the plan maximises once targets are met.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Objective {
    /// Total operations per second (the papers' "aggregate throughput").
    #[default]
    Throughput,
    /// Total file pages per second served from memory or the cache.
    Hits,
}

impl Objective {
    /// What a container contributes to the objective with prediction `p`.
    pub(crate) fn of(self, input: &crate::model::ContainerInput, p: &crate::model::Prediction) -> f64 {
        match self {
            Objective::Throughput => p.ops_s,
            Objective::Hits => p.ops_s * input.demand.file_reads_per_op * p.hit_ratio,
        }
    }
}

fn d_steps() -> u32 {
    48
}
fn d_headroom() -> f64 {
    0.1
}
fn d_rounds() -> u32 {
    3
}
fn d_hysteresis() -> f64 {
    0.02
}
fn d_file_share() -> f64 {
    1.0 / 9.0
}

/// Settings of the decision (plain data, documented defaults).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProvisionConfig {
    /// Units each resource is cut into. Default 48.
    #[serde(default = "d_steps")]
    pub steps: u32,
    /// Targets are planned this much better than asked (0.1: 10%), against model error. Default 0.1.
    #[serde(default = "d_headroom")]
    pub headroom: f64,
    #[serde(default)]
    pub objective: Objective,
    /// Alternations of the memory/memory-cache and SSD programmes. Default 3.
    #[serde(default = "d_rounds")]
    pub rounds: u32,
    /// A current allocation within this fraction of the best objective (and as good on targets) is
    /// kept. Default 0.02.
    #[serde(default = "d_hysteresis")]
    pub hysteresis: f64,
    /// Least share of a container's memory the guest's reclaim leaves to file pages when the container
    /// reads files. Default 1/9: Linux reclaims anonymous pages once the file pages are under an eighth
    /// of them (the lab's guest does the same).
    #[serde(default = "d_file_share")]
    pub min_file_share: f64,
    /// The closed loop's settings ([`crate::feedback`]); [`provision`] alone does not use them.
    #[serde(default)]
    pub feedback: FeedbackConfig,
}

impl Default for ProvisionConfig {
    fn default() -> Self {
        ProvisionConfig {
            steps: d_steps(),
            headroom: d_headroom(),
            objective: Objective::default(),
            rounds: d_rounds(),
            hysteresis: d_hysteresis(),
            min_file_share: d_file_share(),
            feedback: FeedbackConfig::default(),
        }
    }
}

impl ProvisionConfig {
    pub fn validate(&self) -> Result<(), ProvisionError> {
        if !(2..=256).contains(&self.steps) {
            return Err(ProvisionError::invalid("steps", "must be in 2..=256"));
        }
        if !(self.headroom.is_finite() && (0.0..=10.0).contains(&self.headroom)) {
            return Err(ProvisionError::invalid("headroom", "must be in [0, 10]"));
        }
        if !(1..=20).contains(&self.rounds) {
            return Err(ProvisionError::invalid("rounds", "must be in 1..=20"));
        }
        if !(self.hysteresis.is_finite() && (0.0..1.0).contains(&self.hysteresis)) {
            return Err(ProvisionError::invalid("hysteresis", "must be in [0, 1)"));
        }
        if !(0.0..1.0).contains(&self.min_file_share) {
            return Err(ProvisionError::invalid("min_file_share", "must be in [0, 1)"));
        }
        self.feedback.validate()
    }
}

fn d_smoothing() -> f64 {
    0.5
}
fn d_min_gain() -> f64 {
    0.05
}
fn d_max_step() -> u32 {
    8
}
fn d_report_after() -> u32 {
    2
}
fn d_max_correction() -> f64 {
    10.0
}
fn d_failed() -> u32 {
    3
}
fn d_rest() -> u32 {
    6
}
fn d_points() -> u32 {
    64
}
fn d_min_memory_units() -> u32 {
    1
}
fn d_explore_units() -> u32 {
    2
}
fn d_max_age() -> u32 {
    20
}
fn d_settle() -> u32 {
    4
}
fn d_seek() -> f64 {
    3.0
}
fn d_fill() -> u32 {
    30
}
fn d_first_pass_share() -> f64 {
    0.3
}
fn d_first_pass_drop() -> f64 {
    0.2
}

/// Settings of the closed loop (`[decision.feedback]`; plain data, documented defaults).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FeedbackConfig {
    /// Weight of the newest interval in a measured allocation's average. Default 0.5.
    #[serde(default = "d_smoothing")]
    pub smoothing: f64,
    /// Relative gain in the objective a new plan must be predicted to bring over the anchor's
    /// measurement (measurement noise is below it). Default 0.05.
    #[serde(default = "d_min_gain")]
    pub min_gain: f64,
    /// Units (of the plan's `steps`) a decision may move a container in each resource. Default 8.
    #[serde(default = "d_max_step")]
    pub max_step_units: u32,
    /// Intervals in a row a target is measured missed before it is reported. Default 2.
    #[serde(default = "d_report_after")]
    pub report_after: u32,
    /// The model's correction stays within `[1/max_correction, max_correction]`. Default 10.
    #[serde(default = "d_max_correction")]
    pub max_correction: f64,
    /// Plans measured worse than the anchor, in a row, before the loop rests on it. Default 3.
    #[serde(default = "d_failed")]
    pub max_failed_explorations: u32,
    /// Decisions the loop then keeps the anchor without exploring. Default 6.
    #[serde(default = "d_rest")]
    pub rest_intervals: u32,
    /// Measured allocations kept per container, and joint ones (the oldest go first). Default 64.
    #[serde(default = "d_points")]
    pub max_points: u32,
    /// Memory every container keeps, in units of the plan's `steps` (a container left one page
    /// thrashes). Default 1.
    #[serde(default = "d_min_memory_units")]
    pub min_memory_units: u32,
    /// Units of one resource an exploration moves between two containers. Default 2.
    #[serde(default = "d_explore_units")]
    pub explore_units: u32,
    /// Decisions after which a measured allocation not measured again is forgotten: what a container
    /// did long ago says little once its working set has moved (phases). Default 20.
    #[serde(default = "d_max_age")]
    pub max_age_intervals: u32,
    /// Most intervals after a change whose measurements are discarded while the plan stays (caches
    /// fill, pages come back from the disk): it stays until every container's throughput moves by at
    /// most `min_gain` from one interval to the next, or this many intervals passed. Default 4.
    #[serde(default = "d_settle")]
    pub max_settle_intervals: u32,
    /// Most a step towards a missed throughput target multiplies the container's share of a resource
    /// by (`crate::shortfall`: sized by how far below its target it measured); 1 turns such steps off.
    /// Default 3.
    #[serde(default = "d_seek")]
    pub seek_max_factor: f64,
    /// Most decisions in a row a container filling the memory limits gave it keeps that memory as a
    /// floor, its measurements not recorded (what it holds in memory and cache grows, its throughput
    /// does not fall and it still misses: pages still coming in from the disk, so what it measures is
    /// not yet what its allocation gives). 0 turns the floor off. Default 30.
    #[serde(default = "d_fill")]
    pub max_fill_intervals: u32,
    /// A container is ending its first pass over its data when its first references (its file curve's
    /// miss ratio at its largest size, times its file reads per operation and its cost of a disk read)
    /// take more than this share of its measured time per operation and that ratio fell by more than
    /// `first_pass_floor_drop` of itself since the last decision: what it measures is its first pass,
    /// not what its allocation gives. Its measurement is then not recorded, no plan takes the memory it
    /// was given, its target is not judged infeasible, and no joint allocation is recorded as measured.
    /// 1 turns it off. Default 0.3.
    #[serde(default = "d_first_pass_share")]
    pub first_pass_time_share: f64,
    /// See `first_pass_time_share`: a container whose share of first references holds steady (one that
    /// keeps reading new data) is not ending a first pass, whatever they cost. Default 0.2.
    #[serde(default = "d_first_pass_drop")]
    pub first_pass_floor_drop: f64,
}

impl Default for FeedbackConfig {
    fn default() -> Self {
        FeedbackConfig {
            smoothing: d_smoothing(),
            min_gain: d_min_gain(),
            max_step_units: d_max_step(),
            report_after: d_report_after(),
            max_correction: d_max_correction(),
            max_failed_explorations: d_failed(),
            rest_intervals: d_rest(),
            max_points: d_points(),
            min_memory_units: d_min_memory_units(),
            explore_units: d_explore_units(),
            max_age_intervals: d_max_age(),
            max_settle_intervals: d_settle(),
            seek_max_factor: d_seek(),
            max_fill_intervals: d_fill(),
            first_pass_time_share: d_first_pass_share(),
            first_pass_floor_drop: d_first_pass_drop(),
        }
    }
}

impl FeedbackConfig {
    pub fn validate(&self) -> Result<(), ProvisionError> {
        let bad = |f: &str, why: &str| Err(ProvisionError::invalid(&format!("feedback.{f}"), why));
        if !(self.smoothing > 0.0 && self.smoothing <= 1.0) {
            return bad("smoothing", "must be in (0, 1]");
        }
        if !(self.min_gain.is_finite() && (0.0..1.0).contains(&self.min_gain)) {
            return bad("min_gain", "must be in [0, 1)");
        }
        if self.max_step_units == 0 {
            return bad("max_step_units", "must be at least 1");
        }
        if self.report_after == 0 {
            return bad("report_after", "must be at least 1");
        }
        if !(self.max_correction.is_finite() && self.max_correction >= 1.0) {
            return bad("max_correction", "must be at least 1");
        }
        if self.max_failed_explorations == 0 {
            return bad("max_failed_explorations", "must be at least 1");
        }
        if self.max_age_intervals == 0 {
            return bad("max_age_intervals", "must be at least 1");
        }
        if self.explore_units == 0 {
            return bad("explore_units", "must be at least 1");
        }
        if !(self.seek_max_factor.is_finite() && (1.0..=100.0).contains(&self.seek_max_factor)) {
            return bad("seek_max_factor", "must be in [1, 100]");
        }
        if !(1..=4096).contains(&self.max_points) {
            return bad("max_points", "must be in 1..=4096");
        }
        if !(self.first_pass_time_share > 0.0 && self.first_pass_time_share <= 1.0) {
            return bad("first_pass_time_share", "must be in (0, 1]");
        }
        if !(self.first_pass_floor_drop.is_finite() && (0.0..1.0).contains(&self.first_pass_floor_drop)) {
            return bad("first_pass_floor_drop", "must be in [0, 1)");
        }
        Ok(())
    }
}
