//! E2B's control plane (grants.md §6.2, §6.3, as E2B's SDK 2.63.0 speaks it): create with
//! `POST /v2/sandboxes`, read back with `GET /sandboxes/{id}`, kill with `DELETE`, list by
//! metadata with `GET /v2/sandboxes` and its `X-Next-Token` paging. Every call carries
//! `X-API-Key`; nothing here logs a body (a read-back holds the VM's tokens).

use std::collections::BTreeMap;
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Method, StatusCode};
use serde::{Deserialize, Serialize};

use super::http::{Client, HttpError, Response};

/// The bound on one control-plane call.
const CALL_BOUND: Duration = Duration::from_secs(30);
/// The largest control-plane answer read.
const MAX_ANSWER: usize = 4 << 20;
/// Pages of a listing read at most (grants.md §6.3).
const MAX_PAGES: usize = 100;
/// The backoff before each further kill attempt; the whole teardown stays within 33 s.
const KILL_BACKOFF: [Duration; 4] = [
    Duration::from_secs(1),
    Duration::from_secs(2),
    Duration::from_secs(4),
    Duration::from_secs(8),
];

/// Why a control-plane call failed.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// No response.
    #[error(transparent)]
    Http(#[from] HttpError),
    /// A status the call does not accept; the text is cut and scrubbed.
    #[error("E2B answered {0}")]
    Status(String, StatusCode),
    /// An answer that is not the expected JSON.
    #[error("E2B's answer could not be read: {0}")]
    Answer(String),
}

impl ApiError {
    /// Whether the request certainly never reached E2B (no connection was made).
    pub fn never_sent(&self) -> bool {
        matches!(self, ApiError::Http(h) if h.never_sent())
    }
}

/// `network` in a create body and a read-back.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Network {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allow_public_traffic: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allow_out: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deny_out: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rules: Option<serde_json::Value>,
    /// The nameservers an allowed domain opens. Left out, E2B opens `8.8.8.8` (every port)
    /// beside any domain in `allowOut`, and a network update that leaves it out resets it to
    /// that: a way out for anything the guest can say in a DNS query. Always sent, empty.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dns_servers: Option<Vec<String>>,
}

impl Network {
    /// No egress, no nameserver and no public traffic into the VM.
    pub fn deny_all() -> Network {
        Network {
            allow_public_traffic: Some(false),
            deny_out: Some(vec!["0.0.0.0/0".to_owned()]),
            dns_servers: Some(Vec::new()),
            ..Network::default()
        }
    }
}

/// `NewSandboxV2`, the fields plimsoll sends.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct NewSandbox<'a> {
    #[serde(rename = "templateID")]
    pub template_id: &'a str,
    /// Seconds until E2B itself kills the VM: the leak backstop.
    pub timeout: u64,
    pub auto_pause: bool,
    pub metadata: &'a BTreeMap<String, String>,
    pub network: Network,
}

/// The create answer (`Sandbox`): every field optional, so a missing one is judged, not a
/// parse failure.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Created {
    #[serde(rename = "sandboxID")]
    pub sandbox_id: Option<String>,
    pub envd_access_token: Option<String>,
    pub traffic_access_token: Option<String>,
}

/// `SandboxDetail` (and `ListedSandbox`), the fields plimsoll reads.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Detail {
    #[serde(rename = "sandboxID")]
    pub sandbox_id: String,
    /// The envelope (required by E2B's model): absent here means not stated, which the
    /// read-back refuses wherever a limit is set.
    #[serde(default)]
    pub cpu_count: Option<f64>,
    #[serde(rename = "memoryMB", default)]
    pub memory_mb: Option<u64>,
    #[serde(rename = "diskSizeMB", default)]
    pub disk_size_mb: Option<u64>,
    #[serde(default)]
    pub metadata: BTreeMap<String, String>,
    #[serde(default)]
    pub network: Option<Network>,
    /// `running` or `paused`.
    #[serde(default)]
    pub state: String,
}

/// The control plane.
#[derive(Debug, Clone)]
pub struct Api {
    client: Client,
    key: HeaderValue,
}

/// Whether `id` may be used in a host name or a path: E2B's ids are alphanumerics.
pub fn valid_id(id: &str) -> bool {
    (1..=64).contains(&id.len()) && id.bytes().all(|b| b.is_ascii_alphanumeric())
}

impl Api {
    /// The control plane at `client` with `key`.
    pub fn new(client: Client, key: &str) -> Result<Api, HttpError> {
        let mut key = HeaderValue::from_str(key).map_err(|e| HttpError::Build(e.to_string()))?;
        key.set_sensitive(true);
        Ok(Api { client, key })
    }

    /// The control plane's origin, for logs.
    pub fn origin(&self) -> String {
        self.client.origin()
    }

    async fn call(
        &self,
        method: Method,
        path: &str,
        body: Option<Vec<u8>>,
    ) -> Result<Response, HttpError> {
        let mut headers = HeaderMap::new();
        headers.insert("x-api-key", self.key.clone());
        if body.is_some() {
            headers.insert(
                http::header::CONTENT_TYPE,
                HeaderValue::from_static("application/json"),
            );
        }
        let body = Bytes::from(body.unwrap_or_default());
        self.client
            .send(method, path, headers, body, None, CALL_BOUND)
            .await
    }

    /// `POST /v2/sandboxes`. `Ok(Err(status))` is a 4xx: no VM was made.
    pub async fn create(
        &self,
        new: &NewSandbox<'_>,
    ) -> Result<Result<Created, ApiError>, ApiError> {
        let body = serde_json::to_vec(new).map_err(|e| ApiError::Answer(e.to_string()))?;
        let response = self.call(Method::POST, "/v2/sandboxes", Some(body)).await?;
        let status = response.status;
        if status.is_client_error() {
            return Ok(Err(ApiError::Status(response.error_text().await, status)));
        }
        if status != StatusCode::OK && status != StatusCode::CREATED {
            return Err(ApiError::Status(response.error_text().await, status));
        }
        let body = response
            .bytes(MAX_ANSWER, CALL_BOUND)
            .await
            .map_err(ApiError::Answer)?;
        serde_json::from_slice(&body)
            .map(Ok)
            .map_err(|e| ApiError::Answer(e.to_string()))
    }

    /// `GET /sandboxes/{id}`; `None` when E2B knows no such sandbox.
    pub async fn detail(&self, id: &str) -> Result<Option<Detail>, ApiError> {
        let response = self
            .call(Method::GET, &format!("/sandboxes/{id}"), None)
            .await?;
        match response.status {
            StatusCode::OK => {}
            StatusCode::NOT_FOUND => return Ok(None),
            status => return Err(ApiError::Status(response.error_text().await, status)),
        }
        let body = response
            .bytes(MAX_ANSWER, CALL_BOUND)
            .await
            .map_err(ApiError::Answer)?;
        serde_json::from_slice(&body)
            .map(Some)
            .map_err(|e| ApiError::Answer(e.to_string()))
    }

    /// `DELETE /sandboxes/{id}` once: 2xx or 404 is done.
    async fn kill_once(&self, id: &str) -> Result<(), ApiError> {
        let response = self
            .call(Method::DELETE, &format!("/sandboxes/{id}"), None)
            .await?;
        let status = response.status;
        if status.is_success() || status == StatusCode::NOT_FOUND {
            return Ok(());
        }
        Err(ApiError::Status(response.error_text().await, status))
    }

    /// Kills `id`, retrying with backoff; the last error when every attempt failed.
    pub async fn kill(&self, id: &str) -> Result<(), ApiError> {
        let mut last = match self.kill_once(id).await {
            Ok(()) => return Ok(()),
            Err(e) => e,
        };
        for pause in KILL_BACKOFF {
            tokio::time::sleep(pause).await;
            match self.kill_once(id).await {
                Ok(()) => return Ok(()),
                Err(e) => last = e,
            }
        }
        Err(last)
    }

    /// `POST /sandboxes/{id}/pause`: 204, or 409 when it is paused already. With
    /// `requireHealthyGuest` E2B refuses (503, the VM running on) rather than snapshot a VM
    /// whose envd does not answer, which only a cold `memory: false` resume could wake.
    pub async fn pause(&self, id: &str) -> Result<(), ApiError> {
        let body = br#"{"requireHealthyGuest":true}"#.to_vec();
        let response = self
            .call(Method::POST, &format!("/sandboxes/{id}/pause"), Some(body))
            .await?;
        let status = response.status;
        if status.is_success() || status == StatusCode::CONFLICT {
            return Ok(());
        }
        Err(ApiError::Status(response.error_text().await, status))
    }

    /// `POST /v2/sandboxes/{id}/connect` with E2B's timeout for it from now: 200 (it ran) or
    /// 201 (it was paused and runs again) with the sandbox's tokens; `None` when E2B knows no
    /// such sandbox.
    pub async fn connect(&self, id: &str, timeout: Duration) -> Result<Option<Created>, ApiError> {
        let body = serde_json::to_vec(&serde_json::json!({"timeout": timeout.as_secs().max(1)}))
            .map_err(|e| ApiError::Answer(e.to_string()))?;
        let response = self
            .call(
                Method::POST,
                &format!("/v2/sandboxes/{id}/connect"),
                Some(body),
            )
            .await?;
        match response.status {
            StatusCode::OK | StatusCode::CREATED => {}
            StatusCode::NOT_FOUND => return Ok(None),
            status => return Err(ApiError::Status(response.error_text().await, status)),
        }
        let body = response
            .bytes(MAX_ANSWER, CALL_BOUND)
            .await
            .map_err(ApiError::Answer)?;
        serde_json::from_slice(&body)
            .map(Some)
            .map_err(|e| ApiError::Answer(e.to_string()))
    }

    /// `PUT /sandboxes/{id}/network` (`SandboxNetworkUpdateConfig`): E2B replaces the egress
    /// config as a whole; ingress (`allowPublicTraffic`) is not part of it and stays.
    pub async fn set_network(&self, id: &str, network: &Network) -> Result<(), ApiError> {
        let update = Network {
            allow_public_traffic: None,
            ..network.clone()
        };
        let body = serde_json::to_vec(&update).map_err(|e| ApiError::Answer(e.to_string()))?;
        let response = self
            .call(Method::PUT, &format!("/sandboxes/{id}/network"), Some(body))
            .await?;
        let status = response.status;
        if status.is_success() {
            return Ok(());
        }
        Err(ApiError::Status(response.error_text().await, status))
    }

    /// Every running or paused sandbox whose metadata holds all of `filter`.
    pub async fn list(&self, filter: &[(&str, &str)]) -> Result<Vec<Detail>, ApiError> {
        let metadata: Vec<String> = filter
            .iter()
            .map(|(k, v)| format!("{}={}", encode(k), encode(v)))
            .collect();
        let base = format!(
            "/v2/sandboxes?metadata={}&state=running,paused&limit=100",
            encode(&metadata.join("&"))
        );
        let mut found = Vec::new();
        let mut next: Option<String> = None;
        for _ in 0..MAX_PAGES {
            let path = match &next {
                Some(token) => format!("{base}&nextToken={}", encode(token)),
                None => base.clone(),
            };
            let response = self.call(Method::GET, &path, None).await?;
            if response.status != StatusCode::OK {
                let status = response.status;
                return Err(ApiError::Status(response.error_text().await, status));
            }
            next = response
                .headers
                .get("x-next-token")
                .and_then(|v| v.to_str().ok())
                .filter(|v| !v.is_empty())
                .map(str::to_owned);
            let body = response
                .bytes(MAX_ANSWER, CALL_BOUND)
                .await
                .map_err(ApiError::Answer)?;
            let page: Vec<Detail> =
                serde_json::from_slice(&body).map_err(|e| ApiError::Answer(e.to_string()))?;
            found.extend(page);
            if next.is_none() {
                break;
            }
        }
        Ok(found)
    }
}

/// Percent-encodes everything but RFC 3986's unreserved characters.
pub fn encode(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for b in text.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_alphanumerics_only() {
        assert!(valid_id("abc123XYZ"));
        for bad in ["", "a-b", "a.b", "a/b", "a b", &"a".repeat(65)] {
            assert!(!valid_id(bad), "{bad}");
        }
    }

    #[test]
    fn the_create_body_denies_all_egress_and_public_traffic() {
        let metadata = BTreeMap::from([("sdk".to_owned(), "plimsoll".to_owned())]);
        let body = serde_json::to_value(NewSandbox {
            template_id: "base",
            timeout: 40,
            auto_pause: false,
            metadata: &metadata,
            network: Network::deny_all(),
        })
        .unwrap_or_default();
        assert_eq!(
            body,
            serde_json::json!({"templateID": "base", "timeout": 40, "autoPause": false,
                "metadata": {"sdk": "plimsoll"},
                "network": {"allowPublicTraffic": false, "denyOut": ["0.0.0.0/0"],
                    "dnsServers": []}})
        );
        assert_eq!(encode("sdk=plimsoll&a b"), "sdk%3Dplimsoll%26a%20b");
    }
}
