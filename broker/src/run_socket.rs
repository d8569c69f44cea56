//! A run's own Unix socket, `host-api.sock`, and the HTTP/1.1 server on it.
//!
//! The socket lives alone in a fresh private directory (prefix `crsbx-broker`, mode 0711 so
//! the guest uid can reach the socket but not list the directory); the socket is 0666
//! because the guest runs as another uid. The target is the request URI exactly as sent;
//! guest headers are never looked at beyond what HTTP framing needs.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::header::CONTENT_TYPE;
use http::{Request, Response};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::UnixListener;
use tokio::sync::Semaphore;

use crate::run::{Reply, Run, message};

/// The socket's file name.
pub const SOCKET_NAME: &str = "host-api.sock";
/// Prefix of the socket's directory (the daemon's orphan sweep knows it).
pub const DIR_PREFIX: &str = "crsbx-broker";
/// Connections served at once per run.
pub const MAX_CONNECTIONS: usize = 32;
/// Time to send a request's headers.
pub const READ_HEADER_TIMEOUT: Duration = Duration::from_secs(5);
/// Largest request head.
pub const MAX_HEADER_BYTES: usize = 16 * 1024;
/// How long a connection may take to finish its answer once the run has ended.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(3);

/// Why a run socket could not be made.
#[derive(Debug, thiserror::Error)]
pub enum RunSocketError {
    /// Creating the directory, binding or setting modes failed.
    #[error("run socket {path}: {source}")]
    Create {
        /// What was being created.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
}

/// A bound run socket. Dropping it removes the socket and its directory.
pub struct RunSocket {
    dir: Option<tempfile::TempDir>,
    path: PathBuf,
}

// === impl RunSocket ===

impl RunSocket {
    /// Creates the directory and binds the socket (serve it with [`RunSocket::serve`]).
    pub fn bind() -> Result<(Self, UnixListener), RunSocketError> {
        let create = |path: &Path| {
            let path = path.to_owned();
            move |source| RunSocketError::Create { path, source }
        };
        let dir = tempfile::Builder::new()
            .prefix(DIR_PREFIX)
            .tempdir()
            .map_err(create(&std::env::temp_dir()))?;
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o711))
            .map_err(create(dir.path()))?;
        let path = dir.path().join(SOCKET_NAME);
        let listener = UnixListener::bind(&path).map_err(create(&path))?;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o666))
            .map_err(create(&path))?;
        Ok((
            Self {
                dir: Some(dir),
                path,
            },
            listener,
        ))
    }

    /// The socket's absolute path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Removes the socket and its directory now.
    pub fn remove(&mut self) {
        if let Some(dir) = self.dir.take() {
            let shown = dir.path().display().to_string();
            if let Err(error) = dir.close() {
                tracing::warn!(dir = shown, %error, "run socket directory not removed");
            }
        }
    }

    /// Serves `run` on `listener` until the run ends.
    pub async fn serve(listener: UnixListener, run: Arc<Run>) {
        let connections = Arc::new(Semaphore::new(MAX_CONNECTIONS));
        loop {
            let accepted = tokio::select! {
                accepted = listener.accept() => accepted,
                () = run.wait_ended() => break,
            };
            let Ok((stream, _)) = accepted else {
                continue;
            };
            // Over the cap the connection is closed at once: shed, never queue.
            let Ok(permit) = connections.clone().try_acquire_owned() else {
                drop(stream);
                continue;
            };
            let run = run.clone();
            tokio::spawn(async move {
                serve_connection(TokioIo::new(stream), run).await;
                drop(permit);
            });
        }
    }
}

impl Drop for RunSocket {
    fn drop(&mut self) {
        self.remove();
    }
}

async fn serve_connection(io: TokioIo<tokio::net::UnixStream>, run: Arc<Run>) {
    let service_run = run.clone();
    let service = service_fn(move |request: Request<Incoming>| {
        let run = service_run.clone();
        async move { Ok::<_, std::convert::Infallible>(answer(&run, request).await) }
    });
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(READ_HEADER_TIMEOUT)
        .max_buf_size(MAX_HEADER_BYTES)
        .keep_alive(true);
    let connection = builder.serve_connection(io, service);
    tokio::pin!(connection);
    tokio::select! {
        _ = connection.as_mut() => {}
        () = run.wait_ended() => {
            connection.as_mut().graceful_shutdown();
            let _ = tokio::time::timeout(SHUTDOWN_GRACE, connection).await;
        }
    }
}

async fn answer(run: &Run, request: Request<Incoming>) -> Response<Full<Bytes>> {
    let uri = request.uri();
    // Only origin-form targets: an absolute URI or authority form names no route.
    let reply = if uri.scheme().is_some() || uri.authority().is_some() {
        Reply::broker(403, message::FORBIDDEN)
    } else {
        let method = request.method().as_str().to_owned();
        let target = uri.to_string();
        run.call(&method, &target, request.into_body()).await
    };
    to_response(reply)
}

fn to_response(reply: Reply) -> Response<Full<Bytes>> {
    Response::builder()
        .status(reply.status)
        .header(CONTENT_TYPE, reply.content_type)
        .body(Full::new(reply.body))
        .unwrap_or_else(|_| {
            let fallback = Reply::broker(502, message::UNAVAILABLE);
            let mut response = Response::new(Full::new(fallback.body));
            *response.status_mut() = http::StatusCode::BAD_GATEWAY;
            response
        })
}
