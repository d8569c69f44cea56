//! The egress proxy: the only way out of a VM, and E2B's network config enforced on it.
//!
//! Each VM gets two Unix sockets on the host (mounted read-only into the VM at
//! [`crate::guest::EGRESS_DIR`]); the agent's `init` relays the guest's TCP connections to
//! `127.0.0.1:443` and `:80` onto them. For each connection the proxy reads the destination
//! name (the TLS server name, or the HTTP `Host` of each request) and decides:
//!
//! 1. not allowed by the sandbox's network config (and the `egressAllowed` fault is off):
//!    the connection closes, as E2B's firewall closes it;
//! 2. allowed, with a header-transform rule for the name: the proxy terminates TLS with a
//!    certificate from the simulator's CA, sets the rule's headers on every request (an
//!    existing header of that name is replaced), and forwards to the name's upstream;
//! 3. allowed, no rule, a mapped upstream: the bytes pass through untouched (the guest sees the
//!    upstream's own certificate);
//! 4. allowed, no upstream: `example.com` is answered by the simulator itself (standing in for
//!    the internet, which this machine does not have); anything else closes.
//!
//! Upstreams are loopback addresses only ([`crate::config::Upstream`]): the simulator never
//! connects anywhere else.

pub mod ca;
mod forward;
mod rewind;

use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::AsyncReadExt;
use tokio::net::{UnixListener, UnixStream};

use crate::app::App;
use crate::config::Upstream;
use crate::guest::{EGRESS_HTTP_SOCKET, EGRESS_TLS_SOCKET};
use crate::network::Egress;
use rewind::Rewind;

/// Names the simulator answers itself when egress to them is allowed.
pub const INTERNET_HOSTS: [&str; 2] = ["example.com", "www.example.com"];
/// How long a guest has to send its TLS ClientHello.
const HELLO_BUDGET: Duration = Duration::from_secs(10);
const HELLO_LIMIT: usize = 64 * 1024;

/// What the proxy does with a destination.
#[derive(Debug, Clone, PartialEq)]
pub enum Verdict {
    Closed,
    PassThrough(Upstream),
    Intercept {
        /// `None`: the simulator answers itself.
        upstream: Option<Upstream>,
        headers: BTreeMap<String, String>,
    },
}

/// The proxy's decision for sandbox `id` and destination `host`.
pub fn verdict(app: &App, id: &str, host: &str) -> Verdict {
    let host = host.trim_end_matches('.').to_ascii_lowercase();
    let Some(network) = app.sandboxes.with(id, |s| s.network.clone()) else {
        return Verdict::Closed;
    };
    let allowed = app.faults().egress_allowed || network.egress(&host) == Egress::Allowed;
    if !allowed {
        return Verdict::Closed;
    }
    let upstream = app.upstream(&host);
    let answered = INTERNET_HOSTS.contains(&host.as_str());
    match (network.headers_for(&host), upstream) {
        (Some(headers), upstream) if upstream.is_some() || answered => {
            Verdict::Intercept { upstream, headers }
        }
        (None, Some(upstream)) => Verdict::PassThrough(upstream),
        (None, None) if answered => Verdict::Intercept {
            upstream: None,
            headers: BTreeMap::new(),
        },
        _ => Verdict::Closed,
    }
}

/// Binds the VM's two sockets in `dir` and serves them; answers the tasks to abort at death.
pub fn start(
    app: &Arc<App>,
    id: &str,
    dir: &Path,
) -> std::io::Result<Vec<tokio::task::AbortHandle>> {
    let mut tasks = Vec::new();
    for (name, tls) in [(EGRESS_TLS_SOCKET, true), (EGRESS_HTTP_SOCKET, false)] {
        let path = dir.join(name);
        let _ = std::fs::remove_file(&path);
        let listener = UnixListener::bind(&path)?;
        // Only root in the VM (the agent's init) connects; uid 1000 goes through init too.
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600))?;
        let app = Arc::clone(app);
        let id = id.to_owned();
        let task = tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                };
                let app = Arc::clone(&app);
                let id = id.clone();
                tokio::spawn(async move {
                    if tls {
                        tls_connection(app, id, stream).await;
                    } else {
                        forward::serve_plain(app, id, stream).await;
                    }
                });
            }
        });
        tasks.push(task.abort_handle());
    }
    Ok(tasks)
}

async fn tls_connection(app: Arc<App>, id: String, mut stream: UnixStream) {
    let Ok(Some((seen, host))) =
        tokio::time::timeout(HELLO_BUDGET, client_hello(&mut stream)).await
    else {
        return;
    };
    // A guest that named no server (an IP literal) names nothing the simulator can route.
    let Some(host) = host else { return };
    match verdict(&app, &id, &host) {
        Verdict::Closed => {}
        Verdict::PassThrough(upstream) => {
            let Ok(mut out) = tokio::net::TcpStream::connect((upstream.ip, upstream.port)).await
            else {
                return;
            };
            let mut guest = Rewind::new(seen, stream);
            let _ = tokio::io::copy_bidirectional(&mut guest, &mut out).await;
        }
        Verdict::Intercept { upstream, headers } => {
            let Ok(config) = app.ca.server_config(&host) else {
                return;
            };
            let acceptor = tokio_rustls::TlsAcceptor::from(config);
            let Ok(tls) = acceptor.accept(Rewind::new(seen, stream)).await else {
                return;
            };
            forward::serve_intercepted(tls, host, upstream, headers).await;
        }
    }
}

/// Reads until the ClientHello is whole; answers the bytes read and the server name.
async fn client_hello(stream: &mut UnixStream) -> Option<(Vec<u8>, Option<String>)> {
    let mut acceptor = rustls::server::Acceptor::default();
    let mut seen = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        let n = stream.read(&mut buf).await.ok()?;
        if n == 0 || seen.len() + n > HELLO_LIMIT {
            return None;
        }
        seen.extend_from_slice(&buf[..n]);
        acceptor.read_tls(&mut &buf[..n]).ok()?;
        match acceptor.accept() {
            Ok(Some(accepted)) => {
                let name = accepted.client_hello().server_name().map(str::to_owned);
                return Some((seen, name));
            }
            Ok(None) => continue,
            Err(_) => return None,
        }
    }
}
