//! Page buffers with a chosen memory alignment, as `O_DIRECT` needs of every buffer it transfers.
//!
//! Invariant: an [`AlignedBuf`] uniquely owns a zeroed allocation of exactly its length, so it can be
//! handed to the kernel (io_uring) as a raw pointer for as long as the owner keeps it alive.

use std::alloc::{self, Layout};
use std::ops::{Deref, DerefMut};
use std::ptr::NonNull;

/// A zeroed heap buffer with a chosen alignment (for `O_DIRECT`).
pub struct AlignedBuf {
    ptr: NonNull<u8>,
    layout: Layout,
}

// SAFETY: `AlignedBuf` uniquely owns its allocation, like a `Box<[u8]>`.
unsafe impl Send for AlignedBuf {}
// SAFETY: shared access only hands out `&[u8]`.
unsafe impl Sync for AlignedBuf {}

impl AlignedBuf {
    pub fn new(len: usize, align: usize) -> AlignedBuf {
        let layout = match Layout::from_size_align(len, align) {
            Ok(layout) if len > 0 => layout,
            _ => panic!("invalid page buffer layout: {len} bytes aligned to {align}"),
        };
        // SAFETY: `layout` has a non-zero size.
        let ptr = unsafe { alloc::alloc_zeroed(layout) };
        match NonNull::new(ptr) {
            Some(ptr) => AlignedBuf { ptr, layout },
            None => alloc::handle_alloc_error(layout),
        }
    }
}

impl Deref for AlignedBuf {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        // SAFETY: `ptr` points to `layout.size()` initialised (zeroed at allocation) bytes that we own.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.layout.size()) }
    }
}

impl DerefMut for AlignedBuf {
    fn deref_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in `deref`, and `&mut self` guarantees exclusive access.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.layout.size()) }
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        // SAFETY: allocated in `new` with exactly this layout.
        unsafe { alloc::dealloc(self.ptr.as_ptr(), self.layout) }
    }
}
