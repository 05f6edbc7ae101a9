//! Fuzz target: arbitrary bytes as a connection's input stream, through the daemon's frame splitter
//! and request handler against a real (memory-only) engine, with and without a valid HELLO first.
//! Nothing may panic, and the engine's invariants must hold afterwards.
#![no_main]

use dd_server::handler::Session;
use dd_server::{ServerConfig, ServerState};
use libfuzzer_sys::fuzz_target;
use std::sync::OnceLock;

const TOKEN: &str = "fuzz-data-token-0001";

fn state() -> &'static ServerState {
    static S: OnceLock<ServerState> = OnceLock::new();
    S.get_or_init(|| {
        let cfg = ServerConfig::from_toml(&format!(
            "ssd_enabled = false\n[auth]\nhost_admin_token = \"fuzz-host-token-0001\"\n\
             [engine]\nmaintenance = \"inline\"\n[engine.mem]\ncapacity_bytes = 1048576\n\
             [[vms]]\nid = 1\ndata_token = \"{TOKEN}\"\nadmin_token = \"fuzz-admin-token-001\"\n\
             [[vms]]\nid = 2\ndata_token = \"fuzz-data-token-0002\"\nadmin_token = \"fuzz-admin-token-002\"\n"
        ))
        .expect("fuzz configuration");
        ServerState::new(&cfg, "fuzz-host-token-0001").expect("fuzz state")
    })
}

fuzz_target!(|data: &[u8]| {
    let st = state();
    let mut sess = Session::new();
    let mut input = Vec::new();
    if data.first().is_some_and(|b| b & 1 == 1) {
        dd_proto::Request::Hello { min_version: 1, max_version: 1, vm: 1, token: TOKEN.as_bytes() }
            .encode(1, 0, &mut input);
    }
    input.extend_from_slice(data);
    let _ = dd_server::net::drive(st, &mut sess, &input);
    // Another VM's view is never touched by VM 1's traffic.
    assert!(st.cache.pools(dd_engine::VmId(2)).unwrap().is_empty());
    st.cache.check_invariants().unwrap();
});
