//! A whole Fetch response: kafka-protocol's FetchResponse at several versions, then our records layer
//! over every partition's `records` bytes with the partition's aborted-transaction list.
//!
//! The response is built from the input (partitions whose `records` are raw input bytes, aborted lists
//! from input bytes), encoded by kafka-protocol at a version picked by the input, decoded back and fed to
//! the engine. Arbitrary bytes in front of kafka-protocol's decoder are the `responses` target's job;
//! this one keeps the response well-formed so the mutations go into the records.
#![no_main]

use bytes::{Bytes, BytesMut};
use kafka_protocol::messages::fetch_response::{
    AbortedTransaction, FetchResponse, FetchableTopicResponse, PartitionData,
};
use kafka_protocol::messages::{ProducerId, TopicName};
use kafka_protocol::protocol::{Decodable, Encodable, StrBytes};
use libfuzzer_sys::fuzz_target;
use snapfence::records::{self, IsolationLevel, LogState};

const VERSIONS: [i16; 6] = [4, 7, 11, 12, 13, 16];

fuzz_target!(|data: &[u8]| {
    let Some((&head, rest)) = data.split_first() else {
        return;
    };
    let version = VERSIONS[usize::from(head) % VERSIONS.len()];
    let partitions = usize::from(head >> 4) % 3 + 1;
    // Split the rest into one chunk per partition: a 4-byte aborted list descriptor, then records.
    let chunk = rest.len() / partitions;
    let mut parts = vec![];
    for (i, c) in rest.chunks(chunk.max(1)).take(partitions).enumerate() {
        let (desc, recs) = c.split_at(c.len().min(4));
        let aborted: Vec<AbortedTransaction> = desc
            .iter()
            .map(|&b| {
                AbortedTransaction::default()
                    .with_producer_id(ProducerId(i64::from(b & 0x03)))
                    .with_first_offset(i64::from(b >> 2))
            })
            .collect();
        parts.push(
            PartitionData::default()
                .with_partition_index(i as i32)
                .with_high_watermark(1 << 20)
                .with_last_stable_offset(1 << 20)
                .with_aborted_transactions((!aborted.is_empty()).then_some(aborted))
                .with_records(Some(Bytes::copy_from_slice(recs))),
        );
    }
    let response = FetchResponse::default().with_responses(vec![FetchableTopicResponse::default()
        .with_topic(TopicName(StrBytes::from_static_str("t")))
        .with_partitions(parts)]);
    let mut buf = BytesMut::new();
    response.encode(&mut buf, version).expect("encodable");
    let mut frame = buf.freeze();
    let decoded = FetchResponse::decode(&mut frame, version).expect("decodes what it encoded");
    assert_eq!(decoded.responses.len(), 1);

    for topic in &decoded.responses {
        for p in &topic.partitions {
            let Some(bytes) = p.records.clone() else {
                continue;
            };
            let aborted: Vec<records::AbortedTransaction> = p
                .aborted_transactions
                .iter()
                .flatten()
                .map(|t| records::AbortedTransaction {
                    producer_id: t.producer_id.0,
                    first_offset: t.first_offset,
                })
                .collect();
            for isolation in [IsolationLevel::ReadCommitted, IsolationLevel::ReadUncommitted] {
                if let Ok(v) = records::visible_in(bytes.clone(), &aborted, isolation, 0) {
                    for r in v.iter() {
                        let _ = (r.key(), r.value(), r.headers().count());
                    }
                }
            }
            let batches: Vec<_> = records::decode_batches(bytes).map_while(Result::ok).collect();
            let _ = LogState::scan(&batches);
        }
    }
});
