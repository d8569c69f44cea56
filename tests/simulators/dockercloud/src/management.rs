//! The Connect management API (`docker.sbx.v1`) under the management base URL's path
//! (`/sbx`, as `https://sandboxes.connect.docker.com/sbx`): SandboxService,
//! CapabilityService, OperationService and NetworkPolicyService, every call authorized by
//! an exchanged access token.

use std::sync::Arc;
use std::time::Duration;

use hyper::body::Incoming;
use hyper::{Method, Request};
use serde_json::{Value, json};

use crate::connect::{self, Refusal};
use crate::error::{ApiError, Code};
use crate::http::{Reply, json_reply, read_body};
use crate::lifecycle::{self, CreateSpec};
use crate::protojson::uint;
use crate::state::{OnTimeout, State, parse_duration};
use crate::views;

/// The management base URL's path.
pub const PREFIX: &str = "/sbx";

/// How long `WaitOperation` waits at most, whatever the caller asks.
pub const MAX_WAIT: Duration = Duration::from_secs(10);

/// ListSandboxes pages.
const DEFAULT_PAGE_SIZE: u32 = 50;
const MAX_PAGE_SIZE: u32 = 100;

/// The size a create gets when it names no memory (the "Micro" size).
const DEFAULT_MEMORY_MIB: u64 = 2048;

/// Serves the Connect management host.
pub async fn handle(state: Arc<State>, request: Request<Incoming>) -> Reply {
    let path = request.uri().path().to_owned();
    let Some(procedure) = path.strip_prefix(PREFIX).map(str::to_owned) else {
        return json_reply(
            404,
            &json!({ "code": "not_found", "message": "404 page not found" }),
        );
    };
    if !is_procedure(&procedure) {
        return json_reply(
            404,
            &json!({ "code": "not_found", "message": "404 page not found" }),
        );
    }
    if request.method() != Method::POST {
        return crate::http::with_header(crate::http::empty_reply(405), "allow", "POST");
    }
    connect::unary_reply(call(&state, &procedure, request).await)
}

fn is_procedure(procedure: &str) -> bool {
    matches!(
        procedure,
        "/docker.sbx.v1.SandboxService/CreateSandbox"
            | "/docker.sbx.v1.SandboxService/GetSandbox"
            | "/docker.sbx.v1.SandboxService/ListSandboxes"
            | "/docker.sbx.v1.SandboxService/DeleteSandbox"
            | "/docker.sbx.v1.CapabilityService/GetCapabilities"
            | "/docker.sbx.v1.OperationService/WaitOperation"
            | "/docker.sbx.v1.OperationService/GetOperation"
            | "/docker.sbx.v1.NetworkPolicyService/GetEffectiveNetworkPolicy"
    )
}

async fn call(
    state: &Arc<State>,
    procedure: &str,
    request: Request<Incoming>,
) -> Result<Value, Refusal> {
    connect::check_headers(request.headers(), false)?;
    crate::auth::check_access_token(state, request.headers())?;
    let deadline = connect::deadline(request.headers());
    let body = read_body(request.into_body(), connect::MAX_MESSAGE).await?;
    let input = connect::parse_unary(&body)?;
    let work = dispatch(state, procedure, input, deadline);
    match deadline {
        Some(budget) => match tokio::time::timeout(budget, work).await {
            Ok(result) => Ok(result?),
            Err(_) => Err(ApiError::new(Code::DeadlineExceeded, "deadline exceeded").into()),
        },
        None => Ok(work.await?),
    }
}

async fn dispatch(
    state: &Arc<State>,
    procedure: &str,
    input: Value,
    deadline: Option<Duration>,
) -> Result<Value, ApiError> {
    let service = procedure.rsplit('/').next().unwrap_or("");
    match service {
        "CreateSandbox" => create(state, &input),
        "GetSandbox" => {
            let id = find(state, &input["sandbox"])?;
            let inner = state.lock();
            let sandbox = inner
                .sandboxes
                .get(&id)
                .ok_or_else(|| ApiError::not_found("sandbox not found"))?;
            Ok(views::sandbox(state, sandbox))
        }
        "ListSandboxes" => list(state, &input),
        "DeleteSandbox" => {
            let id = find(state, &input["sandbox"])?;
            let op = lifecycle::begin_delete(state, &id, false)?;
            operation(state, &op)
        }
        "GetCapabilities" => Ok(capabilities(state)),
        "WaitOperation" => wait(state, &input, deadline).await,
        "GetOperation" => operation(state, str_field(&input, "id")?),
        "GetEffectiveNetworkPolicy" => {
            let id = find(state, &input["target"]["sandbox"])?;
            let sandbox = state
                .lock()
                .sandboxes
                .get(&id)
                .cloned()
                .ok_or_else(|| ApiError::not_found("sandbox not found"))?;
            Ok(crate::policy::effective(state, &sandbox).connect_json())
        }
        _ => Err(ApiError::new(
            Code::Unimplemented,
            format!("{procedure} is not implemented"),
        )),
    }
}

fn str_field<'a>(input: &'a Value, name: &str) -> Result<&'a str, ApiError> {
    input[name]
        .as_str()
        .filter(|s| !s.is_empty())
        .ok_or_else(|| ApiError::invalid(format!("{name} is required")))
}

/// A `SandboxRef`: `{id}` or `{name}`; answers the id.
fn find(state: &State, reference: &Value) -> Result<String, ApiError> {
    let inner = state.lock();
    if let Some(id) = reference["id"].as_str().filter(|s| !s.is_empty()) {
        return inner
            .sandboxes
            .contains_key(id)
            .then(|| id.to_owned())
            .ok_or_else(|| ApiError::not_found("sandbox not found"));
    }
    if let Some(name) = reference["name"].as_str().filter(|s| !s.is_empty()) {
        return inner
            .sandboxes
            .values()
            .find(|s| s.name == name)
            .map(|s| s.id.clone())
            .ok_or_else(|| ApiError::not_found("sandbox not found"));
    }
    Err(ApiError::invalid("sandbox: id or name is required"))
}

fn create(state: &Arc<State>, input: &Value) -> Result<Value, ApiError> {
    if let Some(request_id) = input["requestId"].as_str().filter(|s| !s.is_empty()) {
        let known = state.lock().request_ids.get(request_id).cloned();
        if let Some(op) = known {
            return operation(state, &op);
        }
    }
    // An inline policy made the live service fail the create with `internal`, although
    // the capabilities say policies can be attached.
    if input["networkPolicies"]
        .as_array()
        .is_some_and(|p| !p.is_empty())
    {
        return Err(ApiError::internal("internal error"));
    }
    if input["image"].as_str().is_some_and(|s| !s.is_empty()) {
        return Err(ApiError::new(
            Code::Unimplemented,
            "image store images are not simulated",
        ));
    }
    let cloud = &input["cloud"];
    if !cloud.is_object() {
        return Err(ApiError::invalid("cloud is required"));
    }
    let image_ref = str_field(cloud, "imageRef")?.to_owned();
    let resources = &input["resources"];
    let Some(cpus) = uint(&resources["cpus"]).filter(|c| *c > 0) else {
        return Err(ApiError::invalid(
            "'cpus' is required when using 'imageRef'",
        ));
    };
    let cpus = u32::try_from(cpus).map_err(|_| ApiError::invalid("cpus is too large"))?;
    let memory_mib = match &resources["memoryMib"] {
        Value::Null => DEFAULT_MEMORY_MIB,
        other => uint(other).ok_or_else(|| ApiError::invalid("memoryMib must be an integer"))?,
    };
    lifecycle::check_platform(&cloud["platform"])?;
    let start_cmd = lifecycle::start_command(&cloud["startCmd"], "startCmd")?;
    let timeout = lifecycle::initial_timeout(&cloud["timeout"])?;
    let on_timeout = match cloud["onTimeout"].as_str() {
        None | Some("ON_TIMEOUT_DELETE") => OnTimeout::Delete,
        Some("ON_TIMEOUT_STOP") => OnTimeout::Stop,
        Some(other) => {
            return Err(ApiError::invalid(format!(
                "onTimeout {other:?} is not supported"
            )));
        }
    };
    let name = match input["name"].as_str().filter(|s| !s.is_empty()) {
        Some(name) => name.to_owned(),
        None => format!("sandbox-{}", crate::ids::hex_id(4)),
    };
    let spec = CreateSpec {
        name,
        image_ref,
        cpus,
        memory_mib,
        start_cmd,
        timeout,
        on_timeout,
        auto_resume: cloud["autoResume"].as_bool().unwrap_or(false),
        via_rest: false,
    };
    let (_, op) = lifecycle::admit(state, spec)?;
    if let Some(request_id) = input["requestId"].as_str().filter(|s| !s.is_empty()) {
        state
            .lock()
            .request_ids
            .insert(request_id.to_owned(), op.clone());
    }
    operation(state, &op)
}

fn operation(state: &State, id: &str) -> Result<Value, ApiError> {
    let op = state
        .lock()
        .operations
        .get(id)
        .cloned()
        .ok_or_else(|| ApiError::not_found("operation not found"))?;
    Ok(views::operation(state, &op))
}

async fn wait(
    state: &Arc<State>,
    input: &Value,
    deadline: Option<Duration>,
) -> Result<Value, ApiError> {
    if state.faults().wait_operation_unimplemented {
        return Err(ApiError::new(
            Code::Unimplemented,
            "docker.sbx.v1.OperationService.WaitOperation is not implemented",
        ));
    }
    let id = str_field(input, "id")?.to_owned();
    let mut budget = match input["timeout"].as_str() {
        Some(text) => {
            parse_duration(text).ok_or_else(|| ApiError::invalid("timeout must be a duration"))?
        }
        None => MAX_WAIT,
    }
    .min(MAX_WAIT);
    if let Some(deadline) = deadline {
        // Answer before the caller gives up.
        budget = budget.min(deadline.saturating_sub(Duration::from_millis(100)));
    }
    let until = tokio::time::Instant::now() + budget;
    loop {
        let notified = state.changed.notified();
        let answer = operation(state, &id)?;
        if answer["done"] == true || tokio::time::Instant::now() >= until {
            return Ok(answer);
        }
        let _ = tokio::time::timeout_at(until, notified).await;
    }
}

fn list(state: &State, input: &Value) -> Result<Value, ApiError> {
    let size = match uint(&input["pageSize"]) {
        None | Some(0) => DEFAULT_PAGE_SIZE as usize,
        Some(n) => n.min(u64::from(MAX_PAGE_SIZE)) as usize,
    };
    let (page, next) = state.page(input["pageToken"].as_str(), size)?;
    let sandboxes: Vec<Value> = page.iter().map(|s| views::sandbox(state, s)).collect();
    Ok(views::prune(
        json!({ "sandboxes": sandboxes, "nextPageToken": next }),
    ))
}

/// Permission names as `docker.sbx.common.v1.Permission` has them. A Cloud Sandboxes
/// token is not shown EXEC or FILES permissions, yet exec and file calls are served (as
/// live).
const PERMISSIONS: [&str; 4] = [
    "PERMISSION_SANDBOXES_READ",
    "PERMISSION_SANDBOXES_CREATE",
    "PERMISSION_SANDBOXES_DELETE",
    "PERMISSION_NETWORK_POLICIES_READ",
];

fn capabilities(state: &State) -> Value {
    let missing = state.faults().missing_permissions;
    let permissions: Vec<&str> = PERMISSIONS
        .into_iter()
        .filter(|p| !missing.iter().any(|m| m == p))
        .collect();
    let settings = &state.settings;
    views::prune(json!({
        "backend": "BACKEND_CLOUD",
        "platforms": [{ "os": "linux", "architecture": "amd64" }],
        "pagination": { "defaultPageSize": DEFAULT_PAGE_SIZE, "maxPageSize": MAX_PAGE_SIZE },
        "policyDomains": ["POLICY_DOMAIN_NETWORK"],
        "permissions": permissions,
        "resources": {
            "cpuMin": settings.cpu_range.0,
            "cpuMax": settings.cpu_range.1,
            "memoryMibMin": settings.memory_mib_range.0.to_string(),
            "memoryMibMax": settings.memory_mib_range.1.to_string(),
        },
        "canAttachPolicies": true,
    }))
}
