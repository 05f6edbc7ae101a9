//! Co-operative de-duplication between real daemon processes on loopback ports (thesis 004, sections
//! 6.2.2-6.2.7): remotifications on one host equal the remote de-dups on its peer, every remotified page
//! comes back intact, nothing is remotified to a peer that does not hold the page, the symmetric X/Y
//! experiment, and faults (peer killed, restarted empty, partitioned by SIGSTOP) give clean misses
//! within the timeout and never wrong data.

mod common;

use common::{page, vm, Daemon, TestVm, HOST_TOKEN};
use dd_engine::{Key, PoolId, PoolOptions, Spec};
use std::time::{Duration, Instant};

const SECRET: &str = "peer-secret-for-tests-0001";
/// Test daemons' memory: 256 pages, evicted 16 at a time.
const MEM_PAGES: u64 = 256;

/// A free loopback port (bound, read and released; the daemon binds it right after).
fn free_port() -> u16 {
    dd_bench::daemon::free_port().unwrap()
}

struct Node {
    name: &'static str,
    port: u16,
}

fn start_node(me: &Node, peers: &[&Node], v: &TestVm, mem_pages: u64) -> Daemon {
    start_node_in(me, peers, v, mem_pages, "peers")
}

/// [`start_node`] with the VM in de-dup group `group` ("": its own domain, the default).
fn start_node_in(me: &Node, peers: &[&Node], v: &TestVm, mem_pages: u64, group: &str) -> Daemon {
    let mut extra = format!(
        "[engine]\neviction_batch_bytes = 65536\n[coop]\nenabled = true\nlisten = \"127.0.0.1:{}\"\n\
         node_name = {:?}\ndedup_group = \"peers\"\npeer_secret = {SECRET:?}\npublish_interval_ms = 3600000\nrequest_timeout_ms = 5000\n\
         connect_timeout_ms = 5000\npeer_backoff_ms = 500\n",
        me.port, me.name
    );
    extra.push_str("peers = [");
    for p in peers {
        extra.push_str(&format!("{{ name = {:?}, addr = \"127.0.0.1:{}\" }}, ", p.name, p.port));
    }
    extra.push_str("]\n[coop.bloom]\nm_bits = 1048576\nk_hashes = 7\n");
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
    let (a, b, c) = (
        Node { name: "a", port: free_port() },
        Node { name: "b", port: free_port() },
        Node { name: "c", port: free_port() },
    );
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
    let (x, y) = (Node { name: "x", port: free_port() }, Node { name: "y", port: free_port() });
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
    let (b, c) = (Node { name: "b", port: free_port() }, Node { name: "c", port: free_port() });
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
    let (b, c) = (Node { name: "b", port: free_port() }, Node { name: "c", port: free_port() });
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
    let (b, c) = (Node { name: "b", port: free_port() }, Node { name: "c", port: free_port() });
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

fn start_etcd_node(me: &Node, etcd: &EtcdServer, v: &TestVm, mem_pages: u64) -> Daemon {
    let extra = format!(
        "[engine]\neviction_batch_bytes = 65536\n[coop]\nenabled = true\nlisten = \"127.0.0.1:{}\"\n\
         node_name = {:?}\ndedup_group = \"peers\"\npeer_secret = {SECRET:?}\nmembership = \"etcd\"\npublish_interval_ms = 3600000\n\
         request_timeout_ms = 5000\nconnect_timeout_ms = 5000\npeer_backoff_ms = 500\n\
         [coop.bloom]\nm_bits = 1048576\nk_hashes = 7\n[coop.etcd]\nendpoint = {:?}\nprefix = \"/dd-test/\"\n\
         lease_ttl_s = 2\n",
        me.port, me.name, etcd.url
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
/// list, and a killed daemon drops out of its peers' lists when its lease expires.
#[test]
fn etcd_membership_finds_peers_and_drops_dead_ones() {
    let etcd = EtcdServer::start();
    let v = vm(1);
    let (b, c) = (Node { name: "b", port: free_port() }, Node { name: "c", port: free_port() });
    let db = start_etcd_node(&b, &etcd, &v, 4096);
    let dc = start_etcd_node(&c, &etcd, &v, MEM_PAGES);
    wait_for("b and c to see each other", || peer_active(&db, "c") && peer_active(&dc, "b"));
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

/// The peer listener: a wrong secret or a first frame other than HELLO is refused and the connection
/// closed; an authenticated peer can pin only content the daemon holds and fetch only its own pins.
#[test]
fn peer_listener_authenticates_and_confines_pins_to_their_owner() {
    use dd_coop::wire::{PeerOp, PeerRequest, PeerResponse, PeerStatus};
    let v = vm(1);
    let b = Node { name: "b", port: free_port() };
    let db = start_node(&b, &[], &v, 1024);
    let mut cb = db.tcp_client(&v);
    let pb = pool(&mut cb);
    put_file(&mut cb, pb, 1, 1, 4);
    let p0 = page(1, 1, 0);
    let h0 = xxhash_rust::xxh3::xxh3_128(&p0);

    let mut s = peer_conn(b.port);
    let hello = |secret: &'static str, name: &'static str| PeerRequest::Hello {
        name,
        epoch: 5,
        secret: secret.as_bytes(),
    };
    let (st, _) = peer_call(&mut s, &hello("wrong-secret-0123456789", "m")).unwrap();
    assert_eq!(st, PeerStatus::AUTH_FAILED.0);
    assert!(peer_call(&mut s, &hello(SECRET, "m")).is_none(), "closed after a wrong secret");
    let mut s = peer_conn(b.port);
    let (st, _) = peer_call(&mut s, &PeerRequest::Fetch { pin: 1 }).unwrap();
    assert_eq!(st, PeerStatus::NOT_AUTHENTICATED.0);
    assert!(peer_call(&mut s, &hello(SECRET, "m")).is_none(), "closed after a frame before HELLO");

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
    let mut m = peer_conn(b.port);
    assert_eq!(peer_call(&mut m, &hello(SECRET, "m")).unwrap().0, 0);
    let pin = compare(&mut m, h0, &p0).expect("b holds the page");
    let other = page(2, 2, 2);
    assert_eq!(compare(&mut m, xxhash_rust::xxh3::xxh3_128(&other), &other), None, "b lacks this one");
    assert_eq!(compare(&mut m, h0 ^ 1, &p0), None, "a hash that does not match the bytes");
    assert!(fetch(&mut m, pin));
    // Another peer cannot read or release m's pin.
    let mut e = peer_conn(b.port);
    assert_eq!(peer_call(&mut e, &hello(SECRET, "e")).unwrap().0, 0);
    assert!(!fetch(&mut e, pin));
    let (_, r) = peer_call(&mut e, &PeerRequest::Unpin { pins: vec![pin] }).unwrap();
    assert_eq!(PeerResponse::decode(PeerOp::Unpin as u8, &r, 4096).unwrap(), PeerResponse::Unpinned(0));
    assert_eq!(pins_held(&db), 1);
    let (_, r) = peer_call(&mut m, &PeerRequest::Unpin { pins: vec![pin] }).unwrap();
    assert_eq!(PeerResponse::decode(PeerOp::Unpin as u8, &r, 4096).unwrap(), PeerResponse::Unpinned(1));
    assert_eq!(pins_held(&db), 0);
    assert!(!fetch(&mut m, pin), "an unpinned page is gone");
}

/// Defect 9: co-operative de-duplication was a content oracle across hosts. VM 2 on host C put copies of
/// pages VM 1 held on host A and wrong guesses; its own `remotified`, its hits and its latencies told
/// the right guesses from the wrong ones, because every VM's evicted pages were offered to peers. Now
/// only the pages of the co-operative de-dup group leave their VM (the administrator's choice on each
/// host): VM 2, in its own domain (the default), offers nothing and learns nothing.
#[test]
fn regression_coop_content_oracle_across_hosts() {
    let (a_node, c_node) = (Node { name: "a", port: free_port() }, Node { name: "c", port: free_port() });
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
    use dd_coop::wire::{PeerRequest, PeerStatus};
    let v = vm(1);
    let b = Node { name: "b", port: free_port() };
    let db = start_node(&b, &[], &v, 1024);
    let mut silent: Vec<std::net::TcpStream> = (0..150).map(|_| peer_conn(b.port)).collect();
    // A peer that says HELLO is served although 150 silent connections came first.
    let mut s = peer_conn(b.port);
    let hello = PeerRequest::Hello { name: "m", epoch: 5, secret: SECRET.as_bytes() };
    let (st, _) = peer_call(&mut s, &hello).expect("a HELLO answer past 150 silent connections");
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
