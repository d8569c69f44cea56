//! `openshell-simulator`: a stand-in for NVIDIA OpenShell's gateway, for plimsoll's tests.
//! See the library's docs (and docs/openshell-simulator.md) for what it simulates.

use clap::Parser;

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let options = openshell_simulator::Options::parse();
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(tracing_subscriber::EnvFilter::new(&options.log))
        .init();
    match openshell_simulator::server::run(options).await {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("openshell-simulator: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}
