//! A tiny blocking Kafka client the fixture uses to decide that a broker is ready, and that the fixture's own
//! tests use to look at what a broker reports.
//!
//! It is deliberately independent of snapfence's `net` layer: that layer is the code under test, and a
//! fixture that needed it to work could not tell a broker problem from a client bug. One request at a time,
//! over a `std::net::TcpStream` with read and write timeouts, encoded with kafka-protocol's structs.
//!
//! # References
//! - Kafka protocol guide: size-prefixed frames, request header v1/v2, response header v0/v1
//! - KIP-511 (ApiVersions v3 client name/version), KIP-584 (finalized features in ApiVersions)
//! - KIP-699 (batched FindCoordinator, v4+)

use std::io::{Read as _, Write as _};
use std::net::{SocketAddr, TcpStream, ToSocketAddrs as _};
use std::time::Duration;

use bytes::{Buf as _, BytesMut};
use kafka_protocol::messages::api_versions_response::ApiVersionsResponse;
use kafka_protocol::messages::describe_groups_response::DescribeGroupsResponse;
use kafka_protocol::messages::describe_transactions_response::DescribeTransactionsResponse;
use kafka_protocol::messages::find_coordinator_response::FindCoordinatorResponse;
use kafka_protocol::messages::init_producer_id_response::InitProducerIdResponse;
use kafka_protocol::messages::metadata_response::MetadataResponse;
use kafka_protocol::messages::{
    ApiKey, ApiVersionsRequest, DescribeGroupsRequest, DescribeTransactionsRequest,
    FindCoordinatorRequest, GroupId, InitProducerIdRequest, MetadataRequest, RequestHeader,
    ResponseHeader, TransactionalId,
};
use kafka_protocol::protocol::{Decodable, Encodable, HeaderVersion, Message, StrBytes};

/// Responses larger than this are refused before the buffer is allocated: nothing the probe asks for comes
/// near it, so a larger length means a broken stream.
const MAX_RESPONSE: usize = 16 * 1024 * 1024;

/// What went wrong talking to a broker.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ProbeError {
    /// Connecting, writing or reading failed (including a timeout).
    #[error("i/o with {addr}: {source}")]
    Io {
        /// The broker address.
        addr: String,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// The bytes did not encode or decode as the expected message.
    #[error("protocol error with {addr}: {detail}")]
    Protocol {
        /// The broker address.
        addr: String,
        /// What did not parse.
        detail: String,
    },
    /// The broker supports no version of the API that this crate can encode.
    #[error("{addr} supports no usable version of API key {api_key}")]
    Unsupported {
        /// The broker address.
        addr: String,
        /// The API key.
        api_key: i16,
    },
}

/// A blocking connection to one broker.
pub struct Probe {
    addr: String,
    stream: TcpStream,
    correlation_id: i32,
    api_versions: Option<ApiVersionsResponse>,
}

impl Probe {
    /// Connects to `addr` ("host:port"); every later read or write fails after `timeout`.
    pub fn connect(addr: &str, timeout: Duration) -> Result<Probe, ProbeError> {
        let io = |source| ProbeError::Io {
            addr: addr.to_owned(),
            source,
        };
        let sock: SocketAddr = addr
            .to_socket_addrs()
            .map_err(io)?
            .next()
            .ok_or_else(|| io(std::io::Error::other("address resolves to nothing")))?;
        let stream = TcpStream::connect_timeout(&sock, timeout).map_err(io)?;
        stream.set_read_timeout(Some(timeout)).map_err(io)?;
        stream.set_write_timeout(Some(timeout)).map_err(io)?;
        stream.set_nodelay(true).map_err(io)?;
        Ok(Probe {
            addr: addr.to_owned(),
            stream,
            correlation_id: 0,
            api_versions: None,
        })
    }

    /// Sends `request` as `api_key` at `version` and waits for its response.
    pub fn call<Req, Resp>(
        &mut self,
        api_key: ApiKey,
        version: i16,
        request: &Req,
    ) -> Result<Resp, ProbeError>
    where
        Req: Encodable + HeaderVersion,
        Resp: Decodable + HeaderVersion,
    {
        self.correlation_id = self.correlation_id.wrapping_add(1);
        let header = RequestHeader::default()
            .with_request_api_key(api_key as i16)
            .with_request_api_version(version)
            .with_correlation_id(self.correlation_id)
            .with_client_id(Some(StrBytes::from_static_str("snapfence-fixture")));
        let mut body = BytesMut::new();
        header
            .encode(&mut body, Req::header_version(version))
            .and_then(|()| request.encode(&mut body, version))
            .map_err(|e| self.protocol(format!("encoding {api_key:?} v{version}: {e}")))?;
        let len =
            i32::try_from(body.len()).map_err(|_| self.protocol("request too large".into()))?;
        let mut frame = Vec::with_capacity(4 + body.len());
        frame.extend_from_slice(&len.to_be_bytes());
        frame.extend_from_slice(&body);
        self.stream.write_all(&frame).map_err(|e| self.io(e))?;

        let mut size = [0u8; 4];
        self.stream.read_exact(&mut size).map_err(|e| self.io(e))?;
        let size = i32::from_be_bytes(size);
        let size = usize::try_from(size)
            .ok()
            .filter(|&s| s <= MAX_RESPONSE)
            .ok_or_else(|| self.protocol(format!("response length {size} out of range")))?;
        let mut buf = vec![0u8; size];
        self.stream.read_exact(&mut buf).map_err(|e| self.io(e))?;
        let mut buf = bytes::Bytes::from(buf);
        let header =
            ResponseHeader::decode(&mut buf, Resp::header_version(version)).map_err(|e| {
                self.protocol(format!("response header of {api_key:?} v{version}: {e}"))
            })?;
        if header.correlation_id != self.correlation_id {
            return Err(self.protocol(format!(
                "correlation id {} answered, {} expected",
                header.correlation_id, self.correlation_id
            )));
        }
        let response = Resp::decode(&mut buf, version)
            .map_err(|e| self.protocol(format!("decoding {api_key:?} v{version}: {e}")))?;
        if buf.has_remaining() {
            return Err(self.protocol(format!(
                "{} bytes left after {api_key:?} v{version}",
                buf.remaining()
            )));
        }
        Ok(response)
    }

    /// ApiVersions v3 (every broker since 2.4 speaks it, and 3.9 is the oldest the fixture runs); the
    /// response is kept for [`Probe::version_for`].
    pub fn api_versions(&mut self) -> Result<ApiVersionsResponse, ProbeError> {
        let v3 = ApiVersionsRequest::default()
            .with_client_software_name(StrBytes::from_static_str("snapfence-fixture"))
            .with_client_software_version(StrBytes::from_static_str(env!("CARGO_PKG_VERSION")));
        let response: ApiVersionsResponse = self.call(ApiKey::ApiVersions, 3, &v3)?;
        if response.error_code != 0 {
            return Err(self.protocol(format!("ApiVersions error code {}", response.error_code)));
        }
        self.api_versions = Some(response.clone());
        Ok(response)
    }

    /// The highest version of `api_key` both the broker and kafka-protocol's `ours` range support.
    /// Calls ApiVersions first if this connection has not yet.
    pub fn version_for(
        &mut self,
        api_key: ApiKey,
        ours: kafka_protocol::protocol::VersionRange,
    ) -> Result<i16, ProbeError> {
        if self.api_versions.is_none() {
            self.api_versions()?;
        }
        let theirs = self
            .api_versions
            .as_ref()
            .and_then(|r| r.api_keys.iter().find(|k| k.api_key == api_key as i16))
            .map(|k| (k.min_version, k.max_version));
        match theirs {
            Some((min, max)) if min.max(ours.min) <= max.min(ours.max) => Ok(max.min(ours.max)),
            _ => Err(ProbeError::Unsupported {
                addr: self.addr.clone(),
                api_key: api_key as i16,
            }),
        }
    }

    /// A Metadata request for no topics: the brokers the answering broker knows as alive.
    pub fn metadata(&mut self) -> Result<MetadataResponse, ProbeError> {
        let version = self.version_for(ApiKey::Metadata, MetadataRequest::VERSIONS)?;
        // topics = [] asks for no topics (null would mean all of them, from v1 on).
        let request = MetadataRequest::default()
            .with_topics(Some(Vec::new()))
            .with_allow_auto_topic_creation(false);
        self.call(ApiKey::Metadata, version, &request)
    }

    /// Sorted node ids of the brokers in a Metadata response.
    pub fn broker_ids(&mut self) -> Result<Vec<i32>, ProbeError> {
        let mut ids: Vec<i32> = self
            .metadata()?
            .brokers
            .iter()
            .map(|b| b.node_id.0)
            .collect();
        ids.sort_unstable();
        Ok(ids)
    }

    /// FindCoordinator for one key: `key_type` 0 = group, 1 = transactional id. Returns (error code, node id)
    /// from whichever form (single key before v4, batched from v4) the broker speaks.
    pub fn find_coordinator(&mut self, key_type: i8, key: &str) -> Result<(i16, i32), ProbeError> {
        let version =
            self.version_for(ApiKey::FindCoordinator, FindCoordinatorRequest::VERSIONS)?;
        let key = StrBytes::from_string(key.to_owned());
        let mut request = FindCoordinatorRequest::default().with_key_type(key_type);
        if version >= 4 {
            request = request.with_coordinator_keys(vec![key]);
        } else {
            request = request.with_key(key);
        }
        let response: FindCoordinatorResponse =
            self.call(ApiKey::FindCoordinator, version, &request)?;
        if version >= 4 {
            let c = response
                .coordinators
                .first()
                .ok_or_else(|| self.protocol("FindCoordinator answered no coordinator".into()))?;
            Ok((c.error_code, c.node_id.0))
        } else {
            Ok((response.error_code, response.node_id.0))
        }
    }

    /// The error code this broker, as coordinator, answers for `key` of `key_type` (0 = group,
    /// 1 = transactional id) when asked to describe it: DescribeGroups or DescribeTransactions. 14
    /// COORDINATOR_LOAD_IN_PROGRESS while the key's internal partition is being loaded, 15 or 16 while
    /// this broker is not (yet) its coordinator; anything else means the partition is served (an unknown
    /// key answers 0 with a dead group, or 69 GROUP_ID_NOT_FOUND, or 105 TRANSACTIONAL_ID_NOT_FOUND).
    pub fn describe_error(&mut self, key_type: i8, key: &str) -> Result<i16, ProbeError> {
        let key = StrBytes::from_string(key.to_owned());
        if key_type == 0 {
            let version =
                self.version_for(ApiKey::DescribeGroups, DescribeGroupsRequest::VERSIONS)?;
            let request = DescribeGroupsRequest::default().with_groups(vec![GroupId(key)]);
            let response: DescribeGroupsResponse =
                self.call(ApiKey::DescribeGroups, version, &request)?;
            response
                .groups
                .first()
                .map(|g| g.error_code)
                .ok_or_else(|| self.protocol("DescribeGroups answered no group".into()))
        } else {
            let version = self.version_for(
                ApiKey::DescribeTransactions,
                DescribeTransactionsRequest::VERSIONS,
            )?;
            let request = DescribeTransactionsRequest::default()
                .with_transactional_ids(vec![TransactionalId(key)]);
            let response: DescribeTransactionsResponse =
                self.call(ApiKey::DescribeTransactions, version, &request)?;
            response
                .transaction_states
                .first()
                .map(|t| t.error_code)
                .ok_or_else(|| self.protocol("DescribeTransactions answered no state".into()))
        }
    }

    /// The error code of an InitProducerId without a transactional id (an idempotent producer's): 14
    /// COORDINATOR_LOAD_IN_PROGRESS until the broker's producer-id manager holds a block of ids from the
    /// controller, which every transactional or idempotent init needs. Allocates one producer id.
    pub fn init_producer_id_error(&mut self) -> Result<i16, ProbeError> {
        let version = self.version_for(ApiKey::InitProducerId, InitProducerIdRequest::VERSIONS)?;
        let request = InitProducerIdRequest::default()
            .with_transactional_id(None)
            .with_transaction_timeout_ms(60_000);
        let response: InitProducerIdResponse =
            self.call(ApiKey::InitProducerId, version, &request)?;
        Ok(response.error_code)
    }

    fn io(&self, source: std::io::Error) -> ProbeError {
        ProbeError::Io {
            addr: self.addr.clone(),
            source,
        }
    }

    fn protocol(&self, detail: String) -> ProbeError {
        ProbeError::Protocol {
            addr: self.addr.clone(),
            detail,
        }
    }
}

/// The finalized level of `feature` in an ApiVersions response (None when the broker does not finalize it).
pub fn finalized_feature(response: &ApiVersionsResponse, feature: &str) -> Option<i16> {
    response
        .finalized_features
        .iter()
        .find(|f| f.name.as_str() == feature)
        .map(|f| f.max_version_level)
}

/// The highest version `response` advertises for `api_key`, if any.
pub fn max_version(response: &ApiVersionsResponse, api_key: ApiKey) -> Option<i16> {
    response
        .api_keys
        .iter()
        .find(|k| k.api_key == api_key as i16)
        .map(|k| k.max_version)
}
