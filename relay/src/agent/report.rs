//! The project runner's report, kept byte for byte: step-began lines and the report body,
//! each authenticated with HMAC-SHA256 under the call's key, so the daemon reads the agent's
//! output as it reads a runner's stdout.

use base64::Engine as _;
use hmac::{Hmac, Mac};
use serde::Serialize;
use sha2::Sha256;

const REPORT_MARKER: &str = "<<<PLIMSOLL_REPORT_V3>>>";
const STEP_MARKER: &str = "<<<PLIMSOLL_STEP_V1>>>";
pub const STEP_RESULTS_CAP: i64 = 3 << 20;
const RESULT_CAP: usize = 15 << 20;
pub const COMMAND_CAP: usize = 16 << 10;

/// The call's key: 32 bytes from the first line's 64 lowercase hex digits.
pub struct Key(Vec<u8>);

impl Key {
    pub fn parse(hex: &[u8]) -> Option<Key> {
        if hex.len() != 64 || !hex.iter().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')) {
            return None;
        }
        let nibble = |b: u8| {
            if b.is_ascii_digit() {
                b - b'0'
            } else {
                b - b'a' + 10
            }
        };
        Some(Key(hex
            .chunks(2)
            .map(|p| nibble(p[0]) << 4 | nibble(p[1]))
            .collect()))
    }

    /// Lowercase hex HMAC-SHA256 of `text`.
    pub fn mac(&self, text: &[u8]) -> String {
        let Ok(mut mac) = Hmac::<Sha256>::new_from_slice(&self.0) else {
            // HMAC takes a key of any length.
            return String::new();
        };
        mac.update(text);
        mac.finalize()
            .into_bytes()
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect()
    }

    /// The line printed before step `i` starts.
    pub fn step_began(&self, i: usize) -> Vec<u8> {
        let mac = self.mac(format!("step-began {i}").as_bytes());
        format!("\n{STEP_MARKER} {i} {mac}\n").into_bytes()
    }

    /// The report: its header line, then the body.
    pub fn report(&self, body: &[u8]) -> Vec<u8> {
        let mut out = format!("\n{REPORT_MARKER} {} {}\n", body.len(), self.mac(body)).into_bytes();
        out.extend_from_slice(body);
        out
    }
}

/// One step's result, before encoding.
pub struct Step {
    pub command: String,
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
    pub exit_code: i32,
    pub timed_out: bool,
    pub duration_ms: u64,
    pub stdout_truncated: bool,
    pub stderr_truncated: bool,
}

/// A string's length in UTF-16 units, as JavaScript counts it.
pub fn js_len(text: &str) -> usize {
    text.encode_utf16().count()
}

/// The first `cap` UTF-16 units of `text`. Deliberate difference: a surrogate pair that the
/// cap would split is left out whole (the JS kept a lone surrogate).
pub fn js_prefix(text: &str, cap: usize) -> String {
    let mut units = 0;
    let mut end = 0;
    for c in text.chars() {
        units += c.len_utf16();
        if units > cap {
            break;
        }
        end += c.len_utf8();
    }
    text.get(..end).unwrap_or(text).to_owned()
}

fn b64_len(n: usize) -> i64 {
    i64::try_from(n.div_ceil(3) * 4).unwrap_or(i64::MAX)
}

/// What a step adds to the report, estimated as the runner did.
pub fn encoded_size(s: &Step) -> i64 {
    b64_len(s.stdout.len())
        + b64_len(s.stderr.len())
        + i64::try_from(js_len(&s.command)).unwrap_or(i64::MAX)
        + 160
}

/// Trims the step's output to what fits in `budget` (stdout first).
pub fn fit(mut step: Step, budget: i64) -> Step {
    if encoded_size(&step) <= budget {
        return step;
    }
    let spare = (budget - i64::try_from(js_len(&step.command)).unwrap_or(i64::MAX) - 160) as f64;
    // Non-negative and at most a few MiB: the casts are exact.
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
    let room = ((spare / 4.0 * 3.0).floor() - 3.0).max(0.0) as usize;
    let keep_out = step.stdout.len().min(room);
    let keep_err = step.stderr.len().min(room - keep_out);
    if keep_out < step.stdout.len() {
        step.stdout_truncated = true;
    }
    if keep_err < step.stderr.len() {
        step.stderr_truncated = true;
    }
    step.stdout.truncate(keep_out);
    step.stderr.truncate(keep_err);
    step
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct StepOut {
    command: String,
    stdout: String,
    stderr: String,
    exit_code: i32,
    timed_out: bool,
    duration_ms: u64,
    stdout_truncated: bool,
    stderr_truncated: bool,
}

#[derive(Serialize)]
struct ArtifactOut {
    path: String,
    content: String,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Result_ {
    steps: Vec<StepOut>,
    artifacts: Vec<ArtifactOut>,
    artifacts_truncated: bool,
}

#[derive(Serialize)]
struct Failure<'a> {
    error: &'a str,
}

/// The report body of an error.
pub fn failure(message: &str) -> Vec<u8> {
    serde_json::to_vec(&Failure { error: message }).unwrap_or_default()
}

/// The report body of a call that ran: artifacts are dropped from the end until it fits in
/// the report cap, and an error replaces it when even that is not enough.
pub fn encode(
    steps: Vec<Step>,
    artifacts: Vec<super::files::Captured>,
    truncated: bool,
) -> Vec<u8> {
    let b64 = base64::engine::general_purpose::STANDARD;
    let mut result = Result_ {
        steps: steps
            .into_iter()
            .map(|s| StepOut {
                command: s.command,
                stdout: b64.encode(&s.stdout),
                stderr: b64.encode(&s.stderr),
                exit_code: s.exit_code,
                timed_out: s.timed_out,
                duration_ms: s.duration_ms,
                stdout_truncated: s.stdout_truncated,
                stderr_truncated: s.stderr_truncated,
            })
            .collect(),
        artifacts: artifacts
            .into_iter()
            .map(|(path, content)| ArtifactOut {
                path,
                content: b64.encode(content),
            })
            .collect(),
        artifacts_truncated: truncated,
    };
    let mut body = serde_json::to_vec(&result).unwrap_or_default();
    while body.len() > RESULT_CAP && !result.artifacts.is_empty() {
        result.artifacts.pop();
        result.artifacts_truncated = true;
        body = serde_json::to_vec(&result).unwrap_or_default();
    }
    if body.len() > RESULT_CAP {
        return failure("the project's result is larger than the runner may report");
    }
    body
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn step(out: usize, err: usize) -> Step {
        Step {
            command: "echo".to_owned(),
            stdout: vec![b'o'; out],
            stderr: vec![b'e'; err],
            exit_code: 0,
            timed_out: false,
            duration_ms: 3,
            stdout_truncated: false,
            stderr_truncated: false,
        }
    }

    #[test]
    fn the_mac_is_hmac_sha256_as_the_runner_made_it() {
        // RFC 4231 test case 2 needs a short key; this key is 32 bytes of 0x0b..., checked
        // against an independent implementation (openssl dgst -sha256 -hmac).
        let key = Key::parse("0b".repeat(32).as_bytes()).unwrap();
        assert_eq!(
            key.mac(b"Hi There"),
            "198a607eb44bfbc69903a0f1cf2bbdc5ba0aa3f3d9ae3c1c7a3b1696a0b68cf7"
        );
        assert!(Key::parse(b"AB").is_none());
        assert!(Key::parse("0B".repeat(32).as_bytes()).is_none());
        let began = String::from_utf8(key.step_began(2)).unwrap();
        assert!(began.starts_with("\n<<<PLIMSOLL_STEP_V1>>> 2 ") && began.ends_with('\n'));
        let report = String::from_utf8(key.report(b"{}")).unwrap();
        assert!(report.starts_with("\n<<<PLIMSOLL_REPORT_V3>>> 2 ") && report.ends_with("\n{}"));
    }

    #[test]
    fn the_body_keeps_the_runners_fields_in_order() {
        let body = encode(
            vec![step(1, 0)],
            vec![("a".to_owned(), b"xy".to_vec())],
            false,
        );
        assert_eq!(
            String::from_utf8(body).unwrap(),
            r#"{"steps":[{"command":"echo","stdout":"bw==","stderr":"","exitCode":0,"timedOut":false,"durationMs":3,"stdoutTruncated":false,"stderrTruncated":false}],"artifacts":[{"path":"a","content":"eHk="}],"artifactsTruncated":false}"#
        );
        assert_eq!(failure("x \"y\""), br#"{"error":"x \"y\""}"#.to_vec());
    }

    #[test]
    fn a_step_is_fitted_stdout_first() {
        let s = fit(step(30, 30), 1000);
        assert_eq!((s.stdout.len(), s.stdout_truncated), (30, false));
        let s = fit(step(3000, 3000), 4 + 160 + 400);
        assert_eq!(s.stdout.len() + s.stderr.len(), 297);
        assert!(s.stdout_truncated && s.stderr_truncated);
        let s = fit(step(10, 10), -5);
        assert!(s.stdout.is_empty() && s.stderr.is_empty());
        assert_eq!(js_prefix("a😀b", 2), "a");
        assert_eq!(js_prefix("a😀b", 3), "a😀");
        assert_eq!(js_len("a😀"), 3);
    }
}
