//! Issue 35, acceptance 2: 10,000 pools and 500 VMs created and destroyed through the data plane and
//! the admin API leave `/metrics` with the series it had and every table keyed by a pool, a VM or a
//! connection (`dd_table_entries`, `ServerState::table_sizes`) at its size before, except the few
//! that are bounded instead, each checked against its documented bound.
//!
//! The churn is the soak's, compressed: pools are created in waves of 100 (so the pool table grows to
//! a burst and must shrink back), each gets pages (so its index, slab and queues are allocated) and
//! some of them are read back, destroyed by the data plane or the admin API; each VM is registered,
//! connects, authenticates, gets a pool with pages, a provisioner report and a VM-scope pool, and
//! is removed with its connection still open.

mod common;

use common::{vm, Daemon, HOST_TOKEN};
use dd_engine::{Key, PoolOptions, Spec};
use std::collections::BTreeMap;

/// `dd_table_entries` by table.
fn tables(d: &Daemon) -> BTreeMap<String, u64> {
    d.metrics()
        .lines()
        .filter_map(|l| l.strip_prefix("dd_table_entries{table=\""))
        .map(|l| {
            let (name, rest) = l.split_once('"').expect("a quoted table name");
            (name.to_string(), rest.trim_start_matches('}').trim().parse().expect("a count"))
        })
        .collect()
}

/// Every series of `/metrics` (name and labels, without the value), sorted.
fn series(d: &Daemon) -> Vec<String> {
    let mut v: Vec<String> = d
        .metrics()
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .map(|l| l.rsplit_once(' ').map_or(l, |(s, _)| s).to_string())
        .collect();
    v.sort();
    v
}

/// The daemon's thread count (what bounds destroyed pools still held by a runtime thread's last-pool
/// slot).
fn threads(pid: u32) -> u64 {
    std::fs::read_dir(format!("/proc/{pid}/task")).map_or(0, |d| d.count() as u64)
}

const POOLS: usize = 10_000;
const WAVE: usize = 100;
const VMS: u32 = 500;

/// One VM's life: registered, used on both planes, removed with a session open.
fn vm_round(d: &Daemon, id: u32, page: &[u8]) {
    let v = vm(id);
    let body = format!(
        r#"{{"id":{id},"data_token":"{}","admin_token":"{}","dedup_group":"churn-{}"}}"#,
        v.data_token,
        v.admin_token,
        id % 3
    );
    let (s, b) = d.http("POST", "/v1/vms", Some(HOST_TOKEN), Some(&body));
    assert_eq!(s, 201, "add vm {id}: {b}");
    let mut c = d.tcp_client(&v);
    let p = c.create_cgroup(PoolOptions::ephemeral(Spec::Mem { weight: 10 })).expect("create");
    c.put_batch(p, &[(Key::new(1, 0), page), (Key::new(1, 1), page)]).expect("put");
    let (s, b) =
        d.http("POST", "/v1/vm/pools", Some(&v.admin_token), Some(r#"{"spec":{"type":"mem","weight":5}}"#));
    assert_eq!(s, 201, "vm pool {id}: {b}");
    let report = serde_json::json!({
        "round": 1, "applied": true, "feasible": true, "infeasible": [], "missed": [], "source": "model",
        "kept_current": false, "memory_bytes": 16777216, "mem_cache_bytes": 16777216, "ssd_cache_bytes": 0,
        "containers": []
    });
    let (s, b) = d.http("PUT", "/v1/vm/provisioner", Some(&v.admin_token), Some(&report.to_string()));
    assert_eq!(s, 200, "provisioner report {id}: {b}");
    let (s, b) = d.http("DELETE", &format!("/v1/vms/{id}"), Some(HOST_TOKEN), None);
    assert!(s / 100 == 2, "remove vm {id}: {s} {b}");
    // The removal cut the session off; closing it on this side too frees nothing more.
    drop(c);
}

/// `rounds` waves of pools on `vm1`'s connection, every `admin_every`-th destroyed through the admin
/// API.
fn pool_waves(d: &Daemon, rounds: usize, page: &[u8]) {
    let v = vm(1);
    let mut c = d.tcp_client(&v);
    for w in 0..rounds {
        let pools: Vec<_> = (0..WAVE)
            .map(|i| {
                let spec = if i % 2 == 0 { Spec::Mem { weight: 10 } } else { Spec::Ssd { weight: 10 } };
                c.create_cgroup(PoolOptions::ephemeral(spec)).expect("create pool")
            })
            .collect();
        for (i, &p) in pools.iter().enumerate() {
            let n = 1 + (i + w) % 8;
            let items: Vec<(Key, &[u8])> = (0..n).map(|k| (Key::new(k as u64 % 3, k as u64), page)).collect();
            c.put_batch(p, &items).expect("put");
            if i % 4 == 0 {
                let mut out = vec![0u8; 4096];
                c.get(p, Key::new(0, 0), &mut out).expect("get");
            }
        }
        for (i, &p) in pools.iter().enumerate() {
            if i % 10 == 0 {
                let (s, b) = d.http("DELETE", &format!("/v1/vm/pools/{}", p.0), Some(&v.admin_token), None);
                assert!(s / 100 == 2, "admin destroy: {s} {b}");
            } else {
                c.destroy_cgroup(p).expect("destroy pool");
            }
        }
    }
}

#[test]
fn regression_tables_keyed_by_pools_vms_and_connections_come_back_to_their_size_after_churn() {
    let v1 = vm(1);
    // History every 100 ms: its series of destroyed pools go at the next sample (issue 31's ring).
    let d = Daemon::start(&[&v1], "[history]\ninterval_ms = 100\n");
    let page = vec![0x5au8; 4096];
    // One round of everything first, so that series that appear with a first use (requests by op and
    // status) and the first retired tokens exist in the baseline.
    pool_waves(&d, 1, &page);
    for id in 1000..1003 {
        vm_round(&d, id, &page);
    }
    // Two samples later the history holds only what exists.
    std::thread::sleep(std::time::Duration::from_millis(300));
    let (tables0, series0) = (tables(&d), series(&d));
    for t in [
        "engine_vms",
        "engine_pools",
        "engine_pool_table_entries",
        "engine_pool_objects_alive",
        "registry_vms",
        "admission_vms_in_session",
        "persisted_records",
        "dedup_group_names",
        "provisioner_reports",
        "dedup_groups",
        "history_series",
        "history_samples",
    ] {
        assert!(tables0.contains_key(t), "no table {t} in /metrics: {tables0:?}");
    }

    let t = std::time::Instant::now();
    pool_waves(&d, POOLS / WAVE, &page);
    for id in 0..VMS {
        vm_round(&d, 2000 + id, &page);
    }
    eprintln!("churn: {POOLS} pools and {VMS} VMs in {:.1} s", t.elapsed().as_secs_f64());

    // Sessions cut off by a removal close on the daemon's side a moment later, and the history drops
    // the series of what is gone at its next sample.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let mut tables1 = tables(&d);
    let settled = |t: &BTreeMap<String, u64>| {
        ["admission_vms_in_session", "history_series"].iter().all(|k| t.get(*k) == tables0.get(*k))
    };
    while !settled(&tables1) && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(50));
        tables1 = tables(&d);
    }
    eprintln!("tables before: {tables0:?}\ntables after:  {tables1:?}");
    assert_eq!(series(&d), series0, "/metrics has other series after the churn");
    // Bounded rather than back: each against its documented bound.
    // The history's samples grow with time (a ring per series), so they are bounded by the series.
    let bounded = [
        "registry_retired_tokens",
        "engine_pool_table_capacity",
        "engine_pool_objects_alive",
        "history_samples",
    ];
    for (name, before) in &tables0 {
        let after = tables1[name];
        if !bounded.contains(&name.as_str()) {
            assert_eq!(after, *before, "table {name}: {before} entries before the churn, {after} after");
        }
    }
    assert!(tables1["registry_retired_tokens"] <= dd_server::auth::RETIRED_KEPT as u64);
    let pools = tables1["engine_pools"];
    assert!(tables1["engine_pool_table_capacity"] <= 4 * pools + 16 * 16, "{tables1:?}");
    assert!(tables1["engine_pool_objects_alive"] <= pools + threads(d.pid()), "{tables1:?}");
    let per_series = dd_server::history::HistoryConfig::default().samples as u64;
    assert!(tables1["history_samples"] <= tables1["history_series"] * per_series, "{tables1:?}");
}

/// The runtime's blocking threads (engine calls that may wait on the SSD, admin calls) are bounded by
/// `limits.max_blocking_threads`: the runtime keeps an idle thread for as long as work wakes it, so
/// unbounded, every burst of concurrency added threads for good, and with them per-thread buffers
/// (issue 35: 51 to 101 threads, 17 to 34 MB of heap, in 11 minutes of `soak`).
#[test]
fn regression_blocking_threads_stay_within_their_limit_under_concurrent_sessions() {
    const LIMIT: u64 = 4;
    let vms: Vec<_> = (1..=4).map(vm).collect();
    let refs: Vec<_> = vms.iter().collect();
    let d = Daemon::start(&refs, &format!("[limits]\nmax_blocking_threads = {LIMIT}\n"));
    let pid = d.pid();
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get()) as u64;
    // The main thread, the main runtime's workers, the session runtimes' workers (one per core), the
    // blocking threads (the limit, plus at most one per session runtime from splitting it between
    // them), and the daemon's own threads (handshake, maintenance, SSD writer: 3 today) with room for
    // 3 more. Unbounded, this load ran 42.
    let bound = 1 + cores + cores + LIMIT + cores + 6;
    let stop = std::sync::atomic::AtomicBool::new(false);
    let most = std::thread::scope(|s| {
        let mut hs = Vec::new();
        for i in 0..24u64 {
            let (d, v, stop) = (&d, &vms[i as usize % vms.len()], &stop);
            hs.push(s.spawn(move || {
                let mut c = d.tcp_client(v);
                let p = c.create_cgroup(PoolOptions::ephemeral(Spec::Ssd { weight: 10 })).expect("create");
                let page = vec![i as u8; 4096];
                let mut out = vec![0u8; 16 * 4096];
                for r in 0..150u64 {
                    let items: Vec<(Key, &[u8])> = (0..16).map(|k| (Key::new(r % 7, k), &page[..])).collect();
                    c.put_batch(p, &items).expect("put");
                    let keys: Vec<Key> = (0..16).map(|k| Key::new((r + 3) % 7, k)).collect();
                    c.get_batch(p, &keys, &mut out).expect("get");
                    if stop.load(std::sync::atomic::Ordering::Relaxed) {
                        break;
                    }
                }
            }));
        }
        for v in &vms {
            let (d, stop) = (&d, &stop);
            hs.push(s.spawn(move || {
                for _ in 0..200 {
                    let (st, b) = d.http("GET", "/v1/vm/stats", Some(&v.admin_token), None);
                    assert_eq!(st, 200, "{b}");
                    if stop.load(std::sync::atomic::Ordering::Relaxed) {
                        break;
                    }
                }
            }));
        }
        let mut most = 0;
        while hs.iter().any(|h| !h.is_finished()) {
            most = most.max(threads(pid));
            if most > bound {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        most
    });
    eprintln!("daemon threads: at most {most} (bound {bound})");
    assert!(most <= bound, "the daemon ran {most} threads, more than {bound} (blocking limit {LIMIT})");
}
