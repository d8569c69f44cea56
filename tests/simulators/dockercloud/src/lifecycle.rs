//! A sandbox's life, shared by the Connect and REST APIs: admission (quota, name, size),
//! provisioning in the background (the create's operation completes when its container
//! runs), deletion, and the timeout that really deletes (or stops) it.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use crate::docker::{LABEL_INSTANCE, LABEL_SIMULATOR, LABEL_SIMULATOR_VALUE};
use crate::error::{ApiError, Code};
use crate::faults::StuckOperation;
use crate::ids::hex_id;
use crate::state::{OnTimeout, Operation, OperationKind, Sandbox, State, Status};
use sim_support::docker::LockedDown;

/// The timeout a sandbox gets when its create names none (the service's one-hour default).
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(3600);

/// What a create asks for, whichever API it came through.
#[derive(Debug, Clone)]
pub struct CreateSpec {
    pub name: String,
    pub image_ref: String,
    pub cpus: u32,
    pub memory_mib: u64,
    pub start_cmd: Vec<String>,
    pub timeout: Duration,
    pub on_timeout: OnTimeout,
    pub auto_resume: bool,
    pub via_rest: bool,
}

/// The start command a create names (`null`: the simulator keeps the sandbox alive with
/// `sleep infinity`).
pub fn start_command(value: &serde_json::Value, field: &str) -> Result<Vec<String>, ApiError> {
    if value.is_null() {
        return Ok(vec!["sleep".into(), "infinity".into()]);
    }
    crate::protojson::strings(value)
        .ok_or_else(|| ApiError::invalid(format!("{field} must be a list of strings")))
}

/// The initial timeout a create names (`null`: the service's default).
pub fn initial_timeout(value: &serde_json::Value) -> Result<Duration, ApiError> {
    if value.is_null() {
        return Ok(DEFAULT_TIMEOUT);
    }
    value
        .as_str()
        .and_then(crate::state::parse_duration)
        .filter(|d| !d.is_zero())
        .ok_or_else(|| ApiError::invalid("timeout must be a positive duration such as \"40s\""))
}

/// Only linux/amd64 is served (a platform left out means that one).
pub fn check_platform(platform: &serde_json::Value) -> Result<(), ApiError> {
    let os = platform["os"].as_str().unwrap_or("linux");
    let architecture = platform["architecture"].as_str().unwrap_or("amd64");
    if os == "linux" && architecture == "amd64" {
        Ok(())
    } else {
        Err(ApiError::invalid(
            "platform is not available: only linux/amd64",
        ))
    }
}

/// A new operation on a sandbox, not done.
fn new_operation(kind: OperationKind, sandbox_id: &str, stuck: bool) -> (String, Operation) {
    let id = format!("operations/{}", hex_id(10));
    let op = Operation {
        id: id.clone(),
        kind,
        sandbox_id: sandbox_id.to_owned(),
        done: false,
        error: None,
        stuck,
        result: None,
        created_at: SystemTime::now(),
        updated_at: SystemTime::now(),
    };
    (id, op)
}

/// Admits a sandbox and starts provisioning it: answers its id and its create operation.
pub fn admit(state: &Arc<State>, spec: CreateSpec) -> Result<(String, String), ApiError> {
    let settings = &state.settings;
    let (cpu_min, cpu_max) = settings.cpu_range;
    if spec.cpus < cpu_min || spec.cpus > cpu_max {
        return Err(ApiError::invalid(format!(
            "cpus {} is outside the allowed range {cpu_min}..{cpu_max}",
            spec.cpus
        )));
    }
    let (mem_min, mem_max) = settings.memory_mib_range;
    if spec.memory_mib < mem_min || spec.memory_mib > mem_max {
        return Err(ApiError::invalid(format!(
            "memory_mib {} is outside the allowed range {mem_min}..{mem_max}",
            spec.memory_mib
        )));
    }
    if spec.start_cmd.first().is_none_or(String::is_empty) {
        return Err(ApiError::invalid("start command must name an executable"));
    }
    let mut inner = state.lock();
    let running = inner
        .sandboxes
        .values()
        .filter(|s| s.status.counts_against_quota())
        .count();
    if inner.faults.quota_reached || running >= settings.max_running {
        return Err(ApiError::quota());
    }
    if inner
        .sandboxes
        .values()
        .any(|s| s.name == spec.name && !spec.name.is_empty())
    {
        return Err(ApiError::new(
            Code::AlreadyExists,
            format!("sandbox {:?} already exists", spec.name),
        ));
    }
    let image = state.resolve_image(&spec.image_ref);
    let id = hex_id(10);
    let stuck = inner
        .faults
        .never_complete
        .contains(&StuckOperation::Create);
    let booted_digest = inner.faults.booted_digest.clone();
    let sandbox = Sandbox {
        id: id.clone(),
        name: spec.name.clone(),
        status: Status::Creating,
        deleting: false,
        created_at: SystemTime::now(),
        cpus: spec.cpus,
        memory_mib: spec.memory_mib,
        image_ref: spec.image_ref.clone(),
        image_digest: booted_digest
            .or_else(|| image.as_ref().map(|i| i.digest.clone()))
            .unwrap_or_default(),
        local_image: image.as_ref().map(|i| i.local.clone()).unwrap_or_default(),
        start_cmd: spec.start_cmd.clone(),
        timeout: spec.timeout,
        on_timeout: spec.on_timeout,
        auto_resume: spec.auto_resume,
        expires_at: None,
        container: None,
        policy_allow: None,
        generation: 1,
        failure: None,
        via_rest: spec.via_rest,
    };
    let (op_id, op) = new_operation(OperationKind::Create, &id, stuck);
    inner.operations.insert(op_id.clone(), op);
    inner.sandboxes.insert(id.clone(), sandbox);
    drop(inner);
    let state = state.clone();
    let (sandbox_id, operation) = (id.clone(), op_id.clone());
    tokio::spawn(async move {
        provision(state, sandbox_id, operation, image.is_some(), stuck).await;
    });
    Ok((id, op_id))
}

fn finish(state: &State, op_id: &str, error: Option<(Code, String)>, result: Option<Sandbox>) {
    let mut inner = state.lock();
    if let Some(op) = inner.operations.get_mut(op_id)
        && !op.stuck
    {
        op.done = true;
        op.error = error;
        op.result = result;
        op.updated_at = SystemTime::now();
    }
    drop(inner);
    state.notify();
}

async fn provision(state: Arc<State>, id: String, op_id: String, image_known: bool, stuck: bool) {
    let Some(_in_flight) = state.makers.begin() else {
        return;
    };
    let Some(sandbox) = state.lock().sandboxes.get(&id).cloned() else {
        return;
    };
    if !image_known {
        let why = format!("manifest unknown: {}", sandbox.image_ref);
        fail(&state, &id, Code::NotFound, &why);
        finish(&state, &op_id, Some((Code::NotFound, why)), None);
        return;
    }
    let settings = &state.settings;
    let mut extra_hosts = Vec::new();
    if let Some(host) = &settings.guard_host {
        extra_hosts.push(format!("{host}:127.0.0.1"));
    }
    let plan = LockedDown {
        name: format!("plimsoll-sim-dc-{}-{id}", settings.instance),
        image: sandbox.local_image.clone(),
        cmd: sandbox.start_cmd.clone(),
        labels: HashMap::from([
            (LABEL_SIMULATOR.to_owned(), LABEL_SIMULATOR_VALUE.to_owned()),
            (LABEL_INSTANCE.to_owned(), settings.instance.clone()),
            ("io.plimsoll.simulator.sandbox".to_owned(), id.clone()),
        ]),
        memory_bytes: Some(
            i64::try_from(sandbox.memory_mib.saturating_mul(1 << 20)).unwrap_or(i64::MAX),
        ),
        nano_cpus: Some(i64::from(sandbox.cpus) * 1_000_000_000),
        tmpfs: HashMap::from([(
            "/tmp".to_owned(),
            format!("rw,exec,nosuid,nodev,size={}m,mode=1777", settings.tmp_mib),
        )]),
        user: settings.sandbox_user.clone(),
        pids_limit: settings.pids_limit,
        runtime: settings.runtime.clone(),
        extra_hosts,
        ..LockedDown::default()
    };
    let container = match state.docker.create_locked_down(&plan).await {
        Ok(container) => container,
        Err(e) => {
            let why = format!("creating the sandbox failed: {e}");
            fail(&state, &id, Code::Internal, &why);
            finish(&state, &op_id, Some((Code::Internal, why)), None);
            return;
        }
    };
    // Recorded before starting, so a delete that races the start still removes it.
    let gone = {
        let mut inner = state.lock();
        match inner.sandboxes.get_mut(&id) {
            Some(s) => {
                s.container = Some(container.clone());
                false
            }
            None => true,
        }
    };
    if gone {
        let _ = state.docker.remove(&container).await;
        return;
    }
    if let Err(e) = state.docker.start(&container).await {
        let why = format!("starting the sandbox failed: {e}");
        fail(&state, &id, Code::Internal, &why);
        finish(&state, &op_id, Some((Code::Internal, why)), None);
        return;
    }
    if stuck {
        // The operation never completes and the sandbox is never reported running.
        return;
    }
    let running = {
        let mut inner = state.lock();
        let Some(s) = inner.sandboxes.get_mut(&id) else {
            return;
        };
        if s.status != Status::Creating {
            return;
        }
        s.status = Status::Running;
        s.expires_at = Some(SystemTime::now() + s.timeout);
        s.touch();
        s.clone()
    };
    let timeout = running.timeout;
    finish(&state, &op_id, None, Some(running));
    tokio::spawn(watch_for_death(state.clone(), id.clone(), container));
    let expiring = state.clone();
    tokio::spawn(async move {
        tokio::time::sleep(timeout).await;
        expire(expiring, id).await;
    });
}

/// A running sandbox whose container stops outside the API (its host failed, or a test
/// killed it) has failed, as a service's VM that crashed would: its commands end with an
/// error and it runs no more.
async fn watch_for_death(state: Arc<State>, id: String, container: String) {
    state.docker.wait_dead(&container).await;
    container_died(&state, &id, &container);
}

/// Sandbox `id`'s container `container` was seen dead: a sandbox still running on it (not
/// being deleted) has failed. Called by its watcher and by a command that saw the death
/// first, so no reader sees the error of one and the RUNNING of the other.
pub fn container_died(state: &State, id: &str, container: &str) {
    let unexpected = state.lock().sandboxes.get(id).is_some_and(|s| {
        s.status == Status::Running && !s.deleting && s.container.as_deref() == Some(container)
    });
    if unexpected {
        tracing::info!(sandbox = %id, "the sandbox's container died: it failed");
        fail(
            state,
            id,
            Code::Internal,
            "the sandbox's VM stopped unexpectedly",
        );
    }
}

fn fail(state: &State, id: &str, code: Code, why: &str) {
    if let Some(s) = state.lock().sandboxes.get_mut(id) {
        s.status = Status::Failed;
        s.failure = Some((code, why.to_owned()));
        s.touch();
    }
    state.notify();
}

/// The timeout fired: `ON_TIMEOUT_DELETE` deletes the sandbox for real,
/// `ON_TIMEOUT_STOP` stops it.
async fn expire(state: Arc<State>, id: String) {
    let action = {
        let inner = state.lock();
        match inner.sandboxes.get(&id) {
            Some(s)
                if s.status == Status::Running
                    && s.expires_at.is_some_and(|t| t <= SystemTime::now()) =>
            {
                Some(s.on_timeout)
            }
            _ => None,
        }
    };
    match action {
        Some(OnTimeout::Delete) => {
            tracing::info!(sandbox = %id, "timeout: deleting");
            let _ = begin_delete(&state, &id, false);
        }
        Some(OnTimeout::Stop) => {
            tracing::info!(sandbox = %id, "timeout: stopping");
            let container = state
                .lock()
                .sandboxes
                .get(&id)
                .and_then(|s| s.container.clone());
            if let Some(container) = container {
                let _ = state.docker.stop(&container).await;
            }
            stop_forwarder(&state, &id);
            if let Some(s) = state.lock().sandboxes.get_mut(&id) {
                s.status = Status::Stopped;
                s.expires_at = None;
                s.touch();
            }
            state.notify();
        }
        None => {}
    }
}

/// Starts deleting a sandbox; answers the delete's operation id. With `keep_record`
/// nothing is removed (the REST fault that reports success and leaves the sandbox).
pub fn begin_delete(state: &Arc<State>, id: &str, keep_record: bool) -> Result<String, ApiError> {
    let mut inner = state.lock();
    let stuck = inner
        .faults
        .never_complete
        .contains(&StuckOperation::Delete);
    let Some(sandbox) = inner.sandboxes.get_mut(id) else {
        return Err(ApiError::not_found("sandbox not found"));
    };
    if !keep_record {
        sandbox.status = Status::Stopping;
        sandbox.deleting = true;
        sandbox.expires_at = None;
        sandbox.touch();
    }
    let (op_id, op) = new_operation(OperationKind::Delete, id, stuck);
    inner.operations.insert(op_id.clone(), op);
    drop(inner);
    state.notify();
    if keep_record {
        finish(state, &op_id, None, None);
        return Ok(op_id);
    }
    if stuck {
        return Ok(op_id);
    }
    let state = state.clone();
    let (id, operation) = (id.to_owned(), op_id.clone());
    tokio::spawn(async move {
        remove(&state, &id).await;
        finish(&state, &operation, None, None);
    });
    Ok(op_id)
}

/// Removes a sandbox's container, forwarder, credentials and record.
async fn remove(state: &State, id: &str) {
    stop_forwarder(state, id);
    let container = state
        .lock()
        .sandboxes
        .get(id)
        .and_then(|s| s.container.clone());
    if let Some(container) = container
        && let Err(e) = state.docker.remove(&container).await
    {
        tracing::warn!(sandbox = %id, error = %e, "removing a sandbox's container failed");
    }
    let mut inner = state.lock();
    inner.sandboxes.remove(id);
    inner.credentials.retain(|_, c| c.sandbox_id != id);
}

/// Ends a sandbox's egress forwarder, if one runs.
pub fn stop_forwarder(state: &State, id: &str) {
    if let Some(handle) = state.lock().forwarders.remove(id) {
        handle.abort();
    }
}

/// Removes every container this simulator made (at shutdown), after the provisioning
/// tasks in flight (at most 30 s), so none makes a container behind it.
pub async fn remove_all(state: &State) {
    let stuck = state.makers.close(Duration::from_secs(30)).await;
    if stuck > 0 {
        tracing::warn!(stuck, "provisioning tasks still running at shutdown");
    }
    let ids: Vec<String> = state.lock().sandboxes.keys().cloned().collect();
    for id in ids {
        remove(state, &id).await;
    }
    let label = format!("{LABEL_INSTANCE}={}", state.settings.instance);
    let left = state.docker.remove_every(&label).await;
    if left > 0 {
        tracing::warn!(left, "containers of this simulator could not be removed");
    }
}
