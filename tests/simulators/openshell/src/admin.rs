//! The admin endpoint the tests use: plain HTTP/1.1 on loopback, JSON bodies.
//!
//! - `GET /faults` answers the fault set; `PUT /faults` replaces it (see [`Faults`]) and
//!   answers the new one. Switching `delete_stays_accepted` off finishes held deletes.
//! - `GET /state` answers every sandbox (name, id, phase, container) and the live
//!   `ForwardTcp` streams per sandbox id.
//! - `POST /sandboxes/<name>/kill` kills that sandbox's container now (it reads back as
//!   ERROR).

use std::convert::Infallible;
use std::sync::Arc;

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper::{Method, Request, Response, StatusCode};
use tokio::net::TcpListener;

use crate::faults::Faults;
use crate::gateway::{State, sandboxes};
use crate::proto::v1::SandboxPhase;

const BODY_LIMIT: usize = 64 * 1024;

fn reply(status: StatusCode, body: serde_json::Value) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::from(body.to_string())));
    *response.status_mut() = status;
    response.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("application/json"),
    );
    response
}

fn error(status: StatusCode, message: impl std::fmt::Display) -> Response<Full<Bytes>> {
    reply(status, serde_json::json!({ "error": message.to_string() }))
}

fn state_json(state: &State) -> serde_json::Value {
    let sandboxes: Vec<serde_json::Value> = state
        .sandboxes()
        .iter()
        .map(|(name, entry)| {
            let phase = SandboxPhase::try_from(
                entry
                    .sandbox
                    .status
                    .as_ref()
                    .map(|s| s.phase)
                    .unwrap_or_default(),
            )
            .map(|p| p.as_str_name())
            .unwrap_or("SANDBOX_PHASE_UNKNOWN");
            serde_json::json!({
                "name": name,
                "id": entry.id(),
                "phase": phase,
                "container": entry.container,
            })
        })
        .collect();
    let forwards = state.forwards();
    let now = state.clock.now_ms();
    let live_tokens = state
        .tokens()
        .values()
        .filter(|t| !t.revoked && t.expires_ms >= now)
        .count();
    serde_json::json!({
        "sandboxes": sandboxes,
        "forwards_by_sandbox": forwards.by_sandbox,
        "live_forwards": forwards.by_sandbox.values().sum::<u32>(),
        "tokens": state.tokens().len(),
        "live_tokens": live_tokens,
        "execs_started": state.execs_started.load(std::sync::atomic::Ordering::Relaxed),
        "gateway_info_calls": state.gateway_info_calls.load(std::sync::atomic::Ordering::Relaxed),
        "ssh_sessions_created": state.ssh_sessions_created.load(std::sync::atomic::Ordering::Relaxed),
    })
}

async fn handle(state: Arc<State>, request: Request<Incoming>) -> Response<Full<Bytes>> {
    let path = request.uri().path().to_owned();
    match (request.method().clone(), path.as_str()) {
        (Method::GET, "/faults") => reply(StatusCode::OK, serde_json::json!(state.faults())),
        (Method::PUT, "/faults") => {
            let body = match Limited::new(request.into_body(), BODY_LIMIT)
                .collect()
                .await
            {
                Ok(body) => body.to_bytes(),
                Err(e) => return error(StatusCode::BAD_REQUEST, format!("reading the body: {e}")),
            };
            let faults: Faults = match serde_json::from_slice(&body) {
                Ok(f) => f,
                Err(e) => return error(StatusCode::BAD_REQUEST, format!("faults: {e}")),
            };
            tracing::info!(?faults, "faults set");
            state.set_faults(faults);
            sandboxes::finish_pending_deletes(&state).await;
            reply(StatusCode::OK, serde_json::json!(state.faults()))
        }
        (Method::GET, "/state") => reply(StatusCode::OK, state_json(&state)),
        (Method::POST, p) if p.starts_with("/sandboxes/") && p.ends_with("/kill") => {
            let name = &p["/sandboxes/".len()..p.len() - "/kill".len()];
            match sandboxes::kill(&state, name).await {
                Ok(()) => reply(StatusCode::OK, serde_json::json!({ "killed": name })),
                Err(e) => error(StatusCode::NOT_FOUND, e),
            }
        }
        _ => error(StatusCode::NOT_FOUND, "no such route"),
    }
}

/// Serves the admin endpoint until the task is dropped.
pub async fn serve(state: Arc<State>, listener: TcpListener) {
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            continue;
        };
        let state = state.clone();
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |request| {
                let state = state.clone();
                async move { Ok::<_, Infallible>(handle(state, request).await) }
            });
            let io = hyper_util::rt::TokioIo::new(stream);
            if let Err(e) = hyper::server::conn::http1::Builder::new()
                .serve_connection(io, service)
                .await
            {
                tracing::debug!(error = %e, "admin connection ended");
            }
        });
    }
}
