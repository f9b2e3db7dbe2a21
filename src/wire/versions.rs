//! API version ranges: what a broker advertises, what this client can speak, and the highest version
//! both share; plus the cluster's finalized features, which arrive in the same ApiVersions answer.
//!
//! # References
//! - KIP-35 (ApiVersions), KIP-511 (ApiVersions v3: client software name and version; response header
//!   pinned to v0 so the UNSUPPORTED_VERSION answer can always be read)
//! - KIP-584 (versioned feature flags: supported and finalized features in ApiVersions v3+)
//! - KIP-890 (`transaction.version`), KIP-848 (`group.version`), KIP-853 (`kraft.version`)

use std::collections::BTreeMap;

use bytes::Bytes;
use kafka_protocol::messages::{ApiVersionsRequest, ApiVersionsResponse};
use kafka_protocol::protocol::{HeaderVersion, Message, VersionRange};

use super::codec::{decode_body, decode_response_header};
use super::{ApiRequest, ErrorCode, WireError};

/// The newest Produce this client sends: v13 addresses topics by id instead of name (KIP-516).
pub(crate) const PRODUCE_MAX: i16 = 13;

/// The newest Produce that addresses topics by name, for a request whose topic ids are not known (a
/// cluster whose metadata carries none).
pub(crate) const PRODUCE_MAX_BY_NAME: i16 = 12;

/// The oldest Produce an idempotent or transactional producer sends: v3 is the first that carries record
/// batches v2 (producer id, epoch and sequence) and a transactional id.
pub(crate) const PRODUCE_MIN_IDEMPOTENT: i16 = 3;

/// The newest Produce inside a transaction under transaction version 1: v12 means "this producer speaks
/// TV2" (KIP-890 part 2: the broker enrols the partition itself), which a TV1 transaction must not claim.
pub(crate) const PRODUCE_MAX_TV1: i16 = 11;

/// The oldest Produce of a TV2 transaction, for the same reason.
pub(crate) const PRODUCE_MIN_TV2: i16 = 12;

/// The oldest Metadata this client sends: v0 reads an empty topic list as "all topics", and only v1+
/// can ask for the broker list alone.
pub(crate) const METADATA_MIN: i16 = 1;

/// The oldest JoinGroup that carries a group instance id, which a static member must send (KIP-345).
pub(crate) const JOIN_GROUP_MIN_STATIC: i16 = 5;

/// The oldest InitProducerId that can ask for a two-phase-commit producer or keep a prepared
/// transaction (KIP-939).
pub(crate) const INIT_PRODUCER_ID_MIN_2PC: i16 = 6;

/// The oldest Fetch the reader sends: v4 is the first that carries an isolation level and answers with
/// the last stable offset and the aborted transactions that read_committed needs.
pub(crate) const FETCH_MIN: i16 = 4;

/// The oldest Fetch that can open or close an incremental fetch session (KIP-227).
pub(crate) const FETCH_MIN_SESSIONS: i16 = 7;

/// The first Fetch that addresses topics by id instead of name (KIP-516).
pub(crate) const FETCH_MIN_BY_ID: i16 = 13;

/// The newest Fetch that addresses topics by name: a session's partitions and its requests' addressing
/// must agree, so a by-name session stays below the by-id versions.
pub(crate) const FETCH_MAX_BY_NAME: i16 = FETCH_MIN_BY_ID - 1;

/// The oldest ListOffsets the reader sends: v2 is the first that carries an isolation level, so that
/// `Latest` under read_committed means the last stable offset.
pub(crate) const LIST_OFFSETS_MIN: i16 = 2;

/// The oldest OffsetForLeaderEpoch a consumer sends: v3 is the first that carries a replica id, which a
/// consumer sets to -1 so that the leader answers from its own log (KIP-320).
pub(crate) const OFFSET_FOR_LEADER_EPOCH_MIN: i16 = 3;

/// The oldest OffsetCommit this client sends: v2 is the first that leaves retention to the broker
/// (retention time -1) instead of stamping each partition with a commit time.
pub(crate) const OFFSET_COMMIT_MIN: i16 = 2;

/// The oldest OffsetCommit that carries a group instance id, which a static member must send (KIP-345).
pub(crate) const OFFSET_COMMIT_MIN_STATIC: i16 = 7;

/// The newest OffsetCommit this client sends: v10 addresses topics by id, and commits here name them.
pub(crate) const OFFSET_COMMIT_MAX: i16 = 9;

/// The oldest OffsetFetch this client sends: v0 reads offsets kept in ZooKeeper, v1 those in Kafka.
pub(crate) const OFFSET_FETCH_MIN: i16 = 1;

/// The newest OffsetFetch this client sends: v10 addresses topics by id, and the answer is read by name.
pub(crate) const OFFSET_FETCH_MAX: i16 = 9;

/// The oldest InitProducerId that bumps the epoch of a known producer id instead of handing out a new
/// one (KIP-360).
pub(crate) const INIT_PRODUCER_ID_MIN_BUMP: i16 = 3;

/// The newest AddPartitionsToTxn a producer sends: v4 and later are the batched broker-to-broker form
/// (KIP-890), which a client is not allowed to use.
pub(crate) const ADD_PARTITIONS_TO_TXN_MAX: i16 = 3;

/// The oldest TxnOffsetCommit a transactional producer sends: v3 is the first that carries the group
/// generation and member id, so the commit is fenced against a zombie of the group (KIP-447).
pub(crate) const TXN_OFFSET_COMMIT_MIN_FENCED: i16 = 3;

/// The newest TxnOffsetCommit under transaction version 1: v5 means "this producer speaks TV2"
/// (KIP-890 part 2), which a TV1 transaction must not claim.
pub(crate) const TXN_OFFSET_COMMIT_MAX_TV1: i16 = 4;

/// The oldest TxnOffsetCommit of a TV2 transaction, for the same reason.
pub(crate) const TXN_OFFSET_COMMIT_MIN_TV2: i16 = 5;

/// The newest TxnOffsetCommit this client sends, the version it was written against.
pub(crate) const TXN_OFFSET_COMMIT_MAX: i16 = 5;

/// The newest EndTxn under transaction version 1: v5 means "this producer speaks TV2" (KIP-890 part
/// 2), which a TV1 transaction must not claim.
pub(crate) const END_TXN_MAX_TV1: i16 = 4;

/// The oldest EndTxn of a TV2 transaction, for the same reason.
pub(crate) const END_TXN_MIN_TV2: i16 = 5;

/// The newest EndTxn this client sends, the version it was written against.
pub(crate) const END_TXN_MAX: i16 = 5;

/// APIs this client holds at a version it was written for, whatever kafka-protocol learns later (a
/// newer Produce changes what the producer must put in it).
///
/// This file is the one table of version caps and minimums. Only the caps here bind every request of
/// their API; the constants above bind one request shape (a by-name Fetch, a TV1 transaction's
/// EndTxn), so the code that builds that shape passes them in its `CallOptions` instead of keeping
/// numbers of its own.
const CLIENT_CAPS: &[(i16, i16)] = &[(0, PRODUCE_MAX)];

/// The versions of `api_key` this client will send: kafka-protocol's range, capped by the table above.
/// `None` for an API kafka-protocol does not know.
pub fn client_versions(api_key: i16) -> Option<VersionRange> {
    let mut range = super::api::kafka_protocol_versions(api_key)?;
    if let Some(&(_, cap)) = CLIENT_CAPS.iter().find(|(k, _)| *k == api_key) {
        range.max = range.max.min(cap);
    }
    Some(range)
}

/// The versions of request type `R` this client will send.
pub fn client_versions_of<R: ApiRequest>() -> VersionRange {
    client_versions(R::KEY).unwrap_or(R::VERSIONS)
}

/// What one broker said it supports in its ApiVersions answer.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BrokerApiVersions {
    /// api key → (min, max) as the broker advertised them.
    ranges: BTreeMap<i16, (i16, i16)>,
}

impl BrokerApiVersions {
    /// The broker's ranges as listed in `response` (at any ApiVersions version).
    pub(crate) fn from_response(response: &ApiVersionsResponse) -> Self {
        let ranges = response
            .api_keys
            .iter()
            .map(|k| (k.api_key, (k.min_version, k.max_version)))
            .collect();
        BrokerApiVersions { ranges }
    }

    /// The broker's advertised `(min, max)` for `api_key`, if it lists the API at all.
    pub fn broker_range(&self, api_key: i16) -> Option<(i16, i16)> {
        self.ranges.get(&api_key).copied()
    }

    /// The highest version of `api_key` that both this client and the broker support.
    pub fn usable(&self, api_key: i16) -> Option<i16> {
        let ours = client_versions(api_key)?;
        let (min, max) = self.broker_range(api_key)?;
        let both = ours.intersect(&VersionRange { min, max });
        (!both.is_empty()).then_some(both.max)
    }

    /// The highest version of `api_key` both sides support, if it is at least `version`.
    pub fn usable_at_least(&self, api_key: i16, version: i16) -> Option<i16> {
        self.usable(api_key).filter(|v| *v >= version)
    }

    /// Whether both sides can speak `api_key` at exactly `version`.
    pub fn supports(&self, api_key: i16, version: i16) -> bool {
        let ours = client_versions(api_key);
        let theirs = self.broker_range(api_key);
        matches!((ours, theirs), (Some(o), Some((min, max)))
            if o.min <= version && version <= o.max && min <= version && version <= max)
    }

    /// Every API the broker listed, as `(api_key, min, max)`, in key order.
    pub fn iter(&self) -> impl Iterator<Item = (i16, i16, i16)> + '_ {
        self.ranges.iter().map(|(k, (min, max))| (*k, *min, *max))
    }
}

/// The cluster-wide finalized feature levels a broker reported (KIP-584).
///
/// A feature the broker does not list is at level 0, which is what the broker itself assumes.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Features {
    /// Finalized `transaction.version`: 2 turns on the KIP-890 part 2 transaction protocol.
    pub transaction_version: i16,
    /// Finalized `group.version`: 1 makes the KIP-848 consumer group protocol available.
    pub group_version: i16,
    /// Finalized `kraft.version`, if listed.
    pub kraft_version: Option<i16>,
    /// Finalized `metadata.version`, if listed.
    pub metadata_version: Option<i16>,
    /// The epoch of this feature snapshot; -1 when the broker did not report one (ApiVersions below v3).
    pub epoch: i64,
    /// Every finalized feature as name → (min level, max level).
    pub finalized: BTreeMap<String, (i16, i16)>,
    /// Every feature the reporting broker's software supports, as name → (min, max).
    pub supported: BTreeMap<String, (i16, i16)>,
}

impl Default for Features {
    /// Nothing reported yet: every level 0, epoch -1.
    fn default() -> Self {
        Features {
            transaction_version: 0,
            group_version: 0,
            kraft_version: None,
            metadata_version: None,
            epoch: -1,
            finalized: BTreeMap::new(),
            supported: BTreeMap::new(),
        }
    }
}

impl Features {
    /// The features in `response`.
    pub(crate) fn from_response(response: &ApiVersionsResponse) -> Self {
        let finalized: BTreeMap<String, (i16, i16)> = response
            .finalized_features
            .iter()
            .map(|f| {
                (
                    f.name.to_string(),
                    (f.min_version_level, f.max_version_level),
                )
            })
            .collect();
        let supported = response
            .supported_features
            .iter()
            .map(|f| (f.name.to_string(), (f.min_version, f.max_version)))
            .collect();
        let level = |name: &str| finalized.get(name).map(|(_, max)| *max);
        Features {
            transaction_version: level("transaction.version").unwrap_or(0),
            group_version: level("group.version").unwrap_or(0),
            kraft_version: level("kraft.version"),
            metadata_version: level("metadata.version"),
            epoch: response.finalized_features_epoch,
            finalized,
            supported,
        }
    }

    /// The finalized level of the feature called `name`, if the broker listed it.
    pub fn level(&self, name: &str) -> Option<i16> {
        self.finalized.get(name).map(|(_, max)| *max)
    }
}

/// Decodes an ApiVersions answer to a request sent at `version`, returning the response and the version
/// its body was actually written at.
///
/// A broker that does not know the requested ApiVersions version answers UNSUPPORTED_VERSION in a v0
/// body (listing what it does support) whatever version was asked for, so the error code, which leads
/// the body at every version, is read first to pick the layout.
pub(crate) fn decode_api_versions(
    frame: Bytes,
    version: i16,
) -> Result<(ApiVersionsResponse, i16), WireError> {
    let key = ApiVersionsRequest::KEY;
    let header_version = <ApiVersionsResponse as HeaderVersion>::header_version(version);
    let (_, body) = decode_response_header(frame, header_version, key, version)?;
    let code = body.get(..2).map(|b| i16::from_be_bytes([b[0], b[1]]));
    let body_version = if code == Some(ErrorCode::UnsupportedVersion.code()) {
        0
    } else {
        version
    };
    let response = decode_body::<ApiVersionsResponse>(body, key, body_version)?;
    Ok((response, body_version))
}

/// The ApiVersions version to use for the first request on a connection.
pub(crate) fn initial_api_versions_version() -> i16 {
    ApiVersionsRequest::VERSIONS.max
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::BytesMut;
    use kafka_protocol::messages::api_versions_response::{ApiVersion, FinalizedFeatureKey};
    use kafka_protocol::messages::ResponseHeader;
    use kafka_protocol::protocol::Encodable;

    fn broker(ranges: &[(i16, i16, i16)]) -> BrokerApiVersions {
        let response = ApiVersionsResponse::default().with_api_keys(
            ranges
                .iter()
                .map(|&(k, min, max)| {
                    ApiVersion::default()
                        .with_api_key(k)
                        .with_min_version(min)
                        .with_max_version(max)
                })
                .collect(),
        );
        BrokerApiVersions::from_response(&response)
    }

    /// The usable version of an API is the highest both the broker and we speak, Produce held at the
    /// newest version the producer was written for, and none when the broker does not list the API.
    #[test]
    fn usable_is_the_highest_common_version() {
        let b = broker(&[(3, 0, 99), (18, 0, 2), (0, 3, 14), (10, 0, 6)]);
        // Metadata: broker newer than kafka-protocol → ours caps it.
        assert_eq!(b.usable(3), Some(kafka_protocol_versions_max(3)));
        // ApiVersions: broker older → theirs caps it.
        assert_eq!(b.usable(18), Some(2));
        // Produce: our table holds it at the newest version the producer was written for.
        assert_eq!(b.usable(0), Some(PRODUCE_MAX));
        assert!(b.supports(0, PRODUCE_MAX) && !b.supports(0, PRODUCE_MAX + 1));
        assert_eq!(b.usable_at_least(10, 4), Some(6));
        assert_eq!(b.usable_at_least(18, 3), None);
        // Not listed by the broker at all.
        assert_eq!(b.usable(26), None);
    }

    /// When the broker's version range and ours do not meet, the API is not usable at any version.
    #[test]
    fn disjoint_ranges_are_not_usable() {
        let b = broker(&[(0, 14, 20)]);
        assert_eq!(b.usable(0), None);
        assert!(!b.supports(0, 14));
    }

    fn kafka_protocol_versions_max(key: i16) -> i16 {
        super::super::api::kafka_protocol_versions(key).unwrap().max
    }

    /// A finalised feature the broker does not list reads as level 0 (transaction.version and
    /// group.version), so its absence never enables a newer protocol.
    #[test]
    fn features_default_to_zero_when_absent() {
        let r = ApiVersionsResponse::default()
            .with_finalized_features_epoch(7)
            .with_finalized_features(vec![FinalizedFeatureKey::default()
                .with_name("transaction.version".into())
                .with_min_version_level(2)
                .with_max_version_level(2)]);
        let f = Features::from_response(&r);
        assert_eq!(f.transaction_version, 2);
        assert_eq!(f.group_version, 0);
        assert_eq!(f.kraft_version, None);
        assert_eq!(f.epoch, 7);
        assert_eq!(f.level("transaction.version"), Some(2));
    }

    fn frame(body: &ApiVersionsResponse, body_version: i16) -> Bytes {
        let mut buf = BytesMut::new();
        ResponseHeader::default()
            .with_correlation_id(1)
            .encode(&mut buf, 0)
            .unwrap();
        body.encode(&mut buf, body_version).unwrap();
        buf.freeze()
    }

    /// The UNSUPPORTED_VERSION answer is read as v0 whatever version was asked for.
    #[test]
    fn unsupported_version_answer_is_read_as_v0() {
        let body = ApiVersionsResponse::default()
            .with_error_code(ErrorCode::UnsupportedVersion.code())
            .with_api_keys(vec![ApiVersion::default()
                .with_api_key(18)
                .with_min_version(0)
                .with_max_version(2)]);
        let (r, v) = decode_api_versions(frame(&body, 0), 4).unwrap();
        assert_eq!(v, 0);
        assert_eq!(r.api_keys.len(), 1);
        assert_eq!(r.api_keys[0].max_version, 2);
    }

    /// An ApiVersions answer without error is read at the version that was asked for.
    #[test]
    fn normal_answer_is_read_at_the_requested_version() {
        let body = ApiVersionsResponse::default()
            .with_finalized_features_epoch(3)
            .with_api_keys(vec![ApiVersion::default()
                .with_api_key(3)
                .with_max_version(12)]);
        let (r, v) = decode_api_versions(frame(&body, 3), 3).unwrap();
        assert_eq!(v, 3);
        assert_eq!(r.finalized_features_epoch, 3);
    }
}
