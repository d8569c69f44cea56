//! The tier, `Describe` and what a snippet's answer carries.

use super::*;

#[test]
fn the_daemon_proves_the_runtimes_tier_and_describes_it() {
    require_docker!();
    let d = shared();
    assert_eq!(d.listening["isolation"], tier(), "{}", d.listening);
    let resp = send(d.addr, &connect::call("Describe", &json!({})));
    assert_eq!(resp.status, 200, "{resp}");
    let v = resp.json();
    assert_eq!(v["sandbox"], "docker");
    assert_eq!(v["isolation"], tier());
    let js = &v["javascriptEnvironment"];
    assert_eq!(js["identity"], image_id(snippet_image()), "{v}");
    assert_eq!(js["maxTimeoutMs"], 30_000, "{v}");
    assert_eq!(
        v["projectEnvironment"]["identity"],
        image_id(project_image()),
        "{v}"
    );
    let proof = d
        .log_records()
        .into_iter()
        .find(|r| r["msg"] == "sandbox provider ready")
        .expect("ready line");
    let evidence = proof["evidence"].as_str().unwrap_or_default();
    if runsc() {
        assert!(
            evidence.contains("runtime runsc registered at /usr/bin/runsc"),
            "{evidence}"
        );
    } else {
        let warned = d
            .logs()
            .iter()
            .any(|l| l.contains("NOT a hostile-code boundary"));
        assert!(
            warned,
            "runc must log the loud warning:\n{}",
            d.logs().join("\n")
        );
    }
}

#[test]
fn a_snippet_answers_with_its_output_environment_and_instance() {
    require_docker!();
    let d = shared();
    let ran = run(&d, "console.log(6*7); console.error('to stderr')", 10_000);
    assert_eq!(
        (ran.stdout.as_str(), ran.stderr.as_str(), ran.exit_code),
        ("42\n", "to stderr\n", 0)
    );
    let record = &ran.resp["record"];
    assert_eq!(ran.resp["isolation"], tier());
    assert_eq!(record["environment"], image_id(snippet_image()));
    let instance = ran.resp["instance"].as_str().unwrap_or_default();
    let id = instance
        .strip_prefix("docker-container:")
        .expect("typed instance");
    assert!(
        id.len() == 64 && id.bytes().all(|b| b.is_ascii_hexdigit()),
        "{instance}"
    );
    assert_eq!(record["instance"], instance);
    // The next run gets another container, one that has run nothing before.
    let next = run(
        &d,
        "console.log(JSON.stringify(require('fs').readdirSync('/tmp')))",
        10_000,
    );
    assert_eq!(next.stdout, "[]\n", "{next:?}");
    assert_ne!(next.resp["instance"], instance);
}

#[test]
fn a_non_zero_exit_is_a_result_and_the_environment_is_explicit() {
    require_docker!();
    let d = shared();
    let ran = run(
        &d,
        "console.log(JSON.stringify({home: process.env.HOME, keys: Object.keys(process.env).sort(), uid: process.getuid()})); process.exit(3)",
        10_000,
    );
    assert_eq!(ran.exit_code, 3, "{ran:?}");
    let r = ran.report();
    assert_eq!(r["home"], "/");
    assert_eq!(r["uid"], 61_000);
    assert_eq!(
        r["keys"],
        json!(["HOME", "HOSTNAME", "PATH"]),
        "only the explicit environment: {r}"
    );
}

#[test]
fn the_deadline_ends_a_run_with_exit_124() {
    require_docker!();
    let d = shared();
    let started = Instant::now();
    let ran = run(&d, "console.log('before'); while (true) {}", 1500);
    assert_eq!((ran.exit_code, ran.timed_out), (124, true), "{ran:?}");
    assert_eq!(ran.stdout, "before\n");
    assert!(
        started.elapsed() < Duration::from_secs(20),
        "{:?}",
        started.elapsed()
    );
}

#[test]
fn output_is_capped_at_64_kib_per_stream_with_flags() {
    require_docker!();
    let d = shared();
    let ran = run(
        &d,
        "process.stdout.write('o'.repeat(100000)); process.stderr.write('e'.repeat(70000));",
        10_000,
    );
    assert_eq!(ran.exit_code, 0, "{ran:?}");
    assert_eq!(
        (ran.stdout.len(), ran.stderr.len()),
        (OUTPUT_CAP, OUTPUT_CAP)
    );
    assert_eq!(ran.result()["stdoutTruncated"], true);
    assert_eq!(ran.result()["stderrTruncated"], true);
    let small = run(&d, "process.stdout.write('x'.repeat(65536))", 10_000);
    assert_eq!(small.stdout.len(), OUTPUT_CAP);
    assert!(
        small.result()["stdoutTruncated"].is_null(),
        "exactly the cap is not truncated"
    );
}
