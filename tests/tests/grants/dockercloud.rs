//! Grants on dockercloud through the guard (grants.md §5.4, §7.4, issue 18 item 5): Docker's
//! proxy cannot add headers, so the guest's client carries its own run's guard token; the
//! sandbox's policy allows exactly `<guardHost>:443` (PUT, echoed, read back). The token is
//! accepted only at the guard, only for that run's grant, and is dead once the run ends.
//!
//! The simulator routes `<guardHost>:443` from the sandbox to a loopback address; there this
//! test terminates TLS with a certificate for the guard's name from a fresh CA (the role of
//! the operator's TLS front) and forwards to the daemon's guard listener. The sandbox image
//! is the simulator's own plus that CA in `NODE_EXTRA_CA_CERTS`; verification stays on.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{Value, json};

use crate::{Fixture, SECRET, bearers, borrowed, ran, run_request, verify_jwt};
use dockercloud_simulator::launch::LaunchOptions;
use plimsoll_tests::dockercloud::{
    DockerCloudSim, SANDBOX_IMAGE, START_TIMEOUT, dockercloud_ready,
};
use plimsoll_tests::{Daemon, connect};

/// The guard's public name, as sandboxes reach it.
const GUARD_HOST: &str = "guard.plimsoll.test";

/// A TLS front for the guard: a certificate for [`GUARD_HOST`] from a fresh CA, forwarding
/// each connection's bytes to the guard listener once it is known.
struct Front {
    addr: SocketAddr,
    ca_pem: String,
    upstream: Arc<Mutex<Option<SocketAddr>>>,
}

fn front() -> Front {
    use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, KeyPair};
    let ca_key = KeyPair::generate().unwrap();
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params
        .distinguished_name
        .push(DnType::CommonName, "plimsoll guard test CA");
    let ca = ca_params.self_signed(&ca_key).unwrap();
    let leaf_key = KeyPair::generate().unwrap();
    let leaf = CertificateParams::new(vec![GUARD_HOST.to_owned()])
        .unwrap()
        .signed_by(&leaf_key, &ca, &ca_key)
        .unwrap();
    let key = rustls::pki_types::PrivateKeyDer::Pkcs8(leaf_key.serialize_der().into());
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(vec![leaf.der().clone()], key)
        .unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
    let upstream: Arc<Mutex<Option<SocketAddr>>> = Arc::default();
    let target = upstream.clone();
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    listener.set_nonblocking(true).unwrap();
    // Ends with the test process.
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async move {
            let listener = tokio::net::TcpListener::from_std(listener).unwrap();
            while let Ok((tcp, _)) = listener.accept().await {
                let acceptor = acceptor.clone();
                let Some(to) = *target.lock().unwrap() else {
                    continue;
                };
                tokio::spawn(async move {
                    let Ok(mut tls) = acceptor.accept(tcp).await else {
                        return;
                    };
                    let Ok(mut guard) = tokio::net::TcpStream::connect(to).await else {
                        return;
                    };
                    let _ = tokio::io::copy_bidirectional(&mut tls, &mut guard).await;
                });
            }
        });
    });
    Front {
        addr,
        ca_pem: ca.pem(),
        upstream,
    }
}

/// The simulator's image plus the front's CA, trusted by node; removed on drop.
struct TrustingImage(String);

impl TrustingImage {
    fn build(ca_pem: &str) -> TrustingImage {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("ca.pem"), ca_pem).unwrap();
        std::fs::write(
            dir.path().join("Dockerfile"),
            format!(
                "FROM {SANDBOX_IMAGE}\nCOPY ca.pem /etc/plimsoll-guard-test-ca.pem\nENV NODE_EXTRA_CA_CERTS=/etc/plimsoll-guard-test-ca.pem\n"
            ),
        )
        .unwrap();
        let tag = format!(
            "plimsoll-sim/dockercloud-guard-test:{}",
            hex::encode(rand_bytes())
        );
        let out = std::process::Command::new("docker")
            .args(["build", "-q", "--pull=false", "-t", &tag])
            .arg(dir.path())
            .env("DOCKER_BUILDKIT", "0")
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        TrustingImage(tag)
    }
}

impl Drop for TrustingImage {
    fn drop(&mut self) {
        let _ = std::process::Command::new("docker")
            .args(["image", "rm", "-f", &self.0])
            .output();
    }
}

fn rand_bytes() -> [u8; 6] {
    let mut bytes = [0u8; 6];
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
        .as_nanos();
    for (i, b) in bytes.iter_mut().enumerate() {
        *b = (nanos >> (i * 8)) as u8 ^ (std::process::id() >> (i % 4 * 8)) as u8;
    }
    bytes
}

/// One POST of `envelope` to the guard with `token`: the status.
fn post_to_guard(addr: &str, token: &str, envelope: &str) -> u16 {
    let mut stream = TcpStream::connect(addr).expect("connect to the guard");
    stream
        .set_read_timeout(Some(Duration::from_secs(30)))
        .expect("timeout");
    write!(
        stream,
        "POST /v1/dockercloud/guard HTTP/1.1\r\nHost: {GUARD_HOST}\r\nX-Plimsoll-Guard: {token}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{envelope}",
        envelope.len()
    )
    .expect("write");
    let mut answer = String::new();
    let _ = stream.read_to_string(&mut answer);
    answer
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0)
}

#[test]
fn dockercloud_runs_reach_only_their_grant_with_their_own_token() {
    if !dockercloud_ready() {
        return;
    }
    let f = Fixture::start();
    let front = front();
    let image = TrustingImage::build(&front.ca_pem);
    let sim = DockerCloudSim::start_with(
        LaunchOptions::new()
            .arg("--image")
            .arg(&image.0)
            .guard(GUARD_HOST, front.addr),
    );
    let mut env = f.env(&[]);
    for (k, v) in sim.env(&[
        ("SANDBOX_DOCKERCLOUD_IMAGE", &image.0),
        (
            "SANDBOX_DOCKERCLOUD_GUARD_URL",
            &format!("https://{GUARD_HOST}"),
        ),
        ("PLIMSOLL_GUARD_ADDR", "127.0.0.1:0"),
    ]) {
        env.retain(|(name, _)| *name != k);
        env.push((k, v));
    }
    let d = Daemon::start_within(&borrowed(&env), START_TIMEOUT);
    assert_eq!(d.listening["isolation"], "vm", "{}", d.listening);
    let guard_addr = d.listening["guard_addr"]
        .as_str()
        .filter(|a| *a != "none")
        .unwrap_or_else(|| panic!("no guard address: {}", d.listening))
        .to_owned();
    *front.upstream.lock().unwrap() = Some(guard_addr.parse().unwrap());
    let v = connect::call_as(&f.alice, "Describe", &json!({}))
        .send(d.addr)
        .json();
    assert_eq!(v["supportsJavascriptGrants"], true, "{v}");

    // Granted: the client reaches the API through the guard with the run's token; a route
    // outside the grant is refused by the broker even with the token; without the token
    // the guard answers 401. The guest prints the token it holds so the test can try it
    // after the run.
    let code = format!(
        "(async () => {{\n\
         const item = await host.get('/items/7');\n\
         const own = require('fs').readFileSync(__filename, 'utf8').match(/crg_[0-9a-f]{{64}}/)[0];\n\
         const post = (headers, envelope) => fetch('https://{GUARD_HOST}/v1/dockercloud/guard', {{ method: 'POST', headers: {{ 'content-type': 'application/json', ...headers }}, body: JSON.stringify(envelope) }}).then((r) => r.status);\n\
         const outside = await post({{ 'X-Plimsoll-Guard': own }}, {{ method: 'GET', path: '/admin' }});\n\
         const bare = await post({{}}, {{ method: 'GET', path: '/items/7' }});\n\
         console.log(JSON.stringify({{ item, outside, bare, token: own }}));\n\
         }})().catch((e) => {{ console.error(String(e)); process.exit(3); }});"
    );
    let out = ran(&run_request(&f.alice, &code, "inv", 30_000).send(d.addr));
    assert_eq!(out.exit_code, 0, "{out:?}");
    let seen: Value = serde_json::from_str(out.stdout.trim()).expect("one JSON line");
    assert_eq!(seen["item"]["id"], 7, "{seen}");
    assert_eq!(seen["outside"], 403, "a route outside the grant: {seen}");
    assert_eq!(seen["bare"], 401, "no token: {seen}");
    let token = seen["token"].as_str().unwrap_or_default().to_owned();
    assert!(token.starts_with("crg_"), "{seen}");
    let tokens = bearers(&f.api.requests());
    assert_eq!(
        tokens.len(),
        1,
        "only the granted route: {:?}",
        f.api.requests()
    );
    assert_eq!(verify_jwt(&tokens[0], SECRET)["sub"], "alice");
    assert!(!out.stdout.contains(&tokens[0]) && !out.stderr.contains(&tokens[0]));
    // The token died with the run.
    assert_eq!(
        post_to_guard(&guard_addr, &token, r#"{"method":"GET","path":"/items/7"}"#),
        401
    );
    assert_eq!(bearers(&f.api.requests()).len(), 1);

    // A granted project: every node a step starts has the client.
    f.api.clear_requests();
    let body = json!({ "protocol": connect::PROTOCOL, "timeoutMs": 60_000,
        "project": { "files": [{ "path": "main.mjs", "content": "console.log((await host.get('/items/7')).id)" }],
                     "steps": ["node main.mjs"], "grantProfile": "inv" } });
    let v = connect::call_as(&f.alice, "Run", &body).send(d.addr).json();
    assert_eq!(v["project"]["outcome"], "PROJECT_OUTCOME_COMPLETED", "{v}");
    let stdout = v["project"]["steps"][0]["stdout"]
        .as_str()
        .unwrap_or_default();
    assert_eq!(
        connect::decode_base64(stdout).expect("base64"),
        b"7\n",
        "{v}"
    );
    assert_eq!(
        bearers(&f.api.requests()).len(),
        1,
        "{:?}",
        f.api.requests()
    );

    // Without a grant the sandbox has no way out at all: its policy allows nothing.
    let bare = format!(
        "fetch('https://{GUARD_HOST}/v1/dockercloud/guard', {{ method: 'POST' }}).then(r => console.log(r.status), () => console.log('blocked'))"
    );
    let out = ran(&run_request(&f.alice, &bare, "", 20_000).send(d.addr));
    assert_eq!(out.stdout, "blocked\n", "{out:?}");
    sim.wait_empty(Duration::from_secs(60));
}
