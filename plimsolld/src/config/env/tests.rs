//! The variable table against the constants env.rs declares, the help text, and unknown-variable detection.

use super::*;

/// The `ENV_` constants, read from this file's source so a constant added without a table
/// entry is caught.
fn declared_names() -> Vec<String> {
    let source = include_str!("../env.rs");
    let mut names = Vec::new();
    for line in source.lines() {
        let Some(rest) = line.strip_prefix("pub const ENV_") else {
            continue;
        };
        // A name the guard crate defines (the listener settings both processes read).
        if let Some((_, ident)) = rest.split_once("guard::env::") {
            names.push(guard_name(ident.trim_end_matches(';')).to_owned());
            continue;
        }
        let Some(start) = rest.find('"') else {
            continue;
        };
        let value = &rest[start + 1..];
        let Some(end) = value.find('"') else { continue };
        names.push(value[..end].to_owned());
    }
    names
}

/// The value of the guard crate's constant `ident`.
fn guard_name(ident: &str) -> &'static str {
    match ident {
        "LOG_FORMAT" => guard::env::LOG_FORMAT,
        "TLS_CERT" => guard::env::TLS_CERT,
        "TLS_KEY" => guard::env::TLS_KEY,
        "HARDENED" => guard::env::HARDENED,
        "MAX_CONCURRENT" => guard::env::MAX_CONCURRENT,
        other => panic!("env.rs names guard::env::{other}, which this test does not know"),
    }
}

/// Every `PLIMSOLL_*`, `SANDBOX_*`, `DOCKER_*` or `E2B_*` word in `text`.
fn mentioned_names(text: &str) -> Vec<String> {
    text.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .filter(|w| {
            ["PLIMSOLL_", "SANDBOX_", "DOCKER_", "E2B_"]
                .iter()
                .any(|p| w.starts_with(p))
        })
        .map(str::to_owned)
        .collect()
}

#[test]
fn every_env_constant_is_in_the_table_and_the_help_text() {
    let mut declared = declared_names();
    declared.extend(BROKER_VARIABLES.iter().map(|n| (*n).to_owned()));
    assert_eq!(declared.len(), VARIABLES.len());
    let mentioned = mentioned_names(&help_text());
    for name in &declared {
        assert!(
            VARIABLES.iter().any(|v| v.name == name),
            "{name} missing from VARIABLES"
        );
        assert!(
            mentioned.contains(name),
            "{name} missing from the help text"
        );
    }
}

#[test]
fn every_name_in_the_help_text_is_an_env_constant() {
    let mut declared = declared_names();
    declared.extend(BROKER_VARIABLES.iter().map(|n| (*n).to_owned()));
    for name in mentioned_names(&help_text()) {
        assert!(declared.contains(&name), "help mentions undeclared {name}");
    }
    for v in VARIABLES {
        assert!(
            declared.iter().any(|d| d == v.name),
            "{} undeclared",
            v.name
        );
    }
}

#[test]
fn table_has_no_duplicates() {
    for (i, v) in VARIABLES.iter().enumerate() {
        assert!(
            VARIABLES[i + 1..].iter().all(|w| w.name != v.name),
            "{} listed twice",
            v.name
        );
    }
}

#[test]
fn help_lists_this_builds_providers_on_the_provider_line() {
    let help = help_text();
    let line = help
        .lines()
        .find(|l| l.trim_start().starts_with(ENV_PROVIDER))
        .unwrap_or_default();
    for p in KNOWN_PROVIDERS {
        assert!(line.contains(p.name), "{} missing from {line:?}", p.name);
    }
}

#[test]
fn help_is_grouped_head_provider_listeners_limits_endpoints() {
    let help = help_text();
    let at = |needle: &str| help.find(needle).unwrap_or(usize::MAX);
    let order = [
        at("plimsolld takes no arguments"),
        at("Provider:"),
        at("Listeners, authentication and transport:"),
        at("Limits:"),
        at("Endpoints:"),
    ];
    assert!(order.windows(2).all(|w| w[0] < w[1]), "{order:?}");
    for endpoint in ["/healthz", "/readyz", "/metrics"] {
        assert!(at(endpoint) > at("Endpoints:"), "{endpoint}");
    }
}

#[test]
fn unknown_detection_uses_the_same_table_as_the_help() {
    let mut env: HashMap<String, String> = VARIABLES
        .iter()
        .map(|v| (v.name.to_owned(), String::new()))
        .collect();
    assert!(unknown_variables(&env).is_empty());
    for name in [
        "PLIMSOLL_ADRR",
        "SANDBOX_NOPE",
        "E2B_WHATEVER",
        "DOCKER_HOST",
        "HOME",
    ] {
        env.insert(name.to_owned(), "x".to_owned());
    }
    assert_eq!(unknown_variables(&env), ["PLIMSOLL_ADRR", "SANDBOX_NOPE"]);
    for name in mentioned_names(&help_text()) {
        assert!(!unknown_variables(&env).contains(&name));
    }
}

#[test]
fn process_env_reads_the_real_environment() {
    // PATH is set in every test environment we run in; the point is only that the impl
    // reaches std::env, not what PATH holds.
    let env = ProcessEnv;
    assert!(env.names().iter().any(|n| n == "PATH"));
    assert!(env.get("PATH").is_some());
}
