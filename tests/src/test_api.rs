//! A stand-in for an operator's HTTPS API, for grant tests: it records every request it
//! gets and answers what the test configured.
//!
//! [`TestApi::start`] makes a fresh CA with `rcgen`, signs a certificate for `127.0.0.1`
//! and `localhost`, and serves HTTP/1.1 over rustls on a free loopback port, on its own
//! thread and runtime (so sync and async tests can both use it). Point the broker at it
//! with `base_url` = [`TestApi::base_url`] and `PLIMSOLL_BROKER_CA_FILE` =
//! [`TestApi::ca_file`]. Routes are matched on method and the exact request target;
//! anything unconfigured gets 404 `{"error":"no such route"}`. The server stops when the
//! value is dropped.

use std::collections::HashMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tokio::sync::oneshot;

/// One request as the API received it.
#[derive(Debug, Clone)]
pub struct Recorded {
    /// The method.
    pub method: String,
    /// The request target exactly as received (path and any query).
    pub target: String,
    /// Every header, names lower-cased, in order.
    pub headers: Vec<(String, String)>,
    /// The body.
    pub body: Vec<u8>,
}

impl Recorded {
    /// The first value of header `name` (lower-case), if any.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }
}

/// What the API answers on one route.
#[derive(Debug, Clone)]
pub struct Reply {
    /// Status code.
    pub status: u16,
    /// `Content-Type` (omitted when empty).
    pub content_type: String,
    /// Body.
    pub body: Vec<u8>,
    /// Wait this long (after recording the request) before answering.
    pub delay: Duration,
    /// A `Retry-After` value, if any.
    pub retry_after: Option<String>,
}

impl Reply {
    /// A JSON answer.
    pub fn json(status: u16, body: &str) -> Self {
        Self {
            status,
            content_type: "application/json".into(),
            body: body.as_bytes().to_vec(),
            delay: Duration::ZERO,
            retry_after: None,
        }
    }

    /// The same answer after `delay`.
    pub fn with_delay(mut self, delay: Duration) -> Self {
        self.delay = delay;
        self
    }

    /// The same answer with `Retry-After: value`.
    pub fn with_retry_after(mut self, value: &str) -> Self {
        self.retry_after = Some(value.to_owned());
        self
    }
}

#[derive(Default)]
struct State {
    replies: HashMap<(String, String), Reply>,
    requests: Vec<Recorded>,
}

/// A running test API. Stops when dropped.
pub struct TestApi {
    addr: SocketAddr,
    _dir: tempfile::TempDir,
    ca_file: PathBuf,
    ca_pem: String,
    state: Arc<Mutex<State>>,
    stop: Option<oneshot::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl TestApi {
    /// Makes the CA and certificate, binds a free loopback port and starts serving.
    pub fn start() -> Self {
        let (ca_pem, server_config) = make_tls();
        let dir = tempfile::tempdir().unwrap();
        let ca_file = dir.path().join("test-ca.pem");
        std::fs::write(&ca_file, &ca_pem).unwrap();
        let state = Arc::new(Mutex::new(State::default()));
        let (stop, stopped) = oneshot::channel();
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let served = state.clone();
        let thread = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
                .unwrap();
            runtime.block_on(serve(server_config, served, ready_tx, stopped));
        });
        let addr = ready_rx
            .recv_timeout(Duration::from_secs(10))
            .expect("the test API did not start");
        Self {
            addr,
            _dir: dir,
            ca_file,
            ca_pem,
            state,
            stop: Some(stop),
            thread: Some(thread),
        }
    }

    /// `https://127.0.0.1:<port>`: a grants-file `base_url`.
    pub fn base_url(&self) -> String {
        format!("https://{}", self.addr)
    }

    /// The bound address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Path of the CA certificate (PEM), for `PLIMSOLL_BROKER_CA_FILE`.
    pub fn ca_file(&self) -> &Path {
        &self.ca_file
    }

    /// The CA certificate (PEM).
    pub fn ca_pem(&self) -> &str {
        &self.ca_pem
    }

    /// Answers `method target` with `reply` from now on.
    pub fn respond(&self, method: &str, target: &str, reply: Reply) {
        self.state
            .lock()
            .unwrap()
            .replies
            .insert((method.to_owned(), target.to_owned()), reply);
    }

    /// Every request received so far, in order.
    pub fn requests(&self) -> Vec<Recorded> {
        self.state.lock().unwrap().requests.clone()
    }

    /// Forgets the requests received so far.
    pub fn clear_requests(&self) {
        self.state.lock().unwrap().requests.clear();
    }
}

impl Drop for TestApi {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// A fresh CA and a server config whose certificate it signed.
fn make_tls() -> (String, Arc<rustls::ServerConfig>) {
    use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, KeyPair};
    let ca_key = KeyPair::generate().unwrap();
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params
        .distinguished_name
        .push(DnType::CommonName, "plimsoll test CA");
    let ca = ca_params.self_signed(&ca_key).unwrap();
    let leaf_key = KeyPair::generate().unwrap();
    let leaf_params =
        CertificateParams::new(vec!["127.0.0.1".to_owned(), "localhost".to_owned()]).unwrap();
    let leaf = leaf_params.signed_by(&leaf_key, &ca, &ca_key).unwrap();
    let key = rustls::pki_types::PrivateKeyDer::Pkcs8(leaf_key.serialize_der().into());
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(vec![leaf.der().clone()], key)
        .unwrap();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    (ca.pem(), Arc::new(config))
}

async fn serve(
    config: Arc<rustls::ServerConfig>,
    state: Arc<Mutex<State>>,
    ready: std::sync::mpsc::Sender<SocketAddr>,
    mut stopped: oneshot::Receiver<()>,
) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    ready.send(listener.local_addr().unwrap()).unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(config);
    loop {
        let (tcp, _) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                Err(_) => continue,
            },
            _ = &mut stopped => return,
        };
        let acceptor = acceptor.clone();
        let state = state.clone();
        // Small answers go out at once: Nagle's wait on the client's delayed ACK would add
        // 40 ms to some calls, noise in every latency the benchmarks take through here.
        let _ = tcp.set_nodelay(true);
        tokio::spawn(async move {
            let Ok(tls) = acceptor.accept(tcp).await else {
                return;
            };
            let service = service_fn(move |request| {
                let state = state.clone();
                async move { Ok::<_, Infallible>(answer(request, &state).await) }
            });
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(tls), service)
                .await;
        });
    }
}

async fn answer(request: Request<Incoming>, state: &Mutex<State>) -> Response<Full<Bytes>> {
    let method = request.method().as_str().to_owned();
    let target = request.uri().to_string();
    let headers = request
        .headers()
        .iter()
        .map(|(n, v)| {
            (
                n.as_str().to_owned(),
                String::from_utf8_lossy(v.as_bytes()).into_owned(),
            )
        })
        .collect();
    let body = match request.into_body().collect().await {
        Ok(body) => body.to_bytes().to_vec(),
        Err(_) => Vec::new(),
    };
    let reply = {
        let mut state = state.lock().unwrap();
        state.requests.push(Recorded {
            method: method.clone(),
            target: target.clone(),
            headers,
            body,
        });
        state.replies.get(&(method, target)).cloned()
    };
    let reply = reply.unwrap_or_else(|| Reply::json(404, r#"{"error":"no such route"}"#));
    if !reply.delay.is_zero() {
        tokio::time::sleep(reply.delay).await;
    }
    let mut response = Response::builder().status(reply.status);
    if !reply.content_type.is_empty() {
        response = response.header("content-type", reply.content_type);
    }
    if let Some(retry_after) = reply.retry_after {
        response = response.header("retry-after", retry_after);
    }
    response.body(Full::new(Bytes::from(reply.body))).unwrap()
}
