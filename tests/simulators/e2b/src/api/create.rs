//! `POST /v2/sandboxes` (E2B's SDK) and the v1 `POST /sandboxes`.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Instant;

use http::StatusCode;
use serde::Deserialize;
use serde_json::Value;

use super::{body, error, timeout};
use crate::app::App;
use crate::http::{Request, Response, json};
use crate::lifecycle::{self, CreateSpec, LifecycleError};
use crate::network::NetworkConfig;

/// `NewSandboxV2` (and v1 `NewSandbox`, which adds `secure`).
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct NewSandbox {
    #[serde(rename = "templateID")]
    template_id: String,
    timeout: Option<i64>,
    #[serde(default)]
    auto_pause: bool,
    secure: Option<bool>,
    #[serde(rename = "allow_internet_access")]
    allow_internet_access: Option<bool>,
    network: Option<NetworkConfig>,
    metadata: Option<BTreeMap<String, String>>,
    env_vars: Option<BTreeMap<String, String>>,
    iam: Option<Value>,
    volume_mounts: Option<Vec<Value>>,
}

pub async fn create(app: &Arc<App>, request: Request, v2: bool) -> Response {
    let received = Instant::now();
    let key = request
        .headers()
        .get("idempotency-key")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    if let Some(key) = &key {
        let earlier = app.idempotent().get(key).cloned();
        let replay =
            earlier.and_then(|id| app.sandboxes.with(&id, |s| s.created(&app.config.domain)));
        if let Some(created) = replay {
            return json(StatusCode::CREATED, &created);
        }
    }
    let new: NewSandbox = match body(request).await {
        Ok(new) => new,
        Err(response) => return response,
    };
    let template = &app.config.template;
    if new.template_id != template.id && new.template_id != template.alias {
        return error(
            StatusCode::NOT_FOUND,
            &format!("template '{}' not found", new.template_id),
        );
    }
    // The v1 default is 15 s, the v2 one 300 s (E2B's API documents both).
    let timeout = match timeout(app, new.timeout, if v2 { 300 } else { 15 }) {
        Ok(timeout) => timeout,
        Err(response) => return *response,
    };
    if new.volume_mounts.as_ref().is_some_and(|v| !v.is_empty()) {
        return error(StatusCode::BAD_REQUEST, "Volume mounts are not enabled.");
    }
    let iam_tokens = new
        .iam
        .as_ref()
        .and_then(|iam| iam.get("tokens"))
        .and_then(Value::as_object)
        .is_some_and(|tokens| !tokens.is_empty());
    if iam_tokens {
        return error(
            StatusCode::BAD_REQUEST,
            "Sandbox IAM workload tokens are not available for your team.",
        );
    }
    let network = match new
        .network
        .unwrap_or_default()
        .validated(new.allow_internet_access)
    {
        Ok(network) => network,
        Err(message) => return error(StatusCode::BAD_REQUEST, &message),
    };
    // v2 secures envd always; v1 only when asked (E2B's `secure` flag).
    let secure = v2 || new.secure == Some(true);
    if network.allow_public_traffic == Some(false) && !secure {
        return error(
            StatusCode::BAD_REQUEST,
            "You cannot create a sandbox without public access unless you enable secure envd access via 'secure' flag.",
        );
    }
    let spec = CreateSpec {
        timeout,
        metadata: new.metadata.unwrap_or_default(),
        env_vars: new.env_vars.unwrap_or_default(),
        network,
        allow_internet_access: new.allow_internet_access,
        auto_pause: new.auto_pause,
        secure,
    };
    let id = match lifecycle::create(app, spec).await {
        Ok(id) => id,
        Err(LifecycleError::Capacity(max)) => {
            return error(
                StatusCode::TOO_MANY_REQUESTS,
                &format!(
                    "You have reached the maximum number of concurrent E2B sandboxes ({max}). If you need more, please contact us at 'https://e2b.dev/docs/getting-help'"
                ),
            );
        }
        Err(e) => {
            eprintln!("e2b-simulator: create failed: {e}");
            return error(
                StatusCode::INTERNAL_SERVER_ERROR,
                "Failed to create sandbox",
            );
        }
    };
    if let Some(key) = key {
        app.idempotent().insert(key, id.clone());
    }
    let Some(mut created) = app.sandboxes.with(&id, |s| s.created(&app.config.domain)) else {
        return error(
            StatusCode::INTERNAL_SERVER_ERROR,
            "Failed to create sandbox",
        );
    };
    let faults = app.faults();
    if let Some(object) = created.as_object_mut() {
        if faults.create_without_envd_token {
            object.remove("envdAccessToken");
        }
        if faults.create_without_traffic_token {
            object.remove("trafficAccessToken");
        }
        if faults.create_without_sandbox_id {
            object.remove("sandboxID");
        }
    }
    app.served.add(&id, received.elapsed());
    json(StatusCode::CREATED, &created)
}
