//! The compute side: each sandbox is one local container, driven through the Docker Engine
//! API (bollard over the local Unix socket), every call under its own time budget.
//!
//! A sandbox container is locked down: no network at all (the account's deny-all egress;
//! the guard's one destination is a forwarder, see [`crate::egress`]), a read-only root
//! with a writable `/tmp`, every capability dropped, no new privileges, a process limit,
//! the requested memory and CPUs, and `--init` so orphans are reaped.

use std::collections::HashMap;
use std::future::Future;
use std::path::Path;
use std::pin::Pin;
use std::time::Duration;

use bollard::container::LogOutput;
use bollard::exec::{CreateExecOptions, StartExecOptions, StartExecResults};
use bollard::models::{ContainerCreateBody, HostConfig};
use bollard::query_parameters::{
    CreateContainerOptions, ListContainersOptions, RemoveContainerOptions, StopContainerOptions,
};
use futures::{Stream, StreamExt};
use tokio::io::{AsyncWrite, AsyncWriteExt};

/// Label on every container the simulator makes.
pub const LABEL_SIMULATOR: &str = "io.plimsoll.simulator";
/// Its value for this simulator.
pub const LABEL_SIMULATOR_VALUE: &str = "dockercloud";
/// Which simulator process made the container.
pub const LABEL_INSTANCE: &str = "io.plimsoll.simulator.instance";

const QUICK: Duration = Duration::from_secs(10);
const START: Duration = Duration::from_secs(60);
const FRAME_CAPACITY: usize = 64 * 1024;

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

async fn bounded<T>(
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

/// What a finished exec left: its exit code and output (each stream kept up to a cap).
#[derive(Debug, Default)]
pub struct Captured {
    pub exit_code: i64,
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
    /// Some output was discarded at the cap.
    pub incomplete: bool,
}

/// A command to run in a sandbox.
#[derive(Debug, Clone)]
pub struct Command {
    pub argv: Vec<String>,
    pub user: String,
    pub working_dir: Option<String>,
    /// `KEY=value` pairs added to its environment.
    pub env: Vec<String>,
}

impl Command {
    pub fn new(argv: Vec<String>, user: &str) -> Command {
        Command {
            argv,
            user: user.to_owned(),
            working_dir: None,
            env: Vec::new(),
        }
    }
}

/// What a sandbox container is made from.
#[derive(Debug, Clone)]
pub struct ContainerPlan {
    pub name: String,
    pub image: String,
    pub cmd: Vec<String>,
    pub labels: HashMap<String, String>,
    pub memory_bytes: i64,
    pub nano_cpus: i64,
    pub tmp_mib: u64,
    pub user: String,
    pub pids_limit: i64,
    pub runtime: String,
    /// `name:ip` entries for /etc/hosts (the guard host points at the sandbox's own
    /// loopback, where the egress forwarder listens once the policy allows it).
    pub extra_hosts: Vec<String>,
}

#[derive(Debug, Clone)]
pub struct Docker {
    api: bollard::Docker,
}

impl Docker {
    pub async fn connect(socket: &Path) -> Result<Docker, DockerError> {
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
        Ok(Docker { api })
    }

    /// The runtimes docker lists.
    pub async fn runtimes(&self) -> Result<Vec<String>, DockerError> {
        let info = bounded("info", QUICK, self.api.info()).await?;
        Ok(info.runtimes.unwrap_or_default().into_keys().collect())
    }

    /// A local image's id (`sha256:…`).
    pub async fn image_id(&self, image: &str) -> Result<String, DockerError> {
        let inspected = bounded("image inspect", QUICK, self.api.inspect_image(image)).await?;
        Ok(inspected.id.unwrap_or_default())
    }

    pub async fn create(&self, plan: &ContainerPlan) -> Result<String, DockerError> {
        let host = HostConfig {
            network_mode: Some("none".into()),
            readonly_rootfs: Some(true),
            cap_drop: Some(vec!["ALL".into()]),
            security_opt: Some(vec!["no-new-privileges".into()]),
            pids_limit: Some(plan.pids_limit),
            memory: Some(plan.memory_bytes),
            memory_swap: Some(plan.memory_bytes),
            nano_cpus: Some(plan.nano_cpus),
            tmpfs: Some(HashMap::from([(
                "/tmp".to_owned(),
                format!("rw,exec,nosuid,nodev,size={}m,mode=1777", plan.tmp_mib),
            )])),
            extra_hosts: Some(plan.extra_hosts.clone()),
            init: Some(true),
            runtime: Some(plan.runtime.clone()),
            ..Default::default()
        };
        let body = ContainerCreateBody {
            image: Some(plan.image.clone()),
            cmd: Some(plan.cmd.clone()),
            entrypoint: Some(Vec::new()),
            user: Some(plan.user.clone()),
            working_dir: Some("/".into()),
            labels: Some(plan.labels.clone()),
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

    /// Starts a command in the container, with stdin, stdout and stderr attached.
    pub async fn exec(&self, container: &str, command: Command) -> Result<Attached, DockerError> {
        let options = CreateExecOptions {
            attach_stdin: Some(true),
            attach_stdout: Some(true),
            attach_stderr: Some(true),
            tty: Some(false),
            env: Some(command.env),
            cmd: Some(command.argv),
            user: Some(command.user),
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
            tty: false,
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

    /// Runs `argv` to completion with `stdin` as its whole input, keeping at most `cap`
    /// bytes of stdout and stderr together (the rest is read and discarded, so the command
    /// is never blocked on a full pipe). No time bound: the caller owns the future.
    pub async fn run(
        &self,
        container: &str,
        command: Command,
        stdin: &[u8],
        cap: usize,
    ) -> Result<Captured, DockerError> {
        let attached = self.exec(container, command).await?;
        let mut input = attached.input;
        let feed = async {
            let written = input.write_all(stdin).await;
            let _ = input.shutdown().await;
            drop(input);
            written
        };
        let mut output = attached.output;
        let mut captured = Captured::default();
        let drain = async {
            while let Some(item) = output.next().await {
                let (into_stdout, bytes) = match item {
                    Ok(LogOutput::StdOut { message }) => (true, message),
                    Ok(LogOutput::StdErr { message }) => (false, message),
                    Ok(_) => continue,
                    Err(_) => break,
                };
                let room = cap.saturating_sub(captured.stdout.len() + captured.stderr.len());
                let keep = bytes.len().min(room);
                if keep < bytes.len() {
                    captured.incomplete = true;
                }
                let target = if into_stdout {
                    &mut captured.stdout
                } else {
                    &mut captured.stderr
                };
                target.extend_from_slice(&bytes[..keep]);
            }
        };
        let (written, ()) = tokio::join!(feed, drain);
        // A command that exits without reading its input breaks the pipe; that is its
        // business, not a failure of the exec.
        if let Err(e) = written
            && e.kind() != std::io::ErrorKind::BrokenPipe
        {
            return Err(DockerError::Stdin(e));
        }
        captured.exit_code = self.exec_exit(&attached.id).await?.unwrap_or(-1);
        Ok(captured)
    }

    /// The exec's exit code, once docker has recorded it (`None` while it still runs).
    pub async fn exec_exit(&self, id: &str) -> Result<Option<i64>, DockerError> {
        for _ in 0..250 {
            let inspected = bounded("exec inspect", QUICK, self.api.inspect_exec(id)).await?;
            if inspected.running != Some(true) {
                return Ok(inspected.exit_code);
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        Ok(None)
    }
}
