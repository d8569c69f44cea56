//! What the simulated account holds: its sandboxes, operations, replay ledgers, endpoint
//! credentials and faults. One lock; nothing awaits while holding it.

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime};

use sim_support::closing::Makers;
use tokio::sync::Notify;

use crate::docker::Docker;
use crate::faults::Faults;

/// A sandbox's coarse lifecycle state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    Creating,
    Running,
    /// Stopping or being deleted.
    Stopping,
    Stopped,
    Failed,
}

impl Status {
    /// The Connect API's enum name (docker.sbx.v1 `SandboxStatus`).
    pub fn connect_name(self) -> &'static str {
        match self {
            Status::Creating => "SANDBOX_STATUS_CREATING",
            Status::Running => "SANDBOX_STATUS_RUNNING",
            Status::Stopping => "SANDBOX_STATUS_STOPPING",
            Status::Stopped => "SANDBOX_STATUS_STOPPED",
            Status::Failed => "SANDBOX_STATUS_FAILED",
        }
    }

    /// Whether it counts against the running-sandboxes quota.
    pub fn counts_against_quota(self) -> bool {
        matches!(self, Status::Creating | Status::Running)
    }
}

/// What happens when a sandbox's timeout expires.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnTimeout {
    Delete,
    Stop,
}

/// One sandbox, as the service records it.
#[derive(Debug, Clone)]
pub struct Sandbox {
    pub id: String,
    /// The Connect `name`, the REST `displayName`.
    pub name: String,
    pub status: Status,
    /// Set while the REST delete is in progress (REST reports `deleting`).
    pub deleting: bool,
    pub created_at: SystemTime,
    pub cpus: u32,
    pub memory_mib: u64,
    pub image_ref: String,
    /// The linux/amd64 manifest digest of the image it booted.
    pub image_digest: String,
    pub local_image: String,
    pub start_cmd: Vec<String>,
    pub timeout: Duration,
    pub on_timeout: OnTimeout,
    pub auto_resume: bool,
    pub expires_at: Option<SystemTime>,
    pub container: Option<String>,
    /// The per-sandbox rule the network-policy PUT installed, if any.
    pub policy_allow: Option<Vec<String>>,
    /// Bumped on every visible change; the REST etag is derived from it.
    pub generation: u64,
    pub failure: Option<(crate::error::Code, String)>,
    /// Made through the REST API (its create answered 202, not an operation).
    pub via_rest: bool,
}

impl Sandbox {
    /// The REST API's strong etag (quoted).
    pub fn etag(&self) -> String {
        format!(
            "\"{}-{}\"",
            &self.id[..12.min(self.id.len())],
            self.generation
        )
    }

    pub fn touch(&mut self) {
        self.generation += 1;
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OperationKind {
    Create,
    Delete,
}

/// One long-running operation (google.longrunning style).
#[derive(Debug, Clone)]
pub struct Operation {
    pub id: String,
    pub kind: OperationKind,
    pub sandbox_id: String,
    pub done: bool,
    pub error: Option<(crate::error::Code, String)>,
    /// Made while a never-complete fault was on: it stays not done.
    pub stuck: bool,
    /// The sandbox as it stood when the operation finished (create's response).
    pub result: Option<Sandbox>,
    pub created_at: SystemTime,
    pub updated_at: SystemTime,
}

/// A REST create remembered under its Idempotency-Key.
#[derive(Debug, Clone)]
pub struct Replay {
    pub payload: serde_json::Value,
    pub sandbox_id: String,
    pub created: SystemTime,
}

/// A sandbox-scoped endpoint credential (REST), stored by the SHA-256 of its token.
#[derive(Debug, Clone)]
pub struct EndpointCredential {
    pub sandbox_id: String,
    pub expires: SystemTime,
    pub permissions: Vec<String>,
}

/// A pullable image: the reference the API accepts and the local image behind it.
#[derive(Debug, Clone)]
pub struct Image {
    pub reference: String,
    pub local: String,
    /// Its "linux/amd64 manifest digest": the local image id.
    pub digest: String,
}

/// Fixed at startup.
#[derive(Debug, Clone)]
pub struct Settings {
    pub instance: String,
    pub runtime: String,
    pub username: String,
    pub token: String,
    pub access_token_ttl: Duration,
    pub images: Vec<Image>,
    pub sandbox_user: String,
    pub pids_limit: i64,
    pub tmp_mib: u64,
    pub max_running: usize,
    pub cpu_range: (u32, u32),
    pub memory_mib_range: (u64, u64),
    pub guard_host: Option<String>,
    pub guard_target: Option<SocketAddr>,
    /// `http://127.0.0.1:<port>`: sandbox endpoints live under it.
    pub endpoint_base: String,
}

#[derive(Debug, Default)]
pub struct Inner {
    pub sandboxes: BTreeMap<String, Sandbox>,
    pub operations: HashMap<String, Operation>,
    /// Connect create `requestId` → operation id (a retried create gets the same one).
    pub request_ids: HashMap<String, String>,
    /// REST Idempotency-Key → the first create.
    pub replays: HashMap<String, Replay>,
    pub credentials: HashMap<[u8; 32], EndpointCredential>,
    pub faults: Faults,
    /// Sandbox id → the egress forwarder task's abort handle.
    pub forwarders: HashMap<String, tokio::task::AbortHandle>,
}

pub struct State {
    pub settings: Settings,
    pub docker: Docker,
    inner: Mutex<Inner>,
    /// Woken on every operation or sandbox change (WaitOperation waits on it).
    pub changed: Notify,
    /// Signs the access tokens the exchange issues.
    pub jwt_key: [u8; 32],
    /// Provisioning tasks in flight; at shutdown no container is made after them.
    pub makers: Makers,
}

impl State {
    pub fn new(settings: Settings, docker: Docker) -> Arc<State> {
        let mut jwt_key = [0u8; 32];
        rand::RngCore::fill_bytes(&mut rand::rng(), &mut jwt_key);
        Arc::new(State {
            settings,
            docker,
            inner: Mutex::new(Inner::default()),
            changed: Notify::new(),
            jwt_key,
            makers: Makers::default(),
        })
    }

    /// The account's state. A poisoned lock still holds consistent maps (every update
    /// is a single insert or field write), so it is used as is.
    pub fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn faults(&self) -> Faults {
        self.lock().faults.clone()
    }

    /// Tells every waiter that something changed.
    pub fn notify(&self) {
        self.changed.notify_waiters();
    }

    /// One page of sandboxes, oldest first, from a page token (`o<offset>`; empty or
    /// absent is the first page), and the next page's token (empty after the last).
    pub fn page(
        &self,
        token: Option<&str>,
        size: usize,
    ) -> Result<(Vec<Sandbox>, String), crate::error::ApiError> {
        let offset: usize = match token.filter(|t| !t.is_empty()) {
            None => 0,
            Some(token) => token
                .strip_prefix('o')
                .and_then(|n| n.parse().ok())
                .ok_or_else(|| crate::error::ApiError::invalid("invalid page token"))?,
        };
        let inner = self.lock();
        let mut all: Vec<&Sandbox> = inner.sandboxes.values().collect();
        all.sort_by(|a, b| (a.created_at, &a.id).cmp(&(b.created_at, &b.id)));
        let page = all
            .iter()
            .skip(offset)
            .take(size)
            .map(|s| (*s).clone())
            .collect();
        let next = if offset + size < all.len() {
            format!("o{}", offset + size)
        } else {
            String::new()
        };
        Ok((page, next))
    }

    /// The endpoint URI of a sandbox.
    pub fn endpoint_uri(&self, id: &str) -> String {
        format!("{}/sandboxes/{id}", self.settings.endpoint_base)
    }

    /// The image a reference names: `repo:tag` exactly, or `repo@sha256:…` by digest.
    pub fn resolve_image(&self, reference: &str) -> Option<Image> {
        let images = &self.settings.images;
        if let Some((repo, digest)) = reference.split_once('@') {
            return images
                .iter()
                .find(|i| i.digest == digest && image_repo(&i.reference) == image_repo(repo))
                .cloned();
        }
        images.iter().find(|i| i.reference == reference).cloned()
    }
}

/// A reference without its tag or digest.
fn image_repo(reference: &str) -> &str {
    let reference = reference.split('@').next().unwrap_or(reference);
    match reference.rfind(':') {
        Some(colon) if !reference[colon..].contains('/') => &reference[..colon],
        _ => reference,
    }
}

/// RFC 3339 in UTC with millisecond precision, as protojson writes a Timestamp.
pub fn rfc3339(at: SystemTime) -> String {
    let since = at
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap_or_default();
    let secs = since.as_secs() as i64;
    let days = secs.div_euclid(86_400);
    let rem = secs.rem_euclid(86_400);
    let (h, m, s) = (rem / 3600, (rem % 3600) / 60, rem % 60);
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{h:02}:{m:02}:{s:02}.{:03}Z",
        since.subsec_millis()
    )
}

/// Parses a protojson Duration (`"40s"`, `"1.5s"`).
pub fn parse_duration(text: &str) -> Option<Duration> {
    let secs = text.strip_suffix('s')?;
    let value: f64 = secs.parse().ok()?;
    (value.is_finite() && value >= 0.0).then(|| Duration::from_secs_f64(value))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timestamps_are_rfc3339_utc() {
        let at = SystemTime::UNIX_EPOCH + Duration::from_millis(1_790_000_000_123);
        assert_eq!(rfc3339(at), "2026-09-21T14:13:20.123Z");
    }

    #[test]
    fn durations_parse_like_protojson() {
        assert_eq!(parse_duration("40s"), Some(Duration::from_secs(40)));
        assert_eq!(parse_duration("1.5s"), Some(Duration::from_millis(1500)));
        assert_eq!(parse_duration("40"), None);
        assert_eq!(parse_duration("-1s"), None);
    }

    #[test]
    fn image_repos_drop_tag_and_digest() {
        assert_eq!(image_repo("a/b:latest"), "a/b");
        assert_eq!(image_repo("a/b@sha256:00"), "a/b");
        assert_eq!(image_repo("localhost:5000/a"), "localhost:5000/a");
    }
}
