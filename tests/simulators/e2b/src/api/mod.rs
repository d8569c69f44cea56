//! E2B's control plane (`E2B_API_URL`): the sandbox endpoints E2B's SDK and plimsoll's e2b
//! provider call, with E2B's paths, JSON field names, status codes and error bodies
//! (`{"code": <status>, "message": ...}`).
//!
//! | call | answer |
//! |---|---|
//! | `POST /v2/sandboxes` (and v1 `POST /sandboxes`) | 201 `Sandbox` |
//! | `GET /v2/sandboxes?metadata&state&limit&nextToken&order&template&startedAfter` | 200 `[ListedSandbox]`, `X-Next-Token`, `X-Total-Running` |
//! | `GET /sandboxes` (v1: running only) | 200 `[ListedSandbox]` |
//! | `GET /sandboxes/{id}` | 200 `SandboxDetail`, 404 |
//! | `DELETE /sandboxes/{id}` | 204, 404 |
//! | `POST /sandboxes/{id}/pause` | 204, 409 already paused, 404 |
//! | `POST /v2/sandboxes/{id}/connect` (and v1 `/sandboxes/{id}/connect`) | 200 was running, 201 resumed, 404 |
//! | `POST /sandboxes/{id}/resume` (v1) | 201, 409 running, 404 |
//! | `POST /sandboxes/{id}/timeout` | 204, 404 |
//! | `PUT /sandboxes/{id}/network` | 204, 409 not running, 404 |
//!
//! Every call but `GET /health` needs `X-API-Key`.

mod create;
mod list;
mod sandbox;

use std::sync::Arc;

use http::{Method, StatusCode};
use serde_json::json;

use crate::app::App;
use crate::http::{Request, Response, json, text};

/// E2B's 401 message for a missing or wrong API key.
const BAD_KEY: &str =
    "Invalid API key, please visit https://e2b.dev/docs/api-key for more information.";
/// The most a request body may hold.
const BODY_LIMIT: usize = 1 << 20;

/// E2B's error body.
pub fn error(status: StatusCode, message: &str) -> Response {
    json(
        status,
        &json!({"code": status.as_u16(), "message": message}),
    )
}

/// E2B's 404 for a sandbox it does not know.
pub fn not_found(id: &str) -> Response {
    error(
        StatusCode::NOT_FOUND,
        &format!("Sandbox {id:?} doesn't exist or you don't have access to it"),
    )
}

/// A sandbox id as E2B validates it (`^[a-z0-9]+$`).
fn valid_id(id: &str) -> bool {
    !id.is_empty()
        && id
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
}

pub async fn handle(app: Arc<App>, request: Request) -> Response {
    let received = std::time::Instant::now();
    let method = request.method().clone();
    let path = request.uri().path().to_owned();
    if method == Method::GET && path == "/health" {
        return text(StatusCode::OK, "Health check successful");
    }
    let key = request
        .headers()
        .get("x-api-key")
        .and_then(|v| v.to_str().ok());
    if key != Some(app.config.api_key.as_str()) {
        return error(StatusCode::UNAUTHORIZED, BAD_KEY);
    }
    let segments: Vec<&str> = path.trim_start_matches('/').split('/').collect();
    match (&method, segments.as_slice()) {
        (&Method::POST, ["v2", "sandboxes"]) => create::create(&app, request, true).await,
        (&Method::POST, ["sandboxes"]) => create::create(&app, request, false).await,
        (&Method::GET, ["v2", "sandboxes"]) => list::list_v2(&app, &request),
        (&Method::GET, ["sandboxes"]) => list::list_v1(&app, &request),
        (_, ["sandboxes", id, ..]) | (_, ["v2", "sandboxes", id, ..]) if !valid_id(id) => {
            error(StatusCode::BAD_REQUEST, "Invalid sandbox ID")
        }
        (&Method::GET, ["sandboxes", id]) => {
            let answer = sandbox::get(&app, id);
            app.served.add(id, received.elapsed());
            answer
        }
        (&Method::DELETE, ["sandboxes", id]) => sandbox::delete(&app, id).await,
        (&Method::POST, ["sandboxes", id, "pause"]) => sandbox::pause(&app, id).await,
        (&Method::POST, ["sandboxes", id, "resume"]) => {
            let id = (*id).to_owned();
            sandbox::resume_v1(&app, &id, request).await
        }
        (&Method::POST, ["sandboxes", id, "connect"])
        | (&Method::POST, ["v2", "sandboxes", id, "connect"]) => {
            let id = (*id).to_owned();
            sandbox::connect(&app, &id, request).await
        }
        (&Method::POST, ["sandboxes", id, "timeout"]) => {
            let id = (*id).to_owned();
            sandbox::set_timeout(&app, &id, request).await
        }
        (&Method::PUT, ["sandboxes", id, "network"]) => {
            let id = (*id).to_owned();
            sandbox::network(&app, &id, request).await
        }
        // gin's answer for a route it does not have.
        _ => text(StatusCode::NOT_FOUND, "404 page not found"),
    }
}

/// The JSON body, or E2B's 400.
async fn body<T: serde::de::DeserializeOwned>(request: Request) -> Result<T, Response> {
    let bytes = crate::http::read_body(request.into_body(), BODY_LIMIT)
        .await
        .map_err(|e| {
            error(
                StatusCode::BAD_REQUEST,
                &format!("Error when parsing request: {e}"),
            )
        })?;
    let bytes = if bytes.iter().all(u8::is_ascii_whitespace) {
        &b"{}"[..]
    } else {
        &bytes[..]
    };
    serde_json::from_slice(bytes).map_err(|e| {
        error(
            StatusCode::BAD_REQUEST,
            &format!("Error when parsing request: {e}"),
        )
    })
}

/// A `timeout` in seconds as E2B checks it.
fn timeout(
    app: &App,
    seconds: Option<i64>,
    default: u64,
) -> Result<std::time::Duration, Box<Response>> {
    let Some(seconds) = seconds else {
        return Ok(std::time::Duration::from_secs(default));
    };
    if seconds <= 0 {
        return Err(Box::new(error(
            StatusCode::BAD_REQUEST,
            "Timeout must be greater than 0",
        )));
    }
    let requested = std::time::Duration::from_secs(seconds.unsigned_abs());
    if requested > app.config.max_timeout {
        let hours = app.config.max_timeout.as_secs() / 3600;
        return Err(Box::new(error(
            StatusCode::BAD_REQUEST,
            &format!("Timeout cannot be greater than {hours} hours"),
        )));
    }
    Ok(requested)
}
