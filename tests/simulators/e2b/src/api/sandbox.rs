//! One sandbox: read, kill, pause, connect/resume, timeout and network.

use std::time::SystemTime;

use http::StatusCode;
use serde::Deserialize;

use super::{body, error, not_found, timeout};
use crate::app::App;
use crate::http::{Request, Response, empty, json};
use crate::lifecycle::{self, Paused, Resumed};
use crate::network::NetworkConfig;
use crate::sandbox::State;

pub fn get(app: &App, id: &str) -> Response {
    match app.sandboxes.with(id, |s| s.detail(&app.config.domain)) {
        Some(detail) => json(StatusCode::OK, &detail),
        None => not_found(id),
    }
}

pub async fn delete(app: &App, id: &str) -> Response {
    if app.take_delete_error() {
        return error(
            StatusCode::INTERNAL_SERVER_ERROR,
            "Error killing sandbox: simulated failure (deleteErrors fault)",
        );
    }
    if lifecycle::kill(app, id).await {
        empty(StatusCode::NO_CONTENT)
    } else {
        not_found(id)
    }
}

pub async fn pause(app: &App, id: &str) -> Response {
    match lifecycle::pause(app, id).await {
        Ok(Paused::Done) => empty(StatusCode::NO_CONTENT),
        Ok(Paused::AlreadyPaused) => error(
            StatusCode::CONFLICT,
            &format!("Sandbox {id:?} is already paused"),
        ),
        Ok(Paused::NotFound) => not_found(id),
        Err(e) => {
            eprintln!("e2b-simulator: pause {id}: {e}");
            error(StatusCode::INTERNAL_SERVER_ERROR, "Error pausing sandbox")
        }
    }
}

/// `ConnectSandbox` / `ResumedSandbox`.
#[derive(Debug, Default, Deserialize)]
struct TimeoutBody {
    timeout: Option<i64>,
}

/// `POST /v2/sandboxes/{id}/connect`: 200 when it was running (its end only moves out), 201
/// when it was paused and now runs.
pub async fn connect(app: &App, id: &str, request: Request) -> Response {
    let asked: TimeoutBody = match body(request).await {
        Ok(asked) => asked,
        Err(response) => return response,
    };
    let timeout = match timeout(app, asked.timeout, 300) {
        Ok(timeout) => timeout,
        Err(response) => return *response,
    };
    match lifecycle::resume(app, id, timeout).await {
        Ok(Resumed::WasRunning) => created(app, id, StatusCode::OK),
        Ok(Resumed::Resumed) => created(app, id, StatusCode::CREATED),
        Ok(Resumed::NotFound) => not_found(id),
        Err(e) => {
            eprintln!("e2b-simulator: resume {id}: {e}");
            error(StatusCode::INTERNAL_SERVER_ERROR, "Error resuming sandbox")
        }
    }
}

/// The deprecated `POST /sandboxes/{id}/resume`: 409 for a running sandbox.
pub async fn resume_v1(app: &App, id: &str, request: Request) -> Response {
    let asked: TimeoutBody = match body(request).await {
        Ok(asked) => asked,
        Err(response) => return response,
    };
    let timeout = match timeout(app, asked.timeout, 15) {
        Ok(timeout) => timeout,
        Err(response) => return *response,
    };
    match app.sandboxes.with(id, |s| s.state) {
        None => return not_found(id),
        Some(State::Running) => {
            return error(
                StatusCode::CONFLICT,
                &format!("Sandbox {id:?} is already running"),
            );
        }
        Some(State::Paused) => {}
    }
    match lifecycle::resume(app, id, timeout).await {
        Ok(Resumed::NotFound) => not_found(id),
        Ok(_) => created(app, id, StatusCode::CREATED),
        Err(e) => {
            eprintln!("e2b-simulator: resume {id}: {e}");
            error(StatusCode::INTERNAL_SERVER_ERROR, "Error resuming sandbox")
        }
    }
}

fn created(app: &App, id: &str, status: StatusCode) -> Response {
    match app.sandboxes.with(id, |s| s.created(&app.config.domain)) {
        Some(created) => json(status, &created),
        None => not_found(id),
    }
}

/// `POST /sandboxes/{id}/timeout`: the sandbox now ends `timeout` seconds from now.
pub async fn set_timeout(app: &App, id: &str, request: Request) -> Response {
    let asked: TimeoutBody = match body(request).await {
        Ok(asked) => asked,
        Err(response) => return response,
    };
    let Some(seconds) = asked.timeout else {
        return error(
            StatusCode::BAD_REQUEST,
            "Error when parsing request: property \"timeout\" is missing",
        );
    };
    let timeout = match timeout(app, Some(seconds), 0) {
        Ok(timeout) => timeout,
        Err(response) => return *response,
    };
    let until = SystemTime::now() + timeout;
    match app.sandboxes.with(id, |s| s.end_at = until) {
        Some(()) => empty(StatusCode::NO_CONTENT),
        None => not_found(id),
    }
}

/// `PUT /sandboxes/{id}/network`: the egress config is replaced as a whole (a field left out
/// is cleared); ingress settings stay. New connections see it at once.
pub async fn network(app: &App, id: &str, request: Request) -> Response {
    let mut update: NetworkConfig = match body(request).await {
        Ok(update) => update,
        Err(response) => return response,
    };
    if app.faults().network_update_drops_dns_servers {
        update.dns_servers = None;
    }
    let allow_internet_access = update.allow_internet_access;
    let validated = match update.validated(allow_internet_access) {
        Ok(validated) => validated,
        Err(message) => return error(StatusCode::BAD_REQUEST, &message),
    };
    let outcome = app.sandboxes.with(id, |s| {
        if s.state != State::Running {
            return Err(s.state);
        }
        s.network = NetworkConfig {
            allow_public_traffic: s.network.allow_public_traffic,
            mask_request_host: s.network.mask_request_host.clone(),
            ..validated
        };
        s.allow_internet_access = allow_internet_access;
        Ok(s.network.clone())
    });
    match outcome {
        Some(Ok(network)) => {
            // What resolves in the VM follows whether it now reaches a nameserver.
            if let Err(e) = crate::lifecycle::rewrite_hosts(app, id, &network) {
                eprintln!("e2b-simulator: sandbox {id}: /etc/hosts not rewritten: {e}");
                return error(StatusCode::INTERNAL_SERVER_ERROR, "network update failed");
            }
            empty(StatusCode::NO_CONTENT)
        }
        Some(Err(state)) => error(
            StatusCode::CONFLICT,
            &format!("Sandbox {id:?} is in {} state", state.as_str()),
        ),
        None => not_found(id),
    }
}
