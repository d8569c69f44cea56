//! Docker's side of the guest exec trait ([`GuestExec`]): commands in one running container
//! over the Engine's exec API ([`exec::run`] and [`exec::attach`]).
//!
//! Every argv goes through [`exec::env_argv`], so the command's environment is exactly the one
//! given (a docker exec would otherwise inherit the container's). Docker cannot kill an exec:
//! a command past its deadline is left to the session's sweep, and a held command ends when its
//! stdin closes.

use async_trait::async_trait;
use tokio::io::{AsyncWrite, AsyncWriteExt};

use super::engine::Engine;
use super::exec::{self, AttachedStdout, ExecSpec};
use crate::provider::guest::{Command, ExecError, GuestExec, Held, HeldInput, HeldOutput, Ran};

/// One container, reached over `docker exec`.
#[derive(Clone)]
pub(super) struct ContainerExec {
    engine: Engine,
    container: String,
}

/// A held exec's stdin.
struct Stdin(std::pin::Pin<Box<dyn AsyncWrite + Send>>);

// === impl ContainerExec ===

impl ContainerExec {
    /// Commands in `container`.
    pub(super) fn new(engine: &Engine, container: &str) -> ContainerExec {
        ContainerExec {
            engine: engine.clone(),
            container: container.to_owned(),
        }
    }
}

#[async_trait]
impl GuestExec for ContainerExec {
    async fn run(&self, command: Command<'_>) -> Result<Ran, ExecError> {
        let argv = exec::env_argv(command.env, command.argv);
        let spec = ExecSpec {
            argv: &argv,
            user: command.user,
            workdir: None,
            stdin: command.stdin,
            stdout_cap: command.stdout_cap,
            stderr_cap: command.stderr_cap,
            deadline: command.deadline,
        };
        let out = exec::run(&self.engine, &self.container, &spec)
            .await
            .map_err(|e| ExecError::Refused(e.to_string()))?;
        Ok(Ran {
            exit_code: out.exit_code,
            stdout: out.stdout,
            stderr: out.stderr,
            stdout_truncated: out.stdout_truncated,
            stderr_truncated: out.stderr_truncated,
            timed_out: out.timed_out,
        })
    }

    async fn start(&self, command: Command<'_>) -> Result<Held, ExecError> {
        let argv = exec::env_argv(command.env, command.argv);
        let attach = exec::attach(
            &self.engine,
            &self.container,
            &argv,
            command.user,
            None,
            command.stderr_cap,
        );
        let attached = match tokio::time::timeout_at(command.deadline, attach).await {
            Ok(attached) => attached.map_err(|e| ExecError::Refused(e.to_string()))?,
            Err(_) => {
                return Err(ExecError::Refused(
                    "docker did not start the exec in time".to_owned(),
                ));
            }
        };
        Ok(Held {
            stdin: Box::new(Stdin(attached.stdin)),
            stdout: Box::new(attached.stdout),
        })
    }
}

#[async_trait]
impl HeldInput for Stdin {
    async fn write(&mut self, bytes: Vec<u8>) -> Result<(), ExecError> {
        let written = async {
            self.0.write_all(&bytes).await?;
            self.0.flush().await
        };
        written.await.map_err(|e| ExecError::Closed(e.to_string()))
    }

    async fn close(&mut self) {
        let _ = self.0.shutdown().await;
    }
}

#[async_trait]
impl HeldOutput for AttachedStdout {
    async fn next(&mut self) -> Option<Vec<u8>> {
        AttachedStdout::next(self).await
    }

    fn stderr(&self) -> &[u8] {
        AttachedStdout::stderr(self)
    }
}
