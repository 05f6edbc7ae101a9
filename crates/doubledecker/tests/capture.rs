//! Recording connections for fuzzing corpora (`[capture]`, `dd_server::capture`; issue 17, item 5):
//! the real daemon writes what each data-plane connection received and sent, in order, to a file of its
//! own, readable back into the exact frames of the exchange; `DD_CAPTURE_DIR` (the `serve
//! --capture-dir` flag's variable) turns it on for daemons that tools start, within the bounds.

mod common;

use common::{page, vm, Daemon};
use dd_engine::{Key, PoolOptions, Spec};
use dd_proto::frame::split_frame;
use dd_proto::{Op, Request, Response, HEADER_LEN};
use dd_server::capture::{parse, Channel, Direction, Recording};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

fn captures(dir: &Path) -> Vec<(PathBuf, Recording)> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().path()).collect();
    v.sort();
    v.into_iter()
        .map(|p| {
            let rec = parse(&p.display().to_string(), &std::fs::read(&p).unwrap()).unwrap();
            (p, rec)
        })
        .collect()
}

/// The frames of one direction: (op, request id, payload).
fn frames(rec: &Recording, dir: Direction) -> Vec<(u8, u64, Vec<u8>)> {
    let stream = rec.stream(dir);
    let mut at = 0;
    let mut out = Vec::new();
    while let Some((h, n)) = split_frame(&stream[at..], u32::MAX).unwrap() {
        out.push((h.op, h.request_id, stream[at + HEADER_LEN..at + n].to_vec()));
        at += n;
    }
    assert_eq!(at, stream.len(), "the recording ends at a frame boundary");
    out
}

#[test]
fn every_connection_is_recorded_frame_for_frame() {
    let v = vm(1);
    let cap = tempfile::tempdir().unwrap();
    let extra = format!("[capture]\ndir = {:?}\n", cap.path().display().to_string());
    let mut d = Daemon::start(&[&v], &extra);
    let data = page(7, 3, 4);
    for mut c in [d.tcp_client(&v), d.unix_client(&v)] {
        let pool = c.create_cgroup(PoolOptions::ephemeral(Spec::Mem { weight: 10 })).unwrap();
        c.put(pool, Key::new(3, 4), &data).unwrap();
        let mut out = vec![0u8; 4096];
        assert!(c.get(pool, Key::new(3, 4), &mut out).unwrap());
    }
    assert!(d.stop());

    let caps = captures(cap.path());
    assert_eq!(caps.len(), 2, "one file per connection: {caps:?}");
    for (path, rec) in &caps {
        let name = path.file_name().unwrap().to_string_lossy();
        assert!(name.contains("-data-") && name.ends_with(".ddcap"), "{name}");
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(std::fs::metadata(path).unwrap().permissions().mode() & 0o777, 0o600, "{name}");
        assert_eq!((rec.channel, rec.trailing_bytes), (Channel::Data, 0));
        let sent = frames(rec, Direction::Received);
        let ops: Vec<u8> = sent.iter().map(|f| f.0).collect();
        assert_eq!(ops, [Op::Hello, Op::CreatePool, Op::Put, Op::Get].map(|o| o as u8), "{name}");
        match Request::decode(sent[0].0, &sent[0].2, 256).unwrap() {
            // The token is redacted: as long as the real one, every byte the fixed one.
            Request::Hello { vm, token, .. } => {
                assert_eq!((vm, token), (1, &vec![dd_server::capture::REDACTED_BYTE; v.data_token.len()][..]))
            }
            other => panic!("{other:?}"),
        }
        match Request::decode(sent[2].0, &sent[2].2, 256).unwrap() {
            Request::Put { key, data: d, .. } => assert_eq!((key, d), (Key::new(3, 4), &data[..])),
            other => panic!("{other:?}"),
        }
        // Each answer in its turn, to its request; the get's answer holds the page.
        let answers = frames(rec, Direction::Sent);
        let ids = |v: &[(u8, u64, Vec<u8>)]| v.iter().map(|f| (f.0, f.1)).collect::<Vec<_>>();
        assert_eq!(ids(&answers), ids(&sent), "{name}");
        let stream = rec.stream(Direction::Sent);
        let mut at = 0;
        let mut last = None;
        while let Some((h, n)) = split_frame(&stream[at..], u32::MAX).unwrap() {
            last = Some(Response::decode(&h, &stream[at + HEADER_LEN..at + n]).unwrap());
            at += n;
        }
        assert_eq!(last, Some(Response::Get(Some(data.clone()))), "{name}");
        let times: Vec<u64> = rec.records.iter().map(|r| r.at_us).collect();
        assert!(times.windows(2).all(|w| w[0] <= w[1]), "{name}: {times:?}");
    }
}

#[test]
fn the_environment_turns_capture_on_within_its_connection_bound() {
    let v = vm(1);
    let cap = tempfile::tempdir().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let ready = dir.path().join("ready.json");
    let cfg = dd_daemonkit::ServeConfig {
        data_dir: dir.path(),
        ready_file: &ready,
        unix_socket: "",
        host_token: common::HOST_TOKEN,
        top: "ssd_enabled = false\n",
        mem: "capacity_bytes = 4194304\n",
        ssd: None,
        extra: "[capture]\nmax_connections = 1\n",
        vms: vec![(v.id, &v.data_token, &v.admin_token, "")],
    }
    .to_toml();
    let cfg_path = dir.path().join("dd.toml");
    std::fs::write(&cfg_path, cfg).unwrap();
    let log = dir.path().join("stderr.log");
    let mut child = std::process::Command::new(common::dd_bin())
        .args(["serve", "--config"])
        .arg(&cfg_path)
        .env("DD_CAPTURE_DIR", cap.path())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    let tcp: std::net::SocketAddr = loop {
        if let Ok(t) = std::fs::read_to_string(&ready) {
            let j: serde_json::Value = serde_json::from_str(&t).unwrap();
            break j["tcp"].as_str().unwrap().parse().unwrap();
        }
        assert!(Instant::now() < deadline && child.try_wait().unwrap().is_none(), "the daemon did not start");
        std::thread::sleep(Duration::from_millis(20));
    };
    for _ in 0..3 {
        let mut c = dd_client::Client::connect_tcp(tcp, v.id, &v.data_token).unwrap();
        c.ping().unwrap();
    }
    let _ = child.kill();
    let _ = child.wait();
    let caps = captures(cap.path());
    assert_eq!(caps.len(), 1, "capture.max_connections = 1: {caps:?}");
    let ops: Vec<u8> = frames(&caps[0].1, Direction::Received).iter().map(|f| f.0).collect();
    assert_eq!(ops, [Op::Hello as u8, Op::Ping as u8]);
    // Issue 30, item 5: capture said nothing at start-up. Now it warns, once, whatever the connections.
    let log = std::fs::read_to_string(&log).unwrap();
    let warnings =
        log.lines().filter(|l| l.contains("WARN") && l.contains("recording every connection")).count();
    assert_eq!(warnings, 1, "{log}");
}
