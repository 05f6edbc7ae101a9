//! # dd-client: the guest side's client library
//!
//! A blocking client of the data plane (`docs/protocol.md`) over a Unix socket or TCP, with the
//! cleancache calls (put, get, flush_page, flush_object, batched put and get) and the cgroup lifecycle
//! calls of paper 002 section 4.1 (CREATE_CGROUP -> [`Client::create_cgroup`], SET_CG_WEIGHT ->
//! [`Client::set_cg_weight`], MIGRATE_OBJECT -> [`Client::migrate_object`], DESTROY_CGROUP ->
//! [`Client::destroy_cgroup`], GET_STATS -> [`Client::get_stats`]).
//!
//! Every convenience call is one request and one response. For pipelining, [`Client::send`] queues a
//! request (written on [`Client::flush`] or when [`Client::recv`] needs a response) and
//! [`Client::recv`] returns responses in order with their request ids.
//!
//! Invariants: one client is one authenticated connection (HELLO is done by `connect_*`); a response
//! whose id does not match the oldest outstanding request is a protocol error and poisons nothing but
//! this client; a server error comes back as [`ClientError::Server`] with its stable status code.
//!
//! [`reconnect`] survives daemon restarts: capped exponential back-off with jitter, the daemon's
//! instance id (HELLO, protocol version 2), pools bound to the instance that made them
//! ([`ClientError::PoolLost`] after a restart, never an ordinary miss).
//!
//! [`admin`] is the admin API's client (HTTP/JSON), for the tools that drive a daemon's control plane.
#![forbid(unsafe_code)] // nothing here needs it: unsafe code lives in dd-engine, dd-fuse, dd-memctl and the few FFI calls of the other crates

pub mod admin;
pub mod reconnect;
pub mod tls;

pub use reconnect::{Backoff, BackoffPolicy, Endpoint, Link, PoolRef, Session};
pub use tls::{TlsClient, TlsError};

use dd_proto::frame::{split_frame, Header};
use dd_proto::{
    KeyList, ProtoError, Request, Response, Status, HEADER_LEN, MIN_PROTOCOL_VERSION, PROTOCOL_VERSION,
};
use dd_types::{Key, PoolId, PoolOptions, PoolStats, PutOutcome, Spec, VmStats};
use std::collections::VecDeque;
use std::io::{BufReader, Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::os::unix::net::UnixStream;
use std::path::Path;

/// Errors of the client.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ClientError {
    #[error("i/o: {0}")]
    Io(#[from] std::io::Error),
    #[error("protocol: {0}")]
    Proto(#[from] ProtoError),
    /// The server answered with a non-zero status.
    #[error("server error {status}: {message}")]
    Server { status: Status, message: String },
    /// The server answered with a response of another shape or id than expected.
    #[error("unexpected response: {0}")]
    Unexpected(String),
    #[error("bad stats document: {0}")]
    Json(String),
    /// A page or batch does not fit the server's page size or limits.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// Not connected, and the reconnection back-off says to wait this long before the next attempt
    /// (nothing was sent).
    #[error("the daemon is unreachable (next attempt in {retry_in:?})")]
    Unavailable { retry_in: std::time::Duration },
    /// The pool belongs to an earlier instance of the daemon: it restarted, and the pool and every page
    /// in it are gone (a persistent pool's pages too). Nothing was sent.
    #[error("pool {pool} was lost: the daemon restarted")]
    PoolLost { pool: PoolId },
    /// The TLS configuration cannot be used (its CA file, the server name); nothing was sent.
    #[error("{0}")]
    Tls(#[from] TlsError),
}

impl ClientError {
    /// The server's status code, if the error came from the server.
    pub fn status(&self) -> Option<Status> {
        match self {
            ClientError::Server { status, .. } => Some(*status),
            _ => None,
        }
    }

    /// Whether the connection is unusable after this error (the daemon may be gone): transport and
    /// framing failures, and a client not connected at all.
    pub fn is_transport(&self) -> bool {
        matches!(
            self,
            ClientError::Io(_)
                | ClientError::Proto(_)
                | ClientError::Unexpected(_)
                | ClientError::Unavailable { .. }
        )
    }

    /// Stable short name of the error: the server's status name, or the client's own
    /// (`pool_lost`, `unavailable`, `io`, ...).
    pub fn code_name(&self) -> &'static str {
        match self {
            ClientError::Server { status, .. } => status.name(),
            ClientError::Io(_) => "io",
            ClientError::Proto(_) => "protocol",
            ClientError::Unexpected(_) => "unexpected_response",
            ClientError::Json(_) => "bad_stats_document",
            ClientError::InvalidArgument(_) => "invalid_argument",
            ClientError::Unavailable { .. } => "unavailable",
            ClientError::PoolLost { .. } => "pool_lost",
            ClientError::Tls(_) => "tls_config",
        }
    }
}

pub type Result<T> = std::result::Result<T, ClientError>;

enum Transport {
    Tcp(TcpStream),
    Unix(UnixStream),
    /// TCP under TLS (boxed: rustls's connection state is a few KiB).
    Tls(Box<rustls::StreamOwned<rustls::ClientConnection, TcpStream>>),
}

impl Read for Transport {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        match self {
            Transport::Tcp(s) => s.read(buf),
            Transport::Unix(s) => s.read(buf),
            Transport::Tls(s) => s.read(buf),
        }
    }
}

impl Write for Transport {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        match self {
            Transport::Tcp(s) => s.write(buf),
            Transport::Unix(s) => s.write(buf),
            Transport::Tls(s) => s.write(buf),
        }
    }
    fn flush(&mut self) -> std::io::Result<()> {
        match self {
            // Sockets are unbuffered here; a TLS stream may hold records not yet written.
            Transport::Tcp(_) | Transport::Unix(_) => Ok(()),
            Transport::Tls(s) => s.flush(),
        }
    }
}

/// What the server announced in its HELLO response.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ServerInfo {
    pub version: u8,
    pub vm: u32,
    pub page_size: usize,
    pub max_batch: usize,
    pub max_payload: u32,
    /// The daemon's instance id (protocol version 2; `None` from a version-1 server).
    pub instance: Option<u64>,
}

/// One authenticated connection to the cache manager.
pub struct Client {
    rd: BufReader<Transport>,
    wbuf: Vec<u8>,
    next_id: u64,
    /// Ids of requests sent (or queued) and not yet answered, oldest first.
    outstanding: VecDeque<u64>,
    info: ServerInfo,
    payload: Vec<u8>,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client")
            .field("info", &self.info)
            .field("outstanding", &self.outstanding.len())
            .finish()
    }
}

impl Client {
    /// Connects over TCP and authenticates as `vm` with its data-plane token.
    pub fn connect_tcp(addr: impl ToSocketAddrs, vm: u32, token: &str) -> Result<Client> {
        let s = TcpStream::connect(addr)?;
        s.set_nodelay(true)?;
        Client::handshake(Transport::Tcp(s), vm, token)
    }

    /// Connects over TCP under TLS (trusting the CAs of `tls`) and authenticates as `vm`.
    pub fn connect_tls(addr: &str, tls: &TlsClient, vm: u32, token: &str) -> Result<Client> {
        let (config, name) = (tls.config()?, tls.name_for(addr)?);
        Client::connect_tls_with(addr, config, name, vm, token)
    }

    /// [`Client::connect_tls`] with a configuration loaded once (a reconnecting client's, a benchmark's).
    pub fn connect_tls_with(
        addr: &str,
        config: std::sync::Arc<rustls::ClientConfig>,
        name: rustls::pki_types::ServerName<'static>,
        vm: u32,
        token: &str,
    ) -> Result<Client> {
        let s = TcpStream::connect(addr)?;
        s.set_nodelay(true)?;
        let conn = rustls::ClientConnection::new(config, name)
            .map_err(|e| ClientError::Io(std::io::Error::other(e)))?;
        Client::handshake(Transport::Tls(Box::new(rustls::StreamOwned::new(conn, s))), vm, token)
    }

    /// Connects over a Unix socket and authenticates as `vm`.
    pub fn connect_unix(path: impl AsRef<Path>, vm: u32, token: &str) -> Result<Client> {
        Client::handshake(Transport::Unix(UnixStream::connect(path)?), vm, token)
    }

    fn handshake(t: Transport, vm: u32, token: &str) -> Result<Client> {
        let mut c = Client {
            rd: BufReader::with_capacity(256 * 1024, t),
            wbuf: Vec::with_capacity(64 * 1024),
            next_id: 1,
            outstanding: VecDeque::new(),
            info: ServerInfo {
                version: PROTOCOL_VERSION,
                vm,
                page_size: 0,
                max_batch: 0,
                max_payload: 0,
                instance: None,
            },
            payload: Vec::new(),
        };
        let hello = Request::Hello {
            min_version: MIN_PROTOCOL_VERSION as u16,
            max_version: PROTOCOL_VERSION as u16,
            vm,
            token: token.as_bytes(),
        };
        match c.call(&hello)? {
            Response::Hello { version, vm, page_size, max_batch, max_payload, instance } => {
                c.info = ServerInfo {
                    version: version as u8,
                    vm,
                    page_size: page_size as usize,
                    max_batch: max_batch as usize,
                    max_payload,
                    instance,
                };
                Ok(c)
            }
            other => Err(ClientError::Unexpected(format!("{other:?} to HELLO"))),
        }
    }

    pub fn info(&self) -> ServerInfo {
        self.info
    }

    // -----------------------------------------------------------------------------------------
    // Pipelining
    // -----------------------------------------------------------------------------------------

    /// Queues a request; returns its id. Nothing is written until [`Client::flush`] or
    /// [`Client::recv`].
    pub fn send(&mut self, req: &Request<'_>) -> u64 {
        let id = self.next_id;
        self.next_id += 1;
        req.encode(self.info.version, id, &mut self.wbuf);
        self.outstanding.push_back(id);
        id
    }

    /// Writes every queued request.
    pub fn flush(&mut self) -> Result<()> {
        if !self.wbuf.is_empty() {
            self.rd.get_mut().write_all(&self.wbuf)?;
            self.rd.get_mut().flush()?;
            self.wbuf.clear();
        }
        Ok(())
    }

    /// Requests sent and not yet answered.
    pub fn outstanding(&self) -> usize {
        self.outstanding.len()
    }

    /// Receives the next response (flushing queued requests first). Returns its request id.
    pub fn recv(&mut self) -> Result<(u64, Response)> {
        self.flush()?;
        let mut hb = [0u8; HEADER_LEN];
        self.rd.read_exact(&mut hb)?;
        let h = Header::decode(&hb)?;
        if !h.is_response() {
            return Err(ClientError::Unexpected("a request frame from the server".into()));
        }
        // The server never sends more than a full batch; bound what a broken peer can make us allocate.
        let limit = dd_proto::ABSOLUTE_MAX_PAYLOAD_BYTES;
        if h.payload_len > limit {
            return Err(ProtoError::FrameTooLarge { len: h.payload_len, limit }.into());
        }
        self.payload.resize(h.payload_len as usize, 0);
        self.rd.read_exact(&mut self.payload)?;
        let resp = Response::decode(&h, &self.payload)?;
        match self.outstanding.pop_front() {
            Some(id) if id == h.request_id => Ok((id, resp)),
            // Errors that close the connection (bad frame, busy) may carry id 0.
            _ if h.request_id == 0 && !h.status().is_ok() => Err(ClientError::Server {
                status: h.status(),
                message: String::from_utf8_lossy(&self.payload).into(),
            }),
            other => Err(ClientError::Unexpected(format!(
                "response id {} while waiting for {other:?}",
                h.request_id
            ))),
        }
    }

    /// Sends one request and waits for its response; a server error becomes `Err`.
    pub fn call(&mut self, req: &Request<'_>) -> Result<Response> {
        self.send(req);
        let (_, r) = self.recv()?;
        ok(r)
    }

    // -----------------------------------------------------------------------------------------
    // cleancache
    // -----------------------------------------------------------------------------------------

    pub fn ping(&mut self) -> Result<()> {
        expect(self.call(&Request::Ping)?, |r| matches!(r, Response::Pong).then_some(()))
    }

    pub fn put(&mut self, pool: PoolId, key: Key, page: &[u8]) -> Result<PutOutcome> {
        expect(self.call(&Request::Put { pool, key, data: page })?, |r| match r {
            Response::Put(o) => Some(o),
            _ => None,
        })
    }

    /// Looks a page up; on a hit copies it into `out` (one page) and returns true.
    pub fn get(&mut self, pool: PoolId, key: Key, out: &mut [u8]) -> Result<bool> {
        let r = self.call(&Request::Get { pool, key })?;
        match r {
            Response::Get(Some(d)) if d.len() == out.len() => {
                out.copy_from_slice(&d);
                Ok(true)
            }
            Response::Get(Some(d)) => {
                Err(ClientError::InvalidArgument(format!("page is {} bytes, buffer {}", d.len(), out.len())))
            }
            Response::Get(None) => Ok(false),
            other => Err(ClientError::Unexpected(format!("{other:?}"))),
        }
    }

    pub fn flush_page(&mut self, pool: PoolId, key: Key) -> Result<bool> {
        expect(self.call(&Request::FlushPage { pool, key })?, |r| match r {
            Response::Flushed(b) => Some(b),
            _ => None,
        })
    }

    pub fn flush_object(&mut self, pool: PoolId, object: u64) -> Result<u64> {
        expect(self.call(&Request::FlushObject { pool, object })?, count)
    }

    /// Puts several pages of one pool in one request; one outcome per page.
    pub fn put_batch(&mut self, pool: PoolId, pages: &[(Key, &[u8])]) -> Result<Vec<PutOutcome>> {
        let keys: Vec<Key> = pages.iter().map(|p| p.0).collect();
        let mut data = Vec::with_capacity(pages.len() * self.info.page_size);
        for (_, p) in pages {
            data.extend_from_slice(p);
        }
        expect(self.call(&Request::PutBatch { pool, keys: KeyList::Keys(&keys), pages: &data })?, |r| match r
        {
            Response::PutBatch(v) if v.len() == keys.len() => Some(v),
            _ => None,
        })
    }

    /// Gets several pages of one pool in one request. `out` holds `keys.len()` pages; each hit is
    /// copied to its key's slot. Returns which keys hit.
    pub fn get_batch(&mut self, pool: PoolId, keys: &[Key], out: &mut [u8]) -> Result<Vec<bool>> {
        let ps = self.info.page_size;
        if out.len() != keys.len() * ps {
            return Err(ClientError::InvalidArgument(format!("out must hold {} pages", keys.len())));
        }
        let r = self.call(&Request::GetBatch { pool, keys: KeyList::Keys(keys) })?;
        unpack_get_batch(r, keys.len(), ps, out)
    }

    // -----------------------------------------------------------------------------------------
    // cgroup lifecycle (paper 002, section 4.1)
    // -----------------------------------------------------------------------------------------

    /// CREATE_CGROUP: a pool for a new container.
    pub fn create_cgroup(&mut self, opts: PoolOptions) -> Result<PoolId> {
        expect(self.call(&Request::CreatePool(opts))?, |r| match r {
            Response::PoolCreated(p) => Some(p),
            _ => None,
        })
    }

    /// SET_CG_WEIGHT: the container's `<T, W>`.
    pub fn set_cg_weight(&mut self, pool: PoolId, spec: Spec) -> Result<()> {
        expect(self.call(&Request::SetSpec { pool, spec })?, done)
    }

    /// SET_LABEL: names a pool (its container's name; shown by the admin API, `/metrics` and `/ui/`);
    /// `""` takes the name away.
    pub fn set_label(&mut self, pool: PoolId, label: &str) -> Result<()> {
        expect(self.call(&Request::SetLabel { pool, label: label.as_bytes() })?, done)
    }

    /// MIGRATE_OBJECT: moves a file's pages to another container's pool; returns pages moved.
    pub fn migrate_object(&mut self, from: PoolId, to: PoolId, object: u64) -> Result<u64> {
        expect(self.call(&Request::MigrateObject { from, to, object })?, count)
    }

    /// DESTROY_CGROUP: frees the pool and every page in it.
    pub fn destroy_cgroup(&mut self, pool: PoolId) -> Result<()> {
        expect(self.call(&Request::DestroyPool { pool })?, done)
    }

    /// GET_STATS of this VM: its pools and totals.
    pub fn get_stats(&mut self) -> Result<VmStats> {
        let j = expect(self.call(&Request::VmStats)?, json)?;
        serde_json::from_slice(&j).map_err(|e| ClientError::Json(e.to_string()))
    }

    /// GET_STATS of one pool.
    pub fn pool_stats(&mut self, pool: PoolId) -> Result<PoolStats> {
        let j = expect(self.call(&Request::PoolStats { pool })?, json)?;
        serde_json::from_slice(&j).map_err(|e| ClientError::Json(e.to_string()))
    }

    /// This VM's pools.
    pub fn list_pools(&mut self) -> Result<Vec<PoolId>> {
        expect(self.call(&Request::ListPools)?, |r| match r {
            Response::Pools(p) => Some(p),
            _ => None,
        })
    }
}

/// Unpacks a GET_BATCH response into per-key slots of `out`.
pub fn unpack_get_batch(r: Response, n: usize, ps: usize, out: &mut [u8]) -> Result<Vec<bool>> {
    match r {
        Response::GetBatch { hits, pages } if hits.len() == n => {
            let nh = hits.iter().filter(|h| **h).count();
            if pages.len() != nh * ps {
                return Err(ClientError::Unexpected(format!("{} page bytes for {nh} hits", pages.len())));
            }
            let mut src = pages.chunks_exact(ps);
            for (i, h) in hits.iter().enumerate() {
                if *h {
                    out[i * ps..(i + 1) * ps].copy_from_slice(src.next().expect("counted"));
                }
            }
            Ok(hits)
        }
        Response::Error { status, message } => Err(ClientError::Server { status, message }),
        other => Err(ClientError::Unexpected(format!("{other:?}"))),
    }
}

fn ok(r: Response) -> Result<Response> {
    match r {
        Response::Error { status, message } => Err(ClientError::Server { status, message }),
        r => Ok(r),
    }
}

fn expect<T>(r: Response, f: impl FnOnce(Response) -> Option<T>) -> Result<T> {
    let dbg = format!("{r:?}");
    f(r).ok_or_else(|| ClientError::Unexpected(dbg.chars().take(200).collect()))
}

fn count(r: Response) -> Option<u64> {
    match r {
        Response::Count(n) => Some(n),
        _ => None,
    }
}

fn done(r: Response) -> Option<()> {
    matches!(r, Response::Done).then_some(())
}

fn json(r: Response) -> Option<Vec<u8>> {
    match r {
        Response::Json(j) => Some(j),
        _ => None,
    }
}

/// Splits complete response frames out of a byte buffer (for callers doing their own I/O).
pub fn next_response(buf: &[u8]) -> Result<Option<(u64, Response, usize)>> {
    match split_frame(buf, dd_proto::ABSOLUTE_MAX_PAYLOAD_BYTES)? {
        None => Ok(None),
        Some((h, n)) => Ok(Some((h.request_id, Response::decode(&h, &buf[HEADER_LEN..n])?, n))),
    }
}
