//! Coherence of the FUSE filesystem (issue 7, test 2): concurrent writers and readers, truncation,
//! rename and delete through the mount never return stale data. The test process itself runs inside a
//! container cgroup with a 16-page first level, so its reads go through the first level, the pool (the
//! real daemon) and the backing directory; it compares what the mount returns with direct reads of the
//! backing directory and with the versions writers have completed.
//! Skipped, with a message, where FUSE or a memory cgroup controller is unavailable (needs root).

mod common;
mod fusekit;

use common::*;
use dd_engine::PoolId;
use fusekit::*;
use std::fs::OpenOptions;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

const PS: usize = 4096;
const PAGES: usize = 64;

/// A page of version `v` of page `p`: every 8-byte word is (v, p).
fn versioned(v: u32, p: u32) -> Vec<u8> {
    let mut b = Vec::with_capacity(PS);
    while b.len() < PS {
        b.extend_from_slice(&v.to_le_bytes());
        b.extend_from_slice(&p.to_le_bytes());
    }
    b
}

/// The version of a page read back; panics if the page mixes versions or is another page's.
fn version_of(page: &[u8], p: u32) -> u32 {
    let v = u32::from_le_bytes(page[..4].try_into().unwrap());
    assert_eq!(page, versioned(v, p).as_slice(), "page {p} is torn or not page {p}");
    v
}

/// Writers publish each version after its write returns; readers must never see an older one.
fn concurrent_writers_and_readers(mnt: &Path) {
    let path = mnt.join("shared");
    let init: Vec<u8> = (0..PAGES as u32).flat_map(|p| versioned(0, p)).collect();
    std::fs::write(&path, &init).unwrap();
    let published: Arc<Vec<AtomicU64>> = Arc::new((0..PAGES).map(|_| AtomicU64::new(0)).collect());
    let mut threads = Vec::new();
    for w in 0..2u32 {
        let (path, published) = (path.clone(), published.clone());
        threads.push(std::thread::spawn(move || {
            let f = OpenOptions::new().write(true).open(&path).unwrap();
            for v in 1..=40u32 {
                for p in (w as usize..PAGES).step_by(2) {
                    f.write_all_at(&versioned(v, p as u32), (p * PS) as u64).unwrap();
                    published[p].store(v as u64, Ordering::Release);
                }
            }
        }));
    }
    for r in 0..2u64 {
        let (path, published) = (path.clone(), published.clone());
        threads.push(std::thread::spawn(move || {
            let f = std::fs::File::open(&path).unwrap();
            let mut buf = vec![0u8; 8 * PS];
            for i in 0..1500u64 {
                // Single pages and 8-page runs (batched pool gets), spread over the file.
                let n = if i % 3 == 0 { 8 } else { 1 };
                let first = ((i * 7 + r * 13) % (PAGES - n + 1) as u64) as usize;
                let floor: Vec<u64> =
                    (first..first + n).map(|p| published[p].load(Ordering::Acquire)).collect();
                f.read_exact_at(&mut buf[..n * PS], (first * PS) as u64).unwrap();
                for k in 0..n {
                    let v = version_of(&buf[k * PS..(k + 1) * PS], (first + k) as u32);
                    assert!(
                        v as u64 >= floor[k],
                        "stale page {}: version {v} after {} completed",
                        first + k,
                        floor[k]
                    );
                }
            }
        }));
    }
    for t in threads {
        t.join().unwrap();
    }
}

/// Each thread owns a few files and applies seeded random operations to them (write, truncate, rename,
/// delete and recreate), checking after each that the mount shows exactly the backing file. Threads run
/// at once, so one thread's reads evict and put another's pages while it changes them.
fn random_operations(mnt: &Path, back: &Path) {
    let mut threads = Vec::new();
    for t in 0..3u64 {
        let (mnt, back) = (mnt.to_path_buf(), back.to_path_buf());
        threads.push(std::thread::spawn(move || {
            use rand::{Rng, SeedableRng};
            let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(t);
            // Each file lives under one of two names; `names[i]` is the current one.
            let mut names: Vec<PathBuf> = (0..3).map(|i| PathBuf::from(format!("t{t}f{i}.a"))).collect();
            for n in &names {
                std::fs::write(mnt.join(n), bytes(t * 1000, 20 * PS)).unwrap();
            }
            let check = |n: &Path, what: &str| {
                let via = std::fs::read(mnt.join(n)).unwrap();
                let direct = std::fs::read(back.join(n)).unwrap();
                assert!(via == direct, "{}: mount and backing differ after {what}", n.display());
            };
            for step in 0..250u64 {
                let i = rng.gen_range(0..names.len());
                let n = names[i].clone();
                let what = match rng.gen_range(0..10) {
                    0..=4 => {
                        let len = rng.gen_range(1..3 * PS);
                        let off = rng.gen_range(0..24 * PS) as u64;
                        let f = OpenOptions::new().write(true).open(mnt.join(&n)).unwrap();
                        f.write_all_at(&bytes(step, len), off).unwrap();
                        "write"
                    }
                    5 | 6 => {
                        let f = OpenOptions::new().write(true).open(mnt.join(&n)).unwrap();
                        f.set_len(rng.gen_range(0..24 * PS) as u64).unwrap();
                        "truncate"
                    }
                    7 | 8 => {
                        let other = n.with_extension(if n.extension().unwrap() == "a" { "b" } else { "a" });
                        // Sometimes onto a file of the other name that exists: an overwriting rename.
                        if rng.gen_bool(0.5) {
                            std::fs::write(mnt.join(&other), bytes(step + 7, 5 * PS)).unwrap();
                            check(&other, "writing a rename target");
                        }
                        std::fs::rename(mnt.join(&n), mnt.join(&other)).unwrap();
                        assert!(
                            std::fs::metadata(mnt.join(&n)).is_err(),
                            "{} still there after rename",
                            n.display()
                        );
                        names[i] = other;
                        "rename"
                    }
                    _ => {
                        std::fs::remove_file(mnt.join(&n)).unwrap();
                        assert!(std::fs::metadata(back.join(&n)).is_err());
                        std::fs::write(mnt.join(&n), bytes(step + 3, rng.gen_range(1..20 * PS))).unwrap();
                        "delete and recreate"
                    }
                };
                check(&names[i], what);
                // Read the other files too, so that pages of this one are evicted and come back.
                for m in &names {
                    check(m, "reading around");
                }
            }
        }));
    }
    for t in threads {
        t.join().unwrap();
    }
}

#[test]
fn the_mount_never_returns_stale_data() {
    let Some(root) = require("the_mount_never_returns_stale_data") else { return };
    let v = vm(3);
    let d = Daemon::start(&[&v], "");
    let groups = Cgroups::new(&root, "coh", &["c"]);
    let work = tempfile::tempdir().unwrap();
    let (back, mnt) = (work.path().join("back"), work.path().join("mnt"));
    std::fs::create_dir_all(&back).unwrap();
    std::fs::create_dir_all(&mnt).unwrap();
    // The pool, made by the real watcher (one round), published in the state file the mount reads.
    let watch: dd_guest::WatchConfig = toml::from_str(&format!(
        "cgroup_parent = {:?}\nstate_file = {:?}\n[daemon]\nunix_socket = {:?}\nvm = 3\ndata_token = {:?}\n",
        groups.parent.display().to_string(),
        work.path().join("pools.json").display().to_string(),
        d.unix.display().to_string(),
        v.data_token
    ))
    .unwrap();
    let mut watcher = dd_guest::Watcher::new(watch).unwrap();
    watcher.round().unwrap();
    let pool = watcher.pools()["c"].pool;
    let cfg = mount_config(
        work.path(),
        &d.unix,
        3,
        &v.data_token,
        &groups.parent,
        "default_budget_bytes = 65536\nthreads = 4\n",
    );
    let mut mount = MountProc::start(&back, &mnt, &cfg);
    // From here on this process's reads and writes are the container's.
    groups.enter("c");

    concurrent_writers_and_readers(&mnt);
    random_operations(&mnt, &back);

    let s = d.unix_client(&v).pool_stats(PoolId(pool.0)).unwrap().counters;
    assert!(s.mem.puts > 0 && s.mem.gets_hit > 0, "the test went through the pool: {s:?}");
    assert!(s.mem.flushes > 0, "writes and deletes flushed pool pages: {s:?}");
    let (ok, stats) = mount.stop();
    assert!(ok && !is_mounted(&mnt));
    let c = stats["containers"].as_array().unwrap().iter().find(|c| c["name"] == "c").cloned().unwrap();
    assert!(c["pool_hits"].as_u64().unwrap() > 0 && c["l1_hits"].as_u64().unwrap() > 0, "{c}");
    watcher.shutdown().unwrap();
}
