//! Surviving daemon restarts: where the daemon is ([`Endpoint`]), when to try it again ([`Backoff`]:
//! capped exponential back-off with jitter), which instance of it answered ([`Link`]), and a
//! self-healing single connection ([`Session`]) whose pools are bound to the instance that made them
//! ([`PoolRef`]).
//!
//! A daemon restart loses every pool (the engine starts empty) and the daemon draws a new instance id,
//! which HELLO returns (protocol version 2). So a pool is named by its id *and* its instance: a call on a
//! pool of another instance than the connection's fails with [`ClientError::PoolLost`] before anything
//! is sent. That is how a persistent pool's client learns that its pages are gone — never as an ordinary
//! miss, and never by reaching a pool of the new instance that happens to have the same id.
//!
//! Logging (the rules `doubledecker mount` and `guest watch` need, so a restart costs a few log lines,
//! not one per request): a [`Link`] logs once when the daemon becomes unreachable, at most once a minute
//! while it stays so, and once when it answers again (saying whether it is a new instance).
//!
//! Invariants: while the back-off runs, [`Link::connect`] makes no system call and fails at once with
//! [`ClientError::Unavailable`]; the first attempt after a working connection broke is immediate, then
//! the delays double from `initial` up to `max`, each drawn uniformly from its upper half (jitter, so
//! that many guests do not reconnect in step). Locks here are leaves.

use crate::{Client, ClientError, Result};
use dd_types::PoolId;
use rand::{Rng, SeedableRng};
use std::path::PathBuf;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Where the daemon's data plane is and who we are.
#[derive(Clone, PartialEq, Eq)]
pub struct Endpoint {
    /// Unix socket (preferred when both are set).
    pub unix_socket: Option<PathBuf>,
    /// TCP address `host:port`.
    pub tcp: Option<String>,
    /// TLS over the TCP address (`None`: plain TCP; never used for the Unix socket).
    pub tls: Option<crate::TlsClient>,
    pub vm: u32,
    pub token: String,
}

impl std::fmt::Debug for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} (VM {})", self.address(), self.vm)
    }
}

impl Endpoint {
    /// The address as logs show it.
    pub fn address(&self) -> String {
        match (&self.unix_socket, &self.tcp) {
            (Some(p), _) => format!("unix:{}", p.display()),
            (None, Some(a)) if self.tls.is_some() => format!("tls:{a}"),
            (None, Some(a)) => format!("tcp:{a}"),
            (None, None) => "(no address)".into(),
        }
    }

    /// One connection attempt (connect and HELLO).
    pub fn connect(&self) -> Result<Client> {
        match (&self.unix_socket, &self.tcp) {
            (Some(p), _) => Client::connect_unix(p, self.vm, &self.token),
            (None, Some(a)) => match &self.tls {
                Some(tls) => Client::connect_tls(a, tls, self.vm, &self.token),
                None => Client::connect_tcp(a.as_str(), self.vm, &self.token),
            },
            (None, None) => Err(ClientError::InvalidArgument("no daemon address".into())),
        }
    }
}

/// Back-off bounds. Default: 50 ms first, doubling up to 2 s (a restarted local daemon is found again
/// within about 2 s; `docs/decisions.md` D19).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BackoffPolicy {
    pub initial: Duration,
    pub max: Duration,
}

impl Default for BackoffPolicy {
    fn default() -> Self {
        BackoffPolicy { initial: Duration::from_millis(50), max: Duration::from_secs(2) }
    }
}

/// Capped exponential back-off with jitter (pure: time is passed in, the generator is seeded).
#[derive(Debug)]
pub struct Backoff {
    policy: BackoffPolicy,
    failures: u32,
    not_before: Option<Instant>,
    rng: rand::rngs::StdRng,
}

impl Backoff {
    pub fn new(policy: BackoffPolicy, seed: u64) -> Backoff {
        Backoff { policy, failures: 0, not_before: None, rng: rand::rngs::StdRng::seed_from_u64(seed) }
    }

    /// Whether an attempt may be made at `now`.
    pub fn ready(&self, now: Instant) -> bool {
        self.not_before.is_none_or(|t| now >= t)
    }

    /// How long until the next attempt may be made.
    pub fn wait(&self, now: Instant) -> Duration {
        self.not_before.map_or(Duration::ZERO, |t| t.saturating_duration_since(now))
    }

    /// Consecutive failed attempts.
    pub fn failures(&self) -> u32 {
        self.failures
    }

    /// Records a failed attempt at `now`; returns the delay before the next one: `initial x 2^(n-1)`
    /// capped at `max`, drawn from its upper half.
    pub fn failed(&mut self, now: Instant) -> Duration {
        let exp = self.failures.min(20);
        let full = self.policy.initial.saturating_mul(1 << exp).min(self.policy.max);
        let half = full / 2;
        let d = half + Duration::from_nanos(self.rng.gen_range(0..=(full - half).as_nanos() as u64));
        self.failures = self.failures.saturating_add(1);
        self.not_before = Some(now + d);
        d
    }

    /// Records a working connection: the next failure starts over (its first retry is immediate).
    pub fn succeeded(&mut self) {
        self.failures = 0;
        self.not_before = None;
    }

    /// A working connection broke: the next attempt may be made at once.
    pub fn broke(&mut self) {
        self.not_before = None;
    }
}

/// A pool as its client knows it: its id and the daemon instance that made it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub struct PoolRef {
    pub id: PoolId,
    pub instance: u64,
}

/// How long the daemon has been unreachable, for the once-a-minute reminder.
const REMIND_EVERY: Duration = Duration::from_secs(60);

#[derive(Debug)]
struct LinkState {
    backoff: Backoff,
    /// The instance of the last successful HELLO.
    instance: Option<u64>,
    /// Since when the daemon has been unreachable, and when that was last logged.
    down_since: Option<Instant>,
    last_log: Option<Instant>,
}

/// The connection policy shared by every connection to one daemon: back-off, the instance last seen,
/// and the loss/recovery log lines.
#[derive(Debug)]
pub struct Link {
    endpoint: Endpoint,
    /// Who logs (`"doubledecker mount"`, `"guest watch"`).
    who: &'static str,
    state: Mutex<LinkState>,
}

impl Link {
    pub fn new(endpoint: Endpoint, policy: BackoffPolicy, who: &'static str) -> Link {
        // Jitter must differ between processes (that is its point); tests seed `Backoff` themselves.
        let clock = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH);
        let seed = (std::process::id() as u64) << 32 ^ clock.map_or(0, |d| d.as_nanos() as u64);
        Link {
            endpoint,
            who,
            state: Mutex::new(LinkState {
                backoff: Backoff::new(policy, seed),
                instance: None,
                down_since: None,
                last_log: None,
            }),
        }
    }

    pub fn endpoint(&self) -> &Endpoint {
        &self.endpoint
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, LinkState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The instance of the last successful HELLO.
    pub fn instance(&self) -> Option<u64> {
        self.lock().instance
    }

    /// Whether the daemon is considered reachable (no failure since the last working connection).
    pub fn is_up(&self) -> bool {
        self.lock().down_since.is_none()
    }

    /// Whether an attempt may be made now (false while the back-off runs).
    pub fn ready(&self) -> bool {
        self.lock().backoff.ready(Instant::now())
    }

    /// A new authenticated connection, unless the back-off says to wait ([`ClientError::Unavailable`],
    /// no system call). Records the outcome (and logs a loss or a recovery).
    pub fn connect(&self) -> Result<Client> {
        let now = Instant::now();
        {
            let st = self.lock();
            if !st.backoff.ready(now) {
                return Err(ClientError::Unavailable { retry_in: st.backoff.wait(now) });
            }
        }
        let r = self.endpoint.connect();
        let mut st = self.lock();
        match &r {
            Ok(c) => {
                let instance = c.info().instance;
                st.backoff.succeeded();
                if let Some(since) = st.down_since.take() {
                    let new = instance != st.instance;
                    tracing::warn!(
                        "{}: the daemon at {} answers again after {:.1} s{}",
                        self.who,
                        self.endpoint.address(),
                        since.elapsed().as_secs_f64(),
                        if new { " (a new instance: its pools are gone)" } else { "" }
                    );
                }
                st.instance = instance;
                st.last_log = None;
            }
            // Refused by the daemon itself (wrong token, busy, shutting down): that is an answer, but
            // not a usable connection; back off all the same.
            Err(e) => {
                st.backoff.failed(now);
                self.note_down(&mut st, now, e);
            }
        }
        r
    }

    /// A working connection failed at the transport: the daemon may be gone, or only this connection
    /// (an idle one the daemon closed). The next attempt is immediate; only its failure counts as a
    /// loss (and is logged).
    pub fn broke(&self) {
        let mut st = self.lock();
        if st.down_since.is_none() {
            st.backoff.broke();
        }
    }

    fn note_down(&self, st: &mut LinkState, now: Instant, e: &ClientError) {
        if !e.is_transport() {
            // The daemon answered and refused (a wrong token, a VM it does not know): retrying will
            // not help and the caller decides what follows, so no "going on without it" (issue 31:
            // `guest watch` for an unregistered VM said so, then exited).
            if st.last_log.is_none_or(|t| now.duration_since(t) >= REMIND_EVERY) {
                st.last_log = Some(now);
                tracing::warn!(
                    "{}: the daemon at {} refused the connection: {e}",
                    self.who,
                    self.endpoint.address()
                );
            }
            return;
        }
        match st.down_since {
            None => {
                st.down_since = Some(now);
                st.last_log = Some(now);
                tracing::warn!(
                    "{}: lost the daemon at {} ({e}); going on without it, retrying with back-off",
                    self.who,
                    self.endpoint.address()
                );
            }
            Some(since) if st.last_log.is_none_or(|t| now.duration_since(t) >= REMIND_EVERY) => {
                st.last_log = Some(now);
                tracing::warn!(
                    "{}: the daemon at {} is still unreachable after {} s ({e})",
                    self.who,
                    self.endpoint.address(),
                    now.duration_since(since).as_secs()
                );
            }
            Some(_) => {}
        }
    }
}

/// One connection that heals itself: calls go through [`Session::call`] (any call) or
/// [`Session::on_pool`] (a call on one pool, refused with [`ClientError::PoolLost`] when the pool is of
/// another instance than the daemon's now).
#[derive(Debug)]
pub struct Session {
    link: Link,
    client: Option<Client>,
}

impl Session {
    /// A session; nothing is connected until the first call.
    pub fn new(endpoint: Endpoint, policy: BackoffPolicy, who: &'static str) -> Session {
        Session { link: Link::new(endpoint, policy, who), client: None }
    }

    pub fn link(&self) -> &Link {
        &self.link
    }

    /// Connects if not connected; returns the instance of the daemon now answering.
    pub fn connect(&mut self) -> Result<u64> {
        if self.client.is_none() {
            self.client = Some(self.link.connect()?);
        }
        Ok(self.client.as_ref().and_then(|c| c.info().instance).unwrap_or(0))
    }

    /// The instance of the current connection (`None` when not connected).
    pub fn instance(&self) -> Option<u64> {
        self.client.as_ref().map(|c| c.info().instance.unwrap_or(0))
    }

    /// Runs `f` on the connection (connecting first if needed). A transport failure drops the
    /// connection (the next call reconnects).
    pub fn call<T>(&mut self, f: impl FnOnce(&mut Client) -> Result<T>) -> Result<T> {
        self.connect()?;
        let c = self.client.as_mut().expect("connected above");
        let r = f(c);
        if let Err(e) = &r {
            if e.is_transport() || c.outstanding() > 0 {
                self.client = None;
                self.link.broke();
            }
        }
        r
    }

    /// Runs `f` with the pool's id, if the daemon now answering is the instance that made the pool;
    /// otherwise [`ClientError::PoolLost`] and nothing is sent.
    pub fn on_pool<T>(
        &mut self,
        pool: PoolRef,
        f: impl FnOnce(&mut Client, PoolId) -> Result<T>,
    ) -> Result<T> {
        let now = self.connect()?;
        if now != pool.instance {
            return Err(ClientError::PoolLost { pool: pool.id });
        }
        self.call(|c| f(c, pool.id))
    }

    /// CREATE_CGROUP, bound to the instance that answered.
    pub fn create_pool(&mut self, opts: dd_types::PoolOptions) -> Result<PoolRef> {
        let instance = self.connect()?;
        let id = self.call(|c| c.create_cgroup(opts))?;
        Ok(PoolRef { id, instance })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_to_its_cap_with_jitter_in_the_upper_half() {
        let p = BackoffPolicy { initial: Duration::from_millis(100), max: Duration::from_secs(1) };
        let mut b = Backoff::new(p, 7);
        let t0 = Instant::now();
        assert!(b.ready(t0));
        let mut delays = Vec::new();
        for _ in 0..8 {
            delays.push(b.failed(t0));
        }
        let fulls = [100u64, 200, 400, 800, 1000, 1000, 1000, 1000];
        for (d, full) in delays.iter().zip(fulls) {
            let ms = d.as_millis() as u64;
            assert!(ms >= full / 2 && ms <= full, "{ms} ms for a full delay of {full} ms");
        }
        assert!(!b.ready(t0) && b.ready(t0 + Duration::from_secs(1)));
        assert_eq!(b.failures(), 8);
        b.succeeded();
        assert!(b.ready(t0) && b.failures() == 0);
        // Seeded: the same seed draws the same delays, another seed others.
        let again: Vec<Duration> = {
            let mut b = Backoff::new(p, 7);
            (0..8).map(|_| b.failed(t0)).collect()
        };
        assert_eq!(again, delays);
        let other: Vec<Duration> = {
            let mut b = Backoff::new(p, 8);
            (0..8).map(|_| b.failed(t0)).collect()
        };
        assert_ne!(other, delays);
    }

    #[test]
    fn an_unreachable_daemon_is_not_tried_again_during_the_backoff() {
        let dir = tempfile::tempdir().unwrap();
        let ep = Endpoint {
            unix_socket: Some(dir.path().join("none.sock")),
            tcp: None,
            tls: None,
            vm: 1,
            token: "t".into(),
        };
        let policy = BackoffPolicy { initial: Duration::from_secs(30), max: Duration::from_secs(60) };
        let link = Link::new(ep, policy, "test");
        assert!(matches!(link.connect(), Err(ClientError::Io(_))), "the first attempt is made");
        assert!(!link.is_up());
        match link.connect() {
            Err(ClientError::Unavailable { retry_in }) => assert!(retry_in > Duration::from_secs(10)),
            other => panic!("{other:?}"),
        }
    }
}
