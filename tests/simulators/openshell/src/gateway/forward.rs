//! SSH session tokens and `ForwardTcp`: a byte stream to a loopback port inside a READY
//! sandbox, authorized by a token from `CreateSshSession`, with the gateway's limits of 3
//! live streams per token and 20 per sandbox. A stream holds its slots until the gateway
//! ends it.
//!
//! The sandbox has no network the host can reach (under runsc it has none at all), so the
//! simulator dials from inside: each stream is a `nc <host> <port>` exec in the sandbox,
//! its stdin and stdout carrying the bytes, in its own process group (killed when the
//! stream ends).

use std::sync::Arc;

use bollard::container::LogOutput;
use futures::StreamExt;
use tokio::io::AsyncWriteExt;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Status, Streaming};

use super::exec::{kill_group, spawn_group};
use super::{SshToken, State, named_workspace, workspace};
use crate::clock::timestamp;
use crate::ids;
use crate::proto::v1::tcp_forward_frame::Payload as Frame;
use crate::proto::v1::tcp_forward_init::Target;
use crate::proto::v1::*;

pub const MAX_PER_TOKEN: u32 = 3;
pub const MAX_PER_SANDBOX: u32 = 20;
/// The largest data frame the gateway sends.
pub const CHUNK: usize = 64 * 1024;

pub type FrameStream = ReceiverStream<Result<TcpForwardFrame, Status>>;

pub fn create_session(
    state: &Arc<State>,
    req: CreateSshSessionRequest,
) -> Result<CreateSshSessionResponse, Status> {
    workspace(&req.workspace_scope)?;
    if req.sandbox.is_empty() {
        return Err(Status::invalid_argument("sandbox is required"));
    }
    let entry = state
        .entry(&req.sandbox)
        .ok_or_else(|| Status::not_found("sandbox not found"))?;
    if entry.phase() != SandboxPhase::Ready {
        return Err(Status::failed_precondition("sandbox is not ready"));
    }
    let token = ids::hex_id(32);
    let ttl_ms =
        i64::try_from(state.settings.ssh_session_ttl_secs.saturating_mul(1000)).unwrap_or(i64::MAX);
    let expires_ms = state.clock.now_ms().saturating_add(ttl_ms);
    state
        .ssh_sessions_created
        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    state.tokens().insert(
        token.clone(),
        SshToken {
            sandbox_id: entry.id(),
            sandbox_name: req.sandbox.clone(),
            expires_ms,
            revoked: false,
        },
    );
    Ok(CreateSshSessionResponse {
        sandbox_id: entry.id(),
        token,
        gateway_host: state.settings.gateway_host.clone(),
        gateway_port: u32::from(state.settings.gateway_port),
        gateway_scheme: "https".into(),
        host_key_fingerprint: String::new(),
        expiration_time: Some(timestamp(expires_ms)),
    })
}

/// COMPLETED for a live token; a missing (or already revoked) one is ALREADY_ABSENT with
/// `allow_missing`, else NOT_FOUND. Streams already open keep running until they end.
pub fn revoke_session(
    state: &Arc<State>,
    req: RevokeSshSessionRequest,
) -> Result<RevokeSshSessionResponse, Status> {
    if req.token.is_empty() {
        return Err(Status::invalid_argument("token is required"));
    }
    let revoked = match state.tokens().get_mut(&req.token) {
        Some(token) if !token.revoked => {
            token.revoked = true;
            true
        }
        _ => false,
    };
    let outcome = match (revoked, req.allow_missing) {
        (true, _) => DeletionOutcome::Completed,
        (false, true) => DeletionOutcome::AlreadyAbsent,
        (false, false) => return Err(Status::not_found("ssh session not found")),
    };
    Ok(RevokeSshSessionResponse {
        outcome: outcome.into(),
    })
}

/// One live stream's claim on its token's and sandbox's slots; dropping it gives them
/// back.
struct Slots {
    state: Arc<State>,
    token: String,
    sandbox_id: String,
}

impl Slots {
    fn claim(state: &Arc<State>, token: &str, sandbox_id: &str) -> Result<Slots, Status> {
        let mut counts = state.forwards();
        let by_token = counts.by_token.get(token).copied().unwrap_or(0);
        if by_token >= MAX_PER_TOKEN {
            return Err(Status::resource_exhausted(
                "SSH session connection limit reached",
            ));
        }
        let by_sandbox = counts.by_sandbox.get(sandbox_id).copied().unwrap_or(0);
        if by_sandbox >= MAX_PER_SANDBOX {
            return Err(Status::resource_exhausted(
                "sandbox SSH connection limit reached",
            ));
        }
        *counts.by_token.entry(token.to_owned()).or_default() += 1;
        *counts.by_sandbox.entry(sandbox_id.to_owned()).or_default() += 1;
        Ok(Slots {
            state: state.clone(),
            token: token.to_owned(),
            sandbox_id: sandbox_id.to_owned(),
        })
    }
}

impl Drop for Slots {
    fn drop(&mut self) {
        let mut counts = self.state.forwards();
        let counts = &mut *counts;
        for (map, key) in [
            (&mut counts.by_token, &self.token),
            (&mut counts.by_sandbox, &self.sandbox_id),
        ] {
            if let Some(n) = map.get_mut(key) {
                *n = n.saturating_sub(1);
                if *n == 0 {
                    map.remove(key);
                }
            }
        }
    }
}

/// The loopback host a target names, as the gateway normalizes it.
fn loopback(host: &str) -> Result<String, Status> {
    let host = host.trim();
    if host.is_empty() {
        return Err(Status::invalid_argument("tcp target host is required"));
    }
    if host.eq_ignore_ascii_case("localhost") {
        return Ok("127.0.0.1".into());
    }
    match host.parse::<std::net::IpAddr>() {
        Ok(ip) if ip.is_loopback() => Ok(ip.to_string()),
        _ => Err(Status::invalid_argument("tcp target host must be loopback")),
    }
}

fn check_token(state: &State, token: &str, sandbox_id: &str) -> Result<(), Status> {
    let tokens = state.tokens();
    let found = tokens
        .get(token)
        .ok_or_else(|| Status::unauthenticated("SSH session token not found"))?;
    if found.revoked || found.sandbox_id != sandbox_id {
        return Err(Status::unauthenticated("SSH session token is not valid"));
    }
    if state.clock.now_ms() > found.expires_ms {
        return Err(Status::unauthenticated("SSH session token expired"));
    }
    Ok(())
}

pub async fn forward_tcp(
    state: &Arc<State>,
    mut inbound: Streaming<TcpForwardFrame>,
) -> Result<FrameStream, Status> {
    let first = inbound
        .message()
        .await?
        .ok_or_else(|| Status::invalid_argument("empty ForwardTcp stream"))?;
    let Some(Frame::Init(init)) = first.payload else {
        return Err(Status::invalid_argument(
            "first TcpForwardFrame must be init",
        ));
    };
    if init.sandbox.is_empty() {
        return Err(Status::invalid_argument("sandbox is required"));
    }
    let (host, port) = match init.target {
        Some(Target::Tcp(ref t)) => {
            if t.port == 0 || t.port > u32::from(u16::MAX) {
                return Err(Status::invalid_argument(
                    "tcp target port must be between 1 and 65535",
                ));
            }
            (loopback(&t.host)?, t.port)
        }
        Some(Target::Ssh(_)) => {
            return Err(Status::unimplemented("SSH relay targets are not simulated"));
        }
        None => return Err(Status::invalid_argument("tcp forward target is required")),
    };
    if !init.workspace.is_empty() {
        named_workspace(&init.workspace)?;
    }
    let entry = state
        .entry(&init.sandbox)
        .ok_or_else(|| Status::not_found("sandbox not found"))?;
    if entry.phase() != SandboxPhase::Ready {
        return Err(Status::failed_precondition("sandbox is not ready"));
    }
    let token = init.authorization_token.trim();
    if token.is_empty() {
        return Err(Status::unauthenticated(
            "authorization_token is required for ForwardTcp",
        ));
    }
    check_token(state, token, &entry.id())?;
    let slots = Slots::claim(state, token, &entry.id())?;
    let container = entry
        .container
        .ok_or_else(|| Status::failed_precondition("sandbox is not ready"))?;
    let line = format!("exec nc {host} {port}");
    let group = spawn_group(state, &container, &line, false, false).await?;
    let (tx, rx) = mpsc::channel(64);
    tokio::spawn(bridge(state.clone(), group, inbound, tx, slots));
    Ok(ReceiverStream::new(rx))
}

/// Copies bytes both ways until the sandbox side ends (or the caller goes away); then the
/// dialer's process group is killed and the slots are given back.
async fn bridge(
    state: Arc<State>,
    group: super::exec::Group,
    mut inbound: Streaming<TcpForwardFrame>,
    tx: mpsc::Sender<Result<TcpForwardFrame, Status>>,
    slots: Slots,
) {
    let super::exec::Group {
        container,
        pgid,
        mut input,
        mut output,
        early,
        ..
    } = group;
    let upstream = tokio::spawn(async move {
        while let Ok(Some(frame)) = inbound.message().await {
            match frame.payload {
                Some(Frame::Data(data)) if data.is_empty() => {}
                Some(Frame::Data(data)) => {
                    if input.write_all(&data).await.is_err() {
                        break;
                    }
                }
                _ => break,
            }
        }
        // The caller half-closed: the dialer half-closes toward the target.
        let _ = input.shutdown().await;
    });
    let mut sent_any = false;
    let mut refusal = Vec::new();
    let mut pending: Vec<LogOutput> = early;
    'copy: loop {
        for item in pending.drain(..) {
            match item {
                LogOutput::StdOut { message } => {
                    for chunk in message.chunks(CHUNK) {
                        let frame = TcpForwardFrame {
                            payload: Some(Frame::Data(chunk.to_vec())),
                        };
                        if tx.send(Ok(frame)).await.is_err() {
                            break 'copy;
                        }
                        sent_any = true;
                    }
                }
                LogOutput::StdErr { message } => refusal.extend_from_slice(&message),
                _ => {}
            }
        }
        tokio::select! {
            _ = tx.closed() => break,
            item = output.next() => match item {
                Some(Ok(out)) => pending.push(out),
                Some(Err(_)) | None => {
                    if !sent_any && !refusal.is_empty() {
                        let why = String::from_utf8_lossy(&refusal).trim().to_owned();
                        let _ = tx.send(Err(Status::unavailable(format!("relay target open failed: {why}")))).await;
                    }
                    break;
                }
            },
        }
    }
    upstream.abort();
    kill_group(&state, &container, pgid).await;
    // The stream ends for the caller first, then its slots count as free again.
    drop(tx);
    drop(slots);
}

#[cfg(test)]
mod tests {
    #[test]
    fn only_loopback_targets() {
        assert_eq!(super::loopback("localhost").unwrap(), "127.0.0.1");
        assert_eq!(super::loopback("::1").unwrap(), "::1");
        assert!(super::loopback("10.0.0.1").is_err());
        assert!(super::loopback("example.com").is_err());
    }
}
