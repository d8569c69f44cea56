//! Hot rotation: the grants file is watched and reloaded without a restart.
//!
//! Every [`POLL_INTERVAL`] the file's metadata and content hash are compared with the last
//! load; `SIGHUP` forces a reload. A reload re-reads the variables the profiles name. A file
//! that fails validation changes nothing: the previous registry stays and the error is
//! logged, naming the problem. The same content loads at most once per change, so a broken
//! file is reported once, not every poll.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use sha2::{Digest, Sha256};
use tokio::signal::unix::{Signal, SignalKind, signal};

use crate::env::Environment;
use crate::registry::{Registry, SharedRegistry};

/// How often the file is checked.
pub const POLL_INTERVAL: Duration = Duration::from_millis(500);

/// What the reloader last saw of the file.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Fingerprint {
    len: u64,
    modified: Option<SystemTime>,
    digest: [u8; 32],
}

/// Watches one grants file and swaps registries.
pub struct Reloader {
    path: PathBuf,
    env: Box<dyn Environment + Send + Sync>,
    shared: Arc<SharedRegistry>,
    last: Option<Fingerprint>,
    generation: u64,
}

// === impl Reloader ===

impl Reloader {
    /// Loads the file once; the error is fatal at startup.
    pub fn start(
        path: PathBuf,
        env: Box<dyn Environment + Send + Sync>,
    ) -> Result<(Self, Arc<SharedRegistry>), crate::grants::GrantsError> {
        let last = fingerprint(&path);
        let registry = Registry::load(&path, env.as_ref(), 1)?;
        warn_open_profiles(&registry);
        let shared = Arc::new(SharedRegistry::new(registry));
        let reloader = Self {
            path,
            env,
            shared: shared.clone(),
            last,
            generation: 1,
        };
        Ok((reloader, shared))
    }

    /// Polls, and reloads on each signal from `hangup`, until the task is dropped.
    /// The caller installs the SIGHUP handler early (see [`hangup`]) so that a SIGHUP
    /// during startup cannot kill the process.
    pub async fn run(mut self, mut hangup: Option<Signal>) {
        let mut tick = tokio::time::interval(POLL_INTERVAL);
        loop {
            let forced = tokio::select! {
                _ = tick.tick() => false,
                Some(()) = async {
                    match hangup.as_mut() {
                        Some(h) => h.recv().await,
                        None => std::future::pending().await,
                    }
                } => true,
            };
            self.check(forced);
        }
    }

    /// Reloads when forced or when the file changed since the last attempt.
    pub fn check(&mut self, forced: bool) {
        let now = fingerprint(&self.path);
        if !forced && now == self.last {
            return;
        }
        self.last = now;
        let generation = self.generation + 1;
        match Registry::load(&self.path, self.env.as_ref(), generation) {
            Ok(registry) => {
                warn_open_profiles(&registry);
                tracing::info!(
                    generation,
                    profiles = registry.len(),
                    forced,
                    "grants reloaded"
                );
                self.generation = generation;
                self.shared.replace(registry);
            }
            Err(error) => {
                tracing::error!(
                    error = %error,
                    generation = self.generation,
                    "grants reload failed; keeping the previous registry"
                );
            }
        }
    }
}

/// Installs the SIGHUP handler (replacing the default action, which ends the process).
pub fn hangup() -> Option<Signal> {
    match signal(SignalKind::hangup()) {
        Ok(s) => Some(s),
        Err(error) => {
            tracing::error!(%error, "grants: cannot listen for SIGHUP; polling only");
            None
        }
    }
}

fn warn_open_profiles(registry: &Registry) {
    for name in registry.open_to_everyone() {
        tracing::warn!(
            profile = name,
            "grants: profile is open to every authenticated caller (allowed_callers \"*\")"
        );
    }
}

/// Metadata plus a content hash: catches edits that keep size and mtime.
fn fingerprint(path: &std::path::Path) -> Option<Fingerprint> {
    let meta = std::fs::metadata(path).ok()?;
    // Past the cap the load refuses the file whatever it holds: its size and time tell a
    // change, and it is not read.
    let bytes = if meta.len() > crate::grants::MAX_FILE_BYTES {
        Vec::new()
    } else {
        crate::grants::read_capped(path, crate::grants::MAX_FILE_BYTES)
            .ok()?
            .unwrap_or_default()
    };
    Some(Fingerprint {
        len: meta.len(),
        modified: meta.modified().ok(),
        digest: Sha256::digest(&bytes).into(),
    })
}
