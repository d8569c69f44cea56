#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::HashMap;
use std::fs;

use super::*;

const FP_A: &str = "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";

fn env(pairs: &[(&str, &str)]) -> HashMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

fn ok(pairs: &[(&str, &str)]) -> Config {
    match Config::from_env(&env(pairs)) {
        Ok(config) => config,
        Err(e) => panic!("{pairs:?} should be accepted: {e}"),
    }
}

fn problems(pairs: &[(&str, &str)]) -> Vec<ConfigProblem> {
    match Config::from_env(&env(pairs)) {
        Ok(config) => panic!("{pairs:?} should be refused, got {config:?}"),
        Err(e) => e.problems,
    }
}

/// The single problem `pairs` produce, as text.
fn problem(pairs: &[(&str, &str)]) -> String {
    let found = problems(pairs);
    assert_eq!(found.len(), 1, "{found:?}");
    found[0].to_string()
}

fn token() -> String {
    "t".repeat(32)
}

// === defaults ===

#[test]
fn empty_environment_gives_the_documented_defaults() {
    let config = ok(&[]);
    assert_eq!(config.addr, "127.0.0.1:8746");
    assert_eq!(config.metrics_addr.as_deref(), Some("127.0.0.1:9464"));
    assert_eq!(config.log_format, LogFormat::Json);
    assert_eq!(config.auth, AuthConfig::Open);
    assert!(!config.insecure && !config.insecure_set);
    assert_eq!(config.tls, None);
    assert!(!config.hardened);
    assert_eq!(config.provider, ProviderConfig::default());
    assert_eq!(config.min_isolation, None);
    assert_eq!(config.resources, Resources::default());
    assert_eq!(config.max_concurrent, 8);
    assert!(config.unknown_vars.is_empty());
}

#[test]
fn empty_values_mean_the_default() {
    let config = ok(&[
        ("PLIMSOLL_ADDR", ""),
        ("PLIMSOLL_METRICS_ADDR", "  "),
        ("SANDBOX_MAX_CONCURRENT", " "),
        ("SANDBOX_MEMORY_MB", ""),
        ("SANDBOX_PROVIDER", " "),
    ]);
    assert_eq!(config.addr, "127.0.0.1:8746");
    assert_eq!(config.metrics_addr.as_deref(), Some("127.0.0.1:9464"));
    assert_eq!(config.max_concurrent, 8);
    assert_eq!(config.provider, ProviderConfig::default());
}

// === listeners ===

#[test]
fn addr_accepts_host_port_and_port_zero() {
    assert_eq!(ok(&[("PLIMSOLL_ADDR", ":0")]).addr, ":0");
    assert_eq!(ok(&[("PLIMSOLL_ADDR", "[::1]:8746")]).addr, "[::1]:8746");
}

#[test]
fn addr_is_not_trimmed() {
    let text = problem(&[("PLIMSOLL_ADDR", " 127.0.0.1:8746")]);
    assert!(text.starts_with("PLIMSOLL_ADDR="), "{text}");
}

#[test]
fn addr_without_port_is_fatal() {
    let text = problem(&[("PLIMSOLL_ADDR", "127.0.0.1")]);
    assert!(text.contains("must be host:port"), "{text}");
}

#[test]
fn metrics_addr_off_in_any_case_disables_it() {
    for off in ["off", "OFF", " Off "] {
        assert_eq!(ok(&[("PLIMSOLL_METRICS_ADDR", off)]).metrics_addr, None);
    }
}

#[test]
fn metrics_addr_is_trimmed_and_must_be_host_port() {
    let config = ok(&[("PLIMSOLL_METRICS_ADDR", " 0.0.0.0:9464 ")]);
    assert_eq!(config.metrics_addr.as_deref(), Some("0.0.0.0:9464"));
    for bad in ["9464", "127.0.0.1"] {
        let text = problem(&[("PLIMSOLL_METRICS_ADDR", bad)]);
        assert!(text.starts_with("PLIMSOLL_METRICS_ADDR="), "{text}");
    }
}

#[test]
fn log_format_text_selects_text_and_anything_else_is_json() {
    for text in ["text", "TEXT", " text "] {
        assert_eq!(
            ok(&[("PLIMSOLL_LOG_FORMAT", text)]).log_format,
            LogFormat::Text
        );
    }
    for other in ["json", "", "logfmt", "texts"] {
        assert_eq!(
            ok(&[("PLIMSOLL_LOG_FORMAT", other)]).log_format,
            LogFormat::Json
        );
    }
}

// === authentication ===

#[test]
fn token_of_32_visible_bytes_is_accepted_untrimmed() {
    let config = ok(&[("PLIMSOLL_TOKEN", &token())]);
    assert_eq!(config.auth, AuthConfig::Token(token()));
}

#[test]
fn token_shorter_than_32_bytes_is_fatal() {
    let text = problem(&[("PLIMSOLL_TOKEN", &"t".repeat(31))]);
    assert!(text.starts_with("PLIMSOLL_TOKEN is too short"), "{text}");
}

#[test]
fn token_longer_than_4096_bytes_is_fatal() {
    let text = problem(&[("PLIMSOLL_TOKEN", &"t".repeat(4097))]);
    assert!(text.contains("too long"), "{text}");
}

#[test]
fn token_with_whitespace_is_fatal_and_never_echoed() {
    let secret = format!("{} ", "s".repeat(40));
    let text = problem(&[("PLIMSOLL_TOKEN", &secret)]);
    assert!(text.contains("visible ASCII"), "{text}");
    assert!(!text.contains(&"s".repeat(40)));
}

#[test]
fn clients_file_wins_over_token() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("clients.json");
    fs::write(
        &path,
        format!(r#"{{"clients": [{{"id": "ci", "token_sha256": "{FP_A}", "scopes": []}}]}}"#),
    )
    .unwrap();
    let path_text = path.to_str().unwrap();
    let vars = env(&[
        ("PLIMSOLL_CLIENTS_FILE", path_text),
        ("PLIMSOLL_TOKEN", "short"),
    ]);
    let config = Config::from_env(&vars).unwrap();
    match &config.auth {
        AuthConfig::Clients(file) => assert_eq!(file.clients[0].id, "ci"),
        other => panic!("{other:?}"),
    }
    assert!(
        config
            .warnings(&vars)
            .iter()
            .any(|w| w.contains("PLIMSOLL_TOKEN is ignored"))
    );
}

#[test]
fn clients_file_that_cannot_be_loaded_is_fatal() {
    let text = problem(&[("PLIMSOLL_CLIENTS_FILE", "/nonexistent/clients.json")]);
    assert!(
        text.contains("failed to load PLIMSOLL_CLIENTS_FILE"),
        "{text}"
    );
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("clients.json");
    fs::write(&path, r#"{"clients": [{"id": "*"}]}"#).unwrap();
    let text = problem(&[("PLIMSOLL_CLIENTS_FILE", path.to_str().unwrap())]);
    assert!(
        text.contains("failed to load PLIMSOLL_CLIENTS_FILE"),
        "{text}"
    );
}

#[test]
fn clients_file_with_no_clients_is_fatal() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("clients.json");
    fs::write(&path, r#"{"clients": []}"#).unwrap();
    let text = problem(&[("PLIMSOLL_CLIENTS_FILE", path.to_str().unwrap())]);
    assert!(text.contains("defines no clients"), "{text}");
}

#[test]
fn real_provider_without_credentials_is_refused() {
    let text = problem(&[("SANDBOX_PROVIDER", "wasm")]);
    assert!(
        text.starts_with(
            "refusing to start: a real sandbox provider is enabled but PLIMSOLL_TOKEN is unset"
        ),
        "{text}"
    );
}

#[test]
fn insecure_exactly_1_allows_open_mode_with_a_real_provider() {
    let config = ok(&[("SANDBOX_PROVIDER", "wasm"), ("PLIMSOLL_INSECURE", "1")]);
    assert_eq!(config.auth, AuthConfig::Open);
    assert!(config.insecure && config.insecure_set);
    for not_one in ["true", " 1", "yes", "TRUE"] {
        let found = problems(&[("SANDBOX_PROVIDER", "wasm"), ("PLIMSOLL_INSECURE", not_one)]);
        assert!(
            matches!(found[..], [ConfigProblem::OpenModeRefused]),
            "{not_one:?}"
        );
    }
}

#[test]
fn insecure_set_records_any_non_empty_value() {
    let config = ok(&[("PLIMSOLL_INSECURE", "no")]);
    assert!(!config.insecure);
    assert!(config.insecure_set);
}

#[test]
fn disabled_provider_allows_open_mode_with_a_warning() {
    let vars = env(&[]);
    let config = Config::from_env(&vars).unwrap();
    assert_eq!(config.auth, AuthConfig::Open);
    assert!(
        config
            .warnings(&vars)
            .iter()
            .any(|w| w.contains("no authentication"))
    );
}

#[test]
fn broken_token_does_not_add_an_open_mode_problem() {
    let found = problems(&[("SANDBOX_PROVIDER", "wasm"), ("PLIMSOLL_TOKEN", "short")]);
    assert!(matches!(
        found[..],
        [ConfigProblem::TokenTooShort { bytes: 5 }]
    ));
}

// === TLS and hardened ===

#[test]
fn tls_needs_both_paths() {
    let config = ok(&[
        ("PLIMSOLL_TLS_CERT", " cert.pem "),
        ("PLIMSOLL_TLS_KEY", "key.pem"),
    ]);
    assert_eq!(
        config.tls,
        Some(TlsFiles {
            cert: "cert.pem".into(),
            key: "key.pem".into()
        })
    );
    assert!(problem(&[("PLIMSOLL_TLS_CERT", "c.pem")]).contains("PLIMSOLL_TLS_KEY is unset"));
    assert!(problem(&[("PLIMSOLL_TLS_KEY", "k.pem")]).contains("PLIMSOLL_TLS_CERT is unset"));
}

#[test]
fn hardened_is_a_strict_boolean() {
    assert!(ok(&[("PLIMSOLL_HARDENED", "1")]).hardened);
    assert!(ok(&[("PLIMSOLL_HARDENED", " TRUE ")]).hardened);
    assert!(!ok(&[("PLIMSOLL_HARDENED", "0")]).hardened);
    assert!(!ok(&[("PLIMSOLL_HARDENED", "false")]).hardened);
    let text = problem(&[("PLIMSOLL_HARDENED", "yes")]);
    assert!(
        text.contains("must be one of 0, 1, false, or true"),
        "{text}"
    );
    assert!(text.starts_with("PLIMSOLL_HARDENED="), "{text}");
}

// === provider and floor ===

#[test]
fn provider_is_trimmed_and_lower_cased() {
    let config = ok(&[("SANDBOX_PROVIDER", " WASM "), ("PLIMSOLL_TOKEN", &token())]);
    assert_eq!(config.provider.name(), "wasm");
    assert_eq!(
        ok(&[("SANDBOX_PROVIDER", "Disabled")]).provider,
        ProviderConfig::default()
    );
}

#[test]
fn unknown_provider_is_fatal_and_lists_the_known_names() {
    let text = problem(&[("SANDBOX_PROVIDER", "firecracker")]);
    assert!(text.contains("\"firecracker\""), "{text}");
    assert!(
        text.ends_with("known: disabled, wasm, docker, openshell, e2b, dockercloud"),
        "{text}"
    );
}

#[test]
fn known_providers_are_chosen_by_their_names() {
    for provider in KNOWN_PROVIDERS {
        let mut pairs = vec![("SANDBOX_PROVIDER", provider.name)];
        let token = token();
        pairs.push(("PLIMSOLL_TOKEN", &token));
        if provider.name == "openshell" {
            // Its five settings have no default.
            pairs.extend([
                ("SANDBOX_OPENSHELL_GATEWAY_URL", "https://127.0.0.1:8443"),
                ("SANDBOX_OPENSHELL_CA_FILE", "/c/ca.crt"),
                ("SANDBOX_OPENSHELL_CERT_FILE", "/c/tls.crt"),
                ("SANDBOX_OPENSHELL_KEY_FILE", "/c/tls.key"),
                ("SANDBOX_OPENSHELL_IMAGE", "plimsoll/sandbox:latest"),
            ]);
        }
        if provider.name == "e2b" {
            // Its key has no default.
            pairs.push(("E2B_API_KEY", "e2b_test"));
        }
        if provider.name == "dockercloud" {
            // Its account, API and image have no default.
            pairs.extend([
                ("DOCKER_SBX_USERNAME", "me"),
                ("DOCKER_SBX_TOKEN", "dckr_pat_test"),
                (
                    "SANDBOX_DOCKERCLOUD_API_URL",
                    "https://sandboxes.connect.docker.com/sbx",
                ),
                ("SANDBOX_DOCKERCLOUD_IMAGE", "docker/sandbox:latest"),
            ]);
        }
        assert_eq!(ok(&pairs).provider.name(), provider.name);
    }
    assert!(!ProviderConfig::default().settings().runs_code());
}

#[test]
fn floor_accepts_the_four_tiers_trimmed_and_lower_cased() {
    for (text, want) in [
        ("process", "process"),
        (" Container ", "container"),
        ("KERNEL", "kernel"),
        ("vm", "vm"),
    ] {
        let config = ok(&[("SANDBOX_MIN_ISOLATION", text)]);
        assert_eq!(config.min_isolation.map(IsolationTier::as_str), Some(want));
    }
}

#[test]
fn floor_none_unknown_or_other_is_fatal() {
    for bad in ["none", "unknown", "gvisor", "microvm"] {
        let text = problem(&[("SANDBOX_MIN_ISOLATION", bad)]);
        assert!(
            text.contains("must be one of process, container, kernel, vm"),
            "{text}"
        );
    }
}

// === envelope ===

#[test]
fn envelope_values_parse() {
    let config = ok(&[
        ("SANDBOX_MEMORY_MB", " 512 "),
        ("SANDBOX_CPUS", "1.5"),
        ("SANDBOX_PIDS", "+64"),
        ("SANDBOX_DISK_MB", "0100"),
    ]);
    assert_eq!(
        config.resources,
        Resources {
            memory_mb: 512,
            cpus: 1.5,
            pids: 64,
            disk_mb: 100
        }
    );
}

#[test]
fn integers_refuse_exponents_hex_and_unicode_digits() {
    for bad in ["1e3", "0x10", "\u{0663}", "1.0", "ten"] {
        let text = problem(&[("SANDBOX_MEMORY_MB", bad)]);
        assert!(text.contains("is not an integer"), "{bad:?}: {text}");
        assert!(text.starts_with("SANDBOX_MEMORY_MB="), "{text}");
    }
}

#[test]
fn negative_integers_are_fatal() {
    let text = problem(&[("SANDBOX_PIDS", "-1")]);
    assert!(text.contains("must be between 0 and"), "{text}");
}

#[test]
fn cpus_must_be_finite_and_non_negative() {
    for bad in ["NaN", "inf", "-1", "two"] {
        let text = problem(&[("SANDBOX_CPUS", bad)]);
        assert!(
            text.contains("finite non-negative number"),
            "{bad:?}: {text}"
        );
    }
}

#[test]
fn a_cpu_share_too_small_to_enforce_is_fatal_and_zero_is_the_default() {
    for tiny in ["1e-10", "0.0000000001", "0.009"] {
        let text = problem(&[("SANDBOX_CPUS", tiny)]);
        assert!(text.contains("below 0.01 CPU"), "{tiny:?}: {text}");
    }
    for fine in ["0", "0.01", "0.5"] {
        let env: HashMap<String, String> = [("SANDBOX_CPUS".to_owned(), fine.to_owned())].into();
        assert!(Config::from_env(&env).is_ok(), "{fine:?}");
    }
}

#[test]
fn cpus_pids_and_disk_are_fatal_for_wasm() {
    let base = [("SANDBOX_PROVIDER", "wasm"), ("PLIMSOLL_INSECURE", "1")];
    let mut pairs = base.to_vec();
    pairs.push(("SANDBOX_CPUS", "1.5"));
    pairs.push(("SANDBOX_PIDS", "64"));
    pairs.push(("SANDBOX_DISK_MB", "100"));
    let found = problems(&pairs);
    assert_eq!(found.len(), 3, "{found:?}");
    assert_eq!(found[0].variable(), "SANDBOX_CPUS");
    assert_eq!(found[1].variable(), "SANDBOX_PIDS");
    assert_eq!(found[2].variable(), "SANDBOX_DISK_MB");
    assert_eq!(
        found[0].to_string(),
        "SANDBOX_CPUS=1.5 is not supported by the wasm provider; unset it or set 0"
    );
    // Memory up to what a 32-bit memory addresses, and no more.
    let mut most = base.to_vec();
    most.push(("SANDBOX_MEMORY_MB", "4096"));
    ok(&most);
    let mut over = base.to_vec();
    over.push(("SANDBOX_MEMORY_MB", "4097"));
    assert_eq!(
        problem(&over),
        "SANDBOX_MEMORY_MB=\"4097\" is more than a wasm run can address (4096)"
    );
    // Zero is the same as unset.
    let mut zeros = base.to_vec();
    zeros.push(("SANDBOX_CPUS", "0"));
    zeros.push(("SANDBOX_PIDS", "0"));
    zeros.push(("SANDBOX_DISK_MB", "0"));
    ok(&zeros);
}

#[test]
fn pids_and_disk_are_allowed_for_disabled() {
    ok(&[("SANDBOX_PIDS", "64"), ("SANDBOX_DISK_MB", "100")]);
}

// === admission ===

#[test]
fn max_concurrent_accepts_1_to_1024() {
    assert_eq!(ok(&[("SANDBOX_MAX_CONCURRENT", "1")]).max_concurrent, 1);
    assert_eq!(
        ok(&[("SANDBOX_MAX_CONCURRENT", "1024")]).max_concurrent,
        1024
    );
}

#[test]
fn max_concurrent_outside_the_range_is_fatal() {
    for (bad, shown) in [("0", "0"), ("1025", "1025"), ("-3", "-3")] {
        let text = problem(&[("SANDBOX_MAX_CONCURRENT", bad)]);
        assert!(
            text.contains(&format!("max_concurrent={shown} is outside [1,1024]")),
            "{text}"
        );
    }
    let text = problem(&[("SANDBOX_MAX_CONCURRENT", "eight")]);
    assert!(text.contains("is not an integer"), "{text}");
}

// === collection ===

#[test]
fn every_bad_variable_is_reported_together() {
    let err = Config::from_env(&env(&[
        ("PLIMSOLL_ADDR", "nope"),
        ("PLIMSOLL_METRICS_ADDR", "9464"),
        ("PLIMSOLL_HARDENED", "maybe"),
        ("PLIMSOLL_TLS_CERT", "c.pem"),
        ("SANDBOX_PROVIDER", "firecracker"),
        ("SANDBOX_MIN_ISOLATION", "none"),
        ("SANDBOX_MEMORY_MB", "1e3"),
        ("SANDBOX_CPUS", "NaN"),
        ("SANDBOX_MAX_CONCURRENT", "0"),
        ("PLIMSOLL_TOKEN", "short"),
    ]))
    .unwrap_err();
    let vars: Vec<&str> = err.problems.iter().map(ConfigProblem::variable).collect();
    assert_eq!(
        vars,
        [
            "PLIMSOLL_ADDR",
            "PLIMSOLL_METRICS_ADDR",
            "PLIMSOLL_TLS_KEY",
            "PLIMSOLL_HARDENED",
            "SANDBOX_PROVIDER",
            "SANDBOX_MIN_ISOLATION",
            "SANDBOX_MEMORY_MB",
            "SANDBOX_CPUS",
            "SANDBOX_MAX_CONCURRENT",
            "PLIMSOLL_TOKEN",
        ]
    );
    let line = err.to_string();
    assert!(line.starts_with("invalid configuration: "));
    assert!(!line.contains('\n'));
}

#[test]
fn long_values_are_cut_in_messages() {
    let text = problem(&[("SANDBOX_MEMORY_MB", &"x".repeat(500))]);
    assert!(text.len() < 200, "{text}");
}

#[test]
fn unknown_variables_are_collected_not_refused() {
    let config = ok(&[
        ("PLIMSOLL_ADRR", ":1"),
        ("SANDBOX_FOO", "1"),
        ("E2B_API_KEY", "k"),
    ]);
    assert_eq!(config.unknown_vars, ["PLIMSOLL_ADRR", "SANDBOX_FOO"]);
}

#[test]
fn non_loopback_metrics_listener_is_warned_about() {
    let vars = env(&[("PLIMSOLL_METRICS_ADDR", ":9464")]);
    let config = Config::from_env(&vars).unwrap();
    assert!(
        config
            .warnings(&vars)
            .iter()
            .any(|w| w.contains("not loopback"))
    );
}

#[test]
fn the_guard_address_is_required_exactly_with_a_guard_url() {
    let e2b = [
        ("SANDBOX_PROVIDER", "e2b"),
        ("E2B_API_KEY", "e2b_test"),
        ("PLIMSOLL_INSECURE", "1"),
    ];
    let with = |extra: &[(&'static str, &'static str)]| {
        let mut pairs = e2b.to_vec();
        pairs.extend_from_slice(extra);
        pairs
    };
    // Set without a guard URL: refused, whichever provider.
    let text = problem(&with(&[("PLIMSOLL_GUARD_ADDR", "127.0.0.1:0")]));
    assert!(text.starts_with("PLIMSOLL_GUARD_ADDR"), "{text}");
    // A guard URL with a supervised broker needs it, and it must be host:port.
    let url = ("E2B_GUARD_URL", "https://guard.example.com");
    let grants = ("PLIMSOLL_GRANTS_FILE", "/g/grants.json");
    let text = problem(&with(&[url, grants]));
    assert!(text.starts_with("PLIMSOLL_GUARD_ADDR"), "{text}");
    let text = problem(&with(&[url, grants, ("PLIMSOLL_GUARD_ADDR", "8443")]));
    assert!(text.contains("PLIMSOLL_GUARD_ADDR"), "{text}");
    let config = ok(&with(&[
        url,
        grants,
        ("PLIMSOLL_GUARD_ADDR", "127.0.0.1:8443"),
    ]));
    assert_eq!(config.guard_addr.as_deref(), Some("127.0.0.1:8443"));
    assert_eq!(ok(&e2b).guard_addr, None);
}

#[test]
fn a_refused_url_never_shows_a_credential_it_carries() {
    for (var, value, extra) in [
        (
            "E2B_API_URL",
            "https://user:hunter2@api.example.com",
            [("SANDBOX_PROVIDER", "e2b"), ("PLIMSOLL_INSECURE", "1")],
        ),
        (
            "E2B_API_URL",
            "https://api.example.com/?key=hunter2",
            [("SANDBOX_PROVIDER", "e2b"), ("PLIMSOLL_INSECURE", "1")],
        ),
        (
            "DOCKER_HOST",
            "tcp://user:hunter2@docker.example.com:2376",
            [("SANDBOX_PROVIDER", "docker"), ("PLIMSOLL_INSECURE", "1")],
        ),
    ] {
        let mut pairs = extra.to_vec();
        pairs.extend([(var, value), ("E2B_API_KEY", "e2b_test")]);
        let text = problem(&pairs);
        assert!(text.contains(var), "{text}");
        assert!(!text.contains("hunter2"), "{text}");
    }
    assert_eq!(
        crate::config::shown_url("https://u:p@h.example/a?t=1#f"),
        "https://<redacted>@h.example/a?<redacted>"
    );
    assert_eq!(
        crate::config::shown_url("key-hunter2@https://h.example"),
        "<redacted>://h.example"
    );
    assert_eq!(
        crate::config::shown_url("unix:///var/run/docker.sock"),
        "unix:///var/run/docker.sock"
    );
}
