//! envd's `process.Process` service.
//!
//! `Start` is a server stream: a `start` event with the pid, `data` events (base64 output,
//! one per read of up to 32 KiB), an `end` event (zero values left out: exit 0 has no
//! `exitCode`; a signal gives `exitCode: -1`, `status: "signal: killed"`), then the
//! end-of-stream frame. `keepalive` events come every `Keepalive-Ping-Interval` seconds
//! (90 s without the header) when nothing else was sent.
//!
//! `Connect-Timeout-Ms` is envd's deadline: when it passes the stream ends with a
//! `deadline_exceeded` error frame and no `end` event, and only the started process is
//! killed (the agent does it; children keep running). Without the header the process is not
//! tied to the request: a client that goes away leaves it running.

use std::sync::Arc;
use std::time::Duration;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use http::HeaderMap;
use serde_json::{Map, Value, json};

use tokio::io::AsyncWriteExt;
use tokio::time::Instant;

use super::connect::{
    self, Code, RpcError, end_stream, message, stream_head, unary_error, unary_ok,
};
use super::{DEFAULT_USER, Target, User, lookup_user, resolve_path};
use crate::app::App;
use crate::frames::Tag;
use crate::guest::{End, Failure};
use crate::http::{Request, Response, read_body};
use crate::sandbox::{Process, SharedInput};
use crate::vm::{Exec, GUEST_PATH};

/// envd's keepalive interval without `Keepalive-Ping-Interval`.
const DEFAULT_KEEPALIVE: Duration = Duration::from_secs(90);
/// The agent kills the process this long after the stream's deadline, so the stream has
/// always ended (without an end event) first, as envd's does.
const KILL_MARGIN: Duration = Duration::from_millis(20);
const REQUEST_LIMIT: usize = 1 << 20;
/// The VM's system CA bundle (it holds the simulator's egress CA).
const CA_BUNDLE: &str = "/etc/ssl/certs/ca-certificates.crt";

pub async fn handle(app: Arc<App>, target: Target, request: Request) -> Response {
    let method = request
        .uri()
        .path()
        .trim_start_matches("/process.Process/")
        .to_owned();
    if method == "Start" {
        return start(app, target, request).await;
    }
    let headers = request.headers().clone();
    let body = match read_body(request.into_body(), REQUEST_LIMIT).await {
        Ok(body) => body,
        Err(e) => return unary_error(&RpcError::new(Code::InvalidArgument, e.to_string())),
    };
    let json_body = headers
        .get(http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|ct| ct.starts_with("application/json"));
    if !json_body {
        return unary_error(&RpcError::new(
            Code::Unimplemented,
            "the E2B simulator speaks the Connect JSON codec only",
        ));
    }
    let msg: Value = match serde_json::from_slice(if body.is_empty() { b"{}" } else { &body }) {
        Ok(msg) => msg,
        Err(e) => return unary_error(&RpcError::new(Code::InvalidArgument, e.to_string())),
    };
    let answer = match method.as_str() {
        "List" => Ok(list(&app, &target)),
        "SendSignal" => send_signal(&app, &target, &msg).await,
        "SendInput" => send_input(&app, &target, &msg).await,
        "CloseStdin" => close_stdin(&app, &target, &msg).await,
        other => Err(RpcError::new(
            Code::Unimplemented,
            format!("the E2B simulator does not implement process.Process/{other}"),
        )),
    };
    match answer {
        Ok(value) => unary_ok(&value),
        Err(e) => unary_error(&e),
    }
}

/// The user a Basic `Authorization` names (empty password), or envd's default.
fn auth_user(headers: &HeaderMap) -> Result<User, RpcError> {
    let Some(value) = headers
        .get(http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
    else {
        return lookup_user(DEFAULT_USER)
            .ok_or_else(|| RpcError::new(Code::Unauthenticated, "no user specified"));
    };
    let name = value
        .strip_prefix("Basic ")
        .and_then(|b| STANDARD.decode(b.trim()).ok())
        .and_then(|raw| String::from_utf8(raw).ok())
        .map(|pair| {
            pair.split_once(':')
                .map_or(pair.clone(), |(u, _)| u.to_owned())
        });
    let Some(name) = name else {
        return lookup_user(DEFAULT_USER)
            .ok_or_else(|| RpcError::new(Code::Unauthenticated, "no user specified"));
    };
    lookup_user(&name)
        .ok_or_else(|| RpcError::new(Code::Unauthenticated, format!("invalid username: '{name}'")))
}

async fn start(app: Arc<App>, target: Target, request: Request) -> Response {
    let received = Instant::now();
    let headers = request.headers().clone();
    let prepared = match prepare(&app, &target, &headers, request).await {
        Ok(prepared) => prepared,
        Err(e) => return connect::stream_error(&e),
    };
    let deadline = prepared.timeout.map(|t| received + t);
    let mut args: Vec<String> = vec!["spawn".into(), "--cwd".into(), prepared.cwd.clone()];
    // envd itself runs as root and starts the process as the user, so root's cleanup killing
    // every process of the user never kills envd's side of a stream.
    if prepared.user.uid != 0 {
        args.extend([
            "--uid".into(),
            prepared.user.uid.to_string(),
            "--gid".into(),
            prepared.user.gid.to_string(),
        ]);
    }
    if let Some(deadline) = deadline {
        let left = deadline.saturating_duration_since(Instant::now()) + KILL_MARGIN;
        args.extend(["--timeout-ms".into(), left.as_millis().to_string()]);
    }
    if prepared.stdin {
        args.push("--stdin".into());
    }
    for (name, value) in &prepared.env {
        args.extend(["--env".into(), format!("{name}={value}")]);
    }
    args.push("--".into());
    args.push(prepared.cmd.clone());
    args.extend(prepared.args.iter().cloned());
    let arg_refs: Vec<&str> = args.iter().map(String::as_str).collect();
    let spawned = app
        .vms
        .agent(&target.container, "root", &arg_refs, prepared.stdin)
        .await;
    let mut exec = match spawned {
        Ok(exec) => exec,
        Err(e) => return connect::stream_error(&RpcError::new(Code::Unavailable, e.to_string())),
    };
    let pid = match exec.expect_frame().await {
        Ok(frame) if frame.tag == Tag::Pid && frame.payload.len() == 4 => u32::from_be_bytes([
            frame.payload[0],
            frame.payload[1],
            frame.payload[2],
            frame.payload[3],
        ]),
        Ok(frame) if frame.tag == Tag::Failed => {
            let failure: Failure = serde_json::from_slice(&frame.payload).unwrap_or(Failure {
                status: 0,
                code: "unknown".into(),
                message: "the process did not start".into(),
            });
            return connect::stream_error(&RpcError::new(
                Code::from_name(&failure.code),
                failure.message,
            ));
        }
        Ok(_) => {
            return connect::stream_error(&RpcError::new(Code::Unknown, "unexpected agent answer"));
        }
        Err(e) => return connect::stream_error(&RpcError::new(Code::Unavailable, e.to_string())),
    };
    // A process may be quiet for as long as it likes.
    exec.set_idle(None);
    let stdin = exec.take_input().filter(|_| prepared.stdin);
    let registered = app.sandboxes.with(&target.id, |s| {
        s.processes.insert(
            pid,
            Process {
                config: prepared.config.clone(),
                tag: prepared.tag.clone(),
                stdin: stdin.map(|input| Arc::new(tokio::sync::Mutex::new(Some(input)))),
            },
        );
        s.life.subscribe()
    });
    let Some(life) = registered else {
        return connect::stream_error(&RpcError::new(Code::Unavailable, "the sandbox is gone"));
    };
    let (sender, body) = crate::http::channel(16);
    let stream = Stream {
        app,
        id: target.id,
        pid,
        received,
        deadline,
        keepalive: prepared.keepalive,
        life,
        sender,
    };
    tokio::spawn(stream.run(exec));
    stream_head(body)
}

/// A checked `StartRequest`.
struct Prepared {
    user: User,
    timeout: Option<Duration>,
    keepalive: Duration,
    cmd: String,
    args: Vec<String>,
    env: Vec<(String, String)>,
    cwd: String,
    stdin: bool,
    tag: Option<String>,
    config: Value,
}

async fn prepare(
    app: &App,
    target: &Target,
    headers: &HeaderMap,
    request: Request,
) -> Result<Prepared, RpcError> {
    let body = read_body(request.into_body(), REQUEST_LIMIT)
        .await
        .map_err(|e| RpcError::new(Code::InvalidArgument, e.to_string()))?;
    let msg = connect::stream_request(&body)?;
    let user = auth_user(headers)?;
    let timeout = match headers.get("connect-timeout-ms") {
        None => None,
        Some(v) => {
            let ms: u64 = v
                .to_str()
                .ok()
                .and_then(|s| s.parse().ok())
                .ok_or_else(|| {
                    RpcError::new(Code::InvalidArgument, "invalid Connect-Timeout-Ms")
                })?;
            // envd: a zero timeout means no timeout.
            (ms > 0).then(|| Duration::from_millis(ms))
        }
    };
    let keepalive = headers
        .get("keepalive-ping-interval")
        .and_then(|v| v.to_str().ok())
        .and_then(|s| s.parse::<u64>().ok())
        .map_or(DEFAULT_KEEPALIVE, Duration::from_secs);
    if msg.get("pty").is_some_and(|p| !p.is_null()) {
        return Err(RpcError::new(
            Code::Unimplemented,
            "the E2B simulator does not run processes on a PTY",
        ));
    }
    let process = msg.get("process").cloned().unwrap_or(json!({}));
    let cmd = process
        .get("cmd")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_owned();
    let args: Vec<String> = process
        .get("args")
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(Value::as_str)
                .map(str::to_owned)
                .collect()
        })
        .unwrap_or_default();
    let envs: Map<String, Value> = process
        .get("envs")
        .and_then(Value::as_object)
        .cloned()
        .unwrap_or_default();
    let cwd_asked = process
        .get("cwd")
        .and_then(Value::as_str)
        .unwrap_or_default();
    let cwd =
        resolve_path(cwd_asked, &user).map_err(|e| RpcError::new(Code::InvalidArgument, e))?;
    let sandbox = app
        .sandboxes
        .with(&target.id, |s| (s.env_vars.clone(), s.template.id.clone()));
    let Some((sandbox_env, template_id)) = sandbox else {
        return Err(RpcError::new(Code::Unavailable, "the sandbox is gone"));
    };
    // envd's order: its own PATH, HOME, USER, LOGNAME, then its global variables (E2B's and
    // the create's envVars), then the request's; a later name wins.
    let mut env: Vec<(String, String)> = vec![
        ("PATH".into(), GUEST_PATH.into()),
        ("HOME".into(), user.home.into()),
        ("USER".into(), user.name.into()),
        ("LOGNAME".into(), user.name.into()),
        ("E2B_SANDBOX".into(), "true".into()),
        ("E2B_SANDBOX_ID".into(), target.id.clone()),
        ("E2B_TEMPLATE_ID".into(), template_id),
    ];
    env.extend(sandbox_env);
    if app.faults().egress_allowed {
        // Under the egress-allowed fault node must accept the simulator's stand-in for
        // example.com, as it would accept the real site's public certificate.
        env.push(("NODE_EXTRA_CA_CERTS".into(), CA_BUNDLE.into()));
    }
    env.extend(
        envs.iter()
            .map(|(k, v)| (k.clone(), v.as_str().unwrap_or_default().to_owned())),
    );
    let mut merged: Vec<(String, String)> = Vec::new();
    for (name, value) in env {
        merged.retain(|(n, _)| *n != name);
        merged.push((name, value));
    }
    Ok(Prepared {
        user,
        timeout,
        keepalive,
        cmd,
        args,
        env: merged,
        cwd,
        // envd's default when the field is absent (old SDKs) is an open stdin.
        stdin: msg.get("stdin").and_then(Value::as_bool).unwrap_or(true),
        tag: msg.get("tag").and_then(Value::as_str).map(str::to_owned),
        config: process,
    })
}

/// One running `Start` stream.
struct Stream {
    app: Arc<App>,
    id: String,
    pid: u32,
    /// When the start's request arrived: the served time runs to the end frame.
    received: Instant,
    deadline: Option<Instant>,
    keepalive: Duration,
    life: tokio::sync::watch::Receiver<bool>,
    sender: crate::http::BodySender,
}

impl Stream {
    async fn run(mut self, mut exec: Exec) {
        let faults = self.app.faults();
        let dies_at = faults
            .vm_dies_after_ms
            .map(|ms| Instant::now() + Duration::from_millis(ms));
        let mut client = true;
        client &= self
            .send(&json!({"event": {"start": {"pid": self.pid}}}))
            .await;
        let mut keepalive_at = Instant::now() + self.keepalive;
        loop {
            tokio::select! {
                frame = exec.next_frame() => {
                    let frame = match frame {
                        Ok(Some(frame)) => frame,
                        // The agent's output ended without an end frame: the VM is gone.
                        Ok(None) | Err(_) => {
                            self.sender.abort("the sandbox went away").await;
                            break;
                        }
                    };
                    match frame.tag {
                        Tag::Stdout | Tag::Stderr => {
                            let stream = if frame.tag == Tag::Stdout { "stdout" } else { "stderr" };
                            let data = STANDARD.encode(&frame.payload);
                            if client {
                                client = self.send(&json!({"event": {"data": {stream: data}}})).await;
                            }
                            keepalive_at = Instant::now() + self.keepalive;
                        }
                        Tag::End => {
                            let end: End = serde_json::from_slice(&frame.payload).unwrap_or(End {
                                exit_code: -1,
                                exited: false,
                                status: "unknown".into(),
                                error: Some("unreadable end".into()),
                            });
                            if client && !faults.drop_end_event {
                                self.sender.send(connect::envelope(0, end_json(&end).as_bytes())).await;
                            }
                            if client && !faults.drop_end_frame {
                                self.sender.send(end_stream(None)).await;
                            }
                            self.app.served.add(&self.id, self.received.elapsed());
                            self.forget();
                            return;
                        }
                        _ => {}
                    }
                    if !client && self.deadline.is_none() {
                        // No deadline: the process outlives the request, as under envd.
                        break;
                    }
                }
                () = sleep_until(self.deadline) => {
                    let error = RpcError::new(Code::DeadlineExceeded, "context deadline exceeded");
                    self.sender.send(end_stream(Some(&error))).await;
                    break;
                }
                () = tokio::time::sleep_until(keepalive_at) => {
                    if client {
                        client = self.send(&json!({"event": {"keepalive": {}}})).await;
                    }
                    keepalive_at = Instant::now() + self.keepalive;
                }
                _ = self.life.changed() => {
                    self.sender.abort("the sandbox paused or died").await;
                    break;
                }
                () = sleep_until(dies_at) => {
                    crate::lifecycle::kill(&self.app, &self.id).await;
                    self.sender.abort("the sandbox died").await;
                    return;
                }
            }
        }
        // The stream is over but the process may not be: keep reading its output so it never
        // blocks on a full pipe, and forget it when it ends.
        drop(self.sender);
        while let Ok(Some(frame)) = exec.next_frame().await {
            if frame.tag == Tag::End {
                break;
            }
        }
        let Stream { app, id, pid, .. } = self;
        app.sandboxes.with(&id, |s| s.processes.remove(&pid));
    }

    async fn send(&mut self, value: &Value) -> bool {
        self.sender.send(message(value)).await
    }

    fn forget(&self) {
        self.app
            .sandboxes
            .with(&self.id, |s| s.processes.remove(&self.pid));
    }
}

/// The end event as protojson writes it: fields in number order, zero values left out.
fn end_json(end: &End) -> String {
    let mut fields = Vec::new();
    if end.exit_code != 0 {
        fields.push(format!("\"exitCode\":{}", end.exit_code));
    }
    if end.exited {
        fields.push("\"exited\":true".to_owned());
    }
    if !end.status.is_empty() {
        fields.push(format!("\"status\":{}", json!(end.status)));
    }
    if let Some(error) = &end.error {
        fields.push(format!("\"error\":{}", json!(error)));
    }
    format!("{{\"event\":{{\"end\":{{{}}}}}}}", fields.join(","))
}

async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

fn list(app: &App, target: &Target) -> Value {
    let processes: Vec<Value> = app
        .sandboxes
        .with(&target.id, |s| {
            s.processes
                .iter()
                .map(|(pid, p)| {
                    let mut info = json!({"config": p.config, "pid": pid});
                    if let (Some(tag), Some(o)) = (&p.tag, info.as_object_mut()) {
                        o.insert("tag".into(), json!(tag));
                    }
                    info
                })
                .collect()
        })
        .unwrap_or_default();
    // protojson leaves an empty repeated field out.
    if processes.is_empty() {
        json!({})
    } else {
        json!({"processes": processes})
    }
}

/// The pid a `ProcessSelector` names among the tracked processes.
fn select(app: &App, target: &Target, msg: &Value) -> Result<u32, RpcError> {
    let selector = msg.get("process").cloned().unwrap_or(json!({}));
    let found = app.sandboxes.with(&target.id, |s| {
        if let Some(pid) = selector.get("pid").and_then(Value::as_u64) {
            let pid = pid as u32;
            return s
                .processes
                .contains_key(&pid)
                .then_some(pid)
                .ok_or_else(|| {
                    RpcError::new(Code::NotFound, format!("process with pid {pid} not found"))
                });
        }
        if let Some(tag) = selector.get("tag").and_then(Value::as_str) {
            return s
                .processes
                .iter()
                .find(|(_, p)| p.tag.as_deref() == Some(tag))
                .map(|(pid, _)| *pid)
                .ok_or_else(|| {
                    RpcError::new(Code::NotFound, format!("process with tag {tag} not found"))
                });
        }
        Err(RpcError::new(
            Code::Unimplemented,
            "invalid input type <nil>",
        ))
    });
    found.unwrap_or_else(|| Err(RpcError::new(Code::Unavailable, "the sandbox is gone")))
}

async fn send_signal(app: &App, target: &Target, msg: &Value) -> Result<Value, RpcError> {
    let pid = select(app, target, msg)?;
    let signal = match msg.get("signal") {
        Some(Value::String(name)) if name == "SIGNAL_SIGKILL" => 9,
        Some(Value::String(name)) if name == "SIGNAL_SIGTERM" => 15,
        Some(Value::Number(n)) if n.as_u64() == Some(9) || n.as_u64() == Some(15) => {
            n.as_u64().unwrap_or(9)
        }
        other => {
            let shown = other.map_or("SIGNAL_UNSPECIFIED".to_owned(), Value::to_string);
            return Err(RpcError::new(
                Code::Unimplemented,
                format!("invalid signal: {shown}"),
            ));
        }
    };
    let (pid_text, signal_text) = (pid.to_string(), signal.to_string());
    let mut exec = app
        .vms
        .agent(
            &target.container,
            "root",
            &["signal", "--pid", &pid_text, "--signal", &signal_text],
            false,
        )
        .await
        .map_err(|e| RpcError::new(Code::Internal, format!("error sending signal: {e}")))?;
    while let Ok(Some(_)) = exec.next_frame().await {}
    Ok(json!({}))
}

async fn send_input(app: &App, target: &Target, msg: &Value) -> Result<Value, RpcError> {
    let pid = select(app, target, msg)?;
    let Some(data) = msg
        .get("input")
        .and_then(|i| i.get("stdin"))
        .and_then(Value::as_str)
    else {
        return Err(RpcError::new(Code::Unimplemented, "invalid input type"));
    };
    let bytes = STANDARD
        .decode(data)
        .map_err(|e| RpcError::new(Code::InvalidArgument, e.to_string()))?;
    let stdin = stdin_of(app, target, pid)?;
    let mut guard = stdin.lock().await;
    let writer = guard
        .as_mut()
        .ok_or_else(|| RpcError::new(Code::Internal, "error writing to stdin: stdin is closed"))?;
    writer
        .write_all(&bytes)
        .await
        .map_err(|e| RpcError::new(Code::Internal, format!("error writing to stdin: {e}")))?;
    let _ = writer.flush().await;
    Ok(json!({}))
}

async fn close_stdin(app: &App, target: &Target, msg: &Value) -> Result<Value, RpcError> {
    let pid = select(app, target, msg)?;
    let stdin = stdin_of(app, target, pid)?;
    if let Some(mut writer) = stdin.lock().await.take() {
        let _ = writer.shutdown().await;
    }
    Ok(json!({}))
}

fn stdin_of(app: &App, target: &Target, pid: u32) -> Result<SharedInput, RpcError> {
    app.sandboxes
        .with(&target.id, |s| {
            s.processes.get(&pid).and_then(|p| p.stdin.clone())
        })
        .flatten()
        .ok_or_else(|| RpcError::new(Code::Internal, "error writing to stdin: stdin not enabled"))
}
