//! The guard end to end (spec/grants.md §5, issue 14): the real `broker` with its guard socket
//! and the real `guard` binary on a loopback port, a run opened with guard delivery through
//! the control socket, and requests to the guard as a microVM's proxy would send them, raw
//! HTTP/1.1 or, over TLS, HTTP/2 and HTTP/1.1 chosen by ALPN. Calls reach [`TestApi`] over
//! real HTTPS with the credential the broker attaches.

use std::net::SocketAddr;
use std::sync::Arc;

use broker::control::protocol::{Delivery, Reach};
use http_body_util::{BodyExt, Full};
use plimsoll_tests::http1::{Connection, Request, Response};

use super::*;

const PATH: &str = "/v1/e2b/guard";
const UNKNOWN: &str = "unknown or expired egress guard credential";

/// The `guard` binary, killed when dropped.
struct GuardProcess {
    child: Child,
    addr: SocketAddr,
    _dir: tempfile::TempDir,
    log: Arc<Mutex<String>>,
}

impl GuardProcess {
    /// Starts `guard` on `127.0.0.1:0` against `broker`'s guard socket (TLS with `tls`'s
    /// certificate and key files) and waits for the address it bound.
    async fn start(broker: &Broker, tls: Option<(&Path, &Path)>) -> Self {
        Self::start_env(broker, tls, &[]).await
    }

    /// [`GuardProcess::start`] with `env` set on top.
    async fn start_env(broker: &Broker, tls: Option<(&Path, &Path)>, env: &[(&str, &str)]) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let addr_file = dir.path().join("guard.addr");
        let mut command = Command::new(plimsoll_tests::binary("guard"));
        command
            .env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .env("PLIMSOLL_GUARD_ADDR", "127.0.0.1:0")
            .env("PLIMSOLL_GUARD_ADDR_FILE", &addr_file)
            .env("PLIMSOLL_BROKER_GUARD_SOCKET", broker.guard_socket())
            .env("PLIMSOLL_LOG_FORMAT", "text")
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        command.envs(env.iter().copied());
        if let Some((cert, key)) = tls {
            command
                .env("PLIMSOLL_TLS_CERT", cert)
                .env("PLIMSOLL_TLS_KEY", key);
        }
        let mut child = command.spawn().unwrap();
        let log = Arc::new(Mutex::new(String::new()));
        let sink = log.clone();
        let stderr = child.stderr.take().unwrap();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                let mut log = sink.lock().unwrap();
                log.push_str(&line);
                log.push('\n');
            }
        });
        let deadline = Instant::now() + WAIT;
        let addr = loop {
            if let Some(addr) = std::fs::read_to_string(&addr_file)
                .ok()
                .and_then(|t| t.strip_suffix('\n').and_then(|a| a.parse().ok()))
            {
                break addr;
            }
            if let Ok(Some(status)) = child.try_wait() {
                panic!("guard exited ({status}): {}", log.lock().unwrap());
            }
            assert!(
                Instant::now() < deadline,
                "guard did not listen: {}",
                log.lock().unwrap()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        Self {
            child,
            addr,
            _dir: dir,
            log,
        }
    }
}

impl Drop for GuardProcess {
    fn drop(&mut self) {
        plimsoll_tests::stop(&mut self.child, Duration::from_secs(5));
    }
}

/// A broker with one JWT profile allowing `allow`, and a guard in front of it.
async fn start(api: &TestApi, allow: &[&str]) -> (Broker, GuardProcess) {
    let broker = Broker::start_with(
        api,
        &grants(json!({"inv": jwt_profile(api, "JWT_SECRET_A", allow)})),
        true,
    )
    .await;
    assert!(broker.client().hello().await.unwrap().guard);
    let guard = GuardProcess::start(&broker, None).await;
    (broker, guard)
}

/// Opens a guard-delivered run of `inv` for `alice` living `budget_ms`: its id and token.
async fn open_guarded(broker: &Broker, budget_ms: u64) -> (String, String) {
    let request = OpenRun {
        delivery: Delivery::Guard,
        ..open_request("alice", "inv", budget_ms)
    };
    let grant = broker.client().open(&request).await.unwrap().unwrap();
    match grant.reach {
        Reach::GuardToken(token) => {
            assert!(token.len() == 68 && token.starts_with("crg_"), "{token}");
            assert!(token[4..].bytes().all(|b| b.is_ascii_hexdigit()));
            (request.run, token)
        }
        other => panic!("a guard run got {other:?}"),
    }
}

fn envelope(method: &str, path: &str) -> Vec<u8> {
    json!({"method": method, "path": path})
        .to_string()
        .into_bytes()
}

/// A guard request with the token (when given) and a JSON body.
fn guard_request(token: Option<&str>, body: Vec<u8>) -> Request {
    let request = Request::post(PATH).header("content-type", "application/json");
    match token {
        Some(token) => request.header("X-Plimsoll-Guard", token),
        None => request,
    }
    .body(body)
}

/// Sends `request` to the guard off the runtime's threads.
async fn send(addr: SocketAddr, request: Request) -> Response {
    tokio::task::spawn_blocking(move || request.send(addr))
        .await
        .unwrap()
}

fn assert_unknown(answer: &Response) {
    assert_eq!(answer.status, 401, "{}", answer.text());
    assert_eq!(answer.json(), json!({"error": UNKNOWN}));
}

#[tokio::test]
async fn a_token_reaches_its_grants_upstream_with_the_brokers_credential() {
    let api = TestApi::start();
    api.respond("GET", "/items/abc", Reply::json(200, r#"{"id":"abc"}"#));
    api.respond("POST", "/items", Reply::json(201, r#"{"made":true}"#));
    let (broker, guard) = start(&api, &["GET /items/*", "POST /items"]).await;
    let (run, token) = open_guarded(&broker, 20_000).await;

    // The guest's own headers never reach the API: the broker's credential does.
    let request = guard_request(Some(&token), envelope("GET", "/items/abc"))
        .header("authorization", "Bearer guest-made");
    let answer = send(guard.addr, request).await;
    assert_eq!(answer.status, 200, "{}", answer.text());
    assert_eq!(answer.text(), r#"{"id":"abc"}"#);
    assert_eq!(answer.media_type(), "application/json");
    let seen = api.requests();
    assert_eq!(seen.len(), 1);
    let claims = decode_jwt(seen[0].header("authorization").unwrap(), SECRET_A);
    assert_eq!(claims["sub"], "alice");

    // Both guard paths; the body goes through as JSON.
    let body = json!({"method": "POST", "path": "/items", "body": {"n": 1}}).to_string();
    let request = Request::post("/v1/dockercloud/guard")
        .header("X-Plimsoll-Guard", &token)
        .body(body);
    let answer = send(guard.addr, request).await;
    assert_eq!(answer.status, 201, "{}", answer.text());
    assert_eq!(api.requests()[1].body, br#"{"n":1}"#);

    // A route outside the grant: the broker's refusal, relayed; the API hears nothing.
    let answer = send(
        guard.addr,
        guard_request(Some(&token), envelope("DELETE", "/items/abc")),
    )
    .await;
    assert_eq!(answer.status, 403, "{}", answer.text());
    assert_eq!(api.requests().len(), 2);

    // A bad envelope is 400 and reaches nobody.
    for bad in [&br#"{"method":"","path":"/x"}"#[..], b"{", b"[]"] {
        let answer = send(guard.addr, guard_request(Some(&token), bad.to_vec())).await;
        assert_eq!(answer.status, 400, "{:?}: {}", bad, answer.text());
    }

    // The broker's audit line counts the guard's calls like a socket's.
    let summary = broker.client().close(&run).await.unwrap();
    assert_eq!((summary.calls, summary.denied), (3, 1));
    assert!(!broker.log().contains(&token), "the token was logged");
    assert!(
        !guard.log.lock().unwrap().contains(&token),
        "the token was logged"
    );
}

#[tokio::test]
async fn wrong_absent_ended_or_expired_tokens_get_401() {
    let api = TestApi::start();
    api.respond("GET", "/items/abc", Reply::json(200, "{}"));
    let (broker, guard) = start(&api, &["GET /items/*"]).await;
    let (run, token) = open_guarded(&broker, 20_000).await;
    let call = || envelope("GET", "/items/abc");

    assert_unknown(&send(guard.addr, guard_request(None, call())).await);
    let unknown = format!("crg_{}", "0f".repeat(32));
    for wrong in [
        unknown.as_str(),
        "crg_",
        &token[..67],
        &token.to_uppercase(),
        &format!("Bearer {token}"),
    ] {
        assert_unknown(&send(guard.addr, guard_request(Some(wrong), call())).await);
    }
    // The header twice is not a token either.
    let twice = guard_request(Some(&token), call()).header("X-Plimsoll-Guard", &token);
    assert_unknown(&send(guard.addr, twice).await);
    assert!(api.requests().is_empty());

    // Live until its run ends, dead after.
    let answer = send(guard.addr, guard_request(Some(&token), call())).await;
    assert_eq!(answer.status, 200, "{}", answer.text());
    broker.client().close(&run).await.unwrap();
    assert_unknown(&send(guard.addr, guard_request(Some(&token), call())).await);
    assert_eq!(api.requests().len(), 1);

    // A run nobody closes dies at its deadline (the broker's 5 s grace after it).
    let (_, short) = open_guarded(&broker, 300).await;
    let deadline = Instant::now() + WAIT;
    loop {
        let answer = send(guard.addr, guard_request(Some(&short), call())).await;
        if answer.status == 401 {
            assert_unknown(&answer);
            break;
        }
        assert!(Instant::now() < deadline, "the token outlived its run");
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

#[tokio::test]
async fn bodies_over_two_mib_get_413_and_the_connection_closes() {
    let api = TestApi::start();
    let (broker, guard) = start(&api, &["POST /items"]).await;
    let (_, token) = open_guarded(&broker, 20_000).await;

    // Declared too large: refused before a byte of it is read.
    let declared = guard_request(Some(&token), Vec::new())
        .no_auto_length()
        .header("content-length", &(3 * 1024 * 1024).to_string());
    let answer = send(guard.addr, declared).await;
    assert_eq!(answer.status, 413, "{}", answer.text());
    assert!(answer.closes());

    // Undeclared (chunked) and too large: cut at 2 MiB while reading.
    let addr = guard.addr;
    let token_for_thread = token.clone();
    let answer = tokio::task::spawn_blocking(move || {
        let mut conn = Connection::open(addr);
        let head = Request::post(PATH)
            .header("X-Plimsoll-Guard", &token_for_thread)
            .header("transfer-encoding", "chunked")
            .no_auto_length()
            .head_bytes(addr);
        conn.send(&head).unwrap();
        let chunk = vec![b' '; 256 * 1024];
        for _ in 0..9 {
            let mut framed = format!("{:x}\r\n", chunk.len()).into_bytes();
            framed.extend_from_slice(&chunk);
            framed.extend_from_slice(b"\r\n");
            if conn.send(&framed).is_err() {
                break;
            }
        }
        let _ = conn.send(b"0\r\n\r\n");
        conn.read_response(false).unwrap()
    })
    .await
    .unwrap();
    assert_eq!(answer.status, 413, "{}", answer.text());
    assert!(api.requests().is_empty());
}

#[tokio::test]
async fn a_run_with_sixteen_requests_inside_gets_429_and_another_run_does_not() {
    let api = TestApi::start();
    api.respond(
        "GET",
        "/slow",
        Reply::json(200, "{}").with_delay(Duration::from_secs(4)),
    );
    api.respond("GET", "/items/abc", Reply::json(200, "{}"));
    let (broker, guard) = start(&api, &["GET /slow", "GET /items/*"]).await;
    let (_, busy) = open_guarded(&broker, 30_000).await;
    let (_, other) = open_guarded(&broker, 30_000).await;

    let inside: Vec<_> = (0..16)
        .map(|_| {
            let request = guard_request(Some(&busy), envelope("GET", "/slow"));
            tokio::spawn(send(guard.addr, request))
        })
        .collect();
    let deadline = Instant::now() + WAIT;
    while api.requests().len() < 16 {
        assert!(Instant::now() < deadline, "16 calls did not reach the API");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let answer = send(
        guard.addr,
        guard_request(Some(&busy), envelope("GET", "/items/abc")),
    )
    .await;
    assert_eq!(answer.status, 429, "{}", answer.text());
    assert_eq!(
        answer.json()["error"],
        "too many requests in flight for this guard credential"
    );
    // Another run's token is not held up by this one's.
    let answer = send(
        guard.addr,
        guard_request(Some(&other), envelope("GET", "/items/abc")),
    )
    .await;
    assert_eq!(answer.status, 200, "{}", answer.text());
    for call in inside {
        assert_eq!(call.await.unwrap().status, 200);
    }
    // Every place was given back: the busy token is served again.
    let answer = send(
        guard.addr,
        guard_request(Some(&busy), envelope("GET", "/items/abc")),
    )
    .await;
    assert_eq!(answer.status, 200, "{}", answer.text());
}

#[tokio::test]
async fn a_broker_that_is_down_gets_503() {
    let api = TestApi::start();
    let (mut broker, guard) = start(&api, &["GET /items/*"]).await;
    let (_, token) = open_guarded(&broker, 20_000).await;
    broker.child.kill().unwrap();
    broker.child.wait().unwrap();
    let answer = send(
        guard.addr,
        guard_request(Some(&token), envelope("GET", "/items/abc")),
    )
    .await;
    assert_eq!(answer.status, 503, "{}", answer.text());
    assert!(api.requests().is_empty());
}

#[tokio::test]
async fn any_other_method_path_or_query_is_404() {
    let api = TestApi::start();
    api.respond("GET", "/items/abc", Reply::json(200, "{}"));
    let (broker, guard) = start(&api, &["GET /items/*"]).await;
    let (_, token) = open_guarded(&broker, 20_000).await;
    let call = envelope("GET", "/items/abc");
    for (method, target) in [
        ("GET", PATH),
        ("PUT", PATH),
        ("DELETE", PATH),
        ("OPTIONS", PATH),
        ("OPTIONS", "*"),
        ("POST", "/v1/e2b/guard/"),
        ("POST", "/v1/e2b/guard/x"),
        ("POST", "/v1/e2b/guard?x=1"),
        ("POST", "/v1/e2b/guard?"),
        ("POST", "/V1/E2B/GUARD"),
        ("POST", "/"),
        ("GET", "/healthz"),
        ("GET", "/readyz"),
    ] {
        let request = Request::new(method, target)
            .header("X-Plimsoll-Guard", &token)
            .body(call.clone());
        let answer = send(guard.addr, request).await;
        assert_eq!(answer.status, 404, "{method} {target}: {}", answer.text());
    }
    assert!(api.requests().is_empty());
    let answer = send(guard.addr, guard_request(Some(&token), call)).await;
    assert_eq!(answer.status, 200, "{}", answer.text());
}

// === TLS ===

/// A CA, and a certificate for 127.0.0.1 it signed, written as PEM files in `dir`.
fn guard_certificate(dir: &Path) -> (rustls::pki_types::CertificateDer<'static>, PathBuf, PathBuf) {
    use rcgen::{BasicConstraints, CertificateParams, IsCa, KeyPair};
    let ca_key = KeyPair::generate().unwrap();
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca = ca_params.self_signed(&ca_key).unwrap();
    let leaf_key = KeyPair::generate().unwrap();
    let leaf = CertificateParams::new(vec!["127.0.0.1".to_owned()])
        .unwrap()
        .signed_by(&leaf_key, &ca, &ca_key)
        .unwrap();
    let (cert, key) = (dir.join("guard.pem"), dir.join("guard.key"));
    std::fs::write(&cert, leaf.pem()).unwrap();
    std::fs::write(&key, leaf_key.serialize_pem()).unwrap();
    (ca.der().clone(), cert, key)
}

/// A TLS connection to the guard offering only `alpn`; returns the protocol it chose.
async fn tls_connect(
    addr: SocketAddr,
    ca: &rustls::pki_types::CertificateDer<'static>,
    alpn: &[u8],
) -> (
    tokio_rustls::client::TlsStream<tokio::net::TcpStream>,
    Option<Vec<u8>>,
) {
    let mut roots = rustls::RootCertStore::empty();
    roots.add(ca.clone()).unwrap();
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = vec![alpn.to_vec()];
    let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let name = rustls::pki_types::ServerName::try_from("127.0.0.1").unwrap();
    let stream = connector.connect(name, tcp).await.unwrap();
    let chosen = stream.get_ref().1.alpn_protocol().map(<[u8]>::to_vec);
    (stream, chosen)
}

fn hyper_request(token: &str, body: Vec<u8>) -> http::Request<Full<bytes::Bytes>> {
    http::Request::post(format!("https://127.0.0.1{PATH}"))
        .header("x-plimsoll-guard", token)
        .header("content-type", "application/json")
        .body(Full::new(bytes::Bytes::from(body)))
        .unwrap()
}

#[tokio::test]
async fn tls_serves_h2_and_http1_by_alpn() {
    use hyper_util::rt::{TokioExecutor, TokioIo};
    let api = TestApi::start();
    api.respond("GET", "/items/abc", Reply::json(200, r#"{"id":"abc"}"#));
    let broker = Broker::start_with(
        &api,
        &grants(json!({"inv": jwt_profile(&api, "JWT_SECRET_A", &["GET /items/*"])})),
        true,
    )
    .await;
    let certs = tempfile::tempdir().unwrap();
    let (ca, cert, key) = guard_certificate(certs.path());
    let guard = GuardProcess::start(&broker, Some((&cert, &key))).await;
    let (_, token) = open_guarded(&broker, 20_000).await;

    // HTTP/2, chosen by ALPN.
    let (stream, chosen) = tls_connect(guard.addr, &ca, b"h2").await;
    assert_eq!(chosen.as_deref(), Some(&b"h2"[..]));
    let (mut sender, connection) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(stream))
            .await
            .unwrap();
    tokio::spawn(connection);
    let answer = sender
        .send_request(hyper_request(&token, envelope("GET", "/items/abc")))
        .await
        .unwrap();
    assert_eq!(answer.version(), http::Version::HTTP_2);
    assert_eq!(answer.status(), 200);
    let body = answer.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(&body[..], br#"{"id":"abc"}"#);

    // HTTP/1.1, chosen by ALPN.
    let (stream, chosen) = tls_connect(guard.addr, &ca, b"http/1.1").await;
    assert_eq!(chosen.as_deref(), Some(&b"http/1.1"[..]));
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .unwrap();
    tokio::spawn(connection);
    let mut request = hyper_request(&token, envelope("GET", "/items/abc"));
    request.headers_mut().insert(
        http::header::HOST,
        http::HeaderValue::from_static("127.0.0.1"),
    );
    let answer = sender.send_request(request).await.unwrap();
    assert_eq!(answer.version(), http::Version::HTTP_11);
    assert_eq!(answer.status(), 200);

    // Cleartext on a TLS listener gets no answer.
    let plain = tokio::task::spawn_blocking({
        let addr = guard.addr;
        move || {
            let mut conn = Connection::open(addr);
            let _ = conn.send(&Request::post(PATH).to_bytes(addr));
            conn.read_response(false).is_err()
        }
    })
    .await
    .unwrap();
    assert!(
        plain,
        "a cleartext request was answered on the TLS listener"
    );
    assert_eq!(api.requests().len(), 2);
}

#[tokio::test]
async fn a_session_token_serves_only_the_grant_lent_to_it() {
    let api = TestApi::start();
    api.respond("GET", "/items/abc", Reply::json(200, "{}"));
    let mut profile = jwt_profile(&api, "JWT_SECRET_A", &["GET /items/*"]);
    profile["allow_in_sessions"] = json!(true);
    let broker = Broker::start_with(&api, &grants(json!({"sess": profile})), true).await;
    let guard = GuardProcess::start(&broker, None).await;
    let client = broker.client();
    let open = OpenSession {
        session: fresh_run_id(),
        deadline_unix_ms: now_ms() + 60_000,
        delivery: Delivery::Guard,
    };
    let token = match client.open_session(&open).await.unwrap().unwrap().reach {
        Reach::GuardToken(token) => token,
        other => panic!("a guard session got {other:?}"),
    };
    let call = || guard_request(Some(&token), envelope("GET", "/items/abc"));

    // Nothing lent: 401, like a dead token.
    assert_unknown(&send(guard.addr, call()).await);
    // A lend must name the session's own delivery.
    let mut lend = lend_request("alice", "sess", &open.session);
    let refused = client.open(&lend).await.unwrap().unwrap_err();
    assert_eq!(
        refused.reason,
        RefusalReason::Request,
        "{}",
        refused.message
    );
    lend.delivery = Delivery::Guard;
    let grant = client.open(&lend).await.unwrap().unwrap();
    assert_eq!(grant.reach, Reach::SessionSlot);
    let answer = send(guard.addr, call()).await;
    assert_eq!(answer.status, 200, "{}", answer.text());
    let claims = decode_jwt(api.requests()[0].header("authorization").unwrap(), SECRET_A);
    assert_eq!(claims["sub"], "alice");
    // Taken back when the call ends: 401 between calls, with the same token.
    client.close(&lend.run).await.unwrap();
    assert_unknown(&send(guard.addr, call()).await);
    let next = OpenRun {
        delivery: Delivery::Guard,
        ..lend_request("alice", "sess", &open.session)
    };
    client.open(&next).await.unwrap().unwrap();
    assert_eq!(send(guard.addr, call()).await.status, 200);
    // The session's end kills the token, and the call lent to it.
    client.close_session(&open.session).await.unwrap();
    assert_unknown(&send(guard.addr, call()).await);
    assert_eq!(api.requests().len(), 2);
}

/// A call lent to a guard session slot with `call_token` gets a token of its own
/// (`E2B_SESSION_GRANTS=call`): it serves that call only (401 once the call closes, and in
/// the next call, which gets another), the session's own token is never handed out for it,
/// the session's route caps still count across calls, and a call token is refused for a run
/// that is not lent to a guard slot.
#[tokio::test]
async fn a_lent_call_may_get_a_token_of_its_own_that_dies_with_the_call() {
    let api = TestApi::start();
    api.respond("GET", "/items/abc", Reply::json(200, "{}"));
    let mut profile = jwt_profile(&api, "JWT_SECRET_A", &["GET /items/*"]);
    profile["allow_in_sessions"] = json!(true);
    profile["route_max_calls"] = json!({ "GET /items/*": 2 });
    let broker = Broker::start_with(&api, &grants(json!({"sess": profile})), true).await;
    let guard = GuardProcess::start(&broker, None).await;
    let client = broker.client();
    let open = OpenSession {
        session: fresh_run_id(),
        deadline_unix_ms: now_ms() + 60_000,
        delivery: Delivery::Guard,
    };
    let Reach::GuardToken(session_token) = client.open_session(&open).await.unwrap().unwrap().reach
    else {
        panic!("a guard session got no token");
    };
    let call = |token: &str| guard_request(Some(token), envelope("GET", "/items/abc"));
    // Not lent, or not guard-delivered: no call token.
    let unlent = OpenRun {
        delivery: Delivery::Guard,
        call_token: true,
        ..open_request("alice", "sess", 20_000)
    };
    let refused = client.open(&unlent).await.unwrap().unwrap_err();
    assert_eq!(
        refused.reason,
        RefusalReason::Request,
        "{}",
        refused.message
    );
    let mut seen: Vec<String> = Vec::new();
    for n in 0..2 {
        let lend = OpenRun {
            delivery: Delivery::Guard,
            call_token: true,
            ..lend_request("alice", "sess", &open.session)
        };
        let grant = client.open(&lend).await.unwrap().unwrap();
        let Reach::GuardToken(token) = grant.reach else {
            panic!(
                "call {n}: a call token was asked for, got {:?}",
                grant.reach
            );
        };
        assert_ne!(token, session_token, "call {n}");
        assert!(!seen.contains(&token), "call {n} reused a token");
        let answer = send(guard.addr, call(&token)).await;
        assert_eq!(answer.status, 200, "call {n}: {}", answer.text());
        for old in &seen {
            assert_unknown(&send(guard.addr, call(old)).await);
        }
        client.close(&lend.run).await.unwrap();
        assert_unknown(&send(guard.addr, call(&token)).await);
        seen.push(token);
    }
    // Both calls counted against the session's cap: a third call is capped, whatever its token.
    let lend = OpenRun {
        delivery: Delivery::Guard,
        call_token: true,
        ..lend_request("alice", "sess", &open.session)
    };
    let Reach::GuardToken(token) = client.open(&lend).await.unwrap().unwrap().reach else {
        panic!("no call token");
    };
    assert_eq!(send(guard.addr, call(&token)).await.status, 429);
    client.close_session(&open.session).await.unwrap();
    assert_unknown(&send(guard.addr, call(&token)).await);
    assert_eq!(api.requests().len(), 2);
}

#[tokio::test]
async fn a_restarted_guard_loses_no_run() {
    let api = TestApi::start();
    api.respond("GET", "/items/abc", Reply::json(200, "{}"));
    let (broker, guard) = start(&api, &["GET /items/*"]).await;
    let (_, token) = open_guarded(&broker, 20_000).await;
    let call = || guard_request(Some(&token), envelope("GET", "/items/abc"));
    assert_eq!(send(guard.addr, call()).await.status, 200);
    drop(guard);
    // Tokens live with the broker: a new guard process serves the same run.
    let guard = GuardProcess::start(&broker, None).await;
    let answer = send(guard.addr, call()).await;
    assert_eq!(answer.status, 200, "{}", answer.text());
    assert_eq!(api.requests().len(), 2);
}

/// Opens a connection and sends a guard request's head declaring `declared` body bytes, then
/// `sent` of them, and leaves the connection open: a slow body.
fn slow_body(addr: SocketAddr, token: &str, declared: usize, sent: usize) -> Connection {
    let mut conn = Connection::open(addr);
    let head = Request::post(PATH)
        .header("X-Plimsoll-Guard", token)
        .header("content-length", &declared.to_string())
        .no_auto_length()
        .head_bytes(addr);
    conn.send(&head).unwrap();
    conn.send(&vec![b' '; sent]).unwrap();
    conn
}

#[tokio::test]
async fn slow_bodies_hold_the_decode_slots_then_get_413_and_others_are_shed_meanwhile() {
    let api = TestApi::start();
    api.respond("GET", "/items/abc", Reply::json(200, "{}"));
    let broker = Broker::start_with(
        &api,
        &grants(json!({"inv": jwt_profile(&api, "JWT_SECRET_A", &["GET /items/*"])})),
        true,
    )
    .await;
    // A run cap of 1: two decode slots for the whole guard.
    let guard = GuardProcess::start_env(&broker, None, &[("SANDBOX_MAX_CONCURRENT", "1")]).await;
    let (_, first) = open_guarded(&broker, 30_000).await;
    let (_, second) = open_guarded(&broker, 30_000).await;
    let (_, third) = open_guarded(&broker, 30_000).await;
    let addr = guard.addr;
    let started = Instant::now();
    // Both slow bodies are under way before the first probe, so a probe cannot take a slot
    // between them (that slow body would be shed, and nothing would hold the second slot).
    let mut held = Vec::new();
    for token in [first, second] {
        held.push(
            tokio::task::spawn_blocking(move || slow_body(addr, &token, 100, 10))
                .await
                .unwrap(),
        );
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let slow: Vec<_> = held
        .into_iter()
        .map(|mut conn| tokio::task::spawn_blocking(move || conn.read_response(false).unwrap()))
        .collect();
    // While both slots are held, a third run's call is shed at once.
    let deadline = Instant::now() + WAIT;
    let shed = loop {
        let answer = send(
            addr,
            guard_request(Some(&third), envelope("GET", "/items/abc")),
        )
        .await;
        if answer.status == 503 {
            break answer;
        }
        assert_eq!(answer.status, 200, "{}", answer.text());
        assert!(Instant::now() < deadline, "nothing was shed");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(shed.header("retry-after"), Some("1"));
    for answer in slow {
        let answer = answer.await.unwrap();
        assert_eq!(answer.status, 413, "{}", answer.text());
    }
    assert!(
        started.elapsed() >= Duration::from_secs(9),
        "a slow body was cut after {:?}, before its 10 s",
        started.elapsed()
    );
    // Nothing leaked: the slots are free again.
    let answer = send(
        addr,
        guard_request(Some(&third), envelope("GET", "/items/abc")),
    )
    .await;
    assert_eq!(answer.status, 200, "{}", answer.text());
}

#[test]
fn a_hardened_guard_refuses_a_cleartext_listener_off_loopback() {
    let output = Command::new(plimsoll_tests::binary("guard"))
        .env_clear()
        .env("PLIMSOLL_GUARD_ADDR", "0.0.0.0:0")
        .env("PLIMSOLL_BROKER_GUARD_SOCKET", "/nonexistent/guard.sock")
        .env("PLIMSOLL_HARDENED", "1")
        .output()
        .unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("hardened mode"), "{stderr}");
}
