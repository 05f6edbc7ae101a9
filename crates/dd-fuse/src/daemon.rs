//! The mount's connections to the daemon, and what keeps the second level safe when the daemon goes
//! away and comes back (issue 13).
//!
//! [`Clients`] keeps idle authenticated connections for reuse (one is taken per call, so no lock is
//! held during network I/O and concurrent FUSE threads use separate connections) and shares one
//! [`dd_client::Link`]: capped exponential back-off with jitter, the daemon instance last reached, and
//! the log lines of a loss (once at the loss, at most once a minute while it lasts, once at recovery).
//! While the back-off runs a call fails at once without a system call, so a mount whose daemon is away
//! serves from its first levels and the backing directory at full speed and without error.
//!
//! Pools are named with the instance that made them ([`PoolRef`], from the watcher's state file): a
//! call on a pool of another instance than the connection's is refused before anything is sent
//! ([`ClientError::PoolLost`]), so after a restart the mount never reaches a pool of the new instance
//! through an old id, and uses the new pools as soon as the watcher publishes them.
//!
//! [`Stale`]: a write whose flush could not reach the daemon leaves pools that may hold old pages of
//! the object. If the daemon comes back as the same instance (the connection broke, the daemon did not
//! restart), those objects are flushed from their pools before any pool is used again; if it comes back
//! as a new instance, the old pools are gone with their pages and there is nothing to flush. Until then
//! the second level is not used at all (the gate in `Frontend::pool`).
//!
//! Locks: `idle`, the stale set and the recovery flag are leaves; recovery runs without object locks
//! (no pool is used for any object while the set is non-empty, and a writer that fails to flush adds
//! its object under its own exclusive lock, see `frontend.rs`).

use dd_client::{Client, ClientError, Link, PoolRef};
use dd_guest::watch::DaemonConfig;
use dd_types::PoolId;
use parking_lot::Mutex;
use std::collections::BTreeSet;

/// Connections to the daemon (see the module documentation).
pub struct Clients {
    link: Link,
    idle: Mutex<Vec<Client>>,
    pub max_batch: usize,
}

/// The instance a connection reached (0 from a version-1 server, which has none).
fn instance_of(c: &Client) -> u64 {
    c.info().instance.unwrap_or(0)
}

impl Clients {
    /// Connects once, so that a wrong address or token fails the mount at start.
    pub fn connect(cfg: &DaemonConfig) -> Result<Clients, ClientError> {
        let link = Link::new(cfg.endpoint(), dd_client::BackoffPolicy::default(), "doubledecker mount");
        let c = link.connect()?;
        let max_batch = c.info().max_batch.max(1);
        Ok(Clients { link, idle: Mutex::new(vec![c]), max_batch })
    }

    pub fn link(&self) -> &Link {
        &self.link
    }

    /// Whether a call may be made now: the daemon answered last time, or the back-off allows a try.
    pub fn ready(&self) -> bool {
        self.link.is_up() || self.link.ready()
    }

    /// Runs `f` on a connection. A pooled connection that fails at the transport (the daemon closed it
    /// when idle, or is gone) is replaced by a fresh one once: every call is safe to repeat (puts
    /// replace, flushes are idempotent, a repeated get may miss).
    pub fn call<T>(
        &self,
        mut f: impl FnMut(&mut Client) -> Result<T, ClientError>,
    ) -> Result<T, ClientError> {
        let idle = self.idle.lock().pop();
        let (mut c, pooled) = match idle {
            Some(c) => (c, true),
            None => (self.link.connect()?, false),
        };
        let mut r = f(&mut c);
        if pooled && r.as_ref().is_err_and(|e| e.is_transport()) {
            self.link.broke();
            c = self.link.connect()?;
            r = f(&mut c);
        }
        match &r {
            // A connection that failed below the protocol may be mid-frame: dropped. The other idle
            // ones most likely went the same way (the daemon died): dropped too, not tried one by one.
            Err(e) if e.is_transport() => {
                self.link.broke();
                self.idle.lock().clear();
            }
            _ if c.outstanding() == 0 => self.idle.lock().push(c),
            _ => {}
        }
        r
    }

    /// Runs `f` with the pool's id on a connection to the instance that made the pool; a connection to
    /// another instance gets [`ClientError::PoolLost`] and nothing is sent.
    pub fn on_pool<T>(
        &self,
        pool: PoolRef,
        mut f: impl FnMut(&mut Client, PoolId) -> Result<T, ClientError>,
    ) -> Result<T, ClientError> {
        self.call(|c| {
            if instance_of(c) != pool.instance {
                return Err(ClientError::PoolLost { pool: pool.id });
            }
            f(c, pool.id)
        })
    }
}

/// Whether an error is the daemon being away or restarted (the link logs it; callers stay quiet).
pub fn quiet(e: &ClientError) -> bool {
    e.is_transport() || matches!(e, ClientError::PoolLost { .. })
}

/// Objects whose pages pools of `instance` may still hold although they were written since (their
/// flush did not reach the daemon).
#[derive(Debug, Default)]
pub struct Stale {
    instance: Option<u64>,
    objects: BTreeSet<u64>,
    recovering: bool,
}

impl Stale {
    /// Records that `object`'s flush failed while the pools known were of `instance`.
    pub fn add(&mut self, instance: Option<u64>, object: u64) {
        if self.instance != instance {
            // Pools of another instance than the recorded one: the recorded ones are gone anyway.
            self.objects.clear();
            self.instance = instance;
        }
        self.objects.insert(object);
    }

    pub fn is_empty(&self) -> bool {
        self.objects.is_empty()
    }
}

/// Brings the stale set to empty if the daemon can be reached: nothing to do when it is a new
/// instance, otherwise each object is flushed from every pool that may hold it (`pools_of`). Returns
/// whether the set is empty. Only one thread recovers at a time; the others find the gate closed.
pub fn recover(stale: &Mutex<Stale>, cl: &Clients, pools_of: impl Fn(u64) -> Vec<u32>) -> bool {
    let (instance, objects) = {
        let mut s = stale.lock();
        if s.is_empty() {
            return true;
        }
        if s.recovering || !cl.ready() {
            return false;
        }
        s.recovering = true;
        (s.instance, s.objects.clone())
    };
    let now = cl.call(|c| c.ping().map(|_| instance_of(c)));
    let mut done = Vec::new();
    match now {
        Ok(now) if Some(now) != instance => done.extend(objects.iter().copied()),
        Ok(_) => {
            for &o in &objects {
                let ok = pools_of(o).into_iter().all(|p| {
                    match cl.call(|c| c.flush_object(PoolId(p), o)) {
                        Ok(_) => true,
                        // The daemon answered (unknown pool): it holds no page of ours there.
                        Err(e) => e.status().is_some(),
                    }
                });
                if !ok {
                    break;
                }
                done.push(o);
            }
        }
        Err(_) => {}
    }
    let mut s = stale.lock();
    s.recovering = false;
    if s.instance == instance {
        for o in done {
            s.objects.remove(&o);
        }
    }
    s.is_empty()
}
