//! The tests' own client: HTTP/1.1 through hyper's client, Connect JSON framing and the
//! token exchange written here, sharing no code with the simulator it judges.

use std::time::Duration;

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use bytes::Bytes;
use dockercloud_simulator::launch::{LaunchOptions, Simulator};
use http_body_util::{BodyExt, Full};
use serde_json::{Value, json};

pub const IMAGE: &str = "plimsoll-sim/dockercloud-sandbox:latest";

/// One answer.
#[derive(Debug)]
pub struct Answer {
    pub status: u16,
    pub headers: http::HeaderMap,
    pub body: Vec<u8>,
}

impl Answer {
    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {}", String::from_utf8_lossy(&self.body)))
    }

    pub fn header(&self, name: &str) -> Option<String> {
        self.headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
    }
}

/// Sends one request over a fresh connection (60 s at most).
pub async fn send(method: &str, url: &str, headers: &[(&str, &str)], body: Vec<u8>) -> Answer {
    let rest = url.strip_prefix("http://").expect("http URL");
    let (authority, path) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
    let path = if path.is_empty() { "/" } else { path };
    let work = async {
        let stream = tokio::net::TcpStream::connect(authority)
            .await
            .expect("connect");
        let io = hyper_util::rt::TokioIo::new(stream);
        let (mut sender, connection) = hyper::client::conn::http1::handshake(io)
            .await
            .expect("handshake");
        tokio::spawn(connection);
        let mut request = http::Request::builder()
            .method(method)
            .uri(path)
            .header("host", authority);
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        let request = request.body(Full::new(Bytes::from(body))).expect("request");
        let response = sender.send_request(request).await.expect("send");
        let status = response.status().as_u16();
        let headers = response.headers().clone();
        let body = response
            .into_body()
            .collect()
            .await
            .expect("body")
            .to_bytes()
            .to_vec();
        Answer {
            status,
            headers,
            body,
        }
    };
    tokio::time::timeout(Duration::from_secs(60), work)
        .await
        .expect("answer within 60 s")
}

/// One Connect envelope.
pub fn envelope(flags: u8, message: &Value) -> Vec<u8> {
    let body = message.to_string().into_bytes();
    let mut out = vec![flags];
    out.extend_from_slice(&(body.len() as u32).to_be_bytes());
    out.extend_from_slice(&body);
    out
}

/// Splits a Connect streaming answer into (flags, message) pairs.
pub fn envelopes(mut body: &[u8]) -> Vec<(u8, Value)> {
    let mut out = Vec::new();
    while !body.is_empty() {
        let len = u32::from_be_bytes([body[1], body[2], body[3], body[4]]) as usize;
        out.push((
            body[0],
            serde_json::from_slice(&body[5..5 + len]).expect("frame JSON"),
        ));
        body = &body[5 + len..];
    }
    out
}

/// A running simulator and an access token for it.
pub struct Harness {
    pub sim: Simulator,
    pub bearer: String,
}

/// Starts a simulator under the runtime under test with `args`; `None` only when the
/// docker environment says to skip (PLIMSOLL_TEST_DOCKER_SKIP=1).
pub async fn start(args: &[&str]) -> Option<Harness> {
    if !plimsoll_tests::docker::docker_ready() {
        return None;
    }
    let mut options = LaunchOptions {
        binary: env!("CARGO_BIN_EXE_dockercloud-simulator").into(),
        ..LaunchOptions::new()
    }
    .runtime(plimsoll_tests::docker::runtime())
    .arg("--log")
    .arg("warn");
    for arg in args {
        options = options.arg(arg);
    }
    let sim = Simulator::start(options)
        .expect("simulator starts (tests/simulators/dockercloud/image/build made its image?)");
    let bearer = exchange(&sim.ready.auth_url, &sim.ready.username, &sim.ready.token).await;
    Some(Harness { sim, bearer })
}

/// The token exchange: the access token for an account.
pub async fn exchange(auth_url: &str, identifier: &str, secret: &str) -> String {
    let body = json!({ "identifier": identifier, "secret": secret })
        .to_string()
        .into_bytes();
    let answer = send(
        "POST",
        auth_url,
        &[("content-type", "application/json")],
        body,
    )
    .await;
    assert_eq!(
        answer.status,
        200,
        "{}",
        String::from_utf8_lossy(&answer.body)
    );
    answer.json()["access_token"]
        .as_str()
        .expect("access_token")
        .to_owned()
}

pub fn create_request(name: &str) -> Value {
    json!({
        "name": name,
        "requestId": name,
        "cloud": {
            "imageRef": IMAGE,
            "startCmd": ["tail", "-f", "/dev/null"],
            "timeout": "300s",
            "onTimeout": "ON_TIMEOUT_DELETE",
            "autoResume": false,
            "platform": { "os": "linux", "architecture": "amd64" },
        },
        "resources": { "cpus": 1, "memoryMib": "1024" },
    })
}

impl Harness {
    /// Replaces the simulator's fault set.
    pub async fn fault(&self, faults: dockercloud_simulator::Faults) {
        self.sim
            .set_faults(&faults)
            .await
            .expect("admin: set faults");
    }

    /// A unary Connect call with a bearer.
    pub async fn call_as(
        &self,
        base: &str,
        procedure: &str,
        bearer: &str,
        input: &Value,
    ) -> Answer {
        let auth = format!("Bearer {bearer}");
        send(
            "POST",
            &format!("{base}{procedure}"),
            &[
                ("content-type", "application/json"),
                ("connect-protocol-version", "1"),
                ("connect-timeout-ms", "30000"),
                ("authorization", &auth),
            ],
            input.to_string().into_bytes(),
        )
        .await
    }

    /// A unary management call.
    pub async fn call(&self, procedure: &str, input: Value) -> Answer {
        self.call_as(&self.sim.ready.api_url, procedure, &self.bearer, &input)
            .await
    }

    /// A unary management call that must succeed.
    pub async fn ok(&self, procedure: &str, input: Value) -> Value {
        let answer = self.call(procedure, input).await;
        assert_eq!(
            answer.status,
            200,
            "{procedure}: {}",
            String::from_utf8_lossy(&answer.body)
        );
        answer.json()
    }

    /// A Connect streaming call to a sandbox endpoint.
    pub async fn stream(
        &self,
        endpoint: &str,
        procedure: &str,
        messages: &[Value],
    ) -> (u16, Vec<(u8, Value)>) {
        let auth = format!("Bearer {}", self.bearer);
        let body: Vec<u8> = messages.iter().flat_map(|m| envelope(0, m)).collect();
        let answer = send(
            "POST",
            &format!("{endpoint}{procedure}"),
            &[
                ("content-type", "application/connect+json"),
                ("connect-protocol-version", "1"),
                ("authorization", &auth),
            ],
            body,
        )
        .await;
        (answer.status, envelopes(&answer.body))
    }

    /// Waits for an operation to be done (WaitOperation, then GetOperation polling when
    /// it is not served), at most 60 s.
    pub async fn wait_done(&self, op: Value) -> Value {
        let mut op = op;
        let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
        while op["done"] != true {
            assert!(
                tokio::time::Instant::now() < deadline,
                "operation not done: {op}"
            );
            let id = op["id"].as_str().expect("operation id").to_owned();
            let waited = self
                .call(
                    "/docker.sbx.v1.OperationService/WaitOperation",
                    json!({ "id": id, "timeout": "10s" }),
                )
                .await;
            op = if waited.status == 200 {
                waited.json()
            } else {
                assert_eq!(waited.json()["code"], "unimplemented");
                tokio::time::sleep(Duration::from_millis(250)).await;
                self.ok(
                    "/docker.sbx.v1.OperationService/GetOperation",
                    json!({ "id": id }),
                )
                .await
            };
        }
        op
    }

    /// Creates a sandbox and waits until it runs; answers it (GetSandbox's view).
    pub async fn running(&self, name: &str) -> Value {
        let op = self
            .ok(
                "/docker.sbx.v1.SandboxService/CreateSandbox",
                create_request(name),
            )
            .await;
        let done = self.wait_done(op).await;
        assert!(done.get("error").is_none(), "create failed: {done}");
        let sandbox = self
            .ok(
                "/docker.sbx.v1.SandboxService/GetSandbox",
                json!({ "sandbox": { "name": name } }),
            )
            .await;
        assert_eq!(sandbox["core"]["status"], "SANDBOX_STATUS_RUNNING");
        sandbox
    }

    /// Runs a command through the Connect exec: (exit code, stdout, stderr).
    pub async fn exec(&self, sandbox: &Value, cmd: &[&str]) -> (i64, String, String) {
        let endpoint = sandbox["core"]["endpoint"]["uri"]
            .as_str()
            .expect("endpoint");
        let answer = self
            .call_as(
                endpoint,
                "/docker.sbx.process.v1.ProcessService/Exec",
                &self.bearer,
                &json!({ "cmd": cmd }),
            )
            .await;
        assert_eq!(
            answer.status,
            200,
            "exec: {}",
            String::from_utf8_lossy(&answer.body)
        );
        let out = answer.json();
        let text = |field: &str| {
            String::from_utf8(
                STANDARD
                    .decode(out[field].as_str().unwrap_or(""))
                    .expect("base64"),
            )
            .expect("utf-8")
        };
        (
            out["exitCode"].as_i64().unwrap_or(0),
            text("stdout"),
            text("stderr"),
        )
    }

    /// The simulator's containers that still exist (docker's view).
    pub fn containers(&self) -> usize {
        let out = std::process::Command::new("docker")
            .args(["ps", "-aq", "--filter"])
            .arg(format!(
                "label=io.plimsoll.simulator.instance={}",
                self.sim.ready.instance
            ))
            .output()
            .expect("docker ps");
        String::from_utf8_lossy(&out.stdout).lines().count()
    }
}
