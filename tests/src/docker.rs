//! What every docker suite needs from its environment: the runtime under test (from
//! `PLIMSOLL_TEST_DOCKER_RUNTIME`, `runc` by default, or `runsc`), the tier it must prove,
//! and whether docker and the guest images are here. Missing ones fail the test unless the
//! developer opted out with `PLIMSOLL_TEST_DOCKER_SKIP=1` (CI never does).

use std::process::Command;

/// The snippet image `images/build` makes.
pub const SNIPPET_IMAGE: &str = "plimsoll/sandbox-node:latest";
/// The project (and session) image `images/build` makes.
pub const PROJECT_IMAGE: &str = "plimsoll/sandbox:latest";

/// `runc` or `runsc`, from `PLIMSOLL_TEST_DOCKER_RUNTIME`.
pub fn runtime() -> &'static str {
    match std::env::var("PLIMSOLL_TEST_DOCKER_RUNTIME").as_deref() {
        Ok("") | Ok("runc") | Err(_) => "runc",
        Ok("runsc") => "runsc",
        Ok(other) => panic!("PLIMSOLL_TEST_DOCKER_RUNTIME={other:?}: use runc or runsc"),
    }
}

/// Whether the runtime under test is gVisor's.
pub fn runsc() -> bool {
    runtime() == "runsc"
}

/// The tier the runtime must prove.
pub fn tier() -> &'static str {
    if runsc() { "kernel" } else { "container" }
}

/// Runs the docker CLI; whether it succeeded, and its stdout (trimmed) then stderr.
pub fn docker(args: &[&str]) -> (bool, String) {
    match Command::new("docker").args(args).output() {
        Ok(out) => (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).trim().to_owned()
                + &String::from_utf8_lossy(&out.stderr),
        ),
        Err(e) => (false, e.to_string()),
    }
}

/// Whether the docker tests can run: docker answers and both images are here. Otherwise it
/// panics, unless `PLIMSOLL_TEST_DOCKER_SKIP=1`, when it says why and answers `false`.
pub fn docker_ready() -> bool {
    let problem = match docker(&["version", "--format", "{{.Server.Version}}"]) {
        (false, why) => Some(format!(
            "docker does not answer ({why}); run scripts/setup-docker"
        )),
        _ => [SNIPPET_IMAGE, PROJECT_IMAGE]
            .into_iter()
            .find(|i| !docker(&["image", "inspect", i]).0)
            .map(|i| format!("image {i} is missing; run images/build")),
    };
    let Some(problem) = problem else { return true };
    if std::env::var("PLIMSOLL_TEST_DOCKER_SKIP").as_deref() == Ok("1") {
        eprintln!("PLIMSOLL_TEST_DOCKER_SKIP=1: skipping a docker test: {problem}");
        return false;
    }
    panic!(
        "{problem} (set PLIMSOLL_TEST_DOCKER_SKIP=1 to skip the docker tests on a developer machine)"
    );
}
