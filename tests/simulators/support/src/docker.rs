//! A simulated sandbox's container, driven through the Docker Engine API (bollard over the
//! local Unix socket), every call under its own time budget. The calls every simulator makes
//! the same way live here, and so does the locked-down container shape ([`LockedDown`]) that
//! the OpenShell and Docker Cloud simulators share; a simulator whose vendor locks its
//! sandboxes down another way (E2B's VMs keep some capabilities for root) builds its own with
//! [`Engine::api`] and [`bounded`].

use std::collections::HashMap;
use std::future::Future;
use std::path::Path;
use std::pin::Pin;
use std::time::Duration;

use bollard::container::LogOutput;
use bollard::exec::{CreateExecOptions, StartExecOptions, StartExecResults};
use bollard::models::{ContainerCreateBody, HostConfig};
use bollard::query_parameters::{
    CreateContainerOptions, KillContainerOptions, ListContainersOptions, RemoveContainerOptions,
    StopContainerOptions, WaitContainerOptions,
};
use futures::{Stream, StreamExt};
use tokio::io::AsyncWrite;

/// Label on every container a simulator makes; its value names the simulator.
pub const LABEL_SIMULATOR: &str = "io.plimsoll.simulator";
/// Which simulator process made the container.
pub const LABEL_INSTANCE: &str = "io.plimsoll.simulator.instance";

/// Budget of a call that only reads or changes engine state.
pub const QUICK: Duration = Duration::from_secs(10);
/// Budget of a call that starts, stops or removes processes.
pub const START: Duration = Duration::from_secs(60);
const FRAME_CAPACITY: usize = 64 * 1024;
/// How long an exec's exit code is waited for once its output has ended.
const EXIT_POLLS: u32 = 250;

#[derive(Debug, thiserror::Error)]
pub enum DockerError {
    #[error("connecting to docker at {socket}: {source}")]
    Connect {
        socket: String,
        source: Box<bollard::errors::Error>,
    },
    #[error("docker {call}: {source}")]
    Api {
        call: &'static str,
        source: Box<bollard::errors::Error>,
    },
    #[error("docker {call} did not answer within {budget:?}")]
    Timeout {
        call: &'static str,
        budget: Duration,
    },
    #[error("docker {0}: the exec was not attached")]
    NotAttached(&'static str),
    #[error("writing an exec's standard input: {0}")]
    Stdin(std::io::Error),
}

/// Runs one engine call under `budget`.
pub async fn bounded<T>(
    call: &'static str,
    budget: Duration,
    fut: impl Future<Output = Result<T, bollard::errors::Error>>,
) -> Result<T, DockerError> {
    match tokio::time::timeout(budget, fut).await {
        Ok(Ok(value)) => Ok(value),
        Ok(Err(source)) => Err(DockerError::Api {
            call,
            source: Box::new(source),
        }),
        Err(_) => Err(DockerError::Timeout { call, budget }),
    }
}

pub type Output = Pin<Box<dyn Stream<Item = Result<LogOutput, bollard::errors::Error>> + Send>>;
pub type Input = Pin<Box<dyn AsyncWrite + Send>>;

/// An attached exec: its id, its stdin and its output.
pub struct Attached {
    pub id: String,
    pub input: Input,
    pub output: Output,
}

/// A command to run in a container.
#[derive(Debug, Clone, Default)]
pub struct Command {
    pub argv: Vec<String>,
    /// The container's user when `None`.
    pub user: Option<String>,
    pub working_dir: Option<String>,
    /// `KEY=value` pairs added to its environment.
    pub env: Vec<String>,
    pub tty: bool,
    /// No stdin attached: the process reads end-of-file at once.
    pub closed_stdin: bool,
}

impl Command {
    pub fn new(argv: Vec<String>, user: &str) -> Command {
        Command {
            argv,
            user: Some(user.to_owned()),
            ..Command::default()
        }
    }
}

/// A sandbox container with no network at all (loopback only), a read-only root, every
/// capability dropped, no new privileges, a process limit, `--init` so orphans are reaped,
/// and what the vendor's sandbox asks for on top.
#[derive(Debug, Clone, Default)]
pub struct LockedDown {
    pub name: String,
    pub image: String,
    pub cmd: Vec<String>,
    pub env: Vec<String>,
    pub tty: bool,
    pub user: String,
    pub labels: HashMap<String, String>,
    pub runtime: String,
    pub pids_limit: i64,
    pub memory_bytes: Option<i64>,
    pub nano_cpus: Option<i64>,
    /// Mount point → docker tmpfs options: the writable places over the read-only root.
    pub tmpfs: HashMap<String, String>,
    /// Anonymous volumes: writable directories whose files survive a stop and start.
    pub volumes: Vec<String>,
    /// `name:ip` entries for /etc/hosts.
    pub extra_hosts: Vec<String>,
    /// Docker's IPC mode; `None` keeps docker's default (a private namespace with /dev/shm).
    pub ipc_mode: Option<String>,
}

#[derive(Debug, Clone)]
pub struct Engine {
    api: bollard::Docker,
}

impl Engine {
    pub async fn connect(socket: &Path) -> Result<Engine, DockerError> {
        let path = socket.to_string_lossy().into_owned();
        let min = bollard::ClientVersion {
            major_version: 1,
            minor_version: 41,
        };
        let api = bollard::Docker::connect_with_unix(&path, 120, &min).map_err(|source| {
            DockerError::Connect {
                socket: path.clone(),
                source: Box::new(source),
            }
        })?;
        let api = bounded("version negotiation", QUICK, api.negotiate_version()).await?;
        Ok(Engine { api })
    }

    /// The raw client, for what one simulator does its own way (creating its containers).
    pub fn api(&self) -> &bollard::Docker {
        &self.api
    }

    /// Creates (does not start) the container `plan` describes; answers its id.
    pub async fn create_locked_down(&self, plan: &LockedDown) -> Result<String, DockerError> {
        let host = HostConfig {
            network_mode: Some("none".into()),
            readonly_rootfs: Some(true),
            cap_drop: Some(vec!["ALL".into()]),
            security_opt: Some(vec!["no-new-privileges".into()]),
            pids_limit: Some(plan.pids_limit),
            memory: plan.memory_bytes,
            memory_swap: plan.memory_bytes,
            nano_cpus: plan.nano_cpus,
            tmpfs: Some(plan.tmpfs.clone()),
            extra_hosts: Some(plan.extra_hosts.clone()),
            init: Some(true),
            ipc_mode: plan.ipc_mode.clone(),
            runtime: Some(plan.runtime.clone()),
            ..Default::default()
        };
        let body = ContainerCreateBody {
            image: Some(plan.image.clone()),
            cmd: Some(plan.cmd.clone()),
            entrypoint: Some(Vec::new()),
            env: Some(plan.env.clone()),
            tty: Some(plan.tty),
            user: Some(plan.user.clone()),
            working_dir: Some("/".into()),
            labels: Some(plan.labels.clone()),
            volumes: Some(plan.volumes.clone()),
            host_config: Some(host),
            ..Default::default()
        };
        let options = CreateContainerOptions {
            name: Some(plan.name.clone()),
            platform: String::new(),
        };
        let created = bounded(
            "container create",
            QUICK,
            self.api.create_container(Some(options), body),
        )
        .await?;
        Ok(created.id)
    }

    /// The runtimes docker lists, and its server version.
    pub async fn runtimes_and_version(&self) -> Result<(Vec<String>, String), DockerError> {
        let info = bounded("info", QUICK, self.api.info()).await?;
        let runtimes = info.runtimes.unwrap_or_default().into_keys().collect();
        Ok((runtimes, info.server_version.unwrap_or_default()))
    }

    pub async fn start(&self, id: &str) -> Result<(), DockerError> {
        bounded("container start", START, self.api.start_container(id, None)).await
    }

    /// Ends every process of the container at once (files stay).
    pub async fn stop(&self, id: &str) -> Result<(), DockerError> {
        let options = StopContainerOptions {
            t: Some(0),
            signal: None,
        };
        bounded(
            "container stop",
            START,
            self.api.stop_container(id, Some(options)),
        )
        .await
    }

    pub async fn kill(&self, id: &str) -> Result<(), DockerError> {
        let options = KillContainerOptions {
            signal: "KILL".into(),
        };
        bounded(
            "container kill",
            QUICK,
            self.api.kill_container(id, Some(options)),
        )
        .await
    }

    /// Removes the container and its anonymous volumes, running or not.
    pub async fn remove(&self, id: &str) -> Result<(), DockerError> {
        let options = RemoveContainerOptions {
            force: true,
            v: true,
            link: false,
        };
        bounded(
            "container remove",
            START,
            self.api.remove_container(id, Some(options)),
        )
        .await
    }

    /// Waits (without a budget: the caller owns the task) until the container stops;
    /// answers its exit code.
    pub async fn wait_exit(&self, id: &str) -> Option<i64> {
        let options = WaitContainerOptions {
            condition: "not-running".into(),
        };
        let mut stream = self.api.wait_container(id, Some(options));
        match stream.next().await {
            Some(Ok(answer)) => Some(answer.status_code),
            Some(Err(bollard::errors::Error::DockerContainerWaitError { code, .. })) => Some(code),
            _ => None,
        }
    }

    /// Whether the container is running now.
    pub async fn running(&self, id: &str) -> bool {
        match bounded(
            "container inspect",
            QUICK,
            self.api.inspect_container(id, None),
        )
        .await
        {
            Ok(inspected) => inspected.state.and_then(|s| s.running).unwrap_or(false),
            Err(_) => false,
        }
    }

    /// Returns once the container has stopped for good (a paused container still runs), with
    /// its exit code when docker's wait told it. docker does not always end an exec's streams
    /// when a gVisor container dies, so a simulator learns of a sandbox's death from the
    /// container itself.
    pub async fn wait_dead(&self, id: &str) -> Option<i64> {
        loop {
            let code = self.wait_exit(id).await;
            if !self.running(id).await {
                return code;
            }
            // A wait that failed while the container runs (the engine restarting, say).
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    }

    /// Whether a command that exited `code` in container `id` died with it. docker reports a
    /// command its container's death killed as killed by a signal (137), sometimes before the
    /// container reads as stopped, where a service's sandbox would have ended the connection:
    /// a second tells the two apart (only commands that died by a signal wait).
    pub async fn died_with_container(&self, id: &str, code: i64) -> bool {
        code > 128
            && tokio::time::timeout(Duration::from_secs(1), self.wait_exit(id))
                .await
                .is_ok()
            && !self.running(id).await
    }

    /// Ids of every container carrying `label` (running or not).
    pub async fn list_labelled(&self, label: &str) -> Result<Vec<String>, DockerError> {
        let options = ListContainersOptions {
            all: true,
            filters: Some(HashMap::from([(
                "label".to_owned(),
                vec![label.to_owned()],
            )])),
            ..Default::default()
        };
        let found = bounded(
            "container list",
            QUICK,
            self.api.list_containers(Some(options)),
        )
        .await?;
        Ok(found.into_iter().filter_map(|c| c.id).collect())
    }

    /// Removes every container carrying `label`, listing again after each pass until a
    /// listing succeeds empty (a create the engine was still finishing, or a removal it was
    /// still carrying out, shows up in a later one), for at most 20 s; answers how many were
    /// still listed at the end.
    pub async fn remove_every(&self, label: &str) -> usize {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
        let mut left = 0;
        loop {
            match self.list_labelled(label).await {
                Ok(ids) if ids.is_empty() => return 0,
                Ok(ids) => {
                    left = ids.len();
                    for id in ids {
                        let _ = self.remove(&id).await;
                    }
                }
                // Not known to be clean: count it as one left and try again.
                Err(_) => left = left.max(1),
            }
            if tokio::time::Instant::now() >= deadline {
                return left;
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }

    /// Starts a command in the container with stdout and stderr (and stdin, unless
    /// `closed_stdin`) attached.
    pub async fn exec(&self, container: &str, command: Command) -> Result<Attached, DockerError> {
        let options = CreateExecOptions {
            attach_stdin: Some(!command.closed_stdin),
            attach_stdout: Some(true),
            attach_stderr: Some(true),
            tty: Some(command.tty),
            env: Some(command.env),
            cmd: Some(command.argv),
            user: command.user,
            working_dir: command.working_dir,
            privileged: Some(false),
            ..Default::default()
        };
        let created = bounded(
            "exec create",
            QUICK,
            self.api.create_exec(container, options),
        )
        .await?;
        let start = StartExecOptions {
            detach: false,
            tty: command.tty,
            output_capacity: Some(FRAME_CAPACITY),
        };
        match bounded(
            "exec start",
            START,
            self.api.start_exec(&created.id, Some(start)),
        )
        .await?
        {
            StartExecResults::Attached { output, input } => Ok(Attached {
                id: created.id,
                input,
                output,
            }),
            StartExecResults::Detached => Err(DockerError::NotAttached("exec start")),
        }
    }

    /// The exec's exit code, once docker has recorded it (`None` while it still runs).
    pub async fn exec_exit(&self, id: &str) -> Result<Option<i64>, DockerError> {
        for _ in 0..EXIT_POLLS {
            let inspected = bounded("exec inspect", QUICK, self.api.inspect_exec(id)).await?;
            if inspected.running != Some(true) {
                return Ok(inspected.exit_code);
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        Ok(None)
    }
}
