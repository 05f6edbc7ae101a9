//! Unit tests of the frontend without a daemon: first-level hits, write and truncation invalidation,
//! changes behind the mount, the budget.

use super::*;
use std::io::Write;

/// A frontend without a daemon over one backing file holding `data`, read by the unattributed
/// container.
struct Setup {
    _dir: tempfile::TempDir,
    path: std::path::PathBuf,
    fe: Frontend,
    c: Arc<Container>,
    f: File,
    obj: Arc<Object>,
}

fn setup(data: &[u8], budget_pages: u64) -> Setup {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("f");
    std::fs::File::create(&path).unwrap().write_all(data).unwrap();
    let cfg = FuseConfig { default_budget_bytes: budget_pages * PAGE_SIZE as u64, ..FuseConfig::default() };
    let fe = Frontend::new(cfg).unwrap();
    let c = fe.container_for_pid(0);
    let f = std::fs::OpenOptions::new().read(true).write(true).open(&path).unwrap();
    let obj = fe.object(f.metadata().unwrap().ino());
    Setup { _dir: dir, path, fe, c, f, obj }
}

#[test]
fn reads_hit_the_first_level_and_writes_invalidate_it() {
    let data: Vec<u8> = (0..3 * PAGE_SIZE + 100).map(|i| (i % 251) as u8).collect();
    let Setup { _dir: _d, path: p, fe, c, f, obj } = setup(&data, 16);
    assert_eq!(fe.read(&c, &obj, &f, 0, data.len()).unwrap(), data);
    assert_eq!(fe.read(&c, &obj, &f, 10, 5000).unwrap(), &data[10..5010]);
    let s = &fe.stats()[0];
    assert_eq!((s.backing_pages, s.backing_reads), (4, 1));
    assert_eq!(s.l1_hits, 2);
    // A write through the frontend is what the next read sees.
    fe.write(&obj, &f, PAGE_SIZE as u64 - 2, b"XYZW", false).unwrap();
    let got = fe.read(&c, &obj, &f, 0, data.len()).unwrap();
    assert_eq!(&got[PAGE_SIZE - 2..PAGE_SIZE + 2], b"XYZW");
    assert_eq!(got, std::fs::read(&p).unwrap());
    // Reads past the end are empty; a truncation is seen.
    assert!(fe.read(&c, &obj, &f, 10 * PAGE_SIZE as u64, 10).unwrap().is_empty());
    fe.change_whole(&obj, || f.set_len(10)).unwrap();
    assert_eq!(fe.read(&c, &obj, &f, 0, 4096).unwrap(), &data[..10]);
}

#[test]
fn changes_behind_the_mounts_back_are_seen() {
    let Setup { _dir: _d, path: p, fe, c, f, obj } = setup(&[1u8; 2 * PAGE_SIZE], 16);
    assert_eq!(fe.read(&c, &obj, &f, 0, 8).unwrap(), vec![1u8; 8]);
    // A different size changes the stamp whatever the timestamp granularity.
    std::fs::write(&p, vec![2u8; 3 * PAGE_SIZE]).unwrap();
    assert_eq!(fe.read(&c, &obj, &f, 0, 8).unwrap(), vec![2u8; 8]);
}

#[test]
fn first_level_stays_within_budget_and_counts_drops_without_a_pool() {
    let Setup { _dir: _d, fe, c, f, obj, .. } = setup(&[7u8; 10 * PAGE_SIZE], 4);
    for i in 0..10u64 {
        assert_eq!(fe.read(&c, &obj, &f, i * PAGE_SIZE as u64, PAGE_SIZE).unwrap(), vec![7u8; PAGE_SIZE]);
    }
    let s = &fe.stats()[0];
    assert_eq!(s.l1_pages, 4);
    assert_eq!(s.puts_dropped, 6);
    assert_eq!(s.puts, 0);
}

#[test]
fn change_range_drops_the_cached_pages_of_the_range_it_changed_and_keeps_the_others() {
    let Setup { _dir: _d, fe, c, f, obj, .. } = setup(&[5u8; 4 * PAGE_SIZE], 16);
    assert_eq!(fe.read(&c, &obj, &f, 0, 4 * PAGE_SIZE).unwrap(), vec![5u8; 4 * PAGE_SIZE]);
    // What a punched hole does to page 1, by other means.
    let zeros = [0u8; PAGE_SIZE];
    fe.change_range(&obj, &f, PAGE_SIZE as u64, Some(PAGE_SIZE as u64), || {
        f.write_at(&zeros, PAGE_SIZE as u64)
    })
    .unwrap();
    let got = fe.read(&c, &obj, &f, 0, 4 * PAGE_SIZE).unwrap();
    assert_eq!(&got[PAGE_SIZE..2 * PAGE_SIZE], &zeros[..]);
    assert_eq!(&got[..PAGE_SIZE], &[5u8; PAGE_SIZE][..]);
    let s = &fe.stats()[0];
    // Only the changed page came from the backing file again.
    assert_eq!((s.backing_pages, s.l1_hits), (5, 3));
}
