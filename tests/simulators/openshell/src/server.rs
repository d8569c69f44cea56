//! Starting, announcing and stopping the simulator: the test CA, the Docker connection and
//! runtime choice, the gRPC server (HTTP/2 over rustls, client certificates required) and
//! the admin endpoint, one JSON line on stdout once both listen, and on shutdown every
//! container this process made removed.

use std::sync::Arc;
use std::time::Duration;

use tokio::io::AsyncReadExt;
use tokio::net::TcpListener;
use tokio_stream::wrappers::TcpListenerStream;
use tonic::transport::{Certificate, Identity, Server, ServerTlsConfig};

use crate::docker::{Docker, DockerError};
use crate::gateway::{Gateway, Settings, State, sandboxes};
use crate::options::Options;
use crate::pki::{self, PkiError, PkiFiles};
use crate::proto::v1::open_shell_server::OpenShellServer;

/// The ready line (one JSON object on stdout).
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct Ready {
    /// `https://127.0.0.1:<port>`: what `SANDBOX_OPENSHELL_GATEWAY_URL` takes.
    pub grpc_url: String,
    /// `127.0.0.1:<port>`: what OpenShell's Python client takes.
    pub grpc_addr: String,
    /// `http://127.0.0.1:<port>`: the admin (faults) endpoint.
    pub admin_url: String,
    #[serde(flatten)]
    pub pki: PkiFiles,
    /// The docker runtime sandboxes run under (`runc` or `runsc`).
    pub runtime: String,
    /// Labels every container of this process: `io.plimsoll.simulator.instance=<instance>`.
    pub instance: String,
}

#[derive(Debug, thiserror::Error)]
pub enum SimulatorError {
    #[error("{0}")]
    Options(String),
    #[error(transparent)]
    Pki(#[from] PkiError),
    #[error(transparent)]
    Docker(#[from] DockerError),
    #[error("docker does not list the runtime {0}")]
    Runtime(String),
    #[error("binding {what} on {addr}: {source}")]
    Bind {
        what: &'static str,
        addr: std::net::SocketAddr,
        source: std::io::Error,
    },
    #[error("TLS setup: {0}")]
    Tls(#[from] tonic::transport::Error),
}

async fn bind(
    what: &'static str,
    addr: std::net::SocketAddr,
) -> Result<TcpListener, SimulatorError> {
    TcpListener::bind(addr)
        .await
        .map_err(|source| SimulatorError::Bind { what, addr, source })
}

/// What ends the simulator.
async fn shutdown_signal(exit_on_stdin_eof: bool, lifetime: Duration) {
    let stdin_eof = async {
        if !exit_on_stdin_eof {
            return std::future::pending().await;
        }
        let mut stdin = tokio::io::stdin();
        let mut buf = [0u8; 256];
        while matches!(stdin.read(&mut buf).await, Ok(n) if n > 0) {}
    };
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending().await,
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => tracing::info!("interrupted"),
        _ = terminate => tracing::info!("terminated"),
        _ = stdin_eof => tracing::info!("standard input closed"),
        _ = tokio::time::sleep(lifetime) => tracing::warn!("maximum lifetime reached"),
    }
}

/// Runs the simulator until a shutdown signal; every container it made is gone after.
pub async fn run(options: Options) -> Result<(), SimulatorError> {
    options.check().map_err(SimulatorError::Options)?;
    let pki = pki::generate(&options.cert_dir)?;
    let docker = Docker::connect(&options.docker_socket).await?;
    let (runtimes, docker_version) = docker.runtimes_and_version().await?;
    let runtime = match options.runtime.as_str() {
        "auto" if runtimes.iter().any(|r| r == "runsc") => "runsc".to_owned(),
        "auto" => "runc".to_owned(),
        named => named.to_owned(),
    };
    if !runtimes.contains(&runtime) {
        return Err(SimulatorError::Runtime(runtime));
    }
    let grpc = bind("the gRPC server", options.listen).await?;
    let admin = bind("the admin endpoint", options.admin_listen).await?;
    let grpc_addr = grpc.local_addr().map_err(|source| SimulatorError::Bind {
        what: "the gRPC server",
        addr: options.listen,
        source,
    })?;
    let admin_addr = admin.local_addr().map_err(|source| SimulatorError::Bind {
        what: "the admin endpoint",
        addr: options.admin_listen,
        source,
    })?;
    let instance = crate::ids::hex_id(4);
    let settings = Settings {
        instance: instance.clone(),
        runtime: runtime.clone(),
        docker_version,
        default_image: options.default_image.clone(),
        sandbox_user: options.sandbox_user.clone(),
        pids_limit: options.pids_limit,
        ssh_session_ttl_secs: options.ssh_session_ttl_secs,
        allow_driver_config: !options.deny_driver_config,
        gateway_host: grpc_addr.ip().to_string(),
        gateway_port: grpc_addr.port(),
    };
    let state = Arc::new(State::new(settings, docker));

    let tls = ServerTlsConfig::new()
        .identity(Identity::from_pem(
            &pki.server_cert_pem,
            &pki.server_key_pem,
        ))
        .client_ca_root(Certificate::from_pem(&pki.ca_pem));
    let service = OpenShellServer::new(Gateway {
        state: state.clone(),
    });
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let server = Server::builder()
        .tls_config(tls)?
        .add_service(service)
        .serve_with_incoming_shutdown(TcpListenerStream::new(grpc), async {
            let _ = stop_rx.await;
        });
    let server = tokio::spawn(server);
    let admin_task = tokio::spawn(crate::admin::serve(state.clone(), admin));

    let ready = Ready {
        grpc_url: format!("https://{grpc_addr}"),
        grpc_addr: grpc_addr.to_string(),
        admin_url: format!("http://{admin_addr}"),
        pki: pki.files.clone(),
        runtime,
        instance,
    };
    // The one line a launcher waits for.
    println!("{}", serde_json::to_string(&ready).unwrap_or_default());
    tracing::info!(grpc = %grpc_addr, admin = %admin_addr, runtime = %ready.runtime, "openshell simulator listening");

    shutdown_signal(
        options.exit_on_stdin_eof,
        Duration::from_secs(options.max_lifetime_secs),
    )
    .await;
    let _ = stop_tx.send(());
    admin_task.abort();
    let _ = tokio::time::timeout(Duration::from_secs(5), server).await;
    sandboxes::remove_all(&state).await;
    tracing::info!("openshell simulator stopped; its containers are removed");
    Ok(())
}
