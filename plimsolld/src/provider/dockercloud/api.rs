//! Docker's sandboxes API as plimsoll speaks it (grants.md §7.1, §7.2): the token exchange
//! (the personal access token goes only there; the bearer it answers is cached until its
//! `exp` − 60 s), Connect JSON unary calls (`Connect-Protocol-Version: 1`,
//! `Connect-Timeout-Ms`, answers capped at 1 MiB) and the Connect streams of the file
//! service (envelopes: a flags byte, a 4-byte big-endian length, the JSON message).
//!
//! Every request goes through the e2b provider's client: HTTP/1.1, no redirects, plain http
//! only to loopback, vendor errors cut and scrubbed before they reach a log or an error.

use std::time::{Duration, Instant, SystemTime};

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Method, StatusCode};
use serde_json::{Value, json};

use super::config::Url;
use crate::provider::e2b::http::{Client, HttpError, scrub};

/// Management answers are capped at 1 MiB (grants.md §7.2).
pub const MAX_ANSWER: usize = 1 << 20;
/// How long a bearer is used before its `exp`.
const EXP_MARGIN: Duration = Duration::from_secs(60);
/// A bearer whose `exp` cannot be read is used this long.
const UNREADABLE_EXP: Duration = Duration::from_secs(300);
/// The longest a bearer is used, whatever its `exp` says (a far `exp` would also overflow
/// the clock the cache is kept on).
const MAX_BEARER_LIFE: Duration = Duration::from_secs(3600);
/// The bound on the token exchange.
const EXCHANGE_BOUND: Duration = Duration::from_secs(20);
/// The end-of-stream flag of a Connect envelope.
const END_STREAM: u8 = 0x02;

/// Why a call to Docker's service failed.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// No response.
    #[error(transparent)]
    Http(#[from] HttpError),
    /// The token exchange refused the account or failed (scrubbed text).
    #[error("the token exchange answered {0}")]
    Exchange(String),
    /// A Connect error (`code` as Connect names it; message scrubbed).
    #[error("{procedure}: {code}: {message}")]
    Rpc {
        procedure: String,
        code: String,
        message: String,
    },
    /// A status the call does not accept (REST, policy), scrubbed.
    #[error("{what} answered {text}")]
    Status {
        what: String,
        status: StatusCode,
        text: String,
    },
    /// An answer that is not what the protocol promises.
    #[error("{0}")]
    Answer(String),
}

impl ApiError {
    /// Whether the request certainly never reached the service: its bearer could not be
    /// had, or no connection was made.
    pub fn never_sent(&self) -> bool {
        match self {
            ApiError::Exchange(_) => true,
            ApiError::Http(h) => h.never_sent(),
            _ => false,
        }
    }

    /// The Connect code, if the service answered one.
    pub fn code(&self) -> Option<&str> {
        match self {
            ApiError::Rpc { code, .. } => Some(code),
            _ => None,
        }
    }
}

/// The cached bearer.
struct Bearer {
    value: String,
    until: Instant,
}

/// The token exchange and its cache.
pub struct Auth {
    client: Client,
    path: String,
    body: Bytes,
    cached: tokio::sync::Mutex<Option<Bearer>>,
}

impl Auth {
    pub fn new(
        url: &Url,
        tls: Option<std::sync::Arc<rustls::ClientConfig>>,
        user: &str,
        token: &str,
    ) -> Auth {
        Auth {
            client: Client::new(url.base.clone(), tls),
            path: if url.path.is_empty() {
                "/".to_owned()
            } else {
                url.path.clone()
            },
            body: Bytes::from(json!({ "identifier": user, "secret": token }).to_string()),
            cached: tokio::sync::Mutex::new(None),
        }
    }

    /// A bearer for the sandbox APIs: the cached one while it is good, else a fresh one.
    pub async fn bearer(&self) -> Result<String, ApiError> {
        let mut cached = self.cached.lock().await;
        if let Some(b) = cached.as_ref()
            && Instant::now() < b.until
        {
            return Ok(b.value.clone());
        }
        let mut headers = HeaderMap::new();
        headers.insert(
            http::header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        let response = self
            .client
            .send(
                Method::POST,
                &self.path,
                headers,
                self.body.clone(),
                None,
                EXCHANGE_BOUND,
            )
            .await?;
        if response.status != StatusCode::OK {
            return Err(ApiError::Exchange(response.error_text().await));
        }
        let body = response
            .bytes(64 << 10, EXCHANGE_BOUND)
            .await
            .map_err(ApiError::Exchange)?;
        let answer: Value = serde_json::from_slice(&body)
            .map_err(|e| ApiError::Exchange(format!("not JSON: {e}")))?;
        let value = answer["access_token"]
            .as_str()
            .filter(|t| !t.is_empty() && t.bytes().all(|b| b.is_ascii_graphic()))
            .ok_or_else(|| ApiError::Exchange("no usable access_token".to_owned()))?
            .to_owned();
        let until = Instant::now() + lifetime(&value);
        *cached = Some(Bearer {
            value: value.clone(),
            until,
        });
        Ok(value)
    }
}

/// How long a JWT is used: until `exp` − 60 s (5 min when `exp` cannot be read), an hour
/// at most.
fn lifetime(jwt: &str) -> Duration {
    let exp = jwt
        .split('.')
        .nth(1)
        .and_then(|p| URL_SAFE_NO_PAD.decode(p.trim_end_matches('=')).ok())
        .and_then(|p| serde_json::from_slice::<Value>(&p).ok())
        .and_then(|c| c["exp"].as_u64());
    let Some(exp) = exp else {
        return UNREADABLE_EXP;
    };
    let now = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs();
    Duration::from_secs(exp.saturating_sub(now))
        .saturating_sub(EXP_MARGIN)
        .min(MAX_BEARER_LIFE)
}

fn headers(
    bearer: &str,
    content_type: &'static str,
    bound: Duration,
) -> Result<HeaderMap, ApiError> {
    let mut h = HeaderMap::new();
    h.insert(
        http::header::CONTENT_TYPE,
        HeaderValue::from_static(content_type),
    );
    h.insert("connect-protocol-version", HeaderValue::from_static("1"));
    let ms = u64::try_from(bound.as_millis()).unwrap_or(u64::MAX);
    h.insert("connect-timeout-ms", HeaderValue::from(ms));
    let auth = HeaderValue::from_str(&format!("Bearer {bearer}"))
        .map_err(|_| ApiError::Answer("the bearer is not a header value".to_owned()))?;
    h.insert(http::header::AUTHORIZATION, auth);
    Ok(h)
}

/// The Connect error in an error body, scrubbed.
fn connect_error(procedure: &str, status: StatusCode, body: &[u8]) -> ApiError {
    let parsed: Value = serde_json::from_slice(body).unwrap_or(Value::Null);
    let code = parsed["code"]
        .as_str()
        .map_or_else(|| format!("http {}", status.as_u16()), str::to_owned);
    let message = parsed["message"]
        .as_str()
        .map_or_else(|| scrub(&String::from_utf8_lossy(body)), scrub);
    ApiError::Rpc {
        procedure: procedure.to_owned(),
        code: scrub(&code),
        message,
    }
}

/// One Connect unary call of `procedure` (`/pkg.Service/Method`) under `prefix` on `client`.
pub async fn unary(
    client: &Client,
    prefix: &str,
    procedure: &str,
    bearer: &str,
    message: &Value,
    bound: Duration,
) -> Result<Value, ApiError> {
    let headers = headers(bearer, "application/json", bound)?;
    let path = format!("{prefix}{procedure}");
    let response = client
        .send(
            Method::POST,
            &path,
            headers,
            Bytes::from(message.to_string()),
            None,
            bound,
        )
        .await?;
    let status = response.status;
    let body = response
        .bytes(MAX_ANSWER, bound)
        .await
        .map_err(|e| ApiError::Answer(format!("{procedure}: {e}")))?;
    if status != StatusCode::OK {
        return Err(connect_error(procedure, status, &body));
    }
    serde_json::from_slice(&body)
        .map_err(|e| ApiError::Answer(format!("{procedure}: not JSON: {e}")))
}

/// The REST API's error body (`{code, message}`, codes camelCase) as the Connect error of
/// the same name, so both transports are judged by one code (`resource_exhausted`, …).
fn rest_error(what: &str, status: StatusCode, body: &[u8]) -> ApiError {
    let mut e = connect_error(what, status, body);
    if let ApiError::Rpc { code, .. } = &mut e {
        let mut snake = String::with_capacity(code.len() + 4);
        for c in code.chars() {
            if c.is_ascii_uppercase() {
                snake.push('_');
            }
            snake.push(c.to_ascii_lowercase());
        }
        *code = snake;
    }
    e
}

/// One REST call: `method` on `path` with `bearer`, a JSON body when given and `extra`
/// headers; a 2xx answer's JSON (`null` when empty), else its error as [`ApiError::Rpc`].
pub async fn rest(
    client: &Client,
    method: Method,
    path: &str,
    bearer: &str,
    body: Option<&Value>,
    extra: &[(&'static str, &str)],
    bound: Duration,
) -> Result<Value, ApiError> {
    let mut headers = HeaderMap::new();
    let auth = HeaderValue::from_str(&format!("Bearer {bearer}"))
        .map_err(|_| ApiError::Answer("the bearer is not a header value".to_owned()))?;
    headers.insert(http::header::AUTHORIZATION, auth);
    if body.is_some() {
        headers.insert(
            http::header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
    }
    for (name, value) in extra {
        let value = HeaderValue::from_str(value)
            .map_err(|_| ApiError::Answer(format!("{name} is not a header value")))?;
        headers.insert(*name, value);
    }
    let what = format!("{method} {}", path.split('?').next().unwrap_or(path));
    let payload = body.map_or_else(Bytes::new, |b| Bytes::from(b.to_string()));
    let response = client
        .send(method, path, headers, payload, None, bound)
        .await?;
    let status = response.status;
    let answer = response
        .bytes(MAX_ANSWER, bound)
        .await
        .map_err(|e| ApiError::Answer(format!("{what}: {e}")))?;
    if !status.is_success() {
        return Err(rest_error(&what, status, &answer));
    }
    if answer.is_empty() {
        return Ok(Value::Null);
    }
    serde_json::from_slice(&answer).map_err(|e| ApiError::Answer(format!("{what}: not JSON: {e}")))
}

/// One envelope of a Connect stream.
pub fn envelope(message: &Value) -> Vec<u8> {
    let body = message.to_string().into_bytes();
    let mut out = Vec::with_capacity(5 + body.len());
    out.push(0);
    out.extend_from_slice(&u32::try_from(body.len()).unwrap_or(u32::MAX).to_be_bytes());
    out.extend_from_slice(&body);
    out
}

/// A Connect streaming call: `frames` (already enveloped) sent, the answer's messages read
/// within `limit` bytes. The end-of-stream envelope is required; an error in it fails the call.
pub async fn stream(
    client: &Client,
    path: &str,
    procedure: &str,
    bearer: &str,
    frames: Vec<u8>,
    limit: usize,
    bound: Duration,
) -> Result<Vec<Value>, ApiError> {
    let headers = headers(bearer, "application/connect+json", bound)?;
    let response = client
        .send(
            Method::POST,
            path,
            headers,
            Bytes::from(frames),
            None,
            bound,
        )
        .await?;
    let status = response.status;
    let body = response
        .bytes(limit, bound)
        .await
        .map_err(|e| ApiError::Answer(format!("{procedure}: {e}")))?;
    if status != StatusCode::OK {
        return Err(connect_error(procedure, status, &body));
    }
    messages(procedure, &body)
}

/// The messages of `procedure`'s stream answer `body` (its status 200), up to the
/// end-of-stream envelope, which is required; an error in it fails the call.
pub(super) fn messages(procedure: &str, body: &[u8]) -> Result<Vec<Value>, ApiError> {
    let mut rest: &[u8] = body;
    let mut messages = Vec::new();
    while rest.len() >= 5 {
        let flags = rest[0];
        let len = u32::from_be_bytes([rest[1], rest[2], rest[3], rest[4]]) as usize;
        let Some(message) = rest.get(5..5 + len) else {
            break;
        };
        let value: Value = serde_json::from_slice(message)
            .map_err(|e| ApiError::Answer(format!("{procedure}: a frame is not JSON: {e}")))?;
        if flags & END_STREAM != 0 {
            if let Some(error) = value.get("error") {
                return Err(connect_error(
                    procedure,
                    StatusCode::OK,
                    error.to_string().as_bytes(),
                ));
            }
            return Ok(messages);
        }
        messages.push(value);
        rest = &rest[5 + len..];
    }
    Err(ApiError::Answer(format!(
        "{procedure}: the stream ended without its end-of-stream frame"
    )))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    /// Only a create that never left is spared the whole paid reservation.
    #[test]
    fn only_a_failed_exchange_or_connection_is_never_sent() {
        let connect = HttpError::Connect {
            origin: "https://x".into(),
            detail: "refused".into(),
        };
        let timeout = HttpError::Timeout {
            method: Method::POST,
            origin: "https://x".into(),
            path: "/v1/sandboxes".into(),
            bound: Duration::from_secs(1),
        };
        assert!(ApiError::Http(connect).never_sent());
        assert!(ApiError::Exchange("401".into()).never_sent());
        assert!(!ApiError::Http(timeout).never_sent(), "it may have arrived");
        assert!(!ApiError::Answer("?".into()).never_sent());
    }

    #[test]
    fn a_bearer_lives_until_exp_minus_a_minute() {
        let now = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .unwrap()
            .as_secs();
        let claims = URL_SAFE_NO_PAD.encode(json!({ "exp": now + 900 }).to_string());
        let life = lifetime(&format!("h.{claims}.s"));
        assert!(
            life <= Duration::from_secs(840) && life > Duration::from_secs(830),
            "{life:?}"
        );
        assert_eq!(lifetime("opaque"), UNREADABLE_EXP);
        let old = URL_SAFE_NO_PAD.encode(json!({ "exp": now + 30 }).to_string());
        assert_eq!(lifetime(&format!("h.{old}.s")), Duration::ZERO);
        // A far `exp` (the vendor's answer) neither overflows the clock nor lives on.
        let far = URL_SAFE_NO_PAD.encode(json!({ "exp": u64::MAX }).to_string());
        let life = lifetime(&format!("h.{far}.s"));
        assert_eq!(life, MAX_BEARER_LIFE);
        assert!(std::time::Instant::now().checked_add(life).is_some());
    }

    #[test]
    fn error_bodies_are_scrubbed() {
        let body = br#"{"code":"unauthenticated","message":"bad token dckr_pat_abc"}"#;
        let e = connect_error("/x", StatusCode::UNAUTHORIZED, body);
        assert_eq!(e.code(), Some("unauthenticated"));
        assert!(!e.to_string().contains("dckr_pat_abc"), "{e}");
    }

    #[test]
    fn rest_codes_read_as_connect_codes() {
        let body =
            br#"{"code":"resourceExhausted","message":"Maximum running sandboxes quota reached"}"#;
        let e = rest_error("POST /v1/sandboxes", StatusCode::TOO_MANY_REQUESTS, body);
        assert_eq!(e.code(), Some("resource_exhausted"));
        let e = rest_error("GET /v1/sandboxes/x", StatusCode::NOT_FOUND, b"not json");
        assert_eq!(e.code(), Some("http 404"));
    }
}
