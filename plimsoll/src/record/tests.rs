//! The golden digest vectors (`shared/vectors/golden.json`, read from disk) and the
//! verifier's refusals, one tampered field at a time.

use std::collections::BTreeMap;
use std::time::Duration;

use serde_json::Value;

use super::*;
use crate::wire::{
    JavaScriptResult, JavaScriptRun, ModuleResult, ModuleRowResult, ProjectOutcome, RunRecord,
    RunRequest, RunResponse, SessionRunRequest, SoftwareRule,
};

// === golden vectors ===

/// Beside the repository clone, as in CI; never copied into the repository.
const GOLDEN: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../../shared/vectors/golden.json"
);

/// Sections that hold vectors, and the one that holds only prose.
const SECTIONS: [&str; 4] = ["requests", "results", "records", "sessionFingerprints"];
const PROSE: &str = "about";

fn golden() -> serde_json::Map<String, Value> {
    let text = std::fs::read_to_string(GOLDEN)
        .unwrap_or_else(|e| panic!("reading the golden vectors at {GOLDEN}: {e}"));
    match serde_json::from_str(&text) {
        Ok(Value::Object(map)) => map,
        Ok(other) => panic!("{GOLDEN} is not a JSON object: {other}"),
        Err(e) => panic!("{GOLDEN} is not JSON: {e}"),
    }
}

fn field<'v>(vector: &'v Value, key: &str) -> &'v Value {
    vector
        .get(key)
        .unwrap_or_else(|| panic!("vector without {key:?}: {vector}"))
}

fn text<'v>(vector: &'v Value, key: &str) -> &'v str {
    field(vector, key)
        .as_str()
        .unwrap_or_else(|| panic!("{key:?} is not a string in {vector}"))
}

fn parse<T: serde::de::DeserializeOwned>(vector: &Value, key: &str) -> T {
    serde_json::from_value(field(vector, key).clone())
        .unwrap_or_else(|e| panic!("{} ({key}): {e}", text(vector, "name")))
}

/// The digest one vector produces, or why it cannot be computed.
fn digest_of(section: &str, vector: &Value) -> String {
    match section {
        "requests" => match text(vector, "kind") {
            "run" => request_digest(&parse::<RunRequest>(vector, "request")),
            "session" => session_request_digest(&parse::<SessionRunRequest>(vector, "request")),
            other => panic!("request vector of unknown kind {other:?}"),
        },
        "results" => result_digest(&parse::<RunResponse>(vector, "response")),
        "records" => record_digest(&parse::<RunRecord>(vector, "record")),
        "sessionFingerprints" => session_fingerprint(text(vector, "sessionId")),
        other => panic!("unknown section {other:?}"),
    }
}

#[test]
fn golden_file_has_only_known_nonempty_sections() {
    let file = golden();
    for (key, value) in &file {
        if key == PROSE {
            continue;
        }
        assert!(
            SECTIONS.contains(&key.as_str()),
            "unknown section {key:?} in {GOLDEN}"
        );
        let vectors = value
            .as_array()
            .unwrap_or_else(|| panic!("{key} is not a list"));
        assert!(!vectors.is_empty(), "section {key} is empty");
    }
    for section in SECTIONS {
        assert!(file.contains_key(section), "section {section} is missing");
    }
}

#[test]
fn every_golden_vector_reproduces() {
    let file = golden();
    let mut checked: BTreeMap<&str, usize> = BTreeMap::new();
    let mut mismatches = Vec::new();
    for section in SECTIONS {
        let vectors = file
            .get(section)
            .and_then(Value::as_array)
            .unwrap_or_else(|| panic!("section {section} is missing or not a list"));
        for vector in vectors {
            let got = digest_of(section, vector);
            let want = text(vector, "sha256");
            if got != want {
                mismatches.push(format!(
                    "{section} / {}: got {got}, want {want}",
                    text(vector, "name")
                ));
            }
            *checked.entry(section).or_default() += 1;
        }
    }
    assert!(
        mismatches.is_empty(),
        "golden mismatches:\n{}",
        mismatches.join("\n")
    );
    for section in SECTIONS {
        assert!(
            checked.get(section).copied().unwrap_or(0) > 0,
            "no vector checked in {section}"
        );
    }
}

#[test]
fn golden_request_kinds_are_all_known() {
    let file = golden();
    let requests = file.get("requests").and_then(Value::as_array);
    for vector in requests.into_iter().flatten() {
        assert!(
            matches!(text(vector, "kind"), "run" | "session"),
            "{vector}"
        );
    }
}

// === check ===

const ID_A: &str = "oci-manifest:linux/amd64@sha256:aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";
const ID_B: &str = "oci-manifest:linux/amd64@sha256:bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb";

fn approved() -> SoftwareRule {
    SoftwareRule {
        mode: "approved".into(),
        identities: vec![ID_B.into(), ID_A.into()],
        ..Default::default()
    }
}

/// A request, its rule and an honest answer with a sealed record.
struct Answered {
    req_digest: String,
    rule: SoftwareRule,
    resp: RunResponse,
}

fn answered() -> Answered {
    let rule = approved();
    let req = RunRequest {
        protocol: 4,
        minimum_isolation: "container".into(),
        software_rule: rule.clone().into(),
        payload: Some(
            JavaScriptRun {
                code: "console.log(1+1)".into(),
                ..Default::default()
            }
            .into(),
        ),
        ..Default::default()
    };
    let mut resp = RunResponse {
        sandbox: "docker".into(),
        isolation: "kernel".into(),
        environment: "docker-image:sha256:01".into(),
        software_identity: ID_A.into(),
        instance: "k8s-pod-uid:6f1c-22".into(),
        duration_ms: 40,
        result: Some(
            JavaScriptResult {
                stdout: b"2\n".to_vec(),
                ..Default::default()
            }
            .into(),
        ),
        ..Default::default()
    };
    let stamp = Stamp {
        provider: resp.sandbox.clone(),
        isolation: resp.isolation.clone(),
        environment: resp.environment.clone(),
        policy: "openshell-policy:sha256:cd".into(),
        software_identity: resp.software_identity.clone(),
        software_rule_id: software_rule_id(Some(&rule)),
        instance: resp.instance.clone(),
        started_unix_ms: 1_790_000_000_000,
        elapsed: Duration::from_millis(41),
        ..Default::default()
    };
    let req_digest = request_digest(&req);
    resp.record = seal(req_digest.clone(), result_digest(&resp), stamp).into();
    Answered {
        req_digest,
        rule,
        resp,
    }
}

impl Answered {
    fn check(&self) -> Result<&RunRecord, RecordError> {
        check_single(&self.req_digest, Some(&self.rule), &self.resp)
    }

    /// Changes the record only, leaving its stated digest as sealed.
    fn tamper(mut self, change: impl FnOnce(&mut RunRecord)) -> Self {
        if let Some(rec) = self.resp.record.as_option_mut() {
            change(rec);
        }
        self
    }

    /// Changes the record and re-seals its own digest, so only the targeted check can fail.
    fn tamper_resealed(self, change: impl FnOnce(&mut RunRecord)) -> Self {
        self.tamper(|rec| {
            change(rec);
            rec.record_sha256 = record_digest(rec);
        })
    }
}

fn variant(result: Result<&RunRecord, RecordError>) -> RecordError {
    match result {
        Ok(rec) => panic!("a tampered record passed: {rec:?}"),
        Err(e) => e,
    }
}

#[test]
fn honest_answer_passes_check_and_check_single() {
    let a = answered();
    assert!(check(&a.req_digest, Some(&a.rule), &a.resp).is_ok());
    assert!(a.check().is_ok());
}

#[test]
fn missing_record_is_refused() {
    let mut a = answered();
    a.resp.record = Default::default();
    assert_eq!(variant(a.check()), RecordError::NoRecord);
}

#[test]
fn any_version_but_4_is_refused_even_when_resealed() {
    for version in [0, 1, 2, 3, 5] {
        let a = answered().tamper_resealed(|r| r.version = version);
        assert_eq!(variant(a.check()), RecordError::Version { found: version });
    }
    let newer = RecordError::Version { found: 5 }.to_string();
    assert!(newer.contains("newer daemon"), "{newer}");
}

#[test]
fn unanswered_code_on_an_answer_is_refused() {
    let a = answered().tamper_resealed(|r| r.unanswered = "internal".into());
    assert!(matches!(variant(a.check()), RecordError::Unanswered { code } if code == "internal"));
}

#[test]
fn request_digest_of_another_request_is_refused() {
    let a = answered();
    let other = request_digest(&RunRequest {
        protocol: 4,
        ..Default::default()
    });
    let err = variant(check(&other, Some(&a.rule), &a.resp));
    assert!(matches!(err, RecordError::RequestDigest { computed, .. } if computed == other));
}

#[test]
fn changed_result_is_refused() {
    let mut a = answered();
    if let Some(crate::wire::run_response::Result::Javascript(js)) = &mut a.resp.result {
        js.stdout = b"3\n".to_vec();
    }
    assert!(matches!(
        variant(a.check()),
        RecordError::ResultDigest { .. }
    ));
}

#[test]
fn provider_differing_from_sandbox_is_refused() {
    let a = answered().tamper_resealed(|r| r.provider = "wasm".into());
    let err = variant(a.check());
    assert_eq!(
        err,
        RecordError::Provider {
            record: "wasm".into(),
            response: "docker".into()
        }
    );
    let message = err.to_string();
    assert!(
        message.contains("wasm") && message.contains("docker"),
        "{message}"
    );
}

#[test]
fn isolation_differing_from_response_is_refused() {
    let mut a = answered();
    a.resp.isolation = "vm".into();
    assert_eq!(
        variant(a.check()),
        RecordError::Isolation {
            record: "kernel".into(),
            response: "vm".into()
        }
    );
}

#[test]
fn environment_differing_from_response_is_refused() {
    let a = answered().tamper_resealed(|r| r.environment = "docker-image:sha256:02".into());
    assert!(matches!(
        variant(a.check()),
        RecordError::Environment { .. }
    ));
}

#[test]
fn instance_differing_from_response_is_refused() {
    let a = answered().tamper_resealed(|r| r.instance = String::new());
    assert!(
        matches!(variant(a.check()), RecordError::Instance { record, .. } if record.is_empty())
    );
}

#[test]
fn instance_that_is_not_a_typed_reference_is_refused() {
    let mut a = answered().tamper_resealed(|r| r.instance = "Pod:1".into());
    a.resp.instance = "Pod:1".into();
    assert_eq!(
        variant(a.check()),
        RecordError::InstanceForm {
            instance: "Pod:1".into()
        }
    );
}

#[test]
fn software_identity_differing_from_response_is_refused() {
    let a = answered().tamper_resealed(|r| r.software_identity = ID_B.into());
    assert!(matches!(
        variant(a.check()),
        RecordError::SoftwareIdentity { .. }
    ));
}

#[test]
fn rule_id_of_another_rule_is_refused() {
    let a = answered();
    let exact = SoftwareRule {
        mode: "exact".into(),
        identities: vec![ID_A.into()],
        ..Default::default()
    };
    let err = variant(check(&a.req_digest, Some(&exact), &a.resp));
    assert!(
        matches!(err, RecordError::SoftwareRuleId { expected, .. } if expected == format!("exact:{ID_A}"))
    );
    // No rule sent, but the record states one.
    assert!(matches!(
        variant(check(&a.req_digest, None, &a.resp)),
        RecordError::SoftwareRuleId { .. }
    ));
}

#[test]
fn software_outside_the_rule_is_refused() {
    let outside = "oci-manifest:linux/amd64@sha256:cccc";
    let mut a = answered().tamper_resealed(|r| r.software_identity = outside.into());
    a.resp.software_identity = outside.into();
    assert!(matches!(
        variant(a.check()),
        RecordError::SoftwareNotAllowed { identity, .. } if identity == outside
    ));
}

#[test]
fn empty_software_never_satisfies_a_rule() {
    let mut a = answered().tamper_resealed(|r| r.software_identity = String::new());
    a.resp.software_identity = String::new();
    assert!(matches!(
        variant(a.check()),
        RecordError::SoftwareNotAllowed { .. }
    ));
}

#[test]
fn field_changed_without_resealing_is_refused_by_own_digest() {
    let a = answered().tamper(|r| r.policy = "openshell-policy:sha256:ff".into());
    assert!(matches!(
        variant(a.check()),
        RecordError::RecordDigest { .. }
    ));
    let a = answered().tamper(|r| r.ended_unix_ms += 1);
    assert!(matches!(
        variant(a.check()),
        RecordError::RecordDigest { .. }
    ));
    let a = answered().tamper(|r| r.record_sha256 = "00".repeat(32));
    assert!(matches!(
        variant(a.check()),
        RecordError::RecordDigest { .. }
    ));
}

#[test]
fn single_run_with_session_fields_is_refused_by_check_single_only() {
    for change in [
        (|r: &mut RunRecord| r.session = session_fingerprint("s")) as fn(&mut RunRecord),
        |r| r.sequence = 1,
        |r| r.previous_sha256 = "00".repeat(32),
    ] {
        let a = answered().tamper_resealed(change);
        assert!(check(&a.req_digest, Some(&a.rule), &a.resp).is_ok());
        assert!(matches!(
            variant(a.check()),
            RecordError::SessionFields { .. }
        ));
    }
}

#[test]
fn module_answer_survives_a_json_round_trip_bit_for_bit() {
    // Clients recompute from decoded JSON, so canonical NaN, -0.0 and infinities must
    // come back with the same bits for the result digest to match.
    let mut resp = RunResponse {
        sandbox: "docker".into(),
        isolation: "kernel".into(),
        result: Some(
            ModuleResult {
                runs: vec![ModuleRowResult {
                    status: 1,
                    outputs: vec![
                        f64::from_bits(0xfff8_0000_0000_0001),
                        -0.0,
                        f64::NEG_INFINITY,
                        0.1,
                    ],
                    ..Default::default()
                }],
                width: 4,
                outcome: ProjectOutcome::PROJECT_OUTCOME_RUNNER_FAILED.into(),
                ..Default::default()
            }
            .into(),
        ),
        ..Default::default()
    };
    canonicalize_response(&mut resp);
    let stamp = Stamp {
        provider: "docker".into(),
        isolation: "kernel".into(),
        ..Default::default()
    };
    resp.record = seal("aa".into(), result_digest(&resp), stamp).into();
    let json = serde_json::to_string(&resp).unwrap_or_else(|e| panic!("encoding: {e}"));
    let decoded: RunResponse =
        serde_json::from_str(&json).unwrap_or_else(|e| panic!("decoding {json}: {e}"));
    assert!(check_single("aa", None, &decoded).is_ok(), "{json}");
}

// === check_unanswered and check_chain ===

fn unanswered(code: &str) -> (String, SoftwareRule, RunRecord) {
    let rule = approved();
    let stamp = Stamp {
        provider: "docker".into(),
        isolation: "kernel".into(),
        software_identity: ID_B.into(),
        software_rule_id: software_rule_id(Some(&rule)),
        session: session_fingerprint("00112233445566778899aabbccddeeff"),
        sequence: 2,
        previous_sha256: "11".repeat(32),
        ..Default::default()
    };
    let digest = "22".repeat(32);
    (digest.clone(), rule, seal_unanswered(digest, code, stamp))
}

#[test]
fn honest_unanswered_record_passes() {
    for code in UNANSWERED_CODES {
        let (digest, rule, rec) = unanswered(code);
        assert_eq!(
            check_unanswered(&digest, Some(&rule), &rec),
            Ok(()),
            "{code}"
        );
    }
}

#[test]
fn unanswered_record_refusals_name_the_failed_check() {
    let reseal = |change: fn(&mut RunRecord)| {
        let (digest, rule, mut rec) = unanswered("deadline_exceeded");
        change(&mut rec);
        rec.record_sha256 = record_digest(&rec);
        check_unanswered(&digest, Some(&rule), &rec)
    };
    assert_eq!(
        reseal(|r| r.version = 3),
        Err(RecordError::Version { found: 3 })
    );
    assert!(matches!(
        reseal(|r| r.instance = "x".into()),
        Err(RecordError::InstanceForm { .. })
    ));
    assert!(matches!(
        reseal(|r| r.result_sha256 = "33".into()),
        Err(RecordError::UnansweredResult { .. })
    ));
    assert!(matches!(
        reseal(|r| r.unanswered = "ok".into()),
        Err(RecordError::UnansweredCode { .. })
    ));
    assert!(matches!(
        reseal(|r| r.unanswered = String::new()),
        Err(RecordError::UnansweredCode { .. })
    ));
    assert!(matches!(
        reseal(|r| r.request_sha256 = "44".into()),
        Err(RecordError::RequestDigest { .. })
    ));
    assert!(matches!(
        reseal(|r| r.software_rule_id = String::new()),
        Err(RecordError::SoftwareRuleId { .. })
    ));
    assert!(matches!(
        reseal(|r| r.software_identity = "img:z".into()),
        Err(RecordError::SoftwareNotAllowed { .. })
    ));

    let (digest, rule, mut rec) = unanswered("internal");
    rec.policy = "p".into();
    assert!(matches!(
        check_unanswered(&digest, Some(&rule), &rec),
        Err(RecordError::RecordDigest { .. })
    ));
}

#[test]
fn chain_accepts_only_the_next_link() {
    let (_, _, rec) = unanswered("unknown");
    let session = session_fingerprint("00112233445566778899aabbccddeeff");
    let last = "11".repeat(32);
    assert_eq!(check_chain(&rec, &session, 1, &last), Ok(()));
    assert!(matches!(
        check_chain(&rec, &session_fingerprint("other"), 1, &last),
        Err(RecordError::Session { .. })
    ));
    assert_eq!(
        check_chain(&rec, &session, 2, &last),
        Err(RecordError::Sequence {
            record: 2,
            expected: 3
        })
    );
    assert!(matches!(
        check_chain(&rec, &session, 1, ""),
        Err(RecordError::Previous { .. })
    ));
    assert!(matches!(
        check_chain(&rec, &session, u64::MAX, &last),
        Err(RecordError::Sequence { .. })
    ));
}

#[test]
fn first_session_call_links_to_nothing() {
    let session = session_fingerprint("s");
    let stamp = Stamp {
        session: session.clone(),
        sequence: 1,
        ..Default::default()
    };
    let rec = seal("aa".into(), "bb".into(), stamp);
    assert_eq!(check_chain(&rec, &session, 0, ""), Ok(()));
}

#[test]
fn instance_form_matches_the_typed_reference_pattern() {
    let id127 = "a".repeat(127);
    let kind32 = format!("a{}", "b".repeat(31));
    for good in [
        "",
        "k8s-pod-uid:6f1c-22",
        "a:b",
        "a1-:x.y_z:w-",
        &format!("k:{id127}"),
        &format!("{kind32}:x"),
    ] {
        assert!(valid_instance(good), "{good:?} should be valid");
    }
    let id128 = "a".repeat(128);
    let kind33 = format!("a{}", "b".repeat(32));
    for bad in [
        "k8s",
        ":x",
        "k:",
        "1k:x",
        "-k:x",
        "K:x",
        "k_8:x",
        "k:x y",
        "k:é",
        "k:x/y",
        &format!("k:{id128}"),
        &format!("{kind33}:x"),
    ] {
        assert!(!valid_instance(bad), "{bad:?} should be invalid");
    }
}
