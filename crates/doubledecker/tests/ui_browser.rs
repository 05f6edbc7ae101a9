//! `/ui/` in a real browser: headless Chromium (Debian's `chromium`, installed by .ci/run) opens the
//! page of a real daemon while two VMs put pages into two containers each, waits until the page shows
//! data, and checks from its DOM that both VMs' containers appear with non-zero use; with one VM's admin
//! token only that VM appears; VM 2's guest provisioner (the real `doubledecker guest provision`, one
//! round over what a mount would publish) reports its targets and decisions, which the page shows for
//! VM 2 and only to those who may see VM 2; with the daemon gone while the page is open (a proxy that
//! starts dropping the API's requests) the page says it is unreachable.
//!
//! History (issue 31, acceptance 1): the daemon samples every second here (`[history] interval_ms`);
//! after a minute of traffic a fresh browser (a reload: the page's own memory is gone) finds at least 30
//! points on every chart, the containers under the names they were given (VM 1's over the data plane,
//! as the watcher names them; VM 2's over the admin API), sizes in MiB, and `/metrics` carries the
//! names and the provisioner's targets and decisions. A screenshot is taken and checked (its pixels
//! hold the first two containers' colours: charts were drawn); it replaces `docs/ui.png` only with
//! `DD_UPDATE_SCREENSHOT=1` (a test run leaves the checkout as it found it).
//!
//! Chromium runs in a memory cgroup of its own (2 GiB) when the test may create one, so that it cannot
//! take the shared machine's memory.

mod common;

use common::{page, vm, Daemon, HOST_TOKEN};
use dd_engine::{Key, PoolOptions, Spec};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

fn chromium() -> String {
    for c in ["chromium", "chromium-browser", "google-chrome"] {
        if Command::new("sh")
            .args(["-c", &format!("command -v {c}")])
            .output()
            .is_ok_and(|o| o.status.success())
        {
            return c.to_string();
        }
    }
    panic!("no chromium on PATH (Debian package `chromium`; .ci/run installs it)");
}

/// A memory cgroup for the browser under this process's own (v1 or v2), if one can be made.
struct BrowserCgroup(Option<PathBuf>);

impl BrowserCgroup {
    fn new() -> BrowserCgroup {
        let own = std::fs::read_to_string("/proc/self/cgroup").unwrap_or_default();
        let name = format!("dd-ui-test-{}", std::process::id());
        for l in own.lines() {
            let mut f = l.splitn(3, ':');
            let (_, ctrl, path) = (f.next(), f.next().unwrap_or(""), f.next().unwrap_or(""));
            let (dir, limit_file) = match ctrl {
                "memory" => (
                    Path::new("/sys/fs/cgroup/memory").join(path.trim_start_matches('/')),
                    "memory.limit_in_bytes",
                ),
                "" if Path::new("/sys/fs/cgroup/cgroup.controllers").exists() => {
                    (Path::new("/sys/fs/cgroup").join(path.trim_start_matches('/')), "memory.max")
                }
                _ => continue,
            };
            let cg = dir.join(&name);
            if std::fs::create_dir(&cg).is_ok() {
                if std::fs::write(cg.join(limit_file), (2u64 << 30).to_string()).is_ok() {
                    return BrowserCgroup(Some(cg));
                }
                let _ = std::fs::remove_dir(&cg);
            }
        }
        BrowserCgroup(None)
    }

    /// Runs chromium with `args` (inside the cgroup when there is one); returns its standard output.
    fn run(&self, args: &[String]) -> String {
        let mut script = String::new();
        if let Some(cg) = &self.0 {
            script.push_str(&format!("echo $$ > '{}/cgroup.procs' && ", cg.display()));
        }
        script.push_str("exec \"$@\"");
        let profile = tempfile::tempdir().unwrap();
        let out = Command::new("timeout")
            .args(["120", "sh", "-c", &script, "sh", &chromium()])
            .args(["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--hide-scrollbars"])
            .arg(format!("--user-data-dir={}", profile.path().display()))
            .args(args)
            .output()
            .expect("run chromium");
        String::from_utf8_lossy(&out.stdout).into_owned()
    }
}

impl Drop for BrowserCgroup {
    fn drop(&mut self) {
        if let Some(cg) = &self.0 {
            // The browser has exited; an empty cgroup can be removed.
            for _ in 0..50 {
                if std::fs::remove_dir(cg).is_ok() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(100));
            }
        }
    }
}

/// The page's DOM after it has polled for a few (virtual) seconds.
fn dom(b: &BrowserCgroup, url: &str) -> String {
    b.run(&["--virtual-time-budget=6000".to_string(), "--dump-dom".to_string(), url.to_string()])
}

/// `(vm, pool, used)` of every container row of the page.
fn containers(dom: &str) -> Vec<(u32, u32, u64)> {
    let attr = |s: &str, name: &str| -> Option<u64> {
        let i = s.find(&format!("{name}=\""))? + name.len() + 2;
        s[i..].split('"').next()?.parse().ok()
    };
    dom.split("<tr ")
        .skip(1)
        .filter(|s| s.contains("class=\"container\""))
        .filter_map(|s| {
            let head = s.split('>').next()?;
            Some((attr(head, "data-vm")? as u32, attr(head, "data-pool")? as u32, attr(head, "data-used")?))
        })
        .collect()
}

/// `(chart kind, vm, points, series names)` of every chart of the page.
fn charts(dom: &str) -> Vec<(String, u32, usize, String)> {
    let attr = |s: &str, name: &str| -> Option<String> {
        Some(s.split(&format!("{name}=\"")).nth(1)?.split('"').next()?.to_string())
    };
    dom.split("<canvas ")
        .skip(1)
        .filter_map(|s| {
            let head = s.split('>').next()?;
            Some((
                attr(head, "data-chart")?,
                attr(head, "data-vm")?.parse().ok()?,
                attr(head, "data-points")?.parse().ok()?,
                attr(head, "data-series")?,
            ))
        })
        .collect()
}

/// Pixels of a PNG within a small distance of `rgb` (anti-aliased strokes and the fills' blends of
/// the colour over white are near it, not always equal).
fn pixels_near(png_path: &Path, rgb: [u8; 3]) -> usize {
    let decoder = png::Decoder::new(std::fs::File::open(png_path).unwrap());
    let mut reader = decoder.read_info().unwrap();
    let mut buf = vec![0; reader.output_buffer_size()];
    let info = reader.next_frame(&mut buf).unwrap();
    let step = info.color_type.samples();
    buf[..info.buffer_size()]
        .chunks(step)
        .filter(|p| p.len() >= 3 && (0..3).all(|i| (p[i] as i32 - rgb[i] as i32).abs() <= 24))
        .count()
}

/// The `data-container` names of the provisioner's decision rows of `vm` on the page.
fn decisions(dom: &str, vm: u32) -> Vec<String> {
    dom.split("<tr ")
        .skip(1)
        .filter(|s| s.contains("class=\"decision\"") && s.contains(&format!("data-vm=\"{vm}\"")))
        .filter_map(|s| Some(s.split("data-container=\"").nth(1)?.split('"').next()?.to_string()))
        .collect()
}

/// One round of the real guest provisioner for VM 2, applied and reported to the admin API: over what a
/// mount would publish for two containers that loop over 1,000 and 2,000 pages (their curves computed
/// exactly from those loops), with the watcher's map naming VM 2's two pools.
fn provision_vm2(d: &Daemon, v2: &common::TestVm) {
    use dd_guest::mount_stats::{ContainerStats, MountStats, PublishedContainer, ReadTimesSnapshot};
    use dd_mrc::{Curve, ExactLru, Mrc, Unit};
    let dir = tempfile::tempdir().unwrap();
    let mut c = d.tcp_client(v2);
    let deadline = Instant::now() + Duration::from_secs(60);
    let pools = loop {
        let mut p = c.list_pools().unwrap();
        if p.len() == 2 {
            p.sort();
            break p;
        }
        assert!(Instant::now() < deadline, "VM 2's load never made its pools");
        std::thread::sleep(Duration::from_millis(50));
    };
    let instance = c.info().instance.unwrap();
    let published = |name: &str, pages: u64| {
        let mut m = ExactLru::new(Unit::Pages);
        for _ in 0..20 {
            for k in 0..pages {
                m.access(k);
            }
        }
        let curve: Curve = m.curve_at(&Curve::even_sizes(pages + pages / 10 + 1, 64));
        let reads = 20 * pages;
        PublishedContainer {
            counters: ContainerStats {
                name: name.into(),
                l1_budget_pages: 64,
                l1_pages: 64,
                l1_hits: reads - reads / 10,
                pool_hits: reads / 20,
                backing_pages: reads / 20,
                ..ContainerStats::default()
            },
            times: ReadTimesSnapshot {
                read_ns: reads * 40_000,
                read_pages: reads,
                pool_ns: reads / 20 * 30_000,
                pool_pages: reads / 20,
                backing_ns: reads / 20 * 500_000,
                backing_pages: reads / 20,
            },
            curve: Some(curve),
            footprint_pages: pages,
        }
    };
    let stats = MountStats {
        page_size: 4096,
        uptime_ms: 60_000,
        containers: vec![published("db", 2000), published("web", 1000)],
    };
    std::fs::write(dir.path().join("stats.json"), serde_json::to_vec(&stats).unwrap()).unwrap();
    let state = serde_json::json!({
        "version": 2, "vm": 2, "instance": instance,
        "pools": {
            "web": {"pool": pools[0].0, "spec": {"type": "mem", "weight": 60}, "kind": "ephemeral", "path": "/web"},
            "db": {"pool": pools[1].0, "spec": {"type": "mem", "weight": 40}, "kind": "ephemeral", "path": "/db"}
        }
    });
    std::fs::write(dir.path().join("pools.json"), state.to_string()).unwrap();
    let cfg = dir.path().join("provision.toml");
    std::fs::write(
        &cfg,
        format!(
            "stats_file = {:?}\nbudgets_file = {:?}\nstate_file = {:?}\nmemory_bytes = 16777216\n\
             [daemon]\ntcp = {:?}\nvm = 2\ndata_token = {:?}\n[admin]\nurl = {:?}\ntoken = {:?}\n\
             [containers.web]\ntarget = {{ kind = \"hit_ratio\", ratio = 0.9 }}\n\
             [containers.db]\ntarget = {{ kind = \"hit_ratio\", ratio = 0.8 }}\n",
            dir.path().join("stats.json").display().to_string(),
            dir.path().join("budgets.json").display().to_string(),
            dir.path().join("pools.json").display().to_string(),
            d.tcp.to_string(),
            v2.data_token,
            d.admin,
            v2.admin_token
        ),
    )
    .unwrap();
    let out = Command::new(common::dd_bin())
        .args(["guest", "provision", "--once", "--config"])
        .arg(&cfg)
        .output()
        .unwrap();
    assert!(out.status.success(), "guest provision --once: {}", String::from_utf8_lossy(&out.stderr));
    let round: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let (status, kept) = d.http("GET", "/v1/vm/provisioner", Some(&v2.admin_token), None);
    assert_eq!(
        (status, &kept["report"]),
        (200, &round),
        "the daemon keeps the round the provisioner printed"
    );
}

#[test]
fn ui_shows_every_vms_containers_live_and_a_vm_token_sees_its_vm_only() {
    let (v1, v2) = (vm(1), vm(2));
    let started = Instant::now();
    // One sample a second: a minute of traffic gives every chart 60 points.
    let mut d = Daemon::start(&[&v1, &v2], "[history]\ninterval_ms = 1000\n");
    let stop = Arc::new(AtomicBool::new(false));
    let mut load = Vec::new();
    for v in [&v1, &v2] {
        let mut c = d.tcp_client(v);
        let stop = stop.clone();
        load.push(std::thread::spawn(move || {
            let pools = [
                c.create_cgroup(PoolOptions::ephemeral(Spec::Mem { weight: 60 })).unwrap(),
                c.create_cgroup(PoolOptions::ephemeral(Spec::Mem { weight: 40 })).unwrap(),
            ];
            // VM 1 names its containers over the data plane, as `guest watch` does.
            if c.info().vm == 1 {
                c.set_label(pools[0], "api").unwrap();
                c.set_label(pools[1], "batch").unwrap();
            }
            let mut i = 0u64;
            let mut buf = vec![0u8; 4096];
            while !stop.load(Ordering::Relaxed) {
                for (n, &p) in pools.iter().enumerate() {
                    let key = Key::new(n as u64 + 1, i % 512);
                    c.put(p, key, &page(7, n as u64, i % 512)).unwrap();
                    if i.is_multiple_of(3) {
                        let _ = c.get(p, Key::new(n as u64 + 1, (i / 3) % 512), &mut buf).unwrap();
                    }
                }
                i += 1;
                if i.is_multiple_of(256) {
                    std::thread::sleep(Duration::from_millis(20));
                }
            }
        }));
    }
    provision_vm2(&d, &v2);
    // VM 2 names its containers over the admin API (the first pool is "web", as the provisioner's
    // state file says).
    for (pool, name) in [(1, "web"), (2, "db")] {
        let body = serde_json::json!({ "label": name }).to_string();
        let (status, p) =
            d.http("PUT", &format!("/v1/vm/pools/{pool}/label"), Some(&v2.admin_token), Some(&body));
        assert_eq!((status, p["label"].as_str()), (200, Some(name)), "{p}");
    }
    let b = BrowserCgroup::new();
    let host_url = format!("{}/ui/#token={HOST_TOKEN}", d.admin);

    // Host token: both VMs, two containers each, all with pages in them.
    let deadline = Instant::now() + Duration::from_secs(120);
    let host_dom = loop {
        let page = dom(&b, &host_url);
        let cs = containers(&page);
        let seen = |vm: u32| cs.iter().filter(|c| c.0 == vm && c.2 > 0).count();
        if seen(1) == 2
            && seen(2) == 2
            && page.contains("data-state=\"live\"")
            && !decisions(&page, 2).is_empty()
        {
            break page;
        }
        assert!(
            Instant::now() < deadline,
            "the page never showed both VMs' containers in use: {cs:?}\n{page}"
        );
        std::thread::sleep(Duration::from_millis(500));
    };
    assert!(host_dom.contains("data-scope=\"host\""), "{host_dom}");
    // Each container row carries its static and effective entitlement (the page draws both).
    let rows: Vec<&str> =
        host_dom.split("<tr ").skip(1).filter(|r| r.contains("class=\"container\"")).collect();
    for r in &rows {
        let head = r.split('>').next().unwrap_or("");
        for attr in ["data-mem-ent=\"", "data-mem-eff=\""] {
            let v: u64 = head.split(attr).nth(1).and_then(|x| x.split('"').next()?.parse().ok()).unwrap_or(0);
            assert!(v > 0, "a container row without {attr}..: {head}");
        }
    }

    // VM 2's provisioner: both containers' targets and decisions, under VM 2 only.
    assert_eq!(decisions(&host_dom, 2), ["db", "web"], "{host_dom}");
    assert!(decisions(&host_dom, 1).is_empty(), "VM 1 has no provisioner:\n{host_dom}");
    assert!(
        host_dom.contains("hit ratio &gt;= 90.0%") && host_dom.contains("every target feasible"),
        "{host_dom}"
    );

    // A VM's admin token: that VM only.
    let vm_dom = dom(&b, &format!("{}/ui/#token={}", d.admin, v2.admin_token));
    let cs = containers(&vm_dom);
    assert!(cs.len() == 2 && cs.iter().all(|c| c.0 == 2 && c.2 > 0), "VM 2's token showed {cs:?}\n{vm_dom}");
    assert!(!vm_dom.contains("data-vm=\"1\""), "VM 2's token shows VM 1:\n{vm_dom}");
    assert_eq!(decisions(&vm_dom, 2), ["db", "web"], "VM 2's token sees its provisioner:\n{vm_dom}");
    assert!(vm_dom.contains("reads/s measured / predicted (correction)"), "{vm_dom}");
    let vm1_dom = dom(&b, &format!("{}/ui/#token={}", d.admin, v1.admin_token));
    assert!(
        !containers(&vm1_dom).is_empty() && !vm1_dom.contains("data-provisioner-vm"),
        "VM 1's token shows VM 2's provisioner:\n{vm1_dom}"
    );

    // After a minute of traffic, a reload: the history is the daemon's, so every chart is full at once.
    std::thread::sleep(Duration::from_secs(60).saturating_sub(started.elapsed()));
    let page = dom(&b, &host_url);
    let cs = charts(&page);
    for vm in [1, 2] {
        let kinds: Vec<&str> = cs.iter().filter(|c| c.1 == vm).map(|c| c.0.as_str()).collect();
        for k in ["mem-use", "hit-ratio", "gets-rate", "puts-rate", "evictions-rate"] {
            assert!(kinds.contains(&k), "VM {vm} has no {k} chart: {kinds:?}\n{page}");
        }
    }
    for (kind, vm, points, series) in &cs {
        assert!(*points >= 30, "VM {vm}'s {kind} chart has {points} points after a minute:\n{page}");
        let names: &[&str] = if *vm == 1 { &["api", "batch"] } else { &["web", "db"] };
        for n in names {
            assert!(series.split('|').any(|s| s == *n), "VM {vm}'s {kind} chart does not name {n}: {series}");
        }
    }
    let named: Vec<String> = page
        .split("<tr ")
        .filter(|r| r.contains("class=\"container\""))
        .filter_map(|r| Some(r.split("data-name=\"").nth(1)?.split('"').next()?.to_string()))
        .collect();
    assert_eq!(named.len(), 4, "{page}");
    for n in ["api", "batch", "web", "db"] {
        assert!(named.iter().any(|x| x == n), "no container row named {n}: {named:?}");
    }
    // One unit: MiB in the tables and charts; no size in pages left on the page.
    assert!(page.contains("mem MiB used") && page.contains(" MiB, against"), "{page}");
    assert!(!page.contains(" pages)") && !page.contains("pages/"), "a size in pages:\n{page}");
    // The same names on /metrics, and the provisioner's decisions as metrics.
    let metrics = d.metrics();
    assert!(metrics.contains("container=\"api\"") && metrics.contains("container=\"web\""), "{metrics}");
    let budget =
        metrics.lines().find(|l| l.starts_with("dd_provisioner_budget_bytes{") && l.contains("\"db\""));
    assert!(budget.is_some_and(|l| !l.ends_with(" 0")), "{metrics}");
    assert!(metrics.contains("dd_provisioner_target_hit_ratio{"), "{metrics}");
    // What the closed loop learnt of its model, per container (a real round: one per container).
    let corrections = metrics.lines().filter(|l| l.starts_with("dd_provisioner_correction{")).count();
    assert_eq!(corrections, 2, "{metrics}");
    // The history endpoint keeps its scopes: a VM's token sees its VM only, and not the host's view.
    let (status, h) = d.http("GET", "/v1/vm/history", Some(&v1.admin_token), None);
    let vms: Vec<u64> = h["vms"].as_array().unwrap().iter().map(|v| v["vm"].as_u64().unwrap()).collect();
    assert_eq!((status, vms), (200, vec![1]));
    let (status, _) = d.http("GET", "/v1/history", Some(&v1.admin_token), None);
    assert_eq!(status, 401, "a VM's token opened the host's history");

    // The screenshot (for docs/ when asked to update it).
    let scratch = tempfile::tempdir().unwrap();
    let shot = if std::env::var_os("DD_UPDATE_SCREENSHOT").is_some_and(|v| v == "1") {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/ui.png")
    } else {
        scratch.path().join("ui.png")
    };
    b.run(&[
        "--window-size=1280,1400".into(),
        "--virtual-time-budget=8000".into(),
        format!("--screenshot={}", shot.display()),
        host_url.clone(),
    ]);
    assert!(std::fs::metadata(&shot).is_ok_and(|m| m.len() > 10_000), "no screenshot at {}", shot.display());
    // The first two containers' stacked areas drawn: their colours (app.js COLORS, #1f77b4 and
    // #ff7f0e) at the fills' alpha (0xb0) over white, which nothing else on the page has.
    for rgb in [[92, 161, 203], [255, 167, 89]] {
        let n = pixels_near(&shot, rgb);
        eprintln!("screenshot: {n} pixels near {rgb:?}");
        assert!(n > 2000, "the screenshot has {n} pixels of {rgb:?}: no use chart drawn");
    }

    stop.store(true, Ordering::Relaxed);
    for t in load {
        t.join().unwrap();
    }
    // The daemon gone while the page is open: the page, loaded through a proxy that passes its assets
    // and its first poll and then drops every API request as a dead daemon would, says so (and still
    // shows what it had).
    // (Three API requests per poll: the statistics, the history and the provisioners' reports.)
    let proxy = CuttingProxy::start(&d.admin, 3);
    let gone = dom(&b, &format!("{}/ui/#token={HOST_TOKEN}", proxy.url));
    assert!(proxy.cut_requests() > 0, "the page did not poll again after its first poll");
    assert!(
        gone.contains("data-state=\"unreachable\"") && gone.contains("daemon unreachable"),
        "the page does not say the daemon is unreachable:\n{gone}"
    );
    assert!(containers(&gone).len() == 4, "the page dropped what it had shown:\n{gone}");
    assert!(d.stop());
}

/// An HTTP proxy in front of the daemon's admin API that forwards the page's assets and its first
/// `passed` API requests, then closes every API request's connection without an answer (what a browser
/// sees when the daemon is gone). One request per connection (it forwards with `Connection: close`).
struct CuttingProxy {
    url: String,
    cut: Arc<std::sync::atomic::AtomicUsize>,
}

impl CuttingProxy {
    fn start(admin: &str, passed: usize) -> CuttingProxy {
        use std::io::{Read, Write};
        use std::net::{TcpListener, TcpStream};
        use std::sync::atomic::AtomicUsize;
        let upstream = admin.trim_start_matches("http://").to_string();
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let (api, cut) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
        let cut2 = cut.clone();
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                let Ok(mut client) = conn else { break };
                let (upstream, api, cut) = (upstream.clone(), api.clone(), cut2.clone());
                std::thread::spawn(move || {
                    let mut head = Vec::new();
                    let mut byte = [0u8; 1];
                    while !head.ends_with(b"\r\n\r\n") {
                        match client.read(&mut byte) {
                            Ok(1) => head.push(byte[0]),
                            _ => return,
                        }
                    }
                    let text = String::from_utf8_lossy(&head).into_owned();
                    let path = text.split_whitespace().nth(1).unwrap_or("").to_string();
                    if path.starts_with("/v1/") && api.fetch_add(1, Ordering::SeqCst) >= passed {
                        cut.fetch_add(1, Ordering::SeqCst);
                        return; // dropped: the connection closes with no answer
                    }
                    let mut lines: Vec<&str> = text
                        .split("\r\n")
                        .filter(|l| !l.is_empty() && !l.to_ascii_lowercase().starts_with("connection:"))
                        .collect();
                    lines.push("Connection: close");
                    let Ok(mut up) = TcpStream::connect(&upstream) else { return };
                    let _ = up.write_all(format!("{}\r\n\r\n", lines.join("\r\n")).as_bytes());
                    let _ = std::io::copy(&mut up, &mut client);
                });
            }
        });
        CuttingProxy { url, cut }
    }

    fn cut_requests(&self) -> usize {
        self.cut.load(Ordering::SeqCst)
    }
}

#[test]
fn ui_assets_are_embedded_and_fetch_nothing_from_outside() {
    let d = Daemon::start(&[], "");
    for (path, kind) in
        [("/ui/", "text/html"), ("/ui/app.js", "text/javascript"), ("/ui/app.css", "text/css")]
    {
        let r = ureq::get(&format!("{}{path}", d.admin)).call().unwrap();
        assert!(r.header("content-type").unwrap_or("").starts_with(kind), "{path}");
        let csp = r.header("content-security-policy").unwrap_or("").to_string();
        assert!(csp.contains("default-src 'none'") && csp.contains("connect-src 'self'"), "{path}: {csp}");
        let body = r.into_string().unwrap();
        assert!(!body.contains("http://") && !body.contains("https://"), "{path} names an outside address");
    }
}
