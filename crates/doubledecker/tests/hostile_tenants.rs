//! Hostile tenants (issue 12, SPEC section 6 "Hostile tenants"): regression tests against a real daemon
//! process, one per defect an independent client found, each named after its defect. Every test plays
//! the attacker (VM B or an unauthenticated client) and checks that VM A, the other tenant, is neither
//! reached nor starved.

mod common;

use common::raw::{self, connect, header, read_frame};
use common::{page, vm, Daemon, HOST_TOKEN};
use dd_client::Client;
use dd_engine::{Key, PoolId, PoolOptions, Spec};
use dd_proto::{Op, Status};
use std::io::Write;
use std::time::{Duration, Instant};

const HOST: Option<&str> = Some(HOST_TOKEN);

fn register(d: &Daemon, id: u32, data: &str, admin: &str) {
    let body = format!(r#"{{"id":{id},"data_token":"{data}","admin_token":"{admin}"}}"#);
    let (s, j) = d.http("POST", "/v1/vms", HOST, Some(&body));
    assert_eq!(s, 201, "{j}");
}

/// Defect 1: a connection outlived its VM. After `DELETE /v1/vms/50` and a new registration of VM 50
/// with other tokens, the old session could list, read and flush the new tenant's pages, and the old
/// admin token could still act.
#[test]
fn regression_connection_outlives_its_vm() {
    let d = Daemon::start(&[], "");
    register(&d, 50, "data-token-first-0050", "admin-token-first-0050");
    let mut old = Client::connect_tcp(d.tcp, 50, "data-token-first-0050").unwrap();
    let old_pool = old.create_cgroup(PoolOptions::ephemeral(Spec::Mem { weight: 100 })).unwrap();
    // A second old session that stays idle the whole time (cut off without sending anything).
    let mut idle = connect(d.tcp);
    assert_eq!(raw::hello(&mut idle, 50, "data-token-first-0050"), Some(Status::OK));

    assert_eq!(d.http("DELETE", "/v1/vms/50", HOST, None).0, 204);
    register(&d, 50, "data-token-second-0050", "admin-token-second-0050");
    let mut new = Client::connect_tcp(d.tcp, 50, "data-token-second-0050").unwrap();
    let pool = new.create_cgroup(PoolOptions::ephemeral(Spec::Mem { weight: 100 })).unwrap();
    let mut pools = vec![pool];
    // Whatever numbering pools get, the old session tries every id it might guess.
    for _ in 0..3 {
        pools.push(new.create_cgroup(PoolOptions::persistent(Spec::Mem { weight: 100 })).unwrap());
    }
    for p in &pools {
        new.put(*p, Key::new(7, 1), &page(50, 7, 1)).unwrap();
    }

    // The old session can do nothing at all: not list, not read, not flush.
    assert!(old.list_pools().is_err(), "the old session listed the new tenant's pools");
    let mut buf = vec![0u8; 4096];
    for p in pools.iter().chain([&old_pool]) {
        assert!(!matches!(old.get(*p, Key::new(7, 1), &mut buf), Ok(true)), "old session read pool {p}");
        assert!(old.flush_object(*p, 7).is_err(), "old session flushed pool {p}");
    }
    // The idle old session was closed by the daemon without sending anything.
    assert!(raw::closed(&mut idle), "an idle session of the removed registration stayed open");
    // The old admin token is dead; the new one works.
    let (s, _) = d.http("GET", "/v1/vm/pools", Some("admin-token-first-0050"), None);
    assert_eq!(s, 401);
    let (s, j) = d.http("GET", "/v1/vm/pools", Some("admin-token-second-0050"), None);
    assert_eq!((s, j.as_array().map(|a| a.len())), (200, Some(pools.len())));
    // The new tenant's pages are intact.
    for p in &pools {
        assert!(new.get(*p, Key::new(7, 1), &mut buf).unwrap());
        assert_eq!(buf, page(50, 7, 1));
    }
}

/// Defect 3: before HELLO the daemon buffered up to `max_payload_bytes` (2 MiB) for a frame that can
/// only be a HELLO. A header announcing more than a HELLO can hold is refused from the header alone,
/// and connections that send megabytes before authenticating cost the daemon next to nothing.
#[test]
fn regression_unauthenticated_memory() {
    let a = vm(1);
    let d = Daemon::start(&[&a], "");
    let mut s = connect(d.tcp);
    s.write_all(&header(Op::Hello as u8, 7, 2 * 1024 * 1024)).unwrap();
    let (h, _) = read_frame(&mut s).expect("an answer to the header alone, before any payload");
    assert_eq!((h.status(), h.request_id), (Status::FRAME_TOO_LARGE, 7));
    assert!(raw::closed(&mut s));

    let before = raw::rss_kib(d.pid());
    let big = vec![0x5au8; 2 * 1024 * 1024 - 1];
    let conns: Vec<_> = (0..48)
        .map(|i| {
            let mut s = connect(d.tcp);
            // The daemon may close the connection after the header: later writes then fail.
            let _ = s.write_all(&header(Op::Hello as u8, i, 2 * 1024 * 1024));
            let _ = s.write_all(&big);
            s
        })
        .collect();
    let grown_kib = raw::rss_kib(d.pid()).saturating_sub(before);
    assert!(
        grown_kib < 16 * 1024,
        "48 unauthenticated connections that sent 2 MiB each grew the daemon by {grown_kib} KiB"
    );
    drop(conns);
    // Everyone else is served.
    let mut c = d.tcp_client(&a);
    c.ping().unwrap();
}

/// Defect 4: connections that sent one byte held every slot (no handshake deadline), authenticated
/// connections of one VM could take every slot (no per-VM cap) and idle sessions were never closed.
#[test]
fn regression_no_handshake_or_idle_deadline_no_per_vm_cap() {
    let (a, b) = (vm(1), vm(2));
    let d = Daemon::start(
        &[&a, &b],
        "[limits]\nmax_connections = 16\nmax_connections_per_vm = 4\nhandshake_timeout_ms = 1000\n\
         idle_timeout_ms = 2000\n",
    );
    // 16 unauthenticated connections that each sent one byte.
    let mut slow: Vec<_> = (0..16)
        .map(|_| {
            let mut s = connect(d.tcp);
            s.write_all(b"D").unwrap();
            s
        })
        .collect();
    // A connects anyway (a new handshake takes the slot of the oldest unauthenticated connection).
    let mut ca =
        Client::connect_tcp(d.tcp, a.id, &a.data_token).expect("A connects past 16 slow connections");
    ca.ping().unwrap();
    // Every slow connection is closed by the handshake deadline (or was displaced by A).
    for s in &mut slow {
        assert!(raw::closed(s), "a connection that never said HELLO stayed open");
    }
    // B's authenticated connections are capped; A is not affected.
    let bs: Vec<Client> = (0..4).map(|_| d.tcp_client(&b)).collect();
    let e = Client::connect_tcp(d.tcp, b.id, &b.data_token).unwrap_err();
    assert_eq!(e.status(), Some(Status::BUSY), "{e}");
    let mut ca2 = d.tcp_client(&a);
    ca2.ping().unwrap();
    drop(bs);
    // An authenticated connection that stays idle is closed after the idle timeout. B's four sessions
    // give their slots back only once the daemon has seen them close, which under load can come after
    // our HELLO: `busy` until then is the per-VM cap still at work (it once failed the test here), so
    // the HELLO is retried on `busy` only, within a generous deadline.
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut s = loop {
        let mut s = connect(d.tcp);
        match raw::hello(&mut s, b.id, &b.data_token) {
            Some(Status::OK) => break s,
            Some(Status::BUSY) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(50)),
            other => panic!("B's HELLO after its sessions closed: {other:?}"),
        }
    };
    // `closed` waits for the daemon to close it up to the connection's read time-out (20 s, ten times
    // the idle time-out): a bound on waiting, not a timing assertion.
    assert!(raw::closed(&mut s), "an idle session was never closed");
}

/// Defect 5: with many pools, VM_STATS answered far more than `max_payload` (40 MB against 2 MiB).
/// Every response, VM_STATS and LIST_POOLS included, fits the frame limit the server announced.
#[test]
fn regression_responses_beyond_the_documented_bounds() {
    let a = vm(1);
    // A small frame limit (a batch of 16 pages) so that the statistics of 400 pools exceed it.
    let d = Daemon::start(&[&a], "[limits]\nmax_payload_bytes = 65800\n[engine]\nmax_batch_pages = 16\n");
    let mut c = d.tcp_client(&a);
    let max_payload = c.info().max_payload;
    assert_eq!(max_payload, 65800);
    for _ in 0..400 {
        c.create_cgroup(PoolOptions::ephemeral(Spec::Mem { weight: 100 })).unwrap();
    }
    let mut s = connect(d.tcp);
    assert_eq!(raw::hello(&mut s, a.id, &a.data_token), Some(Status::OK));
    for (i, op) in [Op::VmStats, Op::ListPools].into_iter().enumerate() {
        s.write_all(&header(op as u8, 10 + i as u64, 0)).unwrap();
        let (h, p) = read_frame(&mut s).expect("a response");
        assert_eq!(h.status(), Status::OK, "{op:?}: {}", String::from_utf8_lossy(&p));
        assert!(h.payload_len <= max_payload, "{op:?} answered {} bytes > {max_payload}", h.payload_len);
    }
    // The client library reads the (bounded) statistics.
    let st = c.get_stats().unwrap();
    assert!(!st.pools.is_empty());
    assert_eq!(c.list_pools().unwrap().len(), 400);
}
/// Defect 6: one VM filled the host-wide pool limit, so another VM could create no pool; pool ids came
/// from one host-wide counter (telling a VM how many pools the others create).
#[test]
fn regression_one_vm_exhausts_the_host_pools() {
    let (a, b) = (vm(1), vm(2));
    let d = Daemon::start(&[&a, &b], "[engine]\nmax_pools = 64\nmax_pools_per_vm = 16\n");
    let mut ca = d.tcp_client(&a);
    let mut cb = d.tcp_client(&b);
    let a1 = ca.create_cgroup(PoolOptions::ephemeral(Spec::Mem { weight: 100 })).unwrap();
    // B creates pools until it is refused.
    let mut held = Vec::new();
    let err = loop {
        match cb.create_cgroup(PoolOptions::ephemeral(Spec::Mem { weight: 1 })) {
            Ok(p) => held.push(p),
            Err(e) => break e,
        }
        assert!(held.len() <= 64, "B was never refused");
    };
    assert_eq!(err.status(), Some(Status(19)), "{err}");
    assert_eq!(held.len(), 16, "B's quota");
    assert!(!err.to_string().contains("64"), "the refusal tells B about the host limit: {err}");
    // A is unaffected, on the data plane and the admin API, and its pool ids tell it nothing about B.
    let a2 = ca.create_cgroup(PoolOptions::ephemeral(Spec::Mem { weight: 100 })).unwrap();
    assert_eq!(a2.0, a1.0 + 1, "A's pool ids moved with B's pool creations ({a1} then {a2})");
    let (s, j) =
        d.http("POST", "/v1/vm/pools", Some(&a.admin_token), Some(r#"{"spec":{"type":"mem","weight":1}}"#));
    assert_eq!(s, 201, "{j}");
    // B's destroys and creates do not move A's numbering either.
    for p in held.drain(..8) {
        cb.destroy_cgroup(p).unwrap();
    }
    for _ in 0..8 {
        cb.create_cgroup(PoolOptions::ephemeral(Spec::Mem { weight: 1 })).unwrap();
    }
    let a4 = ca.create_cgroup(PoolOptions::ephemeral(Spec::Mem { weight: 100 })).unwrap();
    assert_eq!(a4.0, a2.0 + 2);
    // Removing B (all its pools) leaves A whole.
    assert_eq!(d.http("DELETE", "/v1/vms/2", HOST, None).0, 204);
    assert_eq!(ca.list_pools().unwrap().len(), 4);
    let _ = PoolId(0);
}

/// B's own de-dup statistics after putting `guess` into its pool.
fn dedup_seen_by_b(cb: &mut Client, pool: PoolId, guess: &[u8], index: u64) -> (u64, u64) {
    cb.put(pool, Key::new(99, index), guess).unwrap();
    let c = cb.pool_stats(pool).unwrap().counters;
    (c.mem.dedup_hits, c.mem.bytes_saved)
}

/// Defect 2: with de-duplication on, VM B's own POOL_STATS moved (`dedup_hits`, `bytes_saved`) exactly
/// when a page it put equalled a page VM A held: a content oracle across VMs. By default no content is
/// shared across VMs at all, and a VM's statistics never count a match with another VM's content.
#[test]
fn regression_dedup_content_side_channel() {
    let (a, b) = (vm(1), vm(2));
    let d = Daemon::start_with(&[&a, &b], "", "capacity_bytes = 16777216\ndedup = true\n", "");
    let mut ca = d.tcp_client(&a);
    let mut cb = d.tcp_client(&b);
    let pa = ca.create_cgroup(PoolOptions::ephemeral(Spec::Mem { weight: 100 })).unwrap();
    let pb = cb.create_cgroup(PoolOptions::ephemeral(Spec::Mem { weight: 100 })).unwrap();
    let secret = page(1, 1, 1);
    ca.put(pa, Key::new(1, 1), &secret).unwrap();
    let wrong = dedup_seen_by_b(&mut cb, pb, &page(2, 2, 2), 1);
    let right = dedup_seen_by_b(&mut cb, pb, &secret, 2);
    assert_eq!(wrong, right, "B's statistics told the right guess (A's page) from a wrong one");
    // A VM's own duplicates are still de-duplicated and counted: that reveals only its own content.
    let own = dedup_seen_by_b(&mut cb, pb, &page(2, 2, 2), 3);
    assert_eq!(own.0, right.0 + 1, "B's duplicate of its own page");
}

/// CPU time (utime + stime, clock ticks) and nice of each thread of `pid`, by thread name.
fn threads_cpu(pid: u32) -> Vec<(String, u64, i64)> {
    let mut v = Vec::new();
    for t in std::fs::read_dir(format!("/proc/{pid}/task")).unwrap().flatten() {
        let comm = std::fs::read_to_string(t.path().join("comm")).unwrap_or_default().trim().to_string();
        let stat = std::fs::read_to_string(t.path().join("stat")).unwrap_or_default();
        if let Some(s) = dd_bench::cpu::parse_stat(&stat) {
            v.push((comm, s.cpu_ticks(), s.nice));
        }
    }
    v
}

fn cpu_of(threads: &[(String, u64, i64)], name: &str) -> u64 {
    threads.iter().filter(|t| t.0 == name).map(|t| t.1).sum()
}

/// Defect 7, found by the full-length `bench tenants` on a quiet machine: connections that never
/// authenticate (each announcing a 2 MiB frame before HELLO, thousands a second) were accepted and
/// answered on the runtime that serves the sessions, queued first come, first served with A's
/// requests: A's p99 rose fivefold (ratio 0.20 in 3 of 3 pairs). Unauthenticated work now runs on
/// the handshake thread at `limits.handshake_nice` (default 10): this test checks where the CPU of a
/// flood of such connections goes, and that A is served throughout.
#[test]
fn regression_unauthenticated_churn_ran_on_the_session_workers() {
    let a = vm(1);
    // Without the fail delay (its own test below), so that 6000 refusals take seconds.
    let d = Daemon::start(&[&a], "[limits]\nhandshake_fail_delay_ms = 0\n");
    let mut ca = d.tcp_client(&a);
    ca.ping().unwrap();
    let before = threads_cpu(d.pid());
    let mut answered = 0;
    for i in 0..6000u64 {
        let mut s = connect(d.tcp);
        s.write_all(&header(Op::Hello as u8, i, 2 << 20)).unwrap();
        if let Some((h, _)) = read_frame(&mut s) {
            assert_eq!(h.status(), Status::FRAME_TOO_LARGE);
            answered += 1;
        }
        if i % 1000 == 0 {
            ca.ping().unwrap();
        }
    }
    assert!(answered > 5000, "only {answered} of 6000 oversized HELLOs were answered");
    let after = threads_cpu(d.pid());
    ca.ping().unwrap();
    let hs = after.iter().find(|t| t.0 == "dd-handshake").expect("no dd-handshake thread in the daemon");
    assert_eq!(hs.2, 10, "the handshake thread runs at nice {}, not the default 10", hs.2);
    let on_hs = cpu_of(&after, "dd-handshake") - cpu_of(&before, "dd-handshake");
    let on_sessions = cpu_of(&after, "dd-serve").saturating_sub(cpu_of(&before, "dd-serve"));
    eprintln!("unauthenticated flood: {on_hs} ticks on dd-handshake, {on_sessions} on dd-serve");
    assert!(
        on_hs > 0 && on_hs >= 3 * on_sessions,
        "6000 unauthenticated connections cost {on_hs} ticks on the handshake thread and {on_sessions} on the \
         session runtime's threads"
    );
}

/// Found by CI's `bench tenants` on a quiet machine after the fix above (A's p99 ratio 0.42
/// in 5 pairs, 0.23 to 0.55): a refused handshake was answered and closed at once, so a client that
/// reconnected on every refusal made the daemon accept, refuse and close about 6,000 connections a
/// second, and the kernel's work for them (not the daemon's handshake thread: the same flood aimed at
/// another process cost A as much) took A's CPU. A failed handshake is now answered after
/// `limits.handshake_fail_delay_ms` (default 1000), its connection unread meanwhile in a displaceable
/// slot, and a correct HELLO is never delayed.
#[test]
fn regression_refused_handshakes_were_answered_and_closed_at_once() {
    let a = vm(1);
    let d = Daemon::start(&[&a], "[limits]\nhandshake_fail_delay_ms = 2000\n");
    let delayed = |what: &str, t0: Instant| {
        let took = t0.elapsed();
        assert!(
            took >= Duration::from_millis(1900),
            "{what} was answered after {took:?}, not the 2 s fail delay"
        );
    };
    // An oversized frame before HELLO, with megabytes behind it that are never read.
    let t0 = Instant::now();
    let mut s = connect(d.tcp);
    s.write_all(&header(Op::Hello as u8, 7, 2 << 20)).unwrap();
    s.set_nonblocking(true).unwrap();
    let junk = vec![0x5au8; 1 << 20];
    while t0.elapsed() < Duration::from_millis(500) {
        if s.write(&junk).is_err() {
            std::thread::sleep(Duration::from_millis(10));
        }
    }
    s.set_nonblocking(false).unwrap();
    let (h, _) = read_frame(&mut s).expect("the refusal is answered");
    assert_eq!((h.status(), h.request_id), (Status::FRAME_TOO_LARGE, 7));
    delayed("an oversized HELLO", t0);
    assert!(raw::closed(&mut s));
    // A wrong token and an unknown VM.
    for (vm, token) in [(a.id, "not-the-token-of-this-vm"), (99, "data-token-of-no-vm-at-all")] {
        let t0 = Instant::now();
        let mut s = connect(d.tcp);
        assert_eq!(raw::hello(&mut s, vm, token), Some(Status::AUTH_FAILED));
        delayed("a HELLO with a wrong token", t0);
    }
    // While 32 refused connections wait for their answers, A connects and is served at once.
    let mut waiting: Vec<_> = (0..32u64)
        .map(|i| {
            let mut s = connect(d.tcp);
            s.write_all(&header(Op::Hello as u8, i, 2 << 20)).unwrap();
            s
        })
        .collect();
    let t0 = Instant::now();
    let mut ca = d.tcp_client(&a);
    ca.ping().unwrap();
    let took = t0.elapsed();
    assert!(took < Duration::from_millis(1000), "A's HELLO took {took:?} beside refused connections");
    for s in &mut waiting {
        let (h, _) = read_frame(s).expect("every refused connection is answered");
        assert_eq!(h.status(), Status::FRAME_TOO_LARGE);
    }
    let m = d.metrics();
    let n: u64 = m
        .lines()
        .find_map(|l| l.strip_prefix("dd_handshakes_delayed_total "))
        .and_then(|v| v.trim().parse().ok())
        .expect("dd_handshakes_delayed in /metrics");
    assert!(n >= 35, "dd_handshakes_delayed counted {n} of 35 failed handshakes");
}

/// Found by `bench tenants` (`reregistration`) on this project's machine class after the fail delay
/// above: an admin client that registers and removes a VM in a loop made the daemon write the
/// registrations file about 1,000 times a second (two syncs each), and the storage traffic cost VM A
/// half its p99 (ratios 0.44-0.56; the VM's CPU time went to the hypervisor, `steal` 5-15% in
/// /proc/stat, only while the attack ran). Writes are now at least
/// `auth.registrations_min_write_interval_ms` (default 10) apart, and every change is still on disk
/// when its call returns.
#[test]
fn regression_registration_churn_flooded_the_disk_with_syncs() {
    let a = vm(1);
    let d = Daemon::start(&[&a], "");
    let t0 = Instant::now();
    for i in 0..20 {
        register(&d, 60, &format!("data-token-churn-{i:04}"), &format!("admin-token-churn-{i:04}"));
        assert_eq!(d.http("DELETE", "/v1/vms/60", HOST, None).0, 204);
    }
    let took = t0.elapsed();
    // 40 writes, each at least 10 ms after the one before.
    assert!(
        took >= Duration::from_millis(390),
        "40 registration changes took {took:?}: their writes are not paced"
    );
    // Each change was on disk when its call returned: the last state (VM 60 removed) and A survive a restart.
    register(&d, 61, "data-token-after-churn", "admin-token-after-churn");
    let mut d = d;
    d.kill_and_restart();
    let (s, _) = d.http("GET", "/v1/vms/60", HOST, None);
    assert_eq!(s, 404, "VM 60 came back after its removal and a restart");
    let c = Client::connect_tcp(d.tcp, 61, "data-token-after-churn");
    assert!(c.is_ok(), "the registration made just before the restart was lost");
    d.tcp_client(&a).ping().unwrap();
}
