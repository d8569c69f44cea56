#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::os::unix::fs::PermissionsExt;

use super::*;

fn args(list: &[&str]) -> Vec<String> {
    list.iter().map(|s| (*s).to_owned()).collect()
}

/// Runs the tool; returns (exit code, stdout, stderr).
fn run_tool(list: &[&str], stdin: &str) -> (u8, String, String) {
    let mut out = Vec::new();
    let mut err = Vec::new();
    let code = run(&args(list), &mut stdin.as_bytes(), &mut out, &mut err);
    (
        code,
        String::from_utf8(out).unwrap(),
        String::from_utf8(err).unwrap(),
    )
}

struct Scratch {
    _dir: tempfile::TempDir,
    file: String,
}

fn scratch() -> Scratch {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("clients.json").to_str().unwrap().to_owned();
    Scratch { _dir: dir, file }
}

fn registry(s: &Scratch) -> ClientsFile {
    ClientsFile::load(Path::new(&s.file)).unwrap()
}

fn create(s: &Scratch, id: &str) -> String {
    let (code, out, err) = run_tool(
        &["create", "--file", &s.file, "--id", id, "--token-stdout"],
        "",
    );
    assert_eq!(code, 0, "{err}");
    out.trim_end().to_owned()
}

/// Sets (or with "0" removes) client `id`'s paid allowance with the `limit` subcommand.
fn limit(s: &Scratch, id: &str, seconds: &str) -> (u8, String, String) {
    run_tool(
        &[
            "limit",
            "--file",
            &s.file,
            "--id",
            id,
            "--paid-seconds-per-day",
            seconds,
        ],
        "",
    )
}

// === parsing ===

#[test]
fn single_and_double_dash_flags_parse_alike() {
    let want = Command::Revoke {
        file: "c.json".into(),
        id: "ci".into(),
    };
    for form in [
        &["revoke", "-file", "c.json", "-id", "ci"][..],
        &["revoke", "--file", "c.json", "--id", "ci"],
        &["revoke", "--file=c.json", "-id=ci"],
    ] {
        assert_eq!(parse_args(&args(form)).unwrap(), want, "{form:?}");
    }
}

#[test]
fn add_is_an_alias_of_create_and_scope_defaults_to_code_run() {
    let parsed = parse_args(&args(&[
        "add",
        "--file",
        "f",
        "--id",
        "a",
        "--token-stdout",
    ]))
    .unwrap();
    assert_eq!(
        parsed,
        Command::Create(NewClient {
            file: "f".into(),
            id: "a".into(),
            scopes: vec!["code:run".into()],
            paid_seconds_per_day: None,
        })
    );
}

#[test]
fn scopes_repeat_and_allowance_parses() {
    let parsed = parse_args(&args(&[
        "import",
        "-file",
        "f",
        "-id",
        "a",
        "-scope",
        "x",
        "-scope",
        "y",
        "-paid-seconds-per-day",
        "600",
    ]))
    .unwrap();
    let Command::Import(new) = parsed else {
        panic!("{parsed:?}")
    };
    assert_eq!(new.scopes, ["x", "y"]);
    assert_eq!(new.paid_seconds_per_day, Some(600));
}

#[test]
fn create_without_token_stdout_is_a_usage_error() {
    let err = parse_args(&args(&["create", "--file", "f", "--id", "a"])).unwrap_err();
    assert_eq!(err.exit_code(), 2);
    assert!(err.to_string().contains("--token-stdout"));
}

#[test]
fn positional_arguments_are_refused_without_echo() {
    let secret = "s3cr3t-token-value-that-must-not-leak";
    let (code, out, err) = run_tool(&["import", "--file", "f", "--id", "a", secret], "");
    assert_eq!(code, 2);
    assert!(out.is_empty());
    assert!(
        err.contains("tokens must never be passed as arguments"),
        "{err}"
    );
    assert!(!err.contains(secret));
}

#[test]
fn usage_errors_exit_2() {
    for bad in [
        &[][..],
        &["frobnicate", "--file", "f"],
        &["list"],
        &["revoke", "--file", "f"],
        &["list", "--file", "f", "--id", "a"],
        &["revoke", "--file", "f", "--id", "a", "--id", "b"],
        &["revoke", "--file", "f", "--id"],
        &["limit", "--file", "f", "--id", "a"],
        &[
            "limit",
            "--file",
            "f",
            "--id",
            "a",
            "--paid-seconds-per-day",
            "-1",
        ],
        &["rotate", "--file", "f", "--id", "a"],
        &[
            "rotate",
            "--file",
            "f",
            "--id",
            "a",
            "--token-stdout",
            "--token-stdin",
        ],
        &["--file", "f", "list"],
    ] {
        let (code, out, _) = run_tool(bad, "");
        assert_eq!(code, 2, "{bad:?}");
        assert!(out.is_empty(), "{bad:?}");
    }
}

#[test]
fn help_goes_to_stdout_and_exits_0() {
    for form in [&["help"][..], &["-h"], &["--help"], &["create", "-h"]] {
        let (code, out, err) = run_tool(form, "");
        assert_eq!(code, 0, "{form:?}");
        assert!(out.starts_with("plimsoll-clients:"), "{form:?}");
        assert!(err.is_empty());
    }
}

// === create ===

#[test]
fn create_makes_a_new_0600_file_and_prints_only_the_token() {
    let s = scratch();
    let (code, out, err) = run_tool(
        &["create", "--file", &s.file, "--id", "ci", "--token-stdout"],
        "",
    );
    assert_eq!(code, 0, "{err}");
    let token = out.strip_suffix('\n').unwrap();
    assert_eq!(token.len(), 64);
    assert!(token.bytes().all(|b| b.is_ascii_hexdigit()));
    assert!(!err.contains(token));
    let file = registry(&s);
    assert_eq!(file.clients.len(), 1);
    let entry = &file.clients[0];
    assert_eq!(entry.id, "ci");
    assert_eq!(entry.scopes, ["code:run"]);
    assert_eq!(entry.token_sha256, clients_file::token_sha256_hex(token));
    let text = fs::read_to_string(&s.file).unwrap();
    assert!(!text.contains(token), "the token itself is never stored");
    let mode = fs::metadata(&s.file).unwrap().permissions().mode() & 0o7777;
    assert_eq!(mode, 0o600);
    assert!(!Path::new(&format!("{}.lock", s.file)).exists());
}

#[test]
fn create_gives_distinct_tokens_and_refuses_duplicate_ids() {
    let s = scratch();
    let a = create(&s, "a");
    let b = create(&s, "b");
    assert_ne!(a, b);
    let (code, out, err) = run_tool(
        &["create", "--file", &s.file, "--id", " a ", "--token-stdout"],
        "",
    );
    assert_eq!(code, 1);
    assert!(out.is_empty());
    assert!(err.contains("already exists"), "{err}");
    assert_eq!(registry(&s).clients.len(), 2);
}

#[test]
fn create_refuses_invalid_ids_and_scopes() {
    let s = scratch();
    for bad in [
        &["create", "--file", &s.file, "--id", "*", "--token-stdout"][..],
        &["create", "--file", &s.file, "--id", "  ", "--token-stdout"],
        &[
            "create",
            "--file",
            &s.file,
            "--id",
            "a",
            "--scope",
            "x y",
            "--token-stdout",
        ],
    ] {
        let (code, out, _) = run_tool(bad, "");
        assert_eq!(code, 1, "{bad:?}");
        assert!(out.is_empty(), "no token for a refused create");
    }
    assert!(!Path::new(&s.file).exists());
}

#[test]
fn an_existing_lock_is_reported_and_left_alone() {
    let s = scratch();
    let lock = format!("{}.lock", s.file);
    fs::create_dir(&lock).unwrap();
    let (code, out, err) = run_tool(
        &["create", "--file", &s.file, "--id", "a", "--token-stdout"],
        "",
    );
    assert_eq!(code, 1);
    assert!(out.is_empty());
    assert!(err.contains(".lock exists"), "{err}");
    assert!(Path::new(&lock).is_dir());
}

#[test]
fn a_symlinked_file_is_refused() {
    let s = scratch();
    create(&s, "a");
    let link = format!("{}.link", s.file);
    std::os::unix::fs::symlink(&s.file, &link).unwrap();
    let (code, _, err) = run_tool(&["revoke", "--file", &link, "--id", "a"], "");
    assert_eq!(code, 1);
    assert!(err.contains("symbolic link"), "{err}");
}

// === import ===

#[test]
fn import_reads_the_token_from_stdin_with_one_newline() {
    let s = scratch();
    let token = "i".repeat(40);
    let (code, out, err) = run_tool(
        &[
            "import", "--file", &s.file, "--id", "ci", "--scope", "code:run",
        ],
        &format!("{token}\n"),
    );
    assert_eq!(code, 0, "{err}");
    assert!(out.is_empty());
    let file = registry(&s);
    assert_eq!(
        file.lookup(&clients_file::token_sha256_hex(&token))
            .unwrap()
            .id,
        "ci"
    );
}

#[test]
fn import_refuses_malformed_tokens() {
    let s = scratch();
    for bad in [
        "short\n".to_owned(),
        format!("{}\n\n", "i".repeat(40)),
        format!("{} x\n", "i".repeat(40)),
        "i".repeat(4097),
        String::new(),
    ] {
        let (code, _, err) = run_tool(&["import", "--file", &s.file, "--id", "a"], &bad);
        assert_eq!(code, 1, "{bad:?}");
        assert!(err.contains("the token on stdin"), "{err}");
    }
    assert!(!Path::new(&s.file).exists());
}

#[test]
fn import_refuses_a_token_another_client_holds() {
    let s = scratch();
    let token = "i".repeat(40);
    run_tool(&["import", "--file", &s.file, "--id", "a"], &token);
    let (code, _, err) = run_tool(&["import", "--file", &s.file, "--id", "b"], &token);
    assert_eq!(code, 1);
    assert!(err.contains("already used by client \"a\""), "{err}");
}

// === list ===

#[test]
fn list_shows_ids_scopes_and_allowances_never_fingerprints() {
    let s = scratch();
    create(&s, "a");
    run_tool(
        &[
            "create",
            "--file",
            &s.file,
            "--id",
            "b",
            "--scope",
            "x",
            "--scope",
            "y",
            "--paid-seconds-per-day",
            "600",
            "--token-stdout",
        ],
        "",
    );
    let (code, out, _) = run_tool(&["list", "--file", &s.file], "");
    assert_eq!(code, 0);
    assert_eq!(
        out,
        "a\tscopes=code:run\tpaid_seconds_per_day=-\nb\tscopes=x,y\tpaid_seconds_per_day=600\n"
    );
    let (code, out, _) = run_tool(&["list", "-file", &s.file, "-json"], "");
    assert_eq!(code, 0);
    let value: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(value["clients"][1]["paid_seconds_per_day"], 600);
    assert!(value["clients"][0].get("paid_seconds_per_day").is_none());
    for c in &registry(&s).clients {
        assert!(!out.contains(&c.token_sha256));
    }
}

#[test]
fn list_of_a_missing_file_fails() {
    let s = scratch();
    let (code, _, _) = run_tool(&["list", "--file", &s.file], "");
    assert_eq!(code, 1);
}

// === rotate ===

#[test]
fn rotate_with_token_stdout_replaces_the_fingerprint() {
    let s = scratch();
    let old = create(&s, "a");
    let (code, out, err) = run_tool(
        &["rotate", "--file", &s.file, "--id", "a", "--token-stdout"],
        "",
    );
    assert_eq!(code, 0, "{err}");
    let new = out.trim_end();
    assert_ne!(new, old);
    let file = registry(&s);
    assert!(file.lookup(&clients_file::token_sha256_hex(&old)).is_none());
    assert_eq!(
        file.lookup(&clients_file::token_sha256_hex(new))
            .unwrap()
            .id,
        "a"
    );
}

#[test]
fn rotate_with_token_stdin_refuses_the_same_token() {
    let s = scratch();
    let old = create(&s, "a");
    let (code, _, err) = run_tool(
        &["rotate", "--file", &s.file, "--id", "a", "--token-stdin"],
        &old,
    );
    assert_eq!(code, 1);
    assert!(err.contains("must differ"), "{err}");
    let fresh = "r".repeat(48);
    let (code, out, _) = run_tool(
        &["rotate", "--file", &s.file, "--id", "a", "--token-stdin"],
        &fresh,
    );
    assert_eq!(code, 0);
    assert!(out.is_empty());
    assert!(
        registry(&s)
            .lookup(&clients_file::token_sha256_hex(&fresh))
            .is_some()
    );
}

#[test]
fn rotate_of_an_unknown_id_fails_without_printing_a_token() {
    let s = scratch();
    create(&s, "a");
    let (code, out, err) = run_tool(
        &["rotate", "--file", &s.file, "--id", "b", "--token-stdout"],
        "",
    );
    assert_eq!(code, 1);
    assert!(out.is_empty());
    assert!(err.contains("no client \"b\""), "{err}");
}

// === revoke and limit ===

#[test]
fn revoking_the_last_client_leaves_an_empty_registry() {
    let s = scratch();
    create(&s, "a");
    fs::set_permissions(&s.file, fs::Permissions::from_mode(0o640)).unwrap();
    let (code, _, err) = run_tool(&["revoke", "--file", &s.file, "--id", "a"], "");
    assert_eq!(code, 0, "{err}");
    assert!(registry(&s).clients.is_empty());
    let mode = fs::metadata(&s.file).unwrap().permissions().mode() & 0o7777;
    assert_eq!(mode, 0o640, "an existing file keeps its mode");
    let (code, _, _) = run_tool(&["revoke", "--file", &s.file, "--id", "a"], "");
    assert_eq!(code, 1);
}

#[test]
fn limit_sets_warns_below_60_and_zero_removes() {
    let s = scratch();
    create(&s, "a");
    let (code, _, err) = limit(&s, "a", "30");
    assert_eq!(code, 0);
    assert!(err.contains("warning"), "{err}");
    assert_eq!(registry(&s).clients[0].paid_seconds_per_day, Some(30));
    let (code, _, err) = limit(&s, "a", "0");
    assert_eq!(code, 0);
    assert!(err.contains("removed"), "{err}");
    assert_eq!(registry(&s).clients[0].paid_seconds_per_day, None);
    let (code, _, _) = limit(&s, "zz", "100");
    assert_eq!(code, 1);
}

#[test]
fn an_invalid_existing_file_is_not_overwritten() {
    let s = scratch();
    fs::write(&s.file, "{\"clients\": null}").unwrap();
    let (code, out, err) = run_tool(
        &["create", "--file", &s.file, "--id", "a", "--token-stdout"],
        "",
    );
    assert_eq!(code, 1);
    assert!(out.is_empty());
    assert!(err.contains("missing or null"), "{err}");
    assert_eq!(fs::read_to_string(&s.file).unwrap(), "{\"clients\": null}");
}

/// A writer that always fails, like a closed pipe.
struct ClosedPipe;

impl Write for ClosedPipe {
    fn write(&mut self, _: &[u8]) -> io::Result<usize> {
        Err(io::ErrorKind::BrokenPipe.into())
    }

    fn flush(&mut self) -> io::Result<()> {
        Err(io::ErrorKind::BrokenPipe.into())
    }
}

#[test]
fn a_token_that_cannot_be_printed_is_reported_with_the_remedy() {
    let s = scratch();
    let mut err = Vec::new();
    let code = run(
        &args(&["create", "--file", &s.file, "--id", "a", "--token-stdout"]),
        &mut io::empty(),
        &mut ClosedPipe,
        &mut err,
    );
    assert_eq!(code, 1);
    let err = String::from_utf8(err).unwrap();
    assert!(err.contains("rotate --token-stdout"), "{err}");
    assert!(!err.contains("shown once"), "{err}");
}
