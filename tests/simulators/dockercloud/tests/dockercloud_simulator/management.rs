//! The Connect management API: capabilities, create as an operation, read, list, the
//! create refusals, the quota, delete, and the timeout that deletes.

use std::time::Duration;

use serde_json::json;

use crate::common::{IMAGE, create_request, start};

/// Capabilities list the permissions a Cloud Sandboxes token shows (EXEC and FILES
/// not among them) and the CPU and memory ranges (memory as protojson uint64 strings).
#[tokio::test]
async fn capabilities_report_permissions_and_resource_ranges() {
    let Some(h) = start(&["--cpu-max", "2", "--memory-mib-max", "4096"]).await else {
        return;
    };
    let caps = h
        .ok(
            "/docker.sbx.v1.CapabilityService/GetCapabilities",
            json!({}),
        )
        .await;
    let permissions: Vec<&str> = caps["permissions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p.as_str().unwrap())
        .collect();
    for needed in [
        "PERMISSION_SANDBOXES_READ",
        "PERMISSION_SANDBOXES_CREATE",
        "PERMISSION_SANDBOXES_DELETE",
        "PERMISSION_NETWORK_POLICIES_READ",
    ] {
        assert!(
            permissions.contains(&needed),
            "{needed} missing from {permissions:?}"
        );
    }
    assert!(
        !permissions
            .iter()
            .any(|p| p.contains("EXEC") || p.contains("FILES"))
    );
    assert_eq!(
        caps["resources"],
        json!({ "cpuMin": 1, "cpuMax": 2, "memoryMibMin": "512", "memoryMibMax": "4096" })
    );
}

/// A create answers an operation that is not done; the same requestId answers the same
/// operation; once done its response is the running sandbox (endpoint, size, booted
/// digest), which Get (by id or name) and List show too.
#[tokio::test]
async fn create_is_an_operation_that_completes_when_the_sandbox_runs() {
    let Some(h) = start(&[]).await else { return };
    let op = h
        .ok(
            "/docker.sbx.v1.SandboxService/CreateSandbox",
            create_request("plimsoll-a-1"),
        )
        .await;
    assert!(op["id"].as_str().unwrap().starts_with("operations/"));
    assert_ne!(op["done"], true, "a create completes asynchronously: {op}");
    let again = h
        .ok(
            "/docker.sbx.v1.SandboxService/CreateSandbox",
            create_request("plimsoll-a-1"),
        )
        .await;
    assert_eq!(again["id"], op["id"], "the requestId replays the create");
    let done = h.wait_done(op).await;
    let response = &done["response"];
    assert_eq!(
        response["@type"],
        "type.googleapis.com/docker.sbx.v1.Sandbox"
    );
    assert_eq!(response["core"]["status"], "SANDBOX_STATUS_RUNNING");
    assert_eq!(
        response["core"]["endpoint"]["protocol"],
        "SANDBOX_ENDPOINT_PROTOCOL_CONNECT"
    );
    assert!(
        response["core"]["endpoint"]["uri"]
            .as_str()
            .unwrap()
            .starts_with("http://127.0.0.1:")
    );
    assert_eq!(
        response["core"]["resources"],
        json!({ "cpus": 1, "memoryMib": "1024" })
    );
    assert_eq!(
        response["cloud"]["imageDigest"],
        h.sim.ready.images[0].digest
    );
    assert_eq!(response["cloud"]["onTimeout"], "ON_TIMEOUT_DELETE");
    let id = response["core"]["id"].as_str().unwrap();
    let by_id = h
        .ok(
            "/docker.sbx.v1.SandboxService/GetSandbox",
            json!({ "sandbox": { "id": id } }),
        )
        .await;
    let by_name = h
        .ok(
            "/docker.sbx.v1.SandboxService/GetSandbox",
            json!({ "sandbox": { "name": "plimsoll-a-1" } }),
        )
        .await;
    assert_eq!(by_id, by_name);
    assert_eq!(by_id["core"]["name"], "plimsoll-a-1");

    h.running("plimsoll-a-2").await;
    let first = h
        .ok(
            "/docker.sbx.v1.SandboxService/ListSandboxes",
            json!({ "pageSize": 1 }),
        )
        .await;
    assert_eq!(first["sandboxes"].as_array().unwrap().len(), 1);
    let token = first["nextPageToken"].as_str().expect("a second page");
    let second = h
        .ok(
            "/docker.sbx.v1.SandboxService/ListSandboxes",
            json!({ "pageSize": 1, "pageToken": token }),
        )
        .await;
    assert_eq!(second["sandboxes"].as_array().unwrap().len(), 1);
    assert!(second.get("nextPageToken").is_none());
    let names = [&first, &second].map(|page| {
        page["sandboxes"][0]["core"]["name"]
            .as_str()
            .unwrap()
            .to_owned()
    });
    assert_eq!(
        names,
        ["plimsoll-a-1".to_owned(), "plimsoll-a-2".to_owned()]
    );
}

/// An inline network policy fails the create with `internal` (as the live service does);
/// a raw image without cpus, a size outside the ranges or a taken name are refused; an
/// image the service cannot pull fails the operation and the sandbox.
#[tokio::test]
async fn creates_are_refused_as_the_service_refuses_them() {
    let Some(h) = start(&[]).await else { return };
    let create = "/docker.sbx.v1.SandboxService/CreateSandbox";
    let mut inline = create_request("p-inline");
    inline["networkPolicies"] = json!([{ "mode": "NETWORK_POLICY_MODE_DENY_ALL" }]);
    let answer = h.call(create, inline).await;
    assert_eq!(
        (answer.status, answer.json()["code"].clone()),
        (500, json!("internal"))
    );

    let mut no_cpus = create_request("p-nocpu");
    no_cpus["resources"] = json!({ "memoryMib": "1024" });
    let answer = h.call(create, no_cpus).await;
    assert_eq!(answer.status, 400);
    assert_eq!(
        answer.json()["message"],
        "'cpus' is required when using 'imageRef'"
    );

    let mut too_big = create_request("p-big");
    too_big["resources"] = json!({ "cpus": 64, "memoryMib": "1024" });
    assert_eq!(
        h.call(create, too_big).await.json()["code"],
        "invalid_argument"
    );

    let mut unknown = create_request("p-unknown-image");
    unknown["cloud"]["imageRef"] = json!(format!("{IMAGE}@sha256:{}", "0".repeat(64)));
    let op = h.ok(create, unknown).await;
    let done = h.wait_done(op).await;
    assert_eq!(done["error"]["code"], 5, "NOT_FOUND: {done}");
    let failed = h
        .ok(
            "/docker.sbx.v1.SandboxService/GetSandbox",
            json!({ "sandbox": { "name": "p-unknown-image" } }),
        )
        .await;
    assert_eq!(failed["core"]["status"], "SANDBOX_STATUS_FAILED");

    h.running("p-taken").await;
    let mut taken = create_request("p-taken");
    taken["requestId"] = json!("another-request");
    assert_eq!(h.call(create, taken).await.json()["code"], "already_exists");

    // Pinned by the digest the service reports, the image is found.
    let mut pinned = create_request("p-pinned");
    pinned["cloud"]["imageRef"] = json!(format!("{IMAGE}@{}", h.sim.ready.images[0].digest));
    let done = h.wait_done(h.ok(create, pinned).await).await;
    assert_eq!(
        done["response"]["cloud"]["imageDigest"],
        h.sim.ready.images[0].digest
    );
}

/// At the account's maximum, a create is `resource_exhausted` with the service's words;
/// a delete frees the slot.
#[tokio::test]
async fn quota_is_resource_exhausted_at_the_accounts_maximum() {
    let Some(h) = start(&["--max-running", "1"]).await else {
        return;
    };
    let first = h.running("q-1").await;
    let answer = h
        .call(
            "/docker.sbx.v1.SandboxService/CreateSandbox",
            create_request("q-2"),
        )
        .await;
    assert_eq!(answer.status, 429);
    assert_eq!(
        answer.json(),
        json!({ "code": "resource_exhausted", "message": "Maximum running sandboxes quota reached" })
    );
    let id = first["core"]["id"].as_str().unwrap();
    let op = h
        .ok(
            "/docker.sbx.v1.SandboxService/DeleteSandbox",
            json!({ "sandbox": { "id": id }, "force": true, "requestId": "d-1" }),
        )
        .await;
    h.wait_done(op).await;
    h.running("q-2").await;
}

/// Delete is an operation; once done the sandbox is NOT_FOUND and its container gone;
/// deleting it again is NOT_FOUND.
#[tokio::test]
async fn delete_is_an_operation_and_then_the_sandbox_is_gone() {
    let Some(h) = start(&[]).await else { return };
    let sandbox = h.running("d-1").await;
    assert_eq!(h.containers(), 1);
    let reference = json!({ "sandbox": { "id": sandbox["core"]["id"] }, "force": true, "requestId": "del-d-1" });
    let op = h
        .ok(
            "/docker.sbx.v1.SandboxService/DeleteSandbox",
            reference.clone(),
        )
        .await;
    let done = h.wait_done(op).await;
    assert!(done.get("error").is_none(), "{done}");
    let gone = h
        .call(
            "/docker.sbx.v1.SandboxService/GetSandbox",
            json!({ "sandbox": { "name": "d-1" } }),
        )
        .await;
    assert_eq!(
        (gone.status, gone.json()["code"].clone()),
        (404, json!("not_found"))
    );
    assert_eq!(h.containers(), 0);
    let again = h
        .call("/docker.sbx.v1.SandboxService/DeleteSandbox", reference)
        .await;
    assert_eq!(again.json()["code"], "not_found");
}

/// `ON_TIMEOUT_DELETE` really deletes when the timeout expires: the sandbox and its
/// container are gone.
#[tokio::test]
async fn timeout_with_on_timeout_delete_really_deletes() {
    let Some(h) = start(&[]).await else { return };
    let mut request = create_request("t-1");
    request["cloud"]["timeout"] = json!("3s");
    let done = h
        .wait_done(
            h.ok("/docker.sbx.v1.SandboxService/CreateSandbox", request)
                .await,
        )
        .await;
    assert!(done["response"]["cloud"]["expiresAt"].is_string(), "{done}");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let answer = h
            .call(
                "/docker.sbx.v1.SandboxService/GetSandbox",
                json!({ "sandbox": { "name": "t-1" } }),
            )
            .await;
        if answer.status == 404 {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "still there: {}",
            String::from_utf8_lossy(&answer.body)
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(h.containers(), 0);
}
