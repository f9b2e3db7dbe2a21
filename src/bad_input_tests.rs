//! Malformed input at every layer a peer's bytes cross, one table per layer: each row is an input and
//! the typed error it must give. Nothing may panic, and no row may allocate from the length it lies
//! about: the rows carry counts and lengths in the gigabytes, which an unchecked allocation would turn
//! into an abort of this test process. (The `responses` fuzz target additionally measures the heap a
//! decode takes against the frame length; see docs/fuzzing.md.)
//!
//! The records layer's own suite (`records/tests/malformed.rs`) has one test per malformation; the
//! table here also sends each input through the read path a consumer uses (`visible_in` at
//! read_committed), so a malformation cannot hide behind a path that skips it.
//!
//! # References
//! - Kafka protocol guide: frames, response headers (KIP-482 tagged fields), record batch v2 (KIP-98)
//! - The classic consumer protocol's subscription and assignment schemas (KIP-429 owned partitions,
//!   KIP-341/KIP-881 generation and rack)

use std::fs;
use std::path::Path;

use bytes::{Bytes, BytesMut};

use crate::consumer::fuzzing::{assignment_round_trips, subscription_round_trips};
use crate::consumer::ConsumerError;
use crate::records::fuzzing::{compress, raw_batch as batch_at};
use crate::records::tests::malformed::{body, good_record, raw_batch, record, zz};
use crate::records::{visible_in, AbortedTransaction, Compression, DecodeError, IsolationLevel};
use crate::wire::fuzzing::{
    decode_response_frame, decode_response_header, decoded_versions, response_correlation_id,
    FrameDecoder, DECODED_API_KEYS,
};
use crate::wire::WireError;

/// (name, bytes, what the frame reader says: the frame's length, `None` to wait, or the error)
type FrameRow = (
    &'static str,
    &'static [u8],
    Result<Option<usize>, WireError>,
);
/// (name, frame, header version, the correlation id or which part failed)
type HeaderRow = (&'static str, &'static [u8], i16, Result<i32, &'static str>);

/// A frame length that is negative or above the limit is a typed error, a truncated prefix or body waits
/// for more bytes, and an empty frame is a frame.
#[test]
fn frames() {
    const MAX: usize = 1 << 20;
    let rows: [FrameRow; 7] = [
        (
            "negative length",
            &[0xff, 0xff, 0xff, 0xfe],
            Err(WireError::NegativeFrameLength(-2)),
        ),
        (
            "i32::MIN length",
            &[0x80, 0, 0, 0],
            Err(WireError::NegativeFrameLength(i32::MIN)),
        ),
        (
            "oversize by one",
            &[0, 0x10, 0, 1],
            Err(WireError::FrameTooLarge {
                len: MAX + 1,
                max: MAX,
            }),
        ),
        (
            "i32::MAX length",
            &[0x7f, 0xff, 0xff, 0xff],
            Err(WireError::FrameTooLarge {
                len: i32::MAX as usize,
                max: MAX,
            }),
        ),
        ("truncated prefix waits", &[0, 0], Ok(None)),
        ("truncated body waits", &[0, 0x10, 0, 0, 1, 2, 3], Ok(None)),
        ("empty frame", &[0, 0, 0, 0], Ok(Some(0))),
    ];
    for (name, input, expected) in rows {
        let mut buf = BytesMut::from(input);
        let got = FrameDecoder::new(MAX)
            .decode(&mut buf)
            .map(|f| f.map(|f| f.len()));
        assert_eq!(got, expected, "{name}");
        // Waiting for a large frame reserves in steps, not the announced length at once.
        assert!(
            buf.capacity() <= (1 << 20) + 64,
            "{name}: {}",
            buf.capacity()
        );
    }
}

/// A response header too short for its correlation id, or whose tagged fields lie about their count or
/// length, is a typed error naming the header, never a panic or a huge allocation.
#[test]
fn response_headers() {
    // (name, frame, header version, expected: correlation id or which error)
    let rows: [HeaderRow; 7] = [
        ("empty frame", &[], 0, Err("too short")),
        ("three bytes", &[0, 0, 1], 0, Err("too short")),
        ("v0, four bytes", &[0, 0, 0, 9], 0, Ok(9)),
        ("v1 without tagged fields", &[0, 0, 0, 9], 1, Err("header")),
        (
            "v1 with 2^32-1 tagged fields",
            &[0, 0, 0, 9, 0xff, 0xff, 0xff, 0xff, 0x0f],
            1,
            Err("header"),
        ),
        (
            "v1 tagged field longer than the frame",
            &[0, 0, 0, 9, 1, 0, 0xff, 0xff, 0xff, 0xff, 0x07],
            1,
            Err("header"),
        ),
        ("v1, empty tagged fields", &[0, 0, 0, 9, 0], 1, Ok(9)),
    ];
    for (name, frame, version, expected) in rows {
        let got = match response_correlation_id(frame) {
            Err(WireError::FrameTooShort { len }) => {
                assert_eq!(len, frame.len(), "{name}");
                Err("too short")
            }
            Err(other) => panic!("{name}: {other:?}"),
            Ok(id) => match decode_response_header(Bytes::copy_from_slice(frame), version, 3, 12) {
                Ok((header, _)) => {
                    assert_eq!(header.correlation_id, id, "{name}");
                    Ok(id)
                }
                Err(WireError::Decode { part, .. }) => Err(part),
                Err(other) => panic!("{name}: {other:?}"),
            },
        };
        assert_eq!(got, expected, "{name}");
    }
}

/// Every response the client decodes, at the lowest and highest version it sends, starting from a
/// valid frame (the committed fuzz seeds, written by `examples/fuzz_seeds.rs`) and spoiling it.
#[test]
fn every_decoded_response() {
    let seeds = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/seeds/responses");
    let mut covered = std::collections::BTreeSet::new();
    for file in fs::read_dir(&seeds).unwrap() {
        let file = file.unwrap().path();
        let data = fs::read(&file).unwrap();
        let key = i16::from(data[0]);
        let version = decoded_versions(key).start() + i16::from(data[1]);
        let frame = &data[2..];
        let decode = |bytes: &[u8]| {
            decode_response_frame(key, version, Bytes::copy_from_slice(bytes)).unwrap()
        };
        let name = file.display();
        assert_eq!(decode(frame), Ok(()), "{name}: the valid frame");

        let mut trailing = frame.to_vec();
        trailing.push(0);
        assert!(
            matches!(
                decode(&trailing),
                Err(WireError::TrailingBytes { trailing: 1, .. })
            ),
            "{name}: one trailing byte"
        );
        assert!(
            matches!(
                decode(&frame[..frame.len() - 1]),
                Err(WireError::Decode { part: "body", .. })
            ),
            "{name}: last byte cut"
        );
        let header_only = if frame.len() > 4 && frame[4] == 0 {
            5
        } else {
            4
        };
        assert!(
            matches!(
                decode(&frame[..header_only]),
                Err(WireError::Decode { part: "body", .. })
            ),
            "{name}: no body"
        );
        assert!(
            matches!(
                decode(&frame[..3]),
                Err(WireError::Decode { part: "header", .. })
            ),
            "{name}: three bytes"
        );
        assert!(
            matches!(
                decode_response_frame(key, 999, Bytes::copy_from_slice(frame)).unwrap(),
                Err(WireError::UnsupportedVersion { version: 999, .. })
            ),
            "{name}: v999"
        );
        covered.insert(key);
    }
    let all: std::collections::BTreeSet<i16> = DECODED_API_KEYS.iter().copied().collect();
    assert_eq!(
        covered, all,
        "a seed per decoded response: rerun examples/fuzz_seeds.rs"
    );
}

/// Batches, records, compressed sections and control records through the consumer's read path.
#[test]
fn batches_records_compression_and_control_records() {
    type Expect = fn(&DecodeError) -> bool;
    let flipped = {
        let mut raw = raw_batch(0, 0, 1, &good_record(0));
        raw[30] ^= 1;
        raw
    };
    let with_magic = |magic: u8| {
        let mut raw = raw_batch(0, 0, 1, &good_record(0));
        raw[16] = magic;
        raw
    };
    let short_length = {
        let mut raw = raw_batch(0, 0, 1, &good_record(0));
        raw[8..12].copy_from_slice(&48i32.to_be_bytes());
        raw
    };
    let zeros = vec![0u8; 4 << 20];
    let bomb = |codec: Compression| {
        raw_batch(
            i16::from(codec.id()),
            0,
            1,
            &compress(codec, &zeros).unwrap(),
        )
    };
    let garbage = |codec: Compression| raw_batch(i16::from(codec.id()), 0, 1, &[0x13; 64]);
    let rows: Vec<(&str, Vec<u8>, Expect)> = vec![
        ("legacy magic", with_magic(1), |e| {
            matches!(e, DecodeError::LegacyMessageSet { magic: 1, .. })
        }),
        ("unknown magic", with_magic(7), |e| {
            matches!(e, DecodeError::UnknownMagic { magic: 7, .. })
        }),
        ("batch length below the header", short_length, |e| {
            matches!(e, DecodeError::BatchLengthTooSmall { length: 48, .. })
        }),
        ("flipped covered byte", flipped, |e| {
            matches!(e, DecodeError::CrcMismatch { .. })
        }),
        ("codec 5", raw_batch(5, 0, 1, &good_record(0)), |e| {
            matches!(e, DecodeError::UnknownCompression { codec: 5, .. })
        }),
        (
            "negative last offset delta",
            raw_batch(0, -1, 1, &good_record(0)),
            |e| matches!(e, DecodeError::NegativeLastOffsetDelta { delta: -1, .. }),
        ),
        (
            "last offset past i64::MAX",
            batch_at(i64::MAX, -1, 0, 1, 1, &good_record(0)),
            |e| matches!(e, DecodeError::OffsetOverflow { .. }),
        ),
        (
            "record count i32::MAX",
            raw_batch(0, 0, i32::MAX, &good_record(0)),
            |e| {
                matches!(
                    e,
                    DecodeError::BadRecordCount {
                        count: i32::MAX,
                        ..
                    }
                )
            },
        ),
        (
            "negative record count",
            raw_batch(0, 0, -1, &good_record(0)),
            |e| matches!(e, DecodeError::BadRecordCount { count: -1, .. }),
        ),
        (
            "record length varint of six bytes",
            raw_batch(
                0,
                0,
                1,
                &[0xff, 0xff, 0xff, 0xff, 0xff, 0x01, 0, 0, 0, 0, 0, 0, 0, 0],
            ),
            |e| matches!(e, DecodeError::VarintOverflow),
        ),
        (
            "record longer than the batch",
            raw_batch(0, 0, 1, &[zz(50), 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]),
            |e| matches!(e, DecodeError::Overrun { field: "record" }),
        ),
        (
            "key length -2",
            raw_batch(0, 0, 1, &record(&body(0, &[zz(-2), zz(-1), 0]))),
            |e| {
                matches!(
                    e,
                    DecodeError::NegativeLength {
                        field: "record key",
                        ..
                    }
                )
            },
        ),
        (
            "header count past the record",
            raw_batch(0, 0, 1, &record(&body(0, &[zz(-1), zz(-1), zz(40)]))),
            |e| matches!(e, DecodeError::Overrun { field: "headers" }),
        ),
        (
            "offset delta past the batch",
            raw_batch(0, 0, 1, &good_record(1)),
            |e| matches!(e, DecodeError::OffsetDeltaOutOfRange { delta: 1, .. }),
        ),
        ("gzip garbage", garbage(Compression::Gzip), |e| {
            matches!(
                e,
                DecodeError::Decompress {
                    codec: Compression::Gzip,
                    ..
                }
            )
        }),
        ("snappy garbage", garbage(Compression::Snappy), |e| {
            matches!(
                e,
                DecodeError::Decompress {
                    codec: Compression::Snappy,
                    ..
                }
            )
        }),
        ("lz4 garbage", garbage(Compression::Lz4), |e| {
            matches!(
                e,
                DecodeError::Decompress {
                    codec: Compression::Lz4,
                    ..
                }
            )
        }),
        ("zstd garbage", garbage(Compression::Zstd), |e| {
            matches!(
                e,
                DecodeError::Decompress {
                    codec: Compression::Zstd,
                    ..
                }
            )
        }),
        ("gzip bomb", bomb(Compression::Gzip), |e| {
            matches!(e, DecodeError::DecompressedTooLarge { limit: CAP, .. })
        }),
        ("snappy bomb", bomb(Compression::Snappy), |e| {
            matches!(e, DecodeError::DecompressedTooLarge { limit: CAP, .. })
        }),
        ("lz4 bomb", bomb(Compression::Lz4), |e| {
            matches!(e, DecodeError::DecompressedTooLarge { limit: CAP, .. })
        }),
        ("zstd bomb", bomb(Compression::Zstd), |e| {
            matches!(e, DecodeError::DecompressedTooLarge { limit: CAP, .. })
        }),
        (
            "control key of two bytes",
            batch_at(
                0,
                7,
                0x30,
                0,
                1,
                &record(&body(0, &[zz(2), 0, 0, zz(6), 0, 0, 0, 0, 0, 0, 0])),
            ),
            |e| matches!(e, DecodeError::BadControlRecord { .. }),
        ),
        (
            "abort marker with a two-byte value",
            batch_at(
                0,
                7,
                0x30,
                0,
                1,
                &record(&body(0, &[zz(4), 0, 0, 0, 0, zz(2), 0, 0, 0])),
            ),
            |e| matches!(e, DecodeError::BadControlRecord { .. }),
        ),
    ];
    for (name, raw, expected) in rows {
        let bytes = Bytes::from(raw);
        let got = batch_by_batch(bytes.clone());
        assert!(matches!(&got, Err(e) if expected(e)), "{name}: {got:?}");
        // The consumer's path refuses the same bytes too (with its own, larger decompression cap a
        // bomb may get further, into the zeros it expanded to, and fail there). The aborted list names
        // the control batches' producer, so their markers are read rather than skipped unread as they are
        // when no aborted transaction could end at them.
        let aborted = [AbortedTransaction {
            producer_id: 7,
            first_offset: 0,
        }];
        let visible = visible_in(bytes, &aborted, IsolationLevel::ReadCommitted, 0);
        assert!(visible.is_err(), "{name}: visible_in accepted it");
    }
}

/// The per-fetch decompression cap the table reads with: a quarter of what the bombs expand to.
const CAP: usize = 1 << 20;

/// Every batch's control marker and records, decompressed under [`CAP`].
fn batch_by_batch(bytes: Bytes) -> Result<usize, DecodeError> {
    let mut n = 0;
    for batch in crate::records::decode_batches(bytes) {
        let batch = batch?;
        batch.control()?;
        for r in batch.records_with_limit(CAP)? {
            r?;
            n += 1;
        }
    }
    Ok(n)
}

/// Consumer-protocol blobs other members wrote, which reach this client through the coordinator.
#[test]
fn consumer_protocol_blobs() {
    let huge = i32::MAX.to_be_bytes();
    let rows: [(&str, bool, Vec<u8>); 7] = [
        ("subscription: empty", true, vec![]),
        ("subscription: negative version", true, vec![0xff, 0xff]),
        (
            "subscription: topic count i32::MAX",
            true,
            [&[0, 0][..], &huge].concat(),
        ),
        (
            "subscription: topic string longer than the blob",
            true,
            vec![0, 0, 0, 0, 0, 1, 0x7f, 0xff, b'a'],
        ),
        (
            "subscription: topic not UTF-8",
            true,
            vec![0, 0, 0, 0, 0, 1, 0, 1, 0xff, 0xff, 0xff, 0xff, 0xff],
        ),
        (
            "assignment: partition count i32::MAX",
            false,
            [&[0, 1, 0, 0, 0, 1, 0, 1, b't'][..], &huge].concat(),
        ),
        (
            "assignment: user data longer than the blob",
            false,
            [&[0, 0, 0, 0, 0, 0][..], &huge].concat(),
        ),
    ];
    for (name, subscription, blob) in rows {
        let blob = Bytes::from(blob);
        let got = if subscription {
            subscription_round_trips(blob)
        } else {
            assignment_round_trips(blob)
        };
        assert!(
            matches!(got, Err(ConsumerError::Malformed { .. })),
            "{name}: {got:?}"
        );
    }
}
