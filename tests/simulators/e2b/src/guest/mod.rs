//! The simulator's agent inside each VM: the part of envd that has to run in the guest.
//!
//! The simulator bind-mounts its own binary read-only at [`AGENT_PATH`] in every VM container
//! and runs it there as `agent guest <command>`:
//!
//! - `init` is the container's first process: it reaps orphans (as a VM's init does) and
//!   carries the guest's egress, accepting TCP on `127.0.0.1:443` and `:80` and relaying each
//!   connection to the simulator's egress proxy over the Unix sockets mounted at
//!   [`EGRESS_DIR`] (a runsc sandbox has no network at all, so a mounted socket is the only
//!   way out, under runc and runsc alike).
//! - `spawn` starts one process the way envd does (through `/bin/sh`, exactly the given
//!   environment and working directory), relays its output as [`crate::frames`] and reports
//!   its pid and its exact wait status; at a deadline it kills that process only.
//! - `signal`, `write` and `read` are envd's signal and file operations, run as root.
//!
//! Each command writes frames on stdout and diagnostics on stderr. This module runs in the
//! guest and nowhere else: nothing in it talks to docker or to the simulator's state.

mod files;
mod init;
mod spawn;

use std::process::ExitCode;

use serde::{Deserialize, Serialize};

/// Where the agent binary appears in a VM.
pub const AGENT_PATH: &str = "/opt/e2b-sim/agent";
/// Where the egress sockets appear in a VM.
pub const EGRESS_DIR: &str = "/run/e2b-sim/egress";
/// The socket `init` relays guest TLS (port 443) to.
pub const EGRESS_TLS_SOCKET: &str = "tls.sock";
/// The socket `init` relays guest plain HTTP (port 80) to.
pub const EGRESS_HTTP_SOCKET: &str = "http.sock";

/// How a process ended, as envd's end event states it (Go's `os.ProcessState`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct End {
    /// The exit code, or -1 when a signal ended the process.
    pub exit_code: i32,
    /// Whether the process exited (rather than being ended by a signal).
    pub exited: bool,
    /// `exit status N` or `signal: killed` (Go's wording).
    pub status: String,
    /// Go's `cmd.Wait` error text: absent for exit 0, else the status.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// A refusal reported in a [`crate::frames::Tag::Failed`] frame.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Failure {
    /// An HTTP status (file operations) or 0.
    #[serde(default)]
    pub status: u16,
    /// A Connect code (process operations) or empty.
    #[serde(default)]
    pub code: String,
    pub message: String,
}

/// A file `write` wrote.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Written {
    pub path: String,
    pub name: String,
}

/// The agent's entry point: `args` are the words after `guest`.
pub fn main(args: &[String]) -> ExitCode {
    let Some((command, rest)) = args.split_first() else {
        eprintln!("agent: usage: guest init|spawn|signal|write|read ...");
        return ExitCode::from(2);
    };
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("agent: no runtime: {e}");
            return ExitCode::from(1);
        }
    };
    let outcome = match command.as_str() {
        "init" => runtime.block_on(init::run(rest)),
        "spawn" => runtime.block_on(spawn::run(rest)),
        "signal" => spawn::signal(rest),
        "write" => runtime.block_on(files::write(rest)),
        "read" => runtime.block_on(files::read(rest)),
        other => Err(format!("unknown command {other:?}")),
    };
    // A blocking stdin read may still be parked on a thread; it must not hold the exit.
    runtime.shutdown_timeout(std::time::Duration::from_millis(50));
    match outcome {
        Ok(code) => code,
        Err(message) => {
            eprintln!("agent {command}: {message}");
            ExitCode::from(1)
        }
    }
}

/// The value after `--name` in `args`.
fn flag<'a>(args: &'a [String], name: &str) -> Option<&'a str> {
    args.windows(2)
        .find(|pair| pair[0] == name)
        .map(|pair| pair[1].as_str())
}

/// Every value after a repeated `--name`.
fn flags<'a>(args: &'a [String], name: &str) -> Vec<&'a str> {
    args.windows(2)
        .filter(|pair| pair[0] == name)
        .map(|pair| pair[1].as_str())
        .collect()
}

fn number<T: std::str::FromStr>(args: &[String], name: &str) -> Result<T, String> {
    flag(args, name)
        .ok_or_else(|| format!("{name} is missing"))?
        .parse()
        .map_err(|_| format!("{name} is not a number"))
}
