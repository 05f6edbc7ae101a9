//! Fuzz target: arbitrary bytes through the peer protocol's header parser and both payload decoders
//! (`dd_coop::wire`). Nothing may panic, and a request that decodes must re-encode to a frame that
//! decodes to the same request.
#![no_main]

use dd_coop::wire::{parse_header, PeerRequest, PeerResponse, HEADER_LEN};
use libfuzzer_sys::fuzz_target;

/// A small page size keeps COMPARE and FETCH payloads reachable for the fuzzer.
const PAGE: usize = 64;

fuzz_target!(|data: &[u8]| {
    let mut at = 0;
    while at < data.len() {
        let Ok(Some(h)) = parse_header(&data[at..], 1 << 20) else { break };
        let end = at + HEADER_LEN + h.payload_len as usize;
        if end > data.len() {
            break;
        }
        let payload = &data[at + HEADER_LEN..end];
        if let Ok(req) = PeerRequest::decode(h.op, payload, PAGE) {
            let mut out = Vec::new();
            req.encode(h.request_id, &mut out);
            let h2 = parse_header(&out, u32::MAX).unwrap().unwrap();
            assert_eq!(h2.payload_len as usize, out.len() - HEADER_LEN);
            assert_eq!(PeerRequest::decode(h2.op, &out[HEADER_LEN..], PAGE).unwrap(), req);
        }
        if let Ok(resp) = PeerResponse::decode(h.op, payload, PAGE) {
            let mut out = Vec::new();
            resp.encode(h.op, h.request_id, &mut out);
            assert_eq!(PeerResponse::decode(h.op, &out[HEADER_LEN..], PAGE).unwrap(), resp);
        }
        at = end;
    }
});
