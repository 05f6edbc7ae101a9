//! Acceptance 2: nothing VM A does (on the data plane or the admin API, with guessed pool ids, object
//! ids and stats calls) can read, flush, count or detect VM B's pages.

mod common;

use common::{page, vm, Daemon};
use dd_engine::{Key, PoolId, PoolOptions, Spec};
use dd_proto::Status;

const UNKNOWN_POOL: Status = Status(11);

fn code<T: std::fmt::Debug>(r: Result<T, dd_client::ClientError>) -> Option<Status> {
    r.unwrap_err().status()
}

#[test]
fn one_vm_cannot_reach_another() {
    let (a, b) = (vm(1), vm(2));
    let d = Daemon::start(&[&a, &b], "");
    let mut cb = d.tcp_client(&b);
    let mut ca = d.unix_client(&a);

    // B fills two pools.
    let b1 = cb.create_cgroup(PoolOptions::ephemeral(Spec::Mem { weight: 100 })).unwrap();
    let b2 = cb.create_cgroup(PoolOptions::persistent(Spec::Mem { weight: 100 })).unwrap();
    for i in 0..16 {
        cb.put(b1, Key::new(5, i), &page(2, 5, i)).unwrap();
        cb.put(b2, Key::new(5, i), &page(3, 5, i)).unwrap();
    }
    let a1 = ca.create_cgroup(PoolOptions::ephemeral(Spec::Mem { weight: 100 })).unwrap();
    let b_before = cb.get_stats().unwrap();

    // A guesses every pool id around the ones in use, with B's object ids and indexes.
    let mut buf = vec![0u8; 4096];
    for guess in 0..64u32 {
        let p = PoolId(guess);
        if p == a1 {
            continue;
        }
        assert_eq!(code(ca.get(p, Key::new(5, 0), &mut buf)), Some(UNKNOWN_POOL), "get {guess}");
        let mut out = vec![0u8; 2 * 4096];
        assert_eq!(code(ca.get_batch(p, &[Key::new(5, 1), Key::new(5, 2)], &mut out)), Some(UNKNOWN_POOL));
        assert_eq!(code(ca.flush_page(p, Key::new(5, 3))), Some(UNKNOWN_POOL));
        assert_eq!(code(ca.flush_object(p, 5)), Some(UNKNOWN_POOL));
        assert_eq!(code(ca.migrate_object(p, a1, 5)), Some(UNKNOWN_POOL), "migrate out of {guess}");
        assert_eq!(code(ca.migrate_object(a1, p, 5)), Some(UNKNOWN_POOL), "migrate into {guess}");
        assert_eq!(code(ca.pool_stats(p)), Some(UNKNOWN_POOL));
        assert_eq!(code(ca.set_cg_weight(p, Spec::None)), Some(UNKNOWN_POOL));
        assert_eq!(code(ca.put(p, Key::new(5, 4), &page(9, 5, 4))), Some(UNKNOWN_POOL));
        let batch = [(Key::new(5, 6), &buf[..])];
        assert_eq!(code(ca.put_batch(p, &batch)), Some(UNKNOWN_POOL));
        assert_eq!(code(ca.destroy_cgroup(p)), Some(UNKNOWN_POOL));
    }
    // A's error for B's pool is byte-for-byte the error for a pool that never existed (pool ids are
    // numbered per VM: B's second pool has a number A does not have).
    let errs = |p: PoolId, ca: &mut dd_client::Client| match ca.flush_object(p, 5).unwrap_err() {
        dd_client::ClientError::Server { status, message } => (status, message.replace(&p.to_string(), "N")),
        e => panic!("{e}"),
    };
    assert_eq!(errs(b2, &mut ca), errs(PoolId(60_000), &mut ca));

    // A sees only itself.
    assert_eq!(ca.list_pools().unwrap(), vec![a1]);
    let sa = ca.get_stats().unwrap();
    assert_eq!(sa.vm, dd_engine::VmId(1));
    assert_eq!(sa.pools.len(), 1);
    assert_eq!(sa.totals.used_total(), 0);
    // A's data token does not open B's session, nor does A's admin token.
    let e = dd_client::Client::connect_tcp(d.tcp, b.id, &a.data_token).unwrap_err();
    assert_eq!(e.status(), Some(Status::AUTH_FAILED));
    let e = dd_client::Client::connect_tcp(d.tcp, b.id, &b.admin_token).unwrap_err();
    assert_eq!(e.status(), Some(Status::AUTH_FAILED), "the admin token is not a data-plane token");

    // Admin API, VM scope with A's admin token: B's pools do not exist, host scope is closed.
    let t = Some(a.admin_token.as_str());
    // (B's first pool has the number of A's own first pool: that number names A's pool for A.)
    assert_eq!(b1, a1);
    for p in [b2, PoolId(99)] {
        let (s, j) = d.http("GET", &format!("/v1/vm/pools/{p}"), t, None);
        assert_eq!((s, j["code"].as_str()), (404, Some("unknown_pool")));
        let (s, _) = d.http("PUT", &format!("/v1/vm/pools/{p}/spec"), t, Some(r#"{"type":"none"}"#));
        assert_eq!(s, 404);
        let (s, _) = d.http("DELETE", &format!("/v1/vm/pools/{p}"), t, None);
        assert_eq!(s, 404);
    }
    let (s, j) = d.http("GET", "/v1/vm/stats", t, None);
    assert_eq!(s, 200);
    assert_eq!(j["vm"], 1);
    assert_eq!(j["pools"].as_array().unwrap().len(), 1);
    let (s, j) = d.http("GET", "/v1/vm/pools", t, None);
    assert_eq!((s, j.as_array().unwrap().len()), (200, 1));
    for path in ["/v1/stats", "/v1/vms", "/v1/vms/2", "/v1/host", "/metrics"] {
        let (s, j) = d.http("GET", path, t, None);
        assert_eq!((s, j["code"].as_str()), (401, Some("unauthorized")), "{path}");
        let (s, _) = d.http("GET", path, Some(&a.data_token), None);
        assert_eq!(s, 401, "{path} with a data token");
    }
    let (s, _) = d.http("DELETE", "/v1/vms/2", t, None);
    assert_eq!(s, 401);

    // B's pages and counters are exactly as before: nothing was read, flushed or even counted as a miss.
    let b_after = cb.get_stats().unwrap();
    assert_eq!(b_before, b_after);
    for i in 0..16 {
        assert!(cb.get(b1, Key::new(5, i), &mut buf).unwrap());
        assert_eq!(buf, page(2, 5, i));
        assert!(cb.get(b2, Key::new(5, i), &mut buf).unwrap());
        assert_eq!(buf, page(3, 5, i));
    }
}
