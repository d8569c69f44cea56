//! TLS on every listener (config.md §2.1, §4): with `PLIMSOLL_TLS_CERT` and
//! `PLIMSOLL_TLS_KEY` set, the RPC and metrics listeners speak TLS 1.2+ only,
//! negotiate `h2` or `http/1.1` by ALPN, and serve the same answers.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;
use std::time::Duration;

use plimsoll_tests::Daemon;
use plimsoll_tests::connect::{PROTOCOL, request_id};
use rustls::pki_types::{CertificateDer, ServerName};
use rustls::{ClientConfig, ClientConnection, RootCertStore, StreamOwned};

/// A self-signed certificate for 127.0.0.1, written where the daemon can read it.
struct Cert {
    dir: tempfile::TempDir,
    der: CertificateDer<'static>,
}

impl Cert {
    fn new() -> Cert {
        let key = rcgen::generate_simple_self_signed(vec!["127.0.0.1".to_owned()]).expect("cert");
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::write(dir.path().join("cert.pem"), key.cert.pem()).expect("write cert");
        std::fs::write(dir.path().join("key.pem"), key.key_pair.serialize_pem())
            .expect("write key");
        Cert {
            der: key.cert.der().clone(),
            dir,
        }
    }

    fn path(&self, name: &str) -> String {
        self.dir.path().join(name).display().to_string()
    }

    fn start(&self) -> Daemon {
        Daemon::start(&[
            ("PLIMSOLL_TLS_CERT", &self.path("cert.pem")),
            ("PLIMSOLL_TLS_KEY", &self.path("key.pem")),
        ])
    }

    /// A TLS connection to `addr` that trusts only this certificate and offers `alpn`.
    fn connect(&self, addr: SocketAddr, alpn: &[&str]) -> StreamOwned<ClientConnection, TcpStream> {
        let mut roots = RootCertStore::empty();
        roots.add(self.der.clone()).expect("root");
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut config = ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .expect("versions")
            .with_root_certificates(roots)
            .with_no_client_auth();
        config.alpn_protocols = alpn.iter().map(|p| p.as_bytes().to_vec()).collect();
        let name = ServerName::try_from("127.0.0.1").expect("name");
        let conn = ClientConnection::new(Arc::new(config), name).expect("client");
        let tcp = TcpStream::connect(addr).expect("connect");
        tcp.set_read_timeout(Some(Duration::from_secs(10)))
            .expect("timeout");
        let mut stream = StreamOwned::new(conn, tcp);
        // Drive the handshake so ALPN is settled before the caller looks.
        while stream.conn.is_handshaking() {
            stream
                .conn
                .complete_io(&mut stream.sock)
                .expect("handshake");
        }
        stream
    }
}

/// Sends one HTTP/1.1 request and reads the whole answer (the request asks to close).
fn exchange(stream: &mut StreamOwned<ClientConnection, TcpStream>, request: &str) -> String {
    stream.write_all(request.as_bytes()).expect("send");
    let mut out = Vec::new();
    let _ = stream.read_to_end(&mut out);
    String::from_utf8_lossy(&out).into_owned()
}

#[test]
fn rpc_listener_serves_connect_over_tls_with_http1_alpn() {
    let cert = Cert::new();
    let d = cert.start();
    assert_eq!(d.listening["tls"], true, "{}", d.listening);
    let mut s = cert.connect(d.addr, &["http/1.1"]);
    assert_eq!(s.conn.alpn_protocol(), Some(&b"http/1.1"[..]));
    let id = request_id();
    let body = "{}";
    let answer = exchange(
        &mut s,
        &format!(
            "POST /plimsoll.v1.SandboxService/Describe HTTP/1.1\r\nHost: 127.0.0.1\r\n\
             Content-Type: application/json\r\nPlimsoll-Request-Id: {id}\r\n\
             Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        ),
    );
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert!(
        answer
            .to_ascii_lowercase()
            .contains(&format!("plimsoll-request-id: {id}")),
        "{answer}"
    );
    assert!(
        answer.contains(&format!("\"protocol\":{PROTOCOL}")),
        "{answer}"
    );
}

#[test]
fn alpn_offers_h2() {
    let cert = Cert::new();
    let d = cert.start();
    let s = cert.connect(d.addr, &["h2", "http/1.1"]);
    assert_eq!(s.conn.alpn_protocol(), Some(&b"h2"[..]));
}

#[test]
fn cleartext_is_not_served_when_tls_is_on() {
    let cert = Cert::new();
    let d = cert.start();
    let mut tcp = TcpStream::connect(d.addr).expect("connect");
    tcp.set_read_timeout(Some(Duration::from_secs(10)))
        .expect("timeout");
    tcp.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .expect("send");
    let mut out = Vec::new();
    let _ = tcp.read_to_end(&mut out);
    assert!(
        !out.starts_with(b"HTTP/1.1 200"),
        "cleartext got an answer: {:?}",
        String::from_utf8_lossy(&out)
    );
}

#[test]
fn metrics_listener_uses_tls_too() {
    let cert = Cert::new();
    let d = cert.start();
    let addr = d.metrics_addr.expect("metrics listener on");
    let mut s = cert.connect(addr, &["http/1.1"]);
    let answer = exchange(
        &mut s,
        "GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n",
    );
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert!(answer.contains("plimsoll_runs_total"), "{answer}");
}

#[test]
fn unreadable_key_stops_startup_naming_tls() {
    let cert = Cert::new();
    let out = Daemon::refuse(&[
        ("PLIMSOLL_TLS_CERT", &cert.path("cert.pem")),
        ("PLIMSOLL_TLS_KEY", &cert.path("missing.pem")),
    ]);
    assert_eq!(out.code(), 1);
    assert!(
        out.stderr.contains("invalid TLS configuration"),
        "{}",
        out.stderr
    );
}
