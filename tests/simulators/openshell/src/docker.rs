//! The compute side: each sandbox is one local container, driven through the Docker Engine
//! API with the calls every simulator shares ([`sim_support::docker`]).
//!
//! A sandbox container is locked down: no network at all (loopback only: the gateway's
//! deny-all egress), a read-only root with volumes where the policy allows writes (and no
//! `/dev/shm`), every
//! capability dropped, no new privileges, a process limit, the template's memory and CPU
//! limits, and `--init` so orphans are reaped the way OpenShell's supervisor reaps them.

use std::collections::HashMap;
use std::path::Path;

use bollard::models::{ContainerCreateBody, HostConfig};
use bollard::query_parameters::CreateContainerOptions;
use futures::StreamExt;
use sim_support::docker::{Command, Engine, QUICK, bounded};

pub use sim_support::docker::{
    Attached, DockerError, Input, LABEL_INSTANCE, LABEL_SIMULATOR, Output,
};

/// This simulator's value of [`LABEL_SIMULATOR`].
pub const LABEL_SIMULATOR_VALUE: &str = "openshell";

/// What a sandbox container is made from.
#[derive(Debug, Clone)]
pub struct ContainerPlan {
    pub name: String,
    pub image: String,
    pub cmd: Vec<String>,
    pub env: Vec<String>,
    pub tty: bool,
    pub labels: HashMap<String, String>,
    pub memory_bytes: Option<i64>,
    pub nano_cpus: Option<i64>,
    /// Mount point → docker tmpfs options ("rw,noexec,size=…"): the template's mounts.
    pub tmpfs: HashMap<String, String>,
    /// Writable directories over the read-only root: anonymous volumes, so their files
    /// survive a stop and start, as a container's own files do; removed with it.
    pub volumes: Vec<String>,
    pub user: String,
    pub pids_limit: i64,
    pub runtime: String,
}

/// The engine, plus what this simulator does its own way: its containers and its execs.
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

    pub async fn create(&self, plan: &ContainerPlan) -> Result<String, DockerError> {
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
            init: Some(true),
            // No /dev/shm: OpenShell's Landlock policy allows writes only to its read-write
            // paths, and docker's shared-memory tmpfs would be one more writable place.
            ipc_mode: Some("none".into()),
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
            self.engine.api().create_container(Some(options), body),
        )
        .await?;
        Ok(created.id)
    }

    /// Starts `argv` in the container (as its user) with stdin, stdout and stderr attached.
    pub async fn exec(
        &self,
        container: &str,
        argv: Vec<String>,
        env: Vec<String>,
        tty: bool,
    ) -> Result<Attached, DockerError> {
        let command = Command {
            argv,
            env,
            tty,
            ..Command::default()
        };
        self.engine.exec(container, command).await
    }

    /// Runs a short command in the container and waits for it (output discarded).
    pub async fn run_quiet(&self, container: &str, argv: Vec<String>) -> Result<(), DockerError> {
        let attached = self.exec(container, argv, Vec::new(), false).await?;
        drop(attached.input);
        let mut output = attached.output;
        let drain = async { while output.next().await.is_some() {} };
        if tokio::time::timeout(QUICK, drain).await.is_err() {
            return Err(DockerError::Timeout {
                call: "exec",
                budget: QUICK,
            });
        }
        Ok(())
    }
}
