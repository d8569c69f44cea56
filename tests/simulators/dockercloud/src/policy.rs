//! Network policy: the account default (deny-all, nothing allowed), the per-sandbox rule
//! the undocumented `PUT <policy base>/sandboxes/{id}/network-policy` installs (the call
//! `sbx --cloud` makes for `--allow-network`), and the effective policy both APIs read
//! back. Faults can make the effective policy not deny-all or add an allowed network.

use std::sync::Arc;

use hyper::body::Incoming;
use hyper::{Method, Request};
use serde_json::{Value, json};

use crate::http::{Reply, json_reply, read_body};
use crate::state::{Sandbox, State};

/// The effective policy of one sandbox.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Effective {
    pub deny_all: bool,
    /// (network, layer) pairs; layers as the REST API names them (`attached`, `owner`).
    pub allow: Vec<(String, &'static str)>,
}

pub fn effective(state: &State, sandbox: &Sandbox) -> Effective {
    let faults = state.faults();
    let mut allow: Vec<(String, &'static str)> = sandbox
        .policy_allow
        .iter()
        .flatten()
        .map(|n| (n.clone(), "attached"))
        .collect();
    if let Some(extra) = faults.extra_allowed_network {
        allow.push((extra, "owner"));
    }
    Effective {
        deny_all: !faults.policy_not_deny_all,
        allow,
    }
}

impl Effective {
    /// The Connect answer of `GetEffectiveNetworkPolicy`.
    pub fn connect_json(&self) -> Value {
        let mode = if self.deny_all {
            "NETWORK_POLICY_MODE_DENY_ALL"
        } else {
            "NETWORK_POLICY_MODE_ALLOW_ALL"
        };
        let allow: Vec<Value> = self
            .allow
            .iter()
            .map(|(network, layer)| {
                json!({ "network": network, "layer": format!("POLICY_LAYER_{}", layer.to_ascii_uppercase()) })
            })
            .collect();
        crate::views::prune(json!({ "mode": mode, "allowNetworks": allow }))
    }

    /// The REST `effective` view.
    pub fn rest_json(&self) -> Value {
        let allow: Vec<Value> = self
            .allow
            .iter()
            .map(|(network, layer)| json!({ "network": network, "layer": layer }))
            .collect();
        crate::views::prune(
            json!({ "mode": if self.deny_all { "denyAll" } else { "allowAll" }, "allowNetworks": allow }),
        )
    }
}

fn refusal(status: u16, message: &str) -> Reply {
    json_reply(status, &json!({ "message": message }))
}

/// Serves the policy host: `PUT /v1/sandboxes/{id}/network-policy`.
pub async fn handle(state: Arc<State>, request: Request<Incoming>) -> Reply {
    let path = request.uri().path().to_owned();
    let Some(id) = path
        .strip_prefix("/v1/sandboxes/")
        .and_then(|rest| rest.strip_suffix("/network-policy"))
        .filter(|id| !id.is_empty() && !id.contains('/'))
        .map(str::to_owned)
    else {
        return refusal(404, "not found");
    };
    if request.method() != Method::PUT {
        return refusal(405, "method not allowed");
    }
    if let Err(e) = crate::auth::check_access_token(&state, request.headers()) {
        return refusal(401, &e.message);
    }
    let body = match read_body(request.into_body(), 64 << 10).await {
        Ok(body) => body,
        Err(e) => return refusal(413, &e.message),
    };
    let Ok(input) = serde_json::from_slice::<Value>(&body) else {
        return refusal(400, "invalid JSON body");
    };
    if input["mode"] != "deny-all" {
        return refusal(400, "mode must be \"deny-all\"");
    }
    let Some(networks) = input["allowNetworks"].as_array() else {
        return refusal(400, "allowNetworks must be a list");
    };
    let mut allow = Vec::new();
    for network in networks {
        match network.as_str() {
            Some(n) if !n.trim().is_empty() && !n.contains(char::is_whitespace) => {
                allow.push(n.to_owned());
            }
            _ => return refusal(400, "allowNetworks entries must be host:port or CIDR"),
        }
    }
    let exists = {
        let mut inner = state.lock();
        match inner.sandboxes.get_mut(&id) {
            Some(sandbox) if !sandbox.deleting => {
                sandbox.policy_allow = Some(allow.clone());
                sandbox.touch();
                true
            }
            _ => false,
        }
    };
    if !exists {
        return refusal(404, "sandbox not found");
    }
    // Open or close the one real route: the guard host on 443.
    let guard = state
        .settings
        .guard_host
        .as_ref()
        .map(|host| format!("{host}:443"));
    match guard {
        Some(guard) if allow.contains(&guard) => {
            if let Err(e) = crate::egress::open(&state, &id).await {
                return refusal(503, &e.message);
            }
        }
        _ => crate::lifecycle::stop_forwarder(&state, &id),
    }
    json_reply(200, &json!({ "mode": "deny-all", "allowNetworks": allow }))
}
