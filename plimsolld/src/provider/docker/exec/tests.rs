//! The exec helper against a real session-shaped container ([`super::testbed`]).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use tokio::io::AsyncWriteExt;
use tokio::time::Instant;

use super::testbed::{GUEST_USER, Testbed};
use super::*;

fn sh(script: &str) -> Vec<String> {
    env_argv(
        &["ONLY=this".to_owned()],
        &["/bin/sh".to_owned(), "-c".to_owned(), script.to_owned()],
    )
}

fn spec<'a>(argv: &'a [String], stdin: &'a [u8], cap: usize, secs: u64) -> ExecSpec<'a> {
    ExecSpec {
        argv,
        user: GUEST_USER,
        workdir: Some("/work"),
        stdin,
        stdout_cap: cap,
        stderr_cap: cap,
        deadline: Instant::now() + Duration::from_secs(secs),
    }
}

#[test]
fn env_argv_clears_the_environment_and_fixes_the_path() {
    let argv = env_argv(&["A=1".to_owned()], &["node".to_owned(), "-".to_owned()]);
    assert_eq!(
        argv,
        [
            "/usr/bin/env",
            "-i",
            &format!("PATH={GUEST_PATH}"),
            "A=1",
            "node",
            "-"
        ]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_answers_exit_code_capped_streams_identity_and_only_the_given_env() {
    let Some(bed) = Testbed::start().await else {
        return;
    };
    let argv = sh("cat; id -u; id -g; pwd; env | sort; echo err >&2; exit 7");
    let out = run(
        &bed.engine,
        &bed.id,
        &spec(&argv, b"from stdin\n", 4096, 30),
    )
    .await
    .unwrap();
    assert_eq!(out.exit_code, Some(7), "{out:?}");
    let stdout = String::from_utf8(out.stdout.clone()).unwrap();
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(
        lines[..4],
        ["from stdin", "61000", "61000", "/work"],
        "{stdout}"
    );
    let env: Vec<&str> = lines[4..]
        .iter()
        .copied()
        .filter(|l| !l.starts_with("PWD=") && !l.starts_with("SHLVL="))
        .collect();
    assert_eq!(
        env,
        ["ONLY=this", &format!("PATH={GUEST_PATH}")],
        "{stdout}"
    );
    assert_eq!(out.stderr, b"err\n");
    assert!(!out.timed_out && !out.stdout_truncated && !out.stderr_truncated);

    let argv = sh("head -c 100000 /dev/zero; head -c 5000 /dev/zero >&2");
    let out = run(&bed.engine, &bed.id, &spec(&argv, b"", 1000, 30))
        .await
        .unwrap();
    assert_eq!(out.exit_code, Some(0));
    assert_eq!((out.stdout.len(), out.stdout_truncated), (1000, true));
    assert_eq!((out.stderr.len(), out.stderr_truncated), (1000, true));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deadline_answers_timed_out_with_what_was_read() {
    let Some(bed) = Testbed::start().await else {
        return;
    };
    let argv = sh("echo before; exec sleep 60");
    let begun = Instant::now();
    let out = run(&bed.engine, &bed.id, &spec(&argv, b"", 4096, 3))
        .await
        .unwrap();
    assert!(begun.elapsed() < Duration::from_secs(10));
    assert!(out.timed_out, "{out:?}");
    assert_eq!(out.exit_code, None);
    assert_eq!(out.stdout, b"before\n");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_attached_exec_echoes_lines_and_ends_when_its_stdin_closes() {
    let Some(bed) = Testbed::start().await else {
        return;
    };
    let argv = sh("while read -r line; do echo \"got $line\"; done; echo bye; echo oops >&2");
    let mut exec = attach(&bed.engine, &bed.id, &argv, GUEST_USER, Some("/work"), 1024)
        .await
        .unwrap();
    let mut seen = Vec::new();
    for word in ["one", "two"] {
        exec.stdin
            .write_all(format!("{word}\n").as_bytes())
            .await
            .unwrap();
        exec.stdin.flush().await.unwrap();
        let want = format!("got {word}\n");
        while !String::from_utf8_lossy(&seen).ends_with(&want) {
            let piece = tokio::time::timeout(Duration::from_secs(20), exec.stdout.next())
                .await
                .unwrap()
                .unwrap();
            seen.extend(piece);
        }
    }
    exec.stdin.shutdown().await.unwrap();
    while let Some(piece) = tokio::time::timeout(Duration::from_secs(20), exec.stdout.next())
        .await
        .unwrap()
    {
        seen.extend(piece);
    }
    assert_eq!(String::from_utf8_lossy(&seen), "got one\ngot two\nbye\n");
    assert_eq!(exec.stdout.stderr(), b"oops\n");
}
