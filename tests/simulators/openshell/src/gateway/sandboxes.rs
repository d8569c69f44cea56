//! Sandbox lifecycle: create (PROVISIONING, then READY once its container runs), get,
//! list by label, delete (COMPLETED, ALREADY_ABSENT, or ACCEPTED under a fault), stop
//! (only from READY, STOPPED at once, SSH tokens dropped) and start (only from STOPPED,
//! answers STARTING), plus `GetGatewayInfo` and `Health`.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use tonic::Status;

use super::container::{plan, precondition};
use super::{Entry, State, workspace};
use crate::docker::LABEL_INSTANCE;
use crate::faults::{GatewayInfoError, tamper_sandbox};
use crate::ids;
use crate::proto::datamodel::v1::{ObjectMeta, workspace_selector};
use crate::proto::v1::*;
use crate::validate;

/// What the gateway reports as its version: the published package's.
pub const GATEWAY_VERSION: &str = "0.1.5";

pub fn health() -> HealthResponse {
    HealthResponse {
        status: ServiceStatus::Healthy.into(),
        version: GATEWAY_VERSION.into(),
    }
}

fn driver(name: &str, version: &str) -> ComputeDriverInfo {
    ComputeDriverInfo {
        name: name.into(),
        capabilities: Some(ComputeDriverCapabilities {
            driver_name: name.into(),
            driver_version: version.into(),
            resource_capabilities: Some(ResourceCapabilities {
                cpu: Some(CpuResourceCapabilities {
                    limit_supported: true,
                }),
                memory: Some(MemoryResourceCapabilities {
                    limit_supported: true,
                }),
                gpu: Some(GpuResourceCapabilities::default()),
            }),
        }),
    }
}

pub fn gateway_info(state: &Arc<State>) -> Result<GetGatewayInfoResponse, Status> {
    let faults = state.faults();
    match faults.gateway_info_error {
        Some(GatewayInfoError::PermissionDenied) => {
            return Err(Status::permission_denied(
                "GetGatewayInfo requires the platform_admin role",
            ));
        }
        Some(GatewayInfoError::Unauthenticated) => {
            return Err(Status::unauthenticated("authentication required"));
        }
        None => {}
    }
    let mut compute_drivers = vec![driver("docker", &state.settings.docker_version)];
    if faults.second_compute_driver {
        compute_drivers.push(driver("kubernetes", "v1.31.0"));
    }
    Ok(GetGatewayInfoResponse {
        status: ServiceStatus::Healthy.into(),
        gateway_version: GATEWAY_VERSION.into(),
        compute_drivers,
        extensions: Vec::new(),
    })
}

/// The answer for a stored sandbox: a copy, with the read-back faults applied.
pub fn answer(state: &State, entry: &Entry) -> Sandbox {
    let mut sandbox = entry.sandbox.clone();
    tamper_sandbox(&mut sandbox, &state.faults().readback);
    sandbox
}

fn ready_condition(state: &State, status: &str, reason: &str, message: &str) -> SandboxCondition {
    SandboxCondition {
        r#type: "Ready".into(),
        status: status.into(),
        reason: reason.into(),
        message: message.into(),
        transition_time: Some(state.clock.now()),
    }
}

/// Moves a sandbox to `phase` with its Ready condition, bumping its resource version.
pub fn set_phase(
    state: &State,
    entry: &mut Entry,
    phase: SandboxPhase,
    reason: &str,
    message: &str,
) {
    let ready = if phase == SandboxPhase::Ready {
        "True"
    } else {
        "False"
    };
    let condition = ready_condition(state, ready, reason, message);
    let status = entry.sandbox.status.get_or_insert_with(Default::default);
    status.phase = phase.into();
    status.conditions = vec![condition];
    if let Some(meta) = entry.sandbox.metadata.as_mut() {
        meta.resource_version += 1;
    }
}

/// Checks, fills in and stores a new sandbox, then provisions its container in the
/// background; answers the sandbox PROVISIONING.
pub fn create(state: &Arc<State>, req: CreateSandboxRequest) -> Result<SandboxResponse, Status> {
    let ws = workspace(&req.workspace_scope)?;
    let mut spec = req
        .spec
        .ok_or_else(|| Status::invalid_argument("spec is required"))?;
    if !req.workload_template.is_empty() {
        return Err(Status::not_found(format!(
            "sandbox template '{}' not found",
            req.workload_template
        )));
    }
    if !req.service_exposures.is_empty() {
        return Err(Status::unimplemented("service exposures are not simulated"));
    }
    let command_given = !spec.command.is_empty();
    if !command_given {
        spec.command = vec!["/bin/bash".into(), "-l".into()];
        spec.tty = true;
    }
    validate::sandbox_name(&req.name)?;
    validate::labels(&req.labels)?;
    for key in req.annotations.keys() {
        validate::label_key(key)?;
    }
    if let Some(name) = spec.providers.first() {
        return Err(precondition(format!("provider '{name}' not found")));
    }
    let template = spec.template.get_or_insert_with(Default::default);
    if template.image.is_empty() {
        template.image = state.settings.default_image.clone();
    }
    if template.driver_config.is_some() && !state.settings.allow_driver_config {
        return Err(precondition(
            "template.driver_config is refused: this gateway runs without allow_driver_config",
        ));
    }
    if let Some(policy) = &spec.policy {
        validate::policy(policy)?;
    }
    spec.provider_attachment_epoch = ids::uuid();

    let id = ids::uuid();
    let name = if req.name.is_empty() {
        format!("sandbox-{}", ids::hex_id(5))
    } else {
        req.name.clone()
    };
    let mut annotations = req.annotations.clone();
    annotations.insert(
        "internal.openshell.ai/compute-driver".into(),
        "docker".into(),
    );
    annotations.insert("internal.openshell.ai/sandbox-id".into(), id.clone());
    let policy_version = u32::from(spec.policy.is_some());
    let mut entry = Entry {
        sandbox: Sandbox {
            metadata: Some(ObjectMeta {
                id: id.clone(),
                name: name.clone(),
                created_time: Some(state.clock.now()),
                labels: req.labels.clone(),
                resource_version: 0,
                annotations,
                workspace: ws,
                deletion_time: None,
            }),
            spec: Some(spec),
            status: Some(SandboxStatus {
                current_policy_version: policy_version,
                ..Default::default()
            }),
            ..Default::default()
        },
        container: None,
        configuration_instance_id: ids::uuid(),
        generation: 0,
        dying: false,
        delete_pending: false,
        ever_ready: false,
        command_given,
    };
    set_phase(
        state,
        &mut entry,
        SandboxPhase::Provisioning,
        "ContainerCreating",
        "Sandbox is being provisioned",
    );
    // Checked before storing, so a bad template never leaves a record behind.
    plan(state, &entry)?;
    {
        let mut sandboxes = state.sandboxes();
        if sandboxes.contains_key(&name) {
            return Err(Status::already_exists(format!(
                "sandbox '{name}' already exists"
            )));
        }
        sandboxes.insert(name.clone(), entry.clone());
    }
    tokio::spawn(provision(state.clone(), name, 0));
    Ok(SandboxResponse {
        sandbox: Some(answer(state, &entry)),
        service_urls: BTreeMap::new(),
    })
}

/// Makes (first time) and starts the container, then marks the sandbox READY; any failure
/// marks it ERROR. `generation` is the run this start belongs to.
async fn provision(state: Arc<State>, name: String, generation: u64) {
    let Some(_making) = state.makers.begin() else {
        return;
    };
    let delay = state.faults().provision_delay_ms;
    tokio::time::sleep(Duration::from_millis(delay)).await;
    let Some(entry) = state.entry(&name) else {
        return;
    };
    let result = async {
        let id = match &entry.container {
            Some(id) => id.clone(),
            None => {
                let plan = plan(&state, &entry).map_err(|s| s.message().to_owned())?;
                let id = state
                    .docker
                    .create_locked_down(&plan)
                    .await
                    .map_err(|e| e.to_string())?;
                let stored = state.update(&name, |e| e.container = Some(id.clone()));
                if stored.is_none() {
                    // Deleted while provisioning.
                    let _ = state.docker.remove(&id).await;
                    return Err("sandbox deleted while provisioning".to_owned());
                }
                id
            }
        };
        state.docker.start(&id).await.map_err(|e| e.to_string())?;
        Ok::<String, String>(id)
    }
    .await;
    match result {
        Ok(container) => {
            let became_ready = state.update(&name, |entry| {
                let expected = matches!(
                    entry.phase(),
                    SandboxPhase::Provisioning | SandboxPhase::Starting
                );
                if !expected || entry.generation != generation {
                    return false;
                }
                set_phase(
                    &state,
                    entry,
                    SandboxPhase::Ready,
                    "SupervisorConnected",
                    "Sandbox is ready",
                );
                entry.ever_ready = true;
                let now = state.clock.now();
                let id = entry.id();
                if let Some(status) = entry.sandbox.status.as_mut() {
                    status.main_process_started_time = Some(now);
                    status.main_process_instance_id = ids::uuid();
                    status.configuration_activated = Some(true);
                    let spec = entry.sandbox.spec.as_ref();
                    let policy = spec.and_then(|s| s.policy.as_ref());
                    status.configuration_admission = Some(SandboxConfigurationAdmission {
                        instance_id: entry.configuration_instance_id.clone(),
                        state: ConfigurationAdmissionState::Accepted.into(),
                        policy_version: status.current_policy_version,
                        policy_hash: policy
                            .map(crate::policy_hash::policy_hash)
                            .unwrap_or_default(),
                        ..Default::default()
                    });
                }
                tracing::info!(sandbox = %name, %id, "sandbox ready");
                true
            });
            if became_ready == Some(true) {
                tokio::spawn(watch(state.clone(), name, container, generation));
            }
        }
        Err(message) => {
            tracing::warn!(sandbox = %name, %message, "provisioning failed");
            state.update(&name, |entry| {
                if entry.generation == generation {
                    set_phase(
                        &state,
                        entry,
                        SandboxPhase::Error,
                        "ProvisioningFailed",
                        &message,
                    );
                }
            });
        }
    }
}

/// Waits for the container of a READY sandbox to stop by itself (or be killed by a fault)
/// and records it: COMPLETED with the exit code, or ERROR when a fault killed it. A wait
/// docker ends while the container still runs is not a death (`Engine::wait_dead`).
async fn watch(state: Arc<State>, name: String, container: String, generation: u64) {
    let code = state.docker.wait_dead(&container).await;
    state.update(&name, |entry| {
        if entry.generation != generation || entry.phase() != SandboxPhase::Ready {
            return;
        }
        if entry.dying {
            set_phase(
                &state,
                entry,
                SandboxPhase::Error,
                "SandboxTerminated",
                "the sandbox's container was killed",
            );
        } else {
            set_phase(
                &state,
                entry,
                SandboxPhase::Completed,
                "MainProcessExited",
                "the main process exited",
            );
            if let Some(status) = entry.sandbox.status.as_mut() {
                status.exit_code = code.and_then(|c| i32::try_from(c).ok());
            }
        }
    });
}

/// Kills a sandbox's container now (the "dies mid-run" fault).
pub async fn kill(state: &Arc<State>, name: &str) -> Result<(), String> {
    let container = state
        .update(name, |entry| {
            entry.dying = true;
            entry.container.clone()
        })
        .ok_or_else(|| format!("no sandbox named {name}"))?
        .ok_or_else(|| format!("sandbox {name} has no container yet"))?;
    state
        .docker
        .kill(&container)
        .await
        .map_err(|e| e.to_string())
}

fn required_name(name: &str) -> Result<(), Status> {
    if name.is_empty() {
        return Err(Status::invalid_argument("name is required"));
    }
    Ok(())
}

fn not_found() -> Status {
    Status::not_found("sandbox not found")
}

pub fn get(state: &Arc<State>, req: GetSandboxRequest) -> Result<SandboxResponse, Status> {
    workspace(&req.workspace_scope)?;
    required_name(&req.name)?;
    let entry = state.entry(&req.name).ok_or_else(not_found)?;
    Ok(SandboxResponse {
        sandbox: Some(answer(state, &entry)),
        service_urls: BTreeMap::new(),
    })
}

pub fn list(
    state: &Arc<State>,
    req: ListSandboxesRequest,
) -> Result<ListSandboxesResponse, Status> {
    let all = matches!(
        req.workspace_scope
            .as_ref()
            .and_then(|s| s.selection.as_ref()),
        Some(workspace_selector::Selection::AllWorkspaces(_))
    );
    if !all {
        workspace(&req.workspace_scope)?;
    }
    let selector = validate::label_selector(&req.label_selector)?;
    let page_size = match req.page_size {
        n if n <= 0 => 100,
        n => n.min(1000) as usize,
    };
    let offset: usize = if req.page_token.is_empty() {
        0
    } else {
        req.page_token
            .parse()
            .map_err(|_| Status::invalid_argument("invalid page_token"))?
    };
    let mut matching: Vec<Entry> = state
        .sandboxes()
        .values()
        .filter(|e| {
            let labels = e.sandbox.metadata.as_ref().map(|m| &m.labels);
            selector
                .iter()
                .all(|(k, v)| labels.and_then(|l| l.get(k)) == Some(v))
        })
        .cloned()
        .collect();
    let created = |e: &Entry| {
        let t = e.sandbox.metadata.as_ref().and_then(|m| m.created_time);
        t.map(|t| (t.seconds, t.nanos)).unwrap_or_default()
    };
    matching.sort_by(|a, b| {
        created(a)
            .cmp(&created(b))
            .then_with(|| a.id().cmp(&b.id()))
    });
    let page: Vec<Sandbox> = matching
        .iter()
        .skip(offset)
        .take(page_size)
        .map(|e| answer(state, e))
        .collect();
    let next = offset + page.len();
    Ok(ListSandboxesResponse {
        sandboxes: page,
        next_page_token: if next < matching.len() {
            next.to_string()
        } else {
            String::new()
        },
    })
}

/// Removes a sandbox's tokens (a stopped or deleted sandbox keeps none).
fn drop_tokens(state: &State, sandbox_id: &str) {
    state.tokens().retain(|_, t| t.sandbox_id != sandbox_id);
}

pub async fn delete(
    state: &Arc<State>,
    req: DeleteSandboxRequest,
) -> Result<DeleteSandboxResponse, Status> {
    workspace(&req.workspace_scope)?;
    required_name(&req.name)?;
    let stays_accepted = state.faults().delete_stays_accepted;
    let now = state.clock.now();
    let marked = state.update(&req.name, |entry| {
        set_phase(
            state,
            entry,
            SandboxPhase::Deleting,
            "Deleting",
            "Sandbox is being deleted",
        );
        entry.generation += 1;
        entry.delete_pending = stays_accepted;
        if let Some(meta) = entry.sandbox.metadata.as_mut() {
            meta.deletion_time.get_or_insert(now);
        }
        (entry.id(), entry.container.clone())
    });
    let Some((id, container)) = marked else {
        if req.allow_missing {
            return Ok(DeleteSandboxResponse {
                outcome: DeletionOutcome::AlreadyAbsent.into(),
                sandbox_id: String::new(),
            });
        }
        return Err(not_found());
    };
    drop_tokens(state, &id);
    if stays_accepted {
        if let Some(container) = container {
            let _ = state.docker.stop(&container).await;
        }
        return Ok(DeleteSandboxResponse {
            outcome: DeletionOutcome::Accepted.into(),
            sandbox_id: id,
        });
    }
    finish_delete(state, &req.name).await?;
    Ok(DeleteSandboxResponse {
        outcome: DeletionOutcome::Completed.into(),
        sandbox_id: id,
    })
}

/// Removes the container, then the record.
async fn finish_delete(state: &Arc<State>, name: &str) -> Result<(), Status> {
    if let Some(container) = state.entry(name).and_then(|e| e.container) {
        state
            .docker
            .remove(&container)
            .await
            .map_err(|e| Status::internal(format!("delete sandbox failed: {e}")))?;
    }
    state.sandboxes().remove(name);
    Ok(())
}

/// Finishes the deletes that a fault held at ACCEPTED (called when faults change).
pub async fn finish_pending_deletes(state: &Arc<State>) {
    if state.faults().delete_stays_accepted {
        return;
    }
    let pending: Vec<String> = state
        .sandboxes()
        .iter()
        .filter(|(_, e)| e.delete_pending)
        .map(|(n, _)| n.clone())
        .collect();
    for name in pending {
        if let Err(e) = finish_delete(state, &name).await {
            tracing::warn!(sandbox = %name, error = %e, "finishing a held delete failed");
        }
    }
}

pub async fn stop(state: &Arc<State>, req: StopSandboxRequest) -> Result<SandboxResponse, Status> {
    workspace(&req.workspace_scope)?;
    required_name(&req.name)?;
    let prepared = state.update(&req.name, |entry| match entry.phase() {
        SandboxPhase::Stopped => Ok(None),
        SandboxPhase::Ready => {
            set_phase(
                state,
                entry,
                SandboxPhase::Stopping,
                "Stopping",
                "Sandbox stop requested",
            );
            entry.generation += 1;
            Ok(Some((entry.id(), entry.container.clone())))
        }
        phase => Err(precondition(format!(
            "sandbox must be Ready to stop (current phase: {phase:?})"
        ))),
    });
    let (id, container) = match prepared.ok_or_else(not_found)?? {
        None => {
            let entry = state.entry(&req.name).ok_or_else(not_found)?;
            drop_tokens(state, &entry.id());
            return Ok(SandboxResponse {
                sandbox: Some(answer(state, &entry)),
                service_urls: BTreeMap::new(),
            });
        }
        Some(found) => found,
    };
    if let Some(container) = container {
        state
            .docker
            .stop(&container)
            .await
            .map_err(|e| Status::internal(format!("stop sandbox failed: {e}")))?;
    }
    drop_tokens(state, &id);
    let entry = state
        .update(&req.name, |entry| {
            set_phase(
                state,
                entry,
                SandboxPhase::Stopped,
                "Stopped",
                "Sandbox compute is stopped",
            );
            entry.clone()
        })
        .ok_or_else(not_found)?;
    Ok(SandboxResponse {
        sandbox: Some(answer(state, &entry)),
        service_urls: BTreeMap::new(),
    })
}

pub fn start(state: &Arc<State>, req: StartSandboxRequest) -> Result<SandboxResponse, Status> {
    workspace(&req.workspace_scope)?;
    required_name(&req.name)?;
    let started = state.update(&req.name, |entry| match entry.phase() {
        SandboxPhase::Ready => Ok((entry.clone(), None)),
        SandboxPhase::Stopped => {
            set_phase(
                state,
                entry,
                SandboxPhase::Starting,
                "Starting",
                "Sandbox start requested",
            );
            entry.generation += 1;
            Ok((entry.clone(), Some(entry.generation)))
        }
        phase => Err(precondition(format!(
            "sandbox must be Stopped to start (current phase: {phase:?})"
        ))),
    });
    let (entry, generation) = started.ok_or_else(not_found)??;
    if let Some(generation) = generation {
        tokio::spawn(provision(state.clone(), req.name.clone(), generation));
    }
    Ok(SandboxResponse {
        sandbox: Some(answer(state, &entry)),
        service_urls: BTreeMap::new(),
    })
}

/// Removes every container this simulator made (at shutdown), after the provisioning
/// tasks in flight (at most 30 s), so none makes a container behind it.
pub async fn remove_all(state: &Arc<State>) {
    let stuck = state.makers.close(Duration::from_secs(30)).await;
    if stuck > 0 {
        tracing::warn!(stuck, "provisioning tasks still running at shutdown");
    }
    let label = format!("{LABEL_INSTANCE}={}", state.settings.instance);
    let left = state.docker.remove_every(&label).await;
    if left > 0 {
        tracing::warn!(left, "sandbox containers could not be removed");
    }
    state.sandboxes().clear();
}
