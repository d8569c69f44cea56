//! Attacks on the daemon from outside, one file per attack, each against a real
//! `plimsolld` on loopback (docs/security.md lists what each file covers and what it
//! does not). Attacks from inside a sandbox live with their provider's suite
//! (`tests/docker/hostile.rs`, `tests/wasm.rs`).
//!
//! The transport attacks speak raw HTTP/2 ([`plimsoll_tests::h2_frames`]) because a
//! library client will not misbehave on request, and each runs on the cleartext (h2c)
//! listener and on the TLS listener alike. Every test opens a bounded number of
//! connections, sends a bounded number of frames and waits a bounded time.
// A test fails by panicking, with the evidence in the message.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod connection_cap;
mod h2_floods;
mod h2_limits;
mod idle_connections;

use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;
use std::time::Duration;

use plimsoll_tests::Daemon;
use plimsoll_tests::connect::{PROTOCOL, SERVICE_PREFIX};
use plimsoll_tests::h2_frames::{self, H2, flag, kind};
use rustls::pki_types::{CertificateDer, ServerName};
use rustls::{ClientConfig, ClientConnection, RootCertStore, StreamOwned};

/// The daemon's bounds these tests judge (plimsolld/src/server/connections.rs and
/// connection.rs): an anonymous connection's idle time, an authenticated one's, the
/// keep-alive ping's interval and timeout, the grace a closing connection gets.
const ANONYMOUS_IDLE: Duration = Duration::from_secs(10);
const IDLE_TIMEOUT: Duration = Duration::from_secs(120);
const KEEP_ALIVE_INTERVAL: Duration = Duration::from_secs(20);
const KEEP_ALIVE_TIMEOUT: Duration = Duration::from_secs(10);
const CLOSE_GRACE: Duration = Duration::from_secs(1);
/// How long an ended connection keeps its slot (plimsolld/src/server/socket.rs).
const LINGER: Duration = Duration::from_millis(500);
/// Slack on every "closed by" deadline: a loaded CI machine, a debug build.
const SLACK: Duration = Duration::from_secs(5);

/// Which listener a test attacks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Transport {
    /// Prior-knowledge HTTP/2 over cleartext.
    H2c,
    /// HTTP/2 over TLS (ALPN `h2`), with `PLIMSOLL_TLS_CERT` and `PLIMSOLL_TLS_KEY`.
    Tls,
}

impl Transport {
    const ALL: [Transport; 2] = [Transport::H2c, Transport::Tls];
}

/// A daemon under attack, and how to reach it.
struct Target {
    daemon: Daemon,
    transport: Transport,
    tls: Option<(tempfile::TempDir, Arc<ClientConfig>)>,
}

impl Target {
    /// Starts `plimsolld` with `env` for `transport` (TLS adds a fresh certificate).
    fn start(transport: Transport, env: &[(&str, &str)]) -> Target {
        Target::start_with(transport, env, Daemon::start)
    }

    /// Starts the daemon through `launch`, with `env` plus what `transport` needs.
    fn start_with(
        transport: Transport,
        env: &[(&str, &str)],
        launch: impl FnOnce(&[(&str, &str)]) -> Daemon,
    ) -> Target {
        match transport {
            Transport::H2c => Target {
                daemon: launch(env),
                transport,
                tls: None,
            },
            Transport::Tls => {
                let (dir, der) = certificate();
                let cert = dir.path().join("cert.pem").display().to_string();
                let key = dir.path().join("key.pem").display().to_string();
                let mut full = env.to_vec();
                full.push(("PLIMSOLL_TLS_CERT", &cert));
                full.push(("PLIMSOLL_TLS_KEY", &key));
                let daemon = launch(&full);
                Target {
                    daemon,
                    transport,
                    tls: Some((dir, client_config(der))),
                }
            }
        }
    }

    fn addr(&self) -> SocketAddr {
        self.daemon.addr
    }

    /// A new raw HTTP/2 connection: preface and empty SETTINGS sent, nothing read.
    fn connect(&self) -> H2 {
        self.try_connect()
            .unwrap_or_else(|| panic!("{:?}: the connection was refused", self.transport))
    }

    /// [`Target::connect`], or `None` when the daemon closes the connection during the
    /// TLS handshake.
    fn try_connect(&self) -> Option<H2> {
        let tcp = TcpStream::connect(self.addr()).expect("connect");
        let Some((_, config)) = &self.tls else {
            return Some(H2::over(Box::new(tcp)));
        };
        let name = ServerName::try_from("127.0.0.1").expect("name");
        let conn = ClientConnection::new(config.clone(), name).expect("client");
        let mut stream = StreamOwned::new(conn, tcp);
        stream
            .sock
            .set_read_timeout(Some(Duration::from_secs(10)))
            .expect("timeout");
        while stream.conn.is_handshaking() {
            if stream.conn.complete_io(&mut stream.sock).is_err() {
                return None;
            }
        }
        assert_eq!(stream.conn.alpn_protocol(), Some(&b"h2"[..]));
        Some(H2::over(Box::new(stream)))
    }

    /// [`Target::connect`], then the SETTINGS exchange.
    fn handshaken(&self) -> H2 {
        let mut h2 = self.connect();
        h2.handshake();
        h2
    }

    /// The log lines so far that contain `needle`.
    fn log_count(&self, needle: &str) -> usize {
        self.daemon
            .logs()
            .iter()
            .filter(|l| l.contains(needle))
            .count()
    }

    /// How many log lines contain `needle`, once at least one does (the log is read
    /// from the daemon's stderr by another thread, a moment after it is written); 0 if
    /// none has after two seconds.
    fn logged(&self, needle: &str) -> usize {
        self.logged_at_least(needle, 1)
    }

    /// How many log lines contain `needle`, once at least `n` do (or after two seconds).
    fn logged_at_least(&self, needle: &str, n: usize) -> usize {
        let deadline = std::time::Instant::now() + Duration::from_secs(2);
        loop {
            let seen = self.log_count(needle);
            if seen >= n || std::time::Instant::now() > deadline {
                return seen;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// `/healthz` answers 200 over a new connection (the daemon is unharmed).
    fn assert_serving(&self) {
        let mut h2 = self.handshaken();
        let status = exchange(&mut h2, 1, "GET", "/healthz", &[], None);
        assert_eq!(
            status,
            Some(200),
            "{:?}: /healthz after the attack",
            self.transport
        );
    }
}

/// A self-signed certificate for 127.0.0.1, as PEM files in a fresh directory.
fn certificate() -> (tempfile::TempDir, CertificateDer<'static>) {
    let key = rcgen::generate_simple_self_signed(vec!["127.0.0.1".to_owned()]).expect("cert");
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(dir.path().join("cert.pem"), key.cert.pem()).expect("write cert");
    std::fs::write(dir.path().join("key.pem"), key.key_pair.serialize_pem()).expect("write key");
    (dir, key.cert.der().clone())
}

/// A client that trusts only `cert` and offers only `h2`.
fn client_config(cert: CertificateDer<'static>) -> Arc<ClientConfig> {
    let mut roots = RootCertStore::empty();
    roots.add(cert).expect("root");
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .expect("versions")
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = vec![b"h2".to_vec()];
    Arc::new(config)
}

/// Sends one request on `stream` (with `body` as one DATA frame, if any) and waits for
/// its answer's `:status`, answering pings meanwhile; `None` when the stream is reset
/// or the connection ends first.
fn exchange(
    h2: &mut H2,
    stream: u32,
    method: &str,
    path: &str,
    extra: &[(&str, &str)],
    body: Option<&[u8]>,
) -> Option<u16> {
    let block = h2_frames::request(method, path, extra);
    h2.send(&h2_frames::headers(stream, &block, body.is_none()));
    if let Some(body) = body {
        h2.send(&h2_frames::frame(
            kind::DATA,
            flag::END_STREAM,
            stream,
            body,
        ));
    }
    answer_status(h2, stream)
}

/// Waits for `stream`'s answer and returns its `:status` (pings are answered).
fn answer_status(h2: &mut H2, stream: u32) -> Option<u16> {
    loop {
        let f = h2.wait_for(Duration::from_secs(20), |f| {
            f.stream == stream || f.kind == kind::PING || f.kind == kind::GOAWAY
        })?;
        match f.kind {
            kind::HEADERS => return h2_frames::status(&f.payload),
            kind::PING if f.flags & flag::ACK == 0 => {
                let payload: [u8; 8] = f.payload.clone().try_into().expect("8 bytes");
                h2.send(&h2_frames::ping(payload, true));
            }
            kind::RST_STREAM | kind::GOAWAY => return None,
            _ => {}
        }
    }
}

/// Reads `stream`'s answer to its end (END_STREAM or a reset): its status and body.
fn answer(h2: &mut H2, stream: u32) -> (Option<u16>, Vec<u8>) {
    let status = answer_status(h2, stream);
    let mut body = Vec::new();
    while let Some(f) = h2.wait_for(Duration::from_secs(20), |f| f.stream == stream) {
        if f.kind == kind::DATA {
            body.extend_from_slice(&f.payload);
        }
        if f.flags & flag::END_STREAM != 0 || f.kind == kind::RST_STREAM {
            break;
        }
    }
    (status, body)
}

/// The header fields of a Connect JSON call to `procedure` as `token` (none: anonymous).
fn connect_call(token: Option<&str>) -> Vec<(&'static str, String)> {
    let mut fields = vec![
        ("content-type", "application/json".to_owned()),
        ("connect-protocol-version", "1".to_owned()),
    ];
    if let Some(t) = token {
        fields.push(("authorization", format!("Bearer {t}")));
    }
    fields
}

/// The path of `procedure`.
fn procedure(name: &str) -> String {
    format!("{SERVICE_PREFIX}{name}")
}

/// A Connect JSON `Run` body for `code`.
fn run_body(code: &str) -> Vec<u8> {
    serde_json::json!({"protocol": PROTOCOL, "javascript": {"code": code}})
        .to_string()
        .into_bytes()
}

/// Borrowed `(name, value)` pairs of `fields`.
fn borrowed<'a>(fields: &'a [(&'static str, String)]) -> Vec<(&'static str, &'a str)> {
    fields.iter().map(|(n, v)| (*n, v.as_str())).collect()
}
