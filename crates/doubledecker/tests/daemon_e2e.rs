//! Acceptance 1: the real daemon process driven over both transports with the client library: pools,
//! puts, exclusive gets, flushes, migration, spec changes, batches, pipelining, stats; then a graceful
//! SIGTERM shutdown.

mod common;

use common::{page, vm, Daemon};
use dd_client::Client;
use dd_engine::{Key, PoolOptions, PutOutcome, Spec, StoreKind};
use dd_proto::{Request, Response, Status};

fn exercise(c: &mut Client, seed: u64) {
    assert_eq!(c.info().page_size, 4096);
    c.ping().unwrap();
    let mem = c.create_cgroup(PoolOptions::ephemeral(Spec::Mem { weight: 100 })).unwrap();
    let ssd = c.create_cgroup(PoolOptions::ephemeral(Spec::Ssd { weight: 100 })).unwrap();
    let mut pools = c.list_pools().unwrap();
    pools.sort();
    assert_eq!(pools, {
        let mut v = vec![mem, ssd];
        v.sort();
        v
    });

    // Puts and exclusive gets.
    for i in 0..32 {
        assert_eq!(
            c.put(mem, Key::new(1, i), &page(seed, 1, i)).unwrap(),
            PutOutcome::Stored(StoreKind::Mem)
        );
    }
    assert_eq!(c.put(ssd, Key::new(9, 0), &page(seed, 9, 0)).unwrap(), PutOutcome::Stored(StoreKind::Ssd));
    let mut buf = vec![0u8; 4096];
    assert!(c.get(mem, Key::new(1, 3), &mut buf).unwrap());
    assert_eq!(buf, page(seed, 1, 3));
    assert!(!c.get(mem, Key::new(1, 3), &mut buf).unwrap(), "exclusive: the hit removed the page");
    assert!(c.get(ssd, Key::new(9, 0), &mut buf).unwrap());
    assert_eq!(buf, page(seed, 9, 0));

    // A put replaces: the get sees the latest data.
    c.put(mem, Key::new(1, 4), &page(seed + 1, 1, 4)).unwrap();
    assert!(c.get(mem, Key::new(1, 4), &mut buf).unwrap());
    assert_eq!(buf, page(seed + 1, 1, 4));

    // Flushes.
    assert!(c.flush_page(mem, Key::new(1, 5)).unwrap());
    assert!(!c.flush_page(mem, Key::new(1, 5)).unwrap());
    assert!(!c.get(mem, Key::new(1, 5), &mut buf).unwrap());
    for i in 0..4 {
        c.put(mem, Key::new(2, i), &page(seed, 2, i)).unwrap();
    }
    assert_eq!(c.flush_object(mem, 2).unwrap(), 4);
    assert!(!c.get(mem, Key::new(2, 0), &mut buf).unwrap());

    // Migration: object 1's remaining pages move to a second memory pool.
    let other = c.create_cgroup(PoolOptions::ephemeral(Spec::Mem { weight: 50 })).unwrap();
    let moved = c.migrate_object(mem, other, 1).unwrap();
    assert_eq!(moved, 32 - 3, "32 put, 3 gone (two gets, one flush)");
    assert!(!c.get(mem, Key::new(1, 10), &mut buf).unwrap());
    assert!(c.get(other, Key::new(1, 10), &mut buf).unwrap());
    assert_eq!(buf, page(seed, 1, 10));

    // Spec change: mem -> ssd takes the pages out of memory; new puts go to SSD.
    c.set_cg_weight(other, Spec::Ssd { weight: 10 }).unwrap();
    let st = c.pool_stats(other).unwrap();
    assert_eq!(st.spec, Spec::Ssd { weight: 10 });
    assert_eq!(st.counters.mem.used, 0);
    assert_eq!(c.put(other, Key::new(3, 0), &page(seed, 3, 0)).unwrap(), PutOutcome::Stored(StoreKind::Ssd));
    assert!(c.get(other, Key::new(3, 0), &mut buf).unwrap());
    assert_eq!(buf, page(seed, 3, 0));

    // Batches.
    let keys: Vec<Key> = (0..64).map(|i| Key::new(7, i)).collect();
    let pages: Vec<Vec<u8>> = keys.iter().map(|k| page(seed, k.object, k.index)).collect();
    let items: Vec<(Key, &[u8])> = keys.iter().zip(&pages).map(|(k, p)| (*k, &p[..])).collect();
    let outs = c.put_batch(mem, &items).unwrap();
    assert!(outs.iter().all(|o| *o == PutOutcome::Stored(StoreKind::Mem)));
    let mut probe: Vec<Key> = keys.iter().step_by(2).copied().collect();
    probe.push(Key::new(7, 1000)); // a miss in the middle of the answer
    probe.push(Key::new(7, 1));
    let mut out = vec![0u8; probe.len() * 4096];
    let hits = c.get_batch(mem, &probe, &mut out).unwrap();
    for (i, k) in probe.iter().enumerate() {
        if k.index == 1000 {
            assert!(!hits[i]);
        } else {
            assert!(hits[i], "key {k:?}");
            assert_eq!(&out[i * 4096..(i + 1) * 4096], &page(seed, 7, k.index)[..]);
        }
    }

    // Pipelining: 100 requests in flight, answered in order with their ids.
    let mut ids = Vec::new();
    let data: Vec<Vec<u8>> = (0..50).map(|i| page(seed, 8, i)).collect();
    for (i, d) in data.iter().enumerate() {
        ids.push(c.send(&Request::Put { pool: mem, key: Key::new(8, i as u64), data: d }));
    }
    for i in 0..50 {
        ids.push(c.send(&Request::Get { pool: mem, key: Key::new(8, i) }));
    }
    for (n, id) in ids.iter().enumerate() {
        let (got, r) = c.recv().unwrap();
        assert_eq!(got, *id);
        if n < 50 {
            assert_eq!(r, Response::Put(PutOutcome::Stored(StoreKind::Mem)));
        } else {
            assert_eq!(r, Response::Get(Some(data[n - 50].clone())));
        }
    }

    // An error in the middle of a pipeline answers that request and the connection carries on.
    let a = c.send(&Request::Get { pool: dd_engine::PoolId(999_999), key: Key::new(0, 0) });
    let b = c.send(&Request::Ping);
    let (ia, ra) = c.recv().unwrap();
    assert_eq!(ia, a);
    assert!(matches!(ra, Response::Error { status, .. } if status == Status(11)));
    assert_eq!(c.recv().unwrap(), (b, Response::Pong));

    // Stats: the identity holds per pool and in the VM's totals.
    let vs = c.get_stats().unwrap();
    assert_eq!(vs.pools.len(), 3);
    for p in &vs.pools {
        assert!(p.counters.identity_holds(), "pool {}", p.pool);
    }
    assert!(vs.totals.identity_holds());
    assert!(vs.totals.gets_missed >= 4);

    // Destroy.
    c.destroy_cgroup(other).unwrap();
    let e = c.get(other, Key::new(3, 0), &mut buf).unwrap_err();
    assert_eq!(e.status(), Some(Status(11)), "{e}");
    c.destroy_cgroup(mem).unwrap();
    c.destroy_cgroup(ssd).unwrap();
    assert!(c.list_pools().unwrap().is_empty());
    assert!(c.get_stats().unwrap().totals.identity_holds());
}

#[test]
fn daemon_serves_both_transports_and_stops_gracefully() {
    let v1 = vm(1);
    let mut d = Daemon::start(&[&v1], "");
    let mut tcp = d.tcp_client(&v1);
    exercise(&mut tcp, 11);
    let mut unix = d.unix_client(&v1);
    exercise(&mut unix, 22);
    // Both connections are still usable after each other's work.
    tcp.ping().unwrap();
    unix.ping().unwrap();
    let sock = d.unix.clone();
    assert!(d.stop(), "SIGTERM gives a clean exit");
    assert!(!sock.exists(), "the socket file is removed on shutdown");
}

#[test]
fn invalid_configuration_names_the_field() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("bad.toml");
    std::fs::write(&cfg, "[limits]\nmax_connections = 0\n").unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_doubledecker"))
        .args(["serve", "--config"])
        .arg(&cfg)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("limits.max_connections"), "{err}");
    assert_eq!(err.trim().lines().count(), 1, "one message: {err}");
}

#[test]
fn config_default_prints_the_embedded_default() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_doubledecker"))
        .args(["config", "default"])
        .output()
        .unwrap();
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    assert_eq!(dd_server::ServerConfig::from_toml(&text).unwrap(), dd_server::ServerConfig::default());
}

/// `config coop-key FILE` creates a private peer key (mode 0600) once and prints its public key, the
/// same on every later call; the text is what `coop.peers[].public_key` takes.
#[test]
fn config_coop_key_creates_a_key_once_and_prints_its_public_key() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("coop.key");
    let run = || {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_doubledecker"))
            .args(["config", "coop-key"])
            .arg(&file)
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8(out.stdout).unwrap().trim().to_string()
    };
    let public = run();
    assert_eq!(std::fs::metadata(&file).unwrap().permissions().mode() & 0o777, 0o600);
    assert!(dd_coop::identity::parse_public(&public).is_ok(), "{public}");
    assert_ne!(std::fs::read_to_string(&file).unwrap().trim(), public, "the file holds the private half");
    assert_eq!(run(), public, "a second call keeps the key");
}
