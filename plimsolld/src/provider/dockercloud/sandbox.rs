//! One Docker Cloud sandbox per run (grants.md §7.2, §7.4, §7.7): its name
//! `plimsoll-<instance>-<random>` tracked before the create is sent; the create (no inline
//! network policy) followed through its operation and `GetSandbox` until RUNNING with an
//! endpoint; the checks of what booted (a Connect endpoint over https, CPU and memory
//! present and within what was asked, a pinned image's booted digest); and the seal: a
//! granted run's policy PUT echoed, then every run's `GetEffectiveNetworkPolicy` read back as
//! deny-all with exactly the run's entitlement. Any failed check deletes the sandbox before
//! code runs. A sandbox is deleted in the background once its run ends; its name and
//! admission slot are released only when the delete finished.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};

use super::api::{self, ApiError, Auth};
use super::config::{Transport, Url};
use super::endpoint::Endpoint;
use crate::provider::Hold;
use crate::provider::e2b::http::Client;
use crate::provider::tracked::Tracked;

/// The bound on one management call.
pub const CALL_BOUND: Duration = Duration::from_secs(20);
/// How long a create may take to reach RUNNING with an endpoint.
pub const READY_BOUND: Duration = Duration::from_secs(30);
/// How long a delete's operation is followed (REST: how long it is re-read).
pub const DELETE_BOUND: Duration = Duration::from_secs(20);
/// Polling interval of `GetOperation` and `GetSandbox`.
pub const POLL: Duration = Duration::from_millis(250);
/// What the service's own timeout adds to a run's budget: its leak backstop.
pub const BACKSTOP_SLACK: Duration = Duration::from_secs(30);
/// The status of a sandbox that can run code.
const RUNNING: &str = "SANDBOX_STATUS_RUNNING";
const DENY_ALL: &str = "NETWORK_POLICY_MODE_DENY_ALL";

/// Why a sandbox could not be made ready.
#[derive(Debug, thiserror::Error)]
pub enum SandboxError {
    /// The account's running-sandbox quota (refused, reason capacity).
    #[error("the account's sandbox quota is reached: {0}")]
    Quota(String),
    /// The service refused the create, or what booted failed a check; it is deleted.
    #[error("{0}")]
    Refused(String),
    /// A call failed; whatever the create made is deleted by name.
    #[error(transparent)]
    Api(#[from] ApiError),
    /// The create never left (no bearer, no connection): nothing was made or billed.
    #[error("the create was never sent: {0}")]
    Unsent(ApiError),
}

/// What a sandbox boots.
#[derive(Debug, Clone)]
pub enum Image {
    /// An OCI reference (`cloud.imageRef`), with the resources asked for.
    Reference(String),
    /// An image of the account's store (`image`), sized by the store.
    Store(String),
}

/// Everything a sandbox is made from.
pub struct Fleet {
    /// Chosen once at startup, never switched.
    pub transport: Transport,
    pub auth: Auth,
    pub api: Client,
    /// The management base's path (`/sbx`).
    pub prefix: String,
    pub policy: Client,
    pub policy_prefix: String,
    pub tls: Option<Arc<rustls::ClientConfig>>,
    /// This provider's random instance id, in every name it makes.
    pub instance: String,
    pub image: Image,
    /// The configured linux/amd64 manifest digest of a pinned image.
    pub pinned: Option<String>,
    pub cpus: u32,
    pub memory_mib: u64,
    pub names: Tracked,
}

/// A sandbox a run holds. Dropping it deletes the sandbox in the background, then releases
/// the name and the admission slot.
pub struct Sandbox {
    fleet: Arc<Fleet>,
    id: String,
    name: String,
    pub endpoint: Endpoint,
    hold: Option<Hold>,
}

impl Sandbox {
    pub fn id(&self) -> &str {
        &self.id
    }

    /// The bearer for this sandbox's endpoint: over Connect the exchanged one (it authorizes
    /// both); over REST a fresh sandbox-scoped credential, so every call has its full 300 s.
    pub async fn bearer(&self) -> Result<String, ApiError> {
        match self.fleet.transport {
            Transport::Connect => self.fleet.auth.bearer().await,
            Transport::Rest => self.fleet.endpoint_credential(&self.id).await,
        }
    }
}

impl Drop for Sandbox {
    fn drop(&mut self) {
        let fleet = self.fleet.clone();
        let (id, name, hold) = (
            std::mem::take(&mut self.id),
            std::mem::take(&mut self.name),
            self.hold.take(),
        );
        let delete = async move {
            fleet.delete_and_release(Some(&id), &name).await;
            drop(hold);
        };
        match tokio::runtime::Handle::try_current() {
            Ok(handle) => {
                handle.spawn(delete);
            }
            // Only at process exit: the service's own timeout or the next sweep ends it.
            Err(_) => {
                tracing::warn!("a sandbox was dropped outside the runtime; left to its timeout")
            }
        }
    }
}

/// The prefix of every name this instance makes.
pub fn name_prefix(instance: &str) -> String {
    format!("plimsoll-{instance}-")
}

impl Fleet {
    /// One management call.
    pub async fn call(&self, procedure: &str, message: &Value) -> Result<Value, ApiError> {
        let bearer = self.auth.bearer().await?;
        api::unary(
            &self.api,
            &self.prefix,
            procedure,
            &bearer,
            message,
            CALL_BOUND,
        )
        .await
    }

    /// Makes a sandbox for a run of `budget`, holding `hold` until it is deleted; a granted
    /// run's sandbox may reach `guard` (`<host>:443`) and nothing else.
    pub async fn lease(
        self: &Arc<Self>,
        budget: Duration,
        hold: Hold,
        guard: Option<&str>,
    ) -> Result<Sandbox, SandboxError> {
        let name = format!(
            "{}{}",
            name_prefix(&self.instance),
            hex::encode(rand::random::<[u8; 6]>())
        );
        // Tracked before the request leaves: the orphan sweep never deletes one being made.
        self.names.track(&name);
        let mut id = None;
        match self.make(&name, budget, guard, &mut id).await {
            Ok((id, endpoint)) => Ok(Sandbox {
                fleet: self.clone(),
                id,
                name,
                endpoint,
                hold: Some(hold),
            }),
            Err(e) => {
                // Whatever the create made is deleted in the background; the admission slot
                // (and the paid reservation) stay held until it is gone.
                let fleet = self.clone();
                tokio::spawn(async move {
                    fleet.delete_and_release(id.as_deref(), &name).await;
                    drop(hold);
                });
                Err(e)
            }
        }
    }

    async fn make(
        &self,
        name: &str,
        budget: Duration,
        guard: Option<&str>,
        made: &mut Option<String>,
    ) -> Result<(String, Endpoint), SandboxError> {
        let (id, sandbox) = match self.transport {
            Transport::Connect => self.create(name, budget, made).await?,
            Transport::Rest => self.rest_create(name, budget, made).await?,
        };
        let endpoint = self.check(&id, &sandbox).map_err(SandboxError::Refused)?;
        self.seal(&id, guard).await?;
        Ok((id, endpoint))
    }

    /// The Connect create, followed until RUNNING with an endpoint: its id and sandbox.
    async fn create(
        &self,
        name: &str,
        budget: Duration,
        made: &mut Option<String>,
    ) -> Result<(String, Value), SandboxError> {
        let timeout = format!("{}s", (budget + BACKSTOP_SLACK).as_secs());
        let mut cloud = json!({
            "timeout": timeout,
            "onTimeout": "ON_TIMEOUT_DELETE",
            "autoResume": false,
            "platform": { "os": "linux", "architecture": "amd64" },
        });
        let mut request = json!({ "name": name, "requestId": name });
        match &self.image {
            Image::Reference(image) => {
                cloud["imageRef"] = json!(image);
                cloud["startCmd"] = json!(["tail", "-f", "/dev/null"]);
                request["resources"] =
                    json!({ "cpus": self.cpus, "memoryMib": self.memory_mib.to_string() });
            }
            Image::Store(image) => request["image"] = json!(image),
        }
        request["cloud"] = cloud;
        let operation = match self
            .call("/docker.sbx.v1.SandboxService/CreateSandbox", &request)
            .await
        {
            Ok(op) => op,
            Err(e) if e.code() == Some("resource_exhausted") => {
                return Err(SandboxError::Quota(e.to_string()));
            }
            Err(e @ ApiError::Rpc { .. }) => return Err(SandboxError::Refused(e.to_string())),
            Err(e) if e.never_sent() => return Err(SandboxError::Unsent(e)),
            Err(e) => return Err(e.into()),
        };
        let deadline = tokio::time::Instant::now() + READY_BOUND;
        let done = self.finish(operation, deadline).await?;
        if let Some(error) = done.get("error") {
            let message = crate::provider::e2b::http::scrub(&error["message"].to_string());
            if error["code"].as_u64() == Some(8) {
                return Err(SandboxError::Quota(message));
            }
            return Err(SandboxError::Refused(format!(
                "the create failed: {message}"
            )));
        }
        let id = done["metadata"]["target"]
            .as_str()
            .or_else(|| done["response"]["core"]["id"].as_str())
            .filter(|id| valid_id(id))
            .ok_or_else(|| ApiError::Answer("a create operation without a sandbox id".to_owned()))?
            .to_owned();
        let sandbox = loop {
            let sandbox = self
                .call(
                    "/docker.sbx.v1.SandboxService/GetSandbox",
                    &json!({ "sandbox": { "id": id } }),
                )
                .await?;
            // Until the id reads back with this create's name it may be anyone's sandbox:
            // a failure before that is cleaned up by the name, never by the id.
            if sandbox["core"]["name"] != name {
                return Err(SandboxError::Refused(format!(
                    "sandbox {id} does not carry its name"
                )));
            }
            *made = Some(id.clone());
            if sandbox["core"]["status"] == RUNNING
                && sandbox["core"]["endpoint"]["uri"].is_string()
            {
                break sandbox;
            }
            if tokio::time::Instant::now() >= deadline {
                return Err(SandboxError::Refused(format!(
                    "sandbox {id} was not RUNNING with an endpoint within {READY_BOUND:?}"
                )));
            }
            tokio::time::sleep(POLL).await;
        };
        Ok((id, sandbox))
    }

    /// Follows an operation until done: `WaitOperation`, or `GetOperation` polling when the
    /// service does not wait.
    async fn finish(
        &self,
        mut op: Value,
        deadline: tokio::time::Instant,
    ) -> Result<Value, SandboxError> {
        let id = op["id"]
            .as_str()
            .ok_or_else(|| ApiError::Answer("an operation without an id".to_owned()))?
            .to_owned();
        let mut wait = true;
        while op["done"] != true {
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            if left.is_zero() {
                return Err(SandboxError::Refused(format!(
                    "operation {id} did not complete within its bound"
                )));
            }
            if wait {
                let secs = left.as_secs().clamp(1, 10);
                match self
                    .call(
                        "/docker.sbx.v1.OperationService/WaitOperation",
                        &json!({ "id": id, "timeout": format!("{secs}s") }),
                    )
                    .await
                {
                    Ok(next) => op = next,
                    Err(e) if e.code() == Some("unimplemented") => wait = false,
                    Err(e) => return Err(e.into()),
                }
            } else {
                tokio::time::sleep(POLL).await;
                op = self
                    .call(
                        "/docker.sbx.v1.OperationService/GetOperation",
                        &json!({ "id": id }),
                    )
                    .await?;
            }
        }
        Ok(op)
    }

    /// The checks of what booted (grants.md §7.4); the endpoint's client when they hold.
    fn check(&self, id: &str, sandbox: &Value) -> Result<Endpoint, String> {
        let core = &sandbox["core"];
        let endpoint = &core["endpoint"];
        // Over REST the endpoint speaks the REST routes (`protocol: http`).
        let (protocol, spoken) = match self.transport {
            Transport::Connect => ("SANDBOX_ENDPOINT_PROTOCOL_CONNECT", "Connect"),
            Transport::Rest => ("http", "REST"),
        };
        if endpoint["protocol"] != protocol {
            return Err(format!(
                "sandbox {id}'s endpoint is not {spoken} over HTTPS ({})",
                endpoint["protocol"]
            ));
        }
        let uri = endpoint["uri"].as_str().unwrap_or_default();
        let url = Url::parse(uri)
            .map_err(|why| format!("sandbox {id}'s endpoint is not {spoken} over HTTPS: {why}"))?;
        // Plain http (allowed to loopback for a local service) only when the management API
        // is plain http too: an https service's answer never sends the bearer in the clear.
        if !url.base.tls && self.api.is_tls() {
            return Err(format!(
                "sandbox {id}'s endpoint is not {spoken} over HTTPS (plain http from an https service)"
            ));
        }
        let cpus = core["resources"]["cpus"].as_u64().unwrap_or(0);
        let memory = match &core["resources"]["memoryMib"] {
            Value::String(s) => s.parse::<u64>().unwrap_or(0),
            other => other.as_u64().unwrap_or(0),
        };
        if cpus == 0 || memory == 0 {
            return Err(format!("sandbox {id} reports no CPU or memory"));
        }
        if let Image::Reference(_) = self.image
            && (cpus > u64::from(self.cpus) || memory > self.memory_mib)
        {
            return Err(format!(
                "sandbox {id} has {cpus} CPUs and {memory} MiB, more than the {} and {} asked",
                self.cpus, self.memory_mib
            ));
        }
        // REST reports no booted digest (grants.md §7.3): the reference's digest is all there is.
        if let Some(pinned) = self
            .pinned
            .as_ref()
            .filter(|_| self.transport == Transport::Connect)
        {
            let booted = sandbox["cloud"]["imageDigest"].as_str().unwrap_or_default();
            if booted != pinned {
                return Err(format!(
                    "sandbox {id} booted {booted:?}, not the pinned linux/amd64 manifest {pinned}"
                ));
            }
        }
        Ok(Endpoint::new(self.transport, url, self.tls.clone()))
    }

    /// The seal: a granted run's rule installed and echoed, then the effective policy read
    /// back as deny-all with exactly the run's entitlement. Nothing runs unless it holds.
    pub async fn seal(&self, id: &str, guard: Option<&str>) -> Result<(), SandboxError> {
        let entitlement: BTreeSet<String> = guard
            .map(|host| format!("{host}:443"))
            .into_iter()
            .collect();
        if !entitlement.is_empty() {
            let wanted = json!({ "mode": "deny-all", "allowNetworks": entitlement });
            let echo = self.put_policy(id, &wanted).await?;
            if echo != wanted {
                return Err(SandboxError::Refused(format!(
                    "sandbox {id}'s policy PUT did not echo the guard rule"
                )));
            }
        }
        let (policy, deny_all) = match self.transport {
            Transport::Connect => {
                let policy = self
                    .call(
                        "/docker.sbx.v1.NetworkPolicyService/GetEffectiveNetworkPolicy",
                        &json!({ "target": { "sandbox": { "id": id } } }),
                    )
                    .await?;
                (policy, DENY_ALL)
            }
            Transport::Rest => (self.rest_policy(id).await?, "denyAll"),
        };
        // Both APIs answer `{mode, allowNetworks: [{network, layer}]}`.
        let allowed: BTreeSet<String> = policy["allowNetworks"]
            .as_array()
            .map(|a| {
                a.iter()
                    .map(|n| n["network"].as_str().unwrap_or("?").to_owned())
                    .collect()
            })
            .unwrap_or_default();
        if policy["mode"] != deny_all || allowed != entitlement {
            return Err(SandboxError::Refused(format!(
                "sandbox {id}'s effective network policy is {} allowing {allowed:?}, not deny-all allowing exactly {entitlement:?}",
                policy["mode"]
            )));
        }
        Ok(())
    }

    async fn put_policy(&self, id: &str, body: &Value) -> Result<Value, ApiError> {
        let bearer = self.auth.bearer().await?;
        let mut headers = http::HeaderMap::new();
        headers.insert(
            http::header::CONTENT_TYPE,
            http::HeaderValue::from_static("application/json"),
        );
        let auth = http::HeaderValue::from_str(&format!("Bearer {bearer}"))
            .map_err(|_| ApiError::Answer("the bearer is not a header value".to_owned()))?;
        headers.insert(http::header::AUTHORIZATION, auth);
        let path = format!("{}/sandboxes/{id}/network-policy", self.policy_prefix);
        let response = self
            .policy
            .send(
                http::Method::PUT,
                &path,
                headers,
                bytes::Bytes::from(body.to_string()),
                None,
                CALL_BOUND,
            )
            .await?;
        if response.status != http::StatusCode::OK {
            let status = response.status;
            return Err(ApiError::Status {
                what: "the policy PUT".to_owned(),
                status,
                text: response.error_text().await,
            });
        }
        let body = response
            .bytes(api::MAX_ANSWER, CALL_BOUND)
            .await
            .map_err(ApiError::Answer)?;
        serde_json::from_slice(&body).map_err(|e| ApiError::Answer(format!("the policy PUT: {e}")))
    }

    /// Deletes a sandbox (by id, else by name) until it is gone.
    pub async fn delete(&self, id: Option<&str>, name: &str) -> Result<(), ApiError> {
        match self.transport {
            Transport::Connect => self.connect_delete(id, name).await,
            Transport::Rest => self.rest_delete(id, name).await,
        }
    }

    /// The Connect delete, followed through its operation; NOT_FOUND is success.
    async fn connect_delete(&self, id: Option<&str>, name: &str) -> Result<(), ApiError> {
        let target = match id {
            Some(id) => json!({ "id": id }),
            None => json!({ "name": name }),
        };
        let request =
            json!({ "sandbox": target, "force": true, "requestId": format!("{name}-delete") });
        let op = match self
            .call("/docker.sbx.v1.SandboxService/DeleteSandbox", &request)
            .await
        {
            Ok(op) => op,
            Err(e) if e.code() == Some("not_found") => return Ok(()),
            Err(e) => return Err(e),
        };
        let deadline = tokio::time::Instant::now() + DELETE_BOUND;
        match self.finish(op, deadline).await {
            Ok(done)
                if done
                    .get("error")
                    .is_none_or(|e| e["code"].as_u64() == Some(5)) =>
            {
                Ok(())
            }
            Ok(done) => Err(ApiError::Answer(format!(
                "the delete failed: {}",
                crate::provider::e2b::http::scrub(&done["error"].to_string())
            ))),
            Err(SandboxError::Api(e)) => Err(e),
            Err(e) => Err(ApiError::Answer(e.to_string())),
        }
    }

    /// Deletes (retried within the teardown bound), then stops tracking `name`.
    pub async fn delete_and_release(&self, id: Option<&str>, name: &str) {
        let mut last = None;
        for backoff in [0u64, 1, 2, 4] {
            tokio::time::sleep(Duration::from_secs(backoff)).await;
            match self.delete(id, name).await {
                Ok(()) => {
                    last = None;
                    break;
                }
                Err(e) => last = Some(e),
            }
        }
        if let Some(e) = last {
            tracing::warn!(sandbox = %name, error = %e, "dockercloud: a sandbox could not be deleted; the orphan sweep retries");
        }
        self.names.release(name);
    }

    /// Every sandbox name and id of the account, page by page (at most 50 pages).
    pub async fn list(&self) -> Result<Vec<(String, String)>, ApiError> {
        if self.transport == Transport::Rest {
            return self.rest_list().await;
        }
        let mut out = Vec::new();
        let mut token = String::new();
        for _ in 0..50 {
            let page = self
                .call(
                    "/docker.sbx.v1.SandboxService/ListSandboxes",
                    &json!({ "pageSize": 100, "pageToken": token }),
                )
                .await?;
            for s in page["sandboxes"].as_array().into_iter().flatten() {
                if let (Some(name), Some(id)) =
                    (s["core"]["name"].as_str(), s["core"]["id"].as_str())
                {
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

/// A sandbox id usable in a path.
pub fn valid_id(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= 128
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_'))
}
