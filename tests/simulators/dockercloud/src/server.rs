//! Starting, announcing and stopping the simulator: the Docker connection and runtime
//! choice, the images it serves, one loopback listener per host of the real service (the
//! token exchange, the Connect management API, the policy API, the REST API, the sandbox
//! endpoints) plus the admin endpoint, one JSON line on stdout once all listen, and on
//! shutdown every container this process made removed.

use std::net::SocketAddr;
use std::time::Duration;

use tokio::io::AsyncReadExt;
use tokio::net::TcpListener;

use crate::docker::{Docker, DockerError};
use crate::options::{DEFAULT_IMAGE, Options};
use crate::state::{Image, Settings, State};

/// The ready line (one JSON object on stdout).
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct Ready {
    /// Docker Hub's token exchange: what `SANDBOX_DOCKERCLOUD_AUTH_URL` takes.
    pub auth_url: String,
    /// The Connect management base: what `SANDBOX_DOCKERCLOUD_API_URL` takes (connect).
    pub api_url: String,
    /// The network-policy API base: what `SANDBOX_DOCKERCLOUD_POLICY_URL` takes.
    pub policy_url: String,
    /// The REST API base: what `SANDBOX_DOCKERCLOUD_API_URL` takes with the rest transport.
    pub rest_url: String,
    /// Sandbox endpoints are `<endpoint_base>/sandboxes/<id>`.
    pub endpoint_base: String,
    /// The admin (faults) endpoint.
    pub admin_url: String,
    /// `DOCKER_SBX_USERNAME`.
    pub username: String,
    /// `DOCKER_SBX_TOKEN` (a test credential, valid for this process only).
    pub token: String,
    /// The docker runtime sandboxes run under (`runc` or `runsc`).
    pub runtime: String,
    /// Labels every container of this process: `io.plimsoll.simulator.instance=<instance>`.
    pub instance: String,
    /// The images a create may name, each with its linux/amd64 manifest digest.
    pub images: Vec<ReadyImage>,
    /// The guard host a policy PUT can open, and where it leads.
    pub guard_host: Option<String>,
    pub guard_target: Option<String>,
}

#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct ReadyImage {
    pub reference: String,
    pub digest: String,
}

#[derive(Debug, thiserror::Error)]
pub enum SimulatorError {
    #[error("{0}")]
    Options(String),
    #[error(transparent)]
    Docker(#[from] DockerError),
    #[error("docker does not list the runtime {0}")]
    Runtime(String),
    #[error(
        "image {0} is not on this machine (tests/simulators/dockercloud/image/build makes the default one)"
    )]
    Image(String),
    #[error("binding {what} on {addr}: {source}")]
    Bind {
        what: &'static str,
        addr: SocketAddr,
        source: std::io::Error,
    },
}

async fn bind(
    what: &'static str,
    addr: SocketAddr,
) -> Result<(TcpListener, SocketAddr), SimulatorError> {
    let listener = TcpListener::bind(addr)
        .await
        .map_err(|source| SimulatorError::Bind { what, addr, source })?;
    let local = listener
        .local_addr()
        .map_err(|source| SimulatorError::Bind { what, addr, source })?;
    Ok((listener, local))
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

async fn images(docker: &Docker, options: &Options) -> Result<Vec<Image>, SimulatorError> {
    let wanted = if options.images.is_empty() {
        vec![DEFAULT_IMAGE.to_owned()]
    } else {
        options.images.clone()
    };
    let mut out = Vec::new();
    for entry in wanted {
        let (reference, local) = match entry.split_once('=') {
            Some((reference, local)) => (reference.to_owned(), local.to_owned()),
            None => (entry.clone(), entry.clone()),
        };
        let digest = docker
            .image_id(&local)
            .await
            .map_err(|_| SimulatorError::Image(local.clone()))?;
        out.push(Image {
            reference,
            local,
            digest,
        });
    }
    Ok(out)
}

/// Runs the simulator until a shutdown signal; every container it made is gone after.
pub async fn run(options: Options) -> Result<(), SimulatorError> {
    options.check().map_err(SimulatorError::Options)?;
    let docker = Docker::connect(&options.docker_socket).await?;
    let runtimes = docker.runtimes().await?;
    let runtime = match options.runtime.as_str() {
        "auto" if runtimes.iter().any(|r| r == "runsc") => "runsc".to_owned(),
        "auto" => "runc".to_owned(),
        named => named.to_owned(),
    };
    if !runtimes.contains(&runtime) {
        return Err(SimulatorError::Runtime(runtime));
    }
    let images = images(&docker, &options).await?;
    let any = SocketAddr::new(options.bind, 0);
    let (auth, auth_addr) = bind("the token exchange", any).await?;
    let (api, api_addr) = bind("the Connect API", any).await?;
    let (policy, policy_addr) = bind("the policy API", any).await?;
    let (rest, rest_addr) = bind("the REST API", any).await?;
    let (endpoint, endpoint_addr) = bind("the sandbox endpoints", any).await?;
    let (admin, admin_addr) = bind("the admin endpoint", options.admin_listen).await?;
    let instance = crate::ids::hex_id(4);
    let token = options
        .token
        .clone()
        .unwrap_or_else(|| format!("dckr_pat_{}", crate::ids::hex_id(16)));
    let settings = Settings {
        instance: instance.clone(),
        runtime: runtime.clone(),
        username: options.username.clone(),
        token: token.clone(),
        access_token_ttl: Duration::from_secs(options.access_token_ttl_secs),
        images: images.clone(),
        sandbox_user: options.sandbox_user.clone(),
        pids_limit: options.pids_limit,
        tmp_mib: options.tmp_mib,
        max_running: options.max_running,
        cpu_range: (options.cpu_min, options.cpu_max),
        memory_mib_range: (options.memory_mib_min, options.memory_mib_max),
        guard_host: options.guard_host.clone(),
        guard_target: options.guard_target,
        endpoint_base: format!("http://{endpoint_addr}"),
    };
    let state = State::new(settings, docker);
    let tasks = [
        tokio::spawn(crate::http::serve(state.clone(), auth, crate::auth::handle)),
        tokio::spawn(crate::http::serve(
            state.clone(),
            api,
            crate::management::handle,
        )),
        tokio::spawn(crate::http::serve(
            state.clone(),
            policy,
            crate::policy::handle,
        )),
        tokio::spawn(crate::http::serve(state.clone(), rest, crate::rest::handle)),
        tokio::spawn(crate::http::serve(
            state.clone(),
            endpoint,
            crate::endpoint::handle,
        )),
        tokio::spawn(crate::http::serve(
            state.clone(),
            admin,
            crate::admin::handle,
        )),
    ];
    let ready = Ready {
        auth_url: format!("http://{auth_addr}{}", crate::auth::EXCHANGE_PATH),
        api_url: format!("http://{api_addr}{}", crate::management::PREFIX),
        policy_url: format!("http://{policy_addr}/v1"),
        rest_url: format!("http://{rest_addr}{}", crate::rest::PREFIX),
        endpoint_base: format!("http://{endpoint_addr}"),
        admin_url: format!("http://{admin_addr}"),
        username: options.username.clone(),
        token,
        runtime,
        instance,
        images: images
            .iter()
            .map(|i| ReadyImage {
                reference: i.reference.clone(),
                digest: i.digest.clone(),
            })
            .collect(),
        guard_host: options.guard_host.clone(),
        guard_target: options.guard_target.map(|t| t.to_string()),
    };
    // The one line a launcher waits for.
    println!("{}", serde_json::to_string(&ready).unwrap_or_default());
    tracing::info!(api = %ready.api_url, rest = %ready.rest_url, runtime = %ready.runtime, "docker cloud simulator listening");

    shutdown_signal(
        options.exit_on_stdin_eof,
        Duration::from_secs(options.max_lifetime_secs),
    )
    .await;
    for task in &tasks {
        task.abort();
    }
    crate::lifecycle::remove_all(&state).await;
    tracing::info!("docker cloud simulator stopped; its containers are removed");
    Ok(())
}
