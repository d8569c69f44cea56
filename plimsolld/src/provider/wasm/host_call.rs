//! The host side of `coderunner.host_call` (grants.md §3, wasm row): a frozen ABI.
//!
//! `host_call(req_ptr, req_len, resp_ptr, resp_cap) -> i64` reads an envelope
//! `{method, path, body?}` (strict JSON, 1 to 1 MiB + 64 KiB, else 413) from guest memory,
//! relays it to the run's broker socket as one HTTP/1.1 request whose target is `path`
//! exactly, writes the response body at `resp_ptr` and returns the status in the high 32
//! bits and the body length in the low 32. A status outside 100–599 becomes 500; a body
//! that does not fit `resp_cap`, or cannot be written, is 500 with length 0.
//!
//! Only the envelope and the response body cross guest memory; the credential stays in
//! the broker. Without a grant the answer is an error status and nothing is contacted.
//! Each call has its own timeout that never outlives the run's deadline: the guest is not
//! executing while the host waits, so the epoch deadline cannot end a slow call itself.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper_util::rt::TokioIo;
use serde::Deserialize;
use tokio::net::UnixStream;

/// The largest envelope accepted: a 1 MiB body plus room for the method, path and JSON.
pub const MAX_ENVELOPE_BYTES: usize = 1024 * 1024 + 64 * 1024;
/// The longest one call may take (less when the run's deadline is nearer).
const CALL_TIMEOUT: Duration = Duration::from_secs(30);

/// Statuses the host itself answers with.
const PAYLOAD_TOO_LARGE: u32 = 413;
const BAD_REQUEST: u32 = 400;
const FORBIDDEN: u32 = 403;
const BAD_GATEWAY: u32 = 502;
const GATEWAY_TIMEOUT: u32 = 504;
const INTERNAL: u32 = 500;

/// One run's way to its broker socket; `None` in a run without a grant.
pub struct Relay {
    /// The run's `host-api.sock`.
    pub socket: PathBuf,
    /// The run's deadline: no call waits past it.
    pub deadline: Instant,
    /// The daemon's runtime, on which the call runs while this thread blocks.
    pub runtime: tokio::runtime::Handle,
}

/// The envelope the guest sends; anything else is refused.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Envelope {
    method: String,
    path: String,
    #[serde(default)]
    body: Option<serde_json::Value>,
}

/// An answer before it is written into guest memory.
pub struct Answer {
    /// The HTTP status the guest sees.
    pub status: u32,
    /// The body the guest sees.
    pub body: Vec<u8>,
}

impl Answer {
    fn text(status: u32, message: &str) -> Answer {
        Answer {
            status,
            body: format!("{message}\n").into_bytes(),
        }
    }
}

/// Packs the return value: status high, length low.
pub fn pack(status: u32, length: u32) -> i64 {
    let status = if (100..=599).contains(&status) {
        status
    } else {
        INTERNAL
    };
    ((u64::from(status) << 32) | u64::from(length)) as i64
}

/// Whether `req_len` is an acceptable envelope length.
pub fn envelope_len_ok(req_len: i32) -> bool {
    usize::try_from(req_len).is_ok_and(|n| (1..=MAX_ENVELOPE_BYTES).contains(&n))
}

/// The answer to one envelope, `resp_cap` bytes of body at most, or `None` when the run's
/// deadline passed while the call waited (the run then ends as timed out). Blocks the
/// calling (wasm) thread while the call runs on the daemon's runtime.
pub fn answer(relay: Option<&Relay>, envelope: &[u8], resp_cap: usize) -> Option<Answer> {
    if envelope.len() > MAX_ENVELOPE_BYTES {
        return Some(Answer::text(
            PAYLOAD_TOO_LARGE,
            "host api envelope too large",
        ));
    }
    let Some(relay) = relay else {
        return Some(Answer::text(FORBIDDEN, "host api: this run has no grant"));
    };
    let envelope: Envelope = match serde_json::from_slice(envelope) {
        Ok(e) => e,
        Err(e) => {
            return Some(Answer::text(
                BAD_REQUEST,
                &format!("host api envelope invalid: {e}"),
            ));
        }
    };
    let body = match &envelope.body {
        Some(v) => serde_json::to_vec(v).unwrap_or_default(),
        None => Vec::new(),
    };
    let remaining = relay.deadline.saturating_duration_since(Instant::now());
    if remaining.is_zero() {
        return None;
    }
    let bound = remaining.min(CALL_TIMEOUT);
    let call = send(relay, envelope.method, envelope.path, body, resp_cap);
    let answer = match relay
        .runtime
        .block_on(async { tokio::time::timeout(bound, call).await })
    {
        Ok(Ok(answer)) => answer,
        Ok(Err(CallError::TooLarge)) => Answer {
            status: INTERNAL,
            body: Vec::new(),
        },
        Ok(Err(CallError::Request(why))) => Answer::text(BAD_REQUEST, &why),
        Ok(Err(CallError::Broker(why))) => {
            tracing::debug!(reason = %why, "host call to the broker failed");
            Answer::text(BAD_GATEWAY, "host api unavailable")
        }
        Err(_) if Instant::now() >= relay.deadline => return None,
        Err(_) => Answer::text(GATEWAY_TIMEOUT, "host api call timed out"),
    };
    Some(answer)
}

/// Why a relayed call produced no answer.
#[derive(Debug, thiserror::Error)]
enum CallError {
    /// The method or path cannot form a request.
    #[error("{0}")]
    Request(String),
    /// The broker socket could not be reached or broke the exchange.
    #[error("{0}")]
    Broker(String),
    /// The response body exceeds what the guest offered.
    #[error("response body too large")]
    TooLarge,
}

async fn send(
    relay: &Relay,
    method: String,
    path: String,
    body: Vec<u8>,
    cap: usize,
) -> Result<Answer, CallError> {
    let method = http::Method::from_bytes(method.as_bytes())
        .map_err(|_| CallError::Request(format!("host api method {method:?} invalid")))?;
    // The target goes on the wire exactly as the guest wrote it; the broker judges it.
    let target = http::Uri::try_from(path.as_str())
        .map_err(|_| CallError::Request(format!("host api path {path:?} invalid")))?;
    let mut request = http::Request::builder()
        .method(method)
        .uri(target)
        .header(http::header::HOST, "host-api");
    if !body.is_empty() {
        request = request.header(http::header::CONTENT_TYPE, "application/json");
    }
    let request = request
        .body(Full::new(Bytes::from(body)))
        .map_err(|e| CallError::Request(format!("host api request invalid: {e}")))?;
    let stream = UnixStream::connect(&relay.socket)
        .await
        .map_err(|e| CallError::Broker(format!("connect: {e}")))?;
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(|e| CallError::Broker(format!("handshake: {e}")))?;
    // Aborted when this call ends, so a timed-out call leaves no connection behind.
    let driver = AbortOnDrop(tokio::spawn(connection));
    let response = sender
        .send_request(request)
        .await
        .map_err(|e| CallError::Broker(format!("request: {e}")))?;
    let status = u32::from(response.status().as_u16());
    let body = Limited::new(response.into_body(), cap)
        .collect()
        .await
        .map_err(|e| {
            if e.downcast_ref::<http_body_util::LengthLimitError>()
                .is_some()
            {
                CallError::TooLarge
            } else {
                CallError::Broker(format!("response body: {e}"))
            }
        })?
        .to_bytes()
        .to_vec();
    drop(driver);
    Ok(Answer { status, body })
}

/// Aborts a spawned task when dropped.
struct AbortOnDrop<T>(tokio::task::JoinHandle<T>);

impl<T> Drop for AbortOnDrop<T> {
    fn drop(&mut self) {
        self.0.abort();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_goes_high_and_length_low_and_odd_statuses_become_500() {
        assert_eq!(pack(200, 5), (200i64 << 32) | 5);
        assert_eq!(pack(99, 0) >> 32, 500);
        assert_eq!(pack(600, 7) >> 32, 500);
        assert_eq!(pack(599, 0) >> 32, 599);
    }

    #[test]
    fn envelope_lengths_outside_the_range_are_refused() {
        assert!(!envelope_len_ok(0));
        assert!(!envelope_len_ok(-1));
        assert!(envelope_len_ok(1));
        assert!(envelope_len_ok(MAX_ENVELOPE_BYTES as i32));
        assert!(!envelope_len_ok(MAX_ENVELOPE_BYTES as i32 + 1));
    }

    #[test]
    fn without_a_grant_nothing_is_contacted_and_the_status_is_an_error() {
        let a = answer(None, br#"{"method":"GET","path":"/x"}"#, 1024).unwrap();
        assert_eq!(a.status, 403);
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn unknown_fields_and_trailing_data_are_refused_before_any_call() {
        let relay = Relay {
            socket: "/nonexistent/host-api.sock".into(),
            deadline: Instant::now() + Duration::from_secs(5),
            runtime: tokio::runtime::Handle::current(),
        };
        let status = |env: &'static [u8]| {
            let relay = Relay {
                socket: relay.socket.clone(),
                deadline: relay.deadline,
                runtime: relay.runtime.clone(),
            };
            std::thread::spawn(move || answer(Some(&relay), env, 1024).unwrap().status)
                .join()
                .unwrap()
        };
        assert_eq!(status(br#"{"method":"GET","path":"/x","extra":1}"#), 400);
        assert_eq!(status(br#"{"method":"GET","path":"/x"} {}"#), 400);
        // A valid envelope reaches for the socket, which is not there.
        assert_eq!(status(br#"{"method":"GET","path":"/x"}"#), 502);
    }
}
