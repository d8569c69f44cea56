//! What the providers of a proven remote VM (`e2b`, `dockercloud`) share: the startup proof's
//! probe and how its report is judged, the readiness the proof sets (tier `vm` only once it
//! passed), the `Describe` of a VM per run, and the end of a project's run (the artifacts
//! within their budget, the outcome).

use std::collections::BTreeMap;
use std::sync::RwLock;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use plimsoll::refusal::Refusal;
use plimsoll::tier::IsolationTier;
use plimsoll::wire::{Artifact, ProjectFile, ProjectOutcome, ProjectResult, StepResult};
use serde::Deserialize;

use super::docker::project::{DEFAULT_TIMEOUT, MAX_TIMEOUT};
use super::docker::settings::{SNIPPET_DEFAULT_TIMEOUT, SNIPPET_MAX_TIMEOUT};
use super::e2b::config::BaseUrl;
use super::{Description, Environment, ProviderError, Resources};

/// The probe both proofs run: node's version, its cwd, python3's presence, egress attempts.
pub const PROBE: &str = include_str!("e2b/smoke_probe.cjs");
pub const PROBE_FILE: &str = "/tmp/plimsoll-smoke-probe.cjs";
pub const STEP_FILE: &str = "/tmp/plimsoll-smoke-step.sh";
/// The step: python3's presence as the probe's argument, then node in the shell's place.
pub const STEP: &str = "if command -v python3 >/dev/null 2>&1; then py=1; else py=0; fi\nexec node /tmp/plimsoll-smoke-probe.cjs \"$py\"\n";
/// The whole of a project's artifacts (grants.md §6.4, §7.5).
const ARTIFACTS_CAP: usize = 8 << 20;
/// How long past the call's budget its artifacts may still be read: a guest that leaves a
/// FIFO (or a stalled writer) at an artifact's path must not hold the call, its admission
/// slot and a paid sandbox (or a session's turn) for every download's own bound.
pub const ARTIFACTS_GRACE: Duration = Duration::from_secs(30);

/// A failed check of a startup proof.
#[derive(Debug, thiserror::Error)]
#[error("startup proof check {check:?} failed: {detail}")]
pub struct Check {
    pub check: &'static str,
    pub detail: String,
}

/// A failed check named `check`.
pub fn check(check: &'static str, detail: impl Into<String>) -> Check {
    Check {
        check,
        detail: detail.into(),
    }
}

#[derive(Deserialize)]
struct Report {
    node: String,
    cwd: String,
    python: bool,
    egress: BTreeMap<String, String>,
}

/// What a proof found.
#[derive(Debug, Clone, Default)]
pub struct Proven {
    /// The languages a project can use (JavaScript first).
    pub languages: Vec<String>,
    /// node's version, for the log.
    pub node: String,
}

/// Judges the probe's report (its stdout, run as a step in `project_dir`): the step's cwd
/// and every egress attempt blocked.
pub fn judge(stdout: &[u8], project_dir: &str) -> Result<Proven, Check> {
    let report: Report = serde_json::from_str(String::from_utf8_lossy(stdout).trim())
        .map_err(|e| check("probe", format!("its report could not be read: {e}")))?;
    if report.cwd != project_dir {
        return Err(check(
            "cwd",
            format!("a step ran in {:?}, not {project_dir}", report.cwd),
        ));
    }
    if report.egress.len() != 2 || report.egress.values().any(|v| v != "blocked") {
        return Err(check(
            "egress",
            format!("a VM reached the outside world: {:?}", report.egress),
        ));
    }
    let mut languages = vec!["javascript".to_owned()];
    if report.python {
        languages.push("python".to_owned());
    }
    Ok(Proven {
        languages,
        node: report.node,
    })
}

/// Whether the startup proof passed, and what it found. Nothing runs before it passed.
pub struct Proof {
    /// The provider id, for refusals.
    id: &'static str,
    proven: RwLock<Option<Proven>>,
    ready: AtomicBool,
}

impl Proof {
    pub fn new(id: &'static str) -> Proof {
        Proof {
            id,
            proven: RwLock::new(None),
            ready: AtomicBool::new(false),
        }
    }

    /// Records a passed proof; the provider is ready from here on.
    pub fn passed(&self, proven: Proven) {
        *self.proven.write().unwrap_or_else(|e| e.into_inner()) = Some(proven);
        self.ready.store(true, Ordering::Release);
    }

    pub fn is_ready(&self) -> bool {
        self.ready.load(Ordering::Acquire)
    }

    /// What the proof found (nothing before it passed).
    pub fn proven(&self) -> Proven {
        self.proven
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
            .unwrap_or_default()
    }

    /// `Provider::ready`: configured and proven, nothing asked of the vendor.
    pub fn ready(&self) -> Result<(), String> {
        if self.is_ready() {
            Ok(())
        } else {
            Err(format!("the {} startup proof has not passed", self.id))
        }
    }

    /// `Provider::current_tier`: a VM once proven, nothing before.
    pub fn tier(&self) -> IsolationTier {
        if self.is_ready() {
            IsolationTier::Vm
        } else {
            IsolationTier::None
        }
    }

    /// Refuses a run before the proof passed.
    pub fn refuse_unproven(&self) -> Result<(), ProviderError> {
        if self.is_ready() {
            return Ok(());
        }
        Err(ProviderError::Refused(Refusal::Environment(format!(
            "the {} provider has not passed its startup proof; nothing ran",
            self.id
        ))))
    }

    /// The `Describe` of a VM per run: snippets and projects (and sessions when `sessions`),
    /// grants through the guard when one is configured, the proven project languages; `max`
    /// caps each kind's timeout.
    pub fn describe(
        &self,
        identity: &str,
        guarded: bool,
        sessions: bool,
        resources: Resources,
        max: impl Fn(Duration) -> Duration,
    ) -> Description {
        let environment = |default: Duration, most: Duration, languages: Vec<String>| {
            let most = max(most);
            Environment {
                identity: identity.to_owned(),
                default_timeout_ms: duration_ms(default.min(most)),
                max_timeout_ms: duration_ms(most),
                software_identity: String::new(),
                languages,
            }
        };
        let proven = self.proven();
        Description {
            sandbox: self.id,
            supports_project: true,
            supports_javascript_grants: guarded,
            supports_project_grants: guarded,
            javascript: environment(
                SNIPPET_DEFAULT_TIMEOUT,
                SNIPPET_MAX_TIMEOUT,
                vec!["javascript".to_owned()],
            ),
            project: environment(DEFAULT_TIMEOUT, MAX_TIMEOUT, proven.languages.clone()),
            supports_sessions: sessions,
            // Session calls: snippets, projects and cells in the proven languages.
            session: if sessions {
                environment(DEFAULT_TIMEOUT, MAX_TIMEOUT, proven.languages)
            } else {
                Environment::default()
            },
            resources,
            ..Description::default()
        }
    }
}

fn duration_ms(d: Duration) -> u32 {
    u32::try_from(d.as_millis()).unwrap_or(u32::MAX)
}

/// The path of step `i`'s script in a VM.
pub fn step_script(i: usize) -> String {
    format!("/tmp/plimsoll-step-{i}.sh")
}

/// What a project stages in one upload: its files under `project_dir` (an empty `.plimsoll`
/// there when it has none, so the directory every step runs in exists), each step's script,
/// and a granted project's client library as `(path, text)`.
pub fn staged_files(
    files: &[ProjectFile],
    steps: &[String],
    project_dir: &str,
    library: Option<(&str, &str)>,
) -> Vec<(String, Vec<u8>)> {
    let mut staged: Vec<(String, Vec<u8>)> = files
        .iter()
        .map(|f| {
            (
                format!("{project_dir}/{}", f.path),
                f.content.as_bytes().to_vec(),
            )
        })
        .collect();
    if staged.is_empty() {
        staged.push((format!("{project_dir}/.plimsoll"), Vec::new()));
    }
    for (i, step) in steps.iter().enumerate() {
        staged.push((step_script(i), step.as_bytes().to_vec()));
    }
    if let Some((path, text)) = library {
        staged.push((path.to_owned(), text.as_bytes().to_vec()));
    }
    staged
}

/// What reading one artifact gave.
pub enum Read {
    Content(Vec<u8>),
    Absent,
    /// Over the limit asked for.
    TooLarge,
    Failed(String),
}

/// The asked artifacts (paths in `project_dir`) that exist, within the total cap: what does
/// not fit is dropped and flagged. `read(path, limit)` reads one; every read ends by `until`
/// (the call's budget and [`ARTIFACTS_GRACE`]), and one that has not is counted as failed.
pub async fn artifacts<F, Fut>(
    sandbox: &str,
    project_dir: &str,
    asked: &[String],
    until: Instant,
    mut read: F,
) -> (Vec<Artifact>, bool)
where
    F: FnMut(String, usize) -> Fut,
    Fut: Future<Output = Read>,
{
    let until = tokio::time::Instant::from_std(until);
    let mut found = Vec::new();
    let mut left = ARTIFACTS_CAP;
    let mut truncated = false;
    for path in asked {
        // One byte over what is left tells "does not fit" from "fits exactly".
        let late = || Read::Failed("the call's time for its artifacts ran out".to_owned());
        let got = if tokio::time::Instant::now() >= until {
            late()
        } else {
            let one = read(format!("{project_dir}/{path}"), left + 1);
            tokio::time::timeout_at(until, one)
                .await
                .unwrap_or_else(|_| late())
        };
        match got {
            Read::Content(content) if content.len() <= left => {
                left -= content.len();
                found.push(Artifact {
                    path: path.clone(),
                    content,
                    ..Default::default()
                });
            }
            Read::Content(_) | Read::TooLarge => truncated = true,
            Read::Absent => {}
            Read::Failed(e) => {
                tracing::warn!(sandbox = %sandbox, error = %e, "an artifact could not be read");
                truncated = true;
            }
        }
    }
    (found, truncated)
}

/// How one project step's run ended, as the provider saw it.
pub enum StepRan {
    /// The step ended with this result (`timed_out` set when its deadline ended it; the
    /// command is filled in by [`run_steps`]).
    Ended(StepResult),
    /// The sandbox failed or ended while the step ran: why.
    Lost(String),
}

/// Runs a project's `commands` in order, step `i` by `run(i, left)` with what is left of
/// `budget` since `started`, stopping after a step that failed. `Ok(steps)` when they ran;
/// `Err(answer)` when the budget ended them or the sandbox was lost mid-step, `answer` being
/// the project's whole result (a lost step's code ran and its effects are unknown).
pub async fn run_steps<F, Fut, E>(
    provider: &'static str,
    sandbox: &str,
    commands: &[String],
    (started, budget): (Instant, Duration),
    mut run: F,
) -> Result<Result<Vec<StepResult>, ProjectResult>, E>
where
    F: FnMut(usize, Duration) -> Fut,
    Fut: Future<Output = Result<StepRan, E>>,
{
    let mut steps = Vec::new();
    for (i, command) in commands.iter().enumerate() {
        let left = budget.saturating_sub(started.elapsed());
        if left.is_zero() {
            return Ok(Err(timed_out(steps)));
        }
        let mut step = match run(i, left).await? {
            StepRan::Ended(step) => step,
            StepRan::Lost(why) => {
                tracing::warn!(provider, sandbox = %sandbox, step = i + 1, error = %why, "a project step was lost");
                return Ok(Err(outcome(
                    ProjectOutcome::PROJECT_OUTCOME_RUNNER_FAILED,
                    format!(
                        "the sandbox failed after step {} began; code ran and its effects are unknown",
                        i + 1
                    ),
                )));
            }
        };
        step.command = command.clone();
        let (step_timed_out, exit_code) = (step.timed_out, step.exit_code);
        steps.push(step);
        if step_timed_out {
            return Ok(Err(timed_out(steps)));
        }
        if exit_code != 0 {
            break;
        }
    }
    Ok(Ok(steps))
}

/// A project's result with no steps to show.
pub fn outcome(outcome: ProjectOutcome, detail: String) -> ProjectResult {
    ProjectResult {
        outcome: outcome.into(),
        outcome_detail: detail,
        ..ProjectResult::default()
    }
}

/// A project the budget ended, with the steps that ran.
pub fn timed_out(steps: Vec<StepResult>) -> ProjectResult {
    ProjectResult {
        steps,
        ..outcome(
            ProjectOutcome::PROJECT_OUTCOME_TIMED_OUT,
            "the run exceeded its time budget".to_owned(),
        )
    }
}

/// A project whose steps all ran (or stopped at a failing one), with its artifacts.
pub fn completed(
    steps: Vec<StepResult>,
    (artifacts, truncated): (Vec<Artifact>, bool),
) -> ProjectResult {
    ProjectResult {
        outcome: ProjectOutcome::PROJECT_OUTCOME_COMPLETED.into(),
        steps,
        artifacts,
        artifacts_truncated: truncated,
        ..ProjectResult::default()
    }
}

/// Where granted VMs reach the guard.
#[derive(Clone)]
pub struct Guard {
    /// The guard URL's host name (the VM's one allowed destination).
    pub host: String,
    /// The guard path's URL the client library posts to.
    pub url: String,
}

impl Guard {
    /// The guard at `base`, its path for this provider `path`.
    pub fn at(base: &BaseUrl, path: &str) -> Guard {
        Guard {
            host: base.server_name().to_owned(),
            url: format!("https://{}{path}", base.server_name()),
        }
    }
}

/// The refusal of a granted run without a guard (`variable` configures one).
pub fn no_guard(id: &str, variable: &str) -> ProviderError {
    ProviderError::Refused(Refusal::Unsupported(format!(
        "the {id} provider reaches grants only through the guard ({variable}); nothing ran"
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn files(paths: &[&str]) -> Vec<ProjectFile> {
        paths
            .iter()
            .map(|path| ProjectFile {
                path: (*path).to_owned(),
                content: format!("// {path}"),
                ..Default::default()
            })
            .collect()
    }

    fn steps() -> Vec<String> {
        vec!["make".to_owned(), "make test".to_owned()]
    }

    fn paths(files: &[(String, Vec<u8>)]) -> Vec<&str> {
        files.iter().map(|(path, _)| path.as_str()).collect()
    }

    /// A guest can leave a FIFO or a stalled writer at an artifact's path: the reads end at
    /// the call's deadline however many were asked, and the answer says some are missing.
    #[tokio::test(start_paused = true)]
    async fn artifact_reads_end_at_the_calls_deadline() {
        let asked = ["a.txt", "fifo", "b.txt"].map(str::to_owned);
        let began = tokio::time::Instant::now();
        let until = Instant::now() + Duration::from_secs(5);
        let (found, truncated) = artifacts("sb", "/p", &asked, until, |path, _| async move {
            if path.ends_with("fifo") {
                std::future::pending::<()>().await;
            }
            Read::Content(path.into_bytes())
        })
        .await;
        assert!(truncated, "a read that never ended is reported");
        let got: Vec<&str> = found.iter().map(|a| a.path.as_str()).collect();
        assert_eq!(got, ["a.txt"], "nothing is read past the deadline");
        assert!(began.elapsed() < Duration::from_secs(6));
    }

    #[test]
    fn a_project_with_files_stages_them_its_steps_and_its_library() {
        let staged = staged_files(
            &files(&["a/b.js"]),
            &steps(),
            "/p",
            Some(("/tmp/lib.mjs", "x")),
        );
        assert_eq!(
            paths(&staged),
            [
                "/p/a/b.js",
                "/tmp/plimsoll-step-0.sh",
                "/tmp/plimsoll-step-1.sh",
                "/tmp/lib.mjs"
            ]
        );
        assert_eq!(staged[0].1, b"// a/b.js");
        assert_eq!(staged[2].1, b"make test");
        assert_eq!(staged[3].1, b"x");
    }

    #[test]
    fn a_project_without_files_still_gets_its_directory() {
        let staged = staged_files(&[], &steps(), "/p", None);
        assert_eq!(
            paths(&staged),
            [
                "/p/.plimsoll",
                "/tmp/plimsoll-step-0.sh",
                "/tmp/plimsoll-step-1.sh"
            ]
        );
        assert!(staged[0].1.is_empty());
    }

    /// Runs three steps whose endings `ends` gives, in order, with a budget of `budget`:
    /// what `run_steps` answered and which steps were started.
    async fn three_steps(
        ends: Vec<Result<StepRan, &'static str>>,
        budget: Duration,
    ) -> (
        Result<Result<Vec<StepResult>, ProjectResult>, &'static str>,
        Vec<usize>,
    ) {
        let commands: Vec<String> = ["one", "two", "three"].map(str::to_owned).to_vec();
        let mut ends = ends.into_iter();
        let mut started = Vec::new();
        let answer = run_steps(
            "test",
            "sandbox",
            &commands,
            (Instant::now(), budget),
            |i, _| {
                started.push(i);
                let end = ends
                    .next()
                    .unwrap_or(Err("a step ran that should not have"));
                async move { end }
            },
        )
        .await;
        (answer, started)
    }

    fn ended(exit_code: i32, timed_out: bool) -> Result<StepRan, &'static str> {
        Ok(StepRan::Ended(StepResult {
            exit_code,
            timed_out,
            ..Default::default()
        }))
    }

    #[tokio::test]
    async fn steps_run_in_order_until_one_fails_and_each_is_named() {
        let (answer, started) = three_steps(
            vec![ended(0, false), ended(2, false)],
            Duration::from_secs(9),
        )
        .await;
        let steps = answer.unwrap().unwrap();
        assert_eq!(started, [0, 1]);
        let names: Vec<&str> = steps.iter().map(|s| s.command.as_str()).collect();
        assert_eq!(names, ["one", "two"]);
        assert_eq!(steps[1].exit_code, 2);
    }

    #[tokio::test]
    async fn a_timed_out_step_or_a_spent_budget_times_the_project_out() {
        let (answer, started) = three_steps(
            vec![ended(0, false), ended(124, true)],
            Duration::from_secs(9),
        )
        .await;
        let result = answer.unwrap().unwrap_err();
        assert_eq!(started, [0, 1]);
        assert_eq!(result.outcome, ProjectOutcome::PROJECT_OUTCOME_TIMED_OUT);
        assert_eq!(result.steps.len(), 2);
        assert!(result.steps[1].timed_out);

        let (answer, started) = three_steps(vec![], Duration::ZERO).await;
        let result = answer.unwrap().unwrap_err();
        assert!(started.is_empty(), "no step starts without budget");
        assert_eq!(result.outcome, ProjectOutcome::PROJECT_OUTCOME_TIMED_OUT);
    }

    #[tokio::test]
    async fn a_lost_step_is_a_runner_failure_naming_it_and_an_error_stays_an_error() {
        let lost = Ok(StepRan::Lost("the VM ended".to_owned()));
        let (answer, started) =
            three_steps(vec![ended(0, false), lost], Duration::from_secs(9)).await;
        let result = answer.unwrap().unwrap_err();
        assert_eq!(started, [0, 1]);
        assert_eq!(
            result.outcome,
            ProjectOutcome::PROJECT_OUTCOME_RUNNER_FAILED
        );
        assert!(
            result.outcome_detail.contains("after step 2 began"),
            "{}",
            result.outcome_detail
        );
        assert!(result.steps.is_empty());

        let (answer, _) = three_steps(vec![Err("no VM")], Duration::from_secs(9)).await;
        assert_eq!(answer.unwrap_err(), "no VM");
    }
}
