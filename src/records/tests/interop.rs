//! Cross-checks against an independent implementation of the format, kafka-protocol 0.18's record
//! codec (uncompressed only: its codecs need C in this build): it must read what we write, and we must
//! read what it writes.

use bytes::{Bytes, BytesMut};
use kafka_protocol::indexmap::IndexMap;
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::records as kp;

use super::*;

/// An independent decoder (kafka-protocol) reads our batches back with every record's offset, timestamp,
/// sequence, producer, key, value and headers intact.
#[test]
fn kafka_protocol_reads_our_batches() {
    let mut b = BatchBuilder::new(Compression::None, 1 << 16);
    let headers: &[(&[u8], Option<&[u8]>)] = &[(b"a", Some(b"1")), (b"b", None)];
    for i in 0..5i64 {
        let value = format!("value-{i}");
        let rec = NewRecord {
            timestamp: 5_000 + i * 7,
            key: (i % 2 == 0).then_some(&b"key"[..]),
            value: Some(value.as_bytes()),
            headers: if i == 3 { headers } else { &[] },
        };
        assert!(b.try_append(&rec).unwrap());
    }
    let sealed = b
        .seal(ProducerStamp {
            producer_id: 99,
            producer_epoch: 4,
            base_sequence: 17,
            transactional: true,
        })
        .unwrap();
    let mut buf = sealed.at_offset(1_000);
    let set = kp::RecordBatchDecoder::decode(&mut buf).unwrap();
    assert_eq!(set.records.len(), 5);
    for (i, r) in set.records.iter().enumerate() {
        let i = i as i64;
        assert_eq!(r.offset, 1_000 + i);
        assert_eq!(r.timestamp, 5_000 + i * 7);
        assert_eq!(r.sequence, 17 + i as i32);
        assert_eq!((r.producer_id, r.producer_epoch), (99, 4));
        assert!(r.transactional && !r.control);
        assert_eq!(r.key.is_some(), i % 2 == 0);
        assert_eq!(r.value.as_deref(), Some(format!("value-{i}").as_bytes()));
        assert_eq!(r.headers.len(), if i == 3 { 2 } else { 0 });
    }
    let h = &set.records[3].headers;
    assert_eq!(
        h.get(&StrBytes::from_static_str("a")).unwrap().as_deref(),
        Some(&b"1"[..])
    );
    assert_eq!(h.get(&StrBytes::from_static_str("b")).unwrap(), &None);
}

/// We read batches written by an independent encoder (kafka-protocol) with every header and record field
/// intact, null values and headers included.
#[test]
fn we_read_kafka_protocol_batches() {
    let mut headers = IndexMap::new();
    headers.insert(
        StrBytes::from_static_str("h"),
        Some(Bytes::from_static(b"v")),
    );
    let records: Vec<kp::Record> = (0..4i64)
        .map(|i| kp::Record {
            transactional: false,
            control: false,
            delete_horizon: false,
            partition_leader_epoch: 0,
            producer_id: 7,
            producer_epoch: 1,
            timestamp_type: kp::TimestampType::Creation,
            offset: 300 + i,
            sequence: 40 + i as i32,
            timestamp: 9_000 - i,
            key: Some(Bytes::from(format!("k{i}"))),
            value: (i != 2).then(|| Bytes::from(format!("v{i}"))),
            headers: if i == 1 {
                headers.clone()
            } else {
                IndexMap::new()
            },
        })
        .collect();
    let mut buf = BytesMut::new();
    let options = kp::RecordEncodeOptions {
        version: 2,
        compression: kp::Compression::None,
    };
    kp::RecordBatchEncoder::encode(&mut buf, &records, &options).unwrap();
    let batch = decode_batches(buf.freeze()).next().unwrap().unwrap();
    assert_eq!(batch.base_offset(), 300);
    assert_eq!(batch.last_offset(), 303);
    assert_eq!((batch.producer_id(), batch.producer_epoch()), (7, 1));
    assert_eq!(batch.base_sequence(), 40);
    assert!(!batch.is_transactional());
    let ours: Vec<Record> = batch.records().unwrap().map(Result::unwrap).collect();
    for (o, k) in ours.iter().zip(&records) {
        assert_eq!(o.offset, k.offset);
        assert_eq!(o.timestamp, k.timestamp);
        assert_eq!(o.key, k.key);
        assert_eq!(o.value, k.value);
        let kh: Vec<(Bytes, Option<Bytes>)> = k
            .headers
            .iter()
            .map(|(name, v)| (Bytes::copy_from_slice(name.as_bytes()), v.clone()))
            .collect();
        let oh: Vec<(Bytes, Option<Bytes>)> = o
            .headers
            .iter()
            .map(|h| (h.key.clone(), h.value.clone()))
            .collect();
        assert_eq!(oh, kh);
    }
}
