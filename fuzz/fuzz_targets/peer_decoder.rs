//! Fuzz target: arbitrary bytes through the peer protocol's header parser and both payload decoders
//! (`dd_coop::wire`). Nothing may panic, and a request that decodes must re-encode to a frame that
//! decodes to the same request.
#![no_main]

use dd_coop::wire::{parse_header, PeerRequest, PeerResponse, HEADER_LEN};
use libfuzzer_sys::fuzz_target;

/// A small page size keeps COMPARE and FETCH payloads reachable for the fuzzer.
const PAGE: usize = 64;

/// Both payload decoders on one payload; whatever decodes must round-trip.
fn check_payload(op: u8, id: u64, payload: &[u8]) {
    if let Ok(req) = PeerRequest::decode(op, payload, PAGE) {
        let mut out = Vec::new();
        req.encode(id, &mut out);
        let h2 = parse_header(&out, u32::MAX).unwrap().unwrap();
        assert_eq!(h2.payload_len as usize, out.len() - HEADER_LEN);
        assert_eq!(PeerRequest::decode(h2.op, &out[HEADER_LEN..], PAGE).unwrap(), req);
    }
    if let Ok(resp) = PeerResponse::decode(op, payload, PAGE) {
        let mut out = Vec::new();
        resp.encode(op, id, &mut out);
        assert_eq!(PeerResponse::decode(op, &out[HEADER_LEN..], PAGE).unwrap(), resp);
    }
}

fuzz_target!(|data: &[u8]| {
    // The first byte as an op and the rest as its payload reaches the decoders directly (a framed
    // input needs the magic first, which slows the fuzzer down); then the same bytes as frames.
    if let Some((&op, payload)) = data.split_first() {
        check_payload(op, 1, payload);
    }
    let mut at = 0;
    while at < data.len() {
        let Ok(Some(h)) = parse_header(&data[at..], 1 << 20) else { break };
        let end = at + HEADER_LEN + h.payload_len as usize;
        if end > data.len() {
            break;
        }
        let payload = &data[at + HEADER_LEN..end];
        check_payload(h.op, h.request_id, payload);
        at = end;
    }
});
