//! Co-operative de-duplication between real daemon processes on loopback ports (thesis 004, sections
//! 6.2.2-6.2.7): remotifications on one host equal the remote de-dups on its peer, every remotified page
//! comes back intact, nothing is remotified to a peer that does not hold the page, the symmetric X/Y
//! experiment, and faults (peer killed, restarted empty, partitioned by SIGSTOP) give clean misses
//! within the timeout and never wrong data.

mod common;

use common::{page, vm, Daemon, TestVm, HOST_TOKEN};
use dd_coop::identity::NodeKey;
use dd_engine::{Key, PoolId, PoolOptions, Spec};
use std::time::{Duration, Instant};

/// Test daemons' memory: 256 pages, evicted 16 at a time.
const MEM_PAGES: u64 = 256;

/// A free loopback port (bound, read and released; the daemon binds it right after).
fn free_port() -> u16 {
    dd_bench::daemon::free_port().unwrap()
}

/// A daemon-to-be: its name, peer-listener port and its own key (in a file of its own).
struct Node {
    name: &'static str,
    port: u16,
    key: NodeKey,
    key_file: std::path::PathBuf,
    _keys: tempfile::TempDir,
}

/// A node with a key derived from its name (deterministic, distinct per name).
fn node(name: &'static str) -> Node {
    let mut seed = [0u8; 32];
    for (i, b) in seed.iter_mut().enumerate() {
        *b = name.as_bytes()[i % name.len()] ^ (i as u8).wrapping_mul(37);
    }
    let key = NodeKey::from_seed(seed);
    let dir = tempfile::tempdir().unwrap();
    let key_file = dir.path().join("coop.key");
    std::fs::write(&key_file, key.secret_text()).unwrap();
    Node { name, port: free_port(), key, key_file, _keys: dir }
}

/// `peers = [...]`: each node's name, address and public key.
fn peers_toml(peers: &[&Node]) -> String {
    let mut t = String::from("peers = [");
    for p in peers {
        t.push_str(&format!(
            "{{ name = {:?}, addr = \"127.0.0.1:{}\", public_key = {:?} }}, ",
            p.name,
            p.port,
            p.key.public_text()
        ));
    }
    t.push_str("]\n");
    t
}

fn start_node(me: &Node, peers: &[&Node], v: &TestVm, mem_pages: u64) -> Daemon {
    start_node_in(me, peers, v, mem_pages, "peers")
}

/// [`start_node`] with the VM in de-dup group `group` ("": its own domain, the default).
fn start_node_in(me: &Node, peers: &[&Node], v: &TestVm, mem_pages: u64, group: &str) -> Daemon {
    let mut extra = format!(
        "[engine]\neviction_batch_bytes = 65536\n[coop]\nenabled = true\nlisten = \"127.0.0.1:{}\"\n\
         node_name = {:?}\ndedup_group = \"peers\"\nkey_file = {:?}\npublish_interval_ms = 3600000\nrequest_timeout_ms = 5000\n\
         connect_timeout_ms = 5000\npeer_backoff_ms = 500\n",
        me.port,
        me.name,
        me.key_file.display().to_string()
    );
    extra.push_str(&peers_toml(peers));
    extra.push_str("[coop.bloom]\nm_bits = 1048576\nk_hashes = 7\n");
    let mem = format!("capacity_bytes = {}\ndedup = true\n", mem_pages * 4096);
    // The VM's pages are shared with peers only when it is in the co-operative group.
    let v = TestVm { dedup_group: group.into(), ..v.clone() };
    Daemon::start_with(&[&v], "ssd_enabled = false\n", &mem, &extra)
}

fn coop(d: &Daemon) -> serde_json::Value {
    let (s, v) = d.http("GET", "/v1/host/coop", Some(HOST_TOKEN), None);
    assert_eq!(s, 200, "{v}");
    v
}

fn n(v: &serde_json::Value, field: &str) -> u64 {
    v[field].as_u64().unwrap_or_else(|| panic!("{field} missing in {v}"))
}

fn publish(d: &Daemon, peers: u64) {
    let (s, v) = d.http("POST", "/v1/host/coop/publish", Some(HOST_TOKEN), None);
    assert_eq!(s, 200, "{v}");
    assert_eq!(n(&v, "peers_reached"), peers, "every peer took the summary");
}

/// Waits until the daemon's remotifier has handled every offer (a bound on waiting, not a timing
/// assertion).
fn settle(d: &Daemon) -> serde_json::Value {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let c = coop(d);
        let done = n(&c, "remotified")
            + n(&c, "no_candidate")
            + n(&c, "compare_mismatches")
            + n(&c, "remotify_errors")
            + n(&c, "stale_installs");
        if n(&c, "queued") == 0 && done == n(&c, "offered") {
            return c;
        }
        assert!(Instant::now() < deadline, "remotifier did not settle: {c}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn host_stats(d: &Daemon) -> serde_json::Value {
    let (s, v) = d.http("GET", "/v1/stats", Some(HOST_TOKEN), None);
    assert_eq!(s, 200);
    v
}

fn put_file(c: &mut dd_client::Client, pool: PoolId, seed: u64, object: u64, pages: u64) {
    for i in 0..pages {
        c.put(pool, Key::new(object, i), &page(seed, object, i)).unwrap();
    }
}

fn pool(c: &mut dd_client::Client) -> PoolId {
    c.create_cgroup(PoolOptions::ephemeral(Spec::Mem { weight: 100 })).unwrap()
}

/// Gets every page of a file: (hits, misses); panics on any wrong byte.
fn get_file(c: &mut dd_client::Client, pool: PoolId, seed: u64, object: u64, pages: u64) -> (u64, u64) {
    let mut out = vec![0u8; 4096];
    let (mut hits, mut misses) = (0, 0);
    for i in 0..pages {
        if c.get(pool, Key::new(object, i), &mut out).unwrap() {
            assert!(out == page(seed, object, i), "wrong bytes for page {object}/{i}");
            hits += 1;
        } else {
            misses += 1;
        }
    }
    (hits, misses)
}

fn pins_held(d: &Daemon) -> u64 {
    n(&host_stats(d), "pins_held")
}

fn wait_pins(d: &Daemon, want: u64) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while pins_held(d) != want {
        assert!(Instant::now() < deadline, "pins held {} never reached {want}", pins_held(d));
        std::thread::sleep(Duration::from_millis(20));
    }
}

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

/// Remotifies `pages` pages of file 1 from C to B; returns (B, C, clients and pools).
fn remotified_pair(
    b: &Node,
    c: &Node,
    v: &TestVm,
    pages: u64,
) -> (Daemon, Daemon, dd_client::Client, PoolId, u64) {
    let db = start_node(b, &[c], v, 4096);
    let dc = start_node(c, &[b], v, MEM_PAGES);
    let mut cb = db.tcp_client(v);
    let pb = pool(&mut cb);
    put_file(&mut cb, pb, 1, 1, pages);
    publish(&db, 1);
    let mut cc = dc.tcp_client(v);
    let pc = pool(&mut cc);
    put_file(&mut cc, pc, 1, 1, pages);
    put_file(&mut cc, pc, 5, 5, MEM_PAGES);
    let remotified = n(&settle(&dc), "remotified");
    assert_eq!(remotified, pages);
    assert_eq!(pins_held(&db), pages);
    (db, dc, cc, pc, remotified)
}

fn signal(d: &Daemon, sig: libc::c_int) {
    let pid = d.child.as_ref().expect("running").id() as libc::pid_t;
    // SAFETY: kill(2) on the pid of a child this test spawned and has not reaped.
    assert_eq!(unsafe { libc::kill(pid, sig) }, 0);
}

/// Waits until every thread of a SIGSTOPped daemon is stopped (the signal is delivered asynchronously:
/// a thread running on another core may finish a request first).
fn wait_stopped(d: &Daemon) {
    let pid = d.child.as_ref().expect("running").id();
    wait_for("the daemon to stop", || {
        let tasks = std::fs::read_dir(format!("/proc/{pid}/task")).unwrap();
        tasks.flatten().all(|t| {
            let stat = std::fs::read_to_string(t.path().join("stat")).unwrap_or_default();
            // The state follows the parenthesised command name.
            stat.rsplit_once(") ").is_some_and(|(_, rest)| rest.starts_with('T') || rest.starts_with('t'))
        })
    });
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
    let t = Instant::now();
    let mut out = vec![0u8; 4096];
    for i in 32..48 {
        assert!(!cc.get(pc, Key::new(1, i), &mut out).unwrap(), "a dead peer's page is a miss");
    }
    // Bound on the whole run (at most a timeout or two of 5 s; the back-off answers the rest at once).
    // Timeouts are generous so that a loaded 2-core machine never turns a live peer into a miss.
    assert!(t.elapsed() < Duration::from_secs(30), "misses took {:?}", t.elapsed());
    // Restart B empty at the same address but holding the same bytes: the old pins are gone with the
    // old epoch, so the remaining references miss even though equal content exists again.
    let db2 = start_node(&b, &[&c], &v, 4096);
    let mut cb2 = db2.tcp_client(&v);
    let pb2 = pool(&mut cb2);
    put_file(&mut cb2, pb2, 1, 1, 64);
    std::thread::sleep(Duration::from_millis(1500)); // let C's back-off on B expire
    for i in 48..64 {
        assert!(!cc.get(pc, Key::new(1, i), &mut out).unwrap(), "a restarted peer's old pin is a miss");
    }
    let rc = coop(&dc);
    assert_eq!(n(&rc, "remote_gets_hit"), 32);
    assert_eq!(n(&rc, "remote_gets_missed"), remotified - 32);
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
    let t = Instant::now();
    let mut out = vec![0u8; 4096];
    for i in 0..16 {
        assert!(!cc.get(pc, Key::new(1, i), &mut out).unwrap(), "a partitioned peer's page is a miss");
    }
    assert!(t.elapsed() < Duration::from_secs(30), "misses took {:?}", t.elapsed());
    signal(&db, libc::SIGCONT);
    std::thread::sleep(Duration::from_millis(1500)); // back-off expires
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

/// A private etcd on loopback ports (killed and waited for on drop).
struct EtcdServer {
    child: std::process::Child,
    _dir: tempfile::TempDir,
    url: String,
}

impl EtcdServer {
    fn start() -> EtcdServer {
        let dir = tempfile::tempdir().unwrap();
        let (client, peer) = (free_port(), free_port());
        let url = format!("http://127.0.0.1:{client}");
        let peer_url = format!("http://127.0.0.1:{peer}");
        let child = std::process::Command::new("etcd")
            .args(["--name", "dd-test", "--data-dir"])
            .arg(dir.path())
            .args(["--listen-client-urls", &url, "--advertise-client-urls", &url])
            .args(["--listen-peer-urls", &peer_url, "--initial-advertise-peer-urls", &peer_url])
            .args(["--initial-cluster", &format!("dd-test={peer_url}")])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("etcd is installed (apt-get install etcd-server; .ci/run does it)");
        let deadline = Instant::now() + Duration::from_secs(60);
        while ureq::get(&format!("{url}/health")).call().is_err() {
            assert!(Instant::now() < deadline, "etcd did not start");
            std::thread::sleep(Duration::from_millis(50));
        }
        EtcdServer { child, _dir: dir, url }
    }
}

impl Drop for EtcdServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A daemon on etcd membership: `members` are the other nodes it accepts (names and keys; their
/// addresses come from etcd).
fn start_etcd_node(me: &Node, members: &[&Node], etcd: &EtcdServer, v: &TestVm, mem_pages: u64) -> Daemon {
    let mut members_toml = String::from("peers = [");
    for p in members {
        members_toml.push_str(&format!(
            "{{ name = {:?}, public_key = {:?} }}, ",
            p.name,
            p.key.public_text()
        ));
    }
    members_toml.push_str("]\n");
    let extra = format!(
        "[engine]\neviction_batch_bytes = 65536\n[coop]\nenabled = true\nlisten = \"127.0.0.1:{}\"\n\
         node_name = {:?}\ndedup_group = \"peers\"\nkey_file = {:?}\nmembership = \"etcd\"\npublish_interval_ms = 3600000\n\
         request_timeout_ms = 5000\nconnect_timeout_ms = 5000\npeer_backoff_ms = 500\n{members_toml}\
         [coop.bloom]\nm_bits = 1048576\nk_hashes = 7\n[coop.etcd]\nendpoint = {:?}\nprefix = \"/dd-test/\"\n\
         lease_ttl_s = 2\n",
        me.port,
        me.name,
        me.key_file.display().to_string(),
        etcd.url
    );
    let mem = format!("capacity_bytes = {}\ndedup = true\n", mem_pages * 4096);
    // The VM's pages are shared with peers only because it is in the co-operative group.
    let v = TestVm { dedup_group: "peers".into(), ..v.clone() };
    Daemon::start_with(&[&v], "ssd_enabled = false\n", &mem, &extra)
}

fn peer_active(d: &Daemon, name: &str) -> bool {
    coop(d)["peers"].as_array().unwrap().iter().any(|p| p["name"] == name && p["active"] == true)
}

fn wait_for(what: &str, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
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

/// Speaks the peer protocol by hand: one request, one response (status, payload).
fn peer_call(s: &mut std::net::TcpStream, req: &dd_coop::wire::PeerRequest<'_>) -> Option<(u16, Vec<u8>)> {
    use dd_coop::wire::{parse_header, HEADER_LEN};
    use std::io::{Read, Write};
    let mut buf = Vec::new();
    req.encode(9, &mut buf);
    s.write_all(&buf).ok()?;
    let mut head = [0u8; HEADER_LEN];
    s.read_exact(&mut head).ok()?;
    let h = parse_header(&head, u32::MAX).unwrap().unwrap();
    let mut payload = vec![0u8; h.payload_len as usize];
    s.read_exact(&mut payload).ok()?;
    Some((h.status, payload))
}

fn peer_conn(port: u16) -> std::net::TcpStream {
    let s = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    s
}

/// The peer handshake by hand: HELLO as `name` (epoch `epoch`), then AUTH signed with `key` (which
/// may be another node's). Returns the status of the last answer (None: closed without one).
fn peer_handshake(s: &mut std::net::TcpStream, name: &str, epoch: u64, key: &NodeKey) -> Option<u16> {
    use dd_coop::identity::{Role, Transcript};
    use dd_coop::wire::{PeerOp, PeerRequest, PeerResponse};
    let nonce = [0x5a; 32];
    let (st, payload) = peer_call(s, &PeerRequest::Hello { name, epoch, nonce })?;
    if st != 0 {
        return Some(st);
    }
    let PeerResponse::Hello { name: server, epoch: server_epoch, nonce: theirs, .. } =
        PeerResponse::decode(PeerOp::Hello as u8, &payload, 4096).unwrap()
    else {
        panic!("not a HELLO answer")
    };
    let t = Transcript {
        client: name,
        server,
        client_epoch: epoch,
        server_epoch,
        client_nonce: &nonce,
        server_nonce: &theirs,
    };
    let signature = key.sign(Role::Client, &t);
    peer_call(s, &PeerRequest::Auth { signature }).map(|(st, _)| st)
}

/// The peer listener: a name outside the membership, a wrong key or a first frame other than HELLO is
/// refused and the connection closed; an authenticated peer can pin only content the daemon holds and
/// fetch only its own pins.
#[test]
fn peer_listener_authenticates_and_confines_pins_to_their_owner() {
    use dd_coop::wire::{PeerOp, PeerRequest, PeerResponse, PeerStatus};
    let v = vm(1);
    let (b, m, e) = (node("b"), node("m"), node("e"));
    let db = start_node(&b, &[&m, &e], &v, 1024);
    let mut cb = db.tcp_client(&v);
    let pb = pool(&mut cb);
    put_file(&mut cb, pb, 1, 1, 4);
    let p0 = page(1, 1, 0);
    let h0 = xxhash_rust::xxh3::xxh3_128(&p0);

    let mut s = peer_conn(b.port);
    assert_eq!(peer_handshake(&mut s, "m", 5, &e.key), Some(PeerStatus::AUTH_FAILED.0), "m with e's key");
    assert!(peer_call(&mut s, &PeerRequest::Fetch { pin: 1 }).is_none(), "closed after a wrong key");
    let mut s = peer_conn(b.port);
    assert_eq!(peer_handshake(&mut s, "x", 5, &m.key), Some(PeerStatus::AUTH_FAILED.0), "not a member");
    let mut s = peer_conn(b.port);
    let (st, _) = peer_call(&mut s, &PeerRequest::Fetch { pin: 1 }).unwrap();
    assert_eq!(st, PeerStatus::NOT_AUTHENTICATED.0);
    assert!(peer_handshake(&mut s, "m", 5, &m.key).is_none(), "closed after a frame before HELLO");

    let compare = |s: &mut std::net::TcpStream, hash: u128, page: &[u8]| {
        let (st, payload) = peer_call(s, &PeerRequest::Compare { hash, page }).unwrap();
        assert_eq!(st, 0);
        match PeerResponse::decode(PeerOp::Compare as u8, &payload, 4096).unwrap() {
            PeerResponse::Compared(pin) => pin,
            other => panic!("{other:?}"),
        }
    };
    let fetch = |s: &mut std::net::TcpStream, pin: u64| {
        let (st, payload) = peer_call(s, &PeerRequest::Fetch { pin }).unwrap();
        assert_eq!(st, 0);
        matches!(PeerResponse::decode(PeerOp::Fetch as u8, &payload, 4096).unwrap(), PeerResponse::Fetched(Some(p)) if p == p0.as_slice())
    };
    let mut ms = peer_conn(b.port);
    assert_eq!(peer_handshake(&mut ms, "m", 5, &m.key), Some(0));
    let pin = compare(&mut ms, h0, &p0).expect("b holds the page");
    let other = page(2, 2, 2);
    assert_eq!(compare(&mut ms, xxhash_rust::xxh3::xxh3_128(&other), &other), None, "b lacks this one");
    assert_eq!(compare(&mut ms, h0 ^ 1, &p0), None, "a hash that does not match the bytes");
    assert!(fetch(&mut ms, pin));
    // Another member cannot read or release m's pin.
    let mut es = peer_conn(b.port);
    assert_eq!(peer_handshake(&mut es, "e", 5, &e.key), Some(0));
    assert!(!fetch(&mut es, pin));
    let (_, r) = peer_call(&mut es, &PeerRequest::Unpin { pins: vec![pin] }).unwrap();
    assert_eq!(PeerResponse::decode(PeerOp::Unpin as u8, &r, 4096).unwrap(), PeerResponse::Unpinned(0));
    assert_eq!(pins_held(&db), 1);
    let (_, r) = peer_call(&mut ms, &PeerRequest::Unpin { pins: vec![pin] }).unwrap();
    assert_eq!(PeerResponse::decode(PeerOp::Unpin as u8, &r, 4096).unwrap(), PeerResponse::Unpinned(1));
    assert_eq!(pins_held(&db), 0);
    assert!(!fetch(&mut ms, pin), "an unpinned page is gone");
}
/// Defect 9: co-operative de-duplication was a content oracle across hosts. VM 2 on host C put copies of
/// pages VM 1 held on host A and wrong guesses; its own `remotified`, its hits and its latencies told
/// the right guesses from the wrong ones, because every VM's evicted pages were offered to peers. Now
/// only the pages of the co-operative de-dup group leave their VM (the administrator's choice on each
/// host): VM 2, in its own domain (the default), offers nothing and learns nothing.
#[test]
fn regression_coop_content_oracle_across_hosts() {
    let (a_node, c_node) = (node("a"), node("c"));
    let (v1, v2) = (vm(1), vm(2));
    let a = start_node(&a_node, &[&c_node], &v1, 4096);
    let c = start_node_in(&c_node, &[&a_node], &v2, MEM_PAGES, "");
    let mut ca = a.tcp_client(&v1);
    let pa = pool(&mut ca);
    put_file(&mut ca, pa, 1, 1, 64);
    publish(&a, 1);
    // VM 2 puts 32 right guesses (VM 1's bytes) and 32 wrong ones, then pushes them all out.
    let mut cc = c.tcp_client(&v2);
    let pc = pool(&mut cc);
    for i in 0..32 {
        cc.put(pc, Key::new(5, i), &page(1, 1, i)).unwrap();
        cc.put(pc, Key::new(6, i), &page(9, 9, i)).unwrap();
    }
    put_file(&mut cc, pc, 3, 7, 4 * MEM_PAGES);
    let report = settle(&c);
    let stats = cc.pool_stats(pc).unwrap().counters;
    assert_eq!((stats.remotified, stats.remote_pages), (0, 0), "VM 2's statistics saw remote matches");
    assert_eq!(n(&report, "offered"), 0, "pages outside the co-operative group were offered to a peer");
    let (hits, _) = get_file(&mut cc, pc, 1, 5, 32);
    assert_eq!(hits, 0, "a right guess came back from the peer");
}

/// Defect 7: the peer listener had no deadline and no connection limit: connections that sent nothing
/// stayed open for ever (300 of them, with 256 file descriptors, kept the daemon from accepting anyone).
/// Now a connection that does not complete its HELLO within `coop.handshake_timeout_ms` (5 s by
/// default) is closed, the listener holds at most `coop.max_connections` (64), a newer connection
/// displacing the oldest silent one, and a real peer still gets in meanwhile.
#[test]
fn regression_peer_listener_without_deadline_or_limit() {
    use dd_coop::wire::PeerStatus;
    let v = vm(1);
    let (b, m) = (node("b"), node("m"));
    let db = start_node(&b, &[&m], &v, 1024);
    let mut silent: Vec<std::net::TcpStream> = (0..150).map(|_| peer_conn(b.port)).collect();
    // A peer that says HELLO is served although 150 silent connections came first.
    let mut s = peer_conn(b.port);
    let st = peer_handshake(&mut s, "m", 5, &m.key).expect("a HELLO answer past 150 silent connections");
    assert_eq!(st, PeerStatus::OK.0);
    // Every silent connection is closed (displaced or by the handshake deadline).
    for c in &mut silent {
        let mut buf = [0u8; 16];
        let r = std::io::Read::read(c, &mut buf);
        assert!(
            matches!(r, Ok(0) | Err(_))
                && !matches!(&r, Err(e) if e.kind() == std::io::ErrorKind::WouldBlock),
            "a silent peer connection stayed open: {r:?}"
        );
    }
    // The data plane and the admin API were served throughout.
    db.tcp_client(&v).ping().unwrap();
    assert_eq!(db.http("GET", "/healthz", None, None).0, 200);
}

/// Defect 8: one shared secret let any holder be any node. A holder of `peer_secret` said HELLO under
/// names outside the membership, fetched and unpinned other nodes' pins (numbered 1, 2, 3...), and a
/// HELLO under another node's name with a new epoch released every pin held for it. Now each node
/// proves its name with its own key: a member (here `a`, holding only its own key) cannot pass for
/// `c`, a name outside the membership is refused, and pin handles are unguessable and only `c`'s.
#[test]
fn regression_one_shared_secret_lets_any_holder_be_any_node() {
    use dd_coop::wire::{PeerOp, PeerRequest, PeerResponse, PeerStatus};
    let v = vm(1);
    let (a, b, c, mallory) = (node("a"), node("b"), node("c"), node("mallory"));
    let db = start_node(&b, &[&c, &a], &v, 4096);
    let dc = start_node(&c, &[&b], &v, MEM_PAGES);
    let mut cb = db.tcp_client(&v);
    let pb = pool(&mut cb);
    put_file(&mut cb, pb, 1, 1, 40);
    publish(&db, 1);
    let mut cc = dc.tcp_client(&v);
    let pc = pool(&mut cc);
    put_file(&mut cc, pc, 1, 1, 40);
    put_file(&mut cc, pc, 5, 5, MEM_PAGES);
    let remotified = n(&settle(&dc), "remotified");
    assert_eq!((remotified, pins_held(&db)), (40, 40));

    // A name outside the membership is refused at its HELLO, whatever key it signs with.
    let mut s = peer_conn(b.port);
    assert_eq!(peer_handshake(&mut s, "mallory", 5, &mallory.key), Some(PeerStatus::AUTH_FAILED.0));
    // A member cannot say HELLO as c (new epoch): refused, and c's pins stay.
    let mut s = peer_conn(b.port);
    assert_eq!(peer_handshake(&mut s, "c", 77, &a.key), Some(PeerStatus::AUTH_FAILED.0), "a passed for c");
    assert_eq!(pins_held(&db), remotified, "a HELLO under c's name released c's pins");
    // As itself, a finds none of c's pins, however it numbers them, and releases none.
    let mut s = peer_conn(b.port);
    assert_eq!(peer_handshake(&mut s, "a", 5, &a.key), Some(0));
    let guesses: Vec<u64> = (0..=4 * remotified).chain([u64::MAX, 1 << 32, 1 << 63]).collect();
    for &pin in &guesses {
        let (st, p) = peer_call(&mut s, &PeerRequest::Fetch { pin }).unwrap();
        assert_eq!(st, 0);
        let got = PeerResponse::decode(PeerOp::Fetch as u8, &p, 4096).unwrap();
        assert_eq!(got, PeerResponse::Fetched(None), "a fetched pin {pin} of c's");
    }
    let (_, r) = peer_call(&mut s, &PeerRequest::Unpin { pins: guesses }).unwrap();
    assert_eq!(PeerResponse::decode(PeerOp::Unpin as u8, &r, 4096).unwrap(), PeerResponse::Unpinned(0));
    assert_eq!(pins_held(&db), remotified);
    // c, the real node, still gets every page back from b.
    assert_eq!(get_file(&mut cc, pc, 1, 1, 40), (40, 0));
    assert!(n(&coop(&db), "auth_failures") >= 2);
}
