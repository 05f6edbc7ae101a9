//! # dd-guest: the guest side of DoubleDecker
//!
//! What runs inside a VM (SPEC section 7). [`watch`] turns real cgroups into pools: a container's
//! cgroup appearing creates its pool (CREATE_CGROUP), its spec comes from the watcher's configuration or
//! from an annotation on the cgroup directory (SET_CG_WEIGHT), and the cgroup going away destroys the
//! pool (DESTROY_CGROUP). The pool of each cgroup is published in a state file for the other guest
//! frontends (the FUSE filesystem attributes requests to containers through it). [`provision`] is the
//! VM-level provisioner on a real guest (`doubledecker guest provision`): from the curves and counters
//! the FUSE mount publishes ([`mount_stats`]) it sets each container's first-level budget, pool spec and,
//! where configured, cgroup memory limit to meet its target.

pub mod mount_stats;
pub mod provision;
pub mod watch;

pub use provision::{GuestProvisioner, ProvisionFileConfig, RoundReport};
pub use watch::{WatchConfig, Watcher};
