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
//! **Read holds** (issue 28: page copies outside every lock). A non-exclusive get leaves its page
//! indexed, so it may not own the frame; it [`MemStore::hold_for_read`]s the frame under its pool's lock
//! instead and copies it after releasing the lock. A held frame is never written (an indexed frame's
//! bytes never change) and never returns to the allocator: `free` of a held frame only marks it
//! (`FREED_WHILE_HELD`), and the last [`MemStore::end_read`] frees it. A hold is taken only while the
//! frame is indexed and under the lock that indexes it, so no hold begins after the frame was removed:
//! the remover's `free` sees every hold that is still open. Half frames (compressed pages) are not
//! held; their readers decompress them under the lock.
//!
//! Capacity accounting (how many frames may be in use) is done by the cache's store reservation, not
//! here; this type only guarantees that `alloc` succeeds while fewer than `limit` frames are in use.
//!
//! **Compressed pages** (zbud-style, when the store compresses): a page whose LZ4 form fits in half a
//! frame is stored in a half; a frame holds up to two such halves. A [`FrameId`] with the top bit set
//! names a half (`frame << 1 | half`, `store::frame`). [`MemStore::read`], [`MemStore::equals`] and [`MemStore::hash`]
//! decompress halves transparently; [`MemStore::free`] returns whether a whole frame became free (only
//! then does the cache release a reservation). Frames with one free half wait on the `unbuddied` list;
//! `Zbud::state` (two bits per frame, changed only under the `zbud` lock) says which halves are in use.

use super::frame::{FrameId, MAX_FRAMES};
use crossbeam_utils::CachePadded;
use parking_lot::Mutex;
use std::sync::atomic::{AtomicU32, Ordering};

/// Bookkeeping of half frames (under one lock: compressed puts are rarer than the copy they save).
#[derive(Debug, Default)]
struct Zbud {
    /// Frames with exactly one half in use (may hold stale entries; checked on pop).
    unbuddied: Vec<u32>,
    /// Per frame: bit 0 = first half in use, bit 1 = second half in use; 0 for a frame not in zbud
    /// use. Indexed by frame number and grown on demand (a byte per frame: denser and cheaper to
    /// update than a map, on every compressed put and free).
    state: Vec<u8>,
}

impl Zbud {
    fn state_mut(&mut self, f: u32) -> &mut u8 {
        let i = f as usize;
        if i >= self.state.len() {
            self.state.resize(i + 1, 0);
        }
        &mut self.state[i]
    }
}

/// Free stacks: a thread pushes and pops its own (`crate::stripe`), so at most `STRIPES / STACKS`
/// threads meet on one; at 16 cores and more, 8 stacks put two or more runtime threads on each.
const STACKS: usize = 32;

/// A frame's read-hold word (`MemStore::holds`): the number of open holds, and this bit once the frame
/// was freed while held (the last `end_read` then frees it).
const FREED_WHILE_HELD: u32 = 1 << 31;

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
    zbud: Mutex<Zbud>,
    /// Per frame: its read holds (module docs), zero for a frame nobody holds.
    holds: Box<[AtomicU32]>,
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

impl MemStore {
    /// Reserves an arena for `max_frames` frames; `limit` frames may be in use at first.
    pub fn new(page_size: usize, max_frames: u32, limit: u32) -> std::io::Result<MemStore> {
        // `EngineConfig::validate` refuses more; a larger arena would alias half ids.
        assert!(max_frames <= MAX_FRAMES, "{max_frames} frames is more than MAX_FRAMES");
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
            zbud: Mutex::new(Zbud::default()),
            holds: zeroed_words(max_frames as usize),
        })
    }

    /// Asks the kernel to back the arena with transparent huge pages (`MemStoreConfig::huge_pages`).
    /// A hint: where THP is disabled or unsupported the call fails and the arena keeps 4 KiB pages,
    /// which changes speed, never behaviour; the error is returned for the caller to ignore or log.
    pub fn advise_huge_pages(&self) -> std::io::Result<()> {
        // SAFETY: base/map_len are exactly the mapping mmap returned in `new`; MADV_HUGEPAGE changes how
        // the kernel backs it, not its contents or its validity.
        let r = unsafe { libc::madvise(self.base.cast(), self.map_len, libc::MADV_HUGEPAGE) };
        if r != 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(())
    }

    pub fn max_frames(&self) -> u32 {
        self.max_frames
    }

    /// Sets how many frames may be in use (capacity changes). Never above `max_frames`.
    pub fn set_limit(&self, frames: u32) {
        self.limit.store(frames.min(self.max_frames), Ordering::Relaxed);
    }

    fn my_stack(&self) -> usize {
        crate::stripe::index() % STACKS
    }

    /// Takes a free frame. Returns `None` only if every frame up to `max_frames` is in use, which the
    /// cache's reservation prevents.
    pub fn alloc(&self) -> Option<FrameId> {
        let mine = self.my_stack();
        let stack = &self.stacks[mine];
        let popped = crate::lockprof::acquire(
            crate::lockprof::LockClass::FreeStack,
            || stack.try_lock(),
            || stack.lock(),
        )
        .pop();
        if let Some(f) = popped {
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

    /// Returns a page's place to the allocator. The caller must own it and must not touch it afterwards.
    /// Returns true when a whole frame became free (for a half: when its buddy is free too), which is
    /// when the cache releases a reservation.
    pub fn free(&self, frame: FrameId) -> bool {
        if frame.is_half() {
            let f = frame.frame();
            let mut z = self.zbud.lock();
            let st = z.state_mut(f);
            crate::invariant!(*st != 0, "freeing a half of frame {f}, which is not in zbud use");
            *st &= !(1 << (frame.0 & 1));
            if *st == 0 {
                drop(z);
                self.free_frame(f);
                return true;
            }
            z.unbuddied.push(f);
            return false;
        }
        let holds = &self.holds[frame.0 as usize];
        if holds.load(Ordering::Acquire) != 0 {
            // Readers still copy it: the last one frees it (`end_read`), unless all just finished.
            if holds.fetch_or(FREED_WHILE_HELD, Ordering::AcqRel) != 0 {
                return false;
            }
            holds.store(0, Ordering::Relaxed);
        }
        self.free_frame(frame.0);
        true
    }

    /// Holds a whole frame for reading with no lock held (module docs). Call only under the lock of a
    /// pool that indexes the frame; end with [`Self::end_read`].
    pub fn hold_for_read(&self, frame: FrameId) {
        assert!(!frame.is_half(), "half frames are read under their pool's lock, not held");
        let prev = self.holds[frame.0 as usize].fetch_add(1, Ordering::Acquire);
        crate::invariant!(prev & FREED_WHILE_HELD == 0, "a hold on frame {}, already freed", frame.0);
    }

    /// Starts loading a frame's hold word into the CPU caches (a hold follows shortly).
    pub fn prefetch_hold(&self, frame: FrameId) {
        prefetch_line(self.holds[frame.0 as usize].as_ptr().cast_const().cast());
    }

    /// Ends a read hold. Returns true when this freed the frame (it was freed while held and this was
    /// the last hold): the caller then gives its reservation back, as after a `free` that returned true.
    pub fn end_read(&self, frame: FrameId) -> bool {
        let word = &self.holds[frame.0 as usize];
        let prev = word.fetch_sub(1, Ordering::AcqRel);
        crate::invariant!(prev & !FREED_WHILE_HELD != 0, "end_read of frame {} with no hold", frame.0);
        if prev != FREED_WHILE_HELD | 1 {
            return false;
        }
        word.store(0, Ordering::Relaxed);
        self.free_frame(frame.0);
        true
    }

    fn free_frame(&self, f: u32) {
        debug_assert!(f < self.bump.load(Ordering::Relaxed));
        let stack = &self.stacks[self.my_stack()];
        crate::lockprof::acquire(crate::lockprof::LockClass::FreeStack, || stack.try_lock(), || stack.lock())
            .push(f);
    }

    /// Stores a compressed page (`bytes` fits in half a frame with its 2-byte length) in the free half
    /// of a frame already in zbud use. Returns `None` when no such frame exists: the caller then reserves
    /// and allocates a frame and calls [`Self::store_half_in`].
    pub fn store_half(&self, bytes: &[u8]) -> Option<FrameId> {
        let mut z = self.zbud.lock();
        while let Some(f) = z.unbuddied.pop() {
            let st = z.state_mut(f);
            let half = match *st {
                0b01 => 1,
                0b10 => 0,
                _ => continue, // stale: both halves used again, or freed (0)
            };
            *st |= 1 << half;
            drop(z);
            let id = FrameId::half(f, half);
            self.write_half(id, bytes);
            return Some(id);
        }
        None
    }

    /// Stores a compressed page in the first half of a fresh frame the caller just allocated; the second
    /// half becomes available to [`Self::store_half`].
    pub fn store_half_in(&self, frame: FrameId, bytes: &[u8]) -> FrameId {
        debug_assert!(!frame.is_half());
        let id = FrameId::half(frame.0, 0);
        self.write_half(id, bytes);
        let mut z = self.zbud.lock();
        *z.state_mut(frame.0) = 0b01;
        z.unbuddied.push(frame.0);
        id
    }

    /// Bytes a compressed page may take in a half (after its 2-byte length).
    pub fn half_capacity(&self) -> usize {
        self.page_size / 2 - 2
    }

    fn half_ptr(&self, id: FrameId) -> *mut u8 {
        let base = self.frame_ptr(FrameId(id.frame()));
        // SAFETY: the offset is 0 or page_size / 2, inside the frame.
        unsafe { base.add((id.0 & 1) as usize * self.page_size / 2) }
    }

    fn write_half(&self, id: FrameId, bytes: &[u8]) {
        assert!(bytes.len() <= self.half_capacity());
        let dst = self.half_ptr(id);
        let len = (bytes.len() as u16).to_le_bytes();
        // SAFETY: dst points to page_size / 2 bytes inside the mapping, owned by the caller (the half was
        // just marked in use under the zbud lock, or the frame was just allocated); 2 + len fits (asserted).
        unsafe {
            std::ptr::copy_nonoverlapping(len.as_ptr(), dst, 2);
            std::ptr::copy_nonoverlapping(bytes.as_ptr(), dst.add(2), bytes.len());
        }
    }

    /// The compressed bytes of a half, under the same ownership rule as [`Self::read`].
    fn half_bytes(&self, id: FrameId) -> &[u8] {
        let src = self.half_ptr(id);
        // SAFETY: src points to page_size / 2 bytes inside the mapping that the caller may read (it owns
        // the page or holds the owning pool's lock); the stored length was bounded by half_capacity when
        // written, and is clamped again here in case of a logic error elsewhere.
        unsafe {
            let len = u16::from_le_bytes([*src, *src.add(1)]) as usize;
            std::slice::from_raw_parts(src.add(2), len.min(self.half_capacity()))
        }
    }

    /// Decompresses a half into `out`. A page that does not decompress to exactly a page would be a bug
    /// in this module; it is reported as all zeros rather than partially filled.
    fn read_half(&self, id: FrameId, out: &mut [u8]) {
        match super::lz4::decompress_into(self.half_bytes(id), out) {
            Some(n) if n == out.len() => {}
            _ => {
                crate::invariant!(false, "compressed page {} does not decompress to a page", id.0);
                out.fill(0);
            }
        }
    }

    /// Hands a half frame's page, decompressed into this thread's scratch page, to `f` (no allocation
    /// per call: equality checks of de-duplication and gets of compressed pages run on every put and
    /// get).
    fn with_decompressed<R>(&self, id: FrameId, f: impl FnOnce(&[u8]) -> R) -> R {
        thread_local! {
            static SCRATCH: std::cell::Cell<Vec<u8>> = const { std::cell::Cell::new(Vec::new()) };
        }
        // Taken out while `f` runs (a nested call finds it empty and allocates), put back after.
        let mut page = SCRATCH.take();
        page.resize(self.page_size, 0);
        self.read_half(id, &mut page);
        let r = f(&page);
        SCRATCH.set(page);
        r
    }

    /// Frames in use (handed out and not on a free stack). Takes every free-stack lock: for checks only.
    pub fn frames_in_use(&self) -> u64 {
        let free: usize = self.stacks.iter().map(|s| s.lock().len()).sum();
        self.bump.load(Ordering::Relaxed) as u64 - free as u64
    }

    fn frame_ptr(&self, frame: FrameId) -> *mut u8 {
        debug_assert!(!frame.is_half());
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
        if frame.is_half() {
            return self.read_half(frame, out);
        }
        let src = self.frame_ptr(frame);
        // SAFETY: src points to page_size bytes inside the mapping; the caller owns the frame, holds the
        // lock of the pool that owns it or holds it for reading, so no writer exists; `out` cannot alias
        // the arena.
        unsafe { std::ptr::copy_nonoverlapping(src, out.as_mut_ptr(), self.page_size) }
    }

    /// Hands a frame's page to `f` in place: a full frame as a slice of the arena, without a copy; a
    /// half frame decompressed into a page on the stack of this call. Same precondition as
    /// [`Self::read`]: the caller owns the frame or holds the lock of the pool that owns it, for the
    /// whole call of `f`.
    pub fn with_page<R>(&self, frame: FrameId, f: impl FnOnce(&[u8]) -> R) -> R {
        if frame.is_half() {
            return self.with_decompressed(frame, f);
        }
        let src = self.frame_ptr(frame);
        // SAFETY: src points to page_size initialised bytes inside the mapping (frame_ptr checks the
        // range; frames are written before they are indexed). The slice lives only for this call, during
        // which the caller owns the frame, holds its pool's lock or holds it for reading, so the frame is
        // neither freed, nor reused, nor written meanwhile: no `&mut` to these bytes exists while the
        // shared slice does.
        let page = unsafe { std::slice::from_raw_parts(src as *const u8, self.page_size) };
        f(page)
    }

    /// Whether a frame (immutable while the caller holds a reference) holds exactly `data`.
    pub fn equals(&self, frame: FrameId, data: &[u8]) -> bool {
        if frame.is_half() {
            return self.with_decompressed(frame, |page| page == data);
        }
        let src = self.frame_ptr(frame);
        // SAFETY: src points to page_size bytes inside the mapping; the caller holds a reference that keeps
        // the frame allocated and unmodified (de-duplicated frames are immutable while referenced).
        let bytes = unsafe { std::slice::from_raw_parts(src, self.page_size) };
        bytes == data
    }

    /// Hints the CPU to start loading the first cache lines of a frame (a get is about to copy it). A
    /// hint only: it never faults and never changes memory.
    pub fn prefetch(&self, frame: FrameId) {
        let p = self.frame_ptr(FrameId(frame.frame())).cast_const();
        for line in 0..16 {
            prefetch_line(p.wrapping_add(line * 64));
        }
    }

    /// Frames ever handed out (an upper bound on committed memory, in frames).
    #[cfg(test)]
    fn high_water_frames(&self) -> u32 {
        self.bump.load(Ordering::Relaxed)
    }
}

/// Hints the CPU to start loading the cache line at `p` (a no-op where there is no prefetch instruction).
/// Safe for any address: a prefetch does not access memory architecturally and never faults.
#[inline]
fn prefetch_line(p: *const u8) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: prefetch instructions do not access memory architecturally and cannot fault, whatever
    // the address; the callers pass addresses inside the arena or the hold words anyway.
    unsafe {
        std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(p.cast())
    };
    #[cfg(not(target_arch = "x86_64"))]
    let _ = p;
}

/// `n` zeroed atomic words, from the allocator's zeroed memory: for a large arena's table the kernel
/// supplies zero pages on first touch, so words of frames never held cost no memory.
fn zeroed_words(n: usize) -> Box<[AtomicU32]> {
    const _: () = assert!(std::mem::align_of::<AtomicU32>() == std::mem::align_of::<u32>());
    let words = std::mem::ManuallyDrop::new(vec![0u32; n]);
    let (ptr, len, cap) = (words.as_ptr() as *mut u32, words.len(), words.capacity());
    // SAFETY: the allocation is `vec![0u32; n]`'s, given up by the ManuallyDrop above; `AtomicU32` has
    // the size and bit validity of `u32` and (asserted above) its alignment, so the layout the vector was
    // allocated with is the layout of `cap` atomic words, and zero is a valid value of each.
    unsafe { Vec::from_raw_parts(ptr.cast::<AtomicU32>(), len, cap) }.into_boxed_slice()
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

    /// A frame freed while held for reading stays out of the allocator until its last hold ends, and
    /// that `end_read` is the one that frees it (and says so).
    #[test]
    fn a_frame_freed_while_held_is_freed_by_its_last_reader() {
        let m = MemStore::new(512, 4, 2).unwrap();
        let a = m.alloc().unwrap();
        m.write(a, &[7u8; 512]);
        m.hold_for_read(a);
        m.hold_for_read(a);
        assert!(!m.free(a), "a held frame was freed at once");
        let others: Vec<FrameId> = (0..3).map(|_| m.alloc().unwrap()).collect();
        assert!(!others.contains(&a), "a held frame was handed out again: {others:?}");
        let mut out = vec![0u8; 512];
        m.read(a, &mut out);
        assert!(out.iter().all(|&x| x == 7));
        assert!(!m.end_read(a));
        assert!(m.end_read(a), "the last reader must free it");
        assert_eq!(m.alloc(), Some(a));
        for f in others {
            assert!(m.free(f));
        }
        // Holds that end before the free leave nothing behind: the free is immediate.
        m.hold_for_read(a);
        assert!(!m.end_read(a));
        assert!(m.free(a));
    }

    #[test]
    fn alloc_respects_the_limit_and_recycles() {
        let m = MemStore::new(4096, 16, 4).unwrap();
        let frames: Vec<_> = (0..4).map(|_| m.alloc().unwrap()).collect();
        // Beyond the limit only frames from the reservation above it remain (used when capacity shrinks).
        assert_eq!(m.high_water_frames(), 4);
        assert!(m.free(frames[1]));
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

    #[test]
    fn two_compressed_pages_share_a_frame() {
        let m = MemStore::new(4096, 8, 8).unwrap();
        let page_a = vec![7u8; 4096];
        let page_b: Vec<u8> = (0..4096).map(|i| (i / 512) as u8).collect();
        let ca = lz4_flex::block::compress(&page_a);
        let cb = lz4_flex::block::compress(&page_b);
        assert!(m.store_half(&ca).is_none(), "no half-used frame yet");
        let f = m.alloc().unwrap();
        let a = m.store_half_in(f, &ca);
        let b = m.store_half(&cb).expect("the buddy half is free");
        assert_eq!(a.frame(), b.frame());
        let mut out = vec![0u8; 4096];
        m.read(a, &mut out);
        assert_eq!(out, page_a);
        m.read(b, &mut out);
        assert_eq!(out, page_b);
        assert!(m.equals(b, &page_b) && !m.equals(b, &page_a));
        assert_eq!(m.frames_in_use(), 1);
        assert!(!m.free(a), "the buddy still holds the frame");
        assert!(m.free(b), "now the frame is free");
        assert_eq!(m.frames_in_use(), 0);
    }
}
