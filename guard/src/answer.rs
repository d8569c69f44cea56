//! Every answer the guard writes itself (grants.md §5.5), in one place: the status, a JSON
//! body `{"error": "…"}` and, for the two 503s, `Retry-After: 1`. Relayed answers (the
//! broker's and the upstream API's) never pass through here.

use bytes::Bytes;
use http::header::{CONTENT_TYPE, RETRY_AFTER};
use http::{HeaderValue, Response, StatusCode};
use http_body_util::Full;

/// The 401 text the spec fixes; the body is exactly `{"error":"<this>"}`.
pub const UNKNOWN_TOKEN: &str = "unknown or expired egress guard credential";

/// An answer the guard writes.
pub type Answer = Response<Full<Bytes>>;

/// A JSON error answer.
fn error(status: StatusCode, message: &str) -> Answer {
    let body = serde_json::json!({ "error": message }).to_string();
    let mut answer = Response::new(Full::new(Bytes::from(body)));
    *answer.status_mut() = status;
    answer
        .headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    answer
}

fn retry_later(mut answer: Answer) -> Answer {
    answer
        .headers_mut()
        .insert(RETRY_AFTER, HeaderValue::from_static("1"));
    answer
}

/// Step 1: not `POST`, not a guard path, or a query.
pub fn not_found() -> Answer {
    error(StatusCode::NOT_FOUND, "not found")
}

/// Step 2: no token, one of the wrong shape, or one the broker does not know now.
pub fn unknown_token() -> Answer {
    error(StatusCode::UNAUTHORIZED, UNKNOWN_TOKEN)
}

/// Step 3: the declared `Content-Length` is over the limit.
pub fn declared_too_large() -> Answer {
    error(
        StatusCode::PAYLOAD_TOO_LARGE,
        "request body too large: at most 2 MiB",
    )
}

/// Step 4: the token has [`crate::admission::PER_TOKEN`] requests inside already.
pub fn token_busy() -> Answer {
    error(
        StatusCode::TOO_MANY_REQUESTS,
        "too many requests in flight for this guard credential",
    )
}

/// Step 4: no turn of the run's within the wait.
pub fn no_turn() -> Answer {
    retry_later(error(
        StatusCode::SERVICE_UNAVAILABLE,
        "the run's guard turns stayed busy; retry",
    ))
}

/// Step 5: every decode slot is held.
pub fn shed() -> Answer {
    retry_later(error(
        StatusCode::SERVICE_UNAVAILABLE,
        "the guard is at capacity; retry",
    ))
}

/// Step 6: the body went over the limit while being read.
pub fn body_too_large() -> Answer {
    error(
        StatusCode::PAYLOAD_TOO_LARGE,
        "request body too large: at most 2 MiB",
    )
}

/// Step 6: the body did not arrive within the deadline.
pub fn body_too_slow() -> Answer {
    error(
        StatusCode::PAYLOAD_TOO_LARGE,
        "request body not received within 10 s",
    )
}

/// Step 7: the envelope did not decode.
pub fn bad_envelope(detail: &str) -> Answer {
    error(StatusCode::BAD_REQUEST, detail)
}

/// Step 2 when the broker cannot be asked: nothing is known about the token.
pub fn broker_unreachable() -> Answer {
    retry_later(error(
        StatusCode::SERVICE_UNAVAILABLE,
        "the grant broker is not answering; retry",
    ))
}

/// Step 8 when the call broke on the way, or came back with a status outside 100–599 (or
/// one HTTP cannot send as an answer, 1xx).
pub fn unavailable() -> Answer {
    error(StatusCode::BAD_GATEWAY, "host api unavailable")
}

/// A request that outlived the guard's write bound.
pub fn too_long() -> Answer {
    error(StatusCode::GATEWAY_TIMEOUT, "the call took too long")
}
