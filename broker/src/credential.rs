//! Per-run credentials (`spec/grants.md` §1.4): a static bearer, or an HS256 JWT bound to
//! the calling principal, minted once when the run opens.

use std::fmt;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use jsonwebtoken::{Algorithm, EncodingKey, Header};
use rand::RngCore;
use serde::Serialize;

use crate::grants::{TokenSpec, is_token_text};

/// Slack added to the run's remaining budget for a JWT's lifetime.
pub const LIFETIME_SLACK: Duration = Duration::from_secs(5);

/// Why a credential could not be made. Messages never contain a secret or a token.
#[derive(Debug, thiserror::Error)]
pub enum CredentialError {
    /// The principal cannot be a JWT subject.
    #[error("the caller's principal cannot be a token subject ({0})")]
    Subject(&'static str),
    /// Signing failed.
    #[error("the token could not be signed")]
    Sign,
    /// The minted token failed its own checks.
    #[error("the minted token is invalid ({0})")]
    Invalid(&'static str),
}

/// The bearer a run's forwarded calls carry. Its `Debug` never shows the value.
#[derive(Clone, PartialEq, Eq)]
pub struct Credential(String);

impl Credential {
    /// The `Authorization` header value.
    pub fn header_value(&self) -> String {
        format!("Bearer {}", self.0)
    }
}

impl fmt::Debug for Credential {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Credential(<redacted>)")
    }
}

#[derive(Serialize)]
struct Claims<'a> {
    sub: &'a str,
    aud: &'a str,
    iat: u64,
    nbf: u64,
    exp: u64,
    jti: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    iss: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    scope: Option<String>,
}

/// Makes the credential for one run of `principal`, whose deadline is `budget` away.
/// `None` when the profile has no token.
pub fn mint(
    spec: &TokenSpec,
    principal: &str,
    scopes: &[String],
    budget: Duration,
    now: SystemTime,
) -> Result<Option<Credential>, CredentialError> {
    let (secret, audience, ttl_sec, issuer, key_id) = match spec {
        TokenSpec::None => return Ok(None),
        TokenSpec::Static { bearer } => return checked(bearer.clone()).map(Some),
        TokenSpec::Jwt {
            secret,
            audience,
            ttl_sec,
            issuer,
            key_id,
        } => (secret, audience, *ttl_sec, issuer, key_id),
    };
    check_subject(principal)?;
    let now = now
        .duration_since(UNIX_EPOCH)
        .map_err(|_| CredentialError::Invalid("clock before 1970"))?
        .as_secs();
    let lifetime = ttl_sec.min((budget + LIFETIME_SLACK).as_secs());
    if lifetime == 0 {
        return Err(CredentialError::Invalid("already expired"));
    }
    let mut jti = [0u8; 16];
    rand::rng().fill_bytes(&mut jti);
    let claims = Claims {
        sub: principal,
        aud: audience,
        iat: now,
        nbf: now,
        exp: now + lifetime,
        jti: hex::encode(jti),
        iss: issuer.as_deref(),
        scope: (!scopes.is_empty()).then(|| scopes.join(" ")),
    };
    let mut header = Header::new(Algorithm::HS256);
    header.kid = key_id.clone();
    let token = jsonwebtoken::encode(&header, &claims, &EncodingKey::from_secret(secret))
        .map_err(|_| CredentialError::Sign)?;
    checked(token).map(Some)
}

/// A JWT subject must be a real principal: not empty, not `*`, no surrounding whitespace,
/// no control characters.
fn check_subject(principal: &str) -> Result<(), CredentialError> {
    if principal.is_empty() {
        return Err(CredentialError::Subject("empty"));
    }
    if principal == "*" {
        return Err(CredentialError::Subject("`*`"));
    }
    if principal.trim() != principal {
        return Err(CredentialError::Subject("surrounding whitespace"));
    }
    if principal.chars().any(char::is_control) {
        return Err(CredentialError::Subject("control characters"));
    }
    Ok(())
}

fn checked(token: String) -> Result<Credential, CredentialError> {
    if is_token_text(&token) {
        Ok(Credential(token))
    } else {
        Err(CredentialError::Invalid("bytes outside 0x21-0x7e"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use jsonwebtoken::{DecodingKey, Validation, decode};
    use serde_json::Value;

    const SECRET: &[u8] = b"0123456789abcdef0123456789abcdef!";

    fn jwt_spec(ttl_sec: u64) -> TokenSpec {
        TokenSpec::Jwt {
            secret: SECRET.to_vec(),
            audience: "inventory".into(),
            ttl_sec,
            issuer: Some("plimsoll".into()),
            key_id: Some("k1".into()),
        }
    }

    fn claims(token: &Credential) -> (Header, Value) {
        let mut validation = Validation::new(Algorithm::HS256);
        validation.set_audience(&["inventory"]);
        let data =
            decode::<Value>(&token.0, &DecodingKey::from_secret(SECRET), &validation).unwrap();
        (data.header, data.claims)
    }

    #[test]
    fn jwt_is_bound_to_the_principal_and_the_run() {
        let scopes = vec!["inv:read".to_owned(), "inv:write".to_owned()];
        let token = mint(
            &jwt_spec(60),
            "alice",
            &scopes,
            Duration::from_secs(10),
            SystemTime::now(),
        )
        .unwrap()
        .unwrap();
        let (header, c) = claims(&token);
        assert_eq!(header.kid.as_deref(), Some("k1"));
        assert_eq!(c["sub"], "alice");
        assert_eq!(c["aud"], "inventory");
        assert_eq!(c["iss"], "plimsoll");
        assert_eq!(c["scope"], "inv:read inv:write");
        assert_eq!(c["iat"], c["nbf"]);
        let life = c["exp"].as_u64().unwrap() - c["iat"].as_u64().unwrap();
        assert_eq!(life, 15, "min(ttl 60, budget 10 + 5)");
        assert_eq!(c["jti"].as_str().unwrap().len(), 32);
    }

    #[test]
    fn ttl_bounds_the_lifetime_and_scope_is_absent_without_scopes() {
        let token = mint(
            &jwt_spec(7),
            "bob",
            &[],
            Duration::from_secs(100),
            SystemTime::now(),
        )
        .unwrap()
        .unwrap();
        let (_, c) = claims(&token);
        assert_eq!(c["exp"].as_u64().unwrap() - c["iat"].as_u64().unwrap(), 7);
        assert!(c.get("scope").is_none());
    }

    #[test]
    fn jti_differs_per_mint() {
        let a = mint(
            &jwt_spec(60),
            "a",
            &[],
            Duration::from_secs(5),
            SystemTime::now(),
        )
        .unwrap();
        let b = mint(
            &jwt_spec(60),
            "a",
            &[],
            Duration::from_secs(5),
            SystemTime::now(),
        )
        .unwrap();
        assert_ne!(claims(&a.unwrap()).1["jti"], claims(&b.unwrap()).1["jti"]);
    }

    #[test]
    fn unclean_subjects_are_refused() {
        for bad in ["", "*", " alice", "alice\n", "al\u{7}ice"] {
            let err = mint(
                &jwt_spec(60),
                bad,
                &[],
                Duration::from_secs(5),
                SystemTime::now(),
            );
            assert!(matches!(err, Err(CredentialError::Subject(_))), "{bad:?}");
        }
    }

    #[test]
    fn static_and_none() {
        let spec = TokenSpec::Static {
            bearer: "tok-123".into(),
        };
        let c = mint(&spec, "", &[], Duration::ZERO, SystemTime::now())
            .unwrap()
            .unwrap();
        assert_eq!(c.header_value(), "Bearer tok-123");
        assert_eq!(format!("{c:?}"), "Credential(<redacted>)");
        assert!(
            mint(
                &TokenSpec::None,
                "x",
                &[],
                Duration::ZERO,
                SystemTime::now()
            )
            .unwrap()
            .is_none()
        );
    }
}
