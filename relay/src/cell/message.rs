//! The cell relay's lines: what the daemon sends ([`Message`]) and what the relay answers
//! ([`Frame`]), one JSON object a line each way (providers.md §9.6).
//!
//! Incoming lines go through `serde_json`: they carry the caller's code and file contents, so
//! every JSON escape must be read exactly. Outgoing frames are written by hand: every value in
//! them is a nonce the relay checked (32 lowercase hex), base64, a number, a boolean, an errno
//! name or the relay's own identity, none of which needs escaping, and the key order is the
//! one the Node relay printed.

use base64::Engine as _;
use serde_json::Value;

/// The most output bytes one frame carries (before base64).
pub const PIECE: usize = 48 * 1024;

/// The largest integer a cap may be (JavaScript's `Number.MAX_SAFE_INTEGER`).
const MAX_SAFE_INTEGER: f64 = 9_007_199_254_740_991.0;

/// One file of a prepare, as the daemon sent it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FileSpec {
    /// `null`: not a file at all (the Node relay named this `EIO`).
    Null,
    /// Anything else; a field that is not a string is `None` (refused `EINVAL`).
    Entry {
        path: Option<String>,
        content: Option<String>,
    },
}

/// One line from the daemon.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Message {
    /// Write the files, then connect to the interpreter.
    Prepare { nonce: String, files: Vec<FileSpec> },
    /// Send the code to the interpreter, keeping at most the caps of its output.
    Run {
        nonce: String,
        code: String,
        out_cap: usize,
        err_cap: usize,
    },
}

/// Why a line from the daemon was refused; the relay then ends (exit 2).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum MessageError {
    #[error("a line that is not JSON")]
    NotJson,
    #[error("a message that is not an object")]
    NotObject,
    #[error("an unknown message")]
    Unknown,
    #[error("bad prepare")]
    BadPrepare,
    #[error("bad run")]
    BadRun,
}

// === impl Message ===

impl Message {
    /// Parses one line (without its newline). A line with `files` is a prepare, else one with
    /// `code` a run, as the Node relay decided.
    pub fn parse(line: &[u8]) -> Result<Message, MessageError> {
        let value: Value = serde_json::from_slice(line).map_err(|_| MessageError::NotJson)?;
        let object = match value {
            Value::Object(object) => object,
            // An array is an object to JavaScript, but it has neither key.
            Value::Array(_) => return Err(MessageError::Unknown),
            _ => return Err(MessageError::NotObject),
        };
        if let Some(files) = object.get("files") {
            let nonce = object
                .get("nonce")
                .and_then(Value::as_str)
                .filter(|n| is_nonce(n))
                .ok_or(MessageError::BadPrepare)?;
            let files = files.as_array().ok_or(MessageError::BadPrepare)?;
            return Ok(Message::Prepare {
                nonce: nonce.to_owned(),
                files: files.iter().map(FileSpec::from_value).collect(),
            });
        }
        if let Some(code) = object.get("code") {
            let text = |v: Option<&Value>| v.and_then(Value::as_str).map(str::to_owned);
            let nonce = text(object.get("nonce")).ok_or(MessageError::BadRun)?;
            let code = text(Some(code)).ok_or(MessageError::BadRun)?;
            let out_cap = cap(object.get("outCap")).ok_or(MessageError::BadRun)?;
            let err_cap = cap(object.get("errCap")).ok_or(MessageError::BadRun)?;
            return Ok(Message::Run {
                nonce,
                code,
                out_cap,
                err_cap,
            });
        }
        Err(MessageError::Unknown)
    }
}

// === impl FileSpec ===

impl FileSpec {
    fn from_value(value: &Value) -> FileSpec {
        let field = |key: &str| value.get(key).and_then(Value::as_str).map(str::to_owned);
        match value {
            Value::Null => FileSpec::Null,
            _ => FileSpec::Entry {
                path: field("path"),
                content: field("content"),
            },
        }
    }
}

/// `^[0-9a-f]{32}$`.
pub fn is_nonce(text: &str) -> bool {
    text.len() == 32
        && text
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// A cap as the Node relay took it: a safe integer (JSON's `5.0` is one), negatives as 0.
fn cap(value: Option<&Value>) -> Option<usize> {
    let number = value?.as_number()?;
    let whole = if let Some(i) = number.as_i64() {
        i as f64
    } else {
        let f = number.as_f64()?;
        if f.fract() != 0.0 {
            return None;
        }
        f
    };
    if whole.abs() > MAX_SAFE_INTEGER {
        return None;
    }
    // In range and whole, so the cast is exact; usize is 64 bits on every target we build.
    Some(if whole <= 0.0 { 0 } else { whole as usize })
}

/// The line the interpreter's control socket gets for a run.
pub fn kernel_request(nonce: &str, code: &str) -> Vec<u8> {
    // Serialising a &str cannot fail.
    let code = serde_json::to_string(code).unwrap_or_else(|_| "\"\"".to_owned());
    format!("{{\"nonce\":\"{nonce}\",\"code\":{code}}}\n").into_bytes()
}

/// The status the interpreter's first line names, if it is `ok` or `error`.
pub fn kernel_status(line: &[u8]) -> Option<bool> {
    let value: Value = serde_json::from_slice(line).ok()?;
    match value.get("status")?.as_str()? {
        "ok" => Some(true),
        "error" => Some(false),
        _ => None,
    }
}

/// Which of the interpreter's streams.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StreamKey {
    Out,
    Err,
}

impl StreamKey {
    fn key(self) -> &'static str {
        match self {
            StreamKey::Out => "o",
            StreamKey::Err => "e",
        }
    }
}

/// One line the relay sends (without its newline).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Frame<'a> {
    /// The first line: `pid:starttime:cmdlinehex`.
    Ready(&'a str),
    /// The files are written and the interpreter listens.
    Prepared { n: &'a str },
    /// A piece of output, at most [`PIECE`] bytes.
    Piece {
        n: &'a str,
        key: StreamKey,
        bytes: &'a [u8],
    },
    /// File `file` could not be written: nothing ran.
    FileRefused {
        n: &'a str,
        file: usize,
        errno: &'a str,
    },
    /// No interpreter listens: nothing ran.
    NoInterpreter { n: &'a str },
    /// The cell ended: 0 ran, 1 raised, 76 the interpreter went away.
    Done {
        n: &'a str,
        done: u8,
        ot: bool,
        et: bool,
    },
}

impl Frame<'_> {
    /// The frame's line, without the newline.
    pub fn line(&self) -> String {
        match self {
            Frame::Ready(id) => format!("{{\"ready\":\"{id}\"}}"),
            Frame::Prepared { n } => format!("{{\"n\":\"{n}\",\"prepared\":true}}"),
            Frame::Piece { n, key, bytes } => format!(
                "{{\"n\":\"{n}\",\"{}\":\"{}\"}}",
                key.key(),
                base64::engine::general_purpose::STANDARD.encode(bytes)
            ),
            Frame::FileRefused { n, file, errno } => {
                format!("{{\"n\":\"{n}\",\"done\":3,\"file\":{file},\"errno\":\"{errno}\"}}")
            }
            Frame::NoInterpreter { n } => format!("{{\"n\":\"{n}\",\"done\":75}}"),
            Frame::Done { n, done, ot, et } => {
                format!("{{\"n\":\"{n}\",\"done\":{done},\"ot\":{ot},\"et\":{et}}}")
            }
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    const N: &str = "0123456789abcdef0123456789abcdef";

    #[test]
    fn a_prepare_carries_its_nonce_and_files_with_every_escape_read() {
        let line = format!(
            r#"{{"nonce":"{N}","files":[{{"path":"a/b.txt","content":"x\n\"\u00e9\ud83d\ude00\u0000"}},null,5,{{"path":1}}]}}"#
        );
        let Message::Prepare { nonce, files } = Message::parse(line.as_bytes()).unwrap() else {
            panic!("not a prepare");
        };
        assert_eq!(nonce, N);
        assert_eq!(
            files,
            vec![
                FileSpec::Entry {
                    path: Some("a/b.txt".into()),
                    content: Some("x\n\"é😀\0".into())
                },
                FileSpec::Null,
                FileSpec::Entry {
                    path: None,
                    content: None
                },
                FileSpec::Entry {
                    path: None,
                    content: None
                },
            ]
        );
    }

    #[test]
    fn a_run_takes_safe_integer_caps_and_clamps_negatives() {
        let line = format!(r#"{{"nonce":"{N}","code":"1+1","outCap":65536.0,"errCap":-4}}"#);
        assert_eq!(
            Message::parse(line.as_bytes()).unwrap(),
            Message::Run {
                nonce: N.into(),
                code: "1+1".into(),
                out_cap: 65536,
                err_cap: 0
            }
        );
    }

    #[test]
    fn files_wins_over_code_as_in_the_node_relay() {
        let line = format!(r#"{{"nonce":"{N}","files":[],"code":"x"}}"#);
        assert!(matches!(
            Message::parse(line.as_bytes()),
            Ok(Message::Prepare { .. })
        ));
    }

    #[test]
    fn bad_lines_are_refused() {
        let cases: &[(&str, MessageError)] = &[
            ("", MessageError::NotJson),
            ("{", MessageError::NotJson),
            (r#"{"a":1} x"#, MessageError::NotJson),
            ("null", MessageError::NotObject),
            ("\"s\"", MessageError::NotObject),
            ("[1]", MessageError::Unknown),
            ("{}", MessageError::Unknown),
            (r#"{"nonce":"abc","files":[]}"#, MessageError::BadPrepare),
            (
                r#"{"nonce":"0123456789ABCDEF0123456789abcdef","files":[]}"#,
                MessageError::BadPrepare,
            ),
            (
                r#"{"nonce":"0123456789abcdef0123456789abcdef","files":{}}"#,
                MessageError::BadPrepare,
            ),
            (r#"{"files":[]}"#, MessageError::BadPrepare),
            (
                r#"{"nonce":"n","code":1,"outCap":1,"errCap":1}"#,
                MessageError::BadRun,
            ),
            (
                r#"{"nonce":"n","code":"c","outCap":1.5,"errCap":1}"#,
                MessageError::BadRun,
            ),
            (
                r#"{"nonce":"n","code":"c","outCap":9007199254740992,"errCap":1}"#,
                MessageError::BadRun,
            ),
            (
                r#"{"nonce":"n","code":"c","outCap":"1","errCap":1}"#,
                MessageError::BadRun,
            ),
            (
                r#"{"nonce":"n","code":"c","outCap":1}"#,
                MessageError::BadRun,
            ),
            (
                r#"{"code":"c","outCap":1,"errCap":1}"#,
                MessageError::BadRun,
            ),
        ];
        for (line, want) in cases {
            assert_eq!(Message::parse(line.as_bytes()), Err(*want), "{line}");
        }
    }

    #[test]
    fn the_largest_safe_integer_is_a_cap() {
        let line = r#"{"nonce":"n","code":"c","outCap":9007199254740991,"errCap":1e3}"#;
        assert!(matches!(
            Message::parse(line.as_bytes()),
            Ok(Message::Run {
                out_cap: 9_007_199_254_740_991,
                err_cap: 1000,
                ..
            })
        ));
    }

    #[test]
    fn frames_are_the_node_relays_lines() {
        assert_eq!(Frame::Ready("1:2:ab").line(), r#"{"ready":"1:2:ab"}"#);
        assert_eq!(
            Frame::Prepared { n: N }.line(),
            format!(r#"{{"n":"{N}","prepared":true}}"#)
        );
        let piece = Frame::Piece {
            n: N,
            key: StreamKey::Err,
            bytes: b"hi\0\xff",
        };
        assert_eq!(piece.line(), format!(r#"{{"n":"{N}","e":"aGkA/w=="}}"#));
        let refused = Frame::FileRefused {
            n: N,
            file: 2,
            errno: "ELOOP",
        };
        assert_eq!(
            refused.line(),
            format!(r#"{{"n":"{N}","done":3,"file":2,"errno":"ELOOP"}}"#)
        );
        assert_eq!(
            Frame::NoInterpreter { n: N }.line(),
            format!(r#"{{"n":"{N}","done":75}}"#)
        );
        let done = Frame::Done {
            n: N,
            done: 0,
            ot: true,
            et: false,
        };
        assert_eq!(
            done.line(),
            format!(r#"{{"n":"{N}","done":0,"ot":true,"et":false}}"#)
        );
        for frame in [done, refused, piece] {
            let value: Value = serde_json::from_str(&frame.line()).unwrap();
            assert!(value.is_object());
        }
    }

    #[test]
    fn the_kernel_gets_the_code_escaped_and_its_status_is_read() {
        let line = kernel_request(N, "print(\"a\")\n\u{2028}");
        let value: Value = serde_json::from_slice(&line[..line.len() - 1]).unwrap();
        assert_eq!(value["code"], "print(\"a\")\n\u{2028}");
        assert_eq!(value["nonce"], N);
        assert_eq!(*line.last().unwrap(), b'\n');
        assert_eq!(kernel_status(br#"{"status":"ok"}"#), Some(true));
        assert_eq!(kernel_status(br#"{"status":"error"}"#), Some(false));
        for bad in [&b"null"[..], b"{}", br#"{"status":"gone"}"#, b"x", b"[]"] {
            assert_eq!(kernel_status(bad), None);
        }
    }
}
