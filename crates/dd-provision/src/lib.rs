//! # dd-provision: the VM-level provisioner (SPEC section 10b)
//!
//! Turns what a VM's containers need into settings: from each container's miss-ratio curves (its
//! page-cache reads and its anonymous-memory accesses), its target (operations per second, mean latency,
//! or a hit ratio), the latency of each place a page can be found, and what the VM has (its memory and its
//! entitlements in the host cache's memory and SSD stores), [`provision`] decides each container's memory
//! limit and its pool's weights in the two stores. It is a pure function: no I/O, no clock, no
//! randomness; the lab (`dd-lab`, every provisioning interval of an emulated run) and the guest
//! (`doubledecker guest provision`, from the FUSE mount's sampled accesses) both call it.
//!
//! This is the "derivative provider memory management framework" of thesis 000 (section 5.3.1): the
//! VM-level manager, which knows its containers, provisions three levels (container memory, level-1
//! memory cache, level-2 SSD cache) to meet each application's target, where a hypervisor cache alone
//! cannot help an application that lives in anonymous memory (paper 002 section 5.2.1, Table 4). Both
//! papers name miss-ratio curves as the way to do it adaptively; the curves come from `dd-mrc`.
//!
//! Modules: [`model`] (inputs and the performance model: cost of an operation for an allocation),
//! [`plan`] (the decision: a programme over a grid), [`feedback`] (the closed loop around it that the
//! lab and the guest run: measurements correct predictions, [`Controller`]; its step towards a missed
//! target in the private `shortfall`), [`config`] (the settings
//! of both), [`report`] (what a guest provisioner reports after a round: the body of the
//! daemon's `PUT /v1/vm/provisioner`, shared by the guest and the daemon). Curves are `dd_mrc::Curve`s in
//! pages.
#![forbid(unsafe_code)] // nothing here needs it: unsafe code lives in dd-engine, dd-fuse, dd-memctl and the few FFI calls of the other crates

pub mod config;
pub mod error;
pub mod feedback;
pub mod model;
pub mod plan;
pub mod report;
mod shortfall;

pub use config::{FeedbackConfig, Objective, ProvisionConfig};
pub use dd_mrc::{Curve, Unit};
pub use error::ProvisionError;
pub use feedback::{ContainerStatus, Controller, Decision, Measured, Source, TargetState};
pub use model::{
    price_swap_ins_at_shared_disk, ContainerInput, Demand, LatencyModel, Observed, Prediction, Target,
};
pub use plan::{provision, Allocation, Budget, ContainerPlan, Plan};
