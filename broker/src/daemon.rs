//! The broker process: configuration from the environment, startup, serving, shutdown.

use std::path::PathBuf;
use std::time::{Duration, SystemTime};

use tokio::signal::unix::{SignalKind, signal};

use crate::control::server;
use crate::env::{self, Environment};
use crate::grants::GrantsError;
use crate::guard_socket;
use crate::guest_sockets::{DEFAULT_GUEST_UID, GuestSockets, GuestSocketsError};
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
    /// [`env::BROKER_GUARD_SOCKET`]: where the guard is served, if anywhere.
    pub guard_socket: Option<PathBuf>,
    /// [`env::LOG_FORMAT`] is `text`.
    pub text_logs: bool,
    /// [`env::BROKER_GUEST_UID`].
    pub guest_uid: u32,
}

/// How often the socket directory is checked for sockets no open run or session owns.
const SOCKET_SWEEP_EVERY: Duration = Duration::from_secs(30);

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
    /// The guest sockets' directory could not be made.
    #[error(transparent)]
    GuestSockets(#[from] GuestSocketsError),
    /// Signal handlers could not be installed.
    #[error("signals: {0}")]
    Signals(std::io::Error),
}

// === impl Config ===

impl Config {
    /// Reads every variable; reports the first problem.
    pub fn from_env(vars: &dyn Environment) -> Result<Self, StartError> {
        // Trimmed, as plimsolld reads the same variables it hands on to its broker.
        let path = |name: &'static str| {
            vars.var(name)
                .map(|v| v.trim().to_owned())
                .filter(|v| !v.is_empty())
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
        let guard_socket = path(env::BROKER_GUARD_SOCKET);
        if let Some(guard) = &guard_socket {
            if !guard.is_absolute() {
                return Err(StartError::Invalid {
                    name: env::BROKER_GUARD_SOCKET,
                    detail: "must be an absolute path".into(),
                });
            }
            if *guard == control_socket {
                return Err(StartError::Invalid {
                    name: env::BROKER_GUARD_SOCKET,
                    detail: "must not be the control socket".into(),
                });
            }
        }
        // plimsolld's rule (config.md §2.1), since a supervised broker inherits the variable:
        // trimmed, case-insensitive `text` selects text, anything else means JSON.
        let text_logs = vars
            .var(env::LOG_FORMAT)
            .is_some_and(|v| v.trim().eq_ignore_ascii_case("text"));
        let guest_uid = match vars.var(env::BROKER_GUEST_UID).as_deref().map(str::trim) {
            None | Some("") => DEFAULT_GUEST_UID,
            Some(text) => match text.parse::<u32>() {
                Ok(uid) if uid > 0 => uid,
                _ => {
                    return Err(StartError::Invalid {
                        name: env::BROKER_GUEST_UID,
                        detail: format!("{text:?} is not a uid above 0"),
                    });
                }
            },
        };
        Ok(Self {
            grants_file,
            control_socket,
            ca_file: path(env::BROKER_CA_FILE),
            guard_socket,
            text_logs,
            guest_uid,
        })
    }
}

/// Loads the grants, binds the control socket (and the guard socket, when configured) and
/// serves until SIGTERM or SIGINT; then revokes every open run and session and removes the
/// sockets.
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
    let guard_listener = match &config.guard_socket {
        Some(path) => Some(guard_socket::bind(path).await?),
        None => None,
    };
    // A killed predecessor's sockets go first (plimsolld's background loop reaps them too).
    let tmp = std::env::temp_dir();
    crate::socket_dirs::reap_stale(
        &tmp,
        &crate::socket_dirs::BROKER_PREFIXES,
        SystemTime::now(),
    );
    let sockets = std::sync::Arc::new(GuestSockets::create(&tmp, config.guest_uid)?);
    let runs = Runs::new(
        registry.clone(),
        upstream,
        sockets.clone(),
        guard_listener.is_some(),
    );
    let current = registry.current();
    tracing::info!(
        socket = %config.control_socket.display(),
        guest_sockets = %sockets.dir().display(),
        guest_uid = config.guest_uid,
        grants_file = %config.grants_file.display(),
        profiles = current.len(),
        generation = current.generation(),
        guard_socket = config.guard_socket.as_ref().map(|p| p.display().to_string()),
        "broker listening"
    );
    let reload_task = tokio::spawn(reloader.run(hangup));
    let serve_task = tokio::spawn(server::serve(listener, runs.clone()));
    let guard_task = guard_listener
        .map(|listener| tokio::spawn(guard_socket::serve(listener, runs.guard_tokens())));
    let sweep_task = tokio::spawn(sweep_sockets(runs.clone()));
    tokio::select! {
        _ = terminate.recv() => {}
        _ = interrupt.recv() => {}
    }
    tracing::info!("broker stopping");
    serve_task.abort();
    reload_task.abort();
    sweep_task.abort();
    runs.close_all().await;
    if let Some(task) = guard_task {
        task.abort();
    }
    drop(runs);
    // The last holder: the directory and anything left in it go.
    drop(sockets);
    let _ = std::fs::remove_file(&config.control_socket);
    if let Some(path) = &config.guard_socket {
        let _ = std::fs::remove_file(path);
    }
    Ok(())
}

/// Every [`SOCKET_SWEEP_EVERY`], removes what lies in the socket directory with no open
/// run or session owning it: no guest socket outlives its run, even one whose removal
/// failed when the run closed.
async fn sweep_sockets(runs: std::sync::Arc<Runs>) {
    loop {
        tokio::time::sleep(SOCKET_SWEEP_EVERY).await;
        runs.sweep_sockets();
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    fn config(pairs: &[(&str, &str)]) -> Result<Config, StartError> {
        let mut vars: HashMap<String, String> = [
            (env::GRANTS_FILE, "/etc/plimsoll/grants.json"),
            (env::BROKER_SOCKET, "/run/plimsoll/broker.sock"),
        ]
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect();
        for (k, v) in pairs {
            vars.insert((*k).to_owned(), (*v).to_owned());
        }
        Config::from_env(&vars)
    }

    #[test]
    fn the_log_format_is_read_as_plimsolld_reads_it() {
        for (value, text) in [
            ("text", true),
            ("TEXT", true),
            (" text ", true),
            ("json", false),
            ("pretty", false),
            ("", false),
        ] {
            let c = config(&[(env::LOG_FORMAT, value)]).unwrap();
            assert_eq!(c.text_logs, text, "{value:?}");
        }
    }

    #[test]
    fn paths_are_trimmed() {
        let c = config(&[(env::GRANTS_FILE, " /etc/grants.json ")]).unwrap();
        assert_eq!(c.grants_file, PathBuf::from("/etc/grants.json"));
        assert!(matches!(
            config(&[(env::BROKER_SOCKET, "  ")]),
            Err(StartError::Missing(_))
        ));
    }
}
