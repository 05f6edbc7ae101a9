//! Acceptance 5 and 6, end to end on the real daemon binary (no memcached needed): the `bench server`
//! load generator and the `soak` run, each short. These check behaviour (every get of a key space that
//! fits hits, values come back intact, the identity holds, memory stays bounded), not timing.

use dd_bench::server::{run as bench_server, ServerBenchOptions};
use dd_bench::soak::{run as soak, SoakOptions};
use std::path::PathBuf;

fn exe() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_doubledecker"))
}

#[test]
fn bench_server_drives_our_daemon() {
    let opts = ServerBenchOptions {
        exe: exe(),
        against_memcached: false,
        connections: vec![2],
        depth: 3,
        batch: 8,
        keys: 2048,
        warmup_secs: 0.2,
        seconds: 0.5,
        ..Default::default()
    };
    let r = bench_server(&opts, &mut |_| {}).expect("bench server runs");
    assert_eq!(r.rows.len(), 1);
    let row = &r.rows[0];
    let d = &row.doubledecker;
    assert!(d.get_requests > 0 && d.put_requests > 0, "{d:?}");
    assert_eq!(d.get_ops, d.get_requests * 8, "every request is a full batch");
    // The key space was filled before measuring and fits the store: every get hits, every put stores.
    assert_eq!(d.get_hit_ratio, 1.0, "{d:?}");
    assert_eq!(d.puts_not_stored, 0);
    assert!(d.ops_per_s > 0.0 && d.get_p50_us <= d.get_p99_us && d.put_p50_us <= d.put_p99_us);
    // The daemon's CPU time was read over the window: a server that answered thousands of requests
    // spent some (a reader that failed or read nothing would give 0 or a non-finite figure).
    assert!(d.cpu_secs > 0.0 && d.cpu_us_per_op > 0.0 && d.cpu_us_per_op.is_finite(), "{d:?}");
    // So was the load generator's, and the machine's idle share is a fraction.
    assert!(d.client_cpu_secs > 0.0 && d.client_cpu_us_per_op.is_finite(), "{d:?}");
    assert!((0.0..=1.0).contains(&d.machine_idle_fraction) && d.others_cpu_secs >= 0.0, "{d:?}");
    assert!(row.memcached.is_none() && row.ratio_ops.is_none() && row.ratio_cpu.is_none());
    assert!(row.p99_no_worse.is_none());

    // Invalid options are refused before any process starts.
    let e = bench_server(&ServerBenchOptions { batch: 0, ..opts }, &mut |_| {}).unwrap_err();
    assert!(e.to_string().contains("batch"), "{e}");
}

#[test]
fn bench_server_reports_a_missing_memcached() {
    let opts = ServerBenchOptions {
        exe: exe(),
        memcached: PathBuf::from("/nonexistent/memcached"),
        seconds: 0.1,
        ..Default::default()
    };
    let e = bench_server(&opts, &mut |_| {}).unwrap_err();
    assert!(e.to_string().contains("apt-get install memcached"), "{e}");
}

#[test]
fn short_soak_passes_its_checks() {
    let opts = SoakOptions {
        exe: exe(),
        seconds: 3.0,
        vms: 2,
        mem_capacity_bytes: 8 << 20,
        ssd_capacity_bytes: 16 << 20,
        keys_per_vm: 4096,
        sample_ms: 100,
        ..Default::default()
    };
    let mut lines = 0;
    let r = soak(&opts, &mut |_| lines += 1).expect("soak runs");
    assert!(r.load_error.is_none(), "{:?}", r.load_error);
    assert!(r.ops.puts > 0 && r.ops.gets > 0 && r.ops.spec_changes > 0, "{:?}", r.ops);
    assert!(r.ops.admin_calls > 0 && r.ops.pools_created >= 4, "{:?}", r.ops);
    // More pages than the stores hold were put: the stores evicted, and the identity still holds.
    assert!(r.identity.host_evictions_mem > 0, "{:?}", r.identity);
    assert!(r.identity.holds && r.identity.vms_checked == 2, "{:?}", r.identity);
    // Not a sample count (a loaded machine may sample less often than every 100 ms): RSS was seen at
    // least twice, and `bounded` itself requires a sample in the run's second half.
    assert!(r.rss.samples >= 2 && r.rss.bounded, "{:?}", r.rss);
    assert!(r.healthy && r.clean_exit && r.pass);
    assert!(lines <= 1, "progress every 10 s: none (or one) in 3 s");
}
