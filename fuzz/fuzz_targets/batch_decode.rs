//! The records layer over arbitrary bytes: batch decoder, record decoder, control markers, the
//! visibility engine at both isolation levels, LogState, and each decompressor with its cap.
//!
//! Input: byte 0 picks the mode and fetch offset, bytes 1..=16 give two aborted transactions, the rest is
//! a partition's `records` bytes (or, in codec mode, a compressed record section).
#![no_main]

use bytes::Bytes;
use libfuzzer_sys::fuzz_target;
use snapfence::records::{
    decode_batches, fuzzing, visible_in, AbortedTransaction, Compression, IsolationLevel, LogState,
};

const CAP: usize = 1 << 20;

fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    if mode >= 0xf0 {
        codec(mode & 0x07, rest);
        return;
    }
    let (aborted, records) = if rest.len() >= 16 {
        let (a, r) = rest.split_at(16);
        let entry = |b: &[u8]| AbortedTransaction {
            producer_id: i64::from(b[0] % 4),
            first_offset: i64::from(i32::from_be_bytes([0, b[1], b[2], b[3]]) % 64),
        };
        (vec![entry(&a[..8]), entry(&a[8..])], r)
    } else {
        (vec![], rest)
    };
    let fetch_offset = i64::from(mode % 16);
    let bytes = Bytes::copy_from_slice(records);

    for isolation in [IsolationLevel::ReadCommitted, IsolationLevel::ReadUncommitted] {
        if let Ok(v) = visible_in(bytes.clone(), &aborted, isolation, fetch_offset) {
            assert!(v.next_offset >= fetch_offset);
            for r in v.iter() {
                assert!(r.offset() >= fetch_offset);
                let _ = (r.key(), r.value(), r.headers().count(), r.to_record());
            }
        }
    }

    let mut batches = vec![];
    let mut it = decode_batches(bytes.clone());
    for b in it.by_ref() {
        let Ok(b) = b else { break };
        assert!(b.next_offset() > b.base_offset());
        let _ = b.control();
        if let Ok(records) = b.records_with_limit(CAP) {
            for r in records {
                let Ok(r) = r else { break };
                assert!(r.offset >= b.base_offset() && r.offset <= b.last_offset());
            }
        }
        batches.push(b);
    }
    assert!(it.remaining() <= bytes.len());
    if let Ok(state) = LogState::scan(&batches) {
        let hw = it.next_offset().unwrap_or(0);
        assert!(state.last_stable_offset(hw) <= hw);
    }
});

/// Decompression of arbitrary input stays under the cap; compression round-trips.
fn codec(id: u8, input: &[u8]) {
    let Some(codec) = Compression::from_id(id % 5) else {
        return;
    };
    if let Ok(out) = fuzzing::decompress(codec, input, CAP) {
        assert!(out.len() <= CAP);
    }
    let packed = fuzzing::compress(codec, input).expect("compressing to memory cannot fail");
    let unpacked = fuzzing::decompress(codec, &packed, input.len().max(1)).expect("round trip");
    assert_eq!(unpacked, input);
}
