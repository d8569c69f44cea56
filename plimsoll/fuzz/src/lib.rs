//! What the fuzz targets share: the daemon's validation steps for `Run` and `SessionRun`, in
//! the order of wire.md §6.1, and the properties every digest must have.
//!
//! Each target decodes its input one way (proto3 JSON, binary protobuf) and hands the decoded
//! message to [`run_request`] or [`session_run_request`]. Those never return an error: a
//! refusal is an ordinary outcome. What they look for is a panic, or a broken property, which
//! they turn into a panic so libFuzzer keeps the input.

use plimsoll::record;
use plimsoll::refusal::Refusal;
use plimsoll::tier::IsolationTier;
use plimsoll::payload::PayloadKind;
use plimsoll::validate;
use plimsoll::wire::{RunRequest, SessionRunRequest, run_request, session_run_request};

/// Every tier, weakest first, to hold a parsed floor against.
const TIERS: [IsolationTier; 5] = [
    IsolationTier::None,
    IsolationTier::Process,
    IsolationTier::Container,
    IsolationTier::Kernel,
    IsolationTier::Vm,
];

/// A provider's default and ceiling for `effective_timeout_ms` (the wasm provider's values).
const PROVIDER_DEFAULT_MS: u32 = 10_000;
const PROVIDER_CEILING_MS: u32 = 30_000;

/// Steps 1–4 of wire.md §6.1 for a `Run`, as `plimsolld/src/service/run.rs` runs them:
/// protocol, floor, software rule, payload, stopping at the first refusal.
pub fn check_run(req: &RunRequest) -> Result<PayloadKind, Refusal> {
    validate::check_protocol(req.protocol)?;
    let floor = validate::check_floor(&req.minimum_isolation)?;
    for tier in TIERS {
        let _ = floor.is_met_by(tier);
    }
    validate::check_software_rule(req.software_rule.as_option())?;
    validate::check_run_payload(req.payload.as_ref())
}

/// Steps 1–4 of wire.md §6.1 for a `SessionRun`: the same envelope checks, then the session
/// payload (javascript, project or cell).
pub fn check_session_run(req: &SessionRunRequest) -> Result<PayloadKind, Refusal> {
    validate::check_protocol(req.protocol)?;
    let floor = validate::check_floor(&req.minimum_isolation)?;
    for tier in TIERS {
        let _ = floor.is_met_by(tier);
    }
    validate::check_software_rule(req.software_rule.as_option())?;
    validate::check_session_payload(req.payload.as_ref())
}

/// Validates a decoded `Run` request and takes its digest, as the daemon would on arrival,
/// and returns both so a target can compare them across encodings.
///
/// Properties: the digest is 64 lowercase hex digits and does not depend on `trace_id`; a
/// request with a javascript, project or cell payload digests like the equivalent
/// `SessionRun` (`records.md` §4.2).
pub fn run_request(req: &RunRequest) -> (Result<PayloadKind, String>, String) {
    let verdict = check_run(req);
    envelope_extras(&req.trace_id, req.timeout_ms, req.software_rule.as_option());
    let verdict = settle(verdict);

    let digest = record::request_digest(req);
    assert_digest(&digest);

    let mut retraced = req.clone();
    retraced.trace_id = "fuzz-trace".into();
    assert_eq!(
        record::request_digest(&retraced),
        digest,
        "trace_id changed the request digest"
    );

    if let Some(session) = as_session_run(req) {
        assert_eq!(
            record::session_request_digest(&session),
            digest,
            "a Run and the equivalent SessionRun digest differently"
        );
    }
    (verdict, digest)
}

/// Validates a decoded `SessionRun` request and takes its digest; see [`run_request`].
///
/// Properties: the digest is 64 lowercase hex digits and depends on neither `trace_id` nor
/// `session_id`.
pub fn session_run_request(req: &SessionRunRequest) -> (Result<PayloadKind, String>, String) {
    let verdict = check_session_run(req);
    envelope_extras(&req.trace_id, req.timeout_ms, req.software_rule.as_option());
    let verdict = settle(verdict);

    let digest = record::session_request_digest(req);
    assert_digest(&digest);

    let mut renamed = req.clone();
    renamed.trace_id = "fuzz-trace".into();
    renamed.session_id = "fuzz-session".into();
    assert_eq!(
        record::session_request_digest(&renamed),
        digest,
        "trace_id or session_id changed the session request digest"
    );
    (verdict, digest)
}

/// What the daemon does with the envelope besides refusing: keep or drop the trace id, clamp
/// the timeout, name the rule in the record and hold an identity against it.
fn envelope_extras(trace_id: &str, timeout_ms: i32, rule: Option<&plimsoll::wire::SoftwareRule>) {
    if let Some(kept) = validate::trace_id(trace_id) {
        assert_eq!(kept, trace_id, "trace_id kept a different string");
    }
    let ms = validate::effective_timeout_ms(timeout_ms, PROVIDER_DEFAULT_MS, PROVIDER_CEILING_MS);
    assert!(
        ms <= PROVIDER_CEILING_MS.min(validate::HARD_TIMEOUT_CEILING_MS),
        "effective timeout {ms} ms is over the ceiling"
    );
    let rule_id = record::software_rule_id(rule);
    let _ = rule_id.len();
    let _ = record::rule_allows(rule, "oci-manifest:linux/amd64@sha256:0");
    let _ = record::rule_allows(rule, "");
}

/// A refusal as the caller would receive it, reduced to its message so two verdicts compare.
fn settle(verdict: Result<PayloadKind, Refusal>) -> Result<PayloadKind, String> {
    verdict.map_err(|refusal| {
        let _ = refusal.to_connect_error();
        refusal.to_string()
    })
}

/// A `Run` request's `SessionRun` twin: same envelope and payload, no session id. `None` for
/// a module payload, which has no session form.
fn as_session_run(req: &RunRequest) -> Option<SessionRunRequest> {
    let payload = match &req.payload {
        None => None,
        Some(run_request::Payload::Javascript(js)) => {
            Some(session_run_request::Payload::Javascript(js.clone()))
        }
        Some(run_request::Payload::Project(p)) => {
            Some(session_run_request::Payload::Project(p.clone()))
        }
        Some(run_request::Payload::Cell(c)) => Some(session_run_request::Payload::Cell(c.clone())),
        Some(run_request::Payload::Module(_)) => return None,
    };
    Some(SessionRunRequest {
        protocol: req.protocol,
        minimum_isolation: req.minimum_isolation.clone(),
        trace_id: req.trace_id.clone(),
        timeout_ms: req.timeout_ms,
        software_rule: req.software_rule.clone(),
        payload,
        ..Default::default()
    })
}

/// A digest is lowercase hex SHA-256: 64 digits of `[0-9a-f]`.
pub fn assert_digest(digest: &str) {
    assert!(
        digest.len() == 64
            && digest
                .bytes()
                .all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')),
        "digest {digest:?} is not 64 lowercase hex digits"
    );
}
