//! The official Rust client's sessions and the `plimsoll session` commands against a real
//! docker daemon with sessions on (wire.md §7, records.md §7-§8).
//!
//! The runtime comes from `PLIMSOLL_TEST_DOCKER_RUNTIME` (`runc`, the default, or `runsc`).
//! Docker and the images are required: when they are missing every test FAILS, unless the
//! developer sets `PLIMSOLL_TEST_DOCKER_SKIP=1`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::os::unix::fs::PermissionsExt as _;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use plimsoll::client::{Client, ClientError, RunOptions, SessionOptions, verify_session};
use plimsoll::refusal::Reason;
use plimsoll::wire::{ProjectOutcome, SessionEnd, run_response};
use plimsoll_tests::docker::{docker_ready, runsc, tier};
use plimsoll_tests::{Daemon, binary, fresh_token};

/// A docker daemon with sessions on and a shared token.
fn daemon(token: &str) -> Daemon {
    let mut env = vec![
        ("SANDBOX_PROVIDER", "docker"),
        ("PLIMSOLL_TOKEN", token),
        ("PLIMSOLL_METRICS_ADDR", "off"),
        ("SANDBOX_RATE_PER_MIN", "0"),
        ("SANDBOX_MAX_SESSIONS", "4"),
    ];
    if runsc() {
        env.push(("SANDBOX_DOCKER_RUNTIME", "runsc"));
    }
    Daemon::start(&env)
}

fn client(d: &Daemon, token: &str) -> Client {
    Client::builder(format!("http://{}", d.addr))
        .token(token)
        .build()
        .expect("client")
}

fn stdout_of(answer: &plimsoll::client::SessionAnswer) -> String {
    match &answer.run().result {
        Some(run_response::Result::Javascript(js)) => String::from_utf8_lossy(&js.stdout).into(),
        other => panic!("not a snippet result: {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_rust_client_chains_a_docker_session_and_its_close_matches() {
    if !docker_ready() {
        return;
    }
    let token = fresh_token();
    let mut d = daemon(&token);
    let c = client(&d, &token);
    let s = c
        .open_session(
            &SessionOptions::new()
                .minimum_isolation("container")
                .owner("end-user-1"),
        )
        .await
        .expect("open");
    let opened = s.state().await;
    assert_eq!(opened.provider, "docker");
    assert_eq!(opened.isolation, tier());

    let opts = RunOptions::new().timeout(Duration::from_secs(20));
    let first = s
        .run_javascript(
            "require('fs').writeFileSync('/work/n', '41'); console.log('wrote')",
            &opts,
        )
        .await
        .expect("first call");
    assert_eq!(stdout_of(&first), "wrote\n");
    let project = s
        .run_project(
            &[(
                "add.py".to_owned(),
                "print(int(open('n').read()) + 1)\n".to_owned(),
            )],
            &["python3 add.py".to_owned()],
            &[],
            &opts,
        )
        .await
        .expect("project call");
    let result = match &project.run().result {
        Some(run_response::Result::Project(p)) => p.clone(),
        other => panic!("not a project result: {other:?}"),
    };
    assert_eq!(result.outcome, ProjectOutcome::PROJECT_OUTCOME_COMPLETED);
    assert_eq!(result.steps[0].stdout, b"42\n");
    let third = s
        .run_javascript(
            "console.log(require('fs').readdirSync('/work').sort().join(','))",
            &opts,
        )
        .await
        .expect("third call");
    assert_eq!(stdout_of(&third), "add.py,n\n");

    // Cells: one interpreter per language, each keeping its state from cell to cell; a
    // cell's files are written under /work before it runs.
    let cell = |answer: &plimsoll::client::SessionAnswer| match &answer.run().result {
        Some(run_response::Result::Cell(c)) => (
            c.exit_code,
            String::from_utf8_lossy(&c.stdout).into_owned(),
            c.interpreter_started,
        ),
        other => panic!("not a cell result: {other:?}"),
    };
    let js1 = s
        .run_cell("javascript", "let x = 41", &[], &opts)
        .await
        .expect("javascript cell 1");
    assert!(cell(&js1).2, "the first cell starts the interpreter");
    let js2 = s
        .run_cell("javascript", "x + 1", &[], &opts)
        .await
        .expect("javascript cell 2");
    assert_eq!(cell(&js2), (0, "42\n".to_owned(), false));
    let py1 = s
        .run_cell(
            "python",
            "y = int(open('n').read())",
            &[("one.txt".to_owned(), "1".to_owned())],
            &opts,
        )
        .await
        .expect("python cell 1");
    assert_eq!(cell(&py1).0, 0);
    let py2 = s
        .run_cell("python", "y + int(open('one.txt').read())", &[], &opts)
        .await
        .expect("python cell 2");
    assert_eq!(cell(&py2), (0, "42\n".to_owned(), false));
    let raised = s
        .run_cell("python", "raise ValueError('no')", &[], &opts)
        .await
        .expect("a raising cell is an answer");
    assert_eq!(cell(&raised).0, 1);
    let granted = s
        .run_cell("python", "1", &[], &opts.clone().grant_profile("inv"))
        .await
        .expect_err("a cell carries no grant");
    assert_eq!(
        granted.not_dispatched_reason().map(|m| m.to_string()),
        Some("request".to_owned())
    );

    // The client checked every record as it came; the saved answers check again offline.
    let state = s.state().await;
    assert_eq!(state.calls, 8);
    let answers = [first, project, third, js1, js2, py1, py2, raised];
    let (calls, last) = verify_session(&state, &answers).expect("chain");
    assert_eq!(
        (calls, last.as_str()),
        (8, state.last_record_sha256.as_str())
    );

    let summary = s.close().await.expect("close checks the totals");
    assert_eq!(summary.calls, 8);
    assert_eq!(
        summary.ended.as_known(),
        Some(SessionEnd::SESSION_END_CLOSED)
    );
    // A closed session sends nothing more.
    let after = s
        .run_javascript("1", &opts)
        .await
        .expect_err("closed session");
    assert_eq!(
        after.not_dispatched_reason().map(|m| m.to_string()),
        Some("request".to_owned())
    );
    assert!(d.sigterm().success());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unknown_session_is_refused_as_not_found_by_the_client() {
    if !docker_ready() {
        return;
    }
    let token = fresh_token();
    let mut d = daemon(&token);
    let c = client(&d, &token);
    let s = c.open_session(&SessionOptions::new()).await.expect("open");
    let mut state = s.state().await;
    state.session_id = "00112233445566778899aabbccddeeff".to_owned();
    let ghost = c.resume_session(state);
    let err = ghost
        .run_javascript("1", &RunOptions::new())
        .await
        .expect_err("unknown id");
    assert!(matches!(err, ClientError::SessionEnded(_)), "{err:?}");
    assert_eq!(
        err.not_dispatched_reason().map(|m| m.to_string()),
        Some(Reason::Request.as_str().to_owned())
    );
    s.close().await.expect("close the real one");
    assert!(d.sigterm().success());
}

fn cli(d: &Daemon, token: &str, args: &[&str]) -> (i32, String) {
    let out = Command::new(binary("plimsoll"))
        .args(args)
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("PLIMSOLL_URL", format!("http://{}", d.addr))
        .env("PLIMSOLL_TOKEN", token)
        .output()
        .expect("run plimsoll");
    (
        out.status.code().unwrap_or(-1),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

#[test]
fn the_cli_session_commands_exit_with_their_documented_codes() {
    if !docker_ready() {
        return;
    }
    let token = fresh_token();
    let mut d = daemon(&token);
    let dir = tempfile::tempdir().expect("tempdir");
    let state = dir.path().join("s.json");
    let state_arg = state.to_str().expect("utf-8 path");
    let ok = |r: (i32, String), code: i32| {
        assert_eq!(r.0, code, "{}", r.1);
        r.1
    };
    let opened = ok(
        cli(&d, &token, &["session", "open", "--state", state_arg]),
        0,
    );
    assert!(
        opened.contains(&format!("isolation: {}", tier())),
        "{opened}"
    );
    assert_eq!(
        std::fs::metadata(&state)
            .expect("state file")
            .permissions()
            .mode()
            & 0o777,
        0o600,
        "the state file names the session: its owner's only"
    );
    let ran = ok(
        cli(
            &d,
            &token,
            &[
                "session",
                "run",
                "--state",
                state_arg,
                "-e",
                "console.log(6*7)",
            ],
        ),
        0,
    );
    assert!(ran.contains("42"), "{ran}");
    ok(
        cli(
            &d,
            &token,
            &[
                "session",
                "run",
                "--state",
                state_arg,
                "-e",
                "process.exit(3)",
            ],
        ),
        1,
    );
    let cell = ok(
        cli(
            &d,
            &token,
            &[
                "session",
                "cell",
                "--state",
                state_arg,
                "--language",
                "python",
                "-e",
                "6 * 7",
            ],
        ),
        0,
    );
    assert!(cell.contains("42"), "{cell}");
    // A cell carries no grant: the flag is refused before anything is sent, not dropped.
    let granted = ok(
        cli(
            &d,
            &token,
            &[
                "session", "cell", "--state", state_arg, "--grant", "inv", "-e", "1",
            ],
        ),
        3,
    );
    assert!(granted.contains("cannot be granted"), "{granted}");
    let verified = ok(cli(&d, &token, &["verify", state_arg]), 0);
    assert!(verified.contains("session of 3 calls"), "{verified}");
    let closed = ok(
        cli(&d, &token, &["session", "close", "--state", state_arg]),
        0,
    );
    assert!(closed.contains("closed: 3 calls"), "{closed}");
    // After the close this client sends nothing: refused locally, nothing ran.
    ok(
        cli(
            &d,
            &token,
            &["session", "run", "--state", state_arg, "-e", "1"],
        ),
        3,
    );
    // A state file naming a session the daemon does not know: refused, nothing ran.
    let ghost = dir.path().join("ghost.json");
    let mut value: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&state).expect("state")).expect("json");
    value["state"]["session_id"] = "00112233445566778899aabbccddeeff".into();
    value["state"]["closed"] = false.into();
    std::fs::write(&ghost, value.to_string()).expect("write");
    let ghost_arg = ghost.to_str().expect("utf-8 path");
    ok(
        cli(
            &d,
            &token,
            &["session", "run", "--state", ghost_arg, "-e", "1"],
        ),
        3,
    );
    assert!(Path::new(&state).exists());
    assert!(d.sigterm().success());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_the_lifetime_cut_short_is_checked_as_unanswered_and_the_close_still_matches() {
    if !docker_ready() {
        return;
    }
    let token = fresh_token();
    let mut d = daemon(&token);
    let c = client(&d, &token);
    let s = c
        .open_session(&SessionOptions::new().lifetime(Duration::from_secs(4)))
        .await
        .expect("open");
    let err = s
        .run_javascript(
            "for (;;) {}",
            &RunOptions::new().timeout(Duration::from_secs(25)),
        )
        .await
        .expect_err("the session ended under the call");
    assert!(matches!(err, ClientError::SessionEnded(_)), "{err:?}");
    assert_eq!(err.not_dispatched_reason(), None, "it may have run");
    assert!(
        err.failure().unanswered_checked,
        "the client checked the unanswered call's record: {err:?}"
    );
    assert_eq!(s.state().await.calls, 1);
    // The checked call can be kept and checked again offline, request and record.
    let saved = err.unanswered_call().expect("the call to keep").clone();
    assert_eq!(
        verify_session(&s.state().await, &[saved])
            .expect("checks offline")
            .0,
        1
    );
    let summary = s
        .close()
        .await
        .expect("the totals match the client's chain");
    assert_eq!(summary.calls, 1);
    assert_eq!(
        summary.ended.as_known(),
        Some(SessionEnd::SESSION_END_EXPIRED)
    );
    assert!(d.sigterm().success());
}

/// A state file keeps an unanswered call beside the answered ones, so `plimsoll verify` and
/// `plimsoll attest` check the whole chain (before, the file kept only answered calls while
/// the state counted both, and every later check of the file failed).
#[test]
fn the_cli_keeps_an_unanswered_call_and_its_state_file_still_verifies() {
    if !docker_ready() {
        return;
    }
    let token = fresh_token();
    let mut env = vec![
        ("SANDBOX_PROVIDER", "docker"),
        ("PLIMSOLL_TOKEN", token.as_str()),
        ("PLIMSOLL_METRICS_ADDR", "off"),
        ("SANDBOX_RATE_PER_MIN", "0"),
        ("SANDBOX_MAX_SESSIONS", "2"),
        ("SANDBOX_SESSION_LIFETIME", "6s"),
    ];
    if runsc() {
        env.push(("SANDBOX_DOCKER_RUNTIME", "runsc"));
    }
    let mut d = Daemon::start(&env);
    let dir = tempfile::tempdir().expect("tempdir");
    let path = |name: &str| dir.path().join(name).to_str().expect("utf-8").to_owned();
    let state = path("s.json");
    let run = |args: &[&str], code: i32| {
        let (got, out) = cli(&d, &token, args);
        assert_eq!(got, code, "{args:?}: {out}");
        out
    };
    run(&["session", "open", "--state", &state], 0);
    // A printed answer never shows the session id (the file keeps it, for the daemon).
    let shown = run(
        &[
            "--json",
            "session",
            "run",
            "--state",
            &state,
            "-e",
            "console.log(1)",
        ],
        0,
    );
    let saved: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&state).expect("state")).expect("json");
    let id = saved["state"]["session_id"].as_str().expect("the id");
    assert!(
        shown.contains("\"record\"") && !shown.contains(id),
        "{shown}"
    );
    // The lifetime ends the session under this call: unanswered, may have run (exit 4).
    let cut = run(
        &[
            "session",
            "run",
            "--state",
            &state,
            "--timeout",
            "25000",
            "-e",
            "for (;;) {}",
        ],
        4,
    );
    assert!(cut.contains("may have run"), "{cut}");
    let verified = run(&["verify", &state], 0);
    assert!(verified.contains("session of 2 calls"), "{verified}");
    run(
        &[
            "attest",
            "keygen",
            "--private",
            &path("k"),
            "--public",
            &path("k.pub"),
        ],
        0,
    );
    let bundle = run(&["attest", "sign", "--key", &path("k"), &state], 0);
    std::fs::write(path("bundle"), bundle).expect("bundle");
    let checked = run(
        &[
            "attest",
            "verify",
            "--public",
            &path("k.pub"),
            &path("bundle"),
        ],
        0,
    );
    assert!(checked.contains("bundle of 2 calls"), "{checked}");
    assert!(d.sigterm().success());
}
