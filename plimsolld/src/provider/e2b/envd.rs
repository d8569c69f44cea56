//! A VM's envd (grants.md §6.4): `process.Process/Start` as a Connect server stream with the
//! JSON codec and `Connect-Timeout-Ms` (envd kills the process at that deadline), multipart
//! upload and download on `/files`. Every call carries `X-Access-Token` and
//! `e2b-traffic-access-token`, and selects the user with Basic auth (`user`, empty password).
//!
//! Output is kept up to a cap per stream; a frame over 8 MiB or a stream over 32 MiB ends the
//! run as a failed user run (exit 153, both streams truncated). A stream without an `end`
//! event is never an exit 0: it is a deadline (envd's `deadline_exceeded`) or a lost VM.

use std::sync::Arc;
use std::time::{Duration, Instant};

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use bytes::{Buf, Bytes, BytesMut};
use http::{HeaderMap, HeaderValue, Method, StatusCode};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use serde::Deserialize;

use super::api::encode;
use super::config::{BaseUrl, EnvdRoute};
use super::http::{Client, HttpError};
use crate::provider::guest::output::Capped;

mod held;
#[cfg(feature = "fuzzing")]
pub(super) use held::HeldStream;
pub use held::{HeldStdin, HeldStdout};

/// envd's port.
const ENVD_PORT: &str = "49983";
/// The user code runs as.
pub const USER: &str = "user";
/// The largest Connect frame accepted.
const MAX_FRAME: usize = 8 << 20;
/// The largest whole stream accepted.
const MAX_STREAM: usize = 32 << 20;
/// The exit of a run whose output overflowed the stream bound.
pub const EXIT_FLOOD: i32 = 153;
/// The exit of a run its deadline ended.
pub const EXIT_TIMED_OUT: i32 = 124;
/// The bound on a file call.
const FILE_BOUND: Duration = Duration::from_secs(60);
/// What our own timer adds to envd's deadline before the stream is given up.
const DEADLINE_SLACK: Duration = Duration::from_secs(3);

/// Why an envd call failed.
#[derive(Debug, thiserror::Error)]
pub enum EnvdError {
    /// No response.
    #[error(transparent)]
    Http(#[from] HttpError),
    /// A status or Connect error envd answered with (cut and scrubbed).
    #[error("envd answered {0}")]
    Refused(String),
    /// A stream that broke the Connect framing.
    #[error("envd's stream: {0}")]
    Framing(String),
}

/// How a process ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ending {
    /// Its `end` event, with the exit code.
    Exited(i32),
    /// The deadline passed first.
    TimedOut,
    /// The output overflowed the stream bound; the run was abandoned.
    Flooded,
    /// The stream ended without an `end` event and not at the deadline: the VM went away.
    Lost,
}

/// A finished process.
#[derive(Debug)]
pub struct Finished {
    pub stdout: Capped,
    pub stderr: Capped,
    pub ending: Ending,
    pub duration: Duration,
}

/// One process to start.
pub struct Command<'a> {
    pub cmd: &'a str,
    pub args: &'a [&'a str],
    pub cwd: Option<&'a str>,
    pub envs: &'a [(&'a str, &'a str)],
    pub timeout: Duration,
    pub stdout_cap: usize,
    pub stderr_cap: usize,
}

/// One VM's envd.
#[derive(Clone)]
pub struct Envd {
    client: Client,
    headers: HeaderMap,
    host: Option<String>,
}

impl std::fmt::Debug for Envd {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Envd")
    }
}

fn sensitive(value: &str) -> Result<HeaderValue, HttpError> {
    let mut v = HeaderValue::from_str(value).map_err(|e| HttpError::Build(e.to_string()))?;
    v.set_sensitive(true);
    Ok(v)
}

impl Envd {
    /// The envd of sandbox `id` (already checked by [`super::api::valid_id`]).
    pub fn new(
        route: &EnvdRoute,
        tls: Option<Arc<rustls::ClientConfig>>,
        id: &str,
        access_token: &str,
        traffic_token: &str,
    ) -> Result<Envd, HttpError> {
        let mut headers = HeaderMap::new();
        headers.insert("x-access-token", sensitive(access_token)?);
        headers.insert("e2b-traffic-access-token", sensitive(traffic_token)?);
        let user = STANDARD.encode(format!("{USER}:"));
        headers.insert(
            http::header::AUTHORIZATION,
            sensitive(&format!("Basic {user}"))?,
        );
        let (client, host) = match route {
            EnvdRoute::Domain(domain) => {
                let host = format!("{ENVD_PORT}-{id}.{domain}");
                let base = BaseUrl {
                    tls: true,
                    host: host.clone(),
                    port: 443,
                };
                (Client::new(base, tls), Some(host))
            }
            EnvdRoute::Base(base) => {
                headers.insert(
                    "e2b-sandbox-id",
                    HeaderValue::from_str(id).map_err(|e| HttpError::Build(e.to_string()))?,
                );
                headers.insert("e2b-sandbox-port", HeaderValue::from_static(ENVD_PORT));
                (Client::new(base.clone(), tls), None)
            }
        };
        Ok(Envd {
            client,
            headers,
            host,
        })
    }

    /// The same envd, but its processes and files are `root`'s: the session's cleanup and
    /// checks between calls, never the caller's code.
    pub fn as_root(&self) -> Result<Envd, HttpError> {
        let mut root = self.clone();
        let basic = STANDARD.encode("root:");
        root.headers.insert(
            http::header::AUTHORIZATION,
            sensitive(&format!("Basic {basic}"))?,
        );
        Ok(root)
    }

    /// Writes every `(absolute path, content)` in one multipart request, as `user`.
    pub async fn upload(&self, files: &[(String, Vec<u8>)]) -> Result<(), EnvdError> {
        let boundary = format!("plimsoll-{}", hex::encode(rand::random::<[u8; 12]>()));
        let mut body = Vec::new();
        for (path, content) in files {
            // Paths were validated (clean, no quotes or newlines can reach here).
            body.extend_from_slice(
                format!(
                    "--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"{}\"\r\nContent-Type: application/octet-stream\r\n\r\n",
                    path.replace(['"', '\r', '\n'], "_")
                )
                .as_bytes(),
            );
            body.extend_from_slice(content);
            body.extend_from_slice(b"\r\n");
        }
        body.extend_from_slice(format!("--{boundary}--\r\n").as_bytes());
        let mut headers = self.headers.clone();
        headers.insert(
            http::header::CONTENT_TYPE,
            HeaderValue::from_str(&format!("multipart/form-data; boundary={boundary}"))
                .map_err(|e| EnvdError::Http(HttpError::Build(e.to_string())))?,
        );
        let response = self
            .client
            .send(
                Method::POST,
                &format!("/files?username={USER}"),
                headers,
                Bytes::from(body),
                self.host.as_deref(),
                FILE_BOUND,
            )
            .await?;
        if response.status != StatusCode::OK {
            return Err(EnvdError::Refused(response.error_text().await));
        }
        Ok(())
    }

    /// Reads `path` (absolute) as `user`, at most `limit` bytes; `None` when absent or a
    /// directory. `Err` with `Refused("too large")` when over the limit.
    pub async fn download(&self, path: &str, limit: usize) -> Result<Option<Vec<u8>>, EnvdError> {
        let response = self
            .client
            .send(
                Method::GET,
                &format!("/files?path={}&username={USER}", encode(path)),
                self.headers.clone(),
                Bytes::new(),
                self.host.as_deref(),
                FILE_BOUND,
            )
            .await?;
        match response.status {
            StatusCode::OK => {}
            StatusCode::NOT_FOUND | StatusCode::BAD_REQUEST => return Ok(None),
            _ => return Err(EnvdError::Refused(response.error_text().await)),
        }
        response
            .bytes(limit, FILE_BOUND)
            .await
            .map(|b| Some(b.to_vec()))
            .map_err(EnvdError::Refused)
    }

    /// The `Start` request for `command`: its headers and its one enveloped message.
    fn start_request(
        &self,
        command: &Command<'_>,
        stdin: bool,
    ) -> Result<(HeaderMap, Vec<u8>), EnvdError> {
        let envs: serde_json::Map<String, serde_json::Value> = command
            .envs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), serde_json::Value::from(*v)))
            .collect();
        let mut process =
            serde_json::json!({"cmd": command.cmd, "args": command.args, "envs": envs});
        if let Some(cwd) = command.cwd {
            process["cwd"] = serde_json::Value::from(cwd);
        }
        let message = serde_json::to_vec(&serde_json::json!({"process": process, "stdin": stdin}))
            .map_err(|e| EnvdError::Framing(e.to_string()))?;
        let mut body = Vec::with_capacity(message.len() + 5);
        body.push(0);
        body.extend_from_slice(
            &u32::try_from(message.len())
                .unwrap_or(u32::MAX)
                .to_be_bytes(),
        );
        body.extend_from_slice(&message);
        let mut headers = self.headers.clone();
        headers.insert(
            http::header::CONTENT_TYPE,
            HeaderValue::from_static("application/connect+json"),
        );
        headers.insert("connect-protocol-version", HeaderValue::from_static("1"));
        let timeout_ms = command.timeout.as_millis().max(1);
        headers.insert(
            "connect-timeout-ms",
            HeaderValue::from_str(&timeout_ms.to_string())
                .map_err(|e| EnvdError::Http(HttpError::Build(e.to_string())))?,
        );
        Ok((headers, body))
    }

    /// Sends `command`'s `Start` (within `budget` for the answer's head) and answers the
    /// stream's body once envd accepted it.
    pub(super) async fn start(
        &self,
        command: &Command<'_>,
        stdin: bool,
        budget: Duration,
    ) -> Result<Incoming, EnvdError> {
        let (headers, body) = self.start_request(command, stdin)?;
        let response = self
            .client
            .send(
                Method::POST,
                "/process.Process/Start",
                headers,
                Bytes::from(body),
                self.host.as_deref(),
                budget,
            )
            .await?;
        if response.status != StatusCode::OK {
            return Err(EnvdError::Refused(response.error_text().await));
        }
        Ok(response.body)
    }

    /// Starts `command` and follows its stream to the end, the deadline or a loss.
    pub async fn run(&self, command: &Command<'_>) -> Result<Finished, EnvdError> {
        let started = Instant::now();
        let mut finished = Finished {
            stdout: Capped::new(command.stdout_cap),
            stderr: Capped::new(command.stderr_cap),
            ending: Ending::Lost,
            duration: Duration::ZERO,
        };
        let deadline = tokio::time::Instant::now() + command.timeout + DEADLINE_SLACK;
        let stream = async {
            let body = self
                .start(command, false, command.timeout + DEADLINE_SLACK)
                .await?;
            follow(body, &mut finished).await
        };
        let ending = match tokio::time::timeout_at(deadline, stream).await {
            Ok(Ok(ending)) => ending,
            Ok(Err(e)) => return Err(e),
            Err(_) => Ending::TimedOut,
        };
        finished.ending = ending;
        finished.duration = started.elapsed();
        Ok(finished)
    }
}

#[derive(Deserialize)]
struct Frame {
    #[serde(default)]
    event: Option<Event>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Event {
    #[serde(default)]
    start: Option<Start>,
    #[serde(default)]
    data: Option<Data>,
    #[serde(default)]
    end: Option<End>,
}

#[derive(Deserialize)]
struct Start {
    pid: u32,
}

#[derive(Deserialize)]
struct Data {
    #[serde(default)]
    stdout: Option<String>,
    #[serde(default)]
    stderr: Option<String>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct End {
    /// Left out for 0 (envd omits zero values).
    #[serde(default)]
    exit_code: i32,
}

#[derive(Deserialize)]
struct EndStream {
    #[serde(default)]
    error: Option<ConnectError>,
}

#[derive(Deserialize)]
struct ConnectError {
    #[serde(default)]
    code: String,
    #[serde(default)]
    message: String,
}

/// Reads frames until the end-of-stream frame; the ending they show.
async fn follow(mut body: hyper::body::Incoming, out: &mut Finished) -> Result<Ending, EnvdError> {
    let mut envelopes = Envelopes::default();
    loop {
        match body.frame().await {
            Some(Ok(frame)) => {
                if let Ok(data) = frame.into_data()
                    && let Some(ending) = envelopes.feed(&data, out)?
                {
                    return Ok(ending);
                }
            }
            // The connection dropped: an exit already seen still counts (the end frame was
            // lost), otherwise the VM went away.
            Some(Err(_)) | None => return Ok(envelopes.dropped()),
        }
    }
}

/// A process stream as it arrives: Connect envelopes, each an event or the end of the stream.
#[derive(Default)]
pub(super) struct Envelopes {
    buf: BytesMut,
    total: usize,
    exit: Option<i32>,
}

impl Envelopes {
    /// Takes the stream's next `data`, its output into `out`; the ending once the stream
    /// shows one.
    pub(super) fn feed(
        &mut self,
        data: &[u8],
        out: &mut Finished,
    ) -> Result<Option<Ending>, EnvdError> {
        self.total += data.len();
        if self.total > MAX_STREAM {
            return Ok(Some(flood(out)));
        }
        self.buf.extend_from_slice(data);
        while self.buf.len() >= 5 {
            let flags = self.buf[0];
            let len =
                u32::from_be_bytes([self.buf[1], self.buf[2], self.buf[3], self.buf[4]]) as usize;
            if len > MAX_FRAME {
                return Ok(Some(flood(out)));
            }
            if self.buf.len() < 5 + len {
                break;
            }
            self.buf.advance(5);
            let payload = self.buf.split_to(len);
            if flags & 0x02 != 0 {
                let end: EndStream =
                    serde_json::from_slice(if payload.is_empty() { b"{}" } else { &payload })
                        .map_err(|e| EnvdError::Framing(format!("end frame: {e}")))?;
                return Ok(Some(match (end.error, self.exit) {
                    (Some(e), _) if e.code == "deadline_exceeded" => Ending::TimedOut,
                    (Some(e), None) => {
                        return Err(EnvdError::Refused(super::http::scrub(&format!(
                            "{}: {}",
                            e.code, e.message
                        ))));
                    }
                    (_, Some(code)) => Ending::Exited(code),
                    (None, None) => Ending::Lost,
                }));
            }
            let frame: Frame = serde_json::from_slice(&payload)
                .map_err(|e| EnvdError::Framing(format!("event: {e}")))?;
            let Some(event) = frame.event else { continue };
            if let Some(data) = event.data {
                for (text, stream) in [
                    (data.stdout, &mut out.stdout),
                    (data.stderr, &mut out.stderr),
                ] {
                    if let Some(text) = text {
                        let bytes = STANDARD
                            .decode(text)
                            .map_err(|e| EnvdError::Framing(format!("output: {e}")))?;
                        stream.push(&bytes);
                    }
                }
            }
            if let Some(end) = event.end {
                self.exit = Some(end.exit_code);
            }
        }
        Ok(None)
    }

    /// The ending of a stream that broke off before its end frame: the exit already seen,
    /// otherwise a lost VM.
    pub(super) fn dropped(&self) -> Ending {
        self.exit.map_or(Ending::Lost, Ending::Exited)
    }
}

/// A flooded run: both streams marked truncated.
fn flood(out: &mut Finished) -> Ending {
    out.stdout.mark_truncated();
    out.stderr.mark_truncated();
    Ending::Flooded
}
