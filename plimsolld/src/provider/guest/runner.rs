//! The daemon's half of the runner protocol (providers.md §5.9): what the project runner
//! (`images/project/files/runner.mjs`) reads on stdin, and how its report is found in its
//! stdout and authenticated.
//!
//! Stdin is one line with the run's report key (64 hex), then the plan as JSON. The key is
//! 32 fresh random bytes per run that only this process and the runner know: the runner is
//! non-dumpable, reads the key before any step starts and never hands it on. Stdout carries
//! two kinds of frame, each on its own line:
//!
//! ```text
//! \n<<<PLIMSOLL_STEP_V1>>> <index> <hex HMAC-SHA256(key, "step-began <index>")>\n
//! \n<<<PLIMSOLL_REPORT_V3>>> <body length> <hex HMAC-SHA256(key, body)>\n<body>
//! ```
//!
//! Frames whose MAC does not verify are ignored; the first report that verifies wins. Nothing
//! a step prints reaches this stream under runc, and under gVisor (where a step can open the
//! runner's stdout) a step still cannot make a MAC.

use std::collections::HashMap;

use base64::Engine as _;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use plimsoll::wire::{Artifact, ProjectFile, StepResult};

/// The report frame's marker.
const REPORT_MARKER: &[u8] = b"<<<PLIMSOLL_REPORT_V3>>> ";
/// The "step began" frame's marker.
const STEP_MARKER: &[u8] = b"<<<PLIMSOLL_STEP_V1>>> ";
/// The longest header line a frame may have: the marker, an 8-digit length and 64 hex of
/// MAC come to 98 characters; anything much longer is not a frame.
const MAX_HEADER: usize = 128;
/// The largest report body the daemon reads.
pub const MAX_BODY: usize = 16 << 20;
/// How much runner stdout the daemon keeps: the largest body plus room for the step lines.
pub const STDOUT_CAP: usize = MAX_BODY + 64 * 1024;

/// A run's report key.
pub struct ReportKey([u8; 32]);

impl ReportKey {
    /// 32 fresh random bytes.
    pub fn fresh() -> ReportKey {
        ReportKey(rand::random())
    }

    /// A key of the given bytes (for the fuzz targets, which must also make valid frames).
    #[cfg(feature = "fuzzing")]
    pub fn from_bytes(bytes: [u8; 32]) -> ReportKey {
        ReportKey(bytes)
    }

    /// The frame header line for `body` under this key, as the runner writes it.
    #[cfg(feature = "fuzzing")]
    pub fn frame(&self, body: &[u8]) -> Vec<u8> {
        let mut out = b"\n".to_vec();
        out.extend_from_slice(REPORT_MARKER);
        out.extend_from_slice(
            format!("{} {}\n", body.len(), hex::encode(self.mac(body))).as_bytes(),
        );
        out.extend_from_slice(body);
        out
    }

    fn mac(&self, message: &[u8]) -> [u8; 32] {
        hmac_sha256(&self.0, message)
    }

    fn verifies(&self, message: &[u8], hex_mac: &[u8]) -> bool {
        let Ok(given) = hex::decode(hex_mac) else {
            return false;
        };
        given.len() == 32 && bool::from(self.mac(message).ct_eq(&given))
    }
}

/// HMAC-SHA256 (RFC 2104) over SHA-256's 64-byte block.
fn hmac_sha256(key: &[u8; 32], message: &[u8]) -> [u8; 32] {
    let mut block = [0u8; 64];
    block[..32].copy_from_slice(key);
    let pad = |byte: u8| block.map(|b| b ^ byte);
    let inner = Sha256::new()
        .chain_update(pad(0x36))
        .chain_update(message)
        .finalize();
    Sha256::new()
        .chain_update(pad(0x5c))
        .chain_update(inner)
        .finalize()
        .into()
}

/// The plan, as the runner reads it.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Plan<'a> {
    /// The files to write under `/work`.
    pub files: Vec<PlanFile<'a>>,
    /// The steps, in order.
    pub steps: &'a [String],
    /// The artifacts to read back.
    pub artifacts: &'a [String],
    /// The whole plan's budget; each step gets what is left of it.
    pub timeout_ms: u64,
    /// The steps' environment on top of the runner's own: the image's ENV.
    pub env: HashMap<&'a str, &'a str>,
    /// The `/proc/<runner>/…` entries a step must fail to open.
    pub proc_checks: &'a [&'a str],
    /// A granted run's client library, preloaded into every node a step starts.
    #[serde(rename = "hostSDK", skip_serializing_if = "Option::is_none")]
    pub host_sdk: Option<&'a str>,
}

/// One file of the plan.
#[derive(Debug, Serialize)]
pub struct PlanFile<'a> {
    /// Relative to `/work`.
    pub path: &'a str,
    /// UTF-8 text.
    pub content: &'a str,
}

impl<'a> PlanFile<'a> {
    /// The plan's form of a request's file.
    pub fn of(file: &'a ProjectFile) -> PlanFile<'a> {
        PlanFile {
            path: &file.path,
            content: &file.content,
        }
    }
}

/// What the runner reads on stdin: the key's line, then the plan.
pub fn stdin(key: &ReportKey, plan: &Plan<'_>) -> Result<Vec<u8>, serde_json::Error> {
    let mut input = hex::encode(key.0).into_bytes();
    input.push(b'\n');
    serde_json::to_writer(&mut input, plan)?;
    Ok(input)
}

/// What the runner's stdout held.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Scan<'a> {
    /// The first report body whose MAC verified.
    pub report: Option<&'a [u8]>,
    /// Whether any report frame failed to verify (or was cut short).
    pub unauthenticated: bool,
    /// The highest step index the runner said it began.
    pub step_began: Option<u32>,
}

/// Finds the authenticated frames in the runner's stdout.
pub fn scan<'a>(stdout: &'a [u8], key: &ReportKey) -> Scan<'a> {
    let mut found = Scan::default();
    let mut at = 0;
    while let Some(offset) = find(&stdout[at..], b"\n<<<PLIMSOLL_") {
        let start = at + offset + 1;
        at = start;
        let rest = &stdout[start..];
        let Some(end) = rest.iter().take(MAX_HEADER + 1).position(|b| *b == b'\n') else {
            if rest.starts_with(REPORT_MARKER) {
                found.unauthenticated = true;
            }
            continue;
        };
        let header = &rest[..end];
        if let Some(fields) = header.strip_prefix(STEP_MARKER) {
            if let Some((index, mac)) = split_pair(fields) {
                let message = [b"step-began ".as_slice(), index].concat();
                let index = canonical_number(index).and_then(|i| u32::try_from(i).ok());
                if let Some(i) = index.filter(|_| key.verifies(&message, mac)) {
                    found.step_began = found.step_began.max(Some(i));
                }
            }
        } else if let Some(fields) = header.strip_prefix(REPORT_MARKER) {
            let body_start = start + end + 1;
            let verified = split_pair(fields).and_then(|(length, mac)| {
                let length = canonical_number(length)?;
                let body = stdout.get(body_start..body_start.checked_add(length)?)?;
                (length <= MAX_BODY && key.verifies(body, mac)).then_some(body)
            });
            match verified {
                Some(body) if found.report.is_none() => found.report = Some(body),
                Some(_) => {}
                None => found.unauthenticated = true,
            }
        }
    }
    found
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

/// `a b` with exactly one space and no other.
fn split_pair(fields: &[u8]) -> Option<(&[u8], &[u8])> {
    let space = fields.iter().position(|b| *b == b' ')?;
    let (a, b) = (&fields[..space], &fields[space + 1..]);
    (!b.contains(&b' ')).then_some((a, b))
}

/// A decimal without sign or leading zeros.
fn canonical_number(digits: &[u8]) -> Option<usize> {
    if digits.is_empty() || (digits.len() > 1 && digits[0] == b'0') || digits.len() > 9 {
        return None;
    }
    std::str::from_utf8(digits).ok()?.parse().ok()
}

/// The runner's report body.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum Report {
    /// The runner could not set the project up; nothing (more) ran.
    Failed(FailedReport),
    /// The plan ran (to its end, or to its first failing step).
    Ran(RanReport),
}

/// `{"error": …}`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FailedReport {
    /// The runner's own words.
    pub error: String,
}

/// The steps and artifacts.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct RanReport {
    /// Each step that ran, in order.
    pub steps: Vec<RanStep>,
    /// The artifacts found.
    pub artifacts: Vec<RanArtifact>,
    /// Whether the budget dropped any.
    pub artifacts_truncated: bool,
}

/// One step's result; output is base64.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct RanStep {
    command: String,
    stdout: String,
    stderr: String,
    exit_code: i32,
    timed_out: bool,
    duration_ms: i64,
    stdout_truncated: bool,
    stderr_truncated: bool,
}

/// One artifact; content is base64.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RanArtifact {
    path: String,
    content: String,
}

/// Why a verified body could not be read.
#[derive(Debug, thiserror::Error)]
pub enum ReportError {
    /// Not the report's JSON shape.
    #[error("the report is not the runner's JSON: {0}")]
    Shape(#[from] serde_json::Error),
    /// A base64 field did not decode.
    #[error("the report's {0} is not base64")]
    Base64(&'static str),
    /// An artifact the plan did not ask for.
    #[error("the report names an artifact the plan did not ask for")]
    UnaskedArtifact,
}

/// Decodes a verified body.
pub fn decode(body: &[u8]) -> Result<Report, ReportError> {
    Ok(serde_json::from_slice(body)?)
}

impl RanReport {
    /// The steps and artifacts in wire form; artifacts must be among those `asked`.
    pub fn into_wire(
        self,
        asked: &[String],
    ) -> Result<(Vec<StepResult>, Vec<Artifact>), ReportError> {
        let b64 = base64::engine::general_purpose::STANDARD;
        let steps = self
            .steps
            .into_iter()
            .map(|s| {
                Ok(StepResult {
                    stdout: b64
                        .decode(&s.stdout)
                        .map_err(|_| ReportError::Base64("step stdout"))?,
                    stderr: b64
                        .decode(&s.stderr)
                        .map_err(|_| ReportError::Base64("step stderr"))?,
                    command: s.command,
                    exit_code: s.exit_code,
                    timed_out: s.timed_out,
                    duration_ms: s.duration_ms,
                    stdout_truncated: s.stdout_truncated,
                    stderr_truncated: s.stderr_truncated,
                    ..Default::default()
                })
            })
            .collect::<Result<Vec<_>, ReportError>>()?;
        let artifacts = self
            .artifacts
            .into_iter()
            .map(|a| {
                if !asked.contains(&a.path) {
                    return Err(ReportError::UnaskedArtifact);
                }
                Ok(Artifact {
                    content: b64
                        .decode(&a.content)
                        .map_err(|_| ReportError::Base64("artifact content"))?,
                    path: a.path,
                    ..Default::default()
                })
            })
            .collect::<Result<Vec<_>, ReportError>>()?;
        Ok((steps, artifacts))
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    fn key() -> ReportKey {
        ReportKey([7; 32])
    }

    fn frame(key: &ReportKey, body: &[u8]) -> Vec<u8> {
        let mut out = format!(
            "\n<<<PLIMSOLL_REPORT_V3>>> {} {}\n",
            body.len(),
            hex::encode(key.mac(body))
        )
        .into_bytes();
        out.extend_from_slice(body);
        out
    }

    fn step_line(key: &ReportKey, index: u32) -> Vec<u8> {
        let mac = key.mac(format!("step-began {index}").as_bytes());
        format!("\n<<<PLIMSOLL_STEP_V1>>> {index} {}\n", hex::encode(mac)).into_bytes()
    }

    #[test]
    fn hmac_matches_an_independent_implementation() {
        // Python: hmac.new(b"\x0b" * 32, b"Hi There", hashlib.sha256).hexdigest()
        let mac = hmac_sha256(&[0x0b; 32], b"Hi There");
        assert_eq!(
            hex::encode(mac),
            "198a607eb44bfbc69903a0f1cf2bbdc5ba0aa3f3d9ae3c1c7a3b1696a0b68cf7"
        );
    }

    #[test]
    fn the_first_verified_report_wins_and_forged_frames_are_ignored() {
        let k = key();
        let forged = frame(
            &ReportKey([8; 32]),
            br#"{"steps":[],"artifacts":[],"artifactsTruncated":false}"#,
        );
        let real = frame(&k, br#"{"error":"x"}"#);
        let later = frame(&k, br#"{"error":"y"}"#);
        let stdout = [step_line(&k, 0), forged, step_line(&k, 1), real, later].concat();
        let found = scan(&stdout, &k);
        assert_eq!(found.report, Some(&br#"{"error":"x"}"#[..]));
        assert!(found.unauthenticated);
        assert_eq!(found.step_began, Some(1));
    }

    #[test]
    fn a_report_of_the_largest_size_has_a_header_that_fits() {
        let k = key();
        let body = vec![b'x'; 10_000_000];
        assert_eq!(
            scan(&frame(&k, &body), &k).report.map(<[u8]>::len),
            Some(body.len())
        );
    }

    #[test]
    fn a_cut_or_non_canonical_frame_does_not_verify() {
        let k = key();
        let mut cut = frame(&k, b"{\"error\":\"x\"}");
        cut.pop();
        assert_eq!(scan(&cut, &k).report, None);
        assert!(scan(&cut, &k).unauthenticated);
        let body = b"{}";
        let padded = format!(
            "\n<<<PLIMSOLL_REPORT_V3>>> 02 {}\n{{}}",
            hex::encode(k.mac(body))
        );
        assert_eq!(scan(padded.as_bytes(), &k).report, None);
        let forged_step = b"\n<<<PLIMSOLL_STEP_V1>>> 3 00\n";
        assert_eq!(scan(forged_step, &k).step_began, None);
    }

    #[test]
    fn reports_are_decoded_strictly() {
        let ran = decode(
            br#"{"steps":[{"command":"c","stdout":"NDIK","stderr":"","exitCode":0,"timedOut":false,"durationMs":3,"stdoutTruncated":false,"stderrTruncated":false}],"artifacts":[{"path":"out.txt","content":"NDIK"}],"artifactsTruncated":false}"#,
        )
        .unwrap();
        let Report::Ran(ran) = ran else {
            panic!("not a ran report")
        };
        let (steps, artifacts) = ran.into_wire(&["out.txt".to_owned()]).unwrap();
        assert_eq!(steps[0].stdout, b"42\n");
        assert_eq!(artifacts[0].content, b"42\n");
        assert!(decode(br#"{"error":"x","extra":1}"#).is_err());
        assert!(
            decode(br#"{"steps":[],"artifacts":[],"artifactsTruncated":false,"x":1}"#).is_err()
        );
        let Report::Ran(unasked) = decode(
            br#"{"steps":[],"artifacts":[{"path":"a","content":""}],"artifactsTruncated":false}"#,
        )
        .unwrap() else {
            panic!()
        };
        assert!(unasked.into_wire(&[]).is_err());
    }
}
