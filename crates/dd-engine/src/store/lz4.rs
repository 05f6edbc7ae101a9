//! LZ4 block compression of memory pages (`mem.compression = "lz4"`), behind one pair of functions so
//! the codec can be chosen at build time: `lz4_flex` in pure Rust (the default), or the reference C
//! library through `lz4-sys` with the `lz4-c` feature (faster to decompress pages with long runs;
//! BENCHMARKS.md, "De-duplication put cost", has both).
//!
//! Both write and read the LZ4 *block* format, so the two are interchangeable for any page; a build
//! never reads pages another build wrote anyway (the memory store starts empty).
//!
//! Invariant: [`compress`] returns a block only if it is at most `limit` bytes. The C library is asked
//! for at most `limit` bytes and gives up as soon as the block would not fit (an incompressible page
//! costs half a compression); `lz4_flex` needs room for the worst case and is checked afterwards.

/// Compresses `page` into `scratch` (resized as needed); the block, if it is at most `limit` bytes.
pub fn compress<'a>(page: &[u8], scratch: &'a mut Vec<u8>, limit: usize) -> Option<&'a [u8]> {
    #[cfg(not(feature = "lz4-c"))]
    {
        scratch.resize(lz4_flex::block::get_maximum_output_size(page.len()), 0);
        let n = lz4_flex::block::compress_into(page, scratch).ok()?;
        (n <= limit).then(|| &scratch[..n])
    }
    #[cfg(feature = "lz4-c")]
    {
        scratch.resize(limit, 0);
        let (Ok(src_len), Ok(cap)) = (i32::try_from(page.len()), i32::try_from(limit)) else {
            return None;
        };
        // SAFETY: the pointers and lengths describe `page` (read) and `scratch` (written, `limit` bytes
        // long), two live, non-overlapping buffers; LZ4_compress_default writes at most `cap` bytes and
        // returns 0 when the block does not fit.
        let n = unsafe {
            lz4_sys::LZ4_compress_default(page.as_ptr().cast(), scratch.as_mut_ptr().cast(), src_len, cap)
        };
        (n > 0).then(|| &scratch[..n as usize])
    }
}

/// Decompresses `block` into `out`; `Some(length)` on a well-formed block that fits.
pub fn decompress_into(block: &[u8], out: &mut [u8]) -> Option<usize> {
    #[cfg(not(feature = "lz4-c"))]
    {
        lz4_flex::block::decompress_into(block, out).ok()
    }
    #[cfg(feature = "lz4-c")]
    {
        let (Ok(src_len), Ok(cap)) = (i32::try_from(block.len()), i32::try_from(out.len())) else {
            return None;
        };
        // SAFETY: `block` (read) and `out` (written) are live, non-overlapping slices of the lengths
        // passed; LZ4_decompress_safe never reads past `src_len` bytes of
        // `block` nor writes past `cap` bytes of `out`, and returns a negative value on a malformed
        // block.
        let n = unsafe {
            lz4_sys::LZ4_decompress_safe(block.as_ptr().cast(), out.as_mut_ptr().cast(), src_len, cap)
        };
        (n >= 0).then_some(n as usize)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pages_round_trip_and_incompressible_ones_do_not_fit_a_half() {
        let random = crate::test_util::pseudo_random_bytes(7, 4096);
        let mut compressible = random.clone();
        compressible[1024..].fill(0);
        let mut scratch = Vec::new();
        let block =
            compress(&compressible, &mut scratch, 2046).expect("a quarter of random bytes fits a half");
        assert!(block.len() <= 2046);
        let block = block.to_vec();
        let mut page = vec![0u8; 4096];
        assert_eq!(decompress_into(&block, &mut page), Some(4096));
        assert_eq!(page, compressible);
        assert_eq!(compress(&random, &mut scratch, 2046), None, "random bytes do not fit half a page");
        assert_eq!(decompress_into(&[0xff, 0xff, 0xff], &mut page), None, "a malformed block");
    }
}
