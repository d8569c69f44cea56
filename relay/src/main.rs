//! `plimsoll-relay <port> <socket>`, `plimsoll-relay cell <kernel dir> <work dir>` and
//! `plimsoll-relay agent <guest uid>`: see the crate docs. Thin over [`relay::serve`],
//! [`relay::cell::serve`] and [`relay::agent::serve`].

use std::process::ExitCode;

use relay::args::{Args, CellArgs, Mode};
use relay::protocol::{EXIT_CANNOT_LISTEN, EXIT_USAGE};
use relay::serve::{ServeError, serve};

/// The cell relay's exit status when it ends other than by stdin's end (the Node relay's).
const EXIT_CELL_FAILED: i32 = 2;
/// The exit status when the process cannot be made non-dumpable (the runner guard's).
const EXIT_UNGUARDED: i32 = 125;

fn main() -> ExitCode {
    let mode = match Mode::parse(std::env::args().skip(1)) {
        Ok(mode) => mode,
        Err(e) => {
            eprintln!("plimsoll-relay: {e}");
            return code(EXIT_USAGE);
        }
    };
    // The session agent's first act, before it reads anything: the runner guard's work
    // (uid+1 with only the set-id capabilities, non-dumpable), which LD_PRELOAD did for the
    // Node agent. It runs on this one thread and never starts a runtime: its effective-id
    // switches must hold for the whole process.
    if let Mode::Agent(guest) = mode {
        if let Err(e) = relay::agent::guard::guard(guest) {
            eprintln!("plimsoll-relay agent: {e}");
            return code(EXIT_UNGUARDED);
        }
        return code(relay::agent::serve(guest));
    }
    // The cell relay's first act, before it opens or reads anything: no process of the same
    // uid (a session's code) may trace it or open its memory. The runner guard did this for
    // the Node relay through LD_PRELOAD, which a static binary ignores. (The grants relay
    // never held a secret of a session's and stays as it was.)
    if matches!(mode, Mode::Cell(_))
        && let Err(e) = nix::sys::prctl::set_dumpable(false)
    {
        eprintln!("plimsoll-relay: cannot make the process non-dumpable: {e}");
        return code(EXIT_UNGUARDED);
    }
    // One thread: the relay copies a handful of connections and must stay small.
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .enable_time()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("plimsoll-relay: cannot start: {e}");
            return ExitCode::FAILURE;
        }
    };
    match mode {
        Mode::Grants(args) => grants(&runtime, args),
        Mode::Cell(args) => cell(&runtime, args),
        // Served above, without a runtime.
        Mode::Agent(_) => ExitCode::FAILURE,
    }
}

fn grants(runtime: &tokio::runtime::Runtime, args: Args) -> ExitCode {
    match runtime.block_on(serve(args)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e @ (ServeError::Socket { .. } | ServeError::Port { .. })) => {
            eprintln!("plimsoll-relay: {e}");
            code(EXIT_CANNOT_LISTEN)
        }
        Err(e) => {
            eprintln!("plimsoll-relay: {e}");
            ExitCode::FAILURE
        }
    }
}

fn cell(runtime: &tokio::runtime::Runtime, args: CellArgs) -> ExitCode {
    match runtime.block_on(relay::cell::serve::serve(args)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("relay: {e}");
            code(EXIT_CELL_FAILED)
        }
    }
}

fn code(status: i32) -> ExitCode {
    ExitCode::from(u8::try_from(status).unwrap_or(1))
}
