//! Configuration, startup and shutdown (config.md §1, §2, §8, §11).

use std::net::TcpListener;

use plimsoll_tests::connect;
use plimsoll_tests::{ClientsFile, Daemon, Finished, finish, fresh_token};
use serde_json::{Value, json};

/// Variables the help text must name (a sample of config.md §2.1, 2.2, 2.8).
const DOCUMENTED: [&str; 12] = [
    "PLIMSOLL_ADDR",
    "PLIMSOLL_METRICS_ADDR",
    "PLIMSOLL_TOKEN",
    "PLIMSOLL_CLIENTS_FILE",
    "PLIMSOLL_INSECURE",
    "PLIMSOLL_LOG_FORMAT",
    "PLIMSOLL_HARDENED",
    "SANDBOX_PROVIDER",
    "SANDBOX_MIN_ISOLATION",
    "SANDBOX_MAX_CONCURRENT",
    "SANDBOX_RATE_PER_MIN",
    "SANDBOX_RATE_BURST",
];

/// Starts `plimsolld` with `env` (ephemeral loopback listeners unless overridden) and
/// expects it to refuse: exit 1 without ever listening.
fn refused_start(env: &[(&str, &str)]) -> Finished {
    let out = Daemon::refuse(env);
    assert_eq!(
        out.code(),
        1,
        "startup must fail with exit 1 for {env:?}:\n{}",
        out.stderr
    );
    out
}

fn is_error(record: &Value) -> bool {
    record["level"]
        .as_str()
        .is_some_and(|l| l.eq_ignore_ascii_case("error"))
}

/// Whether an error-level JSON log line mentions `needle` (in any field).
fn has_error_line(out: &Finished, needle: &str) -> bool {
    out.log_records()
        .iter()
        .any(|r| is_error(r) && r.to_string().contains(needle))
}

/// Asserts one error-level JSON log line mentions `needle` (in any field).
fn assert_error_line(out: &Finished, needle: &str) {
    assert!(
        has_error_line(out, needle),
        "no error log line mentions {needle:?}:\n{}",
        out.stderr
    );
}

#[test]
fn help_lists_the_variables_and_exits_0() {
    for arg in ["--help", "-h", "help"] {
        let out = finish("plimsolld", &[arg], &[], b"");
        assert_eq!(out.code(), 0, "{arg}: {out:?}");
        for var in DOCUMENTED {
            assert!(
                out.stdout.contains(var),
                "{arg}: help does not name {var}:\n{}",
                out.stdout
            );
        }
    }
}

#[test]
fn any_other_argument_exits_2() {
    for arg in ["--addr=:1", "serve", "-addr"] {
        let out = finish("plimsolld", &[arg], &[], b"");
        assert_eq!(out.code(), 2, "{arg}: {out:?}");
        assert!(
            out.stderr
                .contains(&format!("unexpected argument \"{arg}\"")),
            "{arg}: {}",
            out.stderr
        );
        assert!(
            out.stderr.contains("PLIMSOLL_ADDR"),
            "the help follows on stderr:\n{}",
            out.stderr
        );
    }
}

#[test]
fn unknown_provider_is_fatal_and_named() {
    let out = refused_start(&[("SANDBOX_PROVIDER", "nope")]);
    assert_error_line(&out, "SANDBOX_PROVIDER");
}

#[test]
fn floor_none_or_unknown_is_fatal_and_named() {
    for value in ["none", "unknown", "bogus"] {
        let out = refused_start(&[("SANDBOX_MIN_ISOLATION", value)]);
        assert_error_line(&out, "SANDBOX_MIN_ISOLATION");
    }
}

#[test]
fn floor_above_the_proven_tier_refuses_to_start() {
    for floor in ["process", "vm"] {
        let out = refused_start(&[("SANDBOX_MIN_ISOLATION", floor)]);
        assert_error_line(&out, "provider does not meet the required isolation tier");
    }
}

#[test]
fn short_token_is_fatal() {
    let out = refused_start(&[("PLIMSOLL_TOKEN", "short-token")]);
    assert_error_line(&out, "PLIMSOLL_TOKEN is too short");
    let thirty_one = "a".repeat(31);
    let out = refused_start(&[("PLIMSOLL_TOKEN", &thirty_one)]);
    assert_error_line(&out, "PLIMSOLL_TOKEN");
}

#[test]
fn token_of_32_visible_characters_is_accepted() {
    let token = "!".repeat(16) + &"~".repeat(16);
    let d = Daemon::with_token(&token);
    let resp = connect::call_as(&token, "Describe", &json!({})).send(d.addr);
    assert_eq!(resp.status, 200, "{resp}");
}

#[test]
fn bad_integers_booleans_and_addresses_are_fatal_and_named() {
    let mut problems = Vec::new();
    for (var, value) in [
        ("SANDBOX_MAX_CONCURRENT", "abc"),
        ("SANDBOX_RATE_PER_MIN", "1e3"),
        ("SANDBOX_RATE_BURST", "0x10"),
        ("PLIMSOLL_HARDENED", "maybe"),
        ("PLIMSOLL_METRICS_ADDR", "9464"),
        ("PLIMSOLL_METRICS_ADDR", "127.0.0.1"),
    ] {
        match Daemon::launch(&[(var, value)]) {
            Ok(_) => problems.push(format!("{var}={value:?}: served instead of refusing")),
            Err(out) if out.code() != 1 => {
                problems.push(format!("{var}={value:?}: exit {}", out.status))
            }
            Err(out) if !has_error_line(&out, var) => {
                problems.push(format!(
                    "{var}={value:?}: no error line names it:\n{}",
                    out.stderr
                ));
            }
            Err(_) => {}
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[test]
fn max_concurrent_outside_its_range_is_fatal() {
    for value in ["0", "1025"] {
        let out = refused_start(&[("SANDBOX_MAX_CONCURRENT", value)]);
        assert_error_line(&out, &format!("max_concurrent={value} is outside [1,1024]"));
    }
}

#[test]
fn lenient_integers_are_accepted() {
    let d = Daemon::start(&[
        ("SANDBOX_MAX_CONCURRENT", " +3 "),
        ("SANDBOX_RATE_PER_MIN", "07"),
    ]);
    assert_eq!(d.listening["max_concurrent"], json!(3), "{}", d.listening);
    assert_eq!(d.listening["rate_per_min"], json!(7), "{}", d.listening);
}

#[test]
fn tls_certificate_without_key_is_fatal() {
    let out = refused_start(&[("PLIMSOLL_TLS_CERT", "/nonexistent/cert.pem")]);
    assert!(out.log_records().iter().any(is_error), "{}", out.stderr);
}

#[test]
fn empty_or_invalid_clients_file_is_fatal() {
    for text in [
        r#"{"clients":[]}"#,
        r#"{"clients":null}"#,
        r#"{}"#,
        r#"{"clients":[{"id":"a","token_sha256":"not-hex","scopes":["code:run"]}]}"#,
        r#"{"clients":[],"extra":1}"#,
        "not json",
    ] {
        let file = ClientsFile::raw(text);
        let out = refused_start(&[("PLIMSOLL_CLIENTS_FILE", &file.path_str())]);
        assert_error_line(&out, "PLIMSOLL_CLIENTS_FILE");
    }
    let out = refused_start(&[("PLIMSOLL_CLIENTS_FILE", "/nonexistent/clients.json")]);
    assert_error_line(&out, "PLIMSOLL_CLIENTS_FILE");
}

#[test]
fn occupied_address_fails_with_cannot_listen() {
    let taken = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap().to_string();
    let out = refused_start(&[("PLIMSOLL_ADDR", &addr)]);
    assert_error_line(&out, "cannot listen");
}

#[test]
fn unknown_variable_is_warned_about_not_fatal() {
    let d = Daemon::start(&[
        ("PLIMSOLL_NO_SUCH_SETTING", "1"),
        ("SANDBOX_NO_SUCH_SETTING", "1"),
    ]);
    let warned = d.log_records().iter().any(|r| {
        r["level"]
            .as_str()
            .is_some_and(|l| l.eq_ignore_ascii_case("warn") || l.eq_ignore_ascii_case("warning"))
            && r.to_string().contains("unknown variable ignored")
    });
    assert!(warned, "{}", d.logs().join("\n"));
}

#[test]
fn listening_line_reports_what_serves() {
    let d = Daemon::open();
    let line = &d.listening;
    assert_eq!(line["provider"], "disabled", "{line}");
    assert_eq!(line["isolation"], "none", "{line}");
    assert!(d.addr.ip().is_loopback() && d.addr.port() != 0, "{line}");
    for key in [
        "time",
        "level",
        "msg",
        "auth",
        "max_concurrent",
        "per_key_concurrent",
        "rate_per_min",
        "rate_burst",
    ] {
        assert!(
            line.get(key).is_some(),
            "listening line lacks {key}: {line}"
        );
    }
}

#[test]
fn log_lines_start_with_time_level_msg() {
    let d = Daemon::open();
    let raw = d
        .logs()
        .into_iter()
        .find(|l| l.contains("plimsolld listening"))
        .expect("the listening line was logged");
    let at = |k: &str| {
        raw.find(&format!("\"{k}\":"))
            .unwrap_or_else(|| panic!("no {k}: {raw}"))
    };
    assert!(raw.starts_with("{\"time\":"), "{raw}");
    assert!(at("time") < at("level") && at("level") < at("msg"), "{raw}");
}

#[test]
fn sigterm_drains_and_exits_0() {
    let mut d = Daemon::open();
    assert_eq!(
        connect::call("Describe", &json!({})).send(d.addr).status,
        200
    );
    let status = d.sigterm();
    assert_eq!(
        status.code(),
        Some(0),
        "exit after SIGTERM: {status}\n{}",
        d.logs().join("\n")
    );
    assert!(
        std::net::TcpStream::connect(d.addr).is_err(),
        "the listener is closed after exit"
    );
}

/// `PLIMSOLL_ADDR_FILE` is how a script (scripts/run-main) learns a `:0` port without
/// reading the log: the file names the bound address, which answers, while the daemon
/// serves, and it is gone once the daemon has stopped.
#[test]
fn the_addr_file_names_the_bound_address_while_serving_and_goes_at_exit() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("plimsolld.addr");
    let mut d = Daemon::start(&[("PLIMSOLL_ADDR_FILE", file.to_str().unwrap())]);
    let written = std::fs::read_to_string(&file).unwrap();
    assert_eq!(written, format!("{}\n", d.addr));
    let addr: std::net::SocketAddr = written.trim().parse().unwrap();
    assert_eq!(connect::call("Describe", &json!({})).send(addr).status, 200);
    assert_eq!(d.sigterm().code(), Some(0), "{}", d.logs().join("\n"));
    assert!(!file.exists(), "the file is removed at exit");
    assert_eq!(
        std::fs::read_dir(dir.path()).unwrap().count(),
        0,
        "nothing else is left beside it"
    );
}

#[test]
fn an_addr_file_that_cannot_be_written_fails_the_start() {
    let out = refused_start(&[("PLIMSOLL_ADDR_FILE", "/nonexistent/plimsoll/addr")]);
    assert_error_line(&out, "PLIMSOLL_ADDR_FILE /nonexistent/plimsoll/addr");
}

/// The handlers are in place by the time the listening line is logged: a supervisor
/// that stops the daemon as soon as it listens still gets a clean exit.
#[test]
fn sigterm_right_after_the_listening_line_exits_0() {
    for _ in 0..3 {
        let mut d = Daemon::with_token(&fresh_token());
        let status = d.sigterm();
        assert_eq!(status.code(), Some(0), "{status}\n{}", d.logs().join("\n"));
    }
}

/// Hardened mode judges the rate (rule 6) and the per-caller cap (rule 7) with the rest: an
/// unlimited rate, a burst over the rate or a per-caller cap that is off or not below the
/// daemon's is each named in the one refusal (config.md §10).
#[test]
fn hardened_mode_refuses_an_unlimited_rate_and_an_uncapped_caller() {
    let out = refused_start(&[
        ("PLIMSOLL_HARDENED", "1"),
        ("SANDBOX_RATE_PER_MIN", "0"),
        ("SANDBOX_PER_KEY_CONCURRENT", "0"),
    ]);
    assert_error_line(&out, "rate: SANDBOX_RATE_PER_MIN must be above 0");
    assert_error_line(&out, "per-caller concurrency: SANDBOX_PER_KEY_CONCURRENT=0");
    let out = refused_start(&[
        ("PLIMSOLL_HARDENED", "1"),
        ("SANDBOX_RATE_PER_MIN", "10"),
        ("SANDBOX_RATE_BURST", "11"),
        ("SANDBOX_MAX_CONCURRENT", "4"),
        ("SANDBOX_PER_KEY_CONCURRENT", "4"),
    ]);
    assert_error_line(
        &out,
        "rate: SANDBOX_RATE_BURST=11 is above SANDBOX_RATE_PER_MIN=10",
    );
    assert_error_line(&out, "per-caller concurrency: SANDBOX_PER_KEY_CONCURRENT=4");
}
