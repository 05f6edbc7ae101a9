//! Raw data-plane frames for tests that must speak the protocol by hand (hostile clients): connect,
//! HELLO, read one frame with a bound on waiting, and the daemon's resident memory.

use dd_proto::frame::Header;
use dd_proto::{Request, Status, HEADER_LEN};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

/// A TCP connection with a read timeout (a bound on waiting for the daemon, not a timing assertion).
pub fn connect(addr: SocketAddr) -> TcpStream {
    let s = TcpStream::connect(addr).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    s
}

/// A request header.
pub fn header(op: u8, id: u64, len: u32) -> Vec<u8> {
    let mut v = Vec::new();
    Header { version: 1, op, flags: 0, status: 0, request_id: id, payload_len: len }.encode(&mut v);
    v
}

/// The HELLO frame of `vm` with `token`.
pub fn hello_frame(vm: u32, token: &str) -> Vec<u8> {
    let mut out = Vec::new();
    Request::Hello { min_version: 1, max_version: 1, vm, token: token.as_bytes() }.encode(1, 1, &mut out);
    out
}

/// Reads one frame: `Some((header, payload))`, or `None` at end of stream, on a reset or when nothing
/// came within the socket's read timeout.
pub fn read_frame(s: &mut TcpStream) -> Option<(Header, Vec<u8>)> {
    let mut hb = [0u8; HEADER_LEN];
    s.read_exact(&mut hb).ok()?;
    let h = Header::decode(&hb).ok()?;
    let mut p = vec![0u8; h.payload_len as usize];
    s.read_exact(&mut p).ok()?;
    Some((h, p))
}

/// Sends HELLO and returns the answer's status (None if the connection closed without one).
pub fn hello(s: &mut TcpStream, vm: u32, token: &str) -> Option<Status> {
    s.write_all(&hello_frame(vm, token)).ok()?;
    read_frame(s).map(|(h, _)| h.status())
}

/// Whether the peer closed the connection (end of stream or reset) within the read timeout.
pub fn closed(s: &mut TcpStream) -> bool {
    let mut b = [0u8; 256];
    loop {
        match s.read(&mut b) {
            Ok(0) => return true,
            Ok(_) => continue,
            Err(e)
                if e.kind() == std::io::ErrorKind::WouldBlock || e.kind() == std::io::ErrorKind::TimedOut =>
            {
                return false
            }
            Err(_) => return true,
        }
    }
}

/// Resident set size of a process in KiB (`VmRSS` of /proc/PID/status).
pub fn rss_kib(pid: u32) -> u64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("proc status");
    s.lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmRSS")
}
