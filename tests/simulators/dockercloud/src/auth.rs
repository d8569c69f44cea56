//! Docker Hub's token exchange and the checks of the tokens it issues.
//!
//! `POST /v2/auth/token` with `{"identifier": <account>, "secret": <personal access
//! token>}` answers `{"access_token": <JWT>}`; the JWT (HS256, signed with a key only this
//! process knows) carries `sub`, `iat` and `exp`. The sandbox APIs take only that access
//! token as their bearer: the personal access token itself is refused, as the live
//! service refuses it.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use hmac::{Hmac, Mac};
use hyper::body::Incoming;
use hyper::{Method, Request};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use crate::error::ApiError;
use crate::http::{Reply, json_reply, read_body};
use crate::state::State;

/// The token exchange's path on its host.
pub const EXCHANGE_PATH: &str = "/v2/auth/token";

fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs()
}

fn sign(key: &[u8; 32], signing_input: &str) -> String {
    // HMAC takes a key of any length; this cannot fail.
    let mut mac = match Hmac::<Sha256>::new_from_slice(key) {
        Ok(mac) => mac,
        Err(_) => return String::new(),
    };
    mac.update(signing_input.as_bytes());
    URL_SAFE_NO_PAD.encode(mac.finalize().into_bytes())
}

/// Mints an access token for `subject`, valid for `ttl`.
pub fn mint(key: &[u8; 32], subject: &str, ttl: Duration) -> String {
    let iat = now_secs();
    let header = URL_SAFE_NO_PAD.encode(br#"{"alg":"HS256","typ":"JWT"}"#);
    let claims = json!({
        "iss": "https://hub.docker.com",
        "sub": subject,
        "iat": iat,
        "exp": iat + ttl.as_secs(),
        "jti": crate::ids::hex_id(8),
    });
    let payload = URL_SAFE_NO_PAD.encode(claims.to_string());
    let input = format!("{header}.{payload}");
    let signature = sign(key, &input);
    format!("{input}.{signature}")
}

/// Checks a management bearer: an access token this process issued, not yet expired.
pub fn check_access_token(state: &State, headers: &http::HeaderMap) -> Result<(), ApiError> {
    let Some(token) = crate::http::bearer(headers) else {
        return Err(ApiError::unauthenticated("missing bearer token"));
    };
    if token == state.settings.token {
        // The live service refuses the personal access token itself.
        return Err(ApiError::unauthenticated("TOKEN_INVALID"));
    }
    let mut parts = token.split('.');
    let (Some(header), Some(payload), Some(signature), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(ApiError::unauthenticated("TOKEN_INVALID"));
    };
    let expected = sign(&state.jwt_key, &format!("{header}.{payload}"));
    let same: bool = expected.len() == signature.len()
        && expected
            .bytes()
            .zip(signature.bytes())
            .fold(0u8, |acc, (a, b)| acc | (a ^ b))
            == 0;
    if !same {
        return Err(ApiError::unauthenticated("TOKEN_INVALID"));
    }
    let claims: Value = URL_SAFE_NO_PAD
        .decode(payload)
        .ok()
        .and_then(|raw| serde_json::from_slice(&raw).ok())
        .unwrap_or(Value::Null);
    match claims["exp"].as_u64() {
        Some(exp) if exp > now_secs() => Ok(()),
        _ => Err(ApiError::unauthenticated("TOKEN_EXPIRED")),
    }
}

/// The SHA-256 of a token: credentials are stored by it, never by the token.
pub fn token_hash(token: &str) -> [u8; 32] {
    Sha256::digest(token.as_bytes()).into()
}

/// Serves the token exchange (the Docker Hub host).
pub async fn handle(state: Arc<State>, request: Request<Incoming>) -> Reply {
    if request.uri().path() != EXCHANGE_PATH {
        return json_reply(404, &json!({ "message": "page not found" }));
    }
    if request.method() != Method::POST {
        return json_reply(405, &json!({ "message": "method not allowed" }));
    }
    let body = match read_body(request.into_body(), 64 << 10).await {
        Ok(body) => body,
        Err(e) => return json_reply(400, &json!({ "message": e.message })),
    };
    let Ok(input) = serde_json::from_slice::<Value>(&body) else {
        return json_reply(400, &json!({ "message": "invalid JSON body" }));
    };
    let (Some(identifier), Some(secret)) = (input["identifier"].as_str(), input["secret"].as_str())
    else {
        return json_reply(
            400,
            &json!({ "message": "identifier and secret are required" }),
        );
    };
    let settings = &state.settings;
    if identifier != settings.username || secret != settings.token {
        return json_reply(
            401,
            &json!({ "message": "incorrect username or password", "errinfo": {} }),
        );
    }
    let token = mint(&state.jwt_key, identifier, settings.access_token_ttl);
    json_reply(200, &json!({ "access_token": token }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn minted_tokens_carry_exp_after_iat() {
        let token = mint(&[7u8; 32], "someone", Duration::from_secs(900));
        let payload = token.split('.').nth(1).unwrap();
        let claims: Value =
            serde_json::from_slice(&URL_SAFE_NO_PAD.decode(payload).unwrap()).unwrap();
        assert_eq!(claims["sub"], "someone");
        assert_eq!(
            claims["exp"].as_u64().unwrap() - claims["iat"].as_u64().unwrap(),
            900
        );
    }
}
