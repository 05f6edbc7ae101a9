//! The discrete-event emulator: one host (second-chance cache, one shared disk), its VMs' guests and
//! their containers' workload threads, driven by an event queue on an emulated nanosecond clock.
//!
//! Owns the event queue (a `BinaryHeap` ordered by `(time, seq)`: equal times run in the order they
//! were scheduled, so a run is a pure function of the scenario and seed), the page-level I/O path
//! (guest page cache -> second-chance cache -> disk), eviction handling (write-back of dirty pages, puts
//! of clean file pages, swap-out of anonymous pages), the timeline and the sampling of statistics.
//!
//! Timing model: a thread's operation runs at once at its start time and accumulates its latency
//! (page cache hits, cache hits by tier, disk requests); the thread's next operation is scheduled at the
//! end. The disk (`disk`) is one first-come-first-served server by default, so threads contend for it; an
//! operation that needs several disk requests reserves them in order as it runs (a long operation can
//! thus reserve slots ahead of a later-starting one: a simplification, deterministic and bounded by one
//! operation). Dirty write-back on eviction occupies the disk without blocking the thread; fsync and
//! swap-in wait. A written page costs one page's disk transfer time (the steady state of Linux's dirty
//! throttling).

pub mod backend;
pub mod budget;
mod disk;
pub mod effective;
mod io;
mod ops;
mod provision;
pub mod remote;
mod setup;
pub mod streams;

pub use crate::record::{CtTotals, CurveSnapshot, DecidedContainer, Decision, RunResult, Sample};

use crate::error::LabError;
use crate::model::guest::{Evicted, Guest};
use crate::model::kvstore::{Store, Touch};
use crate::model::workload::{Fileset, Role, Trace, Window};
use crate::scenario::{mib_pages, DiskScheduler, Event, Scenario, Timing, Variant};
use crate::sim::backend::SecondChance;
use crate::sim::disk::Disk;
use crate::sim::streams::Streams;
use dd_engine::{Counters, EvictionOrder, PoolOptions, Spec, StoreKind};
use rand_chacha::ChaCha8Rng;
use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::sync::Arc;

const NS: f64 = 1e9;
/// Object id of the swap area's slots on the disk (above every file's id).
const SWAP_OBJECT: u32 = u32::MAX - 1;

#[derive(Debug, Clone, Copy)]
enum Kind {
    Web { append_kib: f64 },
    Proxy { append_kib: f64 },
    Mail { append_kib: f64 },
    Video { read_pages: u32, write_pages: u32, repint_ns: u64, file_pages: u32, read_page_ns: u64 },
    Kv { pages: u32, write_fraction: f64 },
    Ycsb,
    Trace { repeat: bool },
}

struct Anon {
    object: u32,
    ver: Vec<u32>,
    swapped: Vec<bool>,
}

struct Ct {
    name: String,
    vm: usize,
    cg: usize,
    enabled: bool,
    spec: Spec,
    /// The eviction order of its ephemeral pool (a persistent pool never evicts).
    order: EvictionOrder,
    swap_spec: Option<Spec>,
    pool: Option<u32>,
    swap_pool: Option<u32>,
    running: bool,
    epoch: u32,
    kind: Kind,
    roles: Vec<Role>,
    initial_roles: Vec<Role>,
    fs: Vec<Fileset>,
    log_obj: u32,
    first_obj: u32,
    anon: Option<Anon>,
    store: Option<Box<Store>>,
    trace: Option<Arc<Trace>>,
    rng: ChaCha8Rng,
    tot: CtTotals,
    retired: Counters,
    last: Counters,
    last_tot: CtTotals,
    started_at: Option<u64>,
    /// Earliest start of the readers' next operation under `bwlimit`.
    bw_next: u64,
    /// The pages a `kv` workload uses (`working_set` events); `None`: all.
    kv_window: Option<Window>,
}

#[derive(PartialEq, Eq, PartialOrd, Ord, Clone, Copy)]
struct Ev {
    t: u64,
    seq: u64,
    kind: u8,
    a: u32,
    b: u32,
    c: u32,
}

const EV_CONTROL: u8 = 0;
const EV_SAMPLE: u8 = 1;
const EV_THREAD: u8 = 2;
const EV_PROVISION: u8 = 3;

/// The emulator for one variant of a scenario.
pub struct Sim<B: SecondChance> {
    timing: Timing,
    backend: B,
    guests: Vec<Guest>,
    /// Per VM, when each vCPU is next free.
    vcpus: Vec<Vec<u64>>,
    /// Time the current operation spent waiting on devices (not on a CPU).
    io_wait: u64,
    vm_names: Vec<String>,
    /// Current `(mem, ssd)` weights per VM (a timeline change may give only one).
    vm_weights: Vec<(u32, u32)>,
    cts: Vec<Ct>,
    vm_cts: Vec<Vec<usize>>,
    /// Per object, its size in pages: what a whole-file read reads, where an append starts, what an
    /// fsync or a delete walks. A trace's objects keep 0, since a trace replay never asks (keeping their
    /// extent up to date cost a cache miss per request on a trace of many objects).
    size: Vec<u32>,
    gen: Vec<u32>,
    cursor: Vec<u32>,
    disk: Disk,
    heap: BinaryHeap<Reverse<Ev>>,
    seq: u64,
    now: u64,
    end: u64,
    sample_ns: u64,
    /// The host's eviction batch, pages (for the effective entitlements).
    batch_pages: u64,
    controls: Vec<Event>,
    evbuf: Vec<Evicted>,
    touches: Vec<Touch>,
    /// Last swap slot written (see `handle_evictions`).
    swap_slot: u32,
    samples: Vec<Sample>,
    accesses: u64,
    variant: String,
    /// Store capacities (pages) as the timeline left them (the provisioner's budget, with `vm_weights`).
    capacity: [u64; 2],
    /// Per VM, its provisioner (if it has one and the variant runs it).
    prov: Vec<Option<provision::VmProv>>,
    /// Per container, its observed streams (containers of provisioned VMs only).
    streams: Vec<Option<Box<Streams>>>,
    decisions: Vec<Decision>,
    curves: Vec<CurveSnapshot>,
}

/// Applies a variant's overrides to a (scaled) scenario.
pub fn apply_variant(sc: &Scenario, v: &Variant) -> Scenario {
    let mut s = sc.clone();
    if let Some(m) = v.mode {
        s.host.mode = m;
    }
    if let Some(c) = v.mem_capacity_mib {
        s.host.mem_capacity_mib = c;
    }
    if let Some(c) = v.ssd_capacity_mib {
        s.host.ssd_capacity_mib = c;
    }
    for vm in &mut s.vms {
        if let Some(m) = v.vm_memory_mib.get(&vm.name) {
            vm.memory_mib = *m;
        }
        if let (Some(p), Some(on)) = (vm.provision.as_mut(), v.provision.get(&vm.name)) {
            p.enabled = *on;
        }
        if let (Some(m), Some(o)) = (vm.memctl.as_mut(), v.memctl.get(&vm.name)) {
            m.apply(o);
        }
        for c in &mut vm.containers {
            if let Some(o) = v.containers.get(&c.name) {
                if let Some(spec) = o.cache {
                    c.cache = spec;
                }
                if let Some(l) = o.memory_limit_mib {
                    c.memory_limit_mib = Some(l);
                }
                if let Some(st) = o.start_s {
                    c.start_s = st;
                }
            }
        }
    }
    s
}

/// The timeline with every gradual balloon (`over_s > 0`) replaced by twenty even steps from the VM's memory before it (its configured memory, or the previous balloon's target).
fn expand_balloons(sc: &Scenario) -> Vec<Event> {
    let mut tl = sc.timeline.clone();
    tl.sort_by(|a, b| a.at_s().total_cmp(&b.at_s()));
    let mut mem: Vec<(String, f64)> = sc.vms.iter().map(|v| (v.name.clone(), v.memory_mib)).collect();
    let mut out = Vec::new();
    for e in tl {
        match e {
            Event::Balloon { at_s, vm, memory_mib, over_s } => {
                let Some(cur) = mem.iter_mut().find(|m| m.0 == vm) else { continue };
                let from = cur.1;
                cur.1 = memory_mib;
                // Twenty steps whatever the scale, so a scaled run inflates as gradually as a full one.
                let steps = if over_s > 0.0 { 20 } else { 1 };
                for i in 1..=steps {
                    let f = i as f64 / steps as f64;
                    out.push(Event::Balloon {
                        at_s: at_s + over_s * f,
                        vm: vm.clone(),
                        memory_mib: from + (memory_mib - from) * f,
                        over_s: 0.0,
                    });
                }
            }
            e => out.push(e),
        }
    }
    out
}

fn ns(s: f64) -> u64 {
    (s * NS).round() as u64
}

impl<B: SecondChance> Sim<B> {
    /// Builds the emulator. `sc` is already scaled and has the variant applied; `disabled` names
    /// containers the variant leaves out; `load_trace` opens a trace path (a stream: a trace is read once, as it is parsed).
    pub fn new(
        sc: &Scenario,
        variant: &Variant,
        mut backend: B,
        load_trace: crate::model::workload::OpenTrace<'_>,
    ) -> Result<Sim<B>, LabError> {
        let mut guests = Vec::new();
        let mut vm_cts = Vec::new();
        let mut cts = Vec::new();
        let mut next_obj: u64 = 1;
        let mut size = vec![0u32];
        let mut gen = vec![0u32];
        let mut controls: Vec<Event> = Vec::new();
        let mut prov = Vec::new();
        let mut streams: Vec<Option<Box<Streams>>> = Vec::new();
        for (vi, vm) in sc.vms.iter().enumerate() {
            let p = provision::VmProv::new(sc, vi, cts.len());
            for i in 0..vm.containers.len() {
                // Each container's own sampling seed, from the scenario's seed and its position.
                let seed = sc.seed ^ (0xd1b5_4a32_d192_ed03u64.wrapping_mul((cts.len() + i) as u64 + 1));
                streams.push(p.as_ref().map(|p| Box::new(Streams::new(p.max_samples(), seed))));
            }
            let spare_anon = p.as_ref().is_some_and(|p| p.spare_anon());
            prov.push(p);
            backend.add_vm(vi as u32 + 1, vm.mem_weight, vm.ssd_weight)?;
            let mut g = Guest::new(mib_pages(vm.memory_mib), sc.guest.lru, sc.guest.reclaim_batch_pages);
            g.set_size_scale(sc.guest.size_scale);
            g.spare_anon = spare_anon;
            let mut list = Vec::new();
            for c in &vm.containers {
                let enabled = !variant.containers.get(&c.name).is_some_and(|o| o.disabled);
                let hard = c.memory_limit_mib.map_or(g.limit, mib_pages);
                let soft = c.soft_limit_mib.map_or(u64::MAX, mib_pages);
                let cg = g.add_memcg(hard, soft);
                let idx = cts.len();
                list.push(idx);
                let ct = Self::build_ct(
                    c,
                    vi,
                    cg,
                    enabled,
                    sc.seed,
                    idx,
                    &mut next_obj,
                    &mut size,
                    &mut gen,
                    load_trace,
                )?;
                if enabled {
                    controls.push(Event::Start { at_s: c.start_s, container: c.name.clone() });
                    if let Some(s) = c.stop_s {
                        controls.push(Event::Stop { at_s: s, container: c.name.clone() });
                    }
                }
                cts.push(ct);
            }
            if let Some(m) = &vm.memctl {
                let names: Vec<&str> = vm.containers.iter().map(|c| c.name.as_str()).collect();
                g.memctl = Some(m.resolve(&names));
            }
            guests.push(g);
            vm_cts.push(list);
        }
        if next_obj > u32::MAX as u64 / 2 {
            return Err(LabError::invalid("vms", "too many files in the scenario (more than 2^31)"));
        }
        controls.extend(expand_balloons(sc));
        // Stable: events at the same time keep the file's order (container starts first).
        controls.sort_by(|a, b| a.at_s().total_cmp(&b.at_s()));
        let cursor = vec![0u32; size.len()];
        let mut sim = Sim {
            timing: sc.timing,
            backend,
            guests,
            vcpus: sc.vms.iter().map(|v| vec![0; v.vcpus as usize]).collect(),
            io_wait: 0,
            vm_names: sc.vms.iter().map(|v| v.name.clone()).collect(),
            vm_weights: sc.vms.iter().map(|v| (v.mem_weight, v.ssd_weight)).collect(),
            cts,
            vm_cts,
            size,
            gen,
            cursor,
            disk: Disk::new(
                sc.host.disk.access_ns(),
                sc.host.disk.page_transfer_ns(),
                (sc.host.disk.scheduler == DiskScheduler::Fair)
                    .then(|| sc.containers().map(|(_, _, c)| c.io_weight).collect()),
            ),
            heap: BinaryHeap::new(),
            seq: 0,
            now: 0,
            end: ns(sc.duration_s),
            sample_ns: ns(sc.sample_interval_s).max(1),
            batch_pages: mib_pages(sc.host.eviction_batch_mib).max(1),
            controls,
            evbuf: Vec::new(),
            touches: Vec::new(),
            swap_slot: 0,
            samples: Vec::new(),
            accesses: 0,
            variant: variant.name.clone(),
            capacity: [mib_pages(sc.host.mem_capacity_mib), mib_pages(sc.host.ssd_capacity_mib)],
            prov,
            streams,
            decisions: Vec::new(),
            curves: Vec::new(),
        };
        for i in 0..sim.controls.len() {
            let t = ns(sim.controls[i].at_s());
            sim.push(t, EV_CONTROL, i as u32, 0, 0);
        }
        let mut t = sim.sample_ns;
        while t <= sim.end {
            sim.push(t, EV_SAMPLE, 0, 0, 0);
            t += sim.sample_ns;
        }
        let times: Vec<(usize, Vec<u64>)> = sim
            .prov
            .iter()
            .enumerate()
            .filter_map(|(v, p)| p.as_ref().map(|p| (v, p.times(sim.end))))
            .collect();
        for (v, ts) in times {
            for t in ts {
                sim.push(t, EV_PROVISION, v as u32, 0, 0);
            }
        }
        Ok(sim)
    }

    fn push(&mut self, t: u64, kind: u8, a: u32, b: u32, c: u32) {
        self.seq += 1;
        self.heap.push(Reverse(Ev { t, seq: self.seq, kind, a, b, c }));
    }

    /// Replaces the thread event `ev`, still the earliest in the heap (an operation schedules nothing),
    /// by the thread's next one at `next` (same thread, the container's current epoch), or drops it.
    fn reschedule_top(&mut self, ev: Ev, next: Option<u64>) {
        let Some(mut top) = self.heap.peek_mut() else { return };
        debug_assert!(top.0 == ev, "an operation scheduled an event before its own");
        match next {
            Some(t) => {
                self.seq += 1;
                let epoch = self.cts[ev.a as usize].epoch;
                // Dropping the `PeekMut` sifts the new event down to its place.
                *top = Reverse(Ev { t, seq: self.seq, kind: EV_THREAD, a: ev.a, b: ev.b, c: epoch });
            }
            None => {
                std::collections::binary_heap::PeekMut::pop(top);
            }
        }
    }

    pub fn backend(&self) -> &B {
        &self.backend
    }

    /// Runs to the end. `progress` gets the fraction of emulated time done after every sample.
    pub fn run(mut self, progress: &mut dyn FnMut(f64)) -> Result<RunResult, LabError> {
        // The earliest event is read in place, not popped: a thread's operation reschedules the thread,
        // and writing its next event over the one just run costs one sift-down where a pop and a push
        // cost two sifts (`bench lab`: the heap was 6-11% of a run). Events are totally ordered by
        // `(t, seq)` (every `seq` is new), so the heap yields them in the same order either way.
        while let Some(&Reverse(ev)) = self.heap.peek() {
            if ev.t > self.end {
                break;
            }
            self.now = ev.t;
            if ev.kind != EV_THREAD {
                self.heap.pop();
            }
            match ev.kind {
                EV_CONTROL => self.control(ev.a as usize)?,
                EV_SAMPLE => {
                    self.sample()?;
                    progress(self.now as f64 / self.end as f64);
                }
                EV_PROVISION => self.provision(ev.a as usize)?,
                _ => {
                    let (c, th) = (ev.a as usize, ev.b as usize);
                    let next = if self.cts[c].running && self.cts[c].epoch == ev.c {
                        self.step(c, th)?
                    } else {
                        None
                    };
                    self.reschedule_top(ev, next.map(|lat| self.now + lat.max(1)));
                }
            }
        }
        // Fold the live pools' counters into the totals.
        for c in 0..self.cts.len() {
            let cum = self.cum_counters(c)?;
            let run_ns = match self.cts[c].started_at {
                Some(s) => self.end.saturating_sub(s),
                None => 0,
            };
            let ct = &mut self.cts[c];
            ct.tot.cache = cum;
            ct.tot.run_s += run_ns as f64 / NS;
            let m = &self.guests[ct.vm].cgs[ct.cg].counters;
            ct.tot.pc_hits = m.hits;
            ct.tot.pc_misses = m.misses;
        }
        let mut result = RunResult {
            variant: self.variant.clone(),
            duration_s: self.end as f64 / NS,
            containers: self
                .cts
                .iter()
                .map(|c| (c.name.clone(), self.vm_names[c.vm].clone(), c.enabled))
                .collect(),
            samples: std::mem::take(&mut self.samples),
            totals: self.cts.iter().map(|c| c.tot.clone()).collect(),
            verified_hits: self.backend.verified_hits(),
            accesses: self.accesses,
            decisions: std::mem::take(&mut self.decisions),
            curves: std::mem::take(&mut self.curves),
        };
        let eff = crate::sim::effective::effective_entitlements(&result, self.batch_pages);
        for (s, [m, d]) in result.samples.iter_mut().zip(eff) {
            (s.mem_eff, s.ssd_eff) = (m, d);
        }
        Ok(result)
    }

    fn ct_index(&self, name: &str) -> Option<usize> {
        self.cts.iter().position(|c| c.name == name && c.enabled)
    }

    fn control(&mut self, i: usize) -> Result<(), LabError> {
        let e = self.controls[i].clone();
        match e {
            Event::Start { container, .. } => {
                let Some(c) = self.ct_index(&container) else { return Ok(()) };
                if self.cts[c].running {
                    return Ok(());
                }
                let vm = self.cts[c].vm as u32 + 1;
                let spec = self.cts[c].spec;
                let opts = PoolOptions::ephemeral(spec).with_order(self.cts[c].order);
                self.cts[c].pool = Some(self.backend.new_pool(vm, opts)?);
                if let Some(s) = self.cts[c].swap_spec {
                    self.cts[c].swap_pool = Some(self.backend.new_pool(vm, PoolOptions::persistent(s))?);
                }
                let ct = &mut self.cts[c];
                ct.running = true;
                ct.epoch += 1;
                ct.started_at = Some(self.now);
                ct.roles = ct.initial_roles.clone();
                let (n, epoch) = (ct.roles.len(), ct.epoch);
                for th in 0..n {
                    self.push(self.now, EV_THREAD, c as u32, th as u32, epoch);
                }
            }
            Event::Stop { container, .. } => {
                let Some(c) = self.ct_index(&container) else { return Ok(()) };
                if !self.cts[c].running {
                    return Ok(());
                }
                let cum = self.cum_counters(c)?;
                let vm = self.cts[c].vm as u32 + 1;
                for p in [self.cts[c].pool.take(), self.cts[c].swap_pool.take()].into_iter().flatten() {
                    self.backend.destroy_pool(vm, p)?;
                }
                let now = self.now;
                let ct = &mut self.cts[c];
                ct.retired = cum;
                ct.running = false;
                ct.epoch += 1;
                if let Some(s) = ct.started_at.take() {
                    ct.tot.run_s += (now - s) as f64 / NS;
                }
                let (vmi, cg) = (ct.vm, ct.cg);
                self.guests[vmi].drop_memcg(cg);
            }
            Event::SetCache { container, cache, .. } => {
                let Some(c) = self.ct_index(&container) else { return Ok(()) };
                self.cts[c].spec = cache;
                if let Some(p) = self.cts[c].pool {
                    self.backend.set_spec(self.cts[c].vm as u32 + 1, p, cache)?;
                }
            }
            Event::SetVmWeights { vm, mem, ssd, .. } => {
                if let Some(v) = self.vm_names.iter().position(|n| *n == vm) {
                    let w = &mut self.vm_weights[v];
                    *w = (mem.unwrap_or(w.0), ssd.unwrap_or(w.1));
                    self.backend.set_vm_weights(v as u32 + 1, w.0, w.1)?;
                }
            }
            Event::SetCapacity { store, mib, .. } => {
                self.backend.set_capacity(store, mib_pages(mib))?;
                self.capacity[store.idx()] = mib_pages(mib);
            }
            Event::SetMemoryLimit { container, mib, .. } => {
                // A container not running has no memcg to limit; its start sets its spec's limit.
                let Some(c) = self.ct_index(&container).filter(|&c| self.cts[c].running) else {
                    return Ok(());
                };
                let (v, cg) = (self.cts[c].vm, self.cts[c].cg);
                let pages = mib.map_or(self.guests[v].limit, |m| mib_pages(m).max(1));
                self.reclaim_now(v, |g, sink| g.set_hard_limit(cg, pages, sink))?;
            }
            Event::SetMode { mode, .. } => self.backend.set_mode(mode)?,
            Event::WorkingSet { container, fraction, offset, .. } => {
                let Some(c) = self.ct_index(&container) else { return Ok(()) };
                let ct = &mut self.cts[c];
                if let Some(fs) = ct.fs.first_mut() {
                    fs.set_window(fraction, offset);
                }
                if let Some(st) = ct.store.as_mut() {
                    st.set_window(fraction, offset);
                }
                if let Kind::Kv { pages, .. } = ct.kind {
                    ct.kv_window = Some(Window::of(pages as u64, fraction, offset));
                }
            }
            Event::Balloon { vm, memory_mib, .. } => {
                if let Some(v) = self.vm_names.iter().position(|n| *n == vm) {
                    self.reclaim_now(v, |g, sink| g.set_limit(mib_pages(memory_mib), sink))?;
                }
            }
        }
        Ok(())
    }

    /// Cumulative cache counters of a container (destroyed pools included).
    fn cum_counters(&mut self, c: usize) -> Result<Counters, LabError> {
        let mut cum = self.cts[c].retired;
        let vm = self.cts[c].vm as u32 + 1;
        for p in [self.cts[c].pool, self.cts[c].swap_pool].into_iter().flatten() {
            let pc = self.backend.pool_counters(vm, p)?;
            cum.add(&pc);
            cum.mem.entitlement += pc.mem.entitlement;
            cum.ssd.entitlement += pc.ssd.entitlement;
        }
        Ok(cum)
    }

    fn sample(&mut self) -> Result<(), LabError> {
        let t_s = self.now as f64 / NS;
        for c in 0..self.cts.len() {
            if !self.cts[c].enabled {
                continue;
            }
            let cum = self.cum_counters(c)?;
            let ct = &self.cts[c];
            let l = &ct.last;
            let hits = |x: &Counters| x.mem.gets_hit + x.ssd.gets_hit;
            let (lt, tt) = (&ct.last_tot, &ct.tot);
            let m = &self.guests[ct.vm].cgs[ct.cg];
            let s = Sample {
                t_s,
                ct: c,
                running: ct.running,
                memcg_pages: m.usage,
                mem_used: if ct.running { cum.mem.used } else { 0 },
                mem_ent: if ct.running { cum.mem.entitlement } else { 0 },
                ssd_used: if ct.running { cum.ssd.used } else { 0 },
                ssd_ent: if ct.running { cum.ssd.entitlement } else { 0 },
                mem_eff: 0,
                ssd_eff: 0,
                puts: (cum.mem.puts + cum.ssd.puts) - (l.mem.puts + l.ssd.puts),
                puts_refused: cum.puts_refused - l.puts_refused,
                hits: hits(&cum) - hits(l),
                misses: cum.gets_missed - l.gets_missed,
                flushes: (cum.mem.flushes + cum.ssd.flushes) - (l.mem.flushes + l.ssd.flushes),
                evictions: (cum.mem.evictions + cum.ssd.evictions) - (l.mem.evictions + l.ssd.evictions),
                promotions: cum.promotions - l.promotions,
                demotions: cum.demotions - l.demotions,
                ops: tt.ops - lt.ops,
                bytes: tt.bytes - lt.bytes,
                lat_ns: tt.lat_ns - lt.lat_ns,
                pc_hits: m.counters.hits - lt.pc_hits,
                pc_misses: m.counters.misses - lt.pc_misses,
                disk_reads: tt.disk_reads - lt.disk_reads,
                reclaimed_directed: m.counters.reclaimed_directed,
                reclaimed_lru: m.counters.reclaimed_lru,
                limit_pages: m.hard,
                mem_weight: ct.spec.weight(StoreKind::Mem),
                ssd_weight: ct.spec.weight(StoreKind::Ssd),
            };
            self.samples.push(s);
            let (h, mi) = (m.counters.hits, m.counters.misses);
            let ct = &mut self.cts[c];
            ct.last = cum;
            ct.last_tot = ct.tot.clone();
            ct.last_tot.pc_hits = h;
            ct.last_tot.pc_misses = mi;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sim::backend::{BackendConfig, EngineBackend};
    use dd_engine::Mode;

    /// One container with a 16-page memcg replaying `trace` (plain LRU, reclaim one page at a time) over
    /// a 256-page memory store. Returns its totals.
    fn replay(trace: &str) -> CtTotals {
        let sc = Scenario::trace_replay("t.csv", 16, 1.0, 1000.0);
        let backend = EngineBackend::new(&BackendConfig {
            mem_pages: 256,
            mem_max_pages: 256,
            ssd_pages: 0,
            mode: Mode::Partitioned,
            batch_pages: 1,
            scratch_dir: std::env::temp_dir(),
        })
        .unwrap();
        let text = format!("object,index,pages,op\n{trace}");
        let variant = sc.variant_list()[0].clone();
        let sim = Sim::new(&sc, &variant, backend, &|_| {
            Ok(Box::new(std::io::Cursor::new(text.clone().into_bytes())))
        })
        .unwrap();
        sim.run(&mut |_| {}).unwrap().totals[0].clone()
    }

    #[test]
    fn a_dirty_page_is_written_back_before_it_is_put_and_a_hit_leaves_the_pool() {
        // Fill the memcg with file 1, dirty its page 0, push file 1 out with file 2, read file 1 again.
        let t = replay("1,0,16,R\n1,0,1,W\n2,0,16,R\n1,0,16,R\n");
        assert_eq!(t.disk_reads, 32, "files 1 and 2 once each from the disk");
        assert_eq!(t.writebacks, 1, "the dirtied page was written back when it was evicted");
        // Written back, the page is clean and mapped: it went to the pool with the others, and the
        // re-read of file 1 was served from there.
        assert_eq!(t.mem_hits, 16);
        assert_eq!(t.cache.mem.puts, 32, "file 1's 16 pages, then file 2's");
        // Exclusive gets: file 1's pages left the pool when they were got; file 2's are what remains.
        assert_eq!(t.cache.mem.used, 16);
        assert_eq!(t.cache.mem.exclusive_gets, 16);
    }

    #[test]
    fn a_page_created_by_a_write_is_written_back_and_never_put() {
        // File 3 is written (not read) and pushed out by file 4: Linux invalidates such pages in
        // cleancache instead of putting them (not mapped to disk), so its re-read goes to the disk.
        let t = replay("3,0,16,W\n4,0,16,R\n3,0,16,R\n");
        assert_eq!(t.writebacks, 16);
        assert_eq!(t.mem_hits, 0);
        assert_eq!(t.disk_reads, 32);
        assert_eq!(t.cache.mem.puts, 16, "only file 4's read pages");
    }
}
