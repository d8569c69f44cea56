//! The token exchange and the bearer rules; the Connect framing rules.

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use serde_json::{Value, json};

use crate::common::{send, start};

/// The exchange answers `{access_token}`, a JWT whose `exp` is its lifetime after
/// `iat`; a wrong secret or account is 401, a body without both fields 400.
#[tokio::test]
async fn token_exchange_answers_a_jwt_with_exp_and_refuses_wrong_credentials() {
    let Some(h) = start(&["--access-token-ttl-secs", "600"]).await else {
        return;
    };
    let payload = h.bearer.split('.').nth(1).unwrap();
    let claims: Value = serde_json::from_slice(&URL_SAFE_NO_PAD.decode(payload).unwrap()).unwrap();
    assert_eq!(
        claims["exp"].as_u64().unwrap() - claims["iat"].as_u64().unwrap(),
        600
    );
    assert_eq!(claims["sub"], h.sim.ready.username);
    let ready = &h.sim.ready;
    for (identifier, secret) in [
        (ready.username.as_str(), "dckr_pat_wrong"),
        ("someone-else", ready.token.as_str()),
    ] {
        let body = json!({ "identifier": identifier, "secret": secret })
            .to_string()
            .into_bytes();
        let answer = send(
            "POST",
            &ready.auth_url,
            &[("content-type", "application/json")],
            body,
        )
        .await;
        assert_eq!(answer.status, 401);
        assert!(answer.json().get("access_token").is_none());
    }
    let body = json!({ "identifier": ready.username })
        .to_string()
        .into_bytes();
    assert_eq!(send("POST", &ready.auth_url, &[], body).await.status, 400);
}

/// The sandbox API takes only the exchanged token: none, the personal access token
/// itself, or a token with a changed signature are `unauthenticated` (401).
#[tokio::test]
async fn management_takes_only_the_exchanged_access_token() {
    let Some(h) = start(&[]).await else { return };
    let api = h.sim.ready.api_url.clone();
    let procedure = "/docker.sbx.v1.CapabilityService/GetCapabilities";
    let mut forged = h.bearer.clone();
    forged.push('x');
    for bearer in [h.sim.ready.token.as_str(), forged.as_str()] {
        let answer = h.call_as(&api, procedure, bearer, &json!({})).await;
        assert_eq!(answer.status, 401);
        assert_eq!(answer.json()["code"], "unauthenticated");
    }
    let anonymous = send(
        "POST",
        &format!("{api}{procedure}"),
        &[("content-type", "application/json")],
        b"{}".to_vec(),
    )
    .await;
    assert_eq!(anonymous.status, 401);
    assert_eq!(anonymous.json()["code"], "unauthenticated");
    assert_eq!(
        h.call_as(&api, procedure, &h.bearer, &json!({}))
            .await
            .status,
        200
    );
}

/// Connect JSON only: the binary codec is 415, a protocol version other than 1 is
/// `invalid_argument`, an unknown procedure is 404, a GET is 405.
#[tokio::test]
async fn connect_framing_is_json_only() {
    let Some(h) = start(&[]).await else { return };
    let url = format!(
        "{}/docker.sbx.v1.CapabilityService/GetCapabilities",
        h.sim.ready.api_url
    );
    let auth = format!("Bearer {}", h.bearer);
    let proto = send(
        "POST",
        &url,
        &[
            ("content-type", "application/proto"),
            ("authorization", &auth),
        ],
        Vec::new(),
    )
    .await;
    assert_eq!(proto.status, 415);
    let version = send(
        "POST",
        &url,
        &[
            ("content-type", "application/json"),
            ("connect-protocol-version", "2"),
            ("authorization", &auth),
        ],
        b"{}".to_vec(),
    )
    .await;
    assert_eq!(version.status, 400);
    assert_eq!(version.json()["code"], "invalid_argument");
    let unknown = h
        .call("/docker.sbx.v1.SandboxService/ResizeSandbox", json!({}))
        .await;
    assert_eq!(unknown.status, 404);
    assert_eq!(
        send("GET", &url, &[("authorization", &auth)], Vec::new())
            .await
            .status,
        405
    );
}
