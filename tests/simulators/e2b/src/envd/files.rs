//! envd's `/files`: multipart (or octet-stream) upload and download.
//!
//! Both take `X-Access-Token` or, without it, the SDK's v1 signature (`signature`,
//! `signature_expiration`). `username` picks the owner of what is written and whose `~` and
//! home relative paths mean (envd's default user without it); envd itself works as root.
//! Upload answers 200 with `[{"name", "path", "type": "file"}]` (Go's encoder, no
//! content type set, so Go sniffs `text/plain; charset=utf-8`); download 404 for an absent
//! path, 400 for a directory.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD_NO_PAD;
use bytes::{BufMut, Bytes, BytesMut};
use http::{HeaderMap, HeaderValue, StatusCode, header};
use serde::Serialize;
use serde_json::json;
use sha2::{Digest, Sha256};
use tokio::io::AsyncWriteExt;

use super::{DEFAULT_USER, Target, User, lookup_user, resolve_path};
use crate::app::App;
use crate::frames::Tag;
use crate::guest::{Failure, Written};
use crate::http::{Request, Response, full, query_pairs};

/// The most one upload may carry.
const UPLOAD_LIMIT: usize = 512 << 20;
/// How long handing an upload to the VM may take.
const FEED_BUDGET: Duration = Duration::from_secs(300);

/// envd's `jsonError`: Go's encoder adds a newline.
fn json_error(status: StatusCode, message: &str) -> Response {
    let mut body = serde_json::to_vec(&json!({"code": status.as_u16(), "message": message}))
        .unwrap_or_default();
    body.push(b'\n');
    let mut response = full(status, Some("application/json; charset=utf-8"), body);
    response.headers_mut().insert(
        "x-content-type-options",
        HeaderValue::from_static("nosniff"),
    );
    response
}

/// The query of a `/files` call.
struct Params {
    path: Option<String>,
    username: Option<String>,
    signature: Option<String>,
    expiration: Option<i64>,
}

fn params(request: &Request) -> Params {
    let pairs = query_pairs(request.uri().query());
    let get = |name: &str| {
        pairs
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.clone())
    };
    Params {
        path: get("path"),
        username: get("username"),
        signature: get("signature"),
        expiration: get("signature_expiration").and_then(|v| v.parse().ok()),
    }
}

/// envd's `validateSigning`.
fn check_signing(
    target: &Target,
    headers: &HeaderMap,
    params: &Params,
    operation: &str,
) -> Result<(), String> {
    let Some(token) = &target.token else {
        return Ok(());
    };
    if let Some(sent) = headers.get("x-access-token") {
        return if sent.as_bytes() == token.as_bytes() {
            Ok(())
        } else {
            Err("access token present in header but does not match".to_owned())
        };
    }
    let Some(signature) = &params.signature else {
        return Err("missing signature query parameter".to_owned());
    };
    let path = params.path.as_deref().unwrap_or_default();
    let user = params.username.as_deref().unwrap_or_default();
    let mut raw = format!("{path}:{operation}:{user}:{token}");
    if let Some(expiration) = params.expiration {
        raw.push_str(&format!(":{expiration}"));
    }
    let expected = format!(
        "v1_{}",
        STANDARD_NO_PAD.encode(Sha256::digest(raw.as_bytes()))
    );
    if expected != *signature {
        return Err("invalid signature".to_owned());
    }
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64);
    if params.expiration.is_some_and(|e| e < now) {
        return Err("signature is already expired".to_owned());
    }
    Ok(())
}

fn user_of(params: &Params) -> Result<User, Box<Response>> {
    let name = params.username.as_deref().unwrap_or(DEFAULT_USER);
    lookup_user(name).ok_or_else(|| {
        Box::new(json_error(
            StatusCode::UNAUTHORIZED,
            &format!("error looking up user '{name}': user: unknown user {name}"),
        ))
    })
}

/// `[{"name","path","type"}]` in Go's field order.
#[derive(Serialize)]
struct EntryInfo {
    name: String,
    path: String,
    #[serde(rename = "type")]
    kind: &'static str,
}

pub async fn upload(app: &App, target: &Target, request: Request) -> Response {
    let params = params(&request);
    if let Err(message) = check_signing(target, request.headers(), &params, "write") {
        return json_error(StatusCode::UNAUTHORIZED, &message);
    }
    let user = match user_of(&params) {
        Ok(user) => user,
        Err(response) => return *response,
    };
    let encoded = request
        .headers()
        .get(header::CONTENT_ENCODING)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|e| !e.eq_ignore_ascii_case("identity"));
    if encoded {
        return json_error(
            StatusCode::BAD_REQUEST,
            "error decompressing request body: the E2B simulator takes uncompressed uploads only",
        );
    }
    let content_type = request
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    let media = content_type
        .split(';')
        .next()
        .unwrap_or_default()
        .trim()
        .to_ascii_lowercase();
    let files = if media == "application/octet-stream" {
        raw_file(&params, &user, request).await
    } else if media.starts_with("multipart/") {
        multipart_files(&params, &user, &content_type, request).await
    } else {
        Err(json_error(
            StatusCode::BAD_REQUEST,
            &format!(
                "unsupported content type: {content_type}, expected multipart/form-data or application/octet-stream"
            ),
        ))
    };
    let files = match files {
        Ok(files) => files,
        Err(response) => return response,
    };
    let (uid, gid) = (user.uid.to_string(), user.gid.to_string());
    let exec = app
        .vms
        .agent(
            &target.container,
            "root",
            &["write", "--uid", &uid, "--gid", &gid],
            true,
        )
        .await;
    let mut exec = match exec {
        Ok(exec) => exec,
        Err(e) => return json_error(StatusCode::BAD_GATEWAY, &e.to_string()),
    };
    if let Some(mut input) = exec.take_input() {
        let feed = async {
            for (path, data) in &files {
                let mut record = BytesMut::with_capacity(12 + path.len());
                record.put_u32(path.len() as u32);
                record.put_slice(path.as_bytes());
                record.put_u64(data.len() as u64);
                if input.write_all(&record).await.is_err() || input.write_all(data).await.is_err() {
                    break;
                }
            }
            let _ = input.shutdown().await;
        };
        if tokio::time::timeout(FEED_BUDGET, feed).await.is_err() {
            return json_error(
                StatusCode::BAD_GATEWAY,
                "the sandbox did not take the upload",
            );
        }
    }
    match exec.expect_frame().await {
        Ok(frame) if frame.tag == Tag::Result => {
            let written: Vec<Written> = serde_json::from_slice(&frame.payload).unwrap_or_default();
            let entries: Vec<EntryInfo> = written
                .into_iter()
                .map(|w| EntryInfo {
                    name: w.name,
                    path: w.path,
                    kind: "file",
                })
                .collect();
            full(
                StatusCode::OK,
                Some("text/plain; charset=utf-8"),
                serde_json::to_vec(&entries).unwrap_or_default(),
            )
        }
        Ok(frame) if frame.tag == Tag::Failed => failure_response(&frame.payload),
        Ok(_) => json_error(StatusCode::INTERNAL_SERVER_ERROR, "unexpected agent answer"),
        Err(e) => json_error(StatusCode::BAD_GATEWAY, &e.to_string()),
    }
}

fn failure_response(payload: &[u8]) -> Response {
    let failure: Failure = serde_json::from_slice(payload).unwrap_or(Failure {
        status: 500,
        code: String::new(),
        message: "unreadable agent failure".to_owned(),
    });
    let status = StatusCode::from_u16(failure.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    json_error(status, &failure.message)
}

async fn raw_file(
    params: &Params,
    user: &User,
    request: Request,
) -> Result<Vec<(String, Bytes)>, Response> {
    let Some(path) = &params.path else {
        return Err(json_error(
            StatusCode::BAD_REQUEST,
            "path query parameter is required for raw body upload",
        ));
    };
    let path = resolve_path(path, user).map_err(|e| {
        json_error(
            StatusCode::BAD_REQUEST,
            &format!("error resolving path: {e}"),
        )
    })?;
    let data = crate::http::read_body(request.into_body(), UPLOAD_LIMIT)
        .await
        .map_err(|e| json_error(StatusCode::BAD_REQUEST, &e.to_string()))?;
    Ok(vec![(path, data)])
}

async fn multipart_files(
    params: &Params,
    user: &User,
    content_type: &str,
    request: Request,
) -> Result<Vec<(String, Bytes)>, Response> {
    let bad = |status: StatusCode, message: String| json_error(status, &message);
    let boundary = multer::parse_boundary(content_type).map_err(|e| {
        bad(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("error parsing multipart form: {e}"),
        )
    })?;
    let stream = http_body_util::BodyStream::new(request.into_body());
    let stream = futures::StreamExt::filter_map(stream, |frame| async move {
        match frame {
            Ok(frame) => frame.into_data().ok().map(Ok::<Bytes, hyper::Error>),
            Err(e) => Some(Err(e)),
        }
    });
    let constraints = multer::Constraints::new()
        .size_limit(multer::SizeLimit::new().whole_stream(UPLOAD_LIMIT as u64));
    let mut form = multer::Multipart::with_constraints(stream, boundary, constraints);
    let mut files: Vec<(String, Bytes)> = Vec::new();
    loop {
        let field = match form.next_field().await {
            Ok(Some(field)) => field,
            Ok(None) => break,
            Err(e) => {
                return Err(bad(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    format!("error reading form: {e}"),
                ));
            }
        };
        if field.name() != Some("file") {
            continue;
        }
        let asked = match (&params.path, field.file_name()) {
            (Some(path), _) => path.clone(),
            (None, Some(name)) => name.to_owned(),
            (None, None) => {
                return Err(bad(
                    StatusCode::BAD_REQUEST,
                    "error getting multipart custom part file name: filename not found in Content-Disposition header".to_owned(),
                ));
            }
        };
        let path = resolve_path(&asked, user).map_err(|e| {
            bad(
                StatusCode::BAD_REQUEST,
                format!("error resolving path: {e}"),
            )
        })?;
        if files.iter().any(|(p, _)| *p == path) {
            return Err(bad(
                StatusCode::BAD_REQUEST,
                format!(
                    "you cannot upload multiple files to the same path '{path}' in one upload request, only the first specified file was uploaded"
                ),
            ));
        }
        let data = field.bytes().await.map_err(|e| {
            bad(
                StatusCode::INTERNAL_SERVER_ERROR,
                format!("error reading form: {e}"),
            )
        })?;
        files.push((path, data));
    }
    Ok(files)
}

pub async fn download(app: &App, target: &Target, request: Request) -> Response {
    let params = params(&request);
    if let Err(message) = check_signing(target, request.headers(), &params, "read") {
        return json_error(StatusCode::UNAUTHORIZED, &message);
    }
    let user = match user_of(&params) {
        Ok(user) => user,
        Err(response) => return *response,
    };
    let asked = params.path.clone().unwrap_or_default();
    let path = match resolve_path(&asked, &user) {
        Ok(path) => path,
        Err(e) => {
            return json_error(
                StatusCode::BAD_REQUEST,
                &format!("error expanding and resolving path '{asked}': {e}"),
            );
        }
    };
    let exec = app
        .vms
        .agent(&target.container, "root", &["read", "--path", &path], false)
        .await;
    let mut exec = match exec {
        Ok(exec) => exec,
        Err(e) => return json_error(StatusCode::BAD_GATEWAY, &e.to_string()),
    };
    let head = match exec.expect_frame().await {
        Ok(frame) if frame.tag == Tag::Result => frame,
        Ok(frame) if frame.tag == Tag::Failed => return failure_response(&frame.payload),
        Ok(_) => return json_error(StatusCode::INTERNAL_SERVER_ERROR, "unexpected agent answer"),
        Err(e) => return json_error(StatusCode::BAD_GATEWAY, &e.to_string()),
    };
    let stat: serde_json::Value = serde_json::from_slice(&head.payload).unwrap_or_default();
    let size = stat["size"].as_u64().unwrap_or(0);
    let modified = UNIX_EPOCH + Duration::from_secs(stat["modified"].as_u64().unwrap_or(0));
    // The first bytes decide the sniffed type, as Go's ServeContent does.
    let mut first = Bytes::new();
    if size > 0 {
        match exec.next_frame().await {
            Ok(Some(frame)) if frame.tag == Tag::Data => first = frame.payload,
            _ => {
                return json_error(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "the file could not be read",
                );
            }
        }
    }
    let name = path.rsplit('/').next().unwrap_or_default().to_owned();
    let content_type = content_type(&name, &first);
    let (mut sender, body) = crate::http::channel(8);
    tokio::spawn(async move {
        if !first.is_empty() && !sender.send(first).await {
            return;
        }
        loop {
            match exec.next_frame().await {
                Ok(Some(frame)) if frame.tag == Tag::Data => {
                    if !sender.send(frame.payload).await {
                        return;
                    }
                }
                Ok(None) => return,
                _ => {
                    sender.abort("the file could not be read").await;
                    return;
                }
            }
        }
    });
    let mut response = http::Response::new(body);
    let headers = response.headers_mut();
    for (name, value) in [
        (header::CONTENT_TYPE, content_type),
        (header::CONTENT_LENGTH, size.to_string()),
        (header::ACCEPT_RANGES, "bytes".to_owned()),
        (header::VARY, "Accept-Encoding".to_owned()),
        (header::LAST_MODIFIED, httpdate(modified)),
        (
            header::CONTENT_DISPOSITION,
            format!("inline; filename=\"{}\"", name.replace('"', "\\\"")),
        ),
    ] {
        if let Ok(value) = HeaderValue::from_str(&value) {
            headers.insert(name, value);
        }
    }
    response
}

/// Go's type for a name, by its built-in extension table, else sniffed from the bytes.
fn content_type(name: &str, first: &[u8]) -> String {
    let ext = name.rsplit_once('.').map(|(_, e)| e.to_ascii_lowercase());
    let by_ext = match ext.as_deref() {
        Some("css") => Some("text/css; charset=utf-8"),
        Some("gif") => Some("image/gif"),
        Some("htm" | "html") => Some("text/html; charset=utf-8"),
        Some("jpg" | "jpeg") => Some("image/jpeg"),
        Some("js" | "mjs") => Some("text/javascript; charset=utf-8"),
        Some("json") => Some("application/json"),
        Some("pdf") => Some("application/pdf"),
        Some("png") => Some("image/png"),
        Some("svg") => Some("image/svg+xml"),
        Some("wasm") => Some("application/wasm"),
        Some("xml") => Some("text/xml; charset=utf-8"),
        _ => None,
    };
    if let Some(known) = by_ext {
        return known.to_owned();
    }
    let sample = &first[..first.len().min(512)];
    let binary = sample
        .iter()
        .any(|&b| b < 0x20 && !matches!(b, b'\t' | b'\n' | b'\r' | 0x0c | 0x1b));
    if binary || std::str::from_utf8(sample).is_err() && sample.len() < 509 {
        "application/octet-stream".to_owned()
    } else {
        "text/plain; charset=utf-8".to_owned()
    }
}

fn httpdate(time: SystemTime) -> String {
    // RFC 7231's IMF-fixdate from RFC 3339 parts.
    let text = humantime::format_rfc3339_seconds(time).to_string();
    let days = time
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() / 86_400);
    let weekday = ["Thu", "Fri", "Sat", "Sun", "Mon", "Tue", "Wed"][(days % 7) as usize];
    let months = [
        "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
    ];
    let (date, clock) = text
        .trim_end_matches('Z')
        .split_once('T')
        .unwrap_or(("", ""));
    let mut parts = date.split('-');
    let (year, month, day) = (
        parts.next().unwrap_or("1970"),
        parts
            .next()
            .and_then(|m| m.parse::<usize>().ok())
            .unwrap_or(1),
        parts.next().unwrap_or("01"),
    );
    format!(
        "{weekday}, {day} {} {year} {clock} GMT",
        months[month.clamp(1, 12) - 1]
    )
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn http_dates_and_types_read_like_gos() {
        let t = UNIX_EPOCH + Duration::from_secs(784_111_777);
        assert_eq!(httpdate(t), "Sun, 06 Nov 1994 08:49:37 GMT");
        assert_eq!(content_type("a.json", b"{}"), "application/json");
        assert_eq!(content_type("a.txt", b"hello"), "text/plain; charset=utf-8");
        assert_eq!(
            content_type("a.bin", b"\x00\x01"),
            "application/octet-stream"
        );
    }

    #[test]
    fn signatures_match_the_sdks() {
        let target = Target {
            id: "x".into(),
            container: "c".into(),
            token: Some("tok".into()),
        };
        let raw = "/a:read::tok";
        let good = format!(
            "v1_{}",
            STANDARD_NO_PAD.encode(Sha256::digest(raw.as_bytes()))
        );
        let params = |signature: Option<String>| Params {
            path: Some("/a".into()),
            username: None,
            signature,
            expiration: None,
        };
        let none = HeaderMap::new();
        assert!(check_signing(&target, &none, &params(Some(good)), "read").is_ok());
        assert!(check_signing(&target, &none, &params(Some("v1_x".into())), "read").is_err());
        assert!(check_signing(&target, &none, &params(None), "read").is_err());
        let mut with_token = HeaderMap::new();
        with_token.insert("x-access-token", HeaderValue::from_static("tok"));
        assert!(check_signing(&target, &with_token, &params(None), "read").is_ok());
    }
}
