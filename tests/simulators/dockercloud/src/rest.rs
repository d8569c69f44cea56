//! The REST management API (`https://connect.docker.com/sandboxes` + `/v1/…`), the part
//! plimsoll uses: sandboxes (create with `Idempotency-Key` replay, read, list, delete
//! under `If-Match`), a sandbox's network policies, and its endpoint credentials (at most
//! 300 s). Errors are the API's `Error` body with camelCase codes.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use hyper::body::Incoming;
use hyper::{Method, Request};
use serde_json::{Value, json};

use crate::error::{ApiError, Code};
use crate::http::{Reply, empty_reply, json_reply, read_body, with_header};
use crate::lifecycle::{self, CreateSpec};
use crate::protojson::uint;
use crate::state::{
    EndpointCredential, OnTimeout, Replay, Sandbox, State, Status, parse_duration, rfc3339,
};
use crate::views::prune;

/// The REST base URL's path.
pub const PREFIX: &str = "/sandboxes";
/// The longest (and default) life of an endpoint credential.
pub const CREDENTIAL_MAX_TTL: Duration = Duration::from_secs(300);
/// How long an `Idempotency-Key` replays its create.
pub const REPLAY_RETENTION: Duration = Duration::from_secs(24 * 3600);
/// What an endpoint credential may be asked for.
pub const ENDPOINT_PERMISSIONS: [&str; 3] =
    ["sandboxesExec", "sandboxesFilesRead", "sandboxesFilesWrite"];

fn refuse(e: &ApiError) -> Reply {
    json_reply(e.rest_status(), &e.rest_json())
}

/// Serves the REST management host.
pub async fn handle(state: Arc<State>, request: Request<Incoming>) -> Reply {
    let path = request.uri().path().to_owned();
    let Some(route) = path.strip_prefix(PREFIX).map(str::to_owned) else {
        return refuse(&ApiError::not_found("no such route"));
    };
    if let Err(e) = crate::auth::check_access_token(&state, request.headers()) {
        return refuse(&e);
    }
    let segments: Vec<&str> = route.trim_start_matches('/').split('/').collect();
    let method = request.method().clone();
    match (method, segments.as_slice()) {
        (Method::POST, ["v1", "sandboxes"]) => create(&state, request).await,
        (Method::GET, ["v1", "sandboxes"]) => list(&state, request.uri().query()),
        (Method::GET, ["v1", "sandboxes", id]) => read(&state, id),
        (Method::DELETE, ["v1", "sandboxes", id]) => delete(&state, id, request.headers()),
        (Method::GET, ["v1", "sandboxes", id, "network-policies"]) => network_policies(&state, id),
        (Method::POST, ["v1", "sandboxes", id, "endpoint-credentials"]) => {
            let id = (*id).to_owned();
            credential(&state, &id, request).await
        }
        _ => refuse(&ApiError::not_found("no such route")),
    }
}

fn status_name(s: &Sandbox) -> &'static str {
    match s.status {
        Status::Creating => "creating",
        Status::Running => "running",
        Status::Stopping if s.deleting => "deleting",
        Status::Stopping => "stopping",
        Status::Stopped => "stopped",
        Status::Failed => "failed",
    }
}

/// A sandbox as the REST API writes it.
pub fn view(state: &State, s: &Sandbox) -> Value {
    let mut core = json!({
        "status": status_name(s),
        "resources": { "cpus": s.cpus, "memoryMib": s.memory_mib.to_string() },
        "platform": { "os": "linux", "architecture": "amd64" },
        "createdAt": rfc3339(s.created_at),
        "etag": s.etag(),
        "imageRef": s.image_ref,
    });
    if s.status == Status::Running {
        let uri = state.endpoint_uri(&s.id);
        core["endpoint"] = json!({
            "uri": uri,
            "protocol": "http",
            "credentialAudience": uri,
            "sandbox": format!("sandboxes/{}", s.id),
            "sandboxUid": s.id,
            "apiVersion": "v1",
            "capabilities": ["exec", "upload", "download"],
            "authentication": { "scheme": "scopedBearer", "defaultTtl": "300s", "maxTtl": "300s" },
        });
    }
    let mut out = json!({
        "name": format!("sandboxes/{}", s.id),
        "uid": s.id,
        "displayName": s.name,
        "core": core,
    });
    if let Some((code, message)) = &s.failure {
        out["failure"] = json!({ "code": code.rest_name(), "message": message });
    }
    prune(out)
}

fn sandbox_reply(status: u16, state: &State, s: &Sandbox) -> Reply {
    with_header(json_reply(status, &view(state, s)), "etag", &s.etag())
}

const CREATE_FIELDS: [&str; 16] = [
    "agent",
    "displayName",
    "displayNamePrefix",
    "environment",
    "resources",
    "pullPolicy",
    "kits",
    "mcp",
    "networkPolicies",
    "policyIds",
    "platform",
    "startupExecution",
    "labels",
    "features",
    "image",
    "imageRef",
];

fn only_fields(value: &Value, allowed: &[&str], at: &str) -> Result<(), ApiError> {
    if let Some(map) = value.as_object()
        && let Some(unknown) = map.keys().find(|k| !allowed.contains(&k.as_str()))
    {
        return Err(ApiError::invalid(format!("unknown field {at}{unknown}")).with_http(400));
    }
    Ok(())
}

fn parse_create(input: &Value) -> Result<CreateSpec, ApiError> {
    if !input.is_object() {
        return Err(ApiError::invalid("the body must be a JSON object"));
    }
    only_fields(input, &CREATE_FIELDS, "")?;
    only_fields(&input["resources"], &["cpus", "memoryMib"], "resources.")?;
    only_fields(&input["platform"], &["os", "architecture"], "platform.")?;
    only_fields(
        &input["startupExecution"],
        &["rawImage"],
        "startupExecution.",
    )?;
    only_fields(
        &input["startupExecution"]["rawImage"],
        &["start"],
        "startupExecution.rawImage.",
    )?;
    only_fields(
        &input["features"],
        &["managedVolumes", "timeouts", "storedSecrets"],
        "features.",
    )?;
    let timeouts = &input["features"]["timeouts"];
    only_fields(
        timeouts,
        &["timeout", "onTimeout", "autoResume"],
        "features.timeouts.",
    )?;
    for unsimulated in [
        "agent",
        "kits",
        "mcp",
        "image",
        "policyIds",
        "displayNamePrefix",
    ] {
        if !input[unsimulated].is_null() {
            return Err(ApiError::new(
                Code::Unimplemented,
                format!("{unsimulated} is not simulated"),
            ));
        }
    }
    // While the account's default policy governs, inline policies are refused.
    if input["networkPolicies"]
        .as_array()
        .is_some_and(|p| !p.is_empty())
    {
        return Err(ApiError::new(
            Code::FailedPrecondition,
            "network_policies cannot be enforced while a local account-default policy governs this sandbox",
        )
        .with_http(409));
    }
    let name = input["displayName"].as_str().unwrap_or("").to_owned();
    if name.len() > 64
        || !name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
    {
        return Err(ApiError::invalid(
            "displayName must match ^[a-zA-Z0-9_-]*$, at most 64 characters",
        ));
    }
    let image_ref = input["imageRef"]
        .as_str()
        .filter(|s| !s.is_empty())
        .ok_or_else(|| ApiError::invalid("imageRef is required"))?
        .to_owned();
    let cpus = uint(&input["resources"]["cpus"])
        .filter(|c| *c > 0)
        .ok_or_else(|| ApiError::invalid("'cpus' is required when using 'imageRef'"))?;
    let memory_mib = uint(&input["resources"]["memoryMib"]).unwrap_or(2048);
    lifecycle::check_platform(&input["platform"])?;
    let start_cmd = lifecycle::start_command(
        &input["startupExecution"]["rawImage"]["start"]["argv"],
        "argv",
    )?;
    let timeout = lifecycle::initial_timeout(&timeouts["timeout"])?;
    let on_timeout = match timeouts["onTimeout"].as_str() {
        None | Some("delete") => OnTimeout::Delete,
        Some("stop") => OnTimeout::Stop,
        Some(other) => {
            return Err(ApiError::invalid(format!(
                "onTimeout {other:?} is not supported"
            )));
        }
    };
    Ok(CreateSpec {
        name: if name.is_empty() {
            format!("sandbox-{}", crate::ids::hex_id(4))
        } else {
            name
        },
        image_ref,
        cpus: u32::try_from(cpus).map_err(|_| ApiError::invalid("cpus is too large"))?,
        memory_mib,
        start_cmd,
        timeout,
        on_timeout,
        auto_resume: timeouts["autoResume"].as_bool().unwrap_or(false),
        via_rest: true,
    })
}

async fn create(state: &Arc<State>, request: Request<Incoming>) -> Reply {
    let key = request
        .headers()
        .get("idempotency-key")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let body = match read_body(request.into_body(), 1 << 20).await {
        Ok(body) => body,
        Err(e) => return refuse(&e),
    };
    let Ok(input) = serde_json::from_slice::<Value>(&body) else {
        return refuse(&ApiError::invalid("the body is not JSON"));
    };
    // Unknown fields are refused before the replay lookup.
    let spec = match parse_create(&input) {
        Ok(spec) => spec,
        Err(e) => return refuse(&e),
    };
    if let Some(key) = &key {
        // Keys are kept 24 hours; an older one is a new create.
        let replay = state
            .lock()
            .replays
            .get(key)
            .filter(|r| r.created.elapsed().unwrap_or_default() < REPLAY_RETENTION)
            .cloned();
        if let Some(replay) = replay {
            if replay.payload != input {
                return refuse(
                    &ApiError::new(
                        Code::FailedPrecondition,
                        "The Idempotency-Key was already used with a different payload.",
                    )
                    .with_http(409),
                );
            }
            let sandbox = state.lock().sandboxes.get(&replay.sandbox_id).cloned();
            return match sandbox {
                Some(s) => sandbox_reply(
                    if s.status == Status::Creating {
                        202
                    } else {
                        201
                    },
                    state,
                    &s,
                ),
                None => refuse(&ApiError::not_found("sandbox not found")),
            };
        }
    }
    let id = match lifecycle::admit(state, spec) {
        Ok((id, _)) => id,
        Err(e) => return refuse(&e),
    };
    let Some(sandbox) = state.lock().sandboxes.get(&id).cloned() else {
        return refuse(&ApiError::internal("the sandbox vanished"));
    };
    if let Some(key) = key {
        state.lock().replays.insert(
            key,
            Replay {
                payload: input,
                sandbox_id: id,
                created: SystemTime::now(),
            },
        );
    }
    sandbox_reply(202, state, &sandbox)
}

fn read(state: &State, id: &str) -> Reply {
    match state.lock().sandboxes.get(id) {
        Some(s) => sandbox_reply(200, state, s),
        None => refuse(&ApiError::not_found(
            "The target is absent or not visible within the caller's scope.",
        )),
    }
}

fn list(state: &State, query: Option<&str>) -> Reply {
    let param = |name: &str| {
        query
            .unwrap_or("")
            .split('&')
            .filter_map(|pair| pair.split_once('='))
            .find(|(k, _)| *k == name)
            .map(|(_, v)| v.to_owned())
    };
    let size = param("pageSize")
        .and_then(|v| v.parse::<usize>().ok())
        .filter(|n| *n > 0)
        .unwrap_or(50)
        .min(100);
    let (page, next) = match state.page(param("pageToken").as_deref(), size) {
        Ok(found) => found,
        Err(e) => return refuse(&e),
    };
    let page: Vec<Value> = page.iter().map(|s| view(state, s)).collect();
    json_reply(
        200,
        &prune(json!({ "sandboxes": page, "nextPageToken": next })),
    )
}

fn delete(state: &Arc<State>, id: &str, headers: &http::HeaderMap) -> Reply {
    let Some(if_match) = headers
        .get("if-match")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned)
    else {
        return refuse(
            &ApiError::new(
                Code::FailedPrecondition,
                "etag_required: No precondition was sent.",
            )
            .with_http(428),
        );
    };
    let current = state.lock().sandboxes.get(id).cloned();
    // The answer proves nothing: a sandbox that is not there is "deleted" whatever the etag.
    let Some(sandbox) = current else {
        return empty_reply(204);
    };
    if sandbox.etag() != if_match {
        return refuse(
            &ApiError::new(
                Code::FailedPrecondition,
                "etag_mismatch: The precondition is not the resource's current etag.",
            )
            .with_http(412)
            .with_detail(json!({
                "@type": "type.googleapis.com/docker.sandboxes.v1.EtagMismatch",
                "currentEtag": sandbox.etag(),
            })),
        );
    }
    let keep = state.faults().rest_delete_keeps_sandbox;
    if !sandbox.deleting
        && let Err(e) = lifecycle::begin_delete(state, id, keep)
    {
        return refuse(&e);
    }
    let mut shown = state.lock().sandboxes.get(id).cloned().unwrap_or(sandbox);
    if keep {
        // What the answer claims; the sandbox itself is untouched.
        shown.status = Status::Stopping;
        shown.deleting = true;
    }
    sandbox_reply(202, state, &shown)
}

fn network_policies(state: &State, id: &str) -> Reply {
    let Some(sandbox) = state.lock().sandboxes.get(id).cloned() else {
        return refuse(&ApiError::not_found(
            "The target is absent or not visible within the caller's scope.",
        ));
    };
    if sandbox.policy_allow.is_some() {
        // A per-sandbox rule cannot be shown through this API.
        return refuse(
            &ApiError::new(Code::FailedPrecondition, "the sandbox's network policy cannot be shown: it carries a rule set outside this API")
                .with_http(409),
        );
    }
    let effective = crate::policy::effective(state, &sandbox);
    let mut nodes = vec![json!({
        "constant": if effective.deny_all { "false" } else { "true" },
        "source": { "origin": "default", "id": "account-default" },
    })];
    for (network, _) in &effective.allow {
        let (host, port) = network.rsplit_once(':').unwrap_or((network.as_str(), ""));
        let mut destination = json!({ "kind": "dns", "value": host });
        if let Ok(port) = port.parse::<u16>() {
            destination["port"] = json!(port);
        }
        nodes.push(
            json!({ "destination": destination, "source": { "origin": "owner", "id": "owner" } }),
        );
    }
    if nodes.len() > 1 {
        let operands: Vec<usize> = (0..nodes.len()).collect();
        nodes.push(json!({ "any": { "nodes": operands } }));
    }
    json_reply(
        200,
        &json!({
            "effective": effective.rest_json(),
            "exact": { "revision": format!("r{}", sandbox.generation), "selectorVersion": "destination.v1", "nodes": nodes },
        }),
    )
}

async fn credential(state: &Arc<State>, id: &str, request: Request<Incoming>) -> Reply {
    let no_store = |reply: Reply| with_header(reply, "cache-control", "no-store");
    let body = match read_body(request.into_body(), 64 << 10).await {
        Ok(body) => body,
        Err(e) => return no_store(refuse(&e)),
    };
    let Ok(input) = serde_json::from_slice::<Value>(&body) else {
        return no_store(refuse(&ApiError::invalid("the body is not JSON")));
    };
    if let Err(e) = only_fields(&input, &["permissions", "ttl"], "") {
        return no_store(refuse(&e));
    }
    let permissions = crate::protojson::strings(&input["permissions"]);
    let Some(permissions) = permissions
        .filter(|p| !p.is_empty() && p.iter().all(|x| ENDPOINT_PERMISSIONS.contains(&x.as_str())))
    else {
        return no_store(refuse(&ApiError::invalid(
            "permissions must list sandboxesExec, sandboxesFilesRead or sandboxesFilesWrite",
        )));
    };
    let ttl = match input["ttl"].as_str() {
        None => CREDENTIAL_MAX_TTL,
        Some(text) => match parse_duration(text) {
            Some(d) => d.clamp(Duration::from_secs(1), CREDENTIAL_MAX_TTL),
            None => return no_store(refuse(&ApiError::invalid("ttl must be a duration"))),
        },
    };
    let token = format!("sbxe_{}", crate::ids::hex_id(32));
    let expires = SystemTime::now() + ttl;
    {
        let mut inner = state.lock();
        if !inner.sandboxes.contains_key(id) {
            drop(inner);
            return no_store(refuse(&ApiError::not_found(
                "The target is absent or not visible within the caller's scope.",
            )));
        }
        inner
            .credentials
            .retain(|_, c| c.expires > SystemTime::now());
        inner.credentials.insert(
            crate::auth::token_hash(&token),
            EndpointCredential {
                sandbox_id: id.to_owned(),
                expires,
                permissions: permissions.clone(),
            },
        );
    }
    no_store(json_reply(
        200,
        &json!({
            "token": token,
            "expireTime": rfc3339(expires),
            "permissions": permissions,
            "sandbox": format!("sandboxes/{id}"),
            "audience": state.endpoint_uri(id),
        }),
    ))
}
