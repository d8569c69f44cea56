//! The official Rust client: calls a plimsolld, then re-checks the tier and every record.
//!
//! A [`Client`] states the protocol number on every request, validates each request with
//! the daemon's own rules before sending it, binds every answer to its request with a fresh
//! `Plimsoll-Request-Id`, recomputes the request and result digests and checks the run
//! record against them, checks the tier the answer states against the caller's floor, and,
//! in a [`Session`], follows the chain of records so that a call it did not make is caught.
//! Anything that does not check is a `data_loss` [`ClientError`]: the run may have executed,
//! so it is never retried automatically.
//!
//! # Example
//!
//! ```no_run
//! use std::time::Duration;
//! use plimsoll::client::{Client, RunOptions};
//!
//! # async fn demo() -> Result<(), plimsoll::client::ClientError> {
//! let client = Client::builder("http://127.0.0.1:8746")
//!     .token("a-bearer-token-with-code-run-scope")
//!     .build()?;
//! let info = client.describe().await?;
//! println!("{} at tier {}", info.sandbox, info.isolation);
//!
//! let opts = RunOptions::new()
//!     .minimum_isolation("process")
//!     .timeout(Duration::from_secs(10));
//! match client.run_javascript("console.log(6*7)", &opts).await {
//!     Ok(answer) => {
//!         let js = answer.javascript().map(|j| j.stdout.clone()).unwrap_or_default();
//!         println!("{}", String::from_utf8_lossy(&js));
//!         println!("record {}", answer.record().record_sha256);
//!     }
//!     // Refused: provably nothing ran; safe to retry elsewhere.
//!     Err(e) if e.not_dispatched_reason().is_some() => eprintln!("refused: {e}"),
//!     // May have run: never retried automatically.
//!     Err(e) => eprintln!("may have run: {e}"),
//! }
//! # Ok(())
//! # }
//! ```
//!
//! `examples/verify_record.rs` runs a snippet against a daemon, saves the answer and
//! re-checks it offline: `cargo run -p plimsoll --features client --example verify_record`.
//!
//! # Tour
//!
//! - [`Client`] / [`ClientBuilder`]: the daemon's URL, bearer token, request timeout
//!   (default 360 s, the whole exchange), HTTP/1.1 or h2c, and with the `tls` feature a
//!   custom CA. One connection per call; a `Client` is cheap to clone and share.
//! - [`RunOptions`] and [`SessionOptions`]: floor, timeout, trace id, software rule, grant
//!   profile, owner.
//! - [`RunAnswer`]: the request as sent and the response as received, checked; it
//!   serializes to what `plimsoll verify` re-checks offline.
//! - [`Session`]: a sandbox kept for many calls, with the chain of its records.
//! - [`ClientError`]: one variant per kind of failure; [`ClientError::not_dispatched_reason`]
//!   tells "nothing ran" from "may have run".

mod answer;
mod endpoint;
mod error;
mod options;
mod restore;
mod session;
mod transport;

use std::time::Duration;

pub use answer::RunAnswer;
pub use error::{ClientError, Failure, Mark};
pub use options::{RunOptions, SessionOptions, owner_digest};
pub use session::{Opened, Session, SessionAnswer, SessionState, verify_chain, verify_session};
pub use transport::{MAX_RESPONSE_BYTES, NOT_DISPATCHED_HEADER, REQUEST_ID_HEADER};

use answer::check_run;
use endpoint::Endpoint;
use error::{Failure as F, data_loss, invalid, refused};
use transport::Transport;

use crate::payload::PayloadKind;
use crate::record::{self, check_single, session_fingerprint};
use crate::refusal::{PROTOCOL, Refusal};
use crate::validate;
use crate::wire::{
    DescribeRequest, DescribeResponse, JavaScriptRun, OpenSessionRequest, OpenSessionResponse,
    ProjectFile, ProjectRun, RunRequest, RunResponse, run_request,
};

/// Seconds one HTTP exchange may take by default: six minutes, above the daemon's
/// five-minute ceiling on a run.
pub const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_secs(360);

/// Builds a [`Client`]. Nothing is checked until [`ClientBuilder::build`].
#[derive(Clone)]
pub struct ClientBuilder {
    url: String,
    token: Option<String>,
    timeout: Duration,
    http2: bool,
    insecure_http: bool,
    ca_pem: Option<Vec<u8>>,
}

// By hand: the token is never printed, only whether there is one.
impl std::fmt::Debug for ClientBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientBuilder")
            .field("url", &self.url)
            .field("token", &self.token.as_ref().map(|_| "<redacted>"))
            .field("timeout", &self.timeout)
            .field("http2", &self.http2)
            .field("insecure_http", &self.insecure_http)
            .field("ca_pem", &self.ca_pem.as_ref().map(Vec::len))
            .finish()
    }
}

impl ClientBuilder {
    /// A bearer token with the `code:run` scope. Default: none (a development daemon).
    /// Visible ASCII only; it is never logged or put in an error.
    pub fn token(mut self, token: impl Into<String>) -> ClientBuilder {
        let token = token.into();
        self.token = (!token.is_empty()).then_some(token);
        self
    }

    /// Bounds each whole exchange, from name lookup to the answer's last byte. Default
    /// [`DEFAULT_REQUEST_TIMEOUT`]; must not be zero.
    pub fn request_timeout(mut self, timeout: Duration) -> ClientBuilder {
        self.timeout = timeout;
        self
    }

    /// Cleartext only: speak prior-knowledge HTTP/2 (h2c) instead of HTTP/1.1. Default
    /// `false`. Over TLS, ALPN picks `h2` when the daemon offers it, whatever this says.
    pub fn http2(mut self, yes: bool) -> ClientBuilder {
        self.http2 = yes;
        self
    }

    /// Allows cleartext HTTP to a host that is not loopback. Default `false`: the token and
    /// the code would cross the network unencrypted. For development only.
    pub fn insecure_http(mut self, yes: bool) -> ClientBuilder {
        self.insecure_http = yes;
        self
    }

    /// Trusts only the certificate authorities in `pem` (one or more PEM certificates) for
    /// https, instead of the system's roots. Needs the `tls` feature.
    pub fn ca_pem(mut self, pem: impl Into<Vec<u8>>) -> ClientBuilder {
        self.ca_pem = Some(pem.into());
        self
    }

    /// Checks the settings and builds the client. Fails with
    /// [`ClientError::InvalidBaseUrl`], [`ClientError::InsecureHttp`] or
    /// [`ClientError::InvalidOption`]; opens no connection.
    pub fn build(self) -> Result<Client, ClientError> {
        let endpoint = Endpoint::parse(&self.url, self.insecure_http)?;
        if let Some(t) = &self.token
            && !t.bytes().all(|b| (0x21..=0x7e).contains(&b))
        {
            return Err(option("the token must be visible ASCII characters"));
        }
        if self.timeout.is_zero() {
            return Err(option("request_timeout must be positive"));
        }
        #[cfg(feature = "tls")]
        let tls = if endpoint.https {
            Some(tls_config(self.ca_pem.as_deref())?)
        } else {
            None
        };
        #[cfg(not(feature = "tls"))]
        if endpoint.https || self.ca_pem.is_some() {
            return Err(option(
                "https needs the `tls` feature of the plimsoll crate",
            ));
        }
        Ok(Client {
            transport: Transport {
                endpoint,
                token: self.token,
                timeout: self.timeout,
                http2: self.http2,
                #[cfg(feature = "tls")]
                tls,
            },
        })
    }
}

fn option(message: &str) -> ClientError {
    ClientError::InvalidOption(Box::new(F::new(
        "invalid_argument",
        format!("plimsoll: {message}"),
    )))
}

#[cfg(feature = "tls")]
fn tls_config(ca_pem: Option<&[u8]>) -> Result<std::sync::Arc<rustls::ClientConfig>, ClientError> {
    let mut roots = rustls::RootCertStore::empty();
    match ca_pem {
        Some(pem) => {
            let mut reader = pem;
            for cert in rustls_pemfile::certs(&mut reader) {
                let cert = cert.map_err(|e| option(&format!("the CA file is not PEM: {e}")))?;
                roots
                    .add(cert)
                    .map_err(|e| option(&format!("the CA certificate is unusable: {e}")))?;
            }
            if roots.is_empty() {
                return Err(option("the CA file holds no certificate"));
            }
        }
        None => {
            // Unreadable system certificates are skipped; with none at all every
            // handshake fails, marked `environment`.
            for cert in rustls_native_certs::load_native_certs().certs {
                let _ = roots.add(cert);
            }
        }
    }
    let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| option(&format!("TLS settings: {e}")))?
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(std::sync::Arc::new(config))
}

/// A client for one plimsolld. Holds no connection between calls; clone it freely.
#[derive(Clone)]
pub struct Client {
    transport: Transport,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client")
            .field("endpoint", &self.transport.endpoint.authority)
            .finish_non_exhaustive()
    }
}

impl Client {
    /// Starts building a client for the daemon at `url`, an absolute http or https URL.
    /// Cleartext http is accepted only to a loopback host unless
    /// [`ClientBuilder::insecure_http`].
    pub fn builder(url: impl Into<String>) -> ClientBuilder {
        ClientBuilder {
            url: url.into(),
            token: None,
            timeout: DEFAULT_REQUEST_TIMEOUT,
            http2: false,
            insecure_http: false,
            ca_pem: None,
        }
    }

    /// What the daemon states about itself. A daemon serving another protocol number
    /// is [`ClientError::ProtocolMismatch`] (marked `protocol`, with the description in
    /// [`Failure::describe`]): every request to it would be refused.
    pub async fn describe(&self) -> Result<DescribeResponse, ClientError> {
        let info: DescribeResponse = self
            .transport
            .call("Describe", &DescribeRequest::default())
            .await?;
        if info.protocol != PROTOCOL {
            let mut err = refused(
                &Refusal::ProtocolMismatch(info.protocol),
                format!(
                    "plimsoll: the daemon serves protocol {} and this client speaks {PROTOCOL}",
                    info.protocol
                ),
            );
            err.failure_mut().describe = Some(Box::new(info));
            return Err(err);
        }
        Ok(info)
    }

    /// Runs a JavaScript snippet in a fresh sandbox and checks the answer.
    pub async fn run_javascript(
        &self,
        code: &str,
        opts: &RunOptions,
    ) -> Result<RunAnswer, ClientError> {
        let js = javascript(code, &opts.grant_profile);
        validate::check_javascript(&js).map_err(|r| invalid(r.to_string()))?;
        self.run(
            run_request::Payload::Javascript(Box::new(js)),
            opts,
            PayloadKind::Javascript,
        )
        .await
    }

    /// Writes `files` (relative path, text) into a fresh sandbox, runs `steps` (shell
    /// commands) in order, stopping at the first that fails, and returns `artifacts`
    /// (relative paths) that exist afterwards.
    pub async fn run_project(
        &self,
        files: &[(String, String)],
        steps: &[String],
        artifacts: &[String],
        opts: &RunOptions,
    ) -> Result<RunAnswer, ClientError> {
        let project = project(files, steps, artifacts, &opts.grant_profile)?;
        self.run(
            run_request::Payload::Project(Box::new(project)),
            opts,
            PayloadKind::Project,
        )
        .await
    }

    /// Sends an already built request through the same validation and checks; its
    /// `protocol` is set to [`PROTOCOL`]. For callers that hold a [`RunRequest`].
    pub async fn run_request(&self, mut request: RunRequest) -> Result<RunAnswer, ClientError> {
        request.protocol = PROTOCOL;
        let kind = validate::check_run_payload(request.payload.as_ref())
            .map_err(|r| invalid(r.to_string()))?;
        let opts = RunOptions {
            floor: request.minimum_isolation.clone(),
            timeout: None,
            trace_id: request.trace_id.clone(),
            rule: request.software_rule.as_option().cloned(),
            grant_profile: String::new(),
        };
        let floor = options::floor(&opts.floor)?;
        options::trace_id(&opts.trace_id)?;
        options::rule(opts.rule.as_ref())?;
        self.send_run(request, floor, kind).await
    }

    async fn run(
        &self,
        payload: run_request::Payload,
        opts: &RunOptions,
        kind: PayloadKind,
    ) -> Result<RunAnswer, ClientError> {
        let floor = options::floor(&opts.floor)?;
        let rule = options::rule(opts.rule.as_ref())?;
        let request = RunRequest {
            protocol: PROTOCOL,
            minimum_isolation: floor.to_string(),
            trace_id: options::trace_id(&opts.trace_id)?,
            timeout_ms: options::timeout_ms(opts.timeout),
            software_rule: rule.into(),
            payload: Some(payload),
            ..Default::default()
        };
        self.send_run(request, floor, kind).await
    }

    async fn send_run(
        &self,
        request: RunRequest,
        floor: crate::tier::Floor,
        kind: PayloadKind,
    ) -> Result<RunAnswer, ClientError> {
        let digest = record::request_digest(&request);
        let response: RunResponse = self.transport.call("Run", &request).await?;
        check_run(kind, &response, floor, || {
            check_single(&digest, request.software_rule.as_option(), &response).cloned()
        })?;
        Ok(RunAnswer { request, response })
    }

    /// Opens a session: one sandbox kept for many calls. Checks that the fingerprint is the
    /// SHA-256 of the id, that the tier meets the floor and that the software satisfies the
    /// rule; on failure it closes the session and fails with `data_loss`.
    pub async fn open_session(&self, opts: &SessionOptions) -> Result<Session, ClientError> {
        let floor = options::floor(&opts.floor)?;
        let rule = options::rule(opts.rule.as_ref())?;
        for l in &opts.languages {
            if !validate::LANGUAGES.contains(&l.as_str()) {
                return Err(invalid(format!(
                    "language {l:?} is unknown: use javascript or python"
                )));
            }
        }
        let owner = match &opts.owner {
            None => String::new(),
            Some(o) if o.is_empty() => {
                return Err(invalid(
                    "owner must not be empty; omit it for a session with no owner",
                ));
            }
            Some(o) => owner_digest(self.transport.token.as_deref(), o),
        };
        let request = OpenSessionRequest {
            protocol: PROTOCOL,
            minimum_isolation: floor.to_string(),
            trace_id: options::trace_id(&opts.trace_id)?,
            lifetime_ms: options::duration_ms(opts.lifetime),
            idle_timeout_ms: options::duration_ms(opts.idle_timeout),
            software_rule: rule.clone().into(),
            languages: opts.languages.clone(),
            owner,
            ..Default::default()
        };
        let open: OpenSessionResponse = self.transport.call("OpenSession", &request).await?;
        let session = Session::new(self.transport.clone(), &open, rule.clone(), floor);
        let problem = if open.session != session_fingerprint(&open.session_id) {
            Some(ClientError::Chain(data_loss(
                "the daemon's session fingerprint does not match its session id; the session was closed",
            )))
        } else if !floor.is_met_by_wire(&open.isolation) {
            Some(ClientError::IsolationEvidenceMismatch(data_loss(format!(
                "the session opened at {}, below the requested minimum {floor}; the session was closed",
                if open.isolation.is_empty() {
                    "unknown"
                } else {
                    &open.isolation
                }
            ))))
        } else if !record::rule_allows(rule.as_ref(), &open.software_identity) {
            Some(ClientError::SoftwareEvidenceMismatch(data_loss(
                "the session's selected software is outside the requested rule; the session was closed",
            )))
        } else {
            None
        };
        if let Some(e) = problem {
            // The open already failed; that error is the one to report.
            let _ = session.close().await;
            return Err(e);
        }
        Ok(session)
    }

    /// Picks up a session from a saved [`SessionState`] (a command line that runs one call
    /// per process). The chain continues from the state's last call.
    pub fn resume_session(&self, state: SessionState) -> Session {
        Session::resume(self.transport.clone(), state)
    }
}

/// A JavaScript payload: the snippet under the call's grant profile.
pub(crate) fn javascript(code: &str, grant_profile: &str) -> JavaScriptRun {
    JavaScriptRun {
        code: code.to_owned(),
        grant_profile: grant_profile.to_owned(),
        ..Default::default()
    }
}

/// A project payload from its parts, validated.
pub(crate) fn project(
    files: &[(String, String)],
    steps: &[String],
    artifacts: &[String],
    grant_profile: &str,
) -> Result<ProjectRun, ClientError> {
    let p = ProjectRun {
        files: files
            .iter()
            .map(|(path, content)| ProjectFile {
                path: path.clone(),
                content: content.clone(),
                ..Default::default()
            })
            .collect(),
        steps: steps.to_vec(),
        artifacts: artifacts.to_vec(),
        grant_profile: grant_profile.to_owned(),
        ..Default::default()
    };
    validate::check_project(&p).map_err(|r| invalid(r.to_string()))?;
    Ok(p)
}
