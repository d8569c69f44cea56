//! A `Run` answer verified as a client verifies it, for the suites of a daemon on a vendor's
//! simulator (included by path: the harness in `src/` does not link the `plimsoll` crate).

use plimsoll::record;
use plimsoll::wire::{RunRequest, RunResponse};
use plimsoll_tests::Daemon;
use plimsoll_tests::connect;
use plimsoll_tests::sim::send;
use serde_json::Value;

/// Runs `body`, expects an answer at tier `isolation`, and verifies its record as a client
/// does.
pub fn answered_at(d: &Daemon, body: &Value, isolation: &str) -> Value {
    let resp = send(d.addr, &connect::call("Run", body));
    assert_eq!(resp.status, 200, "{body}: {resp}");
    let v = resp.json();
    let req: RunRequest = serde_json::from_value(body.clone()).expect("request as wire");
    let answer: RunResponse = serde_json::from_value(v.clone()).expect("answer as wire");
    record::check_single(&record::request_digest(&req), None, &answer)
        .unwrap_or_else(|e| panic!("record does not verify ({e}): {v}"));
    assert_eq!(v["isolation"], isolation, "{v}");
    v
}
