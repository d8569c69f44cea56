//! The REST API: Idempotency-Key replay, delete under If-Match (which reports success for
//! a missing sandbox), network policies, and the endpoint credential (at most 300 s).

use std::time::Duration;

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use serde_json::{Value, json};

use crate::common::{Answer, Harness, IMAGE, send, start};

fn create_body(name: &str) -> Value {
    json!({
        "displayName": name,
        "imageRef": IMAGE,
        "platform": { "os": "linux", "architecture": "amd64" },
        "resources": { "cpus": 1, "memoryMib": 1024 },
        "startupExecution": { "rawImage": { "start": { "argv": ["tail", "-f", "/dev/null"] } } },
        "features": { "timeouts": { "timeout": "300s", "onTimeout": "delete", "autoResume": false } },
    })
}

async fn rest(
    h: &Harness,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: Option<Value>,
) -> Answer {
    let auth = format!("Bearer {}", h.bearer);
    let mut all = vec![
        ("authorization", auth.as_str()),
        ("content-type", "application/json"),
    ];
    all.extend_from_slice(headers);
    let body = body.map(|b| b.to_string().into_bytes()).unwrap_or_default();
    send(
        method,
        &format!("{}{path}", h.sim.ready.rest_url),
        &all,
        body,
    )
    .await
}

/// Creates through REST and waits until the sandbox runs; answers it.
async fn running(h: &Harness, name: &str) -> Value {
    let created = rest(
        h,
        "POST",
        "/v1/sandboxes",
        &[("idempotency-key", name)],
        Some(create_body(name)),
    )
    .await;
    assert_eq!(
        created.status,
        202,
        "{}",
        String::from_utf8_lossy(&created.body)
    );
    let uid = created.json()["uid"].as_str().unwrap().to_owned();
    for _ in 0..240 {
        let read = rest(h, "GET", &format!("/v1/sandboxes/{uid}"), &[], None)
            .await
            .json();
        if read["core"]["status"] == "running" {
            return read;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    panic!("{name} never ran");
}

/// The same key and payload replay the first create (same uid, no second sandbox); the
/// same key with another payload is 409 failedPrecondition; an inline network policy is
/// 409 while the account default governs; an unknown field is 400.
#[tokio::test]
async fn create_replays_its_idempotency_key() {
    let Some(h) = start(&[]).await else { return };
    let first = rest(
        &h,
        "POST",
        "/v1/sandboxes",
        &[("idempotency-key", "k-1")],
        Some(create_body("r-1")),
    )
    .await;
    assert_eq!(first.status, 202);
    let sandbox = first.json();
    assert_eq!(
        first.header("etag").as_deref(),
        sandbox["core"]["etag"].as_str()
    );
    assert_eq!(
        sandbox["name"],
        format!("sandboxes/{}", sandbox["uid"].as_str().unwrap())
    );
    let replay = rest(
        &h,
        "POST",
        "/v1/sandboxes",
        &[("idempotency-key", "k-1")],
        Some(create_body("r-1")),
    )
    .await;
    assert!(matches!(replay.status, 201 | 202));
    assert_eq!(replay.json()["uid"], sandbox["uid"]);
    let list = rest(&h, "GET", "/v1/sandboxes?pageSize=10", &[], None)
        .await
        .json();
    assert_eq!(list["sandboxes"].as_array().unwrap().len(), 1);
    let other = rest(
        &h,
        "POST",
        "/v1/sandboxes",
        &[("idempotency-key", "k-1")],
        Some(create_body("r-2")),
    )
    .await;
    assert_eq!(
        (other.status, other.json()["code"].clone()),
        (409, json!("failedPrecondition"))
    );
    let mut inline = create_body("r-3");
    inline["networkPolicies"] = json!([{ "mode": "denyAll" }]);
    let inline = rest(&h, "POST", "/v1/sandboxes", &[], Some(inline)).await;
    assert_eq!(
        (inline.status, inline.json()["code"].clone()),
        (409, json!("failedPrecondition"))
    );
    let mut unknown = create_body("r-4");
    unknown["resources"]["gpus"] = json!(1);
    let unknown = rest(&h, "POST", "/v1/sandboxes", &[], Some(unknown)).await;
    assert_eq!(
        (unknown.status, unknown.json()["code"].clone()),
        (400, json!("invalidArgument"))
    );
}

/// Delete needs If-Match (428 without, 412 with a stale etag and the current one in an
/// EtagMismatch detail), answers 202 `deleting`, and the sandbox is gone after; a delete
/// of a sandbox that does not exist answers 204 whatever the etag.
#[tokio::test]
async fn delete_needs_if_match_and_reports_success_for_missing_sandboxes() {
    let Some(h) = start(&[]).await else { return };
    let sandbox = running(&h, "rd-1").await;
    let uid = sandbox["uid"].as_str().unwrap();
    let etag = sandbox["core"]["etag"].as_str().unwrap();
    let path = format!("/v1/sandboxes/{uid}?force=true");
    let none = rest(&h, "DELETE", &path, &[], None).await;
    assert_eq!(
        (none.status, none.json()["code"].clone()),
        (428, json!("failedPrecondition"))
    );
    let stale = rest(&h, "DELETE", &path, &[("if-match", "\"stale\"")], None).await;
    assert_eq!(stale.status, 412);
    assert_eq!(stale.json()["details"][0]["currentEtag"], etag);
    let deleted = rest(&h, "DELETE", &path, &[("if-match", etag)], None).await;
    assert_eq!(deleted.status, 202);
    assert_eq!(deleted.json()["core"]["status"], "deleting");
    let mut gone = false;
    for _ in 0..120 {
        if rest(&h, "GET", &format!("/v1/sandboxes/{uid}"), &[], None)
            .await
            .status
            == 404
        {
            gone = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    assert!(gone);
    assert_eq!(h.containers(), 0);
    let missing = rest(
        &h,
        "DELETE",
        "/v1/sandboxes/no-such-sandbox?force=true",
        &[("if-match", "\"whatever\"")],
        None,
    )
    .await;
    assert_eq!(missing.status, 204);
}

/// A sandbox's network policies read deny-all with nothing allowed; after a per-sandbox
/// rule (the policy PUT) REST cannot show them (409).
#[tokio::test]
async fn network_policies_read_deny_all_until_a_rule_is_put() {
    let Some(h) = start(&[]).await else { return };
    let sandbox = running(&h, "rp-1").await;
    let uid = sandbox["uid"].as_str().unwrap();
    let policies = rest(
        &h,
        "GET",
        &format!("/v1/sandboxes/{uid}/network-policies"),
        &[],
        None,
    )
    .await
    .json();
    assert_eq!(policies["effective"], json!({ "mode": "denyAll" }));
    assert_eq!(policies["exact"]["selectorVersion"], "destination.v1");
    let auth = format!("Bearer {}", h.bearer);
    let put = send(
        "PUT",
        &format!("{}/sandboxes/{uid}/network-policy", h.sim.ready.policy_url),
        &[("authorization", &auth)],
        json!({ "mode": "deny-all", "allowNetworks": ["guard.example:443"] })
            .to_string()
            .into_bytes(),
    )
    .await;
    assert_eq!(put.status, 200);
    let after = rest(
        &h,
        "GET",
        &format!("/v1/sandboxes/{uid}/network-policies"),
        &[],
        None,
    )
    .await;
    assert_eq!(
        (after.status, after.json()["code"].clone()),
        (409, json!("failedPrecondition"))
    );
}

async fn mint(h: &Harness, uid: &str, permissions: &[&str], ttl: &str) -> Answer {
    rest(
        h,
        "POST",
        &format!("/v1/sandboxes/{uid}/endpoint-credentials"),
        &[],
        Some(json!({ "permissions": permissions, "ttl": ttl })),
    )
    .await
}

async fn endpoint_exec(endpoint: &str, token: &str, cmd: &[&str]) -> Answer {
    let auth = format!("Bearer {token}");
    send(
        "POST",
        &format!("{endpoint}/v1/processes/exec"),
        &[
            ("authorization", &auth),
            ("content-type", "application/json"),
        ],
        json!({ "cmd": cmd }).to_string().into_bytes(),
    )
    .await
}

/// The endpoint refuses the management token and takes a sandbox-scoped credential,
/// clamped to 300 s, for its own sandbox and permissions only; an expired credential
/// is 401 ENDPOINT_CREDENTIAL_EXPIRED, also for an exec it outlived.
#[tokio::test]
async fn the_endpoint_takes_only_a_scoped_credential_of_at_most_300_s() {
    let Some(h) = start(&[]).await else { return };
    let a = running(&h, "rc-1").await;
    let b = running(&h, "rc-2").await;
    let (uid, endpoint) = (
        a["uid"].as_str().unwrap(),
        a["core"]["endpoint"]["uri"].as_str().unwrap(),
    );
    assert_eq!(a["core"]["endpoint"]["authentication"]["maxTtl"], "300s");
    let refused = endpoint_exec(endpoint, &h.bearer, &["true"]).await;
    assert_eq!(
        (refused.status, refused.json()["message"].clone()),
        (401, json!("invalid endpoint credential"))
    );

    let minted = mint(
        &h,
        uid,
        &["sandboxesExec", "sandboxesFilesRead", "sandboxesFilesWrite"],
        "3600s",
    )
    .await;
    assert_eq!(minted.status, 200);
    assert_eq!(minted.header("cache-control").as_deref(), Some("no-store"));
    let credential = minted.json();
    let token = credential["token"].as_str().unwrap();
    assert_eq!(credential["sandbox"], format!("sandboxes/{uid}"));
    // Clamped: asked for an hour, it expires no later than one asked for 300 s after it.
    let five_minutes = mint(&h, uid, &["sandboxesExec"], "300s").await.json();
    let (asked_hour, asked_300) = (
        credential["expireTime"].as_str().unwrap(),
        five_minutes["expireTime"].as_str().unwrap(),
    );
    assert!(
        asked_hour.ends_with('Z') && asked_hour <= asked_300,
        "{asked_hour} vs {asked_300}"
    );
    let ran = endpoint_exec(endpoint, token, &["sh", "-c", "echo ok"]).await;
    assert_eq!(ran.status, 200);
    assert_eq!(
        STANDARD
            .decode(ran.json()["stdout"].as_str().unwrap())
            .unwrap(),
        b"ok\n"
    );
    let other = endpoint_exec(
        b["core"]["endpoint"]["uri"].as_str().unwrap(),
        token,
        &["true"],
    )
    .await;
    assert_eq!(other.status, 404);
    let read_only = mint(&h, uid, &["sandboxesFilesRead"], "60s").await.json();
    assert_eq!(
        endpoint_exec(endpoint, read_only["token"].as_str().unwrap(), &["true"])
            .await
            .status,
        403
    );

    let short = mint(&h, uid, &["sandboxesExec"], "2s").await.json();
    let cut = endpoint_exec(endpoint, short["token"].as_str().unwrap(), &["sleep", "10"]).await;
    assert_eq!(cut.status, 401);
    assert_eq!(
        cut.json()["details"][0]["reason"],
        "ENDPOINT_CREDENTIAL_EXPIRED"
    );
    let late = endpoint_exec(endpoint, short["token"].as_str().unwrap(), &["true"]).await;
    assert_eq!(
        late.json()["details"][0]["reason"],
        "ENDPOINT_CREDENTIAL_EXPIRED"
    );
}

/// REST upload (multipart form-data; parents created) and download (multipart/mixed,
/// an `error` part for a missing path, the closing delimiter last).
#[tokio::test]
async fn rest_files_go_up_and_come_down_as_multipart() {
    let Some(h) = start(&[]).await else { return };
    let sandbox = running(&h, "rf-1").await;
    let (uid, endpoint) = (
        sandbox["uid"].as_str().unwrap(),
        sandbox["core"]["endpoint"]["uri"].as_str().unwrap(),
    );
    let token = mint(
        &h,
        uid,
        &["sandboxesFilesRead", "sandboxesFilesWrite"],
        "300s",
    )
    .await
    .json()["token"]
        .as_str()
        .unwrap()
        .to_owned();
    let auth = format!("Bearer {token}");
    let mut body = Vec::new();
    body.extend_from_slice(b"--XyZ\r\nContent-Disposition: form-data; name=\"metadata\"\r\nContent-Type: application/json\r\n\r\n");
    body.extend_from_slice(br#"{"path":"/tmp/deep/er/f.txt","mode":384}"#);
    body.extend_from_slice(b"\r\n--XyZ\r\nContent-Disposition: form-data; name=\"content\"\r\nContent-Type: application/octet-stream\r\n\r\n");
    body.extend_from_slice(b"line\r\nbytes");
    body.extend_from_slice(b"\r\n--XyZ--\r\n");
    let up = send(
        "POST",
        &format!("{endpoint}/v1/files/upload"),
        &[
            ("authorization", &auth),
            ("content-type", "multipart/form-data; boundary=XyZ"),
        ],
        body,
    )
    .await;
    assert_eq!(up.status, 200, "{}", String::from_utf8_lossy(&up.body));
    assert_eq!(up.json(), json!({ "filesWritten": 1 }));
    let down = send(
        "GET",
        &format!("{endpoint}/v1/files/download?paths=%2Ftmp%2Fdeep%2Fer%2Ff.txt&paths=%2Fnope"),
        &[("authorization", &auth)],
        Vec::new(),
    )
    .await;
    assert_eq!(down.status, 200);
    let content_type = down.header("content-type").unwrap();
    let boundary = content_type.split("boundary=").nth(1).unwrap();
    let text = String::from_utf8_lossy(&down.body).to_string();
    let parts: Vec<&str> = text.split(&format!("--{boundary}")).collect();
    assert!(parts[1].contains("name=metadata") && parts[1].contains(r#""mode":384"#));
    assert!(parts[2].contains("name=content") && parts[2].ends_with("\r\n\r\nline\r\nbytes\r\n"));
    assert!(parts[3].contains("name=error") && parts[3].contains("notFound"));
    assert_eq!(parts[4], "--\r\n", "the closing delimiter ends the answer");
}
