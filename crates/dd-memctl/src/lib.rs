//! # dd-memctl: deterministic container memory under pressure
//!
//! The memory controller of thesis 000, chapter 4 (SPEC section 8). Under memory pressure, each reclaim
//! request takes at most one bounded chunk from the container whose usage most exceeds its
//! weight-proportional share, so memory stays in the ratio of the weights; classes (gold, silver,
//! bronze) order reclaim so that gold is touched only when nobody else can give.
//!
//! The heart is [`decide`], a pure function from a snapshot to one reclaim action, shared by every
//! backend (the lab's emulated memcgs, real cgroup v1 and v2). [`plan`] applies it repeatedly to a copy of
//! the snapshot to show what a whole reclaim of N bytes would do.

pub mod cgroup;
pub mod daemon;
pub mod decide;

pub use decide::{decide, exceeds, plan, Action, Class, ContainerSnapshot, DecisionConfig, Policy, Reason};
