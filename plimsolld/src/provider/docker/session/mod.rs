//! Sessions on docker (providers.md §9): one long-lived, locked-down container of the project
//! image per session, reached only through `docker exec`.
//!
//! - [`open`]: create the container, start it, verify it by inspection, keep its security
//!   snapshot and prove its process baseline ([`container`], [`boundary`]);
//! - before each call: resume it if the idle watcher paused it, then read it back against the
//!   snapshot;
//! - the calls ([`calls`]): snippets and projects, each an exec through the start script;
//! - after each call: the sweep kills whatever the call left running and measures the disk;
//! - suspend is `docker pause`; the end is a confirmed force-remove.
//!
//! - cells ([`cells`], with the [`cell`] machinery): one interpreter per language, kept
//!   across calls, spared by the sweep and ended before any project call.

mod boundary;
mod calls;
pub mod cell;
mod cells;
mod container;

use std::sync::Arc;

use async_trait::async_trait;
use plimsoll::refusal::Refusal;
use plimsoll::wire::SessionEnd;

use super::engine::Engine;
use super::preflight::VerifiedImage;
use super::settings::Settings;
use super::{Inner, container::random_hex, container::unix_now, not_ready, removal};
use crate::provider::{
    CellCall, CellOutcome, OpenedSession, ProjectPlan, ProjectReport, ProviderError, SessionFault,
    SessionOpen, SessionSandbox, SnippetOutcome,
};

pub use container::NAME_PREFIX;

/// Where Yama's ptrace policy is read on the host.
const YAMA_PTRACE_SCOPE: &str = "/proc/sys/kernel/yama/ptrace_scope";

/// One session's container.
pub struct DockerSession {
    engine: Engine,
    settings: Arc<Settings>,
    image: VerifiedImage,
    name: String,
    id: String,
    snapshot: String,
    keep: Vec<String>,
    paused: bool,
    disk_mb: u32,
    removed: bool,
    /// The languages the image runs (proven at startup).
    languages: Vec<String>,
    /// At most one interpreter per language. Behind a mutex only so the session is `Sync`
    /// (an interpreter's relay stream is not); every use goes through `&mut self`.
    interpreters: std::sync::Mutex<Vec<cell::Interpreter>>,
}

/// Opens a session container for `open` (providers.md §9.1).
pub(super) async fn open(
    inner: &Arc<Inner>,
    open: SessionOpen,
) -> Result<OpenedSession, ProviderError> {
    let verified = inner.readiness.check().await.map_err(not_ready)?;
    check_yama(inner.settings.runtime.is_runsc())?;
    let name = format!("{NAME_PREFIX}{}", random_hex());
    let expires = unix_now() + open.lifetime.as_secs() + 1;
    let instance = format!("session-{}", inner.instance);
    let body = container::body(
        &inner.settings,
        &container::Create {
            image: &verified.project,
            expires,
            instance: &instance,
            seccomp: verified.seccomp.as_deref(),
            socket: open.host_socket.as_deref(),
        },
    );
    let engine = verified.engine.clone();
    let mut session = DockerSession {
        engine: engine.clone(),
        settings: Arc::clone(&inner.settings),
        image: verified.project.clone(),
        name,
        id: String::new(),
        snapshot: String::new(),
        keep: Vec::new(),
        paused: false,
        disk_mb: open.disk_mb,
        removed: false,
        languages: inner
            .languages
            .read()
            .map(|l| l.clone())
            .unwrap_or_default(),
        interpreters: std::sync::Mutex::new(Vec::new()),
    };
    // From the create on, every failure removes what was made.
    match session.create_and_prove(body).await {
        Ok(()) => {
            tracing::info!(
                container = %session.name,
                "session container verified"
            );
            let instance = session.instance();
            Ok(OpenedSession {
                environment: session.image.id.clone(),
                software_identity: String::new(),
                instance,
                sandbox: Box::new(session),
            })
        }
        Err(detail) => {
            session.finish().await;
            Err(ProviderError::Infrastructure(format!(
                "session open: {detail}"
            )))
        }
    }
}

/// Yama's `ptrace_scope` must not be 0 under runc: a same-uid guest could otherwise attach
/// to a dumpable plimsoll process in the container. gVisor's own kernel answers ptrace
/// there, and a host without Yama relies on the guard's non-dumpability alone.
fn check_yama(runsc: bool) -> Result<(), ProviderError> {
    if runsc {
        return Ok(());
    }
    match std::fs::read_to_string(YAMA_PTRACE_SCOPE) {
        Ok(text) if text.trim() == "0" => Err(ProviderError::Refused(Refusal::Environment(
            "the host's Yama ptrace_scope is 0; sessions under runc need 1 or more; nothing ran"
                .to_owned(),
        ))),
        _ => Ok(()),
    }
}

impl DockerSession {
    fn instance(&self) -> String {
        format!("docker-container:{}", self.id)
    }

    async fn create_and_prove(
        &mut self,
        body: bollard::models::ContainerCreateBody,
    ) -> Result<(), String> {
        self.id = self
            .engine
            .create(&self.name, body)
            .await
            .map_err(|e| e.to_string())?;
        if self.id.len() != 64 || !self.id.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err("docker answered a container id that is not 64 hex".to_owned());
        }
        self.engine
            .start(&self.id)
            .await
            .map_err(|e| e.to_string())?;
        let inspected = self
            .engine
            .inspect_container(&self.id)
            .await
            .map_err(|e| e.to_string())?;
        container::verify(&inspected, &self.image.id)?;
        self.snapshot = container::snapshot(&inspected);
        self.keep = boundary::baseline(&self.engine, &self.id, &self.settings.user()).await?;
        Ok(())
    }
}

#[async_trait]
impl SessionSandbox for DockerSession {
    async fn prepare(&mut self) -> Result<(), SessionFault> {
        if self.paused {
            if let Err(e) = container::set_paused(&self.engine, &self.id, false).await {
                tracing::warn!(error = %e, "session resume failed");
                return Err(SessionFault::ended(
                    SessionEnd::SESSION_END_BOUNDARY_FAILED,
                    "the suspended session could not be resumed",
                ));
            }
            self.paused = false;
        }
        container::read_back(&self.engine, &self.id, &self.snapshot, false).await
    }

    async fn snippet(
        &mut self,
        code: String,
        timeout: std::time::Duration,
        grant: Option<Arc<crate::grant::GuestGrant>>,
    ) -> Result<SnippetOutcome, SessionFault> {
        self.run_snippet(code, timeout, grant.as_deref()).await
    }

    async fn project(&mut self, plan: ProjectPlan) -> Result<ProjectReport, SessionFault> {
        // Quiesce: no interpreter may outlive into a project call (it could read the
        // runner's stdin, which carries the report key, before the guard loads).
        if self.end_interpreters().await {
            boundary::quiesce(&self.engine, &self.id, &self.settings.user(), &self.keep).await?;
        }
        self.run_project(plan).await
    }

    async fn cell(&mut self, call: CellCall) -> Result<CellOutcome, SessionFault> {
        self.run_cell(call).await
    }

    async fn sweep(&mut self) -> Result<(), SessionFault> {
        self.forget_dead_interpreters().await;
        let mut keep = self.keep.clone();
        keep.extend(self.interpreter_ids());
        boundary::sweep(
            &self.engine,
            &self.id,
            &self.settings.user(),
            self.disk_mb,
            &keep,
        )
        .await
    }

    async fn suspend(&mut self) -> Result<(), SessionFault> {
        match container::set_paused(&self.engine, &self.id, true).await {
            Ok(()) => {
                self.paused = true;
                Ok(())
            }
            Err(e) => {
                tracing::warn!(error = %e, "session suspend failed");
                Err(SessionFault::ended(
                    SessionEnd::SESSION_END_BOUNDARY_FAILED,
                    "the idle session could not be suspended",
                ))
            }
        }
    }

    async fn finish(&mut self) {
        if self.removed {
            return;
        }
        self.removed = true;
        // A paused container is removed by force as it is; the removal is confirmed by listing.
        if removal::force_remove(&self.engine, &self.name)
            .await
            .is_ok()
        {
            tracing::info!(container = %self.name, "session container removed");
        }
    }
}
