//! Sessions on e2b (providers.md §9, grants.md §6.7): one microVM per session, stamped
//! `session=1` and `expires`, its paid seconds reserved for the whole lifetime at open.
//!
//! - open: the same secure create and read-back as a one-shot run; then, as root, the
//!   template's ways for `user` to become root are removed and, as `user`, it is proven that
//!   none is left (the caller's code always runs as `user`; the cleanup runs as root);
//! - before each call: `connect` if the idle watcher paused it, then the read-back again
//!   (ours, running, the envelope, and the network exactly as the session's mode wants it);
//!   any difference ends the session;
//! - the calls: snippets and projects exactly as one-shot runs, files staying in the VM;
//!   granted ones reach the guard as `E2B_SESSION_GRANTS` says: `session` makes the VM with
//!   the guard rule and the session's token (401 between calls), `call` puts the rule on for
//!   the call (`PUT /sandboxes/{id}/network`) with a token the broker minted for that call
//!   alone (`Provider::session_call_tokens`; 401 once it is answered) and plain deny-all
//!   back after it;
//! - after each call: root kills every process of `user` and measures `user`'s files;
//! - suspend is E2B's pause (its admission slot is given back: a paused VM runs nothing); the
//!   end is the kill.
//!
//! Cells ([`super::cells`]): python and javascript interpreters as `user`, kept between calls
//! and spared by the sweep, ended before project calls, granted calls and a suspend.

use std::ops::ControlFlow;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use plimsoll::refusal::Refusal;
use plimsoll::wire::{ProjectOutcome, SessionEnd};

use super::api::Network;
use super::config::SessionGrants;
use super::envd::{Command, Ending, Envd};
use super::runs::{self, RunError};
use super::sandbox::{GuardRule, Vm};
use super::{E2b, E2bError, Guard};
use crate::admission::paid::Paid;
use crate::grant::GuestGrant;
use crate::provider::docker::project::MAX_TIMEOUT;
use crate::provider::docker::settings::SNIPPET_MAX_TIMEOUT;
use crate::provider::guest::cell::Interpreter;
use crate::provider::session::{LOST_SETTLE, settle};
use crate::provider::{
    CellCall, CellOutcome, Hold, OpenedSession, ProjectPlan, ProjectReport, ProviderError,
    SessionFault, SessionOpen, SessionSandbox, SnippetOutcome,
};

/// The sweep, run by root's node after each call.
const SWEEP: &str = include_str!("session_sweep.js");
/// Where the sweep is written (root's, so `user` cannot change it).
const SWEEP_FILE: &str = "/root/plimsoll-session-sweep.js";
/// The budget of the sweep and of the open's checks.
const BOUNDARY_BUDGET: Duration = Duration::from_secs(20);
/// What those may print (nothing of it is trusted).
const BOUNDARY_OUTPUT_CAP: usize = 4096;
/// The most entries the sweep walks.
const MAX_ENTRIES: &str = "200000";
/// Where `user`'s files can be.
const USER_DIRS: [&str; 2] = ["/home/user", "/tmp"];
/// As root: takes away every sudo rule (E2B's templates let `user` sudo) and `user`'s
/// membership of the groups that grant it.
const SEAL: &str = "rm -f /etc/sudoers.d/* 2>/dev/null; \
    if command -v gpasswd >/dev/null 2>&1; then \
      for g in sudo wheel admin; do gpasswd -d user \"$g\" >/dev/null 2>&1; done; \
    fi; \
    chown root:root /root 2>/dev/null; chmod 700 /root; exit 0";
/// As `user`: proves it is not root and that sudo does not make it root.
const CHECK: &str = "[ \"$(id -u)\" != 0 ] || exit 3; \
    if command -v sudo >/dev/null 2>&1 && sudo -n true </dev/null >/dev/null 2>&1; then exit 4; fi; \
    exit 0";
/// What E2B's own timeout adds past the session's lifetime while it runs.
const LIFETIME_SLACK: Duration = Duration::from_secs(60);
/// What the caller is told when the VM went away under a call.
const STOPPED_DURING_CALL: &str = "the session's VM stopped during the call";
/// How often E2B is asked whether a VM whose stream was just lost is gone (for up to
/// [`LOST_SETTLE`]: E2B, like its simulator, notices a dead VM a moment after its streams
/// drop).
const END_POLL: Duration = Duration::from_millis(250);

/// One session's VM.
pub struct E2bSession {
    /// The VM, until the session's end kills it.
    vm: Option<Vm>,
    /// The same envd as root: the cleanup and the checks.
    pub(super) root: Envd,
    /// The live cell interpreters, at most one per language.
    pub(super) interpreters: Vec<Interpreter>,
    /// The cell languages the template runs (proven at startup).
    pub(super) languages: Vec<String>,
    grants: SessionGrants,
    guard: Option<Guard>,
    /// `E2B_GUARD_ADDRESS`.
    guard_address: Option<std::net::Ipv4Addr>,
    /// Made with the guard rule and the session's token (`E2B_SESSION_GRANTS=session`).
    guarded: bool,
    /// Paused by the idle watcher; the next call resumes it.
    paused: bool,
    /// A call's rule could not be taken off again: the session ends at the sweep.
    rule_left: bool,
    disk_mb: u32,
    /// Whether guest code may have run since the last sweep: an interpreter outlived it (its
    /// code runs between calls, and what it starts stays even once the interpreter is gone).
    unswept: bool,
    /// When the session's lifetime ends (E2B's timeout is set past it on every resume).
    ends_at: SystemTime,
    environment: String,
}

/// Opens a session VM for `open`.
pub(super) async fn open(e2b: &E2b, open: SessionOpen) -> Result<OpenedSession, ProviderError> {
    let ends_at = SystemTime::now() + open.lifetime;
    let expires = ends_at
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs()
        .to_string();
    // `session` mode: the rule goes on at the create, a running VM's network being the
    // vendor's to change; without a slot (grants off) the VM stays deny-all.
    let token = open
        .guard_token
        .as_ref()
        .filter(|_| e2b.session_grants == SessionGrants::Session);
    let rule = match (&e2b.guard, token) {
        (Some(guard), Some(token)) => Some(GuardRule {
            host: &guard.host,
            token: token.expose(),
        }),
        _ => None,
    };
    let guarded = rule.is_some();
    // The session's admission slot is the table's; the VM holds only its paid reservation
    // (admission's, or for the daemon's own startup proof one on the daemon's day).
    let paid = open
        .paid
        .unwrap_or_else(|| Arc::new(Paid::own(&e2b.paid, open.lifetime)));
    let vm = e2b
        .vm(
            open.lifetime,
            Hold::paid_only(paid),
            rule,
            &[("session", "1".to_owned()), ("expires", expires)],
        )
        .await?;
    let root = vm
        .envd
        .as_root()
        .map_err(|e| ProviderError::infrastructure(E2bError::Client(e.to_string())))?;
    let languages = e2b.proof.proven().languages;
    let session = E2bSession {
        vm: Some(vm),
        root,
        interpreters: Vec::new(),
        languages,
        grants: e2b.session_grants,
        guard: e2b.guard.clone(),
        guard_address: e2b.guard_address,
        guarded,
        paused: false,
        rule_left: false,
        unswept: false,
        disk_mb: open.disk_mb,
        ends_at,
        environment: e2b.environment.clone(),
    };
    // A failed seal drops the VM, which kills it.
    session
        .seal()
        .await
        .map_err(|detail| ProviderError::infrastructure(format!("e2b session open: {detail}")))?;
    let instance = session.instance();
    tracing::info!(sandbox = %session.id(), "e2b session VM verified");
    Ok(OpenedSession {
        environment: e2b.environment.clone(),
        software_identity: String::new(),
        instance,
        sandbox: Box::new(session),
    })
}

fn boundary(cmd: &'static str, args: &'static [&'static str]) -> Command<'static> {
    Command {
        cmd,
        args,
        cwd: None,
        envs: &[],
        timeout: BOUNDARY_BUDGET,
        stdout_cap: BOUNDARY_OUTPUT_CAP,
        stderr_cap: BOUNDARY_OUTPUT_CAP,
    }
}

impl E2bSession {
    /// Before a project call or a granted one: ends the kept interpreters and, when any
    /// lived since the last sweep, sweeps, so nothing they started (gone themselves or not)
    /// is left to see the runner's key or meet the grant. A dirty sweep ends the session.
    async fn clear_kept(&mut self) -> Result<(), SessionFault> {
        if self.end_interpreters().await || self.unswept {
            self.sweep().await?;
        }
        Ok(())
    }

    pub(super) fn vm(&self) -> Result<&Vm, SessionFault> {
        self.vm.as_ref().ok_or_else(|| {
            SessionFault::ended(
                SessionEnd::SESSION_END_SANDBOX_CHANGED,
                "the session's VM is gone",
            )
        })
    }

    fn id(&self) -> &str {
        self.vm.as_ref().map(Vm::id).unwrap_or_default()
    }

    fn instance(&self) -> String {
        format!("e2b-sandbox:{}", self.id())
    }

    /// Removes the template's ways to root as root, then proves as `user` that none is left.
    async fn seal(&self) -> Result<(), String> {
        let vm = self.vm().map_err(|e| e.to_string())?;
        let sealed = self
            .root
            .run(&boundary("sh", &["-c", SEAL]))
            .await
            .map_err(|e| format!("the seal could not run as root: {e}"))?;
        if sealed.ending != Ending::Exited(0) {
            return Err(format!("the seal ended with {:?}", sealed.ending));
        }
        self.root
            .upload(&[(SWEEP_FILE.to_owned(), SWEEP.as_bytes().to_vec())])
            .await
            .map_err(|e| format!("the sweep could not be staged: {e}"))?;
        let checked = vm
            .envd
            .run(&boundary("sh", &["-c", CHECK]))
            .await
            .map_err(|e| format!("the user check could not run: {e}"))?;
        match checked.ending {
            Ending::Exited(0) => Ok(()),
            other => Err(format!("`user` can still become root ({other:?})")),
        }
    }

    /// The guard rule the read-back must show: the session's, only when made with it.
    fn expected_guard_host(&self) -> Option<&str> {
        match (&self.guard, self.guarded) {
            (Some(guard), true) => Some(guard.host.as_str()),
            _ => None,
        }
    }

    /// Reads the VM back: gone, paused by someone else, not ours, outside the envelope or
    /// with a rule it should not have ends the session; an unanswered read-back only
    /// refuses the call.
    async fn verify(&self) -> Result<(), SessionFault> {
        let vm = self.vm()?;
        let fleet = vm.fleet();
        let detail = match fleet.api.detail(vm.id()).await {
            Ok(Some(detail)) => detail,
            Ok(None) => {
                return Err(SessionFault::ended(
                    SessionEnd::SESSION_END_SANDBOX_CHANGED,
                    "the session's VM is gone",
                ));
            }
            Err(e) => {
                tracing::warn!(error = %e, "E2B did not answer the session's read-back");
                return Err(SessionFault::Refused(Refusal::Environment(
                    "E2B did not answer the session's read-back; nothing ran".to_owned(),
                )));
            }
        };
        if !fleet.ours(&detail, vm.lease()) {
            return Err(SessionFault::ended(
                SessionEnd::SESSION_END_SANDBOX_CHANGED,
                "the session's VM no longer reads back as this daemon's",
            ));
        }
        if detail.state != "running" {
            return Err(SessionFault::ended(
                SessionEnd::SESSION_END_SANDBOX_CHANGED,
                "the session's VM was paused by someone else",
            ));
        }
        if let Some(mismatch) = fleet.mismatch(&detail, self.expected_guard_host()) {
            tracing::warn!(%mismatch, "the session's VM read back differently");
            return Err(SessionFault::ended(
                SessionEnd::SESSION_END_SANDBOX_CHANGED,
                "the session's VM no longer reads back as it was opened",
            ));
        }
        Ok(())
    }

    /// The session's end when the VM is gone or not running, else `None`.
    async fn gone(&self) -> Option<SessionEnd> {
        let vm = self.vm.as_ref()?;
        match vm.fleet().api.detail(vm.id()).await {
            Ok(None) => Some(SessionEnd::SESSION_END_SANDBOX_CHANGED),
            Ok(Some(d)) if d.state != "running" => Some(SessionEnd::SESSION_END_SANDBOX_CHANGED),
            _ => None,
        }
    }

    /// [`Self::gone`] after a call lost its stream: asked again for up to [`LOST_SETTLE`].
    async fn gone_settled(&self) -> Option<SessionEnd> {
        settle(LOST_SETTLE, END_POLL, || async {
            match self.gone().await {
                Some(end) => ControlFlow::Break(Some(end)),
                None => ControlFlow::Continue(None),
            }
        })
        .await
    }

    /// A call that failed outside the guest: the session's end when the VM went away, else
    /// an infrastructure error (the detail goes to the log only).
    pub(super) async fn lost(&self, cause: impl Into<crate::provider::Cause>) -> SessionFault {
        match self.gone_settled().await {
            Some(reason) => SessionFault::ended(reason, STOPPED_DURING_CALL),
            None => SessionFault::infrastructure(cause),
        }
    }

    async fn run_fault(&self, e: RunError) -> SessionFault {
        self.lost(E2bError::Run(e)).await
    }

    /// Resumes a paused VM with E2B's timeout set past the session's end; new tokens in the
    /// answer replace the old ones.
    async fn resume(&mut self) -> Result<(), String> {
        let vm = self.vm.as_mut().ok_or("the session's VM is gone")?;
        let left = self
            .ends_at
            .duration_since(SystemTime::now())
            .unwrap_or_default();
        let created = vm
            .fleet()
            .api
            .connect(vm.id(), left + LIFETIME_SLACK)
            .await
            .map_err(|e| e.to_string())?
            .ok_or("the paused VM is gone")?;
        if let (Some(access), Some(traffic)) =
            (created.envd_access_token, created.traffic_access_token)
        {
            vm.envd = vm
                .fleet()
                .envd_for(vm.id(), &access, &traffic)
                .map_err(|e| e.to_string())?;
            self.root = vm.envd.as_root().map_err(|e| e.to_string())?;
        }
        self.paused = false;
        Ok(())
    }

    /// A granted call's client library (no token in it), the network put on for it in
    /// `call` mode, or the refusal the mode gives (grants.md §6.7).
    async fn grant(&mut self, grant: Option<&GuestGrant>) -> Result<Option<String>, SessionFault> {
        let Some(grant) = grant else { return Ok(None) };
        let (Some(guard), Some(token)) = (&self.guard, grant.access.guard_token()) else {
            return Err(unsupported(
                "this e2b session has no way to the guard; nothing ran",
            ));
        };
        match self.grants {
            SessionGrants::Off => {
                return Err(unsupported(
                    "e2b sessions take no granted calls unless E2B_SESSION_GRANTS is set; nothing ran",
                ));
            }
            SessionGrants::Session if !self.guarded => {
                return Err(unsupported(
                    "this e2b session was opened without its guard rule; nothing ran",
                ));
            }
            SessionGrants::Session | SessionGrants::Call => {}
        }
        // Before any rule goes on: an unknown guard address refuses the call as it is.
        let library = super::guard_library(grant, guard, self.guard_address).await?;
        if self.grants == SessionGrants::Call {
            let vm = self.vm()?;
            let rule = GuardRule {
                host: &guard.host,
                token: token.expose(),
            };
            let put = vm.fleet().api.set_network(vm.id(), &rule.network()).await;
            // What E2B holds, not what was sent: the call runs only under the rule as asked
            // (the guard's name alone, no nameserver).
            let held = match put {
                Err(e) => Err(e),
                Ok(()) => Ok(match vm.fleet().api.detail(vm.id()).await {
                    Ok(Some(detail)) => vm.fleet().mismatch(&detail, Some(&guard.host)),
                    Ok(None) => Some("the VM is gone".to_owned()),
                    Err(e) => Some(format!("no read-back ({e})")),
                }),
            };
            // A put that failed may still have been applied: the sweep takes the rule off.
            self.rule_left = true;
            match held {
                Err(e) => {
                    tracing::warn!(error = %e, "the call's guard rule could not be put on");
                    return Err(SessionFault::Refused(Refusal::Environment(
                        "E2B did not take the call's network rule; nothing ran".to_owned(),
                    )));
                }
                Ok(Some(mismatch)) => {
                    tracing::warn!(%mismatch, "the call's network rule did not read back as put on");
                    return Err(SessionFault::Refused(Refusal::Environment(
                        "the call's network rule did not read back as put on; nothing ran"
                            .to_owned(),
                    )));
                }
                Ok(None) => {}
            }
        }
        Ok(Some(library))
    }

    /// Puts plain deny-all back after a `call`-mode grant; a failure leaves `rule_left` set
    /// and the sweep ends the session.
    async fn take_rule_off(&mut self) {
        if !self.rule_left || self.grants != SessionGrants::Call {
            return;
        }
        let Some(vm) = self.vm.as_ref() else { return };
        match vm
            .fleet()
            .api
            .set_network(vm.id(), &Network::deny_all())
            .await
        {
            Ok(()) => self.rule_left = false,
            Err(e) => tracing::warn!(error = %e, "the call's guard rule could not be taken off"),
        }
    }
}

fn unsupported(why: &str) -> SessionFault {
    SessionFault::Refused(Refusal::Unsupported(why.to_owned()))
}

#[async_trait::async_trait]
impl SessionSandbox for E2bSession {
    async fn prepare(&mut self) -> Result<(), SessionFault> {
        if self.paused
            && let Err(e) = self.resume().await
        {
            tracing::warn!(error = %e, "e2b session resume failed");
            return Err(match self.gone().await {
                Some(reason) => SessionFault::ended(reason, "the paused session's VM is gone"),
                None => SessionFault::ended(
                    SessionEnd::SESSION_END_BOUNDARY_FAILED,
                    "the suspended session could not be resumed",
                ),
            });
        }
        self.verify().await
    }

    async fn snippet(
        &mut self,
        code: String,
        timeout: Duration,
        grant: Option<Arc<GuestGrant>>,
    ) -> Result<SnippetOutcome, SessionFault> {
        if grant.is_some() {
            // A kept interpreter must not run inside the call's window to the guard.
            self.clear_kept().await?;
        }
        let library = self.grant(grant.as_deref()).await;
        let library = match library {
            Ok(library) => library,
            Err(fault) => {
                self.take_rule_off().await;
                return Err(fault);
            }
        };
        let timeout = timeout.min(SNIPPET_MAX_TIMEOUT);
        let ran = runs::snippet(self.vm()?, &code, timeout, library.as_deref()).await;
        self.take_rule_off().await;
        let ran = match ran {
            Ok(ran) => ran,
            Err(e) => return Err(self.run_fault(e).await),
        };
        let (stdout, stdout_truncated) = ran.finished.stdout.into_parts();
        let (stderr, stderr_truncated) = ran.finished.stderr.into_parts();
        Ok(SnippetOutcome {
            stdout,
            stderr,
            exit_code: ran.exit_code,
            timed_out: ran.finished.ending == Ending::TimedOut,
            stdout_truncated,
            stderr_truncated,
            duration: ran.finished.duration,
            environment: self.environment.clone(),
            software_identity: String::new(),
            instance: self.instance(),
        })
    }

    async fn project(&mut self, plan: ProjectPlan) -> Result<ProjectReport, SessionFault> {
        // A kept interpreter runs as `user` like the runner and must not see its report key.
        self.clear_kept().await?;
        let library = match self.grant(plan.grant.as_deref()).await {
            Ok(library) => library,
            Err(fault) => {
                self.take_rule_off().await;
                return Err(fault);
            }
        };
        let budget = plan.timeout.min(MAX_TIMEOUT);
        let ran = runs::project(self.vm()?, &plan, budget, library.as_deref()).await;
        self.take_rule_off().await;
        let result = match ran {
            Ok(result) => result,
            Err(e) => return Err(self.run_fault(e).await),
        };
        // A step lost with its VM ends the session rather than answering.
        if result.outcome == ProjectOutcome::PROJECT_OUTCOME_RUNNER_FAILED
            && let Some(reason) = self.gone_settled().await
        {
            return Err(SessionFault::ended(reason, STOPPED_DURING_CALL));
        }
        Ok(ProjectReport {
            result,
            environment: self.environment.clone(),
            software_identity: String::new(),
            instance: self.instance(),
        })
    }

    async fn sweep(&mut self) -> Result<(), SessionFault> {
        if self.rule_left {
            return Err(SessionFault::ended(
                SessionEnd::SESSION_END_BOUNDARY_FAILED,
                "the call's network rule could not be taken off",
            ));
        }
        let disk_bytes = (u64::from(self.disk_mb) * 1024 * 1024).to_string();
        let kept = self.interpreter_ids();
        let keep = if kept.is_empty() {
            "-".to_owned()
        } else {
            kept.join(",")
        };
        let mut args = vec![
            SWEEP_FILE,
            super::envd::USER,
            &disk_bytes,
            MAX_ENTRIES,
            &keep,
        ];
        args.extend(USER_DIRS);
        let ran = self
            .root
            .run(&Command {
                cmd: "node",
                args: &args,
                cwd: None,
                envs: &[],
                timeout: BOUNDARY_BUDGET,
                stdout_cap: BOUNDARY_OUTPUT_CAP,
                stderr_cap: BOUNDARY_OUTPUT_CAP,
            })
            .await;
        let exit = match &ran {
            Ok(finished) => match finished.ending {
                Ending::Exited(code) => Some(code),
                _ => None,
            },
            Err(e) => {
                tracing::warn!(error = %e, "e2b session sweep could not run");
                None
            }
        };
        match exit {
            Some(0) => {
                self.unswept = !kept.is_empty();
                Ok(())
            }
            Some(10) | Some(11) => Err(SessionFault::ended(
                SessionEnd::SESSION_END_DISK_EXCEEDED,
                "the session's files went over its disk budget",
            )),
            other => {
                tracing::warn!(exit = ?other, "e2b session sweep did not prove the call boundary");
                let reason = self
                    .gone()
                    .await
                    .unwrap_or(SessionEnd::SESSION_END_BOUNDARY_FAILED);
                Err(SessionFault::ended(
                    reason,
                    "the between-calls cleanup could not be proven",
                ))
            }
        }
    }

    async fn cell(&mut self, call: CellCall) -> Result<CellOutcome, SessionFault> {
        self.run_cell(call).await
    }

    async fn suspend(&mut self) -> Result<(), SessionFault> {
        // The relay's envd stream does not survive a pause: the next cell starts afresh.
        self.end_interpreters().await;
        let vm = self.vm()?;
        match vm.fleet().api.pause(vm.id()).await {
            Ok(()) => {
                self.paused = true;
                Ok(())
            }
            Err(e) => {
                tracing::warn!(error = %e, "e2b session pause failed");
                Err(SessionFault::ended(
                    SessionEnd::SESSION_END_BOUNDARY_FAILED,
                    "the idle session could not be suspended",
                ))
            }
        }
    }

    /// A paused E2B VM runs nothing and is not billed for compute.
    fn suspend_frees_slot(&self) -> bool {
        true
    }

    async fn finish(&mut self) {
        if let Some(vm) = self.vm.take() {
            let (id, lease) = (vm.id().to_owned(), vm.lease().to_owned());
            vm.fleet().kill_and_release(&id, &lease).await;
            tracing::info!(sandbox = %id, "e2b session VM killed");
            // Its drop asks E2B once more (a 404 is done) and settles the paid reservation.
            drop(vm);
        }
    }
}
