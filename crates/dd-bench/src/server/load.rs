//! The load generator, generic over [`Backend`](super::Backend): key distributions, one connection's
//! warm-up, mixed load and latency histograms, and the threads that drive all connections at once,
//! with the server process's CPU time read over the measured window.

use super::{stamp, Backend, Result, ServerResult, VALUE_SIZE};
use crate::cpu;
use hdrhistogram::Histogram;
use rand::{Rng, RngCore, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::collections::VecDeque;
use std::sync::{Arc, Barrier, OnceLock};
use std::time::{Duration, Instant};

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
    /// Connections are spread over this many targets (pools; connection `c` uses target `c % groups`),
    /// each holding the keys `k` with `k % groups` equal to its number: `dist` is over `keys / groups`
    /// and a sampled `s` is the key `s * groups + target`. 1: every connection on every key.
    pub groups: usize,
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

/// One connection's load: fill its share of the key space, barrier, warm-up, measurement. The first
/// thread through the barrier sets `start`, so that every connection (and the CPU sampler of
/// [`run_load`]) starts its warm-up and its measured window at the same instant.
pub fn drive<B: Backend>(
    b: &mut B,
    spec: &LoadSpec,
    barrier: &Barrier,
    start: &OnceLock<Instant>,
) -> Result<ConnResult> {
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
    let start = *start.get_or_init(Instant::now);
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
                if spec.groups > 1 {
                    let target = (spec.conn % spec.groups) as u64;
                    keys.iter_mut().for_each(|k| *k = *k * spec.groups as u64 + target);
                }
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

/// Runs `spec.connections` threads against the backend `connect` makes, and sums their results; the
/// server process `server_pid`'s CPU time (user + system, all its threads), this process's (the load
/// generator's: its other threads sleep meanwhile) and the machine's busy and idle time are read when
/// the measured window opens and once every connection has had its last answer.
///
/// The window's edges: requests in flight when it opens are not counted but some of their work falls
/// inside it, and requests sent before it closes are counted with work done after; both are at most
/// `connections x depth` requests of the hundreds of thousands measured, and fall on both sides. The
/// second read comes after the threads are joined, when the server is idle.
pub fn run_load<B, F>(name: &str, spec: &LoadSpec, server_pid: u32, connect: F) -> Result<ServerResult>
where
    B: Backend,
    F: Fn(usize) -> Result<B> + Sync,
{
    // The connections and this thread, which reads the CPU time when the measured window opens.
    let barrier = Barrier::new(spec.connections + 1);
    let start = OnceLock::new();
    let mut cpu_at_open = Ok(Duration::ZERO);
    let mut client_at_open = Ok(Duration::ZERO);
    let mut machine_at_open = Ok(cpu::MachineCpu::default());
    let results: Vec<Result<ConnResult>> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..spec.connections)
            .map(|c| {
                let (barrier, connect, start) = (&barrier, &connect, &start);
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
                    drive(&mut b, &spec, barrier, start)
                })
            })
            .collect();
        barrier.wait();
        let open = *start.get_or_init(Instant::now) + spec.warmup;
        std::thread::sleep(open.saturating_duration_since(Instant::now()));
        cpu_at_open = cpu::process_cpu(server_pid);
        client_at_open = cpu::process_cpu(std::process::id());
        machine_at_open = cpu::machine_cpu();
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
        cpu_secs: 0.0,
        cpu_us_per_op: 0.0,
        client_cpu_secs: 0.0,
        client_cpu_us_per_op: 0.0,
        machine_idle_fraction: 0.0,
        others_cpu_secs: 0.0,
    };
    let cpu = cpu::process_cpu(server_pid)?.saturating_sub(cpu_at_open?);
    let client = cpu::process_cpu(std::process::id())?.saturating_sub(client_at_open?);
    let (m0, m1) = (machine_at_open?, cpu::machine_cpu()?);
    let tps = cpu::clock_ticks_per_s();
    let machine_busy = cpu::ticks_to_duration(
        (m1.total_ticks - m1.idle_ticks).saturating_sub(m0.total_ticks - m0.idle_ticks),
        tps,
    );
    res.machine_idle_fraction =
        (m1.idle_ticks - m0.idle_ticks) as f64 / (m1.total_ticks - m0.total_ticks).max(1) as f64;
    res.others_cpu_secs = machine_busy.saturating_sub(cpu + client).as_secs_f64();
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
    res.cpu_secs = cpu.as_secs_f64();
    // No operation measured (not a case a run that passes reaches): infinite, printed as null.
    res.cpu_us_per_op = res.cpu_secs * 1e6 / (res.get_ops + res.put_ops) as f64;
    res.client_cpu_secs = client.as_secs_f64();
    res.client_cpu_us_per_op = res.client_cpu_secs * 1e6 / (res.get_ops + res.put_ops) as f64;
    res.get_hit_ratio = if res.get_ops > 0 { hits as f64 / res.get_ops as f64 } else { 0.0 };
    res.get_p50_us = get_hist.value_at_quantile(0.5) as f64;
    res.get_p99_us = get_hist.value_at_quantile(0.99) as f64;
    res.put_p50_us = put_hist.value_at_quantile(0.5) as f64;
    res.put_p99_us = put_hist.value_at_quantile(0.99) as f64;
    Ok(res)
}

#[cfg(test)]
mod tests {
    use super::*;

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
