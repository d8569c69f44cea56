//! Layer 2: binds every answer to its request (wire.md §3).
//!
//! - `Plimsoll-Request-Id` is copied onto every answer, but only when the
//!   request carried it exactly once as 32 lowercase hex characters;
//! - `Plimsoll-Not-Dispatched` marks answers with status ≥ 300 written before
//!   a procedure was reached: `unsupported` for a 404, `request` otherwise;
//! - one audit line per request: caller, path, outcome, reason, duration.

use std::time::Instant;

use http::{HeaderMap, HeaderValue, StatusCode};

use super::exchange::Exchange;
use super::{HttpRequest, Inner, ResponseFuture, Step, call};

/// The request-id header.
pub const REQUEST_ID: &str = "plimsoll-request-id";
/// The not-dispatched header.
pub const NOT_DISPATCHED: &str = "plimsoll-not-dispatched";

/// The binding step.
#[derive(Clone)]
pub struct Binding;

/// The request id to echo: exactly one value of exactly 32 `[0-9a-f]`.
pub fn echoable_request_id(headers: &HeaderMap) -> Option<HeaderValue> {
    let mut values = headers.get_all(REQUEST_ID).iter();
    let first = values.next()?;
    if values.next().is_some() {
        return None;
    }
    let b = first.as_bytes();
    (b.len() == 32 && b.iter().all(|c| matches!(c, b'0'..=b'9' | b'a'..=b'f')))
        .then(|| first.clone())
}

impl Step for Binding {
    fn handle<S: Inner>(&self, mut req: HttpRequest, next: S) -> ResponseFuture {
        let started = Instant::now();
        let request_id = echoable_request_id(req.headers());
        let exchange = Exchange::default();
        req.extensions_mut().insert(exchange.clone());
        let path = req.uri().path().to_owned();
        Box::pin(async move {
            let mut resp = call(&next, req).await;
            // An answer written after the handler ran is the handler's to mark;
            // only the transport's own refusals get the header.
            exchange.release_slot();
            let status = resp.status();
            if status.as_u16() >= 300 && !exchange.reached() {
                let mark = if status == StatusCode::NOT_FOUND {
                    "unsupported"
                } else {
                    "request"
                };
                resp.headers_mut()
                    .insert(NOT_DISPATCHED, HeaderValue::from_static(mark));
            }
            if let Some(id) = request_id {
                resp.headers_mut().insert(REQUEST_ID, id);
            }
            let (caller, code, reason) = exchange.audit();
            tracing::info!(
                caller = caller.as_deref().unwrap_or(""),
                path = %path,
                status = status.as_u16(),
                code = code.unwrap_or(if status.is_success() { "ok" } else { "" }),
                not_dispatched = reason.unwrap_or(""),
                duration_ms = started.elapsed().as_millis() as u64,
                "request"
            );
            Ok(resp)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(values: &[&str]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for v in values {
            h.append(REQUEST_ID, v.parse().unwrap());
        }
        h
    }

    #[test]
    fn one_lowercase_hex_id_is_echoed() {
        let id = "0123456789abcdef0123456789abcdef";
        assert_eq!(echoable_request_id(&headers(&[id])).unwrap(), id);
    }

    #[test]
    fn malformed_or_repeated_ids_are_not_echoed() {
        let id = "0123456789abcdef0123456789abcdef";
        for bad in [
            vec!["0123456789ABCDEF0123456789abcdef"],
            vec!["0123456789abcdef0123456789abcde"],
            vec!["0123456789abcdef0123456789abcdef0"],
            vec!["0123456789abcdef0123456789abcdeg"],
            vec![id, id],
            vec![],
        ] {
            assert!(echoable_request_id(&headers(&bad)).is_none(), "{bad:?}");
        }
    }
}
