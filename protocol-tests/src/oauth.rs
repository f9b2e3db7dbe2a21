//! Tokens for the fixture's OAUTHBEARER listeners, which validate with Kafka's unsecured JWS validator
//! (no signature; see `kafka_fixture`'s security module).

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use snapfence::net::OAuthBearerToken;

/// Base64url without padding (RFC 4648 section 5), as JWTs encode their parts.
pub fn base64url(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let n = chunk
            .iter()
            .enumerate()
            .fold(0u32, |n, (i, b)| n | u32::from(*b) << (16 - 8 * i));
        for i in 0..=chunk.len() {
            out.push(char::from(ALPHABET[(n >> (18 - 6 * i) & 63) as usize]));
        }
    }
    out
}

/// An unsecured JWT for principal `User:<sub>`, issued now and valid for `lifetime` (its `exp` in whole
/// seconds, as the validator reads it; the token's `expires_at` is the same instant).
pub fn unsecured_token(sub: &str, lifetime: Duration) -> OAuthBearerToken {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("after 1970")
        .as_secs();
    let exp = now + lifetime.as_secs();
    OAuthBearerToken::new(
        unsecured_jwt(sub, now, exp),
        UNIX_EPOCH + Duration::from_secs(exp),
    )
}

/// The unsecured JWT for `sub` issued at `iat` and expiring at `exp` (seconds since the epoch):
/// `base64url({"alg":"none"})`, `.`, the claims, `.`, no signature.
pub fn unsecured_jwt(sub: &str, iat: u64, exp: u64) -> String {
    let header = base64url(br#"{"alg":"none"}"#);
    let claims = base64url(format!(r#"{{"sub":"{sub}","iat":{iat},"exp":{exp}}}"#).as_bytes());
    format!("{header}.{claims}.")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// RFC 4648's test vectors, in the URL alphabet without padding.
    #[test]
    fn base64url_matches_the_rfc_vectors() {
        let cases = [
            ("", ""),
            ("f", "Zg"),
            ("fo", "Zm8"),
            ("foo", "Zm9v"),
            ("foob", "Zm9vYg"),
            ("fooba", "Zm9vYmE"),
            ("foobar", "Zm9vYmFy"),
        ];
        for (plain, encoded) in cases {
            assert_eq!(base64url(plain.as_bytes()), encoded, "{plain:?}");
        }
        assert_eq!(base64url(&[0xfb, 0xff]), "-_8");
    }
}
