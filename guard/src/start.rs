//! The start of the guard's and the broker's `main`: configuration, logs on stderr, the
//! runtime, then serve. Both binaries start the same way, so the way lives here once.

use std::fmt::Display;
use std::future::Future;
use std::process::ExitCode;

/// Runs a daemon named `name`: a configuration error exits 1 before logs start; otherwise
/// logs start (text or JSON, as `text_logs` says), then `serve` runs on a multi-thread
/// runtime until it returns. Every failure exits 1 and is said on stderr.
pub fn run<C, E, F, S>(
    name: &str,
    config: Result<C, E>,
    text_logs: impl FnOnce(&C) -> bool,
    serve: impl FnOnce(C) -> F,
) -> ExitCode
where
    E: Display,
    F: Future<Output = Result<(), S>>,
    S: Display,
{
    let config = match config {
        Ok(config) => config,
        Err(error) => {
            eprintln!("{name}: {error}");
            return ExitCode::from(1);
        }
    };
    init_logs(text_logs(&config));
    open_files_limit();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("{name}: runtime: {error}");
            return ExitCode::from(1);
        }
    };
    match runtime.block_on(serve(config)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            tracing::error!(%error, "{name} did not start");
            eprintln!("{name}: {error}");
            ExitCode::from(1)
        }
    }
}

/// Raises the soft limit on open files to the hard one and answers the limit in force. Each
/// guest connection holds a descriptor (and each upstream call another): at a low soft limit
/// a few busy runs would exhaust it and every listener would fail to accept.
pub fn open_files_limit() -> u64 {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    let Ok((soft, hard)) = getrlimit(Resource::RLIMIT_NOFILE) else {
        return u64::MAX;
    };
    if soft < hard && setrlimit(Resource::RLIMIT_NOFILE, hard, hard).is_ok() {
        hard
    } else {
        soft
    }
}

fn init_logs(text: bool) {
    let builder = tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_max_level(tracing::Level::INFO);
    if text {
        builder.init();
    } else {
        builder.json().flatten_event(true).init();
    }
}
