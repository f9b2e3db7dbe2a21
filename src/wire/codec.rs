//! Requests to frames and frames to responses: the header that goes in front of each message and the
//! version rules that pick it.
//!
//! A request carries header v1 (api key, version, correlation id, client id) or, at the API's flexible
//! versions, header v2 (the same plus tagged fields). A response carries header v0 (correlation id) or v1
//! (plus tagged fields). Which one a given API version uses is the message's own knowledge; kafka-protocol
//! exposes it as `HeaderVersion::header_version`, and ApiVersions answers always use v0 so that a client
//! can read them before it knows anything else.
//!
//! # References
//! - Kafka protocol guide, "Headers": <https://kafka.apache.org/protocol.html#protocol_messages>
//! - KIP-482 (tagged fields, flexible versions, request header v2 / response header v1)
//! - KIP-511 (ApiVersions v3, response header fixed at v0)

use bytes::{BufMut, Bytes, BytesMut};
use kafka_protocol::messages::{RequestHeader, ResponseHeader};
use kafka_protocol::protocol::{Decodable, Encodable, HeaderVersion, Message, StrBytes};

use super::frame::SIZE_PREFIX;
use super::{ApiRequest, WireError};

/// Encodes `request` at `version` behind its header into one complete frame, size prefix included.
///
/// A frame larger than `max_frame_size` is refused here rather than left for the broker to reject by
/// closing the connection.
pub(crate) fn encode_request<R: ApiRequest>(
    request: &R,
    version: i16,
    correlation_id: i32,
    client_id: &str,
    max_frame_size: usize,
) -> Result<Bytes, WireError> {
    check_version(R::KEY, version, R::VERSIONS)?;
    let header_version = R::header_version(version);
    let header = RequestHeader::default()
        .with_request_api_key(R::KEY)
        .with_request_api_version(version)
        .with_correlation_id(correlation_id)
        .with_client_id(Some(StrBytes::from_string(client_id.to_owned())));
    let encode_err = |e| WireError::Encode {
        api_key: R::KEY,
        version,
        message: explain(e),
    };
    let size = header
        .compute_size(header_version)
        .and_then(|h| Ok(h + request.compute_size(version)?))
        .map_err(encode_err)?;
    if size > max_frame_size || i32::try_from(size).is_err() {
        return Err(WireError::FrameTooLarge {
            len: size,
            max: max_frame_size,
        });
    }
    let mut buf = BytesMut::with_capacity(SIZE_PREFIX + size);
    buf.put_i32(0);
    header
        .encode(&mut buf, header_version)
        .map_err(encode_err)?;
    request.encode(&mut buf, version).map_err(encode_err)?;
    // The prefix is written from what was actually encoded, not from `compute_size`, so a disagreement
    // between the two inside kafka-protocol can never put a wrong length on the wire.
    let written = buf.len() - SIZE_PREFIX;
    if written > max_frame_size {
        return Err(WireError::FrameTooLarge {
            len: written,
            max: max_frame_size,
        });
    }
    let prefix = i32::try_from(written).map_err(|_| WireError::FrameTooLarge {
        len: written,
        max: max_frame_size,
    })?;
    buf[..SIZE_PREFIX].copy_from_slice(&prefix.to_be_bytes());
    Ok(buf.freeze())
}

/// The api key and version of an encoded request frame (size prefix included), for diagnostics; `None`
/// when the frame is too short to carry them.
pub fn request_api(frame: &[u8]) -> Option<(i16, i16)> {
    let b = frame.get(SIZE_PREFIX..SIZE_PREFIX + 4)?;
    Some((
        i16::from_be_bytes([b[0], b[1]]),
        i16::from_be_bytes([b[2], b[3]]),
    ))
}

/// The correlation id of a response frame: its first four bytes, whichever header version follows.
pub fn response_correlation_id(frame: &[u8]) -> Result<i32, WireError> {
    match frame.get(..4) {
        Some(b) => Ok(i32::from_be_bytes([b[0], b[1], b[2], b[3]])),
        None => Err(WireError::FrameTooShort { len: frame.len() }),
    }
}

/// Decodes the response header that goes with `api_key` at `version` and returns it with the body bytes
/// that follow it.
pub fn decode_response_header(
    mut frame: Bytes,
    header_version: i16,
    api_key: i16,
    version: i16,
) -> Result<(ResponseHeader, Bytes), WireError> {
    let header =
        ResponseHeader::decode(&mut frame, header_version).map_err(|e| WireError::Decode {
            api_key,
            version,
            part: "header",
            message: explain(e),
        })?;
    Ok((header, frame))
}

/// Decodes a whole response frame (header and body) for request type `R` sent at `version`.
pub(crate) fn decode_response<R: ApiRequest>(
    frame: Bytes,
    version: i16,
) -> Result<(ResponseHeader, R::Response), WireError> {
    let header_version = <R::Response as HeaderVersion>::header_version(version);
    let (header, body) = decode_response_header(frame, header_version, R::KEY, version)?;
    let response = decode_body::<R::Response>(body, R::KEY, version)?;
    Ok((header, response))
}

/// Decodes a response body at `version`, insisting every byte is consumed.
pub(crate) fn decode_body<M: Message + Decodable>(
    mut body: Bytes,
    api_key: i16,
    version: i16,
) -> Result<M, WireError> {
    check_version(api_key, version, M::VERSIONS)?;
    let message = M::decode(&mut body, version).map_err(|e| WireError::Decode {
        api_key,
        version,
        part: "body",
        message: explain(e),
    })?;
    // Leftover bytes mean the two sides disagree about the layout at this version (new fields are always
    // tagged, and tagged fields are consumed); taking the partial parse as the answer would hide that.
    if !body.is_empty() {
        return Err(WireError::TrailingBytes {
            api_key,
            version,
            trailing: body.len(),
        });
    }
    Ok(message)
}

/// kafka-protocol's errors as text, with their whole cause chain (`{:#}` on its anyhow errors).
fn explain<E: std::fmt::Display>(e: E) -> String {
    format!("{e:#}")
}

fn check_version(
    api_key: i16,
    version: i16,
    range: kafka_protocol::protocol::VersionRange,
) -> Result<(), WireError> {
    if version < range.min || version > range.max {
        return Err(WireError::UnsupportedVersion {
            api_key,
            version,
            min: range.min,
            max: range.max,
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use kafka_protocol::messages::{
        ApiVersionsRequest, MetadataRequest, MetadataResponse, ProduceRequest,
    };
    use kafka_protocol::protocol::decode_request_header_from_buffer;

    fn response_frame<M: Encodable + HeaderVersion>(corr: i32, body: &M, version: i16) -> Bytes {
        let mut buf = BytesMut::new();
        ResponseHeader::default()
            .with_correlation_id(corr)
            .encode(&mut buf, M::header_version(version))
            .unwrap();
        body.encode(&mut buf, version).unwrap();
        buf.freeze()
    }

    /// Header v1 for rigid versions and v2 for flexible ones, as the broker will decode them.
    #[test]
    fn request_header_version_follows_flexibility() {
        for (version, flexible) in [(8i16, false), (9, true), (12, true)] {
            let frame =
                encode_request(&MetadataRequest::default(), version, 7, "me", 1 << 20).unwrap();
            let mut body = frame.slice(SIZE_PREFIX..);
            let header = decode_request_header_from_buffer(&mut body).unwrap();
            assert_eq!(header.request_api_key, 3);
            assert_eq!(header.request_api_version, version);
            assert_eq!(header.correlation_id, 7);
            assert_eq!(header.client_id.as_deref(), Some("me"));
            assert_eq!(
                MetadataRequest::header_version(version),
                if flexible { 2 } else { 1 }
            );
            let decoded = MetadataRequest::decode(&mut body, version).unwrap();
            assert_eq!(decoded, MetadataRequest::default());
            assert!(body.is_empty());
            let len = i32::from_be_bytes(frame[..4].try_into().unwrap()) as usize;
            assert_eq!(len, frame.len() - SIZE_PREFIX);
        }
    }

    /// A request that would exceed the frame limit is refused at encode, never sent for the broker to
    /// drop.
    #[test]
    fn request_too_large_for_the_frame_limit_is_refused() {
        let err = encode_request(&ApiVersionsRequest::default(), 3, 1, "a-client", 8).unwrap_err();
        assert!(
            matches!(err, WireError::FrameTooLarge { max: 8, .. }),
            "{err:?}"
        );
    }

    /// A request version outside what the codec supports is refused as unsupported, never encoded in
    /// some other version's shape.
    #[test]
    fn version_outside_kafka_protocol_range_is_refused() {
        let err = encode_request(&ProduceRequest::default(), 2, 1, "c", 1 << 20).unwrap_err();
        assert!(matches!(
            err,
            WireError::UnsupportedVersion {
                api_key: 0,
                version: 2,
                ..
            }
        ));
    }

    /// A response decodes with its correlation id and body at both rigid and flexible (tagged-field)
    /// versions.
    #[test]
    fn response_round_trip_at_rigid_and_flexible_versions() {
        for version in [1i16, 8, 9, 12] {
            let body = MetadataResponse::default().with_controller_id(3.into());
            let frame = response_frame(42, &body, version);
            assert_eq!(response_correlation_id(&frame).unwrap(), 42);
            let (h, r) = decode_response::<MetadataRequest>(frame, version).unwrap();
            assert_eq!(h.correlation_id, 42);
            assert_eq!(r.controller_id, 3);
        }
    }

    /// A response cut at any byte is a typed decode error naming the API and version, never a panic.
    #[test]
    fn truncated_response_is_a_decode_error() {
        let body = MetadataResponse::default().with_cluster_id(Some("abc".into()));
        let frame = response_frame(1, &body, 12);
        for cut in 0..frame.len() {
            let err = decode_response::<MetadataRequest>(frame.slice(..cut), 12).unwrap_err();
            assert!(
                matches!(
                    err,
                    WireError::Decode {
                        api_key: 3,
                        version: 12,
                        ..
                    }
                ),
                "cut {cut}: {err:?}"
            );
        }
    }

    /// Bytes left after a response body are a typed error, never silently ignored.
    #[test]
    fn trailing_bytes_are_reported() {
        let mut frame = BytesMut::from(&response_frame(1, &MetadataResponse::default(), 12)[..]);
        frame.extend_from_slice(&[0, 0]);
        let err = decode_response::<MetadataRequest>(frame.freeze(), 12).unwrap_err();
        assert_eq!(
            err,
            WireError::TrailingBytes {
                api_key: 3,
                version: 12,
                trailing: 2
            }
        );
    }

    /// A frame too short to hold a correlation id is a typed error rather than a misread id.
    #[test]
    fn short_frame_has_no_correlation_id() {
        assert_eq!(
            response_correlation_id(&[1, 2]),
            Err(WireError::FrameTooShort { len: 2 })
        );
    }
}
