//! The bodies of the cargo-fuzz targets, kept in the library so that every reproducer a campaign finds
//! replays in `cargo test` through exactly the code the fuzzer ran (`fuzz_regressions` below walks
//! `fuzz/regressions/<target>/`). Each function takes the raw fuzz input, returns nothing, and panics
//! only when an invariant breaks; `fuzz/fuzz_targets/<target>.rs` is a one-line wrapper around it.
//!
//! # References
//! - Kafka protocol guide (frames, headers, record batches v2); KIP-98 (control records)

use bytes::{Bytes, BytesMut};

use crate::consumer::fuzzing::{assignment_round_trips, subscription_round_trips};
use crate::records::{
    decode_batches, fuzzing as codecs, visible_in, AbortedTransaction, Compression, ControlMarker,
    IsolationLevel, LogState,
};
use crate::wire::fuzzing::{
    decode_response_frame, decode_response_header, response_correlation_id, split_fuzz_input,
    FrameDecoder,
};

/// `responses`: every response the client decodes, header and body, at every version it sends; see
/// [`split_fuzz_input`] for the layout. Returns the frame length and whether it decoded, for the target's
/// allocation check.
pub fn responses(data: &[u8]) -> Option<(usize, bool)> {
    let (api_key, version, frame) = split_fuzz_input(data)?;
    let len = frame.len();
    let result = decode_response_frame(api_key, version, frame).expect("a key from the list");
    Some((len, result.is_ok()))
}

/// `consumer_protocol`: byte 0's low bit picks a JoinGroup subscription or a SyncGroup assignment
/// blob, the rest is the blob; one that decodes must round-trip through the encoder unchanged.
pub fn consumer_protocol(data: &[u8]) {
    let Some((&which, blob)) = data.split_first() else {
        return;
    };
    let blob = Bytes::copy_from_slice(blob);
    let result = if which & 1 == 0 {
        subscription_round_trips(blob)
    } else {
        assignment_round_trips(blob)
    };
    if let Ok(same) = result {
        assert!(same, "a decoded blob changed through encode and decode");
    }
}

/// `snapshot_envelope`: a value read from a snapshot topic, which any writer with access can put there;
/// it opens with a typed error, or as an envelope the runtime writes back byte for byte.
pub fn snapshot_envelope(data: &[u8]) {
    if let Some(same) = crate::snapshot::fuzzing::envelope_round_trips(data) {
        assert!(
            same,
            "an opened snapshot value is not what the runtime writes for it"
        );
    }
}

/// `frame_reader`: byte 0 is the read size, byte 1 the response header version, the rest a byte
/// stream; frames come out within the limit, waiting never reserves far past it, headers decode or
/// fail with a typed error.
pub fn frame_reader(data: &[u8]) {
    const MAX_FRAME: usize = 4096;
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
                    if let Ok((header, _body)) =
                        decode_response_header(frame, header_version, 3, 12)
                    {
                        assert_eq!(Ok(header.correlation_id), id);
                    }
                }
                Ok(None) => break,
                Err(_) => return,
            }
        }
        assert!(buf.capacity() <= 2 * (MAX_FRAME + 4) + stream.len() + 64);
    }
}

/// Per-batch decompression cap of `sealed_batch`: above every seed, small enough that a bomb is cheap.
const SEALED_CAP: usize = 1 << 16;
const SEALED_PRODUCER: i64 = 7;
const SEALED_BASE_OFFSET: i64 = 100;

/// `sealed_batch`: one batch with a correct CRC around a fuzzer-chosen header and records section, so
/// mutations reach the record, control-record and decompression code instead of stopping at the CRC.
///
/// Byte 0 = attributes (bits 0-2 codec, bit 4 transactional, bit 5 control, bit 6: compress the section
/// here with that codec instead of taking it as already compressed), byte 1 = record count, byte 2 =
/// last offset delta, the rest the records section.
pub fn sealed_batch(data: &[u8]) {
    let [attrs, count, delta, section @ ..] = data else {
        return;
    };
    let packed;
    let section = match Compression::from_id(attrs & 0x07) {
        Some(c) if attrs & 0x40 != 0 && c != Compression::None => {
            packed = codecs::compress(c, section).expect("compressing to memory cannot fail");
            &packed[..]
        }
        _ => section,
    };
    let bytes = Bytes::from(codecs::raw_batch(
        SEALED_BASE_OFFSET,
        SEALED_PRODUCER,
        i16::from(attrs & 0x37),
        i32::from(*delta),
        i32::from(*count),
        section,
    ));

    let mut batches = vec![];
    for batch in decode_batches(bytes.clone()) {
        let Ok(batch) = batch else { break };
        assert_eq!(batch.base_offset(), SEALED_BASE_OFFSET);
        if let Ok(Some(ControlMarker::Abort { .. } | ControlMarker::Commit { .. })) =
            batch.control()
        {
            assert!(batch.is_control());
        }
        if let Ok(records) = batch.records_with_limit(SEALED_CAP) {
            for r in records {
                let Ok(r) = r else { break };
                assert!(r.offset >= batch.base_offset() && r.offset <= batch.last_offset());
                assert!(r.value.as_ref().map_or(0, Bytes::len) <= SEALED_CAP);
            }
        }
        batches.push(batch);
    }
    let _ = LogState::scan(&batches);
    let aborted = [AbortedTransaction {
        producer_id: SEALED_PRODUCER,
        first_offset: SEALED_BASE_OFFSET,
    }];
    for isolation in [
        IsolationLevel::ReadCommitted,
        IsolationLevel::ReadUncommitted,
    ] {
        if let Ok(v) = visible_in(bytes.clone(), &aborted, isolation, SEALED_BASE_OFFSET) {
            assert!(v.next_offset >= SEALED_BASE_OFFSET);
            if isolation == IsolationLevel::ReadCommitted && attrs & 0x10 != 0 {
                // The producer's transaction is in the aborted list: none of it may be delivered.
                assert_eq!(v.iter().count(), 0);
            }
            for r in v.iter() {
                let _ = (r.key(), r.value(), r.headers().count());
            }
        }
    }
}

#[cfg(test)]
mod fuzz_regressions {
    use std::fs;
    use std::path::Path;

    /// Regression: every input a fuzz campaign found (`fuzz/regressions/<target>/*`) runs through its
    /// target's harness without a panic, and every target directory names a harness.
    #[test]
    fn every_committed_reproducer_replays_cleanly() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/regressions");
        let mut replayed = 0;
        for dir in fs::read_dir(&root).expect("fuzz/regressions exists") {
            let dir = dir.unwrap().path();
            if !dir.is_dir() {
                continue;
            }
            let target = dir.file_name().unwrap().to_str().unwrap().to_owned();
            for file in fs::read_dir(&dir).unwrap() {
                let file = file.unwrap().path();
                let data = fs::read(&file).unwrap();
                match target.as_str() {
                    "responses" => drop(super::responses(&data)),
                    "consumer_protocol" => super::consumer_protocol(&data),
                    "frame_reader" => super::frame_reader(&data),
                    "sealed_batch" => super::sealed_batch(&data),
                    "snapshot_envelope" => super::snapshot_envelope(&data),
                    other => panic!("{}: no harness for target {other}", file.display()),
                }
                replayed += 1;
            }
        }
        assert!(replayed > 0, "no reproducers under {}", root.display());
    }
}
