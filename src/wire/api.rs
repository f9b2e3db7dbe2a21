//! Which Rust type is which Kafka API: the request ↔ response pairing and the API key, for every message
//! kafka-protocol generates.
//!
//! kafka-protocol has its own `Request` trait, but implements it only when both its `client` and `broker`
//! features are on (the trait demands that requests also decode). The library builds with `client` alone,
//! so it carries this pairing itself; the test build has `broker` too and uses that to play a broker.
//!
//! # References
//! - Kafka protocol guide, "Protocol API Keys": <https://kafka.apache.org/protocol.html#protocol_api_keys>

use kafka_protocol::messages::*;
use kafka_protocol::protocol::{Decodable, Encodable, HeaderVersion, Message, VersionRange};

/// A Kafka request this client can send: it encodes at the versions kafka-protocol knows, and names its
/// response type and API key.
///
/// Implemented for every request message in `kafka_protocol::messages`; not meant to be implemented
/// elsewhere.
pub trait ApiRequest: Message + Encodable + HeaderVersion + Send + 'static {
    /// The API key on the wire (`ApiKey` as an `i16`).
    const KEY: i16;
    /// The response this request is answered with.
    type Response: Message + Decodable + HeaderVersion + Send + 'static;
}

macro_rules! api_requests {
    ($($req:ident => $resp:ident, $key:literal;)*) => {
        $(
            impl ApiRequest for $req {
                const KEY: i16 = $key;
                type Response = $resp;
            }
        )*

        /// The API's name as the protocol guide spells it (`Produce`, `EndTxn`), for metric labels and
        /// logs; `None` for a key kafka-protocol does not know. A `&'static str`, so labelling a metric
        /// with it allocates nothing.
        pub(crate) fn api_name(api_key: i16) -> Option<&'static str> {
            match api_key {
                $( $key => {
                    let name: &'static str = stringify!($req);
                    Some(name.strip_suffix("Request").unwrap_or(name))
                } )*
                _ => None,
            }
        }

        /// The versions kafka-protocol can encode for `api_key`, for lookups by key at run time.
        pub(crate) fn kafka_protocol_versions(api_key: i16) -> Option<VersionRange> {
            match api_key {
                $( $key => Some(<$req as Message>::VERSIONS), )*
                _ => None,
            }
        }
    };
}

api_requests! {
    ProduceRequest => ProduceResponse, 0;
    FetchRequest => FetchResponse, 1;
    ListOffsetsRequest => ListOffsetsResponse, 2;
    MetadataRequest => MetadataResponse, 3;
    OffsetCommitRequest => OffsetCommitResponse, 8;
    OffsetFetchRequest => OffsetFetchResponse, 9;
    FindCoordinatorRequest => FindCoordinatorResponse, 10;
    JoinGroupRequest => JoinGroupResponse, 11;
    HeartbeatRequest => HeartbeatResponse, 12;
    LeaveGroupRequest => LeaveGroupResponse, 13;
    SyncGroupRequest => SyncGroupResponse, 14;
    DescribeGroupsRequest => DescribeGroupsResponse, 15;
    ListGroupsRequest => ListGroupsResponse, 16;
    SaslHandshakeRequest => SaslHandshakeResponse, 17;
    ApiVersionsRequest => ApiVersionsResponse, 18;
    CreateTopicsRequest => CreateTopicsResponse, 19;
    DeleteTopicsRequest => DeleteTopicsResponse, 20;
    DeleteRecordsRequest => DeleteRecordsResponse, 21;
    InitProducerIdRequest => InitProducerIdResponse, 22;
    OffsetForLeaderEpochRequest => OffsetForLeaderEpochResponse, 23;
    AddPartitionsToTxnRequest => AddPartitionsToTxnResponse, 24;
    AddOffsetsToTxnRequest => AddOffsetsToTxnResponse, 25;
    EndTxnRequest => EndTxnResponse, 26;
    WriteTxnMarkersRequest => WriteTxnMarkersResponse, 27;
    TxnOffsetCommitRequest => TxnOffsetCommitResponse, 28;
    DescribeAclsRequest => DescribeAclsResponse, 29;
    CreateAclsRequest => CreateAclsResponse, 30;
    DeleteAclsRequest => DeleteAclsResponse, 31;
    DescribeConfigsRequest => DescribeConfigsResponse, 32;
    AlterConfigsRequest => AlterConfigsResponse, 33;
    AlterReplicaLogDirsRequest => AlterReplicaLogDirsResponse, 34;
    DescribeLogDirsRequest => DescribeLogDirsResponse, 35;
    SaslAuthenticateRequest => SaslAuthenticateResponse, 36;
    CreatePartitionsRequest => CreatePartitionsResponse, 37;
    CreateDelegationTokenRequest => CreateDelegationTokenResponse, 38;
    RenewDelegationTokenRequest => RenewDelegationTokenResponse, 39;
    ExpireDelegationTokenRequest => ExpireDelegationTokenResponse, 40;
    DescribeDelegationTokenRequest => DescribeDelegationTokenResponse, 41;
    DeleteGroupsRequest => DeleteGroupsResponse, 42;
    ElectLeadersRequest => ElectLeadersResponse, 43;
    IncrementalAlterConfigsRequest => IncrementalAlterConfigsResponse, 44;
    AlterPartitionReassignmentsRequest => AlterPartitionReassignmentsResponse, 45;
    ListPartitionReassignmentsRequest => ListPartitionReassignmentsResponse, 46;
    OffsetDeleteRequest => OffsetDeleteResponse, 47;
    DescribeClientQuotasRequest => DescribeClientQuotasResponse, 48;
    AlterClientQuotasRequest => AlterClientQuotasResponse, 49;
    DescribeUserScramCredentialsRequest => DescribeUserScramCredentialsResponse, 50;
    AlterUserScramCredentialsRequest => AlterUserScramCredentialsResponse, 51;
    VoteRequest => VoteResponse, 52;
    BeginQuorumEpochRequest => BeginQuorumEpochResponse, 53;
    EndQuorumEpochRequest => EndQuorumEpochResponse, 54;
    DescribeQuorumRequest => DescribeQuorumResponse, 55;
    AlterPartitionRequest => AlterPartitionResponse, 56;
    UpdateFeaturesRequest => UpdateFeaturesResponse, 57;
    EnvelopeRequest => EnvelopeResponse, 58;
    FetchSnapshotRequest => FetchSnapshotResponse, 59;
    DescribeClusterRequest => DescribeClusterResponse, 60;
    DescribeProducersRequest => DescribeProducersResponse, 61;
    BrokerRegistrationRequest => BrokerRegistrationResponse, 62;
    BrokerHeartbeatRequest => BrokerHeartbeatResponse, 63;
    UnregisterBrokerRequest => UnregisterBrokerResponse, 64;
    DescribeTransactionsRequest => DescribeTransactionsResponse, 65;
    ListTransactionsRequest => ListTransactionsResponse, 66;
    AllocateProducerIdsRequest => AllocateProducerIdsResponse, 67;
    ConsumerGroupHeartbeatRequest => ConsumerGroupHeartbeatResponse, 68;
    ConsumerGroupDescribeRequest => ConsumerGroupDescribeResponse, 69;
    ControllerRegistrationRequest => ControllerRegistrationResponse, 70;
    GetTelemetrySubscriptionsRequest => GetTelemetrySubscriptionsResponse, 71;
    PushTelemetryRequest => PushTelemetryResponse, 72;
    AssignReplicasToDirsRequest => AssignReplicasToDirsResponse, 73;
    ListConfigResourcesRequest => ListConfigResourcesResponse, 74;
    DescribeTopicPartitionsRequest => DescribeTopicPartitionsResponse, 75;
    ShareGroupHeartbeatRequest => ShareGroupHeartbeatResponse, 76;
    ShareGroupDescribeRequest => ShareGroupDescribeResponse, 77;
    ShareFetchRequest => ShareFetchResponse, 78;
    ShareAcknowledgeRequest => ShareAcknowledgeResponse, 79;
    AddRaftVoterRequest => AddRaftVoterResponse, 80;
    RemoveRaftVoterRequest => RemoveRaftVoterResponse, 81;
    UpdateRaftVoterRequest => UpdateRaftVoterResponse, 82;
    InitializeShareGroupStateRequest => InitializeShareGroupStateResponse, 83;
    ReadShareGroupStateRequest => ReadShareGroupStateResponse, 84;
    WriteShareGroupStateRequest => WriteShareGroupStateResponse, 85;
    DeleteShareGroupStateRequest => DeleteShareGroupStateResponse, 86;
    ReadShareGroupStateSummaryRequest => ReadShareGroupStateSummaryResponse, 87;
    DescribeShareGroupOffsetsRequest => DescribeShareGroupOffsetsResponse, 90;
    AlterShareGroupOffsetsRequest => AlterShareGroupOffsetsResponse, 91;
    DeleteShareGroupOffsetsRequest => DeleteShareGroupOffsetsResponse, 92;
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The pairing here must agree with kafka-protocol's own (test builds have its `broker` feature, which
    /// turns the upstream `Request` impls on), so a typo in the table above cannot go unnoticed.
    #[test]
    fn keys_agree_with_kafka_protocol() {
        fn same<R: ApiRequest + kafka_protocol::protocol::Request>() {
            assert_eq!(
                <R as ApiRequest>::KEY,
                <R as kafka_protocol::protocol::Request>::KEY
            );
            assert_eq!(
                std::any::type_name::<<R as ApiRequest>::Response>(),
                std::any::type_name::<<R as kafka_protocol::protocol::Request>::Response>()
            );
        }
        same::<ProduceRequest>();
        same::<FetchRequest>();
        same::<ListOffsetsRequest>();
        same::<MetadataRequest>();
        same::<OffsetCommitRequest>();
        same::<OffsetFetchRequest>();
        same::<FindCoordinatorRequest>();
        same::<JoinGroupRequest>();
        same::<HeartbeatRequest>();
        same::<LeaveGroupRequest>();
        same::<SyncGroupRequest>();
        same::<DescribeGroupsRequest>();
        same::<ListGroupsRequest>();
        same::<SaslHandshakeRequest>();
        same::<ApiVersionsRequest>();
        same::<CreateTopicsRequest>();
        same::<DeleteTopicsRequest>();
        same::<DeleteRecordsRequest>();
        same::<InitProducerIdRequest>();
        same::<OffsetForLeaderEpochRequest>();
        same::<AddPartitionsToTxnRequest>();
        same::<AddOffsetsToTxnRequest>();
        same::<EndTxnRequest>();
        same::<WriteTxnMarkersRequest>();
        same::<TxnOffsetCommitRequest>();
        same::<DescribeAclsRequest>();
        same::<CreateAclsRequest>();
        same::<DeleteAclsRequest>();
        same::<DescribeConfigsRequest>();
        same::<AlterConfigsRequest>();
        same::<AlterReplicaLogDirsRequest>();
        same::<DescribeLogDirsRequest>();
        same::<SaslAuthenticateRequest>();
        same::<CreatePartitionsRequest>();
        same::<CreateDelegationTokenRequest>();
        same::<RenewDelegationTokenRequest>();
        same::<ExpireDelegationTokenRequest>();
        same::<DescribeDelegationTokenRequest>();
        same::<DeleteGroupsRequest>();
        same::<ElectLeadersRequest>();
        same::<IncrementalAlterConfigsRequest>();
        same::<AlterPartitionReassignmentsRequest>();
        same::<ListPartitionReassignmentsRequest>();
        same::<OffsetDeleteRequest>();
        same::<DescribeClientQuotasRequest>();
        same::<AlterClientQuotasRequest>();
        same::<DescribeUserScramCredentialsRequest>();
        same::<AlterUserScramCredentialsRequest>();
        same::<VoteRequest>();
        same::<BeginQuorumEpochRequest>();
        same::<EndQuorumEpochRequest>();
        same::<DescribeQuorumRequest>();
        same::<AlterPartitionRequest>();
        same::<UpdateFeaturesRequest>();
        same::<EnvelopeRequest>();
        same::<FetchSnapshotRequest>();
        same::<DescribeClusterRequest>();
        same::<DescribeProducersRequest>();
        same::<BrokerRegistrationRequest>();
        same::<BrokerHeartbeatRequest>();
        same::<UnregisterBrokerRequest>();
        same::<DescribeTransactionsRequest>();
        same::<ListTransactionsRequest>();
        same::<AllocateProducerIdsRequest>();
        same::<ConsumerGroupHeartbeatRequest>();
        same::<ConsumerGroupDescribeRequest>();
        same::<ControllerRegistrationRequest>();
        same::<GetTelemetrySubscriptionsRequest>();
        same::<PushTelemetryRequest>();
        same::<AssignReplicasToDirsRequest>();
        same::<ListConfigResourcesRequest>();
        same::<DescribeTopicPartitionsRequest>();
        same::<ShareGroupHeartbeatRequest>();
        same::<ShareGroupDescribeRequest>();
        same::<ShareFetchRequest>();
        same::<ShareAcknowledgeRequest>();
        same::<AddRaftVoterRequest>();
        same::<RemoveRaftVoterRequest>();
        same::<UpdateRaftVoterRequest>();
        same::<InitializeShareGroupStateRequest>();
        same::<ReadShareGroupStateRequest>();
        same::<WriteShareGroupStateRequest>();
        same::<DeleteShareGroupStateRequest>();
        same::<ReadShareGroupStateSummaryRequest>();
        same::<DescribeShareGroupOffsetsRequest>();
        same::<AlterShareGroupOffsetsRequest>();
        same::<DeleteShareGroupOffsetsRequest>();
    }
}
