//! `tenants`: a verified load of VM A while VM B, on the same daemon, attacks it (issue 12, SPEC
//! section 6 "Hostile tenants": no VM can keep another from being served).
//!
//! # What it owns
//!
//! A `doubledecker serve` process (the binary the caller names; 127.0.0.1, ephemeral ports, memory-only,
//! a peer listener on a free port below the ephemeral range with one configured member that never
//! answers), VMs A (1) and B (2) in its configuration file, A's load threads and one attack thread.
//!
//! # Method
//!
//! * **A's load**: `threads` threads, each with its own objects in one shared pool (ephemeral memory,
//!   non-exclusive gets, the key space fits the store), sends batches of `batch` pages: half PUT_BATCH
//!   (each page stamped with its key and a version), half GET_BATCH, every hit checked against the last
//!   version put (`wrong_pages`). Every `reconnect_every` requests a thread drops its connection and
//!   makes a new one (connect, HELLO), so that attacks on connection slots reach A too. A failed request
//!   or connect is counted in `errors` and the thread reconnects.
//! * **Windows**: for each attack, `repeats` pairs of windows: A's load runs `seconds` alone (the
//!   baseline), then `seconds` while the attack runs (the attack starts first and is given a moment to
//!   take hold; it stops before the next baseline). The two windows of a pair are next to each other,
//!   so a machine whose load drifts moves both.
//! * **Ratios**: per pair, `ops` = A's ops/s under attack / without and `p99` = A's p99 without / under
//!   attack (so both are "at least 0.5" when the attack costs A at most half its throughput and at most
//!   doubles its p99). An attack's `ops_ratio` and `p99_ratio` are the lower medians over its pairs: on
//!   a shared machine another process's burst spoils one short window now and then, and the median
//!   ignores a minority of spoiled pairs, while an attack that really hurts A spoils every pair.
//! * **Memory**: the daemon's RSS is sampled every 100 ms. Its bound is the peak of A's first baseline
//!   window plus what `docs/protocol.md` (Security) allows for connections: `max_connections` sessions
//!   of `2 * max_payload + 64 KiB + write_buffer` each, and `coop.max_connections` peer connections of
//!   a 4 KiB frame and a read chunk each.
//! * **The attacker** runs at the lowest CPU priority (nice 19): on a real host it would run on B's own
//!   vCPUs, not on A's; the daemon's threads that serve B keep theirs.
//!
//! The attacks are in [`attacks`]; their configuration (the daemon's limits) is in [`daemon_toml`].

use crate::daemon::{free_port, BenchVm, Daemon, DaemonOptions};
use dd_client::Client;
use dd_engine::{Key, PoolId};
use hdrhistogram::Histogram;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::Serialize;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

mod attacks;
mod peers;
mod tally;

pub use attacks::Attack;

/// Errors that stop the benchmark (a failed check is a report with `pass = false`).
pub type TenantsBenchError = crate::daemon::LoadError;

type Result<T> = std::result::Result<T, TenantsBenchError>;

const PS: usize = 4096;
/// Connection slots of the daemon under test (the default is 1024; fewer make the slot attacks reach
/// the limit within a window).
pub const MAX_CONNECTIONS: usize = 128;
/// Sessions of one VM.
pub const MAX_CONNECTIONS_PER_VM: usize = 16;
/// Pools of one VM.
pub const MAX_POOLS_PER_VM: usize = 256;
/// Peer-listener connections in their handshake from non-member addresses (the default).
pub const COOP_MAX_CONNECTIONS: usize = 64;
/// Members of the daemon under test (the ghost `bench-b`, the victim `bench-v`, the attacker's
/// `bench-m`), with the defaults of their handshake slots and sessions.
pub const COOP_MEMBERS: usize = 3;
pub const COOP_HANDSHAKES_PER_MEMBER: usize = 16;
pub const COOP_SESSIONS_PER_PEER: usize = 8;
/// The frame limit (the default).
pub const MAX_PAYLOAD: u64 = 2 << 20;
/// Buffered answers per session (the default).
pub const WRITE_BUFFER: u64 = 256 << 10;
/// The attack runs this long before A's attacked window starts.
const ATTACK_LEAD: Duration = Duration::from_millis(500);

/// Options of `tenants`.
#[derive(Debug, Clone)]
pub struct TenantsBenchOptions {
    pub exe: std::path::PathBuf,
    /// Length of each window (baseline and attacked), seconds. Default 5.
    pub seconds: f64,
    /// A's load threads (connections). Default 2.
    pub threads: usize,
    /// Pages per request. Default 16.
    pub batch: usize,
    /// Distinct pages of each A thread. Default 2048 (8 MiB).
    pub keys_per_thread: u64,
    /// Requests per A connection before it reconnects. Default 200.
    pub reconnect_every: u64,
    /// Pairs of windows (without, with) per attack; the ratios are their medians. Default 3.
    pub repeats: usize,
    pub attacks: Vec<Attack>,
    pub seed: u64,
}

impl Default for TenantsBenchOptions {
    fn default() -> Self {
        TenantsBenchOptions {
            exe: "doubledecker".into(),
            seconds: 5.0,
            threads: 2,
            batch: 16,
            keys_per_thread: 2048,
            reconnect_every: 200,
            repeats: 3,
            attacks: Attack::ALL.to_vec(),
            seed: 0x7e4a,
        }
    }
}

/// A's figures over one window.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Window {
    pub seconds: f64,
    /// Page operations (a batch of 16 is 16).
    pub ops: u64,
    pub ops_per_s: f64,
    pub p50_us: u64,
    pub p99_us: u64,
    pub connects: u64,
    pub errors: u64,
    pub wrong_pages: u64,
}

/// One attack: A without and with it.
#[derive(Debug, Clone, Serialize)]
pub struct AttackReport {
    pub attack: Attack,
    pub what: &'static str,
    /// The pair of windows whose ops ratio is the median one.
    pub without: Window,
    pub with: Window,
    /// A's ops/s with the attack / without: the lower median of `ops_ratios`.
    pub ops_ratio: f64,
    /// A's p99 without the attack / with: the lower median of `p99_ratios`.
    pub p99_ratio: f64,
    /// Every pair's ratios, in the order run.
    pub ops_ratios: Vec<f64>,
    pub p99_ratios: Vec<f64>,
    /// A's failed requests and connects, and wrong pages, over all of this attack's windows.
    pub errors: u64,
    pub wrong_pages: u64,
    /// What the attacker did (connections opened, frames sent, pools created, ...).
    pub attacker_actions: u64,
    /// Bytes the attacker's writes got into its sockets, over the attacked windows (counted by the
    /// attacks that send payload: `oversized_preauth`; 0 for the others).
    pub attacker_bytes_sent: u64,
    /// CPU time of the attacker's thread over the attacked windows, seconds: what B spends, which on a
    /// host is B's own vCPUs' and here shares A's two cores (at nice 19).
    pub attacker_cpu_s: f64,
    /// Peer attacks: the victim peer's publications during the attacked windows, and those that
    /// reached the daemon under test (at least 95% to pass); 0 for the others.
    pub publishes_attempted: u64,
    pub publishes_delivered: u64,
    /// `peer_inject`: records injected into the victim's sessions, and those refused (the session
    /// closed with no byte of answer; all of them to pass).
    pub injected: u64,
    pub injected_refused: u64,
    /// Attacker-side failures of the attack itself (e.g. a re-registered VM's old session that was
    /// still served: must be 0).
    pub leaks: u64,
    pub peak_rss_mib: f64,
}

/// The report of `tenants`.
#[derive(Debug, Clone, Serialize)]
pub struct TenantsReport {
    pub seconds_per_window: f64,
    pub repeats: usize,
    pub threads: usize,
    pub batch: usize,
    pub attacks: Vec<AttackReport>,
    pub min_ops_ratio: f64,
    pub min_p99_ratio: f64,
    /// A's failed requests and connects over every window.
    pub errors: u64,
    /// A's hits whose bytes were not the last version put, over every window.
    pub wrong_pages: u64,
    pub leaks: u64,
    pub baseline_rss_mib: f64,
    pub peak_rss_mib: f64,
    pub rss_bound_mib: f64,
    pub rss_bound: &'static str,
    pub pass: bool,
}

/// The daemon's configuration beyond the data plane: the limits the attacks run into, and a peer
/// listener whose members are `peers` (name, port, public key: one that never answers, the victim
/// peer, the attacker's member; co-operative de-duplication needs `dedup`; A and B are each in their
/// own de-duplication domain, outside the co-operative group). It is appended right after
/// `[engine.mem]`'s capacity, so `dedup` lands in that table.
pub fn daemon_toml(coop_port: u16, key_file: &str, peers: &[(&str, u16, String)]) -> String {
    let list: Vec<String> = peers
        .iter()
        .map(|(n, port, key)| {
            format!("{{ name = {n:?}, addr = \"127.0.0.1:{port}\", public_key = {key:?} }}")
        })
        .collect();
    format!(
        "dedup = true\n[limits]\nmax_connections = {MAX_CONNECTIONS}\nmax_connections_per_vm = {MAX_CONNECTIONS_PER_VM}\n\
         [engine]\nmax_pools_per_vm = {MAX_POOLS_PER_VM}\n\
         [coop]\nenabled = true\nlisten = \"127.0.0.1:{coop_port}\"\nnode_name = \"bench-a\"\n\
         dedup_group = \"peers\"\nkey_file = {key_file:?}\npublish_interval_ms = 3600000\n\
         peers = [{}]\n",
        list.join(", ")
    )
}

/// The memory bound of the daemon (see the module comment), bytes above A's baseline.
pub fn connection_memory_bound() -> u64 {
    let peer_connections =
        COOP_MAX_CONNECTIONS + COOP_MEMBERS * (COOP_HANDSHAKES_PER_MEMBER + COOP_SESSIONS_PER_PEER);
    MAX_CONNECTIONS as u64 * (2 * MAX_PAYLOAD + (64 << 10) + WRITE_BUFFER)
        + peer_connections as u64 * ((4 << 10) + 2 * (64 << 10))
}

/// The page A's thread `t` puts for `key` at `version`: key and version in the first and last 16 bytes.
fn stamp(page: &mut [u8], key: Key, version: u64) {
    page.fill((key.index as u8) ^ (version as u8));
    let head = [key.object.to_le_bytes(), key.index.to_le_bytes()].concat();
    page[..16].copy_from_slice(&head);
    page[PS - 16..PS - 8].copy_from_slice(&version.to_le_bytes());
    page[PS - 8..].copy_from_slice(&key.index.to_le_bytes());
}

struct LoadThread {
    t: u64,
    pool: PoolId,
    versions: Vec<u64>,
    /// Keys whose last put failed: the daemon holds either `versions[i]` or the next one.
    pending: Vec<bool>,
    rng: ChaCha8Rng,
    conn: Option<Client>,
    requests_on_conn: u64,
}

impl LoadThread {
    fn key(&self, i: u64) -> Key {
        Key::new(self.t + 1, i)
    }

    /// One window of load until `stop`: returns the window's figures.
    fn run(&mut self, o: &TenantsBenchOptions, tcp: SocketAddr, a: &BenchVm, stop: &AtomicBool) -> Window {
        let mut w = Window::default();
        let mut h = Histogram::<u64>::new_with_bounds(1, 60_000_000, 3).expect("valid bounds");
        let mut page = vec![0u8; PS];
        let mut pages = vec![0u8; PS * o.batch];
        let mut out = vec![0u8; PS * o.batch];
        let started = Instant::now();
        while !stop.load(Ordering::Relaxed) {
            if self.conn.is_none() || self.requests_on_conn >= o.reconnect_every {
                self.conn = None;
                w.connects += 1;
                match Client::connect_tcp(tcp, a.id, &a.data_token) {
                    Ok(c) => self.conn = Some(c),
                    Err(_) => {
                        w.errors += 1;
                        std::thread::sleep(Duration::from_millis(10));
                        continue;
                    }
                }
                self.requests_on_conn = 0;
            }
            let first = self.rng.gen_range(0..self.versions.len() as u64 - o.batch as u64);
            let keys: Vec<Key> = (first..first + o.batch as u64).map(|i| self.key(i)).collect();
            let put = self.rng.gen_bool(0.5);
            let c = self.conn.as_mut().expect("connected");
            let t0 = Instant::now();
            let ok = if put {
                for (j, k) in keys.iter().enumerate() {
                    stamp(&mut pages[j * PS..(j + 1) * PS], *k, self.versions[k.index as usize] + 1);
                }
                let batch: Vec<(Key, &[u8])> =
                    keys.iter().enumerate().map(|(j, k)| (*k, &pages[j * PS..(j + 1) * PS])).collect();
                match c.put_batch(self.pool, &batch) {
                    Ok(_) => {
                        for k in &keys {
                            self.versions[k.index as usize] += 1;
                            self.pending[k.index as usize] = false;
                        }
                        true
                    }
                    Err(_) => {
                        for k in &keys {
                            self.pending[k.index as usize] = true;
                        }
                        false
                    }
                }
            } else {
                match c.get_batch(self.pool, &keys, &mut out) {
                    Ok(hits) => {
                        for (j, k) in keys.iter().enumerate() {
                            if hits[j] {
                                let (v, i) = (self.versions[k.index as usize], k.index as usize);
                                let got = &out[j * PS..(j + 1) * PS];
                                stamp(&mut page, *k, v);
                                let mut right = got == &page[..];
                                if !right && self.pending[i] {
                                    stamp(&mut page, *k, v + 1);
                                    right = got == &page[..];
                                }
                                if !right {
                                    w.wrong_pages += 1;
                                }
                            }
                        }
                        true
                    }
                    Err(_) => false,
                }
            };
            if ok {
                h.saturating_record(t0.elapsed().as_micros().max(1) as u64);
                w.ops += o.batch as u64;
                self.requests_on_conn += 1;
            } else {
                // A put that failed may or may not have landed (`pending` above).
                w.errors += 1;
                self.conn = None;
            }
        }
        w.seconds = started.elapsed().as_secs_f64();
        w.ops_per_s = w.ops as f64 / w.seconds.max(1e-9);
        w.p50_us = h.value_at_quantile(0.5);
        w.p99_us = h.value_at_quantile(0.99);
        w
    }
}

fn merge(ws: Vec<Window>) -> Window {
    let mut m = Window::default();
    for w in &ws {
        m.seconds = m.seconds.max(w.seconds);
        m.ops += w.ops;
        m.connects += w.connects;
        m.errors += w.errors;
        m.wrong_pages += w.wrong_pages;
        m.p50_us = m.p50_us.max(w.p50_us);
        m.p99_us = m.p99_us.max(w.p99_us);
    }
    m.ops_per_s = ws.iter().map(|w| w.ops_per_s).sum();
    m
}

/// Runs A's threads for `secs` and returns the merged window.
fn window(o: &TenantsBenchOptions, d: &Daemon, a: &BenchVm, threads: &mut [LoadThread], secs: f64) -> Window {
    let stop = AtomicBool::new(false);
    let ws = std::thread::scope(|s| {
        let hs: Vec<_> = threads.iter_mut().map(|t| s.spawn(|| t.run(o, d.tcp, a, &stop))).collect();
        std::thread::sleep(Duration::from_secs_f64(secs));
        stop.store(true, Ordering::Relaxed);
        hs.into_iter().map(|h| h.join().expect("load thread")).collect::<Vec<_>>()
    });
    merge(ws)
}

/// Samples the daemon's RSS every 100 ms into `peak` until `stop`.
fn sample_rss(pid: u32, peak: &AtomicU64, stop: &AtomicBool) {
    while !stop.load(Ordering::Relaxed) {
        if let Ok(s) = std::fs::read_to_string(format!("/proc/{pid}/status")) {
            if let Some(b) = crate::daemon::parse_vm_rss(&s) {
                peak.fetch_max(b, Ordering::Relaxed);
            }
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

const MIB: f64 = 1024.0 * 1024.0;

/// Puts the calling thread (the attacker) at the lowest CPU priority (nice 19). On a real host B's
/// attack runs on B's own vCPUs; here it shares the machine's cores with A's load threads, and at equal
/// priority it took CPU from them that no attack on the daemon could take (A's ops/s fell to the share
/// of runnable threads that were A's). The daemon's threads serving B keep their priority: what B
/// costs the daemon is what this benchmark measures.
fn lowest_priority() {
    // SAFETY: gettid and setpriority only read and change the calling thread's scheduling priority
    // (Linux applies PRIO_PROCESS to the thread whose id is given).
    unsafe {
        let tid = libc::gettid();
        libc::setpriority(libc::PRIO_PROCESS, tid as libc::id_t, 19);
    }
}

/// CPU time of the calling thread (user and system), nanoseconds.
fn thread_cpu_ns() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: `ts` is a valid, writable timespec for the duration of the call; the clock id is a
    // constant every Linux kernel since 2.6.12 knows.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    if rc != 0 {
        return 0;
    }
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// (ops/s with / without, p99 without / with) of one pair of windows.
fn pair_ratios(without: &Window, with: &Window) -> (f64, f64) {
    (with.ops_per_s / without.ops_per_s.max(1e-9), without.p99_us as f64 / with.p99_us.max(1) as f64)
}

/// The lower median (of an even count, the smaller middle value: the stricter one for a floor check).
fn lower_median(v: &[f64]) -> f64 {
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    s[(s.len() - 1) / 2]
}

/// Runs the benchmark; `progress` gets one line per window.
pub fn run(o: &TenantsBenchOptions, progress: &mut dyn FnMut(&str)) -> Result<TenantsReport> {
    if o.seconds.is_nan() || o.seconds <= 0.0 {
        return Err(TenantsBenchError::InvalidOption { field: "seconds", reason: "must be > 0".into() });
    }
    if o.threads == 0 || o.batch == 0 || o.keys_per_thread <= o.batch as u64 || o.reconnect_every == 0 {
        return Err(TenantsBenchError::InvalidOption {
            field: "threads/batch/keys_per_thread/reconnect_every",
            reason: "threads, batch and reconnect_every > 0, keys_per_thread > batch".into(),
        });
    }
    if o.repeats == 0 {
        return Err(TenantsBenchError::InvalidOption { field: "repeats", reason: "must be > 0".into() });
    }
    let dir = tempfile::Builder::new().prefix("dd-bench-tenants.").tempdir()?;
    let me = crate::remote::BenchNode::new("bench-a", free_port()?, dir.path())?;
    let ghost = crate::remote::BenchNode::new("bench-b", free_port()?, dir.path())?;
    let victim = crate::remote::BenchNode::new("bench-v", free_port()?, dir.path())?;
    let member = crate::remote::BenchNode::new("bench-m", free_port()?, dir.path())?;
    let (a, b) = (BenchVm::new(1), BenchVm::new(2));
    let store = o.threads as u64 * o.keys_per_thread * PS as u64;
    let d = Daemon::start(&DaemonOptions {
        exe: o.exe.clone(),
        // The whole key space fits twice: nothing of A's is evicted, so every get should hit.
        mem_capacity_bytes: (2 * store).max(32 << 20),
        ssd_capacity_bytes: 0,
        vms: vec![a.clone(), b.clone()],
        extra_toml: daemon_toml(
            me.port,
            &me.key_file.display().to_string(),
            &[
                ("bench-b", ghost.port, ghost.key.public_text()),
                ("bench-v", victim.port, victim.key.public_text()),
                ("bench-m", member.port, member.key.public_text()),
            ],
        ),
    })?;
    // The victim peer, 10 ms away each way through a relay an attacker on the path controls.
    let relay = crate::relay::Relay::start(me.port, peers::VICTIM_DELAY)?;
    let peer_setup = peers::PeerSetup {
        victim: peers::start_victim(&o.exe, &victim, &me, relay.port)?,
        relay,
        member: dd_coop::identity::parse_secret(&member.key.secret_text()).expect("a key just made"),
    };
    let pool = Client::connect_tcp(d.tcp, a.id, &a.data_token)?.create_cgroup(crate::daemon::load_pool())?;
    let mut threads: Vec<LoadThread> = (0..o.threads as u64)
        .map(|t| LoadThread {
            t,
            pool,
            versions: vec![0; o.keys_per_thread as usize],
            pending: vec![false; o.keys_per_thread as usize],
            rng: ChaCha8Rng::seed_from_u64(o.seed ^ t),
            conn: None,
            requests_on_conn: 0,
        })
        .collect();
    let peak = AtomicU64::new(0);
    let sampling = AtomicBool::new(false);
    let result = std::thread::scope(|s| -> Result<TenantsReport> {
        s.spawn(|| sample_rss(d.pid, &peak, &sampling));
        let r = run_windows(o, &d, &a, &b, me.port, &peer_setup, &mut threads, &peak, progress);
        sampling.store(true, Ordering::Relaxed);
        r
    })?;
    drop(d);
    Ok(result)
}

#[allow(clippy::too_many_arguments)]
fn run_windows(
    o: &TenantsBenchOptions,
    d: &Daemon,
    a: &BenchVm,
    b: &BenchVm,
    coop_port: u16,
    peer_setup: &peers::PeerSetup,
    threads: &mut [LoadThread],
    peak: &AtomicU64,
    progress: &mut dyn FnMut(&str),
) -> Result<TenantsReport> {
    let member = Arc::new(dd_coop::identity::parse_secret(&peer_setup.member.secret_text()).expect("a key"));
    // Warm-up (unrecorded): every key gets a first version, so most gets hit.
    progress("warm-up: A fills its key space");
    window(o, d, a, threads, o.seconds.min(2.0));
    let first = window(o, d, a, threads, o.seconds);
    let baseline_rss = peak.load(Ordering::Relaxed);
    let mut reports = Vec::new();
    let mut first = Some(first);
    for &attack in &o.attacks {
        let tally = Arc::new(tally::Tally::default());
        let delivery = peers::Delivery::default();
        let mut pairs: Vec<(Window, Window)> = Vec::new();
        let mut attack_peak = 0;
        for _ in 0..o.repeats {
            let without = match first.take() {
                Some(w) => w,
                None => window(o, d, a, threads, o.seconds),
            };
            peak.store(0, Ordering::Relaxed);
            let stop = Arc::new(AtomicBool::new(false));
            let env = attacks::Target {
                tcp: d.tcp,
                admin: d.admin,
                coop: SocketAddr::from(([127, 0, 0, 1], coop_port)),
                b: b.clone(),
                member: member.clone(),
            };
            let published = AtomicBool::new(false);
            let with = std::thread::scope(|s| {
                let (stop2, tally2) = (stop.clone(), tally.clone());
                let h = s.spawn(move || {
                    lowest_priority();
                    let cpu = thread_cpu_ns();
                    attack.run(&env, &stop2, &tally2);
                    tally2.cpu_ns.fetch_add(thread_cpu_ns().saturating_sub(cpu), Ordering::Relaxed);
                });
                std::thread::sleep(ATTACK_LEAD);
                let publisher = attack.on_peers().then(|| {
                    s.spawn(|| {
                        peers::publish_loop(peer_setup, attack == Attack::PeerInject, &published, &delivery)
                    })
                });
                let with = window(o, d, a, threads, o.seconds);
                published.store(true, Ordering::Relaxed);
                if let Some(p) = publisher {
                    p.join().expect("victim publisher");
                }
                attack_peak = attack_peak.max(peak.load(Ordering::Relaxed));
                stop.store(true, Ordering::Relaxed);
                h.join().expect("attack thread");
                with
            });
            let (ops, p99) = pair_ratios(&without, &with);
            progress(&format!(
                "{:<22} A {:>9.0} -> {:>9.0} ops/s (x{ops:.2}), p99 {} -> {} us (x{p99:.2}), \
                 errors {}, wrong {}, attacker actions {}, CPU {:.2} s, {} MiB sent",
                attack.name(),
                without.ops_per_s,
                with.ops_per_s,
                without.p99_us,
                with.p99_us,
                without.errors + with.errors,
                without.wrong_pages + with.wrong_pages,
                tally.actions.load(Ordering::Relaxed),
                tally.cpu_ns.load(Ordering::Relaxed) as f64 / 1e9,
                tally.bytes_sent.load(Ordering::Relaxed) >> 20,
            ));
            pairs.push((without, with));
            // The next baseline starts after the daemon has shed the attacker's connections.
            std::thread::sleep(Duration::from_millis(200));
        }
        let ops_ratios: Vec<f64> = pairs.iter().map(|(w, x)| pair_ratios(w, x).0).collect();
        let p99_ratios: Vec<f64> = pairs.iter().map(|(w, x)| pair_ratios(w, x).1).collect();
        let errors = pairs.iter().map(|(w, x)| w.errors + x.errors).sum();
        let wrong_pages = pairs.iter().map(|(w, x)| w.wrong_pages + x.wrong_pages).sum();
        let ops_ratio = lower_median(&ops_ratios);
        let at = ops_ratios.iter().position(|r| *r == ops_ratio).expect("the median is one of them");
        let (without, with) = pairs.swap_remove(at);
        reports.push(AttackReport {
            attack,
            what: attack.what(),
            without,
            with,
            ops_ratio,
            p99_ratio: lower_median(&p99_ratios),
            ops_ratios,
            p99_ratios,
            errors,
            wrong_pages,
            // The injections are the attacker's actions of `peer_inject` (made by the publisher).
            attacker_actions: tally.actions.load(Ordering::Relaxed)
                + delivery.injected.load(Ordering::Relaxed),
            attacker_bytes_sent: tally.bytes_sent.load(Ordering::Relaxed),
            attacker_cpu_s: tally.cpu_ns.load(Ordering::Relaxed) as f64 / 1e9,
            publishes_attempted: delivery.attempted.load(Ordering::Relaxed),
            publishes_delivered: delivery.delivered.load(Ordering::Relaxed),
            injected: delivery.injected.load(Ordering::Relaxed),
            injected_refused: delivery.refused.load(Ordering::Relaxed),
            leaks: tally.leaks.load(Ordering::Relaxed),
            peak_rss_mib: attack_peak as f64 / MIB,
        });
    }
    let errors = reports.iter().map(|r| r.errors).sum();
    let wrong_pages = reports.iter().map(|r| r.wrong_pages).sum();
    let leaks = reports.iter().map(|r| r.leaks).sum();
    let min_ops_ratio = reports.iter().map(|r| r.ops_ratio).fold(f64::INFINITY, f64::min);
    let min_p99_ratio = reports.iter().map(|r| r.p99_ratio).fold(f64::INFINITY, f64::min);
    let peak_rss = reports.iter().map(|r| r.peak_rss_mib).fold(0.0, f64::max);
    // Peer attacks: the victim reached the daemon under test in at least 95% of its publications, and
    // every injected record was refused.
    let peers_held = reports.iter().filter(|r| r.attack.on_peers()).all(|r| {
        r.publishes_attempted > 0
            && r.publishes_delivered as f64 >= 0.95 * r.publishes_attempted as f64
            && r.injected_refused == r.injected
            && (r.attack != Attack::PeerInject || r.injected > 0)
    });
    let bound = (baseline_rss + connection_memory_bound()) as f64 / MIB;
    Ok(TenantsReport {
        seconds_per_window: o.seconds,
        repeats: o.repeats,
        threads: o.threads,
        batch: o.batch,
        pass: min_ops_ratio >= 0.5
            && min_p99_ratio >= 0.5
            && errors == 0
            && wrong_pages == 0
            && leaks == 0
            && peers_held
            && peak_rss <= bound,
        attacks: reports,
        min_ops_ratio,
        min_p99_ratio,
        errors,
        wrong_pages,
        leaks,
        baseline_rss_mib: baseline_rss as f64 / MIB,
        peak_rss_mib: peak_rss,
        rss_bound_mib: bound,
        rss_bound: "A's baseline peak + max_connections x (2 x max_payload + 64 KiB + write_buffer) \
                    + (coop.max_connections + members x (handshakes_per_member + max_sessions_per_peer)) \
                    x (4 KiB + 64 KiB read + 64 KiB record)",
    })
}
