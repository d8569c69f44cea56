//! Software identities on docker (wire.md §6.3, records.md §2 and §5, providers.md §5.11
//! step 11; issue 16): each image states `oci-manifest:<platform>@sha256:<digest>`, the manifest
//! digest docker recorded when `images/build` pulled it back from its registry; `Describe`,
//! every record and the session answers state it; a software rule naming it runs and one
//! naming anything else is refused before dispatch; an image docker holds no manifest for
//! states none, so every rule is refused; images pinned by their registry digest serve under
//! `SANDBOX_REQUIRE_PINNED_IMAGES=1`.

use plimsoll::record;
use plimsoll::wire::{RunRequest, RunResponse, SoftwareRule};

use super::session::{close_as, open, sessions};
use super::*;

/// `(platform, repo digests)` of an image, as `docker image inspect` states them.
fn inspected(image: &str) -> (String, Vec<String>) {
    let (ok, out) = docker(&[
        "image",
        "inspect",
        "--format",
        "{{.Os}}/{{.Architecture}}{{range .RepoDigests}} {{.}}{{end}}",
        image,
    ]);
    assert!(ok, "docker image inspect {image}: {out}");
    let mut words = out.split_whitespace().map(str::to_owned);
    let platform = words.next().unwrap_or_default();
    (platform, words.collect())
}

/// The identity docker's own records give `image`: its platform and its one manifest digest.
fn manifest_identity(image: &str) -> String {
    let (platform, repo_digests) = inspected(image);
    let mut digests: Vec<&str> = repo_digests
        .iter()
        .filter_map(|r| r.rsplit_once('@').map(|(_, d)| d))
        .collect();
    digests.dedup();
    assert_eq!(
        digests.len(),
        1,
        "{image} must have one repo digest (images/build pulls it back by digest): {repo_digests:?}"
    );
    format!("oci-manifest:{platform}@{}", digests[0])
}

/// `<registry>/<repository>@sha256:<digest>`: the image pinned as a deployment pins it.
fn pinned_reference(image: &str) -> String {
    inspected(image)
        .1
        .into_iter()
        .next()
        .unwrap_or_else(|| panic!("{image} has no repo digest"))
}

/// Another well-formed identity: the same platform, a digest no image here has.
fn other_identity(identity: &str) -> String {
    let (head, _) = identity.rsplit_once('@').expect("an identity has a digest");
    format!("{head}@sha256:{}", "0".repeat(64))
}

fn rule(mode: &str, identities: &[&str]) -> Value {
    json!({ "mode": mode, "identities": identities })
}

/// Sends a Run and, when answered, verifies its record with the caller's rule as a client does.
fn run_with_rule(d: &Daemon, mut body: Value, rule: &Value) -> (Request, Response) {
    body["softwareRule"] = rule.clone();
    let req = connect::call("Run", &body);
    let resp = send(d.addr, &req);
    if resp.status == 200 {
        let wire_req: RunRequest = serde_json::from_value(body).expect("request as wire");
        let answer: RunResponse = serde_json::from_value(resp.json()).expect("answer as wire");
        let wire_rule: SoftwareRule = serde_json::from_value(rule.clone()).expect("rule as wire");
        record::check_single(
            &record::request_digest(&wire_req),
            Some(&wire_rule),
            &answer,
        )
        .unwrap_or_else(|e| panic!("record does not verify ({e}): {resp}"));
    }
    (req, resp)
}

fn snippet_body(code: &str) -> Value {
    json!({ "protocol": connect::PROTOCOL, "timeoutMs": 20_000, "javascript": { "code": code } })
}

#[test]
fn describe_records_and_session_answers_state_each_images_manifest() {
    require_docker!();
    let (snippet, project) = (
        manifest_identity(snippet_image()),
        manifest_identity(project_image()),
    );
    assert_ne!(snippet, project);
    let d = shared();
    let v = send(d.addr, &connect::call("Describe", &json!({}))).json();
    assert_eq!(
        v["javascriptEnvironment"]["softwareIdentity"], snippet,
        "{v}"
    );
    assert_eq!(v["projectEnvironment"]["softwareIdentity"], project, "{v}");
    let ran = run(&d, "console.log(1)", 20_000);
    assert_eq!(ran.resp["softwareIdentity"], snippet, "{:?}", ran.resp);
    assert_eq!(
        ran.resp["record"]["softwareIdentity"], snippet,
        "{:?}",
        ran.resp
    );
    let body = connect::project(&[], &["true"]);
    let v = send(d.addr, &connect::call("Run", &body)).json();
    assert_eq!(v["record"]["softwareIdentity"], project, "{v}");

    // Sessions run in the project image and state its manifest, at open and on every call.
    let s = sessions();
    let described = send(s.addr, &connect::call("Describe", &json!({}))).json();
    assert_eq!(
        described["sessionEnvironment"]["softwareIdentity"], project,
        "{described}"
    );
    let (id, opened) = open(&s, json!({ "softwareRule": rule("exact", &[&project]) }));
    assert_eq!(opened["softwareIdentity"], project, "{opened}");
    // Each call restates the session's rule (wire.md §7.3).
    let body = json!({ "protocol": connect::PROTOCOL, "sessionId": id,
                       "softwareRule": rule("exact", &[&project]),
                       "javascript": { "code": "console.log(2)" } });
    let call = send(s.addr, &connect::call("SessionRun", &body)).json();
    assert_eq!(call["run"]["record"]["softwareIdentity"], project, "{call}");
    assert_eq!(
        call["run"]["record"]["softwareRuleId"],
        format!("exact:{project}"),
        "{call}"
    );
    assert_eq!(close_as(&s, None, &id).status, 200);
}

#[test]
fn a_rule_naming_the_stated_identity_runs_and_any_other_is_refused_before_dispatch() {
    require_docker!();
    let snippet = manifest_identity(snippet_image());
    let project = manifest_identity(project_image());
    let other = other_identity(&snippet);
    let d = shared();

    let (_, resp) = run_with_rule(
        &d,
        snippet_body("console.log('exact')"),
        &rule("exact", &[&snippet]),
    );
    assert_eq!(resp.status, 200, "{resp}");
    assert_eq!(
        resp.json()["record"]["softwareRuleId"],
        format!("exact:{snippet}")
    );

    let approved = rule("approved", &[&other, &snippet, &project]);
    let (_, resp) = run_with_rule(&d, snippet_body("console.log('approved')"), &approved);
    assert_eq!(resp.status, 200, "{resp}");
    let rule_id = resp.json()["record"]["softwareRuleId"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    assert!(rule_id.starts_with("approved:sha256:"), "{rule_id}");

    // Another manifest, or the project image's manifest for a snippet: nothing runs.
    for identities in [vec![other.as_str()], vec![project.as_str()]] {
        let (req, resp) = run_with_rule(
            &d,
            snippet_body("console.log('never')"),
            &rule("exact", &identities),
        );
        let err = connect::assert_refused(
            &resp,
            &req,
            "failed_precondition",
            connect::Reason::Environment,
        );
        assert!(err.message.contains("software rule"), "{resp}");
    }
    // A project is checked against the project image's manifest.
    let (req, resp) = run_with_rule(
        &d,
        connect::project(&[], &["true"]),
        &rule("exact", &[&snippet]),
    );
    connect::assert_refused(
        &resp,
        &req,
        "failed_precondition",
        connect::Reason::Environment,
    );
    let (_, resp) = run_with_rule(
        &d,
        connect::project(&[], &["true"]),
        &rule("exact", &[&project]),
    );
    assert_eq!(resp.status, 200, "{resp}");
}

#[test]
fn images_pinned_by_their_registry_digest_serve_and_state_that_manifest() {
    require_docker!();
    let (snippet, project) = (
        pinned_reference(snippet_image()),
        pinned_reference(project_image()),
    );
    let d = Daemon::start(&env_with(&[
        ("SANDBOX_REQUIRE_PINNED_IMAGES", "1"),
        ("SANDBOX_DOCKER_IMAGE", &snippet),
        ("SANDBOX_DOCKER_PROJECT_IMAGE", &project),
    ]));
    let v = send(d.addr, &connect::call("Describe", &json!({}))).json();
    let digest = |r: &str| {
        r.rsplit_once('@')
            .map(|(_, d)| d.to_owned())
            .unwrap_or_default()
    };
    let stated = v["javascriptEnvironment"]["softwareIdentity"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    assert!(stated.starts_with("oci-manifest:linux/"), "{v}");
    assert!(stated.ends_with(&format!("@{}", digest(&snippet))), "{v}");
    assert!(
        v["projectEnvironment"]["softwareIdentity"]
            .as_str()
            .is_some_and(|s| s.ends_with(&format!("@{}", digest(&project)))),
        "{v}"
    );
    let (_, resp) = run_with_rule(
        &d,
        snippet_body("console.log('pinned')"),
        &rule("exact", &[&stated]),
    );
    stop(d);
    assert_eq!(resp.status, 200, "{resp}");
    assert_eq!(
        resp.json()["record"]["environment"],
        image_id(snippet_image())
    );
}

#[test]
fn an_image_docker_holds_no_manifest_for_states_none_and_every_rule_is_refused() {
    require_docker!();
    // The snippet image's files re-imported as a new image: never pushed, never pulled.
    let name = format!("plsm-test-export-{}", std::process::id());
    let tag = format!("plimsoll-test/unpushed:{}", std::process::id());
    let (ok, out) = docker(&[
        "create",
        "--name",
        &name,
        "--label",
        "io.plimsoll.test=unpushed",
        snippet_image(),
    ]);
    assert!(ok, "{out}");
    let imported = Command::new("sh")
        .arg("-c")
        .arg(format!(
            "docker export {name} | docker import --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' - {tag}"
        ))
        .output()
        .expect("docker export | docker import");
    docker(&["rm", "-f", &name]);
    assert!(imported.status.success(), "{imported:?}");
    let d = Daemon::start(&env_with(&[("SANDBOX_DOCKER_IMAGE", &tag)]));
    let v = send(d.addr, &connect::call("Describe", &json!({}))).json();
    let plain = run(&d, "console.log('no rule')", 20_000);
    let snippet = manifest_identity(snippet_image());
    let (req, refused) = run_with_rule(
        &d,
        snippet_body("console.log('never')"),
        &rule("exact", &[&snippet]),
    );
    let warned = d.logs().iter().any(|l| l.contains("no software identity"));
    stop(d);
    docker(&["rmi", &tag]);
    assert_eq!(
        v["javascriptEnvironment"]["softwareIdentity"],
        Value::Null,
        "{v}"
    );
    assert!(warned, "the daemon logs why the image states no identity");
    assert_eq!(plain.stdout, "no rule\n");
    assert_eq!(
        plain.resp["softwareIdentity"],
        Value::Null,
        "{:?}",
        plain.resp
    );
    let err = connect::assert_refused(
        &refused,
        &req,
        "failed_precondition",
        connect::Reason::Environment,
    );
    assert!(err.message.contains("no stated software"), "{refused}");
}
