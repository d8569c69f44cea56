//! A session's saved calls checked offline, as `plimsoll verify` and `plimsoll attest` check a
//! state file (records.md §7-§9): the chain from call 1, answered and unanswered calls alike,
//! refusing a dropped, reordered or changed call, a state whose totals or session are not its
//! calls', and the same through a signed bundle.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use buffa::Message as _;
use plimsoll::attest;
use plimsoll::client::{ClientError, SessionAnswer, SessionState, verify_chain, verify_session};
use plimsoll::record::{self, Stamp};
use plimsoll::wire::{
    JavaScriptResult, JavaScriptRun, RunResponse, SessionRunRequest, SessionRunResponse,
    session_run_request,
};
use serde_json::Value;

/// A session of `n` calls under `session_id`, sealed as the daemon seals them; the calls
/// numbered in `unanswered` ended without an answer (the daemon chained a record for each,
/// as for a session that ended under the call).
fn chain(session_id: &str, n: u64, unanswered: &[u64]) -> (SessionState, Vec<SessionAnswer>) {
    let mut state = SessionState {
        session_id: session_id.to_owned(),
        fingerprint: record::session_fingerprint(session_id),
        provider: "docker".into(),
        isolation: "container".into(),
        ..SessionState::default()
    };
    let mut out = Vec::new();
    for seq in 1..=n {
        let request = SessionRunRequest {
            protocol: plimsoll::refusal::PROTOCOL,
            session_id: session_id.to_owned(),
            payload: Some(session_run_request::Payload::Javascript(Box::new(
                JavaScriptRun {
                    code: format!("console.log({seq})"),
                    ..Default::default()
                },
            ))),
            ..Default::default()
        };
        let stamp = Stamp {
            provider: state.provider.clone(),
            isolation: state.isolation.clone(),
            started_unix_ms: 1_790_000_000_000 + seq as i64,
            session: state.fingerprint.clone(),
            sequence: seq,
            previous_sha256: state.last_record_sha256.clone(),
            ..Default::default()
        };
        let digest = record::session_request_digest(&request);
        let answer = if unanswered.contains(&seq) {
            let rec = record::seal_unanswered(digest, "deadline_exceeded", stamp);
            SessionAnswer {
                request,
                response: SessionRunResponse::default(),
                unanswered: Some(rec),
            }
        } else {
            let mut run = RunResponse {
                sandbox: state.provider.clone(),
                isolation: state.isolation.clone(),
                result: Some(
                    JavaScriptResult {
                        stdout: format!("{seq}\n").into_bytes(),
                        ..Default::default()
                    }
                    .into(),
                ),
                ..Default::default()
            };
            run.record = record::seal(digest, record::result_digest(&run), stamp).into();
            SessionAnswer {
                request,
                response: SessionRunResponse {
                    run: run.into(),
                    ..Default::default()
                },
                unanswered: None,
            }
        };
        state.calls = seq;
        state.last_record_sha256 = answer.record().unwrap().record_sha256.clone();
        out.push(answer);
    }
    (state, out)
}

#[test]
fn session_chain_refuses_dropped_reordered_and_changed_calls() {
    let (state, answers) = chain("00112233445566778899aabbccddeeff", 3, &[]);
    let (calls, _) = verify_chain(state.opened(), &answers).expect("whole chain");
    assert_eq!(calls, 3);

    let mut reordered = answers.clone();
    reordered.swap(0, 1);
    assert!(matches!(
        verify_chain(state.opened(), &reordered),
        Err(ClientError::Chain(_))
    ));

    let dropped: Vec<_> = answers.iter().skip(1).cloned().collect();
    assert!(matches!(
        verify_chain(state.opened(), &dropped),
        Err(ClientError::Chain(_))
    ));

    let mut changed = answers.clone();
    if let Some(run) = changed[1].response.run.as_option_mut()
        && let Some(plimsoll::wire::run_response::Result::Javascript(j)) = &mut run.result
    {
        j.stdout[0] ^= 1;
    }
    assert!(matches!(
        verify_chain(state.opened(), &changed),
        Err(ClientError::RecordMismatch(_))
    ));
}

#[test]
fn an_unanswered_call_is_kept_in_the_chain_and_checked_against_the_open() {
    let (state, answers) = chain("0123456789abcdef0123456789abcdef", 3, &[2]);
    let (calls, last) = verify_session(&state, &answers).expect("a gap in answers, not in calls");
    assert_eq!((calls, last), (3, state.last_record_sha256.clone()));

    // Without the unanswered call the state's count and the chain both disagree.
    let kept: Vec<_> = answers
        .iter()
        .filter(|a| a.unanswered.is_none())
        .cloned()
        .collect();
    assert!(verify_session(&state, &kept).is_err());

    // Its record stands alone: it must name what the session opened as (answered records
    // are compared with their answers instead), and its request.
    let mut opened_elsewhere = state.clone();
    opened_elsewhere.isolation = "vm".into();
    let err = verify_session(&opened_elsewhere, &answers).unwrap_err();
    assert!(err.to_string().contains("the session opened as"), "{err}");
    let mut other_request = answers.clone();
    if let Some(session_run_request::Payload::Javascript(j)) = &mut other_request[1].request.payload
    {
        j.code = "console.log('something else')".into();
    }
    assert!(verify_session(&state, &other_request).is_err());
    // An unanswered call that also carries an answer is not one the client saved.
    let mut both = answers.clone();
    both[1].response = answers[0].response.clone();
    assert!(verify_session(&state, &both).is_err());

    // The state must be the calls' own: its session, its floor, its totals.
    let mut other_id = state.clone();
    other_id.session_id = "ffeeddccbbaa99887766554433221100".into();
    assert!(verify_session(&other_id, &answers).is_err());
    let mut refingerprinted = other_id.clone();
    refingerprinted.fingerprint = record::session_fingerprint(&other_id.session_id);
    assert!(
        verify_session(&refingerprinted, &answers).is_err(),
        "the calls were sent on another session"
    );
    let mut higher_floor = state.clone();
    higher_floor.floor = "vm".into();
    assert!(
        verify_session(&higher_floor, &answers).is_err(),
        "the calls were sent without the session's floor"
    );
    let mut more = state.clone();
    more.calls = 4;
    assert!(matches!(
        verify_session(&more, &answers),
        Err(ClientError::Chain(_))
    ));
}

fn keys() -> (attest::SigningKey, attest::VerifyingKey) {
    let (sk, pk) = attest::keygen().expect("keygen");
    (
        attest::signing_key(&sk).unwrap(),
        attest::verifying_key(&pk).unwrap(),
    )
}

#[test]
fn signed_bundle_refuses_dropped_reordered_and_changed_lines() {
    let (state, answers) = chain("ffeeddccbbaa99887766554433221100", 3, &[]);
    let (sk, pk) = keys();
    let bundle = attest::sign_session(&sk, &state, &answers).expect("sign");
    assert_eq!(
        attest::verify_bundle(&pk, &bundle)
            .expect("verifies whole")
            .0,
        3
    );

    let lines: Vec<&str> = bundle.lines().collect();
    let join = |ls: Vec<&str>| ls.join("\n");
    let dropped = join(vec![lines[0], lines[2], lines[3]]);
    assert!(
        attest::verify_bundle(&pk, &dropped).is_err(),
        "dropped call"
    );
    let reordered = join(vec![lines[1], lines[0], lines[2], lines[3]]);
    assert!(
        attest::verify_bundle(&pk, &reordered).is_err(),
        "reordered calls"
    );
    let last_dropped = join(vec![lines[0], lines[1], lines[3]]);
    assert!(
        attest::verify_bundle(&pk, &last_dropped).is_err(),
        "last call dropped"
    );

    // One changed byte anywhere in a line's evidence.
    let mut line: Value = serde_json::from_str(lines[1]).unwrap();
    let mut resp = STANDARD.decode(line["response"].as_str().unwrap()).unwrap();
    let at = resp.len() / 2;
    resp[at] ^= 1;
    line["response"] = Value::from(STANDARD.encode(resp));
    let changed_line = serde_json::to_string(&line).unwrap();
    let changed = join(vec![lines[0], &changed_line, lines[2], lines[3]]);
    assert!(
        attest::verify_bundle(&pk, &changed).is_err(),
        "changed byte"
    );

    let (_, other) = attest::keygen().unwrap();
    let other = attest::verifying_key(&other).unwrap();
    assert!(
        attest::verify_bundle(&other, &bundle).is_err(),
        "another key"
    );
}

#[test]
fn a_bundle_carries_an_unanswered_call_and_signs_only_a_whole_session() {
    let (state, answers) = chain("aabbccddeeff00112233445566778899", 3, &[3]);
    let (sk, pk) = keys();
    let bundle = attest::sign_session(&sk, &state, &answers).expect("sign");
    assert_eq!(
        attest::verify_bundle(&pk, &bundle).expect("verifies whole"),
        (3, state.last_record_sha256.clone())
    );

    // The unanswered record changed by one byte, or its call dropped: refused.
    let lines: Vec<&str> = bundle.lines().collect();
    let mut line: Value = serde_json::from_str(lines[2]).unwrap();
    let mut rec = STANDARD
        .decode(line["unanswered"].as_str().unwrap())
        .unwrap();
    let at = rec.len() / 2;
    rec[at] ^= 1;
    line["unanswered"] = Value::from(STANDARD.encode(rec));
    let changed = [lines[0], lines[1], &line.to_string(), lines[3]].join("\n");
    assert!(attest::verify_bundle(&pk, &changed).is_err(), "changed");
    let dropped = [lines[0], lines[1], lines[3]].join("\n");
    assert!(attest::verify_bundle(&pk, &dropped).is_err(), "dropped");

    // The session id, a capability, is not in the evidence handed to others.
    for raw in &lines[..3] {
        let line: Value = serde_json::from_str(raw).unwrap();
        let request = STANDARD.decode(line["request"].as_str().unwrap()).unwrap();
        let request = SessionRunRequest::decode_from_slice(&request).unwrap();
        assert!(request.session_id.is_empty(), "{raw}");
    }
    assert!(!bundle.contains(&state.session_id));

    // A state file whose last call is missing is not signed as a shorter session.
    assert!(attest::sign_session(&sk, &state, &answers[..2]).is_err());
}
