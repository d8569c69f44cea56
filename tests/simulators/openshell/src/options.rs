//! The simulator's command line: everything is a flag (it reads no environment variable).

use std::net::SocketAddr;
use std::path::PathBuf;

/// How to run the simulator. `openshell-simulator --help` lists the same.
#[derive(Debug, Clone, clap::Parser)]
#[command(
    name = "openshell-simulator",
    about = "A stand-in for NVIDIA OpenShell's gateway (gRPC over mutual TLS) for plimsoll's tests; \
             each sandbox is a local locked-down container. Prints one JSON line when ready."
)]
pub struct Options {
    /// Directory for the test CA and certificates (created if missing): ca.crt, tls.crt and
    /// tls.key (the client's, as OpenShell's own mtls/ directory names them), server.crt,
    /// server.key.
    #[arg(long)]
    pub cert_dir: PathBuf,

    /// gRPC listen address. Loopback only; port 0 lets the OS choose.
    #[arg(long, default_value = "127.0.0.1:0")]
    pub listen: SocketAddr,

    /// Admin (faults) HTTP listen address. Loopback only; port 0 lets the OS choose.
    #[arg(long, default_value = "127.0.0.1:0")]
    pub admin_listen: SocketAddr,

    /// The Docker Engine's Unix socket.
    #[arg(long, default_value = "/var/run/docker.sock")]
    pub docker_socket: PathBuf,

    /// Docker runtime for sandboxes: `auto` (runsc when docker lists it, else runc), `runc`
    /// or `runsc`.
    #[arg(long, default_value = "auto")]
    pub runtime: String,

    /// The image a sandbox gets when its template names none (the gateway's default image).
    #[arg(long, default_value = "plimsoll/sandbox-node:latest")]
    pub default_image: String,

    /// The user sandbox processes run as (docker's `--user`).
    #[arg(long, default_value = "61000:61000")]
    pub sandbox_user: String,

    /// The process limit of every sandbox container.
    #[arg(long, default_value_t = 512)]
    pub pids_limit: i64,

    /// Lifetime of an SSH session token (the gateway's `ssh_session_ttl_secs`).
    #[arg(long, default_value_t = 86_400)]
    pub ssh_session_ttl_secs: u64,

    /// Refuse `template.driver_config`, as a gateway without `allow_driver_config = true` does.
    #[arg(long)]
    pub deny_driver_config: bool,

    /// Shut down (removing every container) when standard input reaches end of file, so a
    /// test that dies cannot leave the simulator or its containers behind.
    #[arg(long)]
    pub exit_on_stdin_eof: bool,

    /// Log filter for stderr (tracing's syntax, e.g. `info` or `openshell_simulator=debug`).
    #[arg(long, default_value = "info")]
    pub log: String,

    /// Shut down by itself after this many seconds, whatever happens.
    #[arg(long, default_value_t = 3_600)]
    pub max_lifetime_secs: u64,
}

impl Options {
    /// Refuses a setting that would make the simulator reachable beyond this machine or
    /// could never work.
    pub fn check(&self) -> Result<(), String> {
        for (flag, addr) in [
            ("--listen", self.listen),
            ("--admin-listen", self.admin_listen),
        ] {
            if !addr.ip().is_loopback() {
                return Err(format!(
                    "{flag} {addr}: the simulator listens on loopback only"
                ));
            }
        }
        if !matches!(self.runtime.as_str(), "auto" | "runc" | "runsc") {
            return Err(format!(
                "--runtime {}: use auto, runc or runsc",
                self.runtime
            ));
        }
        if self.pids_limit <= 0 {
            return Err("--pids-limit must be positive".into());
        }
        if self.max_lifetime_secs == 0 {
            return Err("--max-lifetime-secs must be positive".into());
        }
        Ok(())
    }
}
