//! The MySQL-like store's buffer pool: InnoDB's own page cache in the server's anonymous memory.
//!
//! Owns which tablespace page sits in which frame, which frames are dirty, and InnoDB's LRU with
//! midpoint insertion (`innodb_old_blocks_pct` = 37): the list is split into a young sublist (head) and
//! an old sublist (the tail 37%); a page read into the pool enters at the head of the old sublist, an
//! access to a page in the old sublist moves it to the head of the young sublist, and a page is evicted
//! from the tail of the old sublist. So a one-off scan cannot flush the hot pages. Not modelled:
//! `innodb_old_blocks_time` (a page must stay old for 1 s before an access makes it young), read-ahead,
//! the page cleaner (dirty pages are written back when they are evicted, by the thread that needs the
//! frame) and the change buffer.
//!
//! The pool reports what each access does as [`Step`]s; the store turns them into page touches of the
//! heap (the frames, anonymous memory the guest may swap out) and of the data file (read through the page
//! cache on a miss, written back through it when a dirty page is evicted), which the emulator charges.
//!
//! Invariants: a frame holds at most one page and a page at most one frame (`page_of` and `frame_of`
//! agree); every used frame is on exactly one sublist; `old_len` is the old sublist's length and, after
//! every access, `old_len <= ceil(37% of used)` unless the young sublist is empty.

use std::collections::HashMap;

const NIL: u32 = u32::MAX;
/// InnoDB's default `innodb_old_blocks_pct`.
const OLD_PCT: u64 = 37;

/// What one access to a tablespace page costs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// The page is in `frame`.
    Hit { frame: u32 },
    /// The page was not in the pool: `evicted` (a page and whether it was dirty) left `frame`, and the
    /// page must be read from the data file into `frame` unless `fresh` (a page beyond the file's end,
    /// created by an insert).
    Miss { frame: u32, evicted: Option<(u32, bool)>, fresh: bool },
}

#[derive(Debug, Clone, Copy)]
struct Frame {
    page: u32,
    prev: u32,
    next: u32,
    old: bool,
    dirty: bool,
}

/// The buffer pool: `frames` frames, each holding one tablespace page.
#[derive(Debug, Clone)]
pub struct BufferPool {
    frames: Vec<Frame>,
    frame_of: HashMap<u32, u32>,
    /// Frames never used yet, handed out in order (the pool fills from frame 0).
    next_free: u32,
    head: u32,
    tail: u32,
    /// First frame of the old sublist (the midpoint), `NIL` if the old sublist is empty.
    mid: u32,
    used: u64,
    old_len: u64,
    /// Tablespace pages that exist (the data file's length in pages): a miss below it reads the file.
    file_pages: u32,
}

impl BufferPool {
    pub fn new(frames: u32) -> BufferPool {
        let f = Frame { page: NIL, prev: NIL, next: NIL, old: false, dirty: false };
        BufferPool {
            frames: vec![f; frames.max(1) as usize],
            frame_of: HashMap::new(),
            next_free: 0,
            head: NIL,
            tail: NIL,
            mid: NIL,
            used: 0,
            old_len: 0,
            file_pages: 0,
        }
    }

    pub fn frames(&self) -> u32 {
        self.frames.len() as u32
    }

    /// Tablespace pages written to the data file so far.
    pub fn file_pages(&self) -> u32 {
        self.file_pages
    }

    /// Declares the data file `pages` tablespace pages long (records loaded before the run).
    pub fn set_file_pages(&mut self, pages: u32) {
        self.file_pages = self.file_pages.max(pages);
    }

    /// An access to tablespace page `page` (a write dirties it).
    pub fn access(&mut self, page: u32, write: bool) -> Step {
        if let Some(&f) = self.frame_of.get(&page) {
            if self.frames[f as usize].old {
                self.unlink(f);
                self.push_head(f, false);
                self.rebalance();
            } else if self.head != f {
                self.unlink(f);
                self.push_head(f, false);
            }
            self.frames[f as usize].dirty |= write;
            return Step::Hit { frame: f };
        }
        let (frame, evicted) = if (self.next_free as usize) < self.frames.len() {
            self.next_free += 1;
            (self.next_free - 1, None)
        } else {
            let f = self.tail;
            let victim = self.frames[f as usize];
            self.unlink(f);
            self.frame_of.remove(&victim.page);
            if victim.dirty {
                self.file_pages = self.file_pages.max(victim.page + 1);
            }
            (f, Some((victim.page, victim.dirty)))
        };
        let fresh = page >= self.file_pages;
        self.frames[frame as usize].page = page;
        self.frames[frame as usize].dirty = write || fresh;
        self.frame_of.insert(page, frame);
        self.insert_midpoint(frame);
        self.rebalance();
        Step::Miss { frame, evicted, fresh }
    }

    fn old_target(&self) -> u64 {
        (self.used * OLD_PCT).div_ceil(100)
    }

    /// Puts a frame at the head of the old sublist (the midpoint), or at the head of an empty list.
    fn insert_midpoint(&mut self, f: u32) {
        if self.mid == NIL {
            // No old sublist yet: the frame becomes the tail and the whole old sublist.
            let t = self.tail;
            self.link_after(f, t);
        } else {
            let before = self.frames[self.mid as usize].prev;
            self.link_after(f, before);
        }
        self.frames[f as usize].old = true;
        self.mid = f;
        self.old_len += 1;
        self.used += 1;
    }

    fn push_head(&mut self, f: u32, old: bool) {
        self.link_after(f, NIL);
        self.frames[f as usize].old = old;
        if old {
            self.old_len += 1;
            self.mid = f;
        }
        self.used += 1;
    }

    /// Links frame `f` after `prev` (`NIL`: at the head).
    fn link_after(&mut self, f: u32, prev: u32) {
        let next = if prev == NIL { self.head } else { self.frames[prev as usize].next };
        self.frames[f as usize].prev = prev;
        self.frames[f as usize].next = next;
        if prev == NIL {
            self.head = f;
        } else {
            self.frames[prev as usize].next = f;
        }
        if next == NIL {
            self.tail = f;
        } else {
            self.frames[next as usize].prev = f;
        }
    }

    fn unlink(&mut self, f: u32) {
        let Frame { prev, next, old, .. } = self.frames[f as usize];
        if self.mid == f {
            self.mid = if old && next != NIL { next } else { NIL };
        }
        if prev == NIL {
            self.head = next;
        } else {
            self.frames[prev as usize].next = next;
        }
        if next == NIL {
            self.tail = prev;
        } else {
            self.frames[next as usize].prev = prev;
        }
        if old {
            self.old_len -= 1;
        }
        self.used -= 1;
    }

    /// Moves the midpoint so that the old sublist holds its share of the list (InnoDB's
    /// `buf_LRU_old_adjust_len`): young frames just above it become old, or old ones at its head young.
    fn rebalance(&mut self) {
        let want = self.old_target();
        while self.old_len < want {
            let f = if self.mid == NIL { self.tail } else { self.frames[self.mid as usize].prev };
            if f == NIL {
                break;
            }
            self.frames[f as usize].old = true;
            self.mid = f;
            self.old_len += 1;
        }
        while self.old_len > want && self.mid != NIL {
            let f = self.mid;
            self.frames[f as usize].old = false;
            self.old_len -= 1;
            self.mid = self.frames[f as usize].next;
        }
    }

    /// Checks the invariants in the module doc (tests).
    pub fn check(&self) -> Result<(), String> {
        let (mut n, mut old, mut seen_old) = (0u64, 0u64, false);
        let mut f = self.head;
        let mut prev = NIL;
        while f != NIL {
            let fr = &self.frames[f as usize];
            if fr.prev != prev {
                return Err(format!("frame {f}: prev {} want {prev}", fr.prev));
            }
            if self.frame_of.get(&fr.page) != Some(&f) {
                return Err(format!("frame {f} holds page {} the map does not place there", fr.page));
            }
            if fr.old {
                if !seen_old && self.mid != f {
                    return Err(format!("first old frame {f} is not the midpoint {}", self.mid));
                }
                seen_old = true;
                old += 1;
            } else if seen_old {
                return Err(format!("young frame {f} below the midpoint"));
            }
            n += 1;
            prev = f;
            f = fr.next;
        }
        if prev != self.tail || n != self.used || old != self.old_len || n != self.frame_of.len() as u64 {
            return Err(format!("used {} listed {n}, old {} listed {old}", self.used, self.old_len));
        }
        if old > self.old_target() && n > old {
            return Err(format!("old sublist {old} of {n} is longer than its share"));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pages_enter_at_the_midpoint_and_a_second_access_makes_them_young() {
        let mut bp = BufferPool::new(8);
        for p in 0..8 {
            assert_eq!(bp.access(p, false), Step::Miss { frame: p, evicted: None, fresh: true });
            bp.check().unwrap();
        }
        // As the list grew, the midpoint moved up past every other page (1, 3, 5, 7 are young by
        // position, as in InnoDB); the old sublist is its 37%: pages 4, 2, 0 from its head.
        assert_eq!(bp.old_len, 3);
        // Page 0 (oldest) is re-read: it moves to the young head, and is not the next victim; the
        // oldest page of the old sublist is, written back (it was created dirty).
        assert_eq!(bp.access(0, false), Step::Hit { frame: 0 });
        bp.check().unwrap();
        let Step::Miss { evicted, .. } = bp.access(100, false) else { panic!("page 100 is new") };
        assert_eq!(evicted, Some((2, true)));
        bp.check().unwrap();
    }

    #[test]
    fn a_scan_does_not_flush_the_young_pages() {
        let mut bp = BufferPool::new(100);
        // A hot set of 50 pages, each read twice (young).
        for _ in 0..2 {
            for p in 0..50 {
                bp.access(p, false);
            }
        }
        // A scan of 1000 pages read once each.
        for p in 1000..2000 {
            bp.access(p, false);
            bp.check().unwrap();
        }
        let hot_left = (0..50).filter(|p| bp.frame_of.contains_key(p)).count();
        assert!(hot_left >= 50 * 6 / 10, "young pages survive a scan: {hot_left} of 50 left");
        // Under a plain LRU not one of them would be left.
    }

    #[test]
    fn misses_below_the_file_end_read_it_and_dirty_evictions_extend_it() {
        let mut bp = BufferPool::new(2);
        bp.access(0, true);
        bp.access(1, true);
        // Page 0 is evicted dirty: the file now holds page 0; page 2 is fresh.
        assert_eq!(bp.access(2, false), Step::Miss { frame: 0, evicted: Some((0, true)), fresh: true });
        assert_eq!(bp.file_pages(), 1);
        // Page 0 again: below the file end, so read from the file.
        let Step::Miss { fresh, .. } = bp.access(0, false) else { panic!("page 0 was evicted") };
        assert!(!fresh);
        bp.check().unwrap();
    }
}
