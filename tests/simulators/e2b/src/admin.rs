//! The admin listener: what a test tells the simulator, never part of E2B's API.
//!
//! | call | what it does |
//! |---|---|
//! | `GET /faults`, `PUT /faults` | read or replace the [`Faults`] (JSON, camelCase) |
//! | `GET /ca` | the egress CA certificate (PEM) every VM trusts |
//! | `GET /hosts` | the egress host map, `{name: upstream}` |
//! | `PUT /hosts/{name}` `{"upstream": "http://127.0.0.1:P", "caPem"?}` | map a name (e.g. the guard's) to a loopback upstream; VMs created afterwards resolve it |
//! | `DELETE /hosts/{name}` | unmap it |
//! | `GET /sandboxes` | `[{sandboxID, container, state, processes}]`, the docker view |
//! | `GET /served/{id}` | `{ms, calls}`: how long sandbox `id`'s create, detail reads and process starts (each to its end frame) took to serve, for benchmarks |
//! | `POST /sandboxes/{id}/crash` | the VM dies under the API (no E2B call): streams drop, 404 after |

use std::sync::Arc;

use http::{Method, StatusCode};
use serde::Deserialize;
use serde_json::{Value, json};

use crate::app::App;
use crate::config::Upstream;
use crate::faults::Faults;
use crate::http::{Request, Response, empty, full, json, read_body};

pub async fn handle(app: Arc<App>, request: Request) -> Response {
    let method = request.method().clone();
    let path = request.uri().path().to_owned();
    let segments: Vec<&str> = path.trim_start_matches('/').split('/').collect();
    match (&method, segments.as_slice()) {
        (&Method::GET, ["health"]) => empty(StatusCode::OK),
        (&Method::GET, ["faults"]) => json(StatusCode::OK, &app.faults()),
        (&Method::PUT, ["faults"]) => match body::<Faults>(request).await {
            Ok(faults) => {
                app.set_faults(faults);
                json(StatusCode::OK, &app.faults())
            }
            Err(response) => response,
        },
        (&Method::GET, ["ca"]) => full(
            StatusCode::OK,
            Some("application/x-pem-file"),
            app.ca.pem().to_owned(),
        ),
        (&Method::GET, ["hosts"]) => {
            let hosts: serde_json::Map<String, Value> = app
                .hosts()
                .into_iter()
                .map(|(name, u)| {
                    let scheme = if u.tls { "https" } else { "http" };
                    let addr = std::net::SocketAddr::new(u.ip, u.port);
                    (name, json!(format!("{scheme}://{addr}")))
                })
                .collect();
            json(StatusCode::OK, &hosts)
        }
        (&Method::PUT, ["hosts", name]) => {
            let name = (*name).to_owned();
            #[derive(Deserialize)]
            #[serde(rename_all = "camelCase")]
            struct Mapping {
                upstream: String,
                ca_pem: Option<String>,
            }
            let mapping: Mapping = match body(request).await {
                Ok(mapping) => mapping,
                Err(response) => return response,
            };
            match Upstream::parse(&mapping.upstream, mapping.ca_pem) {
                Ok(upstream) => {
                    app.set_host(&name, Some(upstream));
                    empty(StatusCode::NO_CONTENT)
                }
                Err(message) => problem(StatusCode::BAD_REQUEST, &message),
            }
        }
        (&Method::DELETE, ["hosts", name]) => {
            app.set_host(name, None);
            empty(StatusCode::NO_CONTENT)
        }
        (&Method::GET, ["sandboxes"]) => {
            let list: Vec<Value> = app
                .sandboxes
                .lock()
                .values()
                .map(|s| {
                    json!({
                        "sandboxID": s.id,
                        "container": s.container,
                        "state": s.state.as_str(),
                        "processes": s.processes.keys().collect::<Vec<_>>(),
                    })
                })
                .collect();
            json(StatusCode::OK, &list)
        }
        (&Method::GET, ["served", id]) => match app.served.get(id) {
            Some(served) => json(StatusCode::OK, &served),
            None => problem(StatusCode::NOT_FOUND, "no call of that sandbox was served"),
        },
        (&Method::POST, ["sandboxes", id, "crash"]) => {
            if crate::lifecycle::kill(&app, id).await {
                empty(StatusCode::NO_CONTENT)
            } else {
                problem(StatusCode::NOT_FOUND, "no such sandbox")
            }
        }
        _ => problem(StatusCode::NOT_FOUND, "no such admin call"),
    }
}

fn problem(status: StatusCode, message: &str) -> Response {
    json(status, &json!({"error": message}))
}

async fn body<T: serde::de::DeserializeOwned>(request: Request) -> Result<T, Response> {
    let bytes = read_body(request.into_body(), 1 << 20)
        .await
        .map_err(|e| problem(StatusCode::BAD_REQUEST, &e.to_string()))?;
    serde_json::from_slice(&bytes).map_err(|e| problem(StatusCode::BAD_REQUEST, &e.to_string()))
}
