//! The gateway's API as the provider calls it (grants.md §8.1): gRPC over HTTP/2 with mutual
//! TLS through rustls, no proxy, reads capped at 4 MiB, each unary call under its own budget.
//!
//! tonic's connector dials the configured host itself and never reads proxy variables, and
//! gRPC has no redirects to follow. The only roots trusted are the operator's CA file; the
//! client certificate is presented on every connection. Every request that selects a
//! workspace names `default`.

use std::future::Future;
use std::time::Duration;

use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};
use tonic::{Code, Status, Streaming};

use super::config::OpenShellConfig;
use super::proto::datamodel::v1::{WorkspaceSelector, workspace_selector};
use super::proto::sandbox::v1::{GetSandboxConfigRequest, GetSandboxConfigResponse};
use super::proto::v1::open_shell_client::OpenShellClient;
use super::proto::v1::*;

/// The workspace every request names.
pub const WORKSPACE: &str = "default";
/// The largest message read from the gateway (tonic's default, stated).
pub const MAX_MESSAGE: usize = 4 << 20;
/// How long a connection may take to set up.
const CONNECT: Duration = Duration::from_secs(10);
/// The budget of one quick unary call.
pub const QUICK: Duration = Duration::from_secs(10);
/// The budget of a create or a delete (the gateway answers before the container exists).
pub const SLOW: Duration = Duration::from_secs(30);

/// Why a gateway call failed.
#[derive(Debug, thiserror::Error)]
pub enum GatewayError {
    /// The gateway (or the connection to it) answered with a gRPC status.
    #[error("gateway {call}: {code:?}: {message}")]
    Status {
        call: &'static str,
        code: Code,
        message: String,
    },
    /// No answer within the call's budget.
    #[error("gateway {call} did not answer within {budget:?}")]
    Timeout {
        call: &'static str,
        budget: Duration,
    },
}

impl GatewayError {
    fn status(call: &'static str, status: &Status) -> GatewayError {
        // The gateway's message is for the log; cap it so a hostile one cannot flood it.
        let message: String = status.message().chars().take(512).collect();
        GatewayError::Status {
            call,
            code: status.code(),
            message,
        }
    }

    /// The gRPC code, when the gateway answered with one.
    pub fn code(&self) -> Option<Code> {
        match self {
            GatewayError::Status { code, .. } => Some(*code),
            GatewayError::Timeout { .. } => None,
        }
    }

    /// Whether the gateway said the thing is not there.
    pub fn is_not_found(&self) -> bool {
        self.code() == Some(Code::NotFound)
    }
}

/// Why the client could not be made from the operator's files.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// A TLS file could not be read.
    #[error("{var} {path}: {source}")]
    File {
        var: &'static str,
        path: std::path::PathBuf,
        source: std::io::Error,
    },
    /// tonic refused the endpoint or the TLS material.
    #[error("the gateway endpoint {uri}: {source}")]
    Endpoint {
        uri: String,
        source: tonic::transport::Error,
    },
}

/// The workspace selector every request carries.
pub fn workspace() -> Option<WorkspaceSelector> {
    Some(WorkspaceSelector {
        selection: Some(workspace_selector::Selection::Workspace(
            WORKSPACE.to_owned(),
        )),
    })
}

/// A client of one gateway. Cheap to clone (one shared HTTP/2 connection).
#[derive(Clone)]
pub struct Gateway {
    client: OpenShellClient<Channel>,
    uri: String,
}

impl Gateway {
    /// A client for `config`'s gateway; reads the TLS files, connects lazily.
    pub fn new(config: &OpenShellConfig) -> Result<Gateway, ClientError> {
        use crate::config::env::{
            ENV_OPENSHELL_CA_FILE, ENV_OPENSHELL_CERT_FILE, ENV_OPENSHELL_KEY_FILE,
        };
        let read = |var: &'static str, path: &std::path::Path| {
            std::fs::read(path).map_err(|source| ClientError::File {
                var,
                path: path.to_owned(),
                source,
            })
        };
        let ca = read(ENV_OPENSHELL_CA_FILE, &config.ca_file)?;
        let cert = read(ENV_OPENSHELL_CERT_FILE, &config.cert_file)?;
        let key = read(ENV_OPENSHELL_KEY_FILE, &config.key_file)?;
        let uri = config.gateway.uri();
        let fail = |source| ClientError::Endpoint {
            uri: uri.clone(),
            source,
        };
        let tls = ClientTlsConfig::new()
            .ca_certificate(Certificate::from_pem(ca))
            .identity(Identity::from_pem(cert, key))
            .domain_name(config.gateway.server_name());
        let channel = Endpoint::from_shared(uri.clone())
            .map_err(fail)?
            .tls_config(tls)
            .map_err(fail)?
            .connect_timeout(CONNECT)
            .tcp_nodelay(true)
            .http2_keep_alive_interval(Duration::from_secs(30))
            .keep_alive_timeout(Duration::from_secs(20))
            .connect_lazy();
        let client = OpenShellClient::new(channel)
            .max_decoding_message_size(MAX_MESSAGE)
            .max_encoding_message_size(MAX_MESSAGE);
        Ok(Gateway { client, uri })
    }

    /// The gateway's URL, for the log.
    pub fn uri(&self) -> &str {
        &self.uri
    }

    async fn unary<T>(
        &self,
        call: &'static str,
        budget: Duration,
        fut: impl Future<Output = Result<tonic::Response<T>, Status>>,
    ) -> Result<T, GatewayError> {
        match tokio::time::timeout(budget, fut).await {
            Ok(Ok(answer)) => Ok(answer.into_inner()),
            Ok(Err(status)) => Err(GatewayError::status(call, &status)),
            Err(_) => Err(GatewayError::Timeout { call, budget }),
        }
    }

    /// `GetGatewayInfo`.
    pub async fn gateway_info(&self) -> Result<GetGatewayInfoResponse, GatewayError> {
        let mut c = self.client.clone();
        self.unary(
            "GetGatewayInfo",
            QUICK,
            c.get_gateway_info(GetGatewayInfoRequest {}),
        )
        .await
    }

    /// `CreateSandbox`.
    pub async fn create(&self, request: CreateSandboxRequest) -> Result<Sandbox, GatewayError> {
        let mut c = self.client.clone();
        let answer = self
            .unary("CreateSandbox", SLOW, c.create_sandbox(request))
            .await?;
        answer.sandbox.ok_or(GatewayError::Status {
            call: "CreateSandbox",
            code: Code::Internal,
            message: "the answer carries no sandbox".into(),
        })
    }

    /// `GetSandbox`.
    pub async fn get(&self, name: &str) -> Result<Sandbox, GatewayError> {
        let mut c = self.client.clone();
        let request = GetSandboxRequest {
            workspace_scope: workspace(),
            name: name.to_owned(),
        };
        let answer = self
            .unary("GetSandbox", QUICK, c.get_sandbox(request))
            .await?;
        answer.sandbox.ok_or(GatewayError::Status {
            call: "GetSandbox",
            code: Code::Internal,
            message: "the answer carries no sandbox".into(),
        })
    }

    /// One page of `ListSandboxes`.
    pub async fn list(
        &self,
        label_selector: &str,
        page_size: i32,
        page_token: String,
    ) -> Result<ListSandboxesResponse, GatewayError> {
        let mut c = self.client.clone();
        let request = ListSandboxesRequest {
            workspace_scope: workspace(),
            page_size,
            page_token,
            label_selector: label_selector.to_owned(),
        };
        self.unary("ListSandboxes", QUICK, c.list_sandboxes(request))
            .await
    }

    /// `DeleteSandbox` with `allow_missing`.
    pub async fn delete(&self, name: &str) -> Result<DeletionOutcome, GatewayError> {
        let mut c = self.client.clone();
        let request = DeleteSandboxRequest {
            workspace_scope: workspace(),
            name: name.to_owned(),
            allow_missing: true,
            request_id: String::new(),
        };
        let answer = self
            .unary("DeleteSandbox", SLOW, c.delete_sandbox(request))
            .await?;
        Ok(DeletionOutcome::try_from(answer.outcome).unwrap_or(DeletionOutcome::Unspecified))
    }

    /// `StopSandbox`.
    pub async fn stop(&self, name: &str) -> Result<Sandbox, GatewayError> {
        let mut c = self.client.clone();
        let request = StopSandboxRequest {
            workspace_scope: workspace(),
            name: name.to_owned(),
            request_id: String::new(),
        };
        let answer = self
            .unary("StopSandbox", SLOW, c.stop_sandbox(request))
            .await?;
        answer.sandbox.ok_or(GatewayError::Status {
            call: "StopSandbox",
            code: Code::Internal,
            message: "the answer carries no sandbox".into(),
        })
    }

    /// `StartSandbox`.
    pub async fn start(&self, name: &str) -> Result<Sandbox, GatewayError> {
        let mut c = self.client.clone();
        let request = StartSandboxRequest {
            workspace_scope: workspace(),
            name: name.to_owned(),
            request_id: String::new(),
        };
        let answer = self
            .unary("StartSandbox", SLOW, c.start_sandbox(request))
            .await?;
        answer.sandbox.ok_or(GatewayError::Status {
            call: "StartSandbox",
            code: Code::Internal,
            message: "the answer carries no sandbox".into(),
        })
    }

    /// `GetSandboxConfig`.
    pub async fn config(&self, name: &str) -> Result<GetSandboxConfigResponse, GatewayError> {
        let mut c = self.client.clone();
        let request = GetSandboxConfigRequest {
            workspace_scope: workspace(),
            name: name.to_owned(),
        };
        self.unary("GetSandboxConfig", QUICK, c.get_sandbox_config(request))
            .await
    }

    /// `CreateSshSession` for a sandbox: a token that authorizes `ForwardTcp` into it.
    pub async fn create_ssh_session(
        &self,
        sandbox: &str,
    ) -> Result<CreateSshSessionResponse, GatewayError> {
        let mut c = self.client.clone();
        let request = CreateSshSessionRequest {
            workspace_scope: workspace(),
            sandbox: sandbox.to_owned(),
        };
        self.unary("CreateSshSession", QUICK, c.create_ssh_session(request))
            .await
    }

    /// `RevokeSshSession` with `allow_missing`.
    pub async fn revoke_ssh_session(&self, token: &str) -> Result<(), GatewayError> {
        let mut c = self.client.clone();
        let request = RevokeSshSessionRequest {
            token: token.to_owned(),
            allow_missing: true,
        };
        self.unary("RevokeSshSession", QUICK, c.revoke_ssh_session(request))
            .await
            .map(drop)
    }

    /// `ExecSandboxInteractive`: `input` carries the start frame, then stdin; the answer's
    /// events follow. Dropping the answer cancels the stream (the gateway kills the
    /// command's process group).
    pub async fn exec(
        &self,
        input: ReceiverStream<ExecSandboxInput>,
    ) -> Result<Streaming<ExecSandboxEvent>, GatewayError> {
        let mut c = self.client.clone();
        self.unary(
            "ExecSandboxInteractive",
            SLOW,
            c.exec_sandbox_interactive(input),
        )
        .await
    }

    /// `ForwardTcp`: `input` carries the init frame, then data; the answer's data follows.
    pub async fn forward_tcp(
        &self,
        input: ReceiverStream<TcpForwardFrame>,
    ) -> Result<Streaming<TcpForwardFrame>, GatewayError> {
        let mut c = self.client.clone();
        self.unary("ForwardTcp", QUICK, c.forward_tcp(input)).await
    }
}
