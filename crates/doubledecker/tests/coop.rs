//! Co-operative de-duplication between real daemon processes on loopback ports (thesis 004, sections
//! 6.2.2-6.2.7): remotifications on one host equal the remote de-dups on its peer, every remotified page
//! comes back intact, nothing is remotified to a peer that does not hold the page, the symmetric X/Y
//! experiment, and faults (peer killed, restarted empty, partitioned by SIGSTOP) give clean misses
//! within the timeout and never wrong data.

mod common;
mod coopkit;

use common::{page, vm, HOST_TOKEN};
use coopkit::*;
use dd_engine::Key;

/// Thesis 6.2.2: A holds an unrelated file, B holds the "rand file", C evicts the rand file under
/// pressure. Every remotification from C is a remote de-dup on B (none on A), every remotified page
/// comes back intact, pages no peer holds are never remotified, and gets release the pins on B.
#[test]
fn three_daemons_remotify_only_to_the_holder_and_every_page_comes_back() {
    let v = vm(1);
    let (a, b, c) = (node("a"), node("b"), node("c"));
    let da = start_node(&a, &[&b, &c], &v, 4096);
    let db = start_node(&b, &[&a, &c], &v, 4096);
    let dc = start_node(&c, &[&a, &b], &v, MEM_PAGES);
    const RAND: u64 = 200;
    let mut ca = da.tcp_client(&v);
    let pa = pool(&mut ca);
    put_file(&mut ca, pa, 7, 2, RAND);
    let mut cb = db.tcp_client(&v);
    let pb = pool(&mut cb);
    put_file(&mut cb, pb, 1, 1, RAND);
    publish(&da, 2);
    publish(&db, 2);

    let mut cc = dc.tcp_client(&v);
    let pc = pool(&mut cc);
    put_file(&mut cc, pc, 1, 1, RAND); // the rand file, held by B
    put_file(&mut cc, pc, 3, 3, RAND); // a file nobody else holds: evicts the rand file's oldest pages
    put_file(&mut cc, pc, 4, 4, RAND); // and then its own oldest pages, which no peer holds
    let rc = settle(&dc);
    let remotified = n(&rc, "remotified");
    let evicted_rand_pages = RAND; // FIFO: all of file 1 goes first, then 144 pages of file 3
    assert_eq!(remotified, evicted_rand_pages, "{rc}");
    assert!(n(&rc, "no_candidate") + n(&rc, "compare_mismatches") >= 144, "{rc}");
    let rb = coop(&db);
    assert_eq!(n(&rb, "remote_dedups"), remotified, "remotifications from C == remote de-dups on B");
    assert_eq!(n(&coop(&da), "remote_dedups"), 0, "nothing was remotified to A, which lacks the page");
    assert_eq!(pins_held(&db), remotified);
    let ps = cc.pool_stats(pc).unwrap();
    assert_eq!(ps.counters.remotified, remotified);
    assert_eq!(ps.counters.remote_pages, remotified);
    assert_eq!(ps.counters.mem.used, MEM_PAGES - 16 + 8, "remotified pages use no local memory");

    // Every remotified page comes back intact (thesis 6.2.2, step 9); pages no peer held are misses.
    assert_eq!(get_file(&mut cc, pc, 1, 1, RAND), (RAND, 0));
    let (hits3, misses3) = get_file(&mut cc, pc, 3, 3, RAND);
    assert_eq!(hits3 + misses3, RAND);
    assert!(misses3 > 0);
    let rc = coop(&dc);
    assert_eq!(n(&rc, "remote_gets_hit"), remotified);
    assert_eq!(n(&rc, "remote_gets_missed"), 0);
    assert_eq!(n(&coop(&db), "fetches_served"), remotified, "remotified gets from C == gets served by B");
    let ps = cc.pool_stats(pc).unwrap();
    assert_eq!((ps.counters.remote_gets_hit, ps.counters.remote_pages), (remotified, 0));
    // The exclusive gets released their pins on B; B's own pages are untouched.
    wait_pins(&db, 0);
    assert_eq!(get_file(&mut cb, pb, 1, 1, RAND), (RAND, 0));
    // /metrics carries the counters.
    let url = format!("{}/metrics", dc.admin);
    let text = ureq::get(&url)
        .set("Authorization", &format!("Bearer {HOST_TOKEN}"))
        .call()
        .unwrap()
        .into_string()
        .unwrap();
    assert!(
        text.contains(&format!("dd_pool_remotified_total{{vm=\"1\",pool=\"{pc}\"}} {remotified}")),
        "{text}"
    );
}

/// Thesis 6.2.3, the symmetric experiment: X evicts file Y (held by Y) and Y evicts file X (held by X).
#[test]
fn symmetric_x_y_remotification() {
    let v = vm(1);
    let (x, y) = (node("x"), node("y"));
    let dx = start_node(&x, &[&y], &v, MEM_PAGES);
    let dy = start_node(&y, &[&x], &v, MEM_PAGES);
    let (mut cx, mut cy) = (dx.tcp_client(&v), dy.tcp_client(&v));
    let (px, py) = (pool(&mut cx), pool(&mut cy));
    const F: u64 = 100;
    // X: file 20 (oldest), then file 10; Y: file 10 (oldest), then file 20.
    put_file(&mut cx, px, 20, 20, F);
    put_file(&mut cx, px, 10, 10, F);
    put_file(&mut cy, py, 10, 10, F);
    put_file(&mut cy, py, 20, 20, F);
    publish(&dx, 1);
    publish(&dy, 1);
    // Pressure on both: each evicts its oldest file, which the other holds.
    put_file(&mut cx, px, 31, 31, F);
    let rx = settle(&dx);
    put_file(&mut cy, py, 32, 32, F);
    let ry = settle(&dy);
    let (from_x, from_y) = (n(&rx, "remotified"), n(&ry, "remotified"));
    assert_eq!(from_x, 48, "X evicted three batches of file 20: {rx}");
    assert_eq!(from_y, 48, "Y evicted three batches of file 10: {ry}");
    assert_eq!(n(&coop(&dy), "remote_dedups"), from_x);
    assert_eq!(n(&coop(&dx), "remote_dedups"), from_y);
    assert_eq!(get_file(&mut cx, px, 20, 20, F), (F, 0));
    // Y's side through GET_BATCH: remotified and local pages mixed in one batch, all intact.
    let keys: Vec<Key> = (0..F).map(|i| Key::new(10, i)).collect();
    let mut out = vec![0u8; keys.len() * 4096];
    let hits = cy.get_batch(py, &keys, &mut out).unwrap();
    assert!(hits.iter().all(|h| *h), "{hits:?}");
    for (i, chunk) in out.chunks(4096).enumerate() {
        assert!(chunk == page(10, 10, i as u64).as_slice(), "page {i} of a batch");
    }
    assert_eq!(n(&coop(&dx), "remote_gets_hit"), from_x);
    assert_eq!(n(&coop(&dy), "remote_gets_hit"), from_y);
}

/// A peer killed mid-run, then restarted empty on the same address: remotified gets miss (never wrong
/// data) within the timeout, and the restarted peer's new epoch keeps old references from matching.
#[test]
fn killed_and_restarted_peer_gives_clean_misses() {
    let v = vm(1);
    let (b, c) = (node("b"), node("c"));
    let (mut db, dc, mut cc, pc, remotified) = remotified_pair(&b, &c, &v, 64);
    // Half the pages come back while B is alive.
    assert_eq!(get_file(&mut cc, pc, 1, 1, 32), (32, 0));
    signal(&db, libc::SIGKILL);
    let _ = db.child.take().unwrap().wait();
    // The gets end on their own (a time-out or two of 5 s, then the back-off answers at once), as
    // misses. Time-outs are generous so that a loaded 2-core machine never turns a live peer into a miss.
    let (mut cc, hits) = finishes("the gets of a dead peer's pages", move || {
        let mut out = vec![0u8; 4096];
        let hits: Vec<u64> = (32..48).filter(|&i| cc.get(pc, Key::new(1, i), &mut out).unwrap()).collect();
        (cc, hits)
    });
    assert_eq!(hits, Vec::<u64>::new(), "a dead peer's pages are misses");
    // Restart B empty at the same address but holding the same bytes: the old pins are gone with the
    // old epoch, so the remaining references miss even though equal content exists again.
    let db2 = start_node(&b, &[&c], &v, 4096);
    let mut cb2 = db2.tcp_client(&v);
    let pb2 = pool(&mut cb2);
    put_file(&mut cb2, pb2, 1, 1, 64);
    // The gets must reach the restarted B (not be answered by the back-off the dead B caused).
    wait_for("C's back-off on B to end", || peer_backoff_ms(&dc, "b") == 0);
    let mut out = vec![0u8; 4096];
    for i in 48..64 {
        assert!(!cc.get(pc, Key::new(1, i), &mut out).unwrap(), "a restarted peer's old pin is a miss");
    }
    // The first get after the restart finds B's new epoch: its own reference misses and every other
    // reference to the old epoch is forgotten (plain misses from then on).
    let rc = coop(&dc);
    assert_eq!(n(&rc, "remote_gets_hit"), 32);
    assert_eq!(n(&rc, "remote_gets_missed") + n(&rc, "references_dropped"), remotified - 32, "{rc}");
    assert_eq!(cc.pool_stats(pc).unwrap().counters.remote_pages, 0);
    assert_eq!(n(&coop(&db2), "fetches_served"), 0, "the new epoch was refused before any fetch");
    drop(db);
}

/// A restarted remotifier (new epoch) makes its peer release every pin it held for it.
#[test]
fn restarted_remotifier_releases_its_pins_on_the_peer() {
    let v = vm(1);
    let (b, c) = (node("b"), node("c"));
    let (db, mut dc, _cc, _pc, remotified) = remotified_pair(&b, &c, &v, 40);
    assert!(dc.stop());
    let dc2 = start_node(&c, &[&b], &v, MEM_PAGES);
    publish(&dc2, 1); // HELLO with the new epoch
    wait_pins(&db, 0);
    assert_eq!(n(&coop(&db), "pins_released_epoch"), remotified);
}

/// A partitioned peer (stopped with SIGSTOP: its listener accepts nothing and answers nothing): gets
/// miss within the timeout, and once it is back, the remaining remotified pages come back intact.
#[test]
fn partitioned_peer_times_out_to_misses_and_recovers() {
    let v = vm(1);
    let (b, c) = (node("b"), node("c"));
    let (db, dc, mut cc, pc, remotified) = remotified_pair(&b, &c, &v, 48);
    signal(&db, libc::SIGSTOP);
    wait_stopped(&db);
    // The gets end on their own, as misses: a time-out, then the back-off.
    let (mut cc, hits) = finishes("the gets of a partitioned peer's pages", move || {
        let mut out = vec![0u8; 4096];
        let hits: Vec<u64> = (0..16).filter(|&i| cc.get(pc, Key::new(1, i), &mut out).unwrap()).collect();
        (cc, hits)
    });
    assert_eq!(hits, Vec::<u64>::new(), "a partitioned peer's pages are misses");
    signal(&db, libc::SIGCONT);
    wait_for("C's back-off on B to end", || peer_backoff_ms(&dc, "b") == 0);
    assert_eq!(get_file(&mut cc, pc, 1, 1, 48), (32, 16), "the rest is served again, intact");
    let rc = coop(&dc);
    assert_eq!((n(&rc, "remote_gets_hit"), n(&rc, "remote_gets_missed")), (32, 16));
    assert_eq!(remotified, 48);
    // The unpins of the gets made during the partition failed; the next publication sends them again,
    // so B ends up holding no pin for C (none leaks while both live).
    wait_for("the failed unpins to be sent again", || {
        publish(&dc, 1);
        pins_held(&db) == 0
    });
}

/// etcd membership: daemons find each other through leased keys, remotify and fetch as with a static
/// list, a name registered in etcd without a key in the membership is ignored, and a killed daemon
/// drops out of its peers' lists when its lease expires.
#[test]
fn etcd_membership_finds_peers_and_drops_dead_ones() {
    let etcd = EtcdServer::start();
    let v = vm(1);
    let (b, c, m) = (node("b"), node("c"), node("mallory"));
    // A node that is not a member (its key is in nobody's list) registers itself in etcd.
    let dm = start_etcd_node(&m, &[&b, &c], &etcd, &v, 4096);
    let db = start_etcd_node(&b, &[&c], &etcd, &v, 4096);
    let dc = start_etcd_node(&c, &[&b], &etcd, &v, MEM_PAGES);
    wait_for("b and c to see each other", || peer_active(&db, "c") && peer_active(&dc, "b"));
    wait_for("mallory to see b", || peer_active(&dm, "b"));
    assert!(
        !coop(&db)["peers"].as_array().unwrap().iter().any(|p| p["name"] == "mallory"),
        "etcd added a member"
    );
    // mallory's summaries and compares are refused at the handshake.
    assert_eq!(n(&coop(&dm), "peer_failures"), 0);
    let (s, j) = dm.http("POST", "/v1/host/coop/publish", Some(HOST_TOKEN), None);
    assert_eq!((s, n(&j, "peers_reached")), (200, 0), "{j}");
    assert!(n(&coop(&db), "auth_failures") + n(&coop(&dc), "auth_failures") >= 2);
    drop(dm);
    let mut cb = db.tcp_client(&v);
    let pb = pool(&mut cb);
    put_file(&mut cb, pb, 1, 1, 32);
    publish(&db, 1);
    let mut cc = dc.tcp_client(&v);
    let pc = pool(&mut cc);
    put_file(&mut cc, pc, 1, 1, 32);
    put_file(&mut cc, pc, 5, 5, MEM_PAGES);
    assert_eq!(n(&settle(&dc), "remotified"), 32);
    assert_eq!(n(&coop(&db), "remote_dedups"), 32);
    assert_eq!(get_file(&mut cc, pc, 1, 1, 16), (16, 0));
    let mut db = db;
    signal(&db, libc::SIGKILL);
    let _ = db.child.take().unwrap().wait();
    wait_for("b's lease to expire", || !peer_active(&dc, "b"));
    let mut out = vec![0u8; 4096];
    for i in 16..32 {
        assert!(!cc.get(pc, Key::new(1, i), &mut out).unwrap(), "a departed peer's page is a miss");
    }
    assert_eq!(n(&coop(&dc), "remote_gets_missed"), 16);
}
