//! Authentication and scope (wire.md §2, config.md §3).

use std::time::{Duration, Instant};

use plimsoll_tests::connect::{
    self, NOT_DISPATCHED, Reason, SERVICE_PREFIX, assert_bound, assert_disabled, assert_refused,
};
use plimsoll_tests::http1::{Connection, Request};
use plimsoll_tests::{ClientsFile, Daemon, finish, fresh_token};
use serde_json::json;

#[test]
fn missing_token_is_unauthenticated_and_not_dispatched() {
    let d = Daemon::with_token(&fresh_token());
    for procedure in ["Describe", "Run"] {
        let req = connect::call(procedure, &connect::javascript("1"));
        let err = assert_refused(
            &req.send(d.addr),
            &req,
            "unauthenticated",
            Reason::Permission,
        );
        assert_eq!(err.message, "missing bearer token", "{procedure}");
    }
}

#[test]
fn unknown_token_is_unauthenticated_and_not_dispatched() {
    let d = Daemon::with_token(&fresh_token());
    let req = connect::call_as(&fresh_token(), "Run", &connect::javascript("1"));
    let err = assert_refused(
        &req.send(d.addr),
        &req,
        "unauthenticated",
        Reason::Permission,
    );
    assert_eq!(err.message, "invalid or expired token");
}

#[test]
fn malformed_authorization_is_unauthenticated() {
    let token = fresh_token();
    let d = Daemon::with_token(&token);
    for value in [
        format!("Basic {token}"),
        "Bearer".to_string(),
        format!("Bearer {token} extra"),
        format!("Bearer{token}"),
        format!("Token {token}"),
    ] {
        let req = connect::call("Describe", &json!({})).header("Authorization", &value);
        let resp = req.send(d.addr);
        assert_refused(&resp, &req, "unauthenticated", Reason::Permission);
    }
}

#[test]
fn bearer_scheme_is_matched_ignoring_case() {
    let token = fresh_token();
    let d = Daemon::with_token(&token);
    for scheme in ["Bearer", "bearer", "BEARER"] {
        let req = connect::call("Describe", &json!({}))
            .header("Authorization", &format!("{scheme} {token}"));
        let resp = req.send(d.addr);
        assert_eq!(resp.status, 200, "{scheme}: {resp}");
        assert_bound(&resp, &req);
    }
}

#[test]
fn shared_token_reaches_every_procedure() {
    let token = fresh_token();
    let d = Daemon::with_token(&token);
    let resp = connect::call_as(&token, "Describe", &json!({})).send(d.addr);
    assert_eq!(resp.status, 200, "{resp}");
    assert_eq!(resp.json()["protocol"], 4, "{resp}");
    let req = connect::call_as(&token, "Run", &connect::javascript("1"));
    assert_disabled(&req.send(d.addr), &req);
}

#[test]
fn clients_file_token_authenticates_by_its_sha256() {
    let token = fresh_token();
    let other = fresh_token();
    let file = ClientsFile::new(&[
        ("python", &token, &["code:run"]),
        ("other", &other, &["code:run"]),
    ]);
    let d = Daemon::start(&[("PLIMSOLL_CLIENTS_FILE", &file.path_str())]);
    for t in [&token, &other] {
        let resp = connect::call_as(t, "Describe", &json!({})).send(d.addr);
        assert_eq!(resp.status, 200, "{resp}");
    }
    let req = connect::call_as(&fresh_token(), "Describe", &json!({}));
    let err = assert_refused(
        &req.send(d.addr),
        &req,
        "unauthenticated",
        Reason::Permission,
    );
    assert_eq!(err.message, "invalid or expired token");
}

#[test]
fn clients_file_wins_over_the_shared_token() {
    let listed = fresh_token();
    let shared = fresh_token();
    let file = ClientsFile::new(&[("python", &listed, &["code:run"])]);
    let d = Daemon::start(&[
        ("PLIMSOLL_CLIENTS_FILE", &file.path_str()),
        ("PLIMSOLL_TOKEN", &shared),
    ]);
    assert_eq!(
        connect::call_as(&listed, "Describe", &json!({}))
            .send(d.addr)
            .status,
        200
    );
    let req = connect::call_as(&shared, "Describe", &json!({}));
    assert_refused(
        &req.send(d.addr),
        &req,
        "unauthenticated",
        Reason::Permission,
    );
}

#[test]
fn caller_without_the_scope_is_permission_denied() {
    let token = fresh_token();
    let file = ClientsFile::new(&[("reader", &token, &["metrics:read"])]);
    let d = Daemon::start(&[("PLIMSOLL_CLIENTS_FILE", &file.path_str())]);
    for procedure in ["Describe", "Run", "OpenSession"] {
        let req = connect::call_as(&token, procedure, &connect::javascript("1"));
        let err = assert_refused(
            &req.send(d.addr),
            &req,
            "permission_denied",
            Reason::Permission,
        );
        assert_eq!(
            err.message, "token lacks required scope \"code:run\"",
            "{procedure}"
        );
    }
}

#[test]
fn wildcard_scope_matches_code_run() {
    let token = fresh_token();
    let file = ClientsFile::new(&[("admin", &token, &["*"])]);
    let d = Daemon::start(&[("PLIMSOLL_CLIENTS_FILE", &file.path_str())]);
    assert_eq!(
        connect::call_as(&token, "Describe", &json!({}))
            .send(d.addr)
            .status,
        200
    );
}

#[test]
fn unknown_procedure_under_the_service_is_forbidden_with_auth_on() {
    let token = fresh_token();
    let d = Daemon::with_token(&token);
    let req = connect::call_as(&token, "Nonexistent", &json!({}));
    let resp = req.send(d.addr);
    assert_eq!(resp.status, 403, "fail closed, not 404:\n{resp}");
    assert_bound(&resp, &req);
    let resp = connect::call("Nonexistent", &json!({})).send(d.addr);
    assert!(
        resp.status == 401 || resp.status == 403,
        "without a token it is refused, never 404:\n{resp}"
    );
}

#[test]
fn unknown_path_outside_the_service_is_not_found_with_auth_on() {
    let token = fresh_token();
    let d = Daemon::with_token(&token);
    for path in ["/", "/v1/run", "/plimsoll.v1.OtherService/Run"] {
        let resp = Request::post(path).send(d.addr);
        assert_eq!(resp.status, 404, "{path}: {resp}");
        assert_eq!(
            resp.all(NOT_DISPATCHED),
            vec!["unsupported"],
            "{path}: {resp}"
        );
    }
}

#[test]
fn unknown_procedure_is_not_found_in_open_mode() {
    let d = Daemon::open();
    let resp = connect::call("Nonexistent", &json!({})).send(d.addr);
    assert_eq!(resp.status, 404, "{resp}");
    assert_eq!(resp.all(NOT_DISPATCHED), vec!["unsupported"], "{resp}");
}

#[test]
fn authentication_is_checked_before_the_body_is_read() {
    let d = Daemon::with_token(&fresh_token());
    let id = connect::request_id();
    let head = format!(
        "POST {SERVICE_PREFIX}Run HTTP/1.1\r\nHost: {}\r\nContent-Type: application/json\r\n\
         Connect-Protocol-Version: 1\r\nPlimsoll-Request-Id: {id}\r\nContent-Length: 100\r\n\r\n{{}}",
        d.addr
    );
    let mut conn = Connection::open(d.addr);
    let started = Instant::now();
    conn.send(head.as_bytes()).unwrap();
    conn.set_read_timeout(Duration::from_secs(5));
    let resp = conn
        .read_response(false)
        .expect("refused without waiting for the 98 bytes never sent");
    assert!(
        started.elapsed() < Duration::from_secs(4),
        "took {:?}",
        started.elapsed()
    );
    assert_eq!(resp.status, 401, "{resp}");
    assert!(
        resp.closes(),
        "an unread body means Connection: close:\n{resp}"
    );
    assert_eq!(resp.all(connect::REQUEST_ID), vec![id.as_str()], "{resp}");
    assert!(
        conn.closed_within(Duration::from_secs(3)),
        "the server closes the connection"
    );
}

#[test]
fn tokens_never_reach_the_log() {
    let token = fresh_token();
    let wrong = fresh_token();
    let mut d = Daemon::with_token(&token);
    assert_eq!(
        connect::call_as(&token, "Describe", &json!({}))
            .send(d.addr)
            .status,
        200
    );
    connect::call_as(&token, "Run", &connect::javascript("console.log(1)")).send(d.addr);
    connect::call_as(&token, "Run", &connect::javascript_with_floor("1", "vm")).send(d.addr);
    for _ in 0..3 {
        connect::call_as(&wrong, "Run", &connect::javascript("1")).send(d.addr);
    }
    assert!(d.sigterm().success());
    let logs = d.logs();
    assert!(!logs.is_empty());
    for line in &logs {
        assert!(!line.contains(&token), "the token leaked: {line}");
        assert!(!line.contains(&wrong), "a presented token leaked: {line}");
    }
}

#[test]
fn clients_tool_creates_a_token_the_daemon_accepts() {
    let file = ClientsFile::empty();
    let path = file.path_str();
    let out = finish(
        "plimsoll-clients",
        &[
            "create",
            "--file",
            &path,
            "--id",
            "python",
            "--token-stdout",
        ],
        &[],
        b"",
    );
    assert_eq!(out.code(), 0, "{out:?}");
    let token = out.stdout.trim().to_string();
    assert_eq!(token.len(), 64, "32 random bytes as hex: {out:?}");
    assert!(
        !out.stderr.contains(&token),
        "only stdout carries the token"
    );
    let d = Daemon::start(&[("PLIMSOLL_CLIENTS_FILE", &path)]);
    assert_eq!(
        connect::call_as(&token, "Describe", &json!({}))
            .send(d.addr)
            .status,
        200
    );
    let req = connect::call_as(&token, "Run", &connect::javascript("1"));
    assert_disabled(&req.send(d.addr), &req);
}
