//! The session container (providers.md §9.1–§9.2): created detached with the lockdown of
//! §5.4, docker-init as PID 1 and `sleep` as its only child, both as root holding only
//! `CAP_SETUID`/`CAP_SETGID`; verified by inspection right
//! after the start; and read back against that first inspection before every call.

use crate::provider::guest::boundary::SLEEP_ARGV;
use std::collections::HashMap;
use std::time::Duration;

use bollard::models::{ContainerCreateBody, ContainerInspectResponse};
use plimsoll::wire::SessionEnd;

use super::super::DockerError;
use super::super::engine::Engine;
use super::super::lockdown::{
    self, GUEST_PATH, Identity, LABEL_EXPIRES, LABEL_INSTANCE, LABEL_ROLE, Shape,
};
use super::super::preflight::VerifiedImage;
use super::super::settings::Settings;
use crate::provider::SessionFault;

/// Every session container's name starts with this.
pub const NAME_PREFIX: &str = "plsm-session-";
/// Marks a session container.
pub const LABEL_SESSION: &str = "io.plimsoll.session";
/// Marks a warm pool member; its value is the member's warm language set, comma-separated.
pub const LABEL_POOL: &str = "io.plimsoll.pool";
/// The capabilities a session container is created with, exactly: only the agent's exec (as
/// root, moved to uid+1 by the guard before node runs) uses them, to start guest processes and
/// to signal them with the guest uid as its effective uid. Every other process runs as a
/// non-root uid under no-new-privileges and holds none.
pub const CAP_ADD: [&str; 2] = ["SETUID", "SETGID"];
/// The session's work directory.
const WORK: &str = "/work";
/// The budget of one Engine call made here.
const CALL_BUDGET: Duration = Duration::from_secs(10);

/// What a session container is created with.
pub struct Create<'a> {
    /// The verified project image.
    pub image: &'a VerifiedImage,
    /// The expiry label, unix seconds (fixed at creation).
    pub expires: u64,
    /// The label that tells this daemon's session containers apart. It is not the daemon's
    /// instance id: the one-minute orphan sweep removes an instance's containers it does not
    /// hold, and a session container lives for many minutes; its expiry label is the backstop.
    pub instance: &'a str,
    /// The seccomp profile, when one applies.
    pub seccomp: Option<&'a str>,
    /// The session's broker socket, bound at the guest's host-api path.
    pub socket: Option<&'a std::path::Path>,
}

/// The create body: the one lockdown shape, with `/work`, started as docker-init over `sleep`.
pub fn body(settings: &Settings, create: &Create<'_>) -> ContainerCreateBody {
    let argv: Vec<String> = SLEEP_ARGV.iter().map(|s| (*s).to_owned()).collect();
    let mut body = lockdown::create_body(
        settings,
        &Shape {
            image_id: &create.image.id,
            marker: "",
            env: &[],
            argv: &argv,
            work: true,
            socket: create.socket,
            identity: Identity::Guest,
            expires: create.expires,
            instance: create.instance,
            role: "session",
            seccomp: create.seccomp,
        },
    );
    // No start script: the container's own process is only `sleep`, under `env -i`.
    body.cmd = Some(
        ["-i".to_owned(), format!("PATH={GUEST_PATH}")]
            .into_iter()
            .chain(argv)
            .collect(),
    );
    // The container's user is root so that the agent's exec (as root) holds [`CAP_ADD`]:
    // docker gives an exec no capability at all when the container's user is not root. The
    // agent moves itself to uid+1, keeping only those two, before it reads anything. docker-init and `sleep` stay
    // root with only those two capabilities: session code (the guest uid, no capability) can
    // neither trace, signal nor open the `/proc` entries of the processes the sweep keeps,
    // with or without Yama, under runc and gVisor alike. Every exec names its own user.
    body.user = Some(ROOT.to_owned());
    body.attach_stdin = Some(false);
    body.attach_stdout = Some(false);
    body.attach_stderr = Some(false);
    body.open_stdin = Some(false);
    body.stdin_once = Some(false);
    if let Some(host) = body.host_config.as_mut() {
        host.init = Some(true);
        host.cap_add = Some(CAP_ADD.iter().map(|c| (*c).to_owned()).collect());
        // The work directory belongs to the guest uid, which every call and cell runs as, so
        // a client can restore a saved tree into it (`tar -x` sets the mode and times of
        // `.`, which only the owner may do). Its mode stays 1777 (under runc docker copies
        // the image directory's mode onto the tmpfs anyway). One-shot projects keep root's
        // `/work`, which their runner (uid+1) writes into.
        if let Some(work) = host.tmpfs.as_mut().and_then(|t| t.get_mut(WORK)) {
            work.push_str(&format!(",uid={0},gid={0}", settings.guest_uid));
        }
    }
    let labels = body.labels.get_or_insert_with(HashMap::new);
    labels.insert(LABEL_SESSION.to_owned(), "1".to_owned());
    labels.insert(LABEL_EXPIRES.to_owned(), create.expires.to_string());
    labels.insert(LABEL_INSTANCE.to_owned(), create.instance.to_owned());
    labels.insert(LABEL_ROLE.to_owned(), "session".to_owned());
    body
}

/// The container's user (docker-init and `sleep`).
const ROOT: &str = "0:0";

/// The verification right after the start: the verified image, running and not paused, no
/// network but `none`, a read-only root, not privileged, exactly [`CAP_ADD`] added, docker-init.
pub fn verify(inspected: &ContainerInspectResponse, image_id: &str) -> Result<(), String> {
    let state = inspected.state.as_ref();
    let host = inspected.host_config.as_ref();
    let networks: Vec<&String> = inspected
        .network_settings
        .as_ref()
        .and_then(|n| n.networks.as_ref())
        .map(|n| n.keys().collect())
        .unwrap_or_default();
    let checks = [
        (inspected.image.as_deref() == Some(image_id), "image"),
        (state.and_then(|s| s.running) == Some(true), "running"),
        (state.and_then(|s| s.paused) != Some(true), "not paused"),
        (
            host.and_then(|h| h.network_mode.as_deref()) == Some("none"),
            "network mode none",
        ),
        (networks.iter().all(|n| n.as_str() == "none"), "no network"),
        (
            host.and_then(|h| h.readonly_rootfs) == Some(true),
            "read-only root",
        ),
        (
            host.and_then(|h| h.privileged) != Some(true),
            "not privileged",
        ),
        (
            host.and_then(|h| h.cap_add.as_ref())
                .is_some_and(|added| exactly_the_session_caps(added)),
            "added capability",
        ),
        (host.and_then(|h| h.init) == Some(true), "docker-init"),
    ];
    match checks.iter().find(|(ok, _)| !ok) {
        Some((_, what)) => Err(format!("the session container fails the {what} check")),
        None => Ok(()),
    }
}

/// Whether `added` (as docker reports it, with or without the `CAP_` prefix) is exactly
/// [`CAP_ADD`].
fn exactly_the_session_caps(added: &[String]) -> bool {
    let mut names: Vec<&str> = added
        .iter()
        .map(|c| c.strip_prefix("CAP_").unwrap_or(c))
        .collect();
    names.sort_unstable();
    names.dedup();
    let mut want = CAP_ADD.to_vec();
    want.sort_unstable();
    names.len() == added.len() && names == want
}

/// The security snapshot: image, user, the whole host config, mounts and network names, as
/// one string compared before every call.
pub fn snapshot(inspected: &ContainerInspectResponse) -> String {
    let networks: Vec<String> = inspected
        .network_settings
        .as_ref()
        .and_then(|n| n.networks.as_ref())
        .map(|n| {
            let mut names: Vec<String> = n.keys().cloned().collect();
            names.sort();
            names
        })
        .unwrap_or_default();
    serde_json::json!({
        "image": inspected.image,
        "user": inspected.config.as_ref().and_then(|c| c.user.clone()),
        "host_config": inspected.host_config,
        "mounts": inspected.mounts,
        "networks": networks,
    })
    .to_string()
}

/// The read-back before a call (providers.md §9.2): the container still runs, unpaused by
/// anyone else, with the snapshot taken at open.
pub async fn read_back(
    engine: &Engine,
    id: &str,
    opened: &str,
    we_paused: bool,
) -> Result<(), SessionFault> {
    let inspected = match engine.inspect_container(id).await {
        Ok(i) => i,
        Err(e) => return Err(missing_or_unanswered(engine, id, e).await),
    };
    let state = inspected.state.as_ref();
    if state.and_then(|s| s.paused) == Some(true) && !we_paused {
        return Err(SessionFault::ended(
            SessionEnd::SESSION_END_SANDBOX_CHANGED,
            "the session's sandbox was paused by someone else",
        ));
    }
    if state.and_then(|s| s.running) != Some(true) {
        return Err(SessionFault::ended(
            SessionEnd::SESSION_END_MAIN_PROCESS_ENDED,
            "the session's sandbox stopped",
        ));
    }
    if snapshot(&inspected) != opened {
        return Err(SessionFault::ended(
            SessionEnd::SESSION_END_SANDBOX_CHANGED,
            "the session's sandbox no longer matches what was verified at open",
        ));
    }
    Ok(())
}

/// An inspection that failed: the container is gone only when a listing by id confirms it;
/// otherwise docker did not answer, and the call is refused with the session kept.
async fn missing_or_unanswered(engine: &Engine, id: &str, error: DockerError) -> SessionFault {
    match list_by_id(engine, id).await {
        Ok(found) if found.is_empty() => SessionFault::ended(
            SessionEnd::SESSION_END_SANDBOX_CHANGED,
            "the session's sandbox is gone",
        ),
        _ => {
            tracing::warn!(error = %error, "session read-back: docker did not answer");
            SessionFault::Refused(plimsoll::refusal::Refusal::Environment(
                "docker did not answer the session's read-back; nothing ran and the session goes on"
                    .to_owned(),
            ))
        }
    }
}

/// The container's state as the end of a failed call or sweep names it: gone or stopped is
/// `main_process_ended`, paused (by anyone) is `sandbox_changed`, otherwise `fallback`.
pub async fn end_for(engine: &Engine, id: &str, fallback: SessionEnd) -> SessionEnd {
    match engine.inspect_container(id).await {
        Ok(i) => {
            let state = i.state.as_ref();
            if state.and_then(|s| s.running) != Some(true) {
                SessionEnd::SESSION_END_MAIN_PROCESS_ENDED
            } else if state.and_then(|s| s.paused) == Some(true) {
                SessionEnd::SESSION_END_SANDBOX_CHANGED
            } else {
                fallback
            }
        }
        Err(_) => match list_by_id(engine, id).await {
            Ok(found) if found.is_empty() => SessionEnd::SESSION_END_MAIN_PROCESS_ENDED,
            _ => fallback,
        },
    }
}

/// Every container whose id is `id` (`ps -a -q --filter id=<id>`), bounded.
pub async fn list_by_id(engine: &Engine, id: &str) -> Result<Vec<String>, String> {
    let options = bollard::query_parameters::ListContainersOptions {
        all: true,
        filters: Some(HashMap::from([("id".to_owned(), vec![id.to_owned()])])),
        ..Default::default()
    };
    match tokio::time::timeout(CALL_BUDGET, engine.api().list_containers(Some(options))).await {
        Ok(Ok(list)) => Ok(list.into_iter().filter_map(|c| c.id).collect()),
        Ok(Err(e)) => Err(e.to_string()),
        Err(_) => Err(format!("no answer within {CALL_BUDGET:?}")),
    }
}

/// `docker pause` / `docker unpause`, bounded.
pub async fn set_paused(engine: &Engine, id: &str, paused: bool) -> Result<(), String> {
    let call = async {
        if paused {
            engine.api().pause_container(id).await
        } else {
            engine.api().unpause_container(id).await
        }
    };
    match tokio::time::timeout(CALL_BUDGET, call).await {
        Ok(Ok(())) => Ok(()),
        Ok(Err(e)) => Err(e.to_string()),
        Err(_) => Err(format!("no answer within {CALL_BUDGET:?}")),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use bollard::models::{ContainerState, HostConfig};

    use super::*;

    fn inspected() -> ContainerInspectResponse {
        ContainerInspectResponse {
            image: Some("sha256:abc".to_owned()),
            state: Some(ContainerState {
                running: Some(true),
                paused: Some(false),
                ..Default::default()
            }),
            host_config: Some(HostConfig {
                network_mode: Some("none".to_owned()),
                readonly_rootfs: Some(true),
                privileged: Some(false),
                init: Some(true),
                cap_add: Some(vec!["SETUID".to_owned(), "CAP_SETGID".to_owned()]),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn a_locked_down_session_container_verifies() {
        assert_eq!(verify(&inspected(), "sha256:abc"), Ok(()));
    }

    #[test]
    fn each_missing_lockdown_fails_verification_by_name() {
        assert!(
            verify(&inspected(), "sha256:other")
                .unwrap_err()
                .contains("image")
        );
        let mut paused = inspected();
        paused.state.as_mut().unwrap().paused = Some(true);
        assert!(
            verify(&paused, "sha256:abc")
                .unwrap_err()
                .contains("paused")
        );
        for added in [
            Some(vec!["NET_ADMIN".to_owned()]),
            Some(vec![
                "SETUID".to_owned(),
                "SETGID".to_owned(),
                "KILL".to_owned(),
            ]),
            Some(vec!["SETUID".to_owned()]),
            None,
        ] {
            let mut caps = inspected();
            caps.host_config.as_mut().unwrap().cap_add = added;
            assert!(
                verify(&caps, "sha256:abc")
                    .unwrap_err()
                    .contains("capability")
            );
        }
        let mut no_init = inspected();
        no_init.host_config.as_mut().unwrap().init = Some(false);
        assert!(verify(&no_init, "sha256:abc").unwrap_err().contains("init"));
    }

    #[test]
    fn the_session_work_directory_belongs_to_the_guest() {
        let env: HashMap<String, String> = [
            ("SANDBOX_PROVIDER", "docker"),
            ("PLIMSOLL_INSECURE", "1"),
            ("SANDBOX_GUEST_UID", "52000"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect();
        let config = crate::config::Config::from_env(&env).unwrap();
        let settings = Settings::from_config(&config).unwrap();
        let image = VerifiedImage {
            reference: "plimsoll/sandbox:latest".to_owned(),
            id: "sha256:abc".to_owned(),
            env: Vec::new(),
            software: Ok(String::new()),
        };
        let create = Create {
            image: &image,
            expires: 1_700_000_000,
            instance: "session-feedface",
            seccomp: None,
            socket: None,
        };
        let body = body(&settings, &create);
        let tmpfs = body.host_config.as_ref().unwrap().tmpfs.as_ref().unwrap();
        assert_eq!(
            tmpfs[WORK],
            "rw,noexec,nosuid,size=128m,mode=1777,uid=52000,gid=52000"
        );
        assert_eq!(tmpfs["/tmp"], "rw,noexec,nosuid,size=16m");
    }

    #[test]
    fn a_changed_host_config_changes_the_snapshot() {
        let before = snapshot(&inspected());
        let mut changed = inspected();
        changed.host_config.as_mut().unwrap().memory = Some(1 << 30);
        assert_ne!(before, snapshot(&changed));
        assert_eq!(before, snapshot(&inspected()));
    }
}
