//! Recording what connections exchange, for fuzzing corpora made of real traffic (`[capture]`;
//! issue 17, item 5; `fuzz/README.md`).
//!
//! With `capture.dir` set (or `doubledecker serve --capture-dir`, or `DD_CAPTURE_DIR`), every
//! data-plane connection and every connection to the peer listener writes what it receives and what
//! it sends (on the peer listener: the frames inside the encrypted channel, in the clear, not its
//! records), in order and timed, to a file of its own: `<dir>/<pid>-<data|peer>-<n>.ddcap`. The
//! converter `fuzz/examples/corpus_from_capture.rs` turns these files into inputs of each fuzz target.
//!
//! **File format** (little-endian): the 8-byte magic `DDCAPT01`, one byte of channel (0 data plane,
//! 1 peer listener), the `u64` time of the accept in microseconds since the Unix epoch (so that the
//! connections of one run can be put in one order), then records `{u8 direction (0 received, 1 sent); u64 microseconds since the
//! connection was accepted; u32 length; length bytes}`. A received record is what one read returned
//! (any split of the stream), a sent record what one write was given (whole frames).
//!
//! **Bounds** (all of `[capture]`): at most `max_connections` files per daemon process, at most
//! `max_bytes_per_connection` bytes per file and `max_total_bytes` over all of them. A record that
//! would pass either byte bound is not written and ends that file: a file is always a prefix, record
//! by record, of its connection's exchange. When the bounds are used up, connections are simply not
//! recorded; the daemon serves them as ever. A write error (a full disk) ends that file too, with one
//! warning.
//!
//! **Cost and exposure**: recording costs one `write` system call per read and per write of a
//! recorded connection, made on the connection's task. The files hold pages and the peers' handshakes
//! in clear, so the folder is created with mode 0700 and each file with 0600, and the daemon warns
//! once at start that it records; this is for test and benchmark daemons, never for production
//! traffic. **Tokens are redacted** (issue 30, item 5): the token of a data-plane connection's first
//! frame (its HELLO) is written as as many [`REDACTED_BYTE`]s, wherever the reads split it, so a file
//! keeps every length and offset of the exchange but never a VM's data token. (A fuzz corpus made of
//! such files replays HELLOs that fail authentication unless the converter puts a token back.)
//!
//! Invariant: recording never changes what a connection reads, answers or when it closes; a capture
//! that cannot be written is dropped, never an error of the connection.

use crate::config::CaptureConfig;
use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

/// The magic at the start of every capture file (the last two bytes are the format's version).
pub const MAGIC: &[u8; 8] = b"DDCAPT01";
/// Bytes of a file's header: magic, channel, time of the accept.
pub const FILE_HEADER: usize = 8 + 1 + 8;
/// Bytes of a record's header: direction, microseconds, length.
pub const RECORD_HEADER: usize = 1 + 8 + 4;
/// What every byte of a redacted token is written as.
pub const REDACTED_BYTE: u8 = b'*';
/// Where a HELLO's token starts in a data-plane stream: the 20-byte header, then `min_version u16,
/// max_version u16, vm u32`, then the token's `u16` length.
const HELLO_TOKEN_AT: usize = dd_proto::HEADER_LEN + 10;

/// Which listener a recorded connection came through.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Channel {
    /// The data plane (Unix socket or TCP): a guest's HELLO and requests.
    Data,
    /// The peer listener of co-operative de-duplication: a peer's HELLO, AUTH and requests.
    Peer,
}

impl Channel {
    fn byte(self) -> u8 {
        match self {
            Channel::Data => 0,
            Channel::Peer => 1,
        }
    }

    fn name(self) -> &'static str {
        match self {
            Channel::Data => "data",
            Channel::Peer => "peer",
        }
    }
}

/// Which way a record's bytes went.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    /// Read from the connection (what the client or peer sent).
    Received,
    /// Written to the connection (the daemon's answers).
    Sent,
}

/// The daemon's capture settings and what they have used up so far (shared by all connections).
#[derive(Debug)]
pub struct Capture {
    dir: PathBuf,
    max_connections: u64,
    max_bytes_per_connection: u64,
    max_total_bytes: u64,
    /// Files started so far (their numbers).
    started: AtomicU64,
    /// Bytes reserved by every file so far, headers included.
    total: AtomicU64,
}

impl Capture {
    /// The capture of a configuration: `None` when `capture.dir` is empty (off). Creates the folder.
    pub fn from_config(cfg: &CaptureConfig) -> std::io::Result<Option<Arc<Capture>>> {
        if cfg.dir.as_os_str().is_empty() {
            return Ok(None);
        }
        use std::os::unix::fs::DirBuilderExt;
        std::fs::DirBuilder::new().recursive(true).mode(0o700).create(&cfg.dir)?;
        tracing::warn!(
            dir = %cfg.dir.display(),
            "recording every connection's bytes (capture.dir): pages and peer handshakes are written \
             in clear (tokens redacted); for test and benchmark daemons only"
        );
        Ok(Some(Arc::new(Capture {
            dir: cfg.dir.clone(),
            max_connections: cfg.max_connections,
            max_bytes_per_connection: cfg.max_bytes_per_connection,
            max_total_bytes: cfg.max_total_bytes,
            started: AtomicU64::new(0),
            total: AtomicU64::new(0),
        })))
    }

    /// Starts the recording of a connection just accepted: off when the bounds are used up or the
    /// file cannot be created.
    pub fn start(self: &Arc<Self>, channel: Channel) -> Recorder {
        let n = self.started.fetch_add(1, Ordering::Relaxed);
        if n >= self.max_connections || !self.reserve(FILE_HEADER as u64) {
            return Recorder::off();
        }
        let path = self.dir.join(format!("{}-{}-{n}.ddcap", std::process::id(), channel.name()));
        match create_private(&path) {
            Ok(mut file) => {
                let mut head = MAGIC.to_vec();
                head.push(channel.byte());
                let since_epoch =
                    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
                head.extend_from_slice(&(since_epoch.as_micros() as u64).to_le_bytes());
                if file.write_all(&head).is_err() {
                    return Recorder::off();
                }
                Recorder(Some(Active {
                    file,
                    path,
                    written: head.len() as u64,
                    limit: self.max_bytes_per_connection,
                    at: Instant::now(),
                    capture: self.clone(),
                    redact: (channel == Channel::Data).then(Redact::default),
                }))
            }
            Err(e) => {
                tracing::warn!(path = %path.display(), error = %e, "cannot create a capture file");
                Recorder::off()
            }
        }
    }

    /// Takes `n` bytes of the total bound, or nothing when they do not fit.
    fn reserve(&self, n: u64) -> bool {
        self.total
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |t| {
                t.checked_add(n).filter(|&u| u <= self.max_total_bytes)
            })
            .is_ok()
    }
}

fn create_private(path: &Path) -> std::io::Result<File> {
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(path)
}

/// One connection's recording; every method is a no-op once it is off.
#[derive(Debug)]
pub struct Recorder(Option<Active>);

#[derive(Debug)]
struct Active {
    file: File,
    path: PathBuf,
    written: u64,
    limit: u64,
    at: Instant,
    /// Where the total bound is kept.
    capture: Arc<Capture>,
    /// Finds the HELLO's token in what a data-plane connection receives (`None` on the peer channel).
    redact: Option<Redact>,
}

/// Where a data-plane connection's token lies in the bytes it received, found as they come in.
#[derive(Debug, Default)]
struct Redact {
    /// Bytes received so far.
    seen: usize,
    /// The stream's first [`HELLO_TOKEN_AT`] bytes (the HELLO's header and fixed fields).
    prefix: Vec<u8>,
}

impl Redact {
    /// Overwrites the token bytes within `bytes`, the next received bytes of the stream.
    fn apply(&mut self, bytes: &mut [u8]) {
        let start = self.seen;
        self.seen += bytes.len();
        if self.prefix.len() < HELLO_TOKEN_AT {
            let take = (HELLO_TOKEN_AT - self.prefix.len()).min(bytes.len());
            self.prefix.extend_from_slice(&bytes[..take]);
        }
        // Until the fixed fields are in, the token cannot have started yet.
        if self.prefix.len() < HELLO_TOKEN_AT || self.prefix[3] != dd_proto::frame::Op::Hello as u8 {
            return;
        }
        let len = u16::from_le_bytes([self.prefix[HELLO_TOKEN_AT - 2], self.prefix[HELLO_TOKEN_AT - 1]]);
        let (from, to) = (HELLO_TOKEN_AT, HELLO_TOKEN_AT + len as usize);
        for (i, b) in bytes.iter_mut().enumerate() {
            if (from..to).contains(&(start + i)) {
                *b = REDACTED_BYTE;
            }
        }
    }
}

impl Recorder {
    /// A connection that is not recorded.
    pub fn off() -> Recorder {
        Recorder(None)
    }

    /// Whether this connection is being recorded.
    pub fn is_on(&self) -> bool {
        self.0.is_some()
    }

    /// Records bytes read from the connection.
    pub fn received(&mut self, bytes: &[u8]) {
        self.record(Direction::Received, bytes)
    }

    /// Records bytes written to the connection.
    pub fn sent(&mut self, bytes: &[u8]) {
        self.record(Direction::Sent, bytes)
    }

    fn record(&mut self, dir: Direction, bytes: &[u8]) {
        let Some(a) = self.0.as_mut() else { return };
        if bytes.is_empty() {
            return;
        }
        let n = (RECORD_HEADER + bytes.len()) as u64;
        if a.written + n > a.limit || !a.capture.reserve(n) {
            // The file ends here, at a record boundary.
            self.0 = None;
            return;
        }
        let mut rec = Vec::with_capacity(n as usize);
        rec.push(match dir {
            Direction::Received => 0,
            Direction::Sent => 1,
        });
        rec.extend_from_slice(&(a.at.elapsed().as_micros() as u64).to_le_bytes());
        rec.extend_from_slice(&(bytes.len() as u32).to_le_bytes());
        let at = rec.len();
        rec.extend_from_slice(bytes);
        if let (Direction::Received, Some(r)) = (dir, a.redact.as_mut()) {
            r.apply(&mut rec[at..]);
        }
        match a.file.write_all(&rec) {
            Ok(()) => a.written += n,
            Err(e) => {
                tracing::warn!(path = %a.path.display(), error = %e, "capture file write failed; it ends here");
                self.0 = None;
            }
        }
    }
}

/// One record of a capture file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    pub direction: Direction,
    /// Microseconds since the connection was accepted.
    pub at_us: u64,
    pub bytes: Vec<u8>,
}

/// A capture file read back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Recording {
    pub channel: Channel,
    /// When the connection was accepted, in microseconds since the Unix epoch.
    pub accepted_us: u64,
    pub records: Vec<Record>,
    /// Bytes at the end that do not form a whole record (a file cut short by a crash).
    pub trailing_bytes: usize,
}

impl Recording {
    /// The bytes of one direction, concatenated (the stream as the other side wrote it).
    pub fn stream(&self, direction: Direction) -> Vec<u8> {
        self.records
            .iter()
            .filter(|r| r.direction == direction)
            .flat_map(|r| r.bytes.iter().copied())
            .collect()
    }
}

/// Errors of reading a capture file.
#[derive(Debug, thiserror::Error)]
pub enum CaptureError {
    #[error("{0}: not a capture file (no DDCAPT01 magic)")]
    NotACapture(String),
    #[error("{path}: unknown channel byte {byte}")]
    Channel { path: String, byte: u8 },
    #[error("{path}: record at byte {at} has direction byte {byte}")]
    Direction { path: String, at: usize, byte: u8 },
}

/// Parses the bytes of a capture file (`name` is for errors). A truncated last record is counted in
/// `trailing_bytes`, not an error.
pub fn parse(name: &str, data: &[u8]) -> Result<Recording, CaptureError> {
    if data.len() < FILE_HEADER || &data[..MAGIC.len()] != MAGIC {
        return Err(CaptureError::NotACapture(name.to_string()));
    }
    let channel = match data[MAGIC.len()] {
        0 => Channel::Data,
        1 => Channel::Peer,
        byte => return Err(CaptureError::Channel { path: name.to_string(), byte }),
    };
    let accepted_us = u64::from_le_bytes(data[MAGIC.len() + 1..FILE_HEADER].try_into().expect("8 bytes"));
    let mut at = FILE_HEADER;
    let mut records = Vec::new();
    while data.len() - at >= RECORD_HEADER {
        let direction = match data[at] {
            0 => Direction::Received,
            1 => Direction::Sent,
            byte => return Err(CaptureError::Direction { path: name.to_string(), at, byte }),
        };
        let at_us = u64::from_le_bytes(data[at + 1..at + 9].try_into().expect("8 bytes"));
        let len = u32::from_le_bytes(data[at + 9..at + 13].try_into().expect("4 bytes")) as usize;
        if data.len() - at - RECORD_HEADER < len {
            break;
        }
        let body = at + RECORD_HEADER;
        records.push(Record { direction, at_us, bytes: data[body..body + len].to_vec() });
        at = body + len;
    }
    Ok(Recording { channel, accepted_us, records, trailing_bytes: data.len() - at })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn capture(dir: &Path, max_connections: u64, per_connection: u64, total: u64) -> Arc<Capture> {
        let cfg = CaptureConfig {
            dir: dir.to_path_buf(),
            max_connections,
            max_bytes_per_connection: per_connection,
            max_total_bytes: total,
        };
        Capture::from_config(&cfg).unwrap().expect("a directory turns capture on")
    }

    fn files(dir: &Path) -> Vec<PathBuf> {
        let mut v: Vec<PathBuf> = std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().path()).collect();
        v.sort();
        v
    }

    fn read(p: &Path) -> Recording {
        parse(&p.display().to_string(), &std::fs::read(p).unwrap()).unwrap()
    }

    #[test]
    fn an_empty_dir_is_off() {
        assert!(Capture::from_config(&CaptureConfig::default()).unwrap().is_none());
    }

    #[test]
    fn records_read_back_in_order_with_direction_and_channel() {
        let dir = tempfile::tempdir().unwrap();
        let c = capture(dir.path(), 8, 1 << 20, 1 << 20);
        let mut a = c.start(Channel::Data);
        let mut b = c.start(Channel::Peer);
        a.received(b"hello");
        a.sent(b"answer");
        a.received(b"");
        a.received(b"more");
        b.received(&[7; 300]);
        drop((a, b));
        let f = files(dir.path());
        assert_eq!(f.len(), 2);
        let pid = std::process::id();
        assert!(f[0].ends_with(format!("{pid}-data-0.ddcap")), "{f:?}");
        assert!(f[1].ends_with(format!("{pid}-peer-1.ddcap")), "{f:?}");
        let data = read(&f[0]);
        assert_eq!(data.channel, Channel::Data);
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_micros();
        assert!((now as u64).abs_diff(data.accepted_us) < 60_000_000, "{}", data.accepted_us);
        let got: Vec<(Direction, &[u8])> = data.records.iter().map(|r| (r.direction, &r.bytes[..])).collect();
        assert_eq!(
            got,
            [
                (Direction::Received, &b"hello"[..]),
                (Direction::Sent, &b"answer"[..]),
                (Direction::Received, &b"more"[..])
            ]
        );
        assert!(data.records.windows(2).all(|w| w[0].at_us <= w[1].at_us), "times never go back");
        assert_eq!(data.stream(Direction::Received), b"hellomore");
        assert_eq!(data.trailing_bytes, 0);
        let peer = read(&f[1]);
        assert_eq!((peer.channel, peer.stream(Direction::Received)), (Channel::Peer, vec![7; 300]));
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(std::fs::metadata(&f[0]).unwrap().permissions().mode() & 0o777, 0o600);
    }

    #[test]
    fn a_file_ends_at_the_record_that_would_pass_its_bound() {
        let dir = tempfile::tempdir().unwrap();
        // The file's header, then records of 13 + 10 bytes: two fit, the third does not.
        let c = capture(dir.path(), 8, FILE_HEADER as u64 + 2 * 23 + 22, 1 << 20);
        let mut r = c.start(Channel::Data);
        for i in 0..5u8 {
            r.received(&[i; 10]);
        }
        assert!(!r.is_on());
        let got = read(&files(dir.path())[0]);
        assert_eq!(got.stream(Direction::Received), [[0u8; 10], [1; 10]].concat());
        assert_eq!(got.trailing_bytes, 0);
    }

    #[test]
    fn the_total_and_the_connection_count_are_bounded() {
        let dir = tempfile::tempdir().unwrap();
        // Room for two headers (9 bytes) and three records (13 + 10): the second connection gets one.
        let h = FILE_HEADER as u64;
        let c = capture(dir.path(), 3, 1 << 20, h + 2 * 23 + h + 23);
        let mut a = c.start(Channel::Data);
        let mut b = c.start(Channel::Data);
        for _ in 0..2 {
            a.received(&[1; 10]);
        }
        for _ in 0..2 {
            b.received(&[2; 10]);
        }
        assert!(a.is_on() && !b.is_on());
        // The third connection fits no header in what is left; the fourth passes the count.
        assert!(!c.start(Channel::Data).is_on());
        assert!(!c.start(Channel::Peer).is_on());
        let f = files(dir.path());
        assert_eq!(f.len(), 2, "{f:?}");
        assert_eq!(read(&f[0]).records.len(), 2);
        assert_eq!(read(&f[1]).records.len(), 1);
    }

    #[test]
    fn a_truncated_file_parses_to_its_whole_records() {
        let mut data = MAGIC.to_vec();
        data.push(0);
        data.extend_from_slice(&1_700_000_000_000_000u64.to_le_bytes());
        for (d, bytes) in [(0u8, &b"abc"[..]), (1, b"de")] {
            data.push(d);
            data.extend_from_slice(&5u64.to_le_bytes());
            data.extend_from_slice(&(bytes.len() as u32).to_le_bytes());
            data.extend_from_slice(bytes);
        }
        let whole = parse("t", &data).unwrap();
        assert_eq!(whole.records.len(), 2);
        let cut = parse("t", &data[..data.len() - 1]).unwrap();
        assert_eq!((cut.records.len(), cut.trailing_bytes), (1, RECORD_HEADER + 1));
        assert_eq!(whole.accepted_us, 1_700_000_000_000_000);
        assert!(matches!(parse("t", b"DDCAPT00\0\0\0\0\0\0\0\0\0"), Err(CaptureError::NotACapture(_))));
        let mut bad = data.clone();
        bad[FILE_HEADER] = 9;
        assert!(matches!(parse("t", &bad), Err(CaptureError::Direction { byte: 9, .. })));
    }

    /// Issue 30, item 5: capture recorded VM data tokens in clear, and created its folder 0755.
    #[test]
    fn capture_redacts_tokens_and_creates_its_folder_private() {
        let top = tempfile::tempdir().unwrap();
        let dir = top.path().join("made").join("here");
        let c = capture(&dir, 8, 1 << 20, 1 << 20);
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(std::fs::metadata(&dir).unwrap().permissions().mode() & 0o777, 0o700);
        let token = b"the-secret-data-token-of-vm-1";
        let mut stream = Vec::new();
        dd_proto::Request::Hello { min_version: 1, max_version: 2, vm: 1, token }.encode(2, 1, &mut stream);
        dd_proto::Request::VmStats.encode(2, 2, &mut stream);
        let mut want = stream.clone();
        want[HELLO_TOKEN_AT..HELLO_TOKEN_AT + token.len()].fill(REDACTED_BYTE);
        // Whole, byte by byte, and split inside the length and inside the token.
        for cuts in [vec![], (1..stream.len()).collect::<Vec<_>>(), vec![29, 35, 50]] {
            let mut r = c.start(Channel::Data);
            let mut at = 0;
            for cut in cuts.into_iter().chain([stream.len()]) {
                r.received(&stream[at..cut]);
                at = cut;
            }
            drop(r);
        }
        for f in files(&dir) {
            let got = read(&f).stream(Direction::Received);
            assert_eq!(got, want, "{f:?}");
            let raw = std::fs::read(&f).unwrap();
            assert!(!raw.windows(token.len()).any(|w| w == token), "{f:?} holds the token");
        }
        assert_eq!(files(&dir).len(), 3);
    }
}
