//! The simulator's sandboxes: what E2B's control plane knows about each one, and the registry
//! that holds them. A sandbox that was killed or timed out leaves the registry at once, so
//! every later call about it gets E2B's 404 (control plane) or 502 (envd).

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime};

use serde_json::{Value, json};
use tokio::sync::watch;

use crate::config::{ENVD_VERSION, Template};
use crate::network::NetworkConfig;

/// E2B's deprecated `clientID`, the same for every sandbox.
pub const CLIENT_ID: &str = "6532622b";

/// `SandboxState`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum State {
    Running,
    Paused,
}

impl State {
    pub fn as_str(self) -> &'static str {
        match self {
            State::Running => "running",
            State::Paused => "paused",
        }
    }
}

/// A process's stdin, shared by the calls that write to or close it.
pub type SharedInput = Arc<tokio::sync::Mutex<Option<crate::vm::Input>>>;

/// A process envd started and still tracks.
pub struct Process {
    /// `ProcessConfig` as JSON (`cmd`, `args`, `envs`, `cwd`), for `process.List`.
    pub config: Value,
    pub tag: Option<String>,
    /// The process's stdin, when it was started with `stdin: true` and it is not closed.
    pub stdin: Option<SharedInput>,
}

/// One sandbox.
pub struct Sandbox {
    pub id: String,
    pub template: Template,
    pub metadata: BTreeMap<String, String>,
    pub env_vars: BTreeMap<String, String>,
    /// envd's access token; `None` for a v1 create without `secure`.
    pub envd_token: Option<String>,
    pub traffic_token: Option<String>,
    pub network: NetworkConfig,
    pub allow_internet_access: Option<bool>,
    pub started_at: SystemTime,
    pub end_at: SystemTime,
    pub auto_pause: bool,
    pub state: State,
    /// The docker container that is this sandbox's VM.
    pub container: String,
    /// The host directory whose sockets are the VM's egress.
    pub egress_dir: PathBuf,
    /// Turns true when the VM pauses or dies: every envd stream of the VM drops then. A fresh
    /// one is made at resume.
    pub life: watch::Sender<bool>,
    pub processes: HashMap<u32, Process>,
    /// The egress proxy's listeners for this VM; aborted when it dies.
    pub egress_tasks: Vec<tokio::task::AbortHandle>,
}

// === impl Sandbox ===

impl Sandbox {
    /// `startedAt`, cut to microseconds like E2B's keyset pagination.
    pub fn pagination_time(&self) -> SystemTime {
        let since = self
            .started_at
            .duration_since(SystemTime::UNIX_EPOCH)
            .unwrap_or_default();
        SystemTime::UNIX_EPOCH + Duration::from_micros(since.as_micros() as u64)
    }

    /// `ListedSandbox`.
    pub fn listed(&self) -> Value {
        json!({
            "templateID": self.template.id,
            "alias": self.template.alias,
            "sandboxID": self.id,
            "clientID": CLIENT_ID,
            "startedAt": rfc3339(self.started_at),
            "endAt": rfc3339(self.end_at),
            "cpuCount": self.template.cpu_count,
            "memoryMB": self.template.memory_mb,
            "diskSizeMB": self.template.disk_size_mb,
            "metadata": self.metadata,
            "state": self.state.as_str(),
            "envdVersion": ENVD_VERSION,
        })
    }

    /// `SandboxDetail`.
    pub fn detail(&self, domain: &str) -> Value {
        let mut detail = self.listed();
        if let Some(object) = detail.as_object_mut() {
            if let Some(token) = &self.envd_token {
                object.insert("envdAccessToken".to_owned(), json!(token));
            }
            if let Some(allow) = self.allow_internet_access {
                object.insert("allowInternetAccess".to_owned(), json!(allow));
            }
            object.insert("domain".to_owned(), json!(domain));
            if self.network != NetworkConfig::default() {
                object.insert(
                    "network".to_owned(),
                    serde_json::to_value(&self.network).unwrap_or(Value::Null),
                );
            }
            object.insert(
                "lifecycle".to_owned(),
                json!({
                    "autoResume": false,
                    "onTimeout": if self.auto_pause { "pause" } else { "kill" },
                }),
            );
        }
        detail
    }

    /// `Sandbox`, the answer of create and connect.
    pub fn created(&self, domain: &str) -> Value {
        let mut created = json!({
            "templateID": self.template.id,
            "alias": self.template.alias,
            "sandboxID": self.id,
            "clientID": CLIENT_ID,
            "envdVersion": ENVD_VERSION,
            "domain": domain,
        });
        if let Some(object) = created.as_object_mut() {
            if let Some(token) = &self.envd_token {
                object.insert("envdAccessToken".to_owned(), json!(token));
            }
            if let Some(token) = &self.traffic_token {
                object.insert("trafficAccessToken".to_owned(), json!(token));
            }
        }
        created
    }

    /// Drops every envd stream of the current life and starts a new one.
    pub fn end_life(&mut self) {
        let _ = self.life.send(true);
        self.life = watch::channel(false).0;
    }
}

/// Go's RFC 3339 with microseconds (E2B keeps microseconds).
pub fn rfc3339(time: SystemTime) -> String {
    humantime::format_rfc3339_micros(time).to_string()
}

/// The sandboxes, by id.
#[derive(Default)]
pub struct Registry {
    sandboxes: Mutex<BTreeMap<String, Sandbox>>,
}

// === impl Registry ===

impl Registry {
    /// The locked map. The lock is never held across an await.
    pub fn lock(&self) -> MutexGuard<'_, BTreeMap<String, Sandbox>> {
        crate::app::locked(&self.sandboxes)
    }

    /// Runs `f` on the sandbox `id`, if it exists.
    pub fn with<T>(&self, id: &str, f: impl FnOnce(&mut Sandbox) -> T) -> Option<T> {
        self.lock().get_mut(id).map(f)
    }

    pub fn insert(&self, sandbox: Sandbox) {
        self.lock().insert(sandbox.id.clone(), sandbox);
    }

    /// Takes the sandbox out (it is being killed); its streams drop.
    pub fn remove(&self, id: &str) -> Option<Sandbox> {
        let mut removed = self.lock().remove(id)?;
        removed.end_life();
        for task in &removed.egress_tasks {
            task.abort();
        }
        Some(removed)
    }

    pub fn count(&self) -> usize {
        self.lock().len()
    }

    /// Ids of running sandboxes whose time is up.
    pub fn expired(&self, now: SystemTime) -> Vec<(String, bool)> {
        self.lock()
            .values()
            .filter(|s| s.state == State::Running && s.end_at <= now)
            .map(|s| (s.id.clone(), s.auto_pause))
            .collect()
    }
}
