//! What names a page in the memory store and what identifies its bytes, shared by the arena (`mem`), the
//! content index (`dedup`), the pools and the cache: [`FrameId`], the frame cap [`MAX_FRAMES`] its
//! encoding imposes, and [`hash_page`], the content hash of a page.
//!
//! Invariants:
//! * A [`FrameId`] without the top bit names a whole frame; with it, one half of a frame holding a
//!   compressed page (`HALF_BIT | frame << 1 | half`). A frame number therefore fits in 30 bits
//!   ([`MAX_FRAMES`]), so a half's id is never a whole frame's, nor its buddy's.
//! * [`hash_page`] is a pure function of a page's bytes (xxh3-128), so the hash of an immutable frame
//!   equals the one it was indexed under at any time (the index keeps it rather than recomputing it). Equal hashes do not prove
//!   equal bytes: every user compares bytes before it relies on a match.

/// A frame number in the arena, or (top bit set) one half of a frame holding a compressed page.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct FrameId(pub u32);

const HALF_BIT: u32 = 1 << 31;

/// The most frames an arena may have (`EngineConfig::validate` refuses more): a half's id is
/// `HALF_BIT | frame << 1 | half`, so a frame number must fit in 30 bits for its halves to be told from
/// whole frames and from each other.
pub use crate::config::MAX_MEM_FRAMES as MAX_FRAMES;

impl FrameId {
    /// Names half `half` (0 or 1) of frame `frame`.
    pub(super) fn half(frame: u32, half: u32) -> FrameId {
        FrameId(HALF_BIT | frame << 1 | half)
    }
    /// Whether this names a half frame (a compressed page).
    pub fn is_half(self) -> bool {
        self.0 & HALF_BIT != 0
    }
    /// A dense number for side tables with two entries per frame: `2 × frame` for a whole frame,
    /// `2 × frame + half` for a half (a frame is never whole and halved at once).
    pub fn place_index(self) -> usize {
        if self.is_half() {
            (self.0 & !HALF_BIT) as usize
        } else {
            self.0 as usize * 2
        }
    }

    /// The whole frame this page lives in.
    pub fn frame(self) -> u32 {
        if self.is_half() {
            (self.0 & !HALF_BIT) >> 1
        } else {
            self.0
        }
    }
}

/// The content hash of a page: the key of the de-duplication index (`dedup`, which records each
/// indexed frame's hash beside it) and the check of pages fetched from peers. XXH3-128 with
/// seed 0 (peers compare these hashes, so the function is part of the peer protocol); `twox-hash`
/// chooses its AVX2 loop at run time where the CPU has it.
pub fn hash_page(data: &[u8]) -> u128 {
    twox_hash::XxHash3_128::oneshot(data)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The page hash is XXH3-128 exactly, as the reference implementation computes it: peers running
    /// another build compare these hashes.
    #[test]
    fn hash_page_is_xxh3_128() {
        let bytes = crate::test_util::pseudo_random_bytes(0x9E37_79B9_7F4A_7C15, 9000);
        for len in [0, 1, 16, 17, 128, 129, 240, 241, 512, 4095, 4096, 8192, 9000] {
            assert_eq!(hash_page(&bytes[..len]), xxhash_rust::xxh3::xxh3_128(&bytes[..len]), "length {len}");
        }
        assert_eq!(hash_page(&[]), 0x99aa_06d3_0147_98d8_6001_c324_468d_497f);
    }
}
