//! The responses this client decodes, addressable by API key at run time, so that the bad-input tests
//! and the `responses` fuzz target drive exactly the decoders a broker's bytes reach.
//!
//! The list is the set of request types the library builds (`grep -rn 'Request::default()' src cli`);
//! a request type added to the client belongs here too, or its response goes unfuzzed.
//!
//! # References
//! - Kafka protocol guide, "Protocol API Keys": <https://kafka.apache.org/protocol.html#protocol_api_keys>

use bytes::Bytes;
use kafka_protocol::messages::*;
use kafka_protocol::protocol::{HeaderVersion, Message};

use super::codec::decode_response;
use super::versions::{client_versions, decode_api_versions};
use super::{ApiRequest, WireError};

macro_rules! decoded_responses {
    ($($req:ident),* $(,)?) => {
        /// API keys of every response the client decodes, ApiVersions included.
        pub const DECODED_API_KEYS: &[i16] = &[ApiVersionsRequest::KEY, $( $req::KEY, )*];

        /// Decodes `frame` (response header and body, size prefix already removed) as the answer to
        /// `api_key` sent at `version`, exactly as the connection would, and drops the result.
        ///
        /// `None` for an API key the client never decodes.
        pub fn decode_response_frame(
            api_key: i16,
            version: i16,
            frame: Bytes,
        ) -> Option<Result<(), WireError>> {
            if api_key == ApiVersionsRequest::KEY {
                return Some(decode_api_versions(frame, version).map(drop));
            }
            match api_key {
                $( k if k == $req::KEY => Some(decode_response::<$req>(frame, version).map(drop)), )*
                _ => None,
            }
        }

        /// The response header version that goes with `api_key` at `version` (ApiVersions: always 0).
        pub fn response_header_version(api_key: i16, version: i16) -> Option<i16> {
            match api_key {
                k if k == ApiVersionsRequest::KEY => Some(0),
                $( k if k == $req::KEY => {
                    Some(<<$req as ApiRequest>::Response as HeaderVersion>::header_version(version))
                } )*
                _ => None,
            }
        }
    };
}

decoded_responses!(
    AddOffsetsToTxnRequest,
    AddPartitionsToTxnRequest,
    ConsumerGroupHeartbeatRequest,
    CreateTopicsRequest,
    DeleteTopicsRequest,
    DescribeConfigsRequest,
    DescribeGroupsRequest,
    DescribeProducersRequest,
    DescribeTransactionsRequest,
    EndTxnRequest,
    FetchRequest,
    FindCoordinatorRequest,
    HeartbeatRequest,
    InitProducerIdRequest,
    JoinGroupRequest,
    LeaveGroupRequest,
    ListOffsetsRequest,
    ListTransactionsRequest,
    MetadataRequest,
    OffsetCommitRequest,
    OffsetFetchRequest,
    ProduceRequest,
    SaslAuthenticateRequest,
    SaslHandshakeRequest,
    SyncGroupRequest,
    TxnOffsetCommitRequest,
    WriteTxnMarkersRequest,
);

/// The versions the client may send `api_key` at (and so decode its answer at).
pub fn decoded_versions(api_key: i16) -> std::ops::RangeInclusive<i16> {
    let range = client_versions(api_key).unwrap_or(ApiVersionsRequest::VERSIONS);
    range.min..=range.max
}

/// Splits a `responses` fuzz input into (API key, version, frame): byte 0 is the API key when it is one
/// the client decodes (else an index into [`DECODED_API_KEYS`]), byte 1 picks the version within the
/// client's range, the rest is the frame. Shared by the fuzz target and its regression replay.
pub fn split_fuzz_input(data: &[u8]) -> Option<(i16, i16, Bytes)> {
    let [api, version, frame @ ..] = data else {
        return None;
    };
    let api_key = match DECODED_API_KEYS.iter().find(|&&k| k == i16::from(*api)) {
        Some(&k) => k,
        None => DECODED_API_KEYS[usize::from(*api) % DECODED_API_KEYS.len()],
    };
    let versions = decoded_versions(api_key);
    let span = *versions.end() - *versions.start() + 1;
    let version = versions.start() + i16::from(*version) % span;
    Some((api_key, version, Bytes::copy_from_slice(frame)))
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A response frame for `api_key` at `version`: the right header (correlation id 1, no tagged
    /// fields), then `body`.
    pub(crate) fn response_frame(api_key: i16, version: i16, body: &[u8]) -> Bytes {
        let mut out = vec![0, 0, 0, 1];
        if response_header_version(api_key, version) == Some(1) {
            out.push(0);
        }
        out.extend_from_slice(body);
        Bytes::from(out)
    }

    /// Bodies made of nothing but huge counts, as `int32` (classic arrays and bytes) and as unsigned
    /// varints (compact arrays and strings), so whichever field comes first announces far more
    /// elements than the frame holds.
    pub(crate) const HUGE_COUNTS: [&[u8]; 2] = [
        &[
            0x7f, 0xff, 0xff, 0xff, 0x7f, 0xff, 0xff, 0xff, 0x7f, 0xff, 0xff, 0xff,
        ],
        &[
            0xff, 0xff, 0xff, 0xff, 0x0f, 0xff, 0xff, 0xff, 0xff, 0x0f, 0xff, 0xff, 0xff, 0xff,
            0x0f,
        ],
    ];

    /// Regression: a count field is checked against the bytes left in the frame before anything is
    /// allocated from it. kafka-protocol 0.18.0 sized a Vec from these 8 body bytes (206 GB) and the
    /// process aborted; the vendored copy rejects them with a decode error.
    #[test]
    fn hostile_fetch_count_is_a_decode_error_not_an_abort() {
        let frame = response_frame(1, 4, &[0, 0, 0, 0, 0x7f, 0xff, 0xff, 0xff]);
        let err = decode_response_frame(1, 4, frame).unwrap().unwrap_err();
        assert!(
            matches!(&err, WireError::Decode { api_key: 1, version: 4, part: "body", message }
                if message.contains("exceeds the")),
            "{err:?}"
        );
    }

    /// Regression: the same holds for every response the client decodes, at every version it sends.
    #[test]
    fn hostile_counts_in_every_decoded_response_are_decode_errors() {
        for &key in DECODED_API_KEYS {
            for version in decoded_versions(key) {
                for body in HUGE_COUNTS {
                    let frame = response_frame(key, version, body);
                    match decode_response_frame(key, version, frame).unwrap() {
                        // A body that ends before its counts is read whole has trailing bytes.
                        Err(
                            WireError::Decode { part: "body", .. }
                            | WireError::TrailingBytes { .. },
                        ) => {}
                        other => panic!("api {key} v{version} {body:02x?}: {other:?}"),
                    }
                }
            }
        }
    }

    /// Every API the client sends is in the list the bad-input tests and the fuzz target drive, with a
    /// known response header version, so no response a broker can send us goes unfuzzed.
    #[test]
    fn every_request_type_the_client_builds_is_listed() {
        // Keys the library sends today (see the module docs for how the list is found).
        for key in [
            0, 1, 2, 3, 8, 9, 10, 11, 12, 13, 14, 15, 17, 18, 19, 20, 22, 24, 25, 26, 27, 28, 32,
            36, 61, 65, 66, 68,
        ] {
            assert!(DECODED_API_KEYS.contains(&key), "{key}");
            assert!(response_header_version(key, *decoded_versions(key).end()).is_some());
        }
        assert_eq!(decode_response_frame(4, 0, Bytes::new()), None);
    }
}
