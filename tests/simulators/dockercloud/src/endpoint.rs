//! Each sandbox's endpoint (`core.endpoint.uri`, here `<endpoint base>/sandboxes/<id>`):
//! the Connect services `docker.sbx.process.v1.ProcessService/Exec` and
//! `docker.sbx.files.v1.FileService/{Upload, Download}`, authorized by the same access
//! token as the management API, and the REST endpoint routes (`/v1/processes/exec`,
//! `/v1/files/upload`, `/v1/files/download`, see [`crate::rest_endpoint`]), authorized only
//! by a sandbox-scoped endpoint credential.
//!
//! Exec has no timeout and no input; its output is kept up to [`EXEC_CAPTURE`] bytes
//! (the REST API reports the cut as `incomplete`). Upload does not create parent
//! directories.

use std::sync::Arc;

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use hyper::body::Incoming;
use hyper::{Method, Request};
use serde_json::{Value, json};

use crate::connect::{self, Refusal};
use crate::docker::Command;
use crate::error::{ApiError, Code};
use crate::http::{Reply, json_reply, read_body};
use crate::state::{State, Status};
use crate::views::prune;

/// How much exec output (stdout and stderr together) is kept.
pub const EXEC_CAPTURE: usize = 4 << 20;
/// The largest file a download reads.
pub const MAX_DOWNLOAD_FILE: usize = 64 << 20;
/// Data frames of a download carry at most this many bytes.
pub const DOWNLOAD_CHUNK: usize = 256 << 10;

/// Serves the endpoint host.
pub async fn handle(state: Arc<State>, request: Request<Incoming>) -> Reply {
    let path = request.uri().path().to_owned();
    let Some((id, route)) = path
        .strip_prefix("/sandboxes/")
        .and_then(|rest| rest.split_once('/'))
        .map(|(id, route)| (id.to_owned(), format!("/{route}")))
    else {
        return json_reply(
            404,
            &json!({ "code": "not_found", "message": "404 page not found" }),
        );
    };
    if route.starts_with("/v1/") {
        return crate::rest_endpoint::handle(state, &id, &route, request).await;
    }
    if request.method() != Method::POST {
        return crate::http::with_header(crate::http::empty_reply(405), "allow", "POST");
    }
    match route.as_str() {
        "/docker.sbx.process.v1.ProcessService/Exec" => {
            connect::unary_reply(exec(&state, &id, request).await)
        }
        "/docker.sbx.files.v1.FileService/Upload" => match upload(&state, &id, request).await {
            Ok(answer) => connect::stream_reply(&[answer], None),
            Err(refusal) => connect::stream_refusal(refusal),
        },
        "/docker.sbx.files.v1.FileService/Download" => match download(&state, &id, request).await {
            Ok((frames, end)) => connect::stream_reply(&frames, end.as_ref()),
            Err(refusal) => connect::stream_refusal(refusal),
        },
        _ => json_reply(
            404,
            &json!({ "code": "not_found", "message": "404 page not found" }),
        ),
    }
}

/// The container of a running sandbox.
pub fn running_container(state: &State, id: &str) -> Result<String, ApiError> {
    let inner = state.lock();
    let sandbox = inner
        .sandboxes
        .get(id)
        .ok_or_else(|| ApiError::not_found("sandbox not found"))?;
    match (&sandbox.container, sandbox.status) {
        (Some(container), Status::Running) => Ok(container.clone()),
        _ => Err(ApiError::new(
            Code::FailedPrecondition,
            "sandbox is not running",
        )),
    }
}

/// What an exec request asks for.
pub struct ExecRequest {
    pub cmd: Vec<String>,
    pub env: Vec<String>,
    pub working_dir: Option<String>,
    pub user: Option<String>,
}

pub fn parse_exec(input: &Value) -> Result<ExecRequest, ApiError> {
    let cmd: Vec<String> = crate::protojson::strings(&input["cmd"])
        .ok_or_else(|| ApiError::invalid("cmd must be a list of strings"))?;
    if cmd.first().is_none_or(String::is_empty) {
        return Err(ApiError::invalid("cmd is required"));
    }
    let text = |name: &str| {
        input[name]
            .as_str()
            .filter(|s| !s.is_empty())
            .map(str::to_owned)
    };
    // `env` is a map<string, string>: KEY=value pairs added to the process's environment.
    let mut env = Vec::new();
    if let Some(map) = input["env"].as_object() {
        for (key, value) in map {
            let value = value
                .as_str()
                .ok_or_else(|| ApiError::invalid("env values must be strings"))?;
            if key.is_empty() || key.contains('=') {
                return Err(ApiError::invalid(format!("env name {key:?} is not valid")));
            }
            env.push(format!("{key}={value}"));
        }
    } else if !input["env"].is_null() {
        return Err(ApiError::invalid("env must be an object of strings"));
    }
    Ok(ExecRequest {
        cmd,
        env,
        working_dir: text("workingDir"),
        user: text("user"),
    })
}

/// Resolves once sandbox `id` no longer runs (deleted, stopped or failed).
async fn stops_running(state: &State, id: &str) {
    loop {
        let changed = state.changed.notified();
        if running_container(state, id).is_err() {
            return;
        }
        changed.await;
    }
}

/// Runs a command to completion in sandbox `id`, whose container is `container`; a sandbox
/// that stops running meanwhile ends it with an error, as its VM's end would.
pub async fn run_exec(
    state: &State,
    id: &str,
    container: &str,
    request: ExecRequest,
) -> Result<crate::docker::Captured, ApiError> {
    let stopped = || {
        ApiError::new(
            Code::Unavailable,
            "the sandbox stopped while the command ran",
        )
    };
    let out = tokio::select! {
        out = exec_in(state, container, request) => out?,
        () = stops_running(state, id) => return Err(stopped()),
    };
    // A VM's death ends the connection rather than reporting an exit.
    if state
        .docker
        .died_with_container(container, out.exit_code)
        .await
    {
        crate::lifecycle::container_died(state, id, container);
        return Err(stopped());
    }
    Ok(out)
}

async fn exec_in(
    state: &State,
    container: &str,
    request: ExecRequest,
) -> Result<crate::docker::Captured, ApiError> {
    if let Some(dir) = &request.working_dir
        && !dir.starts_with('/')
    {
        return Err(ApiError::invalid("workingDir must be an absolute path"));
    }
    let user = request
        .user
        .unwrap_or_else(|| state.settings.sandbox_user.clone());
    state
        .docker
        .run(
            container,
            Command {
                argv: request.cmd,
                user: Some(user),
                working_dir: request.working_dir,
                env: request.env,
                tty: false,
                closed_stdin: false,
            },
            &[],
            EXEC_CAPTURE,
        )
        .await
        .map_err(|e| ApiError::new(Code::FailedPrecondition, format!("exec: {e}")))
}

async fn exec(state: &Arc<State>, id: &str, request: Request<Incoming>) -> Result<Value, Refusal> {
    connect::check_headers(request.headers(), false)?;
    crate::auth::check_access_token(state, request.headers())?;
    let body = read_body(request.into_body(), connect::MAX_MESSAGE).await?;
    let input = connect::parse_unary(&body)?;
    let exec = parse_exec(&input)?;
    let container = running_container(state, id)?;
    let out = run_exec(state, id, &container, exec).await?;
    Ok(prune(json!({
        "exitCode": out.exit_code,
        "stdout": STANDARD.encode(&out.stdout),
        "stderr": STANDARD.encode(&out.stderr),
    })))
}

/// Writes one file; its parent directory must exist.
pub async fn write_file(
    state: &State,
    container: &str,
    path: &str,
    mode: u32,
    data: &[u8],
) -> Result<(), ApiError> {
    if !path.starts_with('/') || path.ends_with('/') {
        return Err(ApiError::invalid(format!(
            "path {path:?} must be an absolute file path"
        )));
    }
    let mode = match mode & 0o777 {
        0 => 0o644,
        bits => bits,
    };
    let script =
        "d=$(dirname -- \"$1\"); [ -d \"$d\" ] || exit 3; cat >\"$1\" && chmod \"$2\" \"$1\"";
    let argv = ["sh", "-c", script, "sh", path, &format!("{mode:o}")]
        .map(str::to_owned)
        .to_vec();
    let out = state
        .docker
        .run(
            container,
            Command::new(argv, &state.settings.sandbox_user),
            data,
            64 << 10,
        )
        .await
        .map_err(|e| ApiError::internal(format!("upload: {e}")))?;
    match out.exit_code {
        0 => Ok(()),
        3 => Err(ApiError::not_found(format!(
            "parent directory of {path} does not exist"
        ))),
        _ => Err(ApiError::new(
            Code::PermissionDenied,
            format!(
                "writing {path}: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            ),
        )),
    }
}

/// Reads one regular file: its mode and bytes, or the per-file failure.
pub async fn read_file(
    state: &State,
    container: &str,
    path: &str,
) -> Result<Result<(u32, Vec<u8>), ApiError>, ApiError> {
    if !path.starts_with('/') {
        return Ok(Err(ApiError::invalid(format!(
            "path {path:?} must be absolute"
        ))));
    }
    let script = "[ -f \"$1\" ] || exit 3; stat -c %a -- \"$1\" >&2 && cat -- \"$1\"";
    let argv = ["sh", "-c", script, "sh", path].map(str::to_owned).to_vec();
    let out = state
        .docker
        .run(
            container,
            Command::new(argv, &state.settings.sandbox_user),
            &[],
            MAX_DOWNLOAD_FILE,
        )
        .await
        .map_err(|e| ApiError::internal(format!("download: {e}")))?;
    if out.exit_code == 3 {
        return Ok(Err(ApiError::not_found(format!("{path}: no such file"))));
    }
    if out.exit_code != 0 || out.incomplete {
        return Ok(Err(ApiError::new(
            Code::PermissionDenied,
            format!(
                "reading {path}: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            ),
        )));
    }
    let mode = u32::from_str_radix(String::from_utf8_lossy(&out.stderr).trim(), 8).unwrap_or(0o644);
    Ok(Ok((mode, out.stdout)))
}

/// Upload: per file a `header` frame, then `data` frames; answers `filesWritten`.
async fn upload(
    state: &Arc<State>,
    id: &str,
    request: Request<Incoming>,
) -> Result<Value, Refusal> {
    connect::check_headers(request.headers(), true)?;
    crate::auth::check_access_token(state, request.headers())?;
    let body = read_body(request.into_body(), connect::MAX_STREAM_BODY).await?;
    let frames = connect::decode_envelopes(&body)?;
    let container = running_container(state, id)?;
    let mut files: Vec<(String, u32, Vec<u8>)> = Vec::new();
    for frame in &frames {
        match (frame.get("header"), frame.get("data")) {
            (Some(header), None) => {
                let path = header["path"]
                    .as_str()
                    .filter(|p| !p.is_empty())
                    .ok_or_else(|| ApiError::invalid("header.path is required"))?;
                let mode = header["mode"].as_u64().unwrap_or(0) as u32;
                files.push((path.to_owned(), mode, Vec::new()));
            }
            (None, Some(data)) => {
                let Some(current) = files.last_mut() else {
                    return Err(ApiError::invalid("the first frame must be a header").into());
                };
                let bytes = data
                    .as_str()
                    .and_then(|d| STANDARD.decode(d).ok())
                    .ok_or_else(|| ApiError::invalid("data must be base64"))?;
                current.2.extend_from_slice(&bytes);
            }
            _ => {
                return Err(
                    ApiError::invalid("a frame carries exactly one of header or data").into(),
                );
            }
        }
    }
    let mut written = 0u32;
    for (path, mode, data) in &files {
        write_file(state, &container, path, *mode, data).await?;
        written += 1;
    }
    Ok(prune(json!({ "filesWritten": written })))
}

/// Download: per path a `header` frame and `data` frames, or an `error` frame.
async fn download(
    state: &Arc<State>,
    id: &str,
    request: Request<Incoming>,
) -> Result<(Vec<Value>, Option<ApiError>), Refusal> {
    connect::check_headers(request.headers(), true)?;
    crate::auth::check_access_token(state, request.headers())?;
    let body = read_body(request.into_body(), connect::MAX_MESSAGE + 5).await?;
    let messages = connect::decode_envelopes(&body)?;
    let [input] = messages.as_slice() else {
        return Err(ApiError::invalid("a server-streaming call takes exactly one message").into());
    };
    let paths: Vec<String> = crate::protojson::strings(&input["paths"])
        .filter(|p: &Vec<String>| !p.is_empty())
        .ok_or_else(|| ApiError::invalid("paths must be a non-empty list of strings"))?;
    let container = running_container(state, id)?;
    let mut frames = Vec::new();
    for path in &paths {
        match read_file(state, &container, path).await? {
            Ok((mode, bytes)) => {
                frames.push(prune(json!({ "header": { "path": path, "mode": mode } })));
                for chunk in bytes.chunks(DOWNLOAD_CHUNK) {
                    frames.push(json!({ "data": STANDARD.encode(chunk) }));
                }
            }
            Err(e) => frames.push(json!({ "error": { "path": path, "message": e.message } })),
        }
    }
    Ok((frames, None))
}
