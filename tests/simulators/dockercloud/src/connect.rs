//! The Connect protocol, JSON codec only (connectrpc.com/docs/protocol), as Docker's
//! sandboxes API serves it: unary calls are `POST` with `application/json` bodies; the
//! file streams use `application/connect+json` envelopes (one flags byte, a 4-byte
//! big-endian length, the JSON message) and end with an end-of-stream envelope (flag
//! 0x02) carrying any error. The binary codec (`application/proto`) is refused with 415:
//! there is no published schema to give it meaning (docs/dockercloud-simulator.md).

use std::time::Duration;

use bytes::Bytes;
use serde_json::{Value, json};

use crate::error::{ApiError, Code};
use crate::http::{Reply, bytes_reply, json_reply};

/// Largest unary request or stream message the simulator reads (Connect's servers
/// default to 4 MiB; Docker's limit is not published).
pub const MAX_MESSAGE: usize = 4 << 20;
/// Largest whole streaming request body (an upload of many files).
pub const MAX_STREAM_BODY: usize = 64 << 20;

const FLAG_COMPRESSED: u8 = 0x01;
const FLAG_END_STREAM: u8 = 0x02;

/// What went wrong before a handler could run: answered as the protocol says.
pub enum Refusal {
    /// 415 Unsupported Media Type (wrong codec).
    MediaType,
    /// A Connect error.
    Error(ApiError),
}

impl From<ApiError> for Refusal {
    fn from(e: ApiError) -> Refusal {
        Refusal::Error(e)
    }
}

fn content_type(headers: &http::HeaderMap) -> String {
    headers
        .get(hyper::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase()
}

/// Checks the request headers of a call: its codec and, when sent, the protocol version.
pub fn check_headers(headers: &http::HeaderMap, streaming: bool) -> Result<(), Refusal> {
    let want = if streaming {
        "application/connect+json"
    } else {
        "application/json"
    };
    if content_type(headers) != want {
        return Err(Refusal::MediaType);
    }
    if let Some(version) = headers.get("connect-protocol-version")
        && version.as_bytes() != b"1"
    {
        return Err(ApiError::invalid("connect-protocol-version must be \"1\"").into());
    }
    Ok(())
}

/// The client's deadline (`Connect-Timeout-Ms`), if it sent one.
pub fn deadline(headers: &http::HeaderMap) -> Option<Duration> {
    let ms: u64 = headers
        .get("connect-timeout-ms")?
        .to_str()
        .ok()?
        .trim()
        .parse()
        .ok()?;
    Some(Duration::from_millis(ms))
}

/// Parses a unary request body: one JSON object (an empty body is the empty message).
pub fn parse_unary(body: &Bytes) -> Result<Value, ApiError> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Ok(json!({}));
    }
    match serde_json::from_slice::<Value>(body) {
        Ok(value @ Value::Object(_)) => Ok(value),
        Ok(_) => Err(ApiError::invalid("request message must be a JSON object")),
        Err(e) => Err(ApiError::invalid(format!("unmarshal request: {e}"))),
    }
}

/// The answer to a unary call.
pub fn unary_reply(result: Result<Value, Refusal>) -> Reply {
    match result {
        Ok(value) => json_reply(200, &value),
        Err(Refusal::MediaType) => {
            let reply = bytes_reply(415, "text/plain", Vec::new());
            crate::http::with_header(reply, "accept-post", "application/json")
        }
        Err(Refusal::Error(e)) => json_reply(e.code.http_status(), &e.connect_json()),
    }
}

/// Splits a streaming request body into its messages. Every envelope must be whole and
/// uncompressed (no compression was negotiated), at most [`MAX_MESSAGE`] bytes.
pub fn decode_envelopes(body: &[u8]) -> Result<Vec<Value>, ApiError> {
    let mut messages = Vec::new();
    let mut rest = body;
    while !rest.is_empty() {
        if rest.len() < 5 {
            return Err(ApiError::invalid("protocol error: incomplete envelope"));
        }
        let flags = rest[0];
        let len = u32::from_be_bytes([rest[1], rest[2], rest[3], rest[4]]) as usize;
        if len > MAX_MESSAGE {
            return Err(ApiError::new(
                Code::ResourceExhausted,
                format!("message size {len} is larger than configured max {MAX_MESSAGE}"),
            ));
        }
        if rest.len() < 5 + len {
            return Err(ApiError::invalid("protocol error: incomplete envelope"));
        }
        if flags & FLAG_COMPRESSED != 0 {
            return Err(ApiError::internal(
                "protocol error: received compressed message without connect-content-encoding",
            ));
        }
        if flags & FLAG_END_STREAM != 0 {
            return Err(ApiError::invalid(
                "protocol error: end-of-stream flag in a request",
            ));
        }
        let message = &rest[5..5 + len];
        match serde_json::from_slice::<Value>(message) {
            Ok(value @ Value::Object(_)) => messages.push(value),
            _ => return Err(ApiError::invalid("unmarshal message: not a JSON object")),
        }
        rest = &rest[5 + len..];
    }
    Ok(messages)
}

/// One envelope.
pub fn envelope(flags: u8, message: &Value) -> Vec<u8> {
    let body = message.to_string().into_bytes();
    let mut out = Vec::with_capacity(5 + body.len());
    out.push(flags);
    out.extend_from_slice(&(body.len() as u32).to_be_bytes());
    out.extend_from_slice(&body);
    out
}

/// A streaming answer: the messages, then the end-of-stream envelope with `end`'s error.
/// Errors of a streaming call travel there, under HTTP 200.
pub fn stream_reply(messages: &[Value], end: Option<&ApiError>) -> Reply {
    let mut body = Vec::new();
    for message in messages {
        body.extend(envelope(0, message));
    }
    let trailer = match end {
        Some(e) => json!({ "error": e.connect_json() }),
        None => json!({}),
    };
    body.extend(envelope(FLAG_END_STREAM, &trailer));
    bytes_reply(200, "application/connect+json", body)
}

/// A streaming call refused before it started.
pub fn stream_refusal(refusal: Refusal) -> Reply {
    match refusal {
        Refusal::MediaType => {
            let reply = bytes_reply(415, "text/plain", Vec::new());
            crate::http::with_header(reply, "accept-post", "application/connect+json")
        }
        Refusal::Error(e) => stream_reply(&[], Some(&e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn envelopes_round_trip() {
        let mut body = envelope(0, &json!({"a": 1}));
        body.extend(envelope(0, &json!({"b": "x"})));
        let decoded = decode_envelopes(&body).unwrap();
        assert_eq!(decoded, vec![json!({"a": 1}), json!({"b": "x"})]);
    }

    #[test]
    fn a_cut_or_compressed_envelope_is_refused() {
        let body = envelope(0, &json!({"a": 1}));
        assert!(decode_envelopes(&body[..body.len() - 1]).is_err());
        let mut compressed = body.clone();
        compressed[0] = FLAG_COMPRESSED;
        assert_eq!(
            decode_envelopes(&compressed).unwrap_err().code,
            Code::Internal
        );
    }
}
