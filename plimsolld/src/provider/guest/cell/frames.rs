//! The relay's side of the per-cell protocol as the host reads it (providers.md §9.6): one JSON
//! object per line, each line at most [`MAX_FRAME`] bytes, at most [`QUEUE`] read ahead of the
//! host. A line that is too long, not JSON or not a known frame ends the relay's stream: the
//! host then treats the interpreter as lost.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use base64::Engine as _;
use serde_json::Value;
use tokio::sync::mpsc;

use crate::provider::guest::HeldOutput;

/// The longest frame line accepted.
pub const MAX_FRAME: usize = 128 * 1024;
/// Frames read ahead of the host; the reader waits when the queue is full.
pub const QUEUE: usize = 64;

/// One frame from the relay.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Frame {
    /// The relay's first line: its own identity.
    Ready(String),
    /// The files are written and the interpreter is listening.
    Prepared { n: String },
    /// A piece of the cell's stdout.
    Stdout { n: String, bytes: Vec<u8> },
    /// A piece of the cell's stderr.
    Stderr { n: String, bytes: Vec<u8> },
    /// The step ended: 0 ran, 1 raised, 3 a file was refused, 75 no interpreter, 76 the
    /// interpreter went away during the cell.
    Done {
        n: String,
        code: i64,
        file: Option<u64>,
        errno: Option<String>,
        stdout_truncated: bool,
        stderr_truncated: bool,
    },
}

/// Why the relay's stream ended.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    /// The relay's output ended (it exited, or the provider dropped its command).
    #[error("the relay's output ended")]
    Ended,
    /// A line longer than [`MAX_FRAME`].
    #[error("the relay sent a frame longer than {MAX_FRAME} bytes")]
    TooLong,
    /// A line that is not a known frame.
    #[error("the relay sent a malformed frame: {0}")]
    Malformed(String),
}

// === impl Frame ===

impl Frame {
    /// The cell nonce a frame carries (`None` for the ready line).
    pub fn nonce(&self) -> Option<&str> {
        match self {
            Frame::Ready(_) => None,
            Frame::Prepared { n }
            | Frame::Stdout { n, .. }
            | Frame::Stderr { n, .. }
            | Frame::Done { n, .. } => Some(n),
        }
    }

    /// Parses one line.
    pub fn parse(line: &[u8]) -> Result<Frame, FrameError> {
        let malformed = |why: &str| FrameError::Malformed(why.to_owned());
        let value: Value = serde_json::from_slice(line).map_err(|_| malformed("not JSON"))?;
        let object = value
            .as_object()
            .ok_or_else(|| malformed("not an object"))?;
        if let Some(ready) = object.get("ready") {
            let ready = ready.as_str().ok_or_else(|| malformed("ready"))?;
            return Ok(Frame::Ready(ready.to_owned()));
        }
        let n = object
            .get("n")
            .and_then(Value::as_str)
            .ok_or_else(|| malformed("no nonce"))?
            .to_owned();
        let piece = |key: &str| -> Result<Option<Vec<u8>>, FrameError> {
            match object.get(key) {
                None => Ok(None),
                Some(v) => {
                    let text = v.as_str().ok_or_else(|| malformed(key))?;
                    base64::engine::general_purpose::STANDARD
                        .decode(text)
                        .map(Some)
                        .map_err(|_| malformed(key))
                }
            }
        };
        if object.get("prepared") == Some(&Value::Bool(true)) {
            return Ok(Frame::Prepared { n });
        }
        if let Some(bytes) = piece("o")? {
            return Ok(Frame::Stdout { n, bytes });
        }
        if let Some(bytes) = piece("e")? {
            return Ok(Frame::Stderr { n, bytes });
        }
        let code = object
            .get("done")
            .and_then(Value::as_i64)
            .ok_or_else(|| malformed("no known field"))?;
        let flag = |key: &str| object.get(key).and_then(Value::as_bool).unwrap_or(false);
        Ok(Frame::Done {
            code,
            file: object.get("file").and_then(Value::as_u64),
            errno: object
                .get("errno")
                .and_then(Value::as_str)
                .map(|e| e.chars().take(32).collect()),
            stdout_truncated: flag("ot"),
            stderr_truncated: flag("et"),
            n,
        })
    }
}

/// Splits a byte stream into lines of at most [`MAX_FRAME`] bytes.
#[derive(Debug, Default)]
pub struct Lines {
    partial: Vec<u8>,
}

// === impl Lines ===

impl Lines {
    /// The complete lines `bytes` finishes, newline excluded.
    pub fn push(&mut self, mut bytes: &[u8]) -> Result<Vec<Vec<u8>>, FrameError> {
        let mut lines = Vec::new();
        while let Some(at) = bytes.iter().position(|b| *b == b'\n') {
            if self.partial.len() + at > MAX_FRAME {
                return Err(FrameError::TooLong);
            }
            let mut line = std::mem::take(&mut self.partial);
            line.extend_from_slice(&bytes[..at]);
            lines.push(line);
            bytes = &bytes[at + 1..];
        }
        if self.partial.len() + bytes.len() > MAX_FRAME {
            return Err(FrameError::TooLong);
        }
        self.partial.extend_from_slice(bytes);
        Ok(lines)
    }
}

/// Reads the relay's frames into a queue of [`QUEUE`] until its stream ends or breaks the
/// protocol; the last item is then the error, and `alive` turns false.
pub fn spawn_reader(
    mut stdout: Box<dyn HeldOutput>,
    alive: Arc<AtomicBool>,
) -> (
    mpsc::Receiver<Result<Frame, FrameError>>,
    tokio::task::JoinHandle<()>,
) {
    let (tx, rx) = mpsc::channel(QUEUE);
    let task = tokio::spawn(async move {
        let mut lines = Lines::default();
        let error = 'read: loop {
            let Some(bytes) = stdout.next().await else {
                break FrameError::Ended;
            };
            let complete = match lines.push(&bytes) {
                Ok(complete) => complete,
                Err(e) => break e,
            };
            for line in complete {
                match Frame::parse(&line) {
                    Ok(frame) => {
                        if tx.send(Ok(frame)).await.is_err() {
                            return;
                        }
                    }
                    Err(e) => break 'read e,
                }
            }
        };
        alive.store(false, Ordering::SeqCst);
        let stderr = String::from_utf8_lossy(stdout.stderr()).into_owned();
        if !stderr.is_empty() {
            tracing::debug!(relay_stderr = %stderr, error = %error, "cell relay ended");
        }
        let _ = tx.send(Err(error)).await;
    });
    (rx, task)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_relay_frame_parses() {
        let n = "0123456789abcdef0123456789abcdef".to_owned();
        assert_eq!(
            Frame::parse(br#"{"ready":"1:2:ab"}"#),
            Ok(Frame::Ready("1:2:ab".into()))
        );
        let p = format!(r#"{{"n":"{n}","prepared":true}}"#);
        assert_eq!(
            Frame::parse(p.as_bytes()),
            Ok(Frame::Prepared { n: n.clone() })
        );
        let o = format!(r#"{{"n":"{n}","o":"aGk="}}"#);
        assert_eq!(
            Frame::parse(o.as_bytes()),
            Ok(Frame::Stdout {
                n: n.clone(),
                bytes: b"hi".to_vec()
            })
        );
        let d = format!(r#"{{"n":"{n}","done":3,"file":2,"errno":"ELOOP"}}"#);
        assert_eq!(
            Frame::parse(d.as_bytes()),
            Ok(Frame::Done {
                n: n.clone(),
                code: 3,
                file: Some(2),
                errno: Some("ELOOP".into()),
                stdout_truncated: false,
                stderr_truncated: false
            })
        );
        let d = format!(r#"{{"n":"{n}","done":0,"ot":true,"et":false}}"#);
        assert!(matches!(
            Frame::parse(d.as_bytes()),
            Ok(Frame::Done {
                code: 0,
                stdout_truncated: true,
                ..
            })
        ));
    }

    #[test]
    fn malformed_frames_are_refused() {
        for bad in [
            &b"not json"[..],
            b"[1]",
            br#"{"o":"aGk="}"#,
            br#"{"n":"x","o":"***"}"#,
            br#"{"n":"x","done":"0"}"#,
            br#"{"n":"x"}"#,
        ] {
            assert!(
                Frame::parse(bad).is_err(),
                "{}",
                String::from_utf8_lossy(bad)
            );
        }
    }

    #[test]
    fn lines_split_across_pieces_and_overlong_lines_are_refused() {
        let mut lines = Lines::default();
        assert_eq!(lines.push(b"ab").unwrap(), Vec::<Vec<u8>>::new());
        assert_eq!(
            lines.push(b"c\nd\ne").unwrap(),
            vec![b"abc".to_vec(), b"d".to_vec()]
        );
        assert_eq!(lines.push(b"\n").unwrap(), vec![b"e".to_vec()]);
        let mut long = Lines::default();
        assert!(long.push(&vec![b'x'; MAX_FRAME]).is_ok());
        assert_eq!(long.push(b"x"), Err(FrameError::TooLong));
        let mut long = Lines::default();
        let mut exact = vec![b'x'; MAX_FRAME];
        exact.push(b'\n');
        assert_eq!(long.push(&exact).unwrap().len(), 1);
    }
}
