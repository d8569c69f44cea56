//! The REST routes of a sandbox endpoint: `POST /v1/processes/exec`,
//! `POST /v1/files/upload` (multipart/form-data: `metadata` then `content` per file;
//! parents are created) and `GET /v1/files/download?paths=…` (multipart/mixed:
//! `metadata` and `content` per file, `error` for a path that cannot be read).
//!
//! Only a sandbox-scoped endpoint credential is accepted: the management access token is
//! refused (401 "invalid endpoint credential"), a credential for another sandbox is 404,
//! and an expired one is 401 with reason `ENDPOINT_CREDENTIAL_EXPIRED`, also for an exec
//! still running when its credential expires (it is cut off).

use std::time::SystemTime;

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use hyper::body::Incoming;
use hyper::{Method, Request};
use serde_json::{Value, json};
use std::sync::Arc;

use crate::endpoint::{parse_exec, read_file, run_exec, running_container, write_file};
use crate::error::{ApiError, Code};
use crate::http::{Reply, bytes_reply, json_reply, read_body};
use crate::state::State;
use crate::views::prune;

fn refuse(e: &ApiError) -> Reply {
    json_reply(e.rest_status(), &e.rest_json())
}

fn expired() -> ApiError {
    ApiError::unauthenticated("endpoint credential expired").with_detail(json!({
        "@type": "type.googleapis.com/google.rpc.ErrorInfo",
        "reason": "ENDPOINT_CREDENTIAL_EXPIRED",
        "domain": "sandboxes.docker.com",
    }))
}

/// Checks the endpoint credential for `permission` on sandbox `id`; answers its expiry.
fn authorize(
    state: &State,
    id: &str,
    headers: &http::HeaderMap,
    permission: &str,
) -> Result<SystemTime, ApiError> {
    let invalid = || ApiError::unauthenticated("invalid endpoint credential");
    let token = crate::http::bearer(headers).ok_or_else(invalid)?;
    let credential = state
        .lock()
        .credentials
        .get(&crate::auth::token_hash(token))
        .cloned()
        .ok_or_else(invalid)?;
    if credential.expires <= SystemTime::now() {
        return Err(expired());
    }
    if credential.sandbox_id != id {
        return Err(ApiError::not_found(
            "the credential does not address this sandbox endpoint",
        ));
    }
    if !credential.permissions.iter().any(|p| p == permission) {
        return Err(ApiError::new(
            Code::PermissionDenied,
            format!("the credential does not grant {permission}"),
        ));
    }
    Ok(credential.expires)
}

pub async fn handle(state: Arc<State>, id: &str, route: &str, request: Request<Incoming>) -> Reply {
    let result = match (request.method().clone(), route) {
        (Method::POST, "/v1/processes/exec") => exec(&state, id, request).await,
        (Method::POST, "/v1/files/upload") => upload(&state, id, request).await,
        (Method::GET, "/v1/files/download") => download(&state, id, request).await,
        _ => Err(ApiError::not_found("no such route")),
    };
    result.unwrap_or_else(|e| refuse(&e))
}

async fn exec(state: &Arc<State>, id: &str, request: Request<Incoming>) -> Result<Reply, ApiError> {
    let expires = authorize(state, id, request.headers(), "sandboxesExec")?;
    let body = read_body(request.into_body(), 1 << 20).await?;
    let input: Value =
        serde_json::from_slice(&body).map_err(|_| ApiError::invalid("the body is not JSON"))?;
    if let Some(unknown) = input.as_object().and_then(|m| {
        m.keys()
            .find(|k| !["cmd", "env", "workingDir", "user"].contains(&k.as_str()))
    }) {
        return Err(ApiError::invalid(format!("unknown field {unknown}")));
    }
    let request = parse_exec(&input)?;
    let container = running_container(state, id)?;
    let left = expires
        .duration_since(SystemTime::now())
        .unwrap_or_default();
    let out = match tokio::time::timeout(left, run_exec(state, id, &container, request)).await {
        Ok(out) => out?,
        Err(_) => return Err(expired()),
    };
    Ok(json_reply(
        200,
        &prune(json!({
            "exitCode": out.exit_code,
            "stdout": STANDARD.encode(&out.stdout),
            "stderr": STANDARD.encode(&out.stderr),
            "incomplete": out.incomplete,
        })),
    ))
}

fn boundary(headers: &http::HeaderMap, want: &str) -> Result<String, ApiError> {
    let content_type = headers
        .get(hyper::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    let mut parts = content_type.split(';').map(str::trim);
    if !parts.next().is_some_and(|m| m.eq_ignore_ascii_case(want)) {
        return Err(ApiError::invalid(format!("the body must be {want}")));
    }
    parts
        .find_map(|p| p.strip_prefix("boundary="))
        .map(|b| b.trim_matches('"').to_owned())
        .filter(|b| !b.is_empty())
        .ok_or_else(|| ApiError::invalid("multipart boundary missing"))
}

/// One multipart part: its `name` (Content-Disposition) and bytes.
struct Part {
    name: String,
    body: Vec<u8>,
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

/// Splits a multipart body; the closing delimiter is required.
fn parse_multipart(body: &[u8], boundary: &str) -> Result<Vec<Part>, ApiError> {
    let bad = |why: &str| ApiError::invalid(format!("malformed multipart body: {why}"));
    let delimiter = format!("--{boundary}").into_bytes();
    let start = find(body, &delimiter).ok_or_else(|| bad("no delimiter"))?;
    let mut rest = &body[start + delimiter.len()..];
    let mut parts = Vec::new();
    loop {
        if rest.starts_with(b"--") {
            return Ok(parts);
        }
        rest = rest
            .strip_prefix(b"\r\n")
            .ok_or_else(|| bad("delimiter not followed by CRLF"))?;
        let head_end = find(rest, b"\r\n\r\n").ok_or_else(|| bad("part headers not ended"))?;
        let head = String::from_utf8_lossy(&rest[..head_end]).to_string();
        rest = &rest[head_end + 4..];
        let mut next = b"\r\n".to_vec();
        next.extend_from_slice(&delimiter);
        let end = find(rest, &next).ok_or_else(|| bad("no closing delimiter"))?;
        let mut name = String::new();
        for line in head.lines() {
            let Some((key, value)) = line.split_once(':') else {
                continue;
            };
            if key.trim().eq_ignore_ascii_case("content-transfer-encoding") {
                return Err(bad("Content-Transfer-Encoding is refused"));
            }
            if key.trim().eq_ignore_ascii_case("content-disposition") {
                name = value
                    .split(';')
                    .filter_map(|p| p.trim().strip_prefix("name="))
                    .map(|n| n.trim_matches('"').to_owned())
                    .next()
                    .unwrap_or_default();
            }
        }
        parts.push(Part {
            name,
            body: rest[..end].to_vec(),
        });
        rest = &rest[end + next.len()..];
    }
}

async fn upload(
    state: &Arc<State>,
    id: &str,
    request: Request<Incoming>,
) -> Result<Reply, ApiError> {
    authorize(state, id, request.headers(), "sandboxesFilesWrite")?;
    let boundary = boundary(request.headers(), "multipart/form-data")?;
    let body = read_body(request.into_body(), 64 << 20).await?;
    let parts = parse_multipart(&body, &boundary)?;
    let container = running_container(state, id)?;
    let mut written = 0u32;
    let mut pending: Option<(String, u32)> = None;
    for (index, part) in parts.iter().enumerate() {
        match (part.name.as_str(), pending.take()) {
            ("metadata", None) => {
                let header: Value = serde_json::from_slice(&part.body).map_err(|_| {
                    ApiError::invalid(format!("part {index}: metadata is not JSON"))
                })?;
                let path = header["path"]
                    .as_str()
                    .filter(|p| p.starts_with('/'))
                    .ok_or_else(|| {
                        ApiError::invalid(format!("part {index}: path must be absolute"))
                    })?;
                pending = Some((path.to_owned(), header["mode"].as_u64().unwrap_or(0) as u32));
            }
            ("content", Some((path, mode))) => {
                // Unlike the Connect upload, parents are created.
                let parent = path
                    .rsplit_once('/')
                    .map(|(d, _)| d)
                    .filter(|d| !d.is_empty())
                    .unwrap_or("/");
                let mkdir = ["mkdir", "-p", "--", parent].map(str::to_owned).to_vec();
                state
                    .docker
                    .run(
                        &container,
                        crate::docker::Command::new(mkdir, &state.settings.sandbox_user),
                        &[],
                        4096,
                    )
                    .await
                    .map_err(|e| ApiError::internal(format!("upload: {e}")))?;
                write_file(state, &container, &path, mode, &part.body).await?;
                written += 1;
            }
            _ => {
                return Err(ApiError::invalid(format!(
                    "part {index}: expected metadata then content"
                )));
            }
        }
    }
    if pending.is_some() {
        return Err(ApiError::invalid("the last file has no content part"));
    }
    Ok(json_reply(200, &prune(json!({ "filesWritten": written }))))
}

async fn download(
    state: &Arc<State>,
    id: &str,
    request: Request<Incoming>,
) -> Result<Reply, ApiError> {
    authorize(state, id, request.headers(), "sandboxesFilesRead")?;
    let paths: Vec<String> = request
        .uri()
        .query()
        .unwrap_or("")
        .split('&')
        .filter_map(|pair| pair.split_once('='))
        .filter(|(k, _)| *k == "paths")
        .map(|(_, v)| percent_decode(v))
        .collect();
    if paths.is_empty() {
        return Err(ApiError::invalid("paths is required"));
    }
    let container = running_container(state, id)?;
    let boundary = crate::ids::hex_id(12);
    let mut body = Vec::new();
    let mut part = |name: &str, content_type: &str, bytes: &[u8]| {
        body.extend_from_slice(
            format!("--{boundary}\r\nContent-Disposition: attachment; name={name}\r\nContent-Type: {content_type}\r\n\r\n")
                .as_bytes(),
        );
        body.extend_from_slice(bytes);
        body.extend_from_slice(b"\r\n");
    };
    for path in &paths {
        match read_file(state, &container, path).await? {
            Ok((mode, bytes)) => {
                let meta = json!({ "path": path, "mode": mode }).to_string();
                part("metadata", "application/json", meta.as_bytes());
                part("content", "application/octet-stream", &bytes);
            }
            Err(e) => {
                let error = json!({ "path": path, "failure": e.rest_json() }).to_string();
                part("error", "application/json", error.as_bytes());
            }
        }
    }
    body.extend_from_slice(format!("--{boundary}--\r\n").as_bytes());
    Ok(bytes_reply(
        200,
        &format!("multipart/mixed; boundary={boundary}"),
        body,
    ))
}

fn percent_decode(text: &str) -> String {
    let hex = |b: u8| (b as char).to_digit(16).map(|d| d as u8);
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match (
            bytes[i],
            bytes.get(i + 1).copied().and_then(hex),
            bytes.get(i + 2).copied().and_then(hex),
        ) {
            (b'%', Some(high), Some(low)) => {
                out.push(high << 4 | low);
                i += 3;
            }
            (b'+', _, _) => {
                out.push(b' ');
                i += 1;
            }
            (b, _, _) => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn multipart_needs_its_closing_delimiter() {
        let body =
            b"--b\r\nContent-Disposition: form-data; name=\"metadata\"\r\n\r\n{}\r\n--b--\r\n";
        let parts = parse_multipart(body, "b").unwrap();
        assert_eq!(parts.len(), 1);
        assert_eq!(parts[0].name, "metadata");
        assert_eq!(parts[0].body, b"{}");
        let cut = b"--b\r\nContent-Disposition: form-data; name=\"metadata\"\r\n\r\n{}";
        assert!(parse_multipart(cut, "b").is_err());
    }

    #[test]
    fn query_values_are_percent_decoded() {
        assert_eq!(percent_decode("%2Ftmp%2Fa+b"), "/tmp/a b");
        assert_eq!(percent_decode("/tmp/x"), "/tmp/x");
    }
}
