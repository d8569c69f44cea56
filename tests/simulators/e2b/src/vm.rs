//! The VMs: one docker container each, locked down like plimsoll's own guests, and the agent
//! execs that stand in for envd's work inside them.
//!
//! Every call to the Engine has its own time budget (`sim_support::docker`, which the other
//! simulators use too): a gVisor sandbox that dies mid-call must not hang the simulator. Every container carries `io.plimsoll.simulator=e2b`, this
//! simulator's instance id and its owner (pid and start time), so a later simulator can remove
//! what a killed one left behind.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use bollard::container::LogOutput;
use bollard::models::{ContainerCreateBody, HostConfig, ResourcesUlimits};
use bollard::query_parameters::{
    CreateContainerOptions, ListContainersOptions, RemoveContainerOptions,
};
use futures::StreamExt;
use sim_support::docker::{self as engine, DockerError, Engine, Output, bounded};

use crate::config::{Runtime, Template};
use crate::frames::{Decoder, Frame};
use crate::guest::{AGENT_PATH, EGRESS_DIR};

/// Every simulator container carries this label with the value `e2b`.
pub const LABEL: &str = engine::LABEL_SIMULATOR;
const LABEL_INSTANCE: &str = engine::LABEL_INSTANCE;
const LABEL_OWNER: &str = "io.plimsoll.simulator.owner";
const LABEL_SANDBOX: &str = "io.plimsoll.simulator.sandbox";
/// The search path of every VM process (E2B's templates have this one).
pub const GUEST_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

const QUICK: Duration = Duration::from_secs(15);
/// How long an agent operation may stay silent before it counts as hung (a process stream
/// turns this off: a quiet process is normal).
const AGENT_IDLE: Duration = Duration::from_secs(60);
/// The Docker Engine's socket.
const DOCKER_SOCKET: &str = "/var/run/docker.sock";

/// What went wrong with docker.
#[derive(Debug, thiserror::Error)]
pub enum VmError {
    #[error(transparent)]
    Docker(#[from] DockerError),
    #[error("agent output: {0}")]
    Frames(#[from] crate::frames::FrameError),
    #[error("agent output ended early{0}")]
    Truncated(String),
}

/// The host files a VM mounts.
#[derive(Debug, Clone)]
pub struct VmFiles {
    pub egress_dir: PathBuf,
    pub hosts: PathBuf,
    pub ca_bundle: PathBuf,
}

/// The docker side of the simulator.
pub struct Vms {
    docker: Engine,
    runtime: Runtime,
    instance: String,
    agent: PathBuf,
    /// Execs start under the read side, a pause takes the write side: a `docker pause` that
    /// lands while runc is still moving an exec's process into the container's cgroup
    /// freezes that exec's setup for good, and every later engine call on the container
    /// with it (E2B's own pause simply drops the streams).
    pausing: tokio::sync::RwLock<()>,
}

/// The stdin of an exec.
pub use engine::Input;

// === impl Vms ===

impl Vms {
    /// Connects to the local docker and settles `runtime` (auto: runsc when registered).
    pub async fn connect(runtime: Runtime, instance: &str, agent: PathBuf) -> Result<Vms, VmError> {
        let docker = Engine::connect(Path::new(DOCKER_SOCKET)).await?;
        let runtime = match runtime {
            Runtime::Auto => {
                let (runtimes, _) = docker.runtimes_and_version().await?;
                if runtimes.iter().any(|r| r == "runsc") {
                    Runtime::Runsc
                } else {
                    Runtime::Runc
                }
            }
            fixed => fixed,
        };
        Ok(Vms {
            docker,
            runtime,
            instance: instance.to_owned(),
            agent,
            pausing: tokio::sync::RwLock::new(()),
        })
    }

    pub fn runtime(&self) -> Runtime {
        self.runtime
    }

    /// Creates and starts the VM of sandbox `id`; answers the container id.
    pub async fn create(
        &self,
        id: &str,
        template: &Template,
        files: &VmFiles,
    ) -> Result<String, VmError> {
        let memory = i64::from(template.memory_mb) * 1024 * 1024;
        let disk = template.disk_size_mb;
        let tmpfs = HashMap::from([
            (
                "/home/user".to_owned(),
                format!("rw,nosuid,size={disk}m,uid=1000,gid=1000,mode=0755"),
            ),
            (
                "/tmp".to_owned(),
                format!("rw,nosuid,size={disk}m,mode=1777"),
            ),
            (
                "/root".to_owned(),
                "rw,nosuid,size=64m,mode=0700".to_owned(),
            ),
        ]);
        let binds = vec![
            format!("{}:{AGENT_PATH}:ro", self.agent.display()),
            format!("{}:{EGRESS_DIR}:ro", files.egress_dir.display()),
            format!("{}:/etc/hosts:ro", files.hosts.display()),
            format!(
                "{}:/etc/ssl/certs/ca-certificates.crt:ro",
                files.ca_bundle.display()
            ),
        ];
        let host_config = HostConfig {
            runtime: Some(self.runtime.name().to_owned()),
            memory: Some(memory),
            memory_swap: Some(memory),
            nano_cpus: Some(i64::from(template.cpu_count) * 1_000_000_000),
            pids_limit: Some(1024),
            readonly_rootfs: Some(true),
            tmpfs: Some(tmpfs),
            // Root in the VM keeps what envd's file API, its start of a process as the user
            // (SETUID, SETGID) and a cleanup need; uid 1000 gets no capability at all (a
            // change of uid away from root drops them) and, with no-new-privileges and no
            // setuid file in the template, no way to root.
            cap_drop: Some(vec!["ALL".to_owned()]),
            cap_add: Some(
                [
                    "CHOWN",
                    "DAC_OVERRIDE",
                    "FOWNER",
                    "FSETID",
                    "KILL",
                    "NET_BIND_SERVICE",
                    "SETGID",
                    "SETUID",
                ]
                .map(str::to_owned)
                .to_vec(),
            ),
            security_opt: Some(vec!["no-new-privileges".to_owned()]),
            ulimits: Some(vec![ResourcesUlimits {
                name: Some("core".to_owned()),
                soft: Some(0),
                hard: Some(0),
            }]),
            ipc_mode: Some("private".to_owned()),
            network_mode: Some("none".to_owned()),
            binds: Some(binds),
            init: Some(false),
            privileged: Some(false),
            ..Default::default()
        };
        let labels = HashMap::from([
            (LABEL.to_owned(), "e2b".to_owned()),
            (LABEL_INSTANCE.to_owned(), self.instance.clone()),
            (LABEL_OWNER.to_owned(), owner_stamp()),
            (LABEL_SANDBOX.to_owned(), id.to_owned()),
        ]);
        let body = ContainerCreateBody {
            image: Some(template.image.clone()),
            entrypoint: Some(vec![AGENT_PATH.to_owned()]),
            cmd: Some(
                ["guest", "init", "--egress", EGRESS_DIR]
                    .map(str::to_owned)
                    .to_vec(),
            ),
            user: Some("0:0".to_owned()),
            env: Some(vec![format!("PATH={GUEST_PATH}")]),
            hostname: Some("e2b".to_owned()),
            working_dir: Some("/".to_owned()),
            labels: Some(labels),
            network_disabled: Some(true),
            host_config: Some(host_config),
            ..Default::default()
        };
        let options = CreateContainerOptions {
            name: Some(format!("e2b-sim-{}-{id}", self.instance)),
            platform: String::new(),
        };
        let created = bounded(
            "create",
            QUICK,
            self.docker.api().create_container(Some(options), body),
        )
        .await?;
        if let Err(e) = self.docker.start(&created.id).await {
            self.remove(&created.id).await;
            return Err(e.into());
        }
        Ok(created.id)
    }

    /// `rm -f`; a container already gone is fine.
    /// Within [`QUICK`], not the engine's longer budget: a removal docker cannot finish (seen
    /// with a paused container) must not hold up the startup sweep; the next sweep retries.
    pub async fn remove(&self, container: &str) {
        let options = RemoveContainerOptions {
            force: true,
            v: true,
            link: false,
        };
        let api = self.docker.api();
        let _ = bounded(
            "remove",
            QUICK,
            api.remove_container(container, Some(options)),
        )
        .await;
    }

    /// Returns once `container` has stopped for good.
    pub async fn wait_dead(&self, container: &str) {
        self.docker.wait_dead(container).await;
    }

    pub async fn pause(&self, container: &str) -> Result<(), VmError> {
        let _no_new_execs = self.pausing.write().await;
        self.settle_execs(container).await;
        let api = self.docker.api();
        Ok(bounded("pause", QUICK, api.pause_container(container)).await?)
    }

    /// Waits (within [`QUICK`]) until every exec docker lists for `container` has a process
    /// or has ended: one still being set up has neither.
    async fn settle_execs(&self, container: &str) {
        let api = self.docker.api();
        let until = tokio::time::Instant::now() + QUICK;
        loop {
            let Ok(inspected) =
                bounded("inspect", QUICK, api.inspect_container(container, None)).await
            else {
                return;
            };
            let mut starting = false;
            for id in inspected.exec_ids.unwrap_or_default() {
                if let Ok(exec) = bounded("exec inspect", QUICK, api.inspect_exec(&id)).await
                    && exec.exit_code.is_none()
                    && exec.pid.unwrap_or(0) == 0
                {
                    starting = true;
                    break;
                }
            }
            if !starting || tokio::time::Instant::now() >= until {
                return;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    pub async fn unpause(&self, container: &str) -> Result<(), VmError> {
        let api = self.docker.api();
        Ok(bounded("unpause", QUICK, api.unpause_container(container)).await?)
    }

    /// Removes the containers of simulators that are gone (their owner process died before
    /// its own shutdown could).
    pub async fn sweep_orphans(&self) -> usize {
        let options = ListContainersOptions {
            all: true,
            filters: Some(HashMap::from([(
                "label".to_owned(),
                vec![format!("{LABEL}=e2b")],
            )])),
            ..Default::default()
        };
        let api = self.docker.api();
        let Ok(list) = bounded("list", QUICK, api.list_containers(Some(options))).await else {
            return 0;
        };
        let mut removed = 0;
        for container in list {
            let labels = container.labels.unwrap_or_default();
            let ours = labels.get(LABEL_INSTANCE) == Some(&self.instance);
            let orphan = labels
                .get(LABEL_OWNER)
                .is_some_and(|owner| !owner_alive(owner));
            if !ours
                && orphan
                && let Some(id) = container.id
            {
                self.remove(&id).await;
                removed += 1;
            }
        }
        removed
    }

    /// Removes every VM of this simulator (at shutdown), listing again until none is left;
    /// answers how many could not be removed.
    pub async fn remove_every(&self) -> usize {
        self.docker
            .remove_every(&format!("{LABEL_INSTANCE}={}", self.instance))
            .await
    }

    /// Starts `argv` in `container` as `user` with output attached (and stdin when `stdin`).
    pub async fn exec(
        &self,
        container: &str,
        user: &str,
        argv: Vec<String>,
        stdin: bool,
    ) -> Result<Exec, VmError> {
        let command = engine::Command {
            working_dir: Some("/".to_owned()),
            closed_stdin: !stdin,
            ..engine::Command::new(argv, user)
        };
        let attached = {
            let _not_pausing = self.pausing.read().await;
            self.docker.exec(container, command).await?
        };
        Ok(Exec {
            output: attached.output,
            input: stdin.then_some(attached.input),
            decoder: Decoder::default(),
            stderr: Vec::new(),
            idle: Some(AGENT_IDLE),
        })
    }

    /// Runs the agent with `args` as `user`, feeding `stdin` when given.
    pub async fn agent(
        &self,
        container: &str,
        user: &str,
        args: &[&str],
        stdin: bool,
    ) -> Result<Exec, VmError> {
        let mut argv = vec![AGENT_PATH.to_owned(), "guest".to_owned()];
        argv.extend(args.iter().map(|a| (*a).to_owned()));
        self.exec(container, user, argv, stdin).await
    }
}

/// An attached exec of the agent: frames out, bytes in.
pub struct Exec {
    output: Output,
    input: Option<Input>,
    decoder: Decoder,
    /// What the agent said on stderr (kept for error messages, bounded).
    stderr: Vec<u8>,
    /// The longest silence [`Exec::next_frame`] waits out.
    idle: Option<Duration>,
}

// === impl Exec ===

impl Exec {
    /// The exec's stdin, once.
    pub fn take_input(&mut self) -> Option<Input> {
        self.input.take()
    }

    /// Waits for output as long as it takes (`None`), or at most `idle` between pieces.
    pub fn set_idle(&mut self, idle: Option<Duration>) {
        self.idle = idle;
    }

    /// The next frame; `None` when the agent's output ended cleanly between frames.
    pub async fn next_frame(&mut self) -> Result<Option<Frame>, VmError> {
        loop {
            if let Some(frame) = self.decoder.next_frame()? {
                return Ok(Some(frame));
            }
            let next = match self.idle {
                Some(budget) => match tokio::time::timeout(budget, self.output.next()).await {
                    Ok(next) => next,
                    Err(_) => {
                        return Err(DockerError::Timeout {
                            call: "agent output",
                            budget,
                        }
                        .into());
                    }
                },
                None => self.output.next().await,
            };
            match next {
                Some(Ok(LogOutput::StdOut { message })) => self.decoder.push(&message),
                Some(Ok(LogOutput::StdErr { message })) => {
                    if self.stderr.len() < 4096 {
                        self.stderr.extend_from_slice(&message);
                    }
                }
                Some(Ok(_)) => {}
                Some(Err(source)) => {
                    return Err(DockerError::Api {
                        call: "exec output",
                        source: Box::new(source),
                    }
                    .into());
                }
                None if self.decoder.pending() == 0 => return Ok(None),
                None => return Err(VmError::Truncated(self.stderr_note())),
            }
        }
    }

    /// The next frame, where ending without one is an error.
    pub async fn expect_frame(&mut self) -> Result<Frame, VmError> {
        self.next_frame()
            .await?
            .ok_or_else(|| VmError::Truncated(self.stderr_note()))
    }

    fn stderr_note(&self) -> String {
        if self.stderr.is_empty() {
            String::new()
        } else {
            format!(": {}", String::from_utf8_lossy(&self.stderr).trim())
        }
    }
}

/// `<pid>:<start time>` of this process, so a sweep can tell a live owner from a reused pid.
fn owner_stamp() -> String {
    let pid = std::process::id();
    format!("{pid}:{}", start_time(pid).unwrap_or_default())
}

fn owner_alive(stamp: &str) -> bool {
    let Some((pid, started)) = stamp.split_once(':') else {
        return false;
    };
    let Ok(pid) = pid.parse::<u32>() else {
        return false;
    };
    start_time(pid).is_some_and(|now| now == started)
}

/// Field 22 of `/proc/<pid>/stat` (after the command name, which may hold spaces).
fn start_time(pid: u32) -> Option<String> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let after_name = &stat[stat.rfind(')')? + 1..];
    after_name.split_whitespace().nth(19).map(str::to_owned)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_process_is_a_live_owner_and_a_made_up_one_is_not() {
        assert!(owner_alive(&owner_stamp()));
        assert!(!owner_alive(&format!("{}:1", std::process::id())));
        assert!(!owner_alive("not-a-stamp"));
    }
}
