use super::*;
use crate::wire::ModuleRow;

fn js(code: &str) -> JavaScriptRun {
    JavaScriptRun {
        code: code.to_owned(),
        ..Default::default()
    }
}

fn file(path: &str, content: &str) -> ProjectFile {
    ProjectFile {
        path: path.to_owned(),
        content: content.to_owned(),
        ..Default::default()
    }
}

fn project(files: Vec<ProjectFile>, steps: &[&str], artifacts: &[&str]) -> ProjectRun {
    ProjectRun {
        files,
        steps: steps.iter().map(|s| s.to_string()).collect(),
        artifacts: artifacts.iter().map(|s| s.to_string()).collect(),
        ..Default::default()
    }
}

fn rule(mode: &str, ids: &[&str]) -> SoftwareRule {
    SoftwareRule {
        mode: mode.to_owned(),
        identities: ids.iter().map(|s| s.to_string()).collect(),
        ..Default::default()
    }
}

fn module(rows: Vec<Vec<f64>>, end_time: f64, step: f64) -> ModuleRun {
    ModuleRun {
        model: "VanDerPol".into(),
        rows: rows
            .into_iter()
            .map(|values| ModuleRow {
                values,
                ..Default::default()
            })
            .collect(),
        end_time,
        step,
        ..Default::default()
    }
}

fn is_invalid(r: Result<impl std::fmt::Debug, Refusal>) -> bool {
    matches!(r, Err(Refusal::InvalidRequest(_)))
}

#[test]
fn protocol_zero_is_missing_and_others_mismatch() {
    assert_eq!(check_protocol(0), Err(Refusal::ProtocolMissing));
    assert_eq!(check_protocol(3), Err(Refusal::ProtocolMismatch(3)));
    assert_eq!(check_protocol(5), Err(Refusal::ProtocolMismatch(5)));
    assert_eq!(check_protocol(PROTOCOL), Ok(()));
}

#[test]
fn floor_none_is_an_invalid_request() {
    assert!(is_invalid(check_floor("none")));
    assert!(is_invalid(check_floor("bogus")));
    assert_eq!(check_floor(""), Ok(Floor::NONE));
}

#[test]
fn software_rule_shapes() {
    assert!(check_software_rule(None).is_ok());
    assert!(check_software_rule(Some(&rule("", &[]))).is_ok());
    assert!(check_software_rule(Some(&rule("exact", &["a@sha256:1"]))).is_ok());
    assert!(check_software_rule(Some(&rule("approved", &["a", "b"]))).is_ok());
    assert!(is_invalid(check_software_rule(Some(&rule(
        "exact",
        &["a", "b"]
    )))));
    assert!(is_invalid(check_software_rule(Some(&rule(
        "approved",
        &[]
    )))));
    assert!(is_invalid(check_software_rule(Some(&rule("", &["a"])))));
    assert!(is_invalid(check_software_rule(Some(&rule(
        "latest",
        &["a"]
    )))));
    assert!(is_invalid(check_software_rule(Some(&rule(
        "approved",
        &["a", "a"]
    )))));
    assert!(is_invalid(check_software_rule(Some(&rule(
        "exact",
        &["a b"]
    )))));
    assert!(is_invalid(check_software_rule(Some(&rule("exact", &[""])))));
    let long = "a".repeat(MAX_IDENTITY_BYTES + 1);
    assert!(is_invalid(check_software_rule(Some(&rule(
        "exact",
        &[&long]
    )))));
    let many: Vec<String> = (0..=MAX_RULE_IDENTITIES)
        .map(|i| format!("id{i}"))
        .collect();
    let many: Vec<&str> = many.iter().map(String::as_str).collect();
    assert!(is_invalid(check_software_rule(Some(&rule(
        "approved", &many
    )))));
}

#[test]
fn snippet_code_rules() {
    assert!(check_javascript(&js("console.log(1)")).is_ok());
    assert!(is_invalid(check_javascript(&js(""))));
    assert!(is_invalid(check_javascript(&js("a\0b"))));
    assert!(check_javascript(&js(&"x".repeat(MAX_CODE_BYTES))).is_ok());
    assert!(is_invalid(check_javascript(&js(
        &"x".repeat(MAX_CODE_BYTES + 1)
    ))));
    let mut long_profile = js("1");
    long_profile.grant_profile = "p".repeat(MAX_PROFILE_NAME_BYTES + 1);
    assert!(is_invalid(check_javascript(&long_profile)));
}

#[test]
fn unclean_or_escaping_paths_are_refused() {
    for bad in [
        "", ".", "..", "../x", "a/../b", "a/./b", "./a", "/abs", "a//b", "a/", "a\\b", "a\u{1}b",
        "a\u{7f}b", "a\u{85}b",
    ] {
        assert!(
            is_invalid(check_path("p", bad)),
            "{bad:?} should be refused"
        );
    }
    for good in [
        "a",
        "a/b.txt",
        "dir/sub/file.js",
        ".plimsoll/code.py",
        "a..b",
        "...",
        "é",
    ] {
        assert!(check_path("p", good).is_ok(), "{good:?} should pass");
    }
    assert!(is_invalid(check_path(
        "p",
        &"a".repeat(MAX_PROJECT_PATH_BYTES + 1)
    )));
}

#[test]
fn project_rules() {
    let ok = project(
        vec![file("main.js", "x\0y")],
        &["node main.js"],
        &["out.txt"],
    );
    assert!(
        check_project(&ok).is_ok(),
        "NUL is allowed in file contents"
    );
    let dup = project(vec![file("a", ""), file("a", "")], &["true"], &[]);
    assert!(is_invalid(check_project(&dup)));
    let dup_art = project(vec![], &["true"], &["o", "o"]);
    assert!(is_invalid(check_project(&dup_art)));
    assert!(is_invalid(check_project(&project(vec![], &[], &[]))));
    let too_many: Vec<&str> = vec!["true"; MAX_PROJECT_STEPS + 1];
    assert!(is_invalid(check_project(&project(vec![], &too_many, &[]))));
    assert!(is_invalid(check_project(&project(vec![], &["a\0"], &[]))));
    let long_step = "x".repeat(MAX_PROJECT_STEP_BYTES + 1);
    assert!(is_invalid(check_project(&project(
        vec![],
        &[&long_step],
        &[]
    ))));
    let big = "x".repeat(MAX_PROJECT_BYTES / 2 + 1);
    let heavy = project(vec![file("a", &big), file("b", &big)], &["true"], &[]);
    assert!(is_invalid(check_project(&heavy)));
    let files: Vec<ProjectFile> = (0..=MAX_PROJECT_FILES)
        .map(|i| file(&format!("f{i}"), ""))
        .collect();
    assert!(is_invalid(check_project(&project(files, &["true"], &[]))));
    let arts: Vec<String> = (0..=MAX_PROJECT_ARTIFACTS)
        .map(|i| format!("a{i}"))
        .collect();
    let arts: Vec<&str> = arts.iter().map(String::as_str).collect();
    assert!(is_invalid(check_project(&project(
        vec![],
        &["true"],
        &arts
    ))));
}

#[test]
fn module_rules() {
    assert!(check_module(&module(vec![vec![1.0, 2.0]], 1.0, 0.1)).is_ok());
    assert!(is_invalid(check_module(&module(vec![], 1.0, 0.1))));
    assert!(is_invalid(check_module(&module(vec![vec![]], 1.0, 0.1))));
    assert!(is_invalid(check_module(&module(
        vec![vec![1.0], vec![1.0, 2.0]],
        1.0,
        0.1
    ))));
    assert!(is_invalid(check_module(&module(
        vec![vec![f64::NAN]],
        1.0,
        0.1
    ))));
    assert!(is_invalid(check_module(&module(
        vec![vec![f64::INFINITY]],
        1.0,
        0.1
    ))));
    assert!(is_invalid(check_module(&module(vec![vec![1.0]], 0.0, 0.1))));
    assert!(is_invalid(check_module(&module(
        vec![vec![1.0]],
        1.0,
        -0.1
    ))));
    assert!(is_invalid(check_module(&module(vec![vec![1.0]], 2e6, 1.0))));
    // 100 rows of 10^6 steps blows the 8 MiB worst case.
    assert!(is_invalid(check_module(&module(
        vec![vec![1.0]; 100],
        1e6,
        1.0
    ))));
    let mut bad_name = module(vec![vec![1.0]], 1.0, 0.1);
    bad_name.model = "-x".into();
    assert!(is_invalid(check_module(&bad_name)));
    bad_name.model = "a".repeat(65);
    assert!(is_invalid(check_module(&bad_name)));
}

#[test]
fn cell_is_refused_by_run_and_checked_in_sessions() {
    let cell = CellRun {
        language: "python".into(),
        code: "1+1".into(),
        ..Default::default()
    };
    let run = run_request::Payload::Cell(Box::new(cell.clone()));
    assert!(is_invalid(check_run_payload(Some(&run))));
    let sess = session_run_request::Payload::Cell(Box::new(cell.clone()));
    assert_eq!(check_session_payload(Some(&sess)), Ok(PayloadKind::Cell));
    let ruby = CellRun {
        language: "ruby".into(),
        ..cell
    };
    let sess = session_run_request::Payload::Cell(Box::new(ruby));
    assert!(is_invalid(check_session_payload(Some(&sess))));
    assert!(is_invalid(check_run_payload(None)));
    assert!(is_invalid(check_session_payload(None)));
}

#[test]
fn trace_ids_outside_the_charset_are_dropped() {
    assert_eq!(trace_id("t-1"), Some("t-1"));
    assert_eq!(trace_id("a.b:c_d-e"), Some("a.b:c_d-e"));
    assert_eq!(trace_id(""), None);
    assert_eq!(trace_id("has space"), None);
    assert_eq!(trace_id(&"x".repeat(65)), None);
    assert_eq!(trace_id("é"), None);
}

#[test]
fn timeouts_default_and_clamp() {
    assert_eq!(effective_timeout_ms(0, 10_000, 30_000), 10_000);
    assert_eq!(effective_timeout_ms(-5, 10_000, 30_000), 10_000);
    assert_eq!(effective_timeout_ms(5_000, 10_000, 30_000), 5_000);
    assert_eq!(effective_timeout_ms(60_000, 10_000, 30_000), 30_000);
    assert_eq!(
        effective_timeout_ms(i32::MAX, 10_000, u32::MAX),
        HARD_TIMEOUT_CEILING_MS
    );
}
