//! Connect unary requests and answers, as wire.md describes them.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use base64::Engine as _;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use crate::http1::{Request, Response};
use crate::protobuf;

/// The protocol number the daemon serves (the published Python client 0.23.0 states 4).
pub const PROTOCOL: u32 = 4;

/// Every procedure's path starts with this.
pub const SERVICE_PREFIX: &str = "/plimsoll.v1.SandboxService/";

/// The answer-binding header (wire.md §3.1).
pub const REQUEST_ID: &str = "Plimsoll-Request-Id";

/// The pre-handler not-dispatched header (wire.md §3.2).
pub const NOT_DISPATCHED: &str = "Plimsoll-Not-Dispatched";

/// The body cap, 8 MiB (wire.md §1.3).
pub const BODY_CAP: usize = 8 * 1024 * 1024;

/// MaxCodeBytes, 256 KiB (wire.md §6.4).
pub const MAX_CODE_BYTES: usize = 256 * 1024;

/// A fresh request id: 16 bytes as 32 lowercase hex characters.
pub fn request_id() -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or_default();
    let mut h = Sha256::new();
    h.update(b"plimsoll-tests request id\n");
    h.update(nanos.to_le_bytes());
    h.update(COUNTER.fetch_add(1, Ordering::Relaxed).to_le_bytes());
    h.update(std::process::id().to_le_bytes());
    hex::encode(&h.finalize()[..16])
}

/// A Connect JSON call to `procedure` with the Python client's headers and a fresh
/// request id (read it back with `header_value(REQUEST_ID)`).
pub fn call(procedure: &str, body: &Value) -> Request {
    Request::post(&format!("{SERVICE_PREFIX}{procedure}"))
        .header("Content-Type", "application/json")
        .header("Connect-Protocol-Version", "1")
        .header("Accept-Encoding", "identity")
        .header(REQUEST_ID, &request_id())
        .body(body.to_string())
}

/// [`call`] with `Authorization: Bearer <token>`.
pub fn call_as(token: &str, procedure: &str, body: &Value) -> Request {
    call(procedure, body).header("Authorization", &format!("Bearer {token}"))
}

/// A protocol-4 `Run` request body carrying a JavaScript snippet.
pub fn javascript(code: &str) -> Value {
    json!({ "protocol": PROTOCOL, "javascript": { "code": code } })
}

/// `javascript(code)` with `minimumIsolation` set.
pub fn javascript_with_floor(code: &str, floor: &str) -> Value {
    json!({ "protocol": PROTOCOL, "minimumIsolation": floor, "javascript": { "code": code } })
}

/// A protocol-4 `Run` request body carrying a project.
pub fn project(files: &[(&str, &str)], steps: &[&str]) -> Value {
    let files: Vec<Value> = files
        .iter()
        .map(|(p, c)| json!({ "path": p, "content": c }))
        .collect();
    json!({ "protocol": PROTOCOL, "project": { "files": files, "steps": steps } })
}

/// The HTTP status the newer Connect mapping gives a code (wire.md §8.2).
pub fn http_status(code: &str) -> u16 {
    match code {
        "canceled" => 499,
        "invalid_argument" | "failed_precondition" | "out_of_range" => 400,
        "deadline_exceeded" => 504,
        "not_found" => 404,
        "already_exists" | "aborted" => 409,
        "permission_denied" => 403,
        "resource_exhausted" => 429,
        "unimplemented" => 501,
        "unavailable" => 503,
        "unauthenticated" => 401,
        _ => 500,
    }
}

// === impl Reason ===

/// `NotDispatchedReason` (wire.md §5.4).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reason {
    Request = 1,
    Permission = 2,
    Protocol = 3,
    Unsupported = 4,
    Isolation = 5,
    Capacity = 6,
    Environment = 7,
}

impl Reason {
    /// The binary `NotDispatched{reason}` message: `08 <reason>`.
    pub fn detail_bytes(self) -> Vec<u8> {
        vec![0x08, self as u8]
    }
}

// === impl ConnectError ===

/// A Connect error body: `{"code", "message", "details": [{"type", "value"}]}`.
#[derive(Clone, Debug)]
pub struct ConnectError {
    pub code: String,
    pub message: String,
    /// `(type, decoded value)` for each detail.
    pub details: Vec<(String, Vec<u8>)>,
}

impl ConnectError {
    /// Reads the error body of `resp`, panicking with the answer when it is not one.
    pub fn of(resp: &Response) -> ConnectError {
        let v = resp.json();
        let code = v["code"]
            .as_str()
            .unwrap_or_else(|| panic!("error body without a code: {resp}"))
            .to_string();
        let message = v["message"].as_str().unwrap_or("").to_string();
        let details = v["details"]
            .as_array()
            .map(|ds| {
                ds.iter()
                    .map(|d| {
                        let ty = d["type"].as_str().unwrap_or("").to_string();
                        let value = decode_base64(d["value"].as_str().unwrap_or(""))
                            .unwrap_or_else(|| panic!("detail value is not base64: {resp}"));
                        (ty, value)
                    })
                    .collect()
            })
            .unwrap_or_default();
        ConnectError {
            code,
            message,
            details,
        }
    }

    /// The value of the `plimsoll.v1.NotDispatched` detail, if any. The type may carry
    /// a `type.googleapis.com/` prefix (wire.md §8.1).
    pub fn not_dispatched(&self) -> Option<Vec<u8>> {
        self.detail("plimsoll.v1.NotDispatched")
    }

    /// The `SessionEnd` number of the `plimsoll.v1.SessionEnded` detail (its field 1, a
    /// one-byte varint), if any.
    pub fn session_ended(&self) -> Option<u8> {
        self.detail("plimsoll.v1.SessionEnded").and_then(|b| {
            (b.first() == Some(&0x08))
                .then(|| b.get(1).copied())
                .flatten()
        })
    }

    /// The value of the detail whose bare type name is `name`.
    pub fn detail(&self, name: &str) -> Option<Vec<u8>> {
        self.details
            .iter()
            .find(|(t, _)| t.rsplit('/').next() == Some(name))
            .map(|(_, v)| v.clone())
    }
}

/// Decodes standard or URL-safe base64, padded or not.
pub fn decode_base64(text: &str) -> Option<Vec<u8>> {
    use base64::engine::general_purpose::{STANDARD_NO_PAD, URL_SAFE_NO_PAD};
    let bare = text.trim_end_matches('=');
    STANDARD_NO_PAD
        .decode(bare)
        .or_else(|_| URL_SAFE_NO_PAD.decode(bare))
        .ok()
}

// === assertions ===

/// Something that names the request id an answer must carry back: the [`Request`]
/// that was sent, or the id itself when the test wrote the bytes by hand.
pub trait SentId {
    fn sent_id(&self) -> &str;
}

impl SentId for Request {
    fn sent_id(&self) -> &str {
        self.header_value(REQUEST_ID)
            .expect("the request states an id")
    }
}

impl SentId for str {
    fn sent_id(&self) -> &str {
        self
    }
}

impl SentId for String {
    fn sent_id(&self) -> &str {
        self
    }
}

/// Asserts `resp` carries back exactly the request id `req` sent.
pub fn assert_bound(resp: &Response, req: &(impl SentId + ?Sized)) {
    let id = req.sent_id();
    assert_eq!(
        resp.all(REQUEST_ID),
        vec![id],
        "the answer must carry the request id back exactly once:\n{resp}"
    );
}

/// Asserts `resp` is a Connect refusal with `code`, the newer mapping's HTTP status,
/// the `NotDispatched{reason}` detail, and the request id echoed. Returns the error.
pub fn assert_refused(
    resp: &Response,
    req: &(impl SentId + ?Sized),
    code: &str,
    reason: Reason,
) -> ConnectError {
    let err = assert_error(resp, req, code);
    assert_eq!(
        err.not_dispatched(),
        Some(reason.detail_bytes()),
        "expected NotDispatched{{{reason:?}}} = {:02x?}:\n{resp}",
        reason.detail_bytes()
    );
    err
}

/// Asserts `resp` is a Connect error with `code` and its HTTP status, bound to `req`.
pub fn assert_error(resp: &Response, req: &(impl SentId + ?Sized), code: &str) -> ConnectError {
    assert_eq!(
        resp.status,
        http_status(code),
        "expected HTTP {} for {code}:\n{resp}",
        http_status(code)
    );
    let err = ConnectError::of(resp);
    assert_eq!(err.code, code, "wrong Connect code:\n{resp}");
    assert_bound(resp, req);
    err
}

/// Asserts `resp` is an `invalid_argument` refusal marked `request`, with no
/// not-dispatched header (a handler refusal carries the detail instead).
pub fn assert_invalid(resp: &Response, req: &(impl SentId + ?Sized)) -> ConnectError {
    let err = assert_refused(resp, req, "invalid_argument", Reason::Request);
    assert_no_mark_header(resp);
    err
}

/// Asserts the disabled provider's refusal: `failed_precondition` + `unsupported`.
pub fn assert_disabled(resp: &Response, req: &(impl SentId + ?Sized)) -> ConnectError {
    assert_refused(resp, req, "failed_precondition", Reason::Unsupported)
}

/// Asserts `resp` carries no `Plimsoll-Not-Dispatched` header.
pub fn assert_no_mark_header(resp: &Response) {
    assert!(
        resp.all(NOT_DISPATCHED).is_empty(),
        "a handler's answer carries the NotDispatched detail, not the pre-handler header:\n{resp}"
    );
}

/// Decodes a `google.rpc.Status` (`grpc-status-details-bin`) into
/// `(code, message, [(type_url, value)])`.
pub fn rpc_status(bytes: &[u8]) -> (u64, String, Vec<(String, Vec<u8>)>) {
    let f = protobuf::decode(bytes).expect("google.rpc.Status decodes");
    let details = protobuf::all_bytes(&f, 3)
        .iter()
        .map(|any| {
            let a = protobuf::decode(any).expect("google.protobuf.Any decodes");
            (
                protobuf::string(&a, 1).unwrap_or_default(),
                protobuf::bytes(&a, 2).unwrap_or_default(),
            )
        })
        .collect();
    (
        protobuf::uint(&f, 1).unwrap_or(0),
        protobuf::string(&f, 2).unwrap_or_default(),
        details,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_ids_are_32_lowercase_hex_and_fresh() {
        let a = request_id();
        let b = request_id();
        assert_eq!(a.len(), 32);
        assert!(
            a.bytes()
                .all(|c| c.is_ascii_digit() || (b'a'..=b'f').contains(&c))
        );
        assert_ne!(a, b);
    }

    #[test]
    fn base64_accepts_every_form_the_clients_accept() {
        assert_eq!(decode_base64("CAU"), Some(vec![8, 5]));
        assert_eq!(decode_base64("CAU="), Some(vec![8, 5]));
        assert_eq!(decode_base64("_-8"), Some(vec![0xff, 0xef]));
    }
}
