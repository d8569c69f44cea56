//! A long-lived envd process whose stdin and stdout the daemon holds (a cell relay): `Start`
//! with `stdin: true` as a Connect server stream, its first event naming the pid; stdin by the
//! unary `SendInput` (base64 bytes), end of file by `CloseStdin`, both selecting the process by
//! pid, as E2B's SDK does.

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use bytes::{Buf, Bytes, BytesMut};
use http::{HeaderValue, Method, StatusCode};
use http_body_util::BodyExt;

use super::{Command, EnvdError, Frame, MAX_FRAME};
use crate::provider::guest::output::Capped;

/// The budget of one `SendInput` or `CloseStdin`.
const UNARY_BUDGET: std::time::Duration = std::time::Duration::from_secs(10);

/// A held process's stdin.
pub struct HeldStdin {
    envd: super::Envd,
    pid: u32,
    closed: bool,
}

/// A held process's stdout (its stderr kept to a cap, for the log).
pub struct HeldStdout {
    body: hyper::body::Incoming,
    stream: HeldStream,
}

/// What a held process's stream said so far: the bytes of an envelope not yet whole, stdout
/// not yet taken, stderr up to its cap, and whether the stream ended.
pub(crate) struct HeldStream {
    pub(crate) buf: BytesMut,
    pub(crate) pending: Vec<Vec<u8>>,
    pub(crate) stderr: Capped,
    pub(crate) ended: bool,
}

impl super::Envd {
    /// Starts `command` with stdin open and answers its two ends once envd named its pid.
    /// `lifetime` is the stream's `Connect-Timeout-Ms`: envd ends the process after it.
    pub async fn start_held(
        &self,
        command: &Command<'_>,
    ) -> Result<(HeldStdin, HeldStdout), EnvdError> {
        let body = self.start(command, true, UNARY_BUDGET).await?;
        let mut stdout = HeldStdout {
            body,
            stream: HeldStream::new(command.stderr_cap),
        };
        let pid = match tokio::time::timeout(UNARY_BUDGET, stdout.until_pid()).await {
            Ok(Some(pid)) => pid,
            Ok(None) => {
                return Err(EnvdError::Framing(
                    "the process stream ended before its start event".to_owned(),
                ));
            }
            Err(_) => {
                return Err(EnvdError::Framing(
                    "no start event within the budget".to_owned(),
                ));
            }
        };
        let stdin = HeldStdin {
            envd: self.clone(),
            pid,
            closed: false,
        };
        Ok((stdin, stdout))
    }

    /// One unary `process.Process` call in the Connect JSON codec; `Err` unless it answered 200.
    async fn unary(&self, method: &str, message: &serde_json::Value) -> Result<(), EnvdError> {
        let mut headers = self.headers.clone();
        headers.insert(
            http::header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        headers.insert("connect-protocol-version", HeaderValue::from_static("1"));
        let response = self
            .client
            .send(
                Method::POST,
                &format!("/process.Process/{method}"),
                headers,
                Bytes::from(message.to_string()),
                self.host.as_deref(),
                UNARY_BUDGET,
            )
            .await?;
        if response.status != StatusCode::OK {
            return Err(EnvdError::Refused(response.error_text().await));
        }
        Ok(())
    }
}

// === impl HeldStdin ===

impl HeldStdin {
    /// Writes `bytes` to the process's stdin.
    pub async fn write(&mut self, bytes: &[u8]) -> Result<(), EnvdError> {
        if self.closed {
            return Err(EnvdError::Refused("stdin is closed".to_owned()));
        }
        let message = serde_json::json!({
            "process": {"pid": self.pid},
            "input": {"stdin": STANDARD.encode(bytes)},
        });
        self.envd.unary("SendInput", &message).await
    }

    /// Closes the process's stdin (end of file), once.
    pub async fn close(&mut self) {
        if std::mem::replace(&mut self.closed, true) {
            return;
        }
        let message = serde_json::json!({"process": {"pid": self.pid}});
        if let Err(e) = self.envd.unary("CloseStdin", &message).await {
            tracing::debug!(error = %e, "envd did not close a held process's stdin");
        }
    }
}

// === impl HeldStdout ===

impl HeldStdout {
    /// Reads until the start event; its pid, or `None` when the stream ended first.
    async fn until_pid(&mut self) -> Option<u32> {
        loop {
            match self.stream.parse() {
                Ok(Some(pid)) => return Some(pid),
                Ok(None) if self.stream.ended => return None,
                Ok(None) => {}
                Err(e) => {
                    tracing::debug!(error = %e, "a held process's stream broke");
                    self.stream.ended = true;
                    return None;
                }
            }
            self.read().await;
        }
    }

    /// The next stdout bytes, or `None` once the stream ended.
    pub async fn next(&mut self) -> Option<Vec<u8>> {
        loop {
            if !self.stream.pending.is_empty() {
                return Some(self.stream.pending.remove(0));
            }
            if self.stream.ended {
                return None;
            }
            if let Err(e) = self.stream.parse() {
                tracing::debug!(error = %e, "a held process's stream broke");
                self.stream.ended = true;
                continue;
            }
            if self.stream.pending.is_empty() && !self.stream.ended {
                self.read().await;
            }
        }
    }

    /// What the process wrote to stderr so far (up to the cap).
    pub fn stderr(&self) -> &[u8] {
        self.stream.stderr.bytes()
    }

    /// Reads one more piece of the body; the stream ends on its end or an error.
    async fn read(&mut self) {
        match self.body.frame().await {
            Some(Ok(frame)) => {
                if let Ok(data) = frame.into_data() {
                    self.stream.buf.extend_from_slice(&data);
                }
            }
            Some(Err(_)) | None => self.stream.ended = true,
        }
    }
}

// === impl HeldStream ===

impl HeldStream {
    /// A stream nothing was read from yet, its stderr kept up to `stderr_cap` bytes.
    pub(crate) fn new(stderr_cap: usize) -> HeldStream {
        HeldStream {
            buf: BytesMut::new(),
            pending: Vec::new(),
            stderr: Capped::new(stderr_cap),
            ended: false,
        }
    }

    /// Takes every whole envelope off the buffer: output to `pending` or the stderr cap, the
    /// end of the process or of the stream to `ended`. Answers the pid a start event named.
    pub(crate) fn parse(&mut self) -> Result<Option<u32>, EnvdError> {
        let mut pid = None;
        while self.buf.len() >= 5 && !self.ended {
            let flags = self.buf[0];
            let len = u32::from_be_bytes([self.buf[1], self.buf[2], self.buf[3], self.buf[4]]);
            let len = usize::try_from(len).unwrap_or(usize::MAX);
            if len > MAX_FRAME {
                return Err(EnvdError::Framing("an envelope over the limit".to_owned()));
            }
            if self.buf.len() < 5 + len {
                break;
            }
            self.buf.advance(5);
            let payload = self.buf.split_to(len);
            if flags & 0x02 != 0 {
                self.ended = true;
                break;
            }
            let frame: Frame = serde_json::from_slice(&payload)
                .map_err(|e| EnvdError::Framing(format!("event: {e}")))?;
            let Some(event) = frame.event else { continue };
            if let Some(start) = event.start {
                pid = Some(start.pid);
            }
            if let Some(data) = event.data {
                if let Some(text) = data.stdout {
                    let bytes = STANDARD
                        .decode(text)
                        .map_err(|e| EnvdError::Framing(format!("output: {e}")))?;
                    self.pending.push(bytes);
                }
                if let Some(text) = data.stderr {
                    let bytes = STANDARD
                        .decode(text)
                        .map_err(|e| EnvdError::Framing(format!("output: {e}")))?;
                    self.stderr.push(&bytes);
                }
            }
            if event.end.is_some() {
                self.ended = true;
            }
        }
        Ok(pid)
    }
}
