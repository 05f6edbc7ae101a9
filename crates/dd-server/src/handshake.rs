//! The handshake thread: where the data plane accepts connections and reads their HELLO, and the peer
//! listener accepts connections and runs their channel and identity handshake (`coop::serve_peer`),
//! apart from the runtime that serves authenticated sessions.
//!
//! Why a thread of its own: work for a client that has not authenticated is work anyone who can reach
//! the socket can make the daemon do. On the session runtime it would queue with the sessions' tasks
//! (tokio schedules them first come, first served): a VM that opens and abandons thousands of
//! connections a second raised another VM's p99 fivefold there (`bench tenants`, attack
//! `oversized_preauth`, BENCHMARKS.md). Here it runs on one OS thread at a lower CPU priority
//! (`limits.handshake_nice`, default 10): the kernel gives it what the sessions leave, and a flood
//! backs up in the listen queue of the flooding client instead of in front of other VMs' requests.
//!
//! After a successful HELLO, `net` moves the stream to the session runtime ([`Rehome`]): it is
//! deregistered from this thread's reactor and registered with the session runtime's. Invariant: no
//! authenticated request is ever handled on this thread (its only frame handled here is the HELLO).

use std::io;
use std::os::fd::AsRawFd;
use tokio::runtime::Handle;
use tokio::sync::oneshot;

/// The handshake thread and its runtime (a current-thread runtime with I/O and timers).
#[derive(Debug)]
pub struct HandshakeThread {
    handle: Handle,
    stop: Option<oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl HandshakeThread {
    /// Starts the thread (named `dd-handshake`) at `nice` (0..=19; 0 keeps the daemon's priority).
    pub fn start(nice: u8) -> io::Result<HandshakeThread> {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
        let handle = rt.handle().clone();
        let (stop, stopped) = oneshot::channel::<()>();
        let thread = std::thread::Builder::new().name("dd-handshake".into()).spawn(move || {
            if let Err(e) = lower_priority(nice) {
                tracing::warn!("handshake thread: could not set nice {nice}: {e}");
            }
            rt.block_on(async move {
                let _ = stopped.await;
            });
            // Dropping the runtime here (outside any async context) cancels the handshakes still
            // running: their connections close and their slots are released.
        })?;
        Ok(HandshakeThread { handle, stop: Some(stop), thread: Some(thread) })
    }

    /// Where to spawn accept loops and handshakes.
    pub fn handle(&self) -> &Handle {
        &self.handle
    }

    /// Stops the runtime (cancelling handshakes in progress) and waits for the thread.
    pub async fn stop(mut self) {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = tokio::task::spawn_blocking(move || t.join()).await;
        }
    }
}

impl Drop for HandshakeThread {
    fn drop(&mut self) {
        // Not joined here: a drop may happen inside the session runtime, where blocking is not allowed.
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
    }
}

/// Lowers the calling thread's CPU priority to `nice`.
fn lower_priority(nice: u8) -> io::Result<()> {
    if nice == 0 {
        return Ok(());
    }
    // SAFETY: gettid has no preconditions; setpriority only changes the scheduling priority of the
    // thread whose id is given (Linux applies PRIO_PROCESS to a single thread), here the calling one.
    let rc = unsafe {
        let tid = libc::gettid();
        libc::setpriority(libc::PRIO_PROCESS, tid as libc::id_t, libc::c_int::from(nice))
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// A stream that can move from the runtime whose reactor it is registered with to another one.
pub trait Rehome: Sized + AsRawFd {
    /// The same socket, registered with the runtime of `to` (which must have I/O enabled).
    fn rehome(self, to: &Handle) -> io::Result<Self>;

    /// A read that never waits (the stream's own `try_read`).
    fn try_read_now(&self, buf: &mut [u8]) -> io::Result<usize>;

    /// For a connection that will not be read again (a failed handshake waiting for its answer):
    /// discards what its receive queue holds (at most `max` bytes, without waiting) and shrinks the
    /// socket's receive buffer to the kernel's minimum, so that what the client sends from now on is
    /// held in a few KiB of kernel memory (the rest is dropped and the client's writes block).
    fn stop_receiving(&self, max: usize) -> io::Result<()> {
        let mut scratch = [0u8; 16 << 10];
        let mut discarded = 0;
        while discarded < max {
            match self.try_read_now(&mut scratch) {
                Ok(0) => break,
                Ok(n) => discarded += n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) => return Err(e),
            }
        }
        let min: libc::c_int = 1;
        // SAFETY: the fd is this open socket's (borrowed for the call); SO_RCVBUF takes a c_int, whose
        // address and size are passed; the kernel clamps the value to its minimum.
        let rc = unsafe {
            libc::setsockopt(
                self.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_RCVBUF,
                (&min as *const libc::c_int).cast(),
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            )
        };
        if rc == 0 {
            Ok(())
        } else {
            Err(io::Error::last_os_error())
        }
    }
}

impl Rehome for tokio::net::TcpStream {
    fn try_read_now(&self, buf: &mut [u8]) -> io::Result<usize> {
        self.try_read(buf)
    }

    fn rehome(self, to: &Handle) -> io::Result<Self> {
        let s = self.into_std()?;
        let _in = to.enter();
        tokio::net::TcpStream::from_std(s)
    }
}

impl Rehome for tokio::net::UnixStream {
    fn try_read_now(&self, buf: &mut [u8]) -> io::Result<usize> {
        self.try_read(buf)
    }

    fn rehome(self, to: &Handle) -> io::Result<Self> {
        let s = self.into_std()?;
        let _in = to.enter();
        tokio::net::UnixStream::from_std(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// The thread runs at the requested nice value and a stream accepted there keeps working after it
    /// moved to another runtime.
    #[test]
    fn a_stream_accepted_on_the_handshake_thread_serves_on_the_session_runtime() {
        let sessions =
            tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
        let hs = HandshakeThread::start(7).unwrap();
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        l.set_nonblocking(true).unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        let to = sessions.handle().clone();
        hs.handle().spawn(async move {
            let nice = {
                // SAFETY: getpriority only reads the calling thread's priority.
                unsafe { libc::getpriority(libc::PRIO_PROCESS, libc::gettid() as libc::id_t) }
            };
            let l = tokio::net::TcpListener::from_std(l).unwrap();
            let (mut s, _) = l.accept().await.unwrap();
            let mut b = [0u8; 5];
            s.read_exact(&mut b).await.unwrap();
            let s = s.rehome(&to).unwrap();
            tx.send((nice, b, s)).unwrap();
        });
        let mut c = std::net::TcpStream::connect(addr).unwrap();
        std::io::Write::write_all(&mut c, b"hello").unwrap();
        let (nice, b, mut s) = rx.recv().unwrap();
        assert_eq!((nice, &b), (7, b"hello"));
        sessions.block_on(async move {
            s.write_all(b"again").await.unwrap();
        });
        let mut b = [0u8; 5];
        std::io::Read::read_exact(&mut c, &mut b).unwrap();
        assert_eq!(&b, b"again");
        sessions.block_on(hs.stop());
    }
}
