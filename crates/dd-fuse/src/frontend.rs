//! The cleancache frontend of paper 002 (section 4.1) in user space: per-container first-level page
//! caches in front of the daemon's pools, in front of the backing directory.
//!
//! Owns: the containers (each with its [`Level1`] cache and counters), the per-file [`Object`] state,
//! and the connections to the daemon. An object is a backing file, identified to the daemon by its
//! backing inode number (stable across renames, so a renamed file keeps its cached pages).
//!
//! Data path. A read of container C looks each page up in C's first level, then gets the missing ones
//! from C's pool (exclusive: the pool forgets them), then reads the rest from the backing file (one
//! request per contiguous run, each delayed by `backing_read_latency_us`), and fills C's first level;
//! pages pushed out of it are put to C's pool. A write goes to the backing file, then drops the pages it
//! covers from every first level and flushes them from every pool that may hold them; so does every
//! other change of bytes through the mount, by [`Frontend::change_range`] under the same exclusive lock:
//! `fallocate` punching a hole or zeroing a range (that range), collapsing or inserting one (from the
//! offset to the end: the bytes move; FUSE itself refuses these two today), a `copy_file_range`
//! destination (the range copied). Truncation, unlink, an overwriting rename and a change of the
//! backing file behind the mount's back drop and flush the whole object. An object read by another
//! container than its owner migrates: its first-level pages move to the new owner's first level and
//! its pool pages with MIGRATE_OBJECT.
//!
//! Coherence (a reader sees what the backing file holds, for changes made through the mount): every
//! object has a reader-writer lock and a write generation. Reads (lookups, pool gets, backing reads and
//! first-level fills) hold it shared; writes, other changes of bytes (`change_range`), truncation,
//! invalidation and migration hold it exclusively and bump the generation. A first-level page remembers the generation it was filled at;
//! a page evicted later is put to a pool only under the shared lock and only if the generation is
//! unchanged, so a put can never re-insert a page that a write has invalidated since it was read.
//! Changes made to the backing directory directly are detected by the (inode, size, mtime, ctime) stamp
//! each read compares under the lock; a change within one timestamp tick that keeps the size is not seen
//! (documented in README).
//!
//! Shared mappings (issue 13). Files are opened `FOPEN_DIRECT_IO`, so `read`/`write` bypass the kernel's
//! page cache, and the mount asks for `FUSE_DIRECT_IO_ALLOW_MMAP` (Linux 6.6+), so files can be mapped:
//! a mapping's pages do live in the kernel's page cache. Why the invariant above still holds:
//! * a page the kernel maps is faulted in by an ordinary READ, served by this frontend like any read
//!   (first level, pool, backing file, under the object's shared lock);
//! * a page written through a mapping reaches the mount as a WRITE (write-back at `msync`, `fsync`,
//!   `close` or the kernel's periodic write-back), which goes through [`Frontend::write`]: backing file
//!   first, then both levels invalidated, as for any write. Until then the bytes are only in the
//!   kernel's page, which every mapping of the file on this machine shares (so two containers' mappings,
//!   sqlite's `-shm` for example, see each other's stores at once);
//! * the kernel's cached pages of a file are dropped when a `write(2)` through the mount changes them
//!   (the FUSE side invalidates the written range; a write-back of the kernel's own pages does not), when
//!   the file is opened (no `FOPEN_KEEP_CACHE`), and when the mount sees a change behind its back (a read
//!   or write finds a new stamp: [`Frontend::on_change`]). Dropping a dirty page writes it back first, so
//!   nothing written through a mapping is lost. The documented point for a change made behind the mount:
//!   an existing mapping shows it once the file has been opened or read through the mount after it.
//!
//! Lock order: object lock (at most one held blocking; other objects' locks only by
//! `try_read_recursive`, which never waits) -> container first-level mutexes, `objects`, `containers`,
//! an object's small mutexes, the idle-connection list (all leaves). Network I/O happens only under an
//! object lock, which only users of that same file need; never under a first-level mutex.

use crate::attrib::{Attributor, ParentCgroup, UNATTRIBUTED};
use crate::config::{FuseConfig, PAGE_SIZE};
use crate::daemon::{self, Clients, Stale};
use crate::level1::{Evicted, Level1};
use crate::sampling::{page_key, ReadTimes, Sampled};
use dd_client::{ClientError, PoolRef};
use dd_proto::{Request, Response};
use dd_types::{Key, PoolId};
use parking_lot::{Mutex, RwLock, RwLockReadGuard};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fs::{File, Metadata};
use std::os::unix::fs::{FileExt, MetadataExt};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Writes covering more pages than this flush the whole object instead of page by page.
const MAX_PAGE_FLUSHES: u64 = 1024;

/// Errors of starting the frontend.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum FrontendError {
    #[error("daemon: {0}")]
    Daemon(#[from] ClientError),
    #[error("cgroup_parent {0} is not a directory of a cgroup filesystem")]
    NotACgroup(std::path::PathBuf),
}

/// What identifies the content of a backing file at one moment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Stamp {
    ino: u64,
    size: u64,
    mtime_ns: i128,
    ctime_ns: i128,
}

impl Stamp {
    fn of(m: &Metadata) -> Stamp {
        let ns = |s: i64, n: i64| s as i128 * 1_000_000_000 + n as i128;
        Stamp {
            ino: m.ino(),
            size: m.size(),
            mtime_ns: ns(m.mtime(), m.mtime_nsec()),
            ctime_ns: ns(m.ctime(), m.ctime_nsec()),
        }
    }
}

/// One backing file's cache state.
pub struct Object {
    pub id: u64,
    lock: RwLock<()>,
    generation: AtomicU64,
    stamp: Mutex<Option<Stamp>>,
    owner: Mutex<Option<Arc<Container>>>,
    /// Pools that may hold pages of this object (flushes go to each).
    pools: Mutex<BTreeSet<u32>>,
}

/// Counters of one container.
#[derive(Debug, Default)]
struct Counters {
    l1_hits: AtomicU64,
    pool_hits: AtomicU64,
    backing_pages: AtomicU64,
    backing_reads: AtomicU64,
    puts: AtomicU64,
    puts_dropped: AtomicU64,
    migrations: AtomicU64,
}

/// A container (cgroup) as the filesystem sees it.
pub struct Container {
    pub name: String,
    l1: Mutex<Level1>,
    counters: Counters,
    /// Its reads' curve (`[sampling]` on) and where their time goes.
    pub(crate) sampled: Option<Sampled>,
    pub(crate) times: ReadTimes,
}

/// One container's counters, for reports; the same type the mount publishes for the provisioner.
pub use dd_guest::mount_stats::ContainerStats;

pub struct Frontend {
    cfg: FuseConfig,
    attrib: Attributor,
    containers: RwLock<HashMap<String, Arc<Container>>>,
    objects: Mutex<HashMap<u64, Arc<Object>>>,
    clients: Option<Clients>,
    /// Objects whose flush did not reach the daemon: while any is left, no pool is used (`daemon`).
    stale: Mutex<Stale>,
    latency: Duration,
    /// Told `(object, offset, length)` (length 0: to the end) when the mount sees that a backing file
    /// changed behind its back. The FUSE side drops the kernel's cached pages of the file, which is what
    /// keeps shared mappings coherent with such changes (see the module documentation).
    kernel_cache: std::sync::OnceLock<KernelCacheHook>,
}

/// See [`Frontend::on_change`].
pub type KernelCacheHook = Box<dyn Fn(u64, i64, i64) + Send + Sync>;

fn page_box(b: &[u8]) -> Box<[u8]> {
    b.to_vec().into_boxed_slice()
}

impl Frontend {
    /// Connects to the daemon (if configured) once, so that a wrong address or token fails the mount.
    pub fn new(cfg: FuseConfig) -> Result<Frontend, FrontendError> {
        let parent = match &cfg.cgroup_parent {
            Some(p) => Some(ParentCgroup::locate(p).ok_or_else(|| FrontendError::NotACgroup(p.clone()))?),
            None => None,
        };
        let clients = match &cfg.daemon {
            Some(d) => Some(Clients::connect(d)?),
            None => None,
        };
        let attrib = Attributor::new(
            parent,
            cfg.state_file.clone(),
            Duration::from_millis(cfg.attribution_refresh_ms),
        );
        Ok(Frontend {
            latency: Duration::from_micros(cfg.backing_read_latency_us),
            cfg,
            attrib,
            containers: RwLock::new(HashMap::new()),
            objects: Mutex::new(HashMap::new()),
            clients,
            stale: Mutex::new(Stale::default()),
            kernel_cache: std::sync::OnceLock::new(),
        })
    }

    /// Sets the hook told of every change of a backing file's bytes (once; later calls are ignored).
    pub fn on_change(&self, hook: KernelCacheHook) {
        let _ = self.kernel_cache.set(hook);
    }

    fn changed(&self, obj: &Object, offset: u64, len: u64) {
        if let Some(h) = self.kernel_cache.get() {
            h(obj.id, offset.min(i64::MAX as u64) as i64, len.min(i64::MAX as u64) as i64);
        }
    }

    /// The container of a calling process.
    pub fn container_for_pid(&self, pid: u32) -> Arc<Container> {
        let name = self.attrib.container_of(pid);
        self.container(&name)
    }

    fn container(&self, name: &str) -> Arc<Container> {
        if let Some(c) = self.containers.read().get(name) {
            return c.clone();
        }
        self.containers
            .write()
            .entry(name.to_string())
            .or_insert_with(|| {
                let s = &self.cfg.sampling;
                // A seed per container name, so two containers' samples are independent.
                let seed = name
                    .bytes()
                    .fold(0xcbf2_9ce4_8422_2325u64, |h, b| (h ^ b as u64).wrapping_mul(0x100_0000_01b3));
                Arc::new(Container {
                    name: name.to_string(),
                    l1: Mutex::new(Level1::new(self.cfg.budget_pages(name))),
                    counters: Counters::default(),
                    sampled: s.enabled.then(|| Sampled::new(s.max_samples as usize, seed)),
                    times: ReadTimes::default(),
                })
            })
            .clone()
    }

    /// The pool a container's pages go to and come from, if the second level may be used now: the
    /// watcher published one, the daemon is not known to be away (back-off), and no flush is
    /// outstanding (`daemon::Stale`). A pool of another instance than the one last reached is not
    /// refused here: either the watcher has not caught up with a restart (the call is then refused
    /// without I/O, `ClientError::PoolLost`), or the daemon restarted and this mount has not noticed yet
    /// (its connections are dead): only a call finds that out, and it reconnects.
    fn pool(&self, c: &Container) -> Option<PoolRef> {
        let cl = self.clients.as_ref()?;
        let p = self.attrib.pool_of(&c.name)?;
        if !cl.ready() {
            return None;
        }
        let pools_of = |o: u64| -> Vec<u32> {
            let obj = self.objects.lock().get(&o).cloned();
            obj.map_or_else(Vec::new, |obj| obj.pools.lock().iter().copied().collect())
        };
        daemon::recover(&self.stale, cl, pools_of).then_some(p)
    }

    /// The state of a backing object (created on first use; kept for the life of the mount so that one
    /// backing inode never has two locks).
    pub fn object(&self, id: u64) -> Arc<Object> {
        let mut objects = self.objects.lock();
        if let Some(o) = objects.get(&id) {
            return o.clone();
        }
        // Pools of an earlier mount (or a crashed one) may hold pages of this inode: the first read
        // finds no stamp, revalidates, and so flushes it from every pool known now.
        let pools = match &self.clients {
            Some(_) => self.attrib.all_pools().into_iter().map(|p| p.id.0).collect(),
            None => BTreeSet::new(),
        };
        let o = Arc::new(Object {
            id,
            lock: RwLock::new(()),
            generation: AtomicU64::new(0),
            stamp: Mutex::new(None),
            owner: Mutex::new(None),
            pools: Mutex::new(pools),
        });
        objects.insert(id, o.clone());
        o
    }

    /// Takes the object's shared lock once its stamp matches the backing file and `c` owns it
    /// (revalidating and migrating under the exclusive lock first if needed). Returns the file size.
    fn prepare<'a>(
        &self,
        c: &Arc<Container>,
        obj: &'a Object,
        file: &File,
        evicted: &mut Vec<(Arc<Container>, Evicted)>,
    ) -> std::io::Result<(RwLockReadGuard<'a, ()>, u64)> {
        loop {
            let g = obj.lock.read();
            let m = file.metadata()?;
            let stamp = Stamp::of(&m);
            let fresh = *obj.stamp.lock() == Some(stamp);
            let owned = obj.owner.lock().as_ref().is_some_and(|o| Arc::ptr_eq(o, c));
            if fresh && owned {
                return Ok((g, m.size()));
            }
            drop(g);
            let _w = obj.lock.write();
            let m = file.metadata()?;
            let stamp = Stamp::of(&m);
            let known = *obj.stamp.lock();
            if known != Some(stamp) {
                obj.generation.fetch_add(1, Ordering::AcqRel);
                self.invalidate_locked(obj, None);
                *obj.stamp.lock() = Some(stamp);
                if known.is_some() {
                    // Changed behind the mount's back: mapped pages in the kernel are stale too.
                    self.changed(obj, 0, 0);
                }
            }
            let prev = obj.owner.lock().replace(c.clone());
            if let Some(prev) = prev.filter(|p| !Arc::ptr_eq(p, c)) {
                self.migrate_locked(obj, &prev, c, evicted);
            }
        }
    }

    /// Moves an object's cached pages from `from` to `to` (exclusive lock held).
    fn migrate_locked(
        &self,
        obj: &Object,
        from: &Arc<Container>,
        to: &Arc<Container>,
        evicted: &mut Vec<(Arc<Container>, Evicted)>,
    ) {
        let pages = from.l1.lock().take_object(obj.id);
        if let (Some(src), Some(dst), Some(cl)) = (self.pool(from), self.pool(to), &self.clients) {
            if src.id != dst.id && src.instance == dst.instance {
                obj.pools.lock().insert(dst.id.0);
                match cl.on_pool(src, |c, s| c.migrate_object(s, dst.id, obj.id)) {
                    Ok(_) => {}
                    // The pages stay where they were, still listed in `pools`: coherent, just not moved.
                    Err(e) if daemon::quiet(&e) => {}
                    Err(e) => {
                        tracing::warn!("migrating object {} from pool {} to {}: {e}", obj.id, src.id, dst.id)
                    }
                }
            }
        }
        let mut l1 = to.l1.lock();
        for (index, generation, data) in pages {
            evicted.extend(l1.insert(obj.id, index, generation, data).into_iter().map(|e| (to.clone(), e)));
        }
        to.counters.migrations.fetch_add(1, Ordering::Relaxed);
    }

    /// Drops pages of an object from every first level and flushes them from every pool that may hold
    /// them: pages `first..=last`, or the whole object (exclusive lock held).
    fn invalidate_locked(&self, obj: &Object, range: Option<(u64, u64)>) {
        let (first, last) = range.unwrap_or((0, u64::MAX));
        for c in self.containers.read().values() {
            c.l1.lock().remove_range(obj.id, first, last);
        }
        let Some(cl) = &self.clients else { return };
        let pools: Vec<u32> = obj.pools.lock().iter().copied().collect();
        for p in pools {
            let pool = PoolId(p);
            let whole = range.is_none() || last - first >= MAX_PAGE_FLUSHES;
            let r = if whole {
                cl.call(|c| c.flush_object(pool, obj.id).map(|_| ()))
            } else {
                // Pipelined: one write of all requests, then the answers in order.
                cl.call(|c| {
                    for index in first..=last {
                        c.send(&Request::FlushPage { pool, key: Key { object: obj.id, index } });
                    }
                    let mut failure = None;
                    while c.outstanding() > 0 {
                        match c.recv()? {
                            (_, Response::Flushed(_)) => {}
                            (_, Response::Error { status, message }) => {
                                failure = Some(ClientError::Server { status, message })
                            }
                            (_, other) => return Err(ClientError::Unexpected(format!("{other:?}"))),
                        }
                    }
                    failure.map_or(Ok(()), Err)
                })
            };
            match r {
                Ok(()) => {
                    if whole {
                        obj.pools.lock().remove(&p);
                    }
                }
                // The daemon answered: the pool is gone (destroyed with its pages) or refused; either way
                // it holds no page of ours that a later get could return.
                Err(ClientError::Server { .. }) => {
                    obj.pools.lock().remove(&p);
                }
                // Not reached (the daemon is away, or the connection broke): the pool may still hold old
                // pages of the object. The link logs the loss; no pool is used until they are flushed or
                // the pool turns out to be gone with a restarted daemon (`daemon::recover`).
                Err(e) => {
                    if !daemon::quiet(&e) {
                        tracing::warn!("flushing object {} from pool {p}: {e}", obj.id);
                    }
                    self.stale.lock().add(cl.link().instance(), obj.id);
                }
            }
        }
    }

    /// Reads `size` bytes at `offset` of `file` (the backing file of `obj`) for container `c`.
    pub fn read(
        &self,
        c: &Arc<Container>,
        obj: &Object,
        file: &File,
        offset: u64,
        size: usize,
    ) -> std::io::Result<Vec<u8>> {
        let mut evicted = Vec::new();
        let started = Instant::now();
        // Evicted pages are put once the object's lock is released (they may be of this object).
        let out = self.read_locked(c, obj, file, (offset, size), &mut evicted);
        if let Ok(b) = &out {
            ReadTimes::add(&c.times.read_ns, started.elapsed().as_nanos() as u64);
            ReadTimes::add(&c.times.read_pages, b.len().div_ceil(PAGE_SIZE) as u64);
        }
        self.put_evicted(evicted);
        out
    }

    fn read_locked(
        &self,
        c: &Arc<Container>,
        obj: &Object,
        file: &File,
        (offset, size): (u64, usize),
        evicted: &mut Vec<(Arc<Container>, Evicted)>,
    ) -> std::io::Result<Vec<u8>> {
        let ps = PAGE_SIZE as u64;
        let (guard, fsize) = self.prepare(c, obj, file, evicted)?;
        if offset >= fsize || size == 0 {
            return Ok(Vec::new());
        }
        let end = fsize.min(offset + size as u64);
        let first = offset / ps;
        let n = ((end - 1) / ps - first + 1) as usize;
        if let Some(sm) = &c.sampled {
            for i in 0..n as u64 {
                sm.access(page_key(obj.id, first + i));
            }
        }
        let mut buf = vec![0u8; n * PAGE_SIZE];
        let slot = |i: usize| i * PAGE_SIZE..(i + 1) * PAGE_SIZE;
        let mut missing = Vec::new();
        {
            let mut l1 = c.l1.lock();
            for i in 0..n {
                if !l1.get(obj.id, first + i as u64, &mut buf[slot(i)]) {
                    missing.push(i);
                }
            }
        }
        c.counters.l1_hits.fetch_add((n - missing.len()) as u64, Ordering::Relaxed);
        let fetched = missing.clone();
        if let (false, Some(pool), Some(cl)) = (missing.is_empty(), self.pool(c), &self.clients) {
            let mut still = Vec::new();
            for chunk in missing.chunks(cl.max_batch) {
                let keys: Vec<Key> =
                    chunk.iter().map(|&i| Key { object: obj.id, index: first + i as u64 }).collect();
                let mut pages = vec![0u8; chunk.len() * PAGE_SIZE];
                let asked = Instant::now();
                let got = cl.on_pool(pool, |cc, id| cc.get_batch(id, &keys, &mut pages));
                ReadTimes::add(&c.times.pool_ns, asked.elapsed().as_nanos() as u64);
                ReadTimes::add(&c.times.pool_pages, chunk.len() as u64);
                match got {
                    Ok(hits) => {
                        for (j, &i) in chunk.iter().enumerate() {
                            if hits[j] {
                                buf[slot(i)].copy_from_slice(&pages[slot(j)]);
                            } else {
                                still.push(i);
                            }
                        }
                    }
                    Err(e) => {
                        if !daemon::quiet(&e) {
                            tracing::warn!("get from pool {}: {e}", pool.id);
                        }
                        still.extend_from_slice(chunk);
                    }
                }
            }
            c.counters.pool_hits.fetch_add((missing.len() - still.len()) as u64, Ordering::Relaxed);
            missing = still;
        }
        // The rest from the backing file, one request per contiguous run.
        let mut k = 0;
        while k < missing.len() {
            let mut e = k + 1;
            while e < missing.len() && missing[e] == missing[e - 1] + 1 {
                e += 1;
            }
            let asked = Instant::now();
            if !self.latency.is_zero() {
                std::thread::sleep(self.latency);
            }
            let (a, b) = (missing[k], missing[e - 1]);
            read_full_at(file, &mut buf[a * PAGE_SIZE..(b + 1) * PAGE_SIZE], (first + a as u64) * ps)?;
            ReadTimes::add(&c.times.backing_ns, asked.elapsed().as_nanos() as u64);
            ReadTimes::add(&c.times.backing_pages, (e - k) as u64);
            c.counters.backing_reads.fetch_add(1, Ordering::Relaxed);
            c.counters.backing_pages.fetch_add((e - k) as u64, Ordering::Relaxed);
            k = e;
        }
        let generation = obj.generation.load(Ordering::Acquire);
        {
            let mut l1 = c.l1.lock();
            for &i in &fetched {
                let ev = l1.insert(obj.id, first + i as u64, generation, page_box(&buf[slot(i)]));
                evicted.extend(ev.into_iter().map(|e| (c.clone(), e)));
            }
        }
        drop(guard);
        let start = (offset - first * ps) as usize;
        buf.truncate(start + (end - offset) as usize);
        buf.drain(..start);
        Ok(buf)
    }

    /// Puts pages evicted from first levels to their containers' pools, each under its object's shared
    /// lock and only if the object was not written since the page was read.
    fn put_evicted(&self, evicted: Vec<(Arc<Container>, Evicted)>) {
        let mut groups: BTreeMap<(String, u64), (Arc<Container>, Vec<Evicted>)> = BTreeMap::new();
        for (c, e) in evicted {
            groups.entry((c.name.clone(), e.object)).or_insert_with(|| (c.clone(), Vec::new())).1.push(e);
        }
        for ((_, object), (c, pages)) in groups {
            let n = pages.len() as u64;
            let (Some(pool), Some(cl)) = (self.pool(&c), &self.clients) else {
                c.counters.puts_dropped.fetch_add(n, Ordering::Relaxed);
                continue;
            };
            let Some(obj) = self.objects.lock().get(&object).cloned() else {
                c.counters.puts_dropped.fetch_add(n, Ordering::Relaxed);
                continue;
            };
            // Never waits: if a writer holds the object, its pages are being invalidated anyway.
            let Some(_g) = obj.lock.try_read_recursive() else {
                c.counters.puts_dropped.fetch_add(n, Ordering::Relaxed);
                continue;
            };
            let generation = obj.generation.load(Ordering::Acquire);
            let valid: Vec<(Key, &[u8])> = pages
                .iter()
                .filter(|p| p.generation == generation)
                .map(|p| (Key { object, index: p.index }, &p.data[..]))
                .collect();
            c.counters.puts_dropped.fetch_add(n - valid.len() as u64, Ordering::Relaxed);
            if valid.is_empty() {
                continue;
            }
            obj.pools.lock().insert(pool.id.0);
            for chunk in valid.chunks(cl.max_batch) {
                match cl.on_pool(pool, |cc, id| cc.put_batch(id, chunk)) {
                    Ok(_) => {
                        c.counters.puts.fetch_add(chunk.len() as u64, Ordering::Relaxed);
                    }
                    Err(e) => {
                        c.counters.puts_dropped.fetch_add(chunk.len() as u64, Ordering::Relaxed);
                        if !daemon::quiet(&e) {
                            tracing::warn!("put to pool {}: {e}", pool.id);
                        }
                    }
                }
            }
        }
    }

    /// Writes through to the backing file, then invalidates the pages written. With `append` (the
    /// handle was opened `O_APPEND`) the data lands at the end whatever `offset` says.
    pub fn write(
        &self,
        obj: &Object,
        file: &File,
        offset: u64,
        data: &[u8],
        append: bool,
    ) -> std::io::Result<usize> {
        let _w = obj.lock.write();
        self.revalidate_locked(obj, file)?;
        let n = file.write_at(data, offset)?;
        let m = file.metadata()?;
        let start = if append { m.size().saturating_sub(n as u64) } else { offset };
        obj.generation.fetch_add(1, Ordering::AcqRel);
        if n > 0 {
            let ps = PAGE_SIZE as u64;
            self.invalidate_locked(obj, Some((start / ps, (start + n as u64 - 1) / ps)));
        }
        *obj.stamp.lock() = Some(Stamp::of(&m));
        Ok(n)
    }

    /// Before a change through the mount (exclusive lock held): a change behind the mount's back since
    /// the last read must not be blessed by the stamp taken after this one, so it drops the whole object.
    fn revalidate_locked(&self, obj: &Object, file: &File) -> std::io::Result<()> {
        let before = Stamp::of(&file.metadata()?);
        let known = *obj.stamp.lock();
        if known != Some(before) {
            obj.generation.fetch_add(1, Ordering::AcqRel);
            self.invalidate_locked(obj, None);
            if known.is_some() {
                self.changed(obj, 0, 0);
            }
        }
        Ok(())
    }

    /// Runs `f` (a change of the bytes `offset..offset + len` of the object's backing file `file`, or
    /// from `offset` to the end with `len` `None`: fallocate's punch, zero, collapse and insert, a
    /// copy_file_range destination) under the object's exclusive lock, then drops and flushes the
    /// pages of that range, as [`Frontend::write`] does for the bytes it wrote.
    pub fn change_range<T>(
        &self,
        obj: &Object,
        file: &File,
        offset: u64,
        len: Option<u64>,
        f: impl FnOnce() -> std::io::Result<T>,
    ) -> std::io::Result<T> {
        let _w = obj.lock.write();
        self.revalidate_locked(obj, file)?;
        let r = f();
        obj.generation.fetch_add(1, Ordering::AcqRel);
        let ps = PAGE_SIZE as u64;
        let last = match len {
            Some(0) => None,
            Some(n) => Some(offset.saturating_add(n - 1) / ps),
            None => Some(u64::MAX),
        };
        if let Some(last) = last {
            self.invalidate_locked(obj, Some((offset / ps, last)));
        }
        // A failed call may have changed part of the range: the next read compares a fresh stamp.
        *obj.stamp.lock() = match (&r, file.metadata()) {
            (Ok(_), Ok(m)) => Some(Stamp::of(&m)),
            _ => None,
        };
        r
    }

    /// Runs `f` (a truncation, unlink or overwriting rename of the object's backing file) under the
    /// object's exclusive lock, then drops and flushes the whole object. Invalidating after the change
    /// means a reader that takes the lock next finds nothing cached from before it.
    pub fn change_whole<T>(
        &self,
        obj: &Object,
        f: impl FnOnce() -> std::io::Result<T>,
    ) -> std::io::Result<T> {
        let _w = obj.lock.write();
        let r = f();
        obj.generation.fetch_add(1, Ordering::AcqRel);
        self.invalidate_locked(obj, None);
        // Whatever the file is now, the next read compares against a fresh stamp.
        *obj.stamp.lock() = None;
        r
    }

    /// Sets a container's first-level budget (pages, at least one); the pages over it are put to its pool.
    pub fn set_budget(&self, name: &str, pages: usize) {
        let c = self.container(name);
        let evicted: Vec<(Arc<Container>, Evicted)> =
            c.l1.lock().set_budget(pages).into_iter().map(|e| (c.clone(), e)).collect();
        self.put_evicted(evicted);
    }

    /// Every container seen so far (for publishing).
    pub(crate) fn containers(&self) -> Vec<Arc<Container>> {
        let mut v: Vec<Arc<Container>> = self.containers.read().values().cloned().collect();
        v.sort_by(|a, b| a.name.cmp(&b.name));
        v
    }

    /// Flushes every object this mount cached from every pool (unmount: nothing left behind).
    pub fn shutdown(&self) {
        let objects: Vec<Arc<Object>> = self.objects.lock().values().cloned().collect();
        for o in objects {
            if !o.pools.lock().is_empty() {
                let _w = o.lock.write();
                self.invalidate_locked(&o, None);
            }
        }
    }

    /// Counters of every container seen so far (unattributed requests under the empty name).
    pub fn stats(&self) -> Vec<ContainerStats> {
        let mut v: Vec<ContainerStats> = self
            .containers
            .read()
            .values()
            .map(|c| {
                let l1 = c.l1.lock();
                let r = |a: &AtomicU64| a.load(Ordering::Relaxed);
                ContainerStats {
                    name: c.name.clone(),
                    pool: if c.name == UNATTRIBUTED { None } else { self.pool(c).map(|p| p.id.0) },
                    l1_budget_pages: l1.budget(),
                    l1_pages: l1.len(),
                    l1_hits: r(&c.counters.l1_hits),
                    pool_hits: r(&c.counters.pool_hits),
                    backing_pages: r(&c.counters.backing_pages),
                    backing_reads: r(&c.counters.backing_reads),
                    puts: r(&c.counters.puts),
                    puts_dropped: r(&c.counters.puts_dropped),
                    migrations: r(&c.counters.migrations),
                }
            })
            .collect();
        v.sort_by(|a, b| a.name.cmp(&b.name));
        v
    }
}

/// Reads until `buf` is full or the file ends (the rest of `buf` is left as it was: zeros).
fn read_full_at(file: &File, mut buf: &mut [u8], mut offset: u64) -> std::io::Result<()> {
    while !buf.is_empty() {
        match file.read_at(buf, offset) {
            Ok(0) => break,
            Ok(k) => {
                buf = &mut buf[k..];
                offset += k as u64;
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests;
