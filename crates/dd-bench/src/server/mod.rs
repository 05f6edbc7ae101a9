//! `bench server --against memcached`: our daemon against a real memcached over TCP loopback, driven by
//! one load generator (SPEC section 11: ">= 1.5x the ops/s of memcached with 4 KiB values, p99 latency no
//! worse").
//!
//! # What it owns
//!
//! Both servers are started here on 127.0.0.1 and stopped (by PID) at the end: the `doubledecker serve`
//! binary the caller names, memory-only, with one VM in its configuration file and one pool created over
//! the data plane; and `memcached -p <free port> -l 127.0.0.1 -m <MiB> -t <threads> -U 0`. Both get the
//! same number of worker threads (the machine's cores: our daemon's tokio runtime uses one per core) and
//! enough memory for the whole key space, so neither evicts and the comparison is of the request path.
//!
//! # Method (identical for both servers: the generator is generic over [`Backend`])
//!
//! * `connections` client threads, one TCP connection each (Nagle off on both). A list of counts is a
//!   sweep: each count runs both servers afresh (start, fill, warm-up, measurement) and is one row.
//! * Every request is a batch of `batch` distinct keys: a multi-get (`get k1 k2 ...` for memcached,
//!   GET_BATCH for ours) or a batch of puts (meta `ms <key> 4096 q` commands closed by `mn` for memcached:
//!   quiet mode answers only errors, `mn` marks the end of the batch; PUT_BATCH for ours). Each connection
//!   keeps `depth` requests in flight (pipelining); a request's latency is the time from writing it to
//!   reading the last byte of its answer.
//! * Values are 4 KiB; every value carries its key in its first and last 8 bytes, and every hit of both
//!   servers is checked, so a wrong answer fails the benchmark instead of being counted.
//! * Thread `t` seeds a ChaCha8 generator with `seed ^ t`, so both servers see exactly the same sequence
//!   of requests on every connection. A request is a get with probability `get_ratio`, keys are uniform
//!   (or zipfian with `zipf_theta > 0`) over `keys` keys.
//! * Warm-up: the connections first put the whole key space (so gets hit), then run the mixed load for
//!   `warmup_secs` unrecorded; then `seconds` are measured. ops/s counts individual page operations
//!   (a batch of 16 gets is 16 ops), over the measured time until the last answer arrived.
//! * CPU: each server's user + system time over the measured window, from `/proc/<pid>/stat` of its
//!   process (all threads, [`crate::cpu`]), divided by the ops measured: `cpu_us_per_op`. On a 2-core
//!   machine the load generator takes about half the CPU and other work on the machine moves ops/s,
//!   so CPU per operation is the fair measure of the server (issue 16, item 1); `ratio_cpu` is ours /
//!   memcached's (target at most 0.67). The load generator's own CPU per operation
//!   (`client_cpu_us_per_op`), the machine's idle fraction and the CPU others took over the same
//!   window say why ops/s is what it is: with no idle time left, ops/s is two cores divided by the
//!   client's and the server's CPU per operation together.
//!
//! # Fairness of the get semantics
//!
//! Our ephemeral pools default to exclusive gets (a hit removes the page, the cleancache contract of a
//! guest that now holds the page itself). memcached's get never removes. Two ways to compare: re-put
//! every page a get hit on our side (extra work memcached does not do, or that memcached would then have
//! to do too, changing the op mix for both), or run our pool with non-exclusive gets. This benchmark does
//! the latter: an ephemeral memory pool with `exclusive_gets = false` has exactly memcached's semantics
//! (a get leaves the value, a put overwrites it, the cache may drop values under pressure), so the same
//! op sequence means the same thing on both servers and both keep the whole key space resident.

use crate::daemon::{free_port, BenchVm, Daemon, DaemonError, DaemonOptions};
use serde::Serialize;
use std::net::{SocketAddr, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Errors of `bench server`.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ServerBenchError {
    #[error("invalid option {field}: {reason}")]
    InvalidOption { field: &'static str, reason: String },
    #[error("memcached not found ({0}); install it with `apt-get install memcached`")]
    MemcachedMissing(String),
    #[error("memcached: {0}")]
    Memcached(String),
    #[error("memcached protocol: {0}")]
    Protocol(String),
    #[error(transparent)]
    Daemon(#[from] DaemonError),
    #[error("doubledecker client: {0}")]
    Client(#[from] dd_client::ClientError),
    #[error("i/o: {0}")]
    Io(#[from] std::io::Error),
    #[error("{server} returned the wrong value for key {key}")]
    Corrupt { server: &'static str, key: u64 },
    #[error(transparent)]
    Certs(#[from] crate::certs::CertError),
}

type Result<T> = std::result::Result<T, ServerBenchError>;

/// Value size of every put (SPEC: 4 KiB values on both sides).
pub const VALUE_SIZE: usize = 4096;

/// Options of `bench server`.
#[derive(Debug, Clone)]
pub struct ServerBenchOptions {
    /// The `doubledecker` executable (started as `serve`).
    pub exe: PathBuf,
    /// Also run memcached (`--against memcached`); without it only our daemon is measured.
    pub against_memcached: bool,
    /// The memcached executable. Default `memcached` (from PATH).
    pub memcached: PathBuf,
    /// Client connections, one thread each; several counts are a sweep, one row each. Default [4].
    pub connections: Vec<usize>,
    /// The connections spread over this many VMs, each with its own pool (issue 28). Default 1.
    pub vms: usize,
    /// The connections spread over this many pools of each VM (issue 28). Default 1.
    pub pools: usize,
    /// Requests in flight per connection. Default 4.
    pub depth: usize,
    /// Keys per request (multi-get / put batch). Default 16.
    pub batch: usize,
    /// Fraction of requests that are gets. Default 0.9.
    pub get_ratio: f64,
    /// Key space. Default 65 536 (256 MiB of values).
    pub keys: u64,
    /// 0: uniform keys; otherwise zipfian with this exponent. Default 0.
    pub zipf_theta: f64,
    /// Unrecorded mixed load after the fill. Default 1 s.
    pub warmup_secs: f64,
    /// Measured time per server. Default 5 s.
    pub seconds: f64,
    pub seed: u64,
    /// Our daemon with TLS on its data plane (`[tls]`, certificates made for the run), and the same
    /// build without TLS measured in the same row as its baseline. Default false.
    pub tls: bool,
}

impl Default for ServerBenchOptions {
    fn default() -> Self {
        ServerBenchOptions {
            exe: PathBuf::from("doubledecker"),
            against_memcached: true,
            memcached: PathBuf::from("memcached"),
            connections: vec![4],
            vms: 1,
            pools: 1,
            depth: 4,
            batch: 16,
            get_ratio: 0.9,
            keys: 65_536,
            zipf_theta: 0.0,
            warmup_secs: 1.0,
            seconds: 5.0,
            seed: 0x5eed,
            tls: false,
        }
    }
}

/// The figures of one server.
#[derive(Debug, Clone, Serialize)]
pub struct ServerResult {
    pub server: String,
    /// Page operations (each key of a batch) per second, gets and puts together.
    pub ops_per_s: f64,
    pub get_ops: u64,
    pub put_ops: u64,
    /// Gets that hit / gets (should be 1.0: the key space fits both caches).
    pub get_hit_ratio: f64,
    /// Puts the server did not store (ours: refused; memcached: none, errors fail the run).
    pub puts_not_stored: u64,
    pub get_requests: u64,
    pub put_requests: u64,
    /// Latency of a whole request (one batch) from write to last byte of the answer, microseconds.
    pub get_p50_us: f64,
    pub get_p99_us: f64,
    pub put_p50_us: f64,
    pub put_p99_us: f64,
    pub measured_secs: f64,
    /// The server process's user + system CPU time over the measured window, seconds.
    pub cpu_secs: f64,
    /// `cpu_secs` per page operation, microseconds.
    pub cpu_us_per_op: f64,
    /// The load generator's (this process's) user + system CPU time over the same window, seconds:
    /// what asking the server and checking its answers cost the client.
    pub client_cpu_secs: f64,
    /// `client_cpu_secs` per page operation, microseconds.
    pub client_cpu_us_per_op: f64,
    /// The machine's idle (and iowait) time over the window, as a fraction of all its cores' time:
    /// near 0 means the server and the client together used every core.
    pub machine_idle_fraction: f64,
    /// Busy time of the machine over the window that was neither the server's nor the client's
    /// (other processes, and interrupt work charged to no task), seconds.
    pub others_cpu_secs: f64,
}

/// The parameters both servers ran with.
#[derive(Debug, Clone, Serialize)]
pub struct ServerBenchParams {
    /// The connection counts, one row each.
    pub connections: Vec<usize>,
    /// VMs the connections were spread over, each with `pools` pools (connection `c` on target
    /// `c % (vms x pools)`, which holds the keys `k` with `k % (vms x pools)` its number).
    pub vms: usize,
    pub pools: usize,
    pub pipeline_depth: usize,
    pub batch_keys: usize,
    pub value_size_bytes: usize,
    pub get_ratio: f64,
    pub keys: u64,
    pub key_distribution: String,
    pub warmup_secs: f64,
    pub seconds: f64,
    pub seed: u64,
    /// Worker threads of each server (memcached `-t`, our tokio runtime: one per core).
    pub server_threads: usize,
    pub doubledecker_mem_capacity_mib: u64,
    pub memcached_memory_mib: Option<u64>,
    pub memcached_version: Option<String>,
}

/// Both servers at one connection count.
#[derive(Debug, Clone, Serialize)]
pub struct ServerBenchRow {
    pub connections: usize,
    pub doubledecker: ServerResult,
    pub memcached: Option<ServerResult>,
    /// ours / memcached ops/s; SPEC target: at least 1.5.
    pub ratio_ops: Option<f64>,
    /// ours / memcached CPU time per operation; issue 16 target: at most 0.67.
    pub ratio_cpu: Option<f64>,
    /// Our get p99 and put p99 are each at most memcached's.
    pub p99_no_worse: Option<bool>,
    /// With `tls`: the same daemon build without TLS, under the same load (`doubledecker` is then the
    /// TLS one).
    pub plain: Option<ServerResult>,
    /// With `tls`: TLS / plain ops/s.
    pub tls_ratio_ops: Option<f64>,
    /// With `tls`: TLS / plain get p50.
    pub tls_ratio_get_p50: Option<f64>,
}

/// The report printed by `doubledecker bench server --json`: one row per connection count.
#[derive(Debug, Clone, Serialize)]
pub struct ServerBenchReport {
    pub parameters: ServerBenchParams,
    pub rows: Vec<ServerBenchRow>,
}

/// A server the load generator drives. Requests are queued with `send_*` (pipelining), written by
/// `flush`, and answered in order by `recv`.
pub trait Backend {
    /// Queues puts of `keys`; `vals` holds one [`VALUE_SIZE`] value per key, back to back.
    fn send_put(&mut self, keys: &[u64], vals: &[u8]) -> Result<()>;
    /// Queues a multi-get of `keys`.
    fn send_get(&mut self, keys: &[u64]) -> Result<()>;
    /// Writes every queued request.
    fn flush(&mut self) -> Result<()>;
    /// Reads the answer of the oldest outstanding request: for a get the number of hits (every hit's
    /// value checked against its key), for a put the number of values stored.
    fn recv(&mut self) -> Result<usize>;

    /// One put batch, waiting for its answer.
    fn put_many(&mut self, keys: &[u64], vals: &[u8]) -> Result<usize> {
        self.send_put(keys, vals)?;
        self.recv()
    }
    /// One multi-get, waiting for its answer; returns the hits.
    fn get_many(&mut self, keys: &[u64]) -> Result<usize> {
        self.send_get(keys)?;
        self.recv()
    }
}

/// Writes `key` into the first and last 8 bytes of a value so every hit can be checked.
pub fn stamp(val: &mut [u8], key: u64) {
    val[..8].copy_from_slice(&key.to_le_bytes());
    let n = val.len();
    val[n - 8..].copy_from_slice(&(!key).to_le_bytes());
}

/// Whether `val` carries `key` (see [`stamp`]).
pub fn stamped(val: &[u8], key: u64) -> bool {
    let n = val.len();
    n == VALUE_SIZE && val[..8] == key.to_le_bytes() && val[n - 8..] == (!key).to_le_bytes()
}

// ---------------------------------------------------------------------------------------------
// memcached: a minimal text / meta protocol client
// ---------------------------------------------------------------------------------------------

mod conns;
mod load;
pub mod memcache;

pub use conns::{DdConn, MemcachedConn};
pub use load::{drive, run_load, ConnResult, KeyDist, LoadSpec};

// ---------------------------------------------------------------------------------------------
// memcached process
// ---------------------------------------------------------------------------------------------

/// A memcached process started for the benchmark; killed (by PID) and reaped on drop.
struct Memcached {
    child: Child,
    addr: SocketAddr,
}

impl Drop for Memcached {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn memcached_version(bin: &PathBuf) -> Result<String> {
    let out = Command::new(bin)
        .arg("-V")
        .output()
        .map_err(|e| ServerBenchError::MemcachedMissing(format!("{}: {e}", bin.display())))?;
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

fn start_memcached(bin: &PathBuf, memory_mib: u64, threads: usize) -> Result<Memcached> {
    let port = free_port()?;
    let mut cmd = Command::new(bin);
    cmd.args(["-p", &port.to_string(), "-l", "127.0.0.1", "-U", "0"])
        .args(["-m", &memory_mib.to_string(), "-t", &threads.to_string(), "-c", "1024"])
        .stdin(Stdio::null())
        .stdout(Stdio::null());
    // memcached refuses to run as root without naming the user to run as.
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } == 0 {
        cmd.args(["-u", "root"]);
    }
    let child =
        cmd.spawn().map_err(|e| ServerBenchError::MemcachedMissing(format!("{}: {e}", bin.display())))?;
    let mut m = Memcached { child, addr: SocketAddr::from(([127, 0, 0, 1], port)) };
    // Bound on start-up, not a timing assertion.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if TcpStream::connect(m.addr).is_ok() {
            return Ok(m);
        }
        if let Some(st) = m.child.try_wait()? {
            return Err(ServerBenchError::Memcached(format!("exited at start: {st}")));
        }
        if Instant::now() > deadline {
            return Err(ServerBenchError::Memcached("not listening after 30 s".into()));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

// ---------------------------------------------------------------------------------------------
// The benchmark
// ---------------------------------------------------------------------------------------------

fn validate(o: &ServerBenchOptions) -> Result<()> {
    let bad = |field, reason: &str| Err(ServerBenchError::InvalidOption { field, reason: reason.into() });
    if o.connections.is_empty() || o.connections.contains(&0) {
        return bad("connections", "each count must be at least 1");
    }
    if o.vms == 0 || o.pools == 0 {
        return bad("vms", "vms and pools must each be at least 1");
    }
    if o.connections.iter().any(|c| c % (o.vms * o.pools) != 0) {
        return bad("connections", "each count must be a multiple of vms x pools (every target as loaded)");
    }
    if o.depth == 0 {
        return bad("depth", "must be at least 1");
    }
    if o.batch == 0 || o.batch > 256 {
        return bad("batch", "must be 1 to 256 (the daemon's default max_batch)");
    }
    if !(0.0..=1.0).contains(&o.get_ratio) {
        return bad("get_ratio", "must be within 0..1");
    }
    if o.keys < (o.batch * o.connections.iter().max().unwrap_or(&1)) as u64 {
        return bad("keys", "must be at least batch x connections");
    }
    if o.seconds.is_nan() || o.seconds <= 0.0 || o.warmup_secs.is_nan() || o.warmup_secs < 0.0 {
        return bad("seconds", "must be positive (warm-up non-negative)");
    }
    Ok(())
}

/// Runs the benchmark; `progress` gets a short line before each phase.
pub fn run(o: &ServerBenchOptions, progress: &mut dyn FnMut(&str)) -> Result<ServerBenchReport> {
    validate(o)?;
    let threads = std::thread::available_parallelism().map_or(2, |n| n.get());
    let data_mib = (o.keys * VALUE_SIZE as u64).div_ceil(1 << 20);
    // Ours: a page takes exactly a 4 KiB frame; 25% + 16 MiB headroom keeps every key resident even
    // with the eviction batch's slack.
    let dd_mib = data_mib + data_mib / 4 + 16;
    // memcached: a 4 KiB value with its ~60-byte item header lands in a 4.5 KiB slab chunk (growth
    // factor 1.25), and each slab class takes whole 1 MiB pages: twice the data plus 64 MiB is ample.
    let mc_mib = data_mib * 2 + 64;
    let mc_version = if o.against_memcached { Some(memcached_version(&o.memcached)?) } else { None };
    let mut rows = Vec::with_capacity(o.connections.len());
    for &connections in &o.connections {
        let groups = o.vms * o.pools;
        let spec = LoadSpec {
            conn: 0,
            connections,
            groups,
            depth: o.depth,
            batch: o.batch,
            get_ratio: o.get_ratio,
            keys: o.keys,
            dist: KeyDist::new(o.keys / groups as u64, o.zipf_theta),
            warmup: Duration::from_secs_f64(o.warmup_secs),
            measure: Duration::from_secs_f64(o.seconds),
            seed: o.seed,
        };
        rows.push(run_row(o, &spec, dd_mib, mc_mib, threads, progress)?);
    }

    Ok(ServerBenchReport {
        parameters: ServerBenchParams {
            connections: o.connections.clone(),
            vms: o.vms,
            pools: o.pools,
            pipeline_depth: o.depth,
            batch_keys: o.batch,
            value_size_bytes: VALUE_SIZE,
            get_ratio: o.get_ratio,
            keys: o.keys,
            key_distribution: if o.zipf_theta > 0.0 {
                format!("zipf({})", o.zipf_theta)
            } else {
                "uniform".into()
            },
            warmup_secs: o.warmup_secs,
            seconds: o.seconds,
            seed: o.seed,
            server_threads: threads,
            doubledecker_mem_capacity_mib: dd_mib,
            memcached_memory_mib: o.against_memcached.then_some(mc_mib),
            memcached_version: mc_version,
        },
        rows,
    })
}

/// Both servers at `spec.connections`, each started afresh for it, so a row does not inherit the
/// previous row's connections or memory layout.
fn run_row(
    o: &ServerBenchOptions,
    spec: &LoadSpec,
    dd_mib: u64,
    mc_mib: u64,
    threads: usize,
    progress: &mut dyn FnMut(&str),
) -> Result<ServerBenchRow> {
    progress(&format!(
        "doubledecker: {dd_mib} MiB memory store, {} keys, {} connections, {} s",
        o.keys, spec.connections, o.seconds
    ));
    let vms: Vec<BenchVm> = (1..=o.vms as u32).map(BenchVm::new).collect();
    let certs_dir = tempfile::tempdir()?;
    let ours = match o.tls {
        true => {
            let certs = crate::certs::make_certs(certs_dir.path())?;
            run_ours(o, spec, dd_mib, &vms, Some(&certs))?
        }
        false => run_ours(o, spec, dd_mib, &vms, None)?,
    };
    let plain = if o.tls {
        progress(&format!("doubledecker without TLS: the same load, {} connections", spec.connections));
        Some(run_ours(o, spec, dd_mib, &vms, None)?)
    } else {
        None
    };

    let theirs = if o.against_memcached {
        progress(&format!(
            "memcached: -m {mc_mib} -t {threads}, {} keys, {} connections, {} s",
            o.keys, spec.connections, o.seconds
        ));
        let mc = start_memcached(&o.memcached, mc_mib, threads)?;
        let r = run_load("memcached", spec, mc.child.id(), |_| MemcachedConn::connect(mc.addr))?;
        drop(mc);
        Some(r)
    } else {
        None
    };

    Ok(ServerBenchRow {
        connections: spec.connections,
        ratio_ops: theirs.as_ref().map(|m| ours.ops_per_s / m.ops_per_s),
        ratio_cpu: theirs.as_ref().map(|m| ours.cpu_us_per_op / m.cpu_us_per_op),
        p99_no_worse: theirs
            .as_ref()
            .map(|m| ours.get_p99_us <= m.get_p99_us && ours.put_p99_us <= m.put_p99_us),
        tls_ratio_ops: plain.as_ref().map(|p| ours.ops_per_s / p.ops_per_s),
        tls_ratio_get_p50: plain.as_ref().map(|p| ours.get_p50_us / p.get_p50_us),
        doubledecker: ours,
        memcached: theirs,
        plain,
    })
}

/// Our daemon, started afresh, under `spec`'s load spread over `o.pools` pools of each of `vms` (with
/// TLS on its data plane when `certs` is given).
fn run_ours(
    o: &ServerBenchOptions,
    spec: &LoadSpec,
    dd_mib: u64,
    vms: &[BenchVm],
    certs: Option<&crate::certs::Certs>,
) -> Result<ServerResult> {
    let daemon = Daemon::start(&DaemonOptions {
        exe: o.exe.clone(),
        mem_capacity_bytes: dd_mib << 20,
        ssd_capacity_bytes: 0,
        vms: vms.to_vec(),
        // With one VM the load's connections and the one that created the pool are one VM's: above the
        // default 64 per VM a sweep's largest count would be answered `busy` (memcached is started with
        // `-c 1024`).
        extra_toml: format!(
            "[limits]\nmax_connections_per_vm = {}\n{}",
            (spec.connections + 1).max(64),
            certs.map(|c| c.tls_toml()).unwrap_or_default()
        ),
    })?;
    let tls = certs.map(|c| dd_client::TlsClient { ca_file: c.ca.clone(), server_name: None });
    // Target t (= connection mod targets) is pool t / vms of VM t % vms.
    let mut targets = vec![None; vms.len() * o.pools];
    for (v, vm) in vms.iter().enumerate() {
        let mut admin = match &tls {
            Some(t) => dd_client::Client::connect_tls(&daemon.tcp.to_string(), t, vm.id, &vm.data_token)?,
            None => dd_client::Client::connect_tcp(daemon.tcp, vm.id, &vm.data_token)?,
        };
        for p in 0..o.pools {
            let pool = admin.create_cgroup(crate::daemon::load_pool())?;
            targets[p * vms.len() + v] = Some((vm, pool));
        }
    }
    let targets: Vec<(&BenchVm, dd_engine::PoolId)> =
        targets.into_iter().map(|t| t.expect("every target made")).collect();
    let name = if tls.is_some() { "doubledecker+tls" } else { "doubledecker" };
    let r = run_load(name, spec, daemon.pid, |c| {
        let (vm, pool) = targets[c % targets.len()];
        DdConn::connect(daemon.tcp, tls.as_ref(), vm, pool)
    })?;
    let mut d = daemon;
    d.stop(Duration::from_secs(10))?;
    Ok(r)
}
