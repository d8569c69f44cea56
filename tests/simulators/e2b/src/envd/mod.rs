//! envd, the agent E2B runs in every VM, behind E2B's sandbox proxy (`E2B_SANDBOX_URL`).
//!
//! Routing is the proxy's: when the request's host is an IP, `localhost` or
//! `sandbox.<domain>`, the headers `E2b-Sandbox-Id` and `E2b-Sandbox-Port` name the sandbox
//! and port (what E2B's SDK sends when `E2B_SANDBOX_URL` is set); otherwise the host name
//! `<port>-<id>.<domain>` does. An unknown, killed or paused sandbox answers 502
//! `{"sandboxId", "message": "The sandbox was not found", "code": 502}`; a port other than
//! envd's 49983 answers 502 "port is not open" (nothing else listens in a simulated VM).
//!
//! Then envd itself: `GET /health` (204, no token), `GET|POST /files` (token or signature),
//! and with `X-Access-Token`: `process.Process/{Start,List,SendSignal,SendInput,CloseStdin}`.

mod connect;
mod files;
mod process;

use std::path::{Component, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use serde_json::json;

use crate::app::App;
use crate::config::ENVD_PORT;
use crate::http::{Request, Response, empty, json, text};
use crate::sandbox::State;

/// envd's default user and working directory, set by E2B's template build.
pub const DEFAULT_USER: &str = "user";
pub const DEFAULT_WORKDIR: &str = "/home/user";

/// An account of the template (`/etc/passwd` of `template/build`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct User {
    pub name: &'static str,
    pub uid: u32,
    pub gid: u32,
    pub home: &'static str,
}

const USERS: [User; 2] = [
    User {
        name: "root",
        uid: 0,
        gid: 0,
        home: "/root",
    },
    User {
        name: "user",
        uid: 1000,
        gid: 1000,
        home: "/home/user",
    },
];

pub fn lookup_user(name: &str) -> Option<User> {
    USERS.iter().copied().find(|u| u.name == name)
}

/// envd's `ExpandAndResolve`: empty means the default working directory, `~` the user's home,
/// a relative path is under the home; an absolute path is taken as given.
pub fn resolve_path(path: &str, user: &User) -> Result<String, String> {
    let path = if path.is_empty() {
        DEFAULT_WORKDIR
    } else {
        path
    };
    let path = match path.strip_prefix('~') {
        Some(rest) if rest.is_empty() || rest.starts_with('/') => format!("{}{rest}", user.home),
        Some(_) => {
            return Err(format!(
                "failed to expand path '{path}' for user '{}': cannot expand user-specific home dir",
                user.name
            ));
        }
        None => path.to_owned(),
    };
    if path.starts_with('/') {
        return Ok(path);
    }
    let mut joined = PathBuf::from(user.home);
    for part in PathBuf::from(&path).components() {
        match part {
            Component::ParentDir => {
                joined.pop();
            }
            Component::Normal(name) => joined.push(name),
            _ => {}
        }
    }
    Ok(joined.to_string_lossy().into_owned())
}

/// What a request is about, once routed.
pub struct Target {
    pub id: String,
    pub container: String,
    pub token: Option<String>,
}

pub async fn handle(app: Arc<App>, request: Request) -> Response {
    let (id, port) = match route(&request) {
        Ok(target) => target,
        Err(response) => return *response,
    };
    let found = app.sandboxes.with(&id, |s| {
        (s.state, s.container.clone(), s.envd_token.clone())
    });
    let Some((State::Running, container, token)) = found else {
        return json(
            StatusCode::BAD_GATEWAY,
            &json!({"sandboxId": id, "message": "The sandbox was not found", "code": 502}),
        );
    };
    if port != ENVD_PORT {
        return json(
            StatusCode::BAD_GATEWAY,
            &json!({"sandboxId": id, "message": "The sandbox is running but port is not open", "port": port, "code": 502}),
        );
    }
    let delay = app.faults().envd_delay_ms;
    if delay > 0 {
        tokio::time::sleep(Duration::from_millis(delay)).await;
    }
    let target = Target {
        id,
        container,
        token,
    };
    let method = request.method().clone();
    let path = request.uri().path().to_owned();
    match (&method, path.as_str()) {
        (&Method::GET, "/health") => {
            let mut response = empty(StatusCode::NO_CONTENT);
            response
                .headers_mut()
                .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
            response
        }
        (&Method::GET, "/files") => files::download(&app, &target, request).await,
        (&Method::POST, "/files") => files::upload(&app, &target, request).await,
        _ if !token_ok(&target, request.headers()) => {
            let mut response = json(
                StatusCode::UNAUTHORIZED,
                &json!({"code": 401, "message": "unauthorized access, please provide a valid access token or method signing if supported"}),
            );
            response.headers_mut().insert(
                "x-content-type-options",
                HeaderValue::from_static("nosniff"),
            );
            response
        }
        (&Method::POST, rpc) if rpc.starts_with("/process.Process/") => {
            process::handle(app, target, request).await
        }
        (&Method::POST, rpc) if rpc.starts_with("/filesystem.Filesystem/") => {
            connect::unary_error(&connect::RpcError::new(
                connect::Code::Unimplemented,
                format!("the E2B simulator does not implement {}", &rpc[1..]),
            ))
        }
        _ => text(StatusCode::NOT_FOUND, "404 page not found"),
    }
}

fn token_ok(target: &Target, headers: &HeaderMap) -> bool {
    match &target.token {
        None => true,
        Some(token) => headers
            .get("x-access-token")
            .is_some_and(|v| v.as_bytes() == token.as_bytes()),
    }
}

/// The sandbox id and port the request is for, or the proxy's 400.
fn route(request: &Request) -> Result<(String, u16), Box<Response>> {
    let refuse = |message: &str| Box::new(text(StatusCode::BAD_REQUEST, message));
    let host = request
        .headers()
        .get(header::HOST)
        .and_then(|h| h.to_str().ok())
        .map(str::to_owned)
        .or_else(|| request.uri().authority().map(|a| a.as_str().to_owned()))
        .unwrap_or_default();
    let hostname = host
        .rsplit_once(':')
        .filter(|(_, port)| port.bytes().all(|b| b.is_ascii_digit()))
        .map_or(host.as_str(), |(name, _)| name)
        .trim_start_matches('[')
        .trim_end_matches(']');
    let headers = request.headers();
    let by_headers = hostname == "localhost"
        || hostname.parse::<std::net::IpAddr>().is_ok()
        || hostname
            .strip_prefix("sandbox.")
            .is_some_and(|d| !d.is_empty());
    let has_headers =
        headers.contains_key("e2b-sandbox-id") || headers.contains_key("e2b-sandbox-port");
    let (id, port) = if by_headers && has_headers {
        let id = headers.get("e2b-sandbox-id").and_then(|v| v.to_str().ok());
        let port = headers
            .get("e2b-sandbox-port")
            .and_then(|v| v.to_str().ok());
        match (id, port) {
            (None, _) | (Some(""), _) => return Err(refuse("Missing header: E2b-Sandbox-Id")),
            (_, None) | (_, Some("")) => return Err(refuse("Missing header: E2b-Sandbox-Port")),
            (Some(id), Some(port)) => (id.to_owned(), port.to_owned()),
        }
    } else {
        // `<port>-<id>.<domain>`: the first label, and a domain after it.
        let label = hostname.split('.').next().unwrap_or_default();
        let rest = hostname.strip_prefix(label).unwrap_or_default();
        let mut parts = label.split('-');
        match (parts.next(), parts.next()) {
            (Some(port), Some(id)) if !rest.is_empty() => (id.to_owned(), port.to_owned()),
            _ => return Err(refuse("Invalid host")),
        }
    };
    let Ok(port) = port.parse::<u16>() else {
        return Err(refuse("Invalid sandbox port"));
    };
    let lower_alnum = id
        .bytes()
        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit());
    if id.is_empty() || !lower_alnum {
        return Err(refuse("Invalid sandbox ID"));
    }
    Ok((id, port))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn paths_resolve_like_envd() {
        let user = lookup_user("user").unwrap();
        let root = lookup_user("root").unwrap();
        assert_eq!(resolve_path("", &user).unwrap(), "/home/user");
        assert_eq!(resolve_path("a/b", &user).unwrap(), "/home/user/a/b");
        assert_eq!(resolve_path("../x", &user).unwrap(), "/home/x");
        assert_eq!(resolve_path("~/f", &root).unwrap(), "/root/f");
        assert_eq!(resolve_path("/etc/hosts", &user).unwrap(), "/etc/hosts");
        assert!(resolve_path("~other/f", &user).is_err());
        assert!(lookup_user("nobody").is_none());
    }
}
