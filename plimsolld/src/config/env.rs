//! Every environment variable the daemon reads: its name, its default, its one-line meaning.
//!
//! This file is the only place that names a variable. [`VARIABLES`] drives both the help text
//! ([`help_text`]) and unknown-variable detection ([`unknown_variables`]), so a variable cannot
//! be read without being documented, and cannot be documented without being recognised.
//! Values arrive through [`Strings`]: [`ProcessEnv`] in the daemon, a `HashMap` in tests.

use std::collections::HashMap;

use crate::provider::config::KNOWN_PROVIDERS;

// === Variable names ===

/// RPC listener, `host:port`. Default [`DEFAULT_ADDR`]. Not trimmed.
pub const ENV_ADDR: &str = "PLIMSOLL_ADDR";
/// Metrics listener, `host:port` or `off`. Default [`DEFAULT_METRICS_ADDR`]. Trimmed.
pub const ENV_METRICS_ADDR: &str = "PLIMSOLL_METRICS_ADDR";
/// A file the daemon writes its bound RPC address to (`host:port` and a newline) once it
/// listens, and removes when it stops: how scripts learn a `:0` port. Unset: no file.
pub const ENV_ADDR_FILE: &str = "PLIMSOLL_ADDR_FILE";
/// `text` selects key=value logs; anything else means JSON.
pub const ENV_LOG_FORMAT: &str = guard::env::LOG_FORMAT;
/// Path of the caller registry; wins over [`ENV_TOKEN`].
pub const ENV_CLIENTS_FILE: &str = "PLIMSOLL_CLIENTS_FILE";
/// One shared bearer token (visible ASCII, 32..=4096 bytes). Not trimmed.
pub const ENV_TOKEN: &str = "PLIMSOLL_TOKEN";
/// Exactly `1` allows a real provider without authentication.
pub const ENV_INSECURE: &str = "PLIMSOLL_INSECURE";
/// PEM certificate chain; set together with [`ENV_TLS_KEY`].
pub const ENV_TLS_CERT: &str = guard::env::TLS_CERT;
/// PEM private key; set together with [`ENV_TLS_CERT`].
pub const ENV_TLS_KEY: &str = guard::env::TLS_KEY;
/// Strict boolean: enforce the production policy.
pub const ENV_HARDENED: &str = guard::env::HARDENED;
/// Which sandbox provider runs code; unset means `disabled`.
pub const ENV_PROVIDER: &str = "SANDBOX_PROVIDER";
/// Daemon-wide isolation floor: `process`, `container`, `kernel` or `vm`.
pub const ENV_MIN_ISOLATION: &str = "SANDBOX_MIN_ISOLATION";
/// Per-run memory in MiB; 0 means the provider's default.
pub const ENV_MEMORY_MB: &str = "SANDBOX_MEMORY_MB";
/// Per-run CPUs; 0 means the provider's default.
pub const ENV_CPUS: &str = "SANDBOX_CPUS";
/// Per-run process limit; 0 means none.
pub const ENV_PIDS: &str = "SANDBOX_PIDS";
/// Per-run writable disk in MiB; 0 means none.
pub const ENV_DISK_MB: &str = "SANDBOX_DISK_MB";
/// Global cap on runs in flight, in `[1, 1024]`.
pub const ENV_MAX_CONCURRENT: &str = guard::env::MAX_CONCURRENT;
/// Host memory budget in MiB for all runs at once; 0 = off.
pub const ENV_TOTAL_MEMORY_MB: &str = "SANDBOX_TOTAL_MEMORY_MB";
/// Runs in flight per caller; default `max(1, max_concurrent / 2)`; 0 = no per-caller cap.
pub const ENV_PER_KEY_CONCURRENT: &str = "SANDBOX_PER_KEY_CONCURRENT";
/// Per-caller token-bucket refill, runs per minute; 0 = no rate limit.
pub const ENV_RATE_PER_MIN: &str = "SANDBOX_RATE_PER_MIN";
/// Per-caller token-bucket capacity; 0 means the same as the rate.
pub const ENV_RATE_BURST: &str = "SANDBOX_RATE_BURST";
/// Daemon-wide daily allowance of paid VM seconds; only metered providers accept it.
pub const ENV_PAID_SECONDS_PER_DAY: &str = "SANDBOX_PAID_SECONDS_PER_DAY";
/// docker: the snippet image (a tag or a content id); runs use the id inspected at startup.
pub const ENV_DOCKER_IMAGE: &str = "SANDBOX_DOCKER_IMAGE";
/// docker: the project and session image.
pub const ENV_DOCKER_PROJECT_IMAGE: &str = "SANDBOX_DOCKER_PROJECT_IMAGE";
/// docker: the module image (sim-worker and its models); unset, modules are unsupported.
pub const ENV_DOCKER_MODULE_IMAGE: &str = "SANDBOX_DOCKER_MODULE_IMAGE";
/// docker: the OCI runtime; `runsc` (gVisor) for the kernel tier, empty for runc.
pub const ENV_DOCKER_RUNTIME: &str = "SANDBOX_DOCKER_RUNTIME";
/// docker: a seccomp profile path, `unconfined` or `default`; empty keeps docker's default.
pub const ENV_DOCKER_SECCOMP: &str = "SANDBOX_DOCKER_SECCOMP";
/// docker: the guest uid and gid, default 61000.
pub const ENV_GUEST_UID: &str = "SANDBOX_GUEST_UID";
/// Strict boolean: every image must be pinned by digest or content id.
pub const ENV_REQUIRE_PINNED_IMAGES: &str = "SANDBOX_REQUIRE_PINNED_IMAGES";
/// docker: the Engine endpoint; only `unix://` (or an absolute socket path) is accepted.
pub const ENV_DOCKER_HOST: &str = "DOCKER_HOST";
/// docker: a CLI context name; refused unless empty or `default` (contexts are not read).
pub const ENV_DOCKER_CONTEXT: &str = "DOCKER_CONTEXT";
/// openshell: the gateway's gRPC endpoint, `https://host:port` with no path (required).
pub const ENV_OPENSHELL_GATEWAY_URL: &str = "SANDBOX_OPENSHELL_GATEWAY_URL";
/// openshell: PEM roots the gateway's server certificate must chain to (required).
pub const ENV_OPENSHELL_CA_FILE: &str = "SANDBOX_OPENSHELL_CA_FILE";
/// openshell: the PEM client certificate plimsolld presents (required).
pub const ENV_OPENSHELL_CERT_FILE: &str = "SANDBOX_OPENSHELL_CERT_FILE";
/// openshell: the client certificate's PEM private key (required).
pub const ENV_OPENSHELL_KEY_FILE: &str = "SANDBOX_OPENSHELL_KEY_FILE";
/// openshell: the sandbox image (node, sh, the runner, its guard and the relay; required).
pub const ENV_OPENSHELL_IMAGE: &str = "SANDBOX_OPENSHELL_IMAGE";
/// e2b: the API key sent as `X-API-Key` (required; never logged).
pub const ENV_E2B_API_KEY: &str = "E2B_API_KEY";
/// e2b: the template every VM is created from; default `base` (hardened mode requires it set).
pub const ENV_E2B_TEMPLATE: &str = "E2B_TEMPLATE";
/// e2b: the guard's public `https://` URL granted runs reach the broker through.
pub const ENV_E2B_GUARD_URL: &str = "E2B_GUARD_URL";
/// e2b: the IPv4 address granted VMs connect to for the guard's name (they have no
/// nameserver); unset: this host's resolver's answer for the guard URL's host.
pub const ENV_E2B_GUARD_ADDRESS: &str = "E2B_GUARD_ADDRESS";
/// e2b: how a session's granted calls get the guard: `session`, `call` or unset.
pub const ENV_E2B_SESSION_GRANTS: &str = "E2B_SESSION_GRANTS";
/// e2b: the control plane's base URL (as E2B's SDK reads it); default `https://api.<domain>`.
pub const ENV_E2B_API_URL: &str = "E2B_API_URL";
/// e2b: the domain sandboxes are reached under (as E2B's SDK reads it); default `e2b.app`.
pub const ENV_E2B_DOMAIN: &str = "E2B_DOMAIN";
/// e2b: one base URL for every sandbox's envd, routed by headers (as E2B's SDK reads it).
pub const ENV_E2B_SANDBOX_URL: &str = "E2B_SANDBOX_URL";
/// dockercloud: the personal access token, exchanged for a short-lived bearer (never logged).
pub const ENV_DOCKERCLOUD_TOKEN: &str = "DOCKER_SBX_TOKEN";
/// dockercloud: the Docker account the personal access token belongs to.
pub const ENV_DOCKERCLOUD_USERNAME: &str = "DOCKER_SBX_USERNAME";
/// dockercloud: the token exchange; default `https://hub.docker.com/v2/auth/token`.
pub const ENV_DOCKERCLOUD_AUTH_URL: &str = "SANDBOX_DOCKERCLOUD_AUTH_URL";
/// dockercloud: the transport, `connect` (default) or `rest`; never switched at run time.
pub const ENV_DOCKERCLOUD_API: &str = "SANDBOX_DOCKERCLOUD_API";
/// dockercloud: the API base (connect: required; rest: default `https://connect.docker.com/sandboxes`).
pub const ENV_DOCKERCLOUD_API_URL: &str = "SANDBOX_DOCKERCLOUD_API_URL";
/// dockercloud: the OCI image every sandbox boots (`@sha256:` of the linux/amd64 manifest to pin).
pub const ENV_DOCKERCLOUD_IMAGE: &str = "SANDBOX_DOCKERCLOUD_IMAGE";
/// dockercloud: an image from the account's store, `<id>@sha256:<digest>` (connect only).
pub const ENV_DOCKERCLOUD_STORE_IMAGE: &str = "SANDBOX_DOCKERCLOUD_STORE_IMAGE";
/// dockercloud: the guard's public `https://` URL on 443; enables grants (connect only).
pub const ENV_DOCKERCLOUD_GUARD_URL: &str = "SANDBOX_DOCKERCLOUD_GUARD_URL";
/// dockercloud: the network-policy API; default `https://api.sandboxes-cloud.docker.com/v1`.
pub const ENV_DOCKERCLOUD_POLICY_URL: &str = "SANDBOX_DOCKERCLOUD_POLICY_URL";
/// Live sessions at once; 0 (the default) turns sessions off.
pub const ENV_MAX_SESSIONS: &str = "SANDBOX_MAX_SESSIONS";
/// Live sessions per caller; 0 = no per-caller cap.
pub const ENV_MAX_SESSIONS_PER_CALLER: &str = "SANDBOX_MAX_SESSIONS_PER_CALLER";
/// Live sessions per stated owner; at the cap an open replaces the owner's oldest idle one.
pub const ENV_MAX_SESSIONS_PER_OWNER: &str = "SANDBOX_MAX_SESSIONS_PER_OWNER";
/// A session's lifetime, a duration in [1s, 12h]; default 30m.
pub const ENV_SESSION_LIFETIME: &str = "SANDBOX_SESSION_LIFETIME";
/// Idle time before a session is suspended: 0 (never) or [1s, 12h]; default 5m.
pub const ENV_SESSION_IDLE: &str = "SANDBOX_SESSION_IDLE";
/// A session's disk budget in MiB, measured after each call; 0 = no bound; default 1024.
pub const ENV_SESSION_DISK_MB: &str = "SANDBOX_SESSION_DISK_MB";
/// Warm session sandboxes kept ready (docker only); 0 (the default) keeps none.
pub const ENV_SESSION_POOL: &str = "SANDBOX_SESSION_POOL";

/// The broker's and the guard's variables, named once in `broker::env` and `guard::env` and
/// listed in [`VARIABLES`] too: plimsolld picks its grant path from them and its supervised
/// children read them.
pub const BROKER_VARIABLES: &[&str] = &[
    broker::env::BROKER_SOCKET,
    broker::env::GRANTS_FILE,
    broker::env::BROKER_CA_FILE,
    guard::env::GUARD_ADDR,
];

// === Defaults and limits ===

/// Default RPC listener. Loopback on purpose: upstream's default is `:8746` (every interface);
/// this project makes exposure an explicit choice.
pub const DEFAULT_ADDR: &str = "127.0.0.1:8746";
/// Default metrics listener.
pub const DEFAULT_METRICS_ADDR: &str = "127.0.0.1:9464";
/// Default for [`ENV_MAX_CONCURRENT`].
pub const DEFAULT_MAX_CONCURRENT: u32 = 8;
/// Largest accepted [`ENV_MAX_CONCURRENT`].
pub const MAX_CONCURRENT_LIMIT: u32 = 1024;
/// Default for [`ENV_DOCKER_IMAGE`]: the snippet image `images/build` makes (no registry is
/// reachable, so upstream's `node:22-alpine` cannot be pulled).
pub const DEFAULT_DOCKER_IMAGE: &str = "plimsoll/sandbox-node:latest";
/// Default for [`ENV_DOCKER_PROJECT_IMAGE`]: the project image `images/build` makes.
pub const DEFAULT_DOCKER_PROJECT_IMAGE: &str = "plimsoll/sandbox:latest";
/// Default for [`ENV_GUEST_UID`].
pub const DEFAULT_GUEST_UID: u32 = 61_000;
/// Default for [`ENV_DOCKER_HOST`].
pub const DEFAULT_DOCKER_SOCKET: &str = "/var/run/docker.sock";

// === The table ===

/// Where a variable appears in the help text.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HelpGroup {
    /// The provider choice and the isolation floor.
    Provider,
    /// Listeners, authentication, transport and policy.
    Listeners,
    /// The docker provider's settings.
    Docker,
    /// The openshell provider's settings.
    OpenShell,
    /// The e2b provider's settings.
    E2b,
    /// The dockercloud provider's settings.
    DockerCloud,
    /// Per-run envelope and admission limits.
    Limits,
}

/// One documented variable.
#[derive(Debug, Clone, Copy)]
pub struct Variable {
    /// The exact name, one of the `ENV_` constants.
    pub name: &'static str,
    /// The default as an operator would read it.
    pub default: &'static str,
    /// One line on what it does.
    pub meaning: &'static str,
    /// Its help-text section.
    pub group: HelpGroup,
}

const fn var(
    name: &'static str,
    default: &'static str,
    meaning: &'static str,
    group: HelpGroup,
) -> Variable {
    Variable {
        name,
        default,
        meaning,
        group,
    }
}

/// Every variable the daemon reads, in help-text order within each group.
pub const VARIABLES: &[Variable] = &[
    var(
        ENV_PROVIDER,
        "disabled",
        "sandbox provider; this build has:",
        HelpGroup::Provider,
    ),
    var(
        ENV_MIN_ISOLATION,
        "unset (no floor)",
        "refuse to start below this tier: process, container, kernel or vm",
        HelpGroup::Provider,
    ),
    var(
        ENV_ADDR,
        DEFAULT_ADDR,
        "RPC listener host:port (:0 picks a free port; not trimmed)",
        HelpGroup::Listeners,
    ),
    var(
        ENV_METRICS_ADDR,
        DEFAULT_METRICS_ADDR,
        "metrics listener host:port, or off",
        HelpGroup::Listeners,
    ),
    var(
        ENV_ADDR_FILE,
        "unset",
        "file written with the bound RPC address (host:port) once listening; removed at exit",
        HelpGroup::Listeners,
    ),
    var(
        ENV_LOG_FORMAT,
        "json",
        "log format: json or text (anything else means json)",
        HelpGroup::Listeners,
    ),
    var(
        ENV_CLIENTS_FILE,
        "unset",
        "caller registry (see plimsoll-clients); wins over PLIMSOLL_TOKEN",
        HelpGroup::Listeners,
    ),
    var(
        ENV_TOKEN,
        "unset",
        "one shared bearer token, 32 to 4096 visible ASCII bytes",
        HelpGroup::Listeners,
    ),
    var(
        ENV_INSECURE,
        "unset",
        "1 allows a real provider without authentication (development only)",
        HelpGroup::Listeners,
    ),
    var(
        ENV_TLS_CERT,
        "unset (cleartext)",
        "PEM certificate chain; TLS on every listener (set with PLIMSOLL_TLS_KEY)",
        HelpGroup::Listeners,
    ),
    var(
        ENV_TLS_KEY,
        "unset (cleartext)",
        "PEM private key (set with PLIMSOLL_TLS_CERT)",
        HelpGroup::Listeners,
    ),
    var(
        ENV_HARDENED,
        "0",
        "1 or true enforces the production policy and refuses to serve otherwise",
        HelpGroup::Listeners,
    ),
    var(
        broker::env::BROKER_SOCKET,
        "unset",
        "an operator-run broker's control socket (absolute path); grants go through it",
        HelpGroup::Listeners,
    ),
    var(
        broker::env::GRANTS_FILE,
        "unset (no profiles)",
        "grant profiles; without PLIMSOLL_BROKER_SOCKET plimsolld supervises a broker child \
         that inherits its environment (weaker: the secrets pass through plimsolld)",
        HelpGroup::Listeners,
    ),
    var(
        broker::env::BROKER_CA_FILE,
        "unset",
        "extra PEM roots the supervised broker trusts for upstream TLS",
        HelpGroup::Listeners,
    ),
    var(
        ENV_MEMORY_MB,
        "0 (provider default)",
        "per-run memory in MiB",
        HelpGroup::Limits,
    ),
    var(
        ENV_CPUS,
        "0 (provider default)",
        "per-run CPUs, a finite non-negative number",
        HelpGroup::Limits,
    ),
    var(
        ENV_PIDS,
        "0 (none)",
        "per-run process limit (refused by wasm)",
        HelpGroup::Limits,
    ),
    var(
        ENV_DISK_MB,
        "0 (none)",
        "per-run writable disk in MiB (refused by wasm)",
        HelpGroup::Limits,
    ),
    var(
        ENV_MAX_CONCURRENT,
        "8",
        "runs in flight across all callers, 1 to 1024",
        HelpGroup::Limits,
    ),
    var(
        ENV_TOTAL_MEMORY_MB,
        "0 (no memory budget)",
        "host memory budget in MiB; lowers the run cap to what fits",
        HelpGroup::Limits,
    ),
    var(
        ENV_PER_KEY_CONCURRENT,
        "max(1, cap/2)",
        "runs in flight per caller; 0 = no per-caller cap",
        HelpGroup::Limits,
    ),
    var(
        ENV_RATE_PER_MIN,
        "30",
        "per-caller runs per minute (token bucket); 0 = off",
        HelpGroup::Limits,
    ),
    var(
        ENV_RATE_BURST,
        "= rate",
        "per-caller bucket size; 0 means the rate",
        HelpGroup::Limits,
    ),
    var(
        ENV_PAID_SECONDS_PER_DAY,
        "0 (none)",
        "daily paid VM seconds; metered providers only",
        HelpGroup::Limits,
    ),
    var(
        ENV_MAX_SESSIONS,
        "0 (sessions off)",
        "live sessions at once; docker with its project image, openshell or e2b",
        HelpGroup::Limits,
    ),
    var(
        ENV_MAX_SESSIONS_PER_CALLER,
        "0 (no cap)",
        "live sessions per caller",
        HelpGroup::Limits,
    ),
    var(
        ENV_MAX_SESSIONS_PER_OWNER,
        "0 (no cap)",
        "live sessions per owner; at the cap an open replaces the oldest idle one",
        HelpGroup::Limits,
    ),
    var(
        ENV_SESSION_LIFETIME,
        "30m",
        "a session's lifetime, 1s to 12h",
        HelpGroup::Limits,
    ),
    var(
        ENV_SESSION_IDLE,
        "5m",
        "idle time before a session is suspended: 0 (never) or 1s to 12h",
        HelpGroup::Limits,
    ),
    var(
        ENV_SESSION_DISK_MB,
        "1024",
        "a session's disk budget in MiB, measured after each call; 0 = no bound",
        HelpGroup::Limits,
    ),
    var(
        ENV_SESSION_POOL,
        "0 (no pool)",
        "warm session sandboxes kept ready, at most SANDBOX_MAX_SESSIONS; docker only",
        HelpGroup::Limits,
    ),
    var(
        ENV_DOCKER_IMAGE,
        DEFAULT_DOCKER_IMAGE,
        "snippet image; runs start the content id inspected at startup",
        HelpGroup::Docker,
    ),
    var(
        ENV_DOCKER_PROJECT_IMAGE,
        DEFAULT_DOCKER_PROJECT_IMAGE,
        "project image (node, python3, sh); inspected and proven at startup",
        HelpGroup::Docker,
    ),
    var(
        ENV_DOCKER_MODULE_IMAGE,
        "unset (no modules)",
        "module image (images/build makes plimsoll/sandbox-module:latest); proven at startup",
        HelpGroup::Docker,
    ),
    var(
        ENV_DOCKER_RUNTIME,
        "unset (runc)",
        "runsc for gVisor (tier kernel, must be registered with --host-uds=open)",
        HelpGroup::Docker,
    ),
    var(
        ENV_DOCKER_SECCOMP,
        "unset (docker's profile)",
        "seccomp profile path (e.g. seccomp/profile.json), unconfined or default; runc only",
        HelpGroup::Docker,
    ),
    var(
        ENV_GUEST_UID,
        "61000",
        "guest uid and gid, 1 to 65532, outside systemd's bands and the host's accounts",
        HelpGroup::Docker,
    ),
    var(
        ENV_REQUIRE_PINNED_IMAGES,
        "0",
        "1 requires every image as name@sha256:<digest> or a sha256:<id> content id",
        HelpGroup::Docker,
    ),
    var(
        ENV_DOCKER_HOST,
        "unix:///var/run/docker.sock",
        "docker endpoint; only a local unix:// socket is accepted",
        HelpGroup::Docker,
    ),
    var(
        ENV_DOCKER_CONTEXT,
        "unset",
        "refused unless default: set DOCKER_HOST instead",
        HelpGroup::Docker,
    ),
    var(
        ENV_OPENSHELL_GATEWAY_URL,
        "unset (required)",
        "the gateway, https://host:port (gRPC over mutual TLS; no proxy is used)",
        HelpGroup::OpenShell,
    ),
    var(
        ENV_OPENSHELL_CA_FILE,
        "unset (required)",
        "PEM roots for the gateway's certificate (the only roots trusted)",
        HelpGroup::OpenShell,
    ),
    var(
        ENV_OPENSHELL_CERT_FILE,
        "unset (required)",
        "PEM client certificate presented to the gateway",
        HelpGroup::OpenShell,
    ),
    var(
        ENV_OPENSHELL_KEY_FILE,
        "unset (required)",
        "PEM private key of the client certificate",
        HelpGroup::OpenShell,
    ),
    var(
        ENV_OPENSHELL_IMAGE,
        "unset (required)",
        "sandbox image with node, sh, /runner.mjs, its guard and plimsoll-relay",
        HelpGroup::OpenShell,
    ),
    var(
        guard::env::GUARD_ADDR,
        "unset",
        "the supervised guard's listener host:port; required with a guard URL and a supervised broker",
        HelpGroup::Listeners,
    ),
    var(
        ENV_E2B_API_KEY,
        "unset (required)",
        "E2B's API key (sent only to the control plane)",
        HelpGroup::E2b,
    ),
    var(
        ENV_E2B_TEMPLATE,
        "base",
        "the template every VM is created from (hardened mode: required)",
        HelpGroup::E2b,
    ),
    var(
        ENV_E2B_GUARD_URL,
        "unset (no grants)",
        "the guard's public https:// URL that granted VMs reach",
        HelpGroup::E2b,
    ),
    var(
        ENV_E2B_GUARD_ADDRESS,
        "the guard host's IPv4 address here",
        "the IPv4 address granted VMs (which have no nameserver) connect to for the guard",
        HelpGroup::E2b,
    ),
    var(
        ENV_E2B_SESSION_GRANTS,
        "unset",
        "session | call: how a session's granted calls reach the guard",
        HelpGroup::E2b,
    ),
    var(
        ENV_E2B_API_URL,
        "https://api.<domain>",
        "the control plane (plain http only on loopback)",
        HelpGroup::E2b,
    ),
    var(
        ENV_E2B_DOMAIN,
        "e2b.app",
        "sandboxes' envd at https://49983-<id>.<domain>",
        HelpGroup::E2b,
    ),
    var(
        ENV_E2B_SANDBOX_URL,
        "unset",
        "one envd base URL routed by headers (plain http only on loopback)",
        HelpGroup::E2b,
    ),
    var(
        ENV_DOCKERCLOUD_TOKEN,
        "unset (required)",
        "Docker personal access token (sent only to the token exchange)",
        HelpGroup::DockerCloud,
    ),
    var(
        ENV_DOCKERCLOUD_USERNAME,
        "unset (required)",
        "the Docker account of that token",
        HelpGroup::DockerCloud,
    ),
    var(
        ENV_DOCKERCLOUD_AUTH_URL,
        "https://hub.docker.com/v2/auth/token",
        "the token exchange (plain http only on loopback)",
        HelpGroup::DockerCloud,
    ),
    var(
        ENV_DOCKERCLOUD_API,
        "connect",
        "connect | rest (rest: no grants, runs capped at 270 s)",
        HelpGroup::DockerCloud,
    ),
    var(
        ENV_DOCKERCLOUD_API_URL,
        "unset (connect: required); rest: https://connect.docker.com/sandboxes",
        "the sandboxes API base (plain http only on loopback)",
        HelpGroup::DockerCloud,
    ),
    var(
        ENV_DOCKERCLOUD_IMAGE,
        "unset",
        "the OCI image (pinned: @sha256: of the linux/amd64 manifest)",
        HelpGroup::DockerCloud,
    ),
    var(
        ENV_DOCKERCLOUD_STORE_IMAGE,
        "unset",
        "instead: <image id>@sha256:<digest> from the account's store (connect only)",
        HelpGroup::DockerCloud,
    ),
    var(
        ENV_DOCKERCLOUD_GUARD_URL,
        "unset (no grants)",
        "the guard's public https:// URL on 443 (connect only)",
        HelpGroup::DockerCloud,
    ),
    var(
        ENV_DOCKERCLOUD_POLICY_URL,
        "https://api.sandboxes-cloud.docker.com/v1",
        "the network-policy API (plain http only on loopback)",
        HelpGroup::DockerCloud,
    ),
];

const HELP_HEAD: &str = "\
plimsolld: the plimsoll sandbox daemon.

Usage: plimsolld
plimsolld takes no arguments; every setting is an environment variable.
-h, --help or help prints this text.
";

const HELP_ENDPOINTS: &str = "\
Endpoints:
  RPC listener:      POST /plimsoll.v1.SandboxService/{Run,Describe,OpenSession,SessionRun,CloseSession}
                     /healthz (always ok), /readyz (provider preflight)
  metrics listener:  GET /metrics (Prometheus text, no authentication)
";

/// The daemon's help text, generated from [`VARIABLES`] and [`KNOWN_PROVIDERS`].
///
/// Sections: a fixed head, the provider line listing this build's providers, listeners and
/// authentication, limits, then the endpoints. Every variable the daemon reads appears once.
pub fn help_text() -> String {
    let width = VARIABLES.iter().map(|v| v.name.len()).max().unwrap_or(0) + 2;
    let providers: Vec<&str> = KNOWN_PROVIDERS.iter().map(|p| p.name).collect();
    let mut out = String::from(HELP_HEAD);
    for (group, title) in [
        (HelpGroup::Provider, "Provider"),
        (
            HelpGroup::Listeners,
            "Listeners, authentication and transport",
        ),
        (HelpGroup::Docker, "docker provider"),
        (HelpGroup::OpenShell, "openshell provider"),
        (HelpGroup::E2b, "e2b provider"),
        (HelpGroup::DockerCloud, "dockercloud provider"),
        (HelpGroup::Limits, "Limits"),
    ] {
        out.push('\n');
        out.push_str(title);
        out.push_str(":\n");
        for v in VARIABLES.iter().filter(|v| v.group == group) {
            let meaning = if v.name == ENV_PROVIDER {
                format!("{} {}", v.meaning, providers.join(", "))
            } else {
                v.meaning.to_owned()
            };
            out.push_str(&format!(
                "  {:width$}{meaning} (default: {})\n",
                v.name, v.default
            ));
        }
    }
    out.push('\n');
    out.push_str(HELP_ENDPOINTS);
    out
}

/// `PLIMSOLL_*` and `SANDBOX_*` names present in `env` that are not in [`VARIABLES`], sorted.
///
/// The daemon logs a WARN for each; an unknown variable is never an error. Other prefixes
/// (`E2B_*`, `DOCKER_*`) are not checked.
pub fn unknown_variables(env: &dyn Strings) -> Vec<String> {
    let mut unknown: Vec<String> = env
        .names()
        .into_iter()
        .filter(|n| n.starts_with("PLIMSOLL_") || n.starts_with("SANDBOX_"))
        .filter(|n| !VARIABLES.iter().any(|v| v.name == n))
        .collect();
    unknown.sort();
    unknown.dedup();
    unknown
}

// === Strings ===

/// Where variable values come from.
pub trait Strings {
    /// The value of `name`, or `None` when unset. Values are never trimmed here.
    fn get(&self, name: &str) -> Option<String>;
    /// Every variable name present, in no particular order.
    fn names(&self) -> Vec<String>;
}

/// The process environment.
///
/// A value that is not valid UTF-8 is returned with replacement characters, so it fails
/// validation instead of silently counting as unset. Names that are not UTF-8 are skipped.
#[derive(Debug, Clone, Copy, Default)]
pub struct ProcessEnv;

impl Strings for ProcessEnv {
    fn get(&self, name: &str) -> Option<String> {
        std::env::var_os(name).map(|v| v.to_string_lossy().into_owned())
    }

    fn names(&self) -> Vec<String> {
        std::env::vars_os()
            .filter_map(|(name, _)| name.into_string().ok())
            .collect()
    }
}

impl Strings for HashMap<String, String> {
    fn get(&self, name: &str) -> Option<String> {
        HashMap::get(self, name).cloned()
    }

    fn names(&self) -> Vec<String> {
        self.keys().cloned().collect()
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests;
