//! The compute side: each sandbox is one local container, driven through the Docker Engine
//! API with the calls every simulator shares ([`sim_support::docker`]).
//!
//! A sandbox container is locked down: no network at all (the account's deny-all egress;
//! the guard's one destination is a forwarder, see [`crate::egress`]), a read-only root
//! with a writable `/tmp`, every capability dropped, no new privileges, a process limit,
//! the requested memory and CPUs, and `--init` so orphans are reaped.

use std::collections::HashMap;
use std::path::Path;

use bollard::container::LogOutput;
use bollard::models::{ContainerCreateBody, HostConfig};
use bollard::query_parameters::CreateContainerOptions;
use futures::StreamExt;
use sim_support::docker::{Engine, QUICK, bounded};
use tokio::io::AsyncWriteExt;

pub use sim_support::docker::{
    Attached, Command, DockerError, Input, LABEL_INSTANCE, LABEL_SIMULATOR, Output,
};

/// This simulator's value of [`LABEL_SIMULATOR`].
pub const LABEL_SIMULATOR_VALUE: &str = "dockercloud";

/// What a finished exec left: its exit code and output (each stream kept up to a cap).
#[derive(Debug, Default)]
pub struct Captured {
    pub exit_code: i64,
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
    /// Some output was discarded at the cap.
    pub incomplete: bool,
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

/// The engine, plus what this simulator does its own way: its containers and its
/// captured runs.
#[derive(Debug, Clone)]
pub struct Docker {
    engine: Engine,
}

impl std::ops::Deref for Docker {
    type Target = Engine;

    fn deref(&self) -> &Engine {
        &self.engine
    }
}

impl Docker {
    pub async fn connect(socket: &Path) -> Result<Docker, DockerError> {
        Ok(Docker {
            engine: Engine::connect(socket).await?,
        })
    }

    /// The runtimes docker lists.
    pub async fn runtimes(&self) -> Result<Vec<String>, DockerError> {
        Ok(self.engine.runtimes_and_version().await?.0)
    }

    /// A local image's id (`sha256:…`).
    pub async fn image_id(&self, image: &str) -> Result<String, DockerError> {
        let inspected = bounded(
            "image inspect",
            QUICK,
            self.engine.api().inspect_image(image),
        )
        .await?;
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
            self.engine.api().create_container(Some(options), body),
        )
        .await?;
        Ok(created.id)
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
        let attached = self.engine.exec(container, command).await?;
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
        captured.exit_code = self.engine.exec_exit(&attached.id).await?.unwrap_or(-1);
        Ok(captured)
    }
}
