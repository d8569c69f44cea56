//! The REST routes of a sandbox endpoint's files (grants.md §7.3), under the sandbox-scoped
//! endpoint credential: `POST /v1/files/upload` (multipart/form-data, per file a `metadata`
//! part `{path, mode}` then its `content`) and `GET /v1/files/download?paths=…`
//! (multipart/mixed: `metadata` and `content` per file, `error` for a path that cannot be
//! read; the closing delimiter is required). Exec is a plain JSON call ([`super::api::rest`]).

use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Method, StatusCode};
use serde_json::json;

use super::api::{ApiError, MAX_ANSWER};
use crate::provider::e2b::http::Client;

fn headers(bearer: &str, content_type: Option<&str>) -> Result<HeaderMap, ApiError> {
    let mut h = HeaderMap::new();
    let auth = HeaderValue::from_str(&format!("Bearer {bearer}"))
        .map_err(|_| ApiError::Answer("the credential is not a header value".to_owned()))?;
    h.insert(http::header::AUTHORIZATION, auth);
    if let Some(content_type) = content_type {
        let value = HeaderValue::from_str(content_type).map_err(|_| {
            ApiError::Answer("a content type that is not a header value".to_owned())
        })?;
        h.insert(http::header::CONTENT_TYPE, value);
    }
    Ok(h)
}

async fn refusal(what: &str, response: crate::provider::e2b::http::Response) -> ApiError {
    let status = response.status;
    ApiError::Status {
        what: what.to_owned(),
        status,
        text: response.error_text().await,
    }
}

/// Writes `files` in one multipart upload; how many the answer says were written.
pub async fn upload(
    client: &Client,
    path: &str,
    bearer: &str,
    files: &[(String, Vec<u8>)],
    bound: Duration,
) -> Result<u64, ApiError> {
    let boundary = format!("plimsoll-{}", hex::encode(rand::random::<[u8; 12]>()));
    let mut body = Vec::new();
    for (file, data) in files {
        let meta = json!({ "path": file, "mode": 420 }).to_string();
        for (name, content_type, bytes) in [
            ("metadata", "application/json", meta.as_bytes()),
            ("content", "application/octet-stream", data.as_slice()),
        ] {
            body.extend_from_slice(
                format!(
                    "--{boundary}\r\nContent-Disposition: form-data; name=\"{name}\"\r\nContent-Type: {content_type}\r\n\r\n"
                )
                .as_bytes(),
            );
            body.extend_from_slice(bytes);
            body.extend_from_slice(b"\r\n");
        }
    }
    body.extend_from_slice(format!("--{boundary}--\r\n").as_bytes());
    let content_type = format!("multipart/form-data; boundary={boundary}");
    let headers = headers(bearer, Some(&content_type))?;
    let response = client
        .send(Method::POST, path, headers, Bytes::from(body), None, bound)
        .await?;
    if response.status != StatusCode::OK {
        return Err(refusal("the REST upload", response).await);
    }
    let answer = response
        .bytes(MAX_ANSWER, bound)
        .await
        .map_err(|e| ApiError::Answer(format!("the REST upload: {e}")))?;
    let answer: serde_json::Value = serde_json::from_slice(&answer)
        .map_err(|e| ApiError::Answer(format!("the REST upload: not JSON: {e}")))?;
    Ok(answer["filesWritten"].as_u64().unwrap_or(0))
}

/// Reads `file`: `None` when the answer has an `error` part for it (absent or unreadable).
pub async fn download(
    client: &Client,
    path: &str,
    bearer: &str,
    file: &str,
    limit: usize,
    bound: Duration,
) -> Result<Option<Vec<u8>>, ApiError> {
    let query: String =
        percent_encoding::utf8_percent_encode(file, percent_encoding::NON_ALPHANUMERIC).collect();
    let route = format!("{path}?paths={query}");
    let response = client
        .send(
            Method::GET,
            &route,
            headers(bearer, None)?,
            Bytes::new(),
            None,
            bound,
        )
        .await?;
    if response.status != StatusCode::OK {
        return Err(refusal("the REST download", response).await);
    }
    let boundary = response
        .headers
        .get(http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|t| {
            let mut parts = t.split(';').map(str::trim);
            parts
                .next()
                .filter(|m| m.eq_ignore_ascii_case("multipart/mixed"))?;
            parts.find_map(|p| p.strip_prefix("boundary="))
        })
        .map(|b| b.trim_matches('"').to_owned())
        .filter(|b| !b.is_empty())
        .ok_or_else(|| ApiError::Answer("the REST download is not multipart/mixed".to_owned()))?;
    // The content and the parts around it.
    let body = response
        .bytes(limit + (64 << 10), bound)
        .await
        .map_err(|e| ApiError::Answer(format!("the REST download of {file}: {e}")))?;
    let parts = parts(&body, &boundary).map_err(|why| {
        ApiError::Answer(format!("the REST download of {file} is malformed: {why}"))
    })?;
    let mut content = None;
    for (name, bytes) in parts {
        match name.as_str() {
            "error" => return Ok(None),
            "content" => content = Some(bytes.to_vec()),
            _ => {}
        }
    }
    Ok(content)
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

/// A multipart body's parts (`name` from Content-Disposition, bytes); the closing delimiter
/// is required, so a cut answer is never taken for a whole one.
pub(super) fn parts<'a>(
    body: &'a [u8],
    boundary: &str,
) -> Result<Vec<(String, &'a [u8])>, &'static str> {
    let delimiter = format!("--{boundary}").into_bytes();
    let next = [b"\r\n".as_slice(), &delimiter].concat();
    let start = find(body, &delimiter).ok_or("no delimiter")?;
    let mut rest = &body[start + delimiter.len()..];
    let mut out = Vec::new();
    loop {
        if rest.starts_with(b"--") {
            return Ok(out);
        }
        rest = rest
            .strip_prefix(b"\r\n")
            .ok_or("a delimiter not followed by CRLF")?;
        let head_end = find(rest, b"\r\n\r\n").ok_or("part headers not ended")?;
        let head = String::from_utf8_lossy(&rest[..head_end]).into_owned();
        rest = &rest[head_end + 4..];
        let end = find(rest, &next).ok_or("no closing delimiter")?;
        let name = head
            .lines()
            .filter_map(|l| l.split_once(':'))
            .filter(|(k, _)| k.trim().eq_ignore_ascii_case("content-disposition"))
            .flat_map(|(_, v)| v.split(';'))
            .find_map(|p| p.trim().strip_prefix("name="))
            .map(|n| n.trim_matches('"').to_owned())
            .unwrap_or_default();
        out.push((name, &rest[..end]));
        rest = &rest[end + next.len()..];
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn a_multipart_answer_needs_its_closing_delimiter() {
        let body = b"--b\r\nContent-Disposition: attachment; name=content\r\n\r\nhi\r\n--b--\r\n";
        let found = parts(body, "b").unwrap();
        assert_eq!(found.len(), 1);
        assert_eq!(found[0].0, "content");
        assert_eq!(found[0].1, b"hi");
        let cut = b"--b\r\nContent-Disposition: attachment; name=content\r\n\r\nhi";
        assert!(parts(cut, "b").is_err());
    }
}
