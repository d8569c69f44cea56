//! `guard`: the HTTPS endpoint hosted microVMs reach a run's grant through. Reads its
//! configuration from the environment (see `--help`), serves until SIGTERM, drains.

use std::process::ExitCode;

use clap::Parser;
use guard::config::Config;
use guard::daemon;
use guard::env::{self, ProcessEnvironment};

/// Checks a run's guard token and hands each call to the broker; holds no credential.
#[derive(Parser)]
#[command(name = "guard", version, after_help = help())]
struct Args {}

fn help() -> String {
    let mut text = String::from("Environment:\n");
    for (name, meaning) in env::VARIABLES {
        text.push_str(&format!("  {name:<30} {meaning}\n"));
    }
    text.push_str(
        "\nServes only POST /v1/e2b/guard and /v1/dockercloud/guard (grants.md section 5);\n\
         everything else is 404.",
    );
    text
}

fn main() -> ExitCode {
    let _ = Args::parse();
    guard::start::run(
        "guard",
        Config::from_env(&ProcessEnvironment),
        |config| config.text_logs,
        daemon::serve,
    )
}
