//! The wire layer: size-prefixed frames, request and response headers, API version ranges, and the
//! Kafka error-code table.
//!
//! Everything here is pure: bytes in, bytes or messages out, no sockets and no clocks. The net layer
//! above owns the sockets and calls down into this module for every frame.
//!
//! Not a stable part of the crate: the module is private unless the `unstable-protocol` feature is on,
//! because its signatures carry kafka-protocol's traits and types, whose versions snapfence cannot
//! promise to its dependents. [`ErrorCode`] is stable and re-exported at the crate root
//! (`snapfence::ErrorCode`), [`WireError`] as `snapfence::net::WireError`.
//!
//! # References
//! - Kafka protocol guide: <https://kafka.apache.org/protocol.html>
//! - KIP-482 (flexible versions and tagged fields), KIP-511 (ApiVersions v3), KIP-584 (feature flags)

mod api;
mod codec;
#[cfg(any(test, feature = "fuzzing"))]
mod decoded;
mod error;
mod error_code;
mod frame;
mod versions;

pub(crate) use api::api_name;
pub use api::ApiRequest;
pub use error::WireError;
pub use error_code::ErrorCode;
pub use versions::{client_versions, client_versions_of, BrokerApiVersions, Features};

pub(crate) use codec::{decode_response, encode_request, request_api, response_correlation_id};
pub(crate) use frame::FrameDecoder;
pub(crate) use versions::{
    decode_api_versions, initial_api_versions_version, ADD_PARTITIONS_TO_TXN_MAX, END_TXN_MAX,
    END_TXN_MAX_TV1, END_TXN_MIN_TV2, FETCH_MAX_BY_NAME, FETCH_MIN, FETCH_MIN_BY_ID,
    FETCH_MIN_SESSIONS, INIT_PRODUCER_ID_MIN_2PC, INIT_PRODUCER_ID_MIN_BUMP, JOIN_GROUP_MIN_STATIC,
    LIST_OFFSETS_MIN, METADATA_MIN, OFFSET_COMMIT_MAX, OFFSET_COMMIT_MIN, OFFSET_COMMIT_MIN_STATIC,
    OFFSET_FETCH_MAX, OFFSET_FETCH_MIN, OFFSET_FOR_LEADER_EPOCH_MIN, PRODUCE_MAX,
    PRODUCE_MAX_BY_NAME, PRODUCE_MAX_TV1, PRODUCE_MIN_IDEMPOTENT, PRODUCE_MIN_TV2,
    TXN_OFFSET_COMMIT_MAX, TXN_OFFSET_COMMIT_MAX_TV1, TXN_OFFSET_COMMIT_MIN_FENCED,
    TXN_OFFSET_COMMIT_MIN_TV2,
};

/// Internals the cargo-fuzz targets drive directly; not part of the public API.
#[cfg(any(test, feature = "fuzzing"))]
#[doc(hidden)]
pub mod fuzzing {
    pub use super::codec::{decode_response_header, response_correlation_id};
    pub use super::decoded::{
        decode_response_frame, decoded_versions, response_header_version, split_fuzz_input,
        DECODED_API_KEYS,
    };
    pub use super::frame::FrameDecoder;
}
