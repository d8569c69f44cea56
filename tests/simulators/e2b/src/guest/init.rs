//! `guest init --egress DIR`: a VM's first process.
//!
//! It relays every TCP connection the guest opens to `127.0.0.1:443` (and `:80`) to the
//! simulator's egress proxy over the Unix socket `DIR/tls.sock` (`DIR/http.sock`), byte for
//! byte: the proxy reads the destination from the TLS server name or the HTTP `Host` header, as
//! E2B's egress firewall does. The VM's `/etc/hosts` sends every name the simulator serves to
//! 127.0.0.1; any other destination has no route at all (the container has no network).
//!
//! As PID 1 it also reaps the orphans a VM's processes leave, and ends on SIGTERM.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use nix::sys::wait::{WaitPidFlag, WaitStatus, waitpid};
use nix::unistd::Pid;
use tokio::net::{TcpListener, TcpStream, UnixStream};
use tokio::signal::unix::{SignalKind, signal};

use super::{EGRESS_HTTP_SOCKET, EGRESS_TLS_SOCKET, flag};

pub(super) async fn run(args: &[String]) -> Result<ExitCode, String> {
    let dir = PathBuf::from(flag(args, "--egress").ok_or("--egress is missing")?);
    let mut terminate = signal(SignalKind::terminate()).map_err(|e| format!("SIGTERM: {e}"))?;
    let mut children = signal(SignalKind::child()).map_err(|e| format!("SIGCHLD: {e}"))?;
    for (port, socket) in [(443u16, EGRESS_TLS_SOCKET), (80, EGRESS_HTTP_SOCKET)] {
        let listener = TcpListener::bind(("127.0.0.1", port))
            .await
            .map_err(|e| format!("bind 127.0.0.1:{port}: {e}"))?;
        tokio::spawn(relay_all(listener, dir.join(socket)));
    }
    loop {
        tokio::select! {
            _ = terminate.recv() => return Ok(ExitCode::SUCCESS),
            _ = children.recv() => reap(),
        }
    }
}

async fn relay_all(listener: TcpListener, socket: PathBuf) {
    loop {
        let Ok((guest, _)) = listener.accept().await else {
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            continue;
        };
        tokio::spawn(relay(guest, socket.clone()));
    }
}

async fn relay(mut guest: TcpStream, socket: PathBuf) {
    // No proxy on the other side (a VM the simulator is tearing down): the guest's
    // connection just closes, as a refused egress does.
    let Ok(mut proxy) = UnixStream::connect(Path::new(&socket)).await else {
        return;
    };
    let _ = tokio::io::copy_bidirectional(&mut guest, &mut proxy).await;
}

/// Reaps every child that has ended.
fn reap() {
    loop {
        match waitpid(Pid::from_raw(-1), Some(WaitPidFlag::WNOHANG)) {
            Ok(WaitStatus::StillAlive) | Err(_) => return,
            Ok(_) => continue,
        }
    }
}
