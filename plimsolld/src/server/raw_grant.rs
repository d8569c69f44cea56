//! Layer 7: the body is read whole here, and a grant sent in full is refused (wire.md §6.6,
//! grants.md §1.5).
//!
//! Every request that reaches this step has its body read to the end (at most the 8 MiB cap)
//! before the Connect service sees it, so a body that cannot be read — cut off, or not
//! finished within the 30 s the outer layer allows — is a typed refusal (`invalid_argument`,
//! not dispatched, reason `request`) on every procedure, never the service's internal error.
//!
//! A request only *names* a server-side profile (`grant_profile`); the wire has no field for
//! a grant itself, so one could never be accepted. But proto3 JSON ignores keys the schema
//! does not know, and a caller who sends `"grant": {…}` would otherwise get a run with no
//! grant and no word of why. So a Connect JSON body of `Run` and `SessionRun` (uncompressed)
//! is refused — `invalid_argument`, not dispatched, reason `request` — when the request or
//! its payload carries a grant key. Anything else (binary protobuf, which has no such field;
//! compressed bodies, which the Connect service decodes and caps itself; bodies that are not
//! JSON objects) passes on with its bytes unchanged.

use http_body_util::{BodyExt, Full, LengthLimitError, Limited};
use plimsoll::refusal::Refusal;
use plimsoll::validate::MAX_MESSAGE_BYTES;
use serde_json::Value;

use super::exchange::Exchange;
use super::{HttpRequest, Inner, ResponseFuture, Step, call, refuse};

/// The procedures whose payloads could name a grant.
const PATHS: [&str; 2] = [
    "/plimsoll.v1.SandboxService/Run",
    "/plimsoll.v1.SandboxService/SessionRun",
];
/// Where a payload sits in a request.
const PAYLOADS: [&str; 4] = ["javascript", "project", "cell", "module"];
/// Keys that would carry a grant itself rather than a profile's name.
const GRANT_KEYS: [&str; 4] = ["grant", "grants", "rawGrant", "raw_grant"];

/// The refusal's message.
pub const MESSAGE: &str = "a grant cannot be sent in a request: name a profile configured on \
                           the daemon with grant_profile; nothing ran";

/// The raw-grant step.
#[derive(Clone)]
pub struct RawGrant;

/// Whether this request's body is one this step scans for a grant.
fn inspects(req: &HttpRequest) -> bool {
    let json = req
        .headers()
        .get(http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .is_some_and(|v| v.trim().eq_ignore_ascii_case("application/json"));
    let identity = req
        .headers()
        .get(http::header::CONTENT_ENCODING)
        .and_then(|v| v.to_str().ok())
        .is_none_or(|v| v.trim().eq_ignore_ascii_case("identity"));
    req.method() == http::Method::POST && json && identity && PATHS.contains(&req.uri().path())
}

/// Whether a decoded request carries a grant key at its top level or in its payload.
pub fn carries_grant(request: &Value) -> bool {
    let has_key = |v: &Value| {
        v.as_object()
            .is_some_and(|o| GRANT_KEYS.iter().any(|k| o.contains_key(*k)))
    };
    has_key(request)
        || PAYLOADS
            .iter()
            .any(|p| request.get(*p).is_some_and(has_key))
}

/// Whether a body could hold one of [`GRANT_KEYS`] at all: every key contains `grant` or
/// `Grant` literally, unless the body escapes characters (`\u…`), which a JSON key may use.
/// Most bodies fail this cheap scan and are not parsed twice.
fn may_name_a_grant(body: &[u8]) -> bool {
    [&b"grant"[..], b"Grant", b"\\u"]
        .iter()
        .any(|needle| body.windows(needle.len()).any(|w| w == *needle))
}

impl Step for RawGrant {
    fn handle<S: Inner>(&self, req: HttpRequest, next: S) -> ResponseFuture {
        let scan = inspects(&req);
        Box::pin(async move {
            let (parts, body) = req.into_parts();
            // One byte over the cap is enough for the Connect service to refuse it as over.
            let bytes = match Limited::new(body, MAX_MESSAGE_BYTES).collect().await {
                Ok(collected) => collected.to_bytes(),
                Err(e) => {
                    let exchange = Exchange::of(&parts.extensions);
                    let refusal = if e.is::<LengthLimitError>() {
                        Refusal::BodyTooLarge(format!(
                            "request body is over the {MAX_MESSAGE_BYTES} byte limit; nothing ran"
                        ))
                    } else {
                        Refusal::InvalidRequest(
                            "the request body could not be read; nothing ran".to_owned(),
                        )
                    };
                    return Ok(refuse(&parts.headers, &exchange, refusal));
                }
            };
            let refused = scan
                && may_name_a_grant(&bytes)
                && serde_json::from_slice::<Value>(&bytes)
                    .ok()
                    .is_some_and(|v| carries_grant(&v));
            if refused {
                let exchange = Exchange::of(&parts.extensions);
                return Ok(refuse(
                    &parts.headers,
                    &exchange,
                    Refusal::InvalidRequest(MESSAGE.to_owned()),
                ));
            }
            let body = Full::new(bytes).map_err(|never| match never {});
            let req = http::Request::from_parts(parts, body.boxed_unsync());
            Ok(call(&next, req).await)
        })
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_grant_key_in_the_request_or_its_payload_is_caught() {
        for v in [
            json!({"protocol": 4, "javascript": {"code": "1", "grant": {"base_url": "x"}}}),
            json!({"protocol": 4, "project": {"steps": ["true"], "grants": []}}),
            json!({"protocol": 4, "grant": {}, "javascript": {"code": "1"}}),
            json!({"sessionId": "s", "cell": {"code": "1", "rawGrant": "t"}}),
        ] {
            assert!(carries_grant(&v), "{v}");
        }
    }

    #[test]
    fn the_scan_lets_through_every_body_that_could_name_a_grant() {
        for body in [
            &br#"{"javascript":{"code":"1","grant":{}}}"#[..],
            br#"{"javascript":{"code":"1","rawGrant":"t"}}"#,
            br#"{"javascript":{"code":"1","gr\u0061nt":{}}}"#,
        ] {
            assert!(may_name_a_grant(body), "{}", String::from_utf8_lossy(body));
        }
        let escaped: Value =
            serde_json::from_slice(br#"{"javascript":{"gr\u0061nt":{}}}"#).unwrap();
        assert!(carries_grant(&escaped));
        assert!(!may_name_a_grant(
            br#"{"protocol":4,"javascript":{"code":"console.log(1)"}}"#
        ));
    }

    #[test]
    fn a_profile_name_and_other_keys_pass() {
        for v in [
            json!({"protocol": 4, "javascript": {"code": "1", "grantProfile": "inv"}}),
            json!({"protocol": 4, "javascript": {"code": "grant"}}),
            json!([1, 2]),
            json!({"protocol": 4, "javascript": "grant"}),
        ] {
            assert!(!carries_grant(&v), "{v}");
        }
    }
}
