//! A VM's egress, as E2B enforces it: none by default once denied, an `allowOut` host only
//! through the egress proxy, which presents the simulator's CA and adds the sandbox rule's
//! header so the guest never holds the token; network updates apply to new connections; the
//! `egressAllowed` fault opens everything (and the simulator answers example.com).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use common::{Sim, sid};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const GUARD: &str = "guard.sim.test";
const TOKEN: &str = "crg_0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

/// What the loopback "guard" received.
#[derive(Debug, Clone)]
struct Seen {
    path: String,
    headers: BTreeMap<String, String>,
    body: String,
}

/// A plain HTTP/1.1 server on loopback that records every request and answers 200.
async fn recorder() -> (u16, Arc<Mutex<Vec<Seen>>>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let log = Arc::clone(&seen);
    tokio::spawn(async move {
        loop {
            let (mut stream, _) = listener.accept().await.unwrap();
            let log = Arc::clone(&log);
            tokio::spawn(async move {
                let mut raw = Vec::new();
                let mut buf = [0u8; 4096];
                let head_end = loop {
                    let n = stream.read(&mut buf).await.unwrap_or(0);
                    if n == 0 {
                        return;
                    }
                    raw.extend_from_slice(&buf[..n]);
                    if let Some(i) = raw.windows(4).position(|w| w == b"\r\n\r\n") {
                        break i;
                    }
                };
                let head = String::from_utf8_lossy(&raw[..head_end]).into_owned();
                let mut lines = head.lines();
                let path = lines
                    .next()
                    .unwrap_or("")
                    .split(' ')
                    .nth(1)
                    .unwrap_or("")
                    .to_owned();
                let headers: BTreeMap<String, String> = lines
                    .filter_map(|l| l.split_once(':'))
                    .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_owned()))
                    .collect();
                let len: usize = headers
                    .get("content-length")
                    .and_then(|v| v.parse().ok())
                    .unwrap_or(0);
                let mut body = raw[head_end + 4..].to_vec();
                while body.len() < len {
                    let n = stream.read(&mut buf).await.unwrap_or(0);
                    if n == 0 {
                        break;
                    }
                    body.extend_from_slice(&buf[..n]);
                }
                log.lock().unwrap().push(Seen {
                    path,
                    headers,
                    body: String::from_utf8_lossy(&body).into_owned(),
                });
                let answer = b"{\"guard\":\"ok\"}";
                let reply = format!(
                    "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                    answer.len()
                );
                let _ = stream.write_all(reply.as_bytes()).await;
                let _ = stream.write_all(answer).await;
            });
        }
    });
    (port, seen)
}

/// Fetches each URL from inside the VM with node (4 s abort each, like the provider's smoke
/// probe); `status` or `ERR <code>` per URL.
async fn probe(sim: &Sim, sandbox: &Value, urls: &[&str]) -> Vec<String> {
    let script = format!(
        r#"for (const u of {urls}) {{
  try {{
    const r = await fetch(u, {{method: "POST", body: "{{\"method\":\"GET\",\"path\":\"/v1/x\"}}", signal: AbortSignal.timeout(4000)}});
    console.log(r.status + " " + (await r.text()).slice(0, 100));
  }} catch (e) {{ console.log("ERR " + (e.cause ? (e.cause.code || e.cause.message) : e.name)); }}
}}"#,
        urls = serde_json::to_string(urls).unwrap()
    );
    let boundary = "egressprobe";
    let body = format!(
        "--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"/tmp/probe.mjs\"\r\n\r\n{script}\r\n--{boundary}--\r\n"
    );
    let ct = format!("multipart/form-data; boundary={boundary}");
    let up = sim
        .envd(
            sandbox,
            "POST",
            "/files",
            &[("Content-Type", &ct)],
            body.into_bytes(),
        )
        .await;
    assert_eq!(up.status, 200);
    let run = sim
        .run(
            sandbox,
            "NODE_EXTRA_CA_CERTS=/etc/ssl/certs/ca-certificates.crt node /tmp/probe.mjs",
            &[],
        )
        .await;
    assert!(run.end().is_some(), "{:?}", run.frames);
    run.output("stdout").lines().map(str::to_owned).collect()
}

fn guarded(host: &str) -> Value {
    json!({
        "denyOut": ["0.0.0.0/0"],
        "allowOut": [host],
        "rules": {host: [{"transform": {"headers": {"X-Plimsoll-Guard": TOKEN}}}]}
    })
}

#[tokio::test]
async fn only_the_allowed_host_is_reached_with_the_rules_header_the_guest_never_sees() {
    let (port, seen) = recorder().await;
    let upstream = format!("{GUARD}=http://127.0.0.1:{port}");
    let other = format!("other.sim.test=http://127.0.0.1:{port}");
    let Some(sim) = Sim::start(&["--host", &upstream, "--host", &other]) else {
        return;
    };
    let urls = [
        "https://guard.sim.test/v1/e2b/guard",
        "https://other.sim.test/",
        "https://example.com/",
        "https://1.1.1.1/",
    ];

    let denied = sim
        .create(json!({"templateID": "base", "network": {"denyOut": ["0.0.0.0/0"]}}))
        .await;
    let results = probe(&sim, &denied, &urls).await;
    assert!(
        results.iter().all(|r| r.starts_with("ERR")),
        "deny-all: {results:?}"
    );
    assert!(
        seen.lock().unwrap().is_empty(),
        "nothing left a deny-all VM"
    );

    let guard = sim
        .create(json!({"templateID": "base", "network": guarded(GUARD)}))
        .await;
    let results = probe(&sim, &guard, &urls).await;
    assert_eq!(results[0], "200 {\"guard\":\"ok\"}", "{results:?}");
    assert!(
        results[1..].iter().all(|r| r.starts_with("ERR")),
        "{results:?}"
    );
    let requests = seen.lock().unwrap().clone();
    assert_eq!(requests.len(), 1, "{requests:?}");
    assert_eq!(requests[0].path, "/v1/e2b/guard");
    assert_eq!(requests[0].headers["x-plimsoll-guard"], TOKEN);
    assert_eq!(requests[0].headers["host"], GUARD);
    assert_eq!(requests[0].body, "{\"method\":\"GET\",\"path\":\"/v1/x\"}");

    // The token is in the sandbox's network rule (E2B returns it to the API caller) but
    // nowhere in the guest.
    // (The search pattern is built in the shell so the command line does not hold it.)
    let look = sim
        .run(
            &guard,
            "env; cat /etc/hosts; for f in /proc/[0-9]*/cmdline /proc/[0-9]*/environ; do tr '\\0' ' ' < $f; echo; done; \
             t=0123456789abcdef; grep -rsl \"$t$t\" /home /tmp /etc /run /root /opt; echo end",
            &[("Authorization", "Basic cm9vdDo=")],
        )
        .await;
    let out = look.output("stdout");
    assert!(out.ends_with("end\n"), "{out}");
    assert!(
        out.contains("E2B_SANDBOX_ID="),
        "the search ran as root over the whole guest"
    );
    assert!(
        !out.contains(&TOKEN[4..40]),
        "the guest saw the token: {out}"
    );

    // With no network config E2B lets everything out: the simulator answers example.com.
    let open = sim.create(json!({"templateID": "base"})).await;
    let results = probe(&sim, &open, &["https://example.com/"]).await;
    assert!(results[0].starts_with("200 "), "{results:?}");
}

#[tokio::test]
async fn a_network_update_applies_to_the_next_connection() {
    let (port, seen) = recorder().await;
    let upstream = format!("{GUARD}=http://127.0.0.1:{port}");
    let Some(sim) = Sim::start(&["--host", &upstream]) else {
        return;
    };
    let sandbox = sim
        .create(json!({"templateID": "base", "network": {"denyOut": ["0.0.0.0/0"]}}))
        .await;
    let id = sid(&sandbox);
    let url = ["https://guard.sim.test/v1/e2b/guard"];
    assert!(probe(&sim, &sandbox, &url).await[0].starts_with("ERR"));
    let put = sim
        .api(
            "PUT",
            &format!("/sandboxes/{id}/network"),
            Some(guarded(GUARD)),
        )
        .await;
    assert_eq!(put.status, 204);
    assert!(probe(&sim, &sandbox, &url).await[0].starts_with("200"));
    assert_eq!(seen.lock().unwrap().len(), 1);
    let restore = sim
        .api(
            "PUT",
            &format!("/sandboxes/{id}/network"),
            Some(json!({"denyOut": ["0.0.0.0/0"]})),
        )
        .await;
    assert_eq!(restore.status, 204);
    assert!(probe(&sim, &sandbox, &url).await[0].starts_with("ERR"));
    assert_eq!(seen.lock().unwrap().len(), 1);
}

#[tokio::test]
async fn the_egress_allowed_fault_lets_a_denied_vm_reach_example_com() {
    let Some(sim) = Sim::start(&["--fault", "egress-allowed"]) else {
        return;
    };
    let sandbox = sim
        .create(json!({"templateID": "base", "network": {"denyOut": ["0.0.0.0/0"]}}))
        .await;
    // Without NODE_EXTRA_CA_CERTS, as a smoke probe runs: the fault gives every process it.
    let script = "node -e 'fetch(\"https://example.com\", {signal: AbortSignal.timeout(4000)}).then(r => console.log(r.status), e => console.log(\"ERR\", e.cause && e.cause.code))'";
    let run = sim.run(&sandbox, script, &[]).await;
    assert_eq!(run.output("stdout"), "200\n", "{}", run.output("stderr"));
    sim.process.set_faults(&json!({})).unwrap();
    let run = sim.run(&sandbox, script, &[]).await;
    assert!(
        run.output("stdout").starts_with("ERR"),
        "denied again once the fault is off"
    );
}

#[tokio::test]
async fn an_https_upstream_is_verified_against_its_ca() {
    let (port, ca_pem) = tls_recorder().await;
    let Some(sim) = Sim::start(&[]) else { return };
    sim.process
        .map_host(GUARD, &format!("https://127.0.0.1:{port}"), Some(&ca_pem))
        .unwrap();
    let sandbox = sim
        .create(json!({"templateID": "base", "network": guarded(GUARD)}))
        .await;
    let results = probe(&sim, &sandbox, &["https://guard.sim.test/v1/e2b/guard"]).await;
    assert_eq!(results[0], format!("200 {TOKEN}"), "{results:?}");
}

/// An HTTPS server for `GUARD` (its own CA) that answers with the header it received.
async fn tls_recorder() -> (u16, String) {
    use rcgen::{BasicConstraints, CertificateParams, IsCa, KeyPair};
    let ca_key = KeyPair::generate().unwrap();
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca = ca_params.self_signed(&ca_key).unwrap();
    let key = KeyPair::generate().unwrap();
    let leaf = CertificateParams::new(vec![GUARD.to_owned()])
        .unwrap()
        .signed_by(&key, &ca, &ca_key)
        .unwrap();
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(
            vec![leaf.der().clone()],
            rustls::pki_types::PrivateKeyDer::Pkcs8(key.serialize_der().into()),
        )
        .unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        loop {
            let (tcp, _) = listener.accept().await.unwrap();
            let acceptor = acceptor.clone();
            tokio::spawn(async move {
                let Ok(mut tls) = acceptor.accept(tcp).await else {
                    return;
                };
                let mut raw = Vec::new();
                let mut buf = [0u8; 4096];
                while !raw.windows(4).any(|w| w == b"\r\n\r\n") {
                    let n = tls.read(&mut buf).await.unwrap_or(0);
                    if n == 0 {
                        return;
                    }
                    raw.extend_from_slice(&buf[..n]);
                }
                // Read the whole body before answering: closing on an unread body would
                // reset the proxy's request.
                let head_end = raw.windows(4).position(|w| w == b"\r\n\r\n").unwrap_or(0) + 4;
                let head = String::from_utf8_lossy(&raw[..head_end]).to_ascii_lowercase();
                let len: usize = head
                    .lines()
                    .find_map(|l| l.strip_prefix("content-length:"))
                    .and_then(|v| v.trim().parse().ok())
                    .unwrap_or(0);
                while raw.len() < head_end + len {
                    let n = tls.read(&mut buf).await.unwrap_or(0);
                    if n == 0 {
                        break;
                    }
                    raw.extend_from_slice(&buf[..n]);
                }
                let token = head
                    .lines()
                    .find_map(|l| l.strip_prefix("x-plimsoll-guard:"))
                    .map(|v| v.trim().to_owned())
                    .unwrap_or_default();
                let reply = format!(
                    "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{token}",
                    token.len()
                );
                let _ = tls.write_all(reply.as_bytes()).await;
                let _ = tls.shutdown().await;
            });
        }
    });
    (port, ca.pem())
}
