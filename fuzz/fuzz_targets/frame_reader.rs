//! The frame reader and the response-header decoder on arbitrary byte streams, cut into arbitrary
//! read sizes: they must yield frames, wait, or return a typed error, and never panic or reserve more
//! than the frame limit allows.
//!
//! Response *bodies* are not decoded here: kafka-protocol 0.18 reserves array capacity from the wire
//! count before checking the remaining bytes, which the fuzzer finds at once (see src/net/mod.rs).
#![no_main]

use bytes::BytesMut;
use libfuzzer_sys::fuzz_target;
use snapfence::wire::fuzzing::{decode_response_header, response_correlation_id, FrameDecoder};

const MAX_FRAME: usize = 4096;

fuzz_target!(|data: &[u8]| {
    // Byte 0 picks the read size, byte 1 the response header version; the rest is the stream.
    let [chunk, header_version, stream @ ..] = data else {
        return;
    };
    let chunk = usize::from(*chunk).max(1);
    let header_version = i16::from(header_version & 1);
    let decoder = FrameDecoder::new(MAX_FRAME);
    let mut buf = BytesMut::new();
    for piece in stream.chunks(chunk) {
        buf.extend_from_slice(piece);
        loop {
            match decoder.decode(&mut buf) {
                Ok(Some(frame)) => {
                    assert!(frame.len() <= MAX_FRAME);
                    let id = response_correlation_id(&frame);
                    assert_eq!(id.is_ok(), frame.len() >= 4);
                    if let Ok((header, _body)) = decode_response_header(frame, header_version, 3, 12) {
                        assert_eq!(Ok(header.correlation_id), id);
                    }
                }
                Ok(None) => break,
                Err(_) => return,
            }
        }
        // Waiting for a frame never reserves far beyond what the limit allows.
        assert!(buf.capacity() <= 2 * (MAX_FRAME + 4) + stream.len() + 64);
    }
});
