//! What every docker suite needs from its environment: the runtime under test (from
//! `PLIMSOLL_TEST_DOCKER_RUNTIME`, `runc` by default, or `runsc`), the tier it must prove,
//! the guest images, and whether docker and the images are here. Missing ones fail the test
//! unless the developer opted out with `PLIMSOLL_TEST_DOCKER_SKIP=1` (CI never does).
//!
//! The images are the ones `images/build` tags under `PLIMSOLL_IMAGE_PREFIX` (default
//! `plimsoll`: `plimsoll/sandbox-node:latest` and `plimsoll/sandbox:latest`), the same
//! variable the build reads, so images built beside the default ones are tested with one
//! setting. [`crate::Daemon`] hands them to every docker daemon that names no image itself.

use std::process::Command;
use std::sync::LazyLock;

/// The image prefix, from `PLIMSOLL_IMAGE_PREFIX`.
fn prefix() -> String {
    match std::env::var("PLIMSOLL_IMAGE_PREFIX") {
        Ok(p) if !p.is_empty() => p,
        _ => "plimsoll".to_owned(),
    }
}

static SNIPPET: LazyLock<String> = LazyLock::new(|| format!("{}/sandbox-node:latest", prefix()));
static PROJECT: LazyLock<String> = LazyLock::new(|| format!("{}/sandbox:latest", prefix()));
static MODULE: LazyLock<String> = LazyLock::new(|| format!("{}/sandbox-module:latest", prefix()));

/// The snippet image `images/build` makes.
pub fn snippet_image() -> &'static str {
    &SNIPPET
}

/// The project (and session) image `images/build` makes.
pub fn project_image() -> &'static str {
    &PROJECT
}

/// The module image `images/build` makes (images/module/build).
pub fn module_image() -> &'static str {
    &MODULE
}

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
        _ => [snippet_image(), project_image()]
            .into_iter()
            .find(|i| !docker(&["image", "inspect", i]).0)
            .map(|i| format!("image {i} is missing; run images/build")),
    };
    match problem {
        None => true,
        Some(problem) => skip_or_fail(&problem),
    }
}

/// Whether `image` (one a suite needs beyond the two of [`docker_ready`]) is here, with the
/// same rule: missing, it panics naming `build` as the fix, unless `PLIMSOLL_TEST_DOCKER_SKIP=1`.
pub fn image_ready(image: &str, build: &str) -> bool {
    docker(&["image", "inspect", image]).0
        || skip_or_fail(&format!("image {image} is missing; run {build}"))
}

/// Whether the module image is here (see [`image_ready`]).
pub fn module_image_ready() -> bool {
    image_ready(module_image(), "images/build")
}

/// A docker test cannot run for `problem`: `false` (skipped, said why) when
/// `PLIMSOLL_TEST_DOCKER_SKIP=1`, else a panic, so CI never passes a suite that did not run.
fn skip_or_fail(problem: &str) -> bool {
    if std::env::var("PLIMSOLL_TEST_DOCKER_SKIP").as_deref() == Ok("1") {
        eprintln!("PLIMSOLL_TEST_DOCKER_SKIP=1: skipping a docker test: {problem}");
        return false;
    }
    panic!(
        "{problem} (set PLIMSOLL_TEST_DOCKER_SKIP=1 to skip the docker tests on a developer machine)"
    );
}
