//! One operation of a workload thread: the Filebench personalities' flowop loops (webserver, webproxy,
//! varmail, videoserver as `crate::model::workload` describes them), the key-value store's page
//! accesses, YCSB requests against a store and trace rows, each charged on the VM's vCPUs and the I/O
//! path (`io`).

use super::{Kind, Sim};
use crate::error::LabError;
use crate::model::guest::key;
use crate::model::kvstore::{Space, StoreKind as Db, Touch};
use crate::model::workload::{gamma_pages, Role};
use crate::sim::backend::SecondChance;
use rand::Rng;

/// How many requests ahead a trace replay prefetches the page-cache map entry of a request.
const MAP_AHEAD: usize = 16;
/// How many requests ahead it prefetches the page descriptor (after the map entry, which it reads).
const PAGE_AHEAD: usize = 6;

impl<B: SecondChance> Sim<B> {
    /// Runs one operation of thread `th` of container `c` starting now. Returns its latency, or `None`
    /// when the thread has nothing more to do (a trace that does not repeat).
    pub(super) fn step(&mut self, c: usize, th: usize) -> Result<Option<u64>, LabError> {
        // The operation runs on the VM's earliest free vCPU; its CPU time (everything but device waits)
        // keeps that vCPU busy.
        let vm = self.cts[c].vm;
        let (cpu_i, cpu_free) =
            self.vcpus[vm].iter().copied().enumerate().min_by_key(|&(i, f)| (f, i)).unwrap_or((0, 0));
        let begin = self.now.max(cpu_free);
        self.io_wait = 0;
        let start = self.now;
        let mut t = begin;
        let cpu = self.timing.op_cpu_ns;
        let mut ops = 0u64;
        let mut bytes = 0u64;
        let kind = self.cts[c].kind;
        let role = self.cts[c].roles[th];
        let mut next = role;
        match (kind, role) {
            (Kind::Web { append_kib }, Role::Loop { step }) => {
                if step < 10 {
                    let f = self.pick(c, 0);
                    t += 2 * cpu; // open, close
                    bytes += self.read_whole(c, f, &mut t)?;
                    t += cpu;
                    ops += 3;
                } else {
                    let n = gamma_pages(&mut self.cts[c].rng, append_kib);
                    let log = self.cts[c].log_obj;
                    bytes += self.append(c, log, n, &mut t)?;
                    t += cpu;
                    ops += 1;
                }
                next = Role::Loop { step: (step + 1) % 11 };
            }
            (Kind::Proxy { append_kib }, Role::Loop { step }) => {
                let f = self.pick(c, 0);
                if step == 0 {
                    self.delete(c, f)?;
                    let n = gamma_pages(&mut self.cts[c].rng, append_kib);
                    bytes += self.append(c, f, n, &mut t)?;
                    t += 4 * cpu;
                    ops += 4;
                } else {
                    bytes += self.read_whole(c, f, &mut t)?;
                    t += 3 * cpu;
                    ops += 3;
                }
                next = Role::Loop { step: (step + 1) % 6 };
            }
            (Kind::Mail { append_kib }, Role::Loop { step }) => {
                let f = self.pick(c, 0);
                match step {
                    0 => {
                        self.delete(c, f)?;
                        let n = gamma_pages(&mut self.cts[c].rng, append_kib);
                        bytes += self.append(c, f, n, &mut t)?;
                        self.fsync(c, f, &mut t);
                        t += 5 * cpu;
                        ops += 5;
                    }
                    1 => {
                        bytes += self.read_whole(c, f, &mut t)?;
                        let n = gamma_pages(&mut self.cts[c].rng, append_kib);
                        bytes += self.append(c, f, n, &mut t)?;
                        self.fsync(c, f, &mut t);
                        t += 5 * cpu;
                        ops += 5;
                    }
                    _ => {
                        bytes += self.read_whole(c, f, &mut t)?;
                        t += 3 * cpu;
                        ops += 3;
                    }
                }
                next = Role::Loop { step: (step + 1) % 3 };
            }
            (Kind::Video { read_pages, read_page_ns, .. }, Role::Loop { .. }) => {
                if read_page_ns > 0 {
                    // Filebench's bwlimit: the readers together get at most the configured bandwidth.
                    let b = t.max(self.cts[c].bw_next);
                    self.io_wait += b - t;
                    t = b;
                    self.cts[c].bw_next = b + read_page_ns * read_pages as u64;
                }
                let f = self.pick(c, 0);
                let sz = self.size[f as usize].max(1);
                let off = self.cursor[f as usize] % sz;
                let n = read_pages.min(sz);
                // A read that crosses the end of the file wraps to its start (two requests).
                let first = n.min(sz - off);
                self.read_range(c, f, off, first, &mut t)?;
                self.read_range(c, f, 0, n - first, &mut t)?;
                self.cursor[f as usize] = (off + n) % sz;
                bytes += read_pages.min(sz) as u64 * 4096;
                t += cpu;
                ops += 1;
            }
            (
                Kind::Video { write_pages, repint_ns, file_pages, .. },
                Role::VideoWriter { file, done, total, step },
            ) => match step {
                0 => {
                    let f = self.pick(c, 1);
                    self.delete(c, f)?;
                    t += 2 * cpu;
                    ops += 2;
                    next = Role::VideoWriter { file: f, done: 0, total: file_pages, step: 1 };
                }
                1 => {
                    let n = write_pages.min(total - done);
                    bytes += self.append(c, file, n, &mut t)?;
                    t += cpu;
                    ops += 1;
                    let done = done + n;
                    next = Role::VideoWriter { file, done, total, step: if done >= total { 2 } else { 1 } };
                }
                _ => {
                    t += cpu + repint_ns;
                    self.io_wait += repint_ns;
                    ops += 1;
                    next = Role::VideoWriter { file: 0, done: 0, total: 0, step: 0 };
                }
            },
            (Kind::Kv { pages, write_fraction }, Role::Loop { .. }) => {
                let ct = &mut self.cts[c];
                let idx = match ct.kv_window {
                    None => ct.rng.gen_range(0..pages),
                    Some(w) => w.item(ct.rng.gen_range(0..w.len), pages as u64) as u32,
                };
                let rng = &mut ct.rng;
                let write = rng.gen::<f64>() < write_fraction;
                self.anon_access(c, idx, write, &mut t)?;
                t += cpu;
                ops += 1;
                bytes += 4096;
            }
            (Kind::Ycsb, Role::Loop { .. }) => {
                bytes += self.ycsb_request(c, &mut t)?;
                t += cpu;
                ops += 1;
            }
            (Kind::Trace { repeat }, Role::Trace { row }) => {
                // The row is copied out rather than the trace's `Arc` cloned for the call: an atomic
                // increment and decrement per request were two thirds of the event loop's own time in a
                // plain-LRU replay.
                let ct = &self.cts[c];
                let rows =
                    &ct.trace.as_ref().ok_or_else(|| LabError::invalid("workload", "trace not loaded"))?.rows;
                // The next requests are known: fetch a later one's page-cache map entry, and a nearer
                // one's page descriptor (its map entry fetched by then), so that the lookup and a hit's
                // move to the head miss no cache (a replay is otherwise bound by those misses:
                // `Guest::access` and `mark_accessed` were two fifths of a plain-LRU replay).
                let guest = &self.guests[vm];
                if let Some(&(o, idx, ..)) = rows.get(row + MAP_AHEAD) {
                    guest.prefetch(key(ct.first_obj + o, idx));
                }
                if let Some(&(o, idx, ..)) = rows.get(row + PAGE_AHEAD) {
                    guest.prefetch_page(key(ct.first_obj + o, idx));
                }
                let this = match rows.get(row) {
                    Some(&r) => {
                        next = Role::Trace { row: row + 1 };
                        r
                    }
                    None if !repeat => return Ok(None),
                    None => {
                        next = Role::Trace { row: 1 };
                        // A trace has at least one row (`Trace::load` refuses an empty one).
                        *rows.first().ok_or_else(|| LabError::invalid("workload", "empty trace"))?
                    }
                };
                self.trace_row(c, this, &mut t)?;
                bytes += 4096;
                t += cpu;
                ops += 1;
            }
            _ => return Err(LabError::invalid("workload", "thread role does not match the workload")),
        }
        self.cts[c].roles[th] = next;
        if let Some(f) = self.vcpus[vm].get_mut(cpu_i) {
            *f = begin + (t - begin).saturating_sub(self.io_wait);
        }
        let lat = t - start;
        let tot = &mut self.cts[c].tot;
        tot.ops += ops;
        tot.bytes += bytes;
        tot.lat_ns += lat;
        Ok(Some(lat))
    }

    /// One YCSB request against the container's store: waits for the client's rate, then charges each
    /// page run the store touches (heap pages through the anonymous path, data-file pages through the
    /// page cache). Returns the record bytes.
    pub(super) fn ycsb_request(&mut self, c: usize, t: &mut u64) -> Result<u64, LabError> {
        let mut touches = std::mem::take(&mut self.touches);
        let ct = &mut self.cts[c];
        let Some(st) = ct.store.as_mut() else {
            return Err(LabError::invalid("workload", "YCSB store not built"));
        };
        if st.interval_ns > 0 {
            let b = (*t).max(st.next_at);
            self.io_wait += b - *t;
            *t = b;
            st.next_at = b + st.interval_ns;
        }
        let was_loaded = st.loaded();
        let bytes = st.next(&mut ct.rng, &mut touches);
        let (kind, load_done) = (st.kind, !was_loaded && st.loaded());
        // The data file follows the heap (MySQL) or is the store's only object (MongoDB).
        let obj = ct.first_obj + (kind == Db::Mysql) as u32;
        let mut r = Ok(());
        for &Touch { space, first, n, write } in &touches {
            r = match (space, write) {
                (Space::Heap, _) => (first..first + n).try_for_each(|p| self.anon_access(c, p, write, t)),
                (Space::File, false) => self.read_range(c, obj, first, n, t),
                (Space::File, true) => (first..first + n).try_for_each(|p| self.write_page(c, obj, p, t)),
            };
            if r.is_err() {
                break;
            }
            if space == Space::File {
                let sz = &mut self.size[obj as usize];
                *sz = (*sz).max(first + n);
            }
        }
        self.touches = touches;
        if r.is_ok() && load_done && kind != Db::Redis {
            // mongod syncs its data files after a bulk load (and every `syncdelay`), as InnoDB's
            // checkpoint does the tablespace pages written so far; without it every loaded page would
            // still be dirty when reclaim first reaches it, and its write-back would queue behind the
            // faults of the whole VM.
            self.fsync(c, obj, t);
        }
        r.map(|_| bytes)
    }

    /// One request of a trace, `(object, first page, pages, write)` as `Trace::rows` holds it.
    pub(super) fn trace_row(
        &mut self,
        c: usize,
        row: (u32, u32, u32, bool),
        t: &mut u64,
    ) -> Result<(), LabError> {
        let (o, idx, pages, write) = row;
        let obj = self.cts[c].first_obj + o;
        if write {
            for i in idx..idx + pages {
                self.write_page(c, obj, i, t)?;
            }
        } else {
            self.read_range(c, obj, idx, pages, t)?;
        }
        // A trace object's size stays 0 (`Sim::size`): nothing reads it.
        Ok(())
    }

    pub(super) fn pick(&mut self, c: usize, set: usize) -> u32 {
        let ct = &mut self.cts[c];
        ct.fs[set].pick(&mut ct.rng)
    }

    pub(super) fn read_whole(&mut self, c: usize, f: u32, t: &mut u64) -> Result<u64, LabError> {
        let n = self.size[f as usize];
        self.read_range(c, f, 0, n, t)?;
        Ok(n as u64 * 4096)
    }
}
