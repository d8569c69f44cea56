//! One guard request, in the order of grants.md §5.5: every step before the body is read is
//! cheap, and the body is read only for a live token with a turn and a decode slot (sharp
//! edge §10.10: token lookup, declared length, per-run admission, shared slot, then the
//! body under a 10 s deadline; never read or decode first).
//!
//! A refusal given before the body was read to the end is marked, so the listener closes an
//! HTTP/1.x connection after it instead of waiting for the rest of the body.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::header::{CONNECTION, CONTENT_LENGTH, CONTENT_TYPE};
use http::{HeaderValue, Method, Request, StatusCode, Version};
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;

use crate::admission::{Admission, TURN_WAIT};
use crate::answer::{self, Answer};
use crate::broker::{BrokerLink, CallAnswer, Lookup};
use crate::envelope::{Envelope, MAX_ENVELOPE_BYTES};
use crate::token::{self, TokenHash};

/// How long a body may take to arrive once its turn and slot are held.
pub const BODY_DEADLINE: Duration = Duration::from_secs(10);

/// What every request needs.
pub struct Guard {
    /// The link to the broker.
    pub broker: BrokerLink,
    /// Turns and slots.
    pub admission: Arc<Admission>,
}

// === impl Guard ===

impl Guard {
    /// Answers one request.
    pub async fn handle(&self, request: Request<Incoming>) -> Answer {
        let http1 = request.version() < Version::HTTP_2;
        let (answer, body_read) = self.steps(request).await;
        if http1 && !body_read {
            close_after(answer)
        } else {
            answer
        }
    }

    /// §5.5's steps; the flag says whether the body was read to its end.
    async fn steps(&self, request: Request<Incoming>) -> (Answer, bool) {
        // 1. Only POST on a guard path, without a query.
        if !is_guard_request(&request) {
            return (answer::not_found(), false);
        }
        // 2. The token: one lookup of its hash; the body stays unread.
        let Some(hash) = presented_token(&request) else {
            return (answer::unknown_token(), false);
        };
        match self.broker.lookup(&hash).await {
            Ok(Lookup::Live) => {}
            Ok(Lookup::Unknown) => return (answer::unknown_token(), false),
            Err(error) => {
                tracing::warn!(%error, "guard: token lookup failed");
                return (answer::broker_unreachable(), false);
            }
        }
        // 3. The declared length.
        if declared_length(&request).is_some_and(|n| n > MAX_ENVELOPE_BYTES as u64) {
            return (answer::declared_too_large(), false);
        }
        // 4. Per-run admission: a place inside, then a turn.
        let Some(inside) = self.admission.enter(hash) else {
            return (answer::token_busy(), false);
        };
        let Some(turn) = inside.turn(TURN_WAIT).await else {
            return (answer::no_turn(), false);
        };
        // 5. A shared decode slot, now or never.
        let Some(slot) = self.admission.decode_slot() else {
            return (answer::shed(), false);
        };
        // 6. The body, within the deadline and the limit.
        let body = match read_body(request.into_body()).await {
            Ok(body) => body,
            Err(refusal) => return (refusal, false),
        };
        // 7. The envelope.
        if let Err(error) = Envelope::decode(&body) {
            return (answer::bad_envelope(&error.to_string()), true);
        }
        // A call in flight holds no turn and no decode slot; it stays inside.
        drop((slot, turn));
        // 8. The broker makes the call with every check of grants.md §2.2.
        let answer = match self.broker.call(&hash, body).await {
            Ok(CallAnswer::Relay {
                status,
                content_type,
                body,
            }) => relay(status, content_type, body),
            Ok(CallAnswer::Unknown) => answer::unknown_token(),
            Ok(CallAnswer::BadEnvelope) => answer::bad_envelope("the envelope did not decode"),
            Err(error) => {
                tracing::warn!(%error, "guard: call through the broker failed");
                answer::unavailable()
            }
        };
        drop(inside);
        (answer, true)
    }
}

/// Step 1: `POST`, exactly a guard path, no query (not even an empty one).
fn is_guard_request(request: &Request<Incoming>) -> bool {
    let Some(target) = request.uri().path_and_query() else {
        return false;
    };
    request.method() == Method::POST
        && !target.as_str().contains('?')
        && crate::PATHS.contains(&target.path())
}

/// Step 2's hash: exactly one `X-Plimsoll-Guard` header of a token's shape.
fn presented_token(request: &Request<Incoming>) -> Option<TokenHash> {
    let mut values = request.headers().get_all(token::HEADER).iter();
    let value = values.next()?;
    if values.next().is_some() {
        return None;
    }
    TokenHash::of_presented(value.as_bytes())
}

/// The declared `Content-Length`; an unreadable one counts as too large.
fn declared_length(request: &Request<Incoming>) -> Option<u64> {
    let value = request.headers().get(CONTENT_LENGTH)?;
    Some(
        value
            .to_str()
            .ok()
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(u64::MAX),
    )
}

/// Step 6: the whole body within [`BODY_DEADLINE`] and [`MAX_ENVELOPE_BYTES`]; too large or
/// too slow is 413.
async fn read_body(body: Incoming) -> Result<Bytes, Answer> {
    let read = Limited::new(body, MAX_ENVELOPE_BYTES).collect();
    match tokio::time::timeout(BODY_DEADLINE, read).await {
        Ok(Ok(collected)) => Ok(collected.to_bytes()),
        Ok(Err(error)) if error.is::<http_body_util::LengthLimitError>() => {
            Err(answer::body_too_large())
        }
        // A body the client broke off is no body: the same refusal as a slow one.
        Ok(Err(_)) | Err(_) => Err(answer::body_too_slow()),
    }
}

/// Step 8's answer: the status, `Content-Type` and body as the broker gave them.
fn relay(status: u16, content_type: Option<HeaderValue>, body: Bytes) -> Answer {
    let Some(status) = StatusCode::from_u16(status)
        .ok()
        .filter(|s| (200..=599).contains(&s.as_u16()))
    else {
        return answer::unavailable();
    };
    let mut answer = Answer::new(Full::new(body));
    *answer.status_mut() = status;
    if let Some(content_type) = content_type {
        answer.headers_mut().insert(CONTENT_TYPE, content_type);
    }
    answer
}

/// Marks an HTTP/1.x answer to close its connection.
fn close_after(mut answer: Answer) -> Answer {
    answer
        .headers_mut()
        .insert(CONNECTION, HeaderValue::from_static("close"));
    answer
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_status_outside_the_answerable_range_becomes_502() {
        for status in [0, 99, 100, 101, 199, 600, 1000] {
            assert_eq!(
                relay(status, None, Bytes::new()).status(),
                StatusCode::BAD_GATEWAY,
                "{status}"
            );
        }
        let ok = relay(
            201,
            Some(HeaderValue::from_static("text/x")),
            Bytes::from("b"),
        );
        assert_eq!(ok.status(), StatusCode::CREATED);
        assert_eq!(ok.headers()[CONTENT_TYPE], "text/x");
    }
}
