//! The Docker Engine API, as the provider uses it: bollard over one local Unix socket, and
//! every call under its own timeout.
//!
//! The timeouts are the point of this file. bollard bounds only the wait for response
//! headers, and a streaming body (attach, wait) can stay open forever: a gVisor sandbox that
//! dies in the middle of a call can leave the call hanging. So each method here is wrapped in
//! [`tokio::time::timeout`] with a budget named for the call, and a call that runs out is a
//! [`DockerError::Timeout`] naming it.

use std::collections::HashMap;
use std::future::Future;
use std::path::Path;
use std::time::Duration;

use bollard::container::AttachContainerResults;
use bollard::models::{
    ContainerCreateBody, ContainerInspectResponse, ContainerSummary, ImageInspect, SystemInfo,
    SystemVersion,
};
use bollard::query_parameters::{
    AttachContainerOptions, CreateContainerOptions, InspectContainerOptions, ListContainersOptions,
    RemoveContainerOptions, WaitContainerOptions,
};
use futures::StreamExt;

use super::DockerError;

/// The Engine API version asked for before negotiation: the oldest this provider needs
/// (Docker 20.10). Negotiation moves it up to what both sides speak.
const MIN_API: bollard::ClientVersion = bollard::ClientVersion {
    major_version: 1,
    minor_version: 41,
};

/// bollard's own header timeout, in seconds; every call here has a tighter budget of its own.
const HEADER_TIMEOUT_SECS: u64 = 120;

/// The budget of a quick call (ping, info, inspect, list, create).
pub(super) const QUICK: Duration = Duration::from_secs(10);
/// The budget of starting a container (gVisor boots a sandbox here).
pub(super) const START: Duration = Duration::from_secs(20);

/// One Engine endpoint, with the API version negotiated.
#[derive(Debug, Clone)]
pub(super) struct Engine {
    docker: bollard::Docker,
}

async fn bounded<T, E>(
    call: &'static str,
    budget: Duration,
    fut: impl Future<Output = Result<T, E>>,
) -> Result<T, DockerError>
where
    E: Into<DockerError>,
{
    match tokio::time::timeout(budget, fut).await {
        Ok(result) => result.map_err(Into::into),
        Err(_) => Err(DockerError::Timeout { call, budget }),
    }
}

impl From<bollard::errors::Error> for DockerError {
    fn from(source: bollard::errors::Error) -> Self {
        DockerError::Api(Box::new(source))
    }
}

// === impl Engine ===

impl Engine {
    /// Connects to the socket and negotiates the API version (one `/version` call).
    pub(super) async fn connect(socket: &Path) -> Result<Engine, DockerError> {
        let path = socket.to_string_lossy();
        let docker = bollard::Docker::connect_with_unix(&path, HEADER_TIMEOUT_SECS, &MIN_API)
            .map_err(|source| DockerError::Connect {
                socket: socket.to_path_buf(),
                source: Box::new(source),
            })?;
        let docker = bounded("version negotiation", QUICK, docker.negotiate_version()).await?;
        Ok(Engine { docker })
    }

    /// The bollard client, for the exec calls of [`super::exec`] (which bound each call
    /// themselves).
    pub(super) fn api(&self) -> &bollard::Docker {
        &self.docker
    }

    pub(super) async fn ping(&self) -> Result<(), DockerError> {
        bounded("ping", QUICK, self.docker.ping()).await.map(drop)
    }

    pub(super) async fn info(&self) -> Result<SystemInfo, DockerError> {
        bounded("info", QUICK, self.docker.info()).await
    }

    pub(super) async fn version(&self) -> Result<SystemVersion, DockerError> {
        bounded("version", QUICK, self.docker.version()).await
    }

    pub(super) async fn inspect_image(&self, reference: &str) -> Result<ImageInspect, DockerError> {
        bounded("image inspect", QUICK, self.docker.inspect_image(reference)).await
    }

    /// Creates a container and returns its id.
    pub(super) async fn create(
        &self,
        name: &str,
        body: ContainerCreateBody,
    ) -> Result<String, DockerError> {
        let options = CreateContainerOptions {
            name: Some(name.to_owned()),
            platform: String::new(),
        };
        let created = bounded(
            "container create",
            QUICK,
            self.docker.create_container(Some(options), body),
        )
        .await?;
        Ok(created.id)
    }

    /// Attaches to stdin, stdout and stderr before the start, so no output is lost.
    pub(super) async fn attach(&self, id: &str) -> Result<AttachContainerResults, DockerError> {
        let options = AttachContainerOptions {
            stdin: true,
            stdout: true,
            stderr: true,
            stream: true,
            logs: false,
            detach_keys: None,
        };
        bounded(
            "container attach",
            QUICK,
            self.docker.attach_container(id, Some(options)),
        )
        .await
    }

    pub(super) async fn start(&self, id: &str) -> Result<(), DockerError> {
        bounded(
            "container start",
            START,
            self.docker.start_container(id, None),
        )
        .await
    }

    /// The container's exit code once it is not running, within `budget`.
    pub(super) async fn wait(&self, id: &str, budget: Duration) -> Result<i64, DockerError> {
        let options = WaitContainerOptions {
            condition: "not-running".to_owned(),
        };
        let mut stream = self.docker.wait_container(id, Some(options));
        let next = async move {
            match stream.next().await {
                Some(Ok(answer)) => Ok(answer.status_code),
                // bollard turns a non-zero exit into an error that carries the code.
                Some(Err(bollard::errors::Error::DockerContainerWaitError { code, .. })) => {
                    Ok(code)
                }
                Some(Err(e)) => Err(DockerError::from(e)),
                None => Err(DockerError::WaitEnded),
            }
        };
        bounded("container wait", budget, next).await
    }

    pub(super) async fn inspect_container(
        &self,
        id: &str,
    ) -> Result<ContainerInspectResponse, DockerError> {
        bounded(
            "container inspect",
            QUICK,
            self.docker
                .inspect_container(id, None::<InspectContainerOptions>),
        )
        .await
    }

    /// `rm -f`, without reading the answer: success is judged by listing afterwards.
    pub(super) async fn force_remove(&self, name: &str) -> Result<(), DockerError> {
        let options = RemoveContainerOptions {
            force: true,
            v: true,
            link: false,
        };
        bounded(
            "container remove",
            QUICK,
            self.docker.remove_container(name, Some(options)),
        )
        .await
    }

    /// Every container (running or not) whose name is exactly `name`.
    pub(super) async fn list_named(
        &self,
        name: &str,
    ) -> Result<Vec<ContainerSummary>, DockerError> {
        self.list(HashMap::from([(
            "name".to_owned(),
            vec![format!("^/{name}$")],
        )]))
        .await
    }

    /// Every container (running or not) that carries `label`.
    pub(super) async fn list_labelled(
        &self,
        label: &str,
    ) -> Result<Vec<ContainerSummary>, DockerError> {
        self.list(HashMap::from([(
            "label".to_owned(),
            vec![label.to_owned()],
        )]))
        .await
    }

    async fn list(
        &self,
        filters: HashMap<String, Vec<String>>,
    ) -> Result<Vec<ContainerSummary>, DockerError> {
        let options = ListContainersOptions {
            all: true,
            filters: Some(filters),
            ..Default::default()
        };
        bounded(
            "container list",
            QUICK,
            self.docker.list_containers(Some(options)),
        )
        .await
    }
}
