//! plimsolld: the plimsoll sandbox daemon. Configured only by environment
//! variables (`plimsolld --help` lists them); see the README.

use std::process::ExitCode;

use plimsolld::config::env::{ENV_LOG_FORMAT, ProcessEnv, Strings, help_text};
use plimsolld::config::{Config, LogFormat};
use plimsolld::{daemon, logging};

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.first().map(String::as_str) {
        None => {}
        Some("-h" | "--help" | "help") if args.len() == 1 => {
            print!("{}", help_text());
            return ExitCode::SUCCESS;
        }
        Some(arg) => {
            eprintln!(
                "plimsolld: unexpected argument {arg:?}: plimsolld takes no arguments; \
                 configure it with the environment variables below\n"
            );
            eprint!("{}", help_text());
            return ExitCode::from(2);
        }
    }
    let env = ProcessEnv;
    let config = match Config::from_env(&env) {
        Ok(c) => c,
        Err(e) => {
            let text = env
                .get(ENV_LOG_FORMAT)
                .is_some_and(|v| v.trim().eq_ignore_ascii_case("text"));
            logging::init(if text {
                LogFormat::Text
            } else {
                LogFormat::Json
            });
            tracing::error!(error = %e, "invalid configuration");
            return ExitCode::FAILURE;
        }
    };
    logging::init(config.log_format);
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            tracing::error!(error = %e, "cannot start the async runtime");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(daemon::run(config)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!(error = %e, "plimsolld did not start");
            ExitCode::FAILURE
        }
    }
}
