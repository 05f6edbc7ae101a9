//! Co-operative de-duplication between daemons (thesis 004, chapter 5; SPEC section 9): the peer
//! listener, the peer client, the remotifier and the summary publisher.
//!
//! * **Peer listener** (`coop.listen`, tokio): a peer names itself and its restart epoch in HELLO and
//!   proves the name with its own key (`dd_coop::identity`: a signed challenge, checked against the
//!   public key the membership lists for that name; names outside it are refused). Then it pushes
//!   summaries, asks for remote compares (this daemon pins an equal frame for it, Algorithm 4), fetches
//!   its pinned pages and unpins them. Pin handles are random 64-bit numbers, looked up only among the
//!   pins of the authenticated name they were granted to.
//! * **Remotifier** (thread `dd-coop`): the engine offers evicted pages that no local page shares
//!   (`dd_engine::remote`); for each, peers whose summary may contain the page's hash are asked, in
//!   membership order, for a remote compare, until `coop.max_holders` of them pinned an equal frame;
//!   the pins are installed in the engine as the entry's remote reference (every holder, in the order
//!   they answered), or the offer is abandoned when none did (Algorithm 3). Released remote
//!   references are unpinned on every holder here too (best effort, batched).
//! * **Remotified get** ([`Coop::fetch`], on the connection's thread): fetch the pin from its holders
//!   in turn, each with the request timeout, and accept the bytes only if that peer still has the epoch
//!   the pin was granted in and the bytes hash to the recorded content hash. A dead, restarted or
//!   backing-off holder, or one that no longer has the pin, passes the get to the next; when none
//!   answers it is a miss.
//! * **Publisher** (tokio task): every `publish_interval_ms` (or on `POST /v1/host/coop/publish`) the
//!   summary is rebuilt from the content index's live frames and pushed to every peer; the same tick
//!   releases pins of peers not heard from for `pin_ttl_ms` and refreshes etcd membership.
//!
//! **Pins never leak forever**: a peer's pins are released when it authenticates with another epoch
//! (it restarted and lost every reference), when it has not been heard from for `pin_ttl_ms`, and when
//! it unpins them. **Dead references are forgotten**: when a peer turns out to have restarted (a new
//! epoch at connect), or has been unreachable for `pin_ttl_ms` (it has released our pins), the engine's
//! records pointing at it are dropped, so `remote_pages` counts only references that can still hit.
//! Peer failures are logged, at most once per peer every [`LOG_EVERY`]. **Never wrong data, never a hang**: every peer request is bounded by the connect and
//! request timeouts, a peer that failed is skipped for `peer_backoff_ms`, and fetched bytes are checked
//! against the epoch and the content hash.
//!
//! The decisions (which peers to ask, back-off, the unpins to retry, the accept rule of a remotified
//! get, when references to a restarted or silent peer are dead, the pin table held for peers) are `dd_coop::peers` and `dd_coop::pins`, unit-tested there over
//! a fake network; this module holds their state behind its locks, implements their
//! [`PeerTransport`] over the pooled connections, and makes the engine calls.
//!
//! Locks: `peers`, each peer's connection pool and summary, `owners` and the job queue are leaves; none
//! is held across network I/O or an engine call, and no engine lock is ever held while waiting for a
//! peer (the engine only pushes to the job queue).

use crate::config::{CoopConfig, Membership};
use crate::coop_types::{CoopHandle, CoopReport};
use crate::state::ServerState;
use dd_coop::identity::{NodeKey, PublicKey, NONCE_LEN};
use dd_coop::peers::{self, Backoff, Forget, Granted, Liveness, SearchOutcome, UnpinQueue};
use dd_coop::pins::PinTable;
use dd_coop::transport::{PeerTransport, TransportError};
use dd_coop::wire::{self, PeerRequest};
use dd_coop::BloomFilter;
use dd_engine::{Evicted, Holder, RemoteRef, RemoteSink, MAX_HOLDERS};
use parking_lot::{Condvar, Mutex, RwLock};
use rand::{RngCore, SeedableRng};
use std::collections::{HashMap, VecDeque};
use std::io::Write;
use std::net::ToSocketAddrs;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

mod client;
mod listener;
mod report;
mod slots;

pub use client::SecureStream;
pub use listener::serve_peer;
pub use report::CoopStats;
pub use slots::PeerSlots;

enum Job {
    Remotify(Evicted),
    Unpin(RemoteRef),
}

/// The hand-off between the engine and the remotifier thread (the engine's [`RemoteSink`]). Pushing
/// never waits for anything but the queue's own short lock.
#[derive(Debug)]
pub struct JobQueue {
    jobs: Mutex<VecDeque<JobBox>>,
    cv: Condvar,
    pages: AtomicUsize,
    cap: usize,
    closed: AtomicBool,
    stats: Arc<CoopStats>,
}

struct JobBox(Job);
impl std::fmt::Debug for JobBox {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Job")
    }
}

impl RemoteSink for JobQueue {
    fn offer(&self, page: Evicted) -> bool {
        if self.closed.load(Ordering::Relaxed) || self.pages.load(Ordering::Relaxed) >= self.cap {
            self.stats.dropped.fetch_add(1, Ordering::Relaxed);
            return false;
        }
        self.pages.fetch_add(1, Ordering::Relaxed);
        self.stats.offered.fetch_add(1, Ordering::Relaxed);
        self.jobs.lock().push_back(JobBox(Job::Remotify(page)));
        self.cv.notify_one();
        true
    }

    fn release(&self, r: RemoteRef) {
        self.jobs.lock().push_back(JobBox(Job::Unpin(r)));
        self.cv.notify_one();
    }
}

impl Peer {
    /// Closes the idle sessions (their state is unknown, or the address changed).
    fn drop_idle(&self) {
        let mut pool = self.conns.lock();
        pool.open -= pool.idle.len();
        pool.idle.clear();
    }
}

struct Summary {
    filter: BloomFilter,
    received: Instant,
}

struct Peer {
    name: String,
    addr: RwLock<String>,
    active: AtomicBool,
    /// Its sessions (`client`: at most `coop.max_sessions_per_peer` open), and the signal that one
    /// was given back.
    conns: Mutex<client::Pool>,
    returned: Condvar,
    summary: RwLock<Option<Summary>>,
    /// Skipped after a failure (`dd_coop::peers::Backoff`: the rule; here its lock).
    backoff: Mutex<Backoff>,
    /// Its epoch at the last connect and its last successful request (`dd_coop::peers::Liveness`:
    /// when references to it are dead).
    liveness: Mutex<Liveness>,
    /// The last failure logged, with the failures since.
    log: Mutex<(Option<Instant>, u64)>,
}

/// Why a connect or an exchange with a peer failed, in detail for the log; `transport_error` gives
/// the [`TransportError`] the decisions see (all of them end in a miss or a plain eviction).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PeerError {
    #[error("peer i/o: {0}")]
    Io(#[from] std::io::Error),
    #[error("peer answered status {0}")]
    Status(u16),
    #[error("peer wire: {0}")]
    Wire(#[from] wire::WireError),
    #[error("peer address {0} does not resolve")]
    Address(String),
    #[error("peer did not prove its name with the key the membership lists for it")]
    Identity,
    #[error("peer channel: {0}")]
    Channel(#[from] dd_coop::channel::ChannelError),
}

pub struct Coop {
    cfg: CoopConfig,
    me: String,
    key: NodeKey,
    /// The membership: every other node's name and public key (fixed at start).
    members: HashMap<String, PublicKey>,
    /// Draws pin handles and handshake nonces (seeded from the OS generator).
    rng: Mutex<rand::rngs::StdRng>,
    epoch: u64,
    page_size: usize,
    peers: RwLock<Vec<Arc<Peer>>>,
    /// The IP addresses of the live peers' `addr`s: connections from them get handshake slots of
    /// their own (`slots`).
    member_ips: RwLock<std::collections::HashSet<std::net::IpAddr>>,
    /// The pins this daemon holds for its peers (`dd_coop::pins`: the rules; here only the lock).
    owners: Mutex<PinTable>,
    /// Unpins that failed on the network, by (peer, epoch): sent again at every publication, so a pin
    /// held by a peer that was unreachable for a while is released once it is back (a restarted peer
    /// has dropped them itself: another epoch answers `EpochChanged` and they are forgotten).
    retry_unpins: Mutex<UnpinQueue>,
    queue: Arc<JobQueue>,
    pub stats: Arc<CoopStats>,
    state: Weak<ServerState>,
}

/// How the rest of the daemon reaches the layer (`coop_types`): Coop's own methods of the same names.
impl CoopHandle for Coop {
    fn fetch(&self, r: &RemoteRef, out: &mut [u8]) -> bool {
        Coop::fetch(self, r, out)
    }
    fn release(&self, r: RemoteRef) {
        Coop::release(self, r)
    }
    fn report(&self) -> CoopReport {
        Coop::report(self)
    }
    fn publish(&self) -> usize {
        Coop::publish(self)
    }
    fn close(&self) {
        Coop::close(self)
    }
}

impl std::fmt::Debug for Coop {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Coop").field("me", &self.me).field("epoch", &self.epoch).finish_non_exhaustive()
    }
}

/// A peer's failures are logged at most this often (the counters have every one).
pub const LOG_EVERY: Duration = Duration::from_secs(10);

/// Reads this daemon's key, or creates it (mode 0600) when the file does not exist.
pub fn load_or_create_key(path: &std::path::Path) -> Result<NodeKey, crate::ServerError> {
    let bad = |reason: String| crate::ServerError::Config { field: "coop.key_file".into(), reason };
    match std::fs::read_to_string(path) {
        Ok(text) => {
            dd_coop::identity::parse_secret(&text).map_err(|e| bad(format!("{}: {e}", path.display())))
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let mut seed = [0u8; 32];
            rand::rngs::OsRng.fill_bytes(&mut seed);
            let key = NodeKey::from_seed(seed);
            use std::os::unix::fs::OpenOptionsExt;
            let mut f = std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(path)
                .map_err(|e| crate::ServerError::Io(format!("creating {}: {e}", path.display())))?;
            f.write_all(key.secret_text().as_bytes())
                .map_err(|e| crate::ServerError::Io(format!("writing {}: {e}", path.display())))?;
            tracing::info!("created the peer key {} (public key {})", path.display(), key.public_text());
            Ok(key)
        }
        Err(e) => Err(crate::ServerError::Io(format!("reading {}: {e}", path.display()))),
    }
}

impl Coop {
    /// Builds the co-operative layer, installs its queue as the engine's remote sink and starts the
    /// remotifier thread. The listener and the publisher are started by [`crate::run`].
    pub fn start(
        state: &Arc<ServerState>,
        cfg: CoopConfig,
        me: String,
        key: NodeKey,
    ) -> Result<Arc<Coop>, crate::ServerError> {
        let mut members = HashMap::new();
        for (i, p) in cfg.peers.iter().enumerate() {
            let k =
                dd_coop::identity::parse_public(&p.public_key).map_err(|e| crate::ServerError::Config {
                    field: format!("coop.peers[{i}].public_key"),
                    reason: e.to_string(),
                })?;
            members.insert(p.name.clone(), k);
        }
        let stats = Arc::new(CoopStats::default());
        let queue = Arc::new(JobQueue {
            jobs: Mutex::new(VecDeque::new()),
            cv: Condvar::new(),
            pages: AtomicUsize::new(0),
            cap: cfg.remotify_queue_pages,
            closed: AtomicBool::new(false),
            stats: stats.clone(),
        });
        // A restart epoch that a restarted daemon cannot repeat by accident.
        let epoch = {
            use rand::RngCore;
            rand::rngs::OsRng.next_u64() | 1
        };
        let coop = Arc::new(Coop {
            me,
            key,
            members,
            rng: Mutex::new(rand::rngs::StdRng::from_rng(rand::rngs::OsRng).expect("the OS generator")),
            epoch,
            page_size: state.cache.page_size(),
            peers: RwLock::new(Vec::new()),
            member_ips: RwLock::new(Default::default()),
            owners: Mutex::new(PinTable::new()),
            retry_unpins: Mutex::new(UnpinQueue::new()),
            queue: queue.clone(),
            stats,
            state: Arc::downgrade(state),
            cfg,
        });
        if coop.cfg.membership == Membership::Static {
            let list: Vec<(String, String)> =
                coop.cfg.peers.iter().map(|p| (p.name.clone(), p.addr.clone())).collect();
            coop.set_membership(&list);
        }
        state.cache.set_coop_group(Some(state.dedup_group_id(&coop.cfg.dedup_group)));
        if !state.cache.set_remote_sink(queue) {
            return Err(crate::ServerError::Config {
                field: "coop.enabled".into(),
                reason: "the engine refused the remotifier (engine.mem.dedup off?)".into(),
            });
        }
        let weak = Arc::downgrade(&coop);
        std::thread::Builder::new()
            .name("dd-coop".into())
            .spawn(move || remotifier_loop(weak))
            .map_err(|e| crate::ServerError::Io(format!("spawning the remotifier: {e}")))?;
        Ok(coop)
    }

    pub fn node_name(&self) -> &str {
        &self.me
    }

    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// This daemon's public key (what the other members list for it).
    pub fn public_key(&self) -> String {
        self.key.public_text()
    }

    /// Replaces the live peers (static list or etcd): peers not listed become inactive (their index
    /// stays, so remote references to them stay decodable and simply miss), new ones are appended.
    /// Names without a key in the membership are ignored: etcd cannot add a member.
    pub fn set_membership(&self, list: &[(String, String)]) {
        let list: Vec<&(String, String)> = list
            .iter()
            .filter(|(n, _)| {
                let member = *n == self.me || self.members.contains_key(n);
                if !member {
                    tracing::debug!("peer list names {n:?}, which is not in coop.peers: ignored");
                }
                member
            })
            .collect();
        // Resolved before the lock (a name may take a DNS lookup); an address that does not resolve
        // gets no reserved slots until the next refresh.
        let ips = list
            .iter()
            .filter(|(n, _)| *n != self.me)
            .filter_map(|(_, a)| a.to_socket_addrs().ok()?.next())
            .map(|a| a.ip().to_canonical())
            .collect();
        *self.member_ips.write() = ips;
        let mut peers = self.peers.write();
        for p in peers.iter() {
            p.active.store(list.iter().any(|(n, _)| *n == p.name), Ordering::Relaxed);
        }
        for (name, addr) in list {
            if *name == self.me {
                continue;
            }
            match peers.iter().find(|p| p.name == *name) {
                Some(p) => {
                    let mut a = p.addr.write();
                    if *a != *addr {
                        *a = addr.clone();
                        p.drop_idle();
                    }
                    p.active.store(true, Ordering::Relaxed);
                }
                None => peers.push(Arc::new(Peer {
                    name: name.clone(),
                    addr: RwLock::new(addr.clone()),
                    active: AtomicBool::new(true),
                    conns: Mutex::new(client::Pool::default()),
                    returned: Condvar::new(),
                    summary: RwLock::new(None),
                    backoff: Mutex::new(Backoff::default()),
                    liveness: Mutex::new(Liveness::new(Instant::now())),
                    log: Mutex::new((None, 0)),
                })),
            }
        }
    }

    /// Whether a connection from `ip` comes from a live peer's address (`slots`).
    pub fn is_member_address(&self, ip: std::net::IpAddr) -> bool {
        self.member_ips.read().contains(&ip.to_canonical())
    }

    fn peer(&self, idx: u32) -> Option<Arc<Peer>> {
        self.peers.read().get(idx as usize).cloned()
    }

    fn timeout(&self) -> Duration {
        Duration::from_millis(self.cfg.request_timeout_ms)
    }

    // ------------------------------------------------------------------------------------------
    // Client side (blocking std sockets with deadlines; called on the remotifier thread, on
    // connection threads inside `block_in_place`, and on the blocking pool)
    // ------------------------------------------------------------------------------------------

    fn nonce(&self) -> [u8; NONCE_LEN] {
        let mut n = [0u8; NONCE_LEN];
        self.rng.lock().fill_bytes(&mut n);
        n
    }

    /// A connect reached `peer` in `epoch`: if it ran in another epoch before, it restarted and every
    /// pin it granted is gone, so the engine's references to it in older epochs are dropped.
    fn saw_epoch(&self, peer: &Peer, epoch: u64) {
        let forget = peer.liveness.lock().connected(epoch);
        if forget != Forget::Nothing {
            tracing::info!("peer {} restarted (new epoch): forgetting references to its old pins", peer.name);
            self.forget_references(peer, |e| forget.is_dead(e));
        }
    }

    /// Drops the engine's remote references to `peer` whose pin epoch `dead` says is gone (a page
    /// other peers hold too keeps its record, naming them).
    fn forget_references(&self, peer: &Peer, dead: impl Fn(u64) -> bool) {
        let Some(idx) = self.peers.read().iter().position(|p| std::ptr::eq(&**p, peer)) else { return };
        let idx = idx as u32;
        let Some(state) = self.state.upgrade() else { return };
        let n = state.cache.drop_dead_remote(&|h: &Holder| h.peer == idx && dead(h.epoch));
        self.stats.references_dropped.fetch_add(n, Ordering::Relaxed);
        // Unpins waiting for those pins would go to a peer that no longer has them.
        self.retry_unpins.lock().forget(idx, dead);
    }

    /// One request to a peer over a pooled connection, behind the back-off gate of
    /// `dd_coop::peers` (`Backoff::check`, then `Backoff::record` of a failure: the rule the tests'
    /// fake network uses too). With `epoch`, fails with [`TransportError::EpochChanged`] unless the
    /// peer still runs in that epoch.
    fn request(
        &self,
        peer: &Peer,
        req: &PeerRequest<'_>,
        epoch: Option<u64>,
    ) -> Result<(u64, Vec<u8>), TransportError> {
        peer.backoff.lock().check(Instant::now())?;
        let (mut conn, reused) = match self.checkout(peer) {
            Ok(c) => c,
            Err(e) => return Err(self.failed(peer, &e)),
        };
        if epoch.is_some_and(|e| e != conn.epoch) {
            self.pool(peer, conn);
            return Err(TransportError::EpochChanged);
        }
        let mut result = self.exchange(&mut conn, req);
        // A reused session closed under the request (the peer's idle timeout or restart, a cut path)
        // says nothing about the peer: the request goes again, once, on a new session (the other idle
        // ones are as old, so they go too). Every request tolerates being sent twice (`transport`).
        if reused && result.as_ref().is_err_and(|e| transport_error(e) == TransportError::Closed) {
            drop(conn);
            self.closed(peer);
            peer.drop_idle();
            conn = match self.checkout(peer) {
                Ok((c, _)) => c,
                Err(e) => return Err(self.failed(peer, &e)),
            };
            if epoch.is_some_and(|e| e != conn.epoch) {
                self.pool(peer, conn);
                return Err(TransportError::EpochChanged);
            }
            result = self.exchange(&mut conn, req);
        }
        match result {
            Ok((_, payload)) => {
                let e = conn.epoch;
                peer.liveness.lock().answered(Instant::now());
                self.pool(peer, conn);
                Ok((e, payload))
            }
            Err(e) => {
                let te = self.failed(peer, &e);
                if !peers::starts_backoff(&te) {
                    // An answer about this one request leaves the connection in step: keep it.
                    self.pool(peer, conn);
                } else {
                    drop(conn);
                    self.closed(peer);
                }
                Err(te)
            }
        }
    }

    /// A request to `peer` failed with `e`: the back-off starts now if `dd_coop::peers::starts_backoff`
    /// says so (then the peer's connections, whose state is unknown since a late response may still
    /// arrive, are dropped and the failure counted and logged).
    fn failed(&self, peer: &Peer, e: &PeerError) -> TransportError {
        let te = transport_error(e);
        let backoff = Duration::from_millis(self.cfg.peer_backoff_ms);
        if peer.backoff.lock().record(&te, Instant::now(), backoff) {
            self.mark_down(peer, e);
        }
        te
    }

    fn mark_down(&self, peer: &Peer, e: &PeerError) {
        peer.drop_idle();
        self.stats.peer_failures.fetch_add(1, Ordering::Relaxed);
        // Logged, but at most once per peer every LOG_EVERY (a dead peer fails every request).
        let mut log = peer.log.lock();
        log.1 += 1;
        if log.0.is_none_or(|t| t.elapsed() >= LOG_EVERY) {
            let addr = peer.addr.read().clone();
            tracing::warn!(
                "peer {} ({addr}) failed: {e}; skipped for {} ms ({} failures since the last report)",
                peer.name,
                self.cfg.peer_backoff_ms,
                log.1
            );
            *log = (Some(Instant::now()), 0);
        }
    }

    /// A remotified get: the page's bytes from the first of its holders that has them into `out`, or
    /// false (a clean miss) if every holder is unreachable, restarted, no longer holds the pin or
    /// returns other bytes.
    pub fn fetch(&self, r: &RemoteRef, out: &mut [u8]) -> bool {
        let t = Instant::now();
        let hit = self.fetch_inner(r, out);
        if hit {
            self.stats.fetch_us.lock().record(t.elapsed());
        }
        let c = if hit { &self.stats.remote_gets_hit } else { &self.stats.remote_gets_missed };
        c.fetch_add(1, Ordering::Relaxed);
        hit
    }

    fn fetch_inner(&self, r: &RemoteRef, out: &mut [u8]) -> bool {
        let holders: Vec<Granted> = r.holders().iter().map(granted).collect();
        peers::fetch(self, &holders, r.hash, out, self.page_size)
    }

    /// Releases a remote reference's pin after an exclusive remotified get (queued, best effort).
    pub fn release(&self, r: RemoteRef) {
        self.queue.release(r);
    }

    /// Algorithm 3 for one evicted page: ask candidate peers until `max_holders` pinned it, install
    /// every pin as the page's remote reference.
    fn remotify(&self, state: &ServerState, page: Evicted) {
        let t = Instant::now();
        let candidates: Vec<u32> = {
            let ttl = Duration::from_millis(self.cfg.pin_ttl_ms);
            let now = Instant::now();
            self.peers
                .read()
                .iter()
                .enumerate()
                .filter(|(_, p)| {
                    let summary = p.summary.read();
                    let summary = summary.as_ref().map(|s| (&s.filter, s.received));
                    peers::is_candidate(p.active.load(Ordering::Relaxed), summary, page.hash, now, ttl)
                })
                .map(|(i, _)| i as u32)
                .collect()
        };
        let want = self.cfg.max_holders.clamp(1, MAX_HOLDERS);
        let (outcome, mismatches) =
            peers::ask_holders(self, candidates, want, page.hash, &page.data, self.page_size);
        self.stats.compare_mismatches.fetch_add(mismatches, Ordering::Relaxed);
        match outcome {
            SearchOutcome::Pinned(holders) => {
                let mut r = RemoteRef::new(holder(&holders[0]), page.hash);
                for h in &holders[1..] {
                    r.push(holder(h));
                }
                if state.cache.install_remote(page.vm, page.pool, page.key, page.token, r) {
                    self.stats.remotified.fetch_add(1, Ordering::Relaxed);
                    self.stats.remotify_us.lock().record(t.elapsed());
                } else {
                    self.stats.stale_installs.fetch_add(1, Ordering::Relaxed);
                    for h in &holders {
                        self.unpin_now(h.peer, h.epoch, vec![h.pin]);
                    }
                }
                return;
            }
            SearchOutcome::NoCandidate => {
                self.stats.no_candidate.fetch_add(1, Ordering::Relaxed);
            }
            SearchOutcome::Abandoned { errors: true } => {
                self.stats.remotify_errors.fetch_add(1, Ordering::Relaxed);
            }
            // Every candidate answered without an equal frame (a mismatch is counted on its own).
            _ => {}
        }
        state.cache.abandon_remote(page.vm, page.pool, page.key, page.token);
    }

    fn unpin_now(&self, idx: u32, epoch: u64, pins: Vec<u64>) {
        if self.peer(idx).is_none() {
            return;
        }
        let sent = peers::unpin(self, idx, epoch, &pins, |chunk, result| {
            self.retry_unpins.lock().sent(idx, epoch, chunk, result)
        });
        self.stats.unpins_sent.fetch_add(sent, Ordering::Relaxed);
    }

    /// Sends the unpins that failed before (see `retry_unpins`).
    fn retry_failed_unpins(&self) {
        let pending = self.retry_unpins.lock().take();
        for ((idx, epoch), pins) in pending {
            self.unpin_now(idx, epoch, pins);
        }
    }

    /// Rebuilds the summary from the live frames and pushes it to every active peer. Returns the peers
    /// reached. Also releases the pins of peers not heard from for `pin_ttl_ms`.
    pub fn publish(&self) -> usize {
        self.expire_owners();
        self.expire_references();
        let Some(state) = self.state.upgrade() else { return 0 };
        let mut filter = match BloomFilter::new(self.cfg.bloom) {
            Ok(f) => f,
            Err(_) => return 0,
        };
        for h in state.cache.content_hashes() {
            filter.insert(h);
        }
        let bits = filter.summary();
        let req = PeerRequest::Summary {
            m_bits: self.cfg.bloom.m_bits,
            k_hashes: self.cfg.bloom.k_hashes,
            bits: &bits,
        };
        let peers: Vec<Arc<Peer>> =
            self.peers.read().iter().filter(|p| p.active.load(Ordering::Relaxed)).cloned().collect();
        let mut reached = 0;
        for p in peers {
            // A publication is also the heartbeat that ends a back-off early if the peer is back.
            p.backoff.lock().clear();
            if self.request(&p, &req, None).is_ok() {
                reached += 1;
                self.stats.summaries_sent.fetch_add(1, Ordering::Relaxed);
            }
        }
        self.retry_failed_unpins();
        reached
    }

    /// A peer unreachable for `pin_ttl_ms` has released the pins it held for us (it has not heard from
    /// us either): the references to it are forgotten.
    fn expire_references(&self) {
        let ttl = Duration::from_millis(self.cfg.pin_ttl_ms);
        let peers: Vec<Arc<Peer>> = self.peers.read().clone();
        for p in peers {
            let forget = p.liveness.lock().expire(Instant::now(), ttl);
            if forget != Forget::Nothing {
                tracing::info!(
                    "peer {} unreachable for {} ms: forgetting references to it",
                    p.name,
                    ttl.as_millis()
                );
                self.forget_references(&p, |e| forget.is_dead(e));
            }
        }
    }

    /// Stops the remotifier (shutdown). Queued offers are abandoned by the engine's drop.
    pub fn close(&self) {
        self.queue.closed.store(true, Ordering::Relaxed);
        self.queue.cv.notify_all();
    }
}

/// The engine's holder as the decisions see it.
fn granted(h: &Holder) -> Granted {
    Granted { peer: h.peer, epoch: h.epoch, pin: h.pin }
}

fn holder(g: &Granted) -> Holder {
    Holder { peer: g.peer, epoch: g.epoch, pin: g.pin }
}

/// The decisions of `dd_coop::peers` reach the peers through the pooled connections.
impl PeerTransport for Coop {
    fn request(
        &self,
        peer: u32,
        req: &PeerRequest<'_>,
        epoch: Option<u64>,
    ) -> Result<(u64, Vec<u8>), TransportError> {
        let Some(p) = self.peer(peer) else { return Err(TransportError::Other("no such peer".into())) };
        Coop::request(self, &p, req, epoch)
    }
}

/// The transport's view of a failure (what `dd_coop::peers` decides on).
fn transport_error(e: &PeerError) -> TransportError {
    match e {
        PeerError::Status(s) => TransportError::Status(*s),
        PeerError::Io(e) => match e.kind() {
            std::io::ErrorKind::TimedOut | std::io::ErrorKind::WouldBlock => TransportError::Timeout,
            std::io::ErrorKind::ConnectionRefused => TransportError::Refused,
            std::io::ErrorKind::UnexpectedEof
            | std::io::ErrorKind::ConnectionReset
            | std::io::ErrorKind::ConnectionAborted
            | std::io::ErrorKind::BrokenPipe => TransportError::Closed,
            _ => TransportError::Other(e.to_string()),
        },
        e => TransportError::Other(e.to_string()),
    }
}

fn remotifier_loop(weak: Weak<Coop>) {
    loop {
        let Some(coop) = weak.upgrade() else { return };
        let q = coop.queue.clone();
        let mut batch = Vec::new();
        {
            let mut jobs = q.jobs.lock();
            while jobs.is_empty() {
                if q.closed.load(Ordering::Relaxed) {
                    return;
                }
                // Wake periodically so the thread notices when the daemon (and `coop`) goes away.
                if q.cv.wait_for(&mut jobs, Duration::from_millis(200)).timed_out() && jobs.is_empty() {
                    break;
                }
            }
            while let Some(j) = jobs.pop_front() {
                batch.push(j.0);
                if batch.len() >= 256 {
                    break;
                }
            }
        }
        if q.closed.load(Ordering::Relaxed) {
            return;
        }
        let Some(state) = coop.state.upgrade() else { return };
        // Unpins are grouped per peer and epoch (one request each); remotifications go one by one.
        let mut released = Vec::new();
        for job in batch {
            match job {
                Job::Remotify(page) => {
                    coop.remotify(&state, page);
                    q.pages.fetch_sub(1, Ordering::Relaxed);
                }
                Job::Unpin(r) => released.extend(r.holders().iter().map(granted)),
            }
        }
        for ((idx, epoch), pins) in peers::group_unpins(released) {
            coop.unpin_now(idx, epoch, pins);
        }
    }
}
