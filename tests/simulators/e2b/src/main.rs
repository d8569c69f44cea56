//! `e2b-simulator`: serves a simulated E2B on loopback until SIGTERM (or, with
//! `--watch-stdin`, until its stdin closes), then removes every VM it made. When ready it
//! prints one JSON line on stdout:
//!
//! ```text
//! {"event":"listening","api":"http://127.0.0.1:P","envd":"http://127.0.0.1:Q","admin":"http://127.0.0.1:R",
//!  "domain":"e2b.localhost","apiKey":"e2b_…","runtime":"runsc","template":"base","caCertPath":"…","instance":"…"}
//! ```
//!
//! `e2b-simulator guest …` is the agent inside each VM (see the library's `guest` module).

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use e2b_simulator::{Config, Faults, Runtime, Simulator, Upstream};

/// A simulated E2B (control plane and envd) backed by local containers, for tests.
#[derive(Debug, Parser)]
#[command(name = "e2b-simulator", version)]
struct Options {
    /// The API key the control plane accepts (X-API-Key); random when unset.
    #[arg(long, env = "E2B_SIM_API_KEY")]
    api_key: Option<String>,
    /// The sandbox domain (create answers, host routing 49983-<id>.<domain>).
    #[arg(long, env = "E2B_SIM_DOMAIN", default_value = "e2b.localhost")]
    domain: String,
    /// auto (runsc when docker has it registered, else runc), runc or runsc.
    #[arg(long, env = "E2B_SIM_RUNTIME", default_value = "auto")]
    runtime: Runtime,
    /// The template's docker image (made by tests/simulators/e2b/template/build).
    #[arg(long, env = "E2B_SIM_TEMPLATE_IMAGE", default_value = e2b_simulator::config::DEFAULT_TEMPLATE_IMAGE)]
    template_image: String,
    /// vCPUs of every VM (reported and enforced).
    #[arg(long, default_value_t = 2)]
    cpu_count: u32,
    /// Memory of every VM in MB (reported and enforced).
    #[arg(long, default_value_t = 512)]
    memory_mb: u32,
    /// Disk of every VM in MB (reported; the size of each writable tmpfs).
    #[arg(long, default_value_t = 1024)]
    disk_size_mb: u32,
    /// Running or paused sandboxes at most (create answers 429 beyond).
    #[arg(long, default_value_t = 16)]
    max_sandboxes: usize,
    /// NAME=URL: the egress proxy sends NAME's traffic to URL (http:// or https:// on a
    /// loopback IP and port). Repeatable.
    #[arg(long = "host", value_name = "NAME=URL")]
    hosts: Vec<String>,
    /// PEM file of the CA that https upstreams' certificates chain to.
    #[arg(long, value_name = "PEM")]
    upstream_ca: Option<PathBuf>,
    /// A fault on from the start: create-without-envd-token, create-without-traffic-token,
    /// create-without-sandbox-id, delete-errors=N, envd-delay-ms=N, vm-dies-after-ms=N,
    /// drop-end-frame, drop-end-event, egress-allowed. Repeatable.
    #[arg(long = "fault", value_name = "NAME[=N]")]
    faults: Vec<String>,
    /// Where sockets and per-VM files go (a fresh temporary directory when unset).
    #[arg(long, env = "E2B_SIM_STATE_DIR")]
    state_dir: Option<PathBuf>,
    /// Stop when stdin reaches its end (a test harness holding the pipe dies with it).
    #[arg(long)]
    watch_stdin: bool,
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some("guest") {
        return e2b_simulator::guest::main(&args[2..]);
    }
    let options = Options::parse();
    let config = match config(&options) {
        Ok(config) => config,
        Err(message) => {
            eprintln!("e2b-simulator: {message}");
            return ExitCode::from(2);
        }
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("e2b-simulator: no runtime: {e}");
            return ExitCode::from(1);
        }
    };
    runtime.block_on(serve(config, options.watch_stdin))
}

fn config(options: &Options) -> Result<Config, String> {
    let agent = std::env::current_exe().map_err(|e| format!("own path: {e}"))?;
    let mut config = Config::new(agent);
    if let Some(key) = &options.api_key {
        config.api_key = key.clone();
    }
    config.domain = options.domain.clone();
    config.runtime = options.runtime;
    config.template.image = options.template_image.clone();
    config.template.cpu_count = options.cpu_count;
    config.template.memory_mb = options.memory_mb;
    config.template.disk_size_mb = options.disk_size_mb;
    config.max_sandboxes = options.max_sandboxes;
    config.state_dir = options.state_dir.clone();
    let ca = match &options.upstream_ca {
        Some(path) => {
            Some(std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?)
        }
        None => None,
    };
    for host in &options.hosts {
        let (name, url) = host
            .split_once('=')
            .ok_or_else(|| format!("--host {host:?}: want NAME=URL"))?;
        config
            .hosts
            .push((name.to_owned(), Upstream::parse(url, ca.clone())?));
    }
    let mut faults = Faults::default();
    for fault in &options.faults {
        faults.set(fault)?;
    }
    config.faults = faults;
    Ok(config)
}

async fn serve(config: Config, watch_stdin: bool) -> ExitCode {
    let simulator = match Simulator::start(config).await {
        Ok(simulator) => simulator,
        Err(e) => {
            eprintln!("e2b-simulator: {e}");
            return ExitCode::from(1);
        }
    };
    println!("{}", simulator.listening_line());
    let stdin_closed = async {
        if watch_stdin {
            let mut sink = tokio::io::sink();
            let _ = tokio::io::copy(&mut tokio::io::stdin(), &mut sink).await;
        } else {
            std::future::pending::<()>().await;
        }
    };
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut signal) => {
                signal.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    tokio::select! {
        () = stdin_closed => {}
        () = terminate => {}
        _ = tokio::signal::ctrl_c() => {}
    }
    simulator.shutdown().await;
    ExitCode::SUCCESS
}
