//! Project calls (providers.md §9.3): the project runner's role inside the agent, its report
//! format kept. `input` is what the runner read on stdin: the key line (64 hex digits), then
//! the plan. Steps run as the guest uid and gid with no capability, in their own process
//! group, never sharing a uid with the agent, so none can open its /proc entries, signal it
//! or trace it.
//!
//! A step enters /work with the guest's rights: std's `Command` changes gid and uid in the
//! child before it changes directory (the JS forked under the guest's effective ids to get
//! that from node, which changes directory first), so a /work the guest made 0700 is entered
//! or refused exactly as the guest would be.

use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};
use std::time::Instant;

use nix::errno::Errno;
use serde_json::Value;

use super::child::{self, Cap, Watch};
use super::env::{self, Env, WORK};
use super::files;
use super::probe::{self, PROBED, Proof};
use super::procs;
use super::report::{self, Key, Step};

const STEP_OUTPUT_CAP: usize = 1 << 20;
const EXIT_TIMED_OUT: i32 = 124;
const EXIT_NOT_STARTED: i32 = 127;
const DEFAULT_BUDGET_MS: f64 = 30_000.0;

/// One project call: what the runner would have printed (nothing when the key line is bad).
pub fn project(guest: u32, proven: &mut Option<Proof>, input: &[u8]) -> Vec<u8> {
    let Some(newline) = input.iter().position(|b| *b == b'\n') else {
        return Vec::new();
    };
    let (key_line, plan) = input.split_at(newline);
    let Some(key) = Key::parse(key_line) else {
        return Vec::new();
    };
    let mut printed = Vec::new();
    let body = match run_plan(
        guest,
        proven,
        &key,
        plan.get(1..).unwrap_or_default(),
        &mut printed,
    ) {
        Ok(body) => body,
        Err(message) => report::failure(&message),
    };
    printed.extend(key.report(&body));
    printed
}

/// A plan's list field (`plan.x || []`): None when absent or falsy.
fn list<'a>(plan: &'a Value, name: &str) -> Result<&'a [Value], String> {
    match plan.get(name) {
        Some(v) if !env::truthy(v) => Ok(&[]),
        None => Ok(&[]),
        Some(Value::Array(items)) => Ok(items),
        Some(_) => Err(format!("the plan's {name} is not a list")),
    }
}

fn strings(items: &[Value], what: &str) -> Result<Vec<String>, String> {
    items
        .iter()
        .map(|v| {
            v.as_str()
                .map(str::to_owned)
                .ok_or_else(|| format!("a {what} is not a string"))
        })
        .collect()
}

/// Runs the plan; the report body, or the error the report carries.
fn run_plan(
    guest: u32,
    proven: &mut Option<Proof>,
    key: &Key,
    plan: &[u8],
    printed: &mut Vec<u8>,
) -> Result<Vec<u8>, String> {
    let plan: Value = serde_json::from_slice(plan).map_err(|e| e.to_string())?;
    let started = Instant::now();
    let timeout = env::js_number(plan.get("timeoutMs"));
    let budget_ms = if timeout > 0.0 {
        timeout
    } else {
        DEFAULT_BUDGET_MS
    };
    let mut env = Env::base(guest);
    if let Some(Value::Object(vars)) = plan.get("env") {
        for (name, value) in vars {
            env.set(name, value.clone());
        }
    }
    env.set(
        "PLIMSOLL_RUNNER_PID",
        Value::from(std::process::id().to_string()),
    );
    if let Some(Value::String(source)) = plan.get("hostSDK")
        && !source.is_empty()
    {
        let client = files::write_host_client(source)?;
        let flag = format!("--import=file://{client}");
        let options = match env.get("NODE_OPTIONS") {
            Some(v) if env::truthy(v) => format!("{} {flag}", env::js_string(v)),
            _ => flag,
        };
        env.set("NODE_OPTIONS", Value::from(options));
    }
    let checks = match plan.get("procChecks") {
        Some(Value::Array(items)) => items
            .iter()
            .filter_map(|v| v.as_str().map(str::to_owned))
            .collect(),
        Some(v) if env::truthy(v) => return Err("the plan's procChecks is not a list".to_owned()),
        _ => PROBED.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>(),
    };
    if let Some(reachable) = probe::inspectable(guest, proven, &checks) {
        return Err(format!(
            "the runner's process is inspectable by its steps ({reachable}); nothing ran"
        ));
    }
    let mut wanted_files = Vec::new();
    for f in list(&plan, "files")? {
        let path = f.get("path").and_then(Value::as_str);
        let content = f.get("content").and_then(Value::as_str);
        let (Some(path), Some(content)) = (path, content) else {
            return Err("a file is not a path and a content".to_owned());
        };
        wanted_files.push((path.to_owned(), content.to_owned()));
    }
    if !wanted_files.is_empty() {
        procs::as_guest(guest, || files::write_files(&wanted_files))
            .map_err(|e| e.to_string())??;
    }
    let shell_env = env::step_env(guest, &env);
    let commands = strings(list(&plan, "steps")?, "step")?;
    let mut steps = Vec::new();
    let mut encoded = 0i64;
    for (i, command) in commands.iter().enumerate() {
        // Each step starts only while the proof still holds (an in-process read).
        if i > 0
            && let Some(lost) = probe::inspectable(guest, proven, &checks)
        {
            return Err(format!(
                "the runner's process became inspectable by its steps ({lost}); the call stopped before step {i}"
            ));
        }
        printed.extend(key.step_began(i));
        let elapsed = started.elapsed().as_secs_f64() * 1000.0;
        let step = run_step(guest, command, &shell_env, budget_ms - elapsed.floor());
        let step = report::fit(step, report::STEP_RESULTS_CAP - encoded);
        encoded += report::encoded_size(&step);
        let stop = step.timed_out || step.exit_code != 0;
        steps.push(step);
        if stop {
            break;
        }
    }
    // Non-string artifact paths are skipped, as the JS's resolve threw and skipped them.
    let wanted: Vec<String> = list(&plan, "artifacts")?
        .iter()
        .filter_map(|v| v.as_str().map(str::to_owned))
        .collect();
    let (artifacts, truncated) = if wanted.is_empty() {
        (Vec::new(), false)
    } else {
        procs::as_guest(guest, || files::capture(&wanted))
            .and_then(|read| read)
            .map_err(|e| e.to_string())?
    };
    Ok(report::encode(steps, artifacts, truncated))
}

/// What the shell printed when it could not enter /work.
fn not_entered(e: &std::io::Error) -> Vec<u8> {
    let code = files::code(e);
    let text = match e.raw_os_error().map(Errno::from_raw) {
        Some(Errno::EACCES) => "Permission denied",
        Some(Errno::ENOENT) => "No such file or directory",
        Some(Errno::ENOTDIR) => "Not a directory",
        Some(Errno::ELOOP) => "Symbolic link loop",
        _ => code.as_str(),
    };
    format!("sh: cd: line 0: can't cd to {WORK}: {text}\n").into_bytes()
}

/// One step: `sh -c <command>` (`$0` sh) as the guest in /work, in its own process group,
/// killed (group and all) at `limit_ms`, at its output cap, and when it exits.
fn run_step(guest: u32, command: &str, env: &Env, limit_ms: f64) -> Step {
    let started = Instant::now();
    let mut cmd = Command::new("sh");
    cmd.arg("-c")
        .arg(command)
        .env_clear()
        .envs(env.strings())
        .current_dir(WORK)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .uid(guest)
        .gid(guest)
        .process_group(0);
    let watch = Watch {
        guest,
        deadline: child::after(started, limit_ms),
        cap: Cap::SharedKill(STEP_OUTPUT_CAP),
        group: true,
        kill_on_exit: true,
        grace: child::PIPE_GRACE,
    };
    let ran = child::run(&mut cmd, None, &watch);
    let duration_ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
    let command = report::js_prefix(command, report::COMMAND_CAP);
    match ran {
        Ok(ran) => Step {
            command,
            stdout: ran.stdout,
            stderr: ran.stderr,
            exit_code: if ran.timed_out {
                EXIT_TIMED_OUT
            } else {
                ran.exit
            },
            timed_out: ran.timed_out,
            duration_ms,
            stdout_truncated: ran.stdout_truncated,
            stderr_truncated: ran.stderr_truncated,
        },
        Err(e) => Step {
            command,
            stdout: Vec::new(),
            stderr: not_entered(&e),
            exit_code: EXIT_NOT_STARTED,
            timed_out: false,
            duration_ms,
            stdout_truncated: false,
            stderr_truncated: false,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bad_key_line_prints_nothing() {
        let mut proven = None;
        assert!(project(1, &mut proven, b"").is_empty());
        assert!(project(1, &mut proven, b"abc\n{}").is_empty());
        assert!(project(1, &mut proven, "A".repeat(64).as_bytes()).is_empty());
    }

    #[test]
    fn a_plan_that_does_not_parse_is_reported_as_an_error() {
        let mut proven = None;
        let key = "0b".repeat(32);
        let out = project(1, &mut proven, format!("{key}\nnot json").as_bytes());
        let text = String::from_utf8(out).unwrap_or_default();
        assert!(text.starts_with("\n<<<PLIMSOLL_REPORT_V3>>> "), "{text}");
        assert!(text.contains("{\"error\":"), "{text}");
    }

    #[test]
    fn a_step_that_cannot_start_reads_as_the_shell_said_it() {
        let e = std::io::Error::from_raw_os_error(libc::EACCES);
        assert_eq!(
            String::from_utf8(not_entered(&e)).unwrap_or_default(),
            "sh: cd: line 0: can't cd to /work: Permission denied\n"
        );
        let e = std::io::Error::from_raw_os_error(libc::EPERM);
        assert!(
            String::from_utf8(not_entered(&e))
                .unwrap_or_default()
                .ends_with("EPERM\n")
        );
    }
}
