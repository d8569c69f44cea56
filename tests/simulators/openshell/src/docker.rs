//! The compute side: each sandbox is one local container, driven through the Docker Engine
//! API with the calls every simulator shares ([`sim_support::docker`]).
//!
//! A sandbox container is locked down: no network at all (loopback only: the gateway's
//! deny-all egress), a read-only root with volumes where the policy allows writes (and no
//! `/dev/shm`), every
//! capability dropped, no new privileges, a process limit, the template's memory and CPU
//! limits, and `--init` so orphans are reaped the way OpenShell's supervisor reaps them.

use std::path::Path;

use futures::StreamExt;
use sim_support::docker::{Command, Engine, QUICK};

pub use sim_support::docker::{
    Attached, DockerError, Input, LABEL_INSTANCE, LABEL_SIMULATOR, Output,
};

/// This simulator's value of [`LABEL_SIMULATOR`].
pub const LABEL_SIMULATOR_VALUE: &str = "openshell";

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
