//! Harness of the co-operative de-duplication tests: nodes with their own keys, daemons on static or
//! etcd membership, the peer protocol spoken by hand, and waits on the daemons' counters.
#![allow(dead_code)]

use crate::common::{page, Daemon, TestVm, HOST_TOKEN};
use dd_coop::identity::NodeKey;
use dd_engine::{Key, PoolId, PoolOptions, Spec};
use dd_server::coop::SecureStream;
use std::time::{Duration, Instant};

/// Test daemons' memory: 256 pages, evicted 16 at a time.
pub const MEM_PAGES: u64 = 256;

/// A free loopback port (bound, read and released; the daemon binds it right after).
pub fn free_port() -> u16 {
    dd_daemonkit::free_port().unwrap()
}

/// A daemon-to-be: its name, peer-listener port and its own key (in a file of its own).
pub struct Node {
    pub name: &'static str,
    pub port: u16,
    pub key: NodeKey,
    pub key_file: std::path::PathBuf,
    _keys: tempfile::TempDir,
}

/// A node with a key derived from its name (deterministic, distinct per name).
pub fn node(name: &'static str) -> Node {
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

/// `n` as reached at another port (a relay in front of it): its name and key, `port`.
pub fn via(n: &Node, port: u16) -> Node {
    let key = dd_coop::identity::parse_secret(&n.key.secret_text()).unwrap();
    Node { name: n.name, port, key, key_file: n.key_file.clone(), _keys: tempfile::tempdir().unwrap() }
}

/// `peers = [...]`: each node's name, address and public key.
pub fn peers_toml(peers: &[&Node]) -> String {
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

pub fn start_node(me: &Node, peers: &[&Node], v: &TestVm, mem_pages: u64) -> Daemon {
    start_node_in(me, peers, v, mem_pages, "peers")
}

/// [`start_node`] with the VM in de-dup group `group` ("": its own domain, the default).
pub fn start_node_in(me: &Node, peers: &[&Node], v: &TestVm, mem_pages: u64, group: &str) -> Daemon {
    start_node_as(me, peers, v, mem_pages, group, false, "")
}

/// [`start_node`] with `coop` settings of its own (lines of the `[coop]` table).
pub fn start_node_with(me: &Node, peers: &[&Node], v: &TestVm, mem_pages: u64, coop: &str) -> Daemon {
    start_node_as(me, peers, v, mem_pages, "peers", false, coop)
}

/// [`start_node`] with the daemon's log kept (`Daemon::log`).
pub fn start_node_logged(me: &Node, peers: &[&Node], v: &TestVm, mem_pages: u64) -> Daemon {
    start_node_as(me, peers, v, mem_pages, "peers", true, "")
}

fn start_node_as(
    me: &Node,
    peers: &[&Node],
    v: &TestVm,
    mem_pages: u64,
    group: &str,
    logged: bool,
    coop: &str,
) -> Daemon {
    // One shard per pool: these tests count the pages evicted (and so remotified) in their pool's exact
    // FIFO order, which a sharded pool only approximates (docs/decisions.md D33).
    let mut extra = format!(
        "[engine]\neviction_batch_bytes = 65536\npool_shards = 1\n[coop]\nenabled = true\nlisten = \"127.0.0.1:{}\"\n\
         node_name = {:?}\ndedup_group = \"peers\"\nkey_file = {:?}\npublish_interval_ms = 3600000\nrequest_timeout_ms = 5000\n\
         connect_timeout_ms = 5000\npeer_backoff_ms = 500\n",
        me.port,
        me.name,
        me.key_file.display().to_string()
    );
    extra.push_str(coop);
    extra.push_str(&peers_toml(peers));
    extra.push_str("[coop.bloom]\nm_bits = 1048576\nk_hashes = 7\n");
    let mem = format!("capacity_bytes = {}\ndedup = true\n", mem_pages * 4096);
    // The VM's pages are shared with peers only when it is in the co-operative group.
    let v = TestVm { dedup_group: group.into(), ..v.clone() };
    if logged {
        Daemon::start_logged(&[&v], "ssd_enabled = false\n", &mem, &extra)
    } else {
        Daemon::start_with(&[&v], "ssd_enabled = false\n", &mem, &extra)
    }
}

pub fn coop(d: &Daemon) -> serde_json::Value {
    let (s, v) = d.http("GET", "/v1/host/coop", Some(HOST_TOKEN), None);
    assert_eq!(s, 200, "{v}");
    v
}

pub fn n(v: &serde_json::Value, field: &str) -> u64 {
    v[field].as_u64().unwrap_or_else(|| panic!("{field} missing in {v}"))
}

pub fn publish(d: &Daemon, peers: u64) {
    let (s, v) = d.http("POST", "/v1/host/coop/publish", Some(HOST_TOKEN), None);
    assert_eq!(s, 200, "{v}");
    assert_eq!(n(&v, "peers_reached"), peers, "every peer took the summary");
}

/// Waits until the daemon's remotifier has handled every offer (a bound on waiting, not a timing
/// assertion).
pub fn settle(d: &Daemon) -> serde_json::Value {
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

pub fn host_stats(d: &Daemon) -> serde_json::Value {
    let (s, v) = d.http("GET", "/v1/stats", Some(HOST_TOKEN), None);
    assert_eq!(s, 200);
    v
}

pub fn put_file(c: &mut dd_client::Client, pool: PoolId, seed: u64, object: u64, pages: u64) {
    for i in 0..pages {
        c.put(pool, Key::new(object, i), &page(seed, object, i)).unwrap();
    }
}

pub fn pool(c: &mut dd_client::Client) -> PoolId {
    c.create_cgroup(PoolOptions::ephemeral(Spec::Mem { weight: 100 })).unwrap()
}

/// Gets every page of a file: (hits, misses); panics on any wrong byte.
pub fn get_file(c: &mut dd_client::Client, pool: PoolId, seed: u64, object: u64, pages: u64) -> (u64, u64) {
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

pub fn pins_held(d: &Daemon) -> u64 {
    n(&host_stats(d), "pins_held")
}

pub fn wait_pins(d: &Daemon, want: u64) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while pins_held(d) != want {
        assert!(Instant::now() < deadline, "pins held {} never reached {want}", pins_held(d));
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Remotifies `pages` pages of file 1 from C to B; returns (B, C, clients and pools).
pub fn remotified_pair(
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

pub fn signal(d: &Daemon, sig: libc::c_int) {
    let pid = d.child.as_ref().expect("running").id() as libc::pid_t;
    // SAFETY: kill(2) on the pid of a child this test spawned and has not reaped.
    assert_eq!(unsafe { libc::kill(pid, sig) }, 0);
}

/// Waits until every thread of a SIGSTOPped daemon is stopped (the signal is delivered asynchronously:
/// a thread running on another core may finish a request first).
pub fn wait_stopped(d: &Daemon) {
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

/// A private etcd on loopback ports (killed and waited for on drop).
pub struct EtcdServer {
    pub child: std::process::Child,
    _dir: tempfile::TempDir,
    pub url: String,
}

impl EtcdServer {
    pub fn start() -> EtcdServer {
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
pub fn start_etcd_node(
    me: &Node,
    members: &[&Node],
    etcd: &EtcdServer,
    v: &TestVm,
    mem_pages: u64,
) -> Daemon {
    let mut members_toml = String::from("peers = [");
    for p in members {
        members_toml.push_str(&format!(
            "{{ name = {:?}, public_key = {:?} }}, ",
            p.name,
            p.key.public_text()
        ));
    }
    members_toml.push_str("]\n");
    // One shard per pool, as in `start_node_as`: exact eviction order.
    let extra = format!(
        "[engine]\neviction_batch_bytes = 65536\npool_shards = 1\n[coop]\nenabled = true\nlisten = \"127.0.0.1:{}\"\n\
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

pub fn peer_active(d: &Daemon, name: &str) -> bool {
    coop(d)["peers"].as_array().unwrap().iter().any(|p| p["name"] == name && p["active"] == true)
}

pub fn wait_for(what: &str, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Milliseconds left of `d`'s back-off on peer `name` (the admin report's `backoff_ms`).
pub fn peer_backoff_ms(d: &Daemon, name: &str) -> u64 {
    let c = coop(d);
    let peer = c["peers"].as_array().unwrap().iter().find(|p| p["name"] == name);
    n(peer.unwrap_or_else(|| panic!("no peer {name} in {c}")), "backoff_ms")
}

/// Runs `f` on a thread of its own and waits for it to return, within a generous deadline: for calls
/// that must end on their own (a peer's time-out turning into a miss) but whose duration a loaded
/// machine stretches. The deadline bounds the waiting; it does not time the calls.
pub fn finishes<T: Send + 'static>(what: &str, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    match rx.recv_timeout(Duration::from_secs(120)) {
        Ok(v) => v,
        Err(std::sync::mpsc::RecvTimeoutError::Timeout) => panic!("{what} did not finish within 120 s"),
        Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => panic!("{what} panicked"),
    }
}

/// Speaks the peer protocol by hand, inside the encrypted channel: one request, one response
/// (status, payload); `None` when the connection closed instead.
pub fn peer_call(s: &mut SecureStream, req: &dd_coop::wire::PeerRequest<'_>) -> Option<(u16, Vec<u8>)> {
    let mut buf = Vec::new();
    req.encode(9, &mut buf);
    s.send(&buf, Duration::from_secs(30)).ok()?;
    let (h, payload) = s.read_frame(u32::MAX, Instant::now() + Duration::from_secs(30)).ok()?;
    Some((h.status, payload))
}

/// A connection to a peer listener with its encrypted channel open (no identity yet).
pub fn peer_conn(port: u16) -> SecureStream {
    let s = raw_conn(port);
    SecureStream::over(s, Instant::now() + Duration::from_secs(30)).unwrap()
}

/// A plain TCP connection to a peer listener.
pub fn raw_conn(port: u16) -> std::net::TcpStream {
    let s = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    s
}

/// The peer handshake by hand: HELLO as `name` (epoch `epoch`), then AUTH signed with `key` (which
/// may be another node's) over a transcript holding the channel's hash. Returns the status of the
/// last answer (None: closed without one).
pub fn peer_handshake(s: &mut SecureStream, name: &str, epoch: u64, key: &NodeKey) -> Option<u16> {
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
    let binding = *s.binding();
    let t = Transcript {
        client: name,
        server,
        client_epoch: epoch,
        server_epoch,
        client_nonce: &nonce,
        server_nonce: &theirs,
        binding: &binding,
    };
    let signature = key.sign(Role::Client, &t);
    peer_call(s, &PeerRequest::Auth { signature }).map(|(st, _)| st)
}
