//! Paid allowances on dockercloud, the other metered provider: the same admission path as
//! e2b (config.md §3.1, wire.md §6.1 step 8). A caller over its own `paid_seconds_per_day`
//! is refused `resource_exhausted` + `capacity` with no sandbox made, counted `paid_caller`,
//! while a caller without an allowance of its own runs.

use plimsoll_tests::connect::{self, ConnectError, Reason};
use plimsoll_tests::dockercloud::{DockerCloudSim, dockercloud_ready};
use plimsoll_tests::http1::Request;
use plimsoll_tests::{ClientsFile, fresh_token};
use serde_json::json;
use sha2::{Digest, Sha256};

use super::{field, send, snippet};

#[test]
fn a_caller_over_its_own_paid_allowance_is_refused_while_another_runs() {
    if !dockercloud_ready() {
        return;
    }
    let (a, b) = (fresh_token(), fresh_token());
    let entry = |id: &str, token: &str| json!({ "id": id, "token_sha256": hex::encode(Sha256::digest(token.as_bytes())), "scopes": ["code:run"] });
    let mut capped = entry("a", &a);
    capped["paid_seconds_per_day"] = json!(60);
    let file = ClientsFile::raw(&json!({ "clients": [capped, entry("b", &b)] }).to_string());
    let path = file.path_str();
    let cloud = DockerCloudSim::start();
    let d = cloud.daemon(&[
        ("PLIMSOLL_CLIENTS_FILE", path.as_str()),
        ("PLIMSOLL_METRICS_ADDR", "127.0.0.1:0"),
    ]);
    let before = cloud.names();
    // 30 s + the 33 s teardown bound is over a's 60.
    let body = snippet("console.log('must not run')", 30_000);
    let resp = send(d.addr, &connect::call_as(&a, "Run", &body));
    assert_ne!(resp.status, 200, "{resp}");
    let err = ConnectError::of(&resp);
    assert_eq!(err.code, "resource_exhausted", "{err:?}");
    assert_eq!(
        err.not_dispatched(),
        Some(Reason::Capacity.detail_bytes()),
        "{err:?}"
    );
    assert!(err.message.contains("paid_seconds_per_day=60"), "{err:?}");
    assert_eq!(cloud.names(), before, "a refused run made a sandbox");
    let metrics = Request::get("/metrics").send(d.metrics_addr.expect("metrics on"));
    assert!(
        metrics
            .text()
            .contains("plimsoll_shed_total{reason=\"paid_caller\"} 1\n"),
        "{metrics}"
    );
    // b has no allowance of its own (and the daemon's is unset): its 30 s run runs.
    let body = snippet("console.log('b ran')", 30_000);
    let resp = send(d.addr, &connect::call_as(&b, "Run", &body));
    assert_eq!(resp.status, 200, "{resp}");
    assert_eq!(field(&resp.json()["javascript"], "stdout"), "b ran\n");
}
