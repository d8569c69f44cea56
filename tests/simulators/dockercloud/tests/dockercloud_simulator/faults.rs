//! Faults on demand: each makes the simulated service misbehave the way a provider must
//! notice, and the test shows the misbehaviour on the wire.

use std::time::Duration;

use dockercloud_simulator::{Faults, StuckOperation};
use serde_json::json;

use crate::common::{create_request, send, start};

/// The seal faults: a policy that is not deny-all, an extra allowed network, a booted
/// digest that differs from the image's.
#[tokio::test]
async fn seal_faults_show_in_the_read_backs() {
    let Some(h) = start(&[]).await else { return };
    let sandbox = h.running("s-1").await;
    let id = sandbox["core"]["id"].as_str().unwrap();
    let read = || {
        h.ok(
            "/docker.sbx.v1.NetworkPolicyService/GetEffectiveNetworkPolicy",
            json!({ "target": { "sandbox": { "id": id } } }),
        )
    };
    h.fault(Faults {
        policy_not_deny_all: true,
        ..Faults::default()
    })
    .await;
    assert_eq!(
        read().await,
        json!({ "mode": "NETWORK_POLICY_MODE_ALLOW_ALL" })
    );
    h.fault(Faults {
        extra_allowed_network: Some("exfil.example:443".into()),
        ..Faults::default()
    })
    .await;
    assert_eq!(
        read().await,
        json!({ "mode": "NETWORK_POLICY_MODE_DENY_ALL", "allowNetworks": [{ "network": "exfil.example:443", "layer": "POLICY_LAYER_OWNER" }] })
    );
    let other = format!("sha256:{}", "ab".repeat(32));
    h.fault(Faults {
        booted_digest: Some(other.clone()),
        ..Faults::default()
    })
    .await;
    let booted = h.running("s-2").await;
    assert_eq!(booted["cloud"]["imageDigest"], other);
    assert_ne!(other, h.sim.ready.images[0].digest);
}

/// The quota fault refuses every create as the account quota does.
#[tokio::test]
async fn quota_fault_refuses_creates() {
    let Some(h) = start(&[]).await else { return };
    h.fault(Faults {
        quota_reached: true,
        ..Faults::default()
    })
    .await;
    let answer = h
        .call(
            "/docker.sbx.v1.SandboxService/CreateSandbox",
            create_request("qf-1"),
        )
        .await;
    assert_eq!(answer.status, 429);
    assert_eq!(
        answer.json()["message"],
        "Maximum running sandboxes quota reached"
    );
    assert_eq!(h.containers(), 0);
}

/// A create that never completes: WaitOperation answers it not done, the sandbox stays
/// CREATING; it can still be deleted. A delete that never completes leaves the sandbox
/// STOPPING.
#[tokio::test]
async fn operations_that_never_complete() {
    let Some(h) = start(&[]).await else { return };
    h.fault(Faults {
        never_complete: vec![StuckOperation::Create],
        ..Faults::default()
    })
    .await;
    let op = h
        .ok(
            "/docker.sbx.v1.SandboxService/CreateSandbox",
            create_request("n-1"),
        )
        .await;
    let waited = h
        .ok(
            "/docker.sbx.v1.OperationService/WaitOperation",
            json!({ "id": op["id"], "timeout": "2s" }),
        )
        .await;
    assert_ne!(waited["done"], true);
    tokio::time::sleep(Duration::from_secs(2)).await;
    let polled = h
        .ok(
            "/docker.sbx.v1.OperationService/GetOperation",
            json!({ "id": op["id"] }),
        )
        .await;
    assert_ne!(polled["done"], true);
    let stuck = h
        .ok(
            "/docker.sbx.v1.SandboxService/GetSandbox",
            json!({ "sandbox": { "name": "n-1" } }),
        )
        .await;
    assert_eq!(stuck["core"]["status"], "SANDBOX_STATUS_CREATING");
    assert!(stuck["core"].get("endpoint").is_none());
    let deleted = h
        .wait_done(
            h.ok(
                "/docker.sbx.v1.SandboxService/DeleteSandbox",
                json!({ "sandbox": { "name": "n-1" }, "force": true }),
            )
            .await,
        )
        .await;
    assert!(deleted.get("error").is_none());

    h.fault(Faults::default()).await;
    h.running("n-2").await;
    h.fault(Faults {
        never_complete: vec![StuckOperation::Delete],
        ..Faults::default()
    })
    .await;
    let op = h
        .ok(
            "/docker.sbx.v1.SandboxService/DeleteSandbox",
            json!({ "sandbox": { "name": "n-2" }, "force": true }),
        )
        .await;
    let waited = h
        .ok(
            "/docker.sbx.v1.OperationService/WaitOperation",
            json!({ "id": op["id"], "timeout": "1s" }),
        )
        .await;
    assert_ne!(waited["done"], true);
    let lingering = h
        .ok(
            "/docker.sbx.v1.SandboxService/GetSandbox",
            json!({ "sandbox": { "name": "n-2" } }),
        )
        .await;
    assert_eq!(lingering["core"]["status"], "SANDBOX_STATUS_STOPPING");
}

/// WaitOperation unimplemented: clients fall back to GetOperation polling.
#[tokio::test]
async fn wait_operation_can_be_unimplemented() {
    let Some(h) = start(&[]).await else { return };
    h.fault(Faults {
        wait_operation_unimplemented: true,
        ..Faults::default()
    })
    .await;
    let op = h
        .ok(
            "/docker.sbx.v1.SandboxService/CreateSandbox",
            create_request("w-1"),
        )
        .await;
    let waited = h
        .call(
            "/docker.sbx.v1.OperationService/WaitOperation",
            json!({ "id": op["id"] }),
        )
        .await;
    assert_eq!(
        (waited.status, waited.json()["code"].clone()),
        (501, json!("unimplemented"))
    );
    let done = h.wait_done(op).await;
    assert_eq!(done["response"]["core"]["status"], "SANDBOX_STATUS_RUNNING");
}

/// A REST delete that reports success while the sandbox stays running.
#[tokio::test]
async fn rest_delete_can_report_success_and_keep_the_sandbox() {
    let Some(h) = start(&[]).await else { return };
    let sandbox = h.running("rk-1").await;
    let id = sandbox["core"]["id"].as_str().unwrap();
    h.fault(Faults {
        rest_delete_keeps_sandbox: true,
        ..Faults::default()
    })
    .await;
    let auth = format!("Bearer {}", h.bearer);
    let url = format!("{}/v1/sandboxes/{id}", h.sim.ready.rest_url);
    let read = send("GET", &url, &[("authorization", &auth)], Vec::new()).await;
    let etag = read.header("etag").unwrap();
    let deleted = send(
        "DELETE",
        &format!("{url}?force=true"),
        &[("authorization", &auth), ("if-match", &etag)],
        Vec::new(),
    )
    .await;
    assert_eq!(deleted.status, 202);
    assert_eq!(deleted.json()["core"]["status"], "deleting");
    tokio::time::sleep(Duration::from_secs(2)).await;
    let still = send("GET", &url, &[("authorization", &auth)], Vec::new()).await;
    assert_eq!(still.status, 200);
    assert_eq!(still.json()["core"]["status"], "running");
    assert_eq!(h.containers(), 1);
}

/// Missing permissions leave GetCapabilities' list; an unknown fault is refused.
#[tokio::test]
async fn capabilities_can_miss_a_permission_and_unknown_faults_are_refused() {
    let Some(h) = start(&[]).await else { return };
    h.fault(Faults {
        missing_permissions: vec!["PERMISSION_SANDBOXES_DELETE".into()],
        ..Faults::default()
    })
    .await;
    let caps = h
        .ok(
            "/docker.sbx.v1.CapabilityService/GetCapabilities",
            json!({}),
        )
        .await;
    assert!(
        !caps["permissions"]
            .as_array()
            .unwrap()
            .contains(&json!("PERMISSION_SANDBOXES_DELETE"))
    );
    let refused = send(
        "PUT",
        &format!("{}/faults", h.sim.ready.admin_url),
        &[("content-type", "application/json")],
        br#"{"quota_reachd": true}"#.to_vec(),
    )
    .await;
    assert_eq!(refused.status, 400);
}
