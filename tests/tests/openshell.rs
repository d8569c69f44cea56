//! The openshell provider end to end (grants.md §8, issue 17): a real `plimsolld` with
//! `SANDBOX_PROVIDER=openshell` against the gateway simulator (`tests/simulators/openshell`,
//! checked by OpenShell's own published client), its sandboxes backed by local containers
//! under the runtime `PLIMSOLL_TEST_DOCKER_RUNTIME` names (`runc` or `runsc`).
//!
//! No OpenShell gateway can be reached here: this suite is the provider's proof, and every
//! refusal in it is driven by a simulator fault (docs/openshell-simulator.md). Docker, the
//! project image (with the relay) and the built simulator are required: missing ones fail
//! every test unless `PLIMSOLL_TEST_DOCKER_SKIP=1`.
// A test fails by panicking, with the evidence in the message.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use openshell_simulator::{ConfigFault, Faults, GatewayInfoError, ReadbackFault};
use plimsoll_tests::Daemon;
use plimsoll_tests::connect;
use plimsoll_tests::connect::ConnectError;
use plimsoll_tests::docker::docker_ready;
use plimsoll_tests::http1::{Connection, Request};
use plimsoll_tests::openshell::Gateway;
use plimsoll_tests::sim::{field, refused_run, send, snippet};
use serde_json::{Value, json};

#[path = "support/endings.rs"]
mod endings;
#[path = "support/verified.rs"]
mod verified;

macro_rules! require_docker {
    () => {
        if !docker_ready() {
            return;
        }
    };
}

// === calls ===

/// Runs `body`, expects an answer at tier `container`, and verifies its record the way a
/// client does.
fn answered(d: &Daemon, body: &Value) -> Value {
    verified::answered_at(d, body, "container")
}

// === tests ===

/// The happy path: the tier, `Describe` with the policy digest, snippets and projects with
/// verified records, the deadline by cancelling the exec stream, a sandbox lost mid-step,
/// and nothing left behind.
#[test]
fn snippets_and_projects_run_in_verified_sandboxes_at_tier_container() {
    require_docker!();
    let gw = Gateway::start();
    let mut d = gw.daemon(&[]);
    assert_eq!(d.listening["isolation"], "container", "{}", d.listening);

    let v = send(d.addr, &connect::call("Describe", &json!({}))).json();
    assert_eq!(v["sandbox"], "openshell", "{v}");
    assert_eq!(v["isolation"], "container", "{v}");
    let policy = v["policy"].as_str().unwrap_or_default().to_owned();
    let hash = policy
        .strip_prefix("openshell-policy:sha256:")
        .unwrap_or_else(|| panic!("Describe states the policy digest: {v}"));
    assert!(
        hash.len() == 64 && hash.bytes().all(|b| b.is_ascii_hexdigit()),
        "{policy}"
    );
    assert_eq!(v["supportsProject"], true, "{v}");
    assert_eq!(v["projectEnvironment"]["languages"][0], "javascript", "{v}");

    let v = answered(
        &d,
        &snippet("console.log(6*7); console.error('to stderr')", 20_000),
    );
    let js = &v["javascript"];
    assert_eq!(field(js, "stdout"), "42\n", "{v}");
    assert_eq!(field(js, "stderr"), "to stderr\n", "{v}");
    assert_eq!(js["exitCode"].as_i64().unwrap_or(0), 0, "{v}");
    let instance = v["instance"].as_str().unwrap_or_default().to_owned();
    assert!(
        instance.starts_with("openshell-sandbox:"),
        "typed instance: {v}"
    );
    assert_eq!(v["record"]["instance"], instance, "{v}");
    assert_eq!(
        v["record"]["policy"], policy,
        "the record states the policy: {v}"
    );
    assert!(
        v["record"]["environment"]
            .as_str()
            .unwrap_or_default()
            .starts_with("openshell-image:"),
        "{v}"
    );

    // A fresh sandbox each run: nothing of the last one is seen.
    let v = answered(
        &d,
        &snippet(
            "require('fs').writeFileSync('/tmp/mark', 'x'); console.log(require('fs').readdirSync('/tmp').join(','))",
            20_000,
        ),
    );
    assert_eq!(field(&v["javascript"], "stdout"), "mark\n", "{v}");
    assert_ne!(v["instance"], instance.as_str());

    endings::snippet_and_project_endings(&d, "container", "/tmp/work");

    endings::a_sandbox_lost_mid_step(&d, "container", "/tmp/work", || {
        gw.sandboxes()
            .iter()
            .filter_map(|s| s["container"].as_str().map(str::to_owned))
            .collect()
    });

    // Deletion runs in the background: the gateway ends empty once the runs are answered.
    gw.wait_empty(Duration::from_secs(60));
    assert!(d.sigterm().success(), "{}", d.logs().join("\n"));
    assert!(gw.sandboxes().is_empty());
}

/// A `/readyz` flood costs at most one `GetGatewayInfo` per 5 s, and a gateway that starts
/// refusing (PermissionDenied, Unauthenticated, a second driver) makes the daemon not ready
/// and refuse runs before any sandbox is made.
#[test]
fn readiness_is_cached_and_a_gateway_gone_bad_stops_runs() {
    require_docker!();
    let gw = Gateway::start();
    let d = gw.daemon(&[]);
    let before = gw.count("gateway_info_calls");
    let flood_started = Instant::now();
    let mut answers = 0;
    while flood_started.elapsed() < Duration::from_secs(3) {
        let resp = Request::get("/readyz").send(d.addr);
        assert_eq!(resp.status, 200, "{resp}");
        answers += 1;
    }
    let elapsed = flood_started.elapsed();
    let calls = gw.count("gateway_info_calls") - before;
    let allowed = elapsed.as_secs() / 5 + 2;
    assert!(answers > 50, "the flood was too small to judge: {answers}");
    assert!(
        calls <= allowed,
        "{answers} /readyz answers in {elapsed:?} cost {calls} GetGatewayInfo calls (at most {allowed})"
    );

    for (name, faults) in [
        (
            "permission_denied",
            Faults {
                gateway_info_error: Some(GatewayInfoError::PermissionDenied),
                ..Faults::default()
            },
        ),
        (
            "unauthenticated",
            Faults {
                gateway_info_error: Some(GatewayInfoError::Unauthenticated),
                ..Faults::default()
            },
        ),
        (
            "second driver",
            Faults {
                second_compute_driver: true,
                ..Faults::default()
            },
        ),
    ] {
        gw.faults(faults);
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if Request::get("/readyz").send(d.addr).status != 200 {
                break;
            }
            assert!(Instant::now() < deadline, "{name}: still ready");
            std::thread::sleep(Duration::from_millis(250));
        }
        let execs = gw.count("execs_started");
        let err = refused_run(&d, &snippet("console.log(1)", 10_000));
        assert_eq!(err.code, "failed_precondition", "{name}: {err:?}");
        assert_eq!(gw.count("execs_started"), execs, "{name}: code ran");
        assert!(gw.sandboxes().is_empty(), "{name}: a sandbox was made");
        gw.faults(Faults::default());
        let deadline = Instant::now() + Duration::from_secs(20);
        while Request::get("/readyz").send(d.addr).status != 200 {
            assert!(Instant::now() < deadline, "{name}: not ready again");
            std::thread::sleep(Duration::from_millis(250));
        }
    }
    let v = answered(&d, &snippet("console.log('back')", 20_000));
    assert_eq!(field(&v["javascript"], "stdout"), "back\n", "{v}");
}

/// Every read-back fault (one per checked field of the sandbox, and each way
/// `GetSandboxConfig` can differ) refuses the run before any code runs in the sandbox, and
/// the sandbox is deleted.
#[test]
fn every_read_back_fault_refuses_before_code_runs() {
    require_docker!();
    let gw = Gateway::start();
    let d = gw.daemon(&[]);
    let readback = [
        ReadbackFault::Labels,
        ReadbackFault::Image,
        ReadbackFault::Resources,
        ReadbackFault::Policy,
        ReadbackFault::Providers,
        ReadbackFault::DriverConfig,
        ReadbackFault::Command,
        ReadbackFault::AgentSocket,
        ReadbackFault::SpecEnvironment,
        ReadbackFault::TemplateEnvironment,
        ReadbackFault::RuntimeClassName,
        ReadbackFault::UserNamespaces,
        ReadbackFault::TemplateLabels,
        ReadbackFault::TemplateAnnotations,
    ];
    let config = [
        ConfigFault::PolicyHash,
        ConfigFault::Policy,
        ConfigFault::PolicySource,
        ConfigFault::NotAdmitted,
        ConfigFault::ProposalsEnabled,
        ConfigFault::ProposalsMissing,
        ConfigFault::ProposalsWrongType,
    ];
    let cases = readback
        .iter()
        .map(|f| {
            (
                format!("{f:?}"),
                Faults {
                    readback: vec![*f],
                    ..Faults::default()
                },
            )
        })
        .chain(config.iter().map(|f| {
            (
                format!("config {f:?}"),
                Faults {
                    config: vec![*f],
                    ..Faults::default()
                },
            )
        }));
    for (name, faults) in cases {
        gw.faults(faults);
        let execs = gw.count("execs_started");
        let err = refused_run(&d, &snippet("console.log('ran')", 10_000));
        assert_eq!(err.code, "failed_precondition", "{name}: {err:?}");
        assert!(
            err.message.contains("nothing ran"),
            "{name}: the refusal says nothing ran: {err:?}"
        );
        assert_eq!(gw.count("execs_started"), execs, "{name}: code ran");
        gw.faults(Faults::default());
        gw.wait_empty(Duration::from_secs(30));
    }
    let body = connect::project(&[], &["echo fine"]);
    gw.faults(Faults {
        readback: vec![ReadbackFault::Image],
        ..Faults::default()
    });
    let execs = gw.count("execs_started");
    let err = refused_run(&d, &body);
    assert_eq!(err.code, "failed_precondition", "project: {err:?}");
    assert_eq!(gw.count("execs_started"), execs, "project: code ran");
}

/// A gateway the daemon cannot trust at startup is refused: a second compute driver, a
/// driver check that answers PermissionDenied or Unauthenticated, a policy hash that
/// differs. Nothing is served.
#[test]
fn startup_refuses_a_gateway_it_cannot_trust() {
    require_docker!();
    let gw = Gateway::start();
    for (name, faults, says) in [
        (
            "second driver",
            Faults {
                second_compute_driver: true,
                ..Faults::default()
            },
            "driver",
        ),
        (
            "permission denied",
            Faults {
                gateway_info_error: Some(GatewayInfoError::PermissionDenied),
                ..Faults::default()
            },
            "PermissionDenied",
        ),
        (
            "unauthenticated",
            Faults {
                gateway_info_error: Some(GatewayInfoError::Unauthenticated),
                ..Faults::default()
            },
            "Unauthenticated",
        ),
        (
            "policy hash",
            Faults {
                config: vec![ConfigFault::PolicyHash],
                ..Faults::default()
            },
            "policy",
        ),
    ] {
        gw.faults(faults);
        let log = gw.refused(&[]);
        assert!(
            log.to_lowercase().contains(&says.to_lowercase()),
            "{name}: the log names why ({says}):\n{log}"
        );
    }
    gw.faults(Faults::default());
    gw.wait_empty(Duration::from_secs(60));
    // A setting missing is named before anything is dialled.
    let log = gw.refused(&[("SANDBOX_OPENSHELL_IMAGE", "")]);
    assert!(log.contains("SANDBOX_OPENSHELL_IMAGE"), "{log}");
}

/// What a killed daemon left is deleted by the next daemon only once the gateway's clock
/// (not the host's) says its lifetime and 5 minutes have passed.
#[test]
fn orphans_are_swept_on_the_gateways_clock() {
    require_docker!();
    let gw = Gateway::start();
    let first = gw.daemon(&[]);
    gw.wait_empty(Duration::from_secs(60));
    let addr = first.addr;
    let runner = std::thread::spawn(move || {
        // Answered or cut off when the daemon is killed; either way ignored.
        let mut conn = Connection::open(addr);
        conn.set_read_timeout(Duration::from_secs(60));
        let body = snippet("setTimeout(() => {}, 50000)", 30_000);
        let _ = conn.send(&connect::call("Run", &body).to_bytes(addr));
        let _ = conn.read_response(false);
    });
    let deadline = Instant::now() + Duration::from_secs(60);
    while gw.count("execs_started") == 0 || gw.sandboxes().is_empty() {
        assert!(Instant::now() < deadline, "the run never started");
        std::thread::sleep(Duration::from_millis(100));
    }
    let orphan = gw.sandboxes()[0]["name"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    kill9(first);
    let _ = runner.join();

    // On the host's clock the orphan is young: the next daemon keeps it.
    let second = gw.daemon(&[]);
    std::thread::sleep(Duration::from_secs(2));
    let names: Vec<Value> = gw.sandboxes().iter().map(|s| s["name"].clone()).collect();
    assert!(
        names.contains(&json!(orphan)),
        "a young orphan of another daemon was deleted: {names:?}"
    );
    drop(second);

    // The gateway's clock two hours ahead: the next daemon measures the skew at its own
    // creates and deletes the orphan.
    gw.faults(Faults {
        clock_skew_ms: 2 * 3600 * 1000,
        ..Faults::default()
    });
    let third = gw.daemon(&[]);
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let names: Vec<Value> = gw.sandboxes().iter().map(|s| s["name"].clone()).collect();
        if !names.contains(&json!(orphan)) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the expired orphan {orphan} was not swept: {names:?}\n{}",
            third.logs().join("\n")
        );
        std::thread::sleep(Duration::from_millis(250));
    }
    drop(third);
    gw.wait_empty(Duration::from_secs(60));
}

fn kill9(d: Daemon) {
    let pid =
        rustix::process::Pid::from_raw(i32::try_from(d.pid()).expect("pid")).expect("a live pid");
    rustix::process::kill_process(pid, rustix::process::Signal::KILL).expect("SIGKILL");
    // Drop reaps the killed process (SIGTERM to a dead child is a no-op).
    drop(d);
}

/// SIGTERM drains: the run in flight gets its answer, and the daemon exits only once its
/// sandboxes are deleted.
#[test]
fn sigterm_lets_the_run_in_flight_finish_and_deletes_its_sandbox() {
    require_docker!();
    let gw = Gateway::start();
    let mut d = gw.daemon(&[]);
    gw.wait_empty(Duration::from_secs(60));
    let addr = d.addr;
    let execs = gw.count("execs_started");
    let runner = std::thread::spawn(move || {
        let body = snippet("setTimeout(() => console.log('done'), 3000)", 20_000);
        send(addr, &connect::call("Run", &body))
    });
    let deadline = Instant::now() + Duration::from_secs(60);
    while gw.count("execs_started") == execs {
        assert!(Instant::now() < deadline, "the run never started");
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(d.sigterm().success(), "{}", d.logs().join("\n"));
    let resp = runner.join().expect("the run's thread");
    assert_eq!(resp.status, 200, "{resp}");
    assert_eq!(
        field(&resp.json()["javascript"], "stdout"),
        "done\n",
        "{resp}"
    );
    assert!(
        gw.sandboxes().is_empty(),
        "the daemon exited with sandboxes left: {:?}",
        gw.sandboxes()
    );
}

/// Deletion runs in the background with the run's admission slot held: while the gateway
/// keeps a delete ACCEPTED (the sandbox DELETING), a daemon with one slot sheds the next
/// run; once the delete finishes, the slot comes back.
#[test]
fn a_slot_comes_back_only_once_the_gateway_deleted_the_sandbox() {
    require_docker!();
    let gw = Gateway::start();
    let d = gw.daemon(&[("SANDBOX_MAX_CONCURRENT", "1")]);
    gw.wait_empty(Duration::from_secs(60));
    gw.faults(Faults {
        delete_stays_accepted: true,
        ..Faults::default()
    });
    let v = answered(&d, &snippet("console.log(1)", 20_000));
    assert_eq!(field(&v["javascript"], "stdout"), "1\n", "{v}");
    let resp = send(
        d.addr,
        &connect::call("Run", &snippet("console.log(2)", 20_000)),
    );
    assert_eq!(
        resp.status, 429,
        "the slot must stay held while the sandbox is DELETING: {resp}"
    );
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let phases: Vec<Value> = gw.sandboxes().iter().map(|s| s["phase"].clone()).collect();
        if phases == [json!("SANDBOX_PHASE_DELETING")] {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "not one DELETING sandbox: {phases:?}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    gw.faults(Faults::default());
    gw.wait_empty(Duration::from_secs(30));
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let resp = send(
            d.addr,
            &connect::call("Run", &snippet("console.log(3)", 20_000)),
        );
        if resp.status == 200 {
            break;
        }
        assert_eq!(resp.status, 429, "{resp}");
        assert!(Instant::now() < deadline, "the slot never came back");
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// A sandbox that dies under the code gives a typed error at once (never a made-up result
/// or a hang), the dead sandbox is deleted, and the next run is served.
#[test]
fn a_sandbox_that_dies_mid_run_is_an_error_and_the_daemon_serves_on() {
    require_docker!();
    let gw = Gateway::start();
    let d = gw.daemon(&[]);
    gw.wait_empty(Duration::from_secs(60));
    gw.faults(Faults {
        die_after_exec_start_ms: Some(500),
        ..Faults::default()
    });
    let started = Instant::now();
    let resp = send(
        d.addr,
        &connect::call(
            "Run",
            &snippet("setTimeout(() => console.log('late'), 8000)", 20_000),
        ),
    );
    assert_ne!(resp.status, 200, "a dead sandbox gave a result: {resp}");
    let err = ConnectError::of(&resp);
    assert!(
        err.code == "unavailable" || err.code == "internal",
        "{err:?}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(8),
        "the answer waited for the deadline: {:?}",
        started.elapsed()
    );
    gw.faults(Faults::default());
    gw.wait_empty(Duration::from_secs(60));
    let v = answered(&d, &snippet("console.log('next')", 20_000));
    assert_eq!(field(&v["javascript"], "stdout"), "next\n", "{v}");
}
