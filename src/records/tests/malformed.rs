//! One test per malformation, each checking its error variant: bad input gets a typed error, never a
//! panic and never an allocation sized by an unchecked length.

use bytes::Bytes;

use super::*;

pub(crate) use crate::records::fuzzing::fix_crc;

/// A magic 2 batch at offset 0, no producer, around a hand-written record section.
pub(crate) fn raw_batch(
    attributes: i16,
    last_offset_delta: i32,
    count: i32,
    section: &[u8],
) -> Vec<u8> {
    crate::records::fuzzing::raw_batch(0, -1, attributes, last_offset_delta, count, section)
}

pub(crate) fn zz(v: i64) -> u8 {
    let z = ((v << 1) ^ (v >> 63)) as u64;
    assert!(z < 0x80, "test helper writes one-byte varints only");
    z as u8
}

/// A record whose body is `body` (after the length prefix).
pub(crate) fn record(body: &[u8]) -> Vec<u8> {
    let mut r = vec![zz(body.len() as i64)];
    r.extend_from_slice(body);
    r
}

/// Body: attributes 0, timestamp delta 0, offset delta `od`, then `rest`.
pub(crate) fn body(od: i64, rest: &[u8]) -> Vec<u8> {
    let mut b = vec![0, 0, zz(od)];
    b.extend_from_slice(rest);
    b
}

fn first_batch(raw: Vec<u8>) -> Result<RecordBatch, DecodeError> {
    decode_batches(Bytes::from(raw))
        .next()
        .expect("a complete batch")
}

fn first_record(raw: Vec<u8>) -> Result<Record, DecodeError> {
    first_batch(raw)?.records()?.next().expect("a record")
}

fn all_records(raw: Vec<u8>) -> Result<Vec<Record>, DecodeError> {
    first_batch(raw)?.records()?.collect()
}

/// A well-formed record: null key, value "v", no headers.
pub(crate) fn good_record(od: i64) -> Vec<u8> {
    record(&body(od, &[zz(-1), zz(1), b'v', 0]))
}

/// The unaltered batch these tests corrupt decodes cleanly, so each error below comes from its one
/// malformation alone.
#[test]
fn the_helpers_build_a_valid_batch() {
    let recs = all_records(raw_batch(0, 0, 1, &good_record(0))).unwrap();
    assert_eq!(recs.len(), 1);
    assert_eq!(recs[0].value.as_deref(), Some(&b"v"[..]));
}

/// A magic 0 or 1 message set is a typed legacy-format error naming the magic, never misread as a magic
/// 2 batch.
#[test]
fn legacy_magic_is_a_typed_error() {
    for magic in [0u8, 1] {
        let mut raw = raw_batch(0, 0, 1, &good_record(0));
        raw[16] = magic;
        assert!(matches!(
            first_batch(raw),
            Err(DecodeError::LegacyMessageSet { magic: m, .. }) if m == magic as i8
        ));
    }
}

/// A magic byte above 2 is a typed error naming it.
#[test]
fn unknown_magic_is_a_typed_error() {
    let mut raw = raw_batch(0, 0, 1, &good_record(0));
    raw[16] = 3;
    assert!(matches!(
        first_batch(raw),
        Err(DecodeError::UnknownMagic { magic: 3, .. })
    ));
}

/// A batch length too small to hold the batch header, zero or negative included, is a typed error before
/// anything is read from it.
#[test]
fn batch_length_below_the_header() {
    for length in [48, 0, -1, i32::MIN] {
        let mut raw = raw_batch(0, 0, 1, &good_record(0));
        raw[8..12].copy_from_slice(&length.to_be_bytes());
        assert!(matches!(
            first_batch(raw),
            Err(DecodeError::BatchLengthTooSmall { length: l, .. }) if l == length
        ));
    }
}

/// The CRC covers every byte from the attributes to the end of the batch: flipping any one of them is a
/// CRC mismatch.
#[test]
fn any_flipped_covered_byte_fails_the_crc() {
    let good = raw_batch(0, 0, 1, &good_record(0));
    for i in 21..good.len() {
        let mut raw = good.clone();
        raw[i] ^= 0x01;
        assert!(
            matches!(first_batch(raw), Err(DecodeError::CrcMismatch { .. })),
            "byte {i}"
        );
    }
}

/// A compression codec id outside the four Kafka defines is a typed error naming it.
#[test]
fn unknown_codec() {
    for codec in 5..8 {
        assert!(matches!(
            first_batch(raw_batch(codec, 0, 1, &good_record(0))),
            Err(DecodeError::UnknownCompression { codec: c, .. }) if i16::from(c) == codec
        ));
    }
}

/// A negative last offset delta is a typed error.
#[test]
fn negative_last_offset_delta() {
    assert!(matches!(
        first_batch(raw_batch(0, -1, 1, &good_record(0))),
        Err(DecodeError::NegativeLastOffsetDelta { delta: -1, .. })
    ));
}

/// A base offset plus last offset delta past i64::MAX is a typed overflow error, never a wrapped offset.
#[test]
fn last_offset_overflowing_i64() {
    let mut raw = raw_batch(0, 5, 1, &good_record(0));
    raw[0..8].copy_from_slice(&(i64::MAX - 2).to_be_bytes());
    assert!(matches!(
        first_batch(raw),
        Err(DecodeError::OffsetOverflow { delta: 5, .. })
    ));
}

/// The 61-byte batch claiming i32::MAX records that aborts kafka-protocol 0.18 must be a typed error here.
#[test]
fn record_count_larger_than_the_bytes_can_hold() {
    assert!(matches!(
        first_batch(raw_batch(0, 0, i32::MAX, &[])),
        Err(DecodeError::BadRecordCount {
            count: i32::MAX,
            bytes: 0,
            ..
        })
    ));
    assert!(matches!(
        first_batch(raw_batch(0, 0, 2, &good_record(0))),
        Err(DecodeError::BadRecordCount { count: 2, .. })
    ));
    assert!(matches!(
        first_batch(raw_batch(0, 0, -1, &good_record(0))),
        Err(DecodeError::BadRecordCount { count: -1, .. })
    ));
    // A compressed batch's count is checked against the decompressed bytes.
    let section = compression::compress(Compression::Gzip, &good_record(0)).unwrap();
    let batch = first_batch(raw_batch(1, 0, 1000, &section)).unwrap();
    assert!(matches!(
        batch.records(),
        Err(DecodeError::BadRecordCount { count: 1000, .. })
    ));
}

/// A varint or varlong longer than its type allows, or carrying bits past its width, is a typed overflow
/// error.
#[test]
fn varint_overflow() {
    // A record length with six continuation bytes, padded so the count check passes.
    let mut section = vec![0xff, 0xff, 0xff, 0xff, 0xff, 0x01];
    section.extend_from_slice(&[0; 8]);
    assert_eq!(
        first_record(raw_batch(0, 0, 1, &section)).unwrap_err(),
        DecodeError::VarintOverflow
    );
    // Five bytes whose last one carries bits past 32.
    let mut section = vec![0xff, 0xff, 0xff, 0xff, 0x1f];
    section.extend_from_slice(&[0; 8]);
    assert_eq!(
        first_record(raw_batch(0, 0, 1, &section)).unwrap_err(),
        DecodeError::VarintOverflow
    );
    // A varlong (the timestamp delta) of eleven bytes.
    let mut b = vec![0];
    b.extend_from_slice(&[0x80; 10]);
    b.extend_from_slice(&[0x00, 0, 1, 1, 0]);
    assert_eq!(
        first_record(raw_batch(0, 0, 1, &record(&b))).unwrap_err(),
        DecodeError::VarintOverflow
    );
}

/// A record whose length runs past the end of the batch is a typed overrun, never a read past the
/// buffer.
#[test]
fn record_longer_than_the_batch() {
    let mut section = vec![zz(50)];
    section.extend_from_slice(&[0; 10]);
    assert_eq!(
        first_record(raw_batch(0, 0, 1, &section)).unwrap_err(),
        DecodeError::Overrun { field: "record" }
    );
}

/// A key length that runs past the end of its record is an overrun even when the batch has bytes to
/// spare: a field never reads into the next record.
#[test]
fn key_longer_than_its_record() {
    // Key length 20 inside a 7-byte body; the batch has bytes to spare after the record.
    let mut section = record(&body(0, &[zz(20), 0, 0, 0]));
    section.extend_from_slice(&[0; 30]);
    assert_eq!(
        first_record(raw_batch(0, 0, 1, &section)).unwrap_err(),
        DecodeError::Overrun {
            field: "record key"
        }
    );
}

/// Only -1 means null: any other negative record, key, value, header-count or header-key length is a
/// typed error naming the field.
#[test]
fn negative_lengths_other_than_null() {
    let cases: [(Vec<u8>, &str); 4] = [
        (record(&body(0, &[zz(-2), zz(-1), 0])), "record key"),
        (record(&body(0, &[zz(-1), zz(-5), 0])), "record value"),
        (record(&body(0, &[zz(-1), zz(-1), zz(-1)])), "header count"),
        (
            record(&body(0, &[zz(-1), zz(-1), zz(1), zz(-1), zz(-1)])),
            "header key",
        ),
    ];
    for (section, field) in cases {
        assert!(
            matches!(
                first_record(raw_batch(0, 0, 1, &section)),
                Err(DecodeError::NegativeLength { field: f, .. }) if f == field
            ),
            "{field}"
        );
    }
    assert!(matches!(
        first_record(raw_batch(0, 0, 1, &[zz(-3), 0, 0, 0, 0, 0, 0])),
        Err(DecodeError::NegativeLength {
            field: "record",
            length: -3
        })
    ));
}

/// A header count larger than the record can hold is a typed overrun, never an allocation sized by the
/// count.
#[test]
fn header_count_larger_than_the_record() {
    let section = record(&body(0, &[zz(-1), zz(-1), zz(40)]));
    assert_eq!(
        first_record(raw_batch(0, 0, 1, &section)).unwrap_err(),
        DecodeError::Overrun { field: "headers" }
    );
}

/// A record's offset delta outside 0..=last_offset_delta is a typed error.
#[test]
fn offset_delta_outside_the_batch() {
    assert!(matches!(
        first_record(raw_batch(0, 0, 1, &good_record(1))),
        Err(DecodeError::OffsetDeltaOutOfRange {
            delta: 1,
            last_offset_delta: 0
        })
    ));
    assert!(matches!(
        first_record(raw_batch(0, 3, 1, &good_record(-1))),
        Err(DecodeError::OffsetDeltaOutOfRange { delta: -1, .. })
    ));
}

/// A record whose length prefix disagrees with the bytes its fields use is a typed error.
#[test]
fn record_length_disagreeing_with_its_fields() {
    // The length prefix claims one byte more than the fields use.
    let mut body = body(0, &[zz(-1), zz(-1), 0]);
    body.push(0xAA);
    assert_eq!(
        first_record(raw_batch(0, 0, 1, &record(&body))).unwrap_err(),
        DecodeError::RecordLengthMismatch {
            declared: 7,
            read: 6
        }
    );
}

/// Bytes left after the declared number of records are a typed error, never silently ignored.
#[test]
fn bytes_after_the_declared_records() {
    let mut section = good_record(0);
    section.extend_from_slice(&good_record(0));
    let err = all_records(raw_batch(0, 0, 1, &section)).unwrap_err();
    assert_eq!(err, DecodeError::TrailingBytes { bytes: 8 });
}

/// A batch holding fewer records than its count declares is an error.
#[test]
fn fewer_records_than_declared() {
    // Two declared, one present, padding zeros after it read as a zero-length record.
    let mut section = good_record(0);
    section.extend_from_slice(&[0; 7]);
    // The second record's declared length (0) leaves no room for its fields: the read overruns it.
    let err = all_records(raw_batch(0, 1, 2, &section)).unwrap_err();
    assert!(matches!(err, DecodeError::Overrun { .. }), "{err:?}");
}

/// A control record whose key or value is too short is a typed error, while a control batch with no
/// record (what the log cleaner leaves) is no marker and no error.
#[test]
fn malformed_control_records() {
    // Control bit set, transactional, a record whose key is 2 bytes.
    let short_key = record(&body(0, &[zz(2), 0, 0, zz(6), 0, 0, 0, 0, 0, 0, 0]));
    let batch = first_batch(raw_batch(0x30, 0, 1, &short_key)).unwrap();
    assert!(matches!(
        batch.control(),
        Err(DecodeError::BadControlRecord { .. })
    ));
    // An ABORT key with a 2-byte value.
    let short_value = record(&body(0, &[zz(4), 0, 0, 0, 0, zz(2), 0, 0, 0]));
    let batch = first_batch(raw_batch(0x30, 0, 1, &short_value)).unwrap();
    assert!(matches!(
        batch.control(),
        Err(DecodeError::BadControlRecord { .. })
    ));
    // A control batch without records is what the log cleaner leaves after removing a marker: no
    // marker, not an error.
    let batch = first_batch(raw_batch(0x30, 0, 0, &[])).unwrap();
    assert!(matches!(batch.control(), Ok(None)));
}

/// A compressed section that does not decompress, truncated snappy-java framing included, is a typed
/// decompression error naming the codec.
#[test]
fn corrupt_compressed_sections() {
    for codec in [
        Compression::Gzip,
        Compression::Snappy,
        Compression::Lz4,
        Compression::Zstd,
    ] {
        let junk = [0x13u8; 64];
        let batch = first_batch(raw_batch(i16::from(codec.id()), 0, 1, &junk)).unwrap();
        assert!(
            matches!(batch.records(), Err(DecodeError::Decompress { codec: c, .. }) if c == codec),
            "{codec:?}"
        );
    }
    // Truncated snappy-java stream: header then a chunk length pointing past the end.
    let mut xerial = compression::compress(Compression::Snappy, b"hello hello hello").unwrap();
    xerial.truncate(xerial.len() - 3);
    assert!(matches!(
        compression::decompress(Compression::Snappy, &xerial, 1 << 20),
        Err(DecodeError::Decompress { .. })
    ));
}

/// Every codec stops a decompression bomb at the cap with a typed error instead of expanding it.
#[test]
fn decompression_bomb_per_codec() {
    let zeros = vec![0u8; 4 << 20];
    for codec in [
        Compression::Gzip,
        Compression::Snappy,
        Compression::Lz4,
        Compression::Zstd,
    ] {
        let bomb = compression::compress(codec, &zeros).unwrap();
        assert!(bomb.len() < zeros.len() / 10, "{codec:?} compresses zeros");
        let limit = 1 << 20;
        assert_eq!(
            compression::decompress(codec, &bomb, limit).unwrap_err(),
            DecodeError::DecompressedTooLarge { codec, limit },
            "{codec:?}"
        );
        // The same bytes inside a batch, read with the batch-level cap.
        let batch = first_batch(raw_batch(i16::from(codec.id()), 0, 1, &bomb)).unwrap();
        assert!(matches!(
            batch.records_with_limit(limit),
            Err(DecodeError::DecompressedTooLarge { .. })
        ));
        // Under a cap that fits, the same bytes decode.
        assert_eq!(
            compression::decompress(codec, &bomb, zeros.len())
                .unwrap()
                .len(),
            zeros.len()
        );
    }
    // A raw snappy block declares its length up front: rejected before any allocation.
    let raw = snap::raw::Encoder::new().compress_vec(&zeros).unwrap();
    assert_eq!(
        compression::decompress(Compression::Snappy, &raw, 1000).unwrap_err(),
        DecodeError::DecompressedTooLarge {
            codec: Compression::Snappy,
            limit: 1000
        }
    );
}

/// Errors stop the batch iterator: nothing is yielded after the first error.
#[test]
fn batch_iterator_is_fused_after_an_error() {
    let mut bytes = raw_batch(0, 0, 1, &good_record(0));
    bytes[30] ^= 1;
    bytes.extend_from_slice(&raw_batch(0, 0, 1, &good_record(0)));
    let mut it = decode_batches(Bytes::from(bytes));
    assert!(matches!(
        it.next(),
        Some(Err(DecodeError::CrcMismatch { .. }))
    ));
    assert!(it.next().is_none());
}
