//! The startup proof (grants.md §8.6): one throwaway sandbox, made and read back exactly like
//! a run's, must prove from inside that the policy holds: writes succeed only under `/tmp`;
//! no connection leaves and loopback is the only interface; the cgroup holds the requested
//! memory and CPUs; with `SANDBOX_DISK_MB`, `/tmp` is a tmpfs of exactly that size with
//! noexec, nosuid and nodev; a runner round trip works with a plan near the 4 MiB ceiling; a
//! hung command's processes are gone once its exec is cancelled (seen by a second exec); and
//! the runner starts with its guard active, so a step cannot open its plan or report
//! descriptor or its memory. Any failed check refuses the start, naming the check.
//!
//! A step and the runner share the sandbox user here (an exec cannot change its uid), so
//! non-dumpability is what protects the runner. Where the sandbox's kernel still lets the
//! same user open a non-dumpable process's descriptor entries (gVisor does), the proof
//! falls back to the memory check alone and says so: the key never leaves the runner's
//! memory and the plan is read whole before any step starts, so a report still cannot be
//! forged (the same rule docker sessions follow under gVisor).

use std::sync::Arc;
use std::time::Duration;

use plimsoll::wire::ProjectOutcome;
use serde::Deserialize;

use super::exec::{self, Command, Ending};
use super::sandbox::Lease;
use super::{Inner, OpenShellError, Proven, runs};
use crate::provider::docker::settings::OUTPUT_CAP;
use crate::provider::{Hold, ProjectPlan};

/// The probe script, run with `node -`.
const PROBE: &str = include_str!("smoke_probe.js");
/// Every `/proc` entry of the runner a step must fail to open.
pub const PROC_CHECKS_ALL: &[&str] = &["fd/0", "fd/1", "mem", "environ"];
/// The entries where the kernel serves a non-dumpable process's descriptors to its own user.
const PROC_CHECKS_MEMORY: &[&str] = &["mem"];
/// The language probe: JavaScript required, Python optional.
const LANGUAGE_PROBE: &str = "node -e 'console.log(\"javascript\")' && { python3 -c 'print(\"python\")' 2>/dev/null || true; }";
/// The plan of the round trip: files this large in all (the plan is a little more).
const ROUND_TRIP_BYTES: usize = (4 << 20) - (256 << 10);
/// How long the proof's sandbox may live.
const PROOF_LIFETIME: Duration = Duration::from_secs(300);

/// What the probe reported.
#[derive(Debug, Default, Deserialize)]
struct Report {
    mounts: String,
    writable: Vec<String>,
    interfaces: Vec<String>,
    memory_max: String,
    mem_total_kb: String,
    cpu_max: String,
    arch: String,
    /// Yama's `ptrace_scope` as the sandbox's kernel shows it; empty without Yama.
    ptrace_scope: String,
    connect: std::collections::BTreeMap<String, String>,
}

fn failed(check: &'static str, detail: impl Into<String>) -> OpenShellError {
    OpenShellError::Smoke {
        check,
        detail: detail.into(),
    }
}

/// Runs the proof; answers what it established.
pub(super) async fn prove(inner: &Arc<Inner>) -> Result<Proven, OpenShellError> {
    let lease = inner.fleet.lease(PROOF_LIFETIME, Hold::default()).await?;
    let report = probe(&lease).await?;
    judge(inner, &report)?;
    hung_command_is_gone(&lease).await?;
    let (proc_checks, languages) = runner(&lease).await?;
    round_trip(&lease, proc_checks).await?;
    let platform = match report.arch.as_str() {
        "x64" => "linux/amd64",
        "arm64" => "linux/arm64",
        _ => "",
    };
    Ok(Proven {
        languages,
        proc_checks: proc_checks.to_vec(),
        software_identity: super::software_identity(&inner.fleet.envelope.image, platform),
        policy_hash: lease.policy_hash().to_owned(),
    })
}

/// Runs a short command; answers its stdout when it exited 0.
async fn command(
    lease: &Lease,
    check: &'static str,
    argv: &[&str],
    stdin: &[u8],
) -> Result<String, OpenShellError> {
    let finished = exec::run(
        lease.gateway(),
        lease.name(),
        Command {
            argv: argv.iter().map(|s| (*s).to_owned()).collect(),
            env: Default::default(),
            stdin: stdin.to_vec(),
            timeout: Duration::from_secs(30),
            stdout_cap: OUTPUT_CAP,
            stderr_cap: OUTPUT_CAP,
        },
    )
    .await
    .map_err(|e| failed(check, e.to_string()))?;
    match finished.ending {
        Ending::Exited(0) => Ok(String::from_utf8_lossy(finished.stdout.bytes()).into_owned()),
        other => Err(failed(
            check,
            format!(
                "ended {other:?}; stderr {:?}",
                String::from_utf8_lossy(finished.stderr.bytes())
            ),
        )),
    }
}

async fn probe(lease: &Lease) -> Result<Report, OpenShellError> {
    let out = command(lease, "probe", &["node", "-"], PROBE.as_bytes()).await?;
    serde_json::from_str(out.trim()).map_err(|e| failed("probe", format!("{e}: {out:?}")))
}

/// The memory the sandbox holds in bytes: its cgroup's limit or, where its kernel shows no
/// cgroup (gVisor), the total memory that kernel was sized to. Checked: a reported size that
/// wraps must not come out equal to the expected one.
fn held_memory(report: &Report) -> Option<u64> {
    if report.memory_max.is_empty() {
        report
            .mem_total_kb
            .parse::<u64>()
            .ok()
            .and_then(|kb| kb.checked_mul(1024))
    } else {
        report.memory_max.parse::<u64>().ok()
    }
}

fn judge(inner: &Inner, report: &Report) -> Result<(), OpenShellError> {
    let writable: Vec<&String> = report
        .writable
        .iter()
        .filter(|p| *p != "/tmp" && !p.starts_with("/tmp/"))
        .collect();
    if !writable.is_empty() {
        return Err(failed(
            "writes only under /tmp",
            format!("also writable: {writable:?}"),
        ));
    }
    if !report.writable.iter().any(|p| p == "/tmp") {
        return Err(failed("writes only under /tmp", "/tmp is not writable"));
    }
    if report.interfaces != ["lo"] {
        return Err(failed(
            "loopback only",
            format!("interfaces {:?}", report.interfaces),
        ));
    }
    if let Some((target, _)) = report.connect.iter().find(|(_, r)| *r == "connected") {
        return Err(failed(
            "no outbound connection",
            format!("{target} connected"),
        ));
    }
    let resources = &inner.resources;
    let memory = u64::from(resources.memory_mb) * 1024 * 1024;
    let held = held_memory(report);
    if held != Some(memory) {
        return Err(failed(
            "memory limit",
            format!(
                "the sandbox holds {:?} (cgroup) / {:?} kB (total), not {memory} bytes",
                report.memory_max, report.mem_total_kb
            ),
        ));
    }
    if report.cpu_max.is_empty() && report.memory_max.is_empty() {
        // No cgroup is visible from inside (a gVisor kernel): the CPU quota is on the
        // sandbox's host cgroup, and the read-back of `resources` is the only evidence.
        tracing::warn!(
            cpus = resources.cpus,
            "openshell sandboxes show no cgroup inside: the CPU limit rests on the read-back of the sandbox's resources"
        );
    } else {
        let cpus = report
            .cpu_max
            .split_once(' ')
            .and_then(|(q, p)| Some(q.parse::<f64>().ok()? / p.parse::<f64>().ok()?));
        if cpus.is_none_or(|c| (c - resources.cpus).abs() > 0.01) {
            return Err(failed(
                "CPU limit",
                format!(
                    "the cgroup holds {:?}, not {} CPUs",
                    report.cpu_max, resources.cpus
                ),
            ));
        }
    }
    if resources.disk_mb > 0 {
        tmp_is_the_disk(&report.mounts, resources.disk_mb)?;
    }
    if inner.sessions {
        ptrace_is_scoped(&report.ptrace_scope)?;
    }
    Ok(())
}

/// With sessions on, a session's code outlives its call only as the kept processes the
/// sweep checks, and the gateway's exec cannot run a checker under another uid: only
/// Yama's `ptrace_scope` of at least 1 stops that code from tracing the kept `sleep` and
/// surviving the sweep inside it. No Yama (an empty reading) fails as 0 does.
fn ptrace_is_scoped(reading: &str) -> Result<(), OpenShellError> {
    match reading.parse::<u32>() {
        Ok(scope) if scope >= 1 => Ok(()),
        _ => Err(failed(
            "Yama ptrace_scope >= 1 (sessions on)",
            format!(
                "the sandbox's kernel shows ptrace_scope {:?}; sessions on openshell need Yama's ptrace restriction",
                if reading.is_empty() {
                    "absent"
                } else {
                    reading
                }
            ),
        )),
    }
}

/// `/tmp` is a tmpfs of exactly `disk_mb` with noexec, nosuid and nodev.
fn tmp_is_the_disk(mounts: &str, disk_mb: u32) -> Result<(), OpenShellError> {
    let line = mounts
        .lines()
        .rev()
        .find(|l| l.split(' ').nth(1) == Some("/tmp"))
        .ok_or_else(|| failed("/tmp tmpfs", "/tmp is not a mount"))?;
    let fields: Vec<&str> = line.split(' ').collect();
    let options: Vec<&str> = fields
        .get(3)
        .map(|o| o.split(',').collect())
        .unwrap_or_default();
    let size = format!("size={}k", u64::from(disk_mb) * 1024);
    let ok = fields.get(2) == Some(&"tmpfs")
        && ["noexec", "nosuid", "nodev", size.as_str()]
            .iter()
            .all(|want| options.contains(want));
    if !ok {
        return Err(failed(
            "/tmp tmpfs",
            format!("the mount is {line:?}, wanted tmpfs {size},noexec,nosuid,nodev"),
        ));
    }
    Ok(())
}

/// A command whose processes hang is cancelled at its deadline; a second exec must find none
/// of them.
async fn hung_command_is_gone(lease: &Lease) -> Result<(), OpenShellError> {
    let mark = format!("plimsoll-hung-{}", hex::encode(rand::random::<[u8; 6]>()));
    let hang = "const {spawn} = require('child_process');\
                spawn('node', ['-e', 'setInterval(() => {}, 1000)', process.argv[1]], {stdio: 'ignore'});\
                setInterval(() => {}, 1000);";
    let finished = exec::run(
        lease.gateway(),
        lease.name(),
        Command {
            argv: vec!["node".into(), "-e".into(), hang.into(), mark.clone()],
            env: Default::default(),
            stdin: Vec::new(),
            timeout: Duration::from_secs(3),
            stdout_cap: OUTPUT_CAP,
            stderr_cap: OUTPUT_CAP,
        },
    )
    .await
    .map_err(|e| failed("cancelled command ends", e.to_string()))?;
    if finished.ending != Ending::TimedOut {
        return Err(failed(
            "cancelled command ends",
            format!("the hung command ended {:?}", finished.ending),
        ));
    }
    // The mark is split so the looking process's own command line does not carry it.
    let (head, tail) = mark.split_at(8);
    let look = format!(
        "for f in /proc/[0-9]*/cmdline; do if tr '\\0' ' ' <\"$f\" 2>/dev/null | grep -q \"{head}\"'{tail}'; then echo \"$f\"; fi; done"
    );
    let mut last = String::new();
    for _ in 0..20 {
        last = command(lease, "cancelled command ends", &["sh", "-c", &look], b"").await?;
        if last.trim().is_empty() {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    Err(failed(
        "cancelled command ends",
        format!("its processes are still there: {}", last.trim()),
    ))
}

/// The runner through the project run path: its own proof that no step can open its `/proc`
/// entries, a step that tries again from outside, and the languages.
async fn runner(lease: &Lease) -> Result<(&'static [&'static str], Vec<String>), OpenShellError> {
    let mut checks = PROC_CHECKS_ALL;
    for attempt in 0..2 {
        let inspect = format!(
            "for f in {}; do if (: <\"/proc/$PLIMSOLL_RUNNER_PID/$f\") 2>/dev/null; then echo \"runner $f is readable\"; exit 1; fi; done",
            checks.join(" ")
        );
        let plan = ProjectPlan {
            files: Vec::new(),
            steps: vec![inspect, LANGUAGE_PROBE.to_owned()],
            artifacts: Vec::new(),
            timeout: Duration::from_secs(30),
            hold: Hold::default(),
            grant: None,
        };
        let result = runs::project(lease, &plan, plan.timeout, checks).await?;
        let outcome = result.outcome;
        if attempt == 0
            && outcome == ProjectOutcome::PROJECT_OUTCOME_SETUP_FAILED
            && result.outcome_detail.contains("inspectable")
        {
            tracing::warn!(
                detail = %result.outcome_detail,
                "openshell sandboxes let a step open the runner's descriptor entries (a gVisor kernel serves them to the same user): only its memory is checked; the key stays in the runner's memory, so reports cannot be forged"
            );
            checks = PROC_CHECKS_MEMORY;
            continue;
        }
        if outcome != ProjectOutcome::PROJECT_OUTCOME_COMPLETED
            || result.steps.len() != 2
            || result.steps.iter().any(|s| s.exit_code != 0)
        {
            return Err(failed(
                "project runner",
                format!(
                    "outcome {outcome:?} ({}), steps {:?}",
                    result.outcome_detail,
                    result
                        .steps
                        .iter()
                        .map(|s| (s.exit_code, String::from_utf8_lossy(&s.stdout).into_owned()))
                        .collect::<Vec<_>>()
                ),
            ));
        }
        let stdout = String::from_utf8_lossy(&result.steps[1].stdout);
        let languages: Vec<String> = stdout
            .lines()
            .filter(|l| matches!(*l, "javascript" | "python"))
            .map(str::to_owned)
            .collect();
        if languages.first().map(String::as_str) != Some("javascript") {
            return Err(failed(
                "project runner",
                format!("the language probe answered {stdout:?}"),
            ));
        }
        return Ok((checks, languages));
    }
    Err(failed(
        "project runner",
        "the runner is inspectable by its steps even by memory",
    ))
}

/// A plan near the 4 MiB ceiling goes in, and its files come back as artifacts.
async fn round_trip(lease: &Lease, checks: &[&str]) -> Result<(), OpenShellError> {
    let piece = ROUND_TRIP_BYTES / 4;
    let files: Vec<plimsoll::wire::ProjectFile> = (0..4)
        .map(|i| plimsoll::wire::ProjectFile {
            path: format!("big/{i}.txt"),
            content: char::from(b'a' + i as u8).to_string().repeat(piece),
            ..Default::default()
        })
        .collect();
    let plan = ProjectPlan {
        files,
        steps: vec!["cat big/*.txt | wc -c".to_owned()],
        artifacts: vec!["big/3.txt".to_owned()],
        timeout: Duration::from_secs(60),
        hold: Hold::default(),
        grant: None,
    };
    let result = runs::project(lease, &plan, plan.timeout, checks).await?;
    let counted = result
        .steps
        .first()
        .map(|s| String::from_utf8_lossy(&s.stdout).trim().to_owned());
    let back = result.artifacts.first().map(|a| a.content.len());
    if result.outcome != ProjectOutcome::PROJECT_OUTCOME_COMPLETED
        || counted.as_deref() != Some(&(piece * 4).to_string())
        || back != Some(piece)
    {
        return Err(failed(
            "runner round trip near 4 MiB",
            format!(
                "outcome {:?} ({}), counted {counted:?}, artifact {back:?} bytes",
                result.outcome, result.outcome_detail
            ),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_held_memory_never_wraps_into_the_expected_size() {
        let report = |memory_max: &str, mem_total_kb: String| Report {
            memory_max: memory_max.to_owned(),
            mem_total_kb,
            ..Report::default()
        };
        assert_eq!(held_memory(&report("", "524288".into())), Some(512 << 20));
        assert_eq!(
            held_memory(&report("536870912", String::new())),
            Some(512 << 20)
        );
        // 2^54 KiB + 512 MiB would wrap to exactly 512 MiB in bytes.
        let wraps = (1u64 << 54) + (512 << 10);
        assert_eq!(held_memory(&report("", wraps.to_string())), None);
    }

    #[test]
    fn sessions_need_a_yama_ptrace_scope_of_at_least_one() {
        assert!(ptrace_is_scoped("1").is_ok());
        assert!(ptrace_is_scoped("3").is_ok());
        for refused in ["0", "", "x"] {
            let e = ptrace_is_scoped(refused).expect_err(refused);
            assert!(e.to_string().contains("ptrace_scope"), "{e}");
        }
    }
}
