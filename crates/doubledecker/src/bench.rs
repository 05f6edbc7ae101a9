//! `doubledecker bench ...`: runs a benchmark from `dd-bench` and prints its report.

use anyhow::{Context, Result};
use clap::{Args, Subcommand};
use std::path::PathBuf;

#[derive(Subcommand, Debug)]
pub enum BenchCommand {
    /// In-process put / get-hit / get-miss rates against a memcpy baseline.
    Store(StoreArgs),
    /// SSD store 4 KiB random-read IOPS against fio on the same file system.
    Ssd(SsdArgs),
    /// Put cost with content de-duplication against without.
    Dedup(DedupArgs),
    /// The lab emulator's guest page accesses per second on one core, full stack.
    Lab(LabArgs),
    /// Miss-ratio curves: references per CPU second of exact, SHARDS and miniature simulation on one
    /// oracle-general trace (a synthetic 10-million-reference one unless `--trace` is given).
    Mrc(MrcArgs),
    /// A sharded pool's miss ratio against a single queue's (FIFO and LRU, several sizes and shard
    /// counts) on a seeded synthetic oracle-general trace, replayed through the engine.
    Shards(ShardsArgs),
    /// The daemon over TCP loopback against memcached: same load generator, connections, pipeline
    /// depth, batch size, 4 KiB values, key distribution and get/put mix.
    Server(ServerArgs),
    /// Re-reads of a file set larger than a container's first-level cache through the FUSE mount, with
    /// a network-disk latency on backing reads: with the daemon against without (root, /dev/fuse).
    Fuse(FuseArgs),
    /// VM A's verified load with and without each attack of VM B on the same daemon (slow
    /// connections, oversized pre-authentication frames, unread statistics, pool exhaustion,
    /// re-registration, idle peer connections): ratios, errors, wrong pages and peak RSS.
    Tenants(crate::bench_tenants::TenantsArgs),
}

#[derive(Args, Debug)]
pub struct FuseArgs {
    /// Print one JSON object instead of a table.
    #[arg(long)]
    json: bool,
    /// Total size of the file set, MiB.
    #[arg(long, default_value_t = 64)]
    file_set_mib: u64,
    /// Number of files the file set is split into (equal sizes).
    #[arg(long, default_value_t = 16)]
    files: u32,
    /// The container's first-level page cache, MiB.
    #[arg(long, default_value_t = 16)]
    l1_mib: u64,
    /// Delay of each backing-store read request, microseconds (1000: network block storage).
    #[arg(long, default_value_t = 1000)]
    backing_read_latency_us: u64,
    /// Timed re-reads after the cold pass (the median is reported).
    #[arg(long, default_value_t = 3)]
    passes: u32,
    /// Also measure what the mount's read sampling (for `guest provision`) costs: this many pairs of
    /// runs with the daemon, sampling off then on (0: skip).
    #[arg(long, default_value_t = 0)]
    sampling_rounds: u32,
    /// Where the temporary backing directory is made.
    #[arg(long, default_value = "/var/tmp")]
    dir: PathBuf,
}

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Against {
    /// A real memcached (`apt-get install memcached`), started by the benchmark on 127.0.0.1.
    Memcached,
    /// Only our daemon (no baseline; no ratio).
    None,
}

#[derive(Args, Debug)]
pub struct ServerArgs {
    /// The baseline server.
    #[arg(long, value_enum, default_value_t = Against::Memcached)]
    against: Against,
    /// Print one JSON object instead of a table.
    #[arg(long)]
    json: bool,
    /// Client connections, one thread each, for both servers; a comma-separated list is a sweep, one
    /// row per count, each server started afresh for each (e.g. `1,4,16,64`).
    #[arg(long, value_delimiter = ',', default_value = "4")]
    connections: Vec<usize>,
    /// Spread the connections over this many VMs, each with its own pool (connection c on VM c mod
    /// vms); each connection count must be a multiple of vms x pools.
    #[arg(long, default_value_t = 1)]
    vms: usize,
    /// Spread the connections over this many pools of each VM.
    #[arg(long, default_value_t = 1)]
    pools: usize,
    /// Requests in flight per connection (pipeline depth).
    #[arg(long, default_value_t = 4)]
    depth: usize,
    /// Keys per request (multi-get / put batch).
    #[arg(long, default_value_t = 16)]
    batch: usize,
    /// Measured seconds per server (after the fill and a 1 s warm-up).
    #[arg(long, default_value_t = 5.0)]
    seconds: f64,
    /// Fraction of requests that are gets.
    #[arg(long, default_value_t = 0.9)]
    get_ratio: f64,
    /// Key space (4 KiB each); sized to fit both caches.
    #[arg(long, default_value_t = 65_536)]
    keys: u64,
    /// Zipfian key popularity with this exponent (0: uniform).
    #[arg(long, default_value_t = 0.0)]
    zipf: f64,
    /// The memcached executable.
    #[arg(long, default_value = "memcached")]
    memcached: PathBuf,
    /// Seed of the random number generator (keys and page contents), for repeatable runs.
    #[arg(long, default_value_t = 0x5eed)]
    seed: u64,
    /// The `doubledecker` executable to start as the daemon under test (default: this one). For
    /// before/after comparisons with one load generator: two builds' daemons driven by the same client.
    #[arg(long)]
    daemon_exe: Option<PathBuf>,
    /// Our daemon with TLS on its data plane (`[tls]`, a CA and certificate made for the run); each row
    /// also measures the same daemon without TLS under the same load, and prints TLS / plain.
    #[arg(long)]
    tls: bool,
}

#[derive(Args, Debug)]
pub struct LabArgs {
    /// Print one JSON object instead of a table.
    #[arg(long)]
    json: bool,
    /// The bundled scenario to run (every variant).
    #[arg(long, default_value = "fig3-4-global-share")]
    scenario: String,
    /// Its size and time scale.
    #[arg(long, default_value_t = 0.1)]
    scale: f64,
    /// Minimum wall time; whole runs repeat until it has passed.
    #[arg(long, default_value_t = 3.0)]
    seconds: f64,
}

#[derive(Args, Debug)]
pub struct MrcArgs {
    /// Print one JSON object instead of a table.
    #[arg(long)]
    json: bool,
    /// An existing oracle-general trace to use instead of a synthetic one.
    #[arg(long)]
    trace: Option<PathBuf>,
    /// Keep the synthetic trace at this path (to run other tools on the same file).
    #[arg(long, conflicts_with = "trace")]
    keep_trace: Option<PathBuf>,
    /// Synthetic trace: references.
    #[arg(long, default_value_t = 10_000_000)]
    requests: u64,
    /// Synthetic trace: distinct objects (zipf ranks).
    #[arg(long, default_value_t = 10_000_000)]
    keys: u64,
    /// Synthetic trace: the zipf exponent.
    #[arg(long, default_value_t = 0.9)]
    zipf: f64,
    /// Skip the miniature-simulation runs.
    #[arg(long)]
    no_minisim: bool,
}

#[derive(Args, Debug)]
pub struct ShardsArgs {
    /// Print one JSON object instead of a table.
    #[arg(long)]
    json: bool,
    /// Synthetic trace: references.
    #[arg(long, default_value_t = 2_000_000)]
    requests: u64,
    /// Synthetic trace: distinct objects (zipf ranks).
    #[arg(long, default_value_t = 200_000)]
    keys: u64,
    /// Synthetic trace: the zipf exponent.
    #[arg(long, default_value_t = 0.9)]
    zipf: f64,
    /// Cache sizes as fractions of the objects.
    #[arg(long, value_delimiter = ',', default_value = "0.01,0.05,0.2")]
    sizes: Vec<f64>,
    /// Shard counts compared with one.
    #[arg(long, value_delimiter = ',', default_value = "4,16,64")]
    shards: Vec<u32>,
    /// Pages evicted at once when the pool is full.
    #[arg(long, default_value_t = 16)]
    batch_pages: u64,
    /// Seed of the synthetic trace.
    #[arg(long, default_value_t = 0x5eed)]
    seed: u64,
}

#[derive(Args, Debug)]
pub struct DedupArgs {
    /// Print one JSON object instead of a table.
    #[arg(long)]
    json: bool,
    /// Distinct pages put in each configuration.
    #[arg(long, default_value_t = 32_768)]
    working_set_pages: u64,
    /// Length of each measurement, in seconds.
    #[arg(long, default_value_t = 2.0)]
    seconds: f64,
    /// Pages for the co-operative part (two daemons on loopback: remotify and remotified-get
    /// latency); 0 skips it.
    #[arg(long, default_value_t = 4096)]
    remote_pages: u64,
}

/// `bench dedup --json`: the local figures, plus the co-operative ones under `remote`.
#[derive(serde::Serialize)]
struct DedupOutput<'a> {
    #[serde(flatten)]
    local: &'a dd_bench::dedup::DedupBenchReport,
    remote: Option<&'a dd_bench::remote::RemoteBenchReport>,
}

#[derive(Args, Debug)]
pub struct StoreArgs {
    /// Print one JSON object instead of a table.
    #[arg(long)]
    json: bool,
    /// Concurrent threads, each one container with its own pool (or all on one, `--shared-pool`).
    #[arg(long, default_value_t = 1)]
    threads: usize,
    /// Every thread on one pool (a database's vCPUs on one container's pool); the report adds memcpy's
    /// scaling and the put and get-hit scalings as fractions of it.
    #[arg(long)]
    shared_pool: bool,
    /// Shards of the pools (a power of two up to 256; 0: the engine's default, from the cores; 1: one
    /// lock per pool).
    #[arg(long, default_value_t = 0)]
    pool_shards: u32,
    /// Pages each thread puts and gets per round.
    #[arg(long, default_value_t = 65_536)]
    working_set_pages: u64,
    /// Minimum measuring time per configuration, in seconds.
    #[arg(long, default_value_t = 3.0)]
    seconds: f64,
    /// Seed of the random number generator (keys and page contents), for repeatable runs.
    #[arg(long, default_value_t = 0x5eed)]
    seed: u64,
    /// The `doubledecker` executable to start as the daemon under test (default: this one). For
    /// before/after comparisons with one load generator: two builds' daemons driven by the same client.
    #[arg(long)]
    daemon_exe: Option<PathBuf>,
}

#[derive(Args, Debug)]
pub struct SsdArgs {
    /// Print one JSON object instead of a table.
    #[arg(long)]
    json: bool,
    /// Directory on the file system under test.
    #[arg(long, default_value = ".")]
    dir: PathBuf,
    /// Size of the store's file and of fio's, in MiB.
    #[arg(long, default_value_t = 1024)]
    file_size_mib: u64,
    /// Reads in flight, for the store and for fio.
    #[arg(long, default_value_t = 32)]
    queue_depth: usize,
    /// Length of each measurement, in seconds.
    #[arg(long, default_value_t = 5.0)]
    seconds: f64,
    /// Buffered I/O on both sides instead of O_DIRECT.
    #[arg(long)]
    buffered: bool,
    /// Seed of the random number generator (keys and page contents), for repeatable runs.
    #[arg(long, default_value_t = 0x5eed)]
    seed: u64,
    /// The `doubledecker` executable to start as the daemon under test (default: this one). For
    /// before/after comparisons with one load generator: two builds' daemons driven by the same client.
    #[arg(long)]
    daemon_exe: Option<PathBuf>,
}

pub fn run(cmd: BenchCommand) -> Result<()> {
    match cmd {
        BenchCommand::Store(a) => {
            let opts = dd_bench::store::StoreBenchOptions {
                threads: a.threads,
                working_set_pages: a.working_set_pages,
                duration_secs: a.seconds,
                seed: a.seed,
                shared_pool: a.shared_pool,
                pool_shards: a.pool_shards,
                ..Default::default()
            };
            let r = dd_bench::store::run(&opts, &mut |msg| errln!("bench store: {msg}"))
                .context("bench store failed")?;
            if a.json {
                outln!("{}", serde_json::to_string(&r)?);
            } else {
                outln!("threads                {:>14}", r.threads);
                outln!("memcpy     pages/s     {:>14.0}", r.memcpy_pages_per_s);
                outln!(
                    "put        pages/s     {:>14.0}  ({:.2} of memcpy)",
                    r.put_pages_per_s,
                    r.put_vs_memcpy
                );
                outln!(
                    "get (hit)  pages/s     {:>14.0}  ({:.2} of memcpy)",
                    r.get_hit_pages_per_s,
                    r.get_hit_vs_memcpy
                );
                outln!("get (miss) per s       {:>14.0}", r.get_miss_per_s);
                outln!(
                    "put against memcpy into cold pages  {:.2}  (not a target: the copy a put cannot avoid)",
                    r.put_vs_memcpy_cold
                );
                if let (Some(p), Some(g), Some(m)) = (r.put_scaling, r.get_hit_scaling, r.memcpy_scaling) {
                    outln!("scaling vs 1 thread    put {p:.2}x, get-hit {g:.2}x, memcpy {m:.2}x");
                    outln!("  as fractions of memcpy's: put {:.2}, get-hit {:.2}", p / m, g / m);
                }
                if r.shared_pool {
                    outln!("one shared pool of     {:>14} shards", r.pool_shards);
                }
                for l in r.lock_profile.iter().flatten() {
                    outln!(
                        "lock {:<16} {:>12} acquisitions, {:>10} contended, waits {:.4} of thread time",
                        l.stat.lock,
                        l.stat.acquisitions,
                        l.stat.contended,
                        l.wait_share
                    );
                }
                outln!("stats identity holds   {:>14}", r.identity_holds);
            }
        }
        BenchCommand::Server(a) => server(a)?,
        BenchCommand::Fuse(a) => fuse(a)?,
        BenchCommand::Tenants(a) => crate::bench_tenants::run(a)?,
        BenchCommand::Lab(a) => lab(a)?,
        BenchCommand::Mrc(a) => mrc(a)?,
        BenchCommand::Shards(a) => shards(a)?,
        BenchCommand::Dedup(a) => {
            let opts = dd_bench::dedup::DedupBenchOptions {
                working_set_pages: a.working_set_pages,
                duration_secs: a.seconds,
                ..Default::default()
            };
            errln!("bench dedup: plain, dedup (unique pages), dedup (16 contents), {} s each", a.seconds);
            let r = dd_bench::dedup::run(&opts).context("bench dedup failed")?;
            let remote = if a.remote_pages > 0 {
                errln!(
                    "bench dedup: two daemons on loopback, {} pages remotified and fetched",
                    a.remote_pages
                );
                let o = dd_bench::remote::RemoteBenchOptions {
                    exe: std::env::current_exe().context("locating the doubledecker executable")?,
                    pages: a.remote_pages,
                    seed: 0x5eed,
                };
                Some(dd_bench::remote::run(&o).context("bench dedup (remote part) failed")?)
            } else {
                None
            };
            if a.json {
                outln!("{}", serde_json::to_string(&DedupOutput { local: &r, remote: remote.as_ref() })?);
            } else {
                outln!("plain put          pages/s {:>12.0}", r.plain_put_pages_per_s);
                outln!(
                    "dedup put, unique  pages/s {:>12.0}  (cost {:.2}x plain)",
                    r.dedup_unique_put_pages_per_s,
                    r.dedup_unique_cost_vs_plain
                );
                outln!(
                    "dedup put, 16 contents    {:>12.0}  (cost {:.2}x plain, {} frames)",
                    r.dedup_duplicate_put_pages_per_s,
                    r.dedup_duplicate_cost_vs_plain,
                    r.dedup_duplicate_frames
                );
                outln!(
                    "lz4 put, compressible     {:>12.0}  (cost {:.2}x plain, {} frames)",
                    r.lz4_compressible_put_pages_per_s,
                    r.lz4_compressible_cost_vs_plain,
                    r.lz4_compressible_frames
                );
                outln!(
                    "lz4 put, incompressible   {:>12.0}  (cost {:.2}x plain)",
                    r.lz4_incompressible_put_pages_per_s,
                    r.lz4_incompressible_cost_vs_plain
                );
                if let Some(m) = &remote {
                    outln!("remotified pages          {:>12}", m.remotified);
                    outln!("remotify        p50/p99 us {:>6} / {}", m.remotify_p50_us, m.remotify_p99_us);
                    outln!("local get       p50/p99 us {:>6} / {}", m.local_get_p50_us, m.local_get_p99_us);
                    outln!(
                        "remote get      p50/p99 us {:>6} / {}  (target p50 < 200: {})",
                        m.remote_get_p50_us,
                        m.remote_get_p99_us,
                        m.remote_get_target_met
                    );
                    outln!("peer fetch      p50/p99 us {:>6} / {}", m.peer_fetch_p50_us, m.peer_fetch_p99_us);
                }
            }
        }
        BenchCommand::Ssd(a) => {
            let opts = dd_bench::ssd::SsdBenchOptions {
                dir: a.dir,
                file_size_bytes: a.file_size_mib << 20,
                queue_depth: a.queue_depth,
                duration_secs: a.seconds,
                direct: !a.buffered,
                seed: a.seed,
            };
            errln!(
                "bench ssd: filling {} MiB, then {} s of reads for the store and for fio",
                a.file_size_mib,
                a.seconds
            );
            let r = dd_bench::ssd::run(&opts).context("bench ssd failed")?;
            if a.json {
                outln!("{}", serde_json::to_string(&r)?);
            } else {
                outln!("file system            {} ({})", r.file_system, r.dir);
                outln!("queue depth            {} ({} threads)", r.queue_depth, r.reader_threads);
                outln!("direct I/O             {}", r.direct_io);
                outln!("backend                {}", r.io_backend);
                outln!("doubledecker IOPS      {:>10.0}", r.dd_iops);
                outln!("fio IOPS               {:>10.0}", r.fio_iops);
                outln!("ratio                  {:>10.2}", r.ratio);
            }
        }
    }
    Ok(())
}

fn server(a: ServerArgs) -> Result<()> {
    let opts = dd_bench::server::ServerBenchOptions {
        // The daemon under test is this very binary unless named, so by default the benchmark measures
        // the build that runs it.
        exe: match a.daemon_exe {
            Some(p) => p,
            None => std::env::current_exe().context("locating the doubledecker executable")?,
        },
        against_memcached: a.against == Against::Memcached,
        memcached: a.memcached,
        connections: a.connections,
        vms: a.vms,
        pools: a.pools,
        depth: a.depth,
        batch: a.batch,
        get_ratio: a.get_ratio,
        keys: a.keys,
        zipf_theta: a.zipf,
        seconds: a.seconds,
        seed: a.seed,
        tls: a.tls,
        ..Default::default()
    };
    let r = dd_bench::server::run(&opts, &mut |msg| errln!("bench server: {msg}"))
        .context("bench server failed")?;
    if a.json {
        outln!("{}", serde_json::to_string(&r)?);
        return Ok(());
    }
    let p = &r.parameters;
    outln!(
        "depth {} x batch {}, {} B values, {:.0}% gets, {} keys ({}), {} server threads",
        p.pipeline_depth,
        p.batch_keys,
        p.value_size_bytes,
        p.get_ratio * 100.0,
        p.keys,
        p.key_distribution,
        p.server_threads
    );
    outln!(
        "{:>5} {:<14} {:>12} {:>9} {:>10} {:>10} {:>10} {:>10} {:>10} {:>10} {:>6}",
        "conns",
        "server",
        "ops/s",
        "hit",
        "get p50",
        "get p99",
        "put p50",
        "put p99",
        "CPU us/op",
        "client/op",
        "idle"
    );
    for row in &r.rows {
        for s in std::iter::once(&row.doubledecker).chain(&row.plain).chain(&row.memcached) {
            outln!(
                "{:>5} {:<14} {:>12.0} {:>9.3} {:>8.0}us {:>8.0}us {:>8.0}us {:>8.0}us {:>10.2} {:>10.2} {:>5.0}%",
                row.connections,
                s.server,
                s.ops_per_s,
                s.get_hit_ratio,
                s.get_p50_us,
                s.get_p99_us,
                s.put_p50_us,
                s.put_p99_us,
                s.cpu_us_per_op,
                s.client_cpu_us_per_op,
                s.machine_idle_fraction * 100.0
            );
        }
        if let (Some(x), Some(c), Some(p99)) = (row.ratio_ops, row.ratio_cpu, row.p99_no_worse) {
            outln!(
                "{:>5} ops/s ratio {x:.2} (target >= 1.5), CPU/op ratio {c:.2} (target <= 0.67), p99 no worse: {p99}",
                row.connections
            );
        }
        if let (Some(x), Some(p50)) = (row.tls_ratio_ops, row.tls_ratio_get_p50) {
            outln!("{:>5} TLS / plain: ops/s {x:.2}, get p50 {p50:.2}", row.connections);
        }
    }
    Ok(())
}

fn fuse(a: FuseArgs) -> Result<()> {
    let opts = dd_bench::fuse::FuseBenchOptions {
        exe: std::env::current_exe().context("locating the doubledecker executable")?,
        file_set_bytes: a.file_set_mib << 20,
        files: a.files,
        l1_budget_bytes: a.l1_mib << 20,
        backing_read_latency_us: a.backing_read_latency_us,
        passes: a.passes,
        sampling_rounds: a.sampling_rounds,
        dir: a.dir,
    };
    let r =
        dd_bench::fuse::run(&opts, &mut |msg| errln!("bench fuse: {msg}")).context("bench fuse failed")?;
    if a.json {
        outln!("{}", serde_json::to_string(&r)?);
        return Ok(());
    }
    outln!(
        "{} MiB in {} files, first level {} MiB, backing read latency {} us, cgroup v{}",
        a.file_set_mib,
        a.files,
        a.l1_mib,
        a.backing_read_latency_us,
        r.cgroup_version
    );
    outln!(
        "{:<16} {:>9} {:>10} {:>10} {:>10} {:>10}",
        "run",
        "cold s",
        "re-read s",
        "MiB/s",
        "pool hits",
        "backing rd"
    );
    for x in [&r.without_daemon, &r.with_daemon] {
        outln!(
            "{:<16} {:>9.3} {:>10.3} {:>10.1} {:>10} {:>10}",
            if x.daemon { "with daemon" } else { "without daemon" },
            x.cold_s,
            x.reread_s,
            x.reread_mib_per_s,
            x.pool_hits,
            x.backing_reads
        );
    }
    outln!("speed-up of re-reads {:.2}x", r.speedup);
    if let Some(c) = &r.sampling_cost {
        outln!(
            "sampling: re-read {:.3} s sampled against {:.3} s unsampled (medians of {} runs each): {:.3}x",
            c.sampled_median_s,
            c.unsampled_median_s,
            c.sampled_reread_s.len(),
            c.ratio
        );
        outln!(
            "sampler {:.1} ns per page read, a page copy {:.1} ns: {:.3}x a copy",
            c.sampler_ns_per_page,
            c.memcpy_ns_per_page,
            c.sampler_per_memcpy
        );
    }
    Ok(())
}

fn lab(a: LabArgs) -> Result<()> {
    let opts =
        dd_bench::lab::LabBenchOptions { scenario: a.scenario, scale: a.scale, duration_secs: a.seconds };
    let r = dd_bench::lab::run(&opts, &mut |msg| errln!("bench lab: {msg}")).context("bench lab failed")?;
    if a.json {
        outln!("{}", serde_json::to_string(&r)?);
    } else {
        outln!("scenario               {} at scale {}", r.scenario, r.scale);
        outln!("runs                   {:>14}", r.runs);
        outln!("page accesses          {:>14}", r.accesses);
        outln!("wall / CPU seconds     {:>14.2} / {:.2}", r.wall_s, r.cpu_s);
        outln!("accesses per wall s    {:>14.0}", r.accesses_per_wall_s);
        outln!(
            "accesses per CPU s     {:>14.0}  (one core; target {:.0}: {})",
            r.accesses_per_cpu_s,
            r.target_accesses_per_s,
            if r.meets_target { "met" } else { "missed" }
        );
        outln!("page-cache misses      {:>14}", r.page_cache_misses);
        outln!("engine gets / puts     {:>14} / {}", r.engine_gets, r.engine_puts);
        outln!("verified hits          {:>14}", r.verified_hits);
    }
    Ok(())
}

fn shards(a: ShardsArgs) -> Result<()> {
    let opts = dd_bench::shards::ShardsBenchOptions {
        requests: a.requests,
        keys: a.keys,
        zipf: a.zipf,
        sizes: a.sizes,
        shards: a.shards,
        batch_pages: a.batch_pages,
        seed: a.seed,
    };
    let r = dd_bench::shards::run(&opts, &mut |msg| errln!("bench shards: {msg}"))
        .context("bench shards failed")?;
    if a.json {
        outln!("{}", serde_json::to_string(&r)?);
        return Ok(());
    }
    outln!("order  size    pages  shards  miss ratio  vs 1 shard");
    for row in &r.rows {
        outln!(
            "{:<6} {:<6} {:>7} {:>7} {:>11.4} {:>+11.4}",
            row.order,
            row.size_fraction,
            row.cache_pages,
            row.shards,
            row.miss_ratio,
            row.miss_ratio_diff
        );
    }
    outln!("largest difference {:.4}", r.max_abs_diff);
    Ok(())
}

fn mrc(a: MrcArgs) -> Result<()> {
    let opts = dd_bench::mrc::MrcBenchOptions {
        trace: a.trace,
        keep_trace: a.keep_trace,
        requests: a.requests,
        keys: a.keys,
        zipf: a.zipf,
        minisim: !a.no_minisim,
        ..Default::default()
    };
    let r = dd_bench::mrc::run(&opts, &mut |msg| errln!("bench mrc: {msg}")).context("bench mrc failed")?;
    if a.json {
        outln!("{}", serde_json::to_string(&r)?);
        return Ok(());
    }
    outln!("trace {}: {} requests, {} distinct", r.trace, r.requests, r.unique);
    for m in &r.runs {
        let target = match (m.target_per_cpu_s, m.meets_target) {
            (Some(t), Some(met)) => {
                format!("  (target {:.0} M: {})", t / 1e6, if met { "met" } else { "missed" })
            }
            _ => String::new(),
        };
        let mae = m.mae_vs_exact.map_or(String::new(), |e| format!("  MAE vs exact LRU {e:.4}"));
        outln!(
            "{:<24} {:>8.2} M req per CPU s  ({:.2} CPU s){target}{mae}",
            m.method,
            m.requests_per_cpu_s / 1e6,
            m.cpu_s
        );
    }
    Ok(())
}
