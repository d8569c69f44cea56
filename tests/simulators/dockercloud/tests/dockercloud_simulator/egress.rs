//! Network policy and egress: deny-all by default with no network at all; the policy
//! PUT opens `<guard-host>:443` only, through the forwarder, and read-back shows it.

use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::common::{send, start};

const GUARD_HOST: &str = "guard.plimsoll.test";

/// A stand-in guard on loopback: answers every request with "guard says hi".
async fn guard() -> std::net::SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut buf = vec![0u8; 16 * 1024];
                let _ = stream.read(&mut buf).await;
                let _ = stream
                    .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 13\r\nconnection: close\r\n\r\nguard says hi")
                    .await;
            });
        }
    });
    addr
}

/// What a fetch from inside the sandbox gets: the body, or the error code.
const FETCH: &str = "fetch(process.argv[1]).then(r => r.text()).then(t => console.log('body:' + t), e => console.log('error:' + (e.cause && e.cause.code)))";

async fn policy_put(
    h: &crate::common::Harness,
    id: &str,
    allow: Value,
    bearer: &str,
) -> crate::common::Answer {
    let auth = format!("Bearer {bearer}");
    send(
        "PUT",
        &format!("{}/sandboxes/{id}/network-policy", h.sim.ready.policy_url),
        &[
            ("content-type", "application/json"),
            ("authorization", &auth),
        ],
        json!({ "mode": "deny-all", "allowNetworks": allow })
            .to_string()
            .into_bytes(),
    )
    .await
}

/// A sandbox reads back deny-all with nothing allowed and cannot reach the guard; the
/// PUT answers its echo, read-back shows exactly `<guard>:443` (layer ATTACHED), and the
/// guard (and only it) answers; a PUT with nothing allowed closes it again.
#[tokio::test]
async fn the_policy_put_opens_the_guard_and_nothing_else() {
    let target = guard().await;
    let target_text = target.to_string();
    let Some(h) = start(&["--guard-host", GUARD_HOST, "--guard-target", &target_text]).await else {
        return;
    };
    let sandbox = h.running("g-1").await;
    let id = sandbox["core"]["id"].as_str().unwrap().to_owned();
    let read_back = || {
        h.ok(
            "/docker.sbx.v1.NetworkPolicyService/GetEffectiveNetworkPolicy",
            json!({ "target": { "sandbox": { "id": id } } }),
        )
    };
    assert_eq!(
        read_back().await,
        json!({ "mode": "NETWORK_POLICY_MODE_DENY_ALL" })
    );
    let url = format!("http://{GUARD_HOST}:443/v1/dockercloud/guard");
    let (_, before, _) = h.exec(&sandbox, &["node", "-e", FETCH, &url]).await;
    assert!(before.starts_with("error:"), "{before}");

    let put = policy_put(&h, &id, json!([format!("{GUARD_HOST}:443")]), &h.bearer).await;
    assert_eq!(put.status, 200);
    assert_eq!(
        put.json(),
        json!({ "mode": "deny-all", "allowNetworks": [format!("{GUARD_HOST}:443")] })
    );
    assert_eq!(
        read_back().await,
        json!({ "mode": "NETWORK_POLICY_MODE_DENY_ALL", "allowNetworks": [{ "network": format!("{GUARD_HOST}:443"), "layer": "POLICY_LAYER_ATTACHED" }] })
    );
    let (_, after, _) = h.exec(&sandbox, &["node", "-e", FETCH, &url]).await;
    assert_eq!(after, "body:guard says hi\n");
    // The forwarder holds the port: guest code cannot take it over.
    let squat = "require('net').createServer().on('error', e => console.log(e.code)).listen(443, '127.0.0.1', () => { console.log('bound'); process.exit(0) })";
    let (_, squatted, _) = h.exec(&sandbox, &["node", "-e", squat]).await;
    assert_eq!(squatted, "EADDRINUSE\n");
    for elsewhere in [
        format!("http://{GUARD_HOST}:80/"),
        "http://localhost:8443/".to_owned(),
        "http://plimsoll.invalid/".to_owned(),
    ] {
        let (_, out, _) = h.exec(&sandbox, &["node", "-e", FETCH, &elsewhere]).await;
        assert!(out.starts_with("error:"), "{elsewhere}: {out}");
    }

    assert_eq!(policy_put(&h, &id, json!([]), &h.bearer).await.status, 200);
    assert_eq!(
        read_back().await,
        json!({ "mode": "NETWORK_POLICY_MODE_DENY_ALL" })
    );
    let (_, closed, _) = h.exec(&sandbox, &["node", "-e", FETCH, &url]).await;
    assert!(closed.starts_with("error:"), "{closed}");
}

/// The PUT needs the exchanged token, an existing sandbox and mode deny-all.
#[tokio::test]
async fn the_policy_put_refuses_what_it_cannot_apply() {
    let Some(h) = start(&[]).await else { return };
    let sandbox = h.running("g-2").await;
    let id = sandbox["core"]["id"].as_str().unwrap();
    assert_eq!(
        policy_put(&h, id, json!([]), &h.sim.ready.token)
            .await
            .status,
        401
    );
    assert_eq!(
        policy_put(&h, "no-such-sandbox", json!([]), &h.bearer)
            .await
            .status,
        404
    );
    let auth = format!("Bearer {}", h.bearer);
    let allow_all = send(
        "PUT",
        &format!("{}/sandboxes/{id}/network-policy", h.sim.ready.policy_url),
        &[
            ("content-type", "application/json"),
            ("authorization", &auth),
        ],
        json!({ "mode": "allow-all", "allowNetworks": [] })
            .to_string()
            .into_bytes(),
    )
    .await;
    assert_eq!(allow_all.status, 400);
}
