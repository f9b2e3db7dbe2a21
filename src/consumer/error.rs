//! The consumer layer's one error type.

use crate::wire::ErrorCode;

use crate::NotJoined;

/// Everything the consumer layer can fail with.
///
/// The variants keep apart what the caller must handle differently: a fatal group error stops the
/// member for good (close it); a fenced commit means this member no longer owns what it tried to commit
/// (tear the affected flows down and carry on, the group has already moved on); malformed data from a peer
/// is reported, not trusted.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConsumerError {
    /// The group coordinator answered with an error this member cannot recover from by rejoining
    /// (authorization, an inconsistent protocol, a static member id taken over by another process, ...).
    /// The member has stopped.
    #[error("group {group:?}: {code} on {request} is fatal for this member{}", message.as_deref().map(|m| format!(": {m}")).unwrap_or_default())]
    GroupFatal {
        /// The group id.
        group: String,
        /// The coordinator's error code.
        code: ErrorCode,
        /// Which request it answered.
        request: &'static str,
        /// The coordinator's error message, where the protocol carries one.
        message: Option<String>,
    },

    /// An offset commit was refused because the committing member is not (or no longer) the member at
    /// the generation it claimed: `ILLEGAL_GENERATION`, `UNKNOWN_MEMBER_ID`, `FENCED_INSTANCE_ID`,
    /// `STALE_MEMBER_EPOCH` or `FENCED_MEMBER_EPOCH`. The partitions now belong to someone else.
    #[error("commit for group {group:?} fenced: {code}")]
    CommitFenced {
        /// The group id.
        group: String,
        /// The coordinator's error code.
        code: ErrorCode,
    },

    /// A partition's position is outside the log and the reset policy is
    /// [`OffsetReset::Fail`](super::OffsetReset::Fail). The partition is not fetched until the
    /// application seeks.
    #[error("offset {offset} of {partition} is out of range and the reset policy is to fail")]
    OffsetOutOfRange {
        /// The partition.
        partition: super::TopicPartition,
        /// The position that was out of range.
        offset: i64,
    },

    /// A partition-level error the reader cannot handle by retrying (for example
    /// `TOPIC_AUTHORIZATION_FAILED`).
    #[error("{partition}: {code}")]
    Partition {
        /// The partition.
        partition: super::TopicPartition,
        /// The broker's error code.
        code: ErrorCode,
    },

    /// A newly assigned partition has no committed offset and the reset policy is to fail.
    #[error("{partition} has no committed offset and the reset policy is to fail")]
    NoCommittedOffset {
        /// The partition.
        partition: super::TopicPartition,
    },

    /// The group coordinator refused a request that does not end the membership (an offset fetch,
    /// a commit for a reason other than fencing).
    #[error("group {group:?}: {request} refused with {code}")]
    Refused {
        /// The group id.
        group: String,
        /// The request.
        request: &'static str,
        /// The coordinator's error code.
        code: ErrorCode,
    },

    /// Group protocol bytes written by another member (a ConsumerProtocol subscription or assignment)
    /// could not be decoded.
    #[error("malformed {what}: {detail}")]
    Malformed {
        /// Which structure.
        what: &'static str,
        /// What was wrong with it.
        detail: String,
    },

    /// A commit was attempted with group metadata from before the first completed join.
    #[error(transparent)]
    NotJoined(#[from] NotJoined),

    /// The configuration cannot work (for example an empty group id or no assignor).
    #[error("invalid consumer configuration: {0}")]
    InvalidConfig(String),

    /// The request could not be completed (transport, routing, or an unexpected broker answer).
    #[error(transparent)]
    Net(#[from] crate::net::NetError),

    /// A fetched partition's records did not decode.
    #[error("{partition}: {source}")]
    Decode {
        /// The partition.
        partition: super::TopicPartition,
        /// What was wrong.
        #[source]
        source: crate::records::DecodeError,
    },

    /// A task of the consumer panicked or was cancelled. `group membership` (the task that keeps the
    /// member alive): the member no longer heartbeats and the group will evict it; close this consumer
    /// and subscribe a new one. `fetch` or `list offsets` (one leader's part of a read): no answer of
    /// that read was applied and no position moved, so the next call reads the same records again.
    #[error("consumer task {task:?} failed: {failure}")]
    TaskFailed {
        /// Which task.
        task: String,
        /// How it ended: the panic's message, or that it was cancelled.
        failure: String,
    },

    /// The consumer was closed, or its background task stopped.
    #[error("consumer closed")]
    Closed,
}
