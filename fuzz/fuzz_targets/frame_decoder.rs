//! Fuzz target: arbitrary bytes through the frame splitter and both payload decoders. Nothing may
//! panic, and a frame that decodes must re-encode to the same bytes' meaning.
#![no_main]

use dd_proto::frame::split_frame;
use dd_proto::{Request, Response, HEADER_LEN};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let mut at = 0;
    while at < data.len() {
        match split_frame(&data[at..], 1 << 20) {
            Ok(Some((h, n))) => {
                let payload = &data[at + HEADER_LEN..at + n];
                if let Ok(req) = Request::decode(h.op, payload, 256) {
                    let mut out = Vec::new();
                    req.encode(h.version, h.request_id, &mut out);
                    let (h2, n2) = split_frame(&out, u32::MAX).unwrap().unwrap();
                    assert_eq!(n2, out.len());
                    let again = Request::decode(h2.op, &out[HEADER_LEN..], 256).unwrap();
                    assert_eq!(again.op(), req.op());
                }
                let _ = Response::decode(&h, payload);
                at += n;
            }
            Ok(None) | Err(_) => break,
        }
    }
});
