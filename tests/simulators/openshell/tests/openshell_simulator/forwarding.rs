//! ForwardTcp: a sandbox's SSH session token, the forward stream and the gateway's limits on
//! live forwards (the stop test in the parent uses the token and the stream helpers too).

use super::*;

pub(super) async fn ssh_token(client: &mut Client, name: &str) -> String {
    let req = CreateSshSessionRequest {
        workspace_scope: scope(),
        sandbox: name.into(),
    };
    client
        .create_ssh_session(req)
        .await
        .unwrap()
        .into_inner()
        .token
}

/// Opens a ForwardTcp stream to `port`: the response stream (or the refusal) and the
/// sender of frames.
pub(super) async fn forward(
    client: &mut Client,
    name: &str,
    token: &str,
    port: u32,
) -> (
    Result<tonic::Streaming<TcpForwardFrame>, tonic::Status>,
    mpsc::Sender<TcpForwardFrame>,
) {
    let (tx, rx) = mpsc::channel(8);
    let init = TcpForwardInit {
        sandbox: name.into(),
        workspace: "default".into(),
        authorization_token: token.into(),
        target: Some(tcp_forward_init::Target::Tcp(TcpRelayTarget {
            host: "127.0.0.1".into(),
            port,
        })),
        ..Default::default()
    };
    tx.send(TcpForwardFrame {
        payload: Some(tcp_forward_frame::Payload::Init(init)),
    })
    .await
    .unwrap();
    let answer = client
        .forward_tcp(ReceiverStream::new(rx))
        .await
        .map(|r| r.into_inner());
    (answer, tx)
}

async fn data(stream: &mut tonic::Streaming<TcpForwardFrame>) -> Vec<u8> {
    match stream.message().await.unwrap().unwrap().payload.unwrap() {
        tcp_forward_frame::Payload::Data(d) => d,
        other => panic!("expected data, got {other:?}"),
    }
}

/// Waits until the simulator counts `n` live forwards (slots come back once a stream ends).
async fn wait_live_forwards(sim: &Simulator, n: u32) {
    let deadline = Instant::now() + Duration::from_secs(15);
    while sim.state().await.unwrap()["live_forwards"] != n {
        assert!(
            Instant::now() < deadline,
            "the live forwards never came to {n}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn forward_tcp_reaches_loopback_inside_with_the_gateways_limits() {
    let Some(mut h) = harness().await else { return };
    create_ready(&mut h.client, "fwd").await;
    let server = "require('net').createServer(s => s.pipe(s)).listen(7070, '127.0.0.1')";
    let (_, _, code) = exec(
        &mut h.client,
        "fwd",
        &[
            "sh",
            "-c",
            &format!("node -e \"{server}\" >/dev/null 2>&1 &"),
        ],
    )
    .await;
    assert_eq!(code.unwrap(), 0);
    tokio::time::sleep(Duration::from_millis(500)).await;

    let token = ssh_token(&mut h.client, "fwd").await;
    let (stream, tx) = forward(&mut h.client, "fwd", &token, 7070).await;
    let mut stream = stream.unwrap();
    tx.send(TcpForwardFrame {
        payload: Some(tcp_forward_frame::Payload::Data(b"ping".to_vec())),
    })
    .await
    .unwrap();
    assert_eq!(data(&mut stream).await, b"ping");

    // Three per token: the fourth is refused while three are open.
    let mut open = vec![(stream, tx)];
    for _ in 0..2 {
        let (s, t) = forward(&mut h.client, "fwd", &token, 7070).await;
        open.push((s.unwrap(), t));
    }
    let (refused, _) = forward(&mut h.client, "fwd", &token, 7070).await;
    assert_eq!(refused.unwrap_err().code(), Code::ResourceExhausted);
    // Twenty per sandbox, whatever the tokens.
    for _ in 0..6 {
        let other = ssh_token(&mut h.client, "fwd").await;
        for _ in 0..3 {
            if open.len() == 20 {
                break;
            }
            let (s, t) = forward(&mut h.client, "fwd", &other, 7070).await;
            open.push((s.unwrap(), t));
        }
    }
    assert_eq!(h.sim.state().await.unwrap()["live_forwards"], 20);
    let fresh = ssh_token(&mut h.client, "fwd").await;
    let (refused, _) = forward(&mut h.client, "fwd", &fresh, 7070).await;
    assert_eq!(refused.unwrap_err().code(), Code::ResourceExhausted);
    // A half-close ends the stream from the target's side; its slot comes back.
    let (mut first, tx) = open.remove(0);
    drop(tx);
    while first.message().await.unwrap().is_some() {}
    wait_live_forwards(&h.sim, 19).await;
    let (again, _) = forward(&mut h.client, "fwd", &fresh, 7070).await;
    assert!(again.is_ok());
    drop((open, again));
    wait_live_forwards(&h.sim, 0).await;

    // Tokens: none, unknown, revoked; targets: off loopback, a closed port.
    for bad in ["", "not-a-token"] {
        let (refused, _) = forward(&mut h.client, "fwd", bad, 7070).await;
        assert_eq!(refused.unwrap_err().code(), Code::Unauthenticated);
    }
    let revoke = |allow_missing| RevokeSshSessionRequest {
        token: token.clone(),
        allow_missing,
    };
    let done = h
        .client
        .revoke_ssh_session(revoke(false))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(done.outcome, DeletionOutcome::Completed as i32);
    let again = h
        .client
        .revoke_ssh_session(revoke(true))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(again.outcome, DeletionOutcome::AlreadyAbsent as i32);
    let (refused, _) = forward(&mut h.client, "fwd", &token, 7070).await;
    assert_eq!(refused.unwrap_err().code(), Code::Unauthenticated);
    let (closed, _tx) = forward(&mut h.client, "fwd", &fresh, 7071).await;
    let ended = closed.unwrap().message().await;
    assert_eq!(
        ended.unwrap_err().code(),
        Code::Unavailable,
        "a closed port ends the stream with an error"
    );
}
