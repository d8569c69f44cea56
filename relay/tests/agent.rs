//! `plimsoll-relay agent` as plimsolld starts it, through the real binary: its command line,
//! its ready frame (as root it must have moved to uid+1 of the guest), the end of stdin, and
//! a request it cannot read. The calls themselves are exercised in a session container by the
//! docker suites (`tests/tests/docker/session_*`).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::Write;
use std::process::{Command, Output, Stdio};

use serde_json::Value;

/// A guest uid no test machine gives anyone.
const GUEST: u32 = 64_000;

fn agent(args: &[&str], stdin: &[u8]) -> Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_plimsoll-relay"))
        .arg("agent")
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(stdin).unwrap();
    child.wait_with_output().unwrap()
}

fn ready(out: &Output) -> Value {
    let text = String::from_utf8(out.stdout.clone()).unwrap();
    let first = text.lines().next().expect("a ready frame");
    serde_json::from_str(first).unwrap()
}

#[test]
fn a_bad_command_line_is_refused_before_anything() {
    for args in [&[][..], &["0"], &["65533"], &["x"], &["1", "2"]] {
        let out = agent(args, b"");
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        assert!(out.stdout.is_empty(), "{args:?}");
    }
}

#[test]
fn it_answers_ready_as_its_keeper_uid_and_ends_with_stdin() {
    let out = agent(&[&GUEST.to_string()], b"");
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let ready = ready(&out);
    assert_eq!(ready["op"], "ready");
    let me = nix::unistd::Uid::current().as_raw();
    // As root it moved to uid+1 of the guest; otherwise it kept its uid.
    let keeper = if me == 0 { GUEST + 1 } else { me };
    assert_eq!(ready["uid"].as_u64(), Some(u64::from(keeper)), "{ready}");
    let id = ready["id"].as_str().unwrap();
    let hex = id.rsplit(':').next().unwrap();
    assert!(hex.ends_with("006167656e74003634303030"), "{id}");
}

#[test]
fn a_request_it_cannot_read_ends_it_with_3() {
    for line in [
        &b"not json\n"[..],
        b"{\"op\":\"other\"}\n",
        b"{\"op\":\"hold\",\"mode\":\"x\",\"ids\":[]}\n",
    ] {
        let out = agent(&[&GUEST.to_string()], line);
        assert_eq!(out.status.code(), Some(3), "{line:?}: {out:?}");
        assert_eq!(String::from_utf8_lossy(&out.stdout).lines().count(), 1);
    }
}

#[test]
fn a_hold_of_nothing_answers() {
    let out = agent(
        &[&GUEST.to_string()],
        b"{\"op\":\"hold\",\"mode\":\"stop\",\"ids\":[\"1:2:00\"]}\n{\"op\":\"hold\",\"mode\":\"cont\",\"ids\":[]}\n",
    );
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let lines: Vec<&str> = std::str::from_utf8(&out.stdout).unwrap().lines().collect();
    assert_eq!(lines[1], r#"{"op":"hold","ok":true}"#);
    assert_eq!(lines[2], r#"{"op":"hold","ok":true,"held":true}"#);
}
