//! The compute side: each sandbox is one local container, driven through the Docker Engine
//! API with the calls every simulator shares ([`sim_support::docker`]).
//!
//! A sandbox container is locked down: no network at all (the account's deny-all egress;
//! the guard's one destination is a forwarder, see [`crate::egress`]), a read-only root
//! with a writable `/tmp`, every capability dropped, no new privileges, a process limit,
//! the requested memory and CPUs, and `--init` so orphans are reaped.

use std::path::Path;

use bollard::container::LogOutput;
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
