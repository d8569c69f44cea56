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
    guard::start::run(
        "broker",
        Config::from_env(&ProcessEnvironment),
        |config| config.text_logs,
        daemon::serve,
    )
}
