//! The daemon over a failing disk (issue 17): with faults injected under its SSD store, requests on
//! the data plane get misses and refused puts, pages in memory pools keep being served, and the
//! metrics report the store's errors, the failing state and the pages lost.

use dd_engine::store::ssd::faults::{Fault, FaultInjector, IoOp};
use dd_engine::{Key, PoolId, PoolOptions, PutOutcome, Spec};
use dd_proto::frame::split_frame;
use dd_proto::{Header, Request, Response, HEADER_LEN};
use dd_server::handler::Session;
use dd_server::{ServerConfig, ServerState};

const TOKEN: &str = "faults-data-token-0001";
const PS: usize = 4096;

fn state(dir: &std::path::Path, faults: std::sync::Arc<FaultInjector>) -> ServerState {
    let cfg = ServerConfig::from_toml(&format!(
        "data_dir = \"{}\"\nssd_enabled = true\n[auth]\nhost_admin_token = \"faults-host-token-0001\"\n\
         [engine]\nmaintenance = \"inline\"\n[engine.mem]\ncapacity_bytes = 1048576\n\
         [engine.ssd]\npath = \"ssd.bin\"\ncapacity_bytes = 4194304\nwrite_queue_pages = 16\n\
         [[vms]]\nid = 1\ndata_token = \"{TOKEN}\"\nadmin_token = \"faults-admin-token-001\"\n",
        dir.display()
    ))
    .expect("configuration");
    ServerState::with_ssd_faults(&cfg, "faults-host-token-0001", Some(faults)).expect("state")
}

/// One connection: sends requests through the daemon's frame splitter and handler, decodes answers.
struct Conn<'a> {
    st: &'a ServerState,
    sess: Session,
    next_id: u64,
}

impl Conn<'_> {
    fn call(&mut self, req: Request<'_>) -> Response {
        let mut input = Vec::new();
        self.next_id += 1;
        req.encode(1, self.next_id, &mut input);
        let (out, _) = dd_server::net::drive(self.st, &mut self.sess, &input);
        let (h, n) = split_frame(&out, u32::MAX).expect("a frame").expect("a whole frame");
        assert_eq!(n, out.len(), "one answer per request");
        let header = Header::decode(out[..HEADER_LEN].try_into().unwrap()).unwrap();
        assert_eq!(h.request_id, self.next_id);
        Response::decode(&header, &out[HEADER_LEN..n]).expect("a valid response")
    }

    fn pool(&mut self, opts: PoolOptions) -> PoolId {
        match self.call(Request::CreatePool(opts)) {
            Response::PoolCreated(p) => p,
            other => panic!("{other:?}"),
        }
    }

    fn put(&mut self, pool: PoolId, i: u64) -> PutOutcome {
        match self.call(Request::Put { pool, key: Key::new(1, i), data: &page(pool, i) }) {
            Response::Put(o) => o,
            other => panic!("{other:?}"),
        }
    }

    fn get(&mut self, pool: PoolId, i: u64) -> Option<Vec<u8>> {
        match self.call(Request::Get { pool, key: Key::new(1, i) }) {
            Response::Get(p) => p,
            other => panic!("{other:?}"),
        }
    }
}

fn page(pool: PoolId, i: u64) -> Vec<u8> {
    let mut p = vec![(i as u8) ^ 0xa5; PS];
    p[..4].copy_from_slice(&pool.0.to_le_bytes());
    p[4..12].copy_from_slice(&i.to_le_bytes());
    p
}

fn metric(text: &str, name: &str) -> u64 {
    text.lines()
        .filter(|l| l.starts_with(name) && !l.starts_with('#'))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .map(|v| v as u64)
        .sum()
}

#[test]
fn a_failing_ssd_is_reported_in_metrics_and_the_memory_store_keeps_serving() {
    let dir = tempfile::tempdir().unwrap();
    let faults = FaultInjector::new();
    let st = state(dir.path(), faults.clone());
    let mut c = Conn { st: &st, sess: Session::new(), next_id: 0 };
    let token = TOKEN.as_bytes();
    assert!(matches!(
        c.call(Request::Hello { min_version: 1, max_version: 1, vm: 1, token }),
        Response::Hello { .. }
    ));
    let mem = c.pool(PoolOptions::ephemeral(Spec::Mem { weight: 100 }));
    let ssd = c.pool(PoolOptions::persistent(Spec::Ssd { weight: 100 }));
    for i in 0..8 {
        assert!(c.put(ssd, i).is_stored());
    }
    st.cache.quiesce();

    // The disk dies: reads and writes fail from now on.
    faults.fail_after(IoOp::Read, 0, Fault::Eio, u64::MAX);
    faults.fail_after(IoOp::Write, 0, Fault::Enospc, u64::MAX);
    for i in 0..8 {
        assert_eq!(c.get(ssd, i), None, "a page the disk cannot read is a miss");
    }
    assert!(c.put(ssd, 100).is_stored(), "nothing has failed a write yet");
    st.cache.quiesce();
    let refused = (101..121).filter(|&i| c.put(ssd, i) == PutOutcome::Refused).count();
    assert!(refused >= 19, "a failing disk refuses new pages ({refused} of 20 refused)");

    // The memory store is untouched by the disk's failure.
    for i in 0..32 {
        assert!(c.put(mem, i).is_stored());
    }
    for i in 0..32 {
        assert_eq!(c.get(mem, i), Some(page(mem, i)));
    }

    let text = st.metrics.render(
        &st.cache.host_stats(),
        st.cache.ssd_io_stats().as_ref(),
        None,
        &[],
        &st.table_sizes(),
    );
    assert_eq!(metric(&text, "dd_ssd_failing"), 1, "{text}");
    assert!(metric(&text, "dd_ssd_write_errors_total") >= 1, "{text}");
    assert_eq!(metric(&text, "dd_ssd_read_errors_total"), 8, "{text}");
    assert!(metric(&text, "dd_ssd_writes_refused_total") >= 19, "{text}");
    assert_eq!(metric(&text, "dd_pool_pages_lost_total"), 8, "{text}");
    assert!(st.cache.host_stats().totals.identity_holds());
    st.cache.check_invariants().unwrap();
}
