//! A real session-shaped container for tests (providers.md §9.1): the project image, started
//! detached with `--init` and the lockdown flags with `/work`, running `sleep 2147483647` as the
//! guest uid, under the runtime named by `PLIMSOLL_TEST_DOCKER_RUNTIME` (`runc`, the default, or
//! `runsc`). Dropping it force-removes it, also when the test panicked.
//!
//! Docker is required: a missing daemon or image fails the test, unless the developer sets
//! `PLIMSOLL_TEST_DOCKER_SKIP=1` (the docker suite's convention), which makes [`Testbed::start`]
//! answer `None`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::HashMap;
use std::path::Path;
use std::time::{SystemTime, UNIX_EPOCH};

use bollard::models::{ContainerCreateBody, HostConfig, HostConfigLogConfig, ResourcesUlimits};

use super::super::engine::Engine;
use super::super::lockdown::{GUEST_PATH, LABEL_EXPIRES, tmpfs_options};

/// `runc` (default) or `runsc`.
pub(in crate::provider::docker) const RUNTIME_VAR: &str = "PLIMSOLL_TEST_DOCKER_RUNTIME";
/// `1` turns a missing docker into a skipped test on a developer machine.
pub(in crate::provider::docker) const SKIP_VAR: &str = "PLIMSOLL_TEST_DOCKER_SKIP";
/// The local Engine socket.
const SOCKET: &str = "/var/run/docker.sock";
/// The prefix `images/build` tagged the images under (`plimsoll` unless set).
const PREFIX_VAR: &str = "PLIMSOLL_IMAGE_PREFIX";

/// The project image (node, python3, sh, the runner guard): `<prefix>/sandbox:latest`.
fn image() -> String {
    let prefix = std::env::var(PREFIX_VAR)
        .ok()
        .filter(|p| !p.is_empty())
        .unwrap_or_else(|| "plimsoll".to_owned());
    format!("{prefix}/sandbox:latest")
}
/// The guest uid and gid.
pub(in crate::provider::docker) const GUEST_USER: &str = "61000:61000";
/// Guest processes.
const PIDS: i64 = 256;
/// Memory (and memory+swap) in bytes.
const MEMORY: i64 = 512 << 20;

/// One running session-shaped container.
pub(in crate::provider::docker) struct Testbed {
    pub engine: Engine,
    pub id: String,
    /// Whether it runs under gVisor.
    pub runsc: bool,
}

fn runsc() -> bool {
    match std::env::var(RUNTIME_VAR).as_deref() {
        Ok("") | Ok("runc") | Err(_) => false,
        Ok("runsc") => true,
        Ok(other) => panic!("{RUNTIME_VAR}={other:?}: use runc or runsc"),
    }
}

fn skip(problem: &str) -> Option<Testbed> {
    if std::env::var(SKIP_VAR).as_deref() == Ok("1") {
        eprintln!("{SKIP_VAR}=1: skipping a docker test: {problem}");
        return None;
    }
    panic!("{problem} (set {SKIP_VAR}=1 to skip the docker tests on a developer machine)");
}

impl Testbed {
    /// Starts the container, or `None` when docker is missing and the developer opted out.
    pub(in crate::provider::docker) async fn start() -> Option<Testbed> {
        let engine = match Engine::connect(Path::new(SOCKET)).await {
            Ok(e) => e,
            Err(e) => return skip(&format!("docker does not answer ({e})")),
        };
        let image = image();
        if let Err(e) = engine.inspect_image(&image).await {
            return skip(&format!("image {image} is missing ({e}); run images/build"));
        }
        let runsc = runsc();
        let name = format!("plsm-test-{}", hex::encode(rand::random::<[u8; 8]>()));
        let expires = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_secs()
            + 600;
        let tmpfs: HashMap<String, String> = [("/tmp", 16), ("/dev/shm", 16), ("/work", 128)]
            .into_iter()
            .map(|(m, mb)| (m.to_owned(), tmpfs_options(m, mb)))
            .collect();
        let ulimit = |name: &str, v: i64| ResourcesUlimits {
            name: Some(name.to_owned()),
            soft: Some(v),
            hard: Some(v),
        };
        let mut ulimits = vec![ulimit("core", 0), ulimit("nofile", 4096)];
        if runsc {
            ulimits.push(ulimit("nproc", PIDS));
        }
        let host = HostConfig {
            log_config: Some(HostConfigLogConfig {
                typ: Some("none".to_owned()),
                config: None,
            }),
            runtime: runsc.then(|| "runsc".to_owned()),
            memory: Some(MEMORY),
            memory_swap: Some(MEMORY),
            pids_limit: Some(if runsc { PIDS * 16 } else { PIDS }),
            nano_cpus: Some(1_000_000_000),
            readonly_rootfs: Some(true),
            tmpfs: Some(tmpfs),
            cap_drop: Some(vec!["ALL".to_owned()]),
            security_opt: Some(vec!["no-new-privileges".to_owned()]),
            ulimits: Some(ulimits),
            ipc_mode: Some("private".to_owned()),
            network_mode: Some("none".to_owned()),
            init: Some(true),
            privileged: Some(false),
            ..Default::default()
        };
        let body = ContainerCreateBody {
            image: Some(image),
            entrypoint: Some(vec!["/usr/bin/env".to_owned()]),
            cmd: Some(vec![
                "-i".to_owned(),
                format!("PATH={GUEST_PATH}"),
                "sleep".to_owned(),
                "2147483647".to_owned(),
            ]),
            user: Some(GUEST_USER.to_owned()),
            working_dir: Some("/work".to_owned()),
            env: Some(Vec::new()),
            labels: Some(HashMap::from([
                (LABEL_EXPIRES.to_owned(), expires.to_string()),
                ("io.plimsoll.session".to_owned(), "1".to_owned()),
                ("io.plimsoll.role".to_owned(), "test".to_owned()),
            ])),
            network_disabled: Some(true),
            host_config: Some(host),
            ..Default::default()
        };
        let id = engine.create(&name, body).await.expect("create");
        let bed = Testbed { engine, id, runsc };
        bed.engine.start(&bed.id).await.expect("start");
        let inspected = bed
            .engine
            .inspect_container(&bed.id)
            .await
            .expect("inspect");
        let runtime = inspected.host_config.and_then(|h| h.runtime);
        assert_eq!(
            runtime.as_deref(),
            Some(if runsc { "runsc" } else { "runc" })
        );
        Some(bed)
    }
}

impl Drop for Testbed {
    fn drop(&mut self) {
        // Synchronous, so it also runs while a failed test unwinds.
        let removed = std::process::Command::new("docker")
            .args(["rm", "-f", &self.id])
            .output();
        if !matches!(&removed, Ok(out) if out.status.success()) {
            eprintln!("could not remove test container {}: {removed:?}", self.id);
        }
    }
}
