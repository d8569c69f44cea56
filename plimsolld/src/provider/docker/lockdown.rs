//! The one container shape every plimsoll container has (providers.md §5.4), as the Engine
//! API's create body: snippets, projects and the startup proof's probes differ only in
//! the fields of [`Shape`].
//!
//! The guest never sees the image's ENTRYPOINT, CMD or ENV: the entrypoint is
//! `/usr/bin/env -i PATH=…`, which runs the start script (`images/start.sh`, §5.5) under
//! `/bin/sh`, which writes the run's marker and then execs the command with an explicit
//! environment.

use std::collections::HashMap;
use std::path::Path;

use bollard::models::{
    ContainerCreateBody, HealthConfig, HostConfig, HostConfigLogConfig, ResourcesUlimits,
};

use super::settings::Settings;

/// The start script, run by `/bin/sh -c` in every container.
pub const START_SCRIPT: &str = include_str!("../../../../images/start.sh");
/// The fixed search path of every plimsoll process in a guest.
pub const GUEST_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";
/// Where a run's host socket appears in the guest (the broker's, or the proof's throwaway).
pub const GUEST_SOCKET: &str = "/run/host-api.sock";
/// Every plimsoll container carries this label: the unix second after which it is an orphan.
pub const LABEL_EXPIRES: &str = "io.plimsoll.expires";
/// The daemon instance that created the container.
pub const LABEL_INSTANCE: &str = "io.plimsoll.instance";
/// What the container is for: `run` or `smoke`.
pub const LABEL_ROLE: &str = "io.plimsoll.role";
/// Open files per guest process.
const NOFILE: i64 = 4096;

/// Who a container's first process is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Identity {
    /// The guest uid with no capabilities at all (snippets and probes).
    Guest,
    /// Root holding only `CAP_SETUID` and `CAP_SETGID`, for the project runner. Before node
    /// runs, the runner's guard moves it to uid+1 (keeping just those two capabilities) and
    /// every step then runs as the guest uid with none: a step and the runner never share a
    /// uid, so no step can open the runner's `/proc` entries, signal it or trace it, under
    /// gVisor as under runc (images/project/guard/guard.c).
    Runner,
}

/// What differs between one plimsoll container and another.
#[derive(Debug, Clone)]
pub struct Shape<'a> {
    /// The image's content id (`sha256:…`), never a tag.
    pub image_id: &'a str,
    /// The per-run start marker line (without the newline).
    pub marker: &'a str,
    /// `NAME=value` entries for the guest: the verified image ENV, then run variables.
    pub env: &'a [String],
    /// The command, e.g. `["node", "-"]`.
    pub argv: &'a [String],
    /// Whether the run gets a `/work` tmpfs (projects, modules, probes of the project image).
    pub work: bool,
    /// A host Unix socket to bind at [`GUEST_SOCKET`].
    pub socket: Option<&'a Path>,
    /// Who the first process is.
    pub identity: Identity,
    /// `io.plimsoll.expires`, unix seconds.
    pub expires: u64,
    /// This daemon's instance id.
    pub instance: &'a str,
    /// `run` or `smoke`.
    pub role: &'a str,
    /// The seccomp profile to send (already read and parsed at preflight), if it applies.
    pub seccomp: Option<&'a str>,
}

/// The tmpfs option string of one writable mount.
pub fn tmpfs_options(mount: &str, mb: u32) -> String {
    let mode = if mount == "/work" { ",mode=1777" } else { "" };
    format!("rw,noexec,nosuid,size={mb}m{mode}")
}

/// The create body for `shape` under `settings`.
pub fn create_body(settings: &Settings, shape: &Shape<'_>) -> ContainerCreateBody {
    let tmpfs: HashMap<String, String> = settings
        .writable_mounts(shape.work)
        .into_iter()
        .map(|(mount, mb)| (mount.to_owned(), tmpfs_options(mount, mb)))
        .collect();
    let mut security_opt = vec!["no-new-privileges".to_owned()];
    if let Some(profile) = shape.seccomp {
        security_opt.push(format!("seccomp={profile}"));
    }
    let mut ulimits = vec![ulimit("core", 0), ulimit("nofile", NOFILE)];
    if let Some(nproc) = settings.guest_nproc_limit() {
        ulimits.push(ulimit("nproc", i64::from(nproc)));
    }
    let host_config = HostConfig {
        log_config: Some(HostConfigLogConfig {
            typ: Some("none".to_owned()),
            config: None,
        }),
        runtime: settings.runtime.name().map(str::to_owned),
        memory: Some(settings.memory_bytes()),
        memory_swap: Some(settings.memory_bytes()),
        pids_limit: Some(i64::from(settings.host_pids_limit())),
        nano_cpus: Some(settings.nano_cpus()),
        readonly_rootfs: Some(true),
        tmpfs: Some(tmpfs),
        cap_drop: Some(vec!["ALL".to_owned()]),
        cap_add: match shape.identity {
            Identity::Guest => None,
            Identity::Runner => Some(vec!["SETUID".to_owned(), "SETGID".to_owned()]),
        },
        security_opt: Some(security_opt),
        ulimits: Some(ulimits),
        ipc_mode: Some("private".to_owned()),
        network_mode: Some("none".to_owned()),
        binds: shape
            .socket
            .map(|s| vec![format!("{}:{GUEST_SOCKET}", s.display())]),
        init: Some(false),
        privileged: Some(false),
        ..Default::default()
    };
    let mut cmd = vec![
        "-i".to_owned(),
        format!("PATH={GUEST_PATH}"),
        "/bin/sh".to_owned(),
        "-c".to_owned(),
        START_SCRIPT.to_owned(),
        "sh".to_owned(),
        shape.marker.to_owned(),
    ];
    cmd.extend(shape.env.iter().cloned());
    cmd.extend(shape.argv.iter().cloned());
    ContainerCreateBody {
        image: Some(shape.image_id.to_owned()),
        entrypoint: Some(vec!["/usr/bin/env".to_owned()]),
        cmd: Some(cmd),
        user: Some(match shape.identity {
            Identity::Guest => settings.user(),
            Identity::Runner => "0:0".to_owned(),
        }),
        working_dir: shape.work.then(|| "/work".to_owned()),
        // docker's own environment for the container; `env -i` drops it before any guest
        // process starts, so it holds nothing.
        env: Some(Vec::new()),
        labels: Some(HashMap::from([
            (LABEL_EXPIRES.to_owned(), shape.expires.to_string()),
            (LABEL_INSTANCE.to_owned(), shape.instance.to_owned()),
            (LABEL_ROLE.to_owned(), shape.role.to_owned()),
        ])),
        healthcheck: Some(HealthConfig {
            test: Some(vec!["NONE".to_owned()]),
            ..Default::default()
        }),
        attach_stdin: Some(true),
        attach_stdout: Some(true),
        attach_stderr: Some(true),
        open_stdin: Some(true),
        stdin_once: Some(true),
        tty: Some(false),
        network_disabled: Some(true),
        host_config: Some(host_config),
        ..Default::default()
    }
}

fn ulimit(name: &str, value: i64) -> ResourcesUlimits {
    ResourcesUlimits {
        name: Some(name.to_owned()),
        soft: Some(value),
        hard: Some(value),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use crate::config::Config;

    fn settings(runtime: &str) -> Settings {
        let env: HashMap<String, String> = [
            ("SANDBOX_PROVIDER", "docker"),
            ("PLIMSOLL_INSECURE", "1"),
            ("SANDBOX_DOCKER_RUNTIME", runtime),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect();
        Settings::from_config(&Config::from_env(&env).unwrap()).unwrap()
    }

    fn shape<'a>(env: &'a [String], argv: &'a [String]) -> Shape<'a> {
        Shape {
            image_id: "sha256:abc",
            marker: "plimsoll-started:0123456789abcdef",
            env,
            argv,
            work: false,
            socket: None,
            identity: Identity::Guest,
            expires: 1_700_000_000,
            instance: "feedfacefeedface",
            role: "run",
            seccomp: None,
        }
    }

    #[test]
    fn every_lockdown_option_of_section_5_4_is_set() {
        let env = vec!["LANG=C".to_owned()];
        let argv = vec!["node".to_owned(), "-".to_owned()];
        let body = create_body(&settings(""), &shape(&env, &argv));
        let host = body.host_config.as_ref().unwrap();
        assert_eq!(host.readonly_rootfs, Some(true));
        assert_eq!(host.network_mode.as_deref(), Some("none"));
        assert_eq!(host.cap_drop.as_deref(), Some(&["ALL".to_owned()][..]));
        assert_eq!(
            host.security_opt.as_deref(),
            Some(&["no-new-privileges".to_owned()][..])
        );
        assert_eq!(host.memory, host.memory_swap);
        assert_eq!(host.memory, Some(256 << 20));
        assert_eq!(host.pids_limit, Some(256));
        assert_eq!(host.nano_cpus, Some(1_000_000_000));
        assert_eq!(host.ipc_mode.as_deref(), Some("private"));
        assert_eq!(host.runtime, None);
        assert_eq!(
            host.log_config.as_ref().unwrap().typ.as_deref(),
            Some("none")
        );
        let tmpfs = host.tmpfs.as_ref().unwrap();
        assert_eq!(tmpfs["/tmp"], "rw,noexec,nosuid,size=16m");
        assert_eq!(tmpfs["/dev/shm"], "rw,noexec,nosuid,size=16m");
        assert!(!tmpfs.contains_key("/work"));
        let limits: Vec<(String, i64, i64)> = host
            .ulimits
            .as_ref()
            .unwrap()
            .iter()
            .map(|u| (u.name.clone().unwrap(), u.soft.unwrap(), u.hard.unwrap()))
            .collect();
        assert_eq!(
            limits,
            [("core".into(), 0, 0), ("nofile".into(), 4096, 4096)]
        );
        assert_eq!(body.user.as_deref(), Some("61000:61000"));
        assert_eq!(body.image.as_deref(), Some("sha256:abc"));
        assert_eq!(
            body.healthcheck.as_ref().unwrap().test.as_deref(),
            Some(&["NONE".to_owned()][..])
        );
        let labels = body.labels.as_ref().unwrap();
        assert_eq!(labels[LABEL_EXPIRES], "1700000000");
        assert_eq!(labels[LABEL_INSTANCE], "feedfacefeedface");
        assert_eq!(
            body.entrypoint.as_deref(),
            Some(&["/usr/bin/env".to_owned()][..])
        );
        let cmd = body.cmd.as_ref().unwrap();
        assert_eq!(
            cmd[..4],
            ["-i", &format!("PATH={GUEST_PATH}"), "/bin/sh", "-c"]
        );
        assert_eq!(cmd[4], START_SCRIPT);
        assert_eq!(
            cmd[5..],
            [
                "sh",
                "plimsoll-started:0123456789abcdef",
                "LANG=C",
                "node",
                "-"
            ]
        );
        assert_eq!(body.stdin_once, Some(true));
    }

    #[test]
    fn work_socket_runsc_and_seccomp_add_their_options() {
        let mut s = shape(&[], &[]);
        s.work = true;
        s.socket = Some(Path::new("/tmp/crsbx-smoke-sock-x/host-api.sock"));
        s.seccomp = Some("{}");
        let body = create_body(&settings("runsc"), &s);
        let host = body.host_config.as_ref().unwrap();
        assert_eq!(
            host.tmpfs.as_ref().unwrap()["/work"],
            "rw,noexec,nosuid,size=128m,mode=1777"
        );
        assert_eq!(body.working_dir.as_deref(), Some("/work"));
        assert_eq!(
            host.binds.as_deref(),
            Some(&["/tmp/crsbx-smoke-sock-x/host-api.sock:/run/host-api.sock".to_owned()][..])
        );
        assert_eq!(host.runtime.as_deref(), Some("runsc"));
        assert_eq!(host.pids_limit, Some(256 * 16));
        assert!(
            host.ulimits
                .as_ref()
                .unwrap()
                .iter()
                .any(|u| u.name.as_deref() == Some("nproc") && u.hard == Some(256))
        );
        assert_eq!(host.security_opt.as_ref().unwrap()[1], "seccomp={}");
    }

    #[test]
    fn the_start_script_writes_the_marker_first_and_clears_the_environment() {
        let first_output = START_SCRIPT
            .lines()
            .find(|l| !l.starts_with('#') && l.contains(">&2"))
            .unwrap();
        assert!(first_output.contains("$marker"), "{first_output}");
        assert!(START_SCRIPT.contains("exec /usr/bin/env -i"));
    }
}
