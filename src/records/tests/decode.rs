//! Decoding what the encoder builds: every header field, every record field, zero-copy slices, and the
//! partial trailing batch.

use bytes::Bytes;

use super::*;

fn sample_batch(codec: Compression, stamp: ProducerStamp) -> SealedBatch {
    let mut b = BatchBuilder::new(codec, 1 << 20);
    let headers: &[(&[u8], Option<&[u8]>)] = &[(b"trace", Some(b"abc")), (b"empty", None)];
    let recs = [
        NewRecord {
            timestamp: 10_000,
            key: Some(b"key-a"),
            value: Some(b"value-a"),
            headers,
        },
        NewRecord {
            timestamp: 9_000,
            key: None,
            value: Some(b""),
            headers: &[],
        },
        NewRecord {
            timestamp: 12_000,
            key: Some(b""),
            value: None,
            headers: &[],
        },
    ];
    for r in &recs {
        assert!(b.try_append(r).unwrap());
    }
    b.seal(stamp).unwrap()
}

/// Every batch header field and every record field, null and empty keys, values and headers included,
/// decodes to what the builder wrote, with every codec.
#[test]
fn header_fields_round_trip() {
    let stamp = ProducerStamp {
        producer_id: 4242,
        producer_epoch: 7,
        base_sequence: 100,
        transactional: true,
    };
    for codec in ALL_CODECS {
        let sealed = sample_batch(codec, stamp);
        let bytes = sealed.at_offset(500);
        let mut it = decode_batches(bytes.clone());
        let batch = it.next().unwrap().unwrap();
        assert!(it.next().is_none());
        assert_eq!(it.remaining(), 0);
        assert_eq!(it.next_offset(), Some(503));
        assert_eq!(batch.base_offset(), 500);
        assert_eq!(batch.batch_length() as usize, bytes.len() - 12);
        assert_eq!(batch.partition_leader_epoch(), -1);
        assert_eq!(batch.magic(), 2);
        assert_eq!(batch.compression(), codec);
        assert_eq!(batch.attributes().codec_id(), codec.id());
        assert!(batch.is_transactional());
        assert!(!batch.is_control());
        assert!(!batch.attributes().has_delete_horizon());
        assert_eq!(
            batch.attributes().timestamp_type(),
            TimestampType::CreateTime
        );
        assert_eq!(batch.last_offset_delta(), 2);
        assert_eq!(batch.last_offset(), 502);
        assert_eq!(batch.base_timestamp(), 10_000);
        assert_eq!(batch.max_timestamp(), 12_000);
        assert_eq!(batch.producer_id(), 4242);
        assert_eq!(batch.producer_epoch(), 7);
        assert_eq!(batch.base_sequence(), 100);
        assert_eq!(batch.record_count(), 3);
        assert_eq!(batch.control().unwrap(), None);
        let records: Vec<Record> = batch.records().unwrap().map(Result::unwrap).collect();
        assert_eq!(records.len(), 3);
        assert_eq!(records[0].offset, 500);
        assert_eq!(records[0].timestamp, 10_000);
        assert_eq!(records[0].key.as_deref(), Some(&b"key-a"[..]));
        assert_eq!(records[0].value.as_deref(), Some(&b"value-a"[..]));
        assert_eq!(
            records[0].headers,
            vec![
                Header {
                    key: Bytes::from_static(b"trace"),
                    value: Some(Bytes::from_static(b"abc"))
                },
                Header {
                    key: Bytes::from_static(b"empty"),
                    value: None
                },
            ]
        );
        assert_eq!((records[1].offset, records[1].timestamp), (501, 9_000));
        assert_eq!(records[1].key, None);
        assert_eq!(records[1].value.as_deref(), Some(&b""[..]));
        assert!(records[1].headers.is_empty());
        assert_eq!((records[2].offset, records[2].timestamp), (502, 12_000));
        assert_eq!(records[2].key.as_deref(), Some(&b""[..]));
        assert_eq!(records[2].value, None);
    }
}

/// Keys, values and header values of an uncompressed batch are slices of the fetched buffer, never
/// copies.
#[test]
fn uncompressed_keys_and_values_are_slices_of_the_fetch_buffer() {
    let bytes = sample_batch(Compression::None, ProducerStamp::NONE).at_offset(0);
    let range = bytes.as_ptr() as usize..bytes.as_ptr() as usize + bytes.len();
    let batch = decode_batches(bytes.clone()).next().unwrap().unwrap();
    let r = batch.records().unwrap().next().unwrap().unwrap();
    for part in [
        r.key.unwrap(),
        r.value.unwrap(),
        r.headers[0].value.clone().unwrap(),
    ] {
        assert!(
            range.contains(&(part.as_ptr() as usize)),
            "copied, not sliced"
        );
    }
}

/// In a log-append-time batch every record takes the batch's max timestamp, which the broker wrote,
/// whatever its own delta says.
#[test]
fn log_append_time_gives_every_record_the_max_timestamp() {
    let sealed = sample_batch(Compression::None, ProducerStamp::NONE);
    let mut raw = sealed.bytes().to_vec();
    // The broker rewrites attributes bit 3 and the max timestamp on append, then the CRC.
    raw[22] |= 0x08;
    raw[35..43].copy_from_slice(&77_777i64.to_be_bytes());
    malformed::fix_crc(&mut raw);
    let batch = decode_batches(Bytes::from(raw)).next().unwrap().unwrap();
    assert_eq!(
        batch.attributes().timestamp_type(),
        TimestampType::LogAppendTime
    );
    for r in batch.records().unwrap() {
        let r = r.unwrap();
        assert_eq!(r.timestamp, 77_777);
        assert_eq!(r.timestamp_type, TimestampType::LogAppendTime);
    }
}

/// The delete-horizon attribute bit the log cleaner sets is reported.
#[test]
fn delete_horizon_bit_is_reported() {
    let mut raw = sample_batch(Compression::None, ProducerStamp::NONE)
        .bytes()
        .to_vec();
    raw[22] |= 0x40;
    malformed::fix_crc(&mut raw);
    let batch = decode_batches(Bytes::from(raw)).next().unwrap().unwrap();
    assert!(batch.attributes().has_delete_horizon());
}

/// Commit, abort and unknown control markers decode with their producer, epoch and coordinator epoch,
/// and the batch reads as transactional control.
#[test]
fn control_markers_decode() {
    for (marker, kind) in [
        (
            ControlMarker::Abort {
                coordinator_epoch: 9,
            },
            "abort",
        ),
        (
            ControlMarker::Commit {
                coordinator_epoch: 11,
            },
            "commit",
        ),
        (ControlMarker::Other { kind: 3 }, "other"),
    ] {
        let bytes = control_batch(40, 77, 2, marker, 123);
        let batch = decode_batches(bytes).next().unwrap().unwrap();
        assert!(batch.is_control(), "{kind}");
        assert!(batch.is_transactional(), "{kind}");
        assert_eq!(batch.producer_id(), 77);
        assert_eq!(batch.producer_epoch(), 2);
        assert_eq!(batch.base_offset(), 40);
        assert_eq!(batch.control().unwrap(), Some(marker));
    }
}

/// A partial trailing batch is normal in a fetch response: decoding must stop cleanly at every possible
/// cut, yield exactly the batches that are complete, and report the offset they reach.
#[test]
fn partial_trailing_batch_ends_cleanly_at_every_cut() {
    let mut log = Log::new();
    log.plain(&["a", "b"]);
    log.txn(5, &["c"]);
    log.marker(5, true);
    let full = log.bytes();
    let ends: Vec<usize> = {
        let mut ends = vec![];
        let mut at = 0;
        for b in log.batches() {
            at += 12 + b.batch_length() as usize;
            ends.push(at);
        }
        ends
    };
    let next_offsets = [2, 3, 4];
    for cut in 0..=full.len() {
        let mut it = decode_batches(full.slice(..cut));
        let got: Vec<_> = it.by_ref().map(Result::unwrap).collect();
        let complete = ends.iter().filter(|&&e| e <= cut).count();
        assert_eq!(got.len(), complete, "cut at {cut}");
        let consumed = if complete == 0 { 0 } else { ends[complete - 1] };
        assert_eq!(it.remaining(), cut - consumed);
        assert_eq!(
            it.next_offset(),
            complete.checked_sub(1).map(|i| next_offsets[i])
        );
    }
}

/// Empty input yields no batch, no error and no next offset.
#[test]
fn empty_input_yields_nothing() {
    let mut it = decode_batches(Bytes::new());
    assert!(it.next().is_none());
    assert_eq!(it.next_offset(), None);
}

/// The batch builder never grows past its byte budget, except that the first record is always taken so
/// no record is too big to send alone.
#[test]
fn builder_respects_its_byte_budget_and_always_takes_a_first_record() {
    let value = [7u8; 100];
    let rec = NewRecord {
        timestamp: 1,
        key: None,
        value: Some(&value),
        headers: &[],
    };
    let mut b = BatchBuilder::new(Compression::None, 400);
    let mut n = 0;
    while b.try_append(&rec).unwrap() {
        n += 1;
    }
    assert!(n >= 2);
    assert!(b.size() <= 400);
    assert_eq!(b.record_count(), n);
    let sealed = b.seal(ProducerStamp::NONE).unwrap();
    assert!(sealed.bytes().len() <= 400);

    let big = [1u8; 1000];
    let mut b = BatchBuilder::new(Compression::None, 400);
    let rec = NewRecord {
        value: Some(&big),
        ..rec
    };
    assert!(b.try_append(&rec).unwrap(), "first record always fits");
    assert!(!b.try_append(&rec).unwrap());
    assert_eq!(b.record_count(), 1);
}

/// Retries must resend identical bytes, and a restamp changes exactly the producer fields and the CRC.
#[test]
fn restamp_rewrites_producer_fields_and_crc_only() {
    let first = ProducerStamp {
        producer_id: 1,
        producer_epoch: 0,
        base_sequence: 0,
        transactional: false,
    };
    let mut sealed = sample_batch(Compression::Lz4, first);
    let before = sealed.bytes().clone();
    assert_eq!(sealed.bytes(), &before, "bytes are stable until restamped");
    let second = ProducerStamp {
        producer_id: 1,
        producer_epoch: 1,
        base_sequence: 0,
        transactional: true,
    };
    sealed.restamp(second);
    assert_eq!(sealed.stamp(), second);
    let after = sealed.bytes().clone();
    assert_eq!(before.len(), after.len());
    let changed: Vec<usize> = (0..before.len())
        .filter(|&i| before[i] != after[i])
        .collect();
    assert!(changed
        .iter()
        .all(|&i| (17..23).contains(&i) || (43..57).contains(&i)));
    let batch = decode_batches(after).next().unwrap().unwrap();
    assert_eq!(batch.producer_epoch(), 1);
    assert!(batch.is_transactional());
    assert_eq!(batch.records().unwrap().count(), 3);
}

/// The engine's borrowed view and its owned records agree with the batch's own record iterator.
#[test]
fn visible_views_match_decoded_records() {
    for codec in ALL_CODECS {
        let bytes = sample_batch(codec, ProducerStamp::NONE).at_offset(10);
        let batch = decode_batches(bytes.clone()).next().unwrap().unwrap();
        let want: Vec<Record> = batch.records().unwrap().map(Result::unwrap).collect();
        let v = visible_in(bytes.clone(), &[], IsolationLevel::ReadUncommitted, 0).unwrap();
        assert_eq!(v.len(), 3);
        assert_eq!(v.next_offset, 13);
        for (r, w) in v.iter().zip(&want) {
            assert_eq!(r.offset(), w.offset);
            assert_eq!(r.timestamp(), w.timestamp);
            assert_eq!(r.timestamp_type(), w.timestamp_type);
            assert_eq!(r.key(), w.key.as_deref());
            assert_eq!(r.value(), w.value.as_deref());
            assert_eq!(r.key_bytes(), w.key);
            assert_eq!(r.value_bytes(), w.value);
            let headers: Vec<(&[u8], Option<&[u8]>)> = r.headers().collect();
            let want_headers: Vec<(&[u8], Option<&[u8]>)> = w
                .headers
                .iter()
                .map(|h| (&h.key[..], h.value.as_deref()))
                .collect();
            assert_eq!(headers, want_headers);
            assert_eq!(&r.to_record(), w);
        }
        assert_eq!(v.get(1).unwrap().offset(), 11);
        assert!(v.get(3).is_none());
        assert_eq!(v.clone().into_records(), want);
        if codec == Compression::None {
            // Zero-copy through the engine too: the delivered value points into the fetched bytes.
            let range = bytes.as_ptr() as usize..bytes.as_ptr() as usize + bytes.len();
            let value = v.get(0).unwrap().value_bytes().unwrap();
            assert!(range.contains(&(value.as_ptr() as usize)));
        }
    }
    // Starting inside the batch skips the records below the fetch offset.
    let bytes = sample_batch(Compression::Gzip, ProducerStamp::NONE).at_offset(10);
    let v = visible_in(bytes, &[], IsolationLevel::ReadCommitted, 12).unwrap();
    assert_eq!(v.iter().map(|r| r.offset()).collect::<Vec<_>>(), [12]);
    assert_eq!(Visible::empty(5).next_offset, 5);
}

/// A batch with no record cannot be sealed: it is a typed encode error, never an empty batch on the
/// wire.
#[test]
fn an_empty_builder_cannot_be_sealed() {
    let b = BatchBuilder::new(Compression::Zstd, 1024);
    assert!(b.is_empty());
    assert_eq!(
        b.seal(ProducerStamp::NONE).unwrap_err(),
        EncodeError::EmptyBatch
    );
}
