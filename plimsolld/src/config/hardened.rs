//! Hardened mode's production policy (`PLIMSOLL_HARDENED=1`, config.md section 10).
//!
//! The daemon checks the policy twice (config.md section 9): before the smoke test, so a
//! misconfiguration never pays for a VM, and after it, with the tier the provider proved. Both
//! passes call the same function; only `proven_tier` differs. Every violation is collected and
//! reported together.
//!
//! All nine rules: isolation (1), identity (2), transport (3), immutable surface (4), the
//! explicit envelope (5), rate (6), per-caller concurrency (7), sessions (8) and metered
//! allowances (9). The provider's part of rules 1, 4 and 5 (the tier it could reach, its own
//! surface, the limits its sandboxes need) comes from its settings
//! ([`crate::provider::config::ProviderSettings`]).

use super::env::{
    ENV_ADDR, ENV_CLIENTS_FILE, ENV_CPUS, ENV_DISK_MB, ENV_INSECURE, ENV_MAX_CONCURRENT,
    ENV_MEMORY_MB, ENV_METRICS_ADDR, ENV_PER_KEY_CONCURRENT, ENV_RATE_BURST, ENV_RATE_PER_MIN,
};
use super::listen_addr::is_loopback_addr;
use super::{AuthConfig, Config};
use plimsoll::tier::IsolationTier;

/// The weakest tier hardened mode accepts (`kernel`, so `kernel` and `vm`).
const HARDENED_FLOOR: IsolationTier = IsolationTier::Kernel;

/// The policy was violated; lists every violation. Displays as one line.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("hardened-mode policy violation; refusing to serve: {}", .violations.join("; "))]
pub struct HardenedError {
    /// One sentence per violated rule, in rule order. Never empty.
    pub violations: Vec<String>,
}

/// Every violation of the hardened policy that `config` (and the tier, once proven) shows.
///
/// `proven_tier` is `None` on the first pass: the isolation rule then judges the best tier
/// the provider could ever prove
/// ([`ProviderSettings::highest_tier`](crate::provider::config::ProviderSettings::highest_tier)),
/// so `disabled` and
/// `wasm` fail at once while a provider that might reach `kernel` waits for its proof. On the
/// second pass it is the tier the smoke test proved. Computes the violations whether or not `config.hardened` is set; see
/// [`enforce_hardened`] for the gate.
pub fn hardened_violations(config: &Config, proven_tier: Option<IsolationTier>) -> Vec<String> {
    let mut violations = Vec::new();
    let provider = config.provider.settings();

    // 1. Isolation. A provider that cannot reach `kernel` fails before the proof.
    let tier = proven_tier.unwrap_or(provider.highest_tier());
    if tier < HARDENED_FLOOR {
        let how = if proven_tier.is_some() {
            "proved"
        } else {
            "can reach at most"
        };
        let hint = provider.tier_hint().unwrap_or_default();
        violations.push(format!(
            "isolation: the {} provider {how} tier {tier}; hardened mode requires kernel or vm{hint}",
            config.provider
        ));
    }

    // 2. Identity.
    match config.auth {
        AuthConfig::Clients(_) => {}
        AuthConfig::Token(_) => violations.push(format!(
            "identity: {ENV_CLIENTS_FILE} is required; a shared PLIMSOLL_TOKEN is not accepted"
        )),
        AuthConfig::Open => violations.push(format!(
            "identity: {ENV_CLIENTS_FILE} is required; serving without authentication is not accepted"
        )),
    }
    if config.insecure_set {
        violations.push(format!("identity: {ENV_INSECURE} must be unset"));
    }

    // 3. Transport: TLS on every listener that is not loopback.
    if config.tls.is_none() {
        let listeners = std::iter::once((ENV_ADDR, config.addr.as_str())).chain(
            config
                .metrics_addr
                .as_deref()
                .map(|addr| (ENV_METRICS_ADDR, addr)),
        );
        for (var, addr) in listeners {
            if !is_loopback_addr(addr) {
                violations.push(format!(
                    "transport: {var}={addr} is not a loopback address and TLS is off; \
                     set PLIMSOLL_TLS_CERT and PLIMSOLL_TLS_KEY"
                ));
            }
        }
    }

    // 4. Immutable surface: the provider's own rules (docker: images pinned, a syscall
    // filter kept).
    violations.extend(provider.surface_violations());

    // 5. Explicit envelope. Disk only where the provider can enforce it: wasm refuses
    // SANDBOX_DISK_MB outright, so demanding it would be a rule no configuration can meet.
    let resources = &config.resources;
    let mut required = vec![
        (ENV_MEMORY_MB, f64::from(resources.memory_mb)),
        (ENV_CPUS, resources.cpus),
    ];
    if provider.enforces_disk() {
        required.push((ENV_DISK_MB, f64::from(resources.disk_mb)));
    }
    required.extend(provider.required_envelope(config));
    for (var, value) in required {
        if value <= 0.0 {
            violations.push(format!("envelope: {var} must be set explicitly, above 0"));
        }
    }

    // 6. Rate: a limit, and a burst no larger than a minute's refill (an unset burst is the
    // rate already).
    let limits = &config.limits;
    if limits.rate_per_min == 0 {
        violations.push(format!("rate: {ENV_RATE_PER_MIN} must be above 0"));
    } else if limits.rate_burst > limits.rate_per_min {
        violations.push(format!(
            "rate: {ENV_RATE_BURST}={} is above {ENV_RATE_PER_MIN}={}",
            limits.rate_burst, limits.rate_per_min
        ));
    }

    // 7. Per-caller concurrency: a cap strictly below the daemon's (after the memory clamp),
    // so one caller can never take every slot.
    if limits.per_key_concurrent == 0 || limits.per_key_concurrent >= limits.max_concurrent {
        violations.push(format!(
            "per-caller concurrency: {ENV_PER_KEY_CONCURRENT}={} must be above 0 and below the \
             daemon's cap of {} ({ENV_MAX_CONCURRENT}, after the memory clamp)",
            limits.per_key_concurrent, limits.max_concurrent
        ));
    }

    // 8. Sessions: when on, every caller is capped.
    if config.sessions.enabled() && config.sessions.per_caller == 0 {
        violations.push(format!(
            "sessions: {} must be above 0 when sessions are on",
            super::env::ENV_MAX_SESSIONS_PER_CALLER
        ));
    }

    // 9. Metered providers: every caller has a daily paid allowance of its own.
    if let AuthConfig::Clients(file) = &config.auth
        && provider.metered()
    {
        let without: Vec<&str> = file
            .clients
            .iter()
            .filter(|c| c.paid_seconds_per_day.unwrap_or(0) == 0)
            .map(|c| c.id.as_str())
            .collect();
        if !without.is_empty() {
            violations.push(format!(
                "metered: the {} provider bills by the second and these callers have no paid_seconds_per_day above 0: {}",
                config.provider,
                without.join(", ")
            ));
        }
    }

    violations
}

/// `Ok` when hardened mode is off or the policy holds; otherwise every violation.
///
/// Call it with `None` before binding listeners and with `Some(tier)` after the smoke test.
pub fn enforce_hardened(
    config: &Config,
    proven_tier: Option<IsolationTier>,
) -> Result<(), HardenedError> {
    if !config.hardened {
        return Ok(());
    }
    let violations = hardened_violations(config, proven_tier);
    if violations.is_empty() {
        Ok(())
    } else {
        Err(HardenedError { violations })
    }
}

/// A configuration that passes every rule this build can judge once a `kernel` tier is
/// proven: what each provider's own hardened-mode tests start from.
#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
pub(crate) fn passing() -> Config {
    use crate::auth::clients_file::{ClientEntry, ClientsFile};
    use crate::config::Resources;

    let mut config = Config::from_env(&std::collections::HashMap::new()).unwrap();
    config.hardened = true;
    config.auth = AuthConfig::Clients(
        ClientsFile::new(vec![ClientEntry {
            id: "ci".into(),
            token_sha256: "a".repeat(64),
            scopes: vec!["code:run".into()],
            paid_seconds_per_day: Some(3600),
        }])
        .unwrap(),
    );
    config.resources = Resources {
        memory_mb: 256,
        cpus: 1.0,
        pids: 0,
        disk_mb: 64,
    };
    config
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use std::collections::HashMap;

    use super::*;
    use crate::config::{Resources, TlsFiles};
    use crate::provider::config::ProviderConfig;

    fn violations(config: &Config) -> Vec<String> {
        hardened_violations(config, Some(IsolationTier::Kernel))
    }

    #[test]
    fn a_complete_configuration_with_a_kernel_tier_passes() {
        assert_eq!(violations(&passing()), Vec::<String>::new());
        assert!(hardened_violations(&passing(), Some(IsolationTier::Vm)).is_empty());
        assert!(enforce_hardened(&passing(), Some(IsolationTier::Kernel)).is_ok());
    }

    #[test]
    fn tiers_below_kernel_fail_after_proof() {
        for tier in [
            IsolationTier::None,
            IsolationTier::Process,
            IsolationTier::Container,
        ] {
            let found = hardened_violations(&passing(), Some(tier));
            assert_eq!(found.len(), 1, "{tier:?}");
            assert!(found[0].starts_with("isolation:"), "{found:?}");
        }
    }

    #[test]
    fn disabled_and_wasm_fail_isolation_before_any_proof() {
        let mut config = passing();
        let found = hardened_violations(&config, None);
        assert!(found[0].contains("disabled provider can reach at most tier none"));
        config.provider = ProviderConfig::Wasm(Default::default());
        config.resources.disk_mb = 0;
        let found = hardened_violations(&config, None);
        assert_eq!(found.len(), 1, "{found:?}");
        assert!(found[0].contains("wasm provider can reach at most tier process"));
    }

    #[test]
    fn shared_token_and_open_mode_fail_identity() {
        let mut config = passing();
        config.auth = AuthConfig::Token("t".repeat(40));
        assert!(violations(&config)[0].contains("shared PLIMSOLL_TOKEN"));
        config.auth = AuthConfig::Open;
        assert!(violations(&config)[0].contains("without authentication"));
    }

    #[test]
    fn any_non_empty_insecure_value_fails_identity() {
        let mut config = passing();
        config.insecure_set = true;
        assert_eq!(
            violations(&config),
            ["identity: PLIMSOLL_INSECURE must be unset"]
        );
    }

    #[test]
    fn non_loopback_listeners_without_tls_fail_transport() {
        for addr in [
            ":8746",
            "0.0.0.0:8746",
            "10.0.0.1:8746",
            "127.0.0.1",
            "[::]:1",
        ] {
            let mut config = passing();
            config.addr = addr.into();
            let found = violations(&config);
            assert_eq!(found.len(), 1, "{addr}: {found:?}");
            assert!(found[0].contains("PLIMSOLL_ADDR"), "{found:?}");
        }
        let mut config = passing();
        config.metrics_addr = Some("0.0.0.0:9464".into());
        assert!(violations(&config)[0].contains("PLIMSOLL_METRICS_ADDR"));
    }

    #[test]
    fn loopback_listeners_or_tls_pass_transport() {
        let mut config = passing();
        config.addr = "localhost:8746".into();
        config.metrics_addr = Some("[::1]:9464".into());
        assert!(violations(&config).is_empty());
        config.addr = ":8746".into();
        config.metrics_addr = Some(":9464".into());
        config.tls = Some(TlsFiles {
            cert: "c.pem".into(),
            key: "k.pem".into(),
        });
        assert!(violations(&config).is_empty());
        config.tls = None;
        config.metrics_addr = None;
        assert_eq!(violations(&config).len(), 1, "metrics off is not judged");
    }

    #[test]
    fn missing_envelope_values_fail_one_by_one() {
        let mut config = passing();
        config.resources = Resources::default();
        let found = violations(&config);
        assert_eq!(found.len(), 3, "{found:?}");
        for var in ["SANDBOX_MEMORY_MB", "SANDBOX_CPUS", "SANDBOX_DISK_MB"] {
            assert!(found.iter().any(|v| v.contains(var)), "{var}");
        }
    }

    #[test]
    fn rate_needs_a_limit_and_a_burst_within_it() {
        let env = |pairs: &[(&str, &str)]| -> Config {
            let env: HashMap<String, String> = pairs
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect();
            let mut config = passing();
            config.limits = Config::from_env(&env).unwrap().limits;
            config
        };
        assert!(violations(&env(&[])).is_empty(), "the defaults pass");
        let burst_unset = env(&[("SANDBOX_RATE_PER_MIN", "10")]);
        assert!(
            violations(&burst_unset).is_empty(),
            "an unset burst is the rate"
        );
        let off = violations(&env(&[("SANDBOX_RATE_PER_MIN", "0")]));
        assert_eq!(off, ["rate: SANDBOX_RATE_PER_MIN must be above 0"]);
        let wide = violations(&env(&[
            ("SANDBOX_RATE_PER_MIN", "30"),
            ("SANDBOX_RATE_BURST", "31"),
        ]));
        assert_eq!(
            wide,
            ["rate: SANDBOX_RATE_BURST=31 is above SANDBOX_RATE_PER_MIN=30"]
        );
    }

    #[test]
    fn the_per_caller_cap_must_be_set_and_below_the_daemons() {
        let mut config = passing();
        config.limits.max_concurrent = 8;
        for (per_key, passes) in [(0, false), (1, true), (7, true), (8, false)] {
            config.limits.per_key_concurrent = per_key;
            let found = violations(&config);
            assert_eq!(found.is_empty(), passes, "{per_key}: {found:?}");
            if !passes {
                assert_eq!(found.len(), 1, "{found:?}");
                assert!(
                    found[0].starts_with("per-caller concurrency: SANDBOX_PER_KEY_CONCURRENT="),
                    "{found:?}"
                );
            }
        }
    }

    #[test]
    fn every_violation_is_reported_together() {
        let env: HashMap<String, String> = [
            ("PLIMSOLL_HARDENED", "1"),
            ("PLIMSOLL_ADDR", ":8746"),
            ("PLIMSOLL_INSECURE", "yes"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect();
        let config = Config::from_env(&env).unwrap();
        let err = enforce_hardened(&config, None).unwrap_err();
        // isolation, identity x2, transport, envelope x3.
        assert_eq!(err.violations.len(), 7, "{:?}", err.violations);
        assert!(
            err.to_string()
                .starts_with("hardened-mode policy violation")
        );
    }

    #[test]
    fn a_metered_provider_needs_an_allowance_for_every_caller() {
        use crate::auth::clients_file::{ClientEntry, ClientsFile};

        let entry = |id: &str, paid: Option<u64>| ClientEntry {
            id: id.into(),
            token_sha256: id.repeat(64)[..64].to_owned(),
            scopes: vec!["code:run".into()],
            paid_seconds_per_day: paid,
        };
        let mut config = passing();
        config.auth = AuthConfig::Clients(
            ClientsFile::new(vec![
                entry("a", Some(60)),
                entry("b", None),
                entry("c", Some(0)),
            ])
            .unwrap(),
        );
        // Not metered: allowances are not asked for.
        assert!(violations(&config).is_empty(), "{:?}", violations(&config));
        let mut env = HashMap::new();
        env.insert("SANDBOX_PROVIDER".to_owned(), "e2b".to_owned());
        env.insert("E2B_API_KEY".to_owned(), "k".to_owned());
        env.insert("PLIMSOLL_INSECURE".to_owned(), "1".to_owned());
        config.provider = Config::from_env(&env).unwrap().provider;
        let found: Vec<String> = violations(&config)
            .into_iter()
            .filter(|v| v.starts_with("metered:"))
            .collect();
        assert_eq!(found.len(), 1, "{found:?}");
        assert!(
            found[0].ends_with("no paid_seconds_per_day above 0: b, c"),
            "{found:?}"
        );
    }

    #[test]
    fn hardened_off_enforces_nothing() {
        let mut config = passing();
        config.hardened = false;
        config.auth = AuthConfig::Open;
        assert!(enforce_hardened(&config, Some(IsolationTier::None)).is_ok());
    }
}
