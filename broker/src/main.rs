//! `broker`: holds grant credentials and forwards a run's permitted calls. Reads its
//! configuration from the environment (see `--help`), serves until SIGTERM.

use std::process::ExitCode;

use broker::daemon::{self, Config};
use broker::env::{self, ProcessEnvironment};
use clap::Parser;

/// Holds grant credentials, mints per-run tokens and forwards only a grant's routes.
#[derive(Parser)]
#[command(
    name = "broker",
    version,
    after_help = format!(
        "Environment:\n  \
         {:<25} grants file (required; reloaded on change and on SIGHUP)\n  \
         {:<25} control socket path for plimsolld (required, absolute; mode 0600)\n  \
         {:<25} guard socket path for the guard binary (optional, absolute; mode 0660)\n  \
         {:<25} extra PEM roots for upstream TLS (optional)\n  \
         {:<25} the uid docker guests run as; guest sockets answer only it, root and\n  \
         {:<25} the broker's uid (default 61000)\n  \
         {:<25} log format on stderr: json (default) or text\n\n\
         Profiles name further variables (token.env, token.secret_env) holding secrets;\n\
         they are read from this process's environment at each load.",
        env::GRANTS_FILE,
        env::BROKER_SOCKET,
        env::BROKER_GUARD_SOCKET,
        env::BROKER_CA_FILE,
        env::BROKER_GUEST_UID,
        "",
        env::LOG_FORMAT
    )
)]
struct Args {}

fn main() -> ExitCode {
    let _ = Args::parse();
    let config = match Config::from_env(&ProcessEnvironment) {
        Ok(config) => config,
        Err(error) => {
            eprintln!("broker: {error}");
            return ExitCode::from(1);
        }
    };
    init_logs(config.text_logs);
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("broker: runtime: {error}");
            return ExitCode::from(1);
        }
    };
    match runtime.block_on(daemon::serve(config)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            tracing::error!(%error, "broker did not start");
            eprintln!("broker: {error}");
            ExitCode::from(1)
        }
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
