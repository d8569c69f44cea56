//! The simulator's settings: one [`Config`], filled from the command line (see `main.rs`, whose
//! flags each name their environment variable) or built by a test.

use std::net::IpAddr;
use std::path::PathBuf;
use std::time::Duration;

use crate::faults::Faults;

/// The template image `template/build` makes.
pub const DEFAULT_TEMPLATE_IMAGE: &str = "plimsoll-sim/e2b-base:latest";
/// The envd version every sandbox reports. 0.5.7 is the newest envd whose features the
/// simulator has all of: octet-stream uploads (0.5.7) yes, file metadata xattrs (0.6.2) no, so
/// E2B's SDK refuses metadata writes itself instead of the simulator dropping them.
pub const ENVD_VERSION: &str = "0.5.7";
/// envd's port, the one E2B's proxy routes to envd.
pub const ENVD_PORT: u16 = 49983;

/// Which OCI runtime runs the VMs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Runtime {
    /// gVisor when docker has it registered, else runc.
    Auto,
    Runc,
    Runsc,
}

impl std::str::FromStr for Runtime {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "auto" | "" => Ok(Runtime::Auto),
            "runc" => Ok(Runtime::Runc),
            "runsc" => Ok(Runtime::Runsc),
            other => Err(format!("runtime {other:?}: use auto, runc or runsc")),
        }
    }
}

impl Runtime {
    pub fn name(self) -> &'static str {
        match self {
            Runtime::Auto => "auto",
            Runtime::Runc => "runc",
            Runtime::Runsc => "runsc",
        }
    }
}

/// The one template the simulator serves.
#[derive(Debug, Clone)]
pub struct Template {
    /// The template id (`templateID`).
    pub id: String,
    /// Its alias; create accepts either.
    pub alias: String,
    /// The docker image its VMs run.
    pub image: String,
    /// Reported and enforced (`--cpus`).
    pub cpu_count: u32,
    /// Reported and enforced (`--memory`).
    pub memory_mb: u32,
    /// Reported; each writable tmpfs (`/home/user`, `/tmp`) gets this size, and all of them
    /// together stay within the memory limit.
    pub disk_size_mb: u32,
}

impl Default for Template {
    fn default() -> Self {
        Template {
            id: "e2bsimbase0000000001".to_owned(),
            alias: "base".to_owned(),
            image: DEFAULT_TEMPLATE_IMAGE.to_owned(),
            cpu_count: 2,
            memory_mb: 512,
            disk_size_mb: 1024,
        }
    }
}

/// Where the egress proxy sends a mapped host's traffic: a loopback address, never further.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Upstream {
    /// `http` or `https`.
    pub tls: bool,
    pub ip: IpAddr,
    pub port: u16,
    /// PEM certificates the upstream's TLS certificate must chain to (for `https`).
    pub ca_pem: Option<String>,
}

impl Upstream {
    /// Parses `http://127.0.0.1:PORT` or `https://[::1]:PORT`; only loopback is accepted.
    pub fn parse(url: &str, ca_pem: Option<String>) -> Result<Upstream, String> {
        let (tls, rest) = if let Some(rest) = url.strip_prefix("https://") {
            (true, rest)
        } else if let Some(rest) = url.strip_prefix("http://") {
            (false, rest)
        } else {
            return Err(format!("upstream {url:?}: use http:// or https://"));
        };
        let rest = rest.trim_end_matches('/');
        let addr: std::net::SocketAddr = rest
            .parse()
            .map_err(|_| format!("upstream {url:?}: want a literal IP and a port"))?;
        if !addr.ip().is_loopback() {
            return Err(format!("upstream {url:?}: only loopback addresses"));
        }
        if tls && ca_pem.is_none() {
            return Err(format!("upstream {url:?}: https needs a CA to verify it"));
        }
        Ok(Upstream {
            tls,
            ip: addr.ip(),
            port: addr.port(),
            ca_pem,
        })
    }
}

/// Everything the simulator needs to start.
#[derive(Debug, Clone)]
pub struct Config {
    /// The one API key (`X-API-Key`) the control plane accepts.
    pub api_key: String,
    /// The sandbox domain: `domain` in create answers, and host routing `49983-<id>.<domain>`.
    pub domain: String,
    pub runtime: Runtime,
    pub template: Template,
    /// The agent binary mounted into every VM (this binary).
    pub agent: PathBuf,
    /// Sockets, the CA and per-VM files live here; a fresh temporary directory when `None`.
    pub state_dir: Option<PathBuf>,
    /// Hosts the egress proxy can reach, each mapped to a loopback upstream.
    pub hosts: Vec<(String, Upstream)>,
    /// The faults on at start.
    pub faults: Faults,
    /// Running or paused sandboxes at most; create answers 429 beyond.
    pub max_sandboxes: usize,
    /// The longest `timeout` create and connect accept.
    pub max_timeout: Duration,
}

impl Config {
    /// Settings for a test: a random API key, the default template, auto runtime.
    pub fn new(agent: PathBuf) -> Config {
        Config {
            api_key: format!("e2b_{}", crate::token::hex(20)),
            domain: "e2b.localhost".to_owned(),
            runtime: Runtime::Auto,
            template: Template::default(),
            agent,
            state_dir: None,
            hosts: Vec::new(),
            faults: Faults::default(),
            max_sandboxes: 16,
            max_timeout: Duration::from_secs(24 * 3600),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn upstreams_are_loopback_only_and_https_needs_a_ca() {
        assert!(Upstream::parse("http://127.0.0.1:8080", None).is_ok());
        assert!(Upstream::parse("http://[::1]:8080/", None).is_ok());
        assert!(Upstream::parse("http://10.0.0.1:80", None).is_err());
        assert!(Upstream::parse("http://localhost:80", None).is_err());
        assert!(Upstream::parse("https://127.0.0.1:443", None).is_err());
        assert!(Upstream::parse("https://127.0.0.1:443", Some("pem".into())).is_ok());
    }
}
