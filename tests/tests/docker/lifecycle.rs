//! Startup (proof, floors, refusals), readiness, orphans and cleanup.

use super::*;

#[test]
fn after_runs_and_a_timeout_nothing_is_left_and_the_daemon_stays_healthy() {
    require_docker!();
    let mut d = Daemon::start(&env_with(&[]));
    let me = instance(&d);
    assert_eq!(run(&d, "console.log(1)", 10_000).stdout, "1\n");
    assert_eq!(run(&d, "while (true) {}", 1000).exit_code, 124);
    assert_eq!(run(&d, "process.exit(9)", 10_000).exit_code, 9);
    let resp = Request::get("/readyz").send(d.addr);
    assert_eq!(
        (resp.status, resp.body.as_slice()),
        (200, &b"ready\n"[..]),
        "{resp}"
    );
    assert_eq!(Request::get("/healthz").send(d.addr).status, 200);
    // While serving, only the next snippet's container waits: created, never started.
    let started =
        |id: &String| docker(&["inspect", "--format", "{{.State.Status}}", id]).1 != "created";
    let deadline = Instant::now() + Duration::from_secs(30);
    while containers_of(&me).iter().any(started) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(200));
    }
    let left = containers_of(&me);
    assert!(left.len() <= 1, "containers left while serving: {left:?}");
    assert!(
        !left.iter().any(started),
        "a run's container outlived its run: {left:?}"
    );
    assert!(d.sigterm().success(), "{}", d.logs().join("\n"));
    assert_eq!(
        containers_of(&me),
        Vec::<String>::new(),
        "containers left after the drain"
    );
}

#[test]
fn orphans_of_this_machine_are_swept_at_startup() {
    require_docker!();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let create = |expires: u64| {
        let (ok, id) = docker(&[
            "create",
            "--label",
            &format!("io.plimsoll.expires={expires}"),
            "--label",
            "io.plimsoll.instance=0000000000000000",
            "--network",
            "none",
            snippet_image(),
        ]);
        assert!(ok, "{id}");
        id
    };
    let expired = create(now - 600);
    let fresh = create(now + 600);
    let d = Daemon::start(&env_with(&[]));
    let exists = |id: &str| docker(&["inspect", id]).0;
    assert!(
        !exists(&expired),
        "an expired orphan survived the startup sweep:\n{}",
        d.logs().join("\n")
    );
    assert!(
        exists(&fresh),
        "another instance's live container was removed"
    );
    docker(&["rm", "-f", &fresh]);
    stop(d);
}

#[test]
fn the_runtimes_tier_meets_its_floor_and_nothing_above() {
    require_docker!();
    if runsc() {
        let d = Daemon::start(&env_with(&[("SANDBOX_MIN_ISOLATION", "kernel")]));
        assert_eq!(d.listening["isolation"], "kernel");
        stop(d);
        let refused = Daemon::refuse(&env_with(&[("SANDBOX_MIN_ISOLATION", "vm")]));
        assert!(
            refused
                .stderr
                .contains("SANDBOX_MIN_ISOLATION is vm, the provider proved kernel"),
            "{}",
            refused.stderr
        );
    } else {
        let refused = Daemon::refuse(&env_with(&[("SANDBOX_MIN_ISOLATION", "kernel")]));
        assert_eq!(refused.code(), 1);
        assert!(
            refused
                .stderr
                .contains("SANDBOX_MIN_ISOLATION is kernel, the provider proved container"),
            "{}",
            refused.stderr
        );
    }
    // A floor above the tier in a request is refused, marked not dispatched.
    let d = shared();
    let body = json!({ "protocol": connect::PROTOCOL, "minimumIsolation": "vm", "javascript": { "code": "console.log(1)" } });
    let req = connect::call("Run", &body);
    let resp = send(d.addr, &req);
    connect::assert_refused(
        &resp,
        &req,
        "failed_precondition",
        connect::Reason::Isolation,
    );
}

#[test]
fn startup_refuses_what_it_cannot_prove() {
    require_docker!();
    for (env, needle) in [
        (
            vec![("SANDBOX_DOCKER_RUNTIME", "plimsoll-no-such-runtime")],
            "is not registered with docker",
        ),
        (
            vec![("SANDBOX_DOCKER_IMAGE", "plimsoll/no-such-image:1")],
            "is not available on the docker daemon",
        ),
        (
            vec![("DOCKER_HOST", "tcp://127.0.0.1:2375")],
            "a remote docker endpoint is refused",
        ),
        (
            vec![("DOCKER_HOST", "unix:///nonexistent/docker.sock")],
            "cannot connect to docker",
        ),
        (
            vec![("SANDBOX_DOCKER_SECCOMP", "/nonexistent/profile.json")],
            "/nonexistent/profile.json",
        ),
        (
            vec![("SANDBOX_DISK_MB", "20")],
            "cannot hold /tmp, /dev/shm and /work",
        ),
    ] {
        let refused = Daemon::refuse(&env_with(&env));
        assert_eq!(refused.code(), 1, "{env:?}");
        assert!(
            refused.stderr.contains(needle),
            "{env:?}: expected {needle:?} in:\n{}",
            refused.stderr
        );
    }
}

#[test]
fn a_moved_image_tag_makes_the_daemon_not_ready_until_restart() {
    require_docker!();
    let tag = format!("plimsoll/test-moving:{}", std::process::id());
    assert!(docker(&["tag", snippet_image(), &tag]).0);
    let d = Daemon::start(&env_with(&[("SANDBOX_DOCKER_IMAGE", &tag)]));
    assert_eq!(run(&d, "console.log(1)", 10_000).exit_code, 0);
    assert!(docker(&["tag", project_image(), &tag]).0);
    // Past the 5 s preflight cache.
    std::thread::sleep(Duration::from_secs(6));
    let ready = Request::get("/readyz").send(d.addr);
    let body = connect::javascript("console.log(1)");
    let req = connect::call("Run", &body);
    let refused = send(d.addr, &req);
    docker(&["rmi", &tag]);
    stop(d);
    assert_eq!(ready.status, 503, "{ready}");
    connect::assert_refused(
        &refused,
        &req,
        "failed_precondition",
        connect::Reason::Environment,
    );
    assert!(
        refused.text().contains("restart plimsolld to prove it"),
        "{refused}"
    );
}

#[test]
fn the_shipped_seccomp_profile_denies_namespaces_mounts_keys_and_ptrace_under_runc() {
    require_docker!();
    let profile = concat!(env!("CARGO_MANIFEST_DIR"), "/../seccomp/profile.json");
    // The project image, so the snippet (node) can also start python for raw syscalls.
    let d = Daemon::start(&env_with(&[
        ("SANDBOX_DOCKER_SECCOMP", profile),
        ("SANDBOX_DOCKER_IMAGE", project_image()),
    ]));
    let python = "import ctypes, os, json
libc = ctypes.CDLL(None, use_errno=True)
def call(nr, *args):
    r = libc.syscall(nr, *[ctypes.c_long(a) for a in args])
    return 'ok' if r >= 0 else os.strerror(ctypes.get_errno())
print(json.dumps({'unshare': call(272, 0x10000000), 'mount': call(165, 0, 0, 0, 0, 0), 'keyctl': call(250, 0, 0, 0, 0, 0), 'ptrace': call(101, 0, 0, 0, 0), 'python': 'ran'}))";
    let code = format!(
        "const r = JSON.parse(require('child_process').execFileSync('python3', ['-c', {}]).toString()); r.node = 'ran'; console.log(JSON.stringify(r));",
        serde_json::to_string(python).unwrap()
    );
    let r = report(&d, &code, 20_000);
    let ignored = d.logs().iter().any(|l| l.contains("ignored under runsc"));
    stop(d);
    assert_eq!(
        (r["node"].as_str(), r["python"].as_str()),
        (Some("ran"), Some("ran")),
        "{r}"
    );
    if runsc() {
        // gVisor answers syscalls itself and docker does not send the profile.
        assert!(ignored, "runsc must log that the profile is ignored");
        return;
    }
    for call in ["unshare", "mount", "keyctl", "ptrace"] {
        assert_eq!(
            r[call], "Operation not permitted",
            "{call} must be denied: {r}"
        );
    }
}

#[test]
fn images_pinned_by_content_id_serve_and_tags_are_refused_when_pinning_is_required() {
    require_docker!();
    let (snippet, project) = (image_id(snippet_image()), image_id(project_image()));
    let d = Daemon::start(&env_with(&[
        ("SANDBOX_REQUIRE_PINNED_IMAGES", "1"),
        ("SANDBOX_DOCKER_IMAGE", &snippet),
        ("SANDBOX_DOCKER_PROJECT_IMAGE", &project),
    ]));
    let ran = run(&d, "console.log('pinned')", 10_000);
    assert_eq!(ran.stdout, "pinned\n");
    assert_eq!(ran.resp["record"]["environment"], snippet.as_str());
    stop(d);
    let refused = Daemon::refuse(&env_with(&[("SANDBOX_REQUIRE_PINNED_IMAGES", "1")]));
    assert!(
        refused.stderr.contains("must be pinned"),
        "{}",
        refused.stderr
    );
}

/// providers.md §10.1: a run's admission slot is released when its sandbox is
/// gone, not when its call returns. With the cap at one, whenever the daemon
/// admits the next run, the previous run's container no longer exists.
#[test]
fn a_slot_comes_back_only_once_its_container_is_removed() {
    require_docker!();
    let d = Daemon::start(&env_with(&[("SANDBOX_MAX_CONCURRENT", "1")]));
    let mut admitted = 0;
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut previous: Option<String> = None;
    while admitted < 4 && Instant::now() < deadline {
        let body = json!({ "protocol": connect::PROTOCOL, "timeoutMs": 10_000,
                           "javascript": { "code": "console.log(1)" } });
        let resp = send(d.addr, &connect::call("Run", &body));
        if resp.status == 429 {
            // Refused while the previous container is still being removed: fine.
            std::thread::sleep(Duration::from_millis(20));
            continue;
        }
        assert_eq!(resp.status, 200, "{resp}");
        if let Some(id) = previous.take() {
            // This run was admitted, so the previous run's slot was free: its
            // container must be gone already.
            let (exists, out) = docker(&["inspect", "--format", "{{.Id}}", &id]);
            assert!(
                !exists,
                "container {id} still existed when its slot was reused: {out}"
            );
        }
        let v = resp.json();
        let instance = v["instance"].as_str().unwrap_or_default().to_owned();
        let id = instance
            .strip_prefix("docker-container:")
            .unwrap_or_else(|| panic!("instance {instance:?} names no container"))
            .to_owned();
        previous = Some(id);
        admitted += 1;
    }
    assert_eq!(admitted, 4, "four runs should be admitted within the bound");
    stop(d);
}
