//! What every exec-capable provider shares inside its guests (issue #14 item 1): the project
//! runner's protocol and authenticated report ([`runner`], [`outcome`]), the session boundary's
//! programs ([`boundary`]), output capping ([`output`]), the notebook-cell machinery ([`cell`],
//! [`cells`]) and the small exec trait
//! ([`GuestExec`]) each provider implements so that machinery runs over its own transport
//! (`docker exec`, the openshell gateway's exec stream, e2b's envd).
//!
//! The trait asks for two things only:
//! - [`GuestExec::run`]: one command as a given user, with stdin bytes, both streams capped and
//!   a deadline, to its end;
//! - [`GuestExec::start`]: a long-lived command whose stdin and stdout the daemon holds, ended
//!   by closing its stdin or dropping its output ([`Held`]).
//!
//! What a provider cannot do is said by its implementation: the openshell gateway cannot pick a
//! user or a working directory, so there every command runs as the sandbox's user, and the cell
//! programs take their directories as arguments rather than relying on one.

pub mod boundary;
pub mod cell;
pub mod cells;
pub mod outcome;
pub mod output;
pub mod runner;

use async_trait::async_trait;
use tokio::time::Instant;

/// Why a guest command could not be run or fed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ExecError {
    /// The provider did not run the command (its guest is gone or stopped, or a call failed)
    /// or could not tell how it ended.
    #[error("the guest command could not be started: {0}")]
    Refused(String),
    /// The held command's stdin no longer takes bytes (it exited or its stream broke).
    #[error("the guest command's stdin is closed: {0}")]
    Closed(String),
}

/// One command for [`GuestExec::run`] or [`GuestExec::start`].
#[derive(Debug, Clone, Copy)]
pub struct Command<'a> {
    /// The argv (the provider adds nothing before it but what its transport needs).
    pub argv: &'a [String],
    /// The guest user, in the provider's own terms (`uid:gid` on docker, a user name on e2b;
    /// ignored where the transport cannot choose).
    pub user: &'a str,
    /// The environment, as `NAME=value`: on docker it is the whole environment (plus the fixed
    /// search path); elsewhere it is added to the sandbox's.
    pub env: &'a [String],
    /// Bytes written to stdin before it is closed ([`GuestExec::run`] only).
    pub stdin: &'a [u8],
    /// Stdout bytes kept ([`GuestExec::run`] only); the rest is read and dropped.
    pub stdout_cap: usize,
    /// Stderr bytes kept; the rest is read and dropped.
    pub stderr_cap: usize,
    /// When [`GuestExec::run`]'s answer is due, or by when [`GuestExec::start`] must have
    /// started the command.
    pub deadline: Instant,
}

/// What [`GuestExec::run`] saw.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Ran {
    /// The exit code, or `None` when the deadline passed first or the provider saw none.
    pub exit_code: Option<i64>,
    /// The kept stdout.
    pub stdout: Vec<u8>,
    /// The kept stderr.
    pub stderr: Vec<u8>,
    /// Stdout bytes were dropped past the cap.
    pub stdout_truncated: bool,
    /// Stderr bytes were dropped past the cap.
    pub stderr_truncated: bool,
    /// The deadline passed before the command ended.
    pub timed_out: bool,
}

/// A long-lived command's stdin, as [`GuestExec::start`] hands it over.
#[async_trait]
pub trait HeldInput: Send {
    /// Writes all of `bytes` (one or more whole lines of the protocol spoken over it).
    async fn write(&mut self, bytes: Vec<u8>) -> Result<(), ExecError>;
    /// Closes stdin: the programs held this way exit at end of file.
    async fn close(&mut self);
}

/// A long-lived command's stdout, as [`GuestExec::start`] hands it over. Dropping it lets go of
/// the command (on openshell the gateway then kills the command's process group).
#[async_trait]
pub trait HeldOutput: Send {
    /// The next stdout bytes, or `None` once the command's output ended. Cancel-safe: no bytes
    /// are lost when the future is dropped.
    async fn next(&mut self) -> Option<Vec<u8>>;
    /// What the command wrote to stderr so far, up to a cap, for the log.
    fn stderr(&self) -> &[u8];
}

/// A long-lived command the daemon holds.
pub struct Held {
    /// Its stdin.
    pub stdin: Box<dyn HeldInput>,
    /// Its stdout.
    pub stdout: Box<dyn HeldOutput>,
}

/// Running commands in one guest (a container, a sandbox, a microVM).
#[async_trait]
pub trait GuestExec: Send + Sync {
    /// Runs `command` until it ends or its deadline passes. `Err` when the provider did not
    /// run it or could not tell how it ended: either way the caller has no answer to trust.
    async fn run(&self, command: Command<'_>) -> Result<Ran, ExecError>;

    /// Starts `command` with its stdin and stdout held; it lives until its stdin closes, its
    /// output is dropped, it exits, or the guest stops.
    async fn start(&self, command: Command<'_>) -> Result<Held, ExecError>;
}

/// `argv` with the runner guard (`guard`, a shared library in the guest) preloaded, so the
/// program is non-dumpable from its first instruction.
pub fn guarded(guard: &str, argv: impl IntoIterator<Item = String>) -> Vec<String> {
    let mut command = vec![
        "/bin/sh".to_owned(),
        "-c".to_owned(),
        format!("export LD_PRELOAD={guard}; exec \"$@\""),
        "sh".to_owned(),
    ];
    command.extend(argv);
    command
}
