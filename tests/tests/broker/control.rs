//! The control channel: its socket, `hello`, and the open refusals (spec/grants.md §1.5).

use super::*;

#[tokio::test]
async fn the_control_socket_is_private_and_answers_hello() {
    let api = TestApi::start();
    let broker = Broker::start(
        &api,
        &grants(json!({"inv": jwt_profile(&api, "JWT_SECRET_A", &[])})),
    )
    .await;
    let mode = std::fs::metadata(&broker.socket)
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600);
    let parent = std::fs::metadata(broker.socket.parent().unwrap())
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(parent & 0o777, 0o700);
    let hello = broker.client().hello().await.unwrap();
    assert_eq!((hello.version, hello.generation, hello.profiles), (4, 1, 1));
    assert!(!hello.guard, "no guard socket was asked for");
}

#[tokio::test]
async fn unknown_profiles_and_foreign_callers_get_the_same_refusal() {
    let api = TestApi::start();
    let mut session_ok = jwt_profile(&api, "JWT_SECRET_A", &["GET /x"]);
    session_ok["allow_in_sessions"] = json!(true);
    let broker = Broker::start(
        &api,
        &grants(json!({"inv": jwt_profile(&api, "JWT_SECRET_A", &["GET /x"]), "sess": session_ok})),
    )
    .await;
    let client = broker.client();
    let refusal = |run: OpenRun| {
        let client = client.clone();
        async move {
            client
                .open(&run)
                .await
                .unwrap()
                .expect_err("must be refused")
        }
    };
    let unknown = refusal(open_request("alice", "nope", 5_000)).await;
    let foreign = refusal(open_request("mallory", "inv", 5_000)).await;
    let anonymous = refusal(open_request("", "inv", 5_000)).await;
    for r in [&unknown, &foreign, &anonymous] {
        assert_eq!(r.reason, RefusalReason::Permission);
    }
    assert_eq!(
        unknown.message,
        "grant_profile \"nope\" is not available to this caller"
    );
    assert_eq!(
        foreign.message,
        "grant_profile \"inv\" is not available to this caller"
    );
    assert_eq!(anonymous.message, foreign.message);

    let mut in_session = open_request("alice", "inv", 5_000);
    in_session.session = true;
    let r = refusal(in_session).await;
    assert_eq!(r.reason, RefusalReason::Permission);
    assert_eq!(
        r.message,
        "grant_profile \"inv\" is not allowed in sessions"
    );
    let mut allowed = open_request("alice", "sess", 5_000);
    allowed.session = true;
    assert!(client.open(&allowed).await.unwrap().is_ok());

    let mut past = open_request("alice", "inv", 0);
    past.deadline_unix_ms = now_ms() - 1;
    assert_eq!(refusal(past).await.reason, RefusalReason::Capacity);
    let mut bad_id = open_request("alice", "inv", 5_000);
    bad_id.run = "NOT-HEX".into();
    assert_eq!(refusal(bad_id).await.reason, RefusalReason::Request);
    let mut dup = open_request("alice", "sess", 5_000);
    dup.run = allowed.run.clone();
    assert_eq!(refusal(dup).await.reason, RefusalReason::Request);
}

#[tokio::test]
async fn help_lists_every_variable() {
    let output = Command::new(plimsoll_tests::binary("broker"))
        .arg("--help")
        .output()
        .unwrap();
    assert!(output.status.success());
    let help = String::from_utf8_lossy(&output.stdout);
    for name in [
        "PLIMSOLL_GRANTS_FILE",
        "PLIMSOLL_BROKER_SOCKET",
        "PLIMSOLL_BROKER_CA_FILE",
    ] {
        assert!(help.contains(name), "{help}");
    }
}

/// Sends `hello` on `stream` and reads one answer line (empty when the broker closed the
/// connection without a word), within `within`.
async fn hello_on(stream: &mut UnixStream, within: Duration) -> String {
    stream.write_all(b"{\"op\":\"hello\"}\n").await.unwrap();
    let mut answer = Vec::new();
    let read = async {
        let mut byte = [0u8; 1];
        while stream.read(&mut byte).await.unwrap_or(0) == 1 && byte[0] != b'\n' {
            answer.push(byte[0]);
        }
    };
    tokio::time::timeout(within, read)
        .await
        .expect("an answer or a close in time");
    String::from_utf8_lossy(&answer).into_owned()
}

/// Past its 64 connections the control socket makes a newcomer wait for a turn (up to
/// 2 s), then refuses it with a `capacity` line: back-pressure, never a silent drop.
///
/// This is a regression test (issue 12, part 1): it fails on main before the fix, whose
/// control server dropped the 65th connection at once without an answer (a
/// `try_acquire`, else `drop(stream)`), and passes after.
#[tokio::test]
async fn past_its_cap_the_control_socket_makes_a_newcomer_wait_then_refuses_it_with_a_word() {
    let api = TestApi::start();
    let broker = Broker::start(
        &api,
        &grants(json!({"inv": jwt_profile(&api, "JWT_SECRET_A", &[])})),
    )
    .await;
    // 64 connections, each answered once, so each surely holds a turn.
    let mut held = Vec::new();
    for _ in 0..64 {
        let mut stream = UnixStream::connect(&broker.socket).await.unwrap();
        assert!(hello_on(&mut stream, WAIT).await.contains("\"hello\""));
        held.push(stream);
    }
    // A newcomer waits; a turn that comes free within the wait is its.
    let mut waiting = UnixStream::connect(&broker.socket).await.unwrap();
    let freed = async {
        tokio::time::sleep(Duration::from_millis(500)).await;
        held.pop();
    };
    let (answer, ()) = tokio::join!(hello_on(&mut waiting, WAIT), freed);
    assert!(answer.contains("\"hello\""), "{answer:?}");
    held.push(waiting);
    // With every turn kept, the next one is refused after the wait, with a word.
    let started = Instant::now();
    let mut refused = UnixStream::connect(&broker.socket).await.unwrap();
    let answer = hello_on(&mut refused, WAIT).await;
    assert!(
        answer.contains("\"refused\"") && answer.contains("\"capacity\""),
        "{answer:?}"
    );
    assert!(
        started.elapsed() >= Duration::from_millis(1_500),
        "refused before the wait: {:?}",
        started.elapsed()
    );
}
