//! The guard process: bind, serve, and on SIGTERM or SIGINT stop accepting, let requests in
//! flight finish, then exit.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::signal::unix::{SignalKind, signal};

use crate::admission::Admission;
use crate::broker::BrokerLink;
use crate::config::{Config, bind_target};
use crate::handler::Guard;
use crate::listener::{self, WRITE_TIMEOUT};
use crate::tls::{self, TlsError};

/// How long requests in flight may take to finish after a signal: the write bound.
pub const DRAIN_BUDGET: Duration = WRITE_TIMEOUT;

/// Why the guard did not start. Each exits 1.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// The TLS files are unusable.
    #[error(transparent)]
    Tls(#[from] TlsError),
    /// The listener could not bind.
    #[error("cannot listen on {addr}: {source}")]
    Listen {
        /// The address.
        addr: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The bound address could not be written.
    #[error("{path}: {source}")]
    AddrFile {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// Signal handlers could not be installed.
    #[error("signals: {0}")]
    Signals(std::io::Error),
}

/// Serves until a signal; returns once the listener has drained.
pub async fn serve(config: Config) -> Result<(), StartError> {
    let tls = match &config.tls {
        Some((cert, key)) => Some(tls::acceptor(cert, key)?),
        None => None,
    };
    let mut terminate = signal(SignalKind::terminate()).map_err(StartError::Signals)?;
    let mut interrupt = signal(SignalKind::interrupt()).map_err(StartError::Signals)?;
    let listener = TcpListener::bind(bind_target(&config.addr))
        .await
        .map_err(|source| StartError::Listen {
            addr: config.addr.clone(),
            source,
        })?;
    let bound = listener
        .local_addr()
        .map_err(|source| StartError::Listen {
            addr: config.addr.clone(),
            source,
        })?
        .to_string();
    if let Some(path) = &config.addr_file {
        write_addr_file(path, &bound)?;
    }
    let admission = Admission::new(config.decode_slots());
    let guard = Arc::new(Guard {
        broker: BrokerLink::new(&config.broker_socket),
        admission: admission.clone(),
    });
    let max_connections = listener::connection_cap();
    tracing::info!(
        addr = %bound,
        tls = tls.is_some(),
        broker = %config.broker_socket.display(),
        decode_slots = config.decode_slots(),
        max_connections,
        "guard listening"
    );
    let shutdown = async move {
        tokio::select! {
            _ = terminate.recv() => {}
            _ = interrupt.recv() => {}
        }
        tracing::info!("guard stopping: draining requests in flight");
    };
    listener::serve(
        listener,
        tls,
        guard,
        max_connections,
        shutdown,
        DRAIN_BUDGET,
    )
    .await;
    if let Some(path) = &config.addr_file {
        let _ = std::fs::remove_file(path);
    }
    let counts = admission.counts();
    tracing::info!(
        requests_inside = counts.inside,
        turns_held = counts.turns,
        decode_slots_held = counts.decoding,
        "guard stopped"
    );
    Ok(())
}

/// Writes `addr` and a newline to `path` through a temporary file, so a reader never sees
/// half an address.
fn write_addr_file(path: &std::path::Path, addr: &str) -> Result<(), StartError> {
    let fail = |source| StartError::AddrFile {
        path: path.to_owned(),
        source,
    };
    let mut staging = path.as_os_str().to_owned();
    staging.push(".tmp");
    std::fs::write(&staging, format!("{addr}\n")).map_err(fail)?;
    std::fs::rename(&staging, path).map_err(fail)
}
