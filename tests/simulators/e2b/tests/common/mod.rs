//! What the simulator's suites share: a simulator per test (the binary cargo built, under the
//! runtime `PLIMSOLL_TEST_DOCKER_RUNTIME` names, runc by default), a raw HTTP/1.1 client that
//! shares no code with the simulator, and Connect framing read back byte by byte.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use base64::Engine as _;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use serde_json::{Value, json};

pub use e2b_simulator::process::SimulatorProcess;

pub const TEMPLATE_IMAGE: &str = "plimsoll-sim/e2b-base:latest";

/// `runc` or `runsc`.
pub fn runtime() -> &'static str {
    match std::env::var("PLIMSOLL_TEST_DOCKER_RUNTIME").as_deref() {
        Ok("") | Ok("runc") | Err(_) => "runc",
        Ok("runsc") => "runsc",
        Ok(other) => panic!("PLIMSOLL_TEST_DOCKER_RUNTIME={other:?}: use runc or runsc"),
    }
}

/// Whether docker and the template are here; a missing one fails the test unless
/// `PLIMSOLL_TEST_DOCKER_SKIP=1` (never in CI).
fn ready() -> bool {
    let ok = |args: &[&str]| {
        Command::new("docker")
            .args(args)
            .output()
            .is_ok_and(|o| o.status.success())
    };
    let problem = if !ok(&["version"]) {
        Some("docker does not answer; run scripts/setup-docker".to_owned())
    } else if !ok(&["image", "inspect", TEMPLATE_IMAGE]) {
        Some(format!(
            "{TEMPLATE_IMAGE} is missing; run scripts/setup-e2b-simulator"
        ))
    } else {
        None
    };
    let Some(problem) = problem else { return true };
    if std::env::var("PLIMSOLL_TEST_DOCKER_SKIP").as_deref() == Ok("1") {
        eprintln!("PLIMSOLL_TEST_DOCKER_SKIP=1: skipping: {problem}");
        return false;
    }
    panic!("{problem} (PLIMSOLL_TEST_DOCKER_SKIP=1 skips on a developer machine)");
}

/// A simulator for one test, stopped (VMs removed) when dropped.
pub struct Sim {
    pub process: SimulatorProcess,
}

/// One HTTP answer.
#[derive(Debug)]
pub struct Reply {
    pub status: u16,
    pub headers: http::HeaderMap,
    /// The body, or why reading it failed (a dropped stream).
    pub body: Result<Bytes, String>,
}

impl Reply {
    pub fn json(&self) -> Value {
        serde_json::from_slice(self.body.as_ref().expect("a body")).expect("a JSON body")
    }

    pub fn text(&self) -> String {
        String::from_utf8_lossy(self.body.as_ref().expect("a body")).into_owned()
    }

    pub fn header(&self, name: &str) -> Option<String> {
        self.headers
            .get(name)
            .map(|v| v.to_str().unwrap().to_owned())
    }
}

impl Sim {
    /// A simulator with `args`, or `None` when docker tests are skipped.
    pub fn start(args: &[&str]) -> Option<Sim> {
        if !ready() {
            return None;
        }
        let mut all = vec!["--runtime", runtime()];
        all.extend_from_slice(args);
        let process = SimulatorProcess::spawn(Path::new(env!("CARGO_BIN_EXE_e2b-simulator")), &all)
            .expect("the simulator starts");
        assert_eq!(process.runtime, runtime());
        Some(Sim { process })
    }

    pub async fn api(&self, method: &str, path: &str, body: Option<Value>) -> Reply {
        let key = self.process.api_key.clone();
        self.api_as(Some(&key), method, path, body).await
    }

    pub async fn api_as(
        &self,
        key: Option<&str>,
        method: &str,
        path: &str,
        body: Option<Value>,
    ) -> Reply {
        let mut headers = vec![];
        if let Some(key) = key {
            headers.push(("X-API-Key".to_owned(), key.to_owned()));
        }
        let bytes = body.map(|b| b.to_string().into_bytes()).unwrap_or_default();
        if !bytes.is_empty() {
            headers.push(("Content-Type".to_owned(), "application/json".to_owned()));
        }
        request(&self.process.api_url, method, path, &headers, bytes).await
    }

    /// The status of a control-plane call without a body.
    pub async fn status(&self, method: &str, path: &str) -> u16 {
        self.api(method, path, None).await.status
    }

    /// Creates a sandbox (201 asserted); the `Sandbox` answer.
    pub async fn create(&self, body: Value) -> Value {
        let reply = self.api("POST", "/v2/sandboxes", Some(body)).await;
        assert_eq!(reply.status, 201, "create: {:?}", reply.body);
        reply.json()
    }

    /// An envd call for `sandbox` routed like E2B's SDK does with `E2B_SANDBOX_URL`.
    pub async fn envd(
        &self,
        sandbox: &Value,
        method: &str,
        path: &str,
        extra: &[(&str, &str)],
        body: Vec<u8>,
    ) -> Reply {
        let mut headers = vec![
            ("E2b-Sandbox-Id".to_owned(), sid(sandbox)),
            ("E2b-Sandbox-Port".to_owned(), "49983".to_owned()),
        ];
        if let Some(token) = sandbox["envdAccessToken"].as_str() {
            headers.push(("X-Access-Token".to_owned(), token.to_owned()));
        }
        for (name, value) in extra {
            headers.retain(|(n, _)| !n.eq_ignore_ascii_case(name));
            if !value.is_empty() {
                headers.push(((*name).to_owned(), (*value).to_owned()));
            }
        }
        request(&self.process.envd_url, method, path, &headers, body).await
    }

    /// `process.Process/Start` of `bash -c script` (as envd's default user unless `extra`
    /// names another); the reply and its decoded envelopes.
    pub async fn run(&self, sandbox: &Value, script: &str, extra: &[(&str, &str)]) -> Run {
        let message =
            json!({"process": {"cmd": "/bin/bash", "args": ["-c", script]}, "stdin": false});
        let mut headers = vec![
            ("Content-Type", "application/connect+json"),
            ("Connect-Protocol-Version", "1"),
        ];
        headers.extend_from_slice(extra);
        let reply = self
            .envd(
                sandbox,
                "POST",
                "/process.Process/Start",
                &headers,
                envelope(0, &message),
            )
            .await;
        Run::from(reply)
    }
}

pub fn sid(sandbox: &Value) -> String {
    sandbox["sandboxID"]
        .as_str()
        .expect("a sandboxID")
        .to_owned()
}

/// A Connect envelope.
pub fn envelope(flags: u8, message: &Value) -> Vec<u8> {
    let json = message.to_string().into_bytes();
    let mut out = vec![flags];
    out.extend_from_slice(&(json.len() as u32).to_be_bytes());
    out.extend_from_slice(&json);
    out
}

/// A finished `Start` stream, decoded.
#[derive(Debug)]
pub struct Run {
    pub reply: Reply,
    /// Every envelope: flags and JSON.
    pub frames: Vec<(u8, Value)>,
}

impl From<Reply> for Run {
    fn from(reply: Reply) -> Run {
        let mut frames = Vec::new();
        let stream = reply.header("content-type").as_deref() == Some("application/connect+json");
        if let (true, Ok(body)) = (stream, &reply.body) {
            let mut rest = &body[..];
            while rest.len() >= 5 {
                let len = u32::from_be_bytes([rest[1], rest[2], rest[3], rest[4]]) as usize;
                let json = serde_json::from_slice(&rest[5..5 + len]).expect("JSON envelope");
                frames.push((rest[0], json));
                rest = &rest[5 + len..];
            }
            assert!(rest.is_empty(), "a partial envelope: {rest:?}");
        }
        Run { reply, frames }
    }
}

impl Run {
    /// The events, in order (`start`, `data`, `end`, `keepalive`).
    pub fn events(&self) -> Vec<&Value> {
        self.frames
            .iter()
            .filter(|(flags, _)| *flags == 0)
            .map(|(_, v)| &v["event"])
            .collect()
    }

    pub fn pid(&self) -> u64 {
        self.events()[0]["start"]["pid"]
            .as_u64()
            .expect("a start event first")
    }

    /// Stdout and stderr, decoded.
    pub fn output(&self, stream: &str) -> String {
        let mut out = Vec::new();
        for event in self.events() {
            if let Some(data) = event["data"][stream].as_str() {
                out.extend(
                    base64::engine::general_purpose::STANDARD
                        .decode(data)
                        .unwrap(),
                );
            }
        }
        String::from_utf8_lossy(&out).into_owned()
    }

    pub fn end(&self) -> Option<&Value> {
        self.events().into_iter().find_map(|e| e.get("end"))
    }

    /// The end-of-stream envelope's JSON, if it came.
    pub fn end_stream(&self) -> Option<&Value> {
        self.frames
            .iter()
            .find(|(flags, _)| flags & 0x02 != 0)
            .map(|(_, v)| v)
    }
}

/// One HTTP/1.1 request to `base` (`http://127.0.0.1:P`), the whole answer within 2 minutes.
pub async fn request(
    base: &str,
    method: &str,
    path: &str,
    headers: &[(String, String)],
    body: Vec<u8>,
) -> Reply {
    let addr = base.trim_start_matches("http://").to_owned();
    let stream = tokio::net::TcpStream::connect(&addr)
        .await
        .expect("connect");
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .expect("handshake");
    tokio::spawn(connection);
    let mut builder = http::Request::builder().method(method).uri(path);
    let mut has_host = false;
    for (name, value) in headers {
        has_host |= name.eq_ignore_ascii_case("host");
        builder = builder.header(name, value);
    }
    if !has_host {
        builder = builder.header("Host", addr);
    }
    let request = builder.body(Full::new(Bytes::from(body))).unwrap();
    let response = tokio::time::timeout(Duration::from_secs(120), sender.send_request(request))
        .await
        .expect("an answer within 2 minutes")
        .expect("an answer");
    let status = response.status().as_u16();
    let headers = response.headers().clone();
    let body = tokio::time::timeout(Duration::from_secs(120), response.into_body().collect())
        .await
        .expect("the body within 2 minutes")
        .map(|c| c.to_bytes())
        .map_err(|e| e.to_string());
    Reply {
        status,
        headers,
        body,
    }
}
