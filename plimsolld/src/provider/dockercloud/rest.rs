//! The REST transport's management calls (grants.md §7.3), `SANDBOX_DOCKERCLOUD_API=rest`:
//! the create under an `Idempotency-Key` (its name, so a resent create cannot make a second
//! sandbox), read until `running` with an endpoint; the sandbox's effective network policy;
//! the sandbox-scoped endpoint credential (at most 300 s); list; and the delete under
//! `If-Match`, whose answer proves nothing (it reports success for sandboxes that do not
//! exist, or that it left running), so the sandbox is re-read until it is gone.
//!
//! What booted is checked and the seal judged by the same code as over Connect
//! ([`Fleet::check`], [`Fleet::seal`]); this file only speaks the REST routes.

use std::time::Duration;

use http::Method;
use serde_json::{Value, json};

use super::api::{self, ApiError};
use super::sandbox::{
    BACKSTOP_SLACK, CALL_BOUND, DELETE_BOUND, Fleet, Image, POLL, READY_BOUND, SandboxError,
};

/// What an endpoint credential is asked for: everything a run does on the endpoint.
const ENDPOINT_PERMISSIONS: [&str; 3] =
    ["sandboxesExec", "sandboxesFilesRead", "sandboxesFilesWrite"];
/// The longest an endpoint credential lives (and what is asked for).
pub const CREDENTIAL_TTL: Duration = Duration::from_secs(300);
/// How many times a create whose answer was lost is resent under the same key.
const CREATE_ATTEMPTS: usize = 3;
/// How often a delete is resent while a re-read still shows the sandbox not being deleted.
const DELETE_RESEND: Duration = Duration::from_secs(2);

impl Fleet {
    /// One REST management call under the management base's path.
    async fn rest(
        &self,
        method: Method,
        route: &str,
        body: Option<&Value>,
        extra: &[(&'static str, &str)],
    ) -> Result<Value, ApiError> {
        let bearer = self.auth.bearer().await?;
        let path = format!("{}{route}", self.prefix);
        api::rest(&self.api, method, &path, &bearer, body, extra, CALL_BOUND).await
    }

    /// A sandbox as `GET /v1/sandboxes/{id}` shows it; `None` once it is gone.
    async fn rest_read(&self, id: &str) -> Result<Option<Value>, ApiError> {
        match self
            .rest(Method::GET, &format!("/v1/sandboxes/{id}"), None, &[])
            .await
        {
            Ok(sandbox) => Ok(Some(sandbox)),
            Err(e) if e.code() == Some("not_found") => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// The REST create, read until `running` with an endpoint: its id and the sandbox.
    pub(super) async fn rest_create(
        &self,
        name: &str,
        budget: Duration,
        made: &mut Option<String>,
    ) -> Result<(String, Value), SandboxError> {
        let Image::Reference(image) = &self.image else {
            // Refused by the configuration; kept as a refusal rather than a panic.
            return Err(SandboxError::Refused(
                "store images need the connect transport".to_owned(),
            ));
        };
        let request = json!({
            "displayName": name,
            "imageRef": image,
            "resources": { "cpus": self.cpus, "memoryMib": self.memory_mib.to_string() },
            "platform": { "os": "linux", "architecture": "amd64" },
            "startupExecution": { "rawImage": { "start": { "argv": ["tail", "-f", "/dev/null"] } } },
            "features": { "timeouts": {
                "timeout": format!("{}s", (budget + BACKSTOP_SLACK).as_secs()),
                "onTimeout": "delete",
                "autoResume": false,
            } },
        });
        let mut attempt = 0;
        // Whether any attempt may have reached the service (then one may be billed).
        let mut maybe_sent = false;
        let created = loop {
            attempt += 1;
            match self
                .rest(
                    Method::POST,
                    "/v1/sandboxes",
                    Some(&request),
                    &[("idempotency-key", name)],
                )
                .await
            {
                Ok(created) => break created,
                // The same key replays the same create: resending cannot make a second one.
                Err(ApiError::Http(e)) if attempt < CREATE_ATTEMPTS => {
                    maybe_sent |= !e.never_sent();
                    tracing::debug!(error = %e, "dockercloud REST create: resending under its key");
                    tokio::time::sleep(POLL).await;
                }
                Err(e) if e.code() == Some("resource_exhausted") => {
                    return Err(SandboxError::Quota(e.to_string()));
                }
                Err(e @ ApiError::Rpc { .. }) => {
                    return Err(SandboxError::Refused(e.to_string()));
                }
                Err(e) if !maybe_sent && e.never_sent() => return Err(SandboxError::Unsent(e)),
                Err(e) => return Err(e.into()),
            }
        };
        let id = created["uid"]
            .as_str()
            .filter(|id| super::sandbox::valid_id(id))
            .ok_or_else(|| ApiError::Answer("a REST create without a sandbox uid".to_owned()))?
            .to_owned();
        let deadline = tokio::time::Instant::now() + READY_BOUND;
        let sandbox = loop {
            let sandbox = self.rest_read(&id).await?.ok_or_else(|| {
                SandboxError::Refused(format!("sandbox {id} vanished while it was made"))
            })?;
            // Until the uid reads back with this create's name it may be anyone's sandbox:
            // a failure before that is cleaned up by the name, never by the uid.
            if sandbox["displayName"] != name {
                return Err(SandboxError::Refused(format!(
                    "sandbox {id} does not carry its name"
                )));
            }
            *made = Some(id.clone());
            let status = &sandbox["core"]["status"];
            if status == "running" && sandbox["core"]["endpoint"]["uri"].is_string() {
                break sandbox;
            }
            if status == "failed" {
                let why = api_text(&sandbox["failure"]);
                if sandbox["failure"]["code"] == "resourceExhausted" {
                    return Err(SandboxError::Quota(why));
                }
                return Err(SandboxError::Refused(format!("the create failed: {why}")));
            }
            if tokio::time::Instant::now() >= deadline {
                return Err(SandboxError::Refused(format!(
                    "sandbox {id} was not running with an endpoint within {READY_BOUND:?}"
                )));
            }
            tokio::time::sleep(POLL).await;
        };
        Ok((id, sandbox))
    }

    /// The sandbox's effective network policy (`{mode, allowNetworks}`). A policy the API
    /// cannot show (409) is a refusal: nothing runs on a seal that cannot be read.
    pub(super) async fn rest_policy(&self, id: &str) -> Result<Value, SandboxError> {
        match self
            .rest(
                Method::GET,
                &format!("/v1/sandboxes/{id}/network-policies"),
                None,
                &[],
            )
            .await
        {
            Ok(policies) => Ok(policies["effective"].clone()),
            Err(e @ ApiError::Rpc { .. }) if e.code() == Some("failed_precondition") => Err(
                SandboxError::Refused(format!("sandbox {id}'s network policy cannot be read: {e}")),
            ),
            Err(e) => Err(e.into()),
        }
    }

    /// A fresh endpoint credential for sandbox `id`, living [`CREDENTIAL_TTL`].
    pub async fn endpoint_credential(&self, id: &str) -> Result<String, ApiError> {
        let answer = self
            .rest(
                Method::POST,
                &format!("/v1/sandboxes/{id}/endpoint-credentials"),
                Some(&json!({
                    "permissions": ENDPOINT_PERMISSIONS,
                    "ttl": format!("{}s", CREDENTIAL_TTL.as_secs()),
                })),
                &[],
            )
            .await?;
        answer["token"]
            .as_str()
            .filter(|t| !t.is_empty() && t.bytes().all(|b| b.is_ascii_graphic()))
            .map(str::to_owned)
            .ok_or_else(|| ApiError::Answer("an endpoint credential without a token".to_owned()))
    }

    /// Deletes sandbox `id` (found by `name` when the create's answer was lost) and re-reads
    /// it until it is gone: the delete's own answer is never taken as proof.
    pub(super) async fn rest_delete(&self, id: Option<&str>, name: &str) -> Result<(), ApiError> {
        let id = match id {
            Some(id) => id.to_owned(),
            None => match self.rest_list().await?.into_iter().find(|(n, _)| n == name) {
                Some((_, id)) => id,
                None => return Ok(()),
            },
        };
        let deadline = tokio::time::Instant::now() + DELETE_BOUND;
        let mut sent: Option<tokio::time::Instant> = None;
        let mut warned = false;
        loop {
            let Some(sandbox) = self.rest_read(&id).await? else {
                return Ok(());
            };
            let deleting = sandbox["core"]["status"] == "deleting";
            if sent.is_some() && !deleting && !warned {
                warned = true;
                tracing::warn!(sandbox = %name, "dockercloud REST delete: answered, yet the sandbox is still there and not being deleted; resending");
            }
            let due = sent.is_none_or(|at| at.elapsed() >= DELETE_RESEND);
            if !deleting && due {
                let etag = sandbox["core"]["etag"].as_str().unwrap_or_default();
                match self
                    .rest(
                        Method::DELETE,
                        &format!("/v1/sandboxes/{id}?force=true"),
                        None,
                        &[("if-match", etag)],
                    )
                    .await
                {
                    // A changed etag or a sandbox already gone: the next read decides.
                    Ok(_) => {}
                    Err(e) if matches!(e.code(), Some("failed_precondition" | "not_found")) => {}
                    Err(e) => return Err(e),
                }
                sent = Some(tokio::time::Instant::now());
            }
            if tokio::time::Instant::now() >= deadline {
                return Err(ApiError::Answer(format!(
                    "sandbox {id} is still there {DELETE_BOUND:?} after its delete was answered"
                )));
            }
            tokio::time::sleep(POLL).await;
        }
    }

    /// Every sandbox name and id of the account, page by page (at most 50 pages).
    pub(super) async fn rest_list(&self) -> Result<Vec<(String, String)>, ApiError> {
        let mut out = Vec::new();
        let mut token = String::new();
        for _ in 0..50 {
            let mut route = "/v1/sandboxes?pageSize=100".to_owned();
            if !token.is_empty() {
                route.push_str("&pageToken=");
                route.extend(percent_encoding::utf8_percent_encode(
                    &token,
                    percent_encoding::NON_ALPHANUMERIC,
                ));
            }
            let page = self.rest(Method::GET, &route, None, &[]).await?;
            for s in page["sandboxes"].as_array().into_iter().flatten() {
                if let (Some(name), Some(id)) = (s["displayName"].as_str(), s["uid"].as_str()) {
                    out.push((name.to_owned(), id.to_owned()));
                }
            }
            match page["nextPageToken"].as_str() {
                Some(next) if !next.is_empty() => token = next.to_owned(),
                _ => break,
            }
        }
        Ok(out)
    }
}

/// A REST failure's message, scrubbed.
fn api_text(failure: &Value) -> String {
    crate::provider::e2b::http::scrub(failure["message"].as_str().unwrap_or("no reason given"))
}
