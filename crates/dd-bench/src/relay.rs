//! A TCP relay on loopback for the peer attacks (`bench tenants`, `tests/coop_sessions.rs`): a path
//! between two daemons that adds latency, and that an attacker on that path controls: it can cut the
//! latest connection, or write bytes of its own into it toward the upstream daemon.
//!
//! Each accepted connection gets a connection to `127.0.0.1:to`; each direction is copied by two
//! threads (one reads, one writes each chunk `delay` after it arrived, in order), so the relay adds
//! `delay` each way and nothing else. Invariants: the relay only ever connects to the port it was
//! given on 127.0.0.1; bytes are never changed or reordered, only delayed; what the upstream sends is
//! counted, and its end noted, for the latest connection.

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

/// The latest relayed connection's two sides, what its upstream sent and whether it closed (each
/// connection its own counters, so that an older connection's end is never taken for the latest's).
#[derive(Debug, Default)]
struct Latest {
    upstream: Option<TcpStream>,
    downstream: Option<TcpStream>,
    from_upstream: Arc<AtomicU64>,
    upstream_closed: Arc<AtomicBool>,
}

/// A running relay (its threads end with the connections; the listener's when the process does).
#[derive(Debug)]
pub struct Relay {
    pub port: u16,
    latest: Arc<Mutex<Latest>>,
}

impl Relay {
    /// A relay on a free loopback port to `127.0.0.1:to`, adding `delay` each way.
    pub fn start(to: u16, delay: Duration) -> std::io::Result<Relay> {
        let l = TcpListener::bind("127.0.0.1:0")?;
        let r = Relay { port: l.local_addr()?.port(), latest: Arc::default() };
        let latest = r.latest.clone();
        std::thread::Builder::new().name("dd-relay".into()).spawn(move || {
            for down in l.incoming() {
                let Ok(down) = down else { return };
                let Ok(up) = TcpStream::connect(("127.0.0.1", to)) else { continue };
                let _ = (down.set_nodelay(true), up.set_nodelay(true));
                let (Ok(down2), Ok(up2), Ok(up3), Ok(down3)) =
                    (down.try_clone(), up.try_clone(), up.try_clone(), down.try_clone())
                else {
                    continue;
                };
                let (count, closed) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicBool::new(false)));
                *latest.lock().expect("relay lock") = Latest {
                    upstream: Some(up3),
                    downstream: Some(down3),
                    from_upstream: count.clone(),
                    upstream_closed: closed.clone(),
                };
                pump(down, up, delay, None);
                pump(up2, down2, delay, Some((count, closed)));
            }
        })?;
        Ok(r)
    }

    /// Cuts the latest connection, both sides.
    pub fn cut(&self) {
        let mut g = self.latest.lock().expect("relay lock");
        for s in [g.upstream.take(), g.downstream.take()].into_iter().flatten() {
            let _ = s.shutdown(Shutdown::Both);
        }
    }

    /// Writes `bytes` into the latest connection toward the upstream, as if its client had sent
    /// them; false when there is no open connection.
    pub fn inject(&self, bytes: &[u8]) -> bool {
        let g = self.latest.lock().expect("relay lock");
        match &g.upstream {
            Some(s) if !g.upstream_closed.load(Ordering::SeqCst) => (&*s).write_all(bytes).is_ok(),
            _ => false,
        }
    }

    /// Bytes the upstream has sent on the latest connection.
    pub fn from_upstream(&self) -> u64 {
        self.latest.lock().expect("relay lock").from_upstream.load(Ordering::SeqCst)
    }

    /// Whether the upstream closed the latest connection.
    pub fn upstream_closed(&self) -> bool {
        self.latest.lock().expect("relay lock").upstream_closed.load(Ordering::SeqCst)
    }

    /// Waits up to `limit` for the upstream to close the latest connection; returns whether it did.
    pub fn wait_upstream_closed(&self, limit: Duration) -> bool {
        let deadline = Instant::now() + limit;
        while !self.upstream_closed() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
        self.upstream_closed()
    }
}

type Counter = (Arc<AtomicU64>, Arc<AtomicBool>);

/// Copies `from` to `to`, each chunk `delay` after it arrived (order kept); with `count`, the bytes
/// are counted and the end of `from` noted.
fn pump(mut from: TcpStream, mut to: TcpStream, delay: Duration, count: Option<Counter>) {
    let (tx, rx) = mpsc::channel::<(Instant, Vec<u8>)>();
    let _ = std::thread::Builder::new().name("dd-relay-read".into()).spawn(move || {
        let mut buf = vec![0u8; 65536];
        loop {
            match from.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    if let Some((c, _)) = &count {
                        c.fetch_add(n as u64, Ordering::SeqCst);
                    }
                    if tx.send((Instant::now(), buf[..n].to_vec())).is_err() {
                        break;
                    }
                }
            }
        }
        if let Some((_, closed)) = &count {
            closed.store(true, Ordering::SeqCst);
        }
    });
    let _ = std::thread::Builder::new().name("dd-relay-write".into()).spawn(move || {
        for (at, bytes) in rx {
            std::thread::sleep((at + delay).saturating_duration_since(Instant::now()));
            if to.write_all(&bytes).is_err() {
                break;
            }
        }
        let _ = to.shutdown(Shutdown::Write);
    });
}
