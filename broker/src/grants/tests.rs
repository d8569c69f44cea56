use std::collections::HashMap;
use std::path::Path;

use serde_json::{Value, json};

use super::*;

const SECRET: &str = "0123456789abcdef0123456789abcdef";

fn env() -> HashMap<String, String> {
    HashMap::from([
        ("JWT_SECRET".to_owned(), SECRET.to_owned()),
        ("SHORT".to_owned(), "short".to_owned()),
        ("STATIC_TOK".to_owned(), "tok-123".to_owned()),
        ("EMPTY".to_owned(), String::new()),
        ("SPACEY".to_owned(), "a b".to_owned()),
    ])
}

fn base() -> Value {
    json!({
        "base_url": "https://api.example.com",
        "allow": ["GET /items", "get /items/*", "POST /v2/ep1"],
        "allowed_callers": ["alice", " bob "],
        "scopes": ["inv:read"],
        "token": {"type": "jwt", "secret_env": "JWT_SECRET", "audience": "inventory"},
    })
}

fn load_value(file: &Value, dir: &Path) -> Result<Vec<Profile>, GrantsError> {
    parse(
        file.to_string().as_bytes(),
        Path::new("grants.json"),
        dir,
        &env(),
    )
}

/// Loads `base()` with `field` set to `value` and returns the profile error's detail.
fn refused_with(field: &str, value: Value) -> String {
    let mut profile = base();
    if value.is_null() {
        profile.as_object_mut().unwrap().remove(field);
    } else {
        profile[field] = value;
    }
    match load_value(&json!({"profiles": {"p": profile}}), Path::new(".")) {
        Err(GrantsError::Profile { profile, detail }) => {
            assert_eq!(profile, "p");
            detail
        }
        other => panic!("{field}: expected a profile error, got {other:?}"),
    }
}

fn assert_refused(field: &str, value: Value, needle: &str) {
    let detail = refused_with(field, value.clone());
    assert!(
        detail.contains(needle),
        "{field}={value}: {detail:?} does not mention {needle:?}"
    );
}

#[test]
fn a_good_profile_loads() {
    let profiles = load_value(&json!({"profiles": {"inv": base()}}), Path::new(".")).unwrap();
    let p = &profiles[0];
    assert_eq!(p.name, "inv");
    assert_eq!(p.global, "host");
    assert_eq!(p.max_calls, DEFAULT_MAX_CALLS);
    assert_eq!(p.allow[1].template(), "GET /items/*");
    assert!(p.admits("alice") && p.admits("bob"));
    assert!(!p.admits("carol") && !p.admits("") && !p.admits("*"));
    assert_eq!(p.origin.authority(), "api.example.com");
}

#[test]
fn errors_name_the_profile() {
    let err = load_value(
        &json!({"profiles": {"inv": {"allowed_callers": ["a"]}}}),
        Path::new("."),
    )
    .unwrap_err();
    assert_eq!(
        err.to_string(),
        "grants: profile \"inv\": base_url is missing"
    );
}

#[test]
fn unknown_fields_and_trailing_data_are_refused() {
    let mut p = base();
    p["colour"] = json!("red");
    assert!(matches!(
        load_value(&json!({"profiles": {"p": p}}), Path::new(".")),
        Err(GrantsError::Shape { .. })
    ));
    let mut p = base();
    p["token"]["colour"] = json!(1);
    assert!(load_value(&json!({"profiles": {"p": p}}), Path::new(".")).is_err());
    assert!(load_value(&json!({"profiles": {}, "x": 1}), Path::new(".")).is_err());
    // No profiles at all is a valid file (how every profile is taken away, docs/grants.md).
    let none = load_value(&json!({"profiles": {}}), Path::new(".")).unwrap();
    assert!(none.is_empty());
    let text = format!("{} {{}}", json!({"profiles": {}}));
    assert!(parse(text.as_bytes(), Path::new("g"), Path::new("."), &env()).is_err());
    let dup = r#"{"profiles": {"a": {}, "a": {}}}"#;
    let err = parse(dup.as_bytes(), Path::new("g"), Path::new("."), &env()).unwrap_err();
    assert!(err.to_string().contains("defined twice"), "{err}");
}

#[test]
fn bad_names_are_refused() {
    for name in ["", " p", "p ", "a/b", "é", &"x".repeat(129)] {
        let err = load_value(&json!({"profiles": {name: base()}}), Path::new(".")).unwrap_err();
        assert!(
            matches!(err, GrantsError::Profile { .. }),
            "{name:?}: {err}"
        );
    }
    load_value(&json!({"profiles": {"A.b_c-9": base()}}), Path::new(".")).unwrap();
    load_value(
        &json!({"profiles": {"x".repeat(128): base()}}),
        Path::new("."),
    )
    .unwrap();
}

#[test]
fn base_url_must_be_an_origin() {
    assert_refused("base_url", Value::Null, "missing");
    for (url, needle) in [
        ("https://api.example.com/", "not an origin"),
        ("https://api.example.com/v1", "not an origin"),
        ("https://api.example.com?", "not an origin"),
        ("https://api.example.com#f", "not an origin"),
        ("https://u:p@api.example.com", "user information"),
        ("http://api.example.com", "plain http"),
        ("ftp://api.example.com", "scheme"),
        ("api.example.com", "not a URL"),
    ] {
        assert_refused("base_url", json!(url), needle);
    }
    // A refusal reaches the log: a credential in the value is never echoed.
    for url in [
        "https://u:hunter2@api.example.com",
        "https://api.example.com/?key=hunter2",
        "u:hunter2@api.example.com",
        "key-hunter2@https://api.example.com",
        "u:hunter2@x://api.example.com",
    ] {
        let detail = refused_with("base_url", json!(url));
        assert!(!detail.contains("hunter2"), "{detail}");
    }
    for ok in [
        "http://localhost:8080",
        "http://127.0.0.1:9",
        "http://[::1]:9",
        "https://a.b:8443",
    ] {
        let mut p = base();
        p["base_url"] = json!(ok);
        load_value(&json!({"profiles": {"p": p}}), Path::new(".")).unwrap();
    }
}

#[test]
fn routes_are_checked() {
    assert_refused("allow", json!(["GET"]), "not exactly");
    assert_refused("allow", json!(["GET items"]), "absolute");
    assert_refused("allow", json!(["HEAD /x"]), "cannot be granted");
    assert_refused("allow", json!(["GET /a?b=1"]), "`?`");
    assert_refused("allow", json!(["GET /a", "get /a"]), "duplicate");
    assert_refused("catalog", json!(["GET /a/"]), "catalog");
    // An empty allow list loads and reaches nothing.
    let mut p = base();
    p["allow"] = json!([]);
    let profiles = load_value(&json!({"profiles": {"p": p}}), Path::new(".")).unwrap();
    assert!(profiles[0].allow.is_empty());
}

#[test]
fn callers_are_checked() {
    assert_refused("allowed_callers", Value::Null, "empty");
    assert_refused("allowed_callers", json!([]), "empty");
    assert_refused("allowed_callers", json!(["a", " "]), "empty entry");
    assert_refused("allowed_callers", json!(["a", " a"]), "twice");
    let mut p = base();
    p["allowed_callers"] = json!(["*"]);
    let profiles = load_value(&json!({"profiles": {"p": p}}), Path::new(".")).unwrap();
    assert!(profiles[0].admits("anyone") && !profiles[0].admits(""));
}

#[test]
fn scopes_are_checked() {
    assert_refused("scopes", json!([""]), "empty");
    assert_refused("scopes", json!(["a b"]), "whitespace");
    assert_refused("scopes", json!(["code:run"]), "forbidden");
    assert_refused("scopes", json!(["*"]), "forbidden");
}

#[test]
fn tokens_are_checked() {
    assert_refused("token", json!({"type": "static"}), "needs `env`");
    assert_refused(
        "token",
        json!({"env": "UNSET_VAR"}),
        "UNSET_VAR is unset or empty",
    );
    assert_refused("token", json!({"env": "EMPTY"}), "unset or empty");
    assert_refused("token", json!({"env": "SPACEY"}), "0x21-0x7e");
    assert_refused(
        "token",
        json!({"type": "jwt", "audience": "a"}),
        "secret_env",
    );
    assert_refused(
        "token",
        json!({"type": "jwt", "secret_env": "EMPTY", "audience": "a"}),
        "unset or empty",
    );
    assert_refused(
        "token",
        json!({"type": "jwt", "secret_env": "SHORT", "audience": "a"}),
        "under 32 bytes",
    );
    assert_refused(
        "token",
        json!({"type": "jwt", "secret_env": "JWT_SECRET", "audience": " "}),
        "audience",
    );
    assert_refused(
        "token",
        json!({"type": "magic", "env": "X"}),
        "unknown type",
    );
    assert_refused(
        "token",
        json!({"type": "jwt", "secret_env": "JWT_SECRET", "audience": "a", "ttl_sec": -1}),
        "ttl_sec",
    );
    // Secrets never appear in messages.
    let detail = refused_with("token", json!({"type": "jwt", "secret_env": "JWT_SECRET"}));
    assert!(!detail.contains(SECRET));
    let mut p = base();
    p["token"] = json!({"env": "STATIC_TOK"});
    let profiles = load_value(&json!({"profiles": {"p": p}}), Path::new(".")).unwrap();
    assert!(matches!(&profiles[0].token, TokenSpec::Static { bearer } if bearer == "tok-123"));
    let mut p = base();
    p.as_object_mut().unwrap().remove("token");
    let profiles = load_value(&json!({"profiles": {"p": p}}), Path::new(".")).unwrap();
    assert!(matches!(profiles[0].token, TokenSpec::None));
}

#[test]
fn budgets_and_caps_are_checked() {
    assert_refused("max_calls", json!(100_001), "max_calls");
    assert_refused("max_calls", json!(-1), "max_calls");
    assert_refused(
        "route_max_calls",
        json!({"GET /nope": 1}),
        "not an allow entry",
    );
    assert_refused("route_max_calls", json!({"GET /items": 0}), "out of range");
    assert_refused(
        "route_max_calls",
        json!({"GET /items": 100_001}),
        "out of range",
    );
    let mut p = base();
    p["allow"] = json!(["POST /v2/ep1", "POST /v2/*"]);
    p["route_max_calls"] = json!({"post /v2/ep1": 2});
    let err = load_value(&json!({"profiles": {"p": p}}), Path::new(".")).unwrap_err();
    assert!(err.to_string().contains("widened"), "{err}");
    let mut p = base();
    p["max_calls"] = json!(5);
    p["route_max_calls"] = json!({"post /v2/ep1": 2});
    let profiles = load_value(&json!({"profiles": {"p": p}}), Path::new(".")).unwrap();
    assert_eq!(profiles[0].max_calls, 5);
    assert_eq!(profiles[0].route_caps, vec![(2, 2)]);
}

#[test]
fn health_check_advice_and_batches_are_checked() {
    assert_refused("health_check", json!("POST /health"), "GET");
    assert_refused("health_check", json!("GET /h/*"), "concrete");
    assert_refused("health_check", json!("GET h"), "health_check");
    assert_refused("advice", json!("loud"), "advice");
    assert_refused("advice_retention", json!("forever"), "advice_retention");
    assert_refused(
        "batch_of",
        json!({"POST /items": ["GET /items/*"]}),
        "must be a GET",
    );
    assert_refused(
        "batch_of",
        json!({"GET /items": ["POST /items/*"]}),
        "must be a GET",
    );
    assert_refused(
        "batch_of",
        json!({"GET /items": ["GET /items/x"]}),
        "no `*`",
    );
    assert_refused("batch_of", json!({"GET /i/*": ["GET /i/*"]}), "itself");
    assert_refused(
        "batch_of",
        json!({"GET /a": ["GET /i/*"], "GET /b": ["GET /i/*"]}),
        "claimed by two",
    );
    assert_refused("global", json!("no-dash"), "identifier");
}

#[test]
fn preamble_file_stays_in_the_directory() {
    let dir = tempfile::tempdir().unwrap();
    let inner = dir.path().join("g");
    std::fs::create_dir(&inner).unwrap();
    std::fs::write(inner.join("sdk.js"), "const sdk = 1;").unwrap();
    std::fs::write(dir.path().join("outside.js"), "x").unwrap();
    std::os::unix::fs::symlink(dir.path().join("outside.js"), inner.join("link.js")).unwrap();
    let with = |file: &str| {
        let mut p = base();
        p["preamble_file"] = json!(file);
        load_value(&json!({"profiles": {"p": p}}), &inner)
    };
    assert_eq!(with("sdk.js").unwrap()[0].preamble, "const sdk = 1;");
    for bad in ["../outside.js", "/etc/passwd", "link.js", "missing.js"] {
        assert!(with(bad).is_err(), "{bad}");
    }
    // Nothing past the cap is read, and a FIFO is refused without waiting for a writer.
    let big = vec![b'/'; usize::try_from(profile::MAX_PREAMBLE_BYTES).unwrap() + 1];
    std::fs::write(inner.join("big.js"), big).unwrap();
    let err = with("big.js").unwrap_err().to_string();
    assert!(err.contains("larger than"), "{err}");
    mkfifo(&inner.join("fifo.js"));
    let err = with("fifo.js").unwrap_err().to_string();
    assert!(err.contains("not a regular file"), "{err}");
    let mut p = base();
    p["preamble_file"] = json!("sdk.js");
    p["preamble"] = json!("x");
    let err = load_value(&json!({"profiles": {"p": p}}), &inner).unwrap_err();
    assert!(err.to_string().contains("both"), "{err}");
}

fn mkfifo(path: &Path) {
    let made = std::process::Command::new("mkfifo").arg(path).status();
    assert!(made.is_ok_and(|s| s.success()), "mkfifo {}", path.display());
}

#[test]
fn a_grants_file_is_read_only_up_to_its_cap_and_never_from_a_fifo() {
    let dir = tempfile::tempdir().unwrap();
    let big = dir.path().join("big.json");
    let file = std::fs::File::create(&big).unwrap();
    file.set_len(MAX_FILE_BYTES + 1).unwrap();
    assert!(matches!(
        load(&big, &env()),
        Err(GrantsError::TooLarge { .. })
    ));
    mkfifo(&dir.path().join("fifo.json"));
    assert!(matches!(
        load(&dir.path().join("fifo.json"), &env()),
        Err(GrantsError::Read { .. })
    ));
}
