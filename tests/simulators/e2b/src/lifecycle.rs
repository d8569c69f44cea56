//! A sandbox's life: create (VM, egress, registry), pause, resume, kill, and the reaper that
//! ends sandboxes whose time is up, as E2B does.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, SystemTime};

use tokio::sync::watch;

use crate::app::App;
use crate::egress::INTERNET_HOSTS;
use crate::network::NetworkConfig;
use crate::sandbox::{Sandbox, State};
use crate::token;
use crate::vm::{VmError, VmFiles};

/// How often the reaper looks for sandboxes past their `endAt`.
const REAP_EVERY: Duration = Duration::from_millis(250);

/// What a create asks for, already validated.
#[derive(Debug, Clone)]
pub struct CreateSpec {
    pub timeout: Duration,
    pub metadata: BTreeMap<String, String>,
    pub env_vars: BTreeMap<String, String>,
    pub network: NetworkConfig,
    pub allow_internet_access: Option<bool>,
    pub auto_pause: bool,
    /// Whether envd gets an access token (always on `/v2/sandboxes`).
    pub secure: bool,
}

#[derive(Debug, thiserror::Error)]
pub enum LifecycleError {
    #[error("{0}")]
    Vm(#[from] VmError),
    #[error("sandbox files: {0}")]
    Files(#[from] std::io::Error),
    #[error("You have reached the maximum number of concurrent E2B sandboxes ({0}).")]
    Capacity(usize),
    #[error("the simulator is shutting down")]
    Closing,
}

/// Makes the VM and registers the sandbox; answers its id.
pub async fn create(app: &Arc<App>, spec: CreateSpec) -> Result<String, LifecycleError> {
    let Some(_making) = app.makers.begin() else {
        return Err(LifecycleError::Closing);
    };
    let max = app.config.max_sandboxes;
    if app.sandboxes.count() + app.creating.fetch_add(1, Ordering::SeqCst) >= max {
        app.creating.fetch_sub(1, Ordering::SeqCst);
        return Err(LifecycleError::Capacity(max));
    }
    let created = create_inner(app, spec).await;
    app.creating.fetch_sub(1, Ordering::SeqCst);
    created
}

async fn create_inner(app: &Arc<App>, spec: CreateSpec) -> Result<String, LifecycleError> {
    let id = token::sandbox_id();
    let dir = sandbox_dir(app, &id);
    let egress_dir = dir.join("egress");
    std::fs::create_dir_all(&egress_dir)?;
    let hosts = dir.join("hosts");
    std::fs::write(&hosts, hosts_file(app, &spec.network))?;
    let egress_tasks = crate::egress::start(app, &id, &egress_dir)?;
    let files = VmFiles {
        egress_dir: egress_dir.clone(),
        hosts,
        ca_bundle: app.state_dir.join("ca-bundle.crt"),
    };
    let container = match app.vms.create(&id, &app.config.template, &files).await {
        Ok(container) => container,
        Err(e) => {
            for task in &egress_tasks {
                task.abort();
            }
            let _ = std::fs::remove_dir_all(&dir);
            return Err(e.into());
        }
    };
    let watched = container.clone();
    let now = SystemTime::now();
    app.sandboxes.insert(Sandbox {
        id: id.clone(),
        template: app.config.template.clone(),
        metadata: spec.metadata,
        env_vars: spec.env_vars,
        envd_token: spec.secure.then(|| token::hex(32)),
        traffic_token: (spec.network.allow_public_traffic == Some(false)).then(|| token::hex(32)),
        network: spec.network,
        allow_internet_access: spec.allow_internet_access,
        started_at: now,
        end_at: now + spec.timeout,
        auto_pause: spec.auto_pause,
        state: State::Running,
        container,
        egress_dir,
        life: watch::channel(false).0,
        processes: Default::default(),
        egress_tasks,
    });
    watch_for_death(app, &id, &watched);
    Ok(id)
}

/// A VM that dies outside the API (its host failed, or a test killed its container) is
/// gone as E2B's would be: its envd streams drop and it is killed.
fn watch_for_death(app: &Arc<App>, id: &str, container: &str) {
    let (app, id, container) = (Arc::clone(app), id.to_owned(), container.to_owned());
    tokio::spawn(async move {
        app.vms.wait_dead(&container).await;
        let ours = app.sandboxes.with(&id, |s| s.container == container);
        if ours == Some(true) {
            eprintln!("e2b-simulator: sandbox {id}: its container died; killed");
            kill(&app, &id).await;
        }
    });
}

/// Rewrites sandbox `id`'s `/etc/hosts` for `network` (after a network update), in place:
/// the VM's bind mount follows the file, not a replacement of it.
pub fn rewrite_hosts(app: &App, id: &str, network: &NetworkConfig) -> std::io::Result<()> {
    std::fs::write(sandbox_dir(app, id).join("hosts"), hosts_file(app, network))
}

/// A VM's `/etc/hosts`, standing in for DNS: when the VM's network lets it reach a
/// nameserver (or the `egress-allowed` fault opens everything), every name the proxy can
/// serve goes to the agent on 127.0.0.1; when it does not (`dnsServers: []` beside a domain
/// in `allowOut`, or everything denied), no name resolves, as on E2B, and a client must
/// connect to an address of its own. Written at create and at every network update.
fn hosts_file(app: &App, network: &NetworkConfig) -> String {
    let mut text = "127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n".to_owned();
    if !network.resolves_names() && !app.faults().egress_allowed {
        return text;
    }
    let mut names: Vec<String> = app.hosts().into_keys().collect();
    names.extend(INTERNET_HOSTS.iter().map(|h| (*h).to_owned()));
    for name in names {
        text.push_str(&format!("127.0.0.1\t{name}\n"));
    }
    text
}

fn sandbox_dir(app: &App, id: &str) -> PathBuf {
    app.state_dir.join("vm").join(id)
}

/// Kills the sandbox: out of the registry (its streams drop), then its container. Answers
/// whether it existed.
pub async fn kill(app: &App, id: &str) -> bool {
    let Some(sandbox) = app.sandboxes.remove(id) else {
        return false;
    };
    app.vms.remove(&sandbox.container).await;
    let _ = std::fs::remove_dir_all(sandbox_dir(app, id));
    true
}

/// How a pause went.
#[derive(Debug, PartialEq, Eq)]
pub enum Paused {
    Done,
    AlreadyPaused,
    NotFound,
}

/// Freezes the VM (`docker pause`: memory and processes are kept, as E2B's snapshot keeps
/// them); every envd stream of the VM drops.
pub async fn pause(app: &App, id: &str) -> Result<Paused, LifecycleError> {
    let Some((state, container)) = app.sandboxes.with(id, |s| (s.state, s.container.clone()))
    else {
        return Ok(Paused::NotFound);
    };
    if state == State::Paused {
        return Ok(Paused::AlreadyPaused);
    }
    app.vms.pause(&container).await?;
    let found = app.sandboxes.with(id, |s| {
        s.state = State::Paused;
        s.end_life();
    });
    Ok(if found.is_some() {
        Paused::Done
    } else {
        Paused::NotFound
    })
}

/// How a connect (resume) went.
#[derive(Debug, PartialEq, Eq)]
pub enum Resumed {
    /// It was paused and runs again (E2B answers 201).
    Resumed,
    /// It was running; its end moved out if `timeout` reaches further (E2B answers 200).
    WasRunning,
    NotFound,
}

pub async fn resume(app: &App, id: &str, timeout: Duration) -> Result<Resumed, LifecycleError> {
    let Some((state, container)) = app.sandboxes.with(id, |s| (s.state, s.container.clone()))
    else {
        return Ok(Resumed::NotFound);
    };
    let until = SystemTime::now() + timeout;
    if state == State::Running {
        app.sandboxes.with(id, |s| s.end_at = s.end_at.max(until));
        return Ok(Resumed::WasRunning);
    }
    app.vms.unpause(&container).await?;
    let found = app.sandboxes.with(id, |s| {
        s.state = State::Running;
        s.end_at = until;
    });
    Ok(if found.is_some() {
        Resumed::Resumed
    } else {
        Resumed::NotFound
    })
}

/// Ends (or auto-pauses) every running sandbox past its `endAt`, until `stop` turns true.
pub async fn reap(app: Arc<App>, mut stop: watch::Receiver<bool>) {
    loop {
        tokio::select! {
            () = tokio::time::sleep(REAP_EVERY) => {}
            _ = stop.changed() => return,
        }
        for (id, auto_pause) in app.sandboxes.expired(SystemTime::now()) {
            if auto_pause {
                let _ = pause(&app, &id).await;
            } else {
                kill(&app, &id).await;
            }
        }
    }
}
