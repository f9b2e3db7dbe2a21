//! Client settings.

use std::sync::Arc;
use std::time::Duration;

use super::dial::Dialer;

use super::retry::Backoff;
use super::sasl::SaslConfig;

/// How the client connects, times out and retries. Build with [`ClientConfig::new`] or
/// `ClientConfig { bootstrap, ..Default::default() }`.
#[derive(Debug, Clone)]
pub struct ClientConfig {
    /// `host:port` addresses to learn the cluster from; any one reachable broker is enough.
    pub bootstrap: Vec<String>,
    /// Sent in every request header; shows up in broker logs, quotas and `kafka-consumer-groups.sh
    /// --describe`. The default names this process and this configuration:
    /// `snapfence-<host>-<pid>-<n>`, where `<host>` is the machine's host name (a Kubernetes pod's
    /// name, since every pod's main process is pid 1), `<pid>` the process id and `<n>` counts the
    /// default configurations made in the process from 1 (see [`default_client_id`]). Set it to
    /// something stable (a service and replica name) when broker quotas are keyed on it.
    pub client_id: String,
    /// How long a request may wait for its answer before the connection is reset and the request is
    /// re-routed (or fails, once retries run out).
    pub request_timeout: Duration,
    /// How long opening a connection may take: the dial (TCP connect, or the [`dialer`](Self::dialer)),
    /// the TLS handshake, ApiVersions and the SASL login together.
    pub connect_timeout: Duration,
    /// Largest frame sent or accepted, in bytes. A larger announced response is refused before any
    /// memory is reserved for it.
    pub max_frame_size: usize,
    /// First delay between retries; doubles per attempt up to `retry_backoff_max`, with ±20% jitter.
    pub retry_backoff: Duration,
    /// Ceiling of the retry delay.
    pub retry_backoff_max: Duration,
    /// Retries after the first attempt before a request fails with
    /// [`NetError::RetriesExhausted`](super::NetError::RetriesExhausted).
    pub max_retries: u32,
    /// Requests in flight at once on one connection; further requests wait for a slot.
    pub max_in_flight_per_connection: usize,
    /// Connections kept to each broker (at least 1). A broker reads each connection's requests one at a
    /// time, so with more than one its network and request threads can work on several of this
    /// client's requests at once. Requests are spread so that every ordering rule holds: a partition's
    /// requests (its Produce batches in sequence order, its fetch session) always use the same
    /// connection, and so do a group's and a transactional id's. Each connection opens on first use.
    pub connections_per_broker: usize,
    /// `SO_SNDBUF`; `None` keeps the operating system's default (and its auto-tuning).
    pub socket_send_buffer: Option<usize>,
    /// `SO_RCVBUF`; `None` keeps the operating system's default (and its auto-tuning).
    pub socket_receive_buffer: Option<usize>,
    /// TCP keepalive idle time; `None` turns keepalive off.
    pub tcp_keepalive: Option<Duration>,
    /// Opens each connection's byte stream (a tunnel, a proxy); `None` is a plain TCP connect with the
    /// socket options above ([`TcpDialer`](super::TcpDialer)). See [`Dialer`].
    pub dialer: Option<Arc<dyn Dialer>>,
    /// SASL credentials. When set, every connection (reconnects included) logs in right after the
    /// ApiVersions handshake, before it carries any other request; a rejected login fails the request
    /// at once with [`NetError::Authentication`](super::NetError::Authentication) and is never retried.
    pub sasl: Option<SaslConfig>,
    /// TLS for every connection (feature `tls`); `None` is plaintext. With [`ClientConfig::sasl`] too,
    /// this is SASL_SSL.
    #[cfg(feature = "tls")]
    pub tls: Option<super::TlsConfig>,
}

impl Default for ClientConfig {
    fn default() -> Self {
        ClientConfig {
            bootstrap: Vec::new(),
            client_id: default_client_id(),
            request_timeout: Duration::from_secs(30),
            connect_timeout: Duration::from_secs(10),
            // Kafka's own default for socket.request.max.bytes; comfortably above fetch.max.bytes.
            max_frame_size: 100 * 1024 * 1024,
            retry_backoff: Duration::from_millis(100),
            retry_backoff_max: Duration::from_secs(1),
            // With the default backoff this spans roughly 15 s, long enough for a KRaft cluster to
            // notice a dead broker (broker.session.timeout.ms defaults to 9 s) and move its leaderships.
            max_retries: 20,
            max_in_flight_per_connection: 64,
            connections_per_broker: 1,
            socket_send_buffer: None,
            socket_receive_buffer: None,
            tcp_keepalive: Some(Duration::from_secs(60)),
            dialer: None,
            sasl: None,
            #[cfg(feature = "tls")]
            tls: None,
        }
    }
}

/// A client id for this process, unique among the clients one cluster sees from different machines,
/// processes and configurations: `snapfence-<host>-<pid>-<n>` (see [`ClientConfig::client_id`]). The host
/// name is read from `/proc/sys/kernel/hostname` or `$HOSTNAME`, cut at its first dot and kept to
/// letters, digits, `-` and `_` (others become `_`, at most 63 bytes); without one it is left out.
pub fn default_client_id() -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::OnceLock;
    static HOST: OnceLock<String> = OnceLock::new();
    static NEXT: AtomicU64 = AtomicU64::new(1);
    let host = HOST.get_or_init(|| {
        let raw = std::fs::read_to_string("/proc/sys/kernel/hostname")
            .ok()
            .or_else(|| std::env::var("HOSTNAME").ok())
            .unwrap_or_default();
        client_id_part(&raw)
    });
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let pid = std::process::id();
    if host.is_empty() {
        format!("snapfence-{pid}-{n}")
    } else {
        format!("snapfence-{host}-{pid}-{n}")
    }
}

/// The part of a host name a client id carries: up to the first dot, safe characters only, bounded.
fn client_id_part(raw: &str) -> String {
    let short = raw.trim().split('.').next().unwrap_or_default();
    short
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                c
            } else {
                '_'
            }
        })
        .take(63)
        .collect()
}

impl ClientConfig {
    /// Default settings for a comma-separated bootstrap list such as `"127.0.0.1:9092,127.0.0.1:9093"`.
    pub fn new(bootstrap: impl Into<String>) -> Self {
        ClientConfig {
            bootstrap: bootstrap
                .into()
                .split(',')
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .map(str::to_owned)
                .collect(),
            ..ClientConfig::default()
        }
    }

    /// These settings with SASL credentials.
    pub fn with_sasl(self, sasl: SaslConfig) -> Self {
        ClientConfig {
            sasl: Some(sasl),
            ..self
        }
    }

    /// These settings with connections opened by `dialer` instead of a plain TCP connect.
    pub fn with_dialer(self, dialer: impl Dialer) -> Self {
        ClientConfig {
            dialer: Some(Arc::new(dialer)),
            ..self
        }
    }

    /// These settings with TLS (feature `tls`).
    #[cfg(feature = "tls")]
    pub fn with_tls(self, tls: super::TlsConfig) -> Self {
        ClientConfig {
            tls: Some(tls),
            ..self
        }
    }

    /// A fresh [`Backoff`] following this configuration's retry settings.
    pub fn backoff(&self) -> Backoff {
        Backoff::new(self.retry_backoff, self.retry_backoff_max, self.max_retries)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A comma-separated bootstrap list yields each address trimmed, with empty entries dropped.
    #[test]
    fn bootstrap_list_is_split_and_trimmed() {
        let c = ClientConfig::new(" 127.0.0.1:1, 127.0.0.1:2 ,,");
        assert_eq!(c.bootstrap, vec!["127.0.0.1:1", "127.0.0.1:2"]);
    }

    /// Two default configurations in one process get different client ids, each naming the process, so
    /// a broker (and `kafka-consumer-groups.sh --describe`) tells their members apart.
    #[test]
    fn default_client_ids_name_the_process_and_differ() {
        let (a, b) = (ClientConfig::new("x:1"), ClientConfig::default());
        assert_ne!(a.client_id, b.client_id);
        let pid = format!("-{}-", std::process::id());
        for id in [&a.client_id, &b.client_id] {
            assert!(id.starts_with("snapfence-") && id.contains(&pid), "{id}");
            assert!(id.len() <= 120, "{id}");
            assert!(
                id.chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_'),
                "{id}"
            );
        }
    }

    /// A host name is cut at its domain and cleaned of characters a quota or log line would trip on.
    #[test]
    fn host_part_is_short_and_clean() {
        assert_eq!(
            client_id_part("pod-7f9c.ns.svc.cluster.local\n"),
            "pod-7f9c"
        );
        assert_eq!(client_id_part("we ird/host"), "we_ird_host");
        assert_eq!(client_id_part(""), "");
        assert_eq!(client_id_part(&"h".repeat(300)).len(), 63);
    }
}
