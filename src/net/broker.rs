//! Opening a connection to one broker: the TCP socket with its options, then the ApiVersions handshake
//! that tells us which versions of each API the broker speaks and which features the cluster finalized,
//! then the SASL login when one is configured. The login's round trips live here with the other
//! handshake I/O; what goes into them is worked out without I/O in `sasl.rs`.
//!
//! # References
//! - KIP-35 (ApiVersions), KIP-511 (v3: client software name and version, UNSUPPORTED_VERSION answered
//!   in a v0 body), KIP-584 (finalized features)
//! - KIP-43 (SaslHandshake), KIP-152 (SaslAuthenticate; handshake v1), KIP-368 (session lifetime)

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use kafka_protocol::messages::{ApiVersionsRequest, SaslAuthenticateRequest, SaslHandshakeRequest};
use kafka_protocol::protocol::StrBytes;
use tokio::time::{timeout_at, Instant};

use super::conn::{ConnOptions, Connection, Exclusive};
use super::dial::{Dialer, Stream, TcpDialer};
use super::sasl::{AuthFailure, Exchange, SaslConfig, SaslMechanism};
use super::{ClientConfig, NetError};
use crate::telemetry::{self, AUTHENTICATION_FAILURES, CONNECTIONS_OPENED};
use crate::wire::{self, ApiRequest, BrokerApiVersions, ErrorCode, Features};

/// Reported to brokers in ApiVersions v3+ (KIP-511); must match `[a-zA-Z0-9](?:[a-zA-Z0-9\-.]*[a-zA-Z0-9])?`.
const SOFTWARE_NAME: &str = "snapfence";
const SOFTWARE_VERSION: &str = env!("CARGO_PKG_VERSION");

/// A connection that has finished its handshake.
#[derive(Clone)]
pub(crate) struct BrokerConn {
    pub conn: Connection,
    /// The node id, or -1 for a bootstrap connection whose id is not known.
    pub node: i32,
    pub versions: Arc<BrokerApiVersions>,
    pub features: Features,
    /// When the SASL session must be renewed (KIP-368), by re-authenticating in place or by a new
    /// connection: a little before the broker's announced session lifetime runs out, so a request is
    /// never sent on a connection the broker is about to close.
    pub retire_at: Option<Instant>,
    /// When the broker ends the session (`None`: it set no limit).
    pub session_end: Option<Instant>,
}

impl BrokerConn {
    /// Whether requests may still be sent on this connection.
    pub(crate) fn usable(&self) -> bool {
        self.conn.is_usable() && self.retire_at.is_none_or(|at| Instant::now() < at)
    }

    /// Whether the connection is alive but its session is due for renewal: a candidate for
    /// re-authentication in place.
    pub(crate) fn renewable(&self) -> bool {
        self.conn.is_usable()
            && self.retire_at.is_some_and(|at| Instant::now() >= at)
            && self.session_end.is_some_and(|end| Instant::now() < end)
    }
}

/// The fraction of a SASL session (KIP-368) after which it is renewed: early enough that the requests in
/// flight then (a fetch's long poll, 500 ms by default) are answered well before the session ends even
/// when it is a few seconds long, as in the tests; on real clusters sessions last minutes to hours.
const RENEW_AT: f64 = 0.75;

/// The fraction of a session by which the requests in flight must have been answered for a renewal in
/// place; the rest is left for the exchange itself.
const DRAINED_BY: f64 = 0.95;

/// The longest a renewal in place waits for the requests in flight, holding every later request of the
/// broker back meanwhile: twice a fetch's default long poll. A request that takes longer (a JoinGroup
/// waiting out a rebalance) makes the renewal reconnect instead of stalling the broker's other callers.
const MAX_DRAIN: Duration = Duration::from_secs(1);

/// Where a login's requests go: a connection nobody else uses yet, or one held exclusively.
pub(crate) trait LoginChannel {
    fn addr(&self) -> &str;
    fn request<R: ApiRequest + Sync>(
        &self,
        request: &R,
        version: i16,
        timeout: Duration,
    ) -> impl std::future::Future<Output = Result<R::Response, NetError>> + Send;
}

impl LoginChannel for Connection {
    fn addr(&self) -> &str {
        Connection::addr(self)
    }
    async fn request<R: ApiRequest + Sync>(
        &self,
        request: &R,
        version: i16,
        timeout: Duration,
    ) -> Result<R::Response, NetError> {
        Connection::request(self, request, version, timeout).await
    }
}

impl LoginChannel for Exclusive {
    fn addr(&self) -> &str {
        Exclusive::addr(self)
    }
    async fn request<R: ApiRequest + Sync>(
        &self,
        request: &R,
        version: i16,
        timeout: Duration,
    ) -> Result<R::Response, NetError> {
        Exclusive::request(self, request, version, timeout).await
    }
}

/// Why a session was not renewed in place; the pool then opens a new connection (retire and
/// reconnect).
#[derive(Debug)]
pub(crate) enum Renewal {
    /// Requests in flight were not all answered before the session's last safe moment (a JoinGroup
    /// waiting out a rebalance, say). Nothing was sent.
    Busy,
    /// The broker did not re-authenticate the connection (it refuses re-authentication on this
    /// listener, or the login failed); the pool stops trying in place on this broker.
    Failed(NetError),
}

/// Re-authenticates `existing` in place (KIP-368): takes every in-flight slot, which waits until the
/// requests in flight are answered and holds back new ones, then runs the SASL handshake and exchange
/// on the connection again, and returns it with its new session's deadlines. The requests in flight
/// must be answered within [`MAX_DRAIN`] and before 95% of the session has passed, or it gives up
/// ([`Renewal::Busy`]).
///
/// Cancel-safe: dropped while waiting for the slots, nothing was sent; dropped during the exchange, the
/// connection is left with a half-finished login, which the broker ends by closing it at the session's
/// end at the latest (and the pool, seeing the session past, opens a new one).
pub(crate) async fn reauthenticate(
    existing: &BrokerConn,
    config: &ClientConfig,
) -> Result<BrokerConn, Renewal> {
    let (Some(sasl), Some(renew), Some(end)) =
        (&config.sasl, existing.retire_at, existing.session_end)
    else {
        return Err(Renewal::Busy);
    };
    // The session began at `end - lifetime`, and `renew` is RENEW_AT of the way through it.
    let lifetime = end.saturating_duration_since(renew).div_f64(1.0 - RENEW_AT);
    let drained_by = end
        .checked_sub(lifetime.mul_f64(1.0 - DRAINED_BY))
        .unwrap_or(renew)
        .min(Instant::now() + MAX_DRAIN);
    let Some(held) = existing.conn.exclusive(drained_by).await else {
        return Err(Renewal::Busy);
    };
    let started = Instant::now();
    let timeout = end
        .saturating_duration_since(started)
        .min(config.connect_timeout);
    match authenticate(&held, &existing.versions, sasl, timeout).await {
        Ok(lifetime) => Ok(BrokerConn {
            retire_at: lifetime.map(|l| started + l.mul_f64(RENEW_AT)),
            session_end: lifetime.map(|l| started + l),
            ..existing.clone()
        }),
        Err(e) => Err(Renewal::Failed(e)),
    }
}

/// Connects to `addr` and runs the handshake (ApiVersions, then the SASL login when configured), all
/// within the configured connect timeout.
pub(crate) async fn open(
    addr: &str,
    node: i32,
    config: &ClientConfig,
) -> Result<BrokerConn, NetError> {
    let deadline = Instant::now() + config.connect_timeout;
    let stream = dial(addr, config, deadline).await?;
    let opts = ConnOptions {
        addr: addr.to_owned(),
        client_id: Arc::from(config.client_id.as_str()),
        max_frame_size: config.max_frame_size,
        max_in_flight: config.max_in_flight_per_connection,
        sweep_interval: sweep_interval(config.request_timeout),
    };
    #[cfg(feature = "tls")]
    if let Some(tls) = &config.tls {
        // The session runs over whatever the dialer opened; the certificate is checked against `addr`.
        let conn = match stream {
            Stream::Tcp(s) => over_tls(tls, addr, s, deadline, config, opts).await?,
            Stream::Other(s) => over_tls(tls, addr, s, deadline, config, opts).await?,
        };
        return finish(conn, addr, node, config, deadline).await;
    }
    let conn = match stream {
        Stream::Tcp(s) => {
            let (read, write) = s.into_split();
            Connection::spawn(read, write, opts)
        }
        Stream::Other(s) => {
            let (read, write) = tokio::io::split(s);
            Connection::spawn(read, write, opts)
        }
    };
    finish(conn, addr, node, config, deadline).await
}

/// Runs the TLS handshake over a dialed stream and starts the connection inside the session.
#[cfg(feature = "tls")]
async fn over_tls<S>(
    tls: &super::TlsConfig,
    addr: &str,
    stream: S,
    deadline: Instant,
    config: &ClientConfig,
    opts: ConnOptions,
) -> Result<Connection, NetError>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Send + Unpin + 'static,
{
    let tls_stream = match timeout_at(deadline, tls.handshake(addr, stream)).await {
        Ok(done) => done?,
        Err(_) => {
            return Err(NetError::Connect {
                addr: addr.to_owned(),
                message: format!("TLS handshake timed out after {:?}", config.connect_timeout),
            })
        }
    };
    let (read, write) = tokio::io::split(tls_stream);
    Ok(Connection::spawn(read, write, opts))
}

/// The handshake on a started connection: ApiVersions, then the SASL login when configured.
async fn finish(
    conn: Connection,
    addr: &str,
    node: i32,
    config: &ClientConfig,
    deadline: Instant,
) -> Result<BrokerConn, NetError> {
    let remaining = deadline.saturating_duration_since(Instant::now());
    let (versions, features) =
        negotiate(&conn, remaining, &config.client_id, config.max_frame_size)
            .await
            .map_err(|e| match e {
                // A handshake that never completes is a failure to connect: nothing else was sent yet.
                NetError::Timeout { .. } | NetError::Connection { .. } => NetError::Connect {
                    addr: addr.to_owned(),
                    message: format!("ApiVersions handshake failed: {e}"),
                },
                other => other,
            })?;
    let (mut retire_at, mut session_end) = (None, None);
    if let Some(sasl) = &config.sasl {
        let started = Instant::now();
        let remaining = deadline.saturating_duration_since(started);
        let lifetime = authenticate(&conn, &versions, sasl, remaining)
            .await
            .map_err(|e| match e {
                NetError::Timeout { .. } | NetError::Connection { .. } => NetError::Connect {
                    addr: addr.to_owned(),
                    message: format!("SASL {} login did not complete: {e}", sasl.mechanism),
                },
                other => {
                    if let NetError::Authentication { mechanism, .. } = &other {
                        telemetry::count(&AUTHENTICATION_FAILURES, Some(mechanism.name()));
                    }
                    other
                }
            })?;
        retire_at = lifetime.map(|l| started + l.mul_f64(RENEW_AT));
        session_end = lifetime.map(|l| started + l);
    }
    tracing::debug!(%addr, node, tv = features.transaction_version, gv = features.group_version, "connected");
    telemetry::count(&CONNECTIONS_OPENED, None);
    Ok(BrokerConn {
        conn,
        node,
        versions: Arc::new(versions),
        features,
        retire_at,
        session_end,
    })
}

/// Logs in on a connection that has finished ApiVersions and carried nothing else. Returns how long the
/// broker lets the session live (KIP-368), if it set a limit.
///
/// Cancel-safe: dropping it drops the half-authenticated connection with it (the caller owns it and has
/// not handed it out).
async fn authenticate(
    conn: &impl LoginChannel,
    versions: &BrokerApiVersions,
    sasl: &SaslConfig,
    timeout: Duration,
) -> Result<Option<Duration>, NetError> {
    let fail = |reason: AuthFailure| NetError::Authentication {
        addr: conn.addr().to_owned(),
        mechanism: sasl.mechanism,
        reason,
    };
    // Handshake v0 means the raw GSSAPI-era framing instead of SaslAuthenticate; only v1 is spoken here.
    let (Some(handshake_version), Some(auth_version)) = (
        versions.usable_at_least(SaslHandshakeRequest::KEY, 1),
        versions.usable(SaslAuthenticateRequest::KEY),
    ) else {
        return Err(fail(AuthFailure::NotSupportedByBroker));
    };
    let handshake = SaslHandshakeRequest::default()
        .with_mechanism(StrBytes::from_static_str(sasl.mechanism.name()));
    let answer = conn.request(&handshake, handshake_version, timeout).await?;
    match ErrorCode::from_code(answer.error_code) {
        ErrorCode::None => {}
        ErrorCode::UnsupportedSaslMechanism => {
            return Err(fail(AuthFailure::UnsupportedMechanism {
                enabled: answer.mechanisms.iter().map(|m| m.to_string()).collect(),
            }))
        }
        code => {
            return Err(fail(AuthFailure::Rejected {
                code,
                message: String::new(),
            }))
        }
    }

    let token = match (sasl.mechanism, &sasl.oauth_bearer) {
        (SaslMechanism::OAuthBearer, Some(oauth)) => Some(oauth_token(conn, oauth, timeout).await?),
        (SaslMechanism::OAuthBearer, None) => return Err(fail(AuthFailure::NoTokenProvider)),
        _ => None,
    };
    let mut exchange = Exchange::new(sasl, token.as_ref()).map_err(fail)?;
    let mut to_send = Some(exchange.first());
    let mut lifetime_ms = 0i64;
    while let Some(bytes) = to_send.take() {
        let request = SaslAuthenticateRequest::default().with_auth_bytes(Bytes::from(bytes));
        let answer = conn.request(&request, auth_version, timeout).await?;
        let code = ErrorCode::from_code(answer.error_code);
        if code != ErrorCode::None {
            let message = answer
                .error_message
                .map(|m| m.to_string())
                .unwrap_or_default();
            if let Some(refused) = exchange.refusal(&message) {
                // Ask the provider again next time: the token may have expired or been revoked.
                if let Some(oauth) = &sasl.oauth_bearer {
                    oauth.forget();
                }
                return Err(fail(refused));
            }
            return Err(fail(AuthFailure::Rejected { code, message }));
        }
        lifetime_ms = answer.session_lifetime_ms;
        to_send = exchange.step(&answer.auth_bytes).map_err(fail)?;
    }
    tracing::debug!(addr = conn.addr(), mechanism = %sasl.mechanism, lifetime_ms, "authenticated");
    Ok((lifetime_ms > 0).then(|| Duration::from_millis(lifetime_ms as u64)))
}

/// The OAUTHBEARER token for a login on `conn`, within `timeout`: a provider that fails or takes too
/// long is [`NetError::TokenProvider`] (retriable), a token that cannot be sent is an authentication
/// failure.
async fn oauth_token(
    conn: &impl LoginChannel,
    oauth: &super::oauth::OAuthBearer,
    timeout: Duration,
) -> Result<super::oauth::OAuthBearerToken, NetError> {
    use super::oauth::TokenFailure;
    let provider = |message: String| NetError::TokenProvider {
        addr: conn.addr().to_owned(),
        message,
    };
    match tokio::time::timeout(timeout, oauth.token()).await {
        Err(_) => Err(provider(format!("no token within {timeout:?}"))),
        Ok(Err(TokenFailure::Provider(message))) => Err(provider(message)),
        Ok(Err(TokenFailure::Refused(reason))) => Err(NetError::Authentication {
            addr: conn.addr().to_owned(),
            mechanism: SaslMechanism::OAuthBearer,
            reason,
        }),
        Ok(Ok(token)) => Ok(token),
    }
}

/// How often a connection looks for abandoned requests that are overdue: often enough to notice within
/// a fraction of the timeout, rarely enough to cost nothing.
fn sweep_interval(request_timeout: Duration) -> Duration {
    (request_timeout / 4).clamp(Duration::from_millis(10), Duration::from_secs(1))
}

/// Opens the byte stream with the configured dialer (the TCP one by default), within the deadline.
async fn dial(addr: &str, config: &ClientConfig, deadline: Instant) -> Result<Stream, NetError> {
    let tcp = TcpDialer::from_config(config);
    let dialer: &dyn Dialer = match &config.dialer {
        Some(custom) => custom.as_ref(),
        None => &tcp,
    };
    // The address is named once, by the error; the dialer's message says only what went wrong.
    match timeout_at(deadline, dialer.dial(addr, &tcp)).await {
        Ok(Ok(stream)) => Ok(stream.into_inner()),
        Ok(Err(e)) => Err(NetError::Connect {
            addr: addr.to_owned(),
            message: e.to_string(),
        }),
        Err(_) => Err(NetError::Connect {
            addr: addr.to_owned(),
            message: format!("timed out after {:?}", config.connect_timeout),
        }),
    }
}

/// Runs the ApiVersions exchange on a fresh connection.
///
/// The first request goes out at the newest version this client knows. A broker that does not know it
/// answers UNSUPPORTED_VERSION with its own ApiVersions range in a v0 body; the exchange is then repeated
/// at the highest version the broker listed, so that a v3+ broker still reports its features.
pub(crate) async fn negotiate(
    conn: &Connection,
    timeout: Duration,
    client_id: &str,
    max_frame_size: usize,
) -> Result<(BrokerApiVersions, Features), NetError> {
    let deadline = Instant::now() + timeout;
    let mut version = wire::initial_api_versions_version();
    let request = ApiVersionsRequest::default()
        .with_client_software_name(StrBytes::from_static_str(SOFTWARE_NAME))
        .with_client_software_version(StrBytes::from_static_str(SOFTWARE_VERSION));
    // At most one downgrade is ever needed; the bound only guards against a broker that keeps
    // answering UNSUPPORTED_VERSION to the version it listed itself.
    for _ in 0..3 {
        let remaining = deadline.saturating_duration_since(Instant::now());
        let frame = conn
            .round_trip(remaining, |correlation_id| {
                wire::encode_request(&request, version, correlation_id, client_id, max_frame_size)
            })
            .await?;
        let (response, _) =
            wire::decode_api_versions(frame, version).map_err(|source| NetError::Protocol {
                addr: conn.addr().to_owned(),
                source,
            })?;
        match ErrorCode::from_code(response.error_code) {
            ErrorCode::None => {
                return Ok((
                    BrokerApiVersions::from_response(&response),
                    Features::from_response(&response),
                ))
            }
            ErrorCode::UnsupportedVersion => {
                let theirs = response
                    .api_keys
                    .iter()
                    .find(|k| k.api_key == ApiVersionsRequest::KEY)
                    .map(|k| k.max_version)
                    .unwrap_or(0);
                let next = theirs.min(version - 1).max(0);
                if version == 0 {
                    break;
                }
                tracing::debug!(
                    addr = conn.addr(),
                    from = version,
                    to = next,
                    "ApiVersions downgrade"
                );
                version = next;
            }
            code => return Err(NetError::broker(code, None, "ApiVersions handshake")),
        }
    }
    Err(NetError::UnsupportedVersion {
        broker: -1,
        api_key: ApiVersionsRequest::KEY,
        min: 0,
        max: version,
        broker_range: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::net::testing::{options, pair};
    use crate::net::SaslMechanism;
    use kafka_protocol::messages::api_versions_response::{ApiVersion, FinalizedFeatureKey};
    use kafka_protocol::messages::ApiVersionsResponse;
    use kafka_protocol::protocol::Decodable;

    fn listing(max_api_versions: i16) -> Vec<ApiVersion> {
        vec![
            ApiVersion::default()
                .with_api_key(18)
                .with_min_version(0)
                .with_max_version(max_api_versions),
            ApiVersion::default()
                .with_api_key(3)
                .with_min_version(0)
                .with_max_version(9),
        ]
    }

    /// A v3+ broker gets the client software name and version and reports its features.
    #[tokio::test]
    async fn handshake_sends_software_name_and_reads_features() {
        let (conn, mut peer) = pair(4096, options());
        let client =
            tokio::spawn(
                async move { negotiate(&conn, Duration::from_secs(5), "c", 1 << 20).await },
            );
        let got = peer.next_request().await.unwrap();
        let version = got.header.request_api_version;
        assert_eq!(version, wire::initial_api_versions_version());
        let mut body = got.body;
        let request = ApiVersionsRequest::decode(&mut body, version).unwrap();
        assert_eq!(request.client_software_name.as_str(), "snapfence");
        assert_eq!(request.client_software_version.as_str(), SOFTWARE_VERSION);
        let answer = ApiVersionsResponse::default()
            .with_api_keys(listing(version))
            .with_finalized_features_epoch(4)
            .with_finalized_features(vec![FinalizedFeatureKey::default()
                .with_name("group.version".into())
                .with_min_version_level(1)
                .with_max_version_level(1)]);
        peer.respond(got.header.correlation_id, &answer, version)
            .await;
        let (versions, features) = client.await.unwrap().unwrap();
        assert_eq!(versions.usable(3), Some(9));
        assert_eq!(features.group_version, 1);
        assert_eq!(features.transaction_version, 0);
        assert_eq!(features.epoch, 4);
    }

    /// An older broker answers UNSUPPORTED_VERSION in a v0 body; the client retries at the version the
    /// broker listed and ends up with the broker's real table.
    #[tokio::test]
    async fn unsupported_version_falls_back_to_the_brokers_version() {
        let (conn, mut peer) = pair(4096, options());
        let client =
            tokio::spawn(
                async move { negotiate(&conn, Duration::from_secs(5), "c", 1 << 20).await },
            );
        let first = peer.next_request().await.unwrap();
        let refusal = ApiVersionsResponse::default()
            .with_error_code(ErrorCode::UnsupportedVersion.code())
            .with_api_keys(listing(2));
        // The refusal is always written at v0, whatever was asked.
        peer.respond(first.header.correlation_id, &refusal, 0).await;

        let second = peer.next_request().await.unwrap();
        assert_eq!(second.header.request_api_version, 2);
        let answer = ApiVersionsResponse::default().with_api_keys(listing(2));
        peer.respond(second.header.correlation_id, &answer, 2).await;
        let (versions, features) = client.await.unwrap().unwrap();
        assert_eq!(versions.broker_range(18), Some((0, 2)));
        assert_eq!(versions.usable(3), Some(9));
        assert_eq!(features.epoch, -1, "ApiVersions v2 carries no features");
    }

    /// A broker that only speaks ApiVersions v0 is still usable.
    #[tokio::test]
    async fn falls_back_all_the_way_to_v0() {
        let (conn, mut peer) = pair(4096, options());
        let client =
            tokio::spawn(
                async move { negotiate(&conn, Duration::from_secs(5), "c", 1 << 20).await },
            );
        let first = peer.next_request().await.unwrap();
        let refusal = ApiVersionsResponse::default()
            .with_error_code(ErrorCode::UnsupportedVersion.code())
            .with_api_keys(vec![]);
        peer.respond(first.header.correlation_id, &refusal, 0).await;
        let second = peer.next_request().await.unwrap();
        assert_eq!(second.header.request_api_version, 0);
        peer.respond(
            second.header.correlation_id,
            &ApiVersionsResponse::default().with_api_keys(listing(0)),
            0,
        )
        .await;
        let (versions, _) = client.await.unwrap().unwrap();
        assert_eq!(versions.broker_range(18), Some((0, 0)));
    }

    /// An ApiVersions answer with any error other than UNSUPPORTED_VERSION fails the handshake with that
    /// broker error code, rather than a retry at another version.
    #[tokio::test]
    async fn other_handshake_errors_are_broker_errors() {
        let (conn, mut peer) = pair(4096, options());
        let client =
            tokio::spawn(
                async move { negotiate(&conn, Duration::from_secs(5), "c", 1 << 20).await },
            );
        let first = peer.next_request().await.unwrap();
        let answer =
            ApiVersionsResponse::default().with_error_code(ErrorCode::InvalidRequest.code());
        peer.respond(
            first.header.correlation_id,
            &answer,
            first.header.request_api_version,
        )
        .await;
        let err = client.await.unwrap().unwrap_err();
        assert_eq!(err.error_code(), Some(ErrorCode::InvalidRequest));
    }

    fn sasl_versions() -> BrokerApiVersions {
        use kafka_protocol::messages::api_versions_response::ApiVersion;
        use kafka_protocol::messages::ApiVersionsResponse;
        let key = |k, max| {
            ApiVersion::default()
                .with_api_key(k)
                .with_min_version(0)
                .with_max_version(max)
        };
        BrokerApiVersions::from_response(
            &ApiVersionsResponse::default().with_api_keys(vec![key(17, 1), key(36, 2)]),
        )
    }

    /// A refused login surfaces as a fatal Authentication error naming the mechanism and carrying the
    /// broker's own message, after exactly one handshake and one authenticate request.
    #[tokio::test]
    async fn a_rejected_login_is_a_fatal_error_with_the_brokers_message() {
        use crate::net::testing::{options, pair};
        use kafka_protocol::messages::{SaslAuthenticateResponse, SaslHandshakeResponse};
        use kafka_protocol::protocol::Decodable;
        let (conn, mut peer) = pair(4096, options());
        let sasl = SaslConfig::new(SaslMechanism::Plain, "alice", "wrong");
        let client = tokio::spawn(async move {
            authenticate(&conn, &sasl_versions(), &sasl, Duration::from_secs(5)).await
        });
        let hs = peer.next_request().await.unwrap();
        assert_eq!(hs.header.request_api_key, 17);
        assert_eq!(hs.header.request_api_version, 1);
        let mut body = hs.body;
        let req = SaslHandshakeRequest::decode(&mut body, 1).unwrap();
        assert_eq!(req.mechanism.as_str(), "PLAIN");
        peer.respond(
            hs.header.correlation_id,
            &SaslHandshakeResponse::default(),
            1,
        )
        .await;
        let auth = peer.next_request().await.unwrap();
        assert_eq!(auth.header.request_api_key, 36);
        let v = auth.header.request_api_version;
        let mut body = auth.body;
        let req = SaslAuthenticateRequest::decode(&mut body, v).unwrap();
        assert_eq!(&req.auth_bytes[..], b"\0alice\0wrong");
        let refusal = SaslAuthenticateResponse::default()
            .with_error_code(ErrorCode::SaslAuthenticationFailed.code())
            .with_error_message(Some("Invalid username or password".into()));
        peer.respond(auth.header.correlation_id, &refusal, v).await;
        let err = client.await.unwrap().unwrap_err();
        assert!(err.is_authentication() && !err.is_retriable(), "{err:?}");
        let text = err.to_string();
        assert!(
            text.contains("PLAIN") && text.contains("Invalid username or password"),
            "{text}"
        );
    }

    /// The broker's list of enabled mechanisms is reported when ours is not among them.
    #[tokio::test]
    async fn an_unsupported_mechanism_names_what_the_broker_offers() {
        use crate::net::testing::{options, pair};
        use kafka_protocol::messages::SaslHandshakeResponse;
        let (conn, mut peer) = pair(4096, options());
        let sasl = SaslConfig::new(SaslMechanism::ScramSha256, "u", "p");
        let client = tokio::spawn(async move {
            authenticate(&conn, &sasl_versions(), &sasl, Duration::from_secs(5)).await
        });
        let hs = peer.next_request().await.unwrap();
        let answer = SaslHandshakeResponse::default()
            .with_error_code(ErrorCode::UnsupportedSaslMechanism.code())
            .with_mechanisms(vec!["SCRAM-SHA-512".into()]);
        peer.respond(hs.header.correlation_id, &answer, 1).await;
        match client.await.unwrap() {
            Err(NetError::Authentication {
                reason: AuthFailure::UnsupportedMechanism { enabled },
                mechanism: SaslMechanism::ScramSha256,
                ..
            }) => assert_eq!(enabled, vec!["SCRAM-SHA-512".to_owned()]),
            other => panic!("unexpected {other:?}"),
        }
    }

    /// OAUTHBEARER against a scripted broker: a broker without the mechanism is told apart from one
    /// that refuses the token. The refusal runs as RFC 7628 says: the error challenge, the client's lone
    /// `0x01`, then the broker's error; the token is forgotten. A provider that fails is retriable.
    #[tokio::test]
    async fn oauthbearer_refusals_are_told_apart() {
        use crate::net::oauth::{OAuthBearer, OAuthBearerToken};
        use crate::net::testing::{options, pair};
        use kafka_protocol::messages::{SaslAuthenticateResponse, SaslHandshakeResponse};
        use kafka_protocol::protocol::Decodable;
        use std::sync::atomic::{AtomicU32, Ordering};
        let calls = std::sync::Arc::new(AtomicU32::new(0));
        let counted = calls.clone();
        let oauth = OAuthBearer::new(move || {
            counted.fetch_add(1, Ordering::SeqCst);
            async {
                Ok(OAuthBearerToken::new(
                    "tok.en",
                    std::time::SystemTime::now() + Duration::from_secs(600),
                )
                .with_extension("traceId", "t1"))
            }
        });
        let sasl = SaslConfig::oauthbearer(oauth);

        // Not offered.
        let (conn, mut peer) = pair(4096, options());
        let s = sasl.clone();
        let client = tokio::spawn(async move {
            authenticate(&conn, &sasl_versions(), &s, Duration::from_secs(5)).await
        });
        let hs = peer.next_request().await.unwrap();
        let mut body = hs.body;
        assert_eq!(
            SaslHandshakeRequest::decode(&mut body, 1)
                .unwrap()
                .mechanism
                .as_str(),
            "OAUTHBEARER"
        );
        let answer = SaslHandshakeResponse::default()
            .with_error_code(ErrorCode::UnsupportedSaslMechanism.code())
            .with_mechanisms(vec!["PLAIN".into()]);
        peer.respond(hs.header.correlation_id, &answer, 1).await;
        assert!(matches!(
            client.await.unwrap(),
            Err(NetError::Authentication {
                reason: AuthFailure::UnsupportedMechanism { .. },
                mechanism: SaslMechanism::OAuthBearer,
                ..
            })
        ));

        // Offered, the token refused.
        let (conn, mut peer) = pair(4096, options());
        let s = sasl.clone();
        let client = tokio::spawn(async move {
            authenticate(&conn, &sasl_versions(), &s, Duration::from_secs(5)).await
        });
        let hs = peer.next_request().await.unwrap();
        peer.respond(
            hs.header.correlation_id,
            &SaslHandshakeResponse::default(),
            1,
        )
        .await;
        let first = peer.next_request().await.unwrap();
        let v = first.header.request_api_version;
        let mut body = first.body;
        let sent = SaslAuthenticateRequest::decode(&mut body, v).unwrap();
        assert_eq!(
            &sent.auth_bytes[..],
            b"n,,\x01auth=Bearer tok.en\x01traceId=t1\x01\x01"
        );
        let challenge = SaslAuthenticateResponse::default()
            .with_auth_bytes(bytes::Bytes::from_static(br#"{"status":"invalid_token"}"#));
        peer.respond(first.header.correlation_id, &challenge, v)
            .await;
        let second = peer.next_request().await.unwrap();
        let mut body = second.body;
        let sent = SaslAuthenticateRequest::decode(&mut body, v).unwrap();
        assert_eq!(
            &sent.auth_bytes[..],
            b"\x01",
            "the challenge is answered with 0x01"
        );
        let refusal = SaslAuthenticateResponse::default()
            .with_error_code(ErrorCode::SaslAuthenticationFailed.code())
            .with_error_message(Some("Authentication failed".into()));
        peer.respond(second.header.correlation_id, &refusal, v)
            .await;
        match client.await.unwrap() {
            Err(NetError::Authentication {
                reason: AuthFailure::TokenRefused(r),
                ..
            }) => {
                assert_eq!(r.status.as_deref(), Some("invalid_token"));
                assert_eq!(r.message, "Authentication failed");
            }
            other => panic!("unexpected {other:?}"),
        }
        assert_eq!(calls.load(Ordering::SeqCst), 1);
        // Forgotten: the next login asks the provider again (here: a provider failing, retriable).
        let failing = SaslConfig::oauthbearer(OAuthBearer::new(|| async {
            Err::<OAuthBearerToken, _>("idp down".into())
        }));
        let (conn, _peer) = pair(4096, options());
        let err = oauth_token(
            &conn,
            failing.oauth_bearer.as_ref().unwrap(),
            Duration::from_secs(5),
        )
        .await
        .unwrap_err();
        assert!(
            matches!(err, NetError::TokenProvider { .. }) && err.is_retriable(),
            "{err:?}"
        );
        let (conn, _peer) = pair(4096, options());
        oauth_token(
            &conn,
            sasl.oauth_bearer.as_ref().unwrap(),
            Duration::from_secs(5),
        )
        .await
        .unwrap();
        assert_eq!(
            calls.load(Ordering::SeqCst),
            2,
            "the refused token was forgotten"
        );
    }
}
