//! Starting and stopping a whole simulator: three loopback listeners (control plane, envd,
//! admin), the reaper, and the cleanup that leaves no container behind.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use tokio::net::TcpListener;
use tokio::sync::watch;

use crate::app::App;
use crate::config::{Config, Runtime};
use crate::egress::ca::{Ca, CaError};
use crate::vm::{VmError, Vms};

/// Why the simulator could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("docker: {0}")]
    Docker(#[from] VmError),
    #[error("the egress CA: {0}")]
    Ca(#[from] CaError),
    #[error("{what}: {source}")]
    Io {
        what: String,
        source: std::io::Error,
    },
    #[error("the agent binary {0} does not exist")]
    NoAgent(PathBuf),
}

fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> StartError {
    let what = what.into();
    move |source| StartError::Io { what, source }
}

/// A running simulator. [`Simulator::shutdown`] stops it and removes every VM it made; a
/// simulator dropped without it leaves VMs for the next one's sweep.
pub struct Simulator {
    /// `E2B_API_URL`.
    pub api_url: String,
    /// `E2B_SANDBOX_URL`: envd for every sandbox, routed by `E2b-Sandbox-Id`.
    pub envd_url: String,
    /// The admin listener (faults, host map, CA).
    pub admin_url: String,
    pub envd_addr: SocketAddr,
    app: Arc<App>,
    shutdown: watch::Sender<bool>,
    owns_state_dir: bool,
}

impl Simulator {
    pub async fn start(config: Config) -> Result<Simulator, StartError> {
        if !config.agent.is_file() {
            return Err(StartError::NoAgent(config.agent.clone()));
        }
        let instance = crate::token::hex(4);
        let (state_dir, owns_state_dir) = match &config.state_dir {
            Some(dir) => (dir.clone(), false),
            None => (
                std::env::temp_dir().join(format!("e2b-sim-{instance}")),
                true,
            ),
        };
        std::fs::create_dir_all(state_dir.join("vm")).map_err(io("the state directory"))?;
        let ca = Ca::new()?;
        std::fs::write(state_dir.join("ca.pem"), ca.pem()).map_err(io("ca.pem"))?;
        std::fs::write(state_dir.join("ca-bundle.crt"), ca.pem()).map_err(io("ca-bundle.crt"))?;
        let vms = Vms::connect(config.runtime, &instance, config.agent.clone()).await?;
        // Leftovers of simulators that died without cleaning up.
        vms.sweep_orphans().await;
        let app = Arc::new(App::new(config, vms, ca, state_dir, instance));
        let (shutdown, stopped) = watch::channel(false);

        let api = bind().await?;
        let envd = bind().await?;
        let admin = bind().await?;
        let (api_addr, envd_addr, admin_addr) = (addr(&api)?, addr(&envd)?, addr(&admin)?);
        {
            let app = Arc::clone(&app);
            tokio::spawn(crate::http::serve(
                api,
                move |request, _| crate::api::handle(Arc::clone(&app), request),
                stopped.clone(),
            ));
        }
        {
            let app = Arc::clone(&app);
            tokio::spawn(crate::http::serve(
                envd,
                move |request, _| crate::envd::handle(Arc::clone(&app), request),
                stopped.clone(),
            ));
        }
        {
            let app = Arc::clone(&app);
            tokio::spawn(crate::http::serve(
                admin,
                move |request, _| crate::admin::handle(Arc::clone(&app), request),
                stopped.clone(),
            ));
        }
        tokio::spawn(crate::lifecycle::reap(Arc::clone(&app), stopped));
        Ok(Simulator {
            api_url: format!("http://{api_addr}"),
            envd_url: format!("http://{envd_addr}"),
            admin_url: format!("http://{admin_addr}"),
            envd_addr,
            app,
            shutdown,
            owns_state_dir,
        })
    }

    pub fn api_key(&self) -> &str {
        &self.app.config.api_key
    }

    pub fn domain(&self) -> &str {
        &self.app.config.domain
    }

    pub fn runtime(&self) -> Runtime {
        self.app.vms.runtime()
    }

    pub fn ca_pem(&self) -> &str {
        self.app.ca.pem()
    }

    pub fn ca_path(&self) -> PathBuf {
        self.app.state_dir.join("ca.pem")
    }

    /// The one JSON line `e2b-simulator` prints when it is ready.
    pub fn listening_line(&self) -> String {
        json!({
            "event": "listening",
            "api": self.api_url,
            "envd": self.envd_url,
            "admin": self.admin_url,
            "domain": self.domain(),
            "apiKey": self.api_key(),
            "runtime": self.runtime().name(),
            "template": self.app.config.template.alias,
            "caCertPath": self.ca_path(),
            "instance": self.app.instance,
        })
        .to_string()
    }

    /// Stops the listeners and removes every VM and file of this simulator.
    pub async fn shutdown(self) {
        let _ = self.shutdown.send(true);
        // A create's connection task outlives the listeners: wait for it, or its VM would
        // appear after the sweep below.
        let stuck = self.app.makers.close(Duration::from_secs(30)).await;
        if stuck > 0 {
            eprintln!("e2b-simulator: {stuck} creates still running at shutdown");
        }
        let ids: Vec<String> = self.app.sandboxes.lock().keys().cloned().collect();
        for id in ids {
            crate::lifecycle::kill(&self.app, &id).await;
        }
        let left = self.app.vms.remove_every().await;
        if left > 0 {
            eprintln!("e2b-simulator: {left} VMs could not be removed");
        }
        if self.owns_state_dir {
            let _ = std::fs::remove_dir_all(&self.app.state_dir);
        }
    }
}

async fn bind() -> Result<TcpListener, StartError> {
    TcpListener::bind("127.0.0.1:0")
        .await
        .map_err(io("a loopback listener"))
}

fn addr(listener: &TcpListener) -> Result<SocketAddr, StartError> {
    listener.local_addr().map_err(io("a listener's address"))
}
