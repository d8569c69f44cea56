//! The session agent (providers.md §9.4): `plimsoll-relay agent <guest uid>`, one per docker
//! session container and warm pool member, started by plimsolld with one `docker exec` as
//! root whose stdin and stdout it holds for the session's life. [`guard`] first moves it to
//! uid+1 of the guest identity, keeping only `CAP_SETUID` and `CAP_SETGID`, and makes it
//! non-dumpable, so no guest process can signal it, trace it, or open its /proc entries (and
//! so its pipes), under runc or gVisor.
//!
//! Frames are JSON lines: requests on stdin, answers on stdout, one answer per request, in
//! order. Only plimsolld holds stdin and only the agent writes stdout, so an answer needs no
//! key. First it answers `{"op":"ready","id":"pid:starttime:cmdlinehex","uid":N}`, then:
//!
//! ```text
//! {"op":"sweep","disk":<bytes>,"mounts":[…],"keep":[id,…]} -> {"op":"sweep","exit":0|1|10|11}
//! {"op":"hold","mode":"stop"|"cont","ids":[id,…]}         -> {"op":"hold","ok":b[,"held":b]}
//! {"op":"prove"}                                           -> {"op":"prove","ok":b}
//! {"op":"project","input":b64,"hold":[id,…]}               -> {"op":"project","held":false}
//!                                     | {"op":"project","held":true,"still":b,"stdout":b64}
//! {"op":"snippet","code":b64,"env":["N=v",…],"timeoutMs":n,"cap":n[,"spare":"early"|"idle"]}
//!   -> {"op":"snippet","stdout","stderr","exit","timedOut","stdoutTruncated","stderrTruncated"}
//! {"op":"drop"}                                            -> {"op":"drop"}
//! ```
//!
//! `spare` asks for the next snippet's node to be started ahead ([`snippet::Spare`]):
//! `early` (runc) keeps two ahead, topped up as this snippet's node takes its code, and
//! starts one right after a clean sweep when none waits; `idle` starts one once this call's
//! sweep is clean and no request has come for 50 ms. `drop` ends them and the wish.
//!
//! See [`sweep`], [`hold`], [`probe`], [`project`] and [`snippet`]. A request it cannot read
//! ends it with exit 3 (plimsolld then ends the session); the end of stdin with 0.
//!
//! It replaces a Node program (agent.js and its parts) that spoke the same lines at several
//! times its memory. It is single-threaded: its effective-id switches (kills and file work
//! as the guest) hold for the whole process while nothing else runs.
//!
//! Deliberate differences from the Node agent, none visible to plimsolld:
//! - steps and snippets lead their own process group (`setpgid`), not their own session
//!   (node's `detached` was `setsid`); kills go to the group either way;
//! - a child's environment reaches it sorted by name (std's `Command`), not in insertion order;
//! - base64 that does not decode, in `input` or `code`, ends the agent (exit 3) where node's
//!   decoder skipped the bad characters;
//! - the probe that outlives its 10 s is killed with SIGKILL as the guest (node's SIGTERM was
//!   sent as the agent and refused), the verdict being "probe failed" either way;
//! - error texts that quoted node's own messages (a plan that is not JSON, an I/O error while
//!   reading an artifact) carry Rust's wording instead;
//! - a project's printed output is cut one byte past plimsolld's `STDOUT_CAP` and a snippet
//!   stream at 8 MiB, so no answer line exceeds agent.rs's `MAX_LINE` (the JS had no bound);
//! - a command kept in a report is cut at 16 Ki UTF-16 units without splitting a surrogate pair.
//!
//! Added since (plimsolld asks for them): a snippet's node runs under the runner guard
//! (non-dumpable) with its code on a socket, and the next snippet's node can be started ahead
//! ([`snippet::Spare`]).

pub mod child;
pub mod env;
pub mod files;
pub mod guard;
pub mod hold;
pub mod probe;
pub mod procs;
pub mod project;
pub mod quiet;
pub mod report;
pub mod snippet;
pub mod sweep;

use std::collections::HashSet;
use std::io::{self, BufRead, Write};
use std::os::fd::AsFd;

use base64::Engine as _;
use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use nix::unistd::Uid;
use serde::Serialize;
use serde_json::Value;

/// How long no request must come before an idle spare is started.
const IDLE_BEFORE_SPARE_MS: u16 = 50;
/// A request it cannot read, or an answer it cannot write.
pub const EXIT_UNREAD: i32 = 3;
/// The guest uid is not one it can serve (the JS agent's check).
pub const EXIT_BAD_GUEST: i32 = 2;
/// plimsolld's `runner::STDOUT_CAP`: what a runner may print. More is cut to one byte past
/// it (plimsolld reads that as a truncated output), so an answer line always fits agent.rs's
/// MAX_LINE. Deliberate (the JS had no bound; a plan would need ~100k steps to reach it).
const PRINTED_CAP: usize = (16 << 20) + (64 << 10);

#[derive(Serialize)]
struct Ready<'a> {
    op: &'static str,
    id: &'a str,
    uid: u32,
}

#[derive(Serialize)]
struct Dropped {
    op: &'static str,
}

#[derive(Serialize)]
struct Swept {
    op: &'static str,
    exit: i32,
}

#[derive(Serialize)]
struct Held {
    op: &'static str,
    ok: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    held: Option<bool>,
}

#[derive(Serialize)]
struct Proved {
    op: &'static str,
    ok: bool,
}

#[derive(Serialize)]
struct Projected {
    op: &'static str,
    held: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    still: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    stdout: Option<String>,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Snipped {
    op: &'static str,
    stdout: String,
    stderr: String,
    exit: i32,
    timed_out: bool,
    stdout_truncated: bool,
    stderr_truncated: bool,
}

/// Why a request ends the agent.
#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    #[error("unreadable request: {0}")]
    Request(String),
    #[error("{0}")]
    Io(#[from] io::Error),
}

fn bad(what: &str) -> AgentError {
    AgentError::Request(what.to_owned())
}

/// The agent's state across requests.
struct Agent {
    guest: u32,
    spared: HashSet<u32>,
    proven: Option<probe::Proof>,
    /// The next snippets' nodes, started ahead ([`snippet::Spare`]), oldest first.
    spare: Vec<snippet::Spare>,
    /// The environment of the spare the last snippet asked for, and how long no request
    /// must come after a clean sweep before it is started (0 for `early`,
    /// [`IDLE_BEFORE_SPARE_MS`] for `idle`).
    wanted: Option<(Vec<(String, String)>, u16)>,
    /// Whether the last request was a sweep that came out clean: a spare starts only then,
    /// when no code of a call is alive.
    swept_clean: bool,
    /// Whether nodes may still be started beside a call (`early`): false for the agent's
    /// life once one started and was not non-dumpable from its exec (one that could not
    /// start at all leaves it true).
    early: bool,
}

/// Serves stdin to its end; the process's exit status. The guard has run.
pub fn serve(guest: u32) -> i32 {
    if guest == 0 || Uid::current().as_raw() == guest {
        return EXIT_BAD_GUEST;
    }
    let mut agent = Agent {
        guest,
        spared: sweep::spared(),
        proven: None,
        spare: Vec::new(),
        wanted: None,
        swept_clean: false,
        early: true,
    };
    let me = std::process::id().to_string();
    let id = match procs::stat_fields(&me).and_then(|f| procs::identity(&me, &f)) {
        Ok(id) => id,
        Err(e) => {
            eprintln!("plimsoll-relay agent: cannot read its own identity: {e}");
            return 1;
        }
    };
    let ready = Ready {
        op: "ready",
        id: &id,
        uid: Uid::current().as_raw(),
    };
    if answer(&ready).is_err() {
        return EXIT_UNREAD;
    }
    // Its own reader over a duplicate of fd 0, so it can tell whether a request is already
    // read ahead before it waits for one.
    let Ok(fd) = io::stdin().as_fd().try_clone_to_owned() else {
        return EXIT_UNREAD;
    };
    let mut input = io::BufReader::new(std::fs::File::from(fd));
    let mut line = Vec::new();
    loop {
        line.clear();
        if input.buffer().is_empty() {
            agent.when_idle(input.get_ref());
        }
        match input.read_until(b'\n', &mut line) {
            // A last line without its newline is not a request (as in the JS).
            Ok(_) if line.last() != Some(&b'\n') => return 0,
            Ok(_) => {}
            Err(_) => return EXIT_UNREAD,
        }
        if let Err(e) = agent.request(&line) {
            eprintln!("plimsoll-relay agent: {e}");
            return EXIT_UNREAD;
        }
    }
}

fn answer<T: Serialize>(frame: &T) -> io::Result<()> {
    let mut line = serde_json::to_vec(frame).map_err(io::Error::other)?;
    line.push(b'\n');
    let mut out = io::stdout().lock();
    out.write_all(&line)?;
    out.flush()
}

/// `request.x.map(String)`: the field must be a list.
fn string_list(request: &Value, name: &str) -> Result<Vec<String>, AgentError> {
    match request.get(name) {
        Some(Value::Array(items)) => Ok(items.iter().map(env::js_string).collect()),
        _ => Err(AgentError::Request(format!("{name} is not a list"))),
    }
}

/// `BigInt(v)` of the disk budget.
fn disk_budget(value: Option<&Value>) -> Result<i128, AgentError> {
    match value {
        Some(Value::String(s)) => {
            let t = s.trim();
            if t.is_empty() {
                return Ok(0);
            }
            t.parse().map_err(|_| bad("disk is not an integer"))
        }
        Some(Value::Number(n)) => n
            .as_i64()
            .map(i128::from)
            .or_else(|| n.as_u64().map(i128::from))
            .ok_or_else(|| bad("disk is not an integer")),
        Some(Value::Bool(b)) => Ok(i128::from(*b)),
        _ => Err(bad("disk is not an integer")),
    }
}

fn decode(value: Option<&Value>, name: &str) -> Result<Vec<u8>, AgentError> {
    let text = value.map_or_else(|| "undefined".to_owned(), env::js_string);
    // Deliberate: node's decoder skipped what was not base64; this one refuses it, and a
    // request it cannot read ends the agent. plimsolld always sends standard base64.
    base64::engine::general_purpose::STANDARD
        .decode(text.trim_end_matches('\n'))
        .map_err(|_| AgentError::Request(format!("{name} is not base64")))
}

impl Agent {
    /// Before waiting for the next request: right after a clean sweep, when a spare is
    /// wanted and none waits, it is started once no request has come for the wanted time, so
    /// an `idle` spare's start never competes with a call sent right after the last one.
    fn when_idle(&mut self, input: &std::fs::File) {
        if !self.swept_clean || !self.spare.is_empty() {
            return;
        }
        let Some((env, wait_ms)) = self.wanted.as_ref() else {
            return;
        };
        let mut fds = [PollFd::new(input.as_fd(), PollFlags::POLLIN)];
        if matches!(poll(&mut fds, PollTimeout::from(*wait_ms)), Ok(0)) {
            self.spare
                .extend(snippet::Spare::start(self.guest, env.clone()));
        }
    }

    /// Ends the spares and the wish for them (before a grant is lent).
    fn drop_spare(&mut self) {
        self.wanted = None;
        for spare in self.spare.drain(..) {
            spare.end(self.guest);
        }
    }

    fn request(&mut self, line: &[u8]) -> Result<(), AgentError> {
        let request: Value = serde_json::from_slice(line).map_err(|e| bad(&e.to_string()))?;
        let op = request.get("op").and_then(Value::as_str).unwrap_or("");
        self.swept_clean = false;
        match op {
            "sweep" => self.sweep(&request),
            "hold" => self.hold(&request),
            "prove" => self.prove(),
            "project" => self.project(&request),
            "snippet" => self.snippet(&request),
            "drop" => {
                self.drop_spare();
                Ok(answer(&Dropped { op: "drop" })?)
            }
            _ => Err(bad("unknown request")),
        }
    }

    fn sweep(&mut self, request: &Value) -> Result<(), AgentError> {
        let keep: HashSet<String> = string_list(request, "keep")?.into_iter().collect();
        let disk = disk_budget(request.get("disk"))?;
        let mounts = string_list(request, "mounts")?;
        let mut spared = self.spared.clone();
        spared.extend(self.spare.iter().map(snippet::Spare::pid));
        let exit = sweep::sweep(self.guest, &spared, &keep, disk, &mounts);
        self.swept_clean = matches!(exit, Ok(sweep::EXIT_CLEAN));
        if !self.swept_clean {
            self.drop_spare();
        }
        Ok(answer(&Swept {
            op: "sweep",
            exit: exit?,
        })?)
    }

    fn hold(&mut self, request: &Value) -> Result<(), AgentError> {
        let ids = string_list(request, "ids")?;
        let targets = hold::targets(&ids);
        let frame = match request.get("mode").and_then(Value::as_str) {
            Some("stop") => Held {
                op: "hold",
                ok: !hold::any_renamed(&ids) && hold::stop_all(self.guest, &targets),
                held: None,
            },
            Some("cont") => Held {
                op: "hold",
                ok: true,
                held: Some(hold::cont_all(self.guest, &targets)),
            },
            _ => return Err(bad("unknown hold mode")),
        };
        Ok(answer(&frame)?)
    }

    /// Sent once, right after the ready frame and before any guest code can run: the proof,
    /// with a real step-like child, that a step cannot open the agent's /proc entries.
    fn prove(&mut self) -> Result<(), AgentError> {
        procs::settle(self.guest)?;
        self.proven = probe::probe(self.guest);
        Ok(answer(&Proved {
            op: "prove",
            ok: self.proven.is_some(),
        })?)
    }

    /// The kept interpreters are held stopped around the whole call (plimsolld names them),
    /// in this one exchange: nothing of an earlier call runs beside a probe or a step.
    fn project(&mut self, request: &Value) -> Result<(), AgentError> {
        let ids = match request.get("hold") {
            Some(Value::Array(items)) => items.iter().map(env::js_string).collect(),
            _ => Vec::new(),
        };
        let targets = hold::targets(&ids);
        if hold::any_renamed(&ids) || !hold::stop_all(self.guest, &targets) {
            return Ok(answer(&Projected {
                op: "project",
                held: false,
                still: None,
                stdout: None,
            })?);
        }
        let input = decode(request.get("input"), "input");
        // The held processes are resumed whatever the call came to.
        let mut printed = match &input {
            Ok(input) => project::project(self.guest, &mut self.proven, input),
            Err(_) => Vec::new(),
        };
        let still = hold::cont_all(self.guest, &targets);
        input?;
        printed.truncate(PRINTED_CAP + 1);
        let stdout = base64::engine::general_purpose::STANDARD.encode(&printed);
        Ok(answer(&Projected {
            op: "project",
            held: true,
            still: Some(still),
            stdout: Some(stdout),
        })?)
    }

    fn snippet(&mut self, request: &Value) -> Result<(), AgentError> {
        let pairs = match request.get("env") {
            Some(Value::Array(items)) => items.iter().map(env::js_string).collect(),
            Some(v) if !env::truthy(v) => Vec::new(),
            None | Some(Value::String(_)) => Vec::new(),
            Some(_) => return Err(bad("env is not a list")),
        };
        let code = match decode(request.get("code"), "code") {
            Ok(code) => code,
            Err(e) => {
                self.drop_spare();
                return Err(e);
            }
        };
        let env = snippet::environment(self.guest, &pairs);
        let mode = request.get("spare").and_then(Value::as_str);
        let ran = snippet::snippet(
            self.guest,
            &code,
            &env,
            request.get("timeoutMs"),
            request.get("cap"),
            &mut self.spare,
            (mode == Some("early")).then_some(&mut self.early),
        );
        self.wanted = match mode {
            Some("early") => Some((env, 0)),
            Some("idle") => Some((env, IDLE_BEFORE_SPARE_MS)),
            _ => None,
        };
        let b64 = base64::engine::general_purpose::STANDARD;
        Ok(answer(&Snipped {
            op: "snippet",
            stdout: b64.encode(&ran.stdout),
            stderr: b64.encode(&ran.stderr),
            exit: ran.exit,
            timed_out: ran.timed_out,
            stdout_truncated: ran.stdout_truncated,
            stderr_truncated: ran.stderr_truncated,
        })?)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn frames_carry_the_js_agents_fields_in_its_order() {
        let ready = serde_json::to_string(&Ready {
            op: "ready",
            id: "1:2:ab",
            uid: 7,
        })
        .unwrap();
        assert_eq!(ready, r#"{"op":"ready","id":"1:2:ab","uid":7}"#);
        let held = serde_json::to_string(&Held {
            op: "hold",
            ok: true,
            held: None,
        })
        .unwrap();
        assert_eq!(held, r#"{"op":"hold","ok":true}"#);
        let p = Projected {
            op: "project",
            held: true,
            still: Some(false),
            stdout: Some(String::new()),
        };
        assert_eq!(
            serde_json::to_string(&p).unwrap(),
            r#"{"op":"project","held":true,"still":false,"stdout":""}"#
        );
        let s = Snipped {
            op: "snippet",
            stdout: String::new(),
            stderr: String::new(),
            exit: 0,
            timed_out: false,
            stdout_truncated: false,
            stderr_truncated: true,
        };
        assert_eq!(
            serde_json::to_string(&s).unwrap(),
            r#"{"op":"snippet","stdout":"","stderr":"","exit":0,"timedOut":false,"stdoutTruncated":false,"stderrTruncated":true}"#
        );
    }

    #[test]
    fn requests_it_cannot_read_are_refused() {
        let mut agent = Agent {
            guest: 1,
            spared: HashSet::new(),
            proven: None,
            spare: Vec::new(),
            wanted: None,
            swept_clean: false,
            early: true,
        };
        for line in [
            &b""[..],
            b"{",
            b"5",
            b"null",
            br#"{"op":"nope"}"#,
            br#"{"op":"hasOwnProperty"}"#,
        ] {
            assert!(
                matches!(agent.request(line), Err(AgentError::Request(_))),
                "{line:?}"
            );
        }
        for request in [
            json!({"op": "sweep", "disk": "0", "mounts": [], "keep": "x"}),
            json!({"op": "sweep", "disk": "x", "mounts": [], "keep": []}),
            json!({"op": "hold", "mode": "stop", "ids": 5}),
            json!({"op": "hold", "mode": "other", "ids": []}),
            json!({"op": "snippet", "code": "!!", "env": []}),
        ] {
            let line = serde_json::to_vec(&request).unwrap();
            assert!(agent.request(&line).is_err(), "{request}");
        }
    }

    #[test]
    fn the_disk_budget_reads_as_bigint_did() {
        assert_eq!(disk_budget(Some(&json!("123"))).unwrap(), 123);
        assert_eq!(disk_budget(Some(&json!(" -4 "))).unwrap(), -4);
        assert_eq!(disk_budget(Some(&json!(""))).unwrap(), 0);
        assert_eq!(disk_budget(Some(&json!(7))).unwrap(), 7);
        assert!(disk_budget(Some(&json!(1.5))).is_err());
        assert!(disk_budget(None).is_err());
    }
}
