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
//! * `connections` client threads, one TCP connection each (Nagle off on both).
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
use dd_engine::{EvictionOrder, Key, PoolId, PoolKind, PoolOptions, PutOutcome, Spec};
use dd_proto::{KeyList, Request, Response};
use hdrhistogram::Histogram;
use rand::{Rng, RngCore, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::Serialize;
use std::collections::VecDeque;
use std::io::{BufReader, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Barrier};
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
    /// Client connections, one thread each. Default 4.
    pub connections: usize,
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
}

impl Default for ServerBenchOptions {
    fn default() -> Self {
        ServerBenchOptions {
            exe: PathBuf::from("doubledecker"),
            against_memcached: true,
            memcached: PathBuf::from("memcached"),
            connections: 4,
            depth: 4,
            batch: 16,
            get_ratio: 0.9,
            keys: 65_536,
            zipf_theta: 0.0,
            warmup_secs: 1.0,
            seconds: 5.0,
            seed: 0x5eed,
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
}

/// The parameters both servers ran with.
#[derive(Debug, Clone, Serialize)]
pub struct ServerBenchParams {
    pub connections: usize,
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

/// The report printed by `doubledecker bench server --json`.
#[derive(Debug, Clone, Serialize)]
pub struct ServerBenchReport {
    pub parameters: ServerBenchParams,
    pub doubledecker: ServerResult,
    pub memcached: Option<ServerResult>,
    /// ours / memcached ops/s; SPEC target: at least 1.5.
    pub ratio_ops: Option<f64>,
    /// Our get p99 and put p99 are each at most memcached's.
    pub p99_no_worse: Option<bool>,
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

/// memcached protocol encoding and parsing (text protocol `get`, meta `ms` / `mn`).
pub mod memcache {
    use super::{Result, ServerBenchError};
    use std::io::BufRead;

    /// The memcached key of page key `k` (ASCII, no spaces or control characters, < 250 bytes).
    pub fn key_name(k: u64, out: &mut Vec<u8>) {
        out.extend_from_slice(b"dd:");
        out.extend_from_slice(k.to_string().as_bytes());
    }

    fn parse_key_name(name: &[u8]) -> Option<u64> {
        std::str::from_utf8(name.strip_prefix(b"dd:")?).ok()?.parse().ok()
    }

    /// Appends the multi-get `get k1 k2 ...\r\n`.
    pub fn encode_get(keys: &[u64], out: &mut Vec<u8>) {
        out.extend_from_slice(b"get");
        for &k in keys {
            out.push(b' ');
            key_name(k, out);
        }
        out.extend_from_slice(b"\r\n");
    }

    /// Appends one quiet meta set per key (`ms <key> <len> q\r\n<value>\r\n`: success is silent, only
    /// a failure answers) and a meta no-op `mn\r\n`, whose `MN\r\n` ends the batch's answer.
    pub fn encode_sets(keys: &[u64], vals: &[u8], value_size: usize, out: &mut Vec<u8>) {
        for (i, &k) in keys.iter().enumerate() {
            out.extend_from_slice(b"ms ");
            key_name(k, out);
            out.extend_from_slice(format!(" {value_size} q\r\n").as_bytes());
            out.extend_from_slice(&vals[i * value_size..(i + 1) * value_size]);
            out.extend_from_slice(b"\r\n");
        }
        out.extend_from_slice(b"mn\r\n");
    }

    fn read_line<R: BufRead>(r: &mut R, line: &mut Vec<u8>) -> Result<()> {
        line.clear();
        let n = r.read_until(b'\n', line)?;
        if n == 0 {
            return Err(ServerBenchError::Protocol("connection closed by memcached".into()));
        }
        if !line.ends_with(b"\r\n") {
            return Err(ServerBenchError::Protocol(format!(
                "line without CRLF: {:?}",
                String::from_utf8_lossy(line)
            )));
        }
        line.truncate(line.len() - 2);
        Ok(())
    }

    fn error_line(line: &[u8]) -> ServerBenchError {
        ServerBenchError::Memcached(String::from_utf8_lossy(line).into_owned())
    }

    /// Reads one multi-get answer (`VALUE <key> <flags> <bytes>\r\n<data>\r\n` per hit, then
    /// `END\r\n`), calling `on_value(key, data)` per hit; returns the number of hits.
    pub fn read_get_response<R: BufRead>(
        r: &mut R,
        line: &mut Vec<u8>,
        data: &mut Vec<u8>,
        mut on_value: impl FnMut(u64, &[u8]) -> Result<()>,
    ) -> Result<usize> {
        let mut hits = 0;
        loop {
            read_line(r, line)?;
            if line == b"END" {
                return Ok(hits);
            }
            let Some(rest) = line.strip_prefix(b"VALUE ") else {
                return Err(error_line(line));
            };
            let mut f = rest.split(|b| *b == b' ');
            let (Some(name), Some(_flags), Some(len)) = (f.next(), f.next(), f.next()) else {
                return Err(ServerBenchError::Protocol(format!(
                    "bad VALUE line {:?}",
                    String::from_utf8_lossy(line)
                )));
            };
            let key = parse_key_name(name).ok_or_else(|| {
                ServerBenchError::Protocol(format!("unexpected key {:?}", String::from_utf8_lossy(name)))
            })?;
            let len: usize = std::str::from_utf8(len)
                .ok()
                .and_then(|s| s.parse().ok())
                .filter(|n| *n <= 1 << 20)
                .ok_or_else(|| ServerBenchError::Protocol("bad VALUE length".into()))?;
            data.resize(len + 2, 0);
            r.read_exact(data)?;
            if &data[len..] != b"\r\n" {
                return Err(ServerBenchError::Protocol("value not followed by CRLF".into()));
            }
            on_value(key, &data[..len])?;
            hits += 1;
        }
    }

    /// Reads the answer of an [`encode_sets`] batch: `MN` alone means every set succeeded; any line
    /// before it is a failed set (`NS`, `SERVER_ERROR ...`, `CLIENT_ERROR ...`) and fails the batch.
    pub fn read_sets_response<R: BufRead>(r: &mut R, line: &mut Vec<u8>) -> Result<()> {
        read_line(r, line)?;
        if line == b"MN" {
            Ok(())
        } else {
            Err(error_line(line))
        }
    }
}

enum Pending {
    Get(Vec<u64>),
    Put(usize),
}

/// One pipelined connection to memcached.
pub struct MemcachedConn {
    rd: BufReader<TcpStream>,
    wbuf: Vec<u8>,
    pending: VecDeque<Pending>,
    line: Vec<u8>,
    data: Vec<u8>,
}

impl MemcachedConn {
    pub fn connect(addr: SocketAddr) -> Result<MemcachedConn> {
        let s = TcpStream::connect(addr)?;
        s.set_nodelay(true)?;
        Ok(MemcachedConn {
            rd: BufReader::with_capacity(256 * 1024, s),
            wbuf: Vec::with_capacity(256 * 1024),
            pending: VecDeque::new(),
            line: Vec::new(),
            data: Vec::new(),
        })
    }
}

impl Backend for MemcachedConn {
    fn send_put(&mut self, keys: &[u64], vals: &[u8]) -> Result<()> {
        memcache::encode_sets(keys, vals, VALUE_SIZE, &mut self.wbuf);
        self.pending.push_back(Pending::Put(keys.len()));
        Ok(())
    }

    fn send_get(&mut self, keys: &[u64]) -> Result<()> {
        memcache::encode_get(keys, &mut self.wbuf);
        self.pending.push_back(Pending::Get(keys.to_vec()));
        Ok(())
    }

    fn flush(&mut self) -> Result<()> {
        if !self.wbuf.is_empty() {
            self.rd.get_mut().write_all(&self.wbuf)?;
            self.wbuf.clear();
        }
        Ok(())
    }

    fn recv(&mut self) -> Result<usize> {
        self.flush()?;
        match self.pending.pop_front() {
            None => Err(ServerBenchError::Protocol("recv with nothing outstanding".into())),
            Some(Pending::Put(n)) => {
                memcache::read_sets_response(&mut self.rd, &mut self.line)?;
                Ok(n)
            }
            Some(Pending::Get(keys)) => {
                memcache::read_get_response(&mut self.rd, &mut self.line, &mut self.data, |k, v| {
                    if keys.contains(&k) && stamped(v, k) {
                        Ok(())
                    } else {
                        Err(ServerBenchError::Corrupt { server: "memcached", key: k })
                    }
                })
            }
        }
    }
}

/// One pipelined data-plane connection to our daemon, on one pool.
pub struct DdConn {
    client: dd_client::Client,
    pool: PoolId,
    pending: VecDeque<Pending>,
    keybuf: Vec<Key>,
}

/// The data-plane key of page key `k`: 64 pages per object, like consecutive pages of files.
fn dd_key(k: u64) -> Key {
    Key::new(k >> 6, k & 63)
}

impl DdConn {
    pub fn connect(addr: SocketAddr, vm: &BenchVm, pool: PoolId) -> Result<DdConn> {
        let client = dd_client::Client::connect_tcp(addr, vm.id, &vm.data_token)?;
        Ok(DdConn { client, pool, pending: VecDeque::new(), keybuf: Vec::new() })
    }

    fn keys(&mut self, keys: &[u64]) {
        self.keybuf.clear();
        self.keybuf.extend(keys.iter().map(|k| dd_key(*k)));
    }
}

impl Backend for DdConn {
    fn send_put(&mut self, keys: &[u64], vals: &[u8]) -> Result<()> {
        self.keys(keys);
        self.client.send(&Request::PutBatch {
            pool: self.pool,
            keys: KeyList::Keys(&self.keybuf),
            pages: vals,
        });
        self.pending.push_back(Pending::Put(keys.len()));
        Ok(())
    }

    fn send_get(&mut self, keys: &[u64]) -> Result<()> {
        self.keys(keys);
        self.client.send(&Request::GetBatch { pool: self.pool, keys: KeyList::Keys(&self.keybuf) });
        self.pending.push_back(Pending::Get(keys.to_vec()));
        Ok(())
    }

    fn flush(&mut self) -> Result<()> {
        Ok(self.client.flush()?)
    }

    fn recv(&mut self) -> Result<usize> {
        let (_, resp) = self.client.recv()?;
        let pending = self
            .pending
            .pop_front()
            .ok_or_else(|| ServerBenchError::Protocol("recv with nothing outstanding".into()))?;
        match (pending, resp) {
            (Pending::Put(n), Response::PutBatch(outs)) if outs.len() == n => {
                Ok(outs.iter().filter(|o| matches!(o, PutOutcome::Stored(_))).count())
            }
            (Pending::Get(keys), Response::GetBatch { hits, pages }) if hits.len() == keys.len() => {
                let mut src = pages.chunks_exact(VALUE_SIZE);
                let mut n = 0;
                for (k, _) in keys.iter().zip(&hits).filter(|(_, h)| **h) {
                    let v =
                        src.next().ok_or(ServerBenchError::Corrupt { server: "doubledecker", key: *k })?;
                    if !stamped(v, *k) {
                        return Err(ServerBenchError::Corrupt { server: "doubledecker", key: *k });
                    }
                    n += 1;
                }
                Ok(n)
            }
            (_, Response::Error { status, message }) => {
                Err(dd_client::ClientError::Server { status, message }.into())
            }
            (_, other) => {
                Err(ServerBenchError::Protocol(format!("unexpected answer {:.200}", format!("{other:?}"))))
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The load generator
// ---------------------------------------------------------------------------------------------

/// Key distribution over `0..keys`.
#[derive(Debug, Clone)]
pub enum KeyDist {
    Uniform(u64),
    /// Cumulative probabilities of keys 0.. (key 0 the hottest).
    Zipf(Arc<Vec<f64>>),
}

impl KeyDist {
    pub fn new(keys: u64, theta: f64) -> KeyDist {
        if theta <= 0.0 {
            return KeyDist::Uniform(keys);
        }
        let mut cdf = Vec::with_capacity(keys as usize);
        let mut sum = 0.0;
        for i in 0..keys {
            sum += 1.0 / ((i + 1) as f64).powf(theta);
            cdf.push(sum);
        }
        for c in &mut cdf {
            *c /= sum;
        }
        KeyDist::Zipf(Arc::new(cdf))
    }

    pub fn sample(&self, rng: &mut ChaCha8Rng) -> u64 {
        match self {
            KeyDist::Uniform(n) => rng.gen_range(0..*n),
            KeyDist::Zipf(cdf) => {
                let u: f64 = rng.gen();
                (cdf.partition_point(|c| *c < u) as u64).min(cdf.len() as u64 - 1)
            }
        }
    }

    /// `n` distinct keys (a multi-get names each key once).
    fn sample_distinct(&self, rng: &mut ChaCha8Rng, n: usize, out: &mut Vec<u64>) {
        out.clear();
        while out.len() < n {
            let k = self.sample(rng);
            if !out.contains(&k) {
                out.push(k);
            }
        }
    }
}

/// What one connection measured.
#[derive(Debug)]
pub struct ConnResult {
    pub get_hist: Histogram<u64>,
    pub put_hist: Histogram<u64>,
    pub get_ops: u64,
    pub get_hits: u64,
    pub put_ops: u64,
    pub puts_stored: u64,
    pub get_requests: u64,
    pub put_requests: u64,
    pub measured: Duration,
}

/// Load-generator settings of one connection.
#[derive(Debug, Clone)]
pub struct LoadSpec {
    pub conn: usize,
    pub connections: usize,
    pub depth: usize,
    pub batch: usize,
    pub get_ratio: f64,
    pub keys: u64,
    pub dist: KeyDist,
    pub warmup: Duration,
    pub measure: Duration,
    pub seed: u64,
}

fn histogram() -> Histogram<u64> {
    // 1 us .. 60 s, 3 significant digits.
    Histogram::new_with_bounds(1, 60_000_000, 3).expect("static bounds")
}

/// One connection's load: fill its share of the key space, barrier, warm-up, measurement.
pub fn drive<B: Backend>(b: &mut B, spec: &LoadSpec, barrier: &Barrier) -> Result<ConnResult> {
    let mut rng = ChaCha8Rng::seed_from_u64(spec.seed ^ spec.conn as u64);
    let mut vals = vec![0u8; spec.batch * VALUE_SIZE];
    rng.fill_bytes(&mut vals);

    // Fill: this connection's share (keys = conn mod connections), pipelined like the measured load.
    // The barrier is passed whatever the fill's outcome, so a failing connection cannot leave the others
    // waiting at it forever; the error is returned after it.
    let filled = fill(b, spec, &mut vals);
    barrier.wait();
    filled?;

    let mut r = ConnResult {
        get_hist: histogram(),
        put_hist: histogram(),
        get_ops: 0,
        get_hits: 0,
        put_ops: 0,
        puts_stored: 0,
        get_requests: 0,
        put_requests: 0,
        measured: Duration::ZERO,
    };
    let start = Instant::now();
    let record_from = start + spec.warmup;
    let end = record_from + spec.measure;
    // (sent at, is get, keys) of each request in flight, oldest first.
    let mut q: VecDeque<(Instant, bool, usize)> = VecDeque::with_capacity(spec.depth);
    let mut keys = Vec::with_capacity(spec.batch);
    let mut last_done = record_from;
    loop {
        let now = Instant::now();
        let sending = now < end;
        if sending && q.len() < spec.depth {
            // Top up the pipeline: queue every free slot, then one write.
            while q.len() < spec.depth {
                let is_get = rng.gen_bool(spec.get_ratio);
                spec.dist.sample_distinct(&mut rng, spec.batch, &mut keys);
                if is_get {
                    b.send_get(&keys)?;
                } else {
                    for (i, k) in keys.iter().enumerate() {
                        stamp(&mut vals[i * VALUE_SIZE..(i + 1) * VALUE_SIZE], *k);
                    }
                    b.send_put(&keys, &vals)?;
                }
                q.push_back((Instant::now(), is_get, keys.len()));
            }
            b.flush()?;
        }
        let Some((sent, is_get, n)) = q.pop_front() else { break };
        let done = b.recv()?;
        let t = Instant::now();
        if sent >= record_from {
            let us = (t - sent).as_micros().max(1) as u64;
            if is_get {
                r.get_hist.saturating_record(us);
                r.get_ops += n as u64;
                r.get_hits += done as u64;
                r.get_requests += 1;
            } else {
                r.put_hist.saturating_record(us);
                r.put_ops += n as u64;
                r.puts_stored += done as u64;
                r.put_requests += 1;
            }
            last_done = t;
        }
    }
    r.measured = last_done.saturating_duration_since(record_from);
    Ok(r)
}

/// Puts this connection's share of the key space (`conn mod connections`), `depth` batches in flight.
fn fill<B: Backend>(b: &mut B, spec: &LoadSpec, vals: &mut [u8]) -> Result<()> {
    let share: Vec<u64> = (spec.conn as u64..spec.keys).step_by(spec.connections).collect();
    let mut inflight = 0;
    for chunk in share.chunks(spec.batch) {
        for (i, k) in chunk.iter().enumerate() {
            stamp(&mut vals[i * VALUE_SIZE..(i + 1) * VALUE_SIZE], *k);
        }
        b.send_put(chunk, &vals[..chunk.len() * VALUE_SIZE])?;
        inflight += 1;
        if inflight == spec.depth {
            b.recv()?;
            inflight -= 1;
        }
    }
    for _ in 0..inflight {
        b.recv()?;
    }
    Ok(())
}

/// Runs `spec.connections` threads against the backend `connect` makes, and sums their results.
pub fn run_load<B, F>(name: &str, spec: &LoadSpec, connect: F) -> Result<ServerResult>
where
    B: Backend,
    F: Fn(usize) -> Result<B> + Sync,
{
    let barrier = Barrier::new(spec.connections);
    let results: Vec<Result<ConnResult>> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..spec.connections)
            .map(|c| {
                let (barrier, connect) = (&barrier, &connect);
                let spec = LoadSpec { conn: c, ..spec.clone() };
                s.spawn(move || {
                    let mut b = match connect(c) {
                        Ok(b) => b,
                        Err(e) => {
                            // Release the others from the barrier before failing: they would wait forever.
                            barrier.wait();
                            return Err(e);
                        }
                    };
                    drive(&mut b, &spec, barrier)
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().expect("load thread panicked")).collect()
    });
    let mut get_hist = histogram();
    let mut put_hist = histogram();
    let mut res = ServerResult {
        server: name.into(),
        ops_per_s: 0.0,
        get_ops: 0,
        put_ops: 0,
        get_hit_ratio: 0.0,
        puts_not_stored: 0,
        get_requests: 0,
        put_requests: 0,
        get_p50_us: 0.0,
        get_p99_us: 0.0,
        put_p50_us: 0.0,
        put_p99_us: 0.0,
        measured_secs: 0.0,
    };
    let mut hits = 0;
    let mut measured = Duration::ZERO;
    for r in results {
        let r = r?;
        get_hist.add(&r.get_hist).expect("same bounds");
        put_hist.add(&r.put_hist).expect("same bounds");
        res.get_ops += r.get_ops;
        res.put_ops += r.put_ops;
        hits += r.get_hits;
        res.puts_not_stored += r.put_ops - r.puts_stored;
        res.get_requests += r.get_requests;
        res.put_requests += r.put_requests;
        measured = measured.max(r.measured);
    }
    let secs = measured.as_secs_f64().max(1e-9);
    res.measured_secs = measured.as_secs_f64();
    res.ops_per_s = (res.get_ops + res.put_ops) as f64 / secs;
    res.get_hit_ratio = if res.get_ops > 0 { hits as f64 / res.get_ops as f64 } else { 0.0 };
    res.get_p50_us = get_hist.value_at_quantile(0.5) as f64;
    res.get_p99_us = get_hist.value_at_quantile(0.99) as f64;
    res.put_p50_us = put_hist.value_at_quantile(0.5) as f64;
    res.put_p99_us = put_hist.value_at_quantile(0.99) as f64;
    Ok(res)
}

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
    if o.connections == 0 {
        return bad("connections", "must be at least 1");
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
    if o.keys < (o.batch * o.connections) as u64 {
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
    let spec = LoadSpec {
        conn: 0,
        connections: o.connections,
        depth: o.depth,
        batch: o.batch,
        get_ratio: o.get_ratio,
        keys: o.keys,
        dist: KeyDist::new(o.keys, o.zipf_theta),
        warmup: Duration::from_secs_f64(o.warmup_secs),
        measure: Duration::from_secs_f64(o.seconds),
        seed: o.seed,
    };

    progress(&format!("doubledecker: {} MiB memory store, {} keys, {} s", dd_mib, o.keys, o.seconds));
    let vm = BenchVm::new(1);
    let ours = {
        let daemon = Daemon::start(&DaemonOptions {
            exe: o.exe.clone(),
            mem_capacity_bytes: dd_mib << 20,
            ssd_capacity_bytes: 0,
            vms: vec![vm.clone()],
            extra_toml: String::new(),
        })?;
        let mut admin = dd_client::Client::connect_tcp(daemon.tcp, vm.id, &vm.data_token)?;
        let pool = admin.create_cgroup(PoolOptions {
            kind: PoolKind::Ephemeral,
            spec: Spec::Mem { weight: 100 },
            order: EvictionOrder::default(),
            exclusive_gets: false,
        })?;
        let r = run_load("doubledecker", &spec, |_| DdConn::connect(daemon.tcp, &vm, pool))?;
        let mut d = daemon;
        d.stop(Duration::from_secs(10))?;
        r
    };

    let theirs = if o.against_memcached {
        progress(&format!("memcached: -m {mc_mib} -t {threads}, {} keys, {} s", o.keys, o.seconds));
        let mc = start_memcached(&o.memcached, mc_mib, threads)?;
        let r = run_load("memcached", &spec, |_| MemcachedConn::connect(mc.addr))?;
        drop(mc);
        Some(r)
    } else {
        None
    };

    Ok(ServerBenchReport {
        parameters: ServerBenchParams {
            connections: o.connections,
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
        ratio_ops: theirs.as_ref().map(|m| ours.ops_per_s / m.ops_per_s),
        p99_no_worse: theirs
            .as_ref()
            .map(|m| ours.get_p99_us <= m.get_p99_us && ours.put_p99_us <= m.put_p99_us),
        doubledecker: ours,
        memcached: theirs,
    })
}

#[cfg(test)]
mod tests {
    use super::memcache::*;
    use super::*;
    use std::io::Cursor;

    #[test]
    fn encodes_multi_get_and_quiet_sets() {
        let mut out = Vec::new();
        encode_get(&[1, 22, 333], &mut out);
        assert_eq!(out, b"get dd:1 dd:22 dd:333\r\n");
        out.clear();
        let vals: Vec<u8> = (0..8).collect();
        encode_sets(&[5, 6], &vals, 4, &mut out);
        assert_eq!(out, b"ms dd:5 4 q\r\n\x00\x01\x02\x03\r\nms dd:6 4 q\r\n\x04\x05\x06\x07\r\nmn\r\n");
    }

    #[test]
    fn parses_multi_get_answers() {
        let mut v = vec![0u8; VALUE_SIZE];
        stamp(&mut v, 22);
        let mut wire = b"VALUE dd:22 0 4096\r\n".to_vec();
        wire.extend_from_slice(&v);
        wire.extend_from_slice(b"\r\nEND\r\nEND\r\n");
        let mut r = Cursor::new(wire);
        let (mut line, mut data) = (Vec::new(), Vec::new());
        let mut seen = Vec::new();
        let hits = read_get_response(&mut r, &mut line, &mut data, |k, d| {
            seen.push((k, stamped(d, k)));
            Ok(())
        })
        .unwrap();
        assert_eq!((hits, seen), (1, vec![(22, true)]));
        // A second answer with no hits (all misses) is just END.
        assert_eq!(read_get_response(&mut r, &mut line, &mut data, |_, _| Ok(())).unwrap(), 0);
        // The stream is exhausted: reading again is an error, not a hang or a panic.
        assert!(read_get_response(&mut r, &mut line, &mut data, |_, _| Ok(())).is_err());
    }

    #[test]
    fn rejects_malformed_get_answers() {
        let (mut line, mut data) = (Vec::new(), Vec::new());
        for wire in [
            &b"VALUE dd:1 0 4\r\nabcdXX"[..],      // value not followed by CRLF
            b"VALUE other 0 4\r\nabcd\r\nEND\r\n", // a key we never asked for
            b"SERVER_ERROR out of memory\r\n",     // an error instead of values
            b"VALUE dd:1 0\r\n",                   // missing length
            b"END\n",                              // bare LF
        ] {
            let mut r = Cursor::new(wire.to_vec());
            assert!(read_get_response(&mut r, &mut line, &mut data, |_, _| Ok(())).is_err(), "{wire:?}");
        }
    }

    #[test]
    fn parses_set_batch_answers() {
        let mut line = Vec::new();
        assert!(read_sets_response(&mut Cursor::new(b"MN\r\n".to_vec()), &mut line).is_ok());
        let e =
            read_sets_response(&mut Cursor::new(b"SERVER_ERROR out of memory\r\nMN\r\n".to_vec()), &mut line)
                .unwrap_err();
        assert!(e.to_string().contains("out of memory"), "{e}");
        assert!(read_sets_response(&mut Cursor::new(b"NS\r\nMN\r\n".to_vec()), &mut line).is_err());
    }

    #[test]
    fn zipf_keys_are_in_range_and_skewed() {
        let d = KeyDist::new(1000, 0.99);
        let mut rng = ChaCha8Rng::seed_from_u64(1);
        let mut low = 0;
        for _ in 0..10_000 {
            let k = d.sample(&mut rng);
            assert!(k < 1000);
            low += (k < 10) as u32;
        }
        // Under zipf(0.99) the 10 hottest of 1000 keys take ~39% of accesses; uniform would give 1%.
        assert!(low > 2_000, "{low}");
    }
}
