//! The broker process: configuration from the environment, startup, serving, shutdown.

use std::path::PathBuf;

use tokio::signal::unix::{SignalKind, signal};

use crate::control::server;
use crate::env::{self, Environment};
use crate::grants::GrantsError;
use crate::reload::{self, Reloader};
use crate::runs::Runs;
use crate::upstream::{Upstream, UpstreamSetupError};

/// What the broker reads from its environment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    /// [`env::GRANTS_FILE`].
    pub grants_file: PathBuf,
    /// [`env::BROKER_SOCKET`].
    pub control_socket: PathBuf,
    /// [`env::BROKER_CA_FILE`].
    pub ca_file: Option<PathBuf>,
    /// [`env::LOG_FORMAT`] is `text`.
    pub text_logs: bool,
}

/// Why the broker did not start. Every variant exits 1.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// A required variable is unset or blank.
    #[error("{0} is required")]
    Missing(&'static str),
    /// A variable has a value the broker does not accept.
    #[error("{name}: {detail}")]
    Invalid {
        /// The variable.
        name: &'static str,
        /// What is wrong.
        detail: String,
    },
    /// The grants file did not load.
    #[error(transparent)]
    Grants(#[from] GrantsError),
    /// The extra CA file is unusable.
    #[error("{}: {}", env::BROKER_CA_FILE, .0)]
    Ca(#[from] UpstreamSetupError),
    /// The control socket could not be bound.
    #[error(transparent)]
    Control(#[from] server::ControlServerError),
    /// Signal handlers could not be installed.
    #[error("signals: {0}")]
    Signals(std::io::Error),
}

// === impl Config ===

impl Config {
    /// Reads every variable; reports the first problem.
    pub fn from_env(vars: &dyn Environment) -> Result<Self, StartError> {
        let path = |name: &'static str| {
            vars.var(name)
                .filter(|v| !v.trim().is_empty())
                .map(PathBuf::from)
        };
        let grants_file = path(env::GRANTS_FILE).ok_or(StartError::Missing(env::GRANTS_FILE))?;
        let control_socket =
            path(env::BROKER_SOCKET).ok_or(StartError::Missing(env::BROKER_SOCKET))?;
        if !control_socket.is_absolute() {
            return Err(StartError::Invalid {
                name: env::BROKER_SOCKET,
                detail: "must be an absolute path".into(),
            });
        }
        let text_logs = match vars.var(env::LOG_FORMAT).as_deref() {
            None | Some("" | "json") => false,
            Some("text") => true,
            Some(other) => {
                return Err(StartError::Invalid {
                    name: env::LOG_FORMAT,
                    detail: format!("{other:?} is not json or text"),
                });
            }
        };
        Ok(Self {
            grants_file,
            control_socket,
            ca_file: path(env::BROKER_CA_FILE),
            text_logs,
        })
    }
}

/// Loads the grants, binds the control socket and serves until SIGTERM or SIGINT; then
/// revokes every open run and session and removes the control socket.
pub async fn serve(config: Config) -> Result<(), StartError> {
    let hangup = reload::hangup();
    let (reloader, registry) = Reloader::start(
        config.grants_file.clone(),
        Box::new(env::ProcessEnvironment),
    )?;
    let upstream = Upstream::new(config.ca_file.as_deref())?;
    let mut terminate = signal(SignalKind::terminate()).map_err(StartError::Signals)?;
    let mut interrupt = signal(SignalKind::interrupt()).map_err(StartError::Signals)?;
    let listener = server::bind(&config.control_socket).await?;
    let runs = Runs::new(registry.clone(), upstream);
    let current = registry.current();
    tracing::info!(
        socket = %config.control_socket.display(),
        grants_file = %config.grants_file.display(),
        profiles = current.len(),
        generation = current.generation(),
        "broker listening"
    );
    let reload_task = tokio::spawn(reloader.run(hangup));
    let serve_task = tokio::spawn(server::serve(listener, runs.clone()));
    tokio::select! {
        _ = terminate.recv() => {}
        _ = interrupt.recv() => {}
    }
    tracing::info!("broker stopping");
    serve_task.abort();
    reload_task.abort();
    runs.close_all().await;
    let _ = std::fs::remove_file(&config.control_socket);
    Ok(())
}
