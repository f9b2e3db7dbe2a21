//! The net layer's error type.

use std::time::Duration;

use super::sasl::{AuthFailure, SaslMechanism};
use crate::wire::{ErrorCode, WireError};

/// Why a connection stopped being usable. Every request waiting on it fails with the same reason.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ConnectionFailure {
    /// The broker closed the connection between frames.
    #[error("the broker closed the connection")]
    Closed,
    /// The broker closed the connection part-way through a response frame.
    #[error("the connection closed in the middle of a response")]
    ClosedMidFrame,
    /// Reading or writing the socket failed.
    #[error("socket error: {0}")]
    Io(String),
    /// The byte stream could not be split into frames (bad length prefix); it cannot be resynchronised.
    #[error("unreadable frame: {0}")]
    Frame(WireError),
    /// A response arrived for a correlation id this connection never sent (or already answered), so the
    /// pairing of requests and responses can no longer be trusted.
    #[error("response with unexpected correlation id {0}")]
    UnexpectedCorrelationId(i32),
    /// A request on this connection got no answer in time; the connection was reset so that a late
    /// answer cannot be mistaken for another request's.
    #[error("a request got no answer within {0:?}; the connection was reset")]
    RequestTimedOut(Duration),
    /// This client shut the connection down.
    #[error("the connection was shut down by the client")]
    Shutdown,
    /// The connection's reader or writer task panicked or was cancelled, so nothing more would be read
    /// or written: the connection is poisoned at once rather than left to time its waiters out one by one.
    #[error("the connection's {task} task {failure}")]
    TaskFailed {
        /// `reader` or `writer`.
        task: &'static str,
        /// How it ended: the panic's message, or that it was cancelled.
        failure: String,
    },
}

/// Everything that can go wrong between a request and its decoded response.
///
/// Three groups matter to callers:
/// - transport errors ([`NetError::Connect`], [`NetError::Connection`], [`NetError::Timeout`]): the
///   socket failed. When [`NetError::outcome_unknown`] is true the broker may have acted on the request,
///   which for a non-idempotent request (a transaction commit!) means "do not assume it failed";
/// - broker answers ([`NetError::Broker`]): the request was processed and refused with an error code;
/// - everything else is a fault in the exchange itself (undecodable bytes, no common version) that
///   retrying will not fix.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum NetError {
    /// No connection could be opened; the request was not sent.
    #[error("cannot connect to {addr}: {message}")]
    Connect {
        /// The address (or list of addresses) tried.
        addr: String,
        /// What the last attempt failed with.
        message: String,
    },
    /// The connection died before the response arrived.
    #[error("connection to {addr} failed: {failure}{}", unknown_suffix(*outcome_unknown))]
    Connection {
        /// The broker's address.
        addr: String,
        /// Why the connection died.
        failure: ConnectionFailure,
        /// Whether the request may have reached the broker (it was queued for writing).
        outcome_unknown: bool,
    },
    /// No response within the request timeout; the connection was reset.
    #[error("no response from {addr} within {after:?}{}", unknown_suffix(*outcome_unknown))]
    Timeout {
        /// The broker's address.
        addr: String,
        /// The timeout that expired.
        after: Duration,
        /// Whether the request may have reached the broker (it was queued for writing).
        outcome_unknown: bool,
    },
    /// The broker's bytes did not decode, or ours did not encode.
    #[error("protocol error with {addr}: {source}")]
    Protocol {
        /// The broker's address.
        addr: String,
        /// What was wrong with the bytes.
        #[source]
        source: WireError,
    },
    /// The broker answered with an error code.
    #[error("{context}: broker error {code}{}", message.as_deref().map(|m| format!(": {m}")).unwrap_or_default())]
    Broker {
        /// The error code.
        code: ErrorCode,
        /// The broker's error message, if it sent one.
        message: Option<String>,
        /// What was being done (e.g. "metadata for topic t", "create topic t").
        context: String,
    },
    /// The broker and this client have no usable version of an API in common.
    #[error("broker {broker} cannot serve api key {api_key} at a version this client accepts (needed {min}..={max}, broker has {broker_range:?})")]
    UnsupportedVersion {
        /// The broker's node id (-1 for a bootstrap connection).
        broker: i32,
        /// The API key.
        api_key: i16,
        /// The lowest version acceptable to the caller.
        min: i16,
        /// The highest version this client would use.
        max: i16,
        /// What the broker advertised, if it listed the API at all.
        broker_range: Option<(i16, i16)>,
    },
    /// A broker id that is not in the cluster metadata.
    #[error("broker {0} is not in the cluster metadata")]
    UnknownBroker(i32),
    /// Retries ran out; `last` is the error of the final attempt.
    #[error("gave up after {attempts} attempts{}: {last}", unknown_suffix(*outcome_unknown))]
    RetriesExhausted {
        /// How many attempts were made.
        attempts: u32,
        /// Whether any attempt may have reached the broker without an answer coming back.
        outcome_unknown: bool,
        /// The final attempt's error.
        #[source]
        last: Box<NetError>,
    },
    /// The SASL login on a new connection failed. Fatal: the credentials, the mechanism or the broker's
    /// listener setup must change, so the request is not retried (retrying would only repeat the refusal
    /// against every broker in turn).
    #[error("SASL {mechanism} authentication with {addr} failed: {reason}")]
    Authentication {
        /// The broker's address.
        addr: String,
        /// The mechanism that was tried.
        mechanism: SaslMechanism,
        /// What the broker (or the SCRAM check) said.
        reason: AuthFailure,
    },
    /// The application's OAUTHBEARER token provider failed, or gave no token within the connect
    /// timeout; nothing was sent. Retriable: the routing loop tries again after a back-off, and the
    /// provider is asked again.
    #[error("no OAUTHBEARER token for {addr}: {message}")]
    TokenProvider {
        /// The broker's address the login was for.
        addr: String,
        /// The provider's error.
        message: String,
    },
    /// The TLS handshake failed for a reason retrying will not fix (the broker's certificate is not
    /// trusted or does not name it, the broker refused our client certificate, no common protocol).
    #[error("TLS handshake with {addr} failed: {message}")]
    Tls {
        /// The broker's address.
        addr: String,
        /// What rustls reported.
        message: String,
    },
    /// The configuration cannot work (e.g. no bootstrap address).
    #[error("invalid client configuration: {0}")]
    Config(String),
}

fn unknown_suffix(outcome_unknown: bool) -> &'static str {
    if outcome_unknown {
        " (the request may have been processed)"
    } else {
        ""
    }
}

impl NetError {
    /// Whether the socket failed (connect, dead connection, timeout), as opposed to the broker refusing
    /// the request or the bytes being wrong.
    pub fn is_transport(&self) -> bool {
        match self {
            NetError::Connect { .. } | NetError::Connection { .. } | NetError::Timeout { .. } => {
                true
            }
            NetError::RetriesExhausted { last, .. } => last.is_transport(),
            _ => false,
        }
    }

    /// Whether the request may have been acted on by the broker even though no answer came back.
    /// A caller that sees `true` for a non-idempotent request must find out what happened (or make the
    /// retry idempotent) rather than assume the request failed.
    pub fn outcome_unknown(&self) -> bool {
        match self {
            NetError::Connection {
                outcome_unknown, ..
            }
            | NetError::Timeout {
                outcome_unknown, ..
            }
            | NetError::RetriesExhausted {
                outcome_unknown, ..
            } => *outcome_unknown,
            _ => false,
        }
    }

    /// Whether this is a failed SASL login (looking through [`NetError::RetriesExhausted`]).
    pub fn is_authentication(&self) -> bool {
        match self {
            NetError::Authentication { .. } => true,
            NetError::RetriesExhausted { last, .. } => last.is_authentication(),
            _ => false,
        }
    }

    /// Whether opening a connection failed in a way every broker would repeat (a refused login, a failed
    /// TLS handshake): the pool stops trying other brokers and the routing loop does not retry.
    pub fn is_fatal_connect(&self) -> bool {
        match self {
            NetError::Authentication { .. } | NetError::Tls { .. } => true,
            NetError::RetriesExhausted { last, .. } => last.is_fatal_connect(),
            _ => false,
        }
    }

    /// The broker error code this error carries (looking through [`NetError::RetriesExhausted`]).
    pub fn error_code(&self) -> Option<ErrorCode> {
        match self {
            NetError::Broker { code, .. } => Some(*code),
            NetError::RetriesExhausted { last, .. } => last.error_code(),
            _ => None,
        }
    }

    /// Whether sending again (after re-routing and a back-off) may succeed.
    pub fn is_retriable(&self) -> bool {
        match self {
            NetError::Connect { .. } | NetError::Connection { .. } | NetError::Timeout { .. } => {
                true
            }
            NetError::Broker { code, .. } => code.is_retriable(),
            // The metadata may simply be older than the broker list the caller got the id from.
            NetError::UnknownBroker(_) => true,
            // An identity provider that was down may be back.
            NetError::TokenProvider { .. } => true,
            _ => false,
        }
    }

    pub(crate) fn broker(
        code: ErrorCode,
        message: Option<&str>,
        context: impl Into<String>,
    ) -> Self {
        NetError::Broker {
            code,
            message: message.map(str::to_owned),
            context: context.into(),
        }
    }
}
