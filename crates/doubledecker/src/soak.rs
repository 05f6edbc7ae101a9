//! `doubledecker soak`: runs `dd_bench::soak` against this binary's daemon and prints its report; exits
//! non-zero when a check fails.

use anyhow::{bail, Context, Result};
use clap::Args;

#[derive(Args, Debug)]
pub struct SoakArgs {
    /// How long to run the mixed load. Runs of 7200 s or more also check that the RSS is flat over
    /// the second half (least-squares slope at most 1 MiB per hour); shorter runs report the slope only
    /// (the daemon's history of the last hour is still filling in them).
    #[arg(long, default_value_t = 60.0)]
    seconds: f64,
    /// Print one JSON object instead of a summary.
    #[arg(long)]
    json: bool,
    /// VMs, one data-plane client thread each (plus one admin-API thread).
    #[arg(long, default_value_t = 3)]
    vms: u32,
    /// Memory store capacity, MiB (the RSS bound is derived from it).
    #[arg(long, default_value_t = 64)]
    mem_mib: u64,
    /// SSD store capacity, MiB.
    #[arg(long, default_value_t = 128)]
    ssd_mib: u64,
    /// Seed of the random number generator (keys and page contents), for repeatable runs.
    #[arg(long, default_value_t = 0x5eed)]
    seed: u64,
}

pub fn run(a: SoakArgs) -> Result<()> {
    let opts = dd_bench::soak::SoakOptions {
        exe: std::env::current_exe().context("locating the doubledecker executable")?,
        seconds: a.seconds,
        vms: a.vms,
        mem_capacity_bytes: a.mem_mib << 20,
        ssd_capacity_bytes: a.ssd_mib << 20,
        seed: a.seed,
        ..Default::default()
    };
    errln!("soak: {} s, {} VMs, mem {} MiB, ssd {} MiB", a.seconds, a.vms, a.mem_mib, a.ssd_mib);
    let r = dd_bench::soak::run(&opts, &mut |line| errln!("soak: {line}")).context("soak failed")?;
    if a.json {
        outln!("{}", serde_json::to_string(&r)?);
    } else {
        outln!("ran {:.0} s, {:.0} page ops/s, {:?}", r.seconds, r.ops_per_s, r.ops);
        outln!(
            "rss: min {:.1} MiB, max {:.1} MiB, second half {:.1}..{:.1} MiB, bound {:.1} MiB: {}",
            r.rss.min_mib,
            r.rss.max_mib,
            r.rss.second_half_min_mib,
            r.rss.second_half_max_mib,
            r.rss.bound_mib,
            if r.rss.bounded { "ok" } else { "EXCEEDED" }
        );
        let slope = r.rss.second_half_slope_mib_per_h.map_or("n/a".into(), |s| format!("{s:+.2} MiB/h"));
        outln!(
            "rss slope over the second half: {slope} (limit {:.1} MiB/h{}): {}",
            r.rss.slope_limit_mib_per_h,
            if r.rss.slope_checked { "" } else { ", not checked in runs under 30 min" },
            if !r.rss.slope_checked {
                "unchecked"
            } else if r.rss.flat {
                "ok"
            } else {
                "GROWING"
            }
        );
        outln!(
            "stats identity over {} pools, {} VMs and the host: {}",
            r.identity.pools_checked,
            r.identity.vms_checked,
            if r.identity.holds { "holds" } else { "BROKEN" }
        );
        outln!("healthy {}, clean exit {}", r.healthy, r.clean_exit);
    }
    if !r.pass {
        let why = [
            r.load_error.clone(),
            (!r.rss.bounded).then(|| "RSS above its bound".to_string()),
            (!r.rss.flat).then(|| "RSS still growing over the second half".to_string()),
            (!r.identity.holds).then(|| format!("identity broken: {:?}", r.identity.failures)),
            (!r.healthy).then(|| "daemon not healthy".to_string()),
            (!r.clean_exit).then(|| "no clean exit on SIGTERM".to_string()),
        ];
        bail!("soak failed: {}", why.into_iter().flatten().collect::<Vec<_>>().join("; "));
    }
    Ok(())
}
