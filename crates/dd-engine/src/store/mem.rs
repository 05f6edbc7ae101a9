//! The memory store: a bounded arena of page frames.
//!
//! The arena is one anonymous mapping of `max_frames * page_size` bytes reserved at start; the kernel
//! commits a frame's memory only when it is first written, so reserving room for run-time growth costs
//! address space, not RAM. Frames are handed out by a bump pointer (up to the current frame limit) and
//! recycled through a few LIFO free stacks, so recently freed (cache-warm, already committed) frames are
//! reused first and resident memory stays near the store's high-water mark.
//!
//! Ownership invariant (what makes the raw-pointer access sound): a frame is, at any instant, either on a
//! free stack / above the bump pointer (owned by the allocator), or owned by exactly one holder: a pool
//! entry (under that pool's lock) or an operation that has just allocated it or just removed it from a
//! pool. Only the owner reads or writes the frame's bytes. `alloc` transfers ownership to the caller;
//! `free` takes it back. The engine never keeps a frame reachable from an index after freeing it.
//!
//! Capacity accounting (how many frames may be in use) is done by the cache's store reservation, not
//! here; this type only guarantees that `alloc` succeeds while fewer than `limit` frames are in use.

use crossbeam_utils::CachePadded;
use parking_lot::Mutex;
use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};

/// A frame number in the arena.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct FrameId(pub u32);

const STACKS: usize = 8;

pub struct MemStore {
    base: *mut u8,
    map_len: usize,
    page_size: usize,
    max_frames: u32,
    /// Frames below this have been handed out at least once.
    bump: AtomicU32,
    /// Frames the bump pointer may reach (the current capacity in frames).
    limit: AtomicU32,
    /// Padded: threads work on different stacks, and two stacks in one cache line would ping-pong it.
    stacks: [CachePadded<Mutex<Vec<u32>>>; STACKS],
    next_stack: AtomicUsize,
}

// SAFETY: the arena is a plain memory mapping; concurrent access to distinct frames is coordinated by
// the ownership invariant in the module docs, and all shared bookkeeping is atomic or behind mutexes.
unsafe impl Send for MemStore {}
// SAFETY: as above; `&MemStore` only exposes frame access through `write`/`read` on frames the caller owns.
unsafe impl Sync for MemStore {}

impl std::fmt::Debug for MemStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemStore")
            .field("page_size", &self.page_size)
            .field("max_frames", &self.max_frames)
            .field("bump", &self.bump.load(Ordering::Relaxed))
            .finish()
    }
}

thread_local! {
    static STACK_HINT: std::cell::Cell<usize> = const { std::cell::Cell::new(usize::MAX) };
}

impl MemStore {
    /// Reserves an arena for `max_frames` frames; `limit` frames may be in use at first.
    pub fn new(page_size: usize, max_frames: u32, limit: u32) -> std::io::Result<MemStore> {
        let map_len = (max_frames as usize).max(1) * page_size;
        // SAFETY: an anonymous private mapping with no fixed address; arguments are valid and the result is
        // checked. MAP_NORESERVE: memory is committed on first touch.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                map_len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if base == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error());
        }
        Ok(MemStore {
            base: base.cast(),
            map_len,
            page_size,
            max_frames,
            bump: AtomicU32::new(0),
            limit: AtomicU32::new(limit.min(max_frames)),
            stacks: std::array::from_fn(|_| CachePadded::new(Mutex::new(Vec::new()))),
            next_stack: AtomicUsize::new(0),
        })
    }

    pub fn page_size(&self) -> usize {
        self.page_size
    }

    pub fn max_frames(&self) -> u32 {
        self.max_frames
    }

    /// Sets how many frames may be in use (capacity changes). Never above `max_frames`.
    pub fn set_limit(&self, frames: u32) {
        self.limit.store(frames.min(self.max_frames), Ordering::Relaxed);
    }

    fn my_stack(&self) -> usize {
        STACK_HINT.with(|h| {
            let mut v = h.get();
            if v == usize::MAX {
                v = self.next_stack.fetch_add(1, Ordering::Relaxed);
                h.set(v);
            }
            v % STACKS
        })
    }

    /// Takes a free frame. Returns `None` only if every frame up to `max_frames` is in use, which the
    /// cache's reservation prevents.
    pub fn alloc(&self) -> Option<FrameId> {
        let mine = self.my_stack();
        if let Some(f) = self.stacks[mine].lock().pop() {
            return Some(FrameId(f));
        }
        let limit = self.limit.load(Ordering::Relaxed);
        let mut cur = self.bump.load(Ordering::Relaxed);
        while cur < limit {
            match self.bump.compare_exchange_weak(cur, cur + 1, Ordering::Relaxed, Ordering::Relaxed) {
                Ok(_) => return Some(FrameId(cur)),
                Err(now) => cur = now,
            }
        }
        for i in 1..STACKS {
            if let Some(f) = self.stacks[(mine + i) % STACKS].lock().pop() {
                return Some(FrameId(f));
            }
        }
        // Above the limit (capacity just shrank) but frames remain in the reservation: take a fresh one.
        let mut cur = self.bump.load(Ordering::Relaxed);
        while cur < self.max_frames {
            match self.bump.compare_exchange_weak(cur, cur + 1, Ordering::Relaxed, Ordering::Relaxed) {
                Ok(_) => return Some(FrameId(cur)),
                Err(now) => cur = now,
            }
        }
        None
    }

    /// Returns a frame to the allocator. The caller must own it and must not touch it afterwards.
    pub fn free(&self, frame: FrameId) {
        debug_assert!(frame.0 < self.bump.load(Ordering::Relaxed));
        self.stacks[self.my_stack()].lock().push(frame.0);
    }

    fn frame_ptr(&self, frame: FrameId) -> *mut u8 {
        assert!(frame.0 < self.max_frames, "frame {} out of range", frame.0);
        // SAFETY: frame < max_frames, so the offset is inside the mapping of max_frames * page_size bytes.
        unsafe { self.base.add(frame.0 as usize * self.page_size) }
    }

    /// Copies `data` (one page) into a frame the caller owns.
    pub fn write(&self, frame: FrameId, data: &[u8]) {
        assert_eq!(data.len(), self.page_size);
        let dst = self.frame_ptr(frame);
        // SAFETY: dst points to page_size bytes inside the mapping; the caller owns the frame, so no other
        // thread accesses these bytes; `data` is a distinct allocation (it cannot alias the arena because
        // the arena is never exposed as a slice).
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), dst, self.page_size) }
    }

    /// Copies a frame the caller owns (or reads under the owning pool's lock) into `out`.
    pub fn read(&self, frame: FrameId, out: &mut [u8]) {
        assert_eq!(out.len(), self.page_size);
        let src = self.frame_ptr(frame);
        // SAFETY: src points to page_size bytes inside the mapping; the caller owns the frame or holds the
        // lock of the pool that owns it, so no writer exists; `out` cannot alias the arena.
        unsafe { std::ptr::copy_nonoverlapping(src, out.as_mut_ptr(), self.page_size) }
    }

    /// Whether a frame (immutable while the caller holds a reference) holds exactly `data`.
    pub fn equals(&self, frame: FrameId, data: &[u8]) -> bool {
        let src = self.frame_ptr(frame);
        // SAFETY: src points to page_size bytes inside the mapping; the caller holds a reference that keeps
        // the frame allocated and unmodified (de-duplicated frames are immutable while referenced).
        let bytes = unsafe { std::slice::from_raw_parts(src, self.page_size) };
        bytes == data
    }

    /// The content hash of a frame (see `store::dedup`), under the same condition as [`Self::equals`].
    pub fn hash(&self, frame: FrameId) -> u128 {
        let src = self.frame_ptr(frame);
        // SAFETY: as in `equals`.
        let bytes = unsafe { std::slice::from_raw_parts(src, self.page_size) };
        crate::store::dedup::hash_page(bytes)
    }

    /// Hints the CPU to start loading the first cache lines of a frame (a get is about to copy it). A
    /// hint only: it never faults and never changes memory.
    pub fn prefetch(&self, frame: FrameId) {
        #[cfg(target_arch = "x86_64")]
        {
            use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
            let p = self.frame_ptr(frame) as *const i8;
            for line in 0..16 {
                // SAFETY: prefetch instructions do not access memory architecturally and cannot fault; the
                // address is inside the mapping anyway (frame_ptr checks the frame number).
                unsafe { _mm_prefetch::<_MM_HINT_T0>(p.add(line * 64)) };
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        let _ = frame;
    }

    /// Frames ever handed out (an upper bound on committed memory, in frames).
    pub fn high_water_frames(&self) -> u32 {
        self.bump.load(Ordering::Relaxed)
    }
}

impl Drop for MemStore {
    fn drop(&mut self) {
        // SAFETY: base/map_len are exactly what mmap returned; no frame can be in use once the store is
        // dropped because every holder of a frame borrows the store.
        unsafe {
            libc::munmap(self.base.cast(), self.map_len);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn alloc_respects_the_limit_and_recycles() {
        let m = MemStore::new(4096, 16, 4).unwrap();
        let frames: Vec<_> = (0..4).map(|_| m.alloc().unwrap()).collect();
        // Beyond the limit only frames from the reservation above it remain (used when capacity shrinks).
        assert_eq!(m.high_water_frames(), 4);
        m.free(frames[1]);
        assert_eq!(m.alloc(), Some(frames[1]));
        m.set_limit(8);
        assert_eq!(m.alloc(), Some(FrameId(4)));
    }

    #[test]
    fn frames_hold_their_bytes() {
        let m = MemStore::new(512, 4, 4).unwrap();
        let a = m.alloc().unwrap();
        let b = m.alloc().unwrap();
        m.write(a, &[1u8; 512]);
        m.write(b, &[2u8; 512]);
        let mut out = vec![0u8; 512];
        m.read(a, &mut out);
        assert!(out.iter().all(|&x| x == 1));
        m.read(b, &mut out);
        assert!(out.iter().all(|&x| x == 2));
    }

    #[test]
    fn exhaustion_returns_none() {
        let m = MemStore::new(512, 2, 2).unwrap();
        assert!(m.alloc().is_some());
        assert!(m.alloc().is_some());
        assert!(m.alloc().is_none());
    }
}
