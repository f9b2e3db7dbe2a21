//! TLS and mutual TLS for broker connections, with rustls (feature `tls`).
//!
//! The TLS session wraps the TCP stream before anything else is sent; ApiVersions, the SASL login (for
//! SASL_SSL) and every request then run inside it. The broker's certificate is checked against the
//! configured CA certificates and against the host of the address being dialled (an IP address is matched
//! against the certificate's IP SANs), unless [`TlsConfig::server_name`] names the host to expect instead.
//!
//! The crypto provider is ring, which compiles C and assembly; that is why TLS is an opt-in feature and the
//! default build has none of it.
//!
//! # References
//! - Kafka `security.protocol=SSL` / `SASL_SSL`, `ssl.client.auth=required` (KIP-103 listener names)
//! - RFC 8446 (TLS 1.3), RFC 5246 (TLS 1.2), RFC 6125 (server identity checks)

use std::fmt;
use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio_rustls::client::TlsStream;
use tokio_rustls::TlsConnector;

use super::NetError;

/// TLS settings for [`ClientConfig::tls`](super::ClientConfig::tls). All material is PEM text.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct TlsConfig {
    /// The CA certificates that may sign a broker's certificate (PEM, one or more).
    pub ca_pem: Vec<u8>,
    /// The client's certificate chain, leaf first (PEM), for brokers that require client
    /// certificates (`ssl.client.auth=required`). Needs [`TlsConfig::client_key_pem`].
    pub client_cert_pem: Option<Vec<u8>>,
    /// The client's private key (PEM: PKCS#8, PKCS#1 or SEC1). `Debug` never shows it.
    pub client_key_pem: Option<Vec<u8>>,
    /// The name the broker certificates must carry, instead of each broker's own host.
    pub server_name: Option<String>,
}

impl fmt::Debug for TlsConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TlsConfig")
            .field("ca_pem", &format_args!("{} bytes", self.ca_pem.len()))
            .field("client_cert", &self.client_cert_pem.is_some())
            .field(
                "client_key",
                &self.client_key_pem.as_ref().map(|_| "<redacted>"),
            )
            .field("server_name", &self.server_name)
            .finish()
    }
}

impl TlsConfig {
    /// Server authentication only: brokers' certificates must chain to `ca_pem`.
    pub fn new(ca_pem: impl Into<Vec<u8>>) -> TlsConfig {
        TlsConfig {
            ca_pem: ca_pem.into(),
            ..TlsConfig::default()
        }
    }

    /// These settings plus a client certificate and key, for mutual TLS.
    pub fn with_client_cert(
        self,
        cert_chain_pem: impl Into<Vec<u8>>,
        key_pem: impl Into<Vec<u8>>,
    ) -> TlsConfig {
        TlsConfig {
            client_cert_pem: Some(cert_chain_pem.into()),
            client_key_pem: Some(key_pem.into()),
            ..self
        }
    }

    /// The rustls client configuration; fails with [`NetError::Config`] on unusable material.
    pub(crate) fn connector(&self) -> Result<TlsConnector, NetError> {
        let bad = |what: &str, e: &dyn fmt::Display| NetError::Config(format!("TLS {what}: {e}"));
        let mut roots = rustls::RootCertStore::empty();
        for cert in CertificateDer::pem_slice_iter(&self.ca_pem) {
            let cert = cert.map_err(|e| bad("CA certificates", &e))?;
            roots
                .add(cert)
                .map_err(|e| bad("CA certificate rejected", &e))?;
        }
        if roots.is_empty() {
            return Err(NetError::Config(
                "TLS CA certificates: no PEM certificate found".into(),
            ));
        }
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| bad("protocol versions", &e))?
            .with_root_certificates(roots);
        let config = match (&self.client_cert_pem, &self.client_key_pem) {
            (Some(cert), Some(key)) => {
                let chain = CertificateDer::pem_slice_iter(cert)
                    .collect::<Result<Vec<_>, _>>()
                    .map_err(|e| bad("client certificate", &e))?;
                if chain.is_empty() {
                    return Err(NetError::Config(
                        "TLS client certificate: no PEM certificate found".into(),
                    ));
                }
                let key = PrivateKeyDer::from_pem_slice(key).map_err(|e| bad("client key", &e))?;
                builder
                    .with_client_auth_cert(chain, key)
                    .map_err(|e| bad("client certificate and key", &e))?
            }
            (None, None) => builder.with_no_client_auth(),
            _ => {
                return Err(NetError::Config(
                    "TLS: a client certificate needs its key and a key needs its certificate"
                        .into(),
                ))
            }
        };
        Ok(TlsConnector::from(Arc::new(config)))
    }

    /// Runs the TLS handshake over a dialed stream to `addr` ("host:port").
    pub(crate) async fn handshake<S>(&self, addr: &str, stream: S) -> Result<TlsStream<S>, NetError>
    where
        S: AsyncRead + AsyncWrite + Unpin,
    {
        let connector = self.connector()?;
        let host = match &self.server_name {
            Some(name) => name.as_str(),
            None => host_of(addr),
        };
        let name = ServerName::try_from(host.to_owned())
            .map_err(|e| NetError::Config(format!("TLS server name {host:?}: {e}")))?;
        connector.connect(name, stream).await.map_err(|e| {
            // rustls reports its own refusals (certificate, alert, protocol) as InvalidData; anything else
            // is the socket failing mid-handshake (a broker restarting), which a retry may get past.
            if e.kind() == std::io::ErrorKind::InvalidData {
                NetError::Tls {
                    addr: addr.to_owned(),
                    message: e.to_string(),
                }
            } else {
                NetError::Connect {
                    addr: addr.to_owned(),
                    message: format!("TLS handshake interrupted: {e}"),
                }
            }
        })
    }
}

/// The host part of "host:port" or "[v6]:port".
fn host_of(addr: &str) -> &str {
    let host = addr.rsplit_once(':').map_or(addr, |(h, _)| h);
    host.trim_start_matches('[').trim_end_matches(']')
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The name checked against the broker's certificate is the address's host, without port or IPv6
    /// brackets.
    #[test]
    fn hosts_are_cut_from_addresses() {
        assert_eq!(host_of("127.0.0.1:9092"), "127.0.0.1");
        assert_eq!(host_of("[::1]:9092"), "::1");
        assert_eq!(host_of("broker-1.example:9093"), "broker-1.example");
    }

    /// Unreadable certificates or a key without its certificate are a config error when the connector is
    /// built, not a handshake failure later, and Debug never shows the key.
    #[test]
    fn unusable_material_is_a_config_error() {
        assert!(matches!(
            TlsConfig::new(b"not pem".to_vec()).connector(),
            Err(NetError::Config(_))
        ));
        let mut half = TlsConfig::new(b"x".to_vec());
        half.client_key_pem = Some(b"k".to_vec());
        assert!(matches!(half.connector(), Err(NetError::Config(_))));
        let shown = format!("{:?}", half);
        assert!(
            shown.contains("<redacted>") && !shown.contains("\"k\""),
            "{shown}"
        );
    }
}
