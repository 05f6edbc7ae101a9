//! `doubledecker bench tenants`: VM A's verified load with and without each attack of VM B on the
//! same daemon (`dd_bench::tenants`); exits non-zero when a check fails.

use anyhow::{bail, Context, Result};
use clap::Args;

#[derive(Args, Debug)]
pub struct TenantsArgs {
    /// Print one JSON object instead of a table.
    #[arg(long)]
    json: bool,
    /// Length of each window (A alone, then A under one attack), seconds.
    #[arg(long, default_value_t = 5.0)]
    seconds: f64,
    /// A's load threads (one connection each).
    #[arg(long, default_value_t = 2)]
    threads: usize,
    /// Pages per request.
    #[arg(long, default_value_t = 16)]
    batch: usize,
    /// Requests per A connection before it reconnects.
    #[arg(long, default_value_t = 200)]
    reconnect_every: u64,
    /// Pairs of windows (A alone, A under attack) per attack; the ratios reported and checked are
    /// the medians over the pairs.
    #[arg(long, default_value_t = 3)]
    repeats: usize,
    /// Attacks to run (comma-separated; default all): slow_connections, oversized_preauth,
    /// unread_stats, pool_exhaustion, reregistration, peer_idle, peer_sessions, peer_flood,
    /// peer_inject.
    #[arg(long, value_delimiter = ',')]
    attacks: Vec<dd_bench::tenants::Attack>,
    /// Seed of A's key choice, for repeatable runs.
    #[arg(long, default_value_t = 0x7e4a)]
    seed: u64,
}

pub fn run(a: TenantsArgs) -> Result<()> {
    let mut opts = dd_bench::tenants::TenantsBenchOptions {
        // The daemon under test is this very binary.
        exe: std::env::current_exe().context("locating the doubledecker executable")?,
        seconds: a.seconds,
        threads: a.threads,
        batch: a.batch,
        reconnect_every: a.reconnect_every,
        repeats: a.repeats,
        seed: a.seed,
        ..Default::default()
    };
    if !a.attacks.is_empty() {
        opts.attacks = a.attacks;
    }
    let r = dd_bench::tenants::run(&opts, &mut |msg| errln!("bench tenants: {msg}"))
        .context("bench tenants failed")?;
    if a.json {
        outln!("{}", serde_json::to_string(&r)?);
    } else {
        outln!(
            "{:<20} {:>10} {:>10} {:>6} {:>9} {:>9} {:>6} {:>8}",
            "attack",
            "ops/s",
            "attacked",
            "ratio",
            "p99 us",
            "attacked",
            "ratio",
            "rss MiB"
        );
        for x in &r.attacks {
            outln!(
                "{:<20} {:>10.0} {:>10.0} {:>6.2} {:>9} {:>9} {:>6.2} {:>8.1}",
                x.attack.name(),
                x.without.ops_per_s,
                x.with.ops_per_s,
                x.ops_ratio,
                x.without.p99_us,
                x.with.p99_us,
                x.p99_ratio,
                x.peak_rss_mib
            );
        }
        for x in r.attacks.iter().filter(|x| x.attack.on_peers()) {
            outln!(
                "{:<20} victim peer: {} of {} publications delivered; injected records refused {} of {}",
                x.attack.name(),
                x.publishes_delivered,
                x.publishes_attempted,
                x.injected_refused,
                x.injected
            );
        }
        outln!("A's errors {}, wrong pages {}, leaks {}", r.errors, r.wrong_pages, r.leaks);
        outln!(
            "daemon RSS: baseline {:.1} MiB, peak {:.1} MiB, bound {:.1} MiB ({})",
            r.baseline_rss_mib,
            r.peak_rss_mib,
            r.rss_bound_mib,
            r.rss_bound
        );
    }
    if !r.pass {
        bail!(
            "bench tenants: a check failed (ratios >= 0.5: ops {:.2}, p99 {:.2}; errors {}; wrong pages {}; \
             leaks {}; peak RSS {:.1} <= {:.1} MiB; peer attacks: publications delivered >= 95%, every \
             injected record refused)",
            r.min_ops_ratio,
            r.min_p99_ratio,
            r.errors,
            r.wrong_pages,
            r.leaks,
            r.peak_rss_mib,
            r.rss_bound_mib
        );
    }
    Ok(())
}
