//! The admission limits (config.md §2.8): the run cap after the memory clamp,
//! the per-caller cap and the per-caller token bucket. The daemon's
//! `admission` module enforces what this computes.

use super::env::{
    ENV_PAID_SECONDS_PER_DAY, ENV_PER_KEY_CONCURRENT, ENV_RATE_BURST, ENV_RATE_PER_MIN,
    ENV_TOTAL_MEMORY_MB,
};
use super::{ConfigProblem, Reader};
use crate::provider::config::ProviderConfig;

/// Per-run memory charged against `SANDBOX_TOTAL_MEMORY_MB` when
/// `SANDBOX_MEMORY_MB` is unset.
pub const DEFAULT_PER_RUN_MEMORY_MB: u32 = 256;
/// Default `SANDBOX_RATE_PER_MIN`.
pub const DEFAULT_RATE_PER_MIN: u32 = 30;

/// The limits admission enforces.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Runs in flight across all callers, after the memory clamp.
    pub max_concurrent: u32,
    /// Runs in flight per caller; 0 = no per-caller cap.
    pub per_key_concurrent: u32,
    /// Token-bucket refill in runs per minute; 0 = no rate limit.
    pub rate_per_min: u32,
    /// Token-bucket capacity (already resolved: 0 in the environment means the rate).
    pub rate_burst: u32,
    /// The host memory budget in MiB; 0 = none.
    pub total_memory_mb: u32,
    /// What one run is charged against the budget, in MiB.
    pub per_run_memory_mb: u32,
    /// Whether the memory budget lowered `SANDBOX_MAX_CONCURRENT`.
    pub clamped: bool,
    /// `SANDBOX_PAID_SECONDS_PER_DAY`; 0 = none (metered providers only).
    pub paid_seconds_per_day: u64,
}

impl Reader<'_> {
    /// Reads the admission variables; `max_concurrent` is the already-checked
    /// `SANDBOX_MAX_CONCURRENT`, `memory_mb` the per-run `SANDBOX_MEMORY_MB`, `pool` the
    /// checked `SANDBOX_SESSION_POOL` (each member is charged one run, providers.md §10.2).
    pub(super) fn limits(
        &mut self,
        provider: Option<&ProviderConfig>,
        memory_mb: u32,
        max_concurrent: u32,
        pool: u32,
    ) -> Limits {
        let total = self.integer(ENV_TOTAL_MEMORY_MB, 0);
        // Hosted microVMs (e2b, dockercloud) use the vendor's memory, never the host's
        // (config.md §2.8): the budget is ignored, with a warning (`Config::warnings`).
        let total = if provider.is_some_and(|p| p.settings().metered()) {
            0
        } else {
            total
        };
        let per_run = if memory_mb > 0 {
            memory_mb
        } else {
            DEFAULT_PER_RUN_MEMORY_MB
        };
        let mut max = max_concurrent;
        let mut clamped = false;
        if total > 0 {
            let runs = total / per_run;
            let fit = runs.saturating_sub(pool);
            if runs < 1 {
                self.problems.push(ConfigProblem::MemoryBudget {
                    reason: format!(
                        "cannot fit even one {per_run} MiB run (SANDBOX_MEMORY_MB, 256 when unset) in SANDBOX_TOTAL_MEMORY_MB={total}"
                    ),
                });
            } else if fit < 1 {
                self.problems.push(ConfigProblem::MemoryBudget {
                    reason: format!(
                        "cannot fit the session pool's {pool} members of {per_run} MiB (SANDBOX_SESSION_POOL) and one run in SANDBOX_TOTAL_MEMORY_MB={total}"
                    ),
                });
            } else if fit < max {
                max = fit;
                clamped = true;
            }
        }
        let per_key_default = (max / 2).max(1);
        let per_key = self.integer(ENV_PER_KEY_CONCURRENT, per_key_default);
        if per_key > max {
            self.problems.push(ConfigProblem::IntegerOutOfRange {
                var: ENV_PER_KEY_CONCURRENT,
                value: per_key.to_string(),
                min: 0,
                max: i64::from(max),
            });
        }
        let rate = self.integer(ENV_RATE_PER_MIN, DEFAULT_RATE_PER_MIN);
        let burst = match self.integer(ENV_RATE_BURST, 0) {
            0 => rate,
            b => b,
        };
        let paid = self.integer(ENV_PAID_SECONDS_PER_DAY, 0);
        if paid > 0 && !provider.is_some_and(|p| p.settings().metered()) {
            self.problems.push(ConfigProblem::UnsupportedByProvider {
                var: ENV_PAID_SECONDS_PER_DAY,
                value: paid.to_string(),
                provider: provider.map_or("disabled", ProviderConfig::name),
            });
        }
        Limits {
            max_concurrent: max,
            per_key_concurrent: per_key,
            rate_per_min: rate,
            rate_burst: burst,
            total_memory_mb: total,
            per_run_memory_mb: per_run,
            clamped,
            paid_seconds_per_day: u64::from(paid),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::super::Config;

    fn config(vars: &[(&str, &str)]) -> Result<Config, super::super::ConfigError> {
        let env: HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        Config::from_env(&env)
    }

    #[test]
    fn defaults_are_eight_four_thirty_thirty() {
        let c = config(&[]).unwrap();
        assert_eq!(
            (
                c.limits.max_concurrent,
                c.limits.per_key_concurrent,
                c.limits.rate_per_min,
                c.limits.rate_burst
            ),
            (8, 4, 30, 30)
        );
        assert!(!c.limits.clamped);
    }

    #[test]
    fn memory_budget_clamps_the_cap_and_the_per_key_default_follows() {
        let c = config(&[("SANDBOX_TOTAL_MEMORY_MB", "1024")]).unwrap();
        assert_eq!(c.limits.max_concurrent, 4);
        assert_eq!(c.max_concurrent, 4);
        assert_eq!(c.limits.per_key_concurrent, 2);
        assert!(c.limits.clamped);
    }

    #[test]
    fn a_run_larger_than_the_budget_is_fatal() {
        let err = config(&[
            ("SANDBOX_TOTAL_MEMORY_MB", "1024"),
            ("SANDBOX_MEMORY_MB", "2048"),
        ])
        .unwrap_err();
        assert!(
            err.to_string().contains("cannot fit even one 2048 MiB run"),
            "{err}"
        );
    }

    #[test]
    fn the_session_pool_is_charged_against_the_memory_budget() {
        let docker_pool = |total: &'static str, pool: &'static str| {
            config(&[
                ("SANDBOX_PROVIDER", "docker"),
                ("PLIMSOLL_INSECURE", "1"),
                ("SANDBOX_MAX_SESSIONS", "4"),
                ("SANDBOX_SESSION_POOL", pool),
                ("SANDBOX_TOTAL_MEMORY_MB", total),
            ])
        };
        // 1024 / 256 = 4 runs, two of them the pool's.
        let c = docker_pool("1024", "2").unwrap();
        assert_eq!(c.limits.max_concurrent, 2);
        assert!(c.limits.clamped);
        let err = docker_pool("1024", "4").unwrap_err();
        assert!(
            err.to_string()
                .contains("cannot fit the session pool's 4 members"),
            "{err}"
        );
    }

    #[test]
    fn hosted_microvms_are_never_clamped_by_the_host_budget() {
        for provider in ["e2b", "dockercloud"] {
            // 256 MiB of host budget could not fit a 512 MiB run anywhere else.
            let vars = [
                ("SANDBOX_PROVIDER", provider),
                ("E2B_API_KEY", "k"),
                ("DOCKER_SBX_USERNAME", "u"),
                ("DOCKER_SBX_TOKEN", "t"),
                (
                    "SANDBOX_DOCKERCLOUD_API_URL",
                    "https://sandboxes.example.com/sbx",
                ),
                ("SANDBOX_DOCKERCLOUD_IMAGE", "example/sandbox:1"),
                ("PLIMSOLL_INSECURE", "1"),
                ("SANDBOX_MEMORY_MB", "512"),
                ("SANDBOX_TOTAL_MEMORY_MB", "256"),
            ];
            let c = config(&vars).unwrap_or_else(|e| panic!("{provider}: {e}"));
            assert_eq!(c.limits.max_concurrent, 8, "{provider}");
            assert!(!c.limits.clamped, "{provider}");
            assert_eq!(c.limits.total_memory_mb, 0, "{provider}");
            let env: HashMap<String, String> = vars
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect();
            let warnings = c.warnings(&env);
            assert!(
                warnings
                    .iter()
                    .any(|w| w.starts_with("SANDBOX_TOTAL_MEMORY_MB=256 is ignored")),
                "{provider}: {warnings:?}"
            );
        }
        // The same budget on docker clamps and refuses as before.
        let err = config(&[
            ("SANDBOX_PROVIDER", "docker"),
            ("PLIMSOLL_INSECURE", "1"),
            ("SANDBOX_MEMORY_MB", "512"),
            ("SANDBOX_TOTAL_MEMORY_MB", "256"),
        ])
        .unwrap_err();
        assert!(
            err.to_string().contains("cannot fit even one 512 MiB run"),
            "{err}"
        );
    }

    #[test]
    fn burst_zero_means_the_rate() {
        let c = config(&[("SANDBOX_RATE_PER_MIN", "10"), ("SANDBOX_RATE_BURST", "0")]).unwrap();
        assert_eq!(c.limits.rate_burst, 10);
    }

    #[test]
    fn per_key_above_the_cap_is_fatal_and_zero_means_none() {
        let err = config(&[("SANDBOX_PER_KEY_CONCURRENT", "9")]).unwrap_err();
        assert!(
            err.to_string().contains("SANDBOX_PER_KEY_CONCURRENT"),
            "{err}"
        );
        let c = config(&[("SANDBOX_PER_KEY_CONCURRENT", "0")]).unwrap();
        assert_eq!(c.limits.per_key_concurrent, 0);
    }

    #[test]
    fn unparseable_limits_fail_closed() {
        for (var, bad) in [
            ("SANDBOX_RATE_PER_MIN", "1e3"),
            ("SANDBOX_RATE_BURST", "0x10"),
            ("SANDBOX_TOTAL_MEMORY_MB", "-1"),
        ] {
            let err = config(&[(var, bad)]).unwrap_err();
            assert!(err.to_string().contains(var), "{var}={bad}: {err}");
        }
    }

    #[test]
    fn paid_seconds_are_refused_without_a_metered_provider() {
        let err = config(&[("SANDBOX_PAID_SECONDS_PER_DAY", "60")]).unwrap_err();
        assert!(
            err.to_string().contains("SANDBOX_PAID_SECONDS_PER_DAY"),
            "{err}"
        );
    }
}
