//! The gateway: the `openshell.v1.OpenShell` service over the sandboxes this process keeps.
//!
//! One module per part of the API, each handler a short list of the gateway's own steps:
//! [`sandboxes`] (create, get, list, delete, stop, start, gateway info), [`config`]
//! (`GetSandboxConfig`), [`exec`] (both exec methods), [`forward`] (SSH session tokens and
//! `ForwardTcp`). State lives in [`State`]: every sandbox (what was stored, its container,
//! its phase), the SSH session tokens and the live forwards, the faults and the clock.

pub mod config;
pub mod container;
pub mod exec;
pub mod forward;
pub mod sandboxes;

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, MutexGuard, RwLock};

use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status, Streaming};

use crate::clock::Clock;
use crate::docker::Docker;
use crate::faults::Faults;
use crate::proto::datamodel::v1::{WorkspaceSelector, workspace_selector};
use crate::proto::sandbox::v1::{GetSandboxConfigRequest, GetSandboxConfigResponse};
use crate::proto::v1::open_shell_server::OpenShell;
use crate::proto::v1::*;

/// The only workspace a fresh gateway has.
pub const DEFAULT_WORKSPACE: &str = "default";

/// Fixed facts about this simulator process.
#[derive(Debug, Clone)]
pub struct Settings {
    pub instance: String,
    pub runtime: String,
    pub docker_version: String,
    pub default_image: String,
    pub sandbox_user: String,
    pub pids_limit: i64,
    pub ssh_session_ttl_secs: u64,
    pub allow_driver_config: bool,
    pub gateway_host: String,
    pub gateway_port: u16,
}

/// One sandbox as the gateway keeps it.
#[derive(Debug, Clone)]
pub struct Entry {
    /// The truth, as stored; answers are copies (tampered when a fault says so).
    pub sandbox: Sandbox,
    pub container: Option<String>,
    pub configuration_instance_id: String,
    /// Bumped whenever the container is stopped or started on purpose, so a watcher of an
    /// older run does not mistake that for a death.
    pub generation: u64,
    /// Killed on purpose by a fault: its death reads back as ERROR.
    pub dying: bool,
    /// A delete answered ACCEPTED that has not finished.
    pub delete_pending: bool,
    pub ever_ready: bool,
    /// Whether the caller gave a command (else the gateway's default is only recorded).
    pub command_given: bool,
}

impl Entry {
    pub fn phase(&self) -> SandboxPhase {
        self.sandbox
            .status
            .as_ref()
            .and_then(|s| SandboxPhase::try_from(s.phase).ok())
            .unwrap_or(SandboxPhase::Unknown)
    }

    pub fn id(&self) -> String {
        self.sandbox
            .metadata
            .as_ref()
            .map(|m| m.id.clone())
            .unwrap_or_default()
    }
}

/// An SSH session token.
#[derive(Debug, Clone)]
pub struct SshToken {
    pub sandbox_id: String,
    pub sandbox_name: String,
    pub expires_ms: i64,
    pub revoked: bool,
}

/// Live `ForwardTcp` streams, by token and by sandbox id.
#[derive(Debug, Default)]
pub struct ForwardCounts {
    pub by_token: HashMap<String, u32>,
    pub by_sandbox: HashMap<String, u32>,
}

pub struct State {
    pub settings: Settings,
    pub docker: Docker,
    pub clock: Clock,
    faults: RwLock<Faults>,
    sandboxes: Mutex<BTreeMap<String, Entry>>,
    pub tokens: Mutex<HashMap<String, SshToken>>,
    pub forwards: Mutex<ForwardCounts>,
    /// Execs (of either method) that started a command, for tests that must show none ran.
    pub execs_started: std::sync::atomic::AtomicU64,
    /// `GetGatewayInfo` calls answered, for tests that bound how often a client asks.
    pub gateway_info_calls: std::sync::atomic::AtomicU64,
    /// SSH-session tokens ever made (the token table forgets a deleted sandbox's).
    pub ssh_sessions_created: std::sync::atomic::AtomicU64,
    /// Provisioning tasks in flight; at shutdown no container is made after them.
    pub makers: sim_support::closing::Makers,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic while holding the lock leaves plain data behind; keep serving.
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl State {
    pub fn new(settings: Settings, docker: Docker) -> State {
        State {
            settings,
            docker,
            clock: Clock::default(),
            faults: RwLock::new(Faults::default()),
            sandboxes: Mutex::new(BTreeMap::new()),
            tokens: Mutex::new(HashMap::new()),
            forwards: Mutex::new(ForwardCounts::default()),
            execs_started: std::sync::atomic::AtomicU64::new(0),
            gateway_info_calls: std::sync::atomic::AtomicU64::new(0),
            ssh_sessions_created: std::sync::atomic::AtomicU64::new(0),
            makers: Default::default(),
        }
    }

    pub fn faults(&self) -> Faults {
        self.faults
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    pub fn set_faults(&self, faults: Faults) {
        self.clock.set_skew_ms(faults.clock_skew_ms);
        *self
            .faults
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = faults;
    }

    pub fn sandboxes(&self) -> MutexGuard<'_, BTreeMap<String, Entry>> {
        lock(&self.sandboxes)
    }

    pub fn tokens(&self) -> MutexGuard<'_, HashMap<String, SshToken>> {
        lock(&self.tokens)
    }

    pub fn forwards(&self) -> MutexGuard<'_, ForwardCounts> {
        lock(&self.forwards)
    }

    /// A copy of one sandbox's entry.
    pub fn entry(&self, name: &str) -> Option<Entry> {
        self.sandboxes().get(name).cloned()
    }

    /// Changes one sandbox under the lock (if it still exists); answers what `f` answers.
    pub fn update<R>(&self, name: &str, f: impl FnOnce(&mut Entry) -> R) -> Option<R> {
        self.sandboxes().get_mut(name).map(f)
    }
}

/// The workspace a request's `workspace_scope` names (required; only `default` exists).
pub fn workspace(scope: &Option<WorkspaceSelector>) -> Result<String, Status> {
    match scope.as_ref().and_then(|s| s.selection.as_ref()) {
        None => Err(Status::invalid_argument("workspace_scope is required")),
        Some(workspace_selector::Selection::AllWorkspaces(_)) => Err(Status::invalid_argument(
            "workspace_scope must name one workspace for this method",
        )),
        Some(workspace_selector::Selection::Workspace(name)) => named_workspace(name),
    }
}

/// A workspace given by name.
pub fn named_workspace(name: &str) -> Result<String, Status> {
    if name.is_empty() {
        return Err(Status::invalid_argument("workspace must be non-empty"));
    }
    if name != DEFAULT_WORKSPACE {
        return Err(Status::not_found(format!("workspace '{name}' not found")));
    }
    Ok(name.to_owned())
}

/// The service tonic serves.
#[derive(Clone)]
pub struct Gateway {
    pub state: Arc<State>,
}

type EventStream = ReceiverStream<Result<ExecSandboxEvent, Status>>;
type FrameStream = ReceiverStream<Result<TcpForwardFrame, Status>>;

#[tonic::async_trait]
impl OpenShell for Gateway {
    async fn health(
        &self,
        _request: Request<HealthRequest>,
    ) -> Result<Response<HealthResponse>, Status> {
        Ok(Response::new(sandboxes::health()))
    }

    async fn get_gateway_info(
        &self,
        _request: Request<GetGatewayInfoRequest>,
    ) -> Result<Response<GetGatewayInfoResponse>, Status> {
        self.state
            .gateway_info_calls
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        sandboxes::gateway_info(&self.state).map(Response::new)
    }

    async fn create_sandbox(
        &self,
        request: Request<CreateSandboxRequest>,
    ) -> Result<Response<SandboxResponse>, Status> {
        sandboxes::create(&self.state, request.into_inner()).map(Response::new)
    }

    async fn get_sandbox(
        &self,
        request: Request<GetSandboxRequest>,
    ) -> Result<Response<SandboxResponse>, Status> {
        sandboxes::get(&self.state, request.into_inner()).map(Response::new)
    }

    async fn list_sandboxes(
        &self,
        request: Request<ListSandboxesRequest>,
    ) -> Result<Response<ListSandboxesResponse>, Status> {
        sandboxes::list(&self.state, request.into_inner()).map(Response::new)
    }

    async fn delete_sandbox(
        &self,
        request: Request<DeleteSandboxRequest>,
    ) -> Result<Response<DeleteSandboxResponse>, Status> {
        sandboxes::delete(&self.state, request.into_inner())
            .await
            .map(Response::new)
    }

    async fn stop_sandbox(
        &self,
        request: Request<StopSandboxRequest>,
    ) -> Result<Response<SandboxResponse>, Status> {
        sandboxes::stop(&self.state, request.into_inner())
            .await
            .map(Response::new)
    }

    async fn start_sandbox(
        &self,
        request: Request<StartSandboxRequest>,
    ) -> Result<Response<SandboxResponse>, Status> {
        sandboxes::start(&self.state, request.into_inner()).map(Response::new)
    }

    async fn create_ssh_session(
        &self,
        request: Request<CreateSshSessionRequest>,
    ) -> Result<Response<CreateSshSessionResponse>, Status> {
        forward::create_session(&self.state, request.into_inner()).map(Response::new)
    }

    async fn revoke_ssh_session(
        &self,
        request: Request<RevokeSshSessionRequest>,
    ) -> Result<Response<RevokeSshSessionResponse>, Status> {
        forward::revoke_session(&self.state, request.into_inner()).map(Response::new)
    }

    type ExecSandboxStream = EventStream;

    async fn exec_sandbox(
        &self,
        request: Request<ExecSandboxRequest>,
    ) -> Result<Response<EventStream>, Status> {
        exec::unary(&self.state, request.into_inner())
            .await
            .map(Response::new)
    }

    type ForwardTcpStream = FrameStream;

    async fn forward_tcp(
        &self,
        request: Request<Streaming<TcpForwardFrame>>,
    ) -> Result<Response<FrameStream>, Status> {
        forward::forward_tcp(&self.state, request.into_inner())
            .await
            .map(Response::new)
    }

    type ExecSandboxInteractiveStream = EventStream;

    async fn exec_sandbox_interactive(
        &self,
        request: Request<Streaming<ExecSandboxInput>>,
    ) -> Result<Response<EventStream>, Status> {
        exec::interactive(&self.state, request.into_inner())
            .await
            .map(Response::new)
    }

    async fn get_sandbox_config(
        &self,
        request: Request<GetSandboxConfigRequest>,
    ) -> Result<Response<GetSandboxConfigResponse>, Status> {
        config::get(&self.state, request.into_inner()).map(Response::new)
    }
}
