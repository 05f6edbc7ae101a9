//! `dd_fuzz`: what the fuzz targets and the corpus tools share (issue 17).
//!
//! * The typed inputs of the structure-aware targets, how each target reads them and how the corpus
//!   converter writes them: [`data_plane`], [`peer_handler`], [`engine_model`] (which includes the
//!   engine's model-test harness by path). The targets themselves (`fuzz_targets/`) hold the models
//!   and the checks.
//! * [`unarbitrary`]: the inverse of `arbitrary`'s decoding for the shapes those inputs use.
//! * [`convert`]: recorded traffic (the daemon's capture files, `dd_server::capture`) turned into
//!   inputs of every target, for `examples/corpus_from_capture.rs`.
//!
//! Invariant: every writer here is the exact inverse of its reader; the unit tests (`cargo test
//! --manifest-path fuzz/Cargo.toml --lib`) and the converter (which re-reads every input it writes)
//! check it, since `arbitrary`'s layout is its own and could change with its version.

pub mod convert;
pub mod data_plane;
pub mod engine_model;
pub mod peer_handler;
pub mod unarbitrary;
