//! Building the transaction requests at a negotiated version, and reducing their answers to what the
//! state machine needs.
//!
//! A fence is never dropped to make a request fit an old version: a TxnOffsetCommit below v3 cannot
//! carry the group generation, so the builder still sets it and the encoder refuses the request. The
//! state machine refuses earlier, when the broker's versions are known; this is the second line.
//!
//! # References
//! - InitProducerId v3+ (KIP-360 current id and epoch), AddPartitionsToTxn v0-3 (the client versions;
//!   v4+ batch several transactions and are for brokers), TxnOffsetCommit v3+ (KIP-447 generation,
//!   member id, group instance id), EndTxn v5 (KIP-890 part 2: the answer carries the next id and epoch)

use std::collections::BTreeMap;

use kafka_protocol::messages::{
    add_offsets_to_txn_request::AddOffsetsToTxnRequest,
    add_offsets_to_txn_response::AddOffsetsToTxnResponse,
    add_partitions_to_txn_request::{AddPartitionsToTxnRequest, AddPartitionsToTxnTopic},
    add_partitions_to_txn_response::AddPartitionsToTxnResponse,
    end_txn_request::EndTxnRequest,
    end_txn_response::EndTxnResponse,
    init_producer_id_request::InitProducerIdRequest,
    init_producer_id_response::InitProducerIdResponse,
    txn_offset_commit_request::{
        TxnOffsetCommitRequest, TxnOffsetCommitRequestPartition, TxnOffsetCommitRequestTopic,
    },
    txn_offset_commit_response::TxnOffsetCommitResponse,
    GroupId, ProducerId, TopicName, TransactionalId,
};
use kafka_protocol::protocol::StrBytes;

use super::txn::TxnResponse;
use super::{OffsetAndMetadata, ProducerIdEpoch, TopicPartition};
use crate::wire::ErrorCode;
use crate::GroupMetadata;

fn str_bytes(s: &str) -> StrBytes {
    StrBytes::from_string(s.to_owned())
}

fn txn_id(s: &str) -> TransactionalId {
    TransactionalId(str_bytes(s))
}

/// InitProducerId. `transactional_id` is `None` for the idempotent producer. `current` (KIP-360) asks
/// the coordinator to bump this id's epoch; below v3 it cannot be expressed and is left out.
pub(crate) fn init_producer_id(
    transactional_id: Option<&str>,
    timeout_ms: i32,
    current: Option<ProducerIdEpoch>,
    version: i16,
) -> InitProducerIdRequest {
    let mut r = InitProducerIdRequest::default()
        .with_transactional_id(transactional_id.map(txn_id))
        .with_transaction_timeout_ms(timeout_ms);
    if let (Some(ids), true) = (current, version >= 3) {
        r = r
            .with_producer_id(ProducerId(ids.id))
            .with_producer_epoch(ids.epoch);
    }
    r
}

pub(crate) fn parse_init_producer_id(r: &InitProducerIdResponse, version: i16) -> TxnResponse {
    let code = ErrorCode::from_code(r.error_code);
    if !code.is_ok() {
        return TxnResponse::InitProducerId(Err(code));
    }
    if r.producer_id.0 < 0 || r.producer_epoch < 0 {
        // A success without an id would be taken as an id of -1; the broker never does this.
        return TxnResponse::InitProducerId(Err(ErrorCode::UnknownServerError));
    }
    let ids = ProducerIdEpoch {
        id: r.producer_id.0,
        epoch: r.producer_epoch,
    };
    // v6 (KIP-939): with KeepPreparedTxn, the transaction left open and the ids it runs under.
    if version >= 6 && r.ongoing_txn_producer_id.0 >= 0 && r.ongoing_txn_producer_epoch >= 0 {
        return TxnResponse::InitKept {
            ids,
            ongoing: ProducerIdEpoch {
                id: r.ongoing_txn_producer_id.0,
                epoch: r.ongoing_txn_producer_epoch,
            },
        };
    }
    TxnResponse::InitProducerId(Ok(ids))
}

/// Groups partitions by topic, keeping a stable order.
fn by_topic<'a, T: 'a>(
    items: impl IntoIterator<Item = (&'a TopicPartition, T)>,
) -> BTreeMap<&'a str, Vec<(i32, T)>> {
    let mut map: BTreeMap<&str, Vec<(i32, T)>> = BTreeMap::new();
    for (tp, v) in items {
        map.entry(&*tp.topic).or_default().push((tp.partition, v));
    }
    map
}

/// AddPartitionsToTxn in its client shape (v0-3).
pub(crate) fn add_partitions(
    transactional_id: &str,
    ids: ProducerIdEpoch,
    partitions: &[TopicPartition],
) -> AddPartitionsToTxnRequest {
    let topics = by_topic(partitions.iter().map(|tp| (tp, ())))
        .into_iter()
        .map(|(topic, parts)| {
            AddPartitionsToTxnTopic::default()
                .with_name(TopicName(str_bytes(topic)))
                .with_partitions(parts.into_iter().map(|(p, ())| p).collect())
        })
        .collect();
    AddPartitionsToTxnRequest::default()
        .with_v3_and_below_transactional_id(txn_id(transactional_id))
        .with_v3_and_below_producer_id(ProducerId(ids.id))
        .with_v3_and_below_producer_epoch(ids.epoch)
        .with_v3_and_below_topics(topics)
}

pub(crate) fn parse_add_partitions(r: &AddPartitionsToTxnResponse) -> TxnResponse {
    let mut out = Vec::new();
    for t in &r.results_by_topic_v3_and_below {
        for p in &t.results_by_partition {
            out.push((
                TopicPartition::new(t.name.0.as_str(), p.partition_index),
                ErrorCode::from_code(p.partition_error_code),
            ));
        }
    }
    TxnResponse::AddPartitions(out)
}

pub(crate) fn add_offsets(
    transactional_id: &str,
    ids: ProducerIdEpoch,
    group_id: &str,
) -> AddOffsetsToTxnRequest {
    AddOffsetsToTxnRequest::default()
        .with_transactional_id(txn_id(transactional_id))
        .with_producer_id(ProducerId(ids.id))
        .with_producer_epoch(ids.epoch)
        .with_group_id(GroupId(str_bytes(group_id)))
}

pub(crate) fn parse_add_offsets(r: &AddOffsetsToTxnResponse) -> TxnResponse {
    TxnResponse::AddOffsets(ErrorCode::from_code(r.error_code))
}

/// TxnOffsetCommit carrying the group metadata (KIP-447). The generation is set whatever the version, so
/// that a version too old to carry it fails to encode instead of committing unfenced.
pub(crate) fn txn_offset_commit(
    transactional_id: &str,
    ids: ProducerIdEpoch,
    group: &GroupMetadata,
    offsets: &[(TopicPartition, OffsetAndMetadata)],
) -> TxnOffsetCommitRequest {
    let topics = by_topic(offsets.iter().map(|(tp, om)| (tp, om)))
        .into_iter()
        .map(|(topic, parts)| {
            TxnOffsetCommitRequestTopic::default()
                .with_name(TopicName(str_bytes(topic)))
                .with_partitions(
                    parts
                        .into_iter()
                        .map(|(p, om)| {
                            TxnOffsetCommitRequestPartition::default()
                                .with_partition_index(p)
                                .with_committed_offset(om.offset)
                                .with_committed_leader_epoch(om.leader_epoch.unwrap_or(-1))
                                .with_committed_metadata(om.metadata.as_deref().map(str_bytes))
                        })
                        .collect(),
                )
        })
        .collect();
    TxnOffsetCommitRequest::default()
        .with_transactional_id(txn_id(transactional_id))
        .with_group_id(GroupId(str_bytes(group.group_id())))
        .with_producer_id(ProducerId(ids.id))
        .with_producer_epoch(ids.epoch)
        .with_generation_id(group.generation_id())
        .with_member_id(str_bytes(group.member_id()))
        .with_group_instance_id(group.group_instance_id().map(str_bytes))
        .with_topics(topics)
}

pub(crate) fn parse_txn_offset_commit(r: &TxnOffsetCommitResponse) -> TxnResponse {
    let mut out = Vec::new();
    for t in &r.topics {
        for p in &t.partitions {
            out.push((
                TopicPartition::new(t.name.0.as_str(), p.partition_index),
                ErrorCode::from_code(p.error_code),
            ));
        }
    }
    TxnResponse::TxnOffsetCommit(out)
}

pub(crate) fn end_txn(transactional_id: &str, ids: ProducerIdEpoch, commit: bool) -> EndTxnRequest {
    EndTxnRequest::default()
        .with_transactional_id(txn_id(transactional_id))
        .with_producer_id(ProducerId(ids.id))
        .with_producer_epoch(ids.epoch)
        .with_committed(commit)
}

/// The answer to EndTxn at `version`: from v5 it carries the id and epoch for the next transaction.
pub(crate) fn parse_end_txn(r: &EndTxnResponse, version: i16) -> TxnResponse {
    let next = (version >= 5 && r.producer_id.0 >= 0 && r.producer_epoch >= 0).then_some(
        ProducerIdEpoch {
            id: r.producer_id.0,
            epoch: r.producer_epoch,
        },
    );
    TxnResponse::EndTxn {
        code: ErrorCode::from_code(r.error_code),
        next,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::BytesMut;
    use kafka_protocol::protocol::{Decodable, Encodable};

    fn round_trip<T: Encodable + Decodable>(msg: &T, version: i16) -> T {
        let mut buf = BytesMut::new();
        msg.encode(&mut buf, version).expect("encodes");
        let mut bytes = buf.freeze();
        T::decode(&mut bytes, version).expect("decodes")
    }

    fn group() -> GroupMetadata {
        GroupMetadata::new("g", 7, "member-1", Some("instance-a".into())).unwrap()
    }

    const IDS: ProducerIdEpoch = ProducerIdEpoch { id: 42, epoch: 3 };

    /// KIP-447: the offset commit carries the group's generation, member id and instance id at v3+, so
    /// the coordinator can reject a stale owner.
    #[test]
    fn txn_offset_commit_carries_the_fence_at_v3_and_up() {
        let offsets = vec![
            (TopicPartition::new("in", 1), OffsetAndMetadata::from(100)),
            (
                TopicPartition::new("in", 0),
                OffsetAndMetadata {
                    offset: 5,
                    leader_epoch: Some(2),
                    metadata: Some("m".into()),
                },
            ),
        ];
        let req = txn_offset_commit("tx", IDS, &group(), &offsets);
        for v in 3..=5 {
            let back = round_trip(&req, v);
            assert_eq!(back.generation_id, 7);
            assert_eq!(back.member_id.as_str(), "member-1");
            assert_eq!(
                back.group_instance_id.as_ref().map(|s| s.as_str()),
                Some("instance-a")
            );
            assert_eq!(back.producer_id.0, 42);
            assert_eq!(back.producer_epoch, 3);
            let parts = &back.topics[0].partitions;
            assert_eq!(parts.len(), 2);
            assert!(parts
                .iter()
                .any(|p| p.partition_index == 0 && p.committed_leader_epoch == 2));
        }
    }

    /// Below v3 the fence cannot be expressed; the request must fail to encode rather than go out unfenced.
    #[test]
    fn txn_offset_commit_refuses_to_drop_the_fence() {
        let req = txn_offset_commit(
            "tx",
            IDS,
            &group(),
            &[(TopicPartition::new("in", 0), 1.into())],
        );
        let mut buf = BytesMut::new();
        assert!(req.encode(&mut buf, 2).is_err());
    }

    /// AddPartitionsToTxn goes out in the client's v3 shape, one entry per topic with its partitions,
    /// and refuses to encode as v4, the broker-to-broker shape.
    #[test]
    fn add_partitions_uses_the_client_shape() {
        let parts = [
            TopicPartition::new("b", 1),
            TopicPartition::new("a", 0),
            TopicPartition::new("b", 0),
        ];
        let req = add_partitions("tx", IDS, &parts);
        let back = round_trip(&req, 3);
        assert_eq!(back.v3_and_below_transactional_id.0.as_str(), "tx");
        assert_eq!(back.v3_and_below_producer_epoch, 3);
        let names: Vec<_> = back
            .v3_and_below_topics
            .iter()
            .map(|t| (t.name.0.as_str().to_owned(), t.partitions.clone()))
            .collect();
        assert_eq!(
            names,
            vec![("a".to_owned(), vec![0]), ("b".to_owned(), vec![1, 0])]
        );
        // v4 is the broker-to-broker shape; the client request does not fit it.
        assert!(req.encode(&mut BytesMut::new(), 4).is_err());
    }

    /// InitProducerId carries the current id and epoch (the KIP-360 bump) only from v3; below that it
    /// sends -1, and an idempotent producer sends no transactional id.
    #[test]
    fn init_producer_id_sends_current_ids_only_from_v3() {
        let bump = init_producer_id(Some("tx"), 60_000, Some(IDS), 4);
        let back = round_trip(&bump, 4);
        assert_eq!((back.producer_id.0, back.producer_epoch), (42, 3));
        assert_eq!(back.transaction_timeout_ms, 60_000);
        let old = init_producer_id(Some("tx"), 60_000, Some(IDS), 2);
        let back = round_trip(&old, 2);
        assert_eq!((back.producer_id.0, back.producer_epoch), (-1, -1));
        let idem = round_trip(&init_producer_id(None, 1, None, 4), 4);
        assert!(idem.transactional_id.is_none());
    }

    /// A v6 InitProducerId answer naming an ongoing transaction is read as a kept prepared transaction,
    /// -1 or a version below 6 as a plain grant, and the two-phase flags refuse to encode below v6.
    #[test]
    fn a_v6_answer_with_a_kept_transaction_names_it() {
        let kept = InitProducerIdResponse::default()
            .with_producer_id(ProducerId(9))
            .with_producer_epoch(4)
            .with_ongoing_txn_producer_id(ProducerId(9))
            .with_ongoing_txn_producer_epoch(3);
        assert_eq!(
            parse_init_producer_id(&kept, 6),
            TxnResponse::InitKept {
                ids: ProducerIdEpoch { id: 9, epoch: 4 },
                ongoing: ProducerIdEpoch { id: 9, epoch: 3 },
            }
        );
        // Below v6 the fields do not exist; -1 means nothing was kept.
        let none = kept
            .clone()
            .with_ongoing_txn_producer_id(ProducerId(-1))
            .with_ongoing_txn_producer_epoch(-1);
        assert_eq!(
            parse_init_producer_id(&none, 6),
            TxnResponse::InitProducerId(Ok(ProducerIdEpoch { id: 9, epoch: 4 }))
        );
        assert_eq!(
            parse_init_producer_id(&kept, 5),
            TxnResponse::InitProducerId(Ok(ProducerIdEpoch { id: 9, epoch: 4 }))
        );
        // v6 carries the two flags; below it they are refused when set.
        let two_phase = init_producer_id(Some("tx"), 60_000, None, 6)
            .with_enable_2_pc(true)
            .with_keep_prepared_txn(true);
        let back = round_trip(&two_phase, 6);
        assert!(back.enable_2_pc && back.keep_prepared_txn);
        let mut buf = bytes::BytesMut::new();
        assert!(two_phase.encode(&mut buf, 5).is_err());
    }

    /// An InitProducerId error code becomes a typed error, and only EndTxn v5 answers yield the next id
    /// and epoch; v4 yields none whatever the struct holds.
    #[test]
    fn parse_answers() {
        let ok = InitProducerIdResponse::default()
            .with_producer_id(ProducerId(9))
            .with_producer_epoch(1);
        assert_eq!(
            parse_init_producer_id(&ok, 5),
            TxnResponse::InitProducerId(Ok(ProducerIdEpoch { id: 9, epoch: 1 }))
        );
        let bad = InitProducerIdResponse::default().with_error_code(90);
        assert_eq!(
            parse_init_producer_id(&bad, 5),
            TxnResponse::InitProducerId(Err(ErrorCode::ProducerFenced))
        );
        // EndTxn v5 carries the next id and epoch; v4 does not, whatever the struct holds.
        let end = EndTxnResponse::default()
            .with_producer_id(ProducerId(9))
            .with_producer_epoch(2);
        let end5 = round_trip(&end, 5);
        assert_eq!(
            parse_end_txn(&end5, 5),
            TxnResponse::EndTxn {
                code: ErrorCode::None,
                next: Some(ProducerIdEpoch { id: 9, epoch: 2 })
            }
        );
        assert_eq!(
            parse_end_txn(&end, 4),
            TxnResponse::EndTxn {
                code: ErrorCode::None,
                next: None
            }
        );
    }

    /// EndTxn keeps its commit flag and epoch through encode and decode at every version 0 to 5, and
    /// AddOffsetsToTxn keeps its group id.
    #[test]
    fn end_txn_round_trips_at_every_version() {
        let req = end_txn("tx", IDS, true);
        for v in 0..=5 {
            let back = round_trip(&req, v);
            assert!(back.committed);
            assert_eq!(back.producer_epoch, 3);
        }
        let back = round_trip(&add_offsets("tx", IDS, "g"), 3);
        assert_eq!(back.group_id.0.as_str(), "g");
    }
}
