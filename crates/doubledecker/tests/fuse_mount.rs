//! Acceptance test of the FUSE filesystem (issue 7, test 1): the real daemon, the real cgroup watcher
//! and the real `doubledecker mount` run as processes; two real cgroups with different weights run real
//! programs (`sha256sum`, `cat`, `sqlite3`) over the mount. The daemon's per-pool statistics must show
//! each container's pages in its own pool, hits on re-reads after first-level eviction, and a file read
//! by the second container migrating; every checksum must match the backing files.
//! Skipped, with a message, where FUSE or a memory cgroup controller is unavailable (needs root).

mod common;
mod fusekit;

use common::*;
use dd_engine::{PoolId, PoolStats, Spec};
use fusekit::*;
use std::process::Command;

fn pool_stats(d: &Daemon, v: &TestVm, pool: u32) -> PoolStats {
    d.unix_client(v).pool_stats(PoolId(pool)).unwrap()
}

fn sums(paths: &str) -> Vec<String> {
    let out = Command::new("sh").arg("-c").arg(format!("sha256sum {paths}")).output().unwrap();
    assert!(out.status.success());
    String::from_utf8(out.stdout).unwrap().lines().map(|l| l.split(' ').next().unwrap().to_string()).collect()
}

#[test]
fn containers_on_the_mount_use_their_own_pools() {
    let Some(root) = require("containers_on_the_mount_use_their_own_pools") else { return };
    if Command::new("sqlite3").arg("-version").output().is_err() {
        skipped(
            &["sqlite3"],
            "containers_on_the_mount_use_their_own_pools: no sqlite3 (apt-get install sqlite3)",
        );
        return;
    }
    let v = vm(2);
    let d = Daemon::start(&[&v], "");
    let groups = Cgroups::new(&root, "it", &["web", "db"]);
    let work = tempfile::tempdir().unwrap();
    let (back, mnt) = (work.path().join("back"), work.path().join("mnt"));
    std::fs::create_dir_all(&back).unwrap();
    std::fs::create_dir_all(&mnt).unwrap();

    // The watcher: a pool per container, web weighted twice db.
    let watch_cfg = watch_config(
        work.path(),
        &d.unix,
        2,
        &v.data_token,
        &groups.parent,
        &[("web", "mem", 60), ("db", "mem", 30)],
    );
    let mut watcher = Proc::spawn(
        "guest watch",
        Command::new(env!("CARGO_BIN_EXE_doubledecker")).args(["guest", "watch", "--config"]).arg(&watch_cfg),
    );
    let state =
        wait_for_file(&work.path().join("pools.json"), |t| t.contains("\"web\"") && t.contains("\"db\""));
    let state: serde_json::Value = serde_json::from_str(&state).unwrap();
    let (web, db) = (
        state["pools"]["web"]["pool"].as_u64().unwrap() as u32,
        state["pools"]["db"]["pool"].as_u64().unwrap() as u32,
    );
    assert_eq!(pool_stats(&d, &v, web).spec, Spec::Mem { weight: 60 });
    assert_eq!(pool_stats(&d, &v, db).spec, Spec::Mem { weight: 30 });

    // Files: 4 MiB for web and 2 MiB for db, against 1 MiB (web) and 512 KiB (db) first levels.
    for i in 0..4 {
        std::fs::write(back.join(format!("w{i}")), bytes(i, 1 << 20)).unwrap();
    }
    for i in 0..2 {
        std::fs::write(back.join(format!("d{i}")), bytes(100 + i, 1 << 20)).unwrap();
    }
    let cfg = mount_config(
        work.path(),
        &d.unix,
        2,
        &v.data_token,
        &groups.parent,
        "default_budget_bytes = 1048576\n[containers.db]\nbudget_bytes = 524288\n",
    );
    let mut mount = MountProc::start(&back, &mnt, &cfg);
    let m = mnt.display();
    let b = back.display();

    // web reads its files three times: the first pass fills its first level, whose evictions go to its
    // pool; re-reads hit the pool.
    let expected = sums(&format!("{b}/w0 {b}/w1 {b}/w2 {b}/w3"));
    for pass in 0..3 {
        let got = sh_in(&groups.child("web"), &format!("sha256sum {m}/w0 {m}/w1 {m}/w2 {m}/w3"));
        let got: Vec<String> = got.lines().map(|l| l.split(' ').next().unwrap().to_string()).collect();
        assert_eq!(got, expected, "pass {pass}: checksums through the mount match the backing files");
    }
    let w = pool_stats(&d, &v, web).counters;
    assert!(w.mem.puts > 0, "web's evicted pages were put to web's pool: {w:?}");
    assert!(w.mem.gets_hit > 0, "re-reads after first-level eviction hit web's pool: {w:?}");
    let dbs = pool_stats(&d, &v, db).counters;
    assert_eq!((dbs.mem.puts, dbs.mem.used), (0, 0), "nothing of web's is in db's pool: {dbs:?}");

    // db: cat and a real sqlite3 database on the mount, then re-reads after evicting it.
    let dexp = sums(&format!("{b}/d0 {b}/d1"));
    sh_in(
        &groups.child("db"),
        &format!(
            "sqlite3 {m}/db.sqlite \"create table t(k integer primary key, v blob); with recursive \
             n(i) as (select 1 union all select i + 1 from n where i < 20000) insert into t select i, \
             randomblob(200) from n;\""
        ),
    );
    for _ in 0..2 {
        sh_in(&groups.child("db"), &format!("cat {m}/d0 {m}/d1 > /dev/null"));
        let q = sh_in(
            &groups.child("db"),
            &format!(
                "sqlite3 {m}/db.sqlite 'pragma integrity_check; select count(*), sum(length(v)) from t;'"
            ),
        );
        assert_eq!(q.trim(), "ok\n20000|4000000");
        let got = sh_in(&groups.child("db"), &format!("sha256sum {m}/d0 {m}/d1 {m}/db.sqlite"));
        let got: Vec<String> = got.lines().map(|l| l.split(' ').next().unwrap().to_string()).collect();
        assert_eq!(got[..2], dexp[..], "db's files match the backing files");
        assert_eq!(got[2], sums(&format!("{b}/db.sqlite"))[0], "the database matches the backing file");
    }
    let dbs = pool_stats(&d, &v, db).counters;
    assert!(dbs.mem.puts > 0 && dbs.mem.gets_hit > 0, "db's pages live and hit in db's pool: {dbs:?}");

    // db now reads a file web read first: it migrates to db's pool, and still reads right.
    let got = sh_in(&groups.child("db"), &format!("sha256sum {m}/w0"));
    assert_eq!(got.split(' ').next().unwrap(), expected[0]);
    let (w, dbs) = (pool_stats(&d, &v, web).counters, pool_stats(&d, &v, db).counters);
    assert!(dbs.migrations_in > 0 && w.migrations_out > 0, "w0 migrated from web to db: {w:?} {dbs:?}");

    // Symbolic and hard links through the mount reach the same files.
    let out = sh_in(
        &groups.child("db"),
        &format!(
            "ln -s w1 {m}/lnk && ln {m}/d0 {m}/d0.hard && readlink {m}/lnk && sha256sum {m}/lnk {m}/d0.hard"
        ),
    );
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines[0], "w1");
    assert_eq!(lines[1].split(' ').next().unwrap(), expected[1]);
    assert_eq!(lines[2].split(' ').next().unwrap(), dexp[0]);

    // Shutdown leaves nothing behind: unmounted, the mount's pages flushed, pools destroyed.
    let (ok, stats) = mount.stop();
    assert!(ok, "doubledecker mount exits cleanly on SIGTERM");
    assert!(!is_mounted(&mnt));
    let names: Vec<&str> =
        stats["containers"].as_array().unwrap().iter().map(|c| c["name"].as_str().unwrap()).collect();
    assert!(names.contains(&"web") && names.contains(&"db"), "requests were attributed: {stats}");
    for p in [web, db] {
        assert_eq!(pool_stats(&d, &v, p).counters.mem.used, 0, "unmount flushed pool {p}");
    }
    let (ok, _) = watcher.term();
    assert!(ok);
    assert!(!work.path().join("pools.json").exists());
    assert!(d.unix_client(&v).list_pools().unwrap().is_empty());
}
