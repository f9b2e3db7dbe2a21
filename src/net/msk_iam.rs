//! AWS MSK IAM access control over SASL/OAUTHBEARER (the `aws-msk-iam` feature): the token MSK accepts
//! is a SigV4-presigned URL, built here as AWS's own signer libraries build it, from RustCrypto's
//! `hmac` and `sha2` (already in the tree for SCRAM; no C).
//!
//! The token, step by step:
//! 1. The request `GET https://kafka.<region>.amazonaws.com/?Action=kafka-cluster%3AConnect`.
//! 2. SigV4 query signing (presigning) for service `kafka-cluster` in `<region>`: the query gains
//!    `X-Amz-Algorithm=AWS4-HMAC-SHA256`, `X-Amz-Credential=<key id>/<date>/<region>/kafka-cluster/aws4_request`,
//!    `X-Amz-Date`, `X-Amz-Expires=900`, `X-Amz-SignedHeaders=host` and, with temporary credentials,
//!    `X-Amz-Security-Token`; the canonical request signs the `host` header only, with the SHA-256 of
//!    the empty body as the payload hash, and the signature is appended as `X-Amz-Signature`.
//! 3. `User-Agent=<agent>` is appended after signing (it is not signed).
//! 4. The whole URL, base64url without padding, is the bearer token; it is valid for 900 s from its
//!    signing time.
//!
//! The evidence that these bytes are right is a comparison, not a broker: no local Kafka validates MSK
//! tokens. The unit tests reproduce byte for byte what `aws-msk-iam-sasl-signer-python` 1.0.2 (on
//! botocore 1.44.18) produces for the same credentials, region, time and user agent, with and without a
//! session token; `scripts/msk-iam-vectors.py` regenerates them with AWS's library.
//!
//! Credentials come from the environment (`AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`,
//! `AWS_SESSION_TOKEN`) or from an [`AwsCredentialsProvider`] the application passes (for profiles,
//! web identity, container and instance credentials, use the application's own AWS SDK as that
//! provider; docs/security.md lists what is supported).
//!
//! # References
//! - AWS Signature Version 4, "Authenticating requests: using query parameters"
//! - `aws-msk-iam-auth` (Java) and `aws-msk-iam-sasl-signer-*`: the token format MSK accepts

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use hmac::{Hmac, Mac};
use sha2::{Digest, Sha256};

use super::oauth::{OAuthBearer, OAuthBearerToken, TokenError};
use super::NetError;

/// How long an MSK token is valid, from its signing time (`X-Amz-Expires`).
pub const TOKEN_LIFETIME: Duration = Duration::from_secs(900);

const SERVICE: &str = "kafka-cluster";

/// AWS credentials. `Debug` shows the access key id only.
#[derive(Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct AwsCredentials {
    /// The access key id (`AKIA...` long-term, `ASIA...` temporary).
    pub access_key_id: String,
    /// The secret access key.
    pub secret_access_key: String,
    /// The session token of temporary credentials.
    pub session_token: Option<String>,
}

impl AwsCredentials {
    /// Long-term credentials.
    pub fn new(access_key_id: impl Into<String>, secret_access_key: impl Into<String>) -> Self {
        AwsCredentials {
            access_key_id: access_key_id.into(),
            secret_access_key: secret_access_key.into(),
            session_token: None,
        }
    }

    /// Temporary credentials: these with their session token.
    pub fn with_session_token(mut self, token: impl Into<String>) -> Self {
        self.session_token = Some(token.into());
        self
    }

    /// `AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY` and, if set, `AWS_SESSION_TOKEN`.
    pub fn from_env() -> Result<Self, TokenError> {
        let var = |name: &str| std::env::var(name).ok().filter(|v| !v.is_empty());
        let (Some(id), Some(secret)) = (var("AWS_ACCESS_KEY_ID"), var("AWS_SECRET_ACCESS_KEY"))
        else {
            return Err(
                "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY must be set for MSK IAM \
                 (or pass an AwsCredentialsProvider)"
                    .into(),
            );
        };
        let mut creds = AwsCredentials::new(id, secret);
        creds.session_token = var("AWS_SESSION_TOKEN");
        Ok(creds)
    }
}

impl fmt::Debug for AwsCredentials {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AwsCredentials")
            .field("access_key_id", &self.access_key_id)
            .field("secret_access_key", &"<redacted>")
            .field(
                "session_token",
                &self.session_token.as_ref().map(|_| "<redacted>"),
            )
            .finish()
    }
}

/// The future an [`AwsCredentialsProvider`] returns.
pub type CredentialsFuture<'a> =
    Pin<Box<dyn Future<Output = Result<AwsCredentials, TokenError>> + Send + 'a>>;

/// Where MSK IAM's credentials come from, asked each time a new token is signed (every 70% of 900 s,
/// and after a refusal). A closure `Fn() -> impl Future<Output = Result<AwsCredentials, TokenError>>`
/// is one.
pub trait AwsCredentialsProvider: Send + Sync + 'static {
    /// Credentials, current now.
    fn credentials(&self) -> CredentialsFuture<'_>;
}

impl<F, Fut> AwsCredentialsProvider for F
where
    F: Fn() -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<AwsCredentials, TokenError>> + Send + 'static,
{
    fn credentials(&self) -> CredentialsFuture<'_> {
        Box::pin(self())
    }
}

impl OAuthBearer {
    /// MSK IAM: tokens signed for `region` with credentials from `credentials`, through
    /// [`SaslConfig::oauthbearer`](super::SaslConfig::oauthbearer). A region that is not an AWS region
    /// name (`[a-z0-9-]+`) is refused with [`NetError::Config`].
    pub fn aws_msk_iam(
        region: impl Into<String>,
        credentials: impl AwsCredentialsProvider,
    ) -> Result<OAuthBearer, NetError> {
        let region: Arc<str> = Arc::from(region.into());
        let valid = !region.is_empty()
            && region
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-');
        if !valid {
            return Err(NetError::Config(format!(
                "MSK IAM needs an AWS region name like us-east-1, not {region:?}"
            )));
        }
        let credentials: Arc<dyn AwsCredentialsProvider> = Arc::new(credentials);
        Ok(OAuthBearer::new(move || {
            let (region, credentials) = (Arc::clone(&region), Arc::clone(&credentials));
            async move {
                let creds = credentials.credentials().await?;
                Ok(msk_iam_token(
                    &creds,
                    &region,
                    SystemTime::now(),
                    &user_agent(),
                ))
            }
        }))
    }

    /// [`aws_msk_iam`](Self::aws_msk_iam) with the credentials of the environment
    /// ([`AwsCredentials::from_env`]), read again for each token.
    pub fn aws_msk_iam_from_env(region: impl Into<String>) -> Result<OAuthBearer, NetError> {
        Self::aws_msk_iam(region, || async { AwsCredentials::from_env() })
    }
}

/// `snapfence/<version>`, the `User-Agent` parameter of the tokens this crate signs.
pub fn user_agent() -> String {
    format!("snapfence/{}", env!("CARGO_PKG_VERSION"))
}

/// The MSK IAM token for `credentials` in `region`, signed at `at` (whole seconds count), with
/// `user_agent` appended after signing. Valid for [`TOKEN_LIFETIME`] from `at`.
pub fn msk_iam_token(
    credentials: &AwsCredentials,
    region: &str,
    at: SystemTime,
    user_agent: &str,
) -> OAuthBearerToken {
    use base64::Engine as _;
    let secs = at.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
    let (date, stamp) = amz_date(secs);
    let host = format!("kafka.{region}.amazonaws.com");
    let scope = format!("{date}/{region}/{SERVICE}/aws4_request");
    // Every parameter but the signature, sorted by name: the canonical query string.
    let mut params: Vec<(&str, String)> = vec![
        ("Action", "kafka-cluster:Connect".into()),
        ("X-Amz-Algorithm", "AWS4-HMAC-SHA256".into()),
        (
            "X-Amz-Credential",
            format!("{}/{scope}", credentials.access_key_id),
        ),
        ("X-Amz-Date", stamp.clone()),
        ("X-Amz-Expires", TOKEN_LIFETIME.as_secs().to_string()),
        ("X-Amz-SignedHeaders", "host".into()),
    ];
    if let Some(token) = &credentials.session_token {
        params.push(("X-Amz-Security-Token", token.clone()));
    }
    let mut sorted = params.clone();
    sorted.sort_by(|a, b| a.0.cmp(b.0));
    let canonical_query = query(&sorted);
    // The payload hash is that of the empty body (botocore signs a GET's empty payload, not
    // `UNSIGNED-PAYLOAD`, outside S3).
    let canonical_request = format!(
        "GET\n/\n{canonical_query}\nhost:{host}\n\nhost\n{}",
        hex(&Sha256::digest(b""))
    );
    let string_to_sign = format!(
        "AWS4-HMAC-SHA256\n{stamp}\n{scope}\n{}",
        hex(&Sha256::digest(canonical_request.as_bytes()))
    );
    let key = [date.as_str(), region, SERVICE, "aws4_request"]
        .iter()
        .fold(
            format!("AWS4{}", credentials.secret_access_key).into_bytes(),
            |key, part| hmac(&key, part.as_bytes()),
        );
    let signature = hex(&hmac(&key, string_to_sign.as_bytes()));
    // The URL as AWS's signers write it: the operation's parameter, then the signing parameters in
    // the order they add them, the signature, and the user agent.
    let url = format!(
        "https://{host}/?{}&X-Amz-Signature={signature}&{}",
        query(&params),
        query(&[("User-Agent", user_agent.to_owned())])
    );
    OAuthBearerToken::new(
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(url),
        UNIX_EPOCH + Duration::from_secs(secs) + TOKEN_LIFETIME,
    )
}

fn hmac(key: &[u8], data: &[u8]) -> Vec<u8> {
    let mut mac =
        <Hmac<Sha256> as Mac>::new_from_slice(key).expect("HMAC accepts keys of any length");
    mac.update(data);
    mac.finalize().into_bytes().to_vec()
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// `name=value&...`, each part encoded as SigV4 says: unreserved characters (`A-Za-z0-9-_.~`) as they
/// are, every other byte `%XX` in upper case.
fn query(params: &[(&str, String)]) -> String {
    params
        .iter()
        .map(|(k, v)| format!("{}={}", encode(k), encode(v)))
        .collect::<Vec<_>>()
        .join("&")
}

fn encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// `(YYYYMMDD, YYYYMMDDTHHMMSSZ)` of `secs` since the epoch, UTC.
fn amz_date(secs: u64) -> (String, String) {
    let days = i64::try_from(secs / 86_400).unwrap_or(i64::MAX);
    let rem = secs % 86_400;
    // Days since 1970-01-01 to a civil date (the era-based conversion).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    let date = format!("{y:04}{m:02}{d:02}");
    let stamp = format!(
        "{date}T{:02}{:02}{:02}Z",
        rem / 3600,
        rem / 60 % 60,
        rem % 60
    );
    (date, stamp)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// 2026-12-05T10:00:00Z.
    const AT: u64 = 1_796_464_800;
    const SECRET: &str = "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY";
    const PYTHON_AGENT: &str = "aws-msk-iam-sasl-signer-python/1.0.2";

    /// What `aws-msk-iam-sasl-signer-python` 1.0.2 (botocore 1.44.18) returns for long-term
    /// credentials in us-east-1 at 2026-12-05T10:00:00Z (`scripts/msk-iam-vectors.py`).
    const LONG_TERM: &str = "aHR0cHM6Ly9rYWZrYS51cy1lYXN0LTEuYW1hem9uYXdzLmNvbS8_QWN0aW9uPWthZmthLWNsdXN0ZXIlM0FDb25uZWN0JlgtQW16LUFsZ29yaXRobT1BV1M0LUhNQUMtU0hBMjU2JlgtQW16LUNyZWRlbnRpYWw9QUtJREVYQU1QTEUlMkYyMDI2MTIwNSUyRnVzLWVhc3QtMSUyRmthZmthLWNsdXN0ZXIlMkZhd3M0X3JlcXVlc3QmWC1BbXotRGF0ZT0yMDI2MTIwNVQxMDAwMDBaJlgtQW16LUV4cGlyZXM9OTAwJlgtQW16LVNpZ25lZEhlYWRlcnM9aG9zdCZYLUFtei1TaWduYXR1cmU9NmM1Mzk1MzFhYmI4MTY5Zjc2Nzk3NDU2YWE4ZWMyMDJmYjNkMDE3ODFlYWE4MTJlYmMwZWQwN2U1ZjIzMGVhMyZVc2VyLUFnZW50PWF3cy1tc2staWFtLXNhc2wtc2lnbmVyLXB5dGhvbiUyRjEuMC4y";

    /// The same with temporary credentials (a session token with `/`, `+` and `=`) in eu-west-2.
    const TEMPORARY: &str = "aHR0cHM6Ly9rYWZrYS5ldS13ZXN0LTIuYW1hem9uYXdzLmNvbS8_QWN0aW9uPWthZmthLWNsdXN0ZXIlM0FDb25uZWN0JlgtQW16LUFsZ29yaXRobT1BV1M0LUhNQUMtU0hBMjU2JlgtQW16LUNyZWRlbnRpYWw9QVNJQUVYQU1QTEUlMkYyMDI2MTIwNSUyRmV1LXdlc3QtMiUyRmthZmthLWNsdXN0ZXIlMkZhd3M0X3JlcXVlc3QmWC1BbXotRGF0ZT0yMDI2MTIwNVQxMDAwMDBaJlgtQW16LUV4cGlyZXM9OTAwJlgtQW16LVNpZ25lZEhlYWRlcnM9aG9zdCZYLUFtei1TZWN1cml0eS1Ub2tlbj1Gd29HWlhJdllYZHpFWEFNUExFJTJGJTJGdG9rZW4lMkJ3aXRoJTJGc3BlY2lhbCUzRGNoYXJzJlgtQW16LVNpZ25hdHVyZT00ZjM4Yjg2NDMyZmM4M2I4NmVlNTAzMjljYTg0OWJjZTFjYjRmNmUwNzM1NWU0NzA1ZGUzYzc0YTgwM2MyZGU0JlVzZXItQWdlbnQ9YXdzLW1zay1pYW0tc2FzbC1zaWduZXItcHl0aG9uJTJGMS4wLjI";

    /// Byte for byte what AWS's published signer makes, with and without a session token; the token
    /// expires 900 s after its signing time, as the signer reports.
    #[test]
    fn tokens_match_aws_published_signer_byte_for_byte() {
        let at = UNIX_EPOCH + Duration::from_secs(AT);
        let long = msk_iam_token(
            &AwsCredentials::new("AKIDEXAMPLE", SECRET),
            "us-east-1",
            at,
            PYTHON_AGENT,
        );
        assert_eq!(long.value, LONG_TERM);
        assert_eq!(
            long.expires_at,
            UNIX_EPOCH + Duration::from_millis(1_796_465_700_000)
        );
        let temporary = msk_iam_token(
            &AwsCredentials::new("ASIAEXAMPLE", SECRET)
                .with_session_token("FwoGZXIvYXdzEXAMPLE//token+with/special=chars"),
            "eu-west-2",
            at,
            PYTHON_AGENT,
        );
        assert_eq!(temporary.value, TEMPORARY);
        // A fraction of a second does not change the signing time.
        let later = msk_iam_token(
            &AwsCredentials::new("AKIDEXAMPLE", SECRET),
            "us-east-1",
            at + Duration::from_millis(999),
            PYTHON_AGENT,
        );
        assert_eq!(later.value, LONG_TERM);
        // The token passes the OAUTHBEARER checks (a b64token).
        assert!(crate::net::oauth::check_token(&long).is_ok());
    }

    /// Dates across month, year and leap-day boundaries.
    #[test]
    fn amz_dates_are_utc_civil_dates() {
        assert_eq!(amz_date(0).1, "19700101T000000Z");
        assert_eq!(amz_date(AT).1, "20261205T100000Z");
        assert_eq!(amz_date(951_782_400).1, "20000229T000000Z");
        assert_eq!(amz_date(1_709_251_199).1, "20240229T235959Z");
        assert_eq!(amz_date(1_735_689_600).0, "20250101");
    }

    /// A region that is not an AWS region name is refused; credentials never show in `Debug`; the
    /// environment's credentials are required.
    #[test]
    fn the_region_is_checked_and_secrets_are_hidden() {
        let creds = || async { Ok(AwsCredentials::new("a", "b")) };
        assert!(OAuthBearer::aws_msk_iam("us-east-1", creds).is_ok());
        for bad in ["", "US-EAST-1", "us east", "us-east-1/x"] {
            assert!(
                matches!(
                    OAuthBearer::aws_msk_iam(bad, creds),
                    Err(NetError::Config(_))
                ),
                "{bad:?}"
            );
        }
        let shown = format!(
            "{:?}",
            AwsCredentials::new("AKID", "s3cret").with_session_token("t0ken")
        );
        assert!(shown.contains("AKID") && !shown.contains("s3cret") && !shown.contains("t0ken"));
        assert_eq!(encode("a-b_c.d~e/f+g=h:i"), "a-b_c.d~e%2Ff%2Bg%3Dh%3Ai");
    }

    /// Signed through the OAUTHBEARER cache: the provider's credentials sign a token for the region
    /// that expires 900 s after it was made.
    #[tokio::test]
    async fn the_provider_signs_for_its_region() {
        use base64::Engine as _;
        let oauth = OAuthBearer::aws_msk_iam("ap-southeast-2", || async {
            Ok(AwsCredentials::new("AKIDEXAMPLE", SECRET))
        })
        .unwrap();
        let before = SystemTime::now();
        let token = oauth.token().await.unwrap();
        let url = base64::engine::general_purpose::URL_SAFE_NO_PAD
            .decode(&token.value)
            .unwrap();
        let url = String::from_utf8(url).unwrap();
        assert!(
            url.starts_with(
                "https://kafka.ap-southeast-2.amazonaws.com/?Action=kafka-cluster%3AConnect&"
            ),
            "{url}"
        );
        assert!(url.ends_with(&format!("&User-Agent={}", encode(&user_agent()))));
        let lifetime = token.expires_at.duration_since(before).unwrap();
        assert!(lifetime <= TOKEN_LIFETIME && lifetime > TOKEN_LIFETIME - Duration::from_secs(2));
    }
}
