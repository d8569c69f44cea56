//! The simulator's command line: everything is a flag (it reads no environment variable).

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;

/// How to run the simulator. `dockercloud-simulator --help` lists the same.
#[derive(Debug, Clone, clap::Parser)]
#[command(
    name = "dockercloud-simulator",
    about = "A stand-in for Docker Cloud Sandboxes (Connect and REST APIs, Docker Hub's token \
             exchange) for plimsoll's tests; each sandbox is a local locked-down container. \
             Prints one JSON line when ready."
)]
pub struct Options {
    /// The loopback address every listener binds (each on a port the OS chooses).
    #[arg(long, default_value = "127.0.0.1")]
    pub bind: IpAddr,

    /// The admin (faults) listener. Loopback only; port 0 lets the OS choose.
    #[arg(long, default_value = "127.0.0.1:0")]
    pub admin_listen: SocketAddr,

    /// The Docker account name the token exchange accepts (`identifier`).
    #[arg(long, default_value = "plimsoll-sim")]
    pub username: String,

    /// The personal access token the token exchange accepts (`secret`); a fresh random
    /// `dckr_pat_…` when not given. The ready line reports it.
    #[arg(long)]
    pub token: Option<String>,

    /// Lifetime of an exchanged access token (its JWT `exp`), in seconds.
    #[arg(long, default_value_t = 900)]
    pub access_token_ttl_secs: u64,

    /// The Docker Engine's Unix socket.
    #[arg(long, default_value = "/var/run/docker.sock")]
    pub docker_socket: PathBuf,

    /// Docker runtime for sandboxes: `auto` (runsc when docker lists it, else runc), `runc`
    /// or `runsc`.
    #[arg(long, default_value = "auto")]
    pub runtime: String,

    /// A local image the service can "pull", as `REF` or `REF=LOCAL` (a reference the
    /// API accepts, backed by a local image). Repeatable. Its linux/amd64 manifest digest
    /// is the local image's id. Default: the simulator's own sandbox image.
    #[arg(long = "image")]
    pub images: Vec<String>,

    /// The user sandbox processes run as (docker's `--user`).
    #[arg(long, default_value = "61000:61000")]
    pub sandbox_user: String,

    /// The process limit of every sandbox container.
    #[arg(long, default_value_t = 512)]
    pub pids_limit: i64,

    /// Size of each sandbox's writable /tmp, in MiB.
    #[arg(long, default_value_t = 256)]
    pub tmp_mib: u64,

    /// The account's quota of running sandboxes.
    #[arg(long, default_value_t = 10)]
    pub max_running: usize,

    /// CPU range the capabilities report and creates are held to.
    #[arg(long, default_value_t = 1)]
    pub cpu_min: u32,
    #[arg(long, default_value_t = 4)]
    pub cpu_max: u32,

    /// Memory range (MiB) the capabilities report and creates are held to.
    #[arg(long, default_value_t = 512)]
    pub memory_mib_min: u64,
    #[arg(long, default_value_t = 8192)]
    pub memory_mib_max: u64,

    /// The guard's host name: a network-policy PUT that allows `<guard-host>:443` opens
    /// that one destination from the sandbox, forwarded to `--guard-target`.
    #[arg(long)]
    pub guard_host: Option<String>,

    /// Where `<guard-host>:443` really goes: a loopback `host:port` the test serves.
    #[arg(long)]
    pub guard_target: Option<SocketAddr>,

    /// Shut down (removing every container) when standard input reaches end of file, so a
    /// test that dies cannot leave the simulator or its containers behind.
    #[arg(long)]
    pub exit_on_stdin_eof: bool,

    /// Log filter for stderr (tracing's syntax, e.g. `info` or `dockercloud_simulator=debug`).
    #[arg(long, default_value = "info")]
    pub log: String,

    /// Shut down by itself after this many seconds, whatever happens.
    #[arg(long, default_value_t = 3_600)]
    pub max_lifetime_secs: u64,
}

/// The image the simulator serves when no `--image` is given (`image/build` makes it).
pub const DEFAULT_IMAGE: &str = "plimsoll-sim/dockercloud-sandbox:latest";

impl Options {
    /// Refuses a setting that would make the simulator reachable beyond this machine or
    /// could never work.
    pub fn check(&self) -> Result<(), String> {
        if !self.bind.is_loopback() || !self.admin_listen.ip().is_loopback() {
            return Err("the simulator listens on loopback only".into());
        }
        if let Some(target) = self.guard_target
            && !target.ip().is_loopback()
        {
            return Err(format!("--guard-target {target}: loopback only"));
        }
        if self.guard_host.is_some() != self.guard_target.is_some() {
            return Err("--guard-host and --guard-target go together".into());
        }
        if let Some(host) = &self.guard_host
            && (host.is_empty()
                || !host
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '.' || c == '-'))
        {
            return Err(format!("--guard-host {host:?}: a DNS name"));
        }
        if !matches!(self.runtime.as_str(), "auto" | "runc" | "runsc") {
            return Err(format!(
                "--runtime {}: use auto, runc or runsc",
                self.runtime
            ));
        }
        if self.pids_limit <= 0 || self.tmp_mib == 0 || self.max_lifetime_secs == 0 {
            return Err("--pids-limit, --tmp-mib and --max-lifetime-secs must be positive".into());
        }
        if self.cpu_min == 0 || self.cpu_min > self.cpu_max {
            return Err("--cpu-min must be positive and at most --cpu-max".into());
        }
        if self.memory_mib_min == 0 || self.memory_mib_min > self.memory_mib_max {
            return Err("--memory-mib-min must be positive and at most --memory-mib-max".into());
        }
        if self.access_token_ttl_secs < 61 {
            return Err("--access-token-ttl-secs must exceed 60".into());
        }
        Ok(())
    }
}
