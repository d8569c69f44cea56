//! The session settings (config.md §2.9, wire.md §7.1): how many sessions may live, how long
//! each may live and idle, and how much disk a session may fill between calls.
//!
//! Sessions are off unless `SANDBOX_MAX_SESSIONS` is above 0, and only a provider that keeps
//! sessions (docker, with its project image; openshell) may turn them on: any other provider with a
//! session cap is a startup error, never a silent "off".

use std::time::Duration;

use super::duration::parse_duration;
use super::env::{
    ENV_MAX_SESSIONS, ENV_MAX_SESSIONS_PER_CALLER, ENV_MAX_SESSIONS_PER_OWNER, ENV_SESSION_DISK_MB,
    ENV_SESSION_IDLE, ENV_SESSION_LIFETIME, ENV_SESSION_POOL, Strings,
};
use super::value;
use crate::provider::config::ProviderConfig;

/// Default for `SANDBOX_SESSION_LIFETIME`.
pub const DEFAULT_SESSION_LIFETIME: Duration = Duration::from_secs(30 * 60);
/// Default for `SANDBOX_SESSION_IDLE`.
pub const DEFAULT_SESSION_IDLE: Duration = Duration::from_secs(5 * 60);
/// The shortest lifetime or idle timeout an operator may set.
pub const MIN_SESSION_DURATION: Duration = Duration::from_secs(1);
/// The longest lifetime or idle timeout an operator may set.
pub const MAX_SESSION_DURATION: Duration = Duration::from_secs(12 * 60 * 60);
/// Default for `SANDBOX_SESSION_DISK_MB`.
pub const DEFAULT_SESSION_DISK_MB: u32 = 1024;
/// Largest `SANDBOX_SESSION_DISK_MB`.
pub const MAX_SESSION_DISK_MB: u32 = 1_048_576;

/// The daemon's session settings, checked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SessionConfig {
    /// `SANDBOX_MAX_SESSIONS`: live sessions at once; 0 = sessions off.
    pub max_sessions: u32,
    /// `SANDBOX_MAX_SESSIONS_PER_CALLER`: live sessions per principal; 0 = no cap.
    pub per_caller: u32,
    /// `SANDBOX_MAX_SESSIONS_PER_OWNER`: live sessions per stated owner; 0 = no cap. At the
    /// cap an open replaces that owner's least recently used idle session.
    pub per_owner: u32,
    /// `SANDBOX_SESSION_LIFETIME`, in [1 s, 12 h].
    pub lifetime: Duration,
    /// `SANDBOX_SESSION_IDLE`: 0 = never suspend, else in [1 s, 12 h].
    pub idle: Duration,
    /// `SANDBOX_SESSION_DISK_MB`: measured after each call; 0 = no bound.
    pub disk_mb: u32,
    /// `SANDBOX_SESSION_POOL`: warm session sandboxes kept ready (docker only); 0 = none.
    pub pool: u32,
}

impl Default for SessionConfig {
    fn default() -> SessionConfig {
        SessionConfig {
            max_sessions: 0,
            per_caller: 0,
            per_owner: 0,
            lifetime: DEFAULT_SESSION_LIFETIME,
            idle: DEFAULT_SESSION_IDLE,
            disk_mb: DEFAULT_SESSION_DISK_MB,
            pool: 0,
        }
    }
}

impl SessionConfig {
    /// Whether sessions are on.
    pub fn enabled(&self) -> bool {
        self.max_sessions > 0
    }
}

/// One bad session variable.
#[derive(Debug, thiserror::Error)]
pub enum SessionConfigProblem {
    /// Not a plain decimal integer in range.
    #[error("{var}={value:?} must be an integer between 0 and {max}")]
    Integer {
        var: &'static str,
        value: String,
        max: u32,
    },
    /// Not a duration, or outside its bounds.
    #[error("{var}={value:?} {reason}")]
    Duration {
        var: &'static str,
        value: String,
        reason: String,
    },
    /// Sessions were asked of a provider that keeps none.
    #[error(
        "SANDBOX_MAX_SESSIONS={value} but the {provider} provider keeps no sessions (sessions need the docker provider and its project image, openshell or e2b); unset it or set 0"
    )]
    ProviderWithoutSessions { value: u32, provider: &'static str },
    /// A pool without sessions, larger than the session cap, or on a provider other than
    /// docker.
    #[error("SANDBOX_SESSION_POOL={value} {reason}")]
    Pool { value: u32, reason: String },
}

impl SessionConfigProblem {
    /// The variable this problem is about.
    pub fn variable(&self) -> &'static str {
        match self {
            Self::Integer { var, .. } | Self::Duration { var, .. } => var,
            Self::ProviderWithoutSessions { .. } => ENV_MAX_SESSIONS,
            Self::Pool { .. } => ENV_SESSION_POOL,
        }
    }
}

/// Reads every session variable; returns the settings (defaults where a value was bad) and
/// every problem found.
pub fn read(
    env: &dyn Strings,
    provider: Option<&ProviderConfig>,
) -> (SessionConfig, Vec<SessionConfigProblem>) {
    let mut problems = Vec::new();
    let d = SessionConfig::default();
    let mut integer = |var: &'static str, default: u32, max: u32| -> u32 {
        let text = env.get(var).unwrap_or_default().trim().to_owned();
        if text.is_empty() {
            return default;
        }
        match value::parse_integer(&text, 0, i64::from(max)) {
            Ok(n) => u32::try_from(n).unwrap_or(default),
            Err(_) => {
                problems.push(SessionConfigProblem::Integer {
                    var,
                    value: shown(&text),
                    max,
                });
                default
            }
        }
    };
    let max_sessions = integer(ENV_MAX_SESSIONS, 0, u32::MAX);
    let per_caller = integer(ENV_MAX_SESSIONS_PER_CALLER, 0, u32::MAX);
    let per_owner = integer(ENV_MAX_SESSIONS_PER_OWNER, 0, u32::MAX);
    let disk_mb = integer(
        ENV_SESSION_DISK_MB,
        DEFAULT_SESSION_DISK_MB,
        MAX_SESSION_DISK_MB,
    );
    let pool = integer(ENV_SESSION_POOL, 0, u32::MAX);
    let lifetime = duration(env, ENV_SESSION_LIFETIME, d.lifetime, false, &mut problems);
    let idle = duration(env, ENV_SESSION_IDLE, d.idle, true, &mut problems);
    if max_sessions > 0
        && let Some(provider) = provider
        && !provider.settings().keeps_sessions()
    {
        problems.push(SessionConfigProblem::ProviderWithoutSessions {
            value: max_sessions,
            provider: provider.name(),
        });
    }
    // A metered provider bills a session that never suspends for its whole lifetime.
    if max_sessions > 0
        && idle.is_zero()
        && let Some(provider) = provider
        && provider.settings().metered()
    {
        problems.push(SessionConfigProblem::Duration {
            var: ENV_SESSION_IDLE,
            value: "0".to_owned(),
            reason: format!(
                "never suspends a session, which the metered {} provider bills throughout; set 1s to 12h",
                provider.name()
            ),
        });
    }
    if let Some(reason) = pool_problem(pool, max_sessions, provider) {
        problems.push(SessionConfigProblem::Pool {
            value: pool,
            reason,
        });
    }
    (
        SessionConfig {
            max_sessions,
            per_caller,
            per_owner,
            lifetime,
            idle,
            disk_mb,
            pool,
        },
        problems,
    )
}

/// Why a pool of `pool` members cannot be kept (providers.md §9.8): it needs sessions on,
/// at most `SANDBOX_MAX_SESSIONS` members, and the docker provider.
fn pool_problem(pool: u32, max_sessions: u32, provider: Option<&ProviderConfig>) -> Option<String> {
    if pool == 0 {
        None
    } else if max_sessions == 0 {
        Some("needs sessions on (SANDBOX_MAX_SESSIONS above 0)".to_owned())
    } else if pool > max_sessions {
        Some(format!(
            "is above SANDBOX_MAX_SESSIONS={max_sessions}: the pool holds at most one member per session"
        ))
    } else if !provider.is_some_and(|p| p.settings().keeps_session_pool()) {
        Some(format!(
            "but the {} provider keeps no warm pool (docker only); unset it or set 0",
            provider.map_or("disabled", ProviderConfig::name)
        ))
    } else {
        None
    }
}

/// A duration in [1 s, 12 h]; `zero_ok` also accepts `0`.
fn duration(
    env: &dyn Strings,
    var: &'static str,
    default: Duration,
    zero_ok: bool,
    problems: &mut Vec<SessionConfigProblem>,
) -> Duration {
    let text = env.get(var).unwrap_or_default().trim().to_owned();
    if text.is_empty() {
        return default;
    }
    let bounds = if zero_ok {
        "must be 0 (never) or a duration between 1s and 12h"
    } else {
        "must be a duration between 1s and 12h"
    };
    let reason = match parse_duration(&text) {
        Ok(d) if d.is_zero() && zero_ok => return d,
        Ok(d) if (MIN_SESSION_DURATION..=MAX_SESSION_DURATION).contains(&d) => return d,
        Ok(_) => bounds.to_owned(),
        Err(e) => format!("{bounds}: {e}"),
    };
    problems.push(SessionConfigProblem::Duration {
        var,
        value: shown(&text),
        reason,
    });
    default
}

fn shown(value: &str) -> String {
    value.chars().take(64).collect()
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    fn docker() -> ProviderConfig {
        ProviderConfig::Docker(Default::default())
    }

    fn wasm() -> ProviderConfig {
        ProviderConfig::Wasm(Default::default())
    }

    fn read_map(pairs: &[(&str, &str)], provider: ProviderConfig) -> (SessionConfig, Vec<String>) {
        let env: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        let (config, problems) = read(&env, Some(&provider));
        (config, problems.iter().map(ToString::to_string).collect())
    }

    #[test]
    fn sessions_are_off_with_the_spec_defaults_when_nothing_is_set() {
        let (c, problems) = read_map(&[], docker());
        assert!(problems.is_empty());
        assert!(!c.enabled());
        assert_eq!(c, SessionConfig::default());
        assert_eq!(c.lifetime, Duration::from_secs(1800));
        assert_eq!(c.idle, Duration::from_secs(300));
        assert_eq!(c.disk_mb, 1024);
    }

    #[test]
    fn every_setting_is_read_within_its_bounds() {
        let (c, problems) = read_map(
            &[
                (ENV_MAX_SESSIONS, "4"),
                (ENV_MAX_SESSIONS_PER_CALLER, "2"),
                (ENV_MAX_SESSIONS_PER_OWNER, "1"),
                (ENV_SESSION_LIFETIME, "12h"),
                (ENV_SESSION_IDLE, "0"),
                (ENV_SESSION_DISK_MB, "0"),
            ],
            docker(),
        );
        assert!(problems.is_empty(), "{problems:?}");
        assert_eq!(
            (c.max_sessions, c.per_caller, c.per_owner, c.disk_mb),
            (4, 2, 1, 0)
        );
        assert_eq!(c.lifetime, MAX_SESSION_DURATION);
        assert_eq!(c.idle, Duration::ZERO);
    }

    #[test]
    fn the_pool_needs_sessions_docker_and_at_most_the_session_cap() {
        let (c, problems) = read_map(
            &[(ENV_MAX_SESSIONS, "4"), (ENV_SESSION_POOL, "4")],
            docker(),
        );
        assert!(problems.is_empty(), "{problems:?}");
        assert_eq!(c.pool, 4);
        let (_, problems) = read_map(&[(ENV_SESSION_POOL, "1")], docker());
        assert!(problems[0].contains("needs sessions on"), "{problems:?}");
        let (_, problems) = read_map(
            &[(ENV_MAX_SESSIONS, "2"), (ENV_SESSION_POOL, "3")],
            docker(),
        );
        assert!(
            problems[0].contains("above SANDBOX_MAX_SESSIONS=2"),
            "{problems:?}"
        );
        let (_, problems) = read_map(
            &[(ENV_MAX_SESSIONS, "2"), (ENV_SESSION_POOL, "-1")],
            docker(),
        );
        assert!(problems[0].contains("SANDBOX_SESSION_POOL"), "{problems:?}");
    }

    #[test]
    fn out_of_bounds_values_are_each_reported() {
        let (_, problems) = read_map(
            &[
                (ENV_MAX_SESSIONS, "-1"),
                (ENV_SESSION_LIFETIME, "0"),
                (ENV_SESSION_IDLE, "500ms"),
                (ENV_SESSION_DISK_MB, "1048577"),
                (ENV_MAX_SESSIONS_PER_OWNER, "x"),
            ],
            docker(),
        );
        assert_eq!(problems.len(), 5, "{problems:?}");
        assert!(problems.iter().any(|p| p.contains("SANDBOX_SESSION_LIFETIME")
            && p.contains("between 1s and 12h")));
        assert!(problems.iter().any(|p| p.contains("SANDBOX_SESSION_IDLE")));
        assert!(problems.iter().any(|p| p.contains("1048576")));
        let (_, long) = read_map(&[(ENV_SESSION_LIFETIME, "13h")], docker());
        assert_eq!(long.len(), 1);
    }

    #[test]
    fn a_metered_provider_refuses_sessions_that_never_suspend() {
        let e2b = || ProviderConfig::E2b(Default::default());
        let (_, problems) = read_map(&[(ENV_MAX_SESSIONS, "2"), (ENV_SESSION_IDLE, "0")], e2b());
        assert_eq!(problems.len(), 1, "{problems:?}");
        assert!(problems[0].contains("metered"), "{problems:?}");
        let (_, fine) = read_map(&[(ENV_MAX_SESSIONS, "2"), (ENV_SESSION_IDLE, "1m")], e2b());
        assert!(fine.is_empty(), "{fine:?}");
        let (_, docker) = read_map(
            &[(ENV_MAX_SESSIONS, "2"), (ENV_SESSION_IDLE, "0")],
            docker(),
        );
        assert!(docker.is_empty(), "{docker:?}");
    }

    #[test]
    fn a_provider_without_sessions_refuses_a_session_cap() {
        let (_, problems) = read_map(&[(ENV_MAX_SESSIONS, "2")], wasm());
        assert_eq!(problems.len(), 1);
        assert!(problems[0].contains("keeps no sessions"), "{problems:?}");
        let (_, none) = read_map(&[(ENV_MAX_SESSIONS, "0")], wasm());
        assert!(none.is_empty());
    }
}
