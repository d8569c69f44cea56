//! The official Rust client and the `plimsoll` command line, against the real daemon.
//!
//! Happy paths under the `disabled` and `wasm` providers, over HTTP/1.1, h2c and TLS with a
//! custom CA; a tampering proxy (one byte of stdout, the request-id echo, the tier) caught
//! with the documented error kind; the golden vectors through the client's check path; and
//! the command line's exit codes. A session's saved chain and its signed bundle:
//! `client_chain.rs`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::convert::Infallible;
use std::net::SocketAddr;
use std::os::unix::fs::PermissionsExt as _;
use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use bytes::Bytes;
use http_body_util::{BodyExt as _, Full};
use plimsoll::client::{Client, ClientError, Mark, RunAnswer, RunOptions, SessionState};
use plimsoll::record::{self, Stamp};
use plimsoll::refusal::Reason;
use plimsoll::wire::{RunRequest, RunResponse};
use plimsoll_tests::{Daemon, binary};
use serde_json::Value;
use tokio::net::TcpListener;

const TOKEN: &str = "client-test-token-0123456789abcdef0123";

fn wasm() -> Daemon {
    Daemon::start(&[("SANDBOX_PROVIDER", "wasm"), ("PLIMSOLL_TOKEN", TOKEN)])
}

fn url(addr: SocketAddr) -> String {
    format!("http://{addr}")
}

fn client(addr: SocketAddr, token: Option<&str>) -> Client {
    let mut b = Client::builder(url(addr));
    if let Some(t) = token {
        b = b.token(t);
    }
    b.build().expect("client")
}

fn marked(e: &ClientError, reason: Reason) -> bool {
    e.not_dispatched_reason() == Some(Mark::Reason(reason))
}

// === happy paths and refusals ===

#[tokio::test]
async fn describe_on_disabled_states_protocol_4_and_tier_none() {
    let d = Daemon::open();
    let info = client(d.addr, None).describe().await.expect("describe");
    assert_eq!(info.sandbox, "disabled");
    assert_eq!(info.isolation, "none");
    assert_eq!(info.protocol, plimsoll::refusal::PROTOCOL);
}

#[tokio::test]
async fn disabled_run_is_refused_as_disabled_marked_unsupported() {
    let d = Daemon::open();
    let e = client(d.addr, None)
        .run_javascript("console.log(1)", &RunOptions::new())
        .await
        .expect_err("disabled runs nothing");
    assert!(matches!(e, ClientError::Disabled(_)), "{e:?}");
    assert!(marked(&e, Reason::Unsupported), "{e:?}");
}

#[tokio::test]
async fn bad_requests_are_refused_locally_before_anything_is_sent() {
    // Nothing listens on port 1: a request that left would fail as a transport error.
    let c = client(SocketAddr::from(([127, 0, 0, 1], 1)), None);
    for (code, opts) in [
        ("", RunOptions::new()),
        ("x", RunOptions::new().minimum_isolation("none")),
        ("x", RunOptions::new().trace_id("has space")),
        (
            "x",
            RunOptions::new().software_approved(Vec::<String>::new()),
        ),
    ] {
        let e = c.run_javascript(code, &opts).await.expect_err("refused");
        assert!(matches!(e, ClientError::InvalidRequest(_)), "{e:?}");
        assert!(marked(&e, Reason::Request));
    }
    let e = c.describe().await.expect_err("nothing listens");
    assert!(matches!(e, ClientError::Transport(_)), "{e:?}");
    assert!(
        marked(&e, Reason::Environment),
        "connect failed before sending: {e:?}"
    );
}

#[tokio::test]
async fn wasm_snippet_checks_out_over_http1_and_h2c() {
    let d = wasm();
    for http2 in [false, true] {
        let c = Client::builder(url(d.addr))
            .token(TOKEN)
            .http2(http2)
            .build()
            .expect("client");
        let a = c
            .run_javascript(
                "console.log(6*7)",
                &RunOptions::new()
                    .minimum_isolation("process")
                    .trace_id("t-1"),
            )
            .await
            .expect("run");
        assert_eq!(a.response.sandbox, "wasm");
        assert_eq!(a.javascript().expect("js").stdout, b"42\n");
        assert_eq!(a.record().version, record::RECORD_VERSION);
        // The saved answer re-checks offline.
        let saved: RunAnswer =
            serde_json::from_str(&serde_json::to_string(&a).expect("json")).expect("back");
        saved.verify().expect("offline verify");
    }
}

#[tokio::test]
async fn wasm_floor_above_tier_and_bad_token_are_refused_and_marked() {
    let d = wasm();
    let e = client(d.addr, Some(TOKEN))
        .run_javascript("1", &RunOptions::new().minimum_isolation("container"))
        .await
        .expect_err("process < container");
    assert!(matches!(e, ClientError::InsufficientIsolation(_)), "{e:?}");
    assert!(marked(&e, Reason::Isolation));

    let e = client(d.addr, Some("wrong-token"))
        .describe()
        .await
        .expect_err("unknown token");
    assert_eq!(e.code(), "unauthenticated");
    assert!(marked(&e, Reason::Permission), "{e:?}");
}

#[tokio::test]
async fn wasm_tls_with_a_custom_ca() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (ca, cert, key) = test_pki(dir.path());
    let (c, k) = (cert.to_str().unwrap(), key.to_str().unwrap());
    let d = Daemon::start(&[
        ("SANDBOX_PROVIDER", "wasm"),
        ("PLIMSOLL_TOKEN", TOKEN),
        ("PLIMSOLL_TLS_CERT", c),
        ("PLIMSOLL_TLS_KEY", k),
    ]);
    let client = Client::builder(format!("https://{}", d.addr))
        .token(TOKEN)
        .ca_pem(std::fs::read(&ca).expect("ca"))
        .build()
        .expect("client");
    let a = client
        .run_javascript("console.log(6*7)", &RunOptions::new())
        .await
        .expect("run over TLS");
    assert_eq!(a.javascript().expect("js").stdout, b"42\n");

    // A client that trusts another CA (or only the system's roots) refuses this daemon's
    // certificate: the handshake fails before the request is sent, so nothing ran.
    let other = tempfile::tempdir().expect("tempdir");
    let (other_ca, _, _) = test_pki(other.path());
    let untrusted = Client::builder(format!("https://{}", d.addr))
        .token(TOKEN)
        .ca_pem(std::fs::read(&other_ca).expect("other ca"))
        .build()
        .expect("client");
    let system_roots = Client::builder(format!("https://{}", d.addr))
        .token(TOKEN)
        .build()
        .expect("client");
    for refused in [untrusted, system_roots] {
        let e = refused
            .run_javascript("console.log(1)", &RunOptions::new())
            .await
            .expect_err("a certificate no trusted CA signed");
        let text = format!("{e} {e:?}");
        assert!(
            text.contains("certificate") || text.contains("UnknownIssuer"),
            "{text}"
        );
    }

    // An empty CA file is refused when the client is built.
    let e = Client::builder(format!("https://{}", d.addr))
        .token(TOKEN)
        .ca_pem(Vec::new())
        .build()
        .expect_err("an empty CA file holds no certificate");
    assert!(matches!(e, ClientError::InvalidOption(_)));
}

/// A test CA and a leaf certificate for 127.0.0.1 signed by it, written under `dir`:
/// (CA certificate, leaf certificate, leaf key), all PEM.
fn test_pki(dir: &Path) -> (std::path::PathBuf, std::path::PathBuf, std::path::PathBuf) {
    use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, KeyPair};
    let p = |name: &str| dir.join(name);
    let ca_key = KeyPair::generate().expect("CA key");
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).expect("CA params");
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params
        .distinguished_name
        .push(DnType::CommonName, "plimsoll-test-ca");
    let ca = ca_params.self_signed(&ca_key).expect("CA certificate");
    let leaf_key = KeyPair::generate().expect("leaf key");
    let leaf = CertificateParams::new(vec!["127.0.0.1".to_owned()])
        .expect("leaf params")
        .signed_by(&leaf_key, &ca, &ca_key)
        .expect("leaf certificate");
    std::fs::write(p("ca.pem"), ca.pem()).expect("write ca.pem");
    std::fs::write(p("leaf.pem"), leaf.pem()).expect("write leaf.pem");
    std::fs::write(p("leaf.key"), leaf_key.serialize_pem()).expect("write leaf.key");
    (p("ca.pem"), p("leaf.pem"), p("leaf.key"))
}

// === the tampering proxy ===

type Tamper = Arc<dyn Fn(&mut http::response::Parts, &mut Value) + Send + Sync>;

/// Whether an error is the kind a tampering case must produce.
type Expect = fn(&ClientError) -> bool;

/// A loopback HTTP/1.1 proxy to `upstream` that rewrites every JSON answer with `tamper`.
async fn proxy(upstream: SocketAddr, tamper: Tamper) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                return;
            };
            let tamper = tamper.clone();
            tokio::spawn(async move {
                let svc =
                    hyper::service::service_fn(move |req: http::Request<hyper::body::Incoming>| {
                        let tamper = tamper.clone();
                        async move { Ok::<_, Infallible>(forward(upstream, req, tamper).await) }
                    });
                let io = hyper_util::rt::TokioIo::new(stream);
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(io, svc)
                    .await;
            });
        }
    });
    addr
}

async fn forward(
    upstream: SocketAddr,
    req: http::Request<hyper::body::Incoming>,
    tamper: Tamper,
) -> http::Response<Full<Bytes>> {
    let (parts, body) = req.into_parts();
    let body = body.collect().await.expect("request body").to_bytes();
    let stream = tokio::net::TcpStream::connect(upstream)
        .await
        .expect("upstream");
    let (mut sender, conn) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
            .await
            .expect("handshake");
    tokio::spawn(conn);
    let resp = sender
        .send_request(http::Request::from_parts(parts, Full::new(body)))
        .await
        .expect("upstream answer");
    let (mut parts, body) = resp.into_parts();
    let body = body.collect().await.expect("answer body").to_bytes();
    let mut json: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    tamper(&mut parts, &mut json);
    let out = serde_json::to_vec(&json).expect("json");
    parts.headers.remove(http::header::CONTENT_LENGTH);
    http::Response::from_parts(parts, Full::new(Bytes::from(out)))
}

fn decode_response(v: &Value) -> RunResponse {
    serde_json::from_value(v.clone()).expect("RunResponse")
}

#[tokio::test]
async fn tampering_proxy_is_caught_with_the_documented_kind() {
    let d = wasm();
    let cases: Vec<(&str, Tamper, Expect)> = vec![
        (
            "one byte of stdout",
            Arc::new(|_, v: &mut Value| {
                let mut out = STANDARD
                    .decode(v["javascript"]["stdout"].as_str().unwrap())
                    .unwrap();
                out[0] ^= 1;
                v["javascript"]["stdout"] = Value::from(STANDARD.encode(out));
            }),
            |e| matches!(e, ClientError::RecordMismatch(_)),
        ),
        (
            "the request-id echo",
            Arc::new(|p: &mut http::response::Parts, _| {
                p.headers.remove("plimsoll-request-id");
            }),
            |e| matches!(e, ClientError::AnswerNotBound(_)),
        ),
        (
            "the request-id echo, doubled",
            Arc::new(|p: &mut http::response::Parts, _| {
                let id = p.headers.get("plimsoll-request-id").unwrap().clone();
                p.headers.append("plimsoll-request-id", id);
            }),
            |e| matches!(e, ClientError::AnswerNotBound(_)),
        ),
        (
            "the tier, record digest recomputed",
            Arc::new(|_, v: &mut Value| {
                v["isolation"] = Value::from("none");
                v["record"]["isolation"] = Value::from("none");
                let rec = decode_response(v).record.as_option().unwrap().clone();
                v["record"]["recordSha256"] = Value::from(record::record_digest(&rec));
            }),
            |e| matches!(e, ClientError::IsolationEvidenceMismatch(_)),
        ),
        (
            "the tier, record left alone",
            Arc::new(|_, v: &mut Value| {
                v["isolation"] = Value::from("vm");
            }),
            |e| matches!(e, ClientError::RecordMismatch(_)),
        ),
        (
            "the record removed",
            Arc::new(|_, v: &mut Value| {
                v.as_object_mut().unwrap().remove("record");
            }),
            |e| matches!(e, ClientError::NoRecord(_)),
        ),
    ];
    for (what, tamper, expected) in cases {
        let p = proxy(d.addr, tamper).await;
        let e = client(p, Some(TOKEN))
            .run_javascript(
                "console.log(6*7)",
                &RunOptions::new().minimum_isolation("process"),
            )
            .await
            .expect_err(what);
        assert!(expected(&e), "{what}: {e:?}");
        assert!(e.is_data_loss(), "{what}: data_loss, never retried: {e:?}");
        assert_eq!(e.not_dispatched_reason(), None, "{what}: may have run");
    }
}

#[tokio::test]
async fn refusal_without_the_echo_loses_its_mark() {
    let d = Daemon::open();
    let p = proxy(
        d.addr,
        Arc::new(|p: &mut http::response::Parts, _| {
            p.headers.remove("plimsoll-request-id");
        }),
    )
    .await;
    let e = client(p, None)
        .run_javascript("1", &RunOptions::new())
        .await
        .expect_err("disabled");
    assert_eq!(e.code(), "failed_precondition");
    assert_eq!(
        e.not_dispatched_reason(),
        None,
        "an unbound answer proves nothing: {e:?}"
    );
    assert!(e.failure().answer_not_bound);
}

// === the golden vectors through the client's check path ===

#[test]
fn golden_vectors_through_the_client_check_path() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../shared/vectors/golden.json");
    let golden: Value =
        serde_json::from_str(&std::fs::read_to_string(&path).expect("golden.json")).expect("json");
    let requests = golden["requests"].as_array().unwrap();
    let results = golden["results"].as_array().unwrap();
    let js_result = results
        .iter()
        .find(|r| r["response"].get("javascript").is_some())
        .unwrap();
    let mut checked = 0;
    for v in requests.iter().filter(|r| r["kind"] == "run") {
        let request: RunRequest = serde_json::from_value(v["request"].clone()).expect("request");
        if request.protocol < 2 {
            continue;
        }
        let Some(plimsoll::wire::run_request::Payload::Javascript(_)) = &request.payload else {
            continue;
        };
        let mut response: RunResponse =
            serde_json::from_value(js_result["response"].clone()).expect("response");
        let stamp = Stamp {
            provider: response.sandbox.clone(),
            isolation: response.isolation.clone(),
            software_rule_id: record::software_rule_id(request.software_rule.as_option()),
            software_identity: request
                .software_rule
                .as_option()
                .and_then(|r| r.identities.first().cloned())
                .unwrap_or_default(),
            ..Default::default()
        };
        response.software_identity = stamp.software_identity.clone();
        let rec = record::seal(
            v["sha256"].as_str().unwrap().to_owned(),
            js_result["sha256"].as_str().unwrap().to_owned(),
            stamp,
        );
        response.record = rec.into();
        let answer = RunAnswer { request, response };
        let rec = answer
            .verify()
            .unwrap_or_else(|e| panic!("{}: {e}", v["name"]));
        assert_eq!(rec.request_sha256, v["sha256"].as_str().unwrap());
        checked += 1;
    }
    assert!(checked >= 1, "no version-2 javascript request vector");

    // The version-2 record vector is refused as a version this client does not read.
    let rec: plimsoll::wire::RunRecord =
        serde_json::from_value(golden["records"][0]["record"].clone()).expect("record");
    assert_eq!(
        record::record_digest(&rec),
        golden["records"][0]["sha256"].as_str().unwrap()
    );
    let answer = RunAnswer {
        request: RunRequest::default(),
        response: RunResponse {
            record: rec.into(),
            ..Default::default()
        },
    };
    assert!(answer.verify().is_err());
}

// === the command line ===

fn cli(addr: SocketAddr, token: Option<&str>, args: &[&str]) -> std::process::Output {
    let mut cmd = Command::new(binary("plimsoll"));
    cmd.env_clear().env("PLIMSOLL_URL", url(addr)).args(args);
    if let Some(t) = token {
        cmd.env("PLIMSOLL_TOKEN", t);
    }
    cmd.output().expect("run plimsoll")
}

#[test]
fn cli_exit_codes_distinguish_ok_guest_failure_refusal_and_bad_evidence() {
    let disabled = Daemon::open();
    assert_eq!(
        cli(disabled.addr, None, &["describe"]).status.code(),
        Some(0)
    );
    let refused = cli(disabled.addr, None, &["run", "-e", "console.log(1)"]);
    assert_eq!(refused.status.code(), Some(3), "{refused:?}");
    assert_eq!(
        cli(disabled.addr, None, &["run"]).status.code(),
        Some(2),
        "no code"
    );

    let d = wasm();
    let ok = cli(d.addr, Some(TOKEN), &["run", "-e", "console.log(6*7)"]);
    assert_eq!(ok.status.code(), Some(0), "{ok:?}");
    let text = String::from_utf8_lossy(&ok.stdout);
    assert!(
        text.contains("provider:  wasm") && text.contains("42"),
        "{text}"
    );

    let boom = cli(
        d.addr,
        Some(TOKEN),
        &["run", "-e", "throw new Error('boom')"],
    );
    assert_eq!(boom.status.code(), Some(1), "{boom:?}");

    let json = cli(
        d.addr,
        Some(TOKEN),
        &["--json", "run", "-e", "console.log(6*7)"],
    );
    assert_eq!(json.status.code(), Some(0));
    let dir = tempfile::tempdir().unwrap();
    let saved = dir.path().join("answer.json");
    std::fs::write(&saved, &json.stdout).unwrap();
    let s = saved.to_str().unwrap();
    assert_eq!(cli(d.addr, None, &["verify", s]).status.code(), Some(0));

    // Signed, then verified against the saved answer.
    let (sk, pk, env) = (
        dir.path().join("k.pem"),
        dir.path().join("k.pub"),
        dir.path().join("e.json"),
    );
    let (sk, pk) = (sk.to_str().unwrap(), pk.to_str().unwrap());
    assert_eq!(
        cli(
            d.addr,
            None,
            &["attest", "keygen", "--private", sk, "--public", pk]
        )
        .status
        .code(),
        Some(0)
    );
    assert_eq!(
        std::fs::metadata(sk).unwrap().permissions().mode() & 0o777,
        0o600,
        "the private key is its owner's only"
    );
    let signed = cli(d.addr, None, &["attest", "sign", "--key", sk, s]);
    assert_eq!(signed.status.code(), Some(0), "{signed:?}");
    std::fs::write(&env, &signed.stdout).unwrap();
    let e = env.to_str().unwrap();
    assert_eq!(
        cli(
            d.addr,
            None,
            &["attest", "verify", "--public", pk, e, "--answer", s]
        )
        .status
        .code(),
        Some(0)
    );

    // One changed byte of stdout in the saved answer: it no longer checks.
    let mut v: Value = serde_json::from_slice(&json.stdout).unwrap();
    v["response"]["javascript"]["stdout"] = Value::from(STANDARD.encode(b"43\n"));
    std::fs::write(&saved, serde_json::to_vec(&v).unwrap()).unwrap();
    assert_eq!(cli(d.addr, None, &["verify", s]).status.code(), Some(5));
    assert_eq!(
        cli(
            d.addr,
            None,
            &["attest", "verify", "--public", pk, e, "--answer", s]
        )
        .status
        .code(),
        Some(5)
    );
}

#[tokio::test]
async fn cli_exit_code_4_when_the_call_may_have_run() {
    // A daemon stand-in that reads the request and hangs up without answering.
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            use tokio::io::AsyncReadExt as _;
            let mut buf = [0u8; 4096];
            let _ = tokio::time::timeout(Duration::from_millis(300), s.read(&mut buf)).await;
            drop(s);
        }
    });
    let out = tokio::task::spawn_blocking(move || cli(addr, None, &["run", "-e", "1"]))
        .await
        .unwrap();
    assert_eq!(out.status.code(), Some(4), "{out:?}");
}

#[test]
fn cli_sends_a_project_as_regular_files_only_and_refuses_a_symbolic_link() {
    let disabled = Daemon::open();
    let dir = tempfile::tempdir().unwrap();
    let project = dir.path().join("project");
    std::fs::create_dir(&project).unwrap();
    std::fs::write(project.join("main.py"), "print(1)\n").unwrap();
    let outside = dir.path().join("secret.txt");
    std::fs::write(&outside, "not for the sandbox\n").unwrap();
    let p = project.to_str().unwrap();
    // Without the link the project is read and sent: the disabled daemon refuses it (3).
    let sent = cli(
        disabled.addr,
        None,
        &["project", p, "--step", "python3 main.py"],
    );
    assert_eq!(sent.status.code(), Some(3), "{sent:?}");
    // A link to a file outside the project: refused before anything is sent (2), by name.
    std::os::unix::fs::symlink(&outside, project.join("key")).unwrap();
    let linked = cli(
        disabled.addr,
        None,
        &["project", p, "--step", "python3 main.py"],
    );
    assert_eq!(linked.status.code(), Some(2), "{linked:?}");
    let err = String::from_utf8_lossy(&linked.stderr);
    assert!(err.contains("key: a symbolic link"), "{err}");
    // A link that loops back to the project is refused the same way, not followed forever.
    std::fs::remove_file(project.join("key")).unwrap();
    std::os::unix::fs::symlink(&project, project.join("again")).unwrap();
    let looped = cli(
        disabled.addr,
        None,
        &["project", p, "--step", "python3 main.py"],
    );
    assert_eq!(looped.status.code(), Some(2), "{looped:?}");
}

#[test]
fn the_token_and_the_session_id_are_never_printed() {
    let token = "tok-0123456789abcdefghijklmnopqrstuvwxyz";
    let builder = Client::builder("http://127.0.0.1:1").token(token);
    assert!(!format!("{builder:?}").contains(token), "{builder:?}");
    let id = "0123456789abcdef0123456789abcdef";
    let state = SessionState {
        session_id: id.to_owned(),
        ..SessionState::default()
    };
    assert!(!format!("{state:?}").contains(id), "{state:?}");
}

/// A private file (a key, a session's state) replaces what is at its path whole: a link
/// there is replaced, never followed, so the file it named keeps its bytes and mode.
#[test]
fn a_private_file_never_writes_through_a_symlink() {
    let dir = tempfile::tempdir().unwrap();
    let victim = dir.path().join("victim");
    std::fs::write(&victim, "keep me").unwrap();
    std::fs::set_permissions(&victim, std::fs::Permissions::from_mode(0o644)).unwrap();
    let link = dir.path().join("key.pem");
    std::os::unix::fs::symlink(&victim, &link).unwrap();
    let public = dir.path().join("key.pub");
    let addr: SocketAddr = "127.0.0.1:1".parse().unwrap();
    let args = ["attest", "keygen", "--private", link.to_str().unwrap()];
    let out = cli(
        addr,
        None,
        &[&args[..], &["--public", public.to_str().unwrap()]].concat(),
    );
    assert!(out.status.success(), "{out:?}");
    assert_eq!(std::fs::read_to_string(&victim).unwrap(), "keep me");
    assert_eq!(
        std::fs::metadata(&victim).unwrap().permissions().mode() & 0o777,
        0o644
    );
    let written = std::fs::symlink_metadata(&link).unwrap();
    assert!(written.is_file(), "the link was replaced by the key");
    assert_eq!(written.permissions().mode() & 0o777, 0o600);
    assert!(
        std::fs::read_to_string(&link)
            .unwrap()
            .contains("PRIVATE KEY")
    );
}
