//! The two storage tiers: a bounded memory arena and a file-backed SSD store. Both only hold bytes in
//! numbered frames/slots; which page is where is the pools' business.

pub mod dedup;
pub mod mem;
pub mod ssd;
pub mod ssd_file;
