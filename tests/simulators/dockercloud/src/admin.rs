//! The admin endpoint the tests use: plain HTTP/1.1 on loopback, JSON bodies.
//!
//! - `GET /faults` answers the fault set; `PUT /faults` replaces it (see [`Faults`]) and
//!   answers the new one.
//! - `GET /state` answers every sandbox (id, name, status, container, the per-sandbox
//!   network rule, whether its egress forwarder runs) and the operation count.

use std::sync::Arc;

use hyper::body::Incoming;
use hyper::{Method, Request};
use serde_json::json;

use crate::faults::Faults;
use crate::http::{Reply, json_reply, read_body};
use crate::state::State;

fn state_json(state: &State) -> serde_json::Value {
    let inner = state.lock();
    let sandboxes: Vec<serde_json::Value> = inner
        .sandboxes
        .values()
        .map(|s| {
            json!({
                "id": s.id,
                "name": s.name,
                "status": s.status.connect_name(),
                "deleting": s.deleting,
                "container": s.container,
                "policy_allow": s.policy_allow,
                "forwarder": inner.forwarders.contains_key(&s.id),
                "image_digest": s.image_digest,
            })
        })
        .collect();
    json!({
        "sandboxes": sandboxes,
        "operations": inner.operations.len(),
        "endpoint_credentials": inner.credentials.len(),
    })
}

pub async fn handle(state: Arc<State>, request: Request<Incoming>) -> Reply {
    let path = request.uri().path().to_owned();
    match (request.method().clone(), path.as_str()) {
        (Method::GET, "/faults") => json_reply(200, &json!(state.faults())),
        (Method::PUT, "/faults") => {
            let body = match read_body(request.into_body(), 64 << 10).await {
                Ok(body) => body,
                Err(e) => return json_reply(400, &json!({ "error": e.message })),
            };
            let faults: Faults = match serde_json::from_slice(&body) {
                Ok(f) => f,
                Err(e) => return json_reply(400, &json!({ "error": format!("faults: {e}") })),
            };
            tracing::info!(?faults, "faults set");
            state.lock().faults = faults;
            state.notify();
            json_reply(200, &json!(state.faults()))
        }
        (Method::GET, "/state") => json_reply(200, &state_json(&state)),
        _ => json_reply(404, &json!({ "error": "no such route" })),
    }
}
