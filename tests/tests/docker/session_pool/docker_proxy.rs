//! A Unix socket in front of the host's Docker Engine, for one daemon's `DOCKER_HOST`, that a
//! test can make stop answering. [`DockerProxy::hiccup`] refuses new connections and cuts
//! every open one except the exec streams docker already upgraded (a session's agent and
//! relays): the API no longer answers while the sessions' own streams go on, as when dockerd
//! is briefly overloaded or restarting its API. [`DockerProxy::restore`] lets connections
//! through again.

use std::io::{Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

/// The host's Engine (the daemon's default when `DOCKER_HOST` is unset).
const ENGINE: &str = "/var/run/docker.sock";
/// How docker answers an exec start that upgrades its connection to a raw stream.
const UPGRADED: &[u8] = b"HTTP/1.1 101 UPGRADED\r\n";

/// One proxied connection.
struct Conn {
    client: UnixStream,
    engine: UnixStream,
    upgraded: Arc<AtomicBool>,
}

pub(super) struct DockerProxy {
    dir: tempfile::TempDir,
    up: Arc<AtomicBool>,
    stopped: Arc<AtomicBool>,
    conns: Arc<Mutex<Vec<Conn>>>,
}

impl DockerProxy {
    pub(super) fn start() -> DockerProxy {
        let dir = tempfile::tempdir().expect("a directory for the socket");
        let listener = UnixListener::bind(dir.path().join("docker.sock")).expect("bind");
        let proxy = DockerProxy {
            dir,
            up: Arc::new(AtomicBool::new(true)),
            stopped: Arc::new(AtomicBool::new(false)),
            conns: Arc::new(Mutex::new(Vec::new())),
        };
        let (up, stopped, conns) = (
            Arc::clone(&proxy.up),
            Arc::clone(&proxy.stopped),
            Arc::clone(&proxy.conns),
        );
        std::thread::spawn(move || {
            for client in listener.incoming() {
                if stopped.load(Ordering::SeqCst) {
                    return;
                }
                // Refused: taken and closed at once.
                let Ok(client) = client else { continue };
                if !up.load(Ordering::SeqCst) {
                    continue;
                }
                if let Ok(conn) = forward(client) {
                    conns.lock().unwrap().push(conn);
                }
            }
        });
        proxy
    }

    /// The daemon's `DOCKER_HOST`.
    pub(super) fn docker_host(&self) -> String {
        format!("unix://{}", self.socket().display())
    }

    fn socket(&self) -> PathBuf {
        self.dir.path().join("docker.sock")
    }

    /// Docker stops answering; answers how many upgraded streams were left running.
    pub(super) fn hiccup(&self) -> usize {
        self.up.store(false, Ordering::SeqCst);
        let conns = self.conns.lock().unwrap();
        let mut kept = 0;
        for conn in conns.iter() {
            if conn.upgraded.load(Ordering::SeqCst) {
                kept += 1;
            } else {
                let _ = conn.client.shutdown(std::net::Shutdown::Both);
                let _ = conn.engine.shutdown(std::net::Shutdown::Both);
            }
        }
        kept
    }

    /// Docker answers again.
    pub(super) fn restore(&self) {
        self.up.store(true, Ordering::SeqCst);
    }
}

impl Drop for DockerProxy {
    fn drop(&mut self) {
        self.stopped.store(true, Ordering::SeqCst);
        // Wakes the accept loop so that it sees the stop.
        let _ = UnixStream::connect(self.socket());
    }
}

/// Connects `client` to the Engine, one thread per direction; the answers are watched for
/// docker's upgrade.
fn forward(client: UnixStream) -> std::io::Result<Conn> {
    let engine = UnixStream::connect(ENGINE)?;
    let upgraded = Arc::new(AtomicBool::new(false));
    let conn = Conn {
        client: client.try_clone()?,
        engine: engine.try_clone()?,
        upgraded: Arc::clone(&upgraded),
    };
    let (mut from, mut to) = (client.try_clone()?, engine.try_clone()?);
    std::thread::spawn(move || {
        let _ = std::io::copy(&mut from, &mut to);
        let _ = to.shutdown(std::net::Shutdown::Write);
    });
    let (mut from, mut to) = (engine, client);
    std::thread::spawn(move || {
        let mut buf = vec![0u8; 64 * 1024];
        // The last bytes seen, so that the status line is found across two reads.
        let mut tail: Vec<u8> = Vec::new();
        loop {
            let n = match from.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => n,
            };
            if !upgraded.load(Ordering::SeqCst) {
                tail.extend_from_slice(&buf[..n]);
                if tail.windows(UPGRADED.len()).any(|w| w == UPGRADED) {
                    upgraded.store(true, Ordering::SeqCst);
                }
                let keep = tail.len().saturating_sub(UPGRADED.len());
                tail.drain(..keep);
            }
            if to.write_all(&buf[..n]).is_err() {
                break;
            }
        }
        let _ = to.shutdown(std::net::Shutdown::Write);
    });
    Ok(conn)
}
