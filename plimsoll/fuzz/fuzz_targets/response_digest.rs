//! Arbitrary bytes as a proto3 JSON `RunResponse`, the way a client decodes an answer: the
//! result digest, and, when the answer carries a record, the record's own digest and every
//! client-side check of `records.md` §8.
//!
//! Beyond "nothing panics", the daemon-to-client path must hold for any response: settle it
//! (`canonicalize_response`), seal a record that states the response's own evidence, send it
//! as JSON, and the client's `check_single` on what it decodes must accept it.
#![no_main]

use std::time::Duration;

use libfuzzer_sys::fuzz_target;
use plimsoll::record::{self, Stamp};
use plimsoll::wire::{RunResponse, SoftwareRule};
use plimsoll_fuzz::assert_digest;

/// The request digest the sealed record states; any well-formed digest will do.
const REQUEST_SHA256: &str = "5c5ab2f9a2c9b6e2f2b1a0a4fb0de4c5a7d38e7e6f1d8a4b0c3e2d1f0a9b8c7d";

fuzz_target!(|data: &[u8]| {
    let Ok(resp) = serde_json::from_slice::<RunResponse>(data) else {
        return;
    };
    assert_digest(&record::result_digest(&resp));

    if let Some(rec) = resp.record.as_option() {
        assert_digest(&record::record_digest(rec));
        // The record's own request digest, so the checks get past that step.
        let req = rec.request_sha256.as_str();
        let exact = SoftwareRule {
            mode: "exact".into(),
            identities: vec![rec.software_identity.clone()],
            ..Default::default()
        };
        for rule in [None, Some(&exact)] {
            if let Err(e) = record::check(req, rule, &resp) {
                let _ = e.to_string();
            }
            if let Err(e) = record::check_single(req, rule, &resp) {
                let _ = e.to_string();
            }
            if let Err(e) = record::check_unanswered(req, rule, rec) {
                let _ = e.to_string();
            }
        }
        let last = rec.sequence.wrapping_sub(1);
        if let Err(e) = record::check_chain(rec, &rec.session, last, &rec.previous_sha256) {
            let _ = e.to_string();
        }
    }

    seal_and_check(resp);
});

/// The daemon's side, then the client's: a record sealed over the settled response checks,
/// before and after a JSON round trip.
fn seal_and_check(mut sent: RunResponse) {
    if !record::valid_instance(&sent.instance) {
        return;
    }
    record::canonicalize_response(&mut sent);
    let settled = record::result_digest(&sent);
    record::canonicalize_response(&mut sent);
    assert_eq!(
        record::result_digest(&sent),
        settled,
        "canonicalize_response is not idempotent"
    );

    let started_unix_ms = sent.record.as_option().map_or(0, |r| r.started_unix_ms);
    let stamp = Stamp {
        provider: sent.sandbox.clone(),
        isolation: sent.isolation.clone(),
        environment: sent.environment.clone(),
        software_identity: sent.software_identity.clone(),
        instance: sent.instance.clone(),
        started_unix_ms,
        elapsed: Duration::from_millis(sent.duration_ms.unsigned_abs()),
        ..Default::default()
    };
    sent.record = record::seal(REQUEST_SHA256.into(), settled, stamp).into();
    if let Err(e) = record::check_single(REQUEST_SHA256, None, &sent) {
        panic!("a freshly sealed record fails the client's check: {e}");
    }

    let json = serde_json::to_vec(&sent).expect("a RunResponse serializes to JSON");
    let received = serde_json::from_slice::<RunResponse>(&json)
        .expect("the JSON the library writes decodes again");
    if let Err(e) = record::check_single(REQUEST_SHA256, None, &received) {
        panic!("a sealed record fails the client's check after JSON: {e}");
    }
}
