//! A client of a running simulator with its test CA and client certificate, for the
//! repository's benchmarks: the gateway's own exec round trip is their baseline.

use std::time::{Duration, Instant};

use tonic::transport::{Certificate, Channel, ClientTlsConfig, Identity};

use crate::pki::PkiFiles;
use crate::proto::datamodel::v1::WorkspaceSelector;
use crate::proto::datamodel::v1::workspace_selector::Selection;
use crate::proto::v1::ExecSandboxRequest;
use crate::proto::v1::exec_sandbox_event::Payload as Event;
use crate::proto::v1::open_shell_client::OpenShellClient;

/// Why a client call failed.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("reading the test PKI: {0}")]
    Pki(#[from] std::io::Error),
    #[error("connecting: {0}")]
    Transport(#[from] tonic::transport::Error),
    #[error("the gateway answered {0}")]
    Status(#[from] tonic::Status),
    #[error("the exec ended without an exit event")]
    NoExit,
}

/// A mutual-TLS client of the simulator at `grpc_url`.
pub async fn connect(
    grpc_url: &str,
    pki: &PkiFiles,
) -> Result<OpenShellClient<Channel>, ClientError> {
    let tls = ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(std::fs::read(&pki.ca_file)?))
        .domain_name("localhost")
        .identity(Identity::from_pem(
            std::fs::read(&pki.cert_file)?,
            std::fs::read(&pki.key_file)?,
        ));
    let channel = Channel::from_shared(grpc_url.to_owned())
        .map_err(|e| ClientError::Status(tonic::Status::invalid_argument(e.to_string())))?
        .tls_config(tls)?
        .connect()
        .await?;
    Ok(OpenShellClient::new(channel))
}

/// One `ExecSandbox` of `argv` in `sandbox`, from the request to its exit event: answers the
/// exit code and the round trip.
pub async fn exec_round_trip(
    client: &mut OpenShellClient<Channel>,
    sandbox: &str,
    argv: &[&str],
) -> Result<(i32, Duration), ClientError> {
    let began = Instant::now();
    let req = ExecSandboxRequest {
        workspace_scope: Some(WorkspaceSelector {
            selection: Some(Selection::Workspace("default".into())),
        }),
        sandbox: sandbox.to_owned(),
        command: argv.iter().map(|a| (*a).to_owned()).collect(),
        no_login_shell: true,
        ..ExecSandboxRequest::default()
    };
    let mut stream = client.exec_sandbox(req).await?.into_inner();
    while let Some(event) = stream.message().await? {
        if let Some(Event::Exit(x)) = event.payload {
            return Ok((x.exit_code, began.elapsed()));
        }
    }
    Err(ClientError::NoExit)
}
