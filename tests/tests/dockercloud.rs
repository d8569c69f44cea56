//! The dockercloud provider end to end (grants.md §7, issue 18): a real `plimsolld` with
//! `SANDBOX_PROVIDER=dockercloud` against the Docker Cloud simulator
//! (`tests/simulators/dockercloud`, checked by Docker's published SDK), every sandbox a local
//! container under the runtime `PLIMSOLL_TEST_DOCKER_RUNTIME` names (`runc` or `runsc`).
//!
//! No Docker account can be reached here: this suite is the provider's proof, and every
//! refusal in it is driven by a simulator fault (docs/dockercloud-simulator.md).
// A test fails by panicking, with the evidence in the message.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use dockercloud_simulator::{Faults, StuckOperation};
use plimsoll_tests::Daemon;
use plimsoll_tests::connect;
use plimsoll_tests::dockercloud::{DockerCloudSim, dockercloud_ready};
use plimsoll_tests::sim::{self, field, refused_run, send, snippet};
use serde_json::{Value, json};

#[path = "support/endings.rs"]
mod endings;
#[path = "support/verified.rs"]
mod verified;

macro_rules! require_dockercloud {
    () => {
        if !dockercloud_ready() {
            return;
        }
    };
}

#[path = "dockercloud/paid.rs"]
mod paid;

/// Runs `body`, expects an answer at tier `vm`, and verifies its record as a client does.
fn answered(d: &Daemon, body: &Value) -> Value {
    verified::answered_at(d, body, "vm")
}

/// The instance id the daemon logged when its proof passed.
fn instance_of(d: &Daemon) -> String {
    sim::proven_instance(d, "dockercloud")
}

/// The tier, `Describe`, snippets (output, exit, a fresh sandbox each run, the deadline, an
/// output flood) and projects (nested files, steps, artifacts, a failing step, a timeout, a
/// sandbox lost mid-step), with verified records; every sandbox is deleted after its run.
#[test]
fn snippets_and_projects_run_in_fresh_sandboxes_at_tier_vm() {
    require_dockercloud!();
    let cloud = DockerCloudSim::start();
    let mut d = cloud.daemon(&[]);
    assert_eq!(d.listening["isolation"], "vm", "{}", d.listening);
    // The startup proof's sandbox is gone before the daemon serves.
    assert!(cloud.names().is_empty(), "{:?}", cloud.sandboxes());
    let instance = instance_of(&d);

    let v = send(d.addr, &connect::call("Describe", &json!({}))).json();
    assert_eq!(v["sandbox"], "dockercloud", "{v}");
    assert_eq!(v["isolation"], "vm", "{v}");
    assert_eq!(v["supportsProject"], true, "{v}");
    assert_ne!(v["supportsJavascriptGrants"], true, "no guard: {v}");

    let mut body = snippet("console.log(6*7); console.error('to stderr')", 20_000);
    body["minimumIsolation"] = json!("vm");
    let v = answered(&d, &body);
    let js = &v["javascript"];
    assert_eq!(field(js, "stdout"), "42\n", "{v}");
    assert_eq!(field(js, "stderr"), "to stderr\n", "{v}");
    let first = v["instance"].as_str().unwrap_or_default().to_owned();
    assert!(
        first.starts_with("dockercloud-sandbox:"),
        "typed instance: {v}"
    );
    assert_eq!(v["record"]["instance"], first, "{v}");

    // A fresh sandbox each run, named with this instance's prefix while it lives.
    let addr = d.addr;
    let runner = std::thread::spawn(move || {
        let body = snippet(
            "require('fs').writeFileSync('/tmp/mark', 'x'); setTimeout(() => console.log(require('fs').readdirSync('/tmp').filter(f => f === 'mark').length), 1500)",
            20_000,
        );
        send(addr, &connect::call("Run", &body))
    });
    let prefix = format!("plimsoll-{instance}-");
    cloud.wait_for(Duration::from_secs(60), "the run's sandbox", |names| {
        names.iter().any(|n| n.starts_with(&prefix))
    });
    let resp = runner.join().expect("the run's thread");
    let v = resp.json();
    assert_eq!(field(&v["javascript"], "stdout"), "1\n", "{v}");
    assert_ne!(v["instance"], first.as_str());

    endings::snippet_and_project_endings(&d, "vm", "/tmp/plimsoll-project");

    endings::a_sandbox_lost_mid_step(&d, "vm", "/tmp/plimsoll-project", || {
        cloud
            .sandboxes()
            .iter()
            .filter_map(|s| s["container"].as_str().map(str::to_owned))
            .collect()
    });

    cloud.wait_empty(Duration::from_secs(60));
    assert!(d.sigterm().success(), "{}", d.logs().join("\n"));
}

/// Every seal fault refuses the run before code runs and deletes its sandbox: a policy that
/// is not deny-all, one more allowed network, a booted digest other than the pinned one; the
/// quota is refused `capacity`; an operation that never completes is refused; a service
/// without `WaitOperation` is polled.
#[test]
fn each_seal_fault_refuses_before_code_runs() {
    require_dockercloud!();
    let cloud = DockerCloudSim::start();
    let pinned = cloud.pinned_image();
    let d = cloud.daemon(&[
        ("SANDBOX_DOCKERCLOUD_IMAGE", &pinned),
        ("SANDBOX_REQUIRE_PINNED_IMAGES", "1"),
    ]);
    let code = "console.log('ran')";
    let cases = [
        (
            Faults {
                policy_not_deny_all: true,
                ..Faults::default()
            },
            "NETWORK_POLICY_MODE_ALLOW_ALL",
        ),
        (
            Faults {
                extra_allowed_network: Some("example.com:443".into()),
                ..Faults::default()
            },
            "example.com:443",
        ),
        (
            Faults {
                booted_digest: Some(format!("sha256:{}", "0".repeat(64))),
                ..Faults::default()
            },
            "booted",
        ),
    ];
    for (faults, needle) in cases {
        cloud.faults(&faults);
        let err = refused_run(&d, &snippet(code, 10_000));
        assert_eq!(err.code, "failed_precondition", "{faults:?}: {err:?}");
        assert!(err.message.contains("nothing ran"), "{faults:?}: {err:?}");
        assert!(err.message.contains(needle), "{faults:?}: {err:?}");
        cloud.wait_empty(Duration::from_secs(60));
    }
    cloud.faults(&Faults {
        quota_reached: true,
        ..Faults::default()
    });
    let err = refused_run(&d, &snippet(code, 10_000));
    assert_eq!(err.code, "resource_exhausted", "{err:?}");
    assert!(err.message.contains("quota"), "{err:?}");
    cloud.faults(&Faults {
        never_complete: vec![StuckOperation::Create],
        ..Faults::default()
    });
    let err = refused_run(&d, &snippet(code, 10_000));
    assert_eq!(err.code, "failed_precondition", "{err:?}");
    assert!(err.message.contains("did not complete"), "{err:?}");
    cloud.faults(&Faults {
        wait_operation_unimplemented: true,
        ..Faults::default()
    });
    let v = answered(&d, &snippet(code, 10_000));
    assert_eq!(field(&v["javascript"], "stdout"), "ran\n", "{v}");
    cloud.faults(&Faults::default());
    cloud.wait_empty(Duration::from_secs(60));
}

/// A pinned image whose booted digest differs fails the startup proof, and a token without
/// the delete permission too; the proof's sandbox is deleted either way.
#[test]
fn the_startup_proof_fails_closed() {
    require_dockercloud!();
    let cloud = DockerCloudSim::start();
    cloud.faults(&Faults {
        missing_permissions: vec!["PERMISSION_SANDBOXES_DELETE".into()],
        ..Faults::default()
    });
    let stderr = cloud.refused(&[]);
    assert!(stderr.contains("PERMISSION_SANDBOXES_DELETE"), "{stderr}");
    assert!(
        !stderr.contains(&cloud.sim.ready.token),
        "the token leaked: {stderr}"
    );
    cloud.faults(&Faults {
        policy_not_deny_all: true,
        ..Faults::default()
    });
    let stderr = cloud.refused(&[]);
    assert!(stderr.contains("deny-all"), "{stderr}");
    cloud.wait_empty(Duration::from_secs(60));
}

/// The orphan sweep deletes this instance's untracked names (and only those); SIGTERM lets
/// the run in flight finish and leaves no sandbox.
#[test]
fn orphans_are_deleted_and_sigterm_drains() {
    require_dockercloud!();
    let cloud = DockerCloudSim::start();
    let mut d = cloud.daemon(&[]);
    let instance = instance_of(&d);
    let ours = format!("plimsoll-{instance}-0123456789ab");
    let theirs = "plimsoll-0000ffff-0123456789ab".to_owned();
    cloud.create_named(&ours);
    cloud.create_named(&theirs);
    // The sweep runs every minute.
    cloud.wait_for(Duration::from_secs(150), "the orphan deleted", |names| {
        !names.contains(&ours)
    });
    assert!(cloud.names().contains(&theirs), "{:?}", cloud.names());

    let addr = d.addr;
    let runner = std::thread::spawn(move || {
        let body = snippet("setTimeout(() => console.log('done'), 3000)", 20_000);
        send(addr, &connect::call("Run", &body))
    });
    let prefix = format!("plimsoll-{instance}-");
    cloud.wait_for(Duration::from_secs(60), "the run's sandbox", |names| {
        names.iter().any(|n| n.starts_with(&prefix))
    });
    assert!(d.sigterm().success(), "{}", d.logs().join("\n"));
    let resp = runner.join().expect("the run's thread");
    assert_eq!(resp.status, 200, "{resp}");
    assert_eq!(
        field(&resp.json()["javascript"], "stdout"),
        "done\n",
        "{resp}"
    );
    let left: Vec<String> = cloud
        .names()
        .into_iter()
        .filter(|n| n.starts_with(&prefix))
        .collect();
    assert!(
        left.is_empty(),
        "the daemon exited with sandboxes left: {left:?}"
    );
}

/// The day's paid seconds: a run that cannot fit is refused `capacity` before any create.
#[test]
fn the_days_paid_seconds_refuse_runs_once_spent() {
    require_dockercloud!();
    let cloud = DockerCloudSim::start();
    let d = cloud.daemon(&[("SANDBOX_PAID_SECONDS_PER_DAY", "60")]);
    let err = refused_run(&d, &snippet("console.log('must not run')", 30_000));
    assert_eq!(err.code, "resource_exhausted", "{err:?}");
    assert!(
        err.message.contains("SANDBOX_PAID_SECONDS_PER_DAY"),
        "{err:?}"
    );
    assert!(cloud.names().is_empty(), "{:?}", cloud.names());
    let v = answered(&d, &snippet("console.log('fits')", 5_000));
    assert_eq!(field(&v["javascript"], "stdout"), "fits\n", "{v}");
}

/// The REST transport (`SANDBOX_DOCKERCLOUD_API=rest`, grants.md §7.3): a guard URL fails
/// startup; runs (snippet, timeout, project with artifacts) go through the REST endpoint with
/// sandbox-scoped endpoint credentials; maxima within 270 s; the seal is read back per run
/// and its faults refuse before code runs; quota is `capacity`; a delete whose answer lies
/// (the sandbox kept) is not believed: it is re-read and resent until the sandbox is gone.
#[test]
fn the_rest_transport_runs_seals_and_deletes_until_gone() {
    require_dockercloud!();
    let cloud = DockerCloudSim::start();
    let rest_url = cloud.sim.ready.rest_url.clone();
    let rest = [
        ("SANDBOX_DOCKERCLOUD_API", "rest"),
        ("SANDBOX_DOCKERCLOUD_API_URL", rest_url.as_str()),
    ];
    let mut guarded = rest.to_vec();
    guarded.push(("SANDBOX_DOCKERCLOUD_GUARD_URL", "https://guard.example.com"));
    guarded.push(("PLIMSOLL_GUARD_ADDR", "127.0.0.1:0"));
    let stderr = cloud.refused(&guarded);
    assert!(stderr.contains("SANDBOX_DOCKERCLOUD_GUARD_URL"), "{stderr}");
    assert!(stderr.contains("connect transport"), "{stderr}");
    assert!(cloud.names().is_empty(), "{:?}", cloud.names());

    let mut d = cloud.daemon(&rest);
    assert_eq!(d.listening["isolation"], "vm", "{}", d.listening);
    assert!(cloud.names().is_empty(), "{:?}", cloud.sandboxes());
    let v = send(d.addr, &connect::call("Describe", &json!({}))).json();
    assert_ne!(
        v["supportsJavascriptGrants"], true,
        "grants are refused on REST: {v}"
    );
    for kind in ["javascriptEnvironment", "projectEnvironment"] {
        let max = v[kind]["maxTimeoutMs"].as_u64().unwrap_or(u64::MAX);
        assert!(max > 0 && max <= 270_000, "{kind}: {v}");
    }

    let v = answered(&d, &snippet("console.log(6*7); console.error('e')", 20_000));
    assert_eq!(field(&v["javascript"], "stdout"), "42\n", "{v}");
    assert_eq!(field(&v["javascript"], "stderr"), "e\n", "{v}");
    let state = cloud.admin_state();
    assert!(
        state["endpoint_credentials"].as_u64().unwrap_or(0) > 0,
        "runs use endpoint credentials: {state}"
    );
    let v = answered(&d, &snippet("for(;;){}", 2_000));
    assert_eq!(v["javascript"]["timedOut"], true, "{v}");

    let mut body = connect::project(
        &[
            ("main.js", "console.log(require('./lib/deep/answer.js'))"),
            ("lib/deep/answer.js", "module.exports = 42"),
        ],
        &["node main.js > out.txt", "cat out.txt && pwd"],
    );
    body["project"]["artifacts"] = json!(["out.txt", "absent.txt"]);
    body["timeoutMs"] = json!(60_000);
    let v = answered(&d, &body);
    assert_eq!(v["project"]["outcome"], "PROJECT_OUTCOME_COMPLETED", "{v}");
    assert_eq!(
        field(&v["project"]["steps"][1], "stdout"),
        "42\n/tmp/plimsoll-project\n",
        "{v}"
    );
    let artifacts = v["project"]["artifacts"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    assert_eq!(artifacts.len(), 1, "an absent artifact is left out: {v}");
    assert_eq!(field(&artifacts[0], "content"), "42\n", "{v}");
    cloud.wait_empty(Duration::from_secs(60));

    // The seal, read back through the REST API on every run.
    let code = "console.log('ran')";
    let cases = [
        (
            Faults {
                policy_not_deny_all: true,
                ..Faults::default()
            },
            "allowAll",
        ),
        (
            Faults {
                extra_allowed_network: Some("example.com:443".into()),
                ..Faults::default()
            },
            "example.com:443",
        ),
    ];
    for (faults, needle) in cases {
        cloud.faults(&faults);
        let err = refused_run(&d, &snippet(code, 10_000));
        assert_eq!(err.code, "failed_precondition", "{faults:?}: {err:?}");
        assert!(err.message.contains("nothing ran"), "{faults:?}: {err:?}");
        assert!(err.message.contains(needle), "{faults:?}: {err:?}");
        cloud.wait_empty(Duration::from_secs(60));
    }
    cloud.faults(&Faults {
        quota_reached: true,
        ..Faults::default()
    });
    let err = refused_run(&d, &snippet(code, 10_000));
    assert_eq!(err.code, "resource_exhausted", "{err:?}");

    // A delete that answers success yet keeps the sandbox is not believed.
    cloud.faults(&Faults {
        rest_delete_keeps_sandbox: true,
        ..Faults::default()
    });
    let v = answered(&d, &snippet(code, 10_000));
    assert_eq!(field(&v["javascript"], "stdout"), "ran\n", "{v}");
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while !d
        .logs()
        .iter()
        .any(|l| l.contains("answered, yet the sandbox is still there"))
    {
        assert!(
            std::time::Instant::now() < deadline,
            "no re-read after the delete:\n{}",
            d.logs().join("\n")
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    assert_eq!(cloud.names().len(), 1, "{:?}", cloud.sandboxes());
    cloud.faults(&Faults::default());
    cloud.wait_empty(Duration::from_secs(30));
    assert!(d.sigterm().success(), "{}", d.logs().join("\n"));
}
