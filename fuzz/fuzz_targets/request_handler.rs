//! Fuzz target: arbitrary bytes as a connection's input stream, through the daemon's frame splitter
//! and request handler against a real (memory-only) engine: with no HELLO first (the
//! pre-authentication path: HELLO frame limit, one frame answered at a time), with a HELLO of a wrong
//! token, and with a valid HELLO (offering version 1, or 1 to 2). The first byte selects which
//! (`byte % 3`: none, valid, wrong token; `byte & 0x80`: version 2 offered). Nothing may panic; every response is a whole frame within the frame
//! limit (`limits.max_payload_bytes`), and an unauthenticated connection gets only short error frames
//! or a HELLO answer; the engine's invariants hold afterwards and VM 2 is never touched.
//! `dd_server::net::tests::drive_random_inputs_*` runs the same checks on seeded inputs.
//!
//! The frame limit is small (12 KiB: a batch of 2 pages) so that the fuzzer can reach responses that
//! would exceed it (VM_STATS of a VM with a few dozen pools, LIST_POOLS, GET_BATCH); with the 2 MiB
//! default no input of a 1 MiB store could. The state is shared between inputs (cheap; pools pile up
//! to VM 1's quota, which drives VM_STATS into its truncation path).
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
             [limits]\nmax_payload_bytes = 12288\n\
             [engine]\nmaintenance = \"inline\"\nmax_batch_pages = 2\n[engine.mem]\ncapacity_bytes = 1048576\n\
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
    let token = match data.first().map(|b| b % 3) {
        Some(1) => Some(TOKEN),
        Some(2) => Some("not-the-token-of-vm-1"),
        _ => None,
    };
    // The selector's high bit offers protocol version 2 (the version real clients negotiate, so the
    // frames of recorded sessions, which carry it, are accepted), else version 1 only.
    let max_version = if data.first().is_some_and(|b| b & 0x80 != 0) { 2 } else { 1 };
    if let Some(t) = token {
        dd_proto::Request::Hello { min_version: 1, max_version, vm: 1, token: t.as_bytes() }
            .encode(1, 0, &mut input);
    }
    // The selector byte is not part of the connection's bytes (it was, and the stream after a valid
    // HELLO then always began with a bad magic: no authenticated request was ever reached).
    input.extend_from_slice(data.get(1..).unwrap_or_default());
    let (out, _) = dd_server::net::drive(st, &mut sess, &input);
    dd_server::net::check_responses(st, &out, sess.registration().is_some()).unwrap();
    // Another VM's view is never touched by VM 1's traffic.
    assert!(st.cache.pools(dd_engine::VmId(2)).unwrap().is_empty());
    st.cache.check_invariants().unwrap();
});
