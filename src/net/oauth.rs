//! SASL/OAUTHBEARER (RFC 7628, KIP-255): the token an application's provider hands out, the cache that
//! shares it between connections and asks for a new one before it runs out, and the client's messages.
//! No I/O happens here except the provider's own call; the round trips are `authenticate` in
//! `broker.rs`, as for PLAIN and SCRAM.
//!
//! The exchange, as Kafka's broker runs it:
//! 1. The client sends `n,,` `0x01` `auth=Bearer <token>` `0x01`, then each SASL extension (KIP-342) as
//!    `key=value` `0x01`, then a final `0x01`.
//! 2. The broker answers with nothing when it accepts the token. When it refuses, it answers with an
//!    error challenge (a JSON object: `status`, maybe `scope` and `openid-configuration`, RFC 7628
//!    section 3.2.2) and no error code; the client must then send a lone `0x01`, and the broker ends the
//!    exchange with SASL_AUTHENTICATION_FAILED. The refusal is reported with the challenge
//!    ([`AuthFailure::TokenRefused`]).
//!
//! What is refused on the client, before anything is sent: an extension named `auth` (reserved for the
//! token), an extension key that is not letters only, a value outside RFC 7628's characters, and a
//! token that is not an RFC 6750 `b64token` (so that no byte of it can end the message early).
//!
//! # When a new token is asked for
//! The provider is called for the first connection, and again once the cached token has lived
//! [`OAuthBearer::refresh_after`] of its lifetime (70% by default, before a session bounded by the
//! token is renewed at 75% of it): every connection opened or
//! re-authenticated after that gets the new one. The broker bounds a session by the token's remaining
//! lifetime (KIP-368) and the client retires or re-authenticates a connection before its session ends
//! (`broker.rs`), so a connection never carries requests on an expired token. A token the broker refused
//! is forgotten, so the next login asks the provider again.
//!
//! # References
//! - RFC 7628 (OAUTHBEARER), RFC 6750 section 2.1 (`b64token`), KIP-255 (OAUTHBEARER in Kafka), KIP-342
//!   (SASL extensions), KIP-368 (session lifetime and re-authentication)

use std::collections::BTreeMap;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use super::sasl::{AuthFailure, TokenRefusal};

/// What a token provider fails with: any error, reported in [`NetError::TokenProvider`](super::NetError::TokenProvider).
pub type TokenError = Box<dyn std::error::Error + Send + Sync>;

/// The future a [`TokenProvider`] returns.
pub type TokenFuture<'a> =
    Pin<Box<dyn Future<Output = Result<OAuthBearerToken, TokenError>> + Send + 'a>>;

/// A bearer token and what goes with it. `Debug` never shows the token.
#[derive(Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct OAuthBearerToken {
    /// The token as the issuer made it (usually a JWT), sent as `auth=Bearer <value>`.
    pub value: String,
    /// When it stops being valid; the client asks for a new one before then.
    pub expires_at: SystemTime,
    /// SASL extensions (KIP-342) sent with it, e.g. `logicalCluster` and `identityPoolId` on Confluent
    /// Cloud. Keys are letters only; `auth` is reserved.
    pub extensions: BTreeMap<String, String>,
}

impl OAuthBearerToken {
    /// A token valid until `expires_at`, without extensions.
    pub fn new(value: impl Into<String>, expires_at: SystemTime) -> Self {
        OAuthBearerToken {
            value: value.into(),
            expires_at,
            extensions: BTreeMap::new(),
        }
    }

    /// The token with one more SASL extension.
    pub fn with_extension(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.extensions.insert(key.into(), value.into());
        self
    }
}

impl fmt::Debug for OAuthBearerToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OAuthBearerToken")
            .field("value", &"<redacted>")
            .field("expires_at", &self.expires_at)
            .field("extensions", &self.extensions)
            .finish()
    }
}

/// Where OAUTHBEARER tokens come from: the application's login to its identity provider. Called for
/// the first login and whenever the cached token is due for refresh (see [`OAuthBearer`]); calls are
/// never concurrent for one [`OAuthBearer`].
///
/// A closure `Fn() -> impl Future<Output = Result<OAuthBearerToken, TokenError>>` is a provider.
pub trait TokenProvider: Send + Sync + 'static {
    /// A token, freshly obtained.
    fn token(&self) -> TokenFuture<'_>;
}

impl<F, Fut> TokenProvider for F
where
    F: Fn() -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<OAuthBearerToken, TokenError>> + Send + 'static,
{
    fn token(&self) -> TokenFuture<'_> {
        Box::pin(self())
    }
}

/// The OAUTHBEARER settings of [`SaslConfig::oauthbearer`](super::SaslConfig::oauthbearer): the
/// application's [`TokenProvider`] and the token it last handed out, shared by every connection of
/// every client configured with a clone of it.
#[derive(Clone)]
pub struct OAuthBearer {
    inner: Arc<Inner>,
}

struct Inner {
    provider: Arc<dyn TokenProvider>,
    refresh_after: f64,
    /// Held across the provider's call: connections opened together wait for one token.
    cached: tokio::sync::Mutex<Option<Cached>>,
}

struct Cached {
    token: OAuthBearerToken,
    /// When the provider handed it out, and when it is due for refresh.
    refresh_at: Instant,
}

impl OAuthBearer {
    /// Tokens from `provider`, asked for again after 70% of each one's lifetime.
    pub fn new(provider: impl TokenProvider) -> Self {
        Self::with_refresh(Arc::new(provider), 0.7)
    }

    /// Tokens from `provider`, asked for again once `fraction` (clamped to 0.5..=0.95) of each one's
    /// lifetime has passed.
    pub fn refresh_after(provider: impl TokenProvider, fraction: f64) -> Self {
        Self::with_refresh(Arc::new(provider), fraction)
    }

    fn with_refresh(provider: Arc<dyn TokenProvider>, fraction: f64) -> Self {
        let fraction = if fraction.is_nan() {
            0.7
        } else {
            fraction.clamp(0.5, 0.95)
        };
        OAuthBearer {
            inner: Arc::new(Inner {
                provider,
                refresh_after: fraction,
                cached: tokio::sync::Mutex::new(None),
            }),
        }
    }

    /// The token for a login now: the cached one while it is not due for refresh, else a new one from
    /// the provider (checked, then cached).
    ///
    /// Cancel-safe: dropped while the provider runs, nothing is cached and the next call asks again.
    pub(crate) async fn token(&self) -> Result<OAuthBearerToken, TokenFailure> {
        let mut cached = self.inner.cached.lock().await;
        if let Some(c) = cached.as_ref() {
            if Instant::now() < c.refresh_at {
                return Ok(c.token.clone());
            }
        }
        let asked = Instant::now();
        let token = self
            .inner
            .provider
            .token()
            .await
            .map_err(|e| TokenFailure::Provider(e.to_string()))?;
        check_token(&token).map_err(TokenFailure::Refused)?;
        let lifetime = token
            .expires_at
            .duration_since(SystemTime::now())
            .unwrap_or(Duration::ZERO);
        *cached = Some(Cached {
            token: token.clone(),
            refresh_at: asked + lifetime.mul_f64(self.inner.refresh_after),
        });
        Ok(token)
    }

    /// Tokens read from the file at `path` (one token; surrounding white space ignored), read again each
    /// time the cached one is due, so a file another program keeps fresh (a Kubernetes projected
    /// service-account token, an agent's output) is followed. A JWT's expiry is its `exp` claim; a
    /// token without one (or not a JWT) counts as valid for one minute, so the file is read again
    /// soon.
    pub fn token_file(path: impl Into<std::path::PathBuf>) -> Self {
        let path: Arc<std::path::Path> = Arc::from(path.into().as_path());
        Self::new(move || {
            let path = Arc::clone(&path);
            async move {
                let read = Arc::clone(&path);
                let text = tokio::task::spawn_blocking(move || std::fs::read_to_string(&*read))
                    .await
                    .map_err(|e| format!("reading the token file {}: {e}", path.display()))?
                    .map_err(|e| format!("reading the token file {}: {e}", path.display()))?;
                let value = text.trim().to_owned();
                let expires_at = jwt_expiry(&value)
                    .unwrap_or_else(|| SystemTime::now() + Duration::from_secs(60));
                Ok::<_, TokenError>(OAuthBearerToken::new(value, expires_at))
            }
        })
    }

    /// Forgets the cached token (the broker refused it): the next login asks the provider.
    pub(crate) fn forget(&self) {
        if let Ok(mut cached) = self.inner.cached.try_lock() {
            *cached = None;
        }
    }

    /// Whether two settings share one provider and cache.
    pub(crate) fn same(&self, other: &OAuthBearer) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
    }
}

impl fmt::Debug for OAuthBearer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OAuthBearer")
            .field("refresh_after", &self.inner.refresh_after)
            .finish_non_exhaustive()
    }
}

/// Why no token could be had for a login.
#[derive(Debug)]
pub(crate) enum TokenFailure {
    /// The provider failed (its error's text).
    Provider(String),
    /// The provider's token cannot be sent as it is.
    Refused(AuthFailure),
}

/// Checks what would go into the client's message: the token is an RFC 6750 `b64token`, extension
/// keys are letters only and not `auth`, values are RFC 7628's `value` characters.
pub(crate) fn check_token(token: &OAuthBearerToken) -> Result<(), AuthFailure> {
    let v = token.value.as_bytes();
    let body = v.iter().position(|b| *b == b'=').unwrap_or(v.len());
    let b64 = |b: &u8| b.is_ascii_alphanumeric() || b"-._~+/".contains(b);
    if body == 0 || !v[..body].iter().all(b64) || !v[body..].iter().all(|b| *b == b'=') {
        return Err(AuthFailure::BadToken(
            "the token is not an RFC 6750 b64token (letters, digits, -._~+/ and trailing =)".into(),
        ));
    }
    for (key, value) in &token.extensions {
        if key == "auth" {
            return Err(AuthFailure::BadExtension {
                key: key.clone(),
                reason: "the key `auth` is reserved for the token",
            });
        }
        if key.is_empty() || !key.bytes().all(|b| b.is_ascii_alphabetic()) {
            return Err(AuthFailure::BadExtension {
                key: key.clone(),
                reason: "a key is one or more ASCII letters",
            });
        }
        let allowed = |b: u8| (0x21..=0x7e).contains(&b) || b" \t\r\n".contains(&b);
        if !value.bytes().all(allowed) {
            return Err(AuthFailure::BadExtension {
                key: key.clone(),
                reason: "a value is printable ASCII, space, tab, CR or LF",
            });
        }
    }
    Ok(())
}

/// The separator of RFC 7628's key-value pairs.
const KVSEP: u8 = 0x01;

/// The client's initial response for `token` (checked with [`check_token`] first).
pub(crate) fn initial_response(token: &OAuthBearerToken) -> Result<Vec<u8>, AuthFailure> {
    check_token(token)?;
    let mut out = Vec::with_capacity(token.value.len() + 32);
    out.extend_from_slice(b"n,,");
    out.push(KVSEP);
    out.extend_from_slice(b"auth=Bearer ");
    out.extend_from_slice(token.value.as_bytes());
    out.push(KVSEP);
    for (k, v) in &token.extensions {
        out.extend_from_slice(k.as_bytes());
        out.push(b'=');
        out.extend_from_slice(v.as_bytes());
        out.push(KVSEP);
    }
    out.push(KVSEP);
    Ok(out)
}

/// The client's side of one OAUTHBEARER exchange after its initial response, sans-IO.
#[derive(Debug, Default)]
pub(crate) struct OAuthExchange {
    /// The broker's error challenge, once it sent one (the exchange then only ends in a refusal).
    challenge: Option<String>,
}

impl OAuthExchange {
    /// The broker's answer to the client's last message: `None` when the token was accepted (an empty
    /// answer), or the lone separator the client must send after an error challenge.
    pub(crate) fn step(&mut self, server: &[u8]) -> Result<Option<Vec<u8>>, AuthFailure> {
        if self.challenge.is_some() {
            return Err(AuthFailure::Malformed(
                "the broker went on after its error challenge without refusing the login".into(),
            ));
        }
        if server.is_empty() {
            return Ok(None);
        }
        self.challenge = Some(String::from_utf8_lossy(server).into_owned());
        Ok(Some(vec![KVSEP]))
    }

    /// The refusal to report for the broker's final error: the token refused, with the challenge, when
    /// one came; `None` when the broker refused without one.
    pub(crate) fn refusal(&self, message: &str) -> Option<AuthFailure> {
        let challenge = self.challenge.as_ref()?;
        Some(AuthFailure::TokenRefused(Box::new(TokenRefusal {
            status: json_string_field(challenge, "status"),
            challenge: challenge.clone(),
            message: message.to_owned(),
        })))
    }
}

/// A JWT's `exp` claim (whole seconds since the epoch), read without checking the signature: the
/// client only needs to know when to ask for a new token; the broker validates it. `None` when the
/// token is not a JWT or has no numeric `exp`.
pub(crate) fn jwt_expiry(token: &str) -> Option<SystemTime> {
    use base64::Engine as _;
    let claims = token.split('.').nth(1)?;
    let json = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(claims.trim_end_matches('='))
        .ok()?;
    let json = std::str::from_utf8(&json).ok()?;
    let at = json.find("\"exp\"")? + 5;
    let rest = json[at..].trim_start().strip_prefix(':')?.trim_start();
    let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
    let secs: u64 = digits.parse().ok()?;
    std::time::UNIX_EPOCH.checked_add(Duration::from_secs(secs))
}

/// The string value of a top-level `"field": "..."` in a small JSON object, found without a JSON
/// parser (the challenge is a flat object of strings; escapes other than `\"` are left as they are).
fn json_string_field(json: &str, field: &str) -> Option<String> {
    let key = format!("\"{field}\"");
    let at = json.find(&key)? + key.len();
    let rest = json[at..].trim_start().strip_prefix(':')?.trim_start();
    let rest = rest.strip_prefix('"')?;
    let mut out = String::new();
    let mut chars = rest.chars();
    while let Some(c) = chars.next() {
        match c {
            '"' => return Some(out),
            '\\' => out.push(chars.next()?),
            c => out.push(c),
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn token(value: &str) -> OAuthBearerToken {
        OAuthBearerToken::new(value, SystemTime::now() + Duration::from_secs(3600))
    }

    /// The initial response is RFC 7628's: gs2 header, the token, each extension in key order, and the
    /// closing separator.
    #[test]
    fn the_initial_response_carries_the_token_and_the_extensions() {
        let t = token("eyJhbGciOiJub25lIn0.eyJzdWIiOiJhbGljZSJ9.")
            .with_extension("logicalCluster", "lkc-123")
            .with_extension("identityPoolId", "pool-4");
        let msg = initial_response(&t).unwrap();
        assert_eq!(
            msg,
            b"n,,\x01auth=Bearer eyJhbGciOiJub25lIn0.eyJzdWIiOiJhbGljZSJ9.\x01\
              identityPoolId=pool-4\x01logicalCluster=lkc-123\x01\x01"
                .to_vec()
        );
        let bare = initial_response(&token("abc==")).unwrap();
        assert_eq!(bare, b"n,,\x01auth=Bearer abc==\x01\x01".to_vec());
    }

    /// Nothing that could end the message early or break its grammar is sent: the reserved `auth`
    /// key, keys with other characters than letters, values with control characters, and tokens
    /// outside `b64token` are refused with a typed failure.
    #[test]
    fn what_the_grammar_forbids_is_refused_on_the_client() {
        let reserved = token("abc").with_extension("auth", "x");
        assert!(matches!(
            initial_response(&reserved),
            Err(AuthFailure::BadExtension { ref key, .. }) if key == "auth"
        ));
        for key in ["", "a1", "a b", "a=b", "é"] {
            let t = token("abc").with_extension(key, "v");
            assert!(
                matches!(check_token(&t), Err(AuthFailure::BadExtension { .. })),
                "{key:?}"
            );
        }
        for value in ["a\x01b", "\x00", "é", "a\x7fb"] {
            let t = token("abc").with_extension("k", value);
            assert!(
                matches!(check_token(&t), Err(AuthFailure::BadExtension { .. })),
                "{value:?}"
            );
        }
        assert!(check_token(&token("abc").with_extension("k", "a b\tc\r\n~")).is_ok());
        for bad in ["", "=", "a b", "a\x01b", "ab=c", "a,b", "ä"] {
            assert!(
                matches!(check_token(&token(bad)), Err(AuthFailure::BadToken(_))),
                "{bad:?}"
            );
        }
        assert!(check_token(&token("aZ09-._~+/==")).is_ok());
    }

    /// An empty answer accepts the token. An error challenge is answered with a lone separator, and
    /// the broker's refusal that follows is reported as the token refused, with the challenge's status.
    /// A broker that goes on after its challenge breaks the protocol.
    #[test]
    fn the_error_challenge_is_answered_and_reported() {
        let mut ok = OAuthExchange::default();
        assert_eq!(ok.step(b"").unwrap(), None);
        assert!(ok.refusal("x").is_none());

        let mut refused = OAuthExchange::default();
        let challenge = br#"{"status":"invalid_token","scope":"kafka","openid-configuration":"https://idp/.well-known"}"#;
        assert_eq!(refused.step(challenge).unwrap(), Some(vec![0x01]));
        match refused.refusal("Authentication failed") {
            Some(AuthFailure::TokenRefused(r)) => {
                assert_eq!(r.status.as_deref(), Some("invalid_token"));
                assert!(r.challenge.contains("openid-configuration"));
                assert_eq!(r.message, "Authentication failed");
            }
            other => panic!("{other:?}"),
        }
        assert!(matches!(refused.step(b""), Err(AuthFailure::Malformed(_))));
        assert_eq!(
            json_string_field(r#"{ "status" : "in\"valid" }"#, "status").as_deref(),
            Some("in\"valid")
        );
        assert_eq!(json_string_field(r#"{"status":1}"#, "status"), None);
        assert_eq!(json_string_field(r#"{"status":"open"#, "status"), None);
    }

    /// One provider call serves every login until the token is due for refresh; a forgotten token is
    /// asked for again; a provider's failure and a token that cannot be sent are told apart.
    #[tokio::test]
    async fn the_cache_asks_the_provider_once_per_token() {
        use std::sync::atomic::{AtomicU32, Ordering};
        let calls = Arc::new(AtomicU32::new(0));
        let counted = calls.clone();
        let oauth = OAuthBearer::new(move || {
            let n = counted.fetch_add(1, Ordering::SeqCst);
            async move { Ok(token(&format!("t{n}"))) }
        });
        assert_eq!(oauth.token().await.unwrap().value, "t0");
        assert_eq!(oauth.token().await.unwrap().value, "t0");
        assert_eq!(calls.load(Ordering::SeqCst), 1);
        oauth.forget();
        assert_eq!(oauth.token().await.unwrap().value, "t1");

        // A token already past its refresh point is used once and asked for again next time.
        let short =
            OAuthBearer::new(|| async { Ok(OAuthBearerToken::new("s", SystemTime::now())) });
        short.token().await.unwrap();
        assert!(Instant::now() >= short.inner.cached.lock().await.as_ref().unwrap().refresh_at);

        let failing =
            OAuthBearer::new(|| async { Err::<OAuthBearerToken, TokenError>("idp down".into()) });
        assert!(matches!(failing.token().await, Err(TokenFailure::Provider(m)) if m == "idp down"));
        let bad = OAuthBearer::new(|| async { Ok(token("a b")) });
        assert!(matches!(
            bad.token().await,
            Err(TokenFailure::Refused(AuthFailure::BadToken(_)))
        ));
        assert!(format!("{:?}", token("secret")).contains("redacted"));

        // A token file, read again once its token is due: its JWT's `exp` decides when.
        let dir = std::env::temp_dir().join(format!("snapfence-oauth-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("token");
        // {"alg":"none"} . {"sub":"a","exp":4102444800} (2100-01-01) .
        let jwt = "eyJhbGciOiJub25lIn0.eyJzdWIiOiJhIiwiZXhwIjo0MTAyNDQ0ODAwfQ.";
        std::fs::write(&path, format!("  {jwt}\n")).unwrap();
        let file = OAuthBearer::token_file(&path);
        let t = file.token().await.unwrap();
        assert_eq!(t.value, jwt);
        assert_eq!(
            t.expires_at,
            std::time::UNIX_EPOCH + Duration::from_secs(4_102_444_800)
        );
        std::fs::remove_file(&path).unwrap();
        assert_eq!(file.token().await.unwrap().value, jwt, "cached until due");
        file.forget();
        assert!(
            matches!(file.token().await, Err(TokenFailure::Provider(m)) if m.contains("token file")),
            "a missing file is the provider failing"
        );
        std::fs::remove_dir_all(&dir).unwrap();
        assert_eq!(jwt_expiry("opaque-token"), None);
        assert_eq!(jwt_expiry("a.eyJzdWIiOiJhIn0.b"), None, "no exp claim");
        assert!(!format!("{:?}", token("secret")).contains("secret"));
    }
}
