//! The one destination a sandbox can reach: `<guard-host>:443`, once a network-policy PUT
//! allows it, forwarded to the loopback address the test gave (`--guard-target`).
//!
//! A sandbox has no network at all (under runsc, gVisor's `--network=none` leaves nothing
//! the host can dial either way), so the route is built from the docker exec channel: the
//! sandbox's /etc/hosts points the guard host at its own loopback, and a small Node
//! forwarder, started in the sandbox by `docker exec` as root (docker lets any user of a
//! container bind low ports in its own network namespace), listens on 127.0.0.1:443
//! before any guest code runs (the policy PUT precedes the run) and carries each connection's bytes
//! over its stdin and stdout to the simulator, which dials the guard target. Frames are
//! `[kind u8][connection u32][length u32][payload]`, big-endian; kinds: 0 ready, 1 open,
//! 2 data, 3 close. The forwarder is the sandbox's only way out, and it goes to one place.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bollard::container::LogOutput;
use futures::StreamExt;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinSet;

use crate::error::{ApiError, Code};
use crate::state::State;

const READY: u8 = 0;
const OPEN: u8 = 1;
const DATA: u8 = 2;
const CLOSE: u8 = 3;

/// The in-sandbox half (run with `node -e`).
const FORWARDER_JS: &str = r#"
const net = require('net');
const socks = new Map();
let next = 1;
function send(kind, id, payload) {
  const head = Buffer.alloc(9);
  head[0] = kind; head.writeUInt32BE(id, 1); head.writeUInt32BE(payload ? payload.length : 0, 5);
  process.stdout.write(payload ? Buffer.concat([head, payload]) : head);
}
const server = net.createServer((sock) => {
  const id = next++;
  socks.set(id, sock);
  send(1, id);
  sock.on('data', (d) => send(2, id, d));
  sock.on('close', () => { if (socks.delete(id)) send(3, id); });
  sock.on('error', () => {});
});
server.on('error', (e) => { process.stderr.write(String(e)); process.exit(1); });
server.listen(443, '127.0.0.1', () => send(0, 0));
let buf = Buffer.alloc(0);
process.stdin.on('data', (d) => {
  buf = Buffer.concat([buf, d]);
  while (buf.length >= 9) {
    const len = buf.readUInt32BE(5);
    if (buf.length < 9 + len) break;
    const kind = buf[0], id = buf.readUInt32BE(1), payload = buf.subarray(9, 9 + len);
    buf = buf.subarray(9 + len);
    const sock = socks.get(id);
    if (!sock) continue;
    if (kind === 2) sock.write(payload);
    else if (kind === 3) { socks.delete(id); sock.end(); }
  }
});
process.stdin.on('end', () => process.exit(0));
"#;

fn frame(kind: u8, id: u32, payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(9 + payload.len());
    out.push(kind);
    out.extend_from_slice(&id.to_be_bytes());
    out.extend_from_slice(&(payload.len() as u32).to_be_bytes());
    out.extend_from_slice(payload);
    out
}

/// Opens the route from the sandbox to the guard; answers once the forwarder listens.
/// Already open: nothing to do.
pub async fn open(state: &Arc<State>, sandbox_id: &str) -> Result<(), ApiError> {
    let Some(target) = state.settings.guard_target else {
        return Ok(());
    };
    let container = {
        let inner = state.lock();
        if inner.forwarders.contains_key(sandbox_id) {
            return Ok(());
        }
        inner
            .sandboxes
            .get(sandbox_id)
            .and_then(|s| s.container.clone())
            .ok_or_else(|| ApiError::new(Code::FailedPrecondition, "sandbox is not running"))?
    };
    let argv = vec!["node".to_owned(), "-e".to_owned(), FORWARDER_JS.to_owned()];
    let attached = state
        .docker
        .exec(&container, crate::docker::Command::new(argv, "0"))
        .await
        .map_err(|e| ApiError::new(Code::Unavailable, format!("egress forwarder: {e}")))?;
    let (ready_tx, ready_rx) = oneshot::channel();
    let task = tokio::spawn(pump(attached, target, ready_tx));
    state
        .lock()
        .forwarders
        .insert(sandbox_id.to_owned(), task.abort_handle());
    match tokio::time::timeout(Duration::from_secs(20), ready_rx).await {
        Ok(Ok(())) => Ok(()),
        _ => {
            crate::lifecycle::stop_forwarder(state, sandbox_id);
            Err(ApiError::new(
                Code::Unavailable,
                "egress forwarder did not start in the sandbox",
            ))
        }
    }
}

/// Carries frames both ways until the exec ends or the task is aborted (which drops the
/// forwarder's stdin, so it exits, and every connection task with the JoinSet).
async fn pump(attached: crate::docker::Attached, target: SocketAddr, ready: oneshot::Sender<()>) {
    let mut ready = Some(ready);
    let (to_sandbox, mut outbound) = mpsc::channel::<Vec<u8>>(64);
    let mut input = attached.input;
    let mut tasks = JoinSet::new();
    tasks.spawn(async move {
        while let Some(bytes) = outbound.recv().await {
            if input.write_all(&bytes).await.is_err() {
                break;
            }
        }
    });
    let mut conns: HashMap<u32, mpsc::Sender<Option<Vec<u8>>>> = HashMap::new();
    let mut buf: Vec<u8> = Vec::new();
    let mut output = attached.output;
    while let Some(item) = output.next().await {
        match item {
            Ok(LogOutput::StdOut { message }) => buf.extend_from_slice(&message),
            Ok(LogOutput::StdErr { message }) => {
                tracing::warn!(text = %String::from_utf8_lossy(&message), "egress forwarder");
                continue;
            }
            Ok(_) => continue,
            Err(_) => break,
        }
        while buf.len() >= 9 {
            let len = u32::from_be_bytes([buf[5], buf[6], buf[7], buf[8]]) as usize;
            if buf.len() < 9 + len {
                break;
            }
            let kind = buf[0];
            let id = u32::from_be_bytes([buf[1], buf[2], buf[3], buf[4]]);
            let payload: Vec<u8> = buf[9..9 + len].to_vec();
            buf.drain(..9 + len);
            match kind {
                READY => {
                    if let Some(ready) = ready.take() {
                        let _ = ready.send(());
                    }
                }
                OPEN => {
                    let (tx, rx) = mpsc::channel(64);
                    conns.insert(id, tx);
                    tasks.spawn(connection(id, target, rx, to_sandbox.clone()));
                }
                DATA => {
                    if let Some(tx) = conns.get(&id) {
                        let _ = tx.send(Some(payload)).await;
                    }
                }
                CLOSE => {
                    if let Some(tx) = conns.remove(&id) {
                        let _ = tx.send(None).await;
                    }
                }
                _ => {}
            }
        }
    }
}

/// One connection from the sandbox: dials the guard target and copies both ways.
async fn connection(
    id: u32,
    target: SocketAddr,
    mut from_sandbox: mpsc::Receiver<Option<Vec<u8>>>,
    to_sandbox: mpsc::Sender<Vec<u8>>,
) {
    let Ok(stream) = TcpStream::connect(target).await else {
        let _ = to_sandbox.send(frame(CLOSE, id, &[])).await;
        return;
    };
    let (mut read, mut write) = stream.into_split();
    let upstream = async move {
        while let Some(Some(bytes)) = from_sandbox.recv().await {
            if write.write_all(&bytes).await.is_err() {
                break;
            }
        }
        let _ = write.shutdown().await;
    };
    let downstream = {
        let to_sandbox = to_sandbox.clone();
        async move {
            let mut chunk = vec![0u8; 32 * 1024];
            loop {
                match read.read(&mut chunk).await {
                    Ok(0) | Err(_) => break,
                    Ok(n) => {
                        if to_sandbox.send(frame(DATA, id, &chunk[..n])).await.is_err() {
                            break;
                        }
                    }
                }
            }
        }
    };
    let (mut upstream, mut downstream) = (Box::pin(upstream), Box::pin(downstream));
    tokio::select! {
        // The guard closed: tell the sandbox and stop.
        () = &mut downstream => {}
        // The sandbox closed its side: the answer may still be coming.
        () = &mut upstream => downstream.await,
    }
    let _ = to_sandbox.send(frame(CLOSE, id, &[])).await;
}
