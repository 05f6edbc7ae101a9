//! The two storage tiers: a bounded memory arena and a file-backed SSD store. Both only hold bytes in
//! numbered frames/slots; which page is where is the pools' business.

// The memory arena, its frame ids and its de-duplication table are crate-private: `MemStore::read` and
// `write` are safe functions whose soundness rests on the caller owning the frame (the ownership
// invariant of `mem`), which only this crate's pools and `Cache` uphold. Outside the crate, `Cache` is
// the way in. Imports go one way: `dedup` uses `mem`, and both use `frame`.
pub(crate) mod dedup;
pub(crate) mod frame;
pub(crate) mod lz4;
pub(crate) mod mem;
pub mod ssd;
