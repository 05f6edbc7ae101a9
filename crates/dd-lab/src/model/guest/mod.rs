//! The emulated guest kernel of one VM: its page cache, per-container memcgs and reclaim.
//!
//! Owns: a slab of page descriptors with intrusive doubly linked LRU lists (u32 indices, no
//! allocation on a hit), the map `(object, index) -> page`, and per memcg four lists as Linux keeps
//! them (file inactive/active, anon inactive/active). It does not know about the second-chance cache
//! or the disk: every page it drops is handed to the caller's sink, which puts it to the pool, writes
//! it back or swaps it out.
//!
//! Behaviour (our reading of Linux's `mm/vmscan.c` and `mm/swap.c`, simplified where noted):
//! * a new page goes to the head of its type's inactive list; a file page with the referenced flag set
//!   (the read or write that brought it in marked it accessed), an anonymous page without;
//! * `mark_page_accessed`: an inactive page accessed once gets the referenced flag, accessed again it
//!   moves to the head of the active list; an active page just gets the flag;
//! * reclaim of a memcg takes pages from the inactive tail; when the inactive list is "low" it is first
//!   refilled from the active tail (flags cleared). Low is Linux's `inactive_list_is_low`:
//!   `inactive * ratio < active` with `ratio = int_sqrt(10 * size in GiB)` (at least 1) of the lists,
//!   the size taken at full scale (`set_size_scale`) so a scaled run keeps the same balance;
//! * file pages are reclaimed before anonymous ones unless the file lists are under 1/8 of the anonymous
//!   lists (a stand-in for swappiness 60, which strongly prefers page cache);
//! * charging a page over the memcg's hard limit reclaims from that memcg only; charging over the VM's
//!   memory reclaims VM-wide: first from the memcg with the largest usage over its soft limit, and once
//!   every memcg is under its soft limit, from the memcg whose oldest inactive page is the oldest
//!   (a global LRU at batch granularity);
//! * with [`Guest::spare_anon`] (set for a provisioned VM: what a guest agent keeping each container's
//!   `memory.low` at its anonymous usage would get from Linux), VM-wide reclaim takes file pages only
//!   while any memcg holds some: the memcg whose oldest file page is the oldest, its file lists first
//!   whatever their balance with its anonymous ones; anonymous pages go to swap VM-wide only once no
//!   page cache is left, and then from the memcg holding the most (the one furthest above an even split
//!   of the VM, as `memory.low` at an even split would protect the others on Linux: a heap that grows
//!   into a full VM swaps itself out, not a smaller one that was there first). Reclaim under a memcg's
//!   own hard limit is unchanged;
//! * `LruMode::Plain` keeps one exact LRU list per memcg (every access moves the page to the head).
//!
//! Invariants: each live page is on exactly one list of its memcg and in the map once; a memcg's usage
//! is the sum of its list lengths; the VM's `used` is the sum of its memcgs' usage.

pub mod memctl;

use crate::scenario::LruMode;

const NIL: u32 = u32::MAX;
pub const FILE_INACTIVE: usize = 0;
pub const FILE_ACTIVE: usize = 1;
pub const ANON_INACTIVE: usize = 2;
pub const ANON_ACTIVE: usize = 3;

const F_DIRTY: u8 = 1;
const F_REFERENCED: u8 = 2;
const F_ANON: u8 = 4;
/// A file page created by a write (not read from the disk or the second-chance cache). Linux sets
/// `PG_mappedtodisk` only when a read maps the page's blocks, and `page_cache_delete` puts a page to
/// cleancache only if it is up to date *and* mapped to disk; any other dropped page is invalidated in
/// cleancache instead. With ext4's delayed allocation a page written by `write()` and reclaimed without
/// being read back is therefore never stored (Table 2's 99% lookup-to-store ratio and zero evictions of
/// the webserver, whose log grows for the whole run, rely on that).
const F_UNMAPPED: u8 = 8;

/// A page key: object id in the high 32 bits, page index in the low 32.
pub type PageKey = u64;

pub fn key(object: u32, index: u32) -> PageKey {
    ((object as u64) << 32) | index as u64
}
pub fn key_object(k: PageKey) -> u32 {
    (k >> 32) as u32
}
pub fn key_index(k: PageKey) -> u32 {
    k as u32
}

#[derive(Clone, Copy)]
struct Page {
    key: PageKey,
    prev: u32,
    next: u32,
    /// When the page was put at the head of its current list (global LRU order).
    stamp: u64,
    cg: u16,
    list: u8,
    flags: u8,
}

#[derive(Clone, Copy, Debug)]
struct List {
    head: u32,
    tail: u32,
    len: u64,
}

impl List {
    const EMPTY: List = List { head: NIL, tail: NIL, len: 0 };
}

/// One container's memory cgroup.
#[derive(Clone, Debug)]
pub struct Memcg {
    /// Hard limit, pages.
    pub hard: u64,
    /// Soft limit, pages (`u64::MAX`: none).
    pub soft: u64,
    pub usage: u64,
    lists: [List; 4],
    pub counters: MemcgCounters,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MemcgCounters {
    pub hits: u64,
    pub misses: u64,
    pub activations: u64,
    pub deactivations: u64,
    /// Pages reclaimed at this memcg's own hard limit.
    pub reclaimed_local: u64,
    /// Pages reclaimed by VM-wide reclaim.
    pub reclaimed_global: u64,
    /// Of those, pages a VM memory controller took by a directed decision (soft-limit or proportional
    /// exceed) and by its LRU fallback (`memctl`; both stay 0 without a controller).
    pub reclaimed_directed: u64,
    pub reclaimed_lru: u64,
}

/// A page the guest dropped: the sink writes it back if dirty and puts it to the pool or swaps it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Evicted {
    pub cg: usize,
    pub key: PageKey,
    pub dirty: bool,
    pub anon: bool,
    /// False for a file page created by a write (see `F_UNMAPPED`): it must not be put to cleancache.
    pub mapped: bool,
}

/// The guest of one VM.
pub struct Guest {
    /// Memory available to containers, pages.
    pub limit: u64,
    pub used: u64,
    pub cgs: Vec<Memcg>,
    slab: Vec<Page>,
    free: Vec<u32>,
    /// `key -> slab index`. An open-addressed table of 16-byte entries (`dd_mrc::KeyMap`): a lookup
    /// is one cache miss where the general map's control bytes and entry were two, and it can be
    /// prefetched ([`Guest::prefetch`]). Never iterated, so its layout decides no result.
    map: dd_mrc::KeyMap,
    clock: u64,
    mode: LruMode,
    batch: u64,
    /// The VM's memory controller; `None` keeps the built-in soft-limit/global-LRU victim choice.
    pub memctl: Option<memctl::GuestMemctl>,
    /// Pages per GiB of the full-scale experiment (see `GuestOptions::size_scale`).
    pages_per_gib: u64,
    /// VM-wide reclaim spares anonymous memory while page cache remains (see the module doc).
    pub spare_anon: bool,
}

impl Guest {
    pub fn new(limit_pages: u64, mode: LruMode, reclaim_batch: u32) -> Guest {
        Guest {
            limit: limit_pages,
            used: 0,
            cgs: Vec::new(),
            slab: Vec::new(),
            free: Vec::new(),
            map: dd_mrc::KeyMap::new(),
            clock: 0,
            mode,
            batch: reclaim_batch as u64,
            memctl: None,
            pages_per_gib: 256 * 1024,
            spare_anon: false,
        }
    }

    /// Sizes the inactive-list ratio as if every list were `1 / scale` times larger (a scaled run of
    /// a full-size experiment).
    pub fn set_size_scale(&mut self, scale: f64) {
        self.pages_per_gib = ((256.0 * 1024.0 * scale).round() as u64).max(1);
    }

    /// Adds a memcg and returns its index.
    pub fn add_memcg(&mut self, hard: u64, soft: u64) -> usize {
        self.cgs.push(Memcg {
            hard,
            soft,
            usage: 0,
            lists: [List::EMPTY; 4],
            counters: MemcgCounters::default(),
        });
        self.cgs.len() - 1
    }

    pub fn contains(&self, k: PageKey) -> bool {
        self.map.get(k).is_some()
    }

    /// Whether page `k` is dirty (false if absent).
    pub fn is_dirty(&self, k: PageKey) -> bool {
        self.map.get(k).is_some_and(|i| self.slab[i as usize].flags & F_DIRTY != 0)
    }

    /// A read or write of a page by memcg `cg`. On a hit marks the page accessed (and dirty on a
    /// write) and returns true; on a miss counts it and returns false (the caller fetches the page and
    /// calls [`Guest::insert`]). O(1), no allocation.
    #[inline]
    pub fn access(&mut self, cg: usize, k: PageKey, write: bool) -> bool {
        match self.map.get(k) {
            Some(i) => {
                self.cgs[cg].counters.hits += 1;
                if write {
                    self.slab[i as usize].flags |= F_DIRTY;
                }
                self.mark_accessed(i);
                true
            }
            None => {
                self.cgs[cg].counters.misses += 1;
                false
            }
        }
    }

    /// Hints the CPU to fetch the map entry of page `k`, an access a few requests ahead (a replayed
    /// trace knows its next requests): the lookup is then no cache miss. Only a hint; nothing changes.
    #[inline]
    pub fn prefetch(&self, k: PageKey) {
        self.map.prefetch(k);
    }

    /// Hints the CPU to fetch the descriptor of page `k` if it is cached (its map entry should have
    /// been prefetched a little earlier): a hit's move to the head then finds it in the cache. Only a
    /// hint; nothing changes.
    #[inline]
    pub fn prefetch_page(&self, k: PageKey) {
        if let Some(i) = self.map.get(k) {
            dd_mrc::prefetch_slot(&self.slab, i as usize);
        }
    }

    fn mark_accessed(&mut self, i: u32) {
        let p = self.slab[i as usize];
        let cg = p.cg as usize;
        match self.mode {
            LruMode::Plain => {
                self.unlink(cg, p.list as usize, i);
                self.push_head(cg, p.list as usize, i);
            }
            LruMode::TwoList => {
                let l = p.list as usize;
                if (l == FILE_INACTIVE || l == ANON_INACTIVE) && p.flags & F_REFERENCED != 0 {
                    self.unlink(cg, l, i);
                    self.slab[i as usize].flags &= !F_REFERENCED;
                    self.push_head(cg, l + 1, i);
                    self.cgs[cg].counters.activations += 1;
                } else {
                    self.slab[i as usize].flags |= F_REFERENCED;
                }
            }
        }
    }

    /// Adds a page that memcg `cg` just read (or created) to the page cache, charging it and reclaiming
    /// first if a limit would be exceeded. Dropped pages go to `sink`. The page must not be present.
    pub fn insert(&mut self, cg: usize, k: PageKey, dirty: bool, anon: bool, sink: &mut dyn FnMut(Evicted)) {
        debug_assert!(self.map.get(k).is_none());
        // Local reclaim at the hard limit, then VM-wide reclaim; each pass frees a batch, so a page
        // charge costs O(1) amortised. A guard stops a pathological loop (nothing reclaimable).
        let mut guard = 0;
        while self.cgs[cg].usage + 1 > self.cgs[cg].hard && guard < 1_000 {
            let n = self.batch;
            if self.reclaim_memcg(cg, n, false, sink) == 0 {
                break;
            }
            guard += 1;
        }
        while self.used + 1 > self.limit && guard < 2_000 {
            if self.reclaim_global(self.batch, sink) == 0 {
                break;
            }
            guard += 1;
        }
        let i = match self.free.pop() {
            Some(i) => i,
            None => {
                self.slab.push(Page { key: 0, prev: NIL, next: NIL, stamp: 0, cg: 0, list: 0, flags: 0 });
                (self.slab.len() - 1) as u32
            }
        };
        let mut flags = 0;
        if dirty {
            flags |= F_DIRTY;
        }
        if anon {
            flags |= F_ANON;
        } else {
            // The read or write that brought the page in marks it accessed: `filemap_read` (earlier
            // `do_generic_file_read`) calls `mark_page_accessed` on every page it copies, a freshly read
            // one included, and `grab_cache_page_write_begin` allocates with `FGP_ACCESSED`. So a file
            // page is activated by its second access, not its third.
            flags |= F_REFERENCED;
            if dirty {
                // A file page that enters the page cache dirty was created by a write, not read.
                flags |= F_UNMAPPED;
            }
        }
        self.slab[i as usize] =
            Page { key: k, prev: NIL, next: NIL, stamp: 0, cg: cg as u16, list: 0, flags };
        let list = if anon { ANON_INACTIVE } else { FILE_INACTIVE };
        self.push_head(cg, list, i);
        self.map.insert(k, i);
        self.cgs[cg].usage += 1;
        self.used += 1;
    }

    /// Removes a page without handing it to the sink (file deleted, truncated). Returns whether it was
    /// there and whether it was dirty.
    pub fn remove(&mut self, k: PageKey) -> Option<bool> {
        let i = self.map.remove(k)?;
        let p = self.slab[i as usize];
        self.unlink(p.cg as usize, p.list as usize, i);
        self.cgs[p.cg as usize].usage -= 1;
        self.used -= 1;
        self.free.push(i);
        Some(p.flags & F_DIRTY != 0)
    }

    /// Clears the dirty flag of a present page (written back). Returns whether it was dirty.
    pub fn clean(&mut self, k: PageKey) -> bool {
        match self.map.get(k) {
            Some(i) => {
                let was = self.slab[i as usize].flags & F_DIRTY != 0;
                self.slab[i as usize].flags &= !F_DIRTY;
                was
            }
            None => false,
        }
    }

    /// Drops every page of memcg `cg` (container stopped) without the sink. Returns how many.
    pub fn drop_memcg(&mut self, cg: usize) -> u64 {
        let mut n = 0;
        for l in 0..4 {
            while let Some(i) = self.tail(cg, l) {
                let k = self.slab[i as usize].key;
                self.remove(k);
                n += 1;
            }
        }
        n
    }

    /// Sets the VM's memory (ballooning) and reclaims down to it.
    pub fn set_limit(&mut self, pages: u64, sink: &mut dyn FnMut(Evicted)) {
        self.limit = pages;
        while self.used > self.limit {
            if self.reclaim_global(self.batch.min(self.used - self.limit).max(1), sink) == 0 {
                break;
            }
        }
    }

    /// Sets a memcg's hard limit and reclaims down to it.
    pub fn set_hard_limit(&mut self, cg: usize, pages: u64, sink: &mut dyn FnMut(Evicted)) {
        self.cgs[cg].hard = pages;
        while self.cgs[cg].usage > pages {
            let n = (self.cgs[cg].usage - pages).min(self.batch);
            if self.reclaim_memcg(cg, n, false, sink) == 0 {
                break;
            }
        }
    }

    /// Length of one of memcg `cg`'s lists.
    pub fn list_len(&self, cg: usize, list: usize) -> u64 {
        self.cgs[cg].lists[list].len
    }

    /// The keys of one list from head (most recent) to tail; for tests and diagnostics.
    pub fn list_keys(&self, cg: usize, list: usize) -> Vec<PageKey> {
        let mut v = Vec::new();
        let mut i = self.cgs[cg].lists[list].head;
        while i != NIL {
            v.push(self.slab[i as usize].key);
            i = self.slab[i as usize].next;
        }
        v
    }

    /// Reclaims up to `n` pages from memcg `cg`. Returns pages freed.
    pub fn reclaim_memcg(&mut self, cg: usize, n: u64, global: bool, sink: &mut dyn FnMut(Evicted)) -> u64 {
        let mut freed = 0;
        while freed < n {
            let c = &self.cgs[cg];
            let file = c.lists[FILE_INACTIVE].len + c.lists[FILE_ACTIVE].len;
            let anon = c.lists[ANON_INACTIVE].len + c.lists[ANON_ACTIVE].len;
            let spare = global && self.spare_anon;
            // Out of page cache mid-batch: the next victim may still have some.
            if file + anon == 0 || (spare && file == 0 && freed > 0) {
                break;
            }
            let file_first = file * 8 >= anon || spare;
            let base = if file > 0 && file_first { FILE_INACTIVE } else { ANON_INACTIVE };
            let (inactive, active) = (base, base + 1);
            if self.mode == LruMode::TwoList {
                let c = &self.cgs[cg];
                let (ia, ac) = (c.lists[inactive].len, c.lists[active].len);
                let gib = (ia + ac) / self.pages_per_gib;
                let ratio = ((10 * gib) as f64).sqrt() as u64;
                if ia * ratio.max(1) < ac || ia == 0 {
                    self.refill(cg, active, (n - freed).max(self.batch));
                }
            }
            let Some(i) = self.tail(cg, inactive) else { break };
            let p = self.slab[i as usize];
            self.unlink(cg, inactive, i);
            self.map.remove(p.key);
            self.free.push(i);
            self.cgs[cg].usage -= 1;
            self.used -= 1;
            if global {
                self.cgs[cg].counters.reclaimed_global += 1;
            } else {
                self.cgs[cg].counters.reclaimed_local += 1;
            }
            sink(Evicted {
                cg,
                key: p.key,
                dirty: p.flags & F_DIRTY != 0,
                anon: p.flags & F_ANON != 0,
                mapped: p.flags & F_UNMAPPED == 0,
            });
            freed += 1;
        }
        freed
    }

    /// Moves up to `n` pages from the tail of `active` to the head of its inactive list.
    fn refill(&mut self, cg: usize, active: usize, n: u64) {
        for _ in 0..n {
            let Some(i) = self.tail(cg, active) else { break };
            self.unlink(cg, active, i);
            self.slab[i as usize].flags &= !F_REFERENCED;
            self.push_head(cg, active - 1, i);
            self.cgs[cg].counters.deactivations += 1;
        }
    }

    /// The memcg VM-wide reclaim takes from next: largest usage over soft limit, else oldest page.
    pub fn global_victim(&self) -> Option<usize> {
        if let Some(i) = self.furthest_above(|c| c.soft) {
            return Some(i);
        }
        if self.spare_anon {
            if let Some(i) = self.oldest_in(0..self.cgs.len(), FILE_INACTIVE..=FILE_ACTIVE) {
                return Some(i);
            }
            // No page cache left: anonymous memory goes from the memcg holding the most (the one
            // furthest above an even split of the VM), not from the oldest page's. A heap that grows
            // into a full VM then swaps itself out, not a smaller heap that was there first.
            return self.furthest_above(|_| 0);
        }
        self.oldest_memcg(0..self.cgs.len())
    }

    /// Pages per reclaim pass.
    pub fn batch(&self) -> u64 {
        self.batch
    }

    /// Of the memcgs whose usage is above `floor`, the one furthest above it (the first of equals).
    fn furthest_above(&self, floor: impl Fn(&Memcg) -> u64) -> Option<usize> {
        let mut best: Option<(u64, usize)> = None;
        for (i, c) in self.cgs.iter().enumerate() {
            let f = floor(c);
            if c.usage > f && best.is_none_or(|(e, _)| c.usage - f > e) {
                best = Some((c.usage - f, i));
            }
        }
        best.map(|(_, i)| i)
    }

    /// Of `members`, the memcg whose oldest page is the oldest (a global LRU at batch granularity).
    pub fn oldest_memcg(&self, members: impl IntoIterator<Item = usize>) -> Option<usize> {
        self.oldest_in(members, FILE_INACTIVE..=ANON_ACTIVE)
    }

    /// Of `members`, the memcg whose oldest page on `lists` is the oldest.
    fn oldest_in(
        &self,
        members: impl IntoIterator<Item = usize>,
        lists: std::ops::RangeInclusive<usize>,
    ) -> Option<usize> {
        let mut oldest: Option<(u64, usize)> = None;
        for ci in members {
            for l in self.cgs[ci].lists[lists.clone()].iter() {
                if l.tail != NIL {
                    let s = self.slab[l.tail as usize].stamp;
                    if oldest.is_none_or(|(o, _)| s < o) {
                        oldest = Some((s, ci));
                    }
                }
            }
        }
        oldest.map(|(_, i)| i)
    }

    /// One VM-wide reclaim pass of up to `n` pages (with a memory controller: one request of its own
    /// size, see `memctl`). Returns pages freed.
    pub fn reclaim_global(&mut self, n: u64, sink: &mut dyn FnMut(Evicted)) -> u64 {
        if self.memctl.is_some() {
            return memctl::reclaim(self, n, sink);
        }
        match self.global_victim() {
            Some(cg) => {
                let c = &self.cgs[cg];
                // Soft-limit reclaim takes no more than the excess, as Linux's soft-limit pass.
                let n = if c.usage > c.soft { n.min(c.usage - c.soft).max(1) } else { n };
                self.reclaim_memcg(cg, n, true, sink)
            }
            None => 0,
        }
    }

    fn tail(&self, cg: usize, l: usize) -> Option<u32> {
        let t = self.cgs[cg].lists[l].tail;
        (t != NIL).then_some(t)
    }

    #[inline]
    fn push_head(&mut self, cg: usize, l: usize, i: u32) {
        self.clock += 1;
        let head = self.cgs[cg].lists[l].head;
        {
            let p = &mut self.slab[i as usize];
            p.prev = NIL;
            p.next = head;
            p.list = l as u8;
            p.stamp = self.clock;
        }
        if head != NIL {
            self.slab[head as usize].prev = i;
        } else {
            self.cgs[cg].lists[l].tail = i;
        }
        let list = &mut self.cgs[cg].lists[l];
        list.head = i;
        list.len += 1;
    }

    #[inline]
    fn unlink(&mut self, cg: usize, l: usize, i: u32) {
        let (prev, next) = {
            let p = &self.slab[i as usize];
            (p.prev, p.next)
        };
        if prev != NIL {
            self.slab[prev as usize].next = next;
        } else {
            self.cgs[cg].lists[l].head = next;
        }
        if next != NIL {
            self.slab[next as usize].prev = prev;
        } else {
            self.cgs[cg].lists[l].tail = prev;
        }
        self.cgs[cg].lists[l].len -= 1;
    }

    /// Verifies the invariants in the module doc (tests).
    pub fn check_invariants(&self) -> Result<(), String> {
        let mut total = 0;
        for (ci, c) in self.cgs.iter().enumerate() {
            let mut sum = 0;
            for l in 0..4 {
                let keys = self.list_keys(ci, l);
                if keys.len() as u64 != c.lists[l].len {
                    return Err(format!(
                        "memcg {ci} list {l}: len {} but {} linked",
                        c.lists[l].len,
                        keys.len()
                    ));
                }
                for k in keys {
                    let i = self.map.get(k).ok_or(format!("key {k:x} on a list but not in the map"))?;
                    let p = &self.slab[i as usize];
                    if p.cg as usize != ci || p.list as usize != l {
                        return Err(format!("key {k:x}: descriptor says memcg {} list {}", p.cg, p.list));
                    }
                }
                sum += c.lists[l].len;
            }
            if sum != c.usage {
                return Err(format!("memcg {ci}: usage {} but {} pages listed", c.usage, sum));
            }
            total += sum;
        }
        if total != self.used || self.map.len() as u64 != total {
            return Err(format!("used {} map {} listed {}", self.used, self.map.len(), total));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn g(limit: u64) -> Guest {
        Guest::new(limit, LruMode::TwoList, 4)
    }

    #[test]
    fn new_file_page_is_inactive_referenced_and_its_next_access_promotes() {
        let mut g = g(100);
        let cg = g.add_memcg(100, u64::MAX);
        let mut none = |_e: Evicted| panic!("no eviction expected");
        g.insert(cg, key(1, 0), false, false, &mut none);
        assert_eq!(g.list_keys(cg, FILE_INACTIVE), vec![key(1, 0)]);
        // The read that brought the page in marked it accessed: the next access activates it.
        assert!(g.access(cg, key(1, 0), false));
        assert_eq!(g.list_keys(cg, FILE_ACTIVE), vec![key(1, 0)]);
        assert_eq!(g.list_len(cg, FILE_INACTIVE), 0);
        assert_eq!(g.cgs[cg].counters.activations, 1);
        // An active page stays at its place on a further access (Linux only sets the flag).
        g.insert(cg, key(1, 1), false, false, &mut none);
        g.access(cg, key(1, 1), false);
        assert_eq!(g.list_keys(cg, FILE_ACTIVE), vec![key(1, 1), key(1, 0)]);
        assert!(g.access(cg, key(1, 0), false));
        assert_eq!(g.list_keys(cg, FILE_ACTIVE), vec![key(1, 1), key(1, 0)]);
        // An anonymous page starts unreferenced: two accesses to activate.
        g.insert(cg, key(2, 0), true, true, &mut none);
        assert!(g.access(cg, key(2, 0), false));
        assert_eq!(g.list_keys(cg, ANON_INACTIVE), vec![key(2, 0)]);
        assert!(g.access(cg, key(2, 0), false));
        assert_eq!(g.list_keys(cg, ANON_ACTIVE), vec![key(2, 0)]);
        assert!(!g.access(cg, key(1, 9), false));
        assert_eq!(g.cgs[cg].counters.misses, 1);
        g.check_invariants().unwrap();
    }

    #[test]
    fn inactive_ratio_follows_the_full_scale_list_size() {
        // 2 GiB of file pages at scale 1/1024 (512 pages): Linux's ratio for 2 GiB is int_sqrt(20) = 4,
        // so refill stops once inactive * 4 >= active. Unscaled, the same 512 pages count as < 1 GiB
        // (ratio 1) and refill keeps going until inactive >= active.
        let fill = |scale: f64| {
            let mut g = Guest::new(10_000, LruMode::TwoList, 1);
            g.set_size_scale(scale);
            let cg = g.add_memcg(512, u64::MAX);
            let mut none = |_e: Evicted| {};
            for i in 0..512 {
                g.insert(cg, key(1, i), false, false, &mut none);
                g.access(cg, key(1, i), false);
            }
            // Everything active; a stream of new pages forces reclaim, and each pass refills the
            // inactive list from the active tail while the inactive list is low.
            for i in 0..600 {
                g.insert(cg, key(2, i), false, false, &mut none);
            }
            g.check_invariants().unwrap();
            (g.list_len(cg, FILE_INACTIVE), g.list_len(cg, FILE_ACTIVE))
        };
        let (ia, ac) = fill(1.0 / 1024.0);
        assert!((100..=106).contains(&ia) && ia + ac == 512, "scaled: inactive {ia} active {ac}");
        let (ia, ac) = fill(1.0);
        assert!((254..=258).contains(&ia) && ia + ac == 512, "unscaled: inactive {ia} active {ac}");
    }

    #[test]
    fn reclaim_takes_inactive_tail_and_refills_from_active() {
        let mut g = g(100);
        let cg = g.add_memcg(4, u64::MAX);
        let mut ev = Vec::new();
        for i in 0..4 {
            g.insert(cg, key(1, i), false, false, &mut |e| ev.push(e));
        }
        // Promote pages 0 and 1 to active.
        for i in 0..2 {
            g.access(cg, key(1, i), false);
            g.access(cg, key(1, i), false);
        }
        assert_eq!(g.list_keys(cg, FILE_INACTIVE), vec![key(1, 3), key(1, 2)]);
        // Hard limit 4: inserting a fifth reclaims from the inactive tail first: page 2, then 3 (batch
        // of 4, but refill happens when inactive < active).
        g.insert(cg, key(1, 4), false, false, &mut |e| ev.push(e));
        assert_eq!(ev[0].key, key(1, 2), "oldest inactive page goes first");
        assert!(ev.iter().all(|e| e.cg == cg && !e.dirty && !e.anon));
        assert!(g.cgs[cg].usage <= 4);
        assert!(g.cgs[cg].counters.reclaimed_local >= 1);
        g.check_invariants().unwrap();
    }

    #[test]
    fn refill_moves_active_tail_to_inactive_and_clears_referenced() {
        let mut g = Guest::new(100, LruMode::TwoList, 1);
        let cg = g.add_memcg(3, u64::MAX);
        let mut ev = Vec::new();
        for i in 0..3 {
            g.insert(cg, key(1, i), false, false, &mut |e| ev.push(e));
            g.access(cg, key(1, i), false);
            g.access(cg, key(1, i), false);
        }
        assert_eq!(g.list_keys(cg, FILE_ACTIVE), vec![key(1, 2), key(1, 1), key(1, 0)]);
        g.insert(cg, key(1, 9), false, false, &mut |e| ev.push(e));
        // Inactive was empty: refill moved the active tail (page 0) down, and it was reclaimed.
        assert_eq!(ev.len(), 1);
        assert_eq!(ev[0].key, key(1, 0));
        assert_eq!(g.cgs[cg].counters.deactivations, 1);
        g.check_invariants().unwrap();
    }

    #[test]
    fn memcg_hard_limit_reclaims_only_that_memcg() {
        let mut g = g(1000);
        let a = g.add_memcg(10, u64::MAX);
        let b = g.add_memcg(10, u64::MAX);
        let mut ev = Vec::new();
        for i in 0..10 {
            g.insert(b, key(2, i), false, false, &mut |e| ev.push(e));
        }
        for i in 0..50 {
            g.insert(a, key(1, i), false, false, &mut |e| ev.push(e));
        }
        assert!(ev.iter().all(|e| e.cg == a), "only the memcg at its limit is reclaimed");
        assert_eq!(g.cgs[b].usage, 10);
        assert!(g.cgs[a].usage <= 10);
        assert_eq!(g.cgs[a].counters.reclaimed_global, 0);
        g.check_invariants().unwrap();
    }

    #[test]
    fn vm_wide_reclaim_prefers_largest_soft_limit_excess_then_global_lru() {
        let mut g = g(30);
        let a = g.add_memcg(100, 5); // soft limit 5
        let b = g.add_memcg(100, 12); // soft limit 12
        let c = g.add_memcg(100, u64::MAX);
        let mut ev = Vec::new();
        // c first (oldest pages), then a 13 pages (excess 8), b 14 (excess 2): 30 pages, full.
        for i in 0..3 {
            g.insert(c, key(3, i), false, false, &mut |e| ev.push(e));
        }
        for i in 0..13 {
            g.insert(a, key(1, i), false, false, &mut |e| ev.push(e));
        }
        for i in 0..14 {
            g.insert(b, key(2, i), false, false, &mut |e| ev.push(e));
        }
        assert!(ev.is_empty());
        assert_eq!(g.global_victim(), Some(a), "largest excess over the soft limit");
        // Keep inserting into c: a is reclaimed down to its soft limit, then b, before any c page goes.
        let mut order = Vec::new();
        for i in 3..13 {
            g.insert(c, key(3, i), false, false, &mut |e| order.push(e.cg));
        }
        assert_eq!(g.cgs[a].usage, 5, "a reclaimed exactly to its soft limit");
        assert_eq!(g.cgs[b].usage, 12, "then b to its soft limit");
        let first_b = order.iter().position(|&x| x == b).unwrap();
        assert!(order[..first_b].iter().all(|&x| x == a));
        assert!(!order.contains(&c));
        // Everyone under soft limit: global LRU, the oldest page is c's first one.
        assert_eq!(g.global_victim(), Some(c));
        let mut e2 = Vec::new();
        g.insert(c, key(3, 99), false, false, &mut |e| e2.push(e));
        assert_eq!(e2[0].key, key(3, 0));
        g.check_invariants().unwrap();
    }

    #[test]
    fn vm_wide_reclaim_spares_anonymous_memory_while_page_cache_remains() {
        // A heap (the oldest pages) and a mixed memcg with 6 anonymous and 1 file page, then a page
        // cache that fills the VM: with `spare_anon` every page VM-wide reclaim takes is a file page,
        // the mixed memcg's too (its file lists are under an eighth of its anonymous ones). Without it
        // the heap's oldest page goes first. (Below: once no page cache is left, anonymous pages go.)
        for spare in [true, false] {
            let mut g = g(20);
            g.spare_anon = spare;
            let (heap, mixed, cache) =
                (g.add_memcg(100, u64::MAX), g.add_memcg(100, u64::MAX), g.add_memcg(100, u64::MAX));
            let mut ev = Vec::new();
            for i in 0..8 {
                g.insert(heap, key(1, i), true, true, &mut |e| ev.push(e));
            }
            for i in 0..6 {
                g.insert(mixed, key(2, i), true, true, &mut |e| ev.push(e));
            }
            g.insert(mixed, key(3, 0), false, false, &mut |e| ev.push(e));
            for i in 0..5 {
                g.insert(cache, key(4, i), false, false, &mut |e| ev.push(e));
            }
            assert!(ev.is_empty());
            for i in 5..11 {
                g.insert(cache, key(4, i), false, false, &mut |e| ev.push(e));
            }
            if spare {
                assert!(ev.iter().all(|e| !e.anon), "only page cache while some is left: {ev:?}");
                assert_eq!(ev[0].key, key(3, 0), "the oldest file page, the mixed memcg's");
            } else {
                assert!(ev[0].anon && ev[0].key == key(1, 0), "the heap's oldest page first: {ev:?}");
            }
            g.check_invariants().unwrap();
        }
        // Nothing but anonymous memory left: it is reclaimed after all.
        let mut g = g(4);
        g.spare_anon = true;
        let a = g.add_memcg(100, u64::MAX);
        let mut ev = Vec::new();
        for i in 0..6 {
            g.insert(a, key(1, i), true, true, &mut |e| ev.push(e));
        }
        assert!(!ev.is_empty() && ev.iter().all(|e| e.anon), "{ev:?}");
        assert_eq!(g.cgs[a].usage, 4);
    }

    #[test]
    fn with_no_page_cache_left_anonymous_memory_goes_from_the_largest_memcg() {
        // A heap of 3 pages (the oldest), then one that grows to fill the VM and beyond: with
        // `spare_anon` the grower, holding the most, gives its own pages and the first heap keeps all
        // of its; without it the first heap's pages, the oldest, go.
        for spare in [true, false] {
            let mut g = g(8);
            g.spare_anon = spare;
            let (first, grower) = (g.add_memcg(100, u64::MAX), g.add_memcg(100, u64::MAX));
            let mut ev = Vec::new();
            for i in 0..3 {
                g.insert(first, key(1, i), true, true, &mut |e| ev.push(e));
            }
            for i in 0..9 {
                g.insert(grower, key(2, i), true, true, &mut |e| ev.push(e));
            }
            if spare {
                assert!(ev.iter().all(|e| e.cg == grower), "the grower swaps itself out: {ev:?}");
                assert_eq!(g.cgs[first].usage, 3);
            } else {
                assert_eq!(ev[0].key, key(1, 0), "the oldest page first: {ev:?}");
            }
            g.check_invariants().unwrap();
        }
    }

    #[test]
    fn dirty_flag_travels_to_the_sink_and_clean_clears_it() {
        let mut g = Guest::new(2, LruMode::TwoList, 1);
        let cg = g.add_memcg(100, u64::MAX);
        let mut ev = Vec::new();
        g.insert(cg, key(1, 0), false, false, &mut |e| ev.push(e));
        assert!(g.access(cg, key(1, 0), true)); // write: dirty
        assert!(g.is_dirty(key(1, 0)));
        g.insert(cg, key(1, 1), true, false, &mut |e| ev.push(e));
        assert!(g.clean(key(1, 1)));
        assert!(!g.is_dirty(key(1, 1)));
        // Page 0 was activated by the write; page 1 (created by a write, written back) goes first.
        g.insert(cg, key(1, 2), false, false, &mut |e| ev.push(e));
        assert_eq!(ev, vec![Evicted { cg, key: key(1, 1), dirty: false, anon: false, mapped: false }]);
        g.insert(cg, key(1, 3), false, true, &mut |e| ev.push(e));
        assert_eq!(ev[1], Evicted { cg, key: key(1, 2), dirty: false, anon: false, mapped: true });
        // Only page 0 is left on the file lists: refilled from the active list, it leaves still dirty
        // (the sink writes it back before anything else happens to it).
        g.insert(cg, key(1, 4), false, true, &mut |e| ev.push(e));
        assert_eq!(ev[2], Evicted { cg, key: key(1, 0), dirty: true, anon: false, mapped: true });
        g.check_invariants().unwrap();
    }

    #[test]
    fn plain_mode_is_exact_lru() {
        let mut g = Guest::new(1000, LruMode::Plain, 1);
        let cg = g.add_memcg(3, u64::MAX);
        let mut ev = Vec::new();
        for i in 0..3 {
            g.insert(cg, key(1, i), false, false, &mut |e| ev.push(e.key));
        }
        g.access(cg, key(1, 0), false);
        g.insert(cg, key(1, 3), false, false, &mut |e| ev.push(e.key));
        assert_eq!(ev, vec![key(1, 1)]);
        assert_eq!(g.list_keys(cg, FILE_INACTIVE), vec![key(1, 3), key(1, 0), key(1, 2)]);
    }

    #[test]
    fn balloon_down_reclaims_and_remove_and_drop_work() {
        let mut g = g(20);
        let a = g.add_memcg(100, u64::MAX);
        let mut ev = Vec::new();
        for i in 0..20 {
            g.insert(a, key(1, i), i % 2 == 0, false, &mut |e| ev.push(e));
        }
        g.set_limit(8, &mut |e| ev.push(e));
        assert_eq!(g.used, 8);
        assert_eq!(ev.len(), 12);
        assert_eq!(g.remove(key(1, 19)), Some(false));
        assert_eq!(g.remove(key(1, 19)), None);
        assert_eq!(g.drop_memcg(a), 7);
        assert_eq!(g.used, 0);
        g.check_invariants().unwrap();
    }
}
