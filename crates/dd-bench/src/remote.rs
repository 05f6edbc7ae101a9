//! `bench dedup`'s co-operative part: remotify and remotified-get latency with two real daemons on
//! loopback (SPEC section 11: remote get p50 < 200 µs on one machine).
//!
//! Daemon B (the holder) stores `pages` random pages and publishes its summary; daemon C (the
//! remotifier, 256 pages of memory) stores the same pages, so all but its last ~240 are evicted and
//! remotified to B. Then, one client thread on C:
//! * `local_get`: exclusive gets of the pages C still holds (the baseline: a data-plane round trip);
//! * `remote_get`: exclusive gets of the remotified pages, every one verified byte for byte (a
//!   data-plane round trip plus C's fetch from B).
//!
//! `remotify` latency is C's own histogram (offer taken to pin installed: one remote compare round trip
//! with a 4 KiB page plus the install), read from `GET /v1/host/coop`. Client-side latencies are
//! measured per call with `Instant` and kept in an HDR histogram. The thesis measured the same
//! operations in CPU cycles inside its hypervisor (thesis 004, Table 6.5); BENCHMARKS.md puts them side
//! by side.

use crate::daemon::{free_port, BenchVm, Daemon, DaemonError, DaemonOptions, HOST_TOKEN};
use dd_coop::identity::NodeKey;
use dd_engine::{Key, PoolOptions, Spec};
use rand::{RngCore, SeedableRng};
use serde::Serialize;
use std::path::PathBuf;
use std::time::{Duration, Instant};

#[derive(Debug, Clone)]
pub struct RemoteBenchOptions {
    /// The `doubledecker` executable (the CLI passes its own).
    pub exe: PathBuf,
    /// Pages stored on both daemons; about `pages - 240` are remotified.
    pub pages: u64,
    pub seed: u64,
}

#[derive(Debug, Clone, Serialize)]
pub struct RemoteBenchReport {
    pub pages: u64,
    pub remotified: u64,
    pub remotify_p50_us: u64,
    pub remotify_p99_us: u64,
    pub local_get_p50_us: u64,
    pub local_get_p99_us: u64,
    pub remote_get_p50_us: u64,
    pub remote_get_p99_us: u64,
    /// C's own view of the peer fetch inside those gets.
    pub peer_fetch_p50_us: u64,
    pub peer_fetch_p99_us: u64,
    /// SPEC section 11: remote get p50 below 200 µs.
    pub remote_get_target_met: bool,
}

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RemoteBenchError {
    #[error(transparent)]
    Daemon(#[from] DaemonError),
    #[error(transparent)]
    Client(#[from] dd_client::ClientError),
    #[error("{0}")]
    Check(String),
}

const PS: usize = 4096;
/// C's memory in pages.
const C_PAGES: u64 = 256;

/// A node of the benchmark: name, peer-listener port and its key (written to `key_file`).
pub(crate) struct BenchNode {
    pub name: &'static str,
    pub port: u16,
    pub key: NodeKey,
    pub key_file: std::path::PathBuf,
}

impl BenchNode {
    /// A node with a fresh key in `dir`.
    pub fn new(name: &'static str, port: u16, dir: &std::path::Path) -> std::io::Result<BenchNode> {
        let mut seed = [0u8; 32];
        rand::RngCore::fill_bytes(&mut rand::rngs::OsRng, &mut seed);
        let key = NodeKey::from_seed(seed);
        let key_file = dir.join(format!("{name}.key"));
        std::fs::write(&key_file, key.secret_text())?;
        Ok(BenchNode { name, port, key, key_file })
    }
}

fn start(
    o: &RemoteBenchOptions,
    me: &BenchNode,
    peer: &BenchNode,
    mem_pages: u64,
    vm: &BenchVm,
) -> Result<Daemon, DaemonError> {
    let extra = format!(
        "dedup = true\n[engine]\neviction_batch_bytes = 65536\n[coop]\nenabled = true\n\
         listen = \"127.0.0.1:{}\"\nnode_name = {:?}\ndedup_group = \"peers\"\nkey_file = {:?}\n\
         peers = [{{ name = {:?}, addr = \"127.0.0.1:{}\", public_key = {:?} }}]\npublish_interval_ms = 3600000\n\
         remotify_queue_pages = {}\n[coop.bloom]\nm_bits = 1048576\nk_hashes = 7\n",
        me.port,
        me.name,
        me.key_file.display().to_string(),
        peer.name,
        peer.port,
        peer.key.public_text(),
        o.pages + 1024
    );
    Daemon::start(&DaemonOptions {
        exe: o.exe.clone(),
        mem_capacity_bytes: mem_pages * PS as u64,
        ssd_capacity_bytes: 0,
        vms: vec![vm.clone()],
        // Appended right after `[engine.mem]`'s capacity, so `dedup` lands in that table.
        extra_toml: extra,
    })
}

fn hist() -> hdrhistogram::Histogram<u64> {
    hdrhistogram::Histogram::new_with_bounds(1, 60_000_000, 3).expect("valid bounds")
}

fn coop(d: &Daemon) -> Result<serde_json::Value, DaemonError> {
    d.admin("GET", "/v1/host/coop", HOST_TOKEN, None)
}

fn field(v: &serde_json::Value, path: &[&str]) -> u64 {
    path.iter().fold(v, |v, k| &v[k]).as_u64().unwrap_or(0)
}

pub fn run(o: &RemoteBenchOptions) -> Result<RemoteBenchReport, RemoteBenchError> {
    if o.pages <= C_PAGES {
        return Err(RemoteBenchError::Check(format!("pages must exceed {C_PAGES}")));
    }
    // The VM's pages are shared with peers: it is in the co-operative group.
    let vm = BenchVm { dedup_group: "peers".into(), ..BenchVm::new(1) };
    let (pb, pc) = (free_port().map_err(DaemonError::from)?, free_port().map_err(DaemonError::from)?);
    let keys = tempfile::tempdir().map_err(DaemonError::from)?;
    let (nb, nc) = (
        BenchNode::new("b", pb, keys.path()).map_err(DaemonError::from)?,
        BenchNode::new("c", pc, keys.path()).map_err(DaemonError::from)?,
    );
    let b = start(o, &nb, &nc, o.pages + 1024, &vm)?;
    let c = start(o, &nc, &nb, C_PAGES, &vm)?;
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(o.seed);
    let pages: Vec<Vec<u8>> = (0..o.pages)
        .map(|_| {
            let mut p = vec![0u8; PS];
            rng.fill_bytes(&mut p);
            p
        })
        .collect();
    let mut cb = dd_client::Client::connect_tcp(b.tcp, vm.id, &vm.data_token)?;
    let pool_b = cb.create_cgroup(PoolOptions::ephemeral(Spec::Mem { weight: 100 }))?;
    for (i, p) in pages.iter().enumerate() {
        cb.put(pool_b, Key::new(1, i as u64), p)?;
    }
    let r: serde_json::Value = b.admin("POST", "/v1/host/coop/publish", HOST_TOKEN, None)?;
    if field(&r, &["peers_reached"]) != 1 {
        return Err(RemoteBenchError::Check(format!("b could not publish to c: {r}")));
    }
    let mut cc = dd_client::Client::connect_tcp(c.tcp, vm.id, &vm.data_token)?;
    let pool_c = cc.create_cgroup(PoolOptions::ephemeral(Spec::Mem { weight: 100 }))?;
    for (i, p) in pages.iter().enumerate() {
        cc.put(pool_c, Key::new(1, i as u64), p)?;
    }
    // Wait for the remotifier to finish (a bound on waiting, not a measurement).
    let deadline = Instant::now() + Duration::from_secs(120);
    let report = loop {
        let r = coop(&c)?;
        let done = ["remotified", "no_candidate", "compare_mismatches", "remotify_errors", "stale_installs"]
            .iter()
            .map(|k| field(&r, &[k]))
            .sum::<u64>();
        if field(&r, &["queued"]) == 0 && done == field(&r, &["offered"]) {
            break r;
        }
        if Instant::now() > deadline {
            return Err(RemoteBenchError::Check(format!("remotifier did not settle: {r}")));
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    let remotified = field(&report, &["remotified"]);
    let stats = cc.pool_stats(pool_c)?;
    let local_from = o.pages - stats.counters.mem.used;
    let (mut local, mut remote) = (hist(), hist());
    let mut out = vec![0u8; PS];
    for i in 0..o.pages {
        let t = Instant::now();
        let hit = cc.get(pool_c, Key::new(1, i), &mut out)?;
        let us = (t.elapsed().as_micros() as u64).max(1);
        if !hit {
            continue; // evicted but not remotified (none expected): counted below
        }
        if out != pages[i as usize] {
            return Err(RemoteBenchError::Check(format!("page {i} came back with other bytes")));
        }
        let h = if i >= local_from { &mut local } else { &mut remote };
        let _ = h.record(us);
    }
    if remote.len() != remotified {
        return Err(RemoteBenchError::Check(format!(
            "{} remote hits for {remotified} remotified",
            remote.len()
        )));
    }
    let after = coop(&c)?;
    let rep = RemoteBenchReport {
        pages: o.pages,
        remotified,
        remotify_p50_us: field(&report, &["remotify_latency", "p50_us"]),
        remotify_p99_us: field(&report, &["remotify_latency", "p99_us"]),
        local_get_p50_us: local.value_at_quantile(0.5),
        local_get_p99_us: local.value_at_quantile(0.99),
        remote_get_p50_us: remote.value_at_quantile(0.5),
        remote_get_p99_us: remote.value_at_quantile(0.99),
        peer_fetch_p50_us: field(&after, &["remote_get_latency", "p50_us"]),
        peer_fetch_p99_us: field(&after, &["remote_get_latency", "p99_us"]),
        remote_get_target_met: remote.value_at_quantile(0.5) < 200,
    };
    Ok(rep)
}
