//! Sessions on docker (providers.md §9): one long-lived, locked-down container of the project
//! image per session, reached through `docker exec` streams made once.
//!
//! - [`open`]: create the container, start it, verify it by inspection, keep its security
//!   snapshot, prove its process baseline ([`container`], [`boundary`]) and start its agent
//!   ([`agent`]), one held exec at uid+1;
//! - before each call: resume it if the idle watcher paused it, then read it back against the
//!   snapshot;
//! - the calls ([`calls`]): snippets and projects, each one request to the agent, which starts
//!   the guest's processes as the guest uid;
//! - after each call: the agent's sweep kills whatever the call left running and measures the
//!   disk;
//! - suspend is `docker pause`; the end is a confirmed force-remove.
//!
//! - cells ([`cells`], with the [`cell`] machinery): one interpreter per language, kept
//!   across calls, spared by the sweep and held stopped through a project call.

mod agent;
pub(crate) mod boundary;
mod calls;
pub mod cell;
mod cells;
mod container;
pub mod pool;

use std::sync::Arc;

use async_trait::async_trait;
use plimsoll::refusal::Refusal;
use plimsoll::wire::SessionEnd;
use tokio::time::Instant;

use super::config::SeccompSetting;
use super::engine::Engine;
use super::preflight::VerifiedImage;
use super::settings::Settings;
use super::{Inner, container::random_hex, container::unix_now, not_ready, removal};
use crate::provider::{
    CellCall, CellOutcome, OpenedSession, ProjectPlan, ProjectReport, ProviderError, SessionFault,
    SessionOpen, SessionSandbox, SnippetOutcome,
};

pub use container::NAME_PREFIX;

/// A hold's or release's budget (the agent proves a stop within 2 s).
const HOLD_BUDGET: std::time::Duration = std::time::Duration::from_secs(10);
/// How long an idle agent may take to answer a check.
const AGENT_CHECK_BUDGET: std::time::Duration = std::time::Duration::from_secs(5);
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
    /// The interpreters held stopped during a granted call.
    held: Vec<String>,
    /// Whether guest code may have run since the last sweep: an interpreter outlived it (its
    /// code runs between calls, and what it starts stays even once the interpreter is gone).
    unswept: bool,
    /// At most one interpreter per language. Behind a mutex only so the session is `Sync`
    /// (an interpreter's relay stream is not); every use goes through `&mut self`.
    interpreters: std::sync::Mutex<Vec<cell::Interpreter>>,
    /// Interpreters a pool member warmed that no cell has used yet: the first cell in each
    /// still starts fresh (`interpreter_started`).
    unused: Vec<cell::CellLanguage>,
    /// The session's agent, which sweeps after each call (started after the baseline). Behind
    /// a mutex only so the session is `Sync`; every use goes through `&mut self`.
    agent: std::sync::Mutex<Option<agent::Agent>>,
}

/// Opens a session for `open` (providers.md §9.1): a warm pool member when one matches (no
/// preflight: the cached verified state must still hold), else a fresh container.
pub(super) async fn open(
    inner: &Arc<Inner>,
    open: SessionOpen,
) -> Result<OpenedSession, ProviderError> {
    let expires = unix_now() + open.lifetime.as_secs() + 1;
    if let Some(mut session) = inner.session_pool.claim(inner, &open, expires).await {
        session.disk_mb = open.disk_mb;
        tracing::info!(container = %session.name, "session served by a warm pool member");
        return Ok(session.opened());
    }
    let verified = inner.readiness.check().await.map_err(not_ready)?;
    let session = make(
        inner,
        &verified,
        expires,
        open.host_socket.as_deref(),
        open.disk_mb,
        None,
    )
    .await?;
    tracing::info!(container = %session.name, "session container verified");
    Ok(session.opened())
}

/// Creates, starts, verifies and baselines one session container expiring at `expires`
/// (unix seconds): an open's, or (with `warm`, its language set) a warm pool member's.
/// Every failure removes what was made.
pub(super) async fn make(
    inner: &Arc<Inner>,
    verified: &super::preflight::Verified,
    expires: u64,
    socket: Option<&std::path::Path>,
    disk_mb: u32,
    warm: Option<&[String]>,
) -> Result<DockerSession, ProviderError> {
    let seccomp = session_seccomp(
        &inner.settings,
        verified.seccomp.as_deref(),
        read_ptrace_scope(),
    )?;
    let name = format!("{NAME_PREFIX}{}", random_hex());
    let instance = format!("session-{}", inner.instance);
    let mut body = container::body(
        &inner.settings,
        &container::Create {
            image: &verified.project,
            expires,
            instance: &instance,
            seccomp,
            socket,
        },
    );
    if let Some(set) = warm {
        // Which interpreters a member keeps warm, for the operator (and the tests).
        body.labels
            .get_or_insert_with(Default::default)
            .insert(container::LABEL_POOL.to_owned(), set.join(","));
    }
    let mut session = DockerSession {
        engine: verified.engine.clone(),
        settings: Arc::clone(&inner.settings),
        image: verified.project.clone(),
        name,
        id: String::new(),
        snapshot: String::new(),
        keep: Vec::new(),
        paused: false,
        disk_mb,
        removed: false,
        held: Vec::new(),
        unswept: false,
        languages: inner
            .languages
            .read()
            .map(|l| l.clone())
            .unwrap_or_default(),
        interpreters: std::sync::Mutex::new(Vec::new()),
        unused: Vec::new(),
        agent: std::sync::Mutex::new(None),
    };
    match session.create_and_prove(body).await {
        Ok(()) => Ok(session),
        Err(detail) => {
            session.finish().await;
            Err(ProviderError::infrastructure(format!(
                "session open: {detail}"
            )))
        }
    }
}

/// Yama's `ptrace_scope` on the host; a kernel without the Yama file reads as 0, which is
/// what it means (any same-uid process may attach).
fn read_ptrace_scope() -> u32 {
    std::fs::read_to_string(YAMA_PTRACE_SCOPE)
        .ok()
        .and_then(|text| text.trim().parse().ok())
        .unwrap_or(0)
}

/// The syscalls session code must not have when nothing else stops a same-uid attach.
const TRACING_SYSCALLS: [&str; 3] = ["ptrace", "process_vm_readv", "process_vm_writev"];

/// The seccomp profile a session container gets. Every kept process is already out of
/// session code's reach without Yama: docker-init and `sleep` run as root (with only the two
/// set-id capabilities), the relays and interpreters are non-dumpable. Under runc with `ptrace_scope` 0 (or no Yama) the tracing
/// calls are withheld as well: docker's built-in profile allows them, so a session then gets
/// the shipped profile; a profile that allows them (or `unconfined`) is refused. gVisor's
/// own kernel answers ptrace under runsc, where no seccomp profile applies.
fn session_seccomp<'a>(
    settings: &Settings,
    verified: Option<&'a str>,
    ptrace_scope: u32,
) -> Result<Option<&'a str>, ProviderError> {
    if settings.runtime.is_runsc() || ptrace_scope > 0 {
        return Ok(verified);
    }
    let refused = |why: &str| {
        ProviderError::Refused(Refusal::Environment(format!(
            "the host's Yama ptrace_scope is 0 or absent and {why}; sessions under runc then need a seccomp profile that withholds ptrace (the shipped one, or docker's default, which plimsolld replaces with it); nothing ran"
        )))
    };
    match &settings.seccomp {
        SeccompSetting::DockerDefault => Ok(Some(seccomp::PROFILE_JSON)),
        SeccompSetting::Unconfined => Err(refused("SANDBOX_DOCKER_SECCOMP is unconfined")),
        SeccompSetting::Profile(_) => {
            let text = verified.unwrap_or_default();
            let profile = seccomp::Profile::parse(text)
                .map_err(|_| refused("the seccomp profile does not parse"))?;
            if TRACING_SYSCALLS
                .iter()
                .all(|name| withholds(&profile, name))
            {
                Ok(verified)
            } else {
                Err(refused(
                    "the seccomp profile allows ptrace or process_vm_readv/writev",
                ))
            }
        }
    }
}

/// Whether `profile` fails `name` whatever its arguments.
fn withholds(profile: &seccomp::Profile, name: &str) -> bool {
    match profile.verdict(name) {
        seccomp::Verdict::Errno(_) => true,
        seccomp::Verdict::Default => profile.denies_by_default(),
        seccomp::Verdict::Allowed | seccomp::Verdict::Filtered => false,
    }
}

impl DockerSession {
    fn instance(&self) -> String {
        format!("docker-container:{}", self.id)
    }

    /// What the daemon is handed.
    fn opened(self) -> OpenedSession {
        OpenedSession {
            environment: self.image.id.clone(),
            software_identity: self.image.software_identity(),
            instance: self.instance(),
            sandbox: Box::new(self),
        }
    }

    /// Stops (`stop`) or resumes the kept processes `ids` through the agent; a resume answers
    /// whether each was still stopped. An agent whose stream failed is dropped: the session
    /// then ends at its sweep.
    async fn agent_hold(&mut self, stop: bool, ids: &[String]) -> Result<bool, String> {
        let Some(agent) = self.agent.get_mut().ok().and_then(Option::as_mut) else {
            return Err("the session's agent is gone".to_owned());
        };
        match agent.hold(stop, ids, Instant::now() + HOLD_BUDGET).await {
            Ok(held) => Ok(held),
            Err(agent::AgentError::NotHeld) => Err(agent::AgentError::NotHeld.to_string()),
            Err(e) => {
                self.agent.get_mut().ok().map(Option::take);
                Err(e.to_string())
            }
        }
    }

    /// A round trip to the agent now (a pool member's check at claim): `drop`, which ends
    /// nothing on an agent that has run no snippet. An agent that fails it is let go.
    async fn agent_answers(&mut self) -> Result<(), agent::AgentError> {
        let Some(agent) = self.agent.get_mut().ok().and_then(Option::as_mut) else {
            return Err(agent::AgentError::Ended);
        };
        let answered = agent.drop_spare(Instant::now() + AGENT_CHECK_BUDGET).await;
        if answered.is_err() {
            self.agent.get_mut().ok().map(Option::take);
        }
        answered
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
        // The agent joins the keep set: the quiesce and hold programs, run as the guest, must
        // neither try nor fail to end it.
        let agent = agent::Agent::start(&self.engine, &self.id, self.settings.guest_uid)
            .await
            .map_err(|e| e.to_string())?;
        self.keep.push(agent.id().to_owned());
        *self
            .agent
            .get_mut()
            .map_err(|_| "the agent's lock is poisoned".to_owned())? = Some(agent);
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

    async fn hold_kept(&mut self) -> Result<u32, SessionFault> {
        // The next snippet's node, if one waits, goes before the grant is lent.
        let Some(agent) = self.agent.get_mut().ok().and_then(Option::as_mut) else {
            return Err(self.agent_lost("the session's agent is gone").await);
        };
        if let Err(e) = agent.drop_spare(Instant::now() + HOLD_BUDGET).await {
            tracing::warn!(error = %e, "session agent did not end its spare node");
            self.agent.get_mut().ok().map(Option::take);
            return Err(self.agent_lost("the session's agent did not answer").await);
        }
        self.forget_dead_interpreters().await;
        if self.settings.runtime.is_runsc() {
            // Under gVisor every connection to the session's socket has the sandbox's gofer as
            // its peer, so the broker cannot tell a woken interpreter (the call's SIGCONT, its
            // own timer) from the call. Holding is not enough there: the interpreters end
            // before the grant is lent, and the next cell starts a fresh one and says so. The
            // quiesce runs whenever an interpreter outlived the last sweep, gone now or not:
            // a process it started since would otherwise meet the grant.
            let ended = self.end_interpreters().await;
            if ended || self.unswept {
                boundary::quiesce(&self.engine, &self.id, &self.settings.user(), &self.keep)
                    .await?;
            }
            self.unswept = false;
            return Ok(0);
        }
        let ids = self.interpreter_process_ids();
        if ids.is_empty() {
            // No interpreter to hold, but one that lived since the last sweep may have left a
            // process behind (the broker checks peers only while something is kept): swept.
            if self.unswept {
                self.sweep().await?;
            }
            return Ok(0);
        }
        match self.agent_hold(true, &ids).await {
            Ok(_) => {
                let held = u32::try_from(ids.len()).unwrap_or(u32::MAX);
                self.held = ids;
                // With the interpreters stopped, anything they started since the last sweep
                // ends before the grant is lent; a dirty sweep ends the session.
                self.sweep().await?;
                Ok(held)
            }
            Err(e) => {
                tracing::warn!(error = %e, "the session's interpreters could not be held for a granted call");
                self.held = ids;
                self.release_kept().await;
                Err(SessionFault::Refused(Refusal::Environment(
                    "the session's cell interpreters could not be held stopped for the granted call; nothing ran".to_owned(),
                )))
            }
        }
    }

    async fn release_kept(&mut self) {
        let ids = std::mem::take(&mut self.held);
        if ids.is_empty() {
            return;
        }
        match self.agent_hold(false, &ids).await {
            Ok(true) => {}
            Ok(false) => tracing::warn!(
                container = %self.name,
                "a cell interpreter held for a granted call was running again before its release"
            ),
            Err(e) => {
                // An interpreter left stopped would hang the next cell: end them all.
                tracing::warn!(error = %e, "held interpreters could not be resumed; ending them");
                self.end_interpreters().await;
            }
        }
    }

    async fn project(&mut self, plan: ProjectPlan) -> Result<ProjectReport, SessionFault> {
        // The interpreters survive a project call, held stopped through it by the agent (a
        // granted call's hold, or under gVisor its end before the lend, already covers them).
        self.run_project(plan).await
    }

    async fn cell(&mut self, call: CellCall) -> Result<CellOutcome, SessionFault> {
        self.run_cell(call).await
    }

    async fn sweep(&mut self) -> Result<(), SessionFault> {
        self.forget_dead_interpreters().await;
        let mut keep = self.keep.clone();
        keep.extend(self.interpreter_ids());
        let Some(agent) = self.agent.get_mut().ok().and_then(Option::as_mut) else {
            return Err(SessionFault::ended(
                SessionEnd::SESSION_END_BOUNDARY_FAILED,
                "the session's agent is gone",
            ));
        };
        let swept = boundary::agent_sweep(&self.engine, &self.id, agent, self.disk_mb, &keep).await;
        match swept {
            Ok(()) => self.unswept = keep.len() > self.keep.len(),
            // The session ends: its agent goes with it (never a retry).
            Err(_) => drop(self.agent.get_mut().ok().map(Option::take)),
        }
        swept
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

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use std::collections::HashMap;

    use super::*;
    use crate::config::Config;

    fn settings(pairs: &[(&str, &str)]) -> Settings {
        let mut env: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        env.insert("SANDBOX_PROVIDER".into(), "docker".into());
        env.insert("PLIMSOLL_INSECURE".into(), "1".into());
        Settings::from_config(&Config::from_env(&env).unwrap()).unwrap()
    }

    #[test]
    fn without_yama_runc_sessions_withhold_ptrace_or_are_refused() {
        let default = settings(&[]);
        // Yama restricts ptrace: the operator's setting stands.
        assert_eq!(session_seccomp(&default, None, 1).unwrap(), None);
        // No Yama (or 0): docker's default gives way to the shipped profile.
        assert_eq!(
            session_seccomp(&default, None, 0).unwrap(),
            Some(seccomp::PROFILE_JSON)
        );
        let unconfined = settings(&[("SANDBOX_DOCKER_SECCOMP", "unconfined")]);
        assert!(session_seccomp(&unconfined, Some("unconfined"), 0).is_err());
        let shipped = settings(&[("SANDBOX_DOCKER_SECCOMP", "/p.json")]);
        assert_eq!(
            session_seccomp(&shipped, Some(seccomp::PROFILE_JSON), 0).unwrap(),
            Some(seccomp::PROFILE_JSON)
        );
        let lax = r#"{"defaultAction":"SCMP_ACT_ALLOW","syscalls":[]}"#;
        assert!(session_seccomp(&shipped, Some(lax), 0).is_err());
        let runsc = settings(&[("SANDBOX_DOCKER_RUNTIME", "runsc")]);
        assert_eq!(session_seccomp(&runsc, None, 0).unwrap(), None);
    }
}
