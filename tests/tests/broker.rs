//! The broker end to end (spec/grants.md §1–2, issue 7): the real `broker` binary with a
//! grants file in a temp dir, driven through its control socket with
//! `broker::control::client::Client`, and by raw HTTP/1.1 over each run's Unix socket,
//! forwarding over real HTTPS to [`TestApi`].
//!
//! Build the binary first: `cargo build -p broker` (scripts/test builds the workspace).
// A test fails by panicking, with the evidence in the message.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::{BufRead, BufReader};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use broker::control::client::{Client, ControlError};
use broker::control::protocol::{
    Delivery, OpenRun, OpenSession, Reach, Refusal, RefusalReason, RunGrant,
};
use jsonwebtoken::{Algorithm, DecodingKey, Validation};
use plimsoll_tests::test_api::{Reply, TestApi};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::UnixStream;

const SECRET_A: &str = "secret-a-0123456789abcdef0123456789abcdef";
const SECRET_B: &str = "secret-b-0123456789abcdef0123456789abcdef";
const STATIC_TOKEN: &str = "static-token-9f8e7d";
/// Bound on any single wait in these tests.
const WAIT: Duration = Duration::from_secs(15);

// === the broker process ===

struct Broker {
    child: Child,
    dir: tempfile::TempDir,
    socket: PathBuf,
    log: Arc<Mutex<String>>,
}

impl Broker {
    /// Starts `broker` with `grants` (written to `<tmp>/grants.json`) and waits for hello.
    async fn start(api: &TestApi, grants: &Value) -> Self {
        Self::start_with(api, grants, false).await
    }

    /// [`Broker::start`], with a guard socket at [`Broker::guard_socket`] when `guard`.
    async fn start_with(api: &TestApi, grants: &Value, guard: bool) -> Self {
        let dir = tempfile::tempdir().unwrap();
        write_atomic(&dir.path().join("grants.json"), grants);
        let socket = dir.path().join("ctl").join("broker.sock");
        let mut command = command(dir.path(), &socket, api);
        if guard {
            command.env(
                "PLIMSOLL_BROKER_GUARD_SOCKET",
                dir.path().join("guard").join("guard.sock"),
            );
        }
        let mut child = command.stderr(Stdio::piped()).spawn().unwrap();
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
        let broker = Self {
            child,
            dir,
            socket,
            log,
        };
        let deadline = Instant::now() + WAIT;
        loop {
            if broker.client().hello().await.is_ok() {
                return broker;
            }
            assert!(
                Instant::now() < deadline,
                "broker did not answer hello: {}",
                broker.log()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    fn client(&self) -> Client {
        Client::new(&self.socket)
    }

    /// Where [`Broker::start_with`] asked for the guard socket.
    fn guard_socket(&self) -> PathBuf {
        self.dir.path().join("guard").join("guard.sock")
    }

    fn grants_path(&self) -> PathBuf {
        self.dir.path().join("grants.json")
    }

    fn log(&self) -> String {
        self.log.lock().unwrap().clone()
    }

    /// Waits until the log (read from stderr by a thread) contains `needle`.
    async fn wait_log(&self, needle: &str) -> String {
        wait_for_log(&self.log, needle).await
    }

    /// Waits until the log contains `needle` at least `count` times: an event that already
    /// happened once (a reload that failed before) is waited for again.
    async fn wait_log_count(&self, needle: &str, count: usize) {
        let deadline = Instant::now() + WAIT;
        while self.log().matches(needle).count() < count {
            assert!(
                Instant::now() < deadline,
                "{needle:?} not logged {count} times: {}",
                self.log()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    async fn open(&self, principal: &str, profile: &str) -> RunGrant {
        let run = open_request(principal, profile, 20_000);
        match self.client().open(&run).await.unwrap() {
            Ok(grant) => grant,
            Err(refusal) => panic!("open refused: {refusal:?}"),
        }
    }

    /// Opens a session socket living `life_ms`: its slot id and socket path.
    async fn open_session(&self, life_ms: u64) -> (String, PathBuf) {
        let request = OpenSession {
            session: fresh_run_id(),
            deadline_unix_ms: now_ms() + life_ms,
            delivery: Delivery::Socket,
        };
        match self.client().open_session(&request).await.unwrap() {
            Ok(opened) => match opened.reach {
                Reach::Socket(path) => (request.session, path),
                other => panic!("a socket session got {other:?}"),
            },
            Err(refusal) => panic!("open_session refused: {refusal:?}"),
        }
    }

    async fn generation(&self) -> u64 {
        self.client().hello().await.unwrap().generation
    }

    async fn wait_generation(&self, generation: u64) {
        let deadline = Instant::now() + WAIT;
        while self.generation().await < generation {
            assert!(Instant::now() < deadline, "no reload: {}", self.log());
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

impl Broker {
    fn signal(&self, signal: rustix::process::Signal) {
        let pid = rustix::process::Pid::from_child(&self.child);
        rustix::process::kill_process(pid, signal).expect("signal the broker");
    }
}

impl Drop for Broker {
    /// SIGTERM first, so the broker revokes its open runs and removes their sockets.
    fn drop(&mut self) {
        plimsoll_tests::stop(&mut self.child, Duration::from_secs(5));
    }
}

async fn wait_for_log(log: &Mutex<String>, needle: &str) -> String {
    let deadline = Instant::now() + WAIT;
    loop {
        let text = log.lock().unwrap().clone();
        if text.contains(needle) {
            return text;
        }
        assert!(
            Instant::now() < deadline,
            "the log never said {needle:?}: {text}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The broker command with exactly the environment it needs (nothing else inherited).
fn command(dir: &Path, socket: &Path, api: &TestApi) -> Command {
    let mut command = Command::new(plimsoll_tests::binary("broker"));
    command
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("PLIMSOLL_GRANTS_FILE", dir.join("grants.json"))
        .env("PLIMSOLL_BROKER_SOCKET", socket)
        .env("PLIMSOLL_BROKER_CA_FILE", api.ca_file())
        .env("JWT_SECRET_A", SECRET_A)
        .env("JWT_SECRET_B", SECRET_B)
        .env("STATIC_TOKEN", STATIC_TOKEN)
        .stdout(Stdio::null());
    command
}

/// Whether a guest socket's name is the unguessable kind (issue 12, part 5): 128 random
/// bits in hex, then `.sock`, never the fixed `host-api.sock`.
fn unguessable(socket: &Path) -> bool {
    let name = socket.file_name().and_then(|n| n.to_str()).unwrap_or("");
    name.len() == 32 + ".sock".len()
        && name.ends_with(".sock")
        && name[..32].bytes().all(|b| b.is_ascii_hexdigit())
}

fn write_atomic(path: &Path, value: &Value) {
    write_text_atomic(path, &serde_json::to_string_pretty(value).unwrap());
}

fn write_text_atomic(path: &Path, text: &str) {
    let staging = path.with_extension("tmp");
    std::fs::write(&staging, text).unwrap();
    std::fs::rename(&staging, path).unwrap();
}

fn fresh_run_id() -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(1);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64;
    format!(
        "{:016x}{:016x}",
        nanos,
        NEXT.fetch_add(1, Ordering::Relaxed) ^ u64::from(std::process::id())
    )
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

fn open_request(principal: &str, profile: &str, budget_ms: u64) -> OpenRun {
    OpenRun {
        run: fresh_run_id(),
        principal: principal.into(),
        profile: profile.into(),
        deadline_unix_ms: now_ms() + budget_ms,
        session: false,
        delivery: Delivery::Socket,
        slot: None,
        kept_from_earlier_calls: 0,
        call_token: false,
    }
}

/// The socket a socket-delivered grant is reached at.
fn socket_of(grant: &RunGrant) -> PathBuf {
    match &grant.reach {
        Reach::Socket(path) => path.clone(),
        other => panic!("a socket run got {other:?}"),
    }
}

/// A session call lending its grant to the session socket `slot`.
fn lend_request(principal: &str, profile: &str, slot: &str) -> OpenRun {
    OpenRun {
        session: true,
        slot: Some(slot.to_owned()),
        ..open_request(principal, profile, 20_000)
    }
}

// === grants files ===

fn jwt_profile(api: &TestApi, secret_env: &str, allow: &[&str]) -> Value {
    json!({
        "base_url": api.base_url(),
        "allow": allow,
        "allowed_callers": ["alice"],
        "scopes": ["inv:read", "inv:write"],
        "token": {"type": "jwt", "secret_env": secret_env, "audience": "inventory", "ttl_sec": 60,
                  "issuer": "plimsoll-test"},
    })
}

fn grants(profiles: Value) -> Value {
    json!({ "profiles": profiles })
}

// === the guest's side: HTTP/1.1 over the run socket ===

#[derive(Debug)]
struct Answer {
    status: u16,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

impl Answer {
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

/// One request on a fresh connection; `None` when the connection failed or closed early.
async fn call(
    socket: &Path,
    method: &str,
    target: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> Option<Answer> {
    let attempt = async {
        let mut stream = UnixStream::connect(socket).await.ok()?;
        let mut head =
            format!("{method} {target} HTTP/1.1\r\nHost: host-api\r\nConnection: close\r\n");
        for (name, value) in headers {
            head.push_str(&format!("{name}: {value}\r\n"));
        }
        head.push_str(&format!("Content-Length: {}\r\n\r\n", body.len()));
        stream.write_all(head.as_bytes()).await.ok()?;
        stream.write_all(body).await.ok()?;
        let mut raw = Vec::new();
        stream.read_to_end(&mut raw).await.ok()?;
        parse_answer(&raw)
    };
    tokio::time::timeout(WAIT * 2, attempt)
        .await
        .expect("call hung")
}

fn parse_answer(raw: &[u8]) -> Option<Answer> {
    let split = raw.windows(4).position(|w| w == b"\r\n\r\n")?;
    let head = std::str::from_utf8(&raw[..split]).ok()?;
    let mut lines = head.split("\r\n");
    let status = lines.next()?.split(' ').nth(1)?.parse().ok()?;
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(n, v)| (n.trim().to_owned(), v.trim().to_owned()))
        .collect();
    Some(Answer {
        status,
        headers,
        body: raw[split + 4..].to_vec(),
    })
}

async fn get(grant: &RunGrant, target: &str) -> Answer {
    call(&socket_of(grant), "GET", target, &[], b"")
        .await
        .unwrap_or_else(|| panic!("GET {target}: no answer"))
}

fn decode_jwt(authorization: &str, secret: &str) -> Value {
    let token = authorization
        .strip_prefix("Bearer ")
        .expect("a bearer token");
    let mut validation = Validation::new(Algorithm::HS256);
    validation.set_audience(&["inventory"]);
    jsonwebtoken::decode::<Value>(
        token,
        &DecodingKey::from_secret(secret.as_bytes()),
        &validation,
    )
    .expect("a JWT signed with the profile's secret")
    .claims
}

// === the tests ===

#[path = "broker/control.rs"]
mod control;
#[path = "broker/forwarding.rs"]
mod forwarding;
#[path = "broker/guard.rs"]
mod guard;
#[path = "broker/lifecycle.rs"]
mod lifecycle;
#[path = "broker/sessions.rs"]
mod sessions;
