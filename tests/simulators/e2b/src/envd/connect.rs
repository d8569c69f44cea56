//! The Connect protocol as envd speaks it to E2B's SDK: JSON codec, no compression.
//!
//! Written out by hand rather than through a Connect library on purpose: the faults must be
//! able to break the framing (an end-of-stream frame that never comes), which a library
//! would not let a server do.
//!
//! - Server streams answer HTTP 200 `application/connect+json`; each message is an envelope
//!   (flag byte, 4-byte big-endian length, JSON). The last envelope has flag `0x02` and holds
//!   `{}` or `{"error": {"code", "message"}}`; errors, even before the first message, come
//!   that way with HTTP 200.
//! - Unary calls answer `application/json`: the message with 200, or `{"code", "message"}`
//!   with the HTTP status of the code.

use bytes::{BufMut, Bytes, BytesMut};
use http::{HeaderValue, StatusCode, header};
use serde_json::{Value, json};

use crate::http::{Response, full};

pub const STREAM_CONTENT_TYPE: &str = "application/connect+json";
const UNARY_CONTENT_TYPE: &str = "application/json";
const FLAG_END_STREAM: u8 = 0x02;
const FLAG_COMPRESSED: u8 = 0x01;

/// The Connect codes the simulator answers with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Code {
    InvalidArgument,
    DeadlineExceeded,
    NotFound,
    FailedPrecondition,
    Unimplemented,
    Internal,
    Unavailable,
    Unauthenticated,
    Unknown,
}

impl Code {
    pub fn as_str(self) -> &'static str {
        match self {
            Code::InvalidArgument => "invalid_argument",
            Code::DeadlineExceeded => "deadline_exceeded",
            Code::NotFound => "not_found",
            Code::FailedPrecondition => "failed_precondition",
            Code::Unimplemented => "unimplemented",
            Code::Internal => "internal",
            Code::Unavailable => "unavailable",
            Code::Unauthenticated => "unauthenticated",
            Code::Unknown => "unknown",
        }
    }

    pub fn from_name(name: &str) -> Code {
        match name {
            "invalid_argument" => Code::InvalidArgument,
            "deadline_exceeded" => Code::DeadlineExceeded,
            "not_found" => Code::NotFound,
            "failed_precondition" => Code::FailedPrecondition,
            "unimplemented" => Code::Unimplemented,
            "internal" => Code::Internal,
            "unavailable" => Code::Unavailable,
            "unauthenticated" => Code::Unauthenticated,
            _ => Code::Unknown,
        }
    }

    /// The HTTP status of a unary error (Connect's table).
    fn http_status(self) -> StatusCode {
        match self {
            Code::InvalidArgument | Code::FailedPrecondition => StatusCode::BAD_REQUEST,
            Code::DeadlineExceeded => StatusCode::GATEWAY_TIMEOUT,
            Code::NotFound => StatusCode::NOT_FOUND,
            Code::Unimplemented => StatusCode::NOT_IMPLEMENTED,
            Code::Internal | Code::Unknown => StatusCode::INTERNAL_SERVER_ERROR,
            Code::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
            Code::Unauthenticated => StatusCode::UNAUTHORIZED,
        }
    }
}

/// An RPC error.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RpcError {
    pub code: Code,
    pub message: String,
}

impl RpcError {
    pub fn new(code: Code, message: impl Into<String>) -> RpcError {
        RpcError {
            code,
            message: message.into(),
        }
    }
}

/// One envelope.
pub fn envelope(flags: u8, message: &[u8]) -> Bytes {
    let mut out = BytesMut::with_capacity(5 + message.len());
    out.put_u8(flags);
    out.put_u32(u32::try_from(message.len()).unwrap_or(u32::MAX));
    out.put_slice(message);
    out.freeze()
}

/// A stream message envelope.
pub fn message(value: &Value) -> Bytes {
    envelope(0, &serde_json::to_vec(value).unwrap_or_default())
}

/// The end-of-stream envelope: `{}` or the error.
pub fn end_stream(error: Option<&RpcError>) -> Bytes {
    let body = match error {
        None => json!({}),
        Some(e) => json!({"error": {"code": e.code.as_str(), "message": e.message}}),
    };
    envelope(
        FLAG_END_STREAM,
        &serde_json::to_vec(&body).unwrap_or_default(),
    )
}

/// The head of a stream answer, body to follow.
pub fn stream_head(body: crate::http::Body) -> Response {
    let mut response = http::Response::new(body);
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static(STREAM_CONTENT_TYPE),
    );
    response
}

/// A stream that fails before its first message.
pub fn stream_error(error: &RpcError) -> Response {
    full(
        StatusCode::OK,
        Some(STREAM_CONTENT_TYPE),
        end_stream(Some(error)),
    )
}

pub fn unary_ok(value: &Value) -> Response {
    full(
        StatusCode::OK,
        Some(UNARY_CONTENT_TYPE),
        serde_json::to_vec(value).unwrap_or_default(),
    )
}

pub fn unary_error(error: &RpcError) -> Response {
    full(
        error.code.http_status(),
        Some(UNARY_CONTENT_TYPE),
        serde_json::to_vec(&json!({"code": error.code.as_str(), "message": error.message}))
            .unwrap_or_default(),
    )
}

/// The one request message of a server stream.
pub fn stream_request(body: &[u8]) -> Result<Value, RpcError> {
    let bad = |m: &str| RpcError::new(Code::InvalidArgument, m);
    if body.len() < 5 {
        return Err(bad("protocol error: incomplete envelope"));
    }
    if body[0] & FLAG_COMPRESSED != 0 {
        return Err(RpcError::new(
            Code::Internal,
            "protocol error: sent compressed message without compression support",
        ));
    }
    let len = u32::from_be_bytes([body[1], body[2], body[3], body[4]]) as usize;
    if body.len() != 5 + len {
        return Err(bad("protocol error: expected exactly one message"));
    }
    serde_json::from_slice(&body[5..])
        .map_err(|e| bad(&format!("unmarshal into process.StartRequest: {e}")))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn end_stream_frames_carry_flag_two() {
        let ok = end_stream(None);
        assert_eq!(&ok[..], b"\x02\x00\x00\x00\x02{}");
        let err = end_stream(Some(&RpcError::new(
            Code::DeadlineExceeded,
            "context deadline exceeded",
        )));
        assert_eq!(err[0], 0x02);
        let body: Value = serde_json::from_slice(&err[5..]).unwrap();
        assert_eq!(body["error"]["code"], "deadline_exceeded");
    }

    #[test]
    fn a_request_is_one_uncompressed_envelope() {
        let one = envelope(0, br#"{"process":{"cmd":"ls"}}"#);
        assert_eq!(stream_request(&one).unwrap()["process"]["cmd"], "ls");
        let mut two = one.to_vec();
        two.extend_from_slice(&one);
        assert!(stream_request(&two).is_err());
        let compressed = envelope(1, b"{}");
        assert_eq!(
            stream_request(&compressed).unwrap_err().code,
            Code::Internal
        );
    }
}
