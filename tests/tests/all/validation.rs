//! Request validation and its order (wire.md §5.5, §6).
//!
//! The default provider is `disabled` (tier `none`), so a request that passes every
//! check ends as the disabled refusal; that is the control each refusal is set against.

use plimsoll_tests::Daemon;
use plimsoll_tests::connect::{
    self, MAX_CODE_BYTES, NOT_DISPATCHED, PROTOCOL, Reason, assert_disabled, assert_error,
    assert_invalid, assert_no_mark_header, assert_refused,
};
use serde_json::{Value, json};

/// Sends a `Run` with `body` and asserts `invalid_argument` marked `request`.
fn assert_run_invalid(d: &Daemon, body: &Value) {
    let req = connect::call("Run", body);
    let resp = req.send(d.addr);
    assert!(
        resp.status < 500,
        "bad input is never a 5xx: {body}\n{resp}"
    );
    assert_invalid(&resp, &req);
}

/// Sends a `Run` with `body` and asserts it passed validation: the only refusal left
/// for the disabled provider says nothing runs here (`unsupported`).
fn assert_run_valid(d: &Daemon, body: &Value) {
    let req = connect::call("Run", body);
    let resp = req.send(d.addr);
    assert_refused(
        &resp,
        &req,
        &connect::ConnectError::of(&resp).code,
        Reason::Unsupported,
    );
}

fn project_with_paths(paths: &[&str]) -> Value {
    let files: Vec<(&str, &str)> = paths.iter().map(|p| (*p, "text")).collect();
    connect::project(&files, &["true"])
}

#[test]
fn run_without_a_floor_is_refused_as_disabled() {
    let d = Daemon::open();
    let req = connect::call("Run", &connect::javascript("console.log(6*7)"));
    let resp = req.send(d.addr);
    assert_disabled(&resp, &req);
    assert_no_mark_header(&resp);
}

#[test]
fn floor_none_is_invalid_argument() {
    let d = Daemon::open();
    assert_run_invalid(&d, &connect::javascript_with_floor("1", "none"));
}

#[test]
fn unknown_floors_are_invalid_argument() {
    let d = Daemon::open();
    for floor in ["bogus", "unknown", "Process", "VM", " process"] {
        assert_run_invalid(&d, &connect::javascript_with_floor("1", floor));
    }
}

#[test]
fn floor_above_the_current_tier_is_refused_as_isolation() {
    let d = Daemon::open();
    for floor in ["process", "container", "kernel", "vm"] {
        let req = connect::call("Run", &connect::javascript_with_floor("1", floor));
        let resp = req.send(d.addr);
        assert_refused(&resp, &req, "failed_precondition", Reason::Isolation);
        assert_no_mark_header(&resp);
    }
}

#[test]
fn payload_is_validated_before_the_floor_is_compared() {
    let d = Daemon::open();
    assert_run_invalid(&d, &connect::javascript_with_floor("", "process"));
    assert_run_invalid(
        &d,
        &json!({ "protocol": PROTOCOL, "minimumIsolation": "vm", "javascript": { "code": "a\u{0}b" } }),
    );
}

#[test]
fn empty_code_is_invalid_argument() {
    let d = Daemon::open();
    assert_run_invalid(&d, &connect::javascript(""));
    assert_run_invalid(&d, &json!({ "protocol": PROTOCOL, "javascript": {} }));
}

#[test]
fn nul_in_code_is_invalid_argument() {
    let d = Daemon::open();
    assert_run_invalid(&d, &connect::javascript("console.log(1)\u{0}"));
}

#[test]
fn code_over_256_kib_is_invalid_argument_and_at_256_kib_is_accepted() {
    let d = Daemon::open();
    assert_run_invalid(&d, &connect::javascript(&"a".repeat(MAX_CODE_BYTES + 1)));
    let req = connect::call("Run", &connect::javascript(&"a".repeat(MAX_CODE_BYTES)));
    assert_disabled(&req.send(d.addr), &req);
}

#[test]
fn code_limit_counts_bytes_not_characters() {
    let d = Daemon::open();
    // 2-byte characters: 131 073 of them are 262 146 bytes.
    assert_run_invalid(
        &d,
        &connect::javascript(&"é".repeat(MAX_CODE_BYTES / 2 + 1)),
    );
}

#[test]
fn request_without_a_payload_is_invalid_argument() {
    let d = Daemon::open();
    assert_run_invalid(&d, &json!({ "protocol": PROTOCOL }));
}

/// Two members of the `payload` oneof can only be written in JSON, where proto3 JSON
/// refuses them while decoding: the refusal is marked `request` by the detail when the
/// handler saw it, or by the pre-handler header when the decoder did, never both ways
/// nor neither.
#[test]
fn request_with_two_payloads_is_invalid_argument() {
    let d = Daemon::open();
    let body = json!({
        "protocol": PROTOCOL,
        "javascript": { "code": "1" },
        "project": { "files": [], "steps": ["true"] },
    });
    let req = connect::call("Run", &body);
    let resp = req.send(d.addr);
    let err = assert_error(&resp, &req, "invalid_argument");
    let by_detail = err.not_dispatched() == Some(Reason::Request.detail_bytes());
    let by_header = resp.all(NOT_DISPATCHED) == ["request"];
    assert!(
        by_detail != by_header,
        "marked request exactly one way:\n{resp}"
    );
}

#[test]
fn cell_sent_to_run_is_invalid_argument() {
    let d = Daemon::open();
    assert_run_invalid(
        &d,
        &json!({ "protocol": PROTOCOL, "cell": { "language": "python", "code": "1" } }),
    );
}

#[test]
fn unclean_project_paths_are_invalid_argument() {
    let d = Daemon::open();
    let too_long = "a".repeat(1025);
    for path in [
        "../x", "/abs", "a/./b", "a/../b", "a//b", "a/", "./a", ".", "..", "", "a\\b", "a\u{1}b",
        "a\nb", "a\u{7f}b", &too_long,
    ] {
        let body = project_with_paths(&[path]);
        let req = connect::call("Run", &body);
        let resp = req.send(d.addr);
        assert!(resp.status < 500, "path {path:?}: {resp}");
        assert_invalid(&resp, &req);
    }
}

#[test]
fn clean_project_paths_pass_validation() {
    let d = Daemon::open();
    let longest = "a".repeat(1024);
    assert_run_valid(
        &d,
        &project_with_paths(&["main.py", "src/lib/x.js", ".plimsoll/code.py", &longest]),
    );
}

#[test]
fn duplicate_file_paths_are_invalid_argument() {
    let d = Daemon::open();
    assert_run_invalid(&d, &project_with_paths(&["a.txt", "b.txt", "a.txt"]));
}

#[test]
fn unclean_or_duplicate_artifact_paths_are_invalid_argument() {
    let d = Daemon::open();
    for artifacts in [json!(["../out"]), json!(["/out"]), json!(["out", "out"])] {
        let body = json!({
            "protocol": PROTOCOL,
            "project": { "files": [{ "path": "a", "content": "" }], "steps": ["true"], "artifacts": artifacts },
        });
        assert_run_invalid(&d, &body);
    }
}

#[test]
fn project_step_count_is_bounded() {
    let d = Daemon::open();
    assert_run_invalid(&d, &connect::project(&[("a", "x")], &[]));
    let steps: Vec<&str> = vec!["true"; 21];
    assert_run_invalid(&d, &connect::project(&[("a", "x")], &steps));
    let steps: Vec<&str> = vec!["true"; 20];
    assert_run_valid(&d, &connect::project(&[("a", "x")], &steps));
}

#[test]
fn project_step_with_nul_or_over_16_kib_is_invalid_argument() {
    let d = Daemon::open();
    assert_run_invalid(&d, &connect::project(&[("a", "x")], &["echo a\u{0}"]));
    let long = "e".repeat(16 * 1024 + 1);
    assert_run_invalid(&d, &connect::project(&[("a", "x")], &[&long]));
}

#[test]
fn project_file_count_is_bounded() {
    let d = Daemon::open();
    let names: Vec<String> = (0..201).map(|i| format!("f{i}")).collect();
    let files: Vec<(&str, &str)> = names.iter().map(|n| (n.as_str(), "")).collect();
    assert_run_invalid(&d, &connect::project(&files, &["true"]));
    assert_run_valid(&d, &connect::project(&files[..200], &["true"]));
}

#[test]
fn module_payload_rules_are_enforced() {
    let d = Daemon::open();
    let module = |m: Value| json!({ "protocol": PROTOCOL, "module": m });
    for bad in [
        json!({ "model": "-bad", "rows": [{ "values": [1.0] }], "endTime": 1.0, "step": 0.1 }),
        json!({ "model": "m", "rows": [], "endTime": 1.0, "step": 0.1 }),
        json!({ "model": "m", "rows": [{ "values": [] }], "endTime": 1.0, "step": 0.1 }),
        json!({ "model": "m", "rows": [{ "values": [1.0] }, { "values": [1.0, 2.0] }], "endTime": 1.0, "step": 0.1 }),
        json!({ "model": "m", "rows": [{ "values": ["NaN"] }], "endTime": 1.0, "step": 0.1 }),
        json!({ "model": "m", "rows": [{ "values": [1.0] }], "endTime": 0.0, "step": 0.1 }),
        json!({ "model": "m", "rows": [{ "values": [1.0] }], "endTime": 1.0, "step": -0.1 }),
        json!({ "model": "m", "rows": [{ "values": [1.0] }], "endTime": 2000000.0, "step": 1.0 }),
    ] {
        assert_run_invalid(&d, &module(bad));
    }
    assert_run_valid(
        &d,
        &module(
            json!({ "model": "m", "rows": [{ "values": [1.0] }], "endTime": 1.0, "step": 0.1 }),
        ),
    );
}

#[test]
fn malformed_software_rules_are_invalid_argument() {
    let d = Daemon::open();
    let id = format!("oci-manifest:linux/amd64@sha256:{}", "a".repeat(64));
    for rule in [
        json!({ "mode": "exact", "identities": [id, "other"] }),
        json!({ "mode": "exact" }),
        json!({ "mode": "approved", "identities": [] }),
        json!({ "mode": "bogus", "identities": [id] }),
        json!({ "identities": [id] }),
        json!({ "mode": "approved", "identities": [id, id] }),
        json!({ "mode": "exact", "identities": ["has space"] }),
        json!({ "mode": "exact", "identities": ["x".repeat(257)] }),
    ] {
        let body =
            json!({ "protocol": PROTOCOL, "softwareRule": rule, "javascript": { "code": "1" } });
        assert_run_invalid(&d, &body);
    }
}

#[test]
fn software_rule_is_compared_after_the_floor_and_refused_as_environment() {
    let d = Daemon::open();
    let rule = json!({ "mode": "exact", "identities": [format!("oci-manifest:linux/amd64@sha256:{}", "a".repeat(64))] });
    let body = json!({ "protocol": PROTOCOL, "softwareRule": rule, "javascript": { "code": "1" } });
    let req = connect::call("Run", &body);
    assert_refused(
        &req.send(d.addr),
        &req,
        "failed_precondition",
        Reason::Environment,
    );
    let body = json!({ "protocol": PROTOCOL, "minimumIsolation": "process", "softwareRule": rule, "javascript": { "code": "1" } });
    let req = connect::call("Run", &body);
    assert_refused(
        &req.send(d.addr),
        &req,
        "failed_precondition",
        Reason::Isolation,
    );
}

#[test]
fn grant_profile_name_over_128_bytes_is_invalid_argument() {
    let d = Daemon::open();
    let body = json!({ "protocol": PROTOCOL, "javascript": { "code": "1", "grantProfile": "p".repeat(129) } });
    assert_run_invalid(&d, &body);
}

#[test]
fn unknown_grant_profile_is_permission_denied_before_the_floor() {
    let d = Daemon::open();
    for floor in [None, Some("vm")] {
        let mut body = json!({ "protocol": PROTOCOL, "javascript": { "code": "1", "grantProfile": "github" } });
        if let Some(f) = floor {
            body["minimumIsolation"] = json!(f);
        }
        let req = connect::call("Run", &body);
        let err = assert_refused(
            &req.send(d.addr),
            &req,
            "permission_denied",
            Reason::Permission,
        );
        assert_eq!(
            err.message,
            "grant_profile \"github\" is not available to this caller"
        );
    }
}

#[test]
fn bad_trace_id_is_dropped_silently() {
    let d = Daemon::open();
    for trace in ["has space", "x".repeat(65).as_str(), "é"] {
        let body = json!({ "protocol": PROTOCOL, "traceId": trace, "javascript": { "code": "1" } });
        let req = connect::call("Run", &body);
        assert_disabled(&req.send(d.addr), &req);
    }
}

#[test]
fn non_positive_timeout_means_the_default() {
    let d = Daemon::open();
    for timeout in [0, -1, i32::MIN] {
        let body =
            json!({ "protocol": PROTOCOL, "timeoutMs": timeout, "javascript": { "code": "1" } });
        let req = connect::call("Run", &body);
        assert_disabled(&req.send(d.addr), &req);
    }
}

#[test]
fn bad_input_is_never_answered_with_5xx() {
    let d = Daemon::open();
    let bodies = [
        json!(null),
        json!([]),
        json!("run"),
        json!({ "protocol": "four" }),
        json!({ "protocol": -4 }),
        json!({ "protocol": 1e40 }),
        json!({ "protocol": PROTOCOL, "javascript": { "code": 5 } }),
        json!({ "protocol": PROTOCOL, "javascript": "code" }),
        json!({ "protocol": PROTOCOL, "javascript": null, "project": null }),
        json!({ "protocol": PROTOCOL, "project": { "files": [{ "path": 1 }] } }),
        json!({ "protocol": PROTOCOL, "minimumIsolation": 3, "javascript": { "code": "1" } }),
        json!({ "protocol": PROTOCOL, "timeoutMs": "soon", "javascript": { "code": "1" } }),
        json!({ "protocol": PROTOCOL, "module": { "rows": [{ "values": [1e308, -1e308] }] } }),
        json!({ "protocol": PROTOCOL, "softwareRule": "exact", "javascript": { "code": "1" } }),
    ];
    for procedure in ["Run", "OpenSession", "SessionRun", "CloseSession"] {
        for body in &bodies {
            let req = connect::call(procedure, body);
            let resp = req.send(d.addr);
            let err = connect::ConnectError::of(&resp);
            assert_eq!(
                resp.status,
                connect::http_status(&err.code),
                "{procedure} {body}: {resp}"
            );
            // 501 is `unimplemented` (sessions off, another protocol); every other 5xx
            // would be the daemon failing on input it should have refused.
            assert!(
                resp.status < 500 || err.code == "unimplemented",
                "{procedure} {body}: {resp}"
            );
        }
    }
}
