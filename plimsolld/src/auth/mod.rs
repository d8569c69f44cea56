//! Caller credentials, checked before any body byte is read (wire.md §2).
//!
//! The verifier is chosen once at startup, first match wins: the clients
//! file, the shared token, or open dev mode. Tokens are never logged; failed
//! attempts are only counted, and the count is logged at most every 30 s.

pub mod clients_file;

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use http::HeaderMap;
use plimsoll::refusal::Refusal;
use subtle::ConstantTimeEq;

use crate::config::AuthConfig;
use clients_file::token_sha256_hex;

/// The one scope every procedure needs.
pub const SCOPE_RUN: &str = "code:run";

/// Who is calling, as authentication established it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Principal {
    /// The stable id (`static` for the shared token); `None` only in open dev mode.
    pub id: Option<String>,
    /// The scopes the caller holds; `*` matches any.
    pub scopes: Vec<String>,
    /// The caller's own daily paid allowance on metered providers (clients file only);
    /// `None` or 0: only the daemon's allowance applies.
    pub paid_seconds_per_day: Option<u64>,
}

impl Principal {
    /// The key for audit lines, the limiter and session ownership: the id, or
    /// `anon` in open dev mode.
    pub fn audit_key(&self) -> &str {
        self.id.as_deref().unwrap_or("anon")
    }

    /// Whether the caller holds `scope` (or the wildcard).
    pub fn has_scope(&self, scope: &str) -> bool {
        self.scopes.iter().any(|s| s == scope || s == "*")
    }
}

/// How callers are recognised.
pub enum Verifier {
    /// A registry keyed by the lowercase hex SHA-256 of each raw token.
    Clients(HashMap<String, Principal>),
    /// One shared token, compared in constant time; principal `static`.
    Token(Vec<u8>),
    /// Nothing is checked (allowed only where configuration permits it).
    Open,
}

impl Verifier {
    /// The verifier the configuration selects.
    pub fn from_config(auth: &AuthConfig) -> Verifier {
        match auth {
            AuthConfig::Clients(file) => Verifier::Clients(
                file.clients
                    .iter()
                    .map(|c| {
                        (
                            c.token_sha256.clone(),
                            Principal {
                                id: Some(c.id.clone()),
                                scopes: c.scopes.clone(),
                                paid_seconds_per_day: c.paid_seconds_per_day,
                            },
                        )
                    })
                    .collect(),
            ),
            AuthConfig::Token(t) => Verifier::Token(t.as_bytes().to_vec()),
            AuthConfig::Open => Verifier::Open,
        }
    }

    /// Whether authentication is on (anything but open dev mode).
    pub fn is_on(&self) -> bool {
        !matches!(self, Verifier::Open)
    }

    /// The label the startup log uses.
    pub fn label(&self) -> &'static str {
        match self {
            Verifier::Clients(_) => "clients-file",
            Verifier::Token(_) => "token",
            Verifier::Open => "none",
        }
    }

    /// Recognises the caller from the request headers alone.
    pub fn authenticate(&self, headers: &HeaderMap) -> Result<Principal, Refusal> {
        let principal = match self {
            Verifier::Open => {
                return Ok(Principal {
                    id: None,
                    scopes: vec!["*".to_owned()],
                    paid_seconds_per_day: None,
                });
            }
            Verifier::Clients(by_hash) => {
                let token = bearer(headers)?;
                by_hash
                    .get(&token_sha256_hex(token))
                    .cloned()
                    .ok_or_else(unknown_token)?
            }
            Verifier::Token(expected) => {
                let token = bearer(headers)?;
                if !bool::from(token.as_bytes().ct_eq(expected)) {
                    return Err(unknown_token());
                }
                Principal {
                    id: Some("static".to_owned()),
                    scopes: vec![SCOPE_RUN.to_owned()],
                    paid_seconds_per_day: None,
                }
            }
        };
        if !has_stable_identity(principal.id.as_deref().unwrap_or("")) {
            return Err(Refusal::Unauthenticated(
                "authenticated principal has no stable identity".to_owned(),
            ));
        }
        Ok(principal)
    }
}

/// Refuses a caller without the scope a procedure needs.
pub fn authorize(principal: &Principal, scope: &str) -> Result<(), Refusal> {
    if principal.has_scope(scope) {
        Ok(())
    } else {
        Err(Refusal::PermissionDenied(format!(
            "token lacks required scope {scope:?}"
        )))
    }
}

fn unknown_token() -> Refusal {
    Refusal::Unauthenticated("invalid or expired token".to_owned())
}

/// The token from `Authorization: Bearer <token>`: the value split on
/// whitespace must give exactly two fields, the first `Bearer` in any case.
/// A repeated header is refused rather than guessed at.
fn bearer(headers: &HeaderMap) -> Result<&str, Refusal> {
    let missing = || Refusal::Unauthenticated("missing bearer token".to_owned());
    let mut values = headers.get_all(http::header::AUTHORIZATION).iter();
    let value = values.next().ok_or_else(missing)?;
    if values.next().is_some() {
        return Err(unknown_token());
    }
    let value = value.to_str().map_err(|_| unknown_token())?;
    let mut fields = value.split_whitespace();
    match (fields.next(), fields.next(), fields.next()) {
        (Some(scheme), Some(token), None) if scheme.eq_ignore_ascii_case("bearer") => Ok(token),
        (None, _, _) => Err(missing()),
        _ => Err(unknown_token()),
    }
}

fn has_stable_identity(id: &str) -> bool {
    !id.is_empty() && id != "*" && id.trim() == id && !id.chars().any(char::is_control)
}

/// Counts failed credentials and logs the count at most once every 30 s,
/// never the token itself.
pub struct FailureLog {
    state: Mutex<(u64, Option<Instant>)>,
}

impl FailureLog {
    const EVERY: Duration = Duration::from_secs(30);

    /// A log with nothing counted.
    pub fn new() -> FailureLog {
        FailureLog {
            state: Mutex::new((0, None)),
        }
    }

    /// Counts one failure; logs (and resets) the count when 30 s have passed
    /// since the last line.
    pub fn record(&self) {
        let Ok(mut s) = self.state.lock() else { return };
        s.0 += 1;
        let due = s.1.is_none_or(|last| last.elapsed() >= Self::EVERY);
        if due {
            tracing::warn!(
                failed = s.0,
                "authentication failures since the last report"
            );
            *s = (0, Some(Instant::now()));
        }
    }
}

impl Default for FailureLog {
    fn default() -> Self {
        FailureLog::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(auth: &[&str]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for v in auth {
            h.append(http::header::AUTHORIZATION, v.parse().unwrap());
        }
        h
    }

    fn token_verifier() -> Verifier {
        Verifier::Token(b"0123456789abcdef0123456789abcdef".to_vec())
    }

    #[test]
    fn missing_header_is_missing_bearer_token() {
        let err = token_verifier().authenticate(&headers(&[])).unwrap_err();
        assert_eq!(err.to_string(), "missing bearer token");
    }

    #[test]
    fn bearer_scheme_is_case_insensitive_and_needs_two_fields() {
        let v = token_verifier();
        let ok = v.authenticate(&headers(&["bEaReR 0123456789abcdef0123456789abcdef"]));
        assert_eq!(ok.unwrap().id.as_deref(), Some("static"));
        for bad in [
            "Basic 0123456789abcdef0123456789abcdef",
            "Bearer",
            "Bearer a b",
            "0123456789abcdef0123456789abcdef",
        ] {
            assert!(v.authenticate(&headers(&[bad])).is_err(), "{bad}");
        }
    }

    #[test]
    fn wrong_token_is_invalid_or_expired() {
        let err = token_verifier()
            .authenticate(&headers(&["Bearer 0123456789abcdef0123456789abcdeX"]))
            .unwrap_err();
        assert_eq!(err.to_string(), "invalid or expired token");
    }

    #[test]
    fn clients_file_principal_is_found_by_token_hash() {
        let mut map = HashMap::new();
        map.insert(
            token_sha256_hex("py-token"),
            Principal {
                id: Some("python".into()),
                scopes: vec![SCOPE_RUN.into()],
                paid_seconds_per_day: None,
            },
        );
        let v = Verifier::Clients(map);
        let p = v.authenticate(&headers(&["Bearer py-token"])).unwrap();
        assert_eq!(p.audit_key(), "python");
        assert!(authorize(&p, SCOPE_RUN).is_ok());
        assert!(v.authenticate(&headers(&["Bearer other"])).is_err());
    }

    #[test]
    fn scope_is_required_and_wildcard_matches() {
        let none = Principal {
            id: Some("a".into()),
            scopes: vec![],
            paid_seconds_per_day: None,
        };
        let err = authorize(&none, SCOPE_RUN).unwrap_err();
        assert_eq!(err.to_string(), "token lacks required scope \"code:run\"");
        let star = Principal {
            id: Some("a".into()),
            scopes: vec!["*".into()],
            paid_seconds_per_day: None,
        };
        assert!(authorize(&star, SCOPE_RUN).is_ok());
    }

    #[test]
    fn open_mode_is_anon_with_every_scope() {
        let p = Verifier::Open.authenticate(&headers(&[])).unwrap();
        assert_eq!(p.audit_key(), "anon");
        assert!(p.has_scope(SCOPE_RUN));
    }

    #[test]
    fn unstable_identities_are_refused() {
        for id in ["", "*", " a", "a\n"] {
            assert!(!has_stable_identity(id), "{id:?}");
        }
        assert!(has_stable_identity("python"));
    }
}
