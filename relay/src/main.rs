//! `plimsoll-relay <port> <socket>`: see the crate docs. Thin over [`relay::serve`].

use std::process::ExitCode;

use relay::args::Args;
use relay::protocol::{EXIT_CANNOT_LISTEN, EXIT_USAGE};
use relay::serve::{ServeError, serve};

fn main() -> ExitCode {
    let args = match Args::parse(std::env::args().skip(1)) {
        Ok(args) => args,
        Err(e) => {
            eprintln!("plimsoll-relay: {e}");
            return code(EXIT_USAGE);
        }
    };
    // One thread: the relay copies a handful of connections and must stay small.
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("plimsoll-relay: cannot start: {e}");
            return ExitCode::FAILURE;
        }
    };
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

fn code(status: i32) -> ExitCode {
    ExitCode::from(u8::try_from(status).unwrap_or(1))
}
