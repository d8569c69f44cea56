//! The daemon's configuration: every environment variable, parsed once into [`Config`].
//!
//! [`Config::from_env`] reads every variable named in [`env`], checks each one, and reports
//! every bad variable together in one [`ConfigError`] (config.md section 1: "every startup
//! failure is one error log line, then exit 1"). Nothing here binds a port, loads TLS material
//! or talks to a provider; those steps come later in the startup order (config.md section 9)
//! and use the values checked here. The clients file is the exception: it is read here,
//! because a bad registry must fail before anything else starts.
//!
//! Hardened mode's policy lives in [`hardened`]; Go-style durations in [`duration`]. A
//! provider's own settings, and the facts the checks here ask of it, live with the provider
//! ([`crate::provider::config`]); this module reads `SANDBOX_PROVIDER` and hands the provider
//! its share of the environment.

pub mod admission;
pub mod duration;
pub mod env;
pub mod grants;
pub mod hardened;
pub mod listen_addr;
pub mod session;
pub(crate) mod value;

use std::path::PathBuf;

use plimsoll::tier::{Floor, IsolationTier};

use crate::auth::clients_file::{self, ClientsFile, ClientsFileError, TokenShapeError};
use crate::provider::config::{KNOWN_PROVIDERS, KnownProvider, ProviderConfig, SharedSettings};
use env::*;
use listen_addr::{HostPort, HostPortError};
use value::ScalarError;

pub use env::{ProcessEnv, Strings, help_text, unknown_variables};
pub use hardened::{HardenedError, enforce_hardened, hardened_violations};

// === Config types ===

/// Log line format. JSON is the contract tools parse; text is for people.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum LogFormat {
    /// `{"time", "level", "msg", …}` per line. The default, and the fallback for any value
    /// other than `text`.
    #[default]
    Json,
    /// `key=value` per line.
    Text,
}

/// How callers authenticate, in precedence order: clients file, then token, then none.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AuthConfig {
    /// `PLIMSOLL_CLIENTS_FILE`: a validated, non-empty registry, read once at startup.
    Clients(ClientsFile),
    /// `PLIMSOLL_TOKEN`: one shared token (principal `static`, scope `code:run`). The text is
    /// exactly as set, never trimmed. Never log it.
    Token(String),
    /// No authentication: allowed with the `disabled` provider, or with `PLIMSOLL_INSECURE=1`.
    Open,
}

/// The `PLIMSOLL_TLS_CERT` / `PLIMSOLL_TLS_KEY` pair. Only paths: the server loads and checks
/// the PEM files.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsFiles {
    /// PEM certificate chain.
    pub cert: PathBuf,
    /// PEM private key.
    pub key: PathBuf,
}

/// The per-run resource envelope (config.md section 2.3). Zero always means "not set": the
/// provider's default for memory and CPUs, no limit for processes and disk.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Resources {
    /// `SANDBOX_MEMORY_MB`, MiB.
    pub memory_mb: u32,
    /// `SANDBOX_CPUS`, finite and non-negative.
    pub cpus: f64,
    /// `SANDBOX_PIDS`; refused (when > 0) by providers that cannot enforce it.
    pub pids: u32,
    /// `SANDBOX_DISK_MB`, MiB; refused (when > 0) by providers that cannot enforce it.
    pub disk_mb: u32,
}

/// Everything the daemon reads from its environment, checked.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    /// `PLIMSOLL_ADDR`: RPC listener as written (`host:port`; empty host = every interface).
    pub addr: String,
    /// `PLIMSOLL_METRICS_ADDR`, trimmed; `None` when `off`.
    pub metrics_addr: Option<String>,
    /// `PLIMSOLL_ADDR_FILE`, trimmed: where the bound RPC address is written; `None` when
    /// unset.
    pub addr_file: Option<PathBuf>,
    /// `PLIMSOLL_LOG_FORMAT`.
    pub log_format: LogFormat,
    /// Clients file, token, or open.
    pub auth: AuthConfig,
    /// `PLIMSOLL_INSECURE` is exactly `1`.
    pub insecure: bool,
    /// `PLIMSOLL_INSECURE` holds any non-empty value (a hardened-mode violation even when it is
    /// not `1`).
    pub insecure_set: bool,
    /// Both TLS paths, or `None` for cleartext.
    pub tls: Option<TlsFiles>,
    /// `PLIMSOLL_HARDENED` is `1` or `true`.
    pub hardened: bool,
    /// `SANDBOX_PROVIDER`, with that provider's own settings.
    pub provider: ProviderConfig,
    /// `SANDBOX_MIN_ISOLATION`: a floor's tier (`process` and up, as a request's
    /// `minimum_isolation` takes it), or `None` for no floor. Compared with the proven tier
    /// only after the smoke test.
    pub min_isolation: Option<IsolationTier>,
    /// The per-run envelope.
    pub resources: Resources,
    /// `SANDBOX_MAX_CONCURRENT`, in `[1, 1024]`, before any memory clamp.
    pub max_concurrent: u32,
    /// The admission limits; `limits.max_concurrent` equals `max_concurrent`.
    pub limits: admission::Limits,
    /// The session settings (sessions are off unless `SANDBOX_MAX_SESSIONS` > 0).
    pub sessions: session::SessionConfig,
    /// The grant path: off, an operator-run broker, or a supervised child.
    pub grants: grants::GrantSource,
    /// `PLIMSOLL_GUARD_ADDR`: where a supervised guard listens, when the provider has a
    /// guard URL.
    pub guard_addr: Option<String>,
    /// `PLIMSOLL_*` / `SANDBOX_*` names set but unknown to this build; the daemon warns.
    pub unknown_vars: Vec<String>,
}

/// The smallest CPU share a run may be given: docker's own floor (a `NanoCpus` below it is
/// refused, and one that rounds to 0 means no limit at all).
pub const MIN_CPUS: f64 = 0.01;

// === Errors ===

/// One bad variable, or one bad combination. Each message names the variable and what it
/// accepts; none repeats a secret.
#[derive(Debug, thiserror::Error)]
pub enum ConfigProblem {
    /// Not a plain decimal integer.
    #[error("{var}={value:?} is not an integer (plain decimal digits, e.g. {example})")]
    NotInteger {
        var: &'static str,
        value: String,
        example: &'static str,
    },
    /// An integer outside its range.
    #[error("{var}={value:?} must be between {min} and {max}")]
    IntegerOutOfRange {
        var: &'static str,
        value: String,
        min: i64,
        max: i64,
    },
    /// Not a finite non-negative number.
    #[error("{var}={value:?} must be a finite non-negative number (e.g. 0.5 or 2)")]
    NotNonNegativeNumber { var: &'static str, value: String },
    /// A CPU share above 0 but too small to enforce.
    #[error(
        "{var}={value:?} is above 0 but below {MIN_CPUS} CPU, which no provider enforces (docker \
         would run with no CPU limit at all); use 0 for the provider's default or at least {MIN_CPUS}"
    )]
    CpusTooSmall { var: &'static str, value: String },
    /// Not a strict boolean.
    #[error("{var}={value:?} must be one of 0, 1, false, or true")]
    NotBoolean { var: &'static str, value: String },
    /// Not `host:port`.
    #[error("{var}={value:?} must be host:port, e.g. {example} ({reason})")]
    NotHostPort {
        var: &'static str,
        value: String,
        example: &'static str,
        reason: HostPortError,
    },
    /// `PLIMSOLL_TOKEN` is shorter than 32 bytes.
    #[error("PLIMSOLL_TOKEN is too short: {bytes} bytes, at least 32 required")]
    TokenTooShort { bytes: usize },
    /// `PLIMSOLL_TOKEN` is longer than 4096 bytes, or not visible ASCII.
    #[error("PLIMSOLL_TOKEN {0} (32 to 4096 visible ASCII bytes)")]
    TokenShape(TokenShapeError),
    /// The clients file could not be read or is invalid.
    #[error("failed to load PLIMSOLL_CLIENTS_FILE {path}: {source}")]
    ClientsFileLoad {
        path: PathBuf,
        source: ClientsFileError,
    },
    /// The clients file has no entries.
    #[error(
        "PLIMSOLL_CLIENTS_FILE {path} defines no clients (add one with plimsoll-clients create)"
    )]
    ClientsFileEmpty { path: PathBuf },
    /// Only one of the TLS pair is set.
    #[error("PLIMSOLL_TLS_CERT and PLIMSOLL_TLS_KEY must be set together: {missing} is unset")]
    TlsIncomplete { missing: &'static str },
    /// `SANDBOX_PROVIDER` names no provider of this build.
    #[error("SANDBOX_PROVIDER={value:?} is not a provider this build has; known: {known}")]
    UnknownProvider { value: String, known: String },
    /// `SANDBOX_MIN_ISOLATION` is not a floor tier.
    #[error("SANDBOX_MIN_ISOLATION={value:?} must be one of process, container, kernel, vm")]
    BadFloor { value: String },
    /// A limit the chosen provider cannot enforce was set.
    #[error("{var}={value} is not supported by the {provider} provider; unset it or set 0")]
    UnsupportedByProvider {
        var: &'static str,
        value: String,
        provider: &'static str,
    },
    /// `SANDBOX_MAX_CONCURRENT` outside `[1, 1024]`.
    #[error("SANDBOX_MAX_CONCURRENT: max_concurrent={value} is outside [1,1024]")]
    MaxConcurrentOutOfRange { value: i64 },
    /// A provider's own setting is malformed, or set for a provider that has no such setting.
    #[error("{var}={value:?} {reason}")]
    ProviderSetting {
        var: &'static str,
        value: String,
        reason: String,
    },
    /// The memory budget cannot hold one run.
    #[error("SANDBOX_TOTAL_MEMORY_MB: {reason}")]
    MemoryBudget { reason: String },
    /// A session variable is malformed, or sessions were asked of a provider without them.
    #[error(transparent)]
    Session(#[from] session::SessionConfigProblem),
    /// A grant variable is malformed.
    #[error(transparent)]
    Grants(#[from] grants::GrantsConfigProblem),
    /// A real provider with no authentication and no `PLIMSOLL_INSECURE=1`.
    #[error(
        "refusing to start: a real sandbox provider is enabled but PLIMSOLL_TOKEN is unset \
         (set PLIMSOLL_CLIENTS_FILE or PLIMSOLL_TOKEN, or PLIMSOLL_INSECURE=1 for open development mode)"
    )]
    OpenModeRefused,
}

impl ConfigProblem {
    /// The variable this problem is about.
    pub fn variable(&self) -> &'static str {
        match self {
            Self::NotInteger { var, .. }
            | Self::IntegerOutOfRange { var, .. }
            | Self::NotNonNegativeNumber { var, .. }
            | Self::CpusTooSmall { var, .. }
            | Self::NotBoolean { var, .. }
            | Self::NotHostPort { var, .. }
            | Self::UnsupportedByProvider { var, .. }
            | Self::ProviderSetting { var, .. } => var,
            Self::TokenTooShort { .. } | Self::TokenShape(_) | Self::OpenModeRefused => ENV_TOKEN,
            Self::ClientsFileLoad { .. } | Self::ClientsFileEmpty { .. } => ENV_CLIENTS_FILE,
            Self::TlsIncomplete { missing } => missing,
            Self::UnknownProvider { .. } => ENV_PROVIDER,
            Self::BadFloor { .. } => ENV_MIN_ISOLATION,
            Self::MaxConcurrentOutOfRange { .. } => ENV_MAX_CONCURRENT,
            Self::MemoryBudget { .. } => ENV_TOTAL_MEMORY_MB,
            Self::Session(p) => p.variable(),
            Self::Grants(p) => p.variable(),
        }
    }
}

/// Every problem found in the environment; never empty. Displays as one line.
#[derive(Debug, thiserror::Error)]
#[error("invalid configuration: {}", join_problems(.problems))]
pub struct ConfigError {
    /// In the order the variables were checked.
    pub problems: Vec<ConfigProblem>,
}

fn join_problems(problems: &[ConfigProblem]) -> String {
    problems
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join("; ")
}

// === impl Config ===

impl Config {
    /// Reads and checks every variable, reporting all problems together.
    ///
    /// Reads the clients file when `PLIMSOLL_CLIENTS_FILE` is set; does nothing else with the
    /// outside world. Unknown `PLIMSOLL_*`/`SANDBOX_*` names are collected in
    /// [`Config::unknown_vars`], never refused. Hardened mode is *not* enforced here: call
    /// [`enforce_hardened`] at the two points config.md section 9 names.
    pub fn from_env(env: &dyn Strings) -> Result<Config, ConfigError> {
        let mut r = Reader::new(env);

        let addr = r.addr();
        let metrics_addr = r.metrics_addr();
        let addr_file = Some(r.trimmed(ENV_ADDR_FILE))
            .filter(|path| !path.is_empty())
            .map(PathBuf::from);
        let log_format = if r.trimmed(ENV_LOG_FORMAT).eq_ignore_ascii_case("text") {
            LogFormat::Text
        } else {
            LogFormat::Json
        };
        let insecure_raw = r.raw(ENV_INSECURE);
        let insecure = insecure_raw == "1";
        let tls = r.tls();
        let hardened = r.boolean(ENV_HARDENED);
        let shared = SharedSettings {
            require_pinned_images: r.boolean(ENV_REQUIRE_PINNED_IMAGES),
        };
        let provider = r.provider(&shared);
        let min_isolation = r.floor();
        let resources = r.resources(provider.as_ref());
        let configured_max = r.max_concurrent();
        // Sessions first: the memory clamp subtracts the pool's members.
        let (sessions, session_problems) = session::read(env, provider.as_ref());
        r.problems
            .extend(session_problems.into_iter().map(ConfigProblem::Session));
        let limits = r.limits(
            provider.as_ref(),
            resources.memory_mb,
            configured_max,
            sessions.pool,
        );
        let max_concurrent = limits.max_concurrent;
        let auth = r.auth(provider.as_ref(), insecure);
        let grants = grants::read(env).unwrap_or_else(|p| {
            r.problems.push(ConfigProblem::Grants(p));
            grants::GrantSource::Off
        });
        let guard_addr = r.guard_addr(provider.as_ref(), &grants);

        if !r.problems.is_empty() {
            return Err(ConfigError {
                problems: r.problems,
            });
        }
        Ok(Config {
            addr,
            metrics_addr,
            addr_file,
            log_format,
            auth: auth.unwrap_or(AuthConfig::Open),
            insecure,
            insecure_set: !insecure_raw.is_empty(),
            tls,
            hardened,
            provider: provider.unwrap_or_default(),
            min_isolation,
            resources,
            max_concurrent,
            limits,
            sessions,
            grants,
            guard_addr,
            unknown_vars: unknown_variables(env),
        })
    }

    /// Non-fatal findings the daemon should log as WARN lines, one per entry: open mode, a
    /// token shadowed by a clients file, a session cap that can take every run slot, an
    /// ignored `SANDBOX_TOTAL_MEMORY_MB`, a metrics listener off loopback. Does not include
    /// [`Config::unknown_vars`], which have their own fixed message.
    pub fn warnings(&self, env: &dyn Strings) -> Vec<String> {
        let mut warnings = Vec::new();
        match &self.auth {
            AuthConfig::Open if self.provider.settings().runs_code() => warnings.push(format!(
                "{ENV_INSECURE}=1: a real sandbox provider is serving without authentication"
            )),
            AuthConfig::Open => warnings.push(
                "no authentication: PLIMSOLL_CLIENTS_FILE and PLIMSOLL_TOKEN are unset".to_owned(),
            ),
            AuthConfig::Clients(_) if env.get(ENV_TOKEN).is_some_and(|t| !t.is_empty()) => {
                warnings.push(
                    "PLIMSOLL_TOKEN is ignored because PLIMSOLL_CLIENTS_FILE is set".to_owned(),
                );
            }
            _ => {}
        }
        if self.sessions.enabled() && self.sessions.max_sessions >= self.limits.max_concurrent {
            warnings.push(format!(
                "SANDBOX_MAX_SESSIONS={} is not below SANDBOX_MAX_CONCURRENT={}: every live session holds a run slot (on docker, paused ones too; a stopped openshell session gives its slot back), so sessions can take every slot",
                self.sessions.max_sessions, self.limits.max_concurrent
            ));
        }
        if self.provider.settings().metered()
            && let Some(total) = env.get(ENV_TOTAL_MEMORY_MB)
            && !matches!(total.trim(), "" | "0")
        {
            warnings.push(format!(
                "{ENV_TOTAL_MEMORY_MB}={} is ignored: the {} provider's sandboxes use the vendor's memory, not this host's",
                total.trim(),
                self.provider.name()
            ));
        }
        if let Some(metrics) = &self.metrics_addr
            && !listen_addr::is_loopback_addr(metrics)
        {
            warnings.push(format!(
                "PLIMSOLL_METRICS_ADDR={metrics} is not loopback; /metrics has no authentication"
            ));
        }
        warnings
    }
}

/// Reads variables and collects problems; each method returns a usable placeholder on error
/// so every other variable still gets checked. A provider reads its own variables through it
/// ([`ProviderSettings::read`](crate::provider::config::ProviderSettings::read)).
pub struct Reader<'a> {
    pub(crate) env: &'a dyn Strings,
    pub(crate) problems: Vec<ConfigProblem>,
}

impl<'a> Reader<'a> {
    /// A reader of `env` that has found no problem yet.
    pub(crate) fn new(env: &'a dyn Strings) -> Reader<'a> {
        Reader {
            env,
            problems: Vec::new(),
        }
    }

    pub(crate) fn raw(&self, name: &str) -> String {
        self.env.get(name).unwrap_or_default()
    }

    pub(crate) fn trimmed(&self, name: &str) -> String {
        self.raw(name).trim().to_owned()
    }

    fn host_port(&mut self, var: &'static str, value: String, example: &'static str) -> String {
        if let Err(reason) = HostPort::parse(&value) {
            self.problems.push(ConfigProblem::NotHostPort {
                var,
                value: shown(&value),
                example,
                reason,
            });
        }
        value
    }

    /// `PLIMSOLL_GUARD_ADDR` (config.md §2.1): required exactly when the provider has a guard
    /// URL, and then only with a supervised broker (an operator-run broker has an
    /// operator-run guard).
    fn guard_addr(
        &mut self,
        provider: Option<&ProviderConfig>,
        grants: &grants::GrantSource,
    ) -> Option<String> {
        let var = guard::env::GUARD_ADDR;
        let value = self.trimmed(var);
        let url = provider.and_then(|p| p.settings().guard_url());
        let refuse = |r: &mut Self, value: &str, reason: &str| {
            r.problems.push(ConfigProblem::ProviderSetting {
                var,
                value: shown(value),
                reason: reason.to_owned(),
            });
        };
        match (value.is_empty(), url) {
            (true, None) => None,
            (false, None) => {
                refuse(
                    self,
                    &value,
                    "is set but no guard URL is (E2B_GUARD_URL or SANDBOX_DOCKERCLOUD_GUARD_URL)",
                );
                None
            }
            (true, Some(_)) if matches!(grants, grants::GrantSource::Supervised(_)) => {
                refuse(self, "", "is required when a guard URL is set");
                None
            }
            (true, Some(_)) => None,
            (false, Some(_)) => Some(self.host_port(var, value, "127.0.0.1:8443")),
        }
    }

    fn addr(&mut self) -> String {
        // Not trimmed (config.md section 2.1): a stray space is an error, not a silent fix.
        let value = self.raw(ENV_ADDR);
        if value.is_empty() {
            return DEFAULT_ADDR.to_owned();
        }
        self.host_port(ENV_ADDR, value, DEFAULT_ADDR)
    }

    fn metrics_addr(&mut self) -> Option<String> {
        let value = self.trimmed(ENV_METRICS_ADDR);
        if value.eq_ignore_ascii_case("off") {
            return None;
        }
        if value.is_empty() {
            return Some(DEFAULT_METRICS_ADDR.to_owned());
        }
        Some(self.host_port(ENV_METRICS_ADDR, value, DEFAULT_METRICS_ADDR))
    }

    pub(crate) fn boolean(&mut self, var: &'static str) -> bool {
        let value = self.trimmed(var);
        value::parse_bool(&value).unwrap_or_else(|_| {
            self.problems.push(ConfigProblem::NotBoolean {
                var,
                value: shown(&value),
            });
            false
        })
    }

    /// A non-negative integer that fits `u32`; empty means `default`.
    pub(crate) fn integer(&mut self, var: &'static str, default: u32) -> u32 {
        let value = self.trimmed(var);
        if value.is_empty() {
            return default;
        }
        let max = i64::from(u32::MAX);
        match value::parse_integer(&value, 0, max) {
            // In range by construction.
            Ok(n) => u32::try_from(n).unwrap_or(default),
            Err(ScalarError::BelowMinimum | ScalarError::AboveMaximum) => {
                self.problems.push(ConfigProblem::IntegerOutOfRange {
                    var,
                    value: shown(&value),
                    min: 0,
                    max,
                });
                default
            }
            Err(_) => {
                self.problems.push(ConfigProblem::NotInteger {
                    var,
                    value: shown(&value),
                    example: "256",
                });
                default
            }
        }
    }

    fn tls(&mut self) -> Option<TlsFiles> {
        let cert = self.trimmed(ENV_TLS_CERT);
        let key = self.trimmed(ENV_TLS_KEY);
        match (cert.is_empty(), key.is_empty()) {
            (true, true) => None,
            (false, false) => Some(TlsFiles {
                cert: cert.into(),
                key: key.into(),
            }),
            (false, true) => {
                self.problems.push(ConfigProblem::TlsIncomplete {
                    missing: ENV_TLS_KEY,
                });
                None
            }
            (true, false) => {
                self.problems.push(ConfigProblem::TlsIncomplete {
                    missing: ENV_TLS_CERT,
                });
                None
            }
        }
    }

    /// The provider `SANDBOX_PROVIDER` names, with its own settings read; `None` when the
    /// name is unknown (already reported).
    fn provider(&mut self, shared: &SharedSettings) -> Option<ProviderConfig> {
        let value = self.trimmed(ENV_PROVIDER).to_lowercase();
        let provider = if value.is_empty() {
            ProviderConfig::default()
        } else if let Some(known) = KnownProvider::find(&value) {
            (known.read)(self, shared)
        } else {
            let known: Vec<&str> = KNOWN_PROVIDERS.iter().map(|p| p.name).collect();
            self.problems.push(ConfigProblem::UnknownProvider {
                value: shown(&value),
                known: known.join(", "),
            });
            return None;
        };
        // A guest uid set for a provider whose guests run under none would promise an
        // identity nothing enforces.
        let uid = self.trimmed(ENV_GUEST_UID);
        if !uid.is_empty() && !provider.settings().has_guest_uid() {
            self.problems.push(ConfigProblem::ProviderSetting {
                var: ENV_GUEST_UID,
                value: shown(&uid),
                reason: format!("the {provider} provider runs no guest under a host uid"),
            });
        }
        Some(provider)
    }

    fn floor(&mut self) -> Option<IsolationTier> {
        let value = self.trimmed(ENV_MIN_ISOLATION).to_lowercase();
        if value.is_empty() {
            return None;
        }
        if let Some(tier) = Floor::parse(&value).ok().and_then(Floor::tier) {
            Some(tier)
        } else {
            self.problems.push(ConfigProblem::BadFloor {
                value: shown(&value),
            });
            None
        }
    }

    fn resources(&mut self, provider: Option<&ProviderConfig>) -> Resources {
        let memory_mb = self.integer(ENV_MEMORY_MB, 0);
        let cpus_text = self.trimmed(ENV_CPUS);
        let cpus = if cpus_text.is_empty() {
            0.0
        } else {
            value::parse_non_negative_float(&cpus_text).unwrap_or_else(|_| {
                self.problems.push(ConfigProblem::NotNonNegativeNumber {
                    var: ENV_CPUS,
                    value: shown(&cpus_text),
                });
                0.0
            })
        };
        if cpus > 0.0 && cpus < MIN_CPUS {
            self.problems.push(ConfigProblem::CpusTooSmall {
                var: ENV_CPUS,
                value: shown(&cpus_text),
            });
        }
        let pids = self.integer(ENV_PIDS, 0);
        let disk_mb = self.integer(ENV_DISK_MB, 0);
        if let Some(provider) = provider {
            let settings = provider.settings();
            if let Some(most) = settings.max_memory_mb().filter(|most| memory_mb > *most) {
                self.problems.push(ConfigProblem::ProviderSetting {
                    var: ENV_MEMORY_MB,
                    value: memory_mb.to_string(),
                    reason: format!(
                        "is more than a {} run can address ({most})",
                        provider.name()
                    ),
                });
            }
            // A limit nothing enforces would still be stated in Describe: refused instead.
            for (var, set, enforced) in [
                (
                    ENV_CPUS,
                    (cpus > 0.0).then(|| shown(&cpus_text)),
                    settings.enforces_cpus(),
                ),
                (
                    ENV_PIDS,
                    (pids > 0).then(|| pids.to_string()),
                    settings.enforces_pids(),
                ),
                (
                    ENV_DISK_MB,
                    (disk_mb > 0).then(|| disk_mb.to_string()),
                    settings.enforces_disk(),
                ),
            ] {
                if let (Some(value), false) = (set, enforced) {
                    self.problems.push(ConfigProblem::UnsupportedByProvider {
                        var,
                        value,
                        provider: provider.name(),
                    });
                }
            }
        }
        Resources {
            memory_mb,
            cpus,
            pids,
            disk_mb,
        }
    }

    fn max_concurrent(&mut self) -> u32 {
        let value = self.trimmed(ENV_MAX_CONCURRENT);
        if value.is_empty() {
            return DEFAULT_MAX_CONCURRENT;
        }
        let limit = i64::from(MAX_CONCURRENT_LIMIT);
        match value::parse_integer(&value, 1, limit) {
            Ok(n) => u32::try_from(n).unwrap_or(DEFAULT_MAX_CONCURRENT),
            Err(ScalarError::BelowMinimum | ScalarError::AboveMaximum) => {
                // Well-formed but out of range: report the number, saturated if it was huge.
                let n = value.parse::<i64>().unwrap_or(i64::MAX);
                self.problems
                    .push(ConfigProblem::MaxConcurrentOutOfRange { value: n });
                DEFAULT_MAX_CONCURRENT
            }
            Err(_) => {
                self.problems.push(ConfigProblem::NotInteger {
                    var: ENV_MAX_CONCURRENT,
                    value: shown(&value),
                    example: "8",
                });
                DEFAULT_MAX_CONCURRENT
            }
        }
    }

    /// `None` when authentication was configured but is broken (already reported), so the
    /// open-mode rule does not pile a second, misleading problem on top.
    fn auth(&mut self, provider: Option<&ProviderConfig>, insecure: bool) -> Option<AuthConfig> {
        let path = self.trimmed(ENV_CLIENTS_FILE);
        if !path.is_empty() {
            let path = PathBuf::from(path);
            return match ClientsFile::load(&path) {
                Ok(file) if file.clients.is_empty() => {
                    self.problems.push(ConfigProblem::ClientsFileEmpty { path });
                    None
                }
                Ok(file) => Some(AuthConfig::Clients(file)),
                Err(source) => {
                    self.problems
                        .push(ConfigProblem::ClientsFileLoad { path, source });
                    None
                }
            };
        }
        // Not trimmed: the token is compared byte for byte with the bearer text.
        let token = self.raw(ENV_TOKEN);
        if !token.is_empty() {
            return match clients_file::check_token_shape(&token) {
                Ok(()) => Some(AuthConfig::Token(token)),
                Err(TokenShapeError::TooShort(bytes)) => {
                    self.problems.push(ConfigProblem::TokenTooShort { bytes });
                    None
                }
                Err(shape) => {
                    self.problems.push(ConfigProblem::TokenShape(shape));
                    None
                }
            };
        }
        if provider.is_some_and(|p| p.settings().runs_code()) && !insecure {
            self.problems.push(ConfigProblem::OpenModeRefused);
            return None;
        }
        Some(AuthConfig::Open)
    }
}

/// A value as quoted in an error: at most 64 characters, so a pasted blob cannot flood the log.
pub(crate) fn shown(value: &str) -> String {
    const LIMIT: usize = 64;
    if value.chars().count() <= LIMIT {
        value.to_owned()
    } else {
        let mut cut: String = value.chars().take(LIMIT).collect();
        cut.push('…');
        cut
    }
}

/// A URL as a refusal may show it: any user information, query or fragment (where a
/// credential may be) is left out, and the rest is cut like [`shown`].
pub(crate) fn shown_url(value: &str) -> String {
    let (scheme, rest) = match value.find("://") {
        Some(at) => value.split_at(at + 3),
        None => ("", value),
    };
    // What stands before `://` is shown only when it is a scheme (`key@https://…` is not).
    let name = scheme.trim_end_matches("://");
    let is_scheme = name.starts_with(|c: char| c.is_ascii_alphabetic())
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.'));
    let scheme = if scheme.is_empty() || is_scheme {
        scheme
    } else {
        "<redacted>://"
    };
    let authority_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(authority_end);
    let authority = match authority.rfind('@') {
        Some(at) => format!("<redacted>@{}", &authority[at + 1..]),
        None => authority.to_owned(),
    };
    let tail = match tail.find(['?', '#']) {
        Some(at) => format!("{}?<redacted>", &tail[..at]),
        None => tail.to_owned(),
    };
    shown(&format!("{scheme}{authority}{tail}"))
}

#[cfg(test)]
mod tests;
