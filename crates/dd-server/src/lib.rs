//! # dd-server: the DoubleDecker host cache manager (SPEC section 6)
//!
//! The daemon behind `doubledecker serve`, as a library: one [`dd_engine::Cache`] per host, the
//! data plane of `docs/protocol.md` on a Unix socket and TCP, the admin API of `docs/admin-api.yaml`
//! (HTTP/JSON, host and VM scopes) with Prometheus metrics, and graceful shutdown.
//!
//! Module map: [`config`] (serde configuration, embedded default, `validate()`), [`auth`] (tokens,
//! constant-time checks), [`persist`] (the registrations file: run-time VM registrations kept across
//! restarts), [`state`] (what every part shares, lock order), [`handler`] (one frame in,
//! one response out, no I/O but a remotified get's bounded peer fetch: the fuzz target drives it),
//! [`net`] (listeners, connection loop, per connection bounds, blocking policy), [`admin`] (axum
//! routes), [`metrics`], [`coop`] (co-operative de-duplication: peer listener, client, remotifier,
//! summary publisher), [`etcd`] (etcd membership of the peers), [`capture`] (recording connections
//! for fuzzing corpora, off by default), [`history`] (the samples `/ui/` charts, bounded).
//!
//! Shutdown order ([`run`]): stop accepting, tell every connection to finish the frames it holds and
//! close, wait for them (bounded by `limits.drain_timeout_ms`), stop the admin API, quiesce the engine
//! (drain the SSD write queue), remove the socket file, drop the cache.

pub mod admin;
pub mod admin_listener;
pub mod admission;
pub mod auth;
pub mod capture;
pub mod config;
pub mod coop;
pub mod coop_types;
pub mod etcd;
pub mod handler;
pub mod handshake;
pub mod history;
pub mod metrics;
pub mod net;
pub mod persist;
pub mod provisioner;
pub mod sessions;
pub mod state;
pub mod tls;
pub mod ui;

pub use config::ServerConfig;
pub use state::ServerState;

use std::future::Future;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use tokio::net::{TcpListener, UnixListener};
use tokio::sync::{mpsc, watch};

/// Errors of starting or running the daemon.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ServerError {
    /// The configuration is invalid; `field` names the first bad field.
    #[error("invalid configuration: {field}: {reason}")]
    Config { field: String, reason: String },
    #[error("cannot listen on {what} {addr}: {source}")]
    Bind { what: &'static str, addr: String, source: std::io::Error },
    #[error("{0}")]
    Io(String),
    #[error("engine: {0}")]
    Engine(dd_engine::CacheError),
}

impl ServerError {
    /// Stable short name of the error kind.
    pub fn code_name(&self) -> &'static str {
        match self {
            ServerError::Config { .. } => "invalid_config",
            ServerError::Bind { .. } => "bind_failed",
            ServerError::Io(_) => "io_error",
            ServerError::Engine(e) => e.code_name(),
        }
    }
}

/// The addresses the daemon listens on (written to `listen.ready_file` as JSON).
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct Bound {
    pub tcp: Option<SocketAddr>,
    pub unix: Option<PathBuf>,
    pub admin: SocketAddr,
    pub pid: u32,
    /// The peer listener of co-operative de-duplication, when enabled.
    #[serde(default)]
    pub coop: Option<SocketAddr>,
    /// Where the host admin token was read from or written to (absent when it came from the config).
    pub token_file: Option<PathBuf>,
    /// This start's instance id (what HELLO returns), as 16 hex digits.
    #[serde(default)]
    pub instance: String,
    /// TLS on the data plane's TCP listener (`[tls]`).
    #[serde(default)]
    pub tls_data_plane: bool,
    /// TLS on the admin API (`https://`).
    #[serde(default)]
    pub tls_admin: bool,
}

/// Resolves the host admin token: from the configuration, else from the token file, else a fresh one
/// written to the token file with mode 0600.
fn host_token(cfg: &ServerConfig) -> Result<(String, Option<PathBuf>), ServerError> {
    if !cfg.auth.host_admin_token.is_empty() {
        return Ok((cfg.auth.host_admin_token.clone(), None));
    }
    let path = cfg.in_data_dir(&cfg.auth.token_file);
    match std::fs::read_to_string(&path) {
        Ok(t) if t.trim().len() >= config::MIN_TOKEN_LEN => return Ok((t.trim().to_string(), Some(path))),
        Ok(_) => {
            return Err(ServerError::Config {
                field: "auth.token_file".into(),
                reason: format!("{} holds a token shorter than 16 characters", path.display()),
            })
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(ServerError::Io(format!("reading {}: {e}", path.display()))),
    }
    let t = auth::generate_token();
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&path)
        .map_err(|e| ServerError::Io(format!("writing {}: {e}", path.display())))?;
    writeln!(f, "{t}").map_err(|e| ServerError::Io(format!("writing {}: {e}", path.display())))?;
    Ok((t, Some(path)))
}

fn write_ready_file(path: &Path, bound: &Bound) -> Result<(), ServerError> {
    let tmp = path.with_extension("tmp");
    let text = serde_json::to_string_pretty(bound).expect("serialisable");
    std::fs::write(&tmp, text)
        .and_then(|_| std::fs::rename(&tmp, path))
        .map_err(|e| ServerError::Io(format!("writing ready file {}: {e}", path.display())))
}

/// Raises the soft limit on open files to the hard one: every connection is a descriptor, and a daemon
/// that runs out of them can accept nobody (not even the admin API). Warns when even the hard limit is
/// below what the configured connection limits can use.
fn raise_nofile(need: u64) {
    let mut lim = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit writes the struct we pass; it lives for the call.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } != 0 {
        return;
    }
    if lim.rlim_cur < lim.rlim_max {
        let raised = libc::rlimit { rlim_cur: lim.rlim_max, rlim_max: lim.rlim_max };
        // SAFETY: setrlimit reads the struct we pass; it lives for the call.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raised) } == 0 {
            lim.rlim_cur = lim.rlim_max;
        }
    }
    if lim.rlim_cur < need {
        tracing::warn!(
            "the open-file limit ({}) is below what the connection limits can use ({need}): lower \
             limits.max_connections or coop.max_connections, or raise RLIMIT_NOFILE",
            lim.rlim_cur
        );
    }
}

/// Completes on SIGINT or SIGTERM. The handlers are installed when this is called (inside a runtime),
/// not when the future is first polled: a daemon that has said it serves must drain on a signal that
/// comes at once (before, a SIGTERM right after the ready line killed it without draining).
pub fn shutdown_signal() -> impl std::future::Future<Output = ()> + Send {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate()).expect("installing a SIGTERM handler");
    let mut int = signal(SignalKind::interrupt()).expect("installing a SIGINT handler");
    async move {
        tokio::select! {
            _ = term.recv() => {}
            _ = int.recv() => {}
        }
    }
}

/// A listener bound on the session runtime, registered with the handshake thread's reactor instead.
fn rehome_listener<Std, L>(
    std: std::io::Result<Std>,
    on: &tokio::runtime::Handle,
    from_std: impl FnOnce(Std) -> std::io::Result<L>,
) -> Result<L, ServerError> {
    let moved = std.and_then(|l| {
        let _in = on.enter();
        from_std(l)
    });
    moved.map_err(|e| ServerError::Io(format!("moving a listener to the handshake thread: {e}")))
}

/// Accepts TCP streams (with `TCP_NODELAY`: requests and responses are small and latency-bound).
fn accept_tcp(
    l: Arc<TcpListener>,
) -> impl FnMut() -> std::pin::Pin<Box<dyn Future<Output = std::io::Result<tokio::net::TcpStream>> + Send>>
       + Send
       + 'static {
    move || {
        let l = l.clone();
        Box::pin(async move {
            let (s, _) = l.accept().await?;
            let _ = s.set_nodelay(true);
            Ok(s)
        })
    }
}

/// Runs an accept loop until `stop` changes: every accepted stream goes to `on_accept`; an accept error
/// (e.g. out of file descriptors) is logged and retried after a short pause.
fn spawn_accept_loop<S, Fut>(
    on: &tokio::runtime::Handle,
    what: &'static str,
    mut stop: watch::Receiver<bool>,
    mut accept: impl FnMut() -> Fut + Send + 'static,
    mut on_accept: impl FnMut(S) + Send + 'static,
) -> tokio::task::JoinHandle<()>
where
    Fut: Future<Output = std::io::Result<S>> + Send,
    S: Send + 'static,
{
    on.spawn(async move {
        loop {
            tokio::select! {
                r = accept() => match r {
                    Ok(s) => on_accept(s),
                    Err(e) => {
                        tracing::warn!("{what} accept: {e}");
                        tokio::time::sleep(Duration::from_millis(10)).await;
                    }
                },
                _ = stop.changed() => return,
            }
        }
    })
}

/// Runs the daemon until `shutdown` completes, then shuts down gracefully. `on_ready` is called once
/// every listener is bound.
pub async fn run(
    cfg: ServerConfig,
    shutdown: impl Future<Output = ()>,
    on_ready: impl FnOnce(&Bound),
) -> Result<(), ServerError> {
    cfg.validate()?;
    std::fs::create_dir_all(&cfg.data_dir)
        .map_err(|e| ServerError::Io(format!("creating data_dir {}: {e}", cfg.data_dir.display())))?;
    let (token, token_file) = host_token(&cfg)?;
    let coop_conns = if cfg.coop.enabled { cfg.coop.max_connections } else { 0 };
    raise_nofile((cfg.limits.max_connections + admission::MAX_REFUSING + coop_conns + 256) as u64);
    let state = Arc::new(ServerState::new(&cfg, &token)?);
    // TLS (`tls` module): loaded before anything listens, so a bad certificate or key fails the start.
    let (data_tls, admin_tls) = match cfg.tls_files() {
        Some((cert, key)) => {
            let acceptor = tokio_rustls::TlsAcceptor::from(tls::server_config(&cert, &key)?);
            (cfg.tls.data_plane.then(|| acceptor.clone()), cfg.tls.admin.then_some(acceptor))
        }
        None => (None, None),
    };

    let tcp = if cfg.listen.tcp.is_empty() {
        None
    } else {
        Some(TcpListener::bind(&cfg.listen.tcp).await.map_err(|source| ServerError::Bind {
            what: "listen.tcp",
            addr: cfg.listen.tcp.clone(),
            source,
        })?)
    };
    let unix_path = cfg.unix_socket_path();
    let unix = match &unix_path {
        None => None,
        Some(p) => {
            // A socket file left by a previous run would make bind fail; it serves nobody.
            let stale = std::fs::symlink_metadata(p)
                .is_ok_and(|m| std::os::unix::fs::FileTypeExt::is_socket(&m.file_type()));
            if stale {
                let _ = std::fs::remove_file(p);
            }
            Some(UnixListener::bind(p).map_err(|source| ServerError::Bind {
                what: "listen.unix_socket",
                addr: p.display().to_string(),
                source,
            })?)
        }
    };
    let admin_listener = TcpListener::bind(&cfg.listen.admin).await.map_err(|source| ServerError::Bind {
        what: "listen.admin",
        addr: cfg.listen.admin.clone(),
        source,
    })?;
    let coop_listener = if cfg.coop.enabled {
        Some(TcpListener::bind(&cfg.coop.listen).await.map_err(|source| ServerError::Bind {
            what: "coop.listen",
            addr: cfg.coop.listen.clone(),
            source,
        })?)
    } else {
        None
    };
    // Tokens and pages in clear on a network: allowed (a private network may be trusted), said once.
    for (what, addr, on) in [
        ("data plane (listen.tcp)", tcp.as_ref().and_then(|l| l.local_addr().ok()), data_tls.is_some()),
        ("admin API (listen.admin)", admin_listener.local_addr().ok(), admin_tls.is_some()),
    ] {
        if let (Some(a), false) = (addr, on) {
            // On loopback TLS would protect nothing the host's own users could not read anyway.
            if !a.ip().is_loopback() {
                tracing::warn!(
                    "the {what} listens on {a}, beyond loopback, without TLS: tokens and pages cross the \
                     network in clear (set [tls] cert_file and key_file)"
                );
            }
        }
    }
    let bound = Bound {
        coop: coop_listener.as_ref().and_then(|l| l.local_addr().ok()),
        tcp: tcp.as_ref().and_then(|l| l.local_addr().ok()),
        unix: unix_path.clone(),
        admin: admin_listener.local_addr().map_err(|e| ServerError::Io(e.to_string()))?,
        pid: std::process::id(),
        token_file,
        instance: format!("{:016x}", state.instance),
        tls_data_plane: data_tls.is_some(),
        tls_admin: admin_tls.is_some(),
    };

    let (stop_tx, stop_rx) = watch::channel(false);
    // Every connection task holds a clone of `done_tx`; when all are dropped, `done_rx` sees the end.
    let (done_tx, mut done_rx) = mpsc::channel::<()>(1);
    let mut accept_tasks = Vec::new();
    // The data plane's listeners accept, and connections do their handshake, on the handshake thread;
    // authenticated sessions are served here (`handshake` module).
    let hs_thread = handshake::HandshakeThread::start(cfg.limits.handshake_nice)
        .map_err(|e| ServerError::Io(format!("starting the handshake thread: {e}")))?;
    let session_rts = Arc::new(
        sessions::SessionRuntimes::start(cfg.limits.session_threads, cfg.limits.max_blocking_threads)
            .map_err(|e| ServerError::Io(format!("starting the session runtimes: {e}")))?,
    );
    let sessions = session_rts.clone();
    let on_hs = hs_thread.handle().clone();
    if let Some(l) = tcp {
        let (state, stop, done, sessions) =
            (state.clone(), stop_rx.clone(), done_tx.clone(), sessions.clone());
        let l = rehome_listener(l.into_std(), &on_hs, tokio::net::TcpListener::from_std)?;
        let tls = data_tls.clone();
        accept_tasks.push(spawn_accept_loop(
            &on_hs,
            "tcp",
            stop_rx.clone(),
            accept_tcp(Arc::new(l)),
            move |s| match &tls {
                Some(a) => {
                    net::spawn_tls_connection(&state, &sessions.pick(), a, s, stop.clone(), done.clone())
                }
                None => net::spawn_connection(&state, &sessions.pick(), s, stop.clone(), done.clone()),
            },
        ));
    }
    if let Some(l) = unix {
        let (state, stop, done, sessions) =
            (state.clone(), stop_rx.clone(), done_tx.clone(), sessions.clone());
        let l = Arc::new(rehome_listener(l.into_std(), &on_hs, UnixListener::from_std)?);
        let accept = move || {
            let l = l.clone();
            async move { l.accept().await.map(|(s, _)| s) }
        };
        accept_tasks.push(spawn_accept_loop(&on_hs, "unix", stop_rx.clone(), accept, move |s| {
            net::spawn_connection(&state, &sessions.pick(), s, stop.clone(), done.clone())
        }));
    }
    drop(done_tx);

    if let Some(l) = coop_listener {
        let key = coop::load_or_create_key(&cfg.in_data_dir(&cfg.coop.key_file))?;
        let coop = coop::Coop::start(&state, cfg.coop.clone(), cfg.coop_node_name(), key)?;
        let _ = state.coop.set(coop.clone());
        let (st, c, stop) = (state.clone(), coop.clone(), stop_rx.clone());
        // Peer connections have slots of their own (`coop::slots`).
        let peer_slots = coop::PeerSlots::new(
            cfg.coop.handshakes_per_member,
            cfg.coop.max_connections,
            cfg.coop.max_sessions_per_peer,
        );
        // Accepted and authenticated on the handshake thread, like the data plane's connections;
        // sessions are served on the session runtime (`coop::serve_peer`).
        let l = rehome_listener(l.into_std(), &on_hs, TcpListener::from_std)?;
        let peer_sessions = sessions.clone();
        accept_tasks.push(spawn_accept_loop(
            &on_hs,
            "coop",
            stop_rx.clone(),
            accept_tcp(Arc::new(l)),
            move |s| {
                let Ok(from) = s.peer_addr() else { return };
                let member = c.is_member_address(from.ip());
                if let Some(slot) = peer_slots.accept(from.ip(), member) {
                    let serve =
                        coop::serve_peer(c.clone(), st.clone(), s, stop.clone(), slot, peer_sessions.pick());
                    tokio::spawn(serve);
                }
            },
        ));
        let (c, mut stop, period) =
            (coop.clone(), stop_rx.clone(), Duration::from_millis(cfg.coop.publish_interval_ms));
        if cfg.coop.membership == config::Membership::Etcd {
            let e = &cfg.coop.etcd;
            let timeout = Duration::from_millis(cfg.coop.request_timeout_ms.max(1000));
            let etcd = Arc::new(etcd::Etcd::new(&e.endpoint, &e.prefix, e.lease_ttl_s, timeout));
            let me = (cfg.coop_node_name(), bound.coop.map(|a| a.to_string()).unwrap_or_default());
            let every = Duration::from_millis((e.lease_ttl_s * 1000 / 3).max(100));
            let (c, mut stop) = (coop.clone(), stop_rx.clone());
            accept_tasks.push(tokio::spawn(async move {
                loop {
                    let (c2, etcd2, me2) = (c.clone(), etcd.clone(), me.clone());
                    let _ = tokio::task::spawn_blocking(move || {
                        match etcd2.register(&me2.0, &me2.1).and_then(|_| etcd2.members()) {
                            Ok(list) => c2.set_membership(&list),
                            Err(e) => tracing::warn!("etcd membership: {e}"),
                        }
                    })
                    .await;
                    tokio::select! {
                        _ = tokio::time::sleep(every) => {}
                        _ = stop.changed() => {
                            let _ = tokio::task::spawn_blocking(move || etcd.revoke()).await;
                            return;
                        }
                    }
                }
            }));
        }
        accept_tasks.push(tokio::spawn(async move {
            loop {
                let c2 = c.clone();
                let _ = tokio::task::spawn_blocking(move || c2.publish()).await;
                tokio::select! {
                    _ = tokio::time::sleep(period) => {}
                    _ = stop.changed() => return,
                }
            }
        }));
    }

    let st = state.clone();
    let sample = move || st.history.sample(&st.cache);
    accept_tasks.push(history::spawn_sampler(state.history.interval(), stop_rx.clone(), sample));
    let router = admin::router(state.clone());
    let mut admin_stop = stop_rx.clone();
    let admin_listener = match admin_tls {
        Some(a) => admin_listener::AdminListener::tls(admin_listener, a, state.handshake_timeout),
        None => admin_listener::AdminListener::plain(admin_listener),
    }
    .map_err(|e| ServerError::Io(format!("admin listener: {e}")))?;
    let admin_task = tokio::spawn(async move {
        axum::serve(admin_listener, router)
            .with_graceful_shutdown(async move {
                let _ = admin_stop.changed().await;
            })
            .await
    });

    if let Some(p) = (!cfg.listen.ready_file.as_os_str().is_empty()).then_some(&cfg.listen.ready_file) {
        write_ready_file(p, &bound)?;
    }
    on_ready(&bound);

    shutdown.await;
    tracing::info!("shutting down: draining connections");
    state.begin_shutdown();
    let _ = stop_tx.send(true);
    for t in accept_tasks {
        let _ = t.await;
    }
    // Handshakes in progress end with the thread (an unauthenticated connection has nothing to drain).
    hs_thread.stop().await;
    let drain = Duration::from_millis(cfg.limits.drain_timeout_ms);
    if tokio::time::timeout(drain, done_rx.recv()).await.is_err() {
        tracing::warn!("connections still open after {drain:?}; closing anyway");
    }
    let _ = tokio::time::timeout(drain, admin_task).await;
    if let Some(c) = state.coop.get() {
        c.close();
    }
    session_rts.shutdown();
    let st = state.clone();
    let _ = tokio::task::spawn_blocking(move || st.cache.quiesce()).await;
    if let Some(p) = unix_path {
        let _ = std::fs::remove_file(p);
    }
    Ok(())
}
