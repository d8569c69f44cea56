//! The length-prefixed digest encoding (`records.md` §4) and the four digests built on it:
//! request, result, record and session fingerprint.
//!
//! Every digest is lowercase hex SHA-256 over `value(domain)` followed by `field(name, content)`
//! pairs, where `value(x)` is the length of `x` as a big-endian `u64` followed by `x`. Digests
//! are never taken over protobuf or JSON bytes, so every client can recompute them from whatever
//! form it decoded.

use sha2::{Digest, Sha256};

use crate::payload::{Payload, Request};
use crate::wire::{
    ProjectFile, RunRecord, RunRequest, RunResponse, SessionRunRequest, run_response,
};

/// Request digest domain for protocol 0 and 1: no software rule in the encoding.
const REQUEST_DOMAIN_V1: &str = "plimsoll.run-request.v1";
/// Request digest domain for every protocol from 2 on (protocol 4 included).
const REQUEST_DOMAIN_V2: &str = "plimsoll.run-request.v2";
const RESULT_DOMAIN: &str = "plimsoll.run-result.v1";

// === impl Encoder ===

/// One digest being written: `value(domain)`, then `field(name, content)` pairs in order.
///
/// Each method encodes one content type of `records.md` §4.1. Nothing is ever skipped: an
/// absent field is written as its zero value under its name.
pub(crate) struct Encoder {
    hasher: Sha256,
}

impl Encoder {
    pub(crate) fn new(domain: &str) -> Self {
        let mut encoder = Self {
            hasher: Sha256::new(),
        };
        encoder.value(domain.as_bytes());
        encoder
    }

    fn value(&mut self, bytes: &[u8]) {
        // usize is at most 64 bits on every supported target, so the cast never truncates.
        self.hasher.update((bytes.len() as u64).to_be_bytes());
        self.hasher.update(bytes);
    }

    /// A `bytes` field: the raw bytes, never base64.
    pub(crate) fn bytes(&mut self, name: &str, content: &[u8]) {
        self.value(name.as_bytes());
        self.value(content);
    }

    /// A `string` field: its UTF-8 bytes.
    pub(crate) fn str(&mut self, name: &str, content: &str) {
        self.bytes(name, content.as_bytes());
    }

    /// A signed integer (or an enum number): decimal ASCII with a `-` for negatives.
    pub(crate) fn int(&mut self, name: &str, content: i64) {
        self.str(name, &content.to_string());
    }

    /// An unsigned integer or a repeated group's count: decimal ASCII.
    pub(crate) fn uint(&mut self, name: &str, content: u64) {
        self.str(name, &content.to_string());
    }

    /// A repeated group's count.
    pub(crate) fn count(&mut self, name: &str, len: usize) {
        self.uint(name, len as u64);
    }

    pub(crate) fn bool(&mut self, name: &str, content: bool) {
        self.str(name, if content { "true" } else { "false" });
    }

    /// One double or a repeated double: each value's IEEE-754 big-endian bytes, concatenated.
    /// The bits are hashed as they are; canonicalising NaN is the sender's job (§4.3).
    pub(crate) fn doubles(&mut self, name: &str, values: &[f64]) {
        let mut content = Vec::with_capacity(values.len() * 8);
        for v in values {
            content.extend_from_slice(&v.to_bits().to_be_bytes());
        }
        self.bytes(name, &content);
    }

    pub(crate) fn finish(self) -> String {
        hex::encode(self.hasher.finalize())
    }
}

// === request digest ===

/// The request digest of a `Run` request (`records.md` §4.2), as lowercase hex.
///
/// It covers the request exactly as received: `timeout_ms` as sent (zero or negative
/// included, never the clamped value) and the rule's identities in the order sent. The domain
/// is `plimsoll.run-request.v1` below protocol 2 and `.v2` from protocol 2 on; only `.v2`
/// includes the software rule. `trace_id` is excluded, so it never affects the digest.
///
/// This does not validate the request: a request the daemon would refuse still has a digest.
pub fn request_digest(req: &RunRequest) -> String {
    encode_request(&Request::from(req))
}

/// The request digest of a `SessionRun` call (`records.md` §4.2), as lowercase hex.
///
/// The encoding is the one [`request_digest`] uses, with `session_id` and `trace_id`
/// excluded, so a session call and the equivalent `Run` share a digest. A cell payload is
/// encoded under kind `cell`.
pub fn session_request_digest(req: &SessionRunRequest) -> String {
    encode_request(&Request::from(req))
}

/// The request digest of either message's view; `trace_id` is not encoded.
fn encode_request(req: &Request<'_>) -> String {
    let with_rule = req.protocol >= 2;
    let mut e = Encoder::new(if with_rule {
        REQUEST_DOMAIN_V2
    } else {
        REQUEST_DOMAIN_V1
    });
    e.uint("protocol", u64::from(req.protocol));
    e.str("minimum_isolation", req.minimum_isolation);
    e.int("timeout_ms", i64::from(req.timeout_ms));
    if with_rule {
        let (mode, identities) = match req.software_rule {
            Some(rule) => (rule.mode.as_str(), rule.identities.as_slice()),
            None => ("", [].as_slice()),
        };
        e.str("software_mode", mode);
        e.count("software_identities", identities.len());
        for identity in identities {
            e.str("software_identity", identity);
        }
    }
    match req.payload {
        Payload::None => e.str("kind", ""),
        Payload::Javascript(js) => {
            e.str("kind", "javascript");
            e.str("code", &js.code);
            e.str("grant_profile", &js.grant_profile);
        }
        Payload::Project(project) => {
            e.str("kind", "project");
            e.str("grant_profile", &project.grant_profile);
            encode_files(&mut e, &project.files);
            e.count("steps", project.steps.len());
            for step in &project.steps {
                e.str("step_command", step);
            }
            e.count("artifacts", project.artifacts.len());
            for artifact in &project.artifacts {
                e.str("artifact_path", artifact);
            }
        }
        Payload::Module(module) => {
            e.str("kind", "module");
            e.str("model", &module.model);
            e.doubles("end_time", &[module.end_time]);
            e.doubles("step", &[module.step]);
            e.count("rows", module.rows.len());
            for row in &module.rows {
                e.doubles("row_values", &row.values);
            }
        }
        Payload::Cell(cell) => {
            e.str("kind", "cell");
            e.str("language", &cell.language);
            e.str("code", &cell.code);
            encode_files(&mut e, &cell.files);
        }
    }
    e.finish()
}

fn encode_files(e: &mut Encoder, files: &[ProjectFile]) {
    e.count("files", files.len());
    for file in files {
        e.str("file_path", &file.path);
        e.str("file_content", &file.content);
    }
}

// === result digest ===

/// The result digest of a response (`records.md` §4.3), as lowercase hex.
///
/// Covers only the result: `sandbox`, `isolation`, every `duration_ms`, `advice`,
/// `environment`, `software_identity`, `instance` and the record are excluded. A response
/// without a result is encoded as kind `""` alone.
///
/// The digest is taken over the response exactly as given. The daemon must first repair
/// strings and canonicalise module NaNs ([`canonicalize_response`](super::canonicalize_response))
/// so that the digest matches what clients decode; this function does neither.
pub fn result_digest(resp: &RunResponse) -> String {
    let mut e = Encoder::new(RESULT_DOMAIN);
    match &resp.result {
        None => e.str("kind", ""),
        Some(run_response::Result::Javascript(js)) => {
            e.str("kind", "javascript");
            e.int("exit_code", i64::from(js.exit_code));
            e.bool("timed_out", js.timed_out);
            e.bytes("stdout", &js.stdout);
            e.bytes("stderr", &js.stderr);
            e.bool("stdout_truncated", js.stdout_truncated);
            e.bool("stderr_truncated", js.stderr_truncated);
        }
        Some(run_response::Result::Project(project)) => {
            e.str("kind", "project");
            // The number, never the name: an outcome this build does not know still hashes.
            e.int("outcome", i64::from(project.outcome.to_i32()));
            e.str("outcome_detail", &project.outcome_detail);
            e.bool("artifacts_truncated", project.artifacts_truncated);
            e.count("steps", project.steps.len());
            for step in &project.steps {
                e.str("step_command", &step.command);
                e.int("step_exit_code", i64::from(step.exit_code));
                e.bool("step_timed_out", step.timed_out);
                e.bytes("step_stdout", &step.stdout);
                e.bytes("step_stderr", &step.stderr);
                e.bool("step_stdout_truncated", step.stdout_truncated);
                e.bool("step_stderr_truncated", step.stderr_truncated);
            }
            e.count("artifacts", project.artifacts.len());
            for artifact in &project.artifacts {
                e.str("artifact_path", &artifact.path);
                e.bytes("artifact_content", &artifact.content);
            }
        }
        Some(run_response::Result::Module(module)) => {
            e.str("kind", "module");
            e.int("outcome", i64::from(module.outcome.to_i32()));
            e.str("outcome_detail", &module.outcome_detail);
            e.int("width", i64::from(module.width));
            e.bytes("stdout", &module.stdout);
            e.bytes("stderr", &module.stderr);
            e.count("runs", module.runs.len());
            for run in &module.runs {
                e.int("run_status", i64::from(run.status));
                e.doubles("run_outputs", &run.outputs);
            }
        }
        Some(run_response::Result::Cell(cell)) => {
            e.str("kind", "cell");
            e.int("exit_code", i64::from(cell.exit_code));
            e.bool("timed_out", cell.timed_out);
            e.bytes("stdout", &cell.stdout);
            e.bytes("stderr", &cell.stderr);
            e.bool("stdout_truncated", cell.stdout_truncated);
            e.bool("stderr_truncated", cell.stderr_truncated);
            e.bool("interpreter_started", cell.interpreter_started);
            e.bool("interpreter_ended", cell.interpreter_ended);
        }
    }
    e.finish()
}

// === record digest ===

/// One field of a record's digest, named as the encoding names it.
#[derive(Clone, Copy)]
enum RecordField {
    RequestSha256,
    ResultSha256,
    Unanswered,
    Provider,
    Isolation,
    Environment,
    Policy,
    SoftwareIdentity,
    SoftwareRuleId,
    Instance,
    StartedUnixMs,
    EndedUnixMs,
    Session,
    Sequence,
    PreviousSha256,
}

use RecordField as F;

const FIELDS_V1: &[RecordField] = &[
    F::RequestSha256,
    F::ResultSha256,
    F::Provider,
    F::Isolation,
    F::Environment,
    F::Policy,
    F::StartedUnixMs,
    F::EndedUnixMs,
    F::Session,
    F::Sequence,
    F::PreviousSha256,
];

const FIELDS_V2: &[RecordField] = &[
    F::RequestSha256,
    F::ResultSha256,
    F::Provider,
    F::Isolation,
    F::Environment,
    F::Policy,
    F::SoftwareIdentity,
    F::SoftwareRuleId,
    F::StartedUnixMs,
    F::EndedUnixMs,
    F::Session,
    F::Sequence,
    F::PreviousSha256,
];

const FIELDS_V3: &[RecordField] = &[
    F::RequestSha256,
    F::ResultSha256,
    F::Unanswered,
    F::Provider,
    F::Isolation,
    F::Environment,
    F::Policy,
    F::SoftwareIdentity,
    F::SoftwareRuleId,
    F::StartedUnixMs,
    F::EndedUnixMs,
    F::Session,
    F::Sequence,
    F::PreviousSha256,
];

const FIELDS_V4: &[RecordField] = &[
    F::RequestSha256,
    F::ResultSha256,
    F::Unanswered,
    F::Provider,
    F::Isolation,
    F::Environment,
    F::Policy,
    F::SoftwareIdentity,
    F::SoftwareRuleId,
    F::Instance,
    F::StartedUnixMs,
    F::EndedUnixMs,
    F::Session,
    F::Sequence,
    F::PreviousSha256,
];

/// The fields a record version's digest covers, in order. A version this build does not
/// know uses version 4's list, as the published client does, so a newer record still gets a
/// definite (and almost surely mismatching) digest rather than an error.
fn record_fields(version: u32) -> &'static [RecordField] {
    match version {
        1 => FIELDS_V1,
        2 => FIELDS_V2,
        3 => FIELDS_V3,
        _ => FIELDS_V4,
    }
}

/// A record's own digest (`records.md` §4.4, extended by version 4), as lowercase hex.
///
/// The domain is `plimsoll.run-record.v<version>`; the version appears only there. The fields
/// follow the record's version: 1 (no software fields), 2 (+ `software_identity`,
/// `software_rule_id`), 3 (+ `unanswered`), 4 (+ `instance`). Any other version, 0 included,
/// uses version 4's fields under its own domain. `record_sha256` itself is never covered.
pub fn record_digest(rec: &RunRecord) -> String {
    let mut e = Encoder::new(&format!("plimsoll.run-record.v{}", rec.version));
    for field in record_fields(rec.version) {
        match field {
            F::RequestSha256 => e.str("request_sha256", &rec.request_sha256),
            F::ResultSha256 => e.str("result_sha256", &rec.result_sha256),
            F::Unanswered => e.str("unanswered", &rec.unanswered),
            F::Provider => e.str("provider", &rec.provider),
            F::Isolation => e.str("isolation", &rec.isolation),
            F::Environment => e.str("environment", &rec.environment),
            F::Policy => e.str("policy", &rec.policy),
            F::SoftwareIdentity => e.str("software_identity", &rec.software_identity),
            F::SoftwareRuleId => e.str("software_rule_id", &rec.software_rule_id),
            F::Instance => e.str("instance", &rec.instance),
            F::StartedUnixMs => e.int("started_unix_ms", rec.started_unix_ms),
            F::EndedUnixMs => e.int("ended_unix_ms", rec.ended_unix_ms),
            F::Session => e.str("session", &rec.session),
            F::Sequence => e.uint("sequence", rec.sequence),
            F::PreviousSha256 => e.str("previous_sha256", &rec.previous_sha256),
        }
    }
    e.finish()
}

/// The session fingerprint a session call's record carries instead of the id
/// (`records.md` §7): lowercase hex SHA-256 of the id's bytes, with no length prefix or domain.
pub fn session_fingerprint(session_id: &str) -> String {
    hex::encode(Sha256::digest(session_id.as_bytes()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::{
        CellRun, JavaScriptRun, ModuleRow, ModuleRowResult, ModuleRun, ProjectOutcome,
        ProjectResult, SoftwareRule, StepResult, run_request,
    };

    const IDENTITY_D: &str = "oci-manifest:linux/amd64@sha256:dddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddd";

    // Expected values below were computed with the published client `plimsoll-client==0.23.0`
    // (`plimsoll_client._record`) on the same inputs, so they pin the cases the golden file
    // does not cover: protocol 4, record versions 1, 3, 4 and unknown, RUNNER_FAILED, NaN.

    fn record(version: u32) -> RunRecord {
        RunRecord {
            version,
            request_sha256: "aa".repeat(32),
            result_sha256: "bb".repeat(32),
            provider: "docker".into(),
            isolation: "kernel".into(),
            environment: format!("docker-image:sha256:{}", "cc".repeat(32)),
            software_identity: IDENTITY_D.into(),
            software_rule_id: format!("exact:{IDENTITY_D}"),
            started_unix_ms: 1_790_000_000_000,
            ended_unix_ms: 1_790_000_000_812,
            instance: "k8s-pod-uid:0f0e-11".into(),
            ..Default::default()
        }
    }

    #[test]
    fn each_record_version_covers_its_own_fields() {
        let cases = [
            (
                1,
                "2e4198b33a2053b2158008af9d20e5989d9026e2180cde913eda7e9e92a3d3dc",
            ),
            (
                2,
                "0b63f7936ff3fd3d3aac3cbe239bbddb26bf6309d4699f49295992aa56509bdd",
            ),
            (
                3,
                "2500737d6420ab742fc192d81c93ca4ee6960de4ac54eb7f99214a6ae4c72a30",
            ),
            (
                4,
                "a38f809c4e1e138897eb07eeaa3d6aa559d9836c6ade5d113e17816025975eb8",
            ),
            (
                9,
                "621959773ef945b2918494ed91870d94465a3ed8939972408fa65d70c3b474b6",
            ),
        ];
        for (version, want) in cases {
            assert_eq!(record_digest(&record(version)), want, "version {version}");
        }
    }

    #[test]
    fn version_4_unanswered_record_hashes_code_chain_and_negative_start() {
        let rec = RunRecord {
            result_sha256: String::new(),
            unanswered: "deadline_exceeded".into(),
            session: "5947d7c33d783f94b3b4c1a96ebc8991ed28f1b069b71e03376cba8caa98a720".into(),
            sequence: 3,
            previous_sha256: "ee".repeat(32),
            started_unix_ms: -5,
            ..record(4)
        };
        assert_eq!(
            record_digest(&rec),
            "87641ff582ecfbefdaf68c06e9d4aa5badcf1bbdf7cf4763c92374b263bb44e3"
        );
    }

    #[test]
    fn record_digest_ignores_record_sha256() {
        let mut rec = record(4);
        let before = record_digest(&rec);
        rec.record_sha256 = "ff".repeat(32);
        assert_eq!(record_digest(&rec), before);
    }

    #[test]
    fn protocol_4_request_uses_v2_domain_with_rule_and_raw_timeout() {
        let req = RunRequest {
            protocol: 4,
            minimum_isolation: "kernel".into(),
            timeout_ms: -1,
            software_rule: SoftwareRule {
                mode: "exact".into(),
                identities: vec![IDENTITY_D.into()],
                ..Default::default()
            }
            .into(),
            payload: Some(
                JavaScriptRun {
                    code: "console.log(6*7)".into(),
                    grant_profile: "gh".into(),
                    ..Default::default()
                }
                .into(),
            ),
            ..Default::default()
        };
        assert_eq!(
            request_digest(&req),
            "10fb47518f6b602cf612af56829cde66626c47fa8b1bf555510e36dfdc02ee4e"
        );
    }

    #[test]
    fn request_without_payload_is_kind_empty_under_either_domain() {
        let v2 = RunRequest {
            protocol: 4,
            ..Default::default()
        };
        assert_eq!(
            request_digest(&v2),
            "9ca84e1b8e3e7b6d857c1fe4c2b236e39a9ed2465d374bf9f1119dff7bc23d69"
        );
        assert_eq!(
            request_digest(&RunRequest::default()),
            "e5e75ef2f5c904e0e20f7cc3eab45f8f1ab08fa3f2bcfa27cf32faadf16c75b8"
        );
    }

    #[test]
    fn session_call_excludes_session_and_trace_ids() {
        let cell = CellRun {
            language: "javascript".into(),
            code: "1".into(),
            ..Default::default()
        };
        let call = SessionRunRequest {
            protocol: 4,
            session_id: "x".into(),
            trace_id: "y".into(),
            payload: Some(cell.clone().into()),
            ..Default::default()
        };
        let want = "8c92efee3036203b3ef1836e06448aa700180685415b6775b149923d1a5325f6";
        assert_eq!(session_request_digest(&call), want);
        let same_call_elsewhere = SessionRunRequest {
            session_id: "z".into(),
            trace_id: String::new(),
            ..call
        };
        assert_eq!(session_request_digest(&same_call_elsewhere), want);
        // A `Run` carrying the same cell shares the digest: the encoding is one.
        let run = RunRequest {
            protocol: 4,
            payload: Some(run_request::Payload::Cell(Box::new(cell))),
            ..Default::default()
        };
        assert_eq!(request_digest(&run), want);
    }

    #[test]
    fn runner_failed_project_hashes_outcome_number_and_every_step_field() {
        let resp = RunResponse {
            sandbox: "docker".into(),
            duration_ms: 77,
            result: Some(
                ProjectResult {
                    outcome: ProjectOutcome::PROJECT_OUTCOME_RUNNER_FAILED.into(),
                    outcome_detail: "runner died \u{fffd}".into(),
                    artifacts_truncated: true,
                    steps: vec![StepResult {
                        command: "make".into(),
                        exit_code: -2,
                        timed_out: true,
                        stderr: vec![0xff],
                        stdout_truncated: true,
                        duration_ms: 5,
                        ..Default::default()
                    }],
                    ..Default::default()
                }
                .into(),
            ),
            ..Default::default()
        };
        assert_eq!(
            result_digest(&resp),
            "9da21b3b9b258e1a10303e9b4cb39819c4ecb40b0dbe1101ca69ceb909895257"
        );
    }

    #[test]
    fn module_outputs_hash_canonical_nan_negative_zero_and_infinity_bits() {
        let resp = RunResponse {
            result: Some(
                crate::wire::ModuleResult {
                    runs: vec![ModuleRowResult {
                        status: 0,
                        outputs: vec![f64::from_bits(0x7ff8_0000_0000_0000), -0.0, f64::INFINITY],
                        ..Default::default()
                    }],
                    width: 3,
                    outcome: ProjectOutcome::PROJECT_OUTCOME_COMPLETED.into(),
                    stderr: vec![0],
                    ..Default::default()
                }
                .into(),
            ),
            ..Default::default()
        };
        assert_eq!(
            result_digest(&resp),
            "b2e349689d698dda24645b69d7cd988cd7678752910a0d9f3722d09bb8cd9732"
        );
    }

    #[test]
    fn response_without_result_is_kind_empty_and_ignores_evidence() {
        let resp = RunResponse {
            sandbox: "docker".into(),
            isolation: "kernel".into(),
            environment: "e".into(),
            instance: "k8s-pod-uid:1".into(),
            ..Default::default()
        };
        assert_eq!(
            result_digest(&resp),
            "cdcc8fe156dfd51739f77167fb5926c4057c6fd396bee2ed0479d0eb3399e053"
        );
    }

    #[test]
    fn javascript_and_cell_results_hash_flags_and_exit_codes() {
        let js = RunResponse {
            result: Some(
                crate::wire::JavaScriptResult {
                    exit_code: 1,
                    timed_out: true,
                    stdout_truncated: true,
                    stderr_truncated: true,
                    ..Default::default()
                }
                .into(),
            ),
            ..Default::default()
        };
        assert_eq!(
            result_digest(&js),
            "21af0b2b99f2f4e85076a38e8f45f6558bef3b6839e62e5b0f95700645ae3cf2"
        );
        let cell = RunResponse {
            result: Some(
                crate::wire::CellResult {
                    exit_code: -1,
                    interpreter_ended: true,
                    stderr: vec![1, 2],
                    ..Default::default()
                }
                .into(),
            ),
            ..Default::default()
        };
        assert_eq!(
            result_digest(&cell),
            "837fed148124f75c0f7976f0ee1f4b94d8592ca409bac633659ae6f3fc6f1b02"
        );
    }

    #[test]
    fn module_request_hashes_row_values_in_order() {
        let row = |values: Vec<f64>| ModuleRow {
            values,
            ..Default::default()
        };
        let module = ModuleRun {
            model: "VanDerPol".into(),
            rows: vec![row(vec![1.0, 2.0]), row(vec![0.5, -3.0])],
            end_time: 1.0,
            step: 0.1,
            ..Default::default()
        };
        let mut swapped = module.clone();
        swapped.rows.reverse();
        let req = |m: ModuleRun| RunRequest {
            protocol: 1,
            payload: Some(m.into()),
            ..Default::default()
        };
        assert_ne!(request_digest(&req(module)), request_digest(&req(swapped)));
    }
}
