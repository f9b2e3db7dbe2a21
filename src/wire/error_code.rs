//! Kafka's error codes as one `Copy` enum, with the single table that says which are retriable.
//!
//! "Retriable" here means what Kafka's own `RetriableException` hierarchy means: the same request may
//! succeed if sent again, possibly after refreshing metadata or re-finding a coordinator. Whether an error
//! is *fatal* or *abortable* for a transaction depends on which request returned it; that classification
//! belongs to the producer, not to this table.
//!
//! # References
//! - `org.apache.kafka.common.protocol.Errors` (the authoritative list of codes)

macro_rules! error_codes {
    ($( $(#[$doc:meta])* $name:ident = $code:literal, $retriable:literal, $kname:literal; )*) => {
        /// A Kafka protocol error code. `None` (0) is success.
        ///
        /// Variants are Kafka's names in Rust case; [`ErrorCode::name`] gives Kafka's spelling.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        #[non_exhaustive]
        pub enum ErrorCode {
            $( $(#[$doc])* #[doc = $kname] $name, )*
            /// A code this client does not know; kept so it can be reported verbatim.
            Unknown(i16),
        }

        impl ErrorCode {
            /// Maps a wire code to the enum. Never fails: unknown codes become [`ErrorCode::Unknown`].
            pub fn from_code(code: i16) -> Self {
                match code {
                    $( $code => ErrorCode::$name, )*
                    other => ErrorCode::Unknown(other),
                }
            }

            /// The wire value.
            pub fn code(self) -> i16 {
                match self {
                    $( ErrorCode::$name => $code, )*
                    ErrorCode::Unknown(c) => c,
                }
            }

            /// Whether the same request may succeed when retried (after a metadata or coordinator
            /// refresh where the error says the target moved).
            pub fn is_retriable(self) -> bool {
                match self {
                    $( ErrorCode::$name => $retriable, )*
                    ErrorCode::Unknown(_) => false,
                }
            }

            /// The upper-snake-case name Kafka uses in its logs and docs.
            pub fn name(self) -> &'static str {
                match self {
                    $( ErrorCode::$name => $kname, )*
                    ErrorCode::Unknown(_) => "UNKNOWN_CODE",
                }
            }
        }
    };
}

error_codes! {
    UnknownServerError = -1, false, "UNKNOWN_SERVER_ERROR";
    None = 0, false, "NONE";
    OffsetOutOfRange = 1, false, "OFFSET_OUT_OF_RANGE";
    CorruptMessage = 2, true, "CORRUPT_MESSAGE";
    UnknownTopicOrPartition = 3, true, "UNKNOWN_TOPIC_OR_PARTITION";
    InvalidFetchSize = 4, false, "INVALID_FETCH_SIZE";
    LeaderNotAvailable = 5, true, "LEADER_NOT_AVAILABLE";
    NotLeaderOrFollower = 6, true, "NOT_LEADER_OR_FOLLOWER";
    RequestTimedOut = 7, true, "REQUEST_TIMED_OUT";
    BrokerNotAvailable = 8, false, "BROKER_NOT_AVAILABLE";
    ReplicaNotAvailable = 9, true, "REPLICA_NOT_AVAILABLE";
    MessageTooLarge = 10, false, "MESSAGE_TOO_LARGE";
    StaleControllerEpoch = 11, false, "STALE_CONTROLLER_EPOCH";
    OffsetMetadataTooLarge = 12, false, "OFFSET_METADATA_TOO_LARGE";
    NetworkException = 13, true, "NETWORK_EXCEPTION";
    CoordinatorLoadInProgress = 14, true, "COORDINATOR_LOAD_IN_PROGRESS";
    CoordinatorNotAvailable = 15, true, "COORDINATOR_NOT_AVAILABLE";
    NotCoordinator = 16, true, "NOT_COORDINATOR";
    InvalidTopicException = 17, false, "INVALID_TOPIC_EXCEPTION";
    RecordListTooLarge = 18, false, "RECORD_LIST_TOO_LARGE";
    NotEnoughReplicas = 19, true, "NOT_ENOUGH_REPLICAS";
    NotEnoughReplicasAfterAppend = 20, true, "NOT_ENOUGH_REPLICAS_AFTER_APPEND";
    InvalidRequiredAcks = 21, false, "INVALID_REQUIRED_ACKS";
    IllegalGeneration = 22, false, "ILLEGAL_GENERATION";
    InconsistentGroupProtocol = 23, false, "INCONSISTENT_GROUP_PROTOCOL";
    InvalidGroupId = 24, false, "INVALID_GROUP_ID";
    UnknownMemberId = 25, false, "UNKNOWN_MEMBER_ID";
    InvalidSessionTimeout = 26, false, "INVALID_SESSION_TIMEOUT";
    RebalanceInProgress = 27, false, "REBALANCE_IN_PROGRESS";
    InvalidCommitOffsetSize = 28, false, "INVALID_COMMIT_OFFSET_SIZE";
    TopicAuthorizationFailed = 29, false, "TOPIC_AUTHORIZATION_FAILED";
    GroupAuthorizationFailed = 30, false, "GROUP_AUTHORIZATION_FAILED";
    ClusterAuthorizationFailed = 31, false, "CLUSTER_AUTHORIZATION_FAILED";
    InvalidTimestamp = 32, false, "INVALID_TIMESTAMP";
    UnsupportedSaslMechanism = 33, false, "UNSUPPORTED_SASL_MECHANISM";
    IllegalSaslState = 34, false, "ILLEGAL_SASL_STATE";
    UnsupportedVersion = 35, false, "UNSUPPORTED_VERSION";
    TopicAlreadyExists = 36, false, "TOPIC_ALREADY_EXISTS";
    InvalidPartitions = 37, false, "INVALID_PARTITIONS";
    InvalidReplicationFactor = 38, false, "INVALID_REPLICATION_FACTOR";
    InvalidReplicaAssignment = 39, false, "INVALID_REPLICA_ASSIGNMENT";
    InvalidConfig = 40, false, "INVALID_CONFIG";
    NotController = 41, true, "NOT_CONTROLLER";
    InvalidRequest = 42, false, "INVALID_REQUEST";
    UnsupportedForMessageFormat = 43, false, "UNSUPPORTED_FOR_MESSAGE_FORMAT";
    PolicyViolation = 44, false, "POLICY_VIOLATION";
    OutOfOrderSequenceNumber = 45, false, "OUT_OF_ORDER_SEQUENCE_NUMBER";
    DuplicateSequenceNumber = 46, false, "DUPLICATE_SEQUENCE_NUMBER";
    InvalidProducerEpoch = 47, false, "INVALID_PRODUCER_EPOCH";
    InvalidTxnState = 48, false, "INVALID_TXN_STATE";
    InvalidProducerIdMapping = 49, false, "INVALID_PRODUCER_ID_MAPPING";
    InvalidTransactionTimeout = 50, false, "INVALID_TRANSACTION_TIMEOUT";
    ConcurrentTransactions = 51, true, "CONCURRENT_TRANSACTIONS";
    TransactionCoordinatorFenced = 52, false, "TRANSACTION_COORDINATOR_FENCED";
    TransactionalIdAuthorizationFailed = 53, false, "TRANSACTIONAL_ID_AUTHORIZATION_FAILED";
    SecurityDisabled = 54, false, "SECURITY_DISABLED";
    OperationNotAttempted = 55, false, "OPERATION_NOT_ATTEMPTED";
    KafkaStorageError = 56, true, "KAFKA_STORAGE_ERROR";
    LogDirNotFound = 57, false, "LOG_DIR_NOT_FOUND";
    SaslAuthenticationFailed = 58, false, "SASL_AUTHENTICATION_FAILED";
    UnknownProducerId = 59, false, "UNKNOWN_PRODUCER_ID";
    ReassignmentInProgress = 60, false, "REASSIGNMENT_IN_PROGRESS";
    DelegationTokenAuthDisabled = 61, false, "DELEGATION_TOKEN_AUTH_DISABLED";
    DelegationTokenNotFound = 62, false, "DELEGATION_TOKEN_NOT_FOUND";
    DelegationTokenOwnerMismatch = 63, false, "DELEGATION_TOKEN_OWNER_MISMATCH";
    DelegationTokenRequestNotAllowed = 64, false, "DELEGATION_TOKEN_REQUEST_NOT_ALLOWED";
    DelegationTokenAuthorizationFailed = 65, false, "DELEGATION_TOKEN_AUTHORIZATION_FAILED";
    DelegationTokenExpired = 66, false, "DELEGATION_TOKEN_EXPIRED";
    InvalidPrincipalType = 67, false, "INVALID_PRINCIPAL_TYPE";
    NonEmptyGroup = 68, false, "NON_EMPTY_GROUP";
    GroupIdNotFound = 69, false, "GROUP_ID_NOT_FOUND";
    FetchSessionIdNotFound = 70, true, "FETCH_SESSION_ID_NOT_FOUND";
    InvalidFetchSessionEpoch = 71, true, "INVALID_FETCH_SESSION_EPOCH";
    ListenerNotFound = 72, true, "LISTENER_NOT_FOUND";
    TopicDeletionDisabled = 73, false, "TOPIC_DELETION_DISABLED";
    FencedLeaderEpoch = 74, true, "FENCED_LEADER_EPOCH";
    UnknownLeaderEpoch = 75, true, "UNKNOWN_LEADER_EPOCH";
    UnsupportedCompressionType = 76, false, "UNSUPPORTED_COMPRESSION_TYPE";
    StaleBrokerEpoch = 77, false, "STALE_BROKER_EPOCH";
    OffsetNotAvailable = 78, true, "OFFSET_NOT_AVAILABLE";
    MemberIdRequired = 79, false, "MEMBER_ID_REQUIRED";
    PreferredLeaderNotAvailable = 80, true, "PREFERRED_LEADER_NOT_AVAILABLE";
    GroupMaxSizeReached = 81, false, "GROUP_MAX_SIZE_REACHED";
    FencedInstanceId = 82, false, "FENCED_INSTANCE_ID";
    EligibleLeadersNotAvailable = 83, true, "ELIGIBLE_LEADERS_NOT_AVAILABLE";
    ElectionNotNeeded = 84, true, "ELECTION_NOT_NEEDED";
    NoReassignmentInProgress = 85, false, "NO_REASSIGNMENT_IN_PROGRESS";
    GroupSubscribedToTopic = 86, false, "GROUP_SUBSCRIBED_TO_TOPIC";
    InvalidRecord = 87, false, "INVALID_RECORD";
    UnstableOffsetCommit = 88, true, "UNSTABLE_OFFSET_COMMIT";
    ThrottlingQuotaExceeded = 89, true, "THROTTLING_QUOTA_EXCEEDED";
    ProducerFenced = 90, false, "PRODUCER_FENCED";
    ResourceNotFound = 91, false, "RESOURCE_NOT_FOUND";
    DuplicateResource = 92, false, "DUPLICATE_RESOURCE";
    UnacceptableCredential = 93, false, "UNACCEPTABLE_CREDENTIAL";
    InconsistentVoterSet = 94, false, "INCONSISTENT_VOTER_SET";
    InvalidUpdateVersion = 95, false, "INVALID_UPDATE_VERSION";
    FeatureUpdateFailed = 96, false, "FEATURE_UPDATE_FAILED";
    PrincipalDeserializationFailure = 97, false, "PRINCIPAL_DESERIALIZATION_FAILURE";
    SnapshotNotFound = 98, false, "SNAPSHOT_NOT_FOUND";
    PositionOutOfRange = 99, false, "POSITION_OUT_OF_RANGE";
    UnknownTopicId = 100, true, "UNKNOWN_TOPIC_ID";
    DuplicateBrokerRegistration = 101, false, "DUPLICATE_BROKER_REGISTRATION";
    BrokerIdNotRegistered = 102, false, "BROKER_ID_NOT_REGISTERED";
    InconsistentTopicId = 103, true, "INCONSISTENT_TOPIC_ID";
    InconsistentClusterId = 104, false, "INCONSISTENT_CLUSTER_ID";
    TransactionalIdNotFound = 105, false, "TRANSACTIONAL_ID_NOT_FOUND";
    FetchSessionTopicIdError = 106, true, "FETCH_SESSION_TOPIC_ID_ERROR";
    IneligibleReplica = 107, false, "INELIGIBLE_REPLICA";
    NewLeaderElected = 108, false, "NEW_LEADER_ELECTED";
    OffsetMovedToTieredStorage = 109, false, "OFFSET_MOVED_TO_TIERED_STORAGE";
    FencedMemberEpoch = 110, false, "FENCED_MEMBER_EPOCH";
    UnreleasedInstanceId = 111, false, "UNRELEASED_INSTANCE_ID";
    UnsupportedAssignor = 112, false, "UNSUPPORTED_ASSIGNOR";
    StaleMemberEpoch = 113, false, "STALE_MEMBER_EPOCH";
    MismatchedEndpointType = 114, false, "MISMATCHED_ENDPOINT_TYPE";
    UnsupportedEndpointType = 115, false, "UNSUPPORTED_ENDPOINT_TYPE";
    UnknownControllerId = 116, false, "UNKNOWN_CONTROLLER_ID";
    UnknownSubscriptionId = 117, false, "UNKNOWN_SUBSCRIPTION_ID";
    TelemetryTooLarge = 118, false, "TELEMETRY_TOO_LARGE";
    InvalidRegistration = 119, false, "INVALID_REGISTRATION";
    TransactionAbortable = 120, false, "TRANSACTION_ABORTABLE";
    InvalidRecordState = 121, false, "INVALID_RECORD_STATE";
    ShareSessionNotFound = 122, true, "SHARE_SESSION_NOT_FOUND";
    InvalidShareSessionEpoch = 123, true, "INVALID_SHARE_SESSION_EPOCH";
    FencedStateEpoch = 124, false, "FENCED_STATE_EPOCH";
    InvalidVoterKey = 125, false, "INVALID_VOTER_KEY";
    DuplicateVoter = 126, false, "DUPLICATE_VOTER";
    VoterNotFound = 127, false, "VOTER_NOT_FOUND";
    InvalidRegularExpression = 128, false, "INVALID_REGULAR_EXPRESSION";
    RebootstrapRequired = 129, false, "REBOOTSTRAP_REQUIRED";
}

impl ErrorCode {
    /// `true` for [`ErrorCode::None`] (success).
    pub fn is_ok(self) -> bool {
        self == ErrorCode::None
    }

    /// `Ok(())` for `NONE`, `Err(self)` otherwise; lets response handling use `?`.
    pub fn into_result(self) -> Result<(), ErrorCode> {
        if self.is_ok() {
            Ok(())
        } else {
            Err(self)
        }
    }
}

impl std::fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} ({})", self.name(), self.code())
    }
}

impl std::error::Error for ErrorCode {}

#[cfg(test)]
mod tests {
    use super::ErrorCode;

    /// Every code maps back to the wire value it came from, including codes this table does not know.
    #[test]
    fn round_trips_every_code() {
        for code in -5i16..200 {
            assert_eq!(ErrorCode::from_code(code).code(), code);
        }
    }

    /// Which error codes are retriable follows Kafka's own table (a fence or an unknown code never is),
    /// and a code displays with its Kafka name and number.
    #[test]
    fn retriable_table_matches_kafka() {
        assert!(ErrorCode::NotLeaderOrFollower.is_retriable());
        assert!(ErrorCode::NotCoordinator.is_retriable());
        assert!(ErrorCode::ConcurrentTransactions.is_retriable());
        assert!(!ErrorCode::ProducerFenced.is_retriable());
        assert!(!ErrorCode::IllegalGeneration.is_retriable());
        assert!(!ErrorCode::Unknown(4242).is_retriable());
        assert_eq!(ErrorCode::from_code(90), ErrorCode::ProducerFenced);
        assert_eq!(
            ErrorCode::ProducerFenced.to_string(),
            "PRODUCER_FENCED (90)"
        );
    }
}
