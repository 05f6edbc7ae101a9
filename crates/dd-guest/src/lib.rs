//! # dd-guest: the guest side of DoubleDecker
//!
//! What runs inside a VM (SPEC section 7). [`watch`] turns real cgroups into pools: a container's
//! cgroup appearing creates its pool (CREATE_CGROUP), its spec comes from the watcher's configuration or
//! from an annotation on the cgroup directory (SET_CG_WEIGHT), and the cgroup going away destroys the
//! pool (DESTROY_CGROUP). The pool of each cgroup is published in a state file for the other guest
//! frontends (the FUSE filesystem attributes requests to containers through it).

pub mod watch;

pub use watch::{WatchConfig, Watcher};
